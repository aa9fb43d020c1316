//! # cpnet
//!
//! The host API of cpnet (init, PE info, symmetric heap, CPU work-groups and
//! GPU kernels, barrier, finalize), bootstrap and the `cpnet-run` launcher.
//!
//! - [`env`](mod@env): every environment variable cpnet reads, in one place;
//! - [`bootstrap`]: the TCP rendezvous (allgather, barrier, peer-failure
//!   notices) and the server that `cpnet-run` (or PE 0 under mpirun/srun) runs;
//! - [`pe`]: the host API proper ([`Pe`]);
//! - [`daemon`]: the proxy daemon `cpnet-proxyd` (`CPNET_PROXY=daemon`):
//!   its socket, security model, shared memory and faults, and the PE's link to it;
//! - [`gpu`]: GPU PEs ([`GpuPe`]): the CUDA device of a PE, the symmetric
//!   heap in GPU memory, the queues (mapped, or in GPU memory through
//!   copies: `CPNET_QUEUE_MEM`), the kernel handle and builds;
//! - [`transport_map`]: the path to each PE and the provider, printed after
//!   init with `CPNET_TRANSPORT_MAP=1` (`cpnet-run --transport-map`);
//! - the proxy watchdog (`CPNET_PROXY_STALL_TIMEOUT`): a service thread that
//!   stops making progress ends its PE with a report of what was pending.
#![warn(missing_docs)]

pub mod bootstrap;
mod core;
pub mod daemon;
pub mod env;
mod error;
mod host_backend;
pub mod gpu;
pub mod pe;
mod proxy_link;
mod proxy_threads;
pub mod signals;
mod startup;
pub mod team;
pub mod transport_map;
mod watchdog;

pub use cpnet_device as device;
pub use cpnet_proxy as proxy;
pub use error::{Error, GpuError, Result};
pub use gpu::GpuPe;
pub use pe::{Pe, WorkGroup};
pub use team::Team;
