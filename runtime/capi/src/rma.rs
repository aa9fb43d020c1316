//! Contexts and remote memory access (OpenSHMEM 1.5 §9.5 "Communication
//! management routines", §9.6 "Remote memory access routines", §9.8
//! "Signaling operations", §9.11 "Memory ordering routines").
//!
//! # Private memory
//!
//! The proxy moves data only between symmetric-heap offsets. A put whose
//! source is private memory (a stack array, `malloc`) is copied into the
//! context's staging area and put from there as a non-blocking put; the
//! area is reused after the next quiet (taken implicitly when it is full).
//! So a blocking put returns once the source is copied (the spec's
//! "source may be reused", §9.6.1), not when the data has arrived; quiet,
//! fence and barrier order it as any put. A get into private memory lands
//! in the staging area and is copied out (gets are blocking; a `_nbi` get
//! into private memory completes before it returns, which §9.6.8 allows).
//! Puts of 1 to 8 bytes travel inline in the command, read at once.

use std::ffi::{c_char, c_int, c_long, c_void};

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::SignalOp;

use crate::state::{self, Ctx, CtxInner, INLINE_SLOT, State, fatal, lock};
use crate::{CTX_DEFAULT_HANDLE, CpnetCtx};

impl CtxInner {
    /// The work-group, or fatal if the context was destroyed.
    pub(crate) fn wg(&mut self, routine: *const c_char) -> &mut rt::WorkGroup {
        match self.wg.as_mut() {
            Some(w) => w,
            None => fatal(routine, "the context was destroyed"),
        }
    }

    /// `n` bytes of the staging area (8-aligned), quieting first when it is
    /// full. `n` is at most `stage_len - INLINE_SLOT`.
    fn stage(&mut self, routine: *const c_char, n: u64) -> SymAddr {
        let want = n.next_multiple_of(8);
        if self.stage_used + want > self.stage_len {
            self.quiet(routine);
        }
        let at = self.stage_off + self.stage_used;
        self.stage_used += want;
        SymAddr(at)
    }

    /// Largest piece one staging round carries.
    fn chunk(&self) -> u64 {
        self.stage_len - INLINE_SLOT
    }

    /// Quiet the context and reuse its staging area.
    pub(crate) fn quiet(&mut self, routine: *const c_char) {
        if let Err(e) = self.wg(routine).quiet() {
            fatal(routine, &e.to_string());
        }
        self.stage_used = INLINE_SLOT;
    }
}

/// Copy `n` bytes from `src` (any memory) to `dst` (the heap).
///
/// # Safety
/// 1. `src` is valid for reads of `n` bytes, `dst` for writes of `n` bytes.
/// 2. They do not overlap.
unsafe fn copy(src: *const u8, dst: *mut u8, n: u64) {
    // SAFETY: forwarded (1, 2).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n as usize) };
}

/// Check a private pointer the routine reads or writes `n` bytes through.
fn check_private(routine: *const c_char, what: &str, p: *const u8, n: u64) {
    if p.is_null() && n > 0 {
        fatal(routine, &format!("{what} is a null pointer ({n} bytes)"));
    }
}

