/* cpnet/shmem_generic.h: the C11 generic selection of OpenSHMEM 1.5 (each
 * typed family's generic name picks the routine from the type of its
 * symmetric argument; the RMA and AMO names take an optional context first,
 * picked by the number of arguments). Included by <shmem.h> under C11. The
 * associations list the standard C types only (int32_t and the like are
 * typedefs of them), as the spec's generic interfaces do. */
#ifndef CPNET_SHMEM_GENERIC_H
#define CPNET_SHMEM_GENERIC_H

#ifndef CPNET_SHMEM_H
#error "include <shmem.h>, not <cpnet/shmem_generic.h>"
#endif

/* A type the generic name has no routine for: a compile-time error at the call. */
void cpnet_generic_type_not_supported(void);

/* Argument counting: the 5th/6th/7th/8th/9th argument selects the context form. */
#define CPNET_PICK5(a, b, c, d, e, f, ...) f
#define CPNET_PICK6(a, b, c, d, e, f, g, ...) g
#define CPNET_PICK7(a, b, c, d, e, f, g, h, ...) h
#define CPNET_PICK8(a, b, c, d, e, f, g, h, i, ...) i

#define CPNET_GEN_RMA(P, F) \
    float *: P##float_##F, double *: P##double_##F, long double *: P##longdouble_##F, char *: P##char_##F, signed char *: P##schar_##F, \
    short *: P##short_##F, int *: P##int_##F, long *: P##long_##F, long long *: P##longlong_##F, unsigned char *: P##uchar_##F, \
    unsigned short *: P##ushort_##F, unsigned int *: P##uint_##F, unsigned long *: P##ulong_##F, unsigned long long *: P##ulonglong_##F, \
    default: cpnet_generic_type_not_supported
#define CPNET_GEN_RMA_CONST(P, F) \
    const float *: P##float_##F, const double *: P##double_##F, const long double *: P##longdouble_##F, const char *: P##char_##F, \
    const signed char *: P##schar_##F, const short *: P##short_##F, const int *: P##int_##F, const long *: P##long_##F, \
    const long long *: P##longlong_##F, const unsigned char *: P##uchar_##F, const unsigned short *: P##ushort_##F, \
    const unsigned int *: P##uint_##F, const unsigned long *: P##ulong_##F, const unsigned long long *: P##ulonglong_##F, CPNET_GEN_RMA(P, F)
#define CPNET_GEN_AMO_STD(P, F) \
    int *: P##int_##F, long *: P##long_##F, long long *: P##longlong_##F, unsigned int *: P##uint_##F, unsigned long *: P##ulong_##F, \
    unsigned long long *: P##ulonglong_##F
#define CPNET_GEN_AMO_EXT(P, F) CPNET_GEN_AMO_STD(P, F), float *: P##float_##F, double *: P##double_##F
#define CPNET_GEN_AMO_BIT(P, F) unsigned int *: P##uint_##F, unsigned long *: P##ulong_##F, unsigned long long *: P##ulonglong_##F
#define CPNET_GEN_P2P(F) \
    short *: shmem_short_##F, int *: shmem_int_##F, long *: shmem_long_##F, long long *: shmem_longlong_##F, unsigned short *: shmem_ushort_##F, \
    unsigned int *: shmem_uint_##F, unsigned long *: shmem_ulong_##F, unsigned long long *: shmem_ulonglong_##F, \
    default: cpnet_generic_type_not_supported

