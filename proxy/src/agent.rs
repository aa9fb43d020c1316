//! The proxy's end of a landing ring (THE LANDING AGENT in `cmd.h`; the
//! kernel is `cpnet/agent.cuh`): how a GPU PE's proxy thread gets small
//! payloads, signals and AMOs into GPU memory, and small ranges out of it,
//! without a CUDA driver call per message.
//!
//! One [`Landing`] per service thread: a ring of [`AgentRec`]s in pinned
//! host memory mapped into the GPU, and a non-blocking stream on which the
//! thread launches the agent when records wait and none is running (A6).
//! The agent exits by itself after `idle_ns` without records, so a launch
//! costs one driver call per burst of traffic, not per message.
//!
//! The caller pairs every record with what to do once it is applied:
//! [`Landing::push`] returns the record's seq, [`Landing::done`] says how
//! many are applied, [`Landing::value`] reads an AMO's old value back.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use cpnet_device::layout::{
    AgentRec, CPNET_AGENT_CTL_BYTES, CPNET_AGENT_CTL_OFF_BAD, CPNET_AGENT_CTL_OFF_DONE, CPNET_AGENT_CTL_OFF_LAUNCHES,
    CPNET_AGENT_CTL_OFF_RUNNING, CPNET_AGENT_CTL_OFF_STOP, CPNET_AGENT_CTL_OFF_T_APPLY, CPNET_AGENT_CTL_OFF_T_PUBLISH,
    CPNET_AGENT_CTL_OFF_T_READ, CPNET_AGENT_SLOT_BYTES, CPNET_AGENT_SLOT_OFF_RESULT,
    CPNET_AGENT_THREADS,
};
use cudarc::driver::CudaFunction;
use cudarc::driver::result as cu;

use crate::cuda::{CudaError, Pinned, Stream};

/// The compiled agent kernel (`cpnet_device::nvrtc::AGENT_SOURCE`), loaded
/// in the PE's context; cloned into every service thread.
#[derive(Clone, Debug)]
pub struct AgentKernel {
    /// The `cpnet_agent` function of the loaded module.
    pub function: CudaFunction,
    /// Exit after this many ns without a record (`CPNET_AGENT_IDLE_US`).
    pub idle_ns: u64,
    /// Puts, gets and their copies of at most this many bytes land through
    /// the agent; larger ones use the copy engine (`CPNET_AGENT_BYTES`).
    pub max_bytes: u64,
    /// Landing rings per service thread, each with its own agent on its own
    /// stream (`CPNET_AGENT_LANES`, >= 1): records of one initiator queue
    /// always take the same lane (applied in order), records of different
    /// queues are applied in parallel.
    pub lanes: usize,
    /// Whether a copy larger than `max_bytes` and at most `lanes` times it
    /// moves as one record per lane (`CPNET_AGENT_SPLIT`); off where PEs
    /// share the GPU without MPS (the agents wait for their turn there).
    pub split: bool,
}

/// A landing ring and its agent.
#[derive(Debug)]
pub struct Landing {
    mem: Pinned,
    stream: Stream,
    kernel: AgentKernel,
    depth: u64,
    log2_depth: u32,
    /// Records published (A2).
    head: u64,
    /// Last `done` seen (A1).
    done: u64,
    /// Records the caller has retired (read back): slots below it may be
    /// overwritten; `head - retired <= depth`.
    retired: u64,
    heap_base: u64,
    heap_size: u64,
    launches: u64,
}

impl Landing {
    /// A ring of `depth` (power of two) records for the heap at device
    /// address `heap_base` (`heap_size` bytes). Call with the PE's context
    /// current.
    ///
    /// # Errors
    /// Pinned allocation or stream creation failures.
    pub fn new(kernel: AgentKernel, depth: u64, heap_base: u64, heap_size: u64) -> Result<Landing, CudaError> {
        assert!(depth.is_power_of_two(), "landing ring depth must be a power of two");
        let mem = Pinned::new(CPNET_AGENT_CTL_BYTES + depth as usize * CPNET_AGENT_SLOT_BYTES)?;
        let stream = Stream::new()?;
        Ok(Landing {
            mem,
            stream,
            kernel,
            depth,
            log2_depth: depth.trailing_zeros(),
            head: 0,
            done: 0,
            retired: 0,
            heap_base,
            heap_size,
            launches: 0,
        })
    }