/// Put `n` bytes from `src` (symmetric or private) to `dest` on world PE `pe`.
#[allow(clippy::too_many_arguments)] // the state, the context, the name and the put's own five
pub(crate) fn put(st: &State, inner: &mut CtxInner, routine: *const c_char, dest: SymAddr, src: *const u8, n: u64, pe: i32, nbi: bool) {
    if n == 0 {
        return;
    }
    check_private(routine, "source", src, n);
    let heap_src = st.heap_offset(src, n).ok();
    let r = if n <= 8 {
        // Inline: the context reads the bytes when it queues the command.
        let slot = SymAddr(inner.stage_off);
        // SAFETY: `src` is readable for n bytes (the caller's contract);
        // the inline slot is 64 heap bytes of this context only.
        unsafe { copy(src, st.addr(slot.0), n) };
        inner.wg(routine).putmem_nbi(dest, slot, n, pe)
    } else if let (Some(s), true) = (heap_src, nbi || n > inner.chunk()) {
        // Symmetric source: the proxy reads it where it is.
        if nbi { inner.wg(routine).putmem_nbi(dest, SymAddr(s), n, pe) } else { inner.wg(routine).putmem(dest, SymAddr(s), n, pe) }
    } else {
        let mut done = 0;
        let mut r = Ok(());
        while done < n && r.is_ok() {
            let len = (n - done).min(inner.chunk());
            let at = inner.stage(routine, len);
            // SAFETY: src + done is readable for len bytes (within n); the
            // staging bytes are this context's and not in flight (stage
            // quieted the context before reusing them).
            unsafe { copy(src.add(done as usize), st.addr(at.0), len) };
            r = inner.wg(routine).putmem_nbi(dest.add(done), at, len, pe);
            done += len;
        }
        r
    };
    if let Err(e) = r {
        fatal(routine, &e.to_string());
    }
}

/// Get `n` bytes from `source` on world PE `pe` into `dest` (symmetric or private).
#[allow(clippy::too_many_arguments)]
pub(crate) fn get(st: &State, inner: &mut CtxInner, routine: *const c_char, dest: *mut u8, source: SymAddr, n: u64, pe: i32, nbi: bool) {
    if n == 0 {
        return;
    }
    check_private(routine, "dest", dest, n);
    if let Ok(d) = st.heap_offset(dest, n) {
        let wg = inner.wg(routine);
        let r = if nbi { wg.getmem_nbi(SymAddr(d), source, n, pe) } else { wg.getmem(SymAddr(d), source, n, pe) };
        if let Err(e) = r {
            fatal(routine, &e.to_string());
        }
        return;
    }
    // Values of 1, 2, 4, 8 bytes come back in the queue's control block.
    let small = match n {
        1 => Some(inner.wg(routine).g::<u8>(source, pe).map(u64::from)),
        2 => Some(inner.wg(routine).g::<u16>(source, pe).map(u64::from)),
        4 => Some(inner.wg(routine).g::<u32>(source, pe).map(u64::from)),
        8 => Some(inner.wg(routine).g::<u64>(source, pe)),
        _ => None,
    };
    if let Some(r) = small {
        match r {
            // SAFETY: dest is writable for n bytes (caller's contract);
            // the first n little-endian bytes are the value.
            Ok(v) => unsafe { copy(v.to_le_bytes().as_ptr(), dest, n) },
            Err(e) => fatal(routine, &e.to_string()),
        }
        return;
    }
    let mut done = 0;
    while done < n {
        let len = (n - done).min(inner.chunk());
        let at = inner.stage(routine, len);
        if let Err(e) = inner.wg(routine).getmem(at, source.add(done), len, pe) {
            fatal(routine, &e.to_string());
        }
        // SAFETY: the get into the staging bytes is complete (blocking);
        // dest + done is writable for len bytes (within n).
        unsafe { copy(st.addr(at.0), dest.add(done as usize), len) };
        done += len;
    }
}

/// The state, the context and its lock for a C call.
pub(crate) fn enter(routine: *const c_char, ctx: *mut CpnetCtx) -> (&'static State, &'static Ctx) {
    let st = state::get(routine);
    let c = st.ctx(routine, ctx);
    (st, c)
}

