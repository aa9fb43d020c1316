//! A PE's start-up, as one sequence in one place ([`start`]):
//!
//! 1. **launch environment**: who this process is ([`Launch`]) and how big
//!    it is ([`Tuning`]), read by the caller (`Pe::init`, `GpuPe::init`),
//!    which also opens what must fail before any rendezvous (a GPU PE's
//!    device);
//! 2. **rendezvous**: join the job's TCP rendezvous ([`Bootstrap::connect`]);
//! 3. **heap**: every PE checks that all have the same heap layout
//!    ([`check_layout`]), then the symmetric heap and the command queues of
//!    the PE's kind ([`PeKind::heap`]; a GPU PE also exchanges its CUDA IPC
//!    handles here);
//! 4. **proxy**: start the service threads in this process, or attach to the
//!    host's proxy daemon (`CPNET_PROXY=daemon`, [`crate::daemon`]) ([`PeKind::proxy`]);
//! 5. **connect and watchdog**: exchange the endpoints' cards with every PE,
//!    meet at a barrier, start the proxy watchdog, or the daemon link's
//!    watch over the daemon ([`PeCore::start`]).
//!
//! Modules depend one way: `pe` and `gpu` -> `startup` -> `core` ->
//! `proxy_link` -> `proxy_threads`, `daemon` -> `bootstrap`, `env`, `error`,
//! `watchdog`.

use cpnet_device::layout::ErrorCode;
use cpnet_proxy::transport::FabricConfig;

use crate::bootstrap::Bootstrap;
use crate::core::{PeCore, SHMALLOC_ALIGN, first_mismatch, setup_wait_timeout};
use crate::env::{Launch, Tuning};
use crate::error::{Error, Result};
use crate::proxy_link::ProxyLink;

/// A kind of PE (CPU or GPU): its steps 3 and 4 of the start-up.
pub(crate) trait PeKind {
    /// The heap and queues: what the PE keeps after start-up.
    type Parts;
    /// What its transport asks of the provider, which picks the default
    /// provider between hosts ([`default_fabric`]).
    const TRAFFIC: Traffic;
    /// Step 3: allocate the symmetric heap (`heap_size` bytes, a multiple of
    /// [`SHMALLOC_ALIGN`]: `CPNET_HEAP_SIZE` and the teams' scratch past it)
    /// and the queues. May exchange through
    /// `boot` (collective then). `fabric` is what step 4 opens (a GPU PE
    /// that the proxy daemon serves hands it over when it attaches here).
    fn heap(&mut self, launch: &Launch, tuning: &Tuning, boot: &Bootstrap, fabric: &FabricConfig, heap_size: u64) -> Result<Self::Parts>;
    /// Bytes of heap this kind keeps for itself past the teams' scratch, at
    /// offset `CPNET_HEAP_SIZE + teams x CPNET_TEAM_SCRATCH` (a GPU PE's
    /// in-place reduce scratch, `CPNET_REDUCE_SCRATCH`); none by default.
    fn reserve(_tuning: &Tuning) -> u64 {
        0
    }
    /// Step 4: the proxy serving `parts`' queues over `fabric`: service
    /// threads in this process, or an attachment to the proxy daemon
    /// (`CPNET_PROXY`). May use `boot` (collective then).
    fn proxy(&mut self, parts: &mut Self::Parts, launch: &Launch, tuning: &Tuning, boot: &Bootstrap, fabric: &FabricConfig) -> Result<ProxyLink>;
    /// What aborting the PE does to its queues (waits in work-groups or
    /// kernels return `code` at once).
    fn abort(parts: &Self::Parts) -> Box<dyn Fn(ErrorCode) + Send + Sync>;
}

