//! The CPU work-group: the device API of `include/cpnet/device.cuh`, in
//! Rust, for CPU threads. A [`CpuCtx`] claims a queue of the same pool kind
//! a GPU uses and writes the same 64-byte commands with the same protocol,
//! so the proxy cannot tell a CPU work-group from a GPU one (the paper's
//! "CPU" configuration, and the backend CI runs).
//!
//! Every operation is one-sided (OpenSHMEM 1.5 §9.5-9.10) unless it says
//! otherwise. Symmetric addresses are [`SymAddr`]s: byte offsets into the
//! symmetric heap, the same on every PE. Blocking calls return when the
//! operation is complete (puts: delivered to the target; gets and fetching
//! AMOs: value returned); `_nbi` calls return once the command is queued and
//! complete at [`CpuCtx::quiet`]; a rejection of an nbi command is reported
//! by the next blocking call or quiet.

use core::ptr::NonNull;
use std::time::Duration;

use crate::layout::{self, AmoOp, Cmd, Cmp, ErrorCode, SignalOp};
use crate::ring::{Producer, QueueMem, QueuePool, RingError};
use crate::sync::{AtomicU32, AtomicU64, Deadline, Ordering, Spin};

mod team;
pub use team::{ReduceOp, ReduceType};

/// A symmetric address: a byte offset into the symmetric heap, valid on every PE.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SymAddr(pub u64);

impl SymAddr {
    /// The byte offset.
    pub const fn offset(self) -> u64 {
        self.0
    }

    /// The address `bytes` further on.
    pub const fn add(self, bytes: u64) -> SymAddr {
        SymAddr(self.0 + bytes)
    }
}

impl core::fmt::Display for SymAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "heap+{:#x}", self.0)
    }
}

/// This PE's symmetric heap as this process sees it.
#[derive(Clone, Copy, Debug)]
pub struct HeapView {
    base: NonNull<u8>,
    size: u64,
}

// SAFETY: a view; all access through it is atomic or by the proxy's fabric
// operations, per the contract of `from_raw`.
unsafe impl Send for HeapView {}
// SAFETY: as above.
unsafe impl Sync for HeapView {}

impl HeapView {
    /// The heap of `size` bytes at `base`.
    ///
    /// # Safety
    /// 1. `base` is 64-byte aligned and valid for reads and writes of `size`
    ///    bytes for as long as the view (or a context using it) lives.
    /// 2. Concurrent writers of the heap (the proxy, remote PEs through the
    ///    fabric) write words a reader polls with atomics or aligned stores.
    pub unsafe fn from_raw(base: *mut u8, size: u64) -> HeapView {
        HeapView { base: NonNull::new(base).expect("HeapView: null base"), size }
    }

    /// Bytes in the heap.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The base address.
    pub fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// Check that `[addr, addr + len)` lies in the heap.
    ///
    /// # Errors
    /// [`ErrorCode::BadAddr`] otherwise.
    pub fn check(&self, addr: SymAddr, len: u64) -> core::result::Result<(), ErrorCode> {
        match addr.0.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(ErrorCode::BadAddr),
        }
    }

    /// Copy `len` bytes at `addr` out of the local heap.
    ///
    /// # Errors
    /// [`ErrorCode::BadAddr`] if the range is outside the heap.
    pub fn read_bytes(&self, addr: SymAddr, out: &mut [u8]) -> core::result::Result<(), ErrorCode> {
        self.check(addr, out.len() as u64)?;
        // SAFETY: in bounds (checked); the heap is valid memory (from_raw).
        // Racing writers are possible by design (one-sided RMA); bytes copied
        // during a concurrent remote write are unspecified, as in OpenSHMEM.
        unsafe { core::ptr::copy_nonoverlapping(self.base.as_ptr().add(addr.0 as usize), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copy `data` into the local heap at `addr`.
    ///
    /// # Errors
    /// [`ErrorCode::BadAddr`] if the range is outside the heap.
    pub fn write_bytes(&self, addr: SymAddr, data: &[u8]) -> core::result::Result<(), ErrorCode> {
        self.check(addr, data.len() as u64)?;
        // SAFETY: in bounds (checked); see read_bytes on races.
        unsafe { core::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(addr.0 as usize), data.len()) };
        Ok(())
    }

    /// The 64-bit word at `addr` as an atomic.
    ///
    /// # Errors
    /// [`ErrorCode::BadAddr`] or [`ErrorCode::BadAlign`].
    pub fn atomic_u64(&self, addr: SymAddr) -> core::result::Result<&AtomicU64, ErrorCode> {
        self.check(addr, 8)?;
        if !addr.0.is_multiple_of(8) {
            return Err(ErrorCode::BadAlign);
        }
        // SAFETY: in bounds and 8-aligned (base is 64-aligned); every
        // concurrent access is atomic per from_raw's contract.
        Ok(unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(addr.0 as usize).cast()) })
    }

    /// The 32-bit word at `addr` as an atomic.
    ///
    /// # Errors
    /// [`ErrorCode::BadAddr`] or [`ErrorCode::BadAlign`].
    pub fn atomic_u32(&self, addr: SymAddr) -> core::result::Result<&AtomicU32, ErrorCode> {
        self.check(addr, 4)?;
        if !addr.0.is_multiple_of(4) {
            return Err(ErrorCode::BadAlign);
        }
        // SAFETY: as atomic_u64, 4-aligned.
        Ok(unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(addr.0 as usize).cast()) })
    }
}

