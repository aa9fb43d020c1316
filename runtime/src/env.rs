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
//! | `CPNET_BOOTSTRAP_ADDR` | `host:port` of the TCP rendezvous ([`crate::bootstrap`]). `cpnet-run` sets it; under `mpirun`/`srun` the user sets it to an address PE 0 can bind and every PE can reach, and PE 0 runs the rendezvous server in-process. | required when the job has more than one PE |
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
//! | `CPNET_PROVIDER` | libfabric provider, e.g. `shm`, `tcp;ofi_rxm`, `verbs;ofi_rxm` | name | unset: the runtime picks `shm` when every PE is on this host (`local_size == n_pes`), else `tcp;ofi_rxm` |
//! | `CPNET_FABRIC_NODE` | local address the provider binds to (tcp) | host name or IP | unset: the local address of this PE's connection to the rendezvous, i.e. the interface through which this host reaches PE 0's (`127.0.0.1` under `cpnet-run`; set it where the fabric should use another network than the rendezvous); `127.0.0.1` for a single PE |
//! | `CPNET_HEAP_SIZE` | symmetric heap per PE | bytes; a `K`, `M` or `G` suffix (also `KiB`, `MiB`, `GiB`) multiplies by 1024, 1024², 1024³ | `64M` |
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
//! | `CPNET_GPU_IPC` | GPU PEs: reach the heaps of PEs on the same host through CUDA IPC (the proxy's puts, gets and SET signals become peer copies over NVLink or PCIe); `0` sends everything through the staged path | `0` or `1` | `1` |
//! | `CPNET_GPU_P2P` | GPU PEs: kernels put, get, `p`, `g` and SET-signal to their own heap and to the heaps mapped by `CPNET_GPU_IPC` with their own loads and stores (over NVLink or PCIe peer-to-peer), the work-group copying; AMOs and ADD signals still go through the proxy, so they stay atomic with respect to each other. `0` sends every operation through the command queues and the proxy (the ComP-Net path, for comparison). See docs/gpu-data-paths.md | `0` or `1` | `1` |
//! | `CPNET_STAGE_CHUNK` | GPU PEs on the staged path: data bytes per message (larger puts and gets are split); each proxy thread keeps `2 x credits x (PEs - 1) + 16` receive buffers and `CPNET_STAGE_BUFS` send buffers of this size plus 64 in pinned memory | bytes (K/M/G) | `256K` |
//! | `CPNET_STAGE_CREDITS` | GPU PEs on the staged path: requests in flight per proxy thread and target PE | count, `1..=1024` | `8` |
//! | `CPNET_STAGE_BUFS` | GPU PEs on the staged path: send buffers per proxy thread | count, `1..=4096` | `16` |
//! | `CPNET_AGENT_BYTES` | GPU PEs on the staged path: puts, gets and their pieces of at most this many bytes move between the GPU heap and the pinned staging buffers through the landing agent (a one-block kernel each proxy thread starts, `cpnet/agent.cuh`: no CUDA driver call per message); larger ones through copy-engine copies and events. Signals and AMOs always go through the agent. `0`: data never does | bytes (K/M/G), `0..=CPNET_STAGE_CHUNK` | `16K` |
//! | `CPNET_AGENT_LANES` | GPU PEs on the staged path: landing lanes per proxy thread, each a landing ring with its own agent (one block, its own stream), so records of different queues are applied in parallel; the records of one queue (an initiator's queue, seen from either end) always take the same lane, so they are applied in order | integer, `1..=16` | `4` |
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
/// `CPNET_PROXY_IDLE_SLEEP`: microseconds an idle proxy thread sleeps per pass (0: never).
pub const PROXY_IDLE_SLEEP: &str = "CPNET_PROXY_IDLE_SLEEP";
/// `CPNET_AGENT_BYTES`: data of at most this many bytes moves through the landing agent.
pub const AGENT_BYTES: &str = "CPNET_AGENT_BYTES";
/// `CPNET_AGENT_LANES`: landing rings (each with its own agent) per proxy thread.
pub const AGENT_LANES: &str = "CPNET_AGENT_LANES";
/// `CPNET_AGENT_IDLE`: microseconds an idle landing agent waits before it exits.
pub const AGENT_IDLE: &str = "CPNET_AGENT_IDLE";
/// `CPNET_PAYLOAD_BYTES`: bytes per payload slot of a GPU PE's queues (`cmd.h` P0).
pub const PAYLOAD_BYTES: &str = "CPNET_PAYLOAD_BYTES";
/// Most pinned host memory a GPU PE gives its payload slots (all queues):
/// [`Tuning::payload_slot_bytes`] halves the slot size until they fit.
pub const PAYLOAD_BUDGET: usize = 64 << 20;
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

/// Who started this process, i.e. where [`Launch`] found its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Nobody: a single PE (no launch variable set).
    Single,
    /// `cpnet-run` (`CPNET_PE` ...); it runs the rendezvous server itself.
    CpnetRun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    Mpi,
    /// A PMI launcher, e.g. MPICH's or Intel MPI's `mpiexec` (`PMI_*`).
    Pmi,
    /// Slurm's `srun` (`SLURM_*`).
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Single => "no launcher (single PE)",
            Launcher::CpnetRun => "cpnet-run",
            Launcher::Mpi => "mpirun (Open MPI)",
            Launcher::Pmi => "a PMI launcher (mpiexec)",
            Launcher::Slurm => "srun (Slurm)",
        })
    }
}

/// This process's place in the job, from the launcher's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// This PE's number, `0..n_pes`.
    pub pe: i32,
    /// Number of PEs in the job, >= 1.
    pub n_pes: i32,
    /// Rank among the PEs on this host, `0..local_size`.
    pub local_pe: i32,
    /// Number of PEs on this host, `1..=n_pes`.
    pub local_size: i32,
    /// `host:port` of the rendezvous (`CPNET_BOOTSTRAP_ADDR`); always `Some`
    /// when `n_pes > 1`. Kept as text: a host name is resolved when
    /// connecting, not when the environment is read.
    pub bootstrap: Option<String>,
    /// Where the numbers came from.
    pub launcher: Launcher,
}

