//! Every environment variable cpnet reads, in one place.
//!
//! No other module reads a `CPNET_*` variable: the runtime asks
//! [`Launch::from_env`] who this process is and [`Tuning::from_env`] how to
//! size itself. Both are thin wrappers over pure functions
//! ([`Launch::from_lookup`], [`Tuning::from_lookup`]) that take a lookup
//! closure, so tests never touch the process environment.
//!
//! A variable that is set to the empty string (or only whitespace) counts as
//! unset. A variable that is set to something that does not parse is an error
//! ([`EnvError`] names the variable, the value and what was expected); cpnet
//! never silently falls back to a default for a value it could not read.
//!
//! # Who am I: the launch variables
//!
//! Read by [`Launch::from_env`], in this order of precedence (the first group
//! whose rank variable is set wins):
//!
//! | Variable | Meaning | Set by |
//! |---|---|---|
//! | `CPNET_PE` | this process's PE number, `0..CPNET_N_PES` | `cpnet-run` |
//! | `CPNET_N_PES` | number of PEs in the job (>= 1) | `cpnet-run` |
//! | `CPNET_LOCAL_PE` | rank among the PEs on this host, `0..CPNET_LOCAL_SIZE`; default `CPNET_PE` | `cpnet-run` |
//! | `CPNET_LOCAL_SIZE` | number of PEs on this host; default `CPNET_N_PES` | `cpnet-run` |
//! | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, when `GROUP_RANK` is set too | the same, from PyTorch's elastic launcher; ahead of the three below, which `srun torchrun` or `mpirun torchrun` set for the launcher's own task, not the worker | `torchrun` (`python -m torch.distributed.run`) |
//! | `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`, `OMPI_COMM_WORLD_LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_SIZE` | the same, from Open MPI's `mpirun` | `mpirun` (Open MPI) |
//! | `PMI_RANK`, `PMI_SIZE`, and `MPI_LOCALRANKID`, `MPI_LOCALNRANKS` if present (else local = global) | the same, from a PMI launcher (MPICH/Hydra, Intel MPI) | `mpiexec` (PMI) |
//! | `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, and `SLURM_NTASKS_PER_NODE` if it is a plain integer (else local size = `SLURM_NTASKS`) | the same, from Slurm | `srun` |
//!
//! If none of these is set the process is a single PE (PE 0 of 1,
//! [`Launcher::Single`]).
//!
//! Where a launcher gives no local information (PMI without `MPI_LOCAL*`,
//! Slurm with a non-uniform `SLURM_NTASKS_PER_NODE` such as `2(x3),1`) cpnet
//! assumes every PE is on this host; on several hosts set `CPNET_PROVIDER`
//! explicitly so the runtime does not pick the shared-memory provider (an IP
//! provider then binds to the address that reaches the rendezvous, as on any
//! multi-host job: `CPNET_FABRIC_NODE` below).
//!
//! | Variable | Meaning | Default |
//! |---|---|---|
//! | `CPNET_BOOTSTRAP_ADDR` | `host:port` of the TCP rendezvous ([`crate::bootstrap`]). `cpnet-run` sets it; under `mpirun`/`srun` the user sets it to an address PE 0 can bind and every PE can reach, and PE 0 runs the rendezvous server in-process. | required when the job has more than one PE; under `torchrun`, `MASTER_ADDR:MASTER_PORT+1` (rank 0's store holds `MASTER_PORT`) |
//!
//! Under `mpirun`/`srun` prefer an IP address for `CPNET_BOOTSTRAP_ADDR`, or
//! check that PE 0's host name does not resolve to a loopback address (as
//! Debian's `127.0.1.1` entry does): PE 0 binds what the name resolves to.
//!
//! # How big: the tuning variables
//!
//! Read by [`Tuning::from_env`]:
//!
//! | Variable | Meaning | Unit | Default |
//! |---|---|---|---|
//! | `CPNET_PROVIDER` | libfabric provider, e.g. `shm`, `tcp;ofi_rxm`, `net`, `verbs;ofi_rxm` | name | unset: the runtime picks `shm` when every PE is on this host (`local_size == n_pes`); else GPU PEs take libfabric's native TCP RDM endpoint where it has one (`net` in 1.17), CPU PEs (which need atomics) and the rest `tcp;ofi_rxm` |
//! | `CPNET_FABRIC_NODE` | local address the provider binds to (tcp) | host name or IP | unset: the local address of this PE's connection to the rendezvous, i.e. the interface through which this host reaches PE 0's (`127.0.0.1` under `cpnet-run`; set it where the fabric should use another network than the rendezvous); `127.0.0.1` for a single PE |
//! | `CPNET_HEAP_SIZE` | symmetric heap per PE | bytes; a `K`, `M` or `G` suffix (also `KiB`, `MiB`, `GiB`) multiplies by 1024, 1024², 1024³ | `64M` |
//! | `CPNET_TEAMS` | entries of the team table (OpenSHMEM teams, `cmd.h` "Teams"): world, this host's PEs and up to `CPNET_TEAMS - 2` teams from splits alive at once; each has `CPNET_TEAM_SCRATCH` bytes of symmetric memory reserved past the end of `CPNET_HEAP_SIZE` | count, `2..=64` | `32` |
//! | `CPNET_TEAM_SCRATCH` | symmetric scratch per team (its collectives' signals and data buffers): a reduction moves `(bytes - 320 - 8 x size) / (4 x size)` bytes per member per round (rounded down to 64; the other half holds the LL buffers of GPU work-groups) | bytes (K/M), a multiple of 64, `4K..=64M` | `128K` |
//! | `CPNET_PROXY_THREADS` | proxy service threads per PE | count, `1..=64` | `1` for CPU PEs, `4` for GPU PEs (each GPU operation costs a thread several µs of CUDA driver calls; 8 rings of an allreduce step took 190 µs on 1 thread and 64 µs on 8, docs/results.md) |
//! | `CPNET_QUEUES` | command queues (work-group contexts) per PE | count, >= 1 | `64` |
//! | `CPNET_QUEUE_DEPTH` | slots per queue | power of two, `2..=65536` | `64` |
//! | `CPNET_QUEUE_MEM` | GPU PEs: where the command queues live. `host`: pinned host memory mapped into the GPU; the kernel's stores reach the proxy, and the proxy's reach the kernel, with no copy. `device`: GPU memory (the ComP-Net paper's Fig. 4a comparison); each proxy thread reaches its queues through copies to host shadows (`cpnet_proxy::mirror`): per polling pass one device-to-host copy of each active queue's slots (depth x 64 bytes) and one synchronize, a second copy and synchronize for newly published slots (a copy may read a slot torn), and up to three host-to-device copies of each changed control block. So every command's round trip costs at least three copies and two synchronizes where `host` costs none: expect several times the latency and a lower command rate per proxy thread. The status block and the claim words stay where they are. CPU PEs ignore it (their queues are host memory) | `host` or `device` | `host` |
//! | `CPNET_WAIT_TIMEOUT` | how long any device-side or work-group wait (`wait_until`, `signal_wait_until`, quiet, a blocking call, a full ring) may take before it reports what it waits for; `0` or `none` waits forever (host collectives: `CPNET_COLLECTIVE_TIMEOUT`) | seconds (decimal) | `60` |
//! | `CPNET_COLLECTIVE_TIMEOUT` | how long a host collective (`barrier_all`, `shmalloc`, `shfree`, the rendezvous's allgathers, finalize) may wait for the other PEs before the job fails with a report naming the PEs that had not arrived; `0` or `none` waits forever. Longer than `CPNET_WAIT_TIMEOUT` because PEs legitimately spend long apart between host collectives (one PE computing a reference, writing a checkpoint); the same 10 minutes as PyTorch's NCCL process groups (pytorch/pytorch#110947). Init's collectives and finalize's last one wait at least `CPNET_CONNECT_TIMEOUT` | seconds (decimal) | `600` |
//! | `CPNET_PROXY_STALL_TIMEOUT` | the watchdog: a proxy thread whose polling loop has not moved for this long (stuck inside a libfabric or CUDA call, say) is reported, with the queues, PEs and operations it had pending, and the PE is aborted (its waits return `ABORTED`, the process exits with status 1 after `CPNET_ABORT_GRACE`); `0` or `none` turns the watchdog off | seconds (decimal) | `10` |
//! | `CPNET_REACH_TIMEOUT` | a peer whose operations (puts, gets, AMOs, their batches) have waited this long without any completion from it is unreachable: the proxy reports it, naming the peer, an operation, the provider and both endpoints' addresses, and the PE is aborted (its waits return `ABORTED`, the process exits with status 1 after `CPNET_ABORT_GRACE`), instead of hanging while the provider retries (the rendezvous may reach a host whose fabric ports a firewall blocks). Shorter than `CPNET_WAIT_TIMEOUT`, so that it is the one that speaks; `0` or `none`: never | seconds (decimal) | `30` |
//! | `CPNET_ABORT_GRACE` | after learning that a peer died, how long a PE lets its program end on its own before the runtime exits the process with status 1 | seconds (decimal) | `5` |
//! | `CPNET_CONNECT_TIMEOUT` | how long a PE may take to reach the rendezvous, and all PEs to arrive there | seconds (decimal), > 0 | `60` |
//! | `CPNET_PROXY_IDLE_SLEEP` | once a proxy thread has had no command to take for 5 ms, sleep this long per polling pass (saves CPU while idle, but the provider's target-side progress, which rxm and shm atomics and delivery-complete writes need, then waits up to a sleep, plus the kernel's timer slack); `0` spins (yielding) forever | microseconds | `0` |
//! | `CPNET_PROXY` | Who serves the PE's command queues. `inprocess`: service threads in the PE's own process. `daemon`: the node's proxy daemon `cpnet-proxyd` ([`crate::daemon`]): the PE puts its queues and symmetric heap in shared memory (memfd), attaches to the daemon over a Unix socket in `CPNET_PROXYD_DIR`, and the daemon's service threads and fabric endpoints serve it; the PE starts the daemon if none runs. For CPU PEs the in-process proxy stays the default: the daemon is no faster for them (docs/results.md "The proxy daemon, CPU PEs") and needs a process of its own. GPU PEs: unset, their GPU's daemon (`cpnet-proxyd --gpu UUID`, queues in memfds, the heap allocated by the daemon and shared by CUDA IPC) where the GPU runs under MPS, the in-process proxy otherwise; `daemon` without MPS is refused (the daemon's landing kernels would take turns with the PE's) | `inprocess` or `daemon` | CPU PEs `inprocess`; GPU PEs `daemon` under MPS, else `inprocess` |
//! | `CPNET_PROXY_IDLE` | how an idle proxy thread waits, in the PE or in the daemon: `spin` (poll, with spin hints and yields; the lowest wake-up latency, a core per thread while idle), `park` (after 5 ms without work, sleep `CPNET_PROXY_IDLE_SLEEP` per pass, default 100 µs here: near 0 % CPU, up to a sleep of added latency on the first operation after the pause). Unset: as `CPNET_PROXY_IDLE_SLEEP` says (0: spin). Measured: docs/results.md "The proxy daemon, CPU PEs" | `spin` or `park` | unset |
//! | `CPNET_PROXY_CPUS` | CPUs the proxy threads run on, as `taskset -c` writes them (`2,3` or `8-11,24`): thread `t` of PE `p` is pinned to entry `(p x threads + t) mod len`, so the PEs of a host that share the list spread over it; a CPU this process may not use is an error at init naming thread, PE and CPU. For keeping the proxies off the application's cores, or on the cores near the GPU and NIC (`nvidia-smi topo -m`) | CPU list, each `< 1024` | unset: not pinned (the process's affinity) |
//! | `CPNET_PROXYD_DIR` | the directory of the daemon's socket (`proxyd.sock`), election lock (`proxyd.lock`) and log (`proxyd.log`); created with mode 0700, refused if another user owns it or others can open it | path | `$XDG_RUNTIME_DIR/cpnet`, else `/tmp/cpnet-<uid>` |
//! | `CPNET_PROXYD` | the `cpnet-proxyd` binary a PE starts when no daemon runs (`cpnet-run` sets it to the one beside itself unless set) | path | `cpnet-proxyd` next to the running program, else on `PATH` |
//! | `CPNET_PROXYD_LINGER` | `cpnet-proxyd`: how long a daemon with nothing attached stays before it exits (unless `--persistent`); its `--linger` wins | seconds (decimal) | `10` |
//! | `CPNET_JOB_ID`, `CPNET_JOB_TOKEN` | the job's identity and secret for the daemon: PEs attaching with the same id are one job, and must show the same token (32 hex digits); the daemon refuses a PE of a known job with another token. `cpnet-run` sets both (random); under mpirun/srun PE 0 draws them and shares them through the rendezvous | integer; 32 hex digits | set by `cpnet-run` |
//! | `CPNET_GPU_IPC` | GPU PEs: reach the heaps of PEs on the same host through CUDA IPC (the proxy's puts, gets and SET signals become peer copies over NVLink or PCIe); `0` sends everything through the staged path | `0` or `1` | `1` |
//! | `CPNET_GPU_P2P` | GPU PEs: kernels put, get, `p`, `g` and SET-signal to their own heap and to the heaps mapped by `CPNET_GPU_IPC` with their own loads and stores (over NVLink or PCIe peer-to-peer), the work-group copying; AMOs and ADD signals still go through the proxy, so they stay atomic with respect to each other. `0` sends every operation through the command queues and the proxy (the ComP-Net path, for comparison). See docs/gpu-data-paths.md | `0` or `1` | `1` |
//! | `CPNET_STAGE_CHUNK` | GPU PEs on the staged path: data bytes per message (larger puts and gets are split); each proxy thread keeps `2 x credits x (PEs - 1) + 16` receive buffers and `CPNET_STAGE_BUFS` send buffers of this size plus 64 in pinned memory | bytes (K/M/G) | `256K` |
//! | `CPNET_STAGE_CREDITS` | GPU PEs on the staged path: requests in flight per proxy thread and target PE | count, `1..=1024` | `8` |
//! | `CPNET_STAGE_BUFS` | GPU PEs on the staged path: send buffers per proxy thread | count, `1..=4096` | `16` |
//! | `CPNET_STAGE_SHARED` | GPU PEs on the staged path with the `shm` provider: each proxy thread keeps a staging zone (a memfd of `PEs x CPNET_STAGE_SLOTS x CPNET_STAGE_SLOT` bytes, 8 MiB per thread for 2 PEs) that the same thread of every peer maps; a put's data goes by DMA (or the landing agent) straight into the target's zone in pieces of a slot, and the message carries only its header, so the provider's CPU copy of the payload is skipped (`cpnet_proxy::staged`, `zone.rs`). On two H200s the one-block alltoall of 16 MiB per pair took 466-481 µs against 4240-4442 without (docs/results.md, "Session 23"). `0`: data inside the messages | `0` or `1` | `1` |
//! | `CPNET_STAGE_SLOT` | the bytes of a staging zone slot: a put through a zone moves in pieces of this size | bytes (K/M/G), `4K..=1G` | `1M` |
//! | `CPNET_STAGE_SLOTS` | staging zone slots per source PE and proxy thread: a put's pieces in flight toward one thread of one PE | count, `1..=64` | `4` |
//! | `CPNET_AGENT_BYTES` | GPU PEs on the staged path: puts, gets and their pieces of at most this many bytes move between the GPU heap and the pinned staging buffers through the landing agent (a one-block kernel each proxy thread starts, `cpnet/agent.cuh`: no CUDA driver call per message); larger ones through copy-engine copies and events. Signals and AMOs always go through the agent. `0`: data never does. 64 KiB since session 21: on two H200s over `net` the one-block alltoall of 64 KiB per pair took 61-63 µs against 74-84 at 16 KiB (docs/results.md) | bytes (K/M/G), `0..=CPNET_STAGE_CHUNK` | `64K` |
//! | `CPNET_AGENT_LANES` | GPU PEs on the staged path: landing lanes per proxy thread, each a landing ring with its own agent (one block, its own stream), so records of different queues are applied in parallel; the records of one queue (an initiator's queue, seen from either end) always take the same lane, so they are applied in order; a copy split over the lanes (`CPNET_AGENT_SPLIT`) counts as applied when its last part is, and its signal follows that | integer, `1..=16` | `4` |
//! | `CPNET_AGENT_SPLIT` | GPU PEs on the staged path: a copy between the heap and host staging larger than `CPNET_AGENT_BYTES` and at most `CPNET_AGENT_LANES` times it (a put's piece out of the heap, a received piece into it) moves as one landing record per lane, each lane's agent a block of its own, instead of by a copy engine: a copy-engine copy and its event cost about 8 µs beyond their bytes (`cpnet-gpu-check copy-floor`). On two H100s over `shm` the one-block alltoall of 256 KiB per pair took 37.6-38.0 µs against 42.4-48.2 without (docs/results.md, "Session 24"). Off by itself where PEs share the GPU without MPS: their kernels then take turns with each other's, and an agent waits for its turn where a copy engine does not | `0` or `1` | `1` |
//! | `CPNET_REDUCE_SCRATCH` | GPU PEs: heap bytes each PE reserves past the teams' scratch for the network path's reduce on a stream (`team_reduce_on_stream` of 64 KiB or more where the members' heaps are not mapped), at the same offset on every PE. Where it holds 8 MiB + 64 KiB + 256 bytes or more, its first 8 MiB are two landing halves into which the peer of a world team of two puts its array for the pair exchange (up to 4 MiB, through staging zones), one call each in turn, so the call needs no entry round, and the next 256 bytes the pair staging's chunk signals (`CPNET_PAIR_STAGE`). The rest is the in-place copy: an in-place reduce (`dest == source`) runs in chunks of its size, the reduce's kernel copying the member's array there and reducing from that copy into `dest`, instead of on one block through the team scratch (21.6 ms for 16 MiB of floats over `shm` on two H100s). One per PE: reduces that use it on different streams take it in the order they were enqueued on this PE, so the members must enqueue them in the same order. `0`: none (the one-block form in place; the pair exchange with an entry round) | bytes (K/M/G), a multiple of 256, `0..=1G` | `24M` |
//! | `CPNET_PAIR_STAGE` | GPU PEs of a job of two with staging zones (the `shm` provider, `CPNET_STAGE_SHARED=1`) and the landing halves (`CPNET_REDUCE_SCRATCH` of 8 MiB + 64 KiB + 256 bytes or more): each PE keeps two halves of 4 MiB in host memory (a memfd the peer maps and registers with CUDA, as a staging zone), and the world team's reduce on a stream of 64 KiB-4 MiB (`PAIR_STAGE_MAX_BYTES`; `team_reduce_on_stream`, nvshmem.h's `_reduce_on_stream`) has its blocks write the array straight into the peer's half in chunks (`CPNET_PAIR_CHUNK`), signal each through the proxy and fold the peer's chunks from this PE's half as they come: no copy engine or landing agent on either side, and in place without the reduce scratch's copy; likewise its alltoall on a stream of 64 KiB-4 MiB per pair (`team_alltoall_on_stream`; not on a stream under CUDA graph capture, so capture such calls on both PEs alike) (`runtime/src/gpu/pair_stage.rs`, `cpnet/pair.cuh`, docs/results.md "Session 28", "Session 29"). `0`: the puts through the proxy (into the peer's landing half for the reduce) | `0` or `1` | `1` |
//! | `CPNET_PAIR_CHUNK` | GPU PEs with the pair staging (`CPNET_PAIR_STAGE`): bytes of each chunk of a call through it. A call's kernel sends the array in chunks, each signalled on its own, so that the peer reads chunk c from its half while this PE still writes chunk c + 1 (`cpnet/pair.cuh`); a call takes `ceil(bytes / CPNET_PAIR_CHUNK)` chunks, at most 8 (docs/results.md "Session 29"). The same on both PEs (checked at init: the pair staging is off where they differ) | bytes (K/M), a multiple of 256, `4K..=4M` | `512K` |
//! | `CPNET_PAIR_BLOCKS` | GPU PEs with the pair staging: producer blocks of a call through it (as many consumers, and one block that signals): the blocks that write the array into the peer's half, and those that read the peer's array from this PE's half. `0`: one per 16 KiB of the array, at most 16. The same on both PEs (checked at init) | `0..=127` | `0` |
//! | `CPNET_AGENT_IDLE` | GPU PEs: a landing agent with nothing to do for this long exits (it holds one block of one SM while it runs, and a device synchronize waits for it); the next record starts it again with one kernel launch | microseconds, `1..=10000000` | `2000` |
//! | `CPNET_PAYLOAD_BYTES` | GPU PEs: each queue slot has a payload slot of this many bytes in pinned host memory mapped into the GPU (`cmd.h` P0); a put or put-with-signal through the queue of more than 8 and at most this many bytes is copied there by the work-group itself, so the proxy sends it without a copy out of the GPU heap. Halved until all queues' slots fit in 64 MiB (`queues x depth x bytes`), and at most `CPNET_STAGE_CHUNK`; `0`: none | bytes (K), `0` or a power of two in `16..=64K` | `4K` |
//! | `CPNET_TRANSPORT_MAP` | `1`: right after init each PE prints on stderr one line per PE of the job (itself included) naming the path its operations to that PE take and the provider, as libfabric reports it: `cpnet: transport map: PE <me> -> PE <peer>: <path> via <provider> [<details>]`, path one of `self`, `p2p stores`, `ipc copy`, `rma`, `staged active messages` ([`crate::transport_map`]); `cpnet-run --transport-map` sets it for its PEs | `0` or `1` | `0` |

