//! GPU PEs from C and CUDA C++: the host half of `nvshmem.h` (issue 21
//! item 3). One [`rt::GpuPe`] per process, started by `cpnet_gpu_init`; the
//! kernel handle it gives (`cpnet_handle_t`, `cmd.h`) is what the device
//! half of `nvshmem.h` reads. Each CUDA translation unit that includes
//! `nvshmem.h` keeps its own copy of the handle in a `static __device__`
//! variable (no relocatable device code needed) and registers a function
//! that uploads it ([`cpnet_gpu_register_upload`]); init calls them all.
//!
//! Errors are fatal, as in the rest of this library: the routine's name and
//! the reason are printed and the process exits with status 1.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cpnet_device::cpu::{ReduceOp, SymAddr};
use cpnet_device::layout::{self, CPNET_HANDLE_BYTES};
use rt::{GpuPe, Team};

use crate::state::fatal;

/// An upload callback of a translation unit: copies the handle (`bytes`
/// bytes at `handle`) into its `static __device__` copy.
pub type CpnetUploadFn = Option<unsafe extern "C" fn(handle: *const c_void, bytes: usize)>;

struct Gpu {
    pe: Option<GpuPe>,
    uploads: Vec<unsafe extern "C" fn(*const c_void, usize)>,
    /// `cpnet_gpu_publish` ran: later registrations upload at once.
    published: bool,
}

static GPU: Mutex<Gpu> = Mutex::new(Gpu { pe: None, uploads: Vec::new(), published: false });
static MY_PE: AtomicI32 = AtomicI32::new(-1);
static N_PES: AtomicI32 = AtomicI32::new(-1);

fn gpu() -> MutexGuard<'static, Gpu> {
    GPU.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The PE, or fatal ("called before nvshmem_init").
fn with_pe<R>(routine: *const c_char, f: impl FnOnce(&GpuPe) -> R) -> R {
    let g = gpu();
    match g.pe.as_ref() {
        Some(pe) => f(pe),
        None => {
            drop(g);
            fatal(routine, "called before nvshmem_init (cpnet_gpu_init)")
        }
    }
}

/// nvshmem.h's team handle `team` (world 0, node 1) as the runtime's team;
/// `None` for any other.
fn team_of(pe: &GpuPe, team: c_int) -> Option<Team> {
    match team {
        0 => Some(pe.team_world()),
        1 => Some(pe.team_node()),
        _ => None,
    }
}

/// The heap offset of device address `p` of this PE's heap (wrapping: an
/// address outside the heap gives an offset past its end, which the
/// runtime's range checks refuse).
fn heap_offset(pe: &GpuPe, p: *const c_void) -> SymAddr {
    SymAddr((p as u64).wrapping_sub(pe.dev_ptr(SymAddr(0))))
}

/// `stream` (a `cudaStream_t` of this PE's device; null: the legacy
/// stream) as a cudarc stream that does not destroy it.
///
/// # Safety
/// `stream` is null or a live stream of this PE's device, kept alive until
/// the work enqueued through the wrapper has run.
unsafe fn borrowed_stream(pe: &GpuPe, stream: *mut c_void) -> std::sync::Arc<cudarc::driver::CudaStream> {
    // SAFETY: the caller's contract above, as for any cudaStream_t it
    // passes; the wrapper does not destroy the stream, and everything
    // enqueued through it is ordered with the caller's own work on it.
    unsafe { pe.cuda().wrap_borrowed_stream(stream as cudarc::driver::sys::CUstream) }
}

fn handle_bytes(pe: &GpuPe) -> [u8; CPNET_HANDLE_BYTES] {
    let h = pe.handle().0;
    // SAFETY: Handle is repr(C) plain data of exactly CPNET_HANDLE_BYTES
    // bytes (asserted in cpnet_device::layout) with no padding.
    unsafe { std::mem::transmute::<cpnet_device::layout::Handle, [u8; CPNET_HANDLE_BYTES]>(h) }
}

