//! # libcpnet: the C ABI of cpnet
//!
//! `libcpnet.so` and `libcpnet.a`, with `cpnet.h` generated from this crate
//! by cbindgen (build.rs) and the OpenSHMEM 1.5 host API for CPU PEs on top
//! of it in the hand-written `include/shmem.h` (typed routines as
//! `static inline` functions over the generic ones here, C11 `_Generic`
//! selection, the spec's constants). `scripts/install.sh --prefix DIR`
//! installs them with `cpnet.pc`, `oshcc` and `oshrun`; docs/c-api.md shows
//! how to use them.
//!
//! The calling thread acts as a CPU work-group ([`rt::WorkGroup`]) of the
//! PE that `cpnet_init` starts ([`rt::Pe`]): every RMA, AMO and signal is a
//! 64-byte command in the context's queue that the PE's proxy thread turns
//! into libfabric operations, as for GPU work-groups.
//!
//! # The C contract
//!
//! * Every function takes `routine`, the OpenSHMEM routine's name the
//!   header passes (a string literal, or null), and names it in errors.
//! * Errors are fatal, as OpenSHMEM's routines return nothing: the routine's
//!   name and the reason are printed on stderr (`cpnet: PE 1:
//!   shmem_int_put: PE 7 is not a valid PE number: the PEs are 0 to 1`), the
//!   other PEs are told, and the process exits with status 1. Calling any
//!   routine but the init ones before init is such an error.
//! * Symmetric addresses (`dest` of a put, `source` of a get, AMO targets,
//!   signals, wait variables, collective buffers) must lie in the symmetric
//!   heap (memory from `shmem_malloc` and friends): pointers are checked
//!   (null, inside the heap, the whole range fits) before anything is
//!   queued. Global and static variables are not symmetric in cpnet.
//! * Local buffers (`source` of a put, `dest` of a get) may be any memory.
//! * Context handles: `SHMEM_CTX_DEFAULT` is `(shmem_ctx_t)1`; team handles
//!   are small integers (`SHMEM_TEAM_WORLD` 1, `SHMEM_TEAM_SHARED` 2); null
//!   is `SHMEM_CTX_INVALID` / `SHMEM_TEAM_INVALID`.
#![warn(missing_docs)]

use std::ffi::c_int;

mod amo;
mod gpu;
mod reduce;
mod rma;
mod setup;
mod state;
mod sync;
mod team;

pub use amo::*;
pub use gpu::*;
pub use rma::*;
pub use setup::*;
pub use sync::*;
pub use team::*;

/// An opaque context (`shmem_ctx_t` is a pointer to it).
#[repr(C)]
pub struct CpnetCtx {
    _opaque: [u8; 0],
}

/// An opaque team (`shmem_team_t` is a pointer to it).
#[repr(C)]
pub struct CpnetTeam {
    _opaque: [u8; 0],
}

/// A team's configuration (`shmem_team_config_t`, OpenSHMEM 1.5 §9.4.3).
#[repr(C)]
pub struct CpnetTeamConfig {
    /// Contexts the team expects to create (a hint; cpnet needs none).
    pub num_contexts: c_int,
}

/// The handle value of `SHMEM_CTX_DEFAULT`.
pub const CPNET_CTX_DEFAULT: usize = 1;
pub(crate) const CTX_DEFAULT_HANDLE: usize = CPNET_CTX_DEFAULT;

/// Element type codes (`CPNET_TYPE_*`) of the generic routines: 8-bit signed.
pub const CPNET_TYPE_INT8: c_int = 0;
/// 16-bit signed.
pub const CPNET_TYPE_INT16: c_int = 1;
/// 32-bit signed.
pub const CPNET_TYPE_INT32: c_int = 2;
/// 64-bit signed.
pub const CPNET_TYPE_INT64: c_int = 3;
/// 8-bit unsigned.
pub const CPNET_TYPE_UINT8: c_int = 4;
/// 16-bit unsigned.
pub const CPNET_TYPE_UINT16: c_int = 5;
/// 32-bit unsigned.
pub const CPNET_TYPE_UINT32: c_int = 6;
/// 64-bit unsigned.
pub const CPNET_TYPE_UINT64: c_int = 7;
/// `float`.
pub const CPNET_TYPE_FLOAT: c_int = 8;
/// `double`.
pub const CPNET_TYPE_DOUBLE: c_int = 9;

