/* cpnet/shmem_typed.h: the typed and sized OpenSHMEM 1.5 routines (RMA
 * §9.6, AMOs §9.7, signals §9.8, collectives §9.9, point-to-point
 * synchronization §9.10), generated from the type tables of <shmem.h> as
 * static inline functions over libcpnet's generic calls. Include <shmem.h>,
 * not this file. Every function passes its own name for error messages. */
#ifndef CPNET_SHMEM_TYPED_H
#define CPNET_SHMEM_TYPED_H

#ifndef CPNET_SHMEM_H
#error "include <shmem.h>, not <cpnet/shmem_typed.h>"
#endif

#define CPNET_D SHMEM_CTX_DEFAULT

/* ---- §9.6 RMA: put, get, p, g, iput, iget, _nbi; §9.8.1 put_signal ------ */
#define CPNET_DEF_RMA(T, N) \
    static inline void shmem_ctx_##N##_put(shmem_ctx_t ctx, T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_putmem(ctx, dest, source, nelems * sizeof(T), pe, 0, "shmem_ctx_" #N "_put"); } \
    static inline void shmem_##N##_put(T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_putmem(CPNET_D, dest, source, nelems * sizeof(T), pe, 0, "shmem_" #N "_put"); } \
    static inline void shmem_ctx_##N##_put_nbi(shmem_ctx_t ctx, T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_putmem(ctx, dest, source, nelems * sizeof(T), pe, 1, "shmem_ctx_" #N "_put_nbi"); } \
    static inline void shmem_##N##_put_nbi(T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_putmem(CPNET_D, dest, source, nelems * sizeof(T), pe, 1, "shmem_" #N "_put_nbi"); } \
    static inline void shmem_ctx_##N##_get(shmem_ctx_t ctx, T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_getmem(ctx, dest, source, nelems * sizeof(T), pe, 0, "shmem_ctx_" #N "_get"); } \
    static inline void shmem_##N##_get(T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_getmem(CPNET_D, dest, source, nelems * sizeof(T), pe, 0, "shmem_" #N "_get"); } \
    static inline void shmem_ctx_##N##_get_nbi(shmem_ctx_t ctx, T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_getmem(ctx, dest, source, nelems * sizeof(T), pe, 1, "shmem_ctx_" #N "_get_nbi"); } \
    static inline void shmem_##N##_get_nbi(T *dest, const T *source, size_t nelems, int pe) { cpnet_ctx_getmem(CPNET_D, dest, source, nelems * sizeof(T), pe, 1, "shmem_" #N "_get_nbi"); } \
    static inline void shmem_ctx_##N##_p(shmem_ctx_t ctx, T *dest, T value, int pe) { cpnet_ctx_putmem(ctx, dest, &value, sizeof(T), pe, 0, "shmem_ctx_" #N "_p"); } \
    static inline void shmem_##N##_p(T *dest, T value, int pe) { cpnet_ctx_putmem(CPNET_D, dest, &value, sizeof(T), pe, 0, "shmem_" #N "_p"); } \
    static inline T shmem_ctx_##N##_g(shmem_ctx_t ctx, const T *source, int pe) { T v; cpnet_ctx_getmem(ctx, &v, source, sizeof(T), pe, 0, "shmem_ctx_" #N "_g"); return v; } \
    static inline T shmem_##N##_g(const T *source, int pe) { T v; cpnet_ctx_getmem(CPNET_D, &v, source, sizeof(T), pe, 0, "shmem_" #N "_g"); return v; } \
    static inline void shmem_ctx_##N##_iput(shmem_ctx_t ctx, T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iput(ctx, dest, source, dst, sst, nelems, sizeof(T), pe, "shmem_ctx_" #N "_iput"); } \
    static inline void shmem_##N##_iput(T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iput(CPNET_D, dest, source, dst, sst, nelems, sizeof(T), pe, "shmem_" #N "_iput"); } \
    static inline void shmem_ctx_##N##_iget(shmem_ctx_t ctx, T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iget(ctx, dest, source, dst, sst, nelems, sizeof(T), pe, "shmem_ctx_" #N "_iget"); } \
    static inline void shmem_##N##_iget(T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iget(CPNET_D, dest, source, dst, sst, nelems, sizeof(T), pe, "shmem_" #N "_iget"); } \
    static inline void shmem_ctx_##N##_put_signal(shmem_ctx_t ctx, T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(ctx, dest, source, nelems * sizeof(T), sig_addr, signal, sig_op, pe, "shmem_ctx_" #N "_put_signal"); } \
    static inline void shmem_##N##_put_signal(T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(CPNET_D, dest, source, nelems * sizeof(T), sig_addr, signal, sig_op, pe, "shmem_" #N "_put_signal"); } \
    static inline void shmem_ctx_##N##_put_signal_nbi(shmem_ctx_t ctx, T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(ctx, dest, source, nelems * sizeof(T), sig_addr, signal, sig_op, pe, "shmem_ctx_" #N "_put_signal_nbi"); } \
    static inline void shmem_##N##_put_signal_nbi(T *dest, const T *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(CPNET_D, dest, source, nelems * sizeof(T), sig_addr, signal, sig_op, pe, "shmem_" #N "_put_signal_nbi"); } \
    static inline int shmem_##N##_broadcast(shmem_team_t team, T *dest, const T *source, size_t nelems, int PE_root) { return cpnet_team_broadcast(team, dest, source, nelems * sizeof(T), PE_root, "shmem_" #N "_broadcast"); } \
    static inline int shmem_##N##_collect(shmem_team_t team, T *dest, const T *source, size_t nelems) { return cpnet_team_collect(team, dest, source, nelems * sizeof(T), "shmem_" #N "_collect"); } \
    static inline int shmem_##N##_fcollect(shmem_team_t team, T *dest, const T *source, size_t nelems) { return cpnet_team_fcollect(team, dest, source, nelems * sizeof(T), "shmem_" #N "_fcollect"); } \
    static inline int shmem_##N##_alltoall(shmem_team_t team, T *dest, const T *source, size_t nelems) { return cpnet_team_alltoall(team, dest, source, nelems * sizeof(T), "shmem_" #N "_alltoall"); } \
    static inline int shmem_##N##_alltoalls(shmem_team_t team, T *dest, const T *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems) { return cpnet_team_alltoalls(team, dest, source, dst, sst, nelems, sizeof(T), "shmem_" #N "_alltoalls"); }