//!
//! # Others
//!
//! | Variable | Meaning | Read by |
//! |---|---|---|
//! | `RUST_LOG` | `tracing` filter for cpnet's logs (e.g. `cpnet=debug`); default `warn` | the runtime and `cpnet-run` |
//! | `CPNET_INJECT_PROXY_STALL` | fault injection for the reliability tests (docs/reliability.md): `T:N` makes proxy thread `T` hang inside the submit of the `N`-th command it takes (1-based), as a stuck transport call would; `T:N:PE` only on PE `PE` | the runtime |
//! | `CPNET_REQUIRE_GPU`, `CPNET_REQUIRE_NVRTC` | `1`: GPU/NVRTC tests fail instead of skipping where no GPU/NVRTC is found | the `cpnet-device` tests only |

use std::fmt;
use std::time::Duration;

mod launch;
mod tuning;
#[cfg(test)]
mod tests;

pub use launch::{Launch, Launcher};
pub use tuning::Tuning;

/// `CPNET_PE`: this process's PE number (set by `cpnet-run`).
pub const PE: &str = "CPNET_PE";
/// `CPNET_N_PES`: number of PEs in the job (set by `cpnet-run`).
pub const N_PES: &str = "CPNET_N_PES";
/// `CPNET_LOCAL_PE`: rank among the PEs on this host (set by `cpnet-run`).
pub const LOCAL_PE: &str = "CPNET_LOCAL_PE";
/// `CPNET_LOCAL_SIZE`: number of PEs on this host (set by `cpnet-run`).
pub const LOCAL_SIZE: &str = "CPNET_LOCAL_SIZE";
/// `CPNET_BOOTSTRAP_ADDR`: `host:port` of the rendezvous.
pub const BOOTSTRAP_ADDR: &str = "CPNET_BOOTSTRAP_ADDR";
/// `CPNET_PROVIDER`: libfabric provider name.
pub const PROVIDER: &str = "CPNET_PROVIDER";
/// `CPNET_FABRIC_NODE`: local address the provider binds to.
pub const FABRIC_NODE: &str = "CPNET_FABRIC_NODE";
/// `CPNET_HEAP_SIZE`: symmetric heap bytes per PE (`K`/`M`/`G` suffixes).
pub const HEAP_SIZE: &str = "CPNET_HEAP_SIZE";
/// `CPNET_PROXY_THREADS`: proxy service threads per PE.
pub const PROXY_THREADS: &str = "CPNET_PROXY_THREADS";
/// `CPNET_QUEUES`: command queues (work-group contexts) per PE.
pub const QUEUES: &str = "CPNET_QUEUES";
/// `CPNET_QUEUE_DEPTH`: slots per queue (power of two).
pub const QUEUE_DEPTH: &str = "CPNET_QUEUE_DEPTH";
/// `CPNET_QUEUE_MEM`: where a GPU PE's command queues live, `host` or `device`.
pub const QUEUE_MEM: &str = "CPNET_QUEUE_MEM";
/// `CPNET_WAIT_TIMEOUT`: seconds a wait may take before it reports; `0`/`none` = forever.
pub const WAIT_TIMEOUT: &str = "CPNET_WAIT_TIMEOUT";
/// `CPNET_COLLECTIVE_TIMEOUT`: seconds a host collective may wait for the
/// other PEs; `0`/`none` = forever.
pub const COLLECTIVE_TIMEOUT: &str = "CPNET_COLLECTIVE_TIMEOUT";
/// `CPNET_PROXY_STALL_TIMEOUT`: seconds without progress of a proxy thread
/// before the watchdog reports it and aborts the PE; `0`/`none` = off.
pub const PROXY_STALL_TIMEOUT: &str = "CPNET_PROXY_STALL_TIMEOUT";
/// `CPNET_INJECT_PROXY_STALL`: `T:N[:PE]`, fault injection (tests only).
pub const INJECT_PROXY_STALL: &str = "CPNET_INJECT_PROXY_STALL";
/// `CPNET_REACH_TIMEOUT`: seconds a peer may leave operations unanswered before it is unreachable.
pub const REACH_TIMEOUT: &str = "CPNET_REACH_TIMEOUT";
/// `CPNET_ABORT_GRACE`: seconds a PE waits after a peer failure before exiting.
pub const ABORT_GRACE: &str = "CPNET_ABORT_GRACE";
/// `CPNET_CONNECT_TIMEOUT`: seconds to reach the rendezvous and for all PEs to arrive.
pub const CONNECT_TIMEOUT: &str = "CPNET_CONNECT_TIMEOUT";
/// `CPNET_GPU_IPC`: use CUDA IPC peer copies between GPU PEs of one host (1) or not (0).
pub const GPU_IPC: &str = "CPNET_GPU_IPC";
/// `CPNET_GPU_P2P`: kernels load and store to the heaps of this host's GPU PEs themselves (1) or not (0).
pub const GPU_P2P: &str = "CPNET_GPU_P2P";
/// `CPNET_STAGE_CHUNK`: data bytes per staged message.
pub const STAGE_CHUNK: &str = "CPNET_STAGE_CHUNK";
/// `CPNET_STAGE_CREDITS`: staged requests in flight per thread and target.
pub const STAGE_CREDITS: &str = "CPNET_STAGE_CREDITS";
/// `CPNET_STAGE_BUFS`: staged send buffers per thread.
pub const STAGE_BUFS: &str = "CPNET_STAGE_BUFS";
/// `CPNET_STAGE_SHARED`: same-host staging zones on the staged path (shm).
pub const STAGE_SHARED: &str = "CPNET_STAGE_SHARED";
/// `CPNET_STAGE_SLOT`: bytes of a staging zone slot.
pub const STAGE_SLOT: &str = "CPNET_STAGE_SLOT";
/// `CPNET_STAGE_SLOTS`: staging zone slots per source PE and thread.
pub const STAGE_SLOTS: &str = "CPNET_STAGE_SLOTS";
/// `CPNET_PROXY_IDLE_SLEEP`: microseconds an idle proxy thread sleeps per pass (0: never).
pub const PROXY_IDLE_SLEEP: &str = "CPNET_PROXY_IDLE_SLEEP";
/// `CPNET_AGENT_BYTES`: data of at most this many bytes moves through the landing agent.
pub const AGENT_BYTES: &str = "CPNET_AGENT_BYTES";
/// `CPNET_TEAMS`: entries of the team table.
pub const TEAMS: &str = "CPNET_TEAMS";
/// `CPNET_TEAM_SCRATCH`: symmetric scratch bytes per team.
pub const TEAM_SCRATCH: &str = "CPNET_TEAM_SCRATCH";
/// `CPNET_AGENT_SPLIT`: copies of up to `CPNET_AGENT_LANES` agent records split over the lanes.
pub const AGENT_SPLIT: &str = "CPNET_AGENT_SPLIT";
/// `CPNET_REDUCE_SCRATCH`: heap bytes a GPU PE reserves for the network path's in-place reduce.
pub const REDUCE_SCRATCH: &str = "CPNET_REDUCE_SCRATCH";
/// `CPNET_PAIR_STAGE`: the world team of two's reduce through host-memory halves the kernels write and read.
pub const PAIR_STAGE: &str = "CPNET_PAIR_STAGE";
/// `CPNET_PAIR_CHUNK`: bytes of each signalled chunk of a call through the pair staging.
pub const PAIR_CHUNK: &str = "CPNET_PAIR_CHUNK";
/// `CPNET_PAIR_BLOCKS`: producer (and consumer) blocks of a call through the pair staging.
pub const PAIR_BLOCKS: &str = "CPNET_PAIR_BLOCKS";
/// The most producer blocks `CPNET_PAIR_BLOCKS` takes (a launch of 1 + 2 x
/// this many blocks).
pub const PAIR_BLOCKS_MAX: u32 = 127;
/// `CPNET_AGENT_LANES`: landing rings (each with its own agent) per proxy thread.
pub const AGENT_LANES: &str = "CPNET_AGENT_LANES";
/// `CPNET_AGENT_IDLE`: microseconds an idle landing agent waits before it exits.
pub const AGENT_IDLE: &str = "CPNET_AGENT_IDLE";
/// `CPNET_PAYLOAD_BYTES`: bytes per payload slot of a GPU PE's queues (`cmd.h` P0).
pub const PAYLOAD_BYTES: &str = "CPNET_PAYLOAD_BYTES";
/// Most pinned host memory a GPU PE gives its payload slots (all queues):
/// [`Tuning::payload_slot_bytes`] halves the slot size until they fit.
pub const PAYLOAD_BUDGET: usize = 64 << 20;
/// `CPNET_PROXY`: `inprocess` or `daemon`.
pub const PROXY: &str = "CPNET_PROXY";
/// `CPNET_PROXY_IDLE`: `spin` or `park`.
pub const PROXY_IDLE: &str = "CPNET_PROXY_IDLE";
/// `CPNET_PROXY_CPUS`: CPUs the proxy threads are pinned to (`2,3`, `8-11`).
pub const PROXY_CPUS: &str = "CPNET_PROXY_CPUS";
/// `CPNET_PROXYD_DIR`: the daemon's directory (socket, lock, log).
pub const PROXYD_DIR: &str = "CPNET_PROXYD_DIR";
/// `CPNET_PROXYD`: the `cpnet-proxyd` binary to start.
pub const PROXYD: &str = "CPNET_PROXYD";
/// `CPNET_PROXYD_LINGER`: seconds an idle daemon stays.
pub const PROXYD_LINGER: &str = "CPNET_PROXYD_LINGER";
/// `CPNET_JOB_ID`: the job's id at the daemon (set by cpnet-run).
pub const JOB_ID: &str = "CPNET_JOB_ID";
/// `CPNET_JOB_TOKEN`: the job's secret at the daemon, 32 hex digits (set by cpnet-run).
pub const JOB_TOKEN: &str = "CPNET_JOB_TOKEN";
/// Not a variable: where [`Tuning::proxyd_dir`] goes without
/// `CPNET_PROXYD_DIR`, `$XDG_RUNTIME_DIR/cpnet`.
pub const XDG_RUNTIME_DIR: &str = "XDG_RUNTIME_DIR";
/// The park sleep of `CPNET_PROXY_IDLE=park` when `CPNET_PROXY_IDLE_SLEEP` is unset.
pub const DEFAULT_PARK_SLEEP: Duration = Duration::from_micros(100);
/// Default of `CPNET_PROXYD_LINGER`.
pub const DEFAULT_PROXYD_LINGER: Duration = Duration::from_secs(10);