/* §9.6 RMA */
#define shmem_put(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_put, cpnet_g_put, )(__VA_ARGS__)
#define cpnet_g_put(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, put))(dest, __VA_ARGS__)
#define cpnet_gc_put(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, put))(ctx, dest, __VA_ARGS__)
#define shmem_put_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_put_nbi, cpnet_g_put_nbi, )(__VA_ARGS__)
#define cpnet_g_put_nbi(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, put_nbi))(dest, __VA_ARGS__)
#define cpnet_gc_put_nbi(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, put_nbi))(ctx, dest, __VA_ARGS__)
#define shmem_get(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_get, cpnet_g_get, )(__VA_ARGS__)
#define cpnet_g_get(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, get))(dest, __VA_ARGS__)
#define cpnet_gc_get(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, get))(ctx, dest, __VA_ARGS__)
#define shmem_get_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_get_nbi, cpnet_g_get_nbi, )(__VA_ARGS__)
#define cpnet_g_get_nbi(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, get_nbi))(dest, __VA_ARGS__)
#define cpnet_gc_get_nbi(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, get_nbi))(ctx, dest, __VA_ARGS__)
#define shmem_p(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_p, cpnet_g_p, )(__VA_ARGS__)
#define cpnet_g_p(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, p))(dest, __VA_ARGS__)
#define cpnet_gc_p(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, p))(ctx, dest, __VA_ARGS__)
#define shmem_g(...) CPNET_PICK5(__VA_ARGS__, , , cpnet_gc_g, cpnet_g_g, )(__VA_ARGS__)
#define cpnet_g_g(source, ...) _Generic((source), CPNET_GEN_RMA_CONST(shmem_, g))(source, __VA_ARGS__)
#define cpnet_gc_g(ctx, source, ...) _Generic((source), CPNET_GEN_RMA_CONST(shmem_ctx_, g))(ctx, source, __VA_ARGS__)
#define shmem_iput(...) CPNET_PICK7(__VA_ARGS__, cpnet_gc_iput, cpnet_g_iput, )(__VA_ARGS__)
#define cpnet_g_iput(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, iput))(dest, __VA_ARGS__)
#define cpnet_gc_iput(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, iput))(ctx, dest, __VA_ARGS__)
#define shmem_iget(...) CPNET_PICK7(__VA_ARGS__, cpnet_gc_iget, cpnet_g_iget, )(__VA_ARGS__)
#define cpnet_g_iget(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, iget))(dest, __VA_ARGS__)
#define cpnet_gc_iget(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, iget))(ctx, dest, __VA_ARGS__)

/* §9.8.1 put with signal */
#define shmem_put_signal(...) CPNET_PICK8(__VA_ARGS__, cpnet_gc_put_signal, cpnet_g_put_signal, )(__VA_ARGS__)
#define cpnet_g_put_signal(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, put_signal))(dest, __VA_ARGS__)
#define cpnet_gc_put_signal(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, put_signal))(ctx, dest, __VA_ARGS__)
#define shmem_put_signal_nbi(...) CPNET_PICK8(__VA_ARGS__, cpnet_gc_put_signal_nbi, cpnet_g_put_signal_nbi, )(__VA_ARGS__)
#define cpnet_g_put_signal_nbi(dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, put_signal_nbi))(dest, __VA_ARGS__)
#define cpnet_gc_put_signal_nbi(ctx, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_ctx_, put_signal_nbi))(ctx, dest, __VA_ARGS__)

/* §9.7 AMOs: (dest[, value[, value]], pe), with an optional context first. */
#define shmem_atomic_fetch(...) CPNET_PICK5(__VA_ARGS__, , , cpnet_gc_atomic_fetch, cpnet_g_atomic_fetch, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch(source, ...) _Generic((source), CPNET_GEN_AMO_EXT(shmem_, atomic_fetch), const int *: shmem_int_atomic_fetch, \
    const long *: shmem_long_atomic_fetch, const long long *: shmem_longlong_atomic_fetch, const unsigned int *: shmem_uint_atomic_fetch, \
    const unsigned long *: shmem_ulong_atomic_fetch, const unsigned long long *: shmem_ulonglong_atomic_fetch, const float *: shmem_float_atomic_fetch, \
    const double *: shmem_double_atomic_fetch)(source, __VA_ARGS__)