CPNET_RMA_TYPES(CPNET_DEF_RMA)
#undef CPNET_DEF_RMA

/* Sized RMA (§9.6: put8..put128, putmem, and the get and strided forms). */
#define CPNET_DEF_SIZED(SZ, BYTES) \
    static inline void shmem_ctx_put##SZ(shmem_ctx_t ctx, void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_putmem(ctx, dest, source, nelems * BYTES, pe, 0, "shmem_ctx_put" #SZ); } \
    static inline void shmem_put##SZ(void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_putmem(CPNET_D, dest, source, nelems * BYTES, pe, 0, "shmem_put" #SZ); } \
    static inline void shmem_ctx_put##SZ##_nbi(shmem_ctx_t ctx, void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_putmem(ctx, dest, source, nelems * BYTES, pe, 1, "shmem_ctx_put" #SZ "_nbi"); } \
    static inline void shmem_put##SZ##_nbi(void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_putmem(CPNET_D, dest, source, nelems * BYTES, pe, 1, "shmem_put" #SZ "_nbi"); } \
    static inline void shmem_ctx_get##SZ(shmem_ctx_t ctx, void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_getmem(ctx, dest, source, nelems * BYTES, pe, 0, "shmem_ctx_get" #SZ); } \
    static inline void shmem_get##SZ(void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_getmem(CPNET_D, dest, source, nelems * BYTES, pe, 0, "shmem_get" #SZ); } \
    static inline void shmem_ctx_get##SZ##_nbi(shmem_ctx_t ctx, void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_getmem(ctx, dest, source, nelems * BYTES, pe, 1, "shmem_ctx_get" #SZ "_nbi"); } \
    static inline void shmem_get##SZ##_nbi(void *dest, const void *source, size_t nelems, int pe) { cpnet_ctx_getmem(CPNET_D, dest, source, nelems * BYTES, pe, 1, "shmem_get" #SZ "_nbi"); } \
    static inline void shmem_ctx_put##SZ##_signal(shmem_ctx_t ctx, void *dest, const void *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(ctx, dest, source, nelems * BYTES, sig_addr, signal, sig_op, pe, "shmem_ctx_put" #SZ "_signal"); } \
    static inline void shmem_put##SZ##_signal(void *dest, const void *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(CPNET_D, dest, source, nelems * BYTES, sig_addr, signal, sig_op, pe, "shmem_put" #SZ "_signal"); } \
    static inline void shmem_ctx_put##SZ##_signal_nbi(shmem_ctx_t ctx, void *dest, const void *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(ctx, dest, source, nelems * BYTES, sig_addr, signal, sig_op, pe, "shmem_ctx_put" #SZ "_signal_nbi"); } \
    static inline void shmem_put##SZ##_signal_nbi(void *dest, const void *source, size_t nelems, uint64_t *sig_addr, uint64_t signal, int sig_op, int pe) { cpnet_ctx_putmem_signal(CPNET_D, dest, source, nelems * BYTES, sig_addr, signal, sig_op, pe, "shmem_put" #SZ "_signal_nbi"); }
