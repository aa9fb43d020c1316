//! What the grid forms of the on-stream collectives share on the host
//! (issue 22; `alltoall_grid.rs`, `reduce_grid.rs`): the members' mapped
//! addresses and a launch with words of device memory of its own. The
//! device side (opening and closing a grid collective: block 0 speaks for
//! the PE and takes the team's epochs, the launch's `go` and `done` words
//! join the blocks, an exit epoch ends it) is `cpnet/grid.cuh`, whose
//! comment gives the protocol. A failure goes to the status block:
//! [`GpuPe::synchronize`] reports it.

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::CPNET_GRID_THREADS;
use std::sync::Arc;

use cudarc::driver::sys::{CUevent_flags, CUstreamCaptureStatus};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, result};
use parking_lot::Mutex;

use super::{DeviceMem, GpuPe};
use crate::error::{GpuError, Result};
use crate::team::Team;

/// Most team members a grid form takes (its kernel argument holds one
/// address per member): `CPNET_GRID_MAX_MEMBERS` of cmd.h.
pub const GRID_MAX_MEMBERS: usize = cpnet_device::layout::CPNET_GRID_MAX_MEMBERS;
/// 8-byte words of device memory each grid launch gets, zero: grid.cuh's
/// `go` and `done`, the counters of the forms, and the last block's exit
/// count (`CPNET_GRID_WORDS`; [`GridWords`]).
pub(super) const GRID_WORDS: usize = cpnet_device::layout::CPNET_GRID_WORDS;

impl GpuPe {
    /// Whether this job's puts go through the staged transport's staging
    /// zones (`CPNET_STAGE_SHARED` with the `shm` provider), where one proxy
    /// thread fills the copy engines, so the network path's forms move
    /// their data through one context (`alltoall_net.rs`, `reduce_net.rs`).
    /// The same on every PE: the provider and tuning are the job's.
    pub(super) fn staging_zones(&self) -> bool {
        self.core.tuning.stage_shared && self.core.provider() == "shm"
    }

    /// `addr` as this process maps it in every member of `team` (its own:
    /// `dev_ptr(addr)`), where a grid form can run on `team`: peer-to-peer
    /// stores on, every other member's heap mapped here, at most
    /// [`GRID_MAX_MEMBERS`] members.
    pub(super) fn member_ptrs(&self, team: &Team, addr: SymAddr) -> Option<[u64; GRID_MAX_MEMBERS]> {
        let d = team.desc();
        let size = usize::try_from(d.size).ok()?;
        if self.p2p.is_none() || size > GRID_MAX_MEMBERS || d.my_idx < 0 {
            return None;
        }
        let mut ptrs = [0u64; GRID_MAX_MEMBERS];
        for (j, p) in ptrs.iter_mut().enumerate().take(size) {
            *p = if j as i32 == d.my_idx {
                self.dev_ptr(addr)
            } else {
                self.peers.bases.get((d.start + j as i32 * d.stride) as usize).copied().flatten()? + addr.0
            };
        }
        Some(ptrs)
    }

