//! The element-wise operations of the reductions (OpenSHMEM 1.5 §9.9.9,
//! Table 11: AND, OR, XOR on the integer types; MAX, MIN, SUM, PROD on the
//! integer and floating types). Integer SUM and PROD wrap.

use std::ffi::c_int;

use crate::*;

/// Whether `op` is defined for `ty`.
pub(crate) fn supports(ty: c_int, op: c_int) -> bool {
    let float = ty == CPNET_TYPE_FLOAT || ty == CPNET_TYPE_DOUBLE;
    let int = (CPNET_TYPE_INT8..=CPNET_TYPE_UINT64).contains(&ty);
    match op {
        CPNET_OP_AND | CPNET_OP_OR | CPNET_OP_XOR => int,
        CPNET_OP_MAX | CPNET_OP_MIN | CPNET_OP_SUM | CPNET_OP_PROD => int || float,
        _ => false,
    }
}

macro_rules! int_ops {
    ($t:ty, $op:expr, $acc:expr, $other:expr) => {{
        const N: usize = core::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut(N).zip($other.chunks_exact(N)) {
            let x = <$t>::from_ne_bytes(a.try_into().expect("N bytes"));
            let y = <$t>::from_ne_bytes(b.try_into().expect("N bytes"));
            let r = match $op {
                CPNET_OP_AND => x & y,
                CPNET_OP_OR => x | y,
                CPNET_OP_XOR => x ^ y,
                CPNET_OP_MAX => x.max(y),
                CPNET_OP_MIN => x.min(y),
                CPNET_OP_SUM => x.wrapping_add(y),
                _ => x.wrapping_mul(y),
            };
            a.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

macro_rules! float_ops {
    ($t:ty, $op:expr, $acc:expr, $other:expr) => {{
        const N: usize = core::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut(N).zip($other.chunks_exact(N)) {
            let x = <$t>::from_ne_bytes(a.try_into().expect("N bytes"));
            let y = <$t>::from_ne_bytes(b.try_into().expect("N bytes"));
            let r = match $op {
                CPNET_OP_MAX => x.max(y),
                CPNET_OP_MIN => x.min(y),
                CPNET_OP_SUM => x + y,
                _ => x * y,
            };
            a.copy_from_slice(&r.to_ne_bytes());
        }
    }};
}

/// `acc[i] = acc[i] <op> other[i]` for every element of type `ty` (both
/// slices hold whole elements; `supports(ty, op)` holds).
pub(crate) fn combine(ty: c_int, op: c_int, acc: &mut [u8], other: &[u8]) {
    match ty {
        CPNET_TYPE_INT8 => int_ops!(i8, op, acc, other),
        CPNET_TYPE_INT16 => int_ops!(i16, op, acc, other),
        CPNET_TYPE_INT32 => int_ops!(i32, op, acc, other),
        CPNET_TYPE_INT64 => int_ops!(i64, op, acc, other),
        CPNET_TYPE_UINT8 => int_ops!(u8, op, acc, other),
        CPNET_TYPE_UINT16 => int_ops!(u16, op, acc, other),
        CPNET_TYPE_UINT32 => int_ops!(u32, op, acc, other),
        CPNET_TYPE_UINT64 => int_ops!(u64, op, acc, other),
        CPNET_TYPE_FLOAT => float_ops!(f32, op, acc, other),
        _ => float_ops!(f64, op, acc, other),
    }
}