CPNET_DEF_SIZED(8, 1)
CPNET_DEF_SIZED(16, 2)
CPNET_DEF_SIZED(32, 4)
CPNET_DEF_SIZED(64, 8)
CPNET_DEF_SIZED(128, 16)
CPNET_DEF_SIZED(mem, 1)
#undef CPNET_DEF_SIZED

#define CPNET_DEF_ISIZED(SZ, BYTES) \
    static inline void shmem_ctx_iput##SZ(shmem_ctx_t ctx, void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iput(ctx, dest, source, dst, sst, nelems, BYTES, pe, "shmem_ctx_iput" #SZ); } \
    static inline void shmem_iput##SZ(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iput(CPNET_D, dest, source, dst, sst, nelems, BYTES, pe, "shmem_iput" #SZ); } \
    static inline void shmem_ctx_iget##SZ(shmem_ctx_t ctx, void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iget(ctx, dest, source, dst, sst, nelems, BYTES, pe, "shmem_ctx_iget" #SZ); } \
    static inline void shmem_iget##SZ(void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems, int pe) { cpnet_ctx_iget(CPNET_D, dest, source, dst, sst, nelems, BYTES, pe, "shmem_iget" #SZ); }
CPNET_DEF_ISIZED(8, 1)
CPNET_DEF_ISIZED(16, 2)
CPNET_DEF_ISIZED(32, 4)
CPNET_DEF_ISIZED(64, 8)
CPNET_DEF_ISIZED(128, 16)
#undef CPNET_DEF_ISIZED

/* §9.9 collectives on bytes. */
static inline int shmem_broadcastmem(shmem_team_t team, void *dest, const void *source, size_t nelems, int PE_root) { return cpnet_team_broadcast(team, dest, source, nelems, PE_root, "shmem_broadcastmem"); }
static inline int shmem_collectmem(shmem_team_t team, void *dest, const void *source, size_t nelems) { return cpnet_team_collect(team, dest, source, nelems, "shmem_collectmem"); }
static inline int shmem_fcollectmem(shmem_team_t team, void *dest, const void *source, size_t nelems) { return cpnet_team_fcollect(team, dest, source, nelems, "shmem_fcollectmem"); }
static inline int shmem_alltoallmem(shmem_team_t team, void *dest, const void *source, size_t nelems) { return cpnet_team_alltoall(team, dest, source, nelems, "shmem_alltoallmem"); }
static inline int shmem_alltoallsmem(shmem_team_t team, void *dest, const void *source, ptrdiff_t dst, ptrdiff_t sst, size_t nelems) { return cpnet_team_alltoalls(team, dest, source, dst, sst, nelems, 1, "shmem_alltoallsmem"); }

