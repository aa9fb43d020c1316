//! Library setup, exit and query (OpenSHMEM 1.5 §9.1), thread support
//! (§9.2) and the symmetric heap (§9.3).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::AtomicU32;
use std::sync::{Mutex, RwLock};

use cpnet_device::cpu::SymAddr;

use crate::state::{self, STAGING_CTXS, STAGING_MAX, State, fatal, lock};

/// `SHMEM_THREAD_MULTIPLE`: the highest thread level, which cpnet grants.
pub const CPNET_THREAD_MULTIPLE: c_int = 3;

/// Start this PE (§9.1.1 `shmem_init`, §9.2.1 `shmem_init_thread` with
/// `requested` = `SHMEM_THREAD_SINGLE` (0) ... `SHMEM_THREAD_MULTIPLE` (3)):
/// rendezvous with the other PEs (under `cpnet-run`/`oshrun`, `mpirun` or
/// `srun`: see cpnet's env module), allocate and register the symmetric
/// heap (`CPNET_HEAP_SIZE`), start the proxy thread, create the default
/// context. **Collective.** Stores the granted level (`requested`; every
/// level is supported) in `*provided` when non-null and returns 0. A
/// second call while initialized does nothing and returns 0.
///
/// Errors (fatal, naming `routine`): the launch environment or a `CPNET_*`
/// variable is malformed; the rendezvous or the fabric cannot be set up;
/// the heap is too small for cpnet's reserved part (about 1/8 of it, at
/// least 32 KiB).
///
/// # Safety
/// `provided` is writable when non-null; `routine` is null or a
/// NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_init_thread(requested: c_int, provided: *mut c_int, routine: *const c_char) -> c_int {
    let level = requested.clamp(0, CPNET_THREAD_MULTIPLE);
    if !provided.is_null() {
        // SAFETY: writable when non-null (the contract).
        unsafe { *provided = level };
    }
    if state::is_live() {
        return 0;
    }
    let pe = match rt::Pe::init() {
        Ok(pe) => pe,
        Err(e) => fatal(routine, &e.to_string()),
    };
    let heap = *pe.heap();
    let heap_size = heap.size();
    let staging_len = (STAGING_MAX.min(heap_size / 8 / STAGING_CTXS) / 64) * 64;
    if staging_len < 1024 {
        fatal(routine, &format!("the symmetric heap ({heap_size} bytes, CPNET_HEAP_SIZE) is too small: cpnet needs at least 128 KiB"));
    }
    let reserved = match pe.shmalloc(STAGING_CTXS * staging_len) {
        Ok(off) => off,
        Err(e) => fatal(routine, &e.to_string()),
    };
    let (me, n_pes) = (pe.my_pe(), pe.n_pes());
    let wait_timeout = pe.pe_info().wait_timeout;
    let wg0 = match pe.ctx_create(0) {
        Ok(w) => w,
        Err(e) => fatal(routine, &e.to_string()),
    };
    let staging_base = reserved.0;
    let default_ctx = Box::new(state::Ctx {
        inner: Mutex::new(state::CtxInner {
            wg: Some(wg0),
            stage_off: staging_base,
            stage_len: staging_len,
            stage_used: state::INLINE_SLOT,
            stage_idx: 0,
        }),
        start: 0,
        stride: 1,
        size: n_pes,
        team: 1,
    });
    let st = Box::new(State {
        pe: Mutex::new(Some(pe)),
        me,
        n_pes,
        base: heap.base() as usize,
        heap_size,
        wait_timeout,
        thread_level: level,
        default_ctx,
        ctxs: RwLock::new(Vec::new()),
        staging_free: Mutex::new((1..STAGING_CTXS).rev().collect()),
        staging_base,
        staging_len,
        teams: Mutex::new(std::array::from_fn(|_| None)),
        allocs: Mutex::new(BTreeMap::new()),
        next_wg: AtomicU32::new(1),
    });
    crate::team::install_predefined(&st);
    if state::install(st).is_err() {
        fatal(routine, "initialized twice at the same time by two threads");
    }
    0
}

/// End this PE (§9.1.4 `shmem_finalize`): quiet and release every
/// context, meet every PE at a barrier, stop the proxy, leave the
/// rendezvous. **Collective.** No routine but init may be called after it;
/// a call without init does nothing.
///
/// Errors (fatal): a peer failed; a rejected earlier operation.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_finalize(routine: *const c_char) {
    let Some(st) = state::take() else { return };
    // Contexts first (each quiets), then the PE.
    let ctxs = std::mem::take(&mut *st.ctxs.write().unwrap_or_else(std::sync::PoisonError::into_inner));
    for h in ctxs {
        // SAFETY: registered handles are live Box<Ctx> from ctx_create;
        // the registry was emptied, so nothing else frees them.
        let c = unsafe { Box::from_raw(h as *mut state::Ctx) };
        crate::rma::close_ctx(&st, &c, routine);
    }
    crate::rma::close_ctx(&st, &st.default_ctx, routine);
    crate::team::close_all(&st, routine);
    let pe = lock(&st.pe).take();
    if let Some(pe) = pe
        && let Err(e) = pe.finalize()
    {
        state::say(&format!("cpnet: PE {}: {}: {e}", st.me, state::routine_name(routine)));
        state::exit_now(1);
    }
}

