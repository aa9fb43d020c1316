//! Atomic memory operations (OpenSHMEM 1.5 §9.7) through the context's
//! queue: the proxy executes them at the target with the provider's
//! atomics, so they are atomic with respect to every other cpnet AMO on the
//! same word (not to plain loads and stores of it, nor to puts: §9.7's
//! "atomicity guarantees"). 4- and 8-byte types; `float`/`double` through
//! their bits for fetch, set and swap (the extended AMOs).

use std::ffi::{c_char, c_int, c_void};

use cpnet_device::cpu::{AmoType, SymAddr};
use cpnet_device::layout::AmoOp;

use crate::CpnetCtx;
use crate::rma::enter;
use crate::state::{fatal, lock};

fn amo_t<T: AmoType>(wg: &mut rt::WorkGroup, op: AmoOp, dest: SymAddr, value: T, cond: T, pe: i32) -> Result<T, cpnet_device::cpu::Error> {
    let zero = T::from_bits(0);
    match op {
        AmoOp::Fetch => wg.atomic_fetch(dest, pe),
        AmoOp::Set => wg.atomic_set(dest, value, pe).map(|()| zero),
        AmoOp::Swap => wg.atomic_swap(dest, value, pe),
        AmoOp::CompareSwap => wg.atomic_compare_swap(dest, cond, value, pe),
        AmoOp::FetchAdd => wg.atomic_fetch_add(dest, value, pe),
        AmoOp::Add => wg.atomic_add(dest, value, pe).map(|()| zero),
        AmoOp::FetchAnd => wg.atomic_fetch_and(dest, value, pe),
        AmoOp::And => wg.atomic_and(dest, value, pe).map(|()| zero),
        AmoOp::FetchOr => wg.atomic_fetch_or(dest, value, pe),
        AmoOp::Or => wg.atomic_or(dest, value, pe).map(|()| zero),
        AmoOp::FetchXor => wg.atomic_fetch_xor(dest, value, pe),
        AmoOp::Xor => wg.atomic_xor(dest, value, pe).map(|()| zero),
        // cpnet's extension (not in OpenSHMEM 1.5; no shmem.h name yet).
        AmoOp::FetchMin => wg.atomic_fetch_min(dest, value, pe),
        AmoOp::Min => wg.atomic_min(dest, value, pe).map(|()| zero),
    }
}

/// Atomic operation `op` (`CPNET_AMO_*`) on the `size`-byte word `dest`
/// (4 or 8) on PE `pe` of `ctx`'s team, with operand `value` (and `cond`
/// for compare-swap), as bits in the low `size` bytes (§9.7.1-§9.7.14:
/// `shmem_atomic_fetch`, `set`, `compare_swap`, `swap`, `fetch_inc`, `inc`,
/// `fetch_add`, `add`, `fetch_and`, `and`, `fetch_or`, `or`, `fetch_xor`,
/// `xor`). Returns the old value for the fetching operations (blocking),
/// 0 for the others, which complete at quiet and are ordered by fence.
/// One-sided.
///
/// Errors (fatal, naming `routine`): before init; a bad context; `pe`
/// outside the team; `dest` outside the heap or not aligned to `size`; a
/// `size` other than 4 or 8; an unknown `op`; a failure at the target.
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_ctx_amo(
    ctx: *mut CpnetCtx,
    op: c_int,
    size: c_int,
    dest: *mut c_void,
    value: u64,
    cond: u64,
    pe: c_int,
    routine: *const c_char,
) -> u64 {
    let (st, c) = enter(routine, ctx);
    let pe = st.check_pe(routine, c, pe);
    let Some(op) = u8::try_from(op).ok().and_then(AmoOp::from_u8) else {
        fatal(routine, &format!("unknown atomic operation {op}"));
    };
    if size != 4 && size != 8 {
        fatal(routine, &format!("atomics act on 4- or 8-byte words, not {size} bytes"));
    }
    let d = st.sym(routine, "dest", dest.cast(), size as u64);
    if !d.0.is_multiple_of(size as u64) {
        fatal(routine, &format!("dest {dest:p} is not aligned to its {size} bytes"));
    }
    let mut inner = lock(&c.inner);
    let wg = inner.wg(routine);
    let r = if size == 4 {
        amo_t::<u32>(wg, op, d, value as u32, cond as u32, pe).map(u64::from)
    } else {
        amo_t::<u64>(wg, op, d, value, cond, pe)
    };
    match r {
        Ok(v) => v,
        Err(e) => fatal(routine, &e.to_string()),
    }
}