/* ---- §9.7 AMOs ---------------------------------------------------------- */
/* One AMO routine in both forms; R is the return type (void or T), RET returns. */
#define CPNET_AMO_FN(T, N, NAME, ARGS, CALLARGS, OP, VAL, COND, RET, R) \
    static inline R shmem_ctx_##N##_atomic_##NAME(shmem_ctx_t ctx, T *dest ARGS, int pe) { RET cpnet_ctx_amo(ctx, OP, (int)sizeof(T), (void *)dest, (uint64_t)(VAL), (uint64_t)(COND), pe, "shmem_ctx_" #N "_atomic_" #NAME); } \
    static inline R shmem_##N##_atomic_##NAME(T *dest ARGS, int pe) { RET cpnet_ctx_amo(CPNET_D, OP, (int)sizeof(T), (void *)dest, (uint64_t)(VAL), (uint64_t)(COND), pe, "shmem_" #N "_atomic_" #NAME); }
#define CPNET_COMMA ,
#define CPNET_DEF_AMO_STD(T, N) \
    static inline T shmem_ctx_##N##_atomic_fetch(shmem_ctx_t ctx, const T *source, int pe) { return (T)cpnet_ctx_amo(ctx, CPNET_AMO_FETCH, (int)sizeof(T), (void *)source, 0, 0, pe, "shmem_ctx_" #N "_atomic_fetch"); } \
    static inline T shmem_##N##_atomic_fetch(const T *source, int pe) { return (T)cpnet_ctx_amo(CPNET_D, CPNET_AMO_FETCH, (int)sizeof(T), (void *)source, 0, 0, pe, "shmem_" #N "_atomic_fetch"); } \
    CPNET_AMO_FN(T, N, set, CPNET_COMMA T value, , CPNET_AMO_SET, value, 0, (void), void) \
    CPNET_AMO_FN(T, N, swap, CPNET_COMMA T value, , CPNET_AMO_SWAP, value, 0, return (T), T) \
    CPNET_AMO_FN(T, N, compare_swap, CPNET_COMMA T cond CPNET_COMMA T value, , CPNET_AMO_COMPARE_SWAP, value, cond, return (T), T) \
    CPNET_AMO_FN(T, N, fetch_inc, , , CPNET_AMO_FETCH_ADD, 1, 0, return (T), T) \
    CPNET_AMO_FN(T, N, inc, , , CPNET_AMO_ADD, 1, 0, (void), void) \
    CPNET_AMO_FN(T, N, fetch_add, CPNET_COMMA T value, , CPNET_AMO_FETCH_ADD, value, 0, return (T), T) \
    CPNET_AMO_FN(T, N, add, CPNET_COMMA T value, , CPNET_AMO_ADD, value, 0, (void), void) \
    static inline void shmem_ctx_##N##_atomic_fetch_nbi(shmem_ctx_t ctx, T *fetch, const T *source, int pe) { *fetch = shmem_ctx_##N##_atomic_fetch(ctx, source, pe); } \
    static inline void shmem_ctx_##N##_atomic_swap_nbi(shmem_ctx_t ctx, T *fetch, T *dest, T value, int pe) { *fetch = shmem_ctx_##N##_atomic_swap(ctx, dest, value, pe); } \
    static inline void shmem_ctx_##N##_atomic_compare_swap_nbi(shmem_ctx_t ctx, T *fetch, T *dest, T cond, T value, int pe) { *fetch = shmem_ctx_##N##_atomic_compare_swap(ctx, dest, cond, value, pe); } \
    static inline void shmem_ctx_##N##_atomic_fetch_inc_nbi(shmem_ctx_t ctx, T *fetch, T *dest, int pe) { *fetch = shmem_ctx_##N##_atomic_fetch_inc(ctx, dest, pe); } \
    static inline void shmem_ctx_##N##_atomic_fetch_add_nbi(shmem_ctx_t ctx, T *fetch, T *dest, T value, int pe) { *fetch = shmem_ctx_##N##_atomic_fetch_add(ctx, dest, value, pe); } \
    static inline void shmem_##N##_atomic_fetch_nbi(T *fetch, const T *source, int pe) { *fetch = shmem_##N##_atomic_fetch(source, pe); } \
    static inline void shmem_##N##_atomic_swap_nbi(T *fetch, T *dest, T value, int pe) { *fetch = shmem_##N##_atomic_swap(dest, value, pe); } \
    static inline void shmem_##N##_atomic_compare_swap_nbi(T *fetch, T *dest, T cond, T value, int pe) { *fetch = shmem_##N##_atomic_compare_swap(dest, cond, value, pe); } \
    static inline void shmem_##N##_atomic_fetch_inc_nbi(T *fetch, T *dest, int pe) { *fetch = shmem_##N##_atomic_fetch_inc(dest, pe); } \
    static inline void shmem_##N##_atomic_fetch_add_nbi(T *fetch, T *dest, T value, int pe) { *fetch = shmem_##N##_atomic_fetch_add(dest, value, pe); }