/// Start this process's GPU PE (`nvshmem_init`): the launcher's
/// environment (`cpnet-run`, mpirun, srun), device `local rank % device
/// count`, the symmetric heap in GPU memory, the proxy. **Collective.**
/// A second call does nothing. Then make [`cpnet_gpu_device`] current
/// (`cudaSetDevice`) and call [`cpnet_gpu_publish`].
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_init(routine: *const c_char) {
    let mut g = gpu();
    if g.pe.is_some() {
        return;
    }
    let pe = match GpuPe::init() {
        Ok(pe) => pe,
        Err(e) => {
            drop(g);
            fatal(routine, &format!("init failed: {e}"))
        }
    };
    MY_PE.store(pe.my_pe(), Ordering::Release);
    N_PES.store(pe.n_pes(), Ordering::Release);
    g.pe = Some(pe);
}

/// Give every registered translation unit the kernel handle (each copies it
/// into its `static __device__` copy on the CUDA runtime's current device,
/// which the caller made [`cpnet_gpu_device`]); later registrations get it
/// at once. Local.
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_publish(routine: *const c_char) {
    let mut g = gpu();
    let Some(pe) = g.pe.as_ref() else {
        drop(g);
        fatal(routine, "called before nvshmem_init (cpnet_gpu_init)");
    };
    let h = handle_bytes(pe);
    for f in &g.uploads {
        // SAFETY: `f` was registered by a translation unit of this program
        // (cpnet_gpu_register_upload's contract); it reads `h` only.
        unsafe { f(h.as_ptr().cast(), h.len()) };
    }
    g.published = true;
}

/// Register a translation unit's upload function (`nvshmem.h` does it from
/// a static initializer); called at once if the PE is already up.
///
/// # Safety
/// `f` stays callable for the life of the process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_register_upload(f: CpnetUploadFn) -> c_int {
    let Some(f) = f else { return 0 };
    let mut g = gpu();
    if let Some(pe) = g.pe.as_ref().filter(|_| g.published) {
        let h = handle_bytes(pe);
        // SAFETY: as in cpnet_gpu_init.
        unsafe { f(h.as_ptr().cast(), h.len()) };
    }
    g.uploads.push(f);
    1
}

/// The CUDA device ordinal this PE uses (`nvshmem.h` makes it current with
/// `cudaSetDevice` after init). Local.
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_device(routine: *const c_char) -> c_int {
    with_pe(routine, |pe| pe.cuda().ordinal() as c_int)
}

/// This PE's number (`nvshmem_my_pe`), -1 before init. Local.
#[unsafe(no_mangle)]
pub extern "C" fn cpnet_gpu_my_pe() -> c_int {
    MY_PE.load(Ordering::Acquire)
}

/// Number of PEs (`nvshmem_n_pes`), -1 before init. Local.
#[unsafe(no_mangle)]
pub extern "C" fn cpnet_gpu_n_pes() -> c_int {
    N_PES.load(Ordering::Acquire)
}

/// The most blocks a collective (cooperative) launch of this PE may take
/// (`nvshmemx_collective_launch_query_gridsize`): `per_sm` blocks of
/// `threads` threads, `regs` registers each and `smem` bytes of shared
/// memory each (static and dynamic) fit on one SM (the caller's
/// `cudaOccupancyMaxActiveBlocksPerMultiprocessor` and
/// `cudaFuncGetAttributes`): this PE's share of the GPU's SMs, less room
/// for the proxy's landing agents ([`rt::GpuPe::max_persistent_blocks`]).
/// `*carveout` gets the preferred shared-memory carveout (percent) to give
/// the kernel (`cudaFuncAttributePreferredSharedMemoryCarveout`); the
/// agents have it now. Prints why and returns -1 when the agents leave no
/// room. Local.
///
/// # Safety
/// `routine` is null or a NUL-terminated string; `carveout` is valid for a
/// write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_persistent_blocks(
    routine: *const c_char,
    per_sm: c_int,
    threads: c_int,
    regs: c_int,
    smem: usize,
    carveout: *mut c_int,
) -> c_int {
    let r = with_pe(routine, |pe| {
        let per_sm = per_sm.max(0) as u32;
        let percent = pe.carveout_percent(per_sm, smem as u64).map_err(|e| e.to_string())?;
        pe.persistent_blocks_of(per_sm, threads.max(1) as u32, regs.max(0) as u32, percent).map(|b| (b, percent)).map_err(|e| e.to_string())
    });
    match r {
        Ok((b, percent)) => {
            // SAFETY: the caller's contract.
            unsafe { carveout.write(percent) };
            b.min(c_int::MAX as u32) as c_int
        }
        Err(why) => {
            eprintln!("cpnet: {}: {why}", crate::state::routine_name(routine));
            -1
        }
    }
}