#define cpnet_gc_atomic_fetch(ctx, source, ...) _Generic((source), CPNET_GEN_AMO_EXT(shmem_ctx_, atomic_fetch))(ctx, source, __VA_ARGS__)
/* (dest, pe) forms */
#define shmem_atomic_fetch_inc(...) CPNET_PICK5(__VA_ARGS__, , , cpnet_gc_atomic_fetch_inc, cpnet_g_atomic_fetch_inc, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_inc(dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_, atomic_fetch_inc))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_inc(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_fetch_inc))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_inc(...) CPNET_PICK5(__VA_ARGS__, , , cpnet_gc_atomic_inc, cpnet_g_atomic_inc, )(__VA_ARGS__)
#define cpnet_g_atomic_inc(dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_, atomic_inc))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_inc(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_inc))(ctx, dest, __VA_ARGS__)
/* (dest, value, pe) forms */
#define shmem_atomic_set(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_set, cpnet_g_atomic_set, )(__VA_ARGS__)
#define cpnet_g_atomic_set(dest, ...) _Generic((dest), CPNET_GEN_AMO_EXT(shmem_, atomic_set))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_set(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_EXT(shmem_ctx_, atomic_set))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_swap(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_swap, cpnet_g_atomic_swap, )(__VA_ARGS__)
#define cpnet_g_atomic_swap(dest, ...) _Generic((dest), CPNET_GEN_AMO_EXT(shmem_, atomic_swap))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_swap(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_EXT(shmem_ctx_, atomic_swap))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_fetch_add(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_fetch_add, cpnet_g_atomic_fetch_add, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_add(dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_, atomic_fetch_add))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_add(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_fetch_add))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_add(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_add, cpnet_g_atomic_add, )(__VA_ARGS__)
#define cpnet_g_atomic_add(dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_, atomic_add))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_add(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_add))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_fetch_and(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_fetch_and, cpnet_g_atomic_fetch_and, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_and(dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_, atomic_fetch_and))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_and(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_fetch_and))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_and(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_and, cpnet_g_atomic_and, )(__VA_ARGS__)
#define cpnet_g_atomic_and(dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_, atomic_and))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_and(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_and))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_fetch_or(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_fetch_or, cpnet_g_atomic_fetch_or, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_or(dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_, atomic_fetch_or))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_or(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_fetch_or))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_or(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_or, cpnet_g_atomic_or, )(__VA_ARGS__)
#define cpnet_g_atomic_or(dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_, atomic_or))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_or(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_or))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_fetch_xor(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_fetch_xor, cpnet_g_atomic_fetch_xor, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_xor(dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_, atomic_fetch_xor))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_xor(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_fetch_xor))(ctx, dest, __VA_ARGS__)
#define shmem_atomic_xor(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_xor, cpnet_g_atomic_xor, )(__VA_ARGS__)
#define cpnet_g_atomic_xor(dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_, atomic_xor))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_xor(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_xor))(ctx, dest, __VA_ARGS__)
/* nbi fetching forms: (fetch, dest[, value[, value]], pe), the context first optional; the type is the fetch pointer's */
#define shmem_atomic_fetch_nbi(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_fetch_nbi, cpnet_g_atomic_fetch_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_, atomic_fetch_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_fetch_nbi))(ctx, fetch, __VA_ARGS__)
#define shmem_atomic_fetch_inc_nbi(...) CPNET_PICK5(__VA_ARGS__, , cpnet_gc_atomic_fetch_inc_nbi, cpnet_g_atomic_fetch_inc_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_inc_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_, atomic_fetch_inc_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_inc_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_fetch_inc_nbi))(ctx, fetch, __VA_ARGS__)
/* (fetch, dest, value, pe) */
#define shmem_atomic_swap_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_atomic_swap_nbi, cpnet_g_atomic_swap_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_swap_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_, atomic_swap_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_swap_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_swap_nbi))(ctx, fetch, __VA_ARGS__)
#define shmem_atomic_fetch_add_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_atomic_fetch_add_nbi, cpnet_g_atomic_fetch_add_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_add_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_, atomic_fetch_add_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_add_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_fetch_add_nbi))(ctx, fetch, __VA_ARGS__)
#define shmem_atomic_fetch_and_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_atomic_fetch_and_nbi, cpnet_g_atomic_fetch_and_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_and_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_BIT(shmem_, atomic_fetch_and_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_and_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_fetch_and_nbi))(ctx, fetch, __VA_ARGS__)
#define shmem_atomic_fetch_or_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_atomic_fetch_or_nbi, cpnet_g_atomic_fetch_or_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_or_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_BIT(shmem_, atomic_fetch_or_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_or_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_fetch_or_nbi))(ctx, fetch, __VA_ARGS__)
#define shmem_atomic_fetch_xor_nbi(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_atomic_fetch_xor_nbi, cpnet_g_atomic_fetch_xor_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_fetch_xor_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_BIT(shmem_, atomic_fetch_xor_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_fetch_xor_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_BIT(shmem_ctx_, atomic_fetch_xor_nbi))(ctx, fetch, __VA_ARGS__)
/* (fetch, dest, cond, value, pe) */
#define shmem_atomic_compare_swap_nbi(...) CPNET_PICK6(__VA_ARGS__, cpnet_gc_atomic_compare_swap_nbi, cpnet_g_atomic_compare_swap_nbi, )(__VA_ARGS__)
#define cpnet_g_atomic_compare_swap_nbi(fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_, atomic_compare_swap_nbi))(fetch, __VA_ARGS__)
#define cpnet_gc_atomic_compare_swap_nbi(ctx, fetch, ...) _Generic((fetch), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_compare_swap_nbi))(ctx, fetch, __VA_ARGS__)
/* (dest, cond, value, pe) */
#define shmem_atomic_compare_swap(...) CPNET_PICK5(__VA_ARGS__, cpnet_gc_atomic_compare_swap, cpnet_g_atomic_compare_swap, )(__VA_ARGS__)
#define cpnet_g_atomic_compare_swap(dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_, atomic_compare_swap))(dest, __VA_ARGS__)
#define cpnet_gc_atomic_compare_swap(ctx, dest, ...) _Generic((dest), CPNET_GEN_AMO_STD(shmem_ctx_, atomic_compare_swap))(ctx, dest, __VA_ARGS__)