CPNET_AMO_STD_TYPES(CPNET_DEF_AMO_STD)
#undef CPNET_DEF_AMO_STD

#define CPNET_DEF_AMO_BIT(T, N) \
    CPNET_AMO_FN(T, N, fetch_and, CPNET_COMMA T value, , CPNET_AMO_FETCH_AND, value, 0, return (T), T) \
    CPNET_AMO_FN(T, N, and, CPNET_COMMA T value, , CPNET_AMO_AND, value, 0, (void), void) \
    CPNET_AMO_FN(T, N, fetch_or, CPNET_COMMA T value, , CPNET_AMO_FETCH_OR, value, 0, return (T), T) \
    CPNET_AMO_FN(T, N, or, CPNET_COMMA T value, , CPNET_AMO_OR, value, 0, (void), void) \
    CPNET_AMO_FN(T, N, fetch_xor, CPNET_COMMA T value, , CPNET_AMO_FETCH_XOR, value, 0, return (T), T) \
    CPNET_AMO_FN(T, N, xor, CPNET_COMMA T value, , CPNET_AMO_XOR, value, 0, (void), void) \
    static inline void shmem_ctx_##N##_atomic_fetch_and_nbi(shmem_ctx_t ctx, T *fetch, T *dest, T value, int pe) { *fetch = shmem_ctx_##N##_atomic_fetch_and(ctx, dest, value, pe); } \
    static inline void shmem_ctx_##N##_atomic_fetch_or_nbi(shmem_ctx_t ctx, T *fetch, T *dest, T value, int pe) { *fetch = shmem_ctx_##N##_atomic_fetch_or(ctx, dest, value, pe); } \
    static inline void shmem_ctx_##N##_atomic_fetch_xor_nbi(shmem_ctx_t ctx, T *fetch, T *dest, T value, int pe) { *fetch = shmem_ctx_##N##_atomic_fetch_xor(ctx, dest, value, pe); } \
    static inline void shmem_##N##_atomic_fetch_and_nbi(T *fetch, T *dest, T value, int pe) { *fetch = shmem_##N##_atomic_fetch_and(dest, value, pe); } \
    static inline void shmem_##N##_atomic_fetch_or_nbi(T *fetch, T *dest, T value, int pe) { *fetch = shmem_##N##_atomic_fetch_or(dest, value, pe); } \
    static inline void shmem_##N##_atomic_fetch_xor_nbi(T *fetch, T *dest, T value, int pe) { *fetch = shmem_##N##_atomic_fetch_xor(dest, value, pe); }
CPNET_AMO_BIT_TYPES(CPNET_DEF_AMO_BIT)
#undef CPNET_DEF_AMO_BIT

