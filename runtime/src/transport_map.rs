//! The transport map: which path this PE's operations to each PE take, and
//! over which provider (issue 19 item 4; DESIGN.md "The network path": "the
//! per-peer choice of path is printed on request").
//!
//! With `CPNET_TRANSPORT_MAP=1` (`cpnet-run --transport-map` sets it) every
//! PE prints, right after init, one line per PE of the job, itself
//! included, on stderr (one write, so PEs sharing a terminal do not
//! interleave within it):
//!
//! ```text
//! cpnet: transport map: PE 0 -> PE 1: rma via tcp;ofi_rxm [fi_write/fi_read/fi_atomic on the registered host heap (FI_HMEM: no); fabric 10.213.7.0/24, domain veth0; fi_sockaddr_in://10.213.7.1:36021 -> fi_sockaddr_in://10.213.7.2:41877]
//! ```
//!
//! [`Pe::transport_map`](crate::Pe::transport_map) and
//! [`GpuPe::transport_map`](crate::GpuPe::transport_map) return the same
//! lines as [`Route`]s. The map is built from what the PE actually set up,
//! not from the settings: the provider and addresses are those libfabric
//! granted the PE's proxy thread 0 (every thread opens the same provider;
//! their addresses differ), and a GPU PE's paths come from the CUDA IPC
//! mappings that opened and whether the kernels' peer table is installed.
//!
//! | path | when | what carries it |
//! |---|---|---|
//! | `self` | the target is this PE | CPU PE: the proxy thread, with copies and CPU atomics on the heap (`cpnet_proxy::local`); GPU PE: the kernel's own loads and stores (`CPNET_GPU_P2P=1`), else the proxy's device copies and landing agent. No provider: `via none` |
//! | `p2p stores` | GPU PE, the target's heap mapped through CUDA IPC (same host, `CPNET_GPU_IPC=1`) and `CPNET_GPU_P2P=1` | the work-group's own loads and stores into the peer's heap; transfers over the per-thread limit are proxy IPC copies; AMOs and ADD signals are staged active messages over the provider named |
//! | `ipc copy` | as `p2p stores`, with `CPNET_GPU_P2P=0` | the proxy's copy-engine copies into the mapped heap; AMOs and ADD signals as above |
//! | `rma` | CPU PE, any other PE | libfabric `fi_write`, `fi_read` and (fetching) `fi_atomic` on the peer's registered host heap (`cpnet_proxy::transport`) |
//! | `staged active messages` | GPU PE, a PE whose heap is not mapped (another host, or `CPNET_GPU_IPC=0`) | `FI_MSG` sends through registered pinned host staging buffers; the target's proxy and landing agent apply them to its GPU heap (`cpnet_proxy::staged`): the GPU heap is not registered (no `FI_HMEM` provider here) |

use std::fmt;

use cpnet_proxy::transport::EndpointFacts;

/// The path operations from one PE to another take. See the
/// [module docs](self) for when each is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The target is this PE: no fabric operation.
    SelfLoop,
    /// GPU: the kernel stores into the peer's heap mapped through CUDA IPC.
    P2pStores,
    /// GPU: the proxy copies into the peer's heap mapped through CUDA IPC.
    IpcCopy,
    /// CPU: one-sided libfabric RMA and atomics on registered host memory.
    Rma,
    /// GPU: active messages through pinned staging, applied by the target.
    StagedActiveMessages,
}

impl Path {
    /// The name printed in the map: `self`, `p2p stores`, `ipc copy`,
    /// `rma`, `staged active messages`.
    pub fn name(self) -> &'static str {
        match self {
            Path::SelfLoop => "self",
            Path::P2pStores => "p2p stores",
            Path::IpcCopy => "ipc copy",
            Path::Rma => "rma",
            Path::StagedActiveMessages => "staged active messages",
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The provider printed for [`Path::SelfLoop`]: none is involved.
pub const NO_PROVIDER: &str = "none";

/// One line of the map: the path from PE `from` to PE `to`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The PE that issues the operations (this PE).
    pub from: i32,
    /// The target PE.
    pub to: i32,
    /// The path its operations take.
    pub path: Path,
    /// The libfabric provider as libfabric reports it (`shm`,
    /// `tcp;ofi_rxm`, ...), or [`NO_PROVIDER`] for [`Path::SelfLoop`].
    pub provider: String,
    /// What else is worth knowing: how the heap is reached and registered
    /// (`FI_HMEM` or not), the fabric, domain and endpoint addresses.
    pub details: String,
}

impl fmt::Display for Route {
    /// `cpnet: transport map: PE <from> -> PE <to>: <path> via <provider> [<details>]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpnet: transport map: PE {} -> PE {}: {} via {} [{}]",
            self.from, self.to, self.path, self.provider, self.details
        )
    }
}