/// What a work-group knows about its PE.
#[derive(Clone, Copy, Debug)]
pub struct PeInfo {
    /// This PE.
    pub my_pe: i32,
    /// Number of PEs.
    pub n_pes: i32,
    /// This PE's symmetric heap.
    pub heap: HeapView,
    /// How long any wait may take before it reports what it waits for
    /// (`None`: forever).
    pub wait_timeout: Option<Duration>,
}

/// A value that can travel in a put/get of up to 8 bytes (typed `p`/`g`).
pub trait RmaType: Copy + Send + Sync + core::fmt::Debug + 'static {
    /// Bytes.
    const SIZE: u64;
    /// The value's bytes, little-endian, zero-extended to 64 bits.
    fn to_bits(self) -> u64;
    /// The value from the low `SIZE` bytes of `bits`.
    fn from_bits(bits: u64) -> Self;
}

macro_rules! rma_int {
    ($($t:ty => $u:ty),*) => {$(
        impl RmaType for $t {
            const SIZE: u64 = core::mem::size_of::<$t>() as u64;
            fn to_bits(self) -> u64 { self as $u as u64 }
            fn from_bits(bits: u64) -> Self { bits as $u as $t }
        }
    )*};
}
rma_int!(u8 => u8, i8 => u8, u16 => u16, i16 => u16, u32 => u32, i32 => u32, u64 => u64, i64 => u64, usize => u64, isize => u64);

impl RmaType for f32 {
    const SIZE: u64 = 4;
    fn to_bits(self) -> u64 {
        u64::from(f32::to_bits(self))
    }
    fn from_bits(bits: u64) -> Self {
        f32::from_bits(bits as u32)
    }
}

impl RmaType for f64 {
    const SIZE: u64 = 8;
    fn to_bits(self) -> u64 {
        f64::to_bits(self)
    }
    fn from_bits(bits: u64) -> Self {
        f64::from_bits(bits)
    }
}

/// A type with remote atomics (OpenSHMEM 1.5 §9.7 standard AMO types that
/// cpnet carries: int32, int64, uint32, uint64), also usable with
/// `wait_until` / `test` on local symmetric memory.
pub trait AmoType: RmaType + PartialOrd + core::fmt::Display {
    /// The cmd.h type code.
    const TYPE: layout::AmoType;
}
impl AmoType for i32 {
    const TYPE: layout::AmoType = layout::AmoType::Int32;
}
impl AmoType for u32 {
    const TYPE: layout::AmoType = layout::AmoType::Uint32;
}
impl AmoType for i64 {
    const TYPE: layout::AmoType = layout::AmoType::Int64;
}
impl AmoType for u64 {
    const TYPE: layout::AmoType = layout::AmoType::Uint64;
}