impl Launch {
    /// A single PE: PE 0 of 1, no rendezvous.
    pub fn single() -> Launch {
        Launch {
            pe: 0,
            n_pes: 1,
            local_pe: 0,
            local_size: 1,
            bootstrap: None,
            launcher: Launcher::Single,
        }
    }

    /// Reads the launch variables of the process environment (see the
    /// [module docs](self)).
    pub fn from_env() -> Result<Launch, EnvError> {
        Launch::from_lookup(process_env)
    }

    /// Reads the launch variables through `lookup` (name → value; `None` when
    /// unset). Pure: this is what [`Launch::from_env`] calls.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Launch, EnvError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let (launcher, pe, n_pes, local_pe, local_size);
        if let Some(v) = get(PE) {
            launcher = Launcher::CpnetRun;
            let n = required(&get, N_PES, PE, Launcher::CpnetRun)?;
            n_pes = parse_count(N_PES, &n)?;
            pe = parse_rank(PE, &v, n_pes, N_PES)?;
            (local_pe, local_size) = local_pair(&get, (LOCAL_PE, LOCAL_SIZE), pe, n_pes, launcher)?;
        } else if let Some(v) = get(OMPI_RANK) {
            launcher = Launcher::Mpi;
            let n = required(&get, OMPI_SIZE, OMPI_RANK, launcher)?;
            n_pes = parse_count(OMPI_SIZE, &n)?;
            pe = parse_rank(OMPI_RANK, &v, n_pes, OMPI_SIZE)?;
            (local_pe, local_size) = local_pair(
                &get,
                (OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE),
                pe,
                n_pes,
                launcher,
            )?;
        } else if let Some(v) = get(PMI_RANK) {
            launcher = Launcher::Pmi;
            let n = required(&get, PMI_SIZE, PMI_RANK, launcher)?;
            n_pes = parse_count(PMI_SIZE, &n)?;
            pe = parse_rank(PMI_RANK, &v, n_pes, PMI_SIZE)?;
            (local_pe, local_size) = local_pair(
                &get,
                (MPI_LOCALRANKID, MPI_LOCALNRANKS),
                pe,
                n_pes,
                launcher,
            )?;
        } else if let Some(v) = get(SLURM_PROCID) {
            launcher = Launcher::Slurm;
            let n = required(&get, SLURM_NTASKS, SLURM_PROCID, launcher)?;
            n_pes = parse_count(SLURM_NTASKS, &n)?;
            pe = parse_rank(SLURM_PROCID, &v, n_pes, SLURM_NTASKS)?;
            // SLURM_NTASKS_PER_NODE is "4" when uniform, "2(x3),1" when not;
            // only the plain form tells us this node's count.
            let per_node = get(SLURM_NTASKS_PER_NODE)
                .and_then(|s| s.trim().parse::<i32>().ok())
                .filter(|&k| (1..=n_pes).contains(&k));
            match (get(SLURM_LOCALID), per_node) {
                (Some(l), Some(k)) => {
                    local_size = k;
                    local_pe = parse_rank(SLURM_LOCALID, &l, k, SLURM_NTASKS_PER_NODE)?;
                }
                (Some(l), None) => {
                    local_size = n_pes;
                    local_pe = parse_rank(SLURM_LOCALID, &l, n_pes, SLURM_NTASKS)?;
                }
                (None, _) => {
                    local_size = n_pes;
                    local_pe = pe;
                }
            }
        } else {
            let mut single = Launch::single();
            single.bootstrap = get(BOOTSTRAP_ADDR).map(|s| s.trim().to_owned());
            if let Some(addr) = &single.bootstrap {
                check_host_port(addr)?;
            }
            return Ok(single);
        }

        let bootstrap = match get(BOOTSTRAP_ADDR) {
            Some(addr) => {
                let addr = addr.trim().to_owned();
                check_host_port(&addr)?;
                Some(addr)
            }
            None if n_pes > 1 => {
                let why = if launcher == Launcher::CpnetRun {
                    format!(
                        "this job has {n_pes} PEs ({PE} is set); cpnet-run sets it, so this \
                         process was probably not started by cpnet-run: start it with \
                         `cpnet-run -n {n_pes} ...`, or set {BOOTSTRAP_ADDR}=host:port"
                    )
                } else {
                    format!(
                        "this job has {n_pes} PEs (started by {launcher}); set it to a \
                         host:port that PE 0's host can bind and every PE can reach, e.g. \
                         {BOOTSTRAP_ADDR}=$(hostname):29500 exported to all ranks (PE 0 runs \
                         the rendezvous there)"
                    )
                };
                return Err(EnvError::Missing {
                    var: BOOTSTRAP_ADDR,
                    why,
                });
            }
            None => None,
        };

        Ok(Launch {
            pe,
            n_pes,
            local_pe,
            local_size,
            bootstrap,
            launcher,
        })
    }
}

