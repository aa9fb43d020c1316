//! # cpnet
//!
//! The host API of cpnet (init, PE info, symmetric heap, CPU work-groups and
//! GPU kernels, barrier, finalize), bootstrap and the `cpnet-run` launcher.
//! Under construction: the foundation (queue, device API, CPU work-group,
//! proxy service loop) lives in `cpnet-device` and `cpnet-proxy` and is
//! re-exported here.
#![warn(missing_docs)]

pub use cpnet_device as device;
pub use cpnet_proxy as proxy;
