//! The process-wide state behind the C API: the [`rt::Pe`] that
//! `shmem_init` / `cpnet_init` creates, the contexts, the teams, the
//! reserved part of the symmetric heap, and the two ways a C call fails:
//! [`fatal`] (print the routine's name and the reason, tell the other PEs,
//! exit with status 1) and the pointer checks every routine runs before it
//! queues anything ([`State::sym`], [`State::check_pe`]).
//!
//! # Reserved heap
//!
//! `cpnet_init` allocates one block at the start of the symmetric heap
//! (collectively, so it is at the same offset on every PE):
//!
//! | offset | bytes | use |
//! |---|---|---|
//! | 0 | `STAGING_CTXS * staging` | per context: a staging area, the source of puts from private memory and the landing place of gets into it ([`crate::rma`]) |
//!
//! The teams' scratch is the runtime's (its team table, [`crate::team`]).
//!
//! The proxy reads put sources and writes get results only inside the
//! symmetric heap (offsets, never raw pointers: DESIGN.md), so data from or
//! to private C memory goes through the caller's staging area.

use std::collections::BTreeMap;
use std::ffi::{CStr, c_char};
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use cpnet_device::cpu::SymAddr;
use rt::{Pe, WorkGroup};

use crate::team::Team;

/// Team slots of a PE (handles 1..=TEAM_SLOTS): world, shared and 62
/// split teams.
pub(crate) const TEAM_SLOTS: usize = 64;
/// Contexts that can hold a staging area at once (the default one included).
pub(crate) const STAGING_CTXS: u64 = 16;
/// Staging bytes per context, at most (less when the heap is small:
/// the staging areas take at most an eighth of it).
pub(crate) const STAGING_MAX: u64 = 256 << 10;
/// Bytes at the start of each staging area kept for puts of 1..=8 bytes,
/// which the context reads at once (they travel inline in the command).
pub(crate) const INLINE_SLOT: u64 = 64;

/// The state: created by `cpnet_init`, dropped by `cpnet_finalize`.
pub(crate) struct State {
    /// The PE (`None` once finalize has taken it).
    pub(crate) pe: Mutex<Option<Pe>>,
    /// This PE.
    pub(crate) me: i32,
    /// PEs in the job.
    pub(crate) n_pes: i32,
    /// The symmetric heap in this process: base address and bytes.
    pub(crate) base: usize,
    /// Bytes of the symmetric heap.
    pub(crate) heap_size: u64,
    /// How long a wait may take (`CPNET_WAIT_TIMEOUT`).
    pub(crate) wait_timeout: Option<std::time::Duration>,
    /// The thread level granted (`SHMEM_THREAD_*`).
    pub(crate) thread_level: i32,
    /// The default context (`SHMEM_CTX_DEFAULT`).
    pub(crate) default_ctx: Box<Ctx>,
    /// Contexts from `shmem_ctx_create` (their addresses), to refuse a
    /// handle that is not one.
    pub(crate) ctxs: RwLock<Vec<usize>>,
    /// Free staging areas (index into the staging region).
    pub(crate) staging_free: Mutex<Vec<u64>>,
    /// Offset of the first staging area, and bytes per area.
    pub(crate) staging_base: u64,
    pub(crate) staging_len: u64,
    /// Team slots; slot `i` is handle `i + 1`.
    pub(crate) teams: Mutex<[Option<std::sync::Arc<Team>>; TEAM_SLOTS]>,
    /// User allocations: the offset handed out -> (offset allocated, bytes asked).
    pub(crate) allocs: Mutex<BTreeMap<u64, (u64, u64)>>,
    /// Next work-group id for a new context.
    pub(crate) next_wg: AtomicU32,
}