/// Errors of CPU work-group operations. Each names the work-group, the PE,
/// the operation and the address concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The operation was rejected or failed (by the proxy, or by a local
    /// check before it was queued).
    #[error("PE {my_pe} work-group {wg}: {op} to PE {pe} at {addr} failed: {code}")]
    Op {
        /// This PE.
        my_pe: i32,
        /// The work-group.
        wg: u32,
        /// The operation, as in the device API ("putmem", "atomic_fetch_add", ...).
        op: &'static str,
        /// Its target PE.
        pe: i32,
        /// The address concerned.
        addr: SymAddr,
        /// Why.
        code: ErrorCode,
    },
    /// A wait on local symmetric memory passed its timeout.
    #[error(
        "PE {my_pe} work-group {wg}: {op} on {addr} timed out after {timeout:?}: waiting for value {cmp} {expected}, found {found}"
    )]
    WaitTimeout {
        /// This PE (the memory waited on is local).
        my_pe: i32,
        /// The work-group.
        wg: u32,
        /// "wait_until" or "signal_wait_until".
        op: &'static str,
        /// The address waited on.
        addr: SymAddr,
        /// The comparison.
        cmp: Cmp,
        /// The value waited for (as u64 bits, sign-extended for signed types).
        expected: i128,
        /// The value last seen.
        found: i128,
        /// The timeout.
        timeout: Duration,
    },
    /// The queue itself failed (timeout, abort, a rejected earlier nbi op).
    // `cause` is part of the message and deliberately not a `source()`, so
    // printing the error chain does not repeat it.
    #[error("PE {my_pe} work-group {wg} (queue {queue}): {op}: {cause}")]
    Queue {
        /// This PE.
        my_pe: i32,
        /// The work-group.
        wg: u32,
        /// The queue.
        queue: usize,
        /// The operation that saw it.
        op: &'static str,
        /// The ring's error.
        cause: RingError,
    },
    /// No queue of the pool is free.
    #[error("PE {my_pe} work-group {wg}: ctx_create: no free queue in a pool of {pool}")]
    NoQueue {
        /// This PE.
        my_pe: i32,
        /// The work-group.
        wg: u32,
        /// Queues in the pool.
        pool: usize,
    },
}

impl Error {
    /// The cmd.h error code this error corresponds to.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Op { code, .. } => *code,
            Error::WaitTimeout { .. } => ErrorCode::Timeout,
            Error::Queue { cause, .. } => match cause {
                RingError::Rejected { code, .. } | RingError::Aborted(code) => *code,
                RingError::Timeout { .. } => ErrorCode::Timeout,
                RingError::BadDepth(_) | RingError::Protocol { .. } => ErrorCode::BadOp,
            },
            Error::NoQueue { .. } => ErrorCode::NoQueue,
        }
    }
}

/// Result of CPU work-group operations.
pub type Result<T> = core::result::Result<T, Error>;

/// A CPU work-group's context: one queue, claimed from a pool
/// (`cpnet_ctx_create`, paper §4.2.1), and the operations of the device API.
///
/// Not `Sync`: one work-group (thread) issues on a context, as one block does
/// on the GPU.
pub struct CpuCtx {
    prod: Producer,
    queue: usize,
    pe: PeInfo,
    wg: u32,
    /// The commands of the last `depth` seqs, to name an nbi command the
    /// proxy rejected later.
    history: Vec<Cmd>,
}

impl core::fmt::Debug for CpuCtx {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CpuCtx").field("queue", &self.queue).field("wg", &self.wg).field("my_pe", &self.pe.my_pe).finish()
    }
}

fn op_name(cmd: &Cmd) -> &'static str {
    cmd.op_name()
}

fn op_addr(cmd: &Cmd) -> SymAddr {
    SymAddr(cmd.target_addr())
}

impl CpuCtx {
    /// Claim a free queue of `pool` for work-group `wg` (tries queue
    /// `wg % len` first, then every other). One-sided, local.
    ///
    /// # Errors
    /// [`Error::NoQueue`] when every queue is in use.
    pub fn create(pool: &QueuePool, pe: PeInfo, wg: u32) -> Result<CpuCtx> {
        let n = pool.len();
        let first = wg as usize % n;
        for k in 0..n {
            let i = (first + k) % n;
            let q = pool.queue(i);
            if q.try_claim(wg) {
                return Ok(CpuCtx::attach(q, i, pe, wg));
            }
        }
        Err(Error::NoQueue { my_pe: pe.my_pe, wg, pool: n })
    }

    fn attach(q: QueueMem, queue: usize, pe: PeInfo, wg: u32) -> CpuCtx {
        let depth = q.geometry().depth() as usize;
        CpuCtx { prod: Producer::new(q), queue, pe, wg, history: vec![Cmd::default(); depth] }
    }

    /// Quiet, then give the queue back to the pool (`cpnet_ctx_destroy`).
    ///
    /// # Errors
    /// As [`CpuCtx::quiet`]; the queue is released in any case.
    pub fn destroy(mut self) -> Result<()> {
        let r = self.quiet();
        let q = self.prod.detach();
        q.release();
        r
    }

    /// This PE (`cpnet_my_pe`).
    pub fn my_pe(&self) -> i32 {
        self.pe.my_pe
    }

    /// Number of PEs (`cpnet_n_pes`).
    pub fn n_pes(&self) -> i32 {
        self.pe.n_pes
    }