/// Bytes of an element of type code `ty`, 0 for an unknown code.
pub(crate) fn type_size(ty: c_int) -> usize {
    match ty {
        CPNET_TYPE_INT8 | CPNET_TYPE_UINT8 => 1,
        CPNET_TYPE_INT16 | CPNET_TYPE_UINT16 => 2,
        CPNET_TYPE_INT32 | CPNET_TYPE_UINT32 | CPNET_TYPE_FLOAT => 4,
        CPNET_TYPE_INT64 | CPNET_TYPE_UINT64 | CPNET_TYPE_DOUBLE => 8,
        _ => 0,
    }
}

/// Reduction operation codes (`CPNET_OP_*`, OpenSHMEM 1.5 §9.9.9): AND.
pub const CPNET_OP_AND: c_int = 0;
/// OR.
pub const CPNET_OP_OR: c_int = 1;
/// XOR.
pub const CPNET_OP_XOR: c_int = 2;
/// MAX.
pub const CPNET_OP_MAX: c_int = 3;
/// MIN.
pub const CPNET_OP_MIN: c_int = 4;
/// SUM.
pub const CPNET_OP_SUM: c_int = 5;
/// PROD.
pub const CPNET_OP_PROD: c_int = 6;

/// Atomic operation codes for [`cpnet_ctx_amo`] (cmd.h `CPNET_AMO_*`): fetch.
pub const CPNET_AMO_FETCH: c_int = 0;
/// Set.
pub const CPNET_AMO_SET: c_int = 1;
/// Swap.
pub const CPNET_AMO_SWAP: c_int = 2;
/// Compare and swap.
pub const CPNET_AMO_COMPARE_SWAP: c_int = 3;
/// Fetch and add.
pub const CPNET_AMO_FETCH_ADD: c_int = 4;
/// Add.
pub const CPNET_AMO_ADD: c_int = 5;
/// Fetch and AND.
pub const CPNET_AMO_FETCH_AND: c_int = 6;
/// AND.
pub const CPNET_AMO_AND: c_int = 7;
/// Fetch and OR.
pub const CPNET_AMO_FETCH_OR: c_int = 8;
/// OR.
pub const CPNET_AMO_OR: c_int = 9;
/// Fetch and XOR.
pub const CPNET_AMO_FETCH_XOR: c_int = 10;
/// XOR.
pub const CPNET_AMO_XOR: c_int = 11;

/// Comparison codes (cmd.h `CPNET_CMP_*`; `SHMEM_CMP_*` in shmem.h): equal.
pub const CPNET_CMP_EQ: c_int = 0;
/// Not equal.
pub const CPNET_CMP_NE: c_int = 1;
/// Greater than.
pub const CPNET_CMP_GT: c_int = 2;
/// Greater than or equal.
pub const CPNET_CMP_GE: c_int = 3;
/// Less than.
pub const CPNET_CMP_LT: c_int = 4;
/// Less than or equal.
pub const CPNET_CMP_LE: c_int = 5;

/// Signal operation codes (cmd.h `CPNET_SIGNAL_*`): set.
pub const CPNET_SIGNAL_SET: c_int = 0;
/// Add.
pub const CPNET_SIGNAL_ADD: c_int = 1;

// The codes above are cmd.h's (the C ABI passes them straight through).
const _: () = {
    use cpnet_device::layout::{AmoOp, Cmp, SignalOp};
    assert!(CPNET_AMO_FETCH == AmoOp::Fetch as c_int && CPNET_AMO_SET == AmoOp::Set as c_int);
    assert!(CPNET_AMO_SWAP == AmoOp::Swap as c_int && CPNET_AMO_COMPARE_SWAP == AmoOp::CompareSwap as c_int);
    assert!(CPNET_AMO_FETCH_ADD == AmoOp::FetchAdd as c_int && CPNET_AMO_ADD == AmoOp::Add as c_int);
    assert!(CPNET_AMO_FETCH_AND == AmoOp::FetchAnd as c_int && CPNET_AMO_AND == AmoOp::And as c_int);
    assert!(CPNET_AMO_FETCH_OR == AmoOp::FetchOr as c_int && CPNET_AMO_OR == AmoOp::Or as c_int);
    assert!(CPNET_AMO_FETCH_XOR == AmoOp::FetchXor as c_int && CPNET_AMO_XOR == AmoOp::Xor as c_int);
    assert!(CPNET_CMP_EQ == Cmp::Eq as c_int && CPNET_CMP_NE == Cmp::Ne as c_int && CPNET_CMP_GT == Cmp::Gt as c_int);
    assert!(CPNET_CMP_GE == Cmp::Ge as c_int && CPNET_CMP_LT == Cmp::Lt as c_int && CPNET_CMP_LE == Cmp::Le as c_int);
    assert!(CPNET_SIGNAL_SET == SignalOp::Set as c_int && CPNET_SIGNAL_ADD == SignalOp::Add as c_int);
};
