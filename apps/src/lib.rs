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
//! - [`mem`]: typed views of the local symmetric heap for compute loops;
//! - [`team`]: the barrier among the CPU work-groups of one PE.
//!
//! Only the CPU variant (the paper's "CPU" configuration: CPU threads as
//! work-groups, speaking the same command protocol as GPU work-groups) runs
//! today; `-variant intra-kernel` and `-variant inter-kernel` are refused
//! with an error until the GPU backend carries them.
#![warn(missing_docs)]

pub mod allreduce;
pub mod cli;
pub mod jacobi;
pub mod mem;
pub mod team;