/// This PE's number in team `team` (`nvshmem_team_my_pe`): the world team
/// (0) and the node team (1); -1 for any other handle. Local.
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_team_my_pe(routine: *const c_char, team: c_int) -> c_int {
    with_pe(routine, |pe| team_of(pe, team).map_or(-1, |t| t.my_pe()))
}

/// Number of PEs in team `team` (`nvshmem_team_n_pes`): world (0) and node
/// (1); -1 for any other handle. Local.
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_team_n_pes(routine: *const c_char, team: c_int) -> c_int {
    with_pe(routine, |pe| team_of(pe, team).map_or(-1, |t| t.n_pes()))
}

/// `bytes` of symmetric GPU memory aligned to `align` (a power of two, at
/// most 64; `nvshmem_malloc`, `nvshmem_align`): the device address, the
/// same heap offset on every PE, zeroed; null for 0 bytes. **Collective**,
/// with the same arguments on every PE. Fatal when the heap is full
/// (`CPNET_HEAP_SIZE`).
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_malloc(routine: *const c_char, bytes: usize, align: usize) -> *mut c_void {
    if bytes == 0 {
        return std::ptr::null_mut();
    }
    if !align.is_power_of_two() || align > rt::pe::SHMALLOC_ALIGN as usize {
        fatal(routine, &format!("alignment {align}: a power of two up to {} is supported", rt::pe::SHMALLOC_ALIGN));
    }
    let r = with_pe(routine, |pe| pe.shmalloc(bytes as u64).map(|a| pe.dev_ptr(a)).map_err(|e| e.to_string()));
    match r {
        Ok(p) => p as *mut c_void,
        Err(why) => fatal(routine, &why),
    }
}

/// Free a block of [`cpnet_gpu_malloc`] (`nvshmem_free`); null does
/// nothing. **Collective.**
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_free(routine: *const c_char, ptr: *mut c_void) {
    if ptr.is_null() {
        return;
    }
    let r = with_pe(routine, |pe| {
        let off = heap_offset(pe, ptr);
        if off.0 >= pe.heap_size() {
            return Err(format!("{ptr:p} is not in the symmetric heap"));
        }
        pe.shfree(off).map_err(|e| e.to_string())
    });
    if let Err(why) = r {
        fatal(routine, &why);
    }
}

/// Wait for all work on this PE's GPU (`cuCtxSynchronize`), then for every
/// PE (`nvshmem_barrier_all` from the host): kernels' puts, queued or
/// peer-to-peer, are complete at their targets when it returns. A kernel
/// fault or a device-side error (a wait that timed out) is fatal.
/// **Collective.**
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_barrier_all(routine: *const c_char) {
    if let Err(why) = with_pe(routine, |pe| {
        pe.cuda().synchronize().map_err(|e| format!("cuCtxSynchronize: {e:?}"))?;
        pe.check_status().map_err(|e| e.to_string())?;
        pe.barrier_all().map_err(|e| e.to_string())
    }) {
        fatal(routine, &why);
    }
}

/// End the PE (`nvshmem_finalize`): synchronize, barrier, stop the proxy.
/// **Collective.**
///
/// # Safety
/// `routine` is null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_finalize(routine: *const c_char) {
    let pe = {
        let mut g = gpu();
        g.published = false;
        g.pe.take()
    };
    let Some(pe) = pe else {
        fatal(routine, "called before nvshmem_init (cpnet_gpu_init)");
    };
    MY_PE.store(-1, Ordering::Release);
    N_PES.store(-1, Ordering::Release);
    if let Err(e) = pe.cuda().synchronize().map_err(|e| format!("cuCtxSynchronize: {e:?}")).and_then(|()| pe.finalize().map_err(|e| e.to_string())) {
        fatal(routine, &e);
    }
}