/// Put `nbytes` bytes from `source` (symmetric or private memory) to the
/// symmetric `dest` on PE `pe` of `ctx`'s team (OpenSHMEM 1.5 §9.6.1
/// `shmem_putmem`, §9.6.7 `shmem_putmem_nbi` with `nbi != 0`). One-sided.
/// Returns once `source` may be reused; the data is delivered at the
/// context's next quiet (or earlier).
///
/// Errors (fatal: the routine's name and the reason on stderr, exit status
/// 1): before init; a bad context; `pe` outside the team; `dest` not in the
/// symmetric heap or `dest + nbytes` past its end; a null `source`; an
/// operation the proxy rejected.
///
/// # Safety
/// 1. `source` is readable for `nbytes` bytes.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_putmem(
    ctx: *mut CpnetCtx,
    dest: *mut c_void,
    source: *const c_void,
    nbytes: usize,
    pe: c_int,
    nbi: c_int,
    routine: *const c_char,
) {
    let (st, c) = enter(routine, ctx);
    let pe = st.check_pe(routine, c, pe);
    let d = st.sym(routine, "dest", dest.cast(), nbytes as u64);
    let mut inner = lock(&c.inner);
    put(st, &mut inner, routine, d, source.cast(), nbytes as u64, pe, nbi != 0);
}

/// Get `nbytes` bytes from the symmetric `source` on PE `pe` of `ctx`'s
/// team into `dest` (symmetric or private) (§9.6.4 `shmem_getmem`, §9.6.8
/// `shmem_getmem_nbi`). One-sided. Blocking gets return with the data in
/// `dest`; an `_nbi` get into symmetric memory completes at quiet.
///
/// Errors (fatal): as [`cpnet_ctx_putmem`], with `source` checked against the heap.
///
/// # Safety
/// 1. `dest` is writable for `nbytes` bytes.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_getmem(
    ctx: *mut CpnetCtx,
    dest: *mut c_void,
    source: *const c_void,
    nbytes: usize,
    pe: c_int,
    nbi: c_int,
    routine: *const c_char,
) {
    let (st, c) = enter(routine, ctx);
    let pe = st.check_pe(routine, c, pe);
    let s = st.sym(routine, "source", source.cast(), nbytes as u64);
    let mut inner = lock(&c.inner);
    get(st, &mut inner, routine, dest.cast(), s, nbytes as u64, pe, nbi != 0);
}

/// Strided put (§9.6.3 `shmem_iput`): element `i` (`elem_size` bytes) of
/// `source` at `i * sst` elements goes to `dest` at `i * dst` elements on
/// PE `pe`, for `i` in `0..nelems`. One-sided; returns once `source` may
/// be reused.
///
/// Errors (fatal): as [`cpnet_ctx_putmem`], for the whole strided range.
///
/// # Safety
/// 1. `source` is readable at every element it names.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // the OpenSHMEM signature plus the element size and name
pub unsafe extern "C" fn cpnet_ctx_iput(
    ctx: *mut CpnetCtx,
    dest: *mut c_void,
    source: *const c_void,
    dst: isize,
    sst: isize,
    nelems: usize,
    elem_size: usize,
    pe: c_int,
    routine: *const c_char,
) {
    strided(routine, ctx, dest.cast(), source.cast::<u8>().cast_mut(), dst, sst, nelems, elem_size, pe, true);
}

/// Strided get (§9.6.6 `shmem_iget`): element `i` of `source` (stride
/// `sst` elements) on PE `pe` lands at element `i * dst` of `dest`.
/// One-sided, blocking.
///
/// Errors (fatal): as [`cpnet_ctx_getmem`].
///
/// # Safety
/// 1. `dest` is writable at every element it names.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_ctx_iget(
    ctx: *mut CpnetCtx,
    dest: *mut c_void,
    source: *const c_void,
    dst: isize,
    sst: isize,
    nelems: usize,
    elem_size: usize,
    pe: c_int,
    routine: *const c_char,
) {
    strided(routine, ctx, dest.cast(), source.cast::<u8>().cast_mut(), dst, sst, nelems, elem_size, pe, false);
}