/// A context (`shmem_ctx_t`): a work-group context on its own queue, its
/// staging area, and the team whose PE numbers it takes.
pub(crate) struct Ctx {
    pub(crate) inner: Mutex<CtxInner>,
    /// World PE of team PE 0, the stride and the size (the world team:
    /// `0, 1, n_pes`).
    pub(crate) start: i32,
    pub(crate) stride: i32,
    pub(crate) size: i32,
    /// The team handle it was created on (for `shmem_ctx_get_team`).
    pub(crate) team: usize,
}

/// What a context's lock guards.
pub(crate) struct CtxInner {
    /// `None` once destroyed.
    pub(crate) wg: Option<WorkGroup>,
    /// The staging area: heap offset, bytes, and bytes handed out since the
    /// last quiet (from `INLINE_SLOT` on).
    pub(crate) stage_off: u64,
    pub(crate) stage_len: u64,
    pub(crate) stage_used: u64,
    /// Index of the staging area (to give it back).
    pub(crate) stage_idx: u64,
}

/// The live state: null before init and after finalize.
static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

/// The routine name a C caller passed (the header passes `__func__`-like
/// literals); "cpnet" for null.
pub(crate) fn routine_name(routine: *const c_char) -> String {
    if routine.is_null() {
        return "cpnet".to_owned();
    }
    // SAFETY: the headers pass string literals (NUL-terminated, static);
    // a C caller passing something else breaks the documented contract.
    unsafe { CStr::from_ptr(routine) }.to_string_lossy().into_owned()
}

/// Print `cpnet: PE <me>: <routine>: <why>` on stderr, tell the other PEs
/// (they abort naming this PE), flush C's stdio, and exit with status 1.
/// The OpenSHMEM routines return nothing, so every error is fatal (as
/// `shmem_global_exit(1)` would be).
pub(crate) fn fatal(routine: *const c_char, why: &str) -> ! {
    let name = routine_name(routine);
    let st = STATE.load(Ordering::Acquire);
    let who = if st.is_null() {
        String::new()
    } else {
        // SAFETY: non-null STATE points at the live boxed State (leaked
        // until finalize, which nulls it first).
        let s = unsafe { &*st };
        format!("PE {}: ", s.me)
    };
    let line = format!("cpnet: {who}{name}: {why}");
    say(&line);
    if !st.is_null() {
        // SAFETY: as above.
        let s = unsafe { &*st };
        if let Ok(g) = s.pe.try_lock()
            && let Some(pe) = g.as_ref()
        {
            pe.abort_job(&format!("{name}: {why}"));
        }
    }
    exit_now(1)
}

/// Flush C's stdio buffers and `_exit(status)` (not `exit`: proxy threads
/// may be inside libfabric; see `rt::pe`'s exit after a failure).
pub(crate) fn exit_now(status: i32) -> ! {
    // SAFETY: fflush(NULL) flushes every C output stream; _exit ends the
    // process at once.
    unsafe {
        libc::fflush(std::ptr::null_mut());
        libc::_exit(status)
    }
}

/// One line to stderr in one write.
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

/// Install `s` as the live state. Fails (returns it back) if one is live.
pub(crate) fn install(s: Box<State>) -> Result<(), Box<State>> {
    let p = Box::into_raw(s);
    // AcqRel: publishes the State's fields to every thread that loads
    // STATE with Acquire (get); Acquire on failure is not needed.
    match STATE.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Relaxed) {
        Ok(_) => Ok(()),
        // SAFETY: `p` came from Box::into_raw just above and was not published.
        Err(_) => Err(unsafe { Box::from_raw(p) }),
    }
}

/// Take the live state out (finalize). The caller must be the only thread
/// using it (finalize's contract, OpenSHMEM 1.5 §9.1.4).
pub(crate) fn take() -> Option<Box<State>> {
    // AcqRel: pairs with install's publication.
    let p = STATE.swap(std::ptr::null_mut(), Ordering::AcqRel);
    // SAFETY: non-null values of STATE come from Box::into_raw in install
    // and are taken out once (this swap).
    (!p.is_null()).then(|| unsafe { Box::from_raw(p) })
}