/// Element kinds of [`cpnet_gpu_reduce_on_stream_net`] (with the size in
/// bytes): cmd.h's `CPNET_KIND_*`, which nvshmem.h's
/// `cpnet_nv::reduce_kind<T>()` gives.
const KIND_SIGNED: c_int = layout::CPNET_KIND_SIGNED as c_int;
const KIND_UNSIGNED: c_int = layout::CPNET_KIND_UNSIGNED as c_int;
const KIND_FLOAT: c_int = layout::CPNET_KIND_FLOAT as c_int;
const KIND_HALF: c_int = layout::CPNET_KIND_HALF as c_int;
const KIND_BFLOAT16: c_int = layout::CPNET_KIND_BFLOAT16 as c_int;

/// The operator of cmd.h's code `op` (`CPNET_RED_*`, which team.cuh's
/// `enum reduce_op` takes): `ReduceOp::ALL[op]`, the order
/// `cpnet_device::layout` asserts.
fn reduce_op(op: c_int) -> Option<ReduceOp> {
    usize::try_from(op).ok().and_then(|i| ReduceOp::ALL.get(i).copied())
}

/// The network path's forms of the reduce to all on a stream
/// (`GpuPe::team_reduce_on_stream_net`) for nvshmem.h's
/// `nvshmemx_TYPENAME_OP_reduce_on_stream`: `nreduce` elements of the
/// type `kind` / `size` (bytes) with `op` (team.cuh's `reduce_op`) from
/// `source` into `dest` (device addresses in the symmetric heap; equal for
/// in place) on team `team` (world 0, node 1), launched on `stream` (a
/// `cudaStream_t` of this PE's device; null: the legacy stream). Returns
/// the elements launched, a multiple of the team's size; the caller runs
/// its own kernels for the rest after them on the same stream. 0 where
/// these forms do not run (below 64 KiB, every member's heap mapped here,
/// another team or type): the caller runs its own for all. **Collective**
/// over the team, the same answer on every member. Fatal: an address
/// outside the heap, a bitwise operator on a float type, a launch that
/// fails.
///
/// # Safety
/// `routine` is null or a NUL-terminated string; `stream` is null or a
/// live stream of this PE's device, kept alive until the work enqueued on
/// it has run.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cpnet_gpu_reduce_on_stream_net(
    routine: *const c_char,
    team: c_int,
    kind: c_int,
    size: usize,
    op: c_int,
    dest: *mut c_void,
    source: *const c_void,
    nreduce: usize,
    stream: *mut c_void,
) -> usize {
    let Some(op) = reduce_op(op) else { return 0 };
    let r = with_pe(routine, |pe| {
        let Some(t) = team_of(pe, team) else { return Ok(0) };
        let (d, s) = (heap_offset(pe, dest), heap_offset(pe, source));
        // SAFETY: this function's own contract on `stream`.
        let st = unsafe { borrowed_stream(pe, stream) };
        macro_rules! run {
            ($t:ty) => {
                pe.team_reduce_on_stream_net::<$t>(&t, op, d, s, nreduce, &st)
            };
        }
        match (kind, size) {
            (KIND_SIGNED, 1) => run!(i8),
            (KIND_SIGNED, 2) => run!(i16),
            (KIND_SIGNED, 4) => run!(i32),
            (KIND_SIGNED, 8) => run!(i64),
            (KIND_UNSIGNED, 1) => run!(u8),
            (KIND_UNSIGNED, 2) => run!(u16),
            (KIND_UNSIGNED, 4) => run!(u32),
            (KIND_UNSIGNED, 8) => run!(u64),
            (KIND_FLOAT, 4) => run!(f32),
            (KIND_FLOAT, 8) => run!(f64),
            (KIND_HALF, 2) => run!(half::f16),
            (KIND_BFLOAT16, 2) => run!(half::bf16),
            _ => Ok(0),
        }
        .map_err(|e| e.to_string())
    });
    match r {
        Ok(k) => k as usize,
        Err(why) => fatal(routine, &why),
    }
}

