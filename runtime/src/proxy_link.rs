//! Who serves a PE's queues, as [`PeCore`](crate::core::PeCore) sees it
//! ([`ProxyLink`]): service threads in this process ([`Proxies`]), or the
//! host's proxy daemon ([`DaemonLink`]). Either is connected to every PE,
//! watched, asked for command errors, stopped (drained) at finalize, or
//! abandoned when the job fails.

use std::sync::Arc;
use std::time::Duration;

use cpnet_proxy::service::CommandError;
use cpnet_proxy::transport::EndpointFacts;

use crate::bootstrap::Bootstrap;
use crate::daemon::DaemonLink;
use crate::error::Result;
use crate::proxy_threads::Proxies;

/// A PE's proxy.
pub(crate) enum ProxyLink {
    /// Service threads in this process.
    InProcess(Proxies),
    /// The proxy daemon's (`CPNET_PROXY=daemon`); the timeout bounds the
    /// daemon's connect step.
    Daemon(DaemonLink, Duration),
}

impl ProxyLink {
    /// A GPU PE's heap allocated by the daemon: its CUDA IPC handle; `None`
    /// in process (or for a CPU PE).
    pub(crate) fn gpu_heap(&self) -> Option<&[u8]> {
        match self {
            ProxyLink::Daemon(d, _) if !d.gpu_heap().is_empty() => Some(d.gpu_heap()),
            _ => None,
        }
    }

    /// Exchange the endpoints' cards with every PE and connect them.
    /// **Collective.**
    pub(crate) fn connect(&mut self, boot: &Bootstrap, me: i32) -> Result<()> {
        match self {
            ProxyLink::InProcess(p) => p.connect(boot, me),
            ProxyLink::Daemon(d, timeout) => d.connect(boot, me, *timeout),
        }
    }

    /// Start watching: in process, the stall watchdog (when `timeout` is
    /// set); with the daemon, always, the link's reader (the daemon's own
    /// watchdog reports stalls, and a lost daemon is fatal). `on_fatal` gets
    /// the report, once.
    pub(crate) fn start_watchdog(&mut self, me: i32, timeout: Option<Duration>, on_fatal: Box<dyn FnOnce(String) + Send>) -> Result<()> {
        match self {
            // Also with stall detection off: it ends the PE on a transport's
            // fatal report (a peer the fabric cannot reach, crate::watchdog).
            ProxyLink::InProcess(p) => p.start_watchdog(me, timeout, on_fatal),
            ProxyLink::Daemon(d, _) => {
                d.start_watchdog(on_fatal);
                Ok(())
            }
        }
    }

    /// Per service thread, what its transport reports about itself.
    pub(crate) fn facts(&self) -> &[EndpointFacts] {
        match self {
            ProxyLink::InProcess(p) => p.facts(),
            ProxyLink::Daemon(d, _) => d.facts(),
        }
    }

    /// Command errors recorded so far.
    pub(crate) fn command_errors(&self) -> Vec<CommandError> {
        match self {
            ProxyLink::InProcess(p) => p.command_errors(),
            ProxyLink::Daemon(d, _) => d.command_errors(),
        }
    }

    /// Stop the services (draining unless abandoned) and wait for them.
    pub(crate) fn stop(&mut self, me: i32) -> Result<()> {
        match self {
            ProxyLink::InProcess(p) => p.stop(me),
            ProxyLink::Daemon(d, _) => d.stop(),
        }
    }

    /// The job is failing: the services stop without draining.
    pub(crate) fn abandon(&self) {
        match self {
            ProxyLink::InProcess(p) => p.abandon(),
            ProxyLink::Daemon(d, _) => d.abandon(),
        }
    }

    /// [`ProxyLink::abandon`] as a callable for the failure handler.
    pub(crate) fn abandoner(&self) -> Arc<dyn Fn() + Send + Sync> {
        match self {
            ProxyLink::InProcess(p) => {
                let flag = Arc::clone(&p.abandon);
                // Release: pairs with the service threads' Acquire in drain.
                Arc::new(move || flag.store(true, std::sync::atomic::Ordering::Release))
            }
            ProxyLink::Daemon(d, _) => d.abandoner(),
        }
    }
}

impl From<Proxies> for ProxyLink {
    fn from(p: Proxies) -> ProxyLink {
        ProxyLink::InProcess(p)
    }
}
