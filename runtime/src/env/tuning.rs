//! [`Tuning`]: the runtime's sizes, timeouts and switches, read from the
//! `CPNET_*` tuning variables (documented in the [module docs](crate::env)),
//! each checked with an error that names the variable.

use std::time::Duration;

use super::*;

/// Sizes and timeouts of the runtime, from the `CPNET_*` tuning variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// `CPNET_PROVIDER`: libfabric provider; `None` lets the runtime choose
    /// (`shm` when all PEs are local, else `net` or `tcp;ofi_rxm`:
    /// `startup::default_fabric`).
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
    /// `CPNET_PROXY_CPUS`: the CPUs proxy threads are pinned to, in order
    /// ([`Tuning::proxy_cpu`]); empty (the default): not pinned.
    pub proxy_cpus: Vec<usize>,
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
    /// `CPNET_STAGE_SHARED`: put data through the target's staging zone
    /// (the `shm` provider only).
    pub stage_shared: bool,
    /// `CPNET_STAGE_SLOT`: bytes of a staging zone slot.
    pub stage_slot: u64,
    /// `CPNET_STAGE_SLOTS`: zone slots per source PE and thread.
    pub stage_slots: u32,
    /// `CPNET_AGENT_BYTES`: data up to this size moves through the landing agent.
    pub agent_bytes: u64,
    /// `CPNET_AGENT_IDLE`: an idle landing agent exits after this long.
    pub agent_idle: Duration,
    /// `CPNET_AGENT_LANES`: landing rings, each with its own agent, per proxy thread.
    pub agent_lanes: usize,
    /// `CPNET_AGENT_SPLIT`: a copy of up to `agent_lanes` agent records
    /// moves as one record per lane (off by itself on a GPU that PEs share
    /// without MPS).
    pub agent_split: bool,
    /// `CPNET_TEAMS`: entries of the team table (`2..=CPNET_MAX_TEAMS`).
    pub teams: usize,
    /// `CPNET_TEAM_SCRATCH`: symmetric scratch bytes per team, reserved past
    /// the heap's end.
    pub team_scratch: u64,
    /// `CPNET_REDUCE_SCRATCH`: heap bytes a GPU PE reserves past the teams'
    /// scratch for the network path's reduce on a stream: the world team of
    /// two's landing halves (its first 8 MiB, where it holds 8 MiB, 64 KiB
    /// and 256 bytes or more; the 256 bytes after them are the pair
    /// staging's chunk signals) and the in-place copy (a multiple of 256; 0:
    /// none).
    pub reduce_scratch: u64,
    /// `CPNET_PAIR_STAGE`: the world team of two's reduce on a stream
    /// through halves in host memory that its kernels write and read
    /// (`runtime/src/gpu/pair_stage.rs`), where the job allows it.
    pub pair_stage: bool,
    /// `CPNET_PAIR_CHUNK`: bytes of each chunk of a call through the pair
    /// staging, which signals each chunk on its own (`cpnet/pair.cuh`).
    pub pair_chunk: u64,
    /// `CPNET_PAIR_BLOCKS`: producer blocks (and as many consumers) of a
    /// call through the pair staging; 0: one per 16 KiB, at most 16.
    pub pair_blocks: u32,
    /// `CPNET_PAYLOAD_BYTES`: requested bytes per payload slot (0: none);
    /// [`Tuning::payload_slot_bytes`] gives the size in use.
    pub payload_bytes: u32,
    /// `CPNET_TRANSPORT_MAP`: print the path to every PE after init
    /// ([`crate::transport_map`]).
    pub transport_map: bool,
    /// `CPNET_PROXY`: who serves a PE's queues; `None` where unset: a CPU
    /// PE then takes the in-process proxy, a GPU PE its GPU's daemon when
    /// the GPU runs under MPS (the daemon's landing agents then run beside
    /// the PE's kernels) and the in-process proxy otherwise ([`crate::GpuPe`]).
    pub proxy: Option<ProxyMode>,
    /// `CPNET_PROXYD_DIR`, else `$XDG_RUNTIME_DIR/cpnet`, else
    /// `/tmp/cpnet-<uid>`: the daemon's directory.
    pub proxyd_dir: std::path::PathBuf,
    /// `CPNET_PROXYD`: the daemon binary to start; `None`: `cpnet-proxyd`
    /// next to the running program, else on `PATH`.
    pub proxyd_bin: Option<std::path::PathBuf>,
    /// `CPNET_PROXYD_LINGER`: how long an idle daemon stays.
    pub proxyd_linger: Duration,
    /// `CPNET_JOB_ID` and `CPNET_JOB_TOKEN` (both or neither).
    pub job: Option<JobKey>,
    /// Not a variable: set by `cpnet-proxyd` for the services it runs: it
    /// serves other processes' PEs, so it must not clean up libfabric shm
    /// regions of its own pid while they run, and their threads hold their
    /// endpoints open after they stop until the daemon releases them
    /// (`Proxies::release`). `false` everywhere else.
    pub in_daemon: bool,
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
            proxy_cpus: Vec::new(),
            gpu_ipc: true,
            gpu_p2p: true,
            stage_chunk: 256 << 10,
            stage_credits: 8,
            stage_bufs: 16,
            stage_shared: true,
            stage_slot: 1 << 20,
            stage_slots: 4,
            agent_bytes: 64 << 10,
            agent_idle: Duration::from_micros(2000),
            agent_lanes: 4,
            agent_split: true,
            teams: 32,
            team_scratch: 128 << 10,
            reduce_scratch: 24 << 20,
            pair_stage: true,
            pair_chunk: 512 << 10,
            pair_blocks: 0,
            payload_bytes: 4096,
            transport_map: false,
            proxy: None,
            proxyd_dir: default_proxyd_dir(None),
            proxyd_bin: None,
            proxyd_linger: DEFAULT_PROXYD_LINGER,
            job: None,
            in_daemon: false,
        }
    }
}

