//! The reductions' types and operations (OpenSHMEM 1.5 §9.9.9, Table 11:
//! AND, OR, XOR on the integer types; MAX, MIN, SUM, PROD on the integer and
//! floating types): the C codes mapped onto the library's [`ReduceOp`],
//! whose CPU work-group `reduce` computes them (integer SUM and PROD wrap;
//! device-lib/src/cpu/team.rs).

use std::ffi::c_int;

use cpnet_device::cpu::ReduceOp;

use crate::*;

/// The library's operation for `op` (`CPNET_OP_*`) on type `ty`
/// (`CPNET_TYPE_*`), or `None` where Table 11 does not define it (bitwise
/// operations on floating types, unknown codes).
pub(crate) fn op_of(ty: c_int, op: c_int) -> Option<ReduceOp> {
    let float = ty == CPNET_TYPE_FLOAT || ty == CPNET_TYPE_DOUBLE;
    let int = (CPNET_TYPE_INT8..=CPNET_TYPE_UINT64).contains(&ty);
    let r = match op {
        CPNET_OP_AND => ReduceOp::And,
        CPNET_OP_OR => ReduceOp::Or,
        CPNET_OP_XOR => ReduceOp::Xor,
        CPNET_OP_MAX => ReduceOp::Max,
        CPNET_OP_MIN => ReduceOp::Min,
        CPNET_OP_SUM => ReduceOp::Sum,
        CPNET_OP_PROD => ReduceOp::Prod,
        _ => return None,
    };
    (int || (float && !r.bitwise())).then_some(r)
}
