/*
 * cpnet/amo.cuh -- atomic memory operations (OpenSHMEM 1.5 §9.7) and the minimum AMOs (a cpnet extension).
 * Part of the device API: included by <cpnet/device.cuh>, whose RULES
 * (work-group collective calls, symmetric addresses, errors, timeouts)
 * hold for every call here; including this file alone works too.
 */
/* First, outside the guard: device.cuh includes this file at its end, so
 * whichever header a kernel includes first, this file's body comes after
 * device.cuh's and before the files that build on it (team.cuh). */
#include <cpnet/device.cuh>

#ifndef CPNET_AMO_CUH
#define CPNET_AMO_CUH

/* ======================================================================== */
/* Atomic memory operations (OpenSHMEM 1.5 §9.7)                              */
/* ======================================================================== */

/**
 * Typed AMOs on a symmetric TYPE `dest` at PE `pe`, atomic with respect to
 * every other cpnet AMO and signal operation on the same word (not to plain
 * loads/stores or to other libraries' atomics). All collective over the
 * work-group; the fetched value is the same in every thread.
 *
 * Operands travel ZERO-EXTENDED: the low sizeof(TYPE) bytes of the command's
 * `value` / `cond` hold TYPE's bit pattern, the upper bytes are 0, also for
 * signed types; the proxy truncates them to `size` = sizeof(TYPE) and
 * interprets them by `dtype` (CPNET_T_INT32/UINT32/INT64/UINT64; float and
 * double travel as the unsigned type of their size). Fetched values are the
 * low sizeof(TYPE) bytes of ctl.result.
 *
 * FETCHING forms are blocking and return the old value (0 on failure; see
 * cpnet_ctx_last_error): atomic_fetch, atomic_swap, atomic_compare_swap,
 * atomic_fetch_add, atomic_fetch_inc, atomic_fetch_and/or/xor.
 * NON-FETCHING forms (atomic_set, atomic_add, atomic_inc, atomic_and/or/xor)
 * are FIRE-AND-FORGET, as OpenSHMEM allows: they return once the command is
 * queued (the operand is in the command, nothing is left to reuse), complete
 * in order with the context's other operations, and are complete -- their
 * errors reported -- at cpnet_quiet.
 *
 * For every (NAME, TYPE) of CPNET_AMO_STANDARD_TYPES (int, long, longlong,
 * uint, ulong, ulonglong, int32, int64, uint32, uint64, size, ptrdiff):
 *   TYPE cpnet_NAME_atomic_fetch(ctx, const TYPE* source, int pe)           §9.7.2
 *   void cpnet_NAME_atomic_set(ctx, TYPE* dest, TYPE value, int pe)         §9.7.3
 *   TYPE cpnet_NAME_atomic_compare_swap(ctx, TYPE* dest, TYPE cond, TYPE value, int pe)
 *        -- stores value if *dest == cond; returns the old *dest            §9.7.4
 *   TYPE cpnet_NAME_atomic_swap(ctx, TYPE* dest, TYPE value, int pe)        §9.7.5
 *   TYPE cpnet_NAME_atomic_fetch_inc(ctx, TYPE* dest, int pe)               §9.7.6
 *   void cpnet_NAME_atomic_inc(ctx, TYPE* dest, int pe)                     §9.7.7
 *   TYPE cpnet_NAME_atomic_fetch_add(ctx, TYPE* dest, TYPE value, int pe)   §9.7.8
 *   void cpnet_NAME_atomic_add(ctx, TYPE* dest, TYPE value, int pe)         §9.7.9
 * For float and double (CPNET_AMO_EXTENDED_ONLY_TYPES): atomic_fetch,
 * atomic_set, atomic_swap as above.
 * For every (NAME, TYPE) of CPNET_AMO_BITWISE_TYPES (uint, ulong, ulonglong,
 * int32, int64, uint32, uint64):
 *   TYPE cpnet_NAME_atomic_fetch_and / _fetch_or / _fetch_xor(ctx, TYPE* dest, TYPE value, int pe)
 *   void cpnet_NAME_atomic_and / _or / _xor(ctx, TYPE* dest, TYPE value, int pe)
 *                                                                           §9.7.10-15
 * Errors (from the proxy): CPNET_E_BAD_PE, CPNET_E_BAD_ADDR, CPNET_E_BAD_ALIGN
 * (dest not aligned to sizeof(TYPE)), CPNET_E_PEER_DEAD, CPNET_E_FABRIC; and
 * the wait failures (abort code, CPNET_E_TIMEOUT).
 */