    /// The work-group id.
    pub fn wg(&self) -> u32 {
        self.wg
    }

    /// The pool index of this context's queue.
    pub fn queue(&self) -> usize {
        self.queue
    }

    /// This PE's heap.
    pub fn heap(&self) -> &HeapView {
        &self.pe.heap
    }

    /// Where this work-group can load and store the symmetric object at
    /// `addr` of PE `pe` directly (`cpnet_ptr`; OpenSHMEM 1.5 §9.2.8,
    /// shmem_ptr). CPU PEs are separate processes whose heaps only the
    /// fabric reaches, so this is `Some` for `pe == my_pe` with `addr`
    /// inside the heap, `None` otherwise. One-sided, local. Access through
    /// the pointer is the caller's: other PEs' puts and AMOs land in the
    /// same bytes, so use atomics (or order it with a wait that acquires).
    pub fn ptr(&self, addr: SymAddr, pe: i32) -> Option<NonNull<u8>> {
        if pe != self.pe.my_pe || self.pe.heap.check(addr, 1).is_err() {
            return None;
        }
        NonNull::new(self.pe.heap.base().wrapping_add(addr.0 as usize))
    }

    fn deadline(&self) -> Deadline {
        Deadline::after(self.pe.wait_timeout)
    }

    fn queue_err(&self, op: &'static str, source: RingError) -> Error {
        if let RingError::Rejected { seq, code } = source {
            let h = self.history[(seq & self.prod.mem().geometry().mask()) as usize];
            if h.commit == seq + 1 {
                return Error::Op { my_pe: self.pe.my_pe, wg: self.wg, op: op_name(&h), pe: h.pe, addr: op_addr(&h), code };
            }
        }
        Error::Queue { my_pe: self.pe.my_pe, wg: self.wg, queue: self.queue, op, cause: source }
    }

    fn local_err(&self, op: &'static str, pe: i32, addr: SymAddr, code: ErrorCode) -> Error {
        Error::Op { my_pe: self.pe.my_pe, wg: self.wg, op, pe, addr, code }
    }

    /// Queue `cmd`; returns its seq. The clock is read only when the ring
    /// is full (the deadline starts then): a vDSO `clock_gettime` per
    /// command was 5 % of an 8-byte `putmem_nbi` loop's time.
    fn issue(&mut self, cmd: Cmd) -> Result<u64> {
        let seq = match self.prod.try_push(&cmd) {
            Some(seq) => seq,
            None => {
                let deadline = self.deadline();
                self.prod.push(&cmd, &deadline).map_err(|e| self.queue_err(op_name(&cmd), e))?
            }
        };
        let mask = self.prod.mem().geometry().mask();
        self.history[(seq & mask) as usize] = Cmd { commit: seq + 1, ..cmd };
        Ok(seq)
    }

    /// Queue `cmd` and wait for its completion; returns `ctl.result` if `want`.
    fn issue_wait(&mut self, cmd: Cmd, want: bool) -> Result<u64> {
        let seq = self.issue(cmd.blocking())?;
        let deadline = self.deadline();
        self.prod.wait_complete(seq, want, &deadline).map_err(|e| self.queue_err(op_name(&cmd), e))
    }

    /// A blocking no-op: one round trip through the proxy.
    ///
    /// # Errors
    /// Queue errors (timeout, abort, an earlier rejected nbi command).
    pub fn nop(&mut self) -> Result<()> {
        self.issue_wait(Cmd::nop(), false).map(drop)
    }

    /// The source bytes of a put small enough to travel inline (1 to 8
    /// bytes, as on the GPU), read from the local heap now; `None` for a put
    /// that references its source by heap offset.
    fn inline_source(&self, op: &'static str, source: SymAddr, nbytes: u64, pe: i32) -> Result<Option<([u8; 8], usize)>> {
        if nbytes == 0 || nbytes > layout::CPNET_INLINE_MAX as u64 {
            return Ok(None);
        }
        let mut buf = [0u8; 8];
        let n = nbytes as usize;
        self.pe.heap.read_bytes(source, &mut buf[..n]).map_err(|c| self.local_err(op, pe, source, c))?;
        Ok(Some((buf, n)))
    }

    fn put_cmd(&self, dest: SymAddr, source: SymAddr, nbytes: u64, pe: i32) -> Result<Cmd> {
        Ok(match self.inline_source("putmem", source, nbytes, pe)? {
            Some((buf, n)) => Cmd::put_inline(pe, dest.0, &buf[..n]).expect("at most 8 bytes"),
            None => Cmd::put(pe, dest.0, source.0, nbytes),
        })
    }

