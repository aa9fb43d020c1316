//! Point-to-point synchronization (OpenSHMEM 1.5 §9.10: wait_until, test
//! and their `_all`, `_any`, `_some` and `_vector` forms,
//! signal_wait_until), signals (§9.8.3 signal_fetch), barrier_all (§9.9.1)
//! and distributed locks (§9.12).
//!
//! Waits poll local symmetric memory with acquire loads (pairing with the
//! release by which a put, AMO or signal lands), bounded by
//! `CPNET_WAIT_TIMEOUT`: a wait that passes it ends the program with the
//! routine's name, the address, the expected and the last seen values.

use std::ffi::{c_char, c_int, c_long, c_void};
use std::sync::atomic::{AtomicI16, AtomicI32, AtomicI64, AtomicU16, AtomicU32, AtomicU64, Ordering};

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::Cmp;
use cpnet_device::sync::{Deadline, Spin};

use crate::state::{self, State, fatal, lock};
use crate::type_size;

/// A value of a point-to-point type, widened for comparison.
#[derive(Clone, Copy, PartialEq, PartialOrd, Debug)]
enum Val {
    S(i64),
    U(u64),
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::S(v) => write!(f, "{v}"),
            Val::U(v) => write!(f, "{v}"),
        }
    }
}

/// Load the `ty` value at `p` with acquire (atomic: other PEs' AMOs and
/// signals land in it).
///
/// # Safety
/// `p` is aligned to the type's size and inside the symmetric heap.
unsafe fn load(p: *mut u8, ty: c_int) -> Val {
    // SAFETY: (every arm) p is aligned and in the heap (the contract); the
    // heap is only accessed atomically or by copies OpenSHMEM lets race.
    // Acquire: pairs with the release that published the value (the
    // proxy's or the provider's delivery of a put, signal or AMO).
    unsafe {
        match ty {
            crate::CPNET_TYPE_INT16 => Val::S(i64::from(AtomicI16::from_ptr(p.cast()).load(Ordering::Acquire))),
            crate::CPNET_TYPE_INT32 => Val::S(i64::from(AtomicI32::from_ptr(p.cast()).load(Ordering::Acquire))),
            crate::CPNET_TYPE_INT64 => Val::S(AtomicI64::from_ptr(p.cast()).load(Ordering::Acquire)),
            crate::CPNET_TYPE_UINT16 => Val::U(u64::from(AtomicU16::from_ptr(p.cast()).load(Ordering::Acquire))),
            crate::CPNET_TYPE_UINT32 => Val::U(u64::from(AtomicU32::from_ptr(p.cast()).load(Ordering::Acquire))),
            _ => Val::U(AtomicU64::from_ptr(p.cast()).load(Ordering::Acquire)),
        }
    }
}

/// Read a comparison value of type `ty` at `p` (private memory, plain read).
///
/// # Safety
/// `p` is readable for the type's size.
unsafe fn value_at(p: *const u8, ty: c_int) -> Val {
    // SAFETY: readable (the contract); unaligned reads allowed.
    unsafe {
        match ty {
            crate::CPNET_TYPE_INT16 => Val::S(i64::from(p.cast::<i16>().read_unaligned())),
            crate::CPNET_TYPE_INT32 => Val::S(i64::from(p.cast::<i32>().read_unaligned())),
            crate::CPNET_TYPE_INT64 => Val::S(p.cast::<i64>().read_unaligned()),
            crate::CPNET_TYPE_UINT16 => Val::U(u64::from(p.cast::<u16>().read_unaligned())),
            crate::CPNET_TYPE_UINT32 => Val::U(u64::from(p.cast::<u32>().read_unaligned())),
            _ => Val::U(p.cast::<u64>().read_unaligned()),
        }
    }
}

/// `WAIT_ALL`: every element; `WAIT_ANY`: one; `WAIT_SOME`: at least one, all reported.
pub const CPNET_WAIT_ALL: c_int = 0;
/// See [`CPNET_WAIT_ALL`].
pub const CPNET_WAIT_ANY: c_int = 1;
/// See [`CPNET_WAIT_ALL`].
pub const CPNET_WAIT_SOME: c_int = 2;