    /// Launch grid form `f` on `stream`: `blocks` blocks of
    /// `CPNET_GRID_THREADS` threads (its launch bounds), with the handle,
    /// `team`'s id and the argument struct `args(words)`, where `words` are
    /// [`GRID_WORDS`] 8-byte words of device memory, zero when the kernel
    /// starts: the next set of the PE's ring ([`GridWords`]), which the last
    /// block of the set's previous launch zeroed (`grid_exit` of grid.cuh;
    /// every grid kernel ends with it); on a stream under CUDA graph
    /// capture, words of the launch's own, allocated and zeroed on the
    /// stream ([`fresh_words`]). `what` names the launch in its error.
    ///
    /// # Safety
    /// `f`'s parameters are `(cpnet_handle_t, int, A)`, `A` laid out as the
    /// kernel's argument struct, the kernel calls `grid_exit(words)` in
    /// every block as its last step, and every device address in the struct
    /// `args` builds is valid for what the kernel does with it until the
    /// kernel ends (the words are: the ring lives as long as the PE).
    ///
    /// # Errors
    /// The CUDA calls.
    pub(super) unsafe fn launch_grid<A: DeviceRepr>(
        &self,
        stream: &CudaStream,
        f: &CudaFunction,
        team: &Team,
        blocks: u32,
        what: &'static str,
        args: impl FnOnce(u64) -> A,
    ) -> Result<()> {
        // with_grid_words binds the context before anything below runs.
        let launch = |words: u64| -> Result<()> {
            let (h, t, a) = (self.handle(), team.id(), args(words));
            let mut b = stream.launch_builder(f);
            b.arg(&h).arg(&t).arg(&a);
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (CPNET_GRID_THREADS as u32, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments match `f`'s parameters and its struct's
            // addresses are valid (the caller's contract); `words` is a set
            // of the ring, which outlives the kernel, and no other kernel
            // uses it until this one ended (`with_set`), or this launch's
            // own allocation, freed after it in stream order.
            unsafe { b.launch(cfg) }.map(|_| ()).map_err(|source| GpuError::Cuda { what, source }.into())
        };
        // SAFETY: `f` calls grid_exit(words) in every block as its last
        // step (this function's contract).
        unsafe { self.with_grid_words(stream, launch) }
    }

    /// `launch(words)` on `stream` (a stream of this PE's device), where
    /// `words` is the device address of `CPNET_GRID_WORDS` (cmd.h) 8-byte
    /// words of device memory, zero when the kernel `launch` enqueues
    /// starts: the next set of the PE's ring (64 sets; the stream first waits
    /// for the set's previous kernel where that has not ended yet, and the
    /// set's event is recorded after `launch`), or on a stream under CUDA
    /// graph capture words of the launch's own, allocated and zeroed on the
    /// stream before it and freed after it. What the runtime's grid forms
    /// and nvshmem.h's grid kernel (through libcpnet's
    /// `cpnet_gpu_grid_launch`) launch with. Not collective.
    ///
    /// # Safety
    /// `launch` enqueues on `stream` at most one kernel, which calls
    /// `grid_exit(words)` (cpnet/grid.cuh) in every block as its last step,
    /// so that the set is zero again for its next launch, and touches the
    /// words only before that.
    ///
    /// # Errors
    /// `launch`'s, and the CUDA calls (`cuStreamIsCapturing`, the wait and
    /// the event; the allocation, memset and free under capture).
    pub unsafe fn with_grid_words(&self, stream: &CudaStream, launch: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        self.bind()?;
        let status = stream.capture_status().map_err(|source| GpuError::Cuda { what: "cuStreamIsCapturing", source })?;
        if status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            self.grid_words.with_set(stream, launch)
        } else {
            // SAFETY: `stream` is a live stream of this PE's context (the
            // caller's contract; bound above).
            unsafe { fresh_words(stream, launch) }
        }
    }
}

/// `launch(words)` on `stream` with [`GRID_WORDS`] words of its own,
/// allocated and zeroed on the stream before it and freed after it: what a
/// stream under CUDA graph capture gets instead of a set of the ring (the
/// ring's events and a replayed graph's fixed set would not mix; the
/// allocation, memset and free become nodes of the graph).
///
/// # Safety
/// `stream` is a live stream of the current context.
unsafe fn fresh_words(stream: &CudaStream, launch: impl FnOnce(u64) -> Result<()>) -> Result<()> {
    let cu = stream.cu_stream();
    let cuda = |call: &'static str| move |source| GpuError::Cuda { what: call, source };
    const BYTES: usize = 8 * GRID_WORDS;
    // SAFETY: `cu` is live (the caller's contract); BYTES allocated here,
    // zeroed and freed below.
    let mem = unsafe { result::malloc_async(cu, BYTES) }.map_err(cuda("cuMemAllocAsync (a grid form's words)"))?;
    // SAFETY: `mem` is the allocation above, BYTES long, ordered on `cu`.
    if let Err(e) = unsafe { result::memset_d8_async(mem, 0, BYTES, cu) } {
        // SAFETY: `mem` came from malloc_async on `cu` and nothing uses it.
        let _ = unsafe { result::free_async(mem, cu) };
        return Err(cuda("cuMemsetD8Async (a grid form's words)")(e).into());
    }
    let launched = launch(mem);
    // SAFETY: `mem` came from malloc_async on `cu`; the free is ordered
    // after the kernel (or after the memset if the launch failed).
    unsafe { result::free_async(mem, cu) }.map_err(cuda("cuMemFreeAsync (a grid form's words)"))?;
    launched
}