/// `details`, then `; ` and [`fabric_details`] of `facts` for `peer`
/// where there are any.
fn with_fabric_details(mut details: String, facts: Option<&EndpointFacts>, peer: usize) -> String {
    let f = facts.map(|f| fabric_details(f, peer)).unwrap_or_default();
    if !f.is_empty() {
        details += "; ";
        details += &f;
    }
    details
}

/// Where the endpoint listens and, for a peer, where the peer's listens:
/// `fabric F, domain D; local -> peer` (empty parts left out).
fn fabric_details(facts: &EndpointFacts, peer: usize) -> String {
    let mut parts = Vec::new();
    if !facts.fabric.is_empty() || !facts.domain.is_empty() {
        parts.push(format!("fabric {}, domain {}", facts.fabric, facts.domain));
    }
    if let Some(p) = facts.peer_addrs.get(peer) {
        parts.push(format!("{} -> {}", facts.local_addr, p));
    }
    parts.join("; ")
}

/// The map of a CPU PE (`me` of `n_pes`) whose proxy thread 0 reported
/// `facts` (`threads` proxy threads in all): itself `self`, every other PE
/// `rma` over the granted provider.
pub(crate) fn cpu_routes(me: i32, n_pes: i32, facts: &EndpointFacts, threads: usize) -> Vec<Route> {
    (0..n_pes)
        .map(|to| {
            if to == me {
                return Route {
                    from: me,
                    to,
                    path: Path::SelfLoop,
                    provider: NO_PROVIDER.to_owned(),
                    details: "the proxy thread copies and applies atomics to this PE's own heap".to_owned(),
                };
            }
            let mut details =
                with_fabric_details("fi_write/fi_read/fi_atomic on the registered host heap (FI_HMEM: no)".to_owned(), Some(facts), to as usize);
            if threads > 1 {
                details += &format!(" (proxy thread 0 of {threads}, one endpoint each)");
            }
            Route { from: me, to, path: Path::Rma, provider: facts.provider.clone(), details }
        })
        .collect()
}

/// The map of a GPU PE (`me`): `ipc_mapped[pe]` says whether PE `pe`'s heap
/// is mapped into this process through CUDA IPC (the staged transport then
/// copies into it), `p2p` whether the kernels' peer table is installed
/// (`CPNET_GPU_P2P=1`: kernels store into every mapped heap and their own),
/// `provider` the provider the staged transport opened, as libfabric reports it,
/// `facts` its proxy thread 0's endpoint (fabric, domain and addresses, which
/// the staged lines carry), where known.
pub(crate) fn gpu_routes(me: i32, ipc_mapped: &[bool], p2p: bool, provider: &str, facts: Option<&EndpointFacts>) -> Vec<Route> {
    let amo = format!("AMOs and ADD signals: staged active messages over {provider}");
    ipc_mapped
        .iter()
        .enumerate()
        .map(|(to, &mapped)| {
            let to = to as i32;
            let (path, provider, details) = if to == me {
                let how = if p2p {
                    "kernels load and store their own heap; larger transfers, AMOs and ADD signals: the proxy's device copies and landing agent"
                } else {
                    "the proxy's device copies and landing agent on this PE's own heap"
                };
                (Path::SelfLoop, NO_PROVIDER.to_owned(), how.to_owned())
            } else if mapped && p2p {
                let how = format!("kernels store into the peer's GPU heap mapped by CUDA IPC; larger transfers: proxy IPC copies; {amo}");
                (Path::P2pStores, provider.to_owned(), how)
            } else if mapped {
                let how = format!("proxy copy-engine copies into the peer's GPU heap mapped by CUDA IPC; {amo}");
                (Path::IpcCopy, provider.to_owned(), how)
            } else {
                let how = "FI_MSG through registered pinned host staging, applied to the peer's GPU heap by its landing agent; GPU heap not registered (FI_HMEM: no)";
                (Path::StagedActiveMessages, provider.to_owned(), with_fabric_details(how.to_owned(), facts, to as usize))
            };
            Route { from: me, to, path, provider, details }
        })
        .collect()
}