/// Whether the job is being aborted (a peer died): checked now and then in
/// waits so they end instead of running into their timeout.
fn aborted(st: &State) -> Option<String> {
    let g = st.default_ctx.inner.try_lock().ok()?;
    g.wg.as_ref()?.check_abort().err().map(|e| e.to_string())
}

/// Wait on (or, with `block == 0`, test) `nelems` local symmetric variables
/// of type `ty` (`CPNET_TYPE_INT16` ... `CPNET_TYPE_UINT64`) at `ivars`,
/// skipping element `i` where `status` is non-null and `status[i] != 0`,
/// for `ivars[i] <cmp> value` (`cmp`: `SHMEM_CMP_EQ` ... `SHMEM_CMP_LE`),
/// `value` at `values` (one value, or with `vector != 0` one per element)
/// (§9.10.1-§9.10.13). `mode`: [`CPNET_WAIT_ALL`] returns 1 when all hold
/// (0 if testing and not); [`CPNET_WAIT_ANY`] returns the index of one
/// element that holds (`SIZE_MAX` if none does, or all are skipped);
/// [`CPNET_WAIT_SOME`] writes the indices of all that hold to `indices`
/// and returns their number (waiting until it is at least 1, unless all
/// are skipped). One-sided, local.
///
/// Errors (fatal, naming `routine`): before init; `ivars` (any element)
/// outside the heap or misaligned; an unknown type, comparison or mode; a
/// wait past `CPNET_WAIT_TIMEOUT` (naming the element, the expected and
/// the last value seen); a peer's failure.
///
/// # Safety
/// 1. `values` is readable for one (or `nelems`) values of the type,
///    `status` (if non-null) for `nelems` ints, `indices` (for
///    `CPNET_WAIT_SOME`) writable for `nelems` `size_t`s.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_wait(
    ivars: *mut c_void,
    nelems: usize,
    status: *const c_int,
    ty: c_int,
    cmp: c_int,
    values: *const c_void,
    vector: c_int,
    mode: c_int,
    block: c_int,
    indices: *mut usize,
    routine: *const c_char,
) -> usize {
    let st = state::get(routine);
    let size = match ty {
        crate::CPNET_TYPE_INT16..=crate::CPNET_TYPE_INT64 | crate::CPNET_TYPE_UINT16..=crate::CPNET_TYPE_UINT64 => type_size(ty),
        _ => fatal(routine, &format!("type code {ty} is not a point-to-point synchronization type")),
    };
    let Some(cmp) = u8::try_from(cmp).ok().and_then(Cmp::from_u8) else {
        fatal(routine, &format!("comparison {cmp} is not one of SHMEM_CMP_EQ..SHMEM_CMP_LE"));
    };
    if !(CPNET_WAIT_ALL..=CPNET_WAIT_SOME).contains(&mode) {
        fatal(routine, &format!("unknown wait mode {mode}"));
    }
    if nelems > 0 && values.is_null() {
        fatal(routine, "the comparison values are a null pointer");
    }
    if mode == CPNET_WAIT_SOME && nelems > 0 && indices.is_null() {
        fatal(routine, "indices is a null pointer");
    }
    let base: *mut u8 = ivars.cast();
    let off = st.sym(routine, "ivars", base, (nelems.max(1) * size) as u64);
    if !off.0.is_multiple_of(size as u64) {
        fatal(routine, &format!("ivars {ivars:p} is not aligned to its {size} bytes"));
    }
    // SAFETY: status is readable for nelems ints when non-null (contract 1).
    let skip = |i: usize| !status.is_null() && unsafe { *status.add(i) } != 0;
    let expected = |i: usize| {
        let at = if vector != 0 { i * size } else { 0 };
        // SAFETY: values readable for one or nelems values (contract 1).
        unsafe { value_at(values.cast::<u8>().add(at), ty) }
    };
    let active: Vec<usize> = (0..nelems).filter(|&i| !skip(i)).collect();
    if active.is_empty() {
        return if mode == CPNET_WAIT_ALL { 1 } else if mode == CPNET_WAIT_ANY { usize::MAX } else { 0 };
    }
    let deadline = Deadline::after(st.wait_timeout);
    let spin = Spin::new();
    let mut done = vec![false; nelems];
    let mut polls = 0u64;
    loop {
        let mut found = Vec::new();
        let mut last = (0, Val::U(0));
        for &i in &active {
            if done[i] {
                continue;
            }
            // SAFETY: element i is inside the checked, aligned range.
            let v = unsafe { load(base.add(i * size), ty) };
            if cmp.holds(v, expected(i)) {
                match mode {
                    CPNET_WAIT_ANY => return i,
                    CPNET_WAIT_ALL => done[i] = true,
                    _ => found.push(i),
                }
            } else {
                last = (i, v);
            }
        }
        if mode == CPNET_WAIT_ALL && active.iter().all(|&i| done[i]) {
            return 1;
        }
        if mode == CPNET_WAIT_SOME && !found.is_empty() {
            for (k, &i) in found.iter().enumerate() {
                // SAFETY: indices writable for nelems size_t (contract 1); k < nelems.
                unsafe { *indices.add(k) = i };
            }
            return found.len();
        }
        if block == 0 {
            return if mode == CPNET_WAIT_ANY { usize::MAX } else { 0 };
        }
        polls += 1;
        if polls.is_multiple_of(1024)
            && let Some(why) = aborted(st)
        {
            fatal(routine, &why);
        }
        if deadline.expired() {
            let (i, v) = last;
            fatal(
                routine,
                &format!(
                    "timed out after {:?} (CPNET_WAIT_TIMEOUT) waiting for ivars[{i}] (heap+{:#x}) {} {}: found {v}",
                    st.wait_timeout.unwrap_or_default(),
                    off.0 + (i * size) as u64,
                    cmp_op(cmp),
                    expected(i),
                ),
            );
        }
        spin.step();
    }
}