    /// Copy `nbytes` bytes from local symmetric `source` to symmetric `dest`
    /// on `pe`; returns when the data is delivered (OpenSHMEM 1.5 §9.5.1,
    /// `shmem_putmem`). Payloads of at most 8 bytes travel inline.
    ///
    /// # Errors
    /// [`Error::Op`] with `BadPe`, `BadAddr` (either range outside the heap),
    /// `PeerDead`, `Fabric`; queue errors.
    pub fn putmem(&mut self, dest: SymAddr, source: SymAddr, nbytes: u64, pe: i32) -> Result<()> {
        let cmd = self.put_cmd(dest, source, nbytes, pe)?;
        self.issue_wait(cmd, false).map(drop)
    }

    /// [`CpuCtx::putmem`], non-blocking: complete at [`CpuCtx::quiet`]
    /// (§9.5.2, `shmem_putmem_nbi`). `source` must not change before then
    /// (unless the payload went inline, at most 8 bytes).
    ///
    /// # Errors
    /// Queue errors; a rejection is reported by a later blocking call.
    pub fn putmem_nbi(&mut self, dest: SymAddr, source: SymAddr, nbytes: u64, pe: i32) -> Result<()> {
        let cmd = self.put_cmd(dest, source, nbytes, pe)?;
        self.issue(cmd).map(drop)
    }

    /// Copy `nbytes` bytes from symmetric `source` on `pe` to local
    /// symmetric `dest` (§9.5.3, `shmem_getmem`); returns when the data is here.
    ///
    /// # Errors
    /// As [`CpuCtx::putmem`].
    pub fn getmem(&mut self, dest: SymAddr, source: SymAddr, nbytes: u64, pe: i32) -> Result<()> {
        self.issue_wait(Cmd::get(pe, dest.0, source.0, nbytes), false).map(drop)
    }

    /// [`CpuCtx::getmem`], non-blocking: `dest` is valid after
    /// [`CpuCtx::quiet`] (§9.5.4, `shmem_getmem_nbi`).
    ///
    /// # Errors
    /// Queue errors.
    pub fn getmem_nbi(&mut self, dest: SymAddr, source: SymAddr, nbytes: u64, pe: i32) -> Result<()> {
        self.issue(Cmd::get(pe, dest.0, source.0, nbytes)).map(drop)
    }