/// `CPNET_TRANSPORT_MAP`: `1` prints each PE's path to every PE after init
/// (`cpnet-run --transport-map` sets it).
pub const TRANSPORT_MAP: &str = "CPNET_TRANSPORT_MAP";

/// Variables of other launchers that [`Launch`] understands (read only).
pub mod foreign {
    /// Open MPI: rank in `MPI_COMM_WORLD`.
    pub const OMPI_RANK: &str = "OMPI_COMM_WORLD_RANK";
    /// Open MPI: size of `MPI_COMM_WORLD`.
    pub const OMPI_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
    /// Open MPI: rank on this node.
    pub const OMPI_LOCAL_RANK: &str = "OMPI_COMM_WORLD_LOCAL_RANK";
    /// Open MPI: ranks on this node.
    pub const OMPI_LOCAL_SIZE: &str = "OMPI_COMM_WORLD_LOCAL_SIZE";
    /// PMI (MPICH/Hydra, Intel MPI): rank.
    pub const PMI_RANK: &str = "PMI_RANK";
    /// PMI: number of ranks.
    pub const PMI_SIZE: &str = "PMI_SIZE";
    /// MPICH/Hydra: rank on this node.
    pub const MPI_LOCALRANKID: &str = "MPI_LOCALRANKID";
    /// MPICH/Hydra: ranks on this node.
    pub const MPI_LOCALNRANKS: &str = "MPI_LOCALNRANKS";
    /// Slurm: task rank.
    pub const SLURM_PROCID: &str = "SLURM_PROCID";
    /// Slurm: number of tasks.
    pub const SLURM_NTASKS: &str = "SLURM_NTASKS";
    /// Slurm: task rank on this node.
    pub const SLURM_LOCALID: &str = "SLURM_LOCALID";
    /// Slurm: tasks per node (`4`, or `2(x3),1` when not uniform).
    pub const SLURM_NTASKS_PER_NODE: &str = "SLURM_NTASKS_PER_NODE";
    /// torchrun (torch.distributed.run, PyTorch's elastic agent): global rank.
    pub const TORCH_RANK: &str = "RANK";
    /// torchrun: number of workers in the job.
    pub const TORCH_WORLD_SIZE: &str = "WORLD_SIZE";
    /// torchrun: rank on this node.
    pub const TORCH_LOCAL_RANK: &str = "LOCAL_RANK";
    /// torchrun: workers on this node.
    pub const TORCH_LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
    /// torchrun: this node's rank; with the four above it marks a torchrun
    /// worker (the test PyTorch Lightning uses).
    pub const TORCH_GROUP_RANK: &str = "GROUP_RANK";
    /// torchrun: the host of rank 0's store.
    pub const TORCH_MASTER_ADDR: &str = "MASTER_ADDR";
    /// torchrun: the port of rank 0's store (in use by it: cpnet takes the next).
    pub const TORCH_MASTER_PORT: &str = "MASTER_PORT";
}

