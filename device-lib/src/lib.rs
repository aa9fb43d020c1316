//! # cpnet-device
//!
//! The device side of cpnet, a GPU-initiated networking runtime in the
//! OpenSHMEM style after the ComP-Net design (LeBeane et al., PACT 2018):
//!
//! - [`layout`]: the one definition of the 64-byte command slot, the queue's
//!   control and producer blocks, the kernel handle and every code they carry,
//!   generated from and checked against `include/cpnet/cmd.h`;
//! - [`ring`]: the single-producer single-consumer command queue, producer
//!   and consumer, following THE QUEUE PROTOCOL written in `cmd.h`;
//! - [`cpu`]: the CPU work-group, which issues the same commands into the same
//!   queues as a GPU work-group (`include/cpnet/device.cuh`);
//! - [`ordered`]: floats as ordered integers for the minimum AMOs (a cpnet
//!   extension to OpenSHMEM);
//! - `nvrtc` (feature `nvrtc`): compiles user kernels that include
//!   `<cpnet/device.cuh>` with NVRTC, loaded at run time.
#![warn(missing_docs)]

pub mod cmd;
#[cfg(not(loom))]
pub mod cpu;
pub mod layout;
pub mod ordered;
#[cfg(feature = "nvrtc")]
pub mod nvrtc;
pub mod ring;
pub mod sync;
