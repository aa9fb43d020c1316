//! Teams on a GPU PE ([`crate::team`]): the kernels' team table in GPU
//! memory (`cpnet_handle_t.teams`), and team creation's collectives run by
//! one-block kernels on the PE's stream (the device collectives of
//! `cpnet/team.cuh`, over the same scratch as everywhere).

use std::sync::{Arc, OnceLock};

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::{CPNET_TEAM_DESC_BYTES, CPNET_TEAM_NODE, CPNET_TEAM_SCR_XCHG, CPNET_TEAM_WORLD, ErrorCode, TeamDesc};
use cudarc::driver::{CudaModule, LaunchConfig, PushKernelArg};

use super::{DeviceMem, GpuPe, cu};
use crate::error::{Error, GpuError, Result};
use crate::team::{self, Team, TeamHost, Teams};

/// The kernels team creation launches: one block each.
const KERNELS: &str = r#"
#include <cpnet/device.cuh>
/* The AND of every parent member's word at `src` into `dst` (the split
 * agreement), and its error code at `err`. */
extern "C" __global__ void cpnet_team_agree(cpnet_handle_t h, int parent, uint64_t* dst, const uint64_t* src, int* err)
{
    __shared__ cpnet_ctx_t ctx;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e == CPNET_E_OK) {
        e = cpnet_uint64_and_reduce(&ctx, parent, dst, src, 1);
        const int d = cpnet_ctx_destroy(&ctx);
        if (e == CPNET_E_OK) e = d;
    }
    if (threadIdx.x == 0) *err = e;
}
/* The team's sync, and its error code at `err`. */
extern "C" __global__ void cpnet_team_sync_kernel(cpnet_handle_t h, int team, int* err)
{
    __shared__ cpnet_ctx_t ctx;
    int e = cpnet_ctx_create(&h, &ctx);
    if (e == CPNET_E_OK) {
        e = cpnet_team_sync(&ctx, team);
        const int d = cpnet_ctx_destroy(&ctx);
        if (e == CPNET_E_OK) e = d;
    }
    if (threadIdx.x == 0) *err = e;
}
"#;

/// A GPU PE's team table in GPU memory and the creation kernels (built on
/// first use).
#[derive(Debug)]
pub(super) struct TeamTable {
    mem: DeviceMem,
    entries: u32,
    kernels: OnceLock<Arc<CudaModule>>,
}

impl TeamTable {
    /// The table holding `teams`' entries (world and node).
    pub(super) fn new(cuda: &Arc<cudarc::driver::CudaContext>, teams: &Teams) -> std::result::Result<TeamTable, GpuError> {
        let entries = teams.snapshot();
        let mem = DeviceMem::new(
            cuda,
            (CPNET_TEAM_DESC_BYTES * entries.len()) as u64,
            "cuMemAlloc (team table)",
            "cuMemsetD8 (team table)",
        )?;
        // SAFETY: TeamDesc is repr(C) plain data (cmd.h's cpnet_team_desc_t,
        // layout asserted); the allocation holds exactly these entries; the
        // copy is synchronous.
        unsafe { cu::memcpy_htod_sync(mem.base, as_bytes(&entries)) }
            .map_err(|source| GpuError::Cuda { what: "cuMemcpyHtoD (team table)", source })?;
        Ok(TeamTable { mem, entries: entries.len() as u32, kernels: OnceLock::new() })
    }

    /// `cpnet_handle_t.n_teams` and `.teams`.
    pub(super) fn handle_fields(&self) -> (u32, u64) {
        (self.entries, self.mem.base)
    }
}

fn as_bytes(d: &[TeamDesc]) -> &[u8] {
    // SAFETY: TeamDesc is repr(C) with no padding (32 bytes of i32/u64/u32
    // fields, asserted in layout.rs), so every byte is initialized.
    unsafe { std::slice::from_raw_parts(d.as_ptr().cast(), std::mem::size_of_val(d)) }
}

impl GpuPe {
    /// The team of every PE (`SHMEM_TEAM_WORLD`, OpenSHMEM 1.5 §9.4; kernels:
    /// `CPNET_TEAM_WORLD`). Local.
    pub fn team_world(&self) -> Team {
        self.core.teams.team(CPNET_TEAM_WORLD)
    }

    /// The PEs of this host (`SHMEM_TEAM_SHARED`, `NVSHMEMX_TEAM_NODE`;
    /// kernels: `CPNET_TEAM_NODE`). Local.
    pub fn team_node(&self) -> Team {
        self.core.teams.team(CPNET_TEAM_NODE)
    }