/// The alltoall forms for large blocks (`GpuPe::team_alltoall_on_stream_large`:
/// the grid where every member's heap is mapped, a block per proxy thread
/// on the network path without staging zones) for nvshmem.h's
/// `nvshmemx_TYPENAME_alltoall_on_stream`: block `j` (`nbytes` bytes at
/// `source + j x nbytes`) of every member `i` into block `i` of member
/// `j`'s `dest` (device addresses in the symmetric heap) on team `team`
/// (world 0, node 1), launched on `stream` (a `cudaStream_t` of this PE's
/// device; null: the legacy stream). Returns 1 once launched, 0 where
/// neither form runs (below their sizes, another team): the caller runs
/// its own one-block kernel. **Collective** over the team, the same answer
/// on every member. Fatal: an address outside the heap, a launch that
/// fails.
///
/// # Safety
/// As [`cpnet_gpu_reduce_on_stream_net`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_alltoall_on_stream_large(
    routine: *const c_char,
    team: c_int,
    dest: *mut c_void,
    source: *const c_void,
    nbytes: usize,
    stream: *mut c_void,
) -> c_int {
    let r = with_pe(routine, |pe| {
        let Some(t) = team_of(pe, team) else { return Ok(false) };
        // SAFETY: this function's own contract on `stream`.
        let st = unsafe { borrowed_stream(pe, stream) };
        pe.team_alltoall_on_stream_large(&t, heap_offset(pe, dest), heap_offset(pe, source), nbytes, &st).map_err(|e| e.to_string())
    });
    match r {
        Ok(launched) => c_int::from(launched),
        Err(why) => fatal(routine, &why),
    }
}

/// The launch callback of [`cpnet_gpu_grid_launch`]: enqueue the grid
/// kernel with `words` (device memory) on the stream and return its
/// `cudaError_t` (0: launched), e.g. `cudaGetLastError()` after `<<<>>>`.
pub type CpnetGridLaunchFn = unsafe extern "C" fn(arg: *mut c_void, words: *mut u64) -> c_int;

/// Launch a grid kernel of nvshmem.h on `stream` with `CPNET_GRID_WORDS`
/// 8-byte words of device memory that are zero when it starts
/// (`GpuPe::with_grid_words`): `launch(arg, words)` enqueues the kernel,
/// with the next set of the PE's ring of words (the stream first waits for
/// the set's previous kernel where that has not ended; no allocation or
/// memset between kernels), or, on a stream under CUDA graph capture,
/// with words of its own, allocated, zeroed and freed on the stream.
/// Returns `launch`'s code (0: launched). Not collective.
///
/// # Safety
/// `routine` is null or a NUL-terminated string; `stream` is null or a
/// live stream of this PE's device; `launch` enqueues on it at most one
/// kernel, which calls `grid_exit(words)` (cpnet/grid.cuh) in every block
/// as its last step and touches the words only before that, and calls no
/// libcpnet function (the PE is locked while it runs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cpnet_gpu_grid_launch(routine: *const c_char, stream: *mut c_void, launch: CpnetGridLaunchFn, arg: *mut c_void) -> c_int {
    let r = with_pe(routine, |pe| {
        // SAFETY: this function's own contract on `stream`.
        let st = unsafe { borrowed_stream(pe, stream) };
        let mut code = 0;
        // The runtime's own error type, as with_grid_words returns it.
        #[allow(clippy::result_large_err)]
        let enqueue = |words: u64| {
            // SAFETY: the caller's callback, given its own `arg` and a set
            // of words that stays valid while the PE lives.
            code = unsafe { launch(arg, words as *mut u64) };
            Ok(())
        };
        // SAFETY: `launch` enqueues at most one kernel, which ends with
        // grid_exit in every block (this function's contract).
        let ran = unsafe { pe.with_grid_words(&st, enqueue) };
        ran.map(|()| code).map_err(|e| e.to_string())
    });
    match r {
        Ok(code) => code,
        Err(why) => fatal(routine, &why),
    }
}