#[allow(clippy::too_many_arguments)]
fn strided(
    routine: *const c_char,
    ctx: *mut CpnetCtx,
    dest: *mut u8,
    source: *mut u8,
    dst: isize,
    sst: isize,
    nelems: usize,
    size: usize,
    pe: i32,
    is_put: bool,
) {
    let (st, c) = enter(routine, ctx);
    let pe = st.check_pe(routine, c, pe);
    if nelems == 0 || size == 0 {
        return;
    }
    let (sym_ptr, sym_stride, what) = if is_put { (dest, dst, "dest") } else { (source, sst, "source") };
    // Check the first and the last element of the symmetric side.
    let last = (nelems as isize - 1).checked_mul(sym_stride).and_then(|e| e.checked_mul(size as isize));
    let Some(last) = last else { fatal(routine, "the strided range overflows") };
    st.sym(routine, what, sym_ptr, size as u64);
    st.sym(routine, what, sym_ptr.wrapping_offset(last), size as u64);
    let mut inner = lock(&c.inner);
    let elem = |base: *mut u8, stride: isize, i: usize| base.wrapping_offset(i as isize * stride * size as isize);
    if is_put {
        for i in 0..nelems {
            let dsym = st.sym(routine, "dest", elem(dest, dst, i), size as u64);
            // Blocking put semantics: the source may change once iput returns.
            put(st, &mut inner, routine, dsym, elem(source, sst, i), size as u64, pe, false);
        }
        return;
    }
    // Gets: a batch of non-blocking gets into the staging area, one quiet,
    // then the elements copied out (one round trip per batch, not per element).
    let slot = (size as u64).next_multiple_of(8);
    let per = (inner.chunk() / slot).max(1) as usize;
    if slot > inner.chunk() {
        for i in 0..nelems {
            let ssym = st.sym(routine, "source", elem(source, sst, i), size as u64);
            get(st, &mut inner, routine, elem(dest, dst, i), ssym, size as u64, pe, false);
        }
        return;
    }
    for first in (0..nelems).step_by(per) {
        let count = per.min(nelems - first);
        inner.quiet(routine);
        let at = inner.stage(routine, count as u64 * slot);
        for k in 0..count {
            let ssym = st.sym(routine, "source", elem(source, sst, first + k), size as u64);
            if let Err(e) = inner.wg(routine).getmem_nbi(at.add(k as u64 * slot), ssym, size as u64, pe) {
                fatal(routine, &e.to_string());
            }
        }
        inner.quiet(routine);
        for k in 0..count {
            // SAFETY: the gets into the staging slots are complete (quiet);
            // dest is writable at each element (the caller's contract).
            unsafe { copy(st.addr(at.0 + k as u64 * slot), elem(dest, dst, first + k), size as u64) };
        }
    }
}