use foreign::*;

/// Default of `CPNET_HEAP_SIZE`: 64 MiB.
pub const DEFAULT_HEAP_SIZE: u64 = 64 << 20;
/// Default of `CPNET_PROXY_THREADS`.
pub const DEFAULT_PROXY_THREADS: usize = 1;
/// Default of `CPNET_PROXY_THREADS` for GPU PEs.
pub const DEFAULT_GPU_PROXY_THREADS: usize = 4;
/// Largest accepted `CPNET_PROXY_THREADS`.
pub const MAX_PROXY_THREADS: usize = 64;
/// Default of `CPNET_QUEUES`.
pub const DEFAULT_QUEUES: usize = 64;
/// Default of `CPNET_QUEUE_DEPTH`.
pub const DEFAULT_QUEUE_DEPTH: u32 = 64;
/// Smallest accepted `CPNET_QUEUE_DEPTH`.
pub const MIN_QUEUE_DEPTH: u32 = 2;
/// Largest accepted `CPNET_QUEUE_DEPTH`.
pub const MAX_QUEUE_DEPTH: u32 = 65536;
/// Default of `CPNET_WAIT_TIMEOUT`.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default of `CPNET_COLLECTIVE_TIMEOUT`: 10 minutes.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default of `CPNET_PROXY_STALL_TIMEOUT`.
pub const DEFAULT_PROXY_STALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `CPNET_ABORT_GRACE`.
pub const DEFAULT_ABORT_GRACE: Duration = Duration::from_secs(5);
/// Default of `CPNET_REACH_TIMEOUT`: longer than TCP's first SYN retries
/// (1, 3, 7, 15 s), shorter than `CPNET_WAIT_TIMEOUT`.
pub const DEFAULT_REACH_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `CPNET_CONNECT_TIMEOUT`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a GPU PE's command queues live (`CPNET_QUEUE_MEM`; DESIGN.md "The
/// command queue"; the ComP-Net paper's Fig. 4a compares the two).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum QueuePlacement {
    /// `host`: pinned host memory mapped into the GPU (the default). Kernels
    /// and the proxy load and store the queue words directly.
    #[default]
    Host,
    /// `device`: GPU memory. The proxy serves host shadows of the queues and
    /// copies slots in and control blocks out every pass
    /// (`cpnet_proxy::mirror`); each command costs at least three copies.
    Device,
}