/// Start a PE of kind `kind`: the whole sequence of the [module docs](self),
/// steps 2 to 5. **Collective.** Returns the core (bootstrap, allocator,
/// proxy) and the kind's parts; the caller holds the core before the parts
/// so that the proxy stops before the memory it serves is freed.
///
/// # Errors
/// [`Error::Bootstrap`], [`Error::Transport`], [`Error::Queue`],
/// [`Error::Proxy`], [`Error::NotSymmetric`], and the kind's own.
pub(crate) fn start<K: PeKind>(launch: Launch, tuning: Tuning, mut kind: K) -> Result<(PeCore, K::Parts)> {
    init_logging();
    let me = launch.pe;
    // 2. rendezvous
    let boot = Bootstrap::connect(&launch, tuning.connect_timeout).map_err(|cause| Error::Bootstrap { pe: me, cause })?;
    // Set up at the PEs' own pace; `PeCore::start` sets CPNET_COLLECTIVE_TIMEOUT after.
    boot.set_wait_timeout(setup_wait_timeout(&tuning));
    // 3. heap and queues
    // The teams' scratch (crate::team) follows the heap the allocator hands
    // out, then the kind's own reserve.
    let heap_size = tuning.heap_size.next_multiple_of(SHMALLOC_ALIGN);
    let (teams, reserve) = (tuning.team_scratch * tuning.teams as u64, K::reserve(&tuning));
    check_layout(&boot, me, [heap_size, teams, reserve])?;
    let reserved = teams + reserve;
    // The provider step 4 opens; a GPU PE served by the daemon hands it over
    // when it attaches, here.
    let fabric = default_fabric(&launch, &tuning, boot.local_ip(), K::TRAFFIC);
    let mut parts = kind.heap(&launch, &tuning, &boot, &fabric, heap_size + reserved)?;
    // 4. proxy
    let proxies = kind.proxy(&mut parts, &launch, &tuning, &boot, &fabric)?;
    // 5. connect to every PE, barrier, watchdog
    let core = PeCore::start(launch, tuning, fabric, boot, heap_size, proxies, K::abort(&parts))?;
    Ok((core, parts))
}


/// Check that every PE lays its symmetric heap out alike: `[heap, teams,
/// reserve]` are this PE's heap bytes (`CPNET_HEAP_SIZE`, rounded up), its
/// teams' scratch (`CPNET_TEAMS` x `CPNET_TEAM_SCRATCH`) and its kind's
/// reserve past them (GPU PEs: `CPNET_REDUCE_SCRATCH`). Every symmetric
/// address is one offset on every PE (OpenSHMEM 1.5 §3, symmetric data
/// objects), so a PE started with another value would read and write the
/// wrong bytes of its peers' heaps: every PE fails at init instead, naming
/// the first PE whose layout differs (issue 22, bad input). **Collective**
/// (an allgather).
///
/// # Errors
/// [`Error::NotSymmetric`] (call `"init"`); [`Error::Bootstrap`].
fn check_layout(boot: &Bootstrap, me: i32, mine: [u64; 3]) -> Result<()> {
    let Some((peer, b)) = first_mismatch(boot, me, &mine)? else { return Ok(()) };
    let theirs: Vec<u64> = b.chunks_exact(8).map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes"))).collect();
    let show = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(" / ");
    Err(Error::NotSymmetric {
        pe: me,
        call: "init",
        detail: format!(
            "the symmetric heap's layout differs: this PE has {} bytes of heap / teams' scratch / its kind's reserve, \
             PE {peer} has {} (CPNET_HEAP_SIZE / CPNET_TEAMS x CPNET_TEAM_SCRATCH / GPU PEs' CPNET_REDUCE_SCRATCH): \
             set them alike on every PE",
            show(&mine),
            show(&theirs)
        ),
    })
}

/// Sets up `tracing` output on stderr once per process (`RUST_LOG`, default
/// `warn`), unless the program installed a subscriber already.
pub(crate) fn init_logging() {
    // Once, not at every init: each subscriber built only for `try_init`
    // to refuse it (one is set) left ~120 B allocated in tracing-core
    // (heaptrack: 4.7 KiB over 40 init/finalize cycles).
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    });
}

/// What a PE kind's transport needs from the provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Traffic {
    /// One-sided RMA and atomics on registered host memory (CPU PEs,
    /// `cpnet_proxy::transport`).
    RmaAtomics,
    /// Messages only (GPU PEs' staged transport, `cpnet_proxy::staged`).
    Messages,
}