/// Put `nbytes` from `source` to `dest` on PE `pe`, then update the 64-bit
/// `sig_addr` on `pe` with `signal` by `sig_op` (`SHMEM_SIGNAL_SET` = 0,
/// `SHMEM_SIGNAL_ADD` = 1); a PE that sees the signal sees the data
/// (§9.8.1 `shmem_putmem_signal`, §9.8.2 `_nbi`). One-sided; returns once
/// `source` may be reused.
///
/// Errors (fatal): as [`cpnet_ctx_putmem`]; `sig_addr` outside the heap or
/// not 8-byte aligned; an unknown `sig_op`.
///
/// # Safety
/// 1. `source` is readable for `nbytes` bytes.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_ctx_putmem_signal(
    ctx: *mut CpnetCtx,
    dest: *mut c_void,
    source: *const c_void,
    nbytes: usize,
    sig_addr: *mut u64,
    signal: u64,
    sig_op: c_int,
    pe: c_int,
    routine: *const c_char,
) {
    let (st, c) = enter(routine, ctx);
    let pe = st.check_pe(routine, c, pe);
    let n = nbytes as u64;
    let d = st.sym(routine, "dest", dest.cast(), n);
    let sig = st.sym(routine, "sig_addr", sig_addr.cast(), 8);
    if !sig.0.is_multiple_of(8) {
        fatal(routine, &format!("sig_addr {sig_addr:p} is not 8-byte aligned"));
    }
    let op = match u8::try_from(sig_op).ok().and_then(SignalOp::from_u8) {
        Some(op) => op,
        None => fatal(routine, &format!("sig_op {sig_op} is neither SHMEM_SIGNAL_SET nor SHMEM_SIGNAL_ADD")),
    };
    let src: *const u8 = source.cast();
    check_private(routine, "source", src, n);
    let mut inner = lock(&c.inner);
    if n == 0 {
        // No data: the signal alone, as an AMO on the signal word.
        let wg = inner.wg(routine);
        let r = match op {
            SignalOp::Set => wg.atomic_set::<u64>(sig, signal, pe),
            SignalOp::Add => wg.atomic_add::<u64>(sig, signal, pe),
        };
        if let Err(e) = r {
            fatal(routine, &e.to_string());
        }
        return;
    }
    // Every piece but the last as a plain put, fenced before the last.
    let chunk = inner.chunk();
    let head = if n > chunk { n - (n - 1) % chunk - 1 } else { 0 };
    if head > 0 {
        // As a blocking put: the source may change once the call returns.
        put(st, &mut inner, routine, d, src, head, pe, false);
        if let Err(e) = inner.wg(routine).fence() {
            fatal(routine, &e.to_string());
        }
    }
    let len = n - head;
    // SAFETY: src + head is within the n readable bytes.
    let tail = unsafe { src.add(head as usize) };
    let at = if len <= 8 { SymAddr(inner.stage_off) } else { inner.stage(routine, len) };
    // SAFETY: len readable bytes at tail; the staging bytes are ours and
    // free (inline slot, or fresh from stage).
    unsafe { copy(tail, st.addr(at.0), len) };
    if let Err(e) = inner.wg(routine).putmem_signal_nbi(d.add(head), at, len, sig, signal, op, pe) {
        fatal(routine, &e.to_string());
    }
}

/// Wait until every operation `ctx` issued is complete and visible at its
/// target (§9.11.2 `shmem_ctx_quiet`). One-sided.
///
/// Errors (fatal): before init; a bad context; an earlier non-blocking
/// operation the proxy rejected (named in the message).
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_quiet(ctx: *mut CpnetCtx, routine: *const c_char) {
    let (_, c) = enter(routine, ctx);
    lock(&c.inner).quiet(routine);
}

/// Order every earlier put, AMO and put-with-signal of `ctx` to each PE
/// before every later one to that PE (§9.11.1 `shmem_ctx_fence`). Does not
/// wait. One-sided.
///
/// Errors (fatal): before init; a bad context.
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_fence(ctx: *mut CpnetCtx, routine: *const c_char) {
    let (_, c) = enter(routine, ctx);
    if let Err(e) = lock(&c.inner).wg(routine).fence() {
        fatal(routine, &e.to_string());
    }
}

/// Create a context on its own command queue for the PEs of `team` (a
/// team handle, `SHMEM_TEAM_WORLD` = 1) (§9.5.1 `shmem_ctx_create`, §9.5.2
/// `shmem_team_create_ctx`); `options` (`SHMEM_CTX_SERIALIZED`,
/// `_PRIVATE`, `_NOSTORE`) are accepted and need nothing: every context is
/// safe to use from several threads. One-sided, local. Returns 0 and
/// stores the handle in `*ctx`, or nonzero (and `SHMEM_CTX_INVALID`, null)
/// when no queue (`CPNET_QUEUES`) or staging area (16 contexts) is free or
/// this PE is not in `team`.
///
/// Errors (fatal): before init; a null `ctx`; a bad team handle.
///
/// # Safety
/// 1. `ctx` is writable.
/// 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_create(team: *mut crate::CpnetTeam, options: c_long, ctx: *mut *mut CpnetCtx, routine: *const c_char) -> c_int {
    let st = state::get(routine);
    if ctx.is_null() {
        fatal(routine, "ctx is a null pointer");
    }
    let _ = options;
    let t = crate::team::lookup(st, routine, team);
    // SAFETY: ctx is writable (contract 1), checked non-null.
    unsafe { *ctx = std::ptr::null_mut() };
    if t.my_idx.is_none() {
        return 1;
    }
    let Some(c) = new_ctx(st, t.start, t.stride, t.size, team as usize) else { return 1 };
    let p = Box::into_raw(Box::new(c));
    st.ctxs.write().unwrap_or_else(std::sync::PoisonError::into_inner).push(p as usize);
    // SAFETY: as above.
    unsafe { *ctx = p.cast() };
    0
}