/// Sets of a PE's grid launch words ([`GridWords`]).
pub(super) const GRID_WORD_SETS: usize = 64;

/// The words of a PE's grid launches: [`GRID_WORD_SETS`] sets of
/// [`GRID_WORDS`] 8-byte words of device memory, zeroed once, handed to
/// the launches in turn. Each grid kernel's last block zeroes its set on
/// the way out (`grid_exit`, grid.cuh), so a launch needs no allocation or
/// memset on its stream: those cost 3.4 µs between two kernels on an H200
/// (docs/results.md, "Session 27"). A set is reused only after the
/// kernel that last had it ended: its launch's stream waits for the event
/// recorded after that kernel unless the event has passed already (a
/// no-op on the same stream, which orders the two anyway).
#[derive(Debug)]
pub(super) struct GridWords {
    mem: DeviceMem,
    ring: Mutex<WordRing>,
}

#[derive(Debug)]
struct WordRing {
    /// The set the next launch takes.
    next: usize,
    /// Per set, its last launch.
    last: Vec<LastUse>,
}

/// The last use of something a PE's launches share (a set of grid words,
/// the reduce scratch), as an event recorded after it on its stream: the
/// next user's stream waits for it, so users on different streams take the
/// thing in the order they were enqueued here. One event, created once
/// without timing and recorded again after each use; the wait is skipped
/// where the event has already passed (a `cuEventQuery` costs less than a
/// `cuStreamWaitEvent`, which the stream then carries). Callers serialize
/// through a lock around it.
#[derive(Debug, Default)]
pub(super) struct LastUse(Option<CudaEvent>);

impl LastUse {
    /// `use_()` on `stream` after the last use, this use's event recorded
    /// after it even where it failed (what it enqueued may use the thing).
    /// `wait` and `record` name the two calls in an error, e.g.
    /// `"cuStreamWaitEvent (a grid launch's words)"`.
    pub(super) fn after<R>(&mut self, stream: &CudaStream, wait: &'static str, record: &'static str, use_: impl FnOnce() -> Result<R>) -> Result<R> {
        let cuda = |what: &'static str| move |source| GpuError::Cuda { what, source };
        if let Some(ev) = self.0.as_ref().filter(|ev| !ev.is_complete()) {
            stream.wait(ev).map_err(cuda(wait))?;
        }
        let ran = use_();
        match self.0.as_ref() {
            Some(ev) => ev.record(stream).map_err(cuda(record))?,
            None => self.0 = Some(stream.record_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).map_err(cuda(record))?),
        }
        ran
    }
}

impl GridWords {
    /// The ring, zeroed, in `cuda`'s memory.
    pub(super) fn new(cuda: &Arc<CudaContext>) -> std::result::Result<GridWords, GpuError> {
        let bytes = (GRID_WORD_SETS * GRID_WORDS * 8) as u64;
        let mem = DeviceMem::new(cuda, bytes, "cuMemAlloc (grid launches' words)", "cuMemsetD8 (grid launches' words)")?;
        Ok(GridWords { mem, ring: Mutex::new(WordRing { next: 0, last: (0..GRID_WORD_SETS).map(|_| LastUse::default()).collect() }) })
    }

    /// `launch(words)` with the next set (its device address) on `stream`,
    /// after the set's previous kernel ended, and the set's event recorded
    /// after it, even where it failed. Launches take the lock in turn.
    fn with_set(&self, stream: &CudaStream, launch: impl FnOnce(u64) -> Result<()>) -> Result<()> {
        let mut ring = self.ring.lock();
        let k = ring.next;
        ring.next = (k + 1) % GRID_WORD_SETS;
        let words = self.mem.base + (k * GRID_WORDS * 8) as u64;
        ring.last[k].after(stream, "cuStreamWaitEvent (a grid launch's words)", "cuEventRecord (a grid launch's words)", || launch(words))
    }
}