#define CPNET_DEFINE_AMO_EXTENDED(NAME, TYPE, DT)                                                  \
    __device__ inline TYPE cpnet_##NAME##_atomic_fetch(cpnet_ctx_t* ctx, const TYPE* source, int pe) \
    {                                                                                              \
        static_assert(sizeof(TYPE) == (((DT) == CPNET_T_INT32 || (DT) == CPNET_T_UINT32) ? 4 : 8),  \
                      "cpnet: " #NAME " does not have the size of its AMO type");                 \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, source, CPNET_AMO_FETCH, DT, (TYPE)0, (TYPE)0, pe))); \
    }                                                                                              \
    __device__ inline void cpnet_##NAME##_atomic_set(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, int pe) \
    {                                                                                              \
        cpnet_detail::enqueue_nbi(                                                                 \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_SET, DT, value, (TYPE)0, pe));     \
    }                                                                                              \
    __device__ inline TYPE cpnet_##NAME##_atomic_swap(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, int pe) \
    {                                                                                              \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_SWAP, DT, value, (TYPE)0, pe)));   \
    }

#define CPNET_DEFINE_AMO_STANDARD(NAME, TYPE, DT)                                                  \
    CPNET_DEFINE_AMO_EXTENDED(NAME, TYPE, DT)                                                      \
    __device__ inline TYPE cpnet_##NAME##_atomic_compare_swap(cpnet_ctx_t* ctx, TYPE* dest,        \
                                                              TYPE cond, TYPE value, int pe)       \
    {                                                                                              \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_COMPARE_SWAP, DT, value, cond, pe))); \
    }                                                                                              \
    __device__ inline TYPE cpnet_##NAME##_atomic_fetch_add(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, \
                                                           int pe)                                 \
    {                                                                                              \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_FETCH_ADD, DT, value, (TYPE)0, pe))); \
    }                                                                                              \
    __device__ inline void cpnet_##NAME##_atomic_add(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, int pe) \
    {                                                                                              \
        cpnet_detail::enqueue_nbi(                                                                 \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_ADD, DT, value, (TYPE)0, pe));     \
    }                                                                                              \
    __device__ inline TYPE cpnet_##NAME##_atomic_fetch_inc(cpnet_ctx_t* ctx, TYPE* dest, int pe)   \
    {                                                                                              \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_FETCH_ADD, DT, (TYPE)1, (TYPE)0, pe))); \
    }                                                                                              \
    __device__ inline void cpnet_##NAME##_atomic_inc(cpnet_ctx_t* ctx, TYPE* dest, int pe)         \
    {                                                                                              \
        cpnet_detail::enqueue_nbi(                                                                 \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_ADD, DT, (TYPE)1, (TYPE)0, pe));   \
    }

/* OP is "_and", "_or", "_xor": "and", "or", "xor" are C++ alternative tokens. */
#define CPNET_DEFINE_AMO_BITWISE_OP(NAME, TYPE, DT, OP, FETCH_SUBOP, SUBOP)                        \
    __device__ inline TYPE cpnet_##NAME##_atomic_fetch##OP(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, \
                                                            int pe)                                \
    {                                                                                              \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, FETCH_SUBOP, DT, value, (TYPE)0, pe)));      \
    }                                                                                              \
    __device__ inline void cpnet_##NAME##_atomic##OP(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, int pe) \
    {                                                                                              \
        cpnet_detail::enqueue_nbi(ctx,                                                             \
                                  cpnet_detail::amo_cmd<TYPE>(ctx, dest, SUBOP, DT, value, (TYPE)0, pe)); \
    }

#define CPNET_DEFINE_AMO_BITWISE(NAME, TYPE, DT)                                                   \
    CPNET_DEFINE_AMO_BITWISE_OP(NAME, TYPE, DT, _and, CPNET_AMO_FETCH_AND, CPNET_AMO_AND)           \
    CPNET_DEFINE_AMO_BITWISE_OP(NAME, TYPE, DT, _or, CPNET_AMO_FETCH_OR, CPNET_AMO_OR)              \
    CPNET_DEFINE_AMO_BITWISE_OP(NAME, TYPE, DT, _xor, CPNET_AMO_FETCH_XOR, CPNET_AMO_XOR)

