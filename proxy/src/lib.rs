//! # cpnet-proxy
//!
//! The proxy of cpnet: service threads that poll the work-groups' command
//! queues (ComP-Net paper §4.2) and the transports that carry the commands
//! to other PEs.
//!
//! - [`decode`]: validation of a 64-byte slot into a typed operation;
//! - [`local`]: execution of operations that target this PE's host heap;
//! - [`service`]: the service loop, the [`service::Transport`] trait and the
//!   loopback transport;
//! - [`mirror`]: how a service serves queues in GPU memory through copies
//!   to host shadows (`CPNET_QUEUE_MEM=device`, the paper's Fig. 4a);
//! - [`fabric`]: a safe layer over libfabric (`cpnet-fabric-sys`);
//! - [`transport`]: the libfabric transport (RMA, atomics, ordering, barrier);
//! - [`batch`]: small puts to one PE sent together as one message;
//! - [`staged`]: the transport for GPU heaps over providers without CUDA
//!   support (active messages and asynchronous copies, [`cuda`]).
#![warn(missing_docs)]

pub mod agent;
pub mod batch;
pub mod cuda;
pub mod decode;
pub mod fabric;
pub mod local;
pub mod mirror;
pub mod reach;
pub mod service;
pub mod staged;
pub mod transport;
