//! cpnet applications and microbenchmarks. Binaries live in `src/bin/`;
//! the two applications of the project keep their logic here so that it can
//! be tested and shared between variants:
//!
//! - [`jacobi`]: the 2D Jacobi solver of NVIDIA's multi-gpu-programming-models,
//!   with the halo exchange and the norm reduction issued from inside
//!   persistent work-groups (the Jacobi stencil of ComP-Net's evaluation,
//!   §5, "intra-kernel" communication);
//! - [`allreduce`]: the multi-ring allreduce of ComP-Net §5.4, one ring per
//!   work-group, reduce-scatter then allgather, chunked and pipelined with
//!   `putmem_signal` / signal waits;
//! - [`cli`]: what the binaries share on the command line (single-dash long
//!   flags as the tools they compare against spell them, the `-variant`
//!   flag, byte sizes, heap sizing at init);
//! - [`gpu`]: what the GPU variants share (kernel prelude, the kernels'
//!   failure record, cooperative launch sizing);
//! - [`floor`]: the provider's own floor (raw libfabric ping-pong and write
//!   rates between two PEs), printed by the benchmarks beside cpnet's numbers;
//! - [`mem`]: typed views of the local symmetric heap for compute loops;
//! - [`proxy_cpu`]: the CPU time the proxy service threads use (from
//!   `/proc`), for the benchmarks' proxy-cost measurements;
//! - [`team`]: the barrier among the CPU work-groups of one PE.
//!
//! Each app has three variants (`-variant`): `cpu` (the paper's "CPU"
//! configuration: CPU threads as work-groups, speaking the same command
//! protocol as GPU work-groups; CI runs it), `intra-kernel` (one persistent
//! GPU kernel communicating from inside) and `inter-kernel` (a kernel per
//! step, communication between kernels). On a machine without a GPU the
//! GPU variants fail with an error that says so.
#![warn(missing_docs)]

pub mod allreduce;
pub mod bfs;
pub mod cli;
pub mod energy;
pub mod figure_csv;
pub mod floor;
pub mod gpu;
pub mod gpu_p2p;
pub mod graph;
pub mod jacobi;
pub mod mem;
pub mod moe;
pub mod proxy_cpu;
pub mod sssp;
pub mod team;