fn cmp_op(c: Cmp) -> &'static str {
    match c {
        Cmp::Eq => "==",
        Cmp::Ne => "!=",
        Cmp::Gt => ">",
        Cmp::Ge => ">=",
        Cmp::Lt => "<",
        Cmp::Le => "<=",
    }
}

/// Wait until the local 64-bit signal `sig_addr` satisfies `cmp` against
/// `value` and return the value that did (§9.10.14
/// `shmem_signal_wait_until`). One-sided, local.
///
/// Errors (fatal): as [`cpnet_wait`].
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_signal_wait_until(sig_addr: *mut u64, cmp: c_int, value: u64, routine: *const c_char) -> u64 {
    // SAFETY: one value at &value; no status, no indices.
    unsafe {
        cpnet_wait(
            sig_addr.cast(),
            1,
            std::ptr::null(),
            crate::CPNET_TYPE_UINT64,
            cmp,
            (&raw const value).cast(),
            0,
            CPNET_WAIT_ALL,
            1,
            std::ptr::null_mut(),
            routine,
        )
    };
    // SAFETY: `routine` is this function's, under the same contract.
    unsafe { cpnet_signal_fetch(sig_addr, routine) }
}

/// The local 64-bit signal at `sig_addr`, read atomically with acquire
/// (§9.8.3 `shmem_signal_fetch`). One-sided, local.
///
/// Errors (fatal): before init; `sig_addr` outside the heap or misaligned.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_signal_fetch(sig_addr: *const u64, routine: *const c_char) -> u64 {
    let st = state::get(routine);
    let off = st.sym(routine, "sig_addr", sig_addr.cast(), 8);
    if !off.0.is_multiple_of(8) {
        fatal(routine, &format!("sig_addr {sig_addr:p} is not 8-byte aligned"));
    }
    // SAFETY: inside the heap and 8-aligned (checked).
    match unsafe { load(st.addr(off.0), crate::CPNET_TYPE_UINT64) } {
        Val::U(v) => v,
        Val::S(v) => v as u64,
    }
}