/* §9.10 point-to-point synchronization */
#define shmem_wait_until(ivar, ...) _Generic((ivar), CPNET_GEN_P2P(wait_until))(ivar, __VA_ARGS__)
#define shmem_wait_until_all(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(wait_until_all))(ivars, __VA_ARGS__)
#define shmem_wait_until_any(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(wait_until_any))(ivars, __VA_ARGS__)
#define shmem_wait_until_some(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(wait_until_some))(ivars, __VA_ARGS__)
#define shmem_wait_until_all_vector(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(wait_until_all_vector))(ivars, __VA_ARGS__)
#define shmem_wait_until_any_vector(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(wait_until_any_vector))(ivars, __VA_ARGS__)
#define shmem_wait_until_some_vector(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(wait_until_some_vector))(ivars, __VA_ARGS__)
#define shmem_test(ivar, ...) _Generic((ivar), CPNET_GEN_P2P(test))(ivar, __VA_ARGS__)
#define shmem_test_all(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(test_all))(ivars, __VA_ARGS__)
#define shmem_test_any(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(test_any))(ivars, __VA_ARGS__)
#define shmem_test_some(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(test_some))(ivars, __VA_ARGS__)
#define shmem_test_all_vector(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(test_all_vector))(ivars, __VA_ARGS__)
#define shmem_test_any_vector(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(test_any_vector))(ivars, __VA_ARGS__)
#define shmem_test_some_vector(ivars, ...) _Generic((ivars), CPNET_GEN_P2P(test_some_vector))(ivars, __VA_ARGS__)

/* §9.9 team collectives: (team, dest, ...) */
#define shmem_broadcast(team, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, broadcast))(team, dest, __VA_ARGS__)
#define shmem_collect(team, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, collect))(team, dest, __VA_ARGS__)
#define shmem_fcollect(team, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, fcollect))(team, dest, __VA_ARGS__)
#define shmem_alltoall(team, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, alltoall))(team, dest, __VA_ARGS__)
#define shmem_alltoalls(team, dest, ...) _Generic((dest), CPNET_GEN_RMA(shmem_, alltoalls))(team, dest, __VA_ARGS__)
#define CPNET_GEN_BITRED(F) \
    unsigned char *: shmem_uchar_##F, unsigned short *: shmem_ushort_##F, unsigned int *: shmem_uint_##F, unsigned long *: shmem_ulong_##F, \
    unsigned long long *: shmem_ulonglong_##F, default: cpnet_generic_type_not_supported
#define CPNET_GEN_ARITHRED(F) \
    char *: shmem_char_##F, signed char *: shmem_schar_##F, short *: shmem_short_##F, int *: shmem_int_##F, long *: shmem_long_##F, \
    long long *: shmem_longlong_##F, unsigned char *: shmem_uchar_##F, unsigned short *: shmem_ushort_##F, unsigned int *: shmem_uint_##F, \
    unsigned long *: shmem_ulong_##F, unsigned long long *: shmem_ulonglong_##F, float *: shmem_float_##F, double *: shmem_double_##F, \
    default: cpnet_generic_type_not_supported
#define shmem_and_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_BITRED(and_reduce))(team, dest, __VA_ARGS__)
#define shmem_or_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_BITRED(or_reduce))(team, dest, __VA_ARGS__)
#define shmem_xor_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_BITRED(xor_reduce))(team, dest, __VA_ARGS__)
#define shmem_max_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_ARITHRED(max_reduce))(team, dest, __VA_ARGS__)
#define shmem_min_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_ARITHRED(min_reduce))(team, dest, __VA_ARGS__)
#define shmem_sum_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_ARITHRED(sum_reduce))(team, dest, __VA_ARGS__)
#define shmem_prod_reduce(team, dest, ...) _Generic((dest), CPNET_GEN_ARITHRED(prod_reduce))(team, dest, __VA_ARGS__)

#endif /* CPNET_SHMEM_GENERIC_H */