/// The provider and where it binds. The provider: `CPNET_PROVIDER`, else
/// `shm` when every PE is on this host; between hosts, for
/// [`Traffic::Messages`] the native TCP RDM endpoint where this libfabric
/// has one ([`cpnet_proxy::fabric::native_tcp_rdm`]: `net` in 1.17, 1.6-1.9x
/// lower latency than rxm), else, and for [`Traffic::RmaAtomics`] (1.17's
/// `net` has no atomic operations), `tcp;ofi_rxm`. Every PE of a job runs
/// the same libfabric and kind, so every PE picks the same. Where an IP
/// provider binds: `CPNET_FABRIC_NODE`; else `rendezvous_ip`, the local
/// address of this PE's connection to the rendezvous
/// ([`Bootstrap::local_ip`]), i.e. the interface this host reaches PE 0's
/// host through (`127.0.0.1` under cpnet-run, whose rendezvous is there);
/// else (a single PE) `127.0.0.1`. Left to itself, libfabric's tcp provider
/// takes the first interface it lists, which can be the loopback one: a PE
/// then publishes `127.0.0.1` and no other host reaches it (seen between two
/// network namespaces, scripts/twohost.sh). Nor is "every PE on this host"
/// a safe reason for `127.0.0.1`: it is only assumed where the launcher says
/// nothing of hosts (PMI without `MPI_LOCAL*`).
pub(crate) fn default_fabric(
    launch: &Launch,
    tuning: &Tuning,
    rendezvous_ip: Option<std::net::IpAddr>,
    traffic: Traffic,
) -> FabricConfig {
    let all_local = launch.local_size == launch.n_pes;
    let provider = tuning.provider.clone().unwrap_or_else(|| {
        if all_local {
            "shm".to_owned()
        } else {
            between_hosts(traffic, cpnet_proxy::fabric::native_tcp_rdm()).to_owned()
        }
    });
    let ip = !provider.starts_with("shm");
    let src_node = tuning
        .fabric_node
        .clone()
        .or_else(|| rendezvous_ip.map(|a| a.to_string()))
        .or_else(|| all_local.then(|| "127.0.0.1".to_owned()));
    FabricConfig { provider, src_node: if ip { src_node } else { None }, reach_timeout: tuning.reach_timeout }
}

/// The default provider between hosts for `traffic`, `native` being this
/// libfabric's native TCP RDM provider, if any.
fn between_hosts(traffic: Traffic, native: Option<&'static str>) -> &'static str {
    match (traffic, native) {
        (Traffic::Messages, Some(name)) => name,
        _ => "tcp;ofi_rxm",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_binds_the_rendezvous_route_and_loopback_only_without_one() {
        use crate::env::Launcher;
        let ip: std::net::IpAddr = "10.213.7.2".parse().unwrap();
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let one_host = Launch { pe: 1, n_pes: 2, local_pe: 1, local_size: 2, bootstrap: Some("h:1".into()), launcher: Launcher::Mpi };
        let two_hosts = Launch { local_pe: 0, local_size: 1, ..one_host.clone() };
        let tcp = Tuning { provider: Some("tcp;ofi_rxm".into()), ..Tuning::default() };

        let f = default_fabric(&one_host, &Tuning::default(), Some(ip), Traffic::RmaAtomics);
        assert_eq!((f.provider.as_str(), f.src_node), ("shm", None), "one host: shm, which binds nothing");
        let f = default_fabric(&one_host, &tcp, Some(lo), Traffic::RmaAtomics);
        assert_eq!(f.src_node.as_deref(), Some("127.0.0.1"), "cpnet-run over tcp: its rendezvous is on loopback");
        let f = default_fabric(&one_host, &tcp, None, Traffic::RmaAtomics);
        assert_eq!(f.src_node.as_deref(), Some("127.0.0.1"), "one host, no connection: loopback");
        // PMI without MPI_LOCAL*: "one host" is only assumed; the route decides.
        let f = default_fabric(&one_host, &tcp, Some(ip), Traffic::RmaAtomics);
        assert_eq!(f.src_node.as_deref(), Some("10.213.7.2"), "assumed one host over tcp: the route to PE 0");

        let f = default_fabric(&two_hosts, &Tuning::default(), Some(ip), Traffic::RmaAtomics);
        assert_eq!((f.provider.as_str(), f.src_node.as_deref()), ("tcp;ofi_rxm", Some("10.213.7.2")), "the route to PE 0");
        let f = default_fabric(&two_hosts, &Tuning::default(), None, Traffic::RmaAtomics);
        assert_eq!(f.src_node, None, "no connection: the provider's choice");
        let node = Tuning { fabric_node: Some("10.9.9.9".into()), ..tcp.clone() };
        let f = default_fabric(&two_hosts, &node, Some(ip), Traffic::RmaAtomics);
        assert_eq!(f.src_node.as_deref(), Some("10.9.9.9"), "CPNET_FABRIC_NODE wins");
        let f = default_fabric(&one_host, &Tuning::default(), Some(ip), Traffic::Messages);
        assert_eq!(f.provider, "shm", "one host: shm for GPU PEs too");
        assert_eq!(between_hosts(Traffic::Messages, Some("net")), "net", "GPU PEs between hosts: the native endpoint");
        assert_eq!(between_hosts(Traffic::Messages, None), "tcp;ofi_rxm", "no native endpoint: rxm");
        assert_eq!(between_hosts(Traffic::RmaAtomics, Some("net")), "tcp;ofi_rxm", "CPU PEs need atomics: rxm");
        let shm = Tuning { provider: Some("shm".into()), ..Tuning::default() };
        assert_eq!(default_fabric(&two_hosts, &shm, Some(ip), Traffic::RmaAtomics).src_node, None, "shm binds no address");
    }

}