/// Complete every operation of the default context, then wait until every
/// PE has called it (§9.9.1 `shmem_barrier_all`). **Collective** over all PEs.
///
/// Errors (fatal): before init; a rejected earlier operation; a peer's
/// failure or a barrier past `CPNET_WAIT_TIMEOUT`.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_barrier_all(routine: *const c_char) {
    let st = state::get(routine);
    let mut inner = lock(&st.default_ctx.inner);
    if let Err(e) = inner.wg(routine).barrier_all() {
        fatal(routine, &e.to_string());
    }
    inner.stage_used = state::INLINE_SLOT;
}

/// The default context and the world PE of the lock's home (PE 0).
fn lock_word(routine: *const c_char, lock_ptr: *mut c_long) -> (&'static State, SymAddr) {
    let st = state::get(routine);
    let off = st.sym(routine, "lock", lock_ptr.cast(), 8);
    if !off.0.is_multiple_of(8) {
        fatal(routine, &format!("lock {lock_ptr:p} is not 8-byte aligned"));
    }
    (st, off)
}

fn lock_amo(st: &State, routine: *const c_char, f: impl FnOnce(&mut rt::WorkGroup) -> Result<u64, cpnet_device::cpu::Error>) -> u64 {
    let mut inner = lock(&st.default_ctx.inner);
    match f(inner.wg(routine)) {
        Ok(v) => v,
        Err(e) => fatal(routine, &e.to_string()),
    }
}

/// Acquire the distributed lock `lock` (a symmetric `long`, zero before
/// first use), waiting as long as another PE holds it (§9.12.1
/// `shmem_set_lock`). A ticket lock held in PE 0's copy of the word: the
/// high 32 bits hand out tickets, the low 32 bits count releases, so
/// waiters are served in arrival order. One-sided (on PE 0's word).
///
/// Errors (fatal): before init; `lock` outside the heap or misaligned; a
/// wait past `CPNET_WAIT_TIMEOUT`.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_set_lock(lock_ptr: *mut c_long, routine: *const c_char) {
    let (st, w) = lock_word(routine, lock_ptr);
    let ticket = (lock_amo(st, routine, |wg| wg.atomic_fetch_add::<u64>(w, 1 << 32, 0)) >> 32) as u32;
    let deadline = Deadline::after(st.wait_timeout);
    let spin = Spin::new();
    loop {
        let v = lock_amo(st, routine, |wg| wg.atomic_fetch::<u64>(w, 0));
        if v as u32 == ticket {
            return;
        }
        if deadline.expired() {
            fatal(routine, &format!("timed out after {:?} waiting for lock {lock_ptr:p} (ticket {ticket}, serving {})", st.wait_timeout.unwrap_or_default(), v as u32));
        }
        spin.step();
    }
}

/// Release `lock` after completing this PE's operations on the default
/// context (§9.12.1 `shmem_clear_lock`). One-sided.
///
/// Errors (fatal): as [`cpnet_set_lock`].
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_clear_lock(lock_ptr: *mut c_long, routine: *const c_char) {
    let (st, w) = lock_word(routine, lock_ptr);
    let mut inner = lock(&st.default_ctx.inner);
    inner.quiet(routine);
    let wg = inner.wg(routine);
    if let Err(e) = wg.atomic_add::<u64>(w, 1, 0).and_then(|()| wg.quiet()) {
        fatal(routine, &e.to_string());
    }
}

/// Take `lock` if it is free: returns 0 when this call acquired it, 1 when
/// another PE holds it (§9.12.1 `shmem_test_lock`). One-sided.
///
/// Errors (fatal): as [`cpnet_set_lock`].
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_test_lock(lock_ptr: *mut c_long, routine: *const c_char) -> c_int {
    let (st, w) = lock_word(routine, lock_ptr);
    let v = lock_amo(st, routine, |wg| wg.atomic_fetch::<u64>(w, 0));
    if (v >> 32) as u32 != v as u32 {
        return 1;
    }
    let old = lock_amo(st, routine, |wg| wg.atomic_compare_swap::<u64>(w, v, v.wrapping_add(1 << 32), 0));
    c_int::from(old != v)
}
