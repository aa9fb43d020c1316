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
use cudarc::driver::{CudaFunction, CudaStream, DeviceRepr, LaunchConfig, PushKernelArg, result};

use super::GpuPe;
use crate::error::{GpuError, Result};
use crate::team::Team;

/// Most team members a grid form takes (its kernel argument holds one
/// address per member): `CPNET_GRID_MAX_MEMBERS` of cmd.h.
pub const GRID_MAX_MEMBERS: usize = cpnet_device::layout::CPNET_GRID_MAX_MEMBERS;
/// 8-byte words of device memory each grid launch gets, zeroed: grid.cuh's
/// `go` and `done`, and the counter that deals out the form's pieces
/// (`CPNET_GRID_WORDS`).
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
    /// `team`'s id and the argument struct `args(words)`, where `words` are [`GRID_WORDS`]
    /// 8-byte words of device memory for this launch alone (`go`, `done`,
    /// then the counter that deals out the form's pieces), zeroed,
    /// allocated on `stream` before the launch and freed after it in
    /// stream order (so launches on other streams never share them).
    /// `what` names the launch in its error.
    ///
    /// # Safety
    /// `f`'s parameters are `(cpnet_handle_t, int, A)`, `A` laid out as the
    /// kernel's argument struct, and every device address in the struct
    /// `args` builds is valid for what the kernel does with it until the
    /// kernel ends (the launch's own words are: freed after it).
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
        self.bind()?;
        let cu = stream.cu_stream();
        let cuda = |call: &'static str| move |source| GpuError::Cuda { what: call, source };
        const BYTES: usize = 8 * GRID_WORDS;
        // SAFETY: `cu` is the caller's live stream of this PE's context
        // (bound above); BYTES allocated here, zeroed and freed below.
        let mem = unsafe { result::malloc_async(cu, BYTES) }.map_err(cuda("cuMemAllocAsync (a grid form's words)"))?;
        // SAFETY: `mem` is the allocation above, BYTES long, ordered on `cu`.
        if let Err(e) = unsafe { result::memset_d8_async(mem, 0, BYTES, cu) } {
            // SAFETY: `mem` came from malloc_async on `cu` and nothing uses it.
            let _ = unsafe { result::free_async(mem, cu) };
            return Err(cuda("cuMemsetD8Async (a grid form's words)")(e).into());
        }
        let (h, t, a) = (self.handle(), team.id(), args(mem));
        let mut b = stream.launch_builder(f);
        b.arg(&h).arg(&t).arg(&a);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (CPNET_GRID_THREADS as u32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match `f`'s parameters and its struct's
        // addresses are valid (the caller's contract); `mem` lives until its
        // stream-ordered free below, after the kernel.
        let launched = unsafe { b.launch(cfg) }.map(|_| ()).map_err(cuda(what));
        // SAFETY: `mem` came from malloc_async on `cu`; the free is ordered
        // after the kernel (or after the memset if the launch failed).
        unsafe { result::free_async(mem, cu) }.map_err(cuda("cuMemFreeAsync (a grid form's words)"))?;
        Ok(launched?)
    }
}