/* Extended AMOs on float and double (fetch, set, swap) through their bits. */
#define CPNET_DEF_AMO_FLOAT(T, N, U) \
    static inline U cpnet_bits_##N(T v) { U u; memcpy(&u, &v, sizeof u); return u; } \
    static inline T cpnet_from_bits_##N(U u) { T v; memcpy(&v, &u, sizeof v); return v; } \
    static inline T shmem_ctx_##N##_atomic_fetch(shmem_ctx_t ctx, const T *source, int pe) { return cpnet_from_bits_##N((U)cpnet_ctx_amo(ctx, CPNET_AMO_FETCH, (int)sizeof(T), (void *)source, 0, 0, pe, "shmem_ctx_" #N "_atomic_fetch")); } \
    static inline T shmem_##N##_atomic_fetch(const T *source, int pe) { return cpnet_from_bits_##N((U)cpnet_ctx_amo(CPNET_D, CPNET_AMO_FETCH, (int)sizeof(T), (void *)source, 0, 0, pe, "shmem_" #N "_atomic_fetch")); } \
    static inline void shmem_ctx_##N##_atomic_set(shmem_ctx_t ctx, T *dest, T value, int pe) { cpnet_ctx_amo(ctx, CPNET_AMO_SET, (int)sizeof(T), dest, cpnet_bits_##N(value), 0, pe, "shmem_ctx_" #N "_atomic_set"); } \
    static inline void shmem_##N##_atomic_set(T *dest, T value, int pe) { cpnet_ctx_amo(CPNET_D, CPNET_AMO_SET, (int)sizeof(T), dest, cpnet_bits_##N(value), 0, pe, "shmem_" #N "_atomic_set"); } \
    static inline T shmem_ctx_##N##_atomic_swap(shmem_ctx_t ctx, T *dest, T value, int pe) { return cpnet_from_bits_##N((U)cpnet_ctx_amo(ctx, CPNET_AMO_SWAP, (int)sizeof(T), dest, cpnet_bits_##N(value), 0, pe, "shmem_ctx_" #N "_atomic_swap")); } \
    static inline T shmem_##N##_atomic_swap(T *dest, T value, int pe) { return cpnet_from_bits_##N((U)cpnet_ctx_amo(CPNET_D, CPNET_AMO_SWAP, (int)sizeof(T), dest, cpnet_bits_##N(value), 0, pe, "shmem_" #N "_atomic_swap")); }
CPNET_DEF_AMO_FLOAT(float, float, uint32_t)
CPNET_DEF_AMO_FLOAT(double, double, uint64_t)
#undef CPNET_DEF_AMO_FLOAT