/// Sizes and timeouts of the runtime, from the `CPNET_*` tuning variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// `CPNET_PROVIDER`: libfabric provider; `None` lets the runtime choose
    /// (`shm` when all PEs are local, else `tcp;ofi_rxm`).
    pub provider: Option<String>,
    /// `CPNET_FABRIC_NODE`: local address the provider binds to; `None` lets
    /// the runtime choose (the local address of the PE's rendezvous
    /// connection; `127.0.0.1` for a single PE).
    pub fabric_node: Option<String>,
    /// `CPNET_HEAP_SIZE`: symmetric heap per PE, in bytes (> 0).
    pub heap_size: u64,
    /// `CPNET_PROXY_THREADS`: proxy service threads per PE, `1..=64`.
    pub proxy_threads: usize,
    /// Proxy service threads of a GPU PE: `CPNET_PROXY_THREADS` if set,
    /// else [`DEFAULT_GPU_PROXY_THREADS`].
    pub gpu_proxy_threads: usize,
    /// `CPNET_QUEUES`: command queues (work-group contexts) per PE, >= 1.
    pub queues: usize,
    /// `CPNET_QUEUE_DEPTH`: slots per queue, a power of two in `2..=65536`.
    pub queue_depth: u32,
    /// `CPNET_QUEUE_MEM`: where a GPU PE's queues live (CPU PEs ignore it).
    pub queue_mem: QueuePlacement,
    /// `CPNET_WAIT_TIMEOUT`: how long a wait may take before it reports what
    /// it waits for; `None` = forever.
    pub wait_timeout: Option<Duration>,
    /// `CPNET_COLLECTIVE_TIMEOUT`: how long a host collective may wait for
    /// the other PEs; `None` = forever.
    pub collective_timeout: Option<Duration>,
    /// `CPNET_PROXY_STALL_TIMEOUT`: how long a proxy thread's loop may stand
    /// still before the watchdog reports it and aborts the PE; `None` = off.
    pub proxy_stall_timeout: Option<Duration>,
    /// `CPNET_INJECT_PROXY_STALL`: `(thread, nth command, only on PE)`; a
    /// fault for the reliability tests, `None` normally.
    pub inject_proxy_stall: Option<(usize, u64, Option<i32>)>,
    /// `CPNET_ABORT_GRACE`: after a peer failure, how long the program may
    /// take to end on its own before the runtime exits the process (status 1).
    pub abort_grace: Duration,
    /// `CPNET_REACH_TIMEOUT`: how long a peer may leave this PE's
    /// operations without any completion before it is reported unreachable
    /// and the PE aborted; `None` = never.
    pub reach_timeout: Option<Duration>,
    /// `CPNET_CONNECT_TIMEOUT`: how long to reach the rendezvous, and for all
    /// PEs to arrive there (> 0).
    pub connect_timeout: Duration,
    /// `CPNET_PROXY_IDLE_SLEEP`: sleep per polling pass of a proxy thread
    /// idle for 5 ms; `None` (the default) spins, yielding.
    pub proxy_idle_sleep: Option<Duration>,
    /// `CPNET_GPU_IPC`: peer copies through CUDA IPC between GPU PEs of one host.
    pub gpu_ipc: bool,
    /// `CPNET_GPU_P2P`: kernels' own loads and stores to their own heap and
    /// to the heaps mapped through CUDA IPC (the handle's peer-to-peer table).
    pub gpu_p2p: bool,
    /// `CPNET_STAGE_CHUNK`: data bytes per staged message (GPU PEs), > 0.
    pub stage_chunk: u64,
    /// `CPNET_STAGE_CREDITS`: staged requests in flight per thread and target PE.
    pub stage_credits: u32,
    /// `CPNET_STAGE_BUFS`: staged send buffers per thread.
    pub stage_bufs: usize,
    /// `CPNET_AGENT_BYTES`: data up to this size moves through the landing agent.
    pub agent_bytes: u64,
    /// `CPNET_AGENT_IDLE`: an idle landing agent exits after this long.
    pub agent_idle: Duration,
    /// `CPNET_AGENT_LANES`: landing rings, each with its own agent, per proxy thread.
    pub agent_lanes: usize,
    /// `CPNET_PAYLOAD_BYTES`: requested bytes per payload slot (0: none);
    /// [`Tuning::payload_slot_bytes`] gives the size in use.
    pub payload_bytes: u32,
    /// `CPNET_TRANSPORT_MAP`: print the path to every PE after init
    /// ([`crate::transport_map`]).
    pub transport_map: bool,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            provider: None,
            fabric_node: None,
            heap_size: DEFAULT_HEAP_SIZE,
            proxy_threads: DEFAULT_PROXY_THREADS,
            gpu_proxy_threads: DEFAULT_GPU_PROXY_THREADS,
            queues: DEFAULT_QUEUES,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            queue_mem: QueuePlacement::Host,
            wait_timeout: Some(DEFAULT_WAIT_TIMEOUT),
            collective_timeout: Some(DEFAULT_COLLECTIVE_TIMEOUT),
            proxy_stall_timeout: Some(DEFAULT_PROXY_STALL_TIMEOUT),
            inject_proxy_stall: None,
            abort_grace: DEFAULT_ABORT_GRACE,
            reach_timeout: Some(DEFAULT_REACH_TIMEOUT),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            proxy_idle_sleep: None,
            gpu_ipc: true,
            gpu_p2p: true,
            stage_chunk: 256 << 10,
            stage_credits: 8,
            stage_bufs: 16,
            agent_bytes: 16 << 10,
            agent_idle: Duration::from_micros(2000),
            agent_lanes: 4,
            payload_bytes: 4096,
            transport_map: false,
        }
    }
}

impl Tuning {
    /// The payload slot size in use (bytes; 0: none): `payload_bytes`,
    /// at most `stage_chunk`, halved while `queues * queue_depth` slots
    /// would take more than [`PAYLOAD_BUDGET`]; 0 when even 16-byte slots
    /// would not fit.
    pub fn payload_slot_bytes(&self) -> u32 {
        let slots = self.queues.saturating_mul(self.queue_depth as usize).max(1);
        let mut b = u64::from(self.payload_bytes).min(self.stage_chunk);
        if b != 0 && !b.is_power_of_two() {
            b = 1 << (63 - b.leading_zeros());
        }
        while b >= 16 && (slots as u64).saturating_mul(b) > PAYLOAD_BUDGET as u64 {
            b /= 2;
        }
        if b < 16 { 0 } else { b as u32 }
    }

    /// Reads the tuning variables of the process environment (see the
    /// [module docs](self)); unset ones take their defaults.
    pub fn from_env() -> Result<Tuning, EnvError> {
        Tuning::from_lookup(process_env)
    }