/// A new context on a free queue and staging area, `None` when none is free.
pub(crate) fn new_ctx(st: &State, start: i32, stride: i32, size: i32, team: usize) -> Option<Ctx> {
    let idx = lock(&st.staging_free).pop()?;
    let wg = st.next_wg.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let made = match lock(&st.pe).as_ref() {
        Some(pe) => pe.ctx_create(wg).ok(),
        None => None,
    };
    let Some(wg) = made else {
        lock(&st.staging_free).push(idx);
        return None;
    };
    let off = st.staging_base + idx * st.staging_len;
    Some(Ctx {
        inner: std::sync::Mutex::new(CtxInner {
            wg: Some(wg),
            stage_off: off,
            stage_len: st.staging_len,
            stage_used: INLINE_SLOT,
            stage_idx: idx,
        }),
        start,
        stride,
        size,
        team,
    })
}

/// Quiet and release a context's queue and staging area.
pub(crate) fn close_ctx(st: &State, c: &Ctx, routine: *const c_char) {
    let mut inner = lock(&c.inner);
    if let Some(wg) = inner.wg.take()
        && let Err(e) = wg.destroy()
    {
        fatal(routine, &e.to_string());
    }
    lock(&st.staging_free).push(inner.stage_idx);
}

/// Quiet `ctx`, then free it (§9.5.3 `shmem_ctx_destroy`). `SHMEM_CTX_INVALID`
/// (null) is ignored; `SHMEM_CTX_DEFAULT` is refused. One-sided, local.
///
/// Errors (fatal): before init; a handle that is not a live context; an
/// earlier operation the proxy rejected.
///
/// # Safety
/// `routine` is null or a NUL-terminated string; no other thread uses `ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_destroy(ctx: *mut CpnetCtx, routine: *const c_char) {
    let st = state::get(routine);
    if ctx.is_null() {
        return;
    }
    if ctx as usize == CTX_DEFAULT_HANDLE {
        fatal(routine, "SHMEM_CTX_DEFAULT cannot be destroyed");
    }
    let c = st.ctx(routine, ctx);
    close_ctx(st, c, routine);
    let mut list = st.ctxs.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    list.retain(|&h| h != ctx as usize);
    drop(list);
    // SAFETY: the handle was a Box<Ctx> from cpnet_ctx_create, just
    // unregistered, so no later lookup reaches it; freed once.
    drop(unsafe { Box::from_raw(ctx.cast::<Ctx>()) });
}

/// The team `ctx` was created on (§9.5.4 `shmem_ctx_get_team`): stores the
/// handle in `*team` and returns 0; for `SHMEM_CTX_DEFAULT`,
/// `SHMEM_TEAM_WORLD`.
///
/// Errors (fatal): before init; a bad context; null `team`.
///
/// # Safety
/// 1. `team` is writable. 2. `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_ctx_get_team(ctx: *mut CpnetCtx, team: *mut *mut crate::CpnetTeam, routine: *const c_char) -> c_int {
    let (_, c) = enter(routine, ctx);
    if team.is_null() {
        fatal(routine, "team is a null pointer");
    }
    // SAFETY: writable (contract 1), non-null.
    unsafe { *team = c.team as *mut crate::CpnetTeam };
    0
}