    /// Store one element `value` at symmetric `dest` on `pe` (§9.5.1,
    /// `shmem_<T>_p`); the value travels inline. Blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::putmem`].
    pub fn p<T: RmaType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        let bytes = value.to_bits().to_le_bytes();
        let cmd = Cmd::put_inline(pe, dest.0, &bytes[..T::SIZE as usize]).expect("RmaType fits inline");
        self.issue_wait(cmd, false).map(drop)
    }

    /// Load one element from symmetric `source` on `pe` (§9.5.3,
    /// `shmem_<T>_g`); the value comes back in the queue's control block.
    ///
    /// # Errors
    /// As [`CpuCtx::getmem`].
    pub fn g<T: RmaType>(&mut self, source: SymAddr, pe: i32) -> Result<T> {
        let cmd = Cmd::get_inline(pe, source.0, T::SIZE).expect("RmaType fits inline");
        self.issue_wait(cmd, true).map(T::from_bits)
    }

    #[allow(clippy::too_many_arguments)] // the OpenSHMEM signature plus the op name
    fn put_signal_cmd(
        &self,
        dest: SymAddr,
        source: SymAddr,
        nbytes: u64,
        sig_addr: SymAddr,
        signal: u64,
        sig_op: SignalOp,
        pe: i32,
    ) -> Result<Cmd> {
        Ok(match self.inline_source("putmem_signal", source, nbytes, pe)? {
            Some((buf, n)) => {
                Cmd::put_signal_inline(pe, dest.0, &buf[..n], sig_addr.0, signal, sig_op).expect("at most 8 bytes")
            }
            None => Cmd::put_signal(pe, dest.0, source.0, nbytes, sig_addr.0, signal, sig_op),
        })
    }

    /// Put `nbytes` from `source` to `dest` on `pe`, then update the 64-bit
    /// signal word `sig_addr` on `pe` with `signal` by `sig_op`; the signal
    /// is visible only after the data (§9.8.1, `shmem_putmem_signal`). Blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::putmem`], plus `BadAlign` for a signal word not 8-aligned.
    #[allow(clippy::too_many_arguments)]
    pub fn putmem_signal(
        &mut self,
        dest: SymAddr,
        source: SymAddr,
        nbytes: u64,
        sig_addr: SymAddr,
        signal: u64,
        sig_op: SignalOp,
        pe: i32,
    ) -> Result<()> {
        let cmd = self.put_signal_cmd(dest, source, nbytes, sig_addr, signal, sig_op, pe)?;
        self.issue_wait(cmd, false).map(drop)
    }

    /// [`CpuCtx::putmem_signal`], non-blocking (§9.8.1, `shmem_putmem_signal_nbi`).
    ///
    /// # Errors
    /// Queue errors.
    #[allow(clippy::too_many_arguments)]
    pub fn putmem_signal_nbi(
        &mut self,
        dest: SymAddr,
        source: SymAddr,
        nbytes: u64,
        sig_addr: SymAddr,
        signal: u64,
        sig_op: SignalOp,
        pe: i32,
    ) -> Result<()> {
        let cmd = self.put_signal_cmd(dest, source, nbytes, sig_addr, signal, sig_op, pe)?;
        self.issue(cmd).map(drop)
    }

    fn load_local<T: AmoType>(&self, ivar: SymAddr) -> core::result::Result<T, ErrorCode> {
        // Acquire: pairs with the writer's release (the proxy's or the
        // fabric's delivery of a put/signal that completed before the
        // signal became visible), so data put before a signal is visible
        // once the signal is seen.
        match T::SIZE {
            4 => Ok(T::from_bits(u64::from(self.pe.heap.atomic_u32(ivar)?.load(Ordering::Acquire)))),
            8 => Ok(T::from_bits(self.pe.heap.atomic_u64(ivar)?.load(Ordering::Acquire))),
            _ => Err(ErrorCode::BadSize),
        }
    }

    /// Whether local symmetric `ivar` satisfies `cmp` against `value`
    /// (§9.10.3, `shmem_<T>_test`). Local, no command.
    ///
    /// # Errors
    /// [`Error::Op`] with `BadAddr` / `BadAlign`; the abort code once the
    /// job is ending (so a polling loop ends when a peer dies).
    pub fn test<T: AmoType>(&self, ivar: SymAddr, cmp: Cmp, value: T) -> Result<bool> {
        self.check_abort()?;
        let found = self.load_local::<T>(ivar).map_err(|c| self.local_err("test", self.pe.my_pe, ivar, c))?;
        Ok(cmp.holds(found, value))
    }

    fn wait_local<T: AmoType>(&self, op: &'static str, ivar: SymAddr, cmp: Cmp, value: T) -> Result<T> {
        let deadline = self.deadline();
        let spin = Spin::new();
        loop {
            let found = self.load_local::<T>(ivar).map_err(|c| self.local_err(op, self.pe.my_pe, ivar, c))?;
            if cmp.holds(found, value) {
                return Ok(found);
            }
            if let Some(code) = self.prod.mem().abort_code() {
                return Err(self.queue_err(op, RingError::Aborted(code)));
            }
            if deadline.expired() {
                return Err(Error::WaitTimeout {
                    my_pe: self.pe.my_pe,
                    wg: self.wg,
                    op,
                    addr: ivar,
                    cmp,
                    expected: signed_view(value),
                    found: signed_view(found),
                    timeout: self.pe.wait_timeout.unwrap_or_default(),
                });
            }
            spin.step();
        }
    }

    /// `Err` with the abort code (`PEER_DEAD`, ...) once the job is ending,
    /// else `Ok`: for work-groups that poll memory in their own loops.
    /// Local, no command; one load of a word in the queue's control block.
    ///
    /// # Errors
    /// [`Error::Queue`] with [`RingError::Aborted`].
    pub fn check_abort(&self) -> Result<()> {
        match self.prod.mem().abort_code() {
            Some(code) => Err(self.queue_err("check_abort", RingError::Aborted(code))),
            None => Ok(()),
        }
    }

    /// Wait until local symmetric `ivar` satisfies `cmp` against `value`
    /// (§9.10.1, `shmem_<T>_wait_until`). Local, no command.
    ///
    /// # Errors
    /// [`Error::WaitTimeout`] (naming the address, expected and found
    /// values) after the PE's wait timeout; `BadAddr` / `BadAlign`; abort.
    pub fn wait_until<T: AmoType>(&self, ivar: SymAddr, cmp: Cmp, value: T) -> Result<()> {
        self.wait_local("wait_until", ivar, cmp, value).map(drop)
    }

    /// Wait until the local 64-bit signal word `sig_addr` satisfies `cmp`
    /// against `value`; returns the value seen (§9.8.3, `shmem_signal_wait_until`).
    ///
    /// # Errors
    /// As [`CpuCtx::wait_until`].
    pub fn signal_wait_until(&self, sig_addr: SymAddr, cmp: Cmp, value: u64) -> Result<u64> {
        self.wait_local("signal_wait_until", sig_addr, cmp, value)
    }

    /// Wait until every operation this context issued is complete (§9.9.2,
    /// `shmem_ctx_quiet`).
    ///
    /// # Errors
    /// The first rejection of an earlier nbi command not yet reported
    /// ([`Error::Op`]); queue errors.
    pub fn quiet(&mut self) -> Result<()> {
        self.issue(Cmd::quiet())?;
        let deadline = self.deadline();
        self.prod.quiet(&deadline).map_err(|e| self.queue_err("quiet", e))
    }

    /// Order every earlier put, put-signal and AMO of this context to each
    /// PE before every later one to the same PE (§9.9.1, `shmem_ctx_fence`).
    /// Does not wait.
    ///
    /// # Errors
    /// Queue errors.
    pub fn fence(&mut self) -> Result<()> {
        self.issue(Cmd::fence()).map(drop)
    }

    /// Quiet, then wait until every PE has reached its barrier
    /// (`shmem_barrier_all`). Collective: exactly one work-group (or the
    /// host) of every PE calls it.
    ///
    /// # Errors
    /// Queue errors, `PeerDead`.
    pub fn barrier_all(&mut self) -> Result<()> {
        self.quiet()?;
        self.issue_wait(Cmd::barrier_all(), false).map(drop)
    }

    fn amo<T: AmoType>(&mut self, op: AmoOp, dest: SymAddr, value: T, cond: T, pe: i32) -> Result<T> {
        let cmd = Cmd::amo(pe, T::TYPE, op, dest.0, value.to_bits(), cond.to_bits());
        if op.fetches() {
            self.issue_wait(cmd, true).map(T::from_bits)
        } else {
            // Non-fetching AMOs are issued like nbi puts (OpenSHMEM allows
            // it): complete at quiet, ordered by fence.
            self.issue(cmd).map(|_| value)
        }
    }

    /// Atomically read `source` on `pe` (§9.7.1, `shmem_atomic_fetch`).
    ///
    /// # Errors
    /// `BadPe`, `BadAddr`, `BadAlign` (not aligned to `size_of::<T>()`); queue errors.
    pub fn atomic_fetch<T: AmoType>(&mut self, source: SymAddr, pe: i32) -> Result<T> {
        self.amo(AmoOp::Fetch, source, T::from_bits(0), T::from_bits(0), pe)
    }

    /// Atomically write `value` to `dest` on `pe` (§9.7.2, `shmem_atomic_set`).
    /// Non-blocking: complete at quiet.
    ///
    /// # Errors
    /// Queue errors; a rejection is reported later.
    pub fn atomic_set<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        self.amo(AmoOp::Set, dest, value, T::from_bits(0), pe).map(drop)
    }

    /// Atomically swap `value` into `dest` on `pe`; returns the old value
    /// (§9.7.4, `shmem_atomic_swap`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_swap<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::Swap, dest, value, T::from_bits(0), pe)
    }

    /// Write `value` to `dest` on `pe` if it equals `cond`; returns the old
    /// value (§9.7.3, `shmem_atomic_compare_swap`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_compare_swap<T: AmoType>(&mut self, dest: SymAddr, cond: T, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::CompareSwap, dest, value, cond, pe)
    }

    /// Add `value` to `dest` on `pe`; returns the old value (§9.7.6,
    /// `shmem_atomic_fetch_add`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_fetch_add<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::FetchAdd, dest, value, T::from_bits(0), pe)
    }

    /// Add `value` to `dest` on `pe` (§9.7.7, `shmem_atomic_add`). Non-blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_set`].
    pub fn atomic_add<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        self.amo(AmoOp::Add, dest, value, T::from_bits(0), pe).map(drop)
    }

    /// Add one to `dest` on `pe`; returns the old value (§9.7.5,
    /// `shmem_atomic_fetch_inc`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_fetch_inc<T: AmoType>(&mut self, dest: SymAddr, pe: i32) -> Result<T> {
        self.amo(AmoOp::FetchAdd, dest, T::from_bits(1), T::from_bits(0), pe)
    }

    /// Add one to `dest` on `pe` (§9.7.5, `shmem_atomic_inc`). Non-blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_set`].
    pub fn atomic_inc<T: AmoType>(&mut self, dest: SymAddr, pe: i32) -> Result<()> {
        self.amo(AmoOp::Add, dest, T::from_bits(1), T::from_bits(0), pe).map(drop)
    }

    /// Bitwise AND `value` into `dest` on `pe`; returns the old value
    /// (§9.7.8, `shmem_atomic_fetch_and`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_fetch_and<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::FetchAnd, dest, value, T::from_bits(0), pe)
    }

    /// Bitwise AND `value` into `dest` on `pe` (§9.7.9, `shmem_atomic_and`). Non-blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_set`].
    pub fn atomic_and<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        self.amo(AmoOp::And, dest, value, T::from_bits(0), pe).map(drop)
    }

    /// Bitwise OR; returns the old value (§9.7.10, `shmem_atomic_fetch_or`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_fetch_or<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::FetchOr, dest, value, T::from_bits(0), pe)
    }

    /// Bitwise OR (§9.7.11, `shmem_atomic_or`). Non-blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_set`].
    pub fn atomic_or<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        self.amo(AmoOp::Or, dest, value, T::from_bits(0), pe).map(drop)
    }

    /// Bitwise XOR; returns the old value (§9.7.12, `shmem_atomic_fetch_xor`).
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_fetch_xor<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::FetchXor, dest, value, T::from_bits(0), pe)
    }

    /// Bitwise XOR (§9.7.13, `shmem_atomic_xor`). Non-blocking.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_set`].
    pub fn atomic_xor<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        self.amo(AmoOp::Xor, dest, value, T::from_bits(0), pe).map(drop)
    }

    /// Atomically set `dest` on `pe` to `min(dest, value)`; returns the old
    /// value. **A cpnet extension to OpenSHMEM 1.5** (which has no minimum
    /// AMO; OpenSHMEM has min only as a reduction, §9.9.7): signed
    /// comparison for `i32`/`i64`, unsigned for `u32`/`u64`. For floats,
    /// pass their ordered encoding as `u32`/`u64` ([`crate::ordered`]).
    /// Atomic with respect to every other cpnet AMO on the word.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_fetch`].
    pub fn atomic_fetch_min<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<T> {
        self.amo(AmoOp::FetchMin, dest, value, T::from_bits(0), pe)
    }

    /// Atomically set `dest` on `pe` to `min(dest, value)` (cpnet extension,
    /// as [`CpuCtx::atomic_fetch_min`]). Non-blocking: complete at quiet,
    /// ordered by fence, like the other non-fetching AMOs.
    ///
    /// # Errors
    /// As [`CpuCtx::atomic_set`].
    pub fn atomic_min<T: AmoType>(&mut self, dest: SymAddr, value: T, pe: i32) -> Result<()> {
        self.amo(AmoOp::Min, dest, value, T::from_bits(0), pe).map(drop)
    }
}