/// End the whole job with `status` (§9.1.5 `shmem_global_exit`): every
/// other PE is told and ends (their waits fail, they exit after
/// `CPNET_ABORT_GRACE`); this process flushes C's stdio and exits with
/// `status` at once. One-sided. Before init, only this process exits.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_global_exit(status: c_int, routine: *const c_char) -> ! {
    let _ = routine;
    if state::is_live() {
        let st = state::get(routine);
        // try_lock: another thread may hold the PE in a collective; then
        // the other PEs learn of the exit from the launcher instead.
        if let Ok(g) = st.pe.try_lock()
            && let Some(pe) = g.as_ref()
        {
            pe.abort_job(&format!("shmem_global_exit({status}) on PE {}", st.me));
        }
    }
    state::exit_now(status)
}

/// This PE's number, `0..n_pes` (§9.1.2 `shmem_my_pe`). Local.
///
/// Errors (fatal): before init.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_my_pe(routine: *const c_char) -> c_int {
    state::get(routine).me
}

/// Number of PEs in the job (§9.1.3 `shmem_n_pes`). Local.
///
/// Errors (fatal): before init.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_n_pes(routine: *const c_char) -> c_int {
    state::get(routine).n_pes
}

/// 1 if `pe` is a PE of the job (reachable through the fabric), else 0
/// (§9.1.6 `shmem_pe_accessible`). Local.
///
/// Errors (fatal): before init.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_pe_accessible(pe: c_int, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    c_int::from(pe >= 0 && pe < st.n_pes)
}

/// 1 if `addr` is a symmetric address (in the heap) that `pe` can be
/// reached at, else 0 (§9.1.7 `shmem_addr_accessible`). Local.
///
/// Errors (fatal): before init.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_addr_accessible(addr: *const c_void, pe: c_int, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    c_int::from(pe >= 0 && pe < st.n_pes && st.heap_offset(addr.cast(), 1).is_ok())
}

/// A local pointer to `dest` on `pe` for loads and stores, or null (§9.1.8
/// `shmem_ptr`): `dest` itself for this PE, null for any other (CPU PEs'
/// heaps are only reachable through the fabric) and for addresses outside
/// the heap. Local.
///
/// Errors (fatal): before init.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ptr(dest: *const c_void, pe: c_int, routine: *const c_char) -> *mut c_void {
    let st = state::get(routine);
    if pe == st.me && st.heap_offset(dest.cast(), 1).is_ok() { dest.cast_mut() } else { std::ptr::null_mut() }
}

/// The thread level granted at init (§9.2.2 `shmem_query_thread`). Local.
///
/// Errors (fatal): before init.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_query_thread(routine: *const c_char) -> c_int {
    state::get(routine).thread_level
}

/// A static, NUL-terminated description of a cmd.h error code
/// (`CPNET_E_*`), "unknown error code" for others.
#[unsafe(no_mangle)]
pub extern "C" fn cpnet_strerror(code: c_int) -> *const c_char {
    use cpnet_device::layout::ErrorCode as E;
    let s: &'static std::ffi::CStr = match E::from_i32(code) {
        None if code == 0 => c"success",
        Some(E::BadPe) => c"the target PE is outside 0..n_pes",
        Some(E::BadAddr) => c"an address range is outside the symmetric heap",
        Some(E::BadAlign) => c"an AMO or signal address is not aligned to its size",
        Some(E::BadSize) => c"invalid size",
        Some(E::BadOp) => c"unknown operation, flag or type",
        Some(E::PeerDead) => c"the target PE died or left",
        Some(E::Timeout) => c"a wait passed its timeout (CPNET_WAIT_TIMEOUT)",
        Some(E::Fabric) => c"the fabric reported an error",
        Some(E::Aborted) => c"the job is ending",
        Some(E::NoQueue) => c"no free command queue (CPNET_QUEUES)",
        Some(E::BadTeam) => c"not a live team, or this PE is not a member",
        None => c"unknown error code",
    };
    s.as_ptr()
}

/// The heap offset of a block from `cpnet_malloc` (the same offset on every PE).
fn alloc(st: &State, routine: *const c_char, size: u64, align: u64) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    let extra = if align > rt::pe::SHMALLOC_ALIGN { align } else { 0 };
    let Some(bytes) = size.checked_add(extra) else { fatal(routine, &format!("size {size} overflows")) };
    let got = match lock(&st.pe).as_ref() {
        Some(pe) => pe.shmalloc(bytes),
        None => return std::ptr::null_mut(),
    };
    let off = match got {
        Ok(off) => off.0,
        Err(rt::pe::Error::OutOfHeap { .. }) => return std::ptr::null_mut(),
        Err(e) => fatal(routine, &e.to_string()),
    };
    let user = if extra > 0 { (st.base as u64 + off).next_multiple_of(align) - st.base as u64 } else { off };
    lock(&st.allocs).insert(user, (off, size));
    st.addr(user).cast()
}