/// The daemon's directory without `CPNET_PROXYD_DIR`: `$XDG_RUNTIME_DIR/cpnet`
/// (given `xdg`), else `/tmp/cpnet-<uid>`.
fn default_proxyd_dir(xdg: Option<String>) -> std::path::PathBuf {
    match xdg.filter(|x| !x.trim().is_empty()) {
        Some(x) => std::path::Path::new(x.trim()).join("cpnet"),
        None => std::path::PathBuf::from(format!("/tmp/cpnet-{}", rustix::process::getuid().as_raw())),
    }
}

impl Tuning {
    /// The CPU proxy thread `thread` of PE `pe` is pinned to under
    /// `CPNET_PROXY_CPUS` (entry `(pe x threads + thread) mod len`, so the
    /// PEs of a host sharing one list spread over it); `None` when unset.
    pub fn proxy_cpu(&self, pe: i32, threads: usize, thread: usize) -> Option<usize> {
        (!self.proxy_cpus.is_empty())
            .then(|| self.proxy_cpus[(pe.max(0) as usize * threads + thread) % self.proxy_cpus.len()])
    }

    /// Proxy service threads a GPU PE runs: `gpu_proxy_threads`, at most
    /// one per queue, at least one.
    pub fn gpu_service_threads(&self) -> usize {
        self.gpu_proxy_threads.min(self.queues).max(1)
    }

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
    /// [module docs](crate::env)); unset ones take their defaults.
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
        if let Some(v) = get(STAGE_SHARED) {
            t.stage_shared = switch(STAGE_SHARED, &v)?;
        }
        if let Some(v) = get(STAGE_SLOT) {
            t.stage_slot = parse_bytes(&v)
                .filter(|&b| ((4 << 10)..=(1 << 30)).contains(&b))
                .ok_or_else(|| invalid(STAGE_SLOT, &v, "a byte count in 4K..=1G, optionally with a K, M or G suffix"))?;
        }
        if let Some(v) = get(STAGE_SLOTS) {
            t.stage_slots = v
                .parse::<u32>()
                .ok()
                .filter(|n| (1..=64).contains(n))
                .ok_or_else(|| invalid(STAGE_SLOTS, &v, "an integer in 1..=64"))?;
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
        if let Some(v) = get(TEAMS) {
            let max = cpnet_device::layout::CPNET_MAX_TEAMS;
            t.teams = v
                .parse::<usize>()
                .ok()
                .filter(|n| (2..=max).contains(n))
                .ok_or_else(|| invalid(TEAMS, &v, &format!("an integer in 2..={max}")))?;
        }
        if let Some(v) = get(TEAM_SCRATCH) {
            t.team_scratch = parse_bytes(&v)
                .filter(|b| (4096..=64 << 20).contains(b) && b % 64 == 0)
                .ok_or_else(|| invalid(TEAM_SCRATCH, &v, "a multiple of 64 bytes in 4K..=64M, optionally with a K or M suffix"))?;
        }
        if let Some(v) = get(REDUCE_SCRATCH) {
            t.reduce_scratch = parse_bytes(&v)
                .filter(|b| *b <= 1 << 30 && b % 256 == 0)
                .ok_or_else(|| invalid(REDUCE_SCRATCH, &v, "a multiple of 256 bytes in 0..=1G, optionally with a K, M or G suffix"))?;
        }
        if let Some(v) = get(PAIR_STAGE) {
            t.pair_stage = switch(PAIR_STAGE, &v)?;
        }
        if let Some(v) = get(PAIR_CHUNK) {
            t.pair_chunk = parse_bytes(&v)
                .filter(|b| (4096..=4 << 20).contains(b) && b % 256 == 0)
                .ok_or_else(|| invalid(PAIR_CHUNK, &v, "a multiple of 256 bytes in 4K..=4M, optionally with a K or M suffix"))?;
        }
        if let Some(v) = get(PAIR_BLOCKS) {
            t.pair_blocks = v
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= PAIR_BLOCKS_MAX)
                .ok_or_else(|| invalid(PAIR_BLOCKS, &v, &format!("an integer in 0..={PAIR_BLOCKS_MAX}")))?;
        }
        if let Some(v) = get(AGENT_LANES) {
            t.agent_lanes = v
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or_else(|| invalid(AGENT_LANES, &v, "an integer in 1..=16"))?;
        }
        if let Some(v) = get(AGENT_SPLIT) {
            t.agent_split = switch(AGENT_SPLIT, &v)?;
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
        if let Some(v) = get(PROXY_CPUS) {
            t.proxy_cpus = parse_cpu_list(&v).ok_or_else(|| {
                invalid(PROXY_CPUS, &v, "a CPU list as taskset -c writes it, e.g. 2,3 or 8-11,24 (each CPU below 1024)")
            })?;
        }
        match get(PROXY_IDLE).as_deref() {
            None => {}
            Some("spin") => t.proxy_idle_sleep = None,
            Some("park") => t.proxy_idle_sleep = Some(t.proxy_idle_sleep.unwrap_or(DEFAULT_PARK_SLEEP)),
            Some(v) => return Err(invalid(PROXY_IDLE, v, "spin or park")),
        }
        t.proxy = match get(PROXY).as_deref() {
            None => None,
            Some("inprocess") => Some(ProxyMode::InProcess),
            Some("daemon") => Some(ProxyMode::Daemon),
            Some(v) => return Err(invalid(PROXY, v, "inprocess or daemon")),
        };
        t.proxyd_dir = match get(PROXYD_DIR) {
            Some(d) => std::path::PathBuf::from(d),
            None => default_proxyd_dir(lookup(XDG_RUNTIME_DIR)),
        };
        t.proxyd_bin = get(PROXYD).map(std::path::PathBuf::from);
        if let Some(v) = get(PROXYD_LINGER) {
            t.proxyd_linger = parse_seconds(&v).ok_or_else(|| invalid(PROXYD_LINGER, &v, "seconds >= 0 (e.g. 10 or 0.5)"))?;
        }
        t.job = match (get(JOB_ID), get(JOB_TOKEN)) {
            (None, None) => None,
            (Some(id), Some(token)) => Some(JobKey {
                id: id.parse().map_err(|_| invalid(JOB_ID, &id, "an unsigned 64-bit integer"))?,
                token: JobKey::parse_token(&token).ok_or_else(|| invalid(JOB_TOKEN, "<hidden>", "32 hex digits"))?,
            }),
            (Some(_), None) => {
                return Err(EnvError::Missing { var: JOB_TOKEN, why: format!("{JOB_ID} is set (cpnet-run sets both)") });
            }
            (None, Some(_)) => {
                return Err(EnvError::Missing { var: JOB_ID, why: format!("{JOB_TOKEN} is set (cpnet-run sets both)") });
            }
        };
        Ok(t)
    }
}