impl QueuePlacement {
    /// The variable's spelling of it (`host`, `device`).
    pub fn name(self) -> &'static str {
        match self {
            QueuePlacement::Host => "host",
            QueuePlacement::Device => "device",
        }
    }
}

impl fmt::Display for QueuePlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Who serves a CPU PE's command queues (`CPNET_PROXY`; DESIGN.md "The
/// proxy daemon").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum ProxyMode {
    /// `inprocess`: service threads in the PE's process (the default).
    #[default]
    InProcess,
    /// `daemon`: the host's `cpnet-proxyd` ([`crate::daemon`]).
    Daemon,
}

/// A job's identity at the proxy daemon: `CPNET_JOB_ID` and
/// `CPNET_JOB_TOKEN`.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey {
    /// The job's id: PEs attaching with the same id are one job.
    pub id: u64,
    /// The job's secret (16 bytes; 32 hex digits in the environment).
    pub token: [u8; 16],
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the token.
        write!(f, "JobKey {{ id: {:#x}, token: <secret> }}", self.id)
    }
}

impl JobKey {
    /// The token in the environment's spelling (32 lowercase hex digits).
    pub fn token_hex(&self) -> String {
        self.token.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 32 hex digits; `None` for anything else.
    pub fn parse_token(s: &str) -> Option<[u8; 16]> {
        let s = s.trim();
        if s.len() != 32 || !s.is_ascii() {
            return None;
        }
        let mut t = [0u8; 16];
        for (i, b) in t.iter_mut().enumerate() {
            *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(t)
    }
}

/// A variable that is set but cannot be used, or one that is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The variable is set to a value cpnet cannot use.
    #[error("environment variable {var}={value:?} is not valid: expected {expected}")]
    Invalid {
        /// The variable's name.
        var: &'static str,
        /// The value it holds.
        value: String,
        /// What would have been accepted.
        expected: String,
    },
    /// The variable is needed but not set.
    #[error("environment variable {var} is not set, but {why}")]
    Missing {
        /// The variable's name.
        var: &'static str,
        /// Why it is needed and what to set it to.
        why: String,
    },
}

/// A CPU list as `taskset -c` writes it: comma-separated CPUs and
/// inclusive ranges (`0,2,4-7`), each CPU below 1024 (`CPU_SETSIZE`), in
/// the order given. `None` for anything else (empty, a reversed range...).
///
/// ```
/// use cpnet::env::parse_cpu_list;
/// assert_eq!(parse_cpu_list("0,2,4-6"), Some(vec![0, 2, 4, 5, 6]));
/// assert_eq!(parse_cpu_list("5-3"), None);
/// ```
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<usize>().ok()?, b.trim().parse::<usize>().ok()?),
            None => {
                let c = part.parse::<usize>().ok()?;
                (c, c)
            }
        };
        if a > b || b >= 1024 {
            return None;
        }
        cpus.extend(a..=b);
    }
    (!cpus.is_empty()).then_some(cpus)
}

/// Parses a byte count: plain bytes (`4096`), or an integer with a `K`, `M`
/// or `G` suffix (also `KiB`, `MiB`, `GiB`; case-insensitive), each a power
/// of 1024. Returns `None` for anything else, and on overflow.
///
/// ```
/// use cpnet::env::parse_bytes;
/// assert_eq!(parse_bytes("64M"), Some(64 << 20));
/// assert_eq!(parse_bytes("2GiB"), Some(2 << 30));
/// assert_eq!(parse_bytes("1.5G"), None);
/// ```
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Parses a non-negative, finite number of seconds (`5`, `2.5`, `0.01`).
pub(super) fn parse_seconds(s: &str) -> Option<Duration> {
    let secs: f64 = s.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// The real environment; a value that is not UTF-8 is passed on lossily so
/// that it fails to parse (and is reported) rather than counting as unset.
pub(super) fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// An on/off variable: `1` or `0`.
pub(super) fn switch(var: &'static str, value: &str) -> Result<bool, EnvError> {
    match value {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(invalid(var, value, "0 or 1")),
    }
}

pub(super) fn invalid(var: &'static str, value: &str, expected: &str) -> EnvError {
    EnvError::Invalid {
        var,
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}