/*
 * MINIMUM AMOs -- a cpnet EXTENSION to OpenSHMEM 1.5 (which has min only as
 * a reduction, sec. 9.9.7). For every (NAME, TYPE) of CPNET_AMO_STANDARD_TYPES:
 *   TYPE cpnet_NAME_atomic_fetch_min(ctx, TYPE* dest, TYPE value, int pe)
 *        -- *dest = min(*dest, value), atomically; returns the old *dest (blocking)
 *   void cpnet_NAME_atomic_min(ctx, TYPE* dest, TYPE value, int pe)
 *        -- the same, fire-and-forget (complete at cpnet_quiet)
 * Signed comparison for signed TYPEs, unsigned for unsigned ones. Atomic with
 * respect to every other cpnet AMO on the word (cmd.h, CPNET_AMO_MIN).
 *
 * Floats as ORDERED INTEGERS: cpnet_f32_ord / cpnet_f64_ord map a float to
 * an unsigned integer whose unsigned order is the float order (sign bit set
 * for x >= +0, every bit flipped for x < 0; -0.0 maps to +0.0; NaNs are
 * outside the contract); cpnet_f32_from_ord / cpnet_f64_from_ord invert it.
 * Keep such words encoded in the heap and use
 *   float  cpnet_float_ord_atomic_fetch_min(ctx, uint32_t* dest, float value, int pe)
 *   void   cpnet_float_ord_atomic_min(ctx, uint32_t* dest, float value, int pe)
 *   double cpnet_double_ord_atomic_fetch_min(ctx, uint64_t* dest, double value, int pe)
 *   void   cpnet_double_ord_atomic_min(ctx, uint64_t* dest, double value, int pe)
 * The same encoding is cpnet_device::ordered in Rust.
 */
#define CPNET_DEFINE_AMO_MIN(NAME, TYPE, DT)                                                       \
    __device__ inline TYPE cpnet_##NAME##_atomic_fetch_min(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, \
                                                           int pe)                                 \
    {                                                                                              \
        return cpnet_detail::from_bits<TYPE>(cpnet_detail::fetch_blocking(                         \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_FETCH_MIN, DT, value, (TYPE)0, pe))); \
    }                                                                                              \
    __device__ inline void cpnet_##NAME##_atomic_min(cpnet_ctx_t* ctx, TYPE* dest, TYPE value, int pe) \
    {                                                                                              \
        cpnet_detail::enqueue_nbi(                                                                 \
            ctx, cpnet_detail::amo_cmd<TYPE>(ctx, dest, CPNET_AMO_MIN, DT, value, (TYPE)0, pe));     \
    }

CPNET_AMO_STANDARD_TYPES(CPNET_DEFINE_AMO_STANDARD)
CPNET_AMO_EXTENDED_ONLY_TYPES(CPNET_DEFINE_AMO_EXTENDED)
CPNET_AMO_BITWISE_TYPES(CPNET_DEFINE_AMO_BITWISE)
CPNET_AMO_STANDARD_TYPES(CPNET_DEFINE_AMO_MIN)

/** The ordered encoding of `x` (see "MINIMUM AMOs" above). */
__device__ inline uint32_t cpnet_f32_ord(float x)
{
    uint32_t b = __float_as_uint(x);
    if (x == 0.0f) b = 0;
    return (b >> 31) == 0 ? (b | 0x80000000u) : ~b;
}
/** The float whose ordered encoding is `e`. */
__device__ inline float cpnet_f32_from_ord(uint32_t e)
{
    return __uint_as_float((e >> 31) ? (e & 0x7fffffffu) : ~e);
}
/** The ordered encoding of `x` (see "MINIMUM AMOs" above). */
__device__ inline uint64_t cpnet_f64_ord(double x)
{
    uint64_t b = (uint64_t)__double_as_longlong(x);
    if (x == 0.0) b = 0;
    return (b >> 63) == 0 ? (b | 0x8000000000000000ull) : ~b;
}
/** The double whose ordered encoding is `e`. */
__device__ inline double cpnet_f64_from_ord(uint64_t e)
{
    return __longlong_as_double((long long)((e >> 63) ? (e & 0x7fffffffffffffffull) : ~e));
}
__device__ inline float cpnet_float_ord_atomic_fetch_min(cpnet_ctx_t* ctx, uint32_t* dest, float value, int pe)
{
    return cpnet_f32_from_ord(cpnet_uint32_atomic_fetch_min(ctx, dest, cpnet_f32_ord(value), pe));
}
__device__ inline void cpnet_float_ord_atomic_min(cpnet_ctx_t* ctx, uint32_t* dest, float value, int pe)
{
    cpnet_uint32_atomic_min(ctx, dest, cpnet_f32_ord(value), pe);
}
__device__ inline double cpnet_double_ord_atomic_fetch_min(cpnet_ctx_t* ctx, uint64_t* dest, double value, int pe)
{
    return cpnet_f64_from_ord(cpnet_uint64_atomic_fetch_min(ctx, dest, cpnet_f64_ord(value), pe));
}
__device__ inline void cpnet_double_ord_atomic_min(cpnet_ctx_t* ctx, uint64_t* dest, double value, int pe)
{
    cpnet_uint64_atomic_min(ctx, dest, cpnet_f64_ord(value), pe);
}
#undef CPNET_DEFINE_AMO_MIN
#undef CPNET_DEFINE_AMO_EXTENDED
#undef CPNET_DEFINE_AMO_STANDARD
#undef CPNET_DEFINE_AMO_BITWISE_OP
#undef CPNET_DEFINE_AMO_BITWISE

#endif /* CPNET_AMO_CUH */