    /// Reads the tuning variables through `lookup` (name → value; `None` when
    /// unset). Pure: this is what [`Tuning::from_env`] calls.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Tuning, EnvError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let mut t = Tuning {
            provider: get(PROVIDER),
            fabric_node: get(FABRIC_NODE),
            ..Tuning::default()
        };
        if let Some(v) = get(HEAP_SIZE) {
            t.heap_size = parse_bytes(&v).filter(|&b| b > 0).ok_or_else(|| {
                invalid(
                    HEAP_SIZE,
                    &v,
                    "a positive byte count, optionally with a K, M or G suffix (powers of 1024), e.g. 64M",
                )
            })?;
        }
        if let Some(v) = get(PROXY_THREADS) {
            t.proxy_threads = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PROXY_THREADS).contains(n))
                .ok_or_else(|| {
                    invalid(
                        PROXY_THREADS,
                        &v,
                        &format!("an integer in 1..={MAX_PROXY_THREADS}"),
                    )
                })?;
        }
        if get(PROXY_THREADS).is_some() {
            t.gpu_proxy_threads = t.proxy_threads;
        }
        if let Some(v) = get(GPU_IPC) {
            t.gpu_ipc = switch(GPU_IPC, &v)?;
        }
        if let Some(v) = get(GPU_P2P) {
            t.gpu_p2p = switch(GPU_P2P, &v)?;
        }
        if let Some(v) = get(TRANSPORT_MAP) {
            t.transport_map = switch(TRANSPORT_MAP, &v)?;
        }
        if let Some(v) = get(STAGE_CHUNK) {
            t.stage_chunk = parse_bytes(&v)
                .filter(|&b| (1..=(1 << 30)).contains(&b))
                .ok_or_else(|| invalid(STAGE_CHUNK, &v, "a byte count in 1..=1G, optionally with a K, M or G suffix"))?;
        }
        if let Some(v) = get(STAGE_CREDITS) {
            t.stage_credits = v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(|| invalid(STAGE_CREDITS, &v, "an integer in 1..=1024"))?;
        }
        if let Some(v) = get(STAGE_BUFS) {
            t.stage_bufs = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=4096).contains(n))
                .ok_or_else(|| invalid(STAGE_BUFS, &v, "an integer in 1..=4096"))?;
        }
        if let Some(v) = get(AGENT_BYTES) {
            t.agent_bytes = parse_bytes(&v)
                .filter(|&b| b <= t.stage_chunk)
                .ok_or_else(|| invalid(AGENT_BYTES, &v, "a byte count no larger than CPNET_STAGE_CHUNK, optionally with a K, M or G suffix"))?;
        }
        if let Some(v) = get(PAYLOAD_BYTES) {
            t.payload_bytes = parse_bytes(&v)
                .filter(|&b| b == 0 || (b.is_power_of_two() && (16..=65536).contains(&b)))
                .map(|b| b as u32)
                .ok_or_else(|| invalid(PAYLOAD_BYTES, &v, "0 or a power of two from 16 to 64K bytes, optionally with a K suffix"))?;
        }
        if let Some(v) = get(AGENT_IDLE) {
            t.agent_idle = v
                .parse::<u64>()
                .ok()
                .filter(|n| (1..=10_000_000).contains(n))
                .map(Duration::from_micros)
                .ok_or_else(|| invalid(AGENT_IDLE, &v, "whole microseconds in 1..=10000000"))?;
        }
        if let Some(v) = get(AGENT_LANES) {
            t.agent_lanes = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or_else(|| invalid(AGENT_LANES, &v, "an integer in 1..=16"))?;
        }
        if let Some(v) = get(QUEUES) {
            t.queues = v
                .parse::<usize>()
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| invalid(QUEUES, &v, "an integer >= 1"))?;
        }
        if let Some(v) = get(QUEUE_DEPTH) {
            t.queue_depth = v
                .parse::<u32>()
                .ok()
                .filter(|n| n.is_power_of_two() && (MIN_QUEUE_DEPTH..=MAX_QUEUE_DEPTH).contains(n))
                .ok_or_else(|| {
                    invalid(
                        QUEUE_DEPTH,
                        &v,
                        &format!("a power of two in {MIN_QUEUE_DEPTH}..={MAX_QUEUE_DEPTH}"),
                    )
                })?;
        }
        if let Some(v) = get(QUEUE_MEM) {
            t.queue_mem = match v.to_ascii_lowercase().as_str() {
                "host" => QueuePlacement::Host,
                "device" => QueuePlacement::Device,
                _ => {
                    return Err(invalid(
                        QUEUE_MEM,
                        &v,
                        "host (pinned host memory mapped into the GPU) or device (GPU memory, served through copies)",
                    ));
                }
            };
        }
        if let Some(v) = get(WAIT_TIMEOUT) {
            t.wait_timeout = if v.eq_ignore_ascii_case("none") {
                None
            } else {
                let d = parse_seconds(&v).ok_or_else(|| {
                    invalid(
                        WAIT_TIMEOUT,
                        &v,
                        "seconds (e.g. 60 or 2.5), or 0 or none to wait forever",
                    )
                })?;
                (!d.is_zero()).then_some(d)
            };
        }
        if let Some(v) = get(COLLECTIVE_TIMEOUT) {
            t.collective_timeout = if v.eq_ignore_ascii_case("none") {
                None
            } else {
                let d = parse_seconds(&v)
                    .ok_or_else(|| invalid(COLLECTIVE_TIMEOUT, &v, "seconds (e.g. 600 or 2.5), or 0 or none to wait forever"))?;
                (!d.is_zero()).then_some(d)
            };
        }
        if let Some(v) = get(PROXY_STALL_TIMEOUT) {
            t.proxy_stall_timeout = if v.eq_ignore_ascii_case("none") {
                None
            } else {
                let d = parse_seconds(&v).ok_or_else(|| {
                    invalid(PROXY_STALL_TIMEOUT, &v, "seconds (e.g. 10 or 0.5), or 0 or none to turn the watchdog off")
                })?;
                (!d.is_zero()).then_some(d)
            };
        }
        if let Some(v) = get(INJECT_PROXY_STALL) {
            let bad = || invalid(INJECT_PROXY_STALL, &v, "T:N or T:N:PE (proxy thread, 1-based command count, PE)");
            let parts: Vec<&str> = v.split(':').collect();
            if !(2..=3).contains(&parts.len()) {
                return Err(bad());
            }
            let thread = parts[0].parse::<usize>().map_err(|_| bad())?;
            let nth = parts[1].parse::<u64>().ok().filter(|&n| n >= 1).ok_or_else(bad)?;
            let pe = match parts.get(2) {
                Some(p) => Some(p.parse::<i32>().map_err(|_| bad())?),
                None => None,
            };
            t.inject_proxy_stall = Some((thread, nth, pe));
        }
        if let Some(v) = get(REACH_TIMEOUT) {
            t.reach_timeout = if v.eq_ignore_ascii_case("none") {
                None
            } else {
                let d = parse_seconds(&v)
                    .ok_or_else(|| invalid(REACH_TIMEOUT, &v, "seconds (e.g. 30 or 2.5), or 0 or none to never give up on a peer"))?;
                (!d.is_zero()).then_some(d)
            };
        }
        if let Some(v) = get(ABORT_GRACE) {
            t.abort_grace = parse_seconds(&v)
                .ok_or_else(|| invalid(ABORT_GRACE, &v, "seconds >= 0 (e.g. 5 or 0.5)"))?;
        }
        if let Some(v) = get(CONNECT_TIMEOUT) {
            t.connect_timeout = parse_seconds(&v)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| invalid(CONNECT_TIMEOUT, &v, "seconds > 0 (e.g. 60 or 2.5)"))?;
        }
        if let Some(v) = get(PROXY_IDLE_SLEEP) {
            let us: u64 = v
                .trim()
                .parse()
                .map_err(|_| invalid(PROXY_IDLE_SLEEP, &v, "whole microseconds >= 0 (0: never sleep)"))?;
            t.proxy_idle_sleep = (us > 0).then(|| Duration::from_micros(us));
        }
        Ok(t)
    }
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
fn parse_seconds(s: &str) -> Option<Duration> {
    let secs: f64 = s.trim().parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// The real environment; a value that is not UTF-8 is passed on lossily so
/// that it fails to parse (and is reported) rather than counting as unset.
fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

/// An on/off variable: `1` or `0`.
fn switch(var: &'static str, value: &str) -> Result<bool, EnvError> {
    match value {
        "1" => Ok(true),
        "0" => Ok(false),
        _ => Err(invalid(var, value, "0 or 1")),
    }
}

fn invalid(var: &'static str, value: &str, expected: &str) -> EnvError {
    EnvError::Invalid {
        var,
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

/// `var` must be set because `because` is (both belong to `launcher`).
fn required(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    because: &'static str,
    launcher: Launcher,
) -> Result<String, EnvError> {
    get(var).ok_or_else(|| EnvError::Missing {
        var,
        why: format!("{because} is set (looks like {launcher}); both are needed"),
    })
}

/// A job size: an integer >= 1.
fn parse_count(var: &'static str, v: &str) -> Result<i32, EnvError> {
    v.trim()
        .parse::<i32>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| invalid(var, v, "an integer >= 1"))
}

/// A rank: an integer in `0..n`, where `n` came from `n_var`.
fn parse_rank(var: &'static str, v: &str, n: i32, n_var: &'static str) -> Result<i32, EnvError> {
    v.trim()
        .parse::<i32>()
        .ok()
        .filter(|r| (0..n).contains(r))
        .ok_or_else(|| invalid(var, v, &format!("an integer in 0..{n} ({n_var}={n})")))
}

/// The local rank and size from the pair `(rank_var, size_var)`; when the
/// launcher does not set them, every PE is taken to be on this host.
fn local_pair(
    get: &impl Fn(&str) -> Option<String>,
    (rank_var, size_var): (&'static str, &'static str),
    pe: i32,
    n_pes: i32,
    launcher: Launcher,
) -> Result<(i32, i32), EnvError> {
    match (get(rank_var), get(size_var)) {
        (None, None) => Ok((pe, n_pes)),
        (Some(r), Some(s)) => {
            let size = s
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|k| (1..=n_pes).contains(k))
                .ok_or_else(|| {
                    invalid(
                        size_var,
                        &s,
                        &format!("an integer in 1..={n_pes} (the job size)"),
                    )
                })?;
            let rank = parse_rank(rank_var, &r, size, size_var)?;
            Ok((rank, size))
        }
        (Some(_), None) => Err(EnvError::Missing {
            var: size_var,
            why: format!("{rank_var} is set (looks like {launcher}); both are needed"),
        }),
        (None, Some(_)) => Err(EnvError::Missing {
            var: rank_var,
            why: format!("{size_var} is set (looks like {launcher}); both are needed"),
        }),
    }
}

/// Checks that `addr` has the form `host:port` (or `[v6]:port`) with a
/// numeric port; the host is resolved later, when connecting.
fn check_host_port(addr: &str) -> Result<(), EnvError> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(invalid(
            BOOTSTRAP_ADDR,
            addr,
            "host:port, e.g. 10.0.0.1:29500, node01:29500 or [::1]:29500",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn bytes_plain_and_suffixes() {
        assert_eq!(parse_bytes("0"), Some(0));
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes(" 4096 "), Some(4096));
        assert_eq!(parse_bytes("1K"), Some(1024));
        assert_eq!(parse_bytes("1k"), Some(1024));
        assert_eq!(parse_bytes("3KiB"), Some(3 * 1024));
        assert_eq!(parse_bytes("64M"), Some(64 << 20));
        assert_eq!(parse_bytes("64 MiB"), Some(64 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("2gib"), Some(2 << 30));
    }

    #[test]
    fn bytes_rejects_garbage_and_overflow() {
        for bad in [
            "", " ", "M", "-1", "+1", "1.5G", "1T", "1KB", "1 K B", "12x", "0x10", "1e6",
        ] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
        assert_eq!(parse_bytes("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_bytes("18446744073709551616"), None);
        assert_eq!(parse_bytes("17179869184G"), None); // 2^34 GiB = 2^64
    }

    #[test]
    fn seconds() {
        assert_eq!(parse_seconds("5"), Some(Duration::from_secs(5)));
        assert_eq!(parse_seconds("0.25"), Some(Duration::from_millis(250)));
        assert_eq!(parse_seconds("0"), Some(Duration::ZERO));
        for bad in ["-1", "nan", "inf", "1e400", "5s", ""] {
            assert_eq!(parse_seconds(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn launch_single_when_nothing_set() {
        assert_eq!(Launch::from_lookup(env(&[])).unwrap(), Launch::single());
    }

    #[test]
    fn launch_cpnet_run() {
        let l = Launch::from_lookup(env(&[
            (PE, "2"),
            (N_PES, "4"),
            (LOCAL_PE, "2"),
            (LOCAL_SIZE, "4"),
            (BOOTSTRAP_ADDR, "127.0.0.1:4000"),
        ]))
        .unwrap();
        assert_eq!(
            l,
            Launch {
                pe: 2,
                n_pes: 4,
                local_pe: 2,
                local_size: 4,
                bootstrap: Some("127.0.0.1:4000".into()),
                launcher: Launcher::CpnetRun,
            }
        );
    }

    #[test]
    fn launch_cpnet_wins_over_mpi() {
        let l = Launch::from_lookup(env(&[
            (PE, "1"),
            (N_PES, "2"),
            (OMPI_RANK, "0"),
            (OMPI_SIZE, "8"),
            (BOOTSTRAP_ADDR, "h:1"),
        ]))
        .unwrap();
        assert_eq!((l.pe, l.n_pes, l.launcher), (1, 2, Launcher::CpnetRun));
        assert_eq!((l.local_pe, l.local_size), (1, 2));
    }

    #[test]
    fn launch_open_mpi() {
        let l = Launch::from_lookup(env(&[
            (OMPI_RANK, "5"),
            (OMPI_SIZE, "8"),
            (OMPI_LOCAL_RANK, "1"),
            (OMPI_LOCAL_SIZE, "4"),
            (BOOTSTRAP_ADDR, "node01:29500"),
        ]))
        .unwrap();
        assert_eq!(
            (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher),
            (5, 8, 1, 4, Launcher::Mpi)
        );
    }

    #[test]
    fn launch_pmi_with_and_without_local() {
        let l = Launch::from_lookup(env(&[
            (PMI_RANK, "3"),
            (PMI_SIZE, "4"),
            (BOOTSTRAP_ADDR, "[::1]:29500"),
        ]))
        .unwrap();
        assert_eq!(
            (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher),
            (3, 4, 3, 4, Launcher::Pmi)
        );
        let l = Launch::from_lookup(env(&[
            (PMI_RANK, "3"),
            (PMI_SIZE, "4"),
            (MPI_LOCALRANKID, "1"),
            (MPI_LOCALNRANKS, "2"),
            (BOOTSTRAP_ADDR, "h:1"),
        ]))
        .unwrap();
        assert_eq!((l.local_pe, l.local_size), (1, 2));
    }

    #[test]
    fn launch_slurm_plain_and_nonuniform_per_node() {
        let base = [
            (SLURM_PROCID, "6"),
            (SLURM_NTASKS, "8"),
            (SLURM_LOCALID, "2"),
            (BOOTSTRAP_ADDR, "h:1"),
        ];
        let mut plain = base.to_vec();
        plain.push((SLURM_NTASKS_PER_NODE, "4"));
        let l = Launch::from_lookup(env(&plain)).unwrap();
        assert_eq!(
            (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher),
            (6, 8, 2, 4, Launcher::Slurm)
        );
        let mut odd = base.to_vec();
        odd.push((SLURM_NTASKS_PER_NODE, "2(x3),2"));
        let l = Launch::from_lookup(env(&odd)).unwrap();
        assert_eq!((l.local_pe, l.local_size), (2, 8));
    }

    #[test]
    fn launch_errors_name_the_variable() {
        let e = Launch::from_lookup(env(&[(PE, "4"), (N_PES, "4"), (BOOTSTRAP_ADDR, "h:1")]))
            .unwrap_err();
        assert!(
            matches!(&e, EnvError::Invalid { var, .. } if *var == PE),
            "{e}"
        );
        assert!(e.to_string().contains("0..4"), "{e}");

        let e = Launch::from_lookup(env(&[(PE, "0")])).unwrap_err();
        assert!(
            matches!(&e, EnvError::Missing { var, .. } if *var == N_PES),
            "{e}"
        );

        let e = Launch::from_lookup(env(&[(N_PES, "two"), (PE, "0")])).unwrap_err();
        assert!(
            matches!(&e, EnvError::Invalid { var, .. } if *var == N_PES),
            "{e}"
        );

        let e = Launch::from_lookup(env(&[(OMPI_RANK, "0"), (OMPI_SIZE, "2")])).unwrap_err();
        assert!(
            matches!(&e, EnvError::Missing { var, .. } if *var == BOOTSTRAP_ADDR),
            "{e}"
        );
        assert!(e.to_string().contains("PE 0"), "{e}");

        let e = Launch::from_lookup(env(&[
            (OMPI_RANK, "0"),
            (OMPI_SIZE, "2"),
            (BOOTSTRAP_ADDR, "no-port"),
        ]))
        .unwrap_err();
        assert!(
            matches!(&e, EnvError::Invalid { var, .. } if *var == BOOTSTRAP_ADDR),
            "{e}"
        );

        let e = Launch::from_lookup(env(&[
            (PE, "1"),
            (N_PES, "2"),
            (LOCAL_PE, "1"),
            (BOOTSTRAP_ADDR, "h:1"),
        ]))
        .unwrap_err();
        assert!(
            matches!(&e, EnvError::Missing { var, .. } if *var == LOCAL_SIZE),
            "{e}"
        );

        let e = Launch::from_lookup(env(&[
            (PE, "1"),
            (N_PES, "2"),
            (LOCAL_PE, "1"),
            (LOCAL_SIZE, "3"),
            (BOOTSTRAP_ADDR, "h:1"),
        ]))
        .unwrap_err();
        assert!(
            matches!(&e, EnvError::Invalid { var, .. } if *var == LOCAL_SIZE),
            "{e}"
        );
    }

    #[test]
    fn launch_one_pe_needs_no_addr_and_empty_is_unset() {
        let l =
            Launch::from_lookup(env(&[(PE, "0"), (N_PES, "1"), (BOOTSTRAP_ADDR, " ")])).unwrap();
        assert_eq!((l.pe, l.n_pes, l.bootstrap), (0, 1, None));
        let l = Launch::from_lookup(env(&[(PE, ""), (OMPI_RANK, "")])).unwrap();
        assert_eq!(l, Launch::single());
    }

    #[test]
    fn tuning_defaults() {
        let t = Tuning::from_lookup(env(&[])).unwrap();
        assert_eq!(t, Tuning::default());
        assert_eq!(t.heap_size, 64 << 20);
        assert_eq!(t.proxy_threads, 1);
        assert_eq!(t.queues, 64);
        assert_eq!(t.queue_depth, 64);
        assert_eq!(t.wait_timeout, Some(Duration::from_secs(60)));
        assert_eq!(t.abort_grace, Duration::from_secs(5));
        assert_eq!(t.connect_timeout, Duration::from_secs(60));
        assert_eq!(t.reach_timeout, Some(Duration::from_secs(30)));
        assert_eq!((t.provider, t.fabric_node), (None, None));
    }

    #[test]
    fn tuning_all_set() {
        let t = Tuning::from_lookup(env(&[
            (PROVIDER, "tcp;ofi_rxm"),
            (FABRIC_NODE, "10.0.0.7"),
            (HEAP_SIZE, "1G"),
            (PROXY_THREADS, "4"),
            (QUEUES, "128"),
            (QUEUE_DEPTH, "1024"),
            (WAIT_TIMEOUT, "2.5"),
            (ABORT_GRACE, "0"),
            (CONNECT_TIMEOUT, "0.5"),
            (PROXY_STALL_TIMEOUT, "1.5"),
            (COLLECTIVE_TIMEOUT, "30"),
            (INJECT_PROXY_STALL, "2:100:1"),
            (REACH_TIMEOUT, "3"),
        ]))
        .unwrap();
        assert_eq!(t.reach_timeout, Some(Duration::from_secs(3)));
        assert_eq!(t.proxy_stall_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(t.collective_timeout, Some(Duration::from_secs(30)));
        assert_eq!(t.inject_proxy_stall, Some((2, 100, Some(1))));
        assert_eq!(t.provider.as_deref(), Some("tcp;ofi_rxm"));
        assert_eq!(t.fabric_node.as_deref(), Some("10.0.0.7"));
        assert_eq!(t.heap_size, 1 << 30);
        assert_eq!(t.proxy_threads, 4);
        assert_eq!(t.queues, 128);
        assert_eq!(t.queue_depth, 1024);
        assert_eq!(t.wait_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(t.abort_grace, Duration::ZERO);
        assert_eq!(t.connect_timeout, Duration::from_millis(500));
    }

    #[test]
    fn tuning_wait_forever() {
        for v in ["0", "none", "NONE", "0.0"] {
            let t = Tuning::from_lookup(env(&[(WAIT_TIMEOUT, v)])).unwrap();
            assert_eq!(t.wait_timeout, None, "{v}");
            let t = Tuning::from_lookup(env(&[(PROXY_STALL_TIMEOUT, v)])).unwrap();
            assert_eq!(t.proxy_stall_timeout, None, "watchdog off: {v}");
            let t = Tuning::from_lookup(env(&[(COLLECTIVE_TIMEOUT, v)])).unwrap();
            assert_eq!(t.collective_timeout, None, "collectives wait forever: {v}");
        }
        let t = Tuning::from_lookup(env(&[])).unwrap();
        assert_eq!(t.collective_timeout, Some(DEFAULT_COLLECTIVE_TIMEOUT));
        let t = Tuning::from_lookup(env(&[])).unwrap();
        assert_eq!(t.proxy_stall_timeout, Some(DEFAULT_PROXY_STALL_TIMEOUT));
        assert_eq!(t.inject_proxy_stall, None);
    }

    #[test]
    fn tuning_rejects_out_of_range() {
        for (var, bad) in [
            (HEAP_SIZE, "0"),
            (HEAP_SIZE, "64X"),
            (PROXY_THREADS, "0"),
            (PROXY_THREADS, "65"),
            (QUEUES, "0"),
            (QUEUES, "-3"),
            (QUEUE_DEPTH, "1"),
            (QUEUE_DEPTH, "48"),
            (QUEUE_DEPTH, "131072"),
            (WAIT_TIMEOUT, "-1"),
            (WAIT_TIMEOUT, "forever"),
            (ABORT_GRACE, "soon"),
            (CONNECT_TIMEOUT, "0"),
            (PROXY_STALL_TIMEOUT, "later"),
            (COLLECTIVE_TIMEOUT, "-2"),
            (INJECT_PROXY_STALL, "1"),
            (INJECT_PROXY_STALL, "0:0"),
            (INJECT_PROXY_STALL, "a:3"),
            (INJECT_PROXY_STALL, "0:3:x"),
        ] {
            let e = Tuning::from_lookup(env(&[(var, bad)])).unwrap_err();
            match &e {
                EnvError::Invalid { var: v, value, .. } => {
                    assert_eq!((*v, value.as_str()), (var, bad));
                }
                other => panic!("{var}={bad}: {other}"),
            }
            let msg = e.to_string();
            assert!(msg.contains(var) && msg.contains(bad), "{msg}");
        }
    }

    #[test]
    fn queue_depth_edges() {
        for ok in ["2", "65536"] {
            assert!(
                Tuning::from_lookup(env(&[(QUEUE_DEPTH, ok)])).is_ok(),
                "{ok}"
            );
        }
    }

    #[test]
    fn gpu_pes_default_to_more_proxy_threads_unless_told() {
        let t = Tuning::from_lookup(env(&[])).unwrap();
        assert_eq!((t.proxy_threads, t.gpu_proxy_threads), (DEFAULT_PROXY_THREADS, DEFAULT_GPU_PROXY_THREADS));
        let t = Tuning::from_lookup(env(&[(PROXY_THREADS, "2")])).unwrap();
        assert_eq!((t.proxy_threads, t.gpu_proxy_threads), (2, 2), "an explicit count applies to both");
        let t = Tuning::from_lookup(env(&[(GPU_IPC, "0"), (STAGE_CHUNK, "64K"), (STAGE_CREDITS, "4")])).unwrap();
        assert_eq!((t.gpu_ipc, t.stage_chunk, t.stage_credits), (false, 65536, 4));
        let t = Tuning::from_lookup(env(&[(AGENT_BYTES, "4K"), (AGENT_IDLE, "500")])).unwrap();
        assert_eq!((t.agent_bytes, t.agent_idle), (4096, Duration::from_micros(500)));
        assert!(Tuning::from_lookup(env(&[(STAGE_CHUNK, "64K"), (AGENT_BYTES, "128K")])).is_err(), "agent bytes above the chunk");
        assert!(Tuning::from_lookup(env(&[(AGENT_IDLE, "0")])).is_err());
        assert_eq!(Tuning::from_lookup(env(&[(AGENT_LANES, "8")])).unwrap().agent_lanes, 8);
        assert!(Tuning::from_lookup(env(&[(AGENT_LANES, "0")])).is_err());
        assert!(Tuning::from_lookup(env(&[(AGENT_LANES, "17")])).is_err());
        assert_eq!(Tuning::from_lookup(env(&[])).unwrap().payload_bytes, 4096);
        assert_eq!(Tuning::from_lookup(env(&[(PAYLOAD_BYTES, "1K")])).unwrap().payload_bytes, 1024);
        assert_eq!(Tuning::from_lookup(env(&[(PAYLOAD_BYTES, "0")])).unwrap().payload_bytes, 0);
        for bad in ["8", "100", "128K", "x"] {
            assert!(Tuning::from_lookup(env(&[(PAYLOAD_BYTES, bad)])).is_err(), "{bad}");
        }
        let t = Tuning::from_lookup(env(&[])).unwrap();
        assert_eq!(t.payload_slot_bytes(), 4096, "64 queues x 64 slots x 4 KiB = 16 MiB fits");
        let t = Tuning::from_lookup(env(&[(QUEUES, "1024")])).unwrap();
        assert_eq!(t.payload_slot_bytes(), 1024, "halved to fit 64 MiB");
        let t = Tuning::from_lookup(env(&[(QUEUES, "1000000")])).unwrap();
        assert_eq!(t.payload_slot_bytes(), 0, "not even 16 bytes fit");
        let t = Tuning::from_lookup(env(&[(STAGE_CHUNK, "1000")])).unwrap();
        assert_eq!(t.payload_slot_bytes(), 512, "at most one chunk, a power of two");
        assert!(Tuning::from_lookup(env(&[(GPU_IPC, "yes")])).is_err());
        assert!(Tuning::from_lookup(env(&[])).unwrap().gpu_p2p, "peer-to-peer stores are the default");
        assert!(!Tuning::from_lookup(env(&[(GPU_P2P, "0")])).unwrap().gpu_p2p);
        assert!(Tuning::from_lookup(env(&[(GPU_P2P, "on")])).is_err());
        assert!(Tuning::from_lookup(env(&[(STAGE_CREDITS, "0")])).is_err());
    }

    #[test]
    fn transport_map_off_by_default_on_with_1_nothing_else() {
        assert!(!Tuning::from_lookup(env(&[])).unwrap().transport_map);
        assert!(!Tuning::from_lookup(env(&[(TRANSPORT_MAP, "0")])).unwrap().transport_map);
        assert!(!Tuning::from_lookup(env(&[(TRANSPORT_MAP, " ")])).unwrap().transport_map, "empty is unset");
        assert!(Tuning::from_lookup(env(&[(TRANSPORT_MAP, "1")])).unwrap().transport_map);
        assert!(Tuning::from_lookup(env(&[(TRANSPORT_MAP, " 1 ")])).unwrap().transport_map);
        for bad in ["yes", "on", "true", "2", "-1"] {
            let e = Tuning::from_lookup(env(&[(TRANSPORT_MAP, bad)])).unwrap_err();
            assert!(matches!(&e, EnvError::Invalid { var, value, .. } if *var == TRANSPORT_MAP && value == bad), "{e}");
            assert!(e.to_string().contains("0 or 1"), "{e}");
        }
    }

    #[test]
    fn queue_mem_host_by_default_device_on_request_nothing_else() {
        assert_eq!(Tuning::from_lookup(env(&[])).unwrap().queue_mem, QueuePlacement::Host);
        for (v, want) in [("host", QueuePlacement::Host), ("device", QueuePlacement::Device), (" Device ", QueuePlacement::Device), ("", QueuePlacement::Host)] {
            assert_eq!(Tuning::from_lookup(env(&[(QUEUE_MEM, v)])).unwrap().queue_mem, want, "{v:?}");
        }
        for bad in ["gpu", "mapped", "1", "device,host"] {
            let e = Tuning::from_lookup(env(&[(QUEUE_MEM, bad)])).unwrap_err();
            assert!(matches!(&e, EnvError::Invalid { var, value, .. } if *var == QUEUE_MEM && value == bad), "{e}");
            let msg = e.to_string();
            assert!(msg.contains("CPNET_QUEUE_MEM") && msg.contains("host") && msg.contains("device"), "{msg}");
        }
        assert_eq!(QueuePlacement::Device.to_string(), "device");
    }
}