/// Allocate `size` bytes of symmetric memory, aligned to 64 bytes, the
/// same offset on every PE (§9.3.1 `shmem_malloc`). **Collective**, with
/// the same `size` everywhere. Returns null for `size` 0 or when the heap
/// (`CPNET_HEAP_SIZE`) has no block that large.
///
/// Errors (fatal): before init; PEs passing different sizes.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_malloc(size: usize, routine: *const c_char) -> *mut c_void {
    let st = state::get(routine);
    alloc(st, routine, size as u64, 0)
}

/// [`cpnet_malloc`] of `count * size` bytes, zeroed, with a barrier so no
/// PE writes into it before every PE has cleared it (§9.3.3
/// `shmem_calloc`). **Collective.**
///
/// Errors (fatal): as [`cpnet_malloc`]; `count * size` overflows.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_calloc(count: usize, size: usize, routine: *const c_char) -> *mut c_void {
    let st = state::get(routine);
    let Some(bytes) = count.checked_mul(size) else { fatal(routine, &format!("{count} x {size} bytes overflows")) };
    let p = alloc(st, routine, bytes as u64, 0);
    if !p.is_null() {
        // SAFETY: a fresh block of `bytes` bytes inside the heap.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
        // SAFETY: `routine` is this function's, under the same contract.
        unsafe { crate::sync::cpnet_barrier_all(routine) };
    }
    p
}

/// [`cpnet_malloc`] aligned to `alignment` bytes, a power of two (§9.3.1
/// `shmem_align`). **Collective.**
///
/// Errors (fatal): as [`cpnet_malloc`]; an alignment that is not a power of two.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_align(alignment: usize, size: usize, routine: *const c_char) -> *mut c_void {
    let st = state::get(routine);
    if !alignment.is_power_of_two() {
        fatal(routine, &format!("alignment {alignment} is not a power of two"));
    }
    alloc(st, routine, size as u64, alignment as u64)
}

/// Free a block from the allocation routines (§9.3.1 `shmem_free`): first
/// completes the default context's operations; null does nothing.
/// **Collective** (a barrier), with the same block everywhere.
///
/// Errors (fatal): before init; a pointer that is not a live block;
/// different blocks on different PEs.
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_free(ptr: *mut c_void, routine: *const c_char) {
    let st = state::get(routine);
    if ptr.is_null() {
        return;
    }
    let off = match st.heap_offset(ptr.cast(), 0) {
        Ok(o) => o,
        Err(why) => fatal(routine, &format!("ptr {why}")),
    };
    let Some((alloc_off, _)) = lock(&st.allocs).remove(&off) else {
        fatal(routine, &format!("{ptr:p} is not a block returned by shmem_malloc (or it was freed already)"));
    };
    lock(&st.default_ctx.inner).quiet(routine);
    if let Some(pe) = lock(&st.pe).as_ref()
        && let Err(e) = pe.shfree(SymAddr(alloc_off))
    {
        fatal(routine, &e.to_string());
    }
}

/// Resize a block (§9.3.1 `shmem_realloc`): a new block of `size` bytes
/// holding the old contents up to the smaller size, the old one freed;
/// `ptr` null allocates, `size` 0 frees and returns null. Returns null
/// (the old block kept) when the heap has no room. **Collective.**
///
/// Errors (fatal): as [`cpnet_free`].
///
/// # Safety
/// `routine` is null or a NUL-terminated string (the headers pass literals).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_realloc(ptr: *mut c_void, size: usize, routine: *const c_char) -> *mut c_void {
    let st = state::get(routine);
    if ptr.is_null() {
        return alloc(st, routine, size as u64, 0);
    }
    if size == 0 {
        // SAFETY: `routine` is this function's, under the same contract.
        unsafe { cpnet_free(ptr, routine) };
        return std::ptr::null_mut();
    }
    let off = st.heap_offset(ptr.cast(), 0).unwrap_or(u64::MAX);
    let Some(&(_, old)) = lock(&st.allocs).get(&off) else {
        fatal(routine, &format!("{ptr:p} is not a block returned by shmem_malloc (or it was freed already)"));
    };
    let p = alloc(st, routine, size as u64, 0);
    if p.is_null() {
        return p;
    }
    // SAFETY: both blocks are live heap blocks of at least min(old, size)
    // bytes; distinct blocks do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), p.cast::<u8>(), old.min(size as u64) as usize) };
    // SAFETY: as above.
    unsafe { cpnet_free(ptr, routine) };
    p
}