    /// Bytes up to which data lands through the agent.
    pub fn max_bytes(&self) -> u64 {
        self.kernel.max_bytes
    }

    /// Whether copies may split over the lanes ([`AgentKernel::split`]).
    pub fn split(&self) -> bool {
        self.kernel.split
    }

    /// The control block's u64 at byte offset `off` (a `CPNET_AGENT_CTL_OFF_*`).
    fn ctl64(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= CPNET_AGENT_CTL_BYTES && off.is_multiple_of(8));
        // SAFETY: an aligned u64 of the control block inside the pinned
        // allocation, which lives as long as `self`; the agent touches it only
        // with single-copy-atomic .sys loads and stores, as we do.
        unsafe { AtomicU64::from_ptr(self.mem.ptr().add(off).cast()) }
    }

    /// The control block's u32 at byte offset `off`.
    fn ctl32(&self, off: usize) -> &AtomicU32 {
        assert!(off + 4 <= CPNET_AGENT_CTL_BYTES && off.is_multiple_of(4));
        // SAFETY: as `ctl64`, for an aligned u32.
        unsafe { AtomicU32::from_ptr(self.mem.ptr().add(off).cast()) }
    }

    /// Word `k` (0..8) of the record slot of `seq`.
    fn rec_word(&self, seq: u64, k: usize) -> &AtomicU64 {
        assert!(k < CPNET_AGENT_SLOT_BYTES / 8);
        let off = CPNET_AGENT_CTL_BYTES + (seq & (self.depth - 1)) as usize * CPNET_AGENT_SLOT_BYTES + 8 * k;
        // SAFETY: an aligned u64 of a slot inside the pinned allocation
        // (control block, then `depth` slots); the agent reads it with .sys
        // loads and writes only the result word, with a .sys store.
        unsafe { AtomicU64::from_ptr(self.mem.ptr().add(off).cast()) }
    }

    /// Records applied by the agent so far (A1/A5: acquire, pairs with the
    /// agent's release store of `done`): every record below it is applied
    /// and its `value` holds an AMO's old value.
    pub fn done(&mut self) -> u64 {
        self.done = self.ctl64(CPNET_AGENT_CTL_OFF_DONE).load(Ordering::Acquire);
        self.done
    }

    /// Records published and not yet applied.
    pub fn waiting(&self) -> u64 {
        self.head - self.done
    }

    /// Publish `rec` (A1, A2) and return its seq; `None` when the ring is full
    /// (try again after the caller retired applied records).
    pub fn push(&mut self, rec: &AgentRec) -> Option<u64> {
        if self.head - self.retired >= self.depth {
            return None;
        }
        let seq = self.head;
        for (h, w) in rec.ll_words(seq).into_iter().enumerate() {
            // A2: release, each pairing with the agent's ld.acquire.sys of
            // that word (A4): what the record points at (staging data
            // written before) is visible once the agent sees all 14 tags.
            self.rec_word(seq, h).store(w, Ordering::Release);
        }
        self.head += 1;
        Some(seq)
    }

    /// Whether record `seq` is applied (loads `done` again only if needed).
    pub fn is_done(&mut self, seq: u64) -> bool {
        seq < self.done || seq < self.done()
    }

    /// The caller is finished with every record up to `seq`: their slots may
    /// be reused. Call in seq order, for applied records only.
    pub fn retire(&mut self, seq: u64) {
        debug_assert!(seq < self.done && seq >= self.retired);
        self.retired = seq + 1;
    }

    /// The result word of record `seq`'s slot (an AMO's old value once applied).
    pub fn value(&self, seq: u64) -> u64 {
        // Relaxed: the record is below `done`, whose acquire load ordered
        // the agent's store of it before this load; not overwritten yet (push
        // reuses a slot only after the caller retired it).
        self.rec_word(seq, CPNET_AGENT_SLOT_OFF_RESULT / 8).load(Ordering::Relaxed)
    }

    /// A6: launch the agent if records wait and it is not running. One
    /// driver call, made once per burst.
    ///
    /// # Errors
    /// `cuLaunchKernel` failures.
    pub fn kick(&mut self) -> Result<(), CudaError> {
        if self.head == self.done {
            return Ok(());
        }
        // Acquire: pairs with the exiting agent's release store (A7), after
        // its last `done`; a new agent then starts from that `done`.
        if self.ctl32(CPNET_AGENT_CTL_OFF_RUNNING).load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        self.ctl32(CPNET_AGENT_CTL_OFF_RUNNING).store(1, Ordering::Relaxed);
        self.launches += 1;
        self.ctl64(CPNET_AGENT_CTL_OFF_LAUNCHES).store(self.launches, Ordering::Relaxed);
        let mut ctl = self.mem.dev_ptr();
        let mut ring = self.mem.dev_ptr() + CPNET_AGENT_CTL_BYTES as u64;
        let mut log2 = self.log2_depth;
        let mut heap = self.heap_base;
        let mut size = self.heap_size;
        let mut idle = self.kernel.idle_ns;
        let mut params: [*mut std::ffi::c_void; 6] = [
            (&raw mut ctl).cast(),
            (&raw mut ring).cast(),
            (&raw mut log2).cast(),
            (&raw mut heap).cast(),
            (&raw mut size).cast(),
            (&raw mut idle).cast(),
        ];
        // SAFETY: the function is the agent of a module loaded in this
        // context (AgentKernel's contract); the parameters match its
        // signature (AGENT_SOURCE) and are read at launch; the ring and the
        // heap outlive every launch (the transport stops the agent and
        // synchronizes the stream before either is freed).
        unsafe {
            cu::launch_kernel(
                self.kernel.function.cu_function(),
                (1, 1, 1),
                (CPNET_AGENT_THREADS as u32, 1, 1),
                0,
                self.stream.raw(),
                &mut params,
            )
        }
        .map_err(|source| {
            self.ctl32(CPNET_AGENT_CTL_OFF_RUNNING).store(0, Ordering::Relaxed);
            CudaError { what: "cuLaunchKernel (landing agent)", source }
        })
    }

    /// Agent launches so far.
    pub fn launches(&self) -> u64 {
        self.launches
    }

    /// Records the agent refused (a range outside the heap; a proxy bug).
    pub fn refused(&self) -> u64 {
        self.ctl64(CPNET_AGENT_CTL_OFF_BAD).load(Ordering::Relaxed)
    }

    /// Records applied so far and the agent's own time on them, summed
    /// (ns: reading records, applying them, publishing `done`); complete
    /// once the agent has exited (it adds its sums at exit).
    pub fn times(&self) -> (u64, u64, u64, u64) {
        (
            self.done,
            self.ctl64(CPNET_AGENT_CTL_OFF_T_READ).load(Ordering::Relaxed),
            self.ctl64(CPNET_AGENT_CTL_OFF_T_APPLY).load(Ordering::Relaxed),
            self.ctl64(CPNET_AGENT_CTL_OFF_T_PUBLISH).load(Ordering::Relaxed),
        )
    }

    /// Tell the agent to exit and wait for it (teardown).
    pub fn stop(&mut self) {
        // Release: nothing to publish but the request; the agent polls it relaxed.
        self.ctl32(CPNET_AGENT_CTL_OFF_STOP).store(1, Ordering::Release);
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!("landing agent teardown: {e}");
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        self.stop();
    }
}