/// A value widened for reports (signed types keep their sign).
fn signed_view<T: AmoType>(v: T) -> i128 {
    let bits = v.to_bits();
    match T::TYPE {
        layout::AmoType::Int32 => i128::from(bits as u32 as i32),
        layout::AmoType::Int64 => i128::from(bits as i64),
        layout::AmoType::Uint32 | layout::AmoType::Uint64 => i128::from(bits),
    }
}

/// A zeroed, 64-byte-aligned host allocation to serve as a symmetric heap
/// (single-process jobs, tests; the runtime registers such memory with the
/// fabric). Views taken from it must not outlive it.
pub struct HostHeap {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the allocation is only reached through HeapView, whose accesses
// are atomics or copies that OpenSHMEM semantics allow to race.
unsafe impl Send for HostHeap {}
// SAFETY: as above.
unsafe impl Sync for HostHeap {}

impl HostHeap {
    /// `size` zeroed bytes (at least 64), 64-byte aligned.
    ///
    /// # Panics
    /// If the allocation fails.
    pub fn new(size: u64) -> HostHeap {
        let layout = std::alloc::Layout::from_size_align((size as usize).max(64), 64).expect("heap layout");
        // SAFETY: nonzero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        HostHeap { ptr, layout }
    }

    /// A view of the whole heap. Keep `self` alive while the view is used.
    pub fn view(&self) -> HeapView {
        // SAFETY: the allocation is valid, 64-aligned and `layout.size()`
        // bytes; the caller keeps it alive while using the view.
        unsafe { HeapView::from_raw(self.ptr.as_ptr(), self.layout.size() as u64) }
    }
}

impl Drop for HostHeap {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