/// Whether init has run (and finalize has not).
pub(crate) fn is_live() -> bool {
    !STATE.load(Ordering::Acquire).is_null()
}

/// The live state, or a fatal "called before shmem_init" naming `routine`.
pub(crate) fn get(routine: *const c_char) -> &'static State {
    // Acquire: pairs with install's AcqRel.
    let p = STATE.load(Ordering::Acquire);
    if p.is_null() {
        fatal(routine, "called before shmem_init (or after shmem_finalize): initialize the library first");
    }
    // SAFETY: the State lives until finalize takes it; calling a routine
    // concurrently with finalize is outside the OpenSHMEM contract.
    unsafe { &*p }
}

/// Lock `m`, ignoring poisoning (a panic in another C call already ended
/// that call; the data is still consistent for our uses).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// The heap offset of `[ptr, ptr + len)`, which must lie in the
    /// symmetric heap; otherwise a fatal error naming `routine` and `what`
    /// ("dest", "source", "ivar", ...).
    pub(crate) fn sym(&self, routine: *const c_char, what: &str, ptr: *const u8, len: u64) -> SymAddr {
        match self.heap_offset(ptr, len) {
            Ok(off) => SymAddr(off),
            Err(why) => fatal(routine, &format!("{what} {why}")),
        }
    }

    /// The heap offset of `[ptr, ptr + len)`, or why it is not one.
    pub(crate) fn heap_offset(&self, ptr: *const u8, len: u64) -> Result<u64, String> {
        let (a, base, size) = (ptr as usize, self.base, self.heap_size);
        if ptr.is_null() {
            return Err("is a null pointer".to_owned());
        }
        if a < base || a >= base + size as usize {
            return Err(format!(
                "{ptr:p} is not in the symmetric heap [{:#x}, {:#x}) (only shmem_malloc'd memory is symmetric in cpnet)",
                base,
                base + size as usize
            ));
        }
        let off = (a - base) as u64;
        match off.checked_add(len) {
            Some(end) if end <= size => Ok(off),
            _ => Err(format!(
                "{ptr:p} + {len} bytes does not fit in the symmetric heap: it ends {} bytes past its end ({size} bytes)",
                off.saturating_add(len) - size
            )),
        }
    }

    /// The address of heap offset `off` in this process.
    pub(crate) fn addr(&self, off: u64) -> *mut u8 {
        (self.base + off as usize) as *mut u8
    }

    /// `pe` as a world PE through `ctx`'s team; fatal if outside it.
    pub(crate) fn check_pe(&self, routine: *const c_char, ctx: &Ctx, pe: i32) -> i32 {
        if pe < 0 || pe >= ctx.size {
            let team = if ctx.size == self.n_pes && ctx.stride == 1 { String::new() } else { " of the context's team".to_owned() };
            fatal(routine, &format!("PE {pe} is not a valid PE number{team}: the PEs are 0 to {}", ctx.size - 1));
        }
        ctx.start + pe * ctx.stride
    }

    /// The context behind a C handle: `SHMEM_CTX_DEFAULT` (1) or one from
    /// `shmem_ctx_create`; fatal otherwise.
    pub(crate) fn ctx(&self, routine: *const c_char, handle: *mut crate::CpnetCtx) -> &Ctx {
        let h = handle as usize;
        if h == crate::CTX_DEFAULT_HANDLE {
            return &self.default_ctx;
        }
        let known = self.ctxs.read().unwrap_or_else(PoisonError::into_inner).contains(&h);
        if !known {
            fatal(routine, &format!("{handle:p} is not a live context (SHMEM_CTX_INVALID or destroyed)"));
        }
        // SAFETY: `h` is the address of a Box<Ctx> still registered (it is
        // unregistered before it is freed, by ctx_destroy under the write lock).
        unsafe { &*(h as *const Ctx) }
    }
}