/* ---- §9.10 point-to-point synchronization -------------------------------- */
#define CPNET_W(N, F) "shmem_" #N "_" #F
#define CPNET_DEF_P2P(T, N, CODE) \
    static inline void shmem_##N##_wait_until(T *ivar, int cmp, T cmp_value) { cpnet_wait(ivar, 1, NULL, CODE, cmp, &cmp_value, 0, CPNET_WAIT_ALL, 1, NULL, CPNET_W(N, wait_until)); } \
    static inline void shmem_##N##_wait_until_all(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value) { cpnet_wait(ivars, nelems, status, CODE, cmp, &cmp_value, 0, CPNET_WAIT_ALL, 1, NULL, CPNET_W(N, wait_until_all)); } \
    static inline size_t shmem_##N##_wait_until_any(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value) { return cpnet_wait(ivars, nelems, status, CODE, cmp, &cmp_value, 0, CPNET_WAIT_ANY, 1, NULL, CPNET_W(N, wait_until_any)); } \
    static inline size_t shmem_##N##_wait_until_some(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, T cmp_value) { return cpnet_wait(ivars, nelems, status, CODE, cmp, &cmp_value, 0, CPNET_WAIT_SOME, 1, indices, CPNET_W(N, wait_until_some)); } \
    static inline void shmem_##N##_wait_until_all_vector(T *ivars, size_t nelems, const int *status, int cmp, T *cmp_values) { cpnet_wait(ivars, nelems, status, CODE, cmp, cmp_values, 1, CPNET_WAIT_ALL, 1, NULL, CPNET_W(N, wait_until_all_vector)); } \
    static inline size_t shmem_##N##_wait_until_any_vector(T *ivars, size_t nelems, const int *status, int cmp, T *cmp_values) { return cpnet_wait(ivars, nelems, status, CODE, cmp, cmp_values, 1, CPNET_WAIT_ANY, 1, NULL, CPNET_W(N, wait_until_any_vector)); } \
    static inline size_t shmem_##N##_wait_until_some_vector(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, T *cmp_values) { return cpnet_wait(ivars, nelems, status, CODE, cmp, cmp_values, 1, CPNET_WAIT_SOME, 1, indices, CPNET_W(N, wait_until_some_vector)); } \
    static inline int shmem_##N##_test(T *ivar, int cmp, T cmp_value) { return (int)cpnet_wait(ivar, 1, NULL, CODE, cmp, &cmp_value, 0, CPNET_WAIT_ALL, 0, NULL, CPNET_W(N, test)); } \
    static inline int shmem_##N##_test_all(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value) { return (int)cpnet_wait(ivars, nelems, status, CODE, cmp, &cmp_value, 0, CPNET_WAIT_ALL, 0, NULL, CPNET_W(N, test_all)); } \
    static inline size_t shmem_##N##_test_any(T *ivars, size_t nelems, const int *status, int cmp, T cmp_value) { return cpnet_wait(ivars, nelems, status, CODE, cmp, &cmp_value, 0, CPNET_WAIT_ANY, 0, NULL, CPNET_W(N, test_any)); } \
    static inline size_t shmem_##N##_test_some(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, T cmp_value) { return cpnet_wait(ivars, nelems, status, CODE, cmp, &cmp_value, 0, CPNET_WAIT_SOME, 0, indices, CPNET_W(N, test_some)); } \
    static inline int shmem_##N##_test_all_vector(T *ivars, size_t nelems, const int *status, int cmp, T *cmp_values) { return (int)cpnet_wait(ivars, nelems, status, CODE, cmp, cmp_values, 1, CPNET_WAIT_ALL, 0, NULL, CPNET_W(N, test_all_vector)); } \
    static inline size_t shmem_##N##_test_any_vector(T *ivars, size_t nelems, const int *status, int cmp, T *cmp_values) { return cpnet_wait(ivars, nelems, status, CODE, cmp, cmp_values, 1, CPNET_WAIT_ANY, 0, NULL, CPNET_W(N, test_any_vector)); } \
    static inline size_t shmem_##N##_test_some_vector(T *ivars, size_t nelems, size_t *indices, const int *status, int cmp, T *cmp_values) { return cpnet_wait(ivars, nelems, status, CODE, cmp, cmp_values, 1, CPNET_WAIT_SOME, 0, indices, CPNET_W(N, test_some_vector)); }
CPNET_P2P_TYPES(CPNET_DEF_P2P)
#undef CPNET_DEF_P2P

/* ---- §9.9.9 reductions (team-based) -------------------------------------- */
#define CPNET_DEF_REDUCE(T, N, CODE, OPNAME, OP) \
    static inline int shmem_##N##_##OPNAME##_reduce(shmem_team_t team, T *dest, const T *source, size_t nreduce) { return cpnet_team_reduce(team, dest, source, nreduce, CODE, OP, "shmem_" #N "_" #OPNAME "_reduce"); }
#define CPNET_DEF_BITWISE(T, N, CODE) CPNET_DEF_REDUCE(T, N, CODE, and, CPNET_OP_AND) CPNET_DEF_REDUCE(T, N, CODE, or, CPNET_OP_OR) CPNET_DEF_REDUCE(T, N, CODE, xor, CPNET_OP_XOR)
#define CPNET_DEF_ARITH(T, N, CODE) \
    CPNET_DEF_REDUCE(T, N, CODE, max, CPNET_OP_MAX) CPNET_DEF_REDUCE(T, N, CODE, min, CPNET_OP_MIN) CPNET_DEF_REDUCE(T, N, CODE, sum, CPNET_OP_SUM) CPNET_DEF_REDUCE(T, N, CODE, prod, CPNET_OP_PROD)
CPNET_BITWISE_REDUCE_TYPES(CPNET_DEF_BITWISE)
CPNET_ARITH_REDUCE_TYPES(CPNET_DEF_ARITH)
#undef CPNET_DEF_ARITH
#undef CPNET_DEF_BITWISE
#undef CPNET_DEF_REDUCE

#endif /* CPNET_SHMEM_TYPED_H */