/// Print `routes` on stderr, one line each, in a single write.
pub(crate) fn print(routes: &[Route]) {
    use std::io::Write;
    let text: String = routes.iter().map(|r| format!("{r}\n")).collect();
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(provider: &str) -> EndpointFacts {
        EndpointFacts {
            provider: provider.to_owned(),
            fabric: "10.1.2.0/24".to_owned(),
            domain: "veth0".to_owned(),
            local_addr: "fi_sockaddr_in://10.1.2.1:1000".to_owned(),
            peer_addrs: vec!["fi_sockaddr_in://10.1.2.1:1000".to_owned(), "fi_sockaddr_in://10.1.2.2:2000".to_owned()],
        }
    }

    #[test]
    fn cpu_pes_reach_themselves_locally_and_peers_by_rma() {
        let r = cpu_routes(0, 2, &facts("tcp;ofi_rxm"), 1);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].path, r[0].provider.as_str()), (Path::SelfLoop, NO_PROVIDER));
        assert_eq!((r[1].path, r[1].provider.as_str()), (Path::Rma, "tcp;ofi_rxm"));
        assert_eq!(
            r[1].to_string(),
            "cpnet: transport map: PE 0 -> PE 1: rma via tcp;ofi_rxm [fi_write/fi_read/fi_atomic on the registered \
             host heap (FI_HMEM: no); fabric 10.1.2.0/24, domain veth0; fi_sockaddr_in://10.1.2.1:1000 -> \
             fi_sockaddr_in://10.1.2.2:2000]"
        );
        assert!(r[0].to_string().starts_with("cpnet: transport map: PE 0 -> PE 0: self via none ["), "{}", r[0]);
        let r = cpu_routes(1, 2, &facts("shm"), 3);
        assert_eq!((r[0].path, r[1].path), (Path::Rma, Path::SelfLoop));
        assert!(r[0].details.ends_with("(proxy thread 0 of 3, one endpoint each)"), "{}", r[0]);
    }

    #[test]
    fn cpu_route_without_fabric_names_or_addresses_leaves_them_out() {
        let f = EndpointFacts { provider: "shm".into(), fabric: String::new(), domain: String::new(), local_addr: String::new(), peer_addrs: Vec::new() };
        let r = cpu_routes(0, 2, &f, 1);
        assert_eq!(r[1].details, "fi_write/fi_read/fi_atomic on the registered host heap (FI_HMEM: no)");
    }

    #[test]
    fn gpu_paths_follow_ipc_mappings_and_the_p2p_switch() {
        let mapped = [false, true, false];
        let r = gpu_routes(0, &mapped, true, "shm", None);
        let paths: Vec<Path> = r.iter().map(|r| r.path).collect();
        assert_eq!(paths, [Path::SelfLoop, Path::P2pStores, Path::StagedActiveMessages]);
        let r = gpu_routes(0, &mapped, false, "shm", Some(&facts("net")));
        let paths: Vec<Path> = r.iter().map(|r| r.path).collect();
        assert_eq!(paths, [Path::SelfLoop, Path::IpcCopy, Path::StagedActiveMessages]);
        assert_eq!(r[2].provider, "shm");
        assert!(r[2].details.contains("FI_HMEM: no"), "{}", r[2]);
        assert!(r[1].details.contains("over shm"), "{}", r[1]);
        assert_eq!(r[0].provider, NO_PROVIDER);
        assert!(r[2].to_string().contains("PE 0 -> PE 2: staged active messages via shm ["), "{}", r[2]);
    }

    #[test]
    fn staged_routes_carry_the_endpoint_addresses() {
        let r = gpu_routes(0, &[false, false], false, "net", Some(&facts("net")));
        assert_eq!(r[1].path, Path::StagedActiveMessages);
        assert!(
            r[1].details.ends_with(
                "(FI_HMEM: no); fabric 10.1.2.0/24, domain veth0; fi_sockaddr_in://10.1.2.1:1000 -> fi_sockaddr_in://10.1.2.2:2000"
            ),
            "{}",
            r[1]
        );
    }

    #[test]
    fn path_names_are_the_documented_ones() {
        let names: Vec<&str> =
            [Path::SelfLoop, Path::P2pStores, Path::IpcCopy, Path::Rma, Path::StagedActiveMessages].map(Path::name).to_vec();
        assert_eq!(names, ["self", "p2p stores", "ipc copy", "rma", "staged active messages"]);
    }
}