    /// A new team of the parent's PEs `start + i * stride`, `i` in
    /// `0..size`: `Some` on its members (`shmem_team_split_strided`,
    /// §9.4.3). **Collective** over `parent`; runs two one-block kernels on
    /// [`GpuPe::stream`] (the first split builds them with NVRTC), so no
    /// kernel may hold every queue meanwhile.
    ///
    /// # Errors
    /// [`Error::Team`]; [`Error::Gpu`]; [`Error::Device`] from the kernels.
    pub fn team_split_strided(&self, parent: &Team, start: i32, stride: i32, size: i32) -> Result<Option<Team>> {
        team::split_strided(self, parent, start, stride, size)
    }

    /// This PE's row and column teams of the parent seen as a grid of
    /// `xrange` columns (`shmem_team_split_2d`, §9.4.4). **Collective**
    /// over `parent`.
    ///
    /// # Errors
    /// As [`GpuPe::team_split_strided`].
    pub fn team_split_2d(&self, parent: &Team, xrange: i32) -> Result<(Team, Team)> {
        team::split_2d(self, parent, xrange)
    }

    /// Destroy a team made by a split (`shmem_team_destroy`, §9.4.10); its
    /// handle then fails in kernels with `CPNET_E_BAD_TEAM`. **Collective**
    /// over the team.
    ///
    /// # Errors
    /// As [`GpuPe::team_split_strided`]; the world and node teams.
    pub fn team_destroy(&self, team: Team) -> Result<()> {
        team::destroy(self, team)
    }

    fn team_kernels(&self) -> Result<&Arc<CudaModule>> {
        if let Some(m) = self.teams.kernels.get() {
            return Ok(m);
        }
        let m = self.build_module("cpnet_team.cu", KERNELS)?;
        Ok(self.teams.kernels.get_or_init(|| m))
    }

    /// Launch `name` (one block of 32 threads) with `(handle, team, args...)`
    /// and the error word; wait for it.
    fn run_team_kernel(&self, name: &str, team: i32, ptrs: &[u64]) -> Result<()> {
        let f = self
            .team_kernels()?
            .load_function(name)
            .map_err(|source| GpuError::Cuda { what: "cuModuleGetFunction (team kernel)", source })?;
        let err = SymAddr(self.core.teams.team(team).desc().word(CPNET_TEAM_SCR_XCHG + 16));
        let (h, errp) = (self.handle(), self.dev_ptr(err));
        let mut b = self.stream.launch_builder(&f);
        b.arg(&h).arg(&team);
        for p in ptrs {
            b.arg(p);
        }
        b.arg(&errp);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match the kernel's parameters (KERNELS):
        // the handle by value, an int, device pointers into this PE's heap.
        unsafe { b.launch(cfg) }.map_err(|source| GpuError::Cuda { what: "cuLaunchKernel (team kernel)", source })?;
        self.synchronize()?;
        let mut code = [0u8; 4];
        self.read_heap(err, &mut code)?;
        match ErrorCode::from_i32(i32::from_le_bytes(code)) {
            None => Ok(()),
            Some(c) => Err(Error::Team { pe: self.my_pe(), why: format!("{name} on team {team}: {c}") }),
        }
    }
}

impl TeamHost for GpuPe {
    fn teams(&self) -> &Teams {
        &self.core.teams
    }
    fn agree(&self, parent: &Team, mask: u64) -> Result<u64> {
        let id = parent.id();
        let (src, dst) = (SymAddr(parent.word(CPNET_TEAM_SCR_XCHG)), SymAddr(parent.word(CPNET_TEAM_SCR_XCHG + 8)));
        self.write_heap(src, &mask.to_le_bytes())?;
        self.run_team_kernel("cpnet_team_agree", id, &[self.dev_ptr(dst), self.dev_ptr(src)])?;
        let mut b = [0u8; 8];
        self.read_heap(dst, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    fn sync(&self, team: &Team) -> Result<()> {
        self.run_team_kernel("cpnet_team_sync_kernel", team.id(), &[])
    }
    fn clear(&self, desc: &TeamDesc, bytes: u64) -> Result<()> {
        self.write_heap(SymAddr(desc.scratch), &vec![0u8; bytes as usize])
    }
    fn publish(&self, id: i32, desc: &TeamDesc) -> Result<()> {
        self.bind()?;
        let at = self.teams.mem.base + id as u64 * CPNET_TEAM_DESC_BYTES as u64;
        // SAFETY: entry `id` lies inside the table (id < entries: ids come
        // from the table's own free mask); TeamDesc is plain data; the copy
        // is synchronous, and no kernel uses entry `id` meanwhile (the team
        // is being created or destroyed, collectively).
        unsafe { cu::memcpy_htod_sync(at, as_bytes(std::slice::from_ref(desc))) }
            .map_err(|source| GpuError::Cuda { what: "cuMemcpyHtoD (team table entry)", source })?;
        Ok(())
    }
}
