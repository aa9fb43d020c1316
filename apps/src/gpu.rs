//! What the apps' GPU variants share: the kernel source prelude, the
//! kernel's control block and how its failure report is read, launch sizing
//! for persistent (cooperative) kernels.
//!
//! Each GPU kernel source is `#define`s generated here and by the app (the
//! one definition of every word index and operation id the host reads), then
//! `gpu/common.cuh` (device helpers: the failure record, bounded and
//! abortable waits, a grid barrier, a block sum), then the app's `.cu` file;
//! [`cpnet::GpuPe::build_module`] compiles it with NVRTC.
//!
//! # The control block
//!
//! [`ctl::WORDS`] `u64` in device memory (not the symmetric heap), zeroed
//! before a launch. A block that fails records the first failure of the
//! grid there (CAS on [`ctl::FAIL`]): the `CPNET_E_*`, the work-group, the
//! iteration (or message index), the operation ([`op`]), the PE, the heap
//! address, the expected and the found value; every other block sees it at
//! its next wait or grid barrier and ends too, so a failing launch ends
//! promptly instead of leaving blocks waiting for peers that stopped.
//! [`check_launch`] turns the record, the status block (cpnet's own device
//! waits) and the proxy's rejected commands into one error.

use anyhow::{Context, bail};
use cpnet::GpuPe;
use cpnet::device::layout::ErrorCode;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

/// The device helpers (after the generated `#define`s).
const COMMON_CUH: &str = include_str!("gpu/common.cuh");

/// Word indices of the control block (`APP_CTL_*` in the kernels).
pub mod ctl {
    /// Grid barrier arrivals (its own 128-byte line).
    pub const BARRIER: usize = 0;
    /// First failure: a `CPNET_E_*` (0: none).
    pub const FAIL: usize = 16;
    /// Its work-group (block).
    pub const FAIL_WG: usize = 17;
    /// Its iteration, or the ring's message index.
    pub const FAIL_ITER: usize = 18;
    /// Its operation (an [`super::op`] id).
    pub const FAIL_OP: usize = 19;
    /// The PE it concerned.
    pub const FAIL_PE: usize = 20;
    /// The heap offset it concerned (`u64::MAX`: none).
    pub const FAIL_ADDR: usize = 21;
    /// The value waited for.
    pub const FAIL_EXPECTED: usize = 22;
    /// The value last seen.
    pub const FAIL_FOUND: usize = 23;
    /// First word an app may use.
    pub const APP: usize = 32;
    /// Words in the block.
    pub const WORDS: usize = 64;
}

/// Operation ids of failure reports (`APP_OP_*` in the kernels).
pub mod op {
    /// `cpnet_ctx_create`.
    pub const CTX_CREATE: u64 = 1;
    /// The grid barrier.
    pub const GRID_BARRIER: u64 = 2;
    /// Jacobi: the wait for the top halo (the PE above's last row).
    pub const TOP_HALO: u64 = 3;
    /// Jacobi: the wait for the bottom halo (the PE below's first row).
    pub const BOTTOM_HALO: u64 = 4;
    /// Jacobi: the wait for every PE's norm contribution.
    pub const NORM: u64 = 5;
    /// The final quiet (`cpnet_ctx_destroy`): an earlier non-blocking
    /// operation failed.
    pub const QUIET: u64 = 6;
    /// Allreduce: the wait for a message from the previous PE's work-group.
    pub const RING_RECV: u64 = 7;
    /// Allreduce: the send window (acknowledgements of the next PE's).
    pub const RING_ACK: u64 = 8;
    /// Allreduce: the blocking no-op an idle ring issues to see the job fail.
    pub const PROBE: u64 = 9;
    /// MoE: the dispatch (its quiet, or the wait for every source's signal).
    pub const MOE_DISPATCH: u64 = 10;
    /// MoE: the combine (its quiet, or the wait for every PE's signal).
    pub const MOE_COMBINE: u64 = 11;
    /// BFS: the frontier exchange of a round (its puts, or the wait for a
    /// source's message).
    pub const BFS_FRONTIER: u64 = 12;
    /// SSSP: a round's exchange (its puts, or the wait for a source PE's
    /// message).
    pub const SSSP_ROUND: u64 = 13;
    /// Allreduce `-algo team`: the library's reduce to all.
    pub const TEAM_REDUCE: u64 = 14;

    /// What operation `id` is, in words.
    pub fn name(id: u64) -> &'static str {
        match id {
            CTX_CREATE => "cpnet_ctx_create",
            GRID_BARRIER => "grid barrier (a block of this kernel did not arrive)",
            TOP_HALO => "wait for the top halo (signal from the PE above)",
            BOTTOM_HALO => "wait for the bottom halo (signal from the PE below)",
            NORM => "wait for every PE's norm contribution",
            QUIET => "final quiet (an earlier non-blocking put or signal failed)",
            RING_RECV => {
                "allreduce ring receive (signal of the message from the previous PE's work-group)"
            }
            RING_ACK => {
                "allreduce ring send window (acknowledgement from the next PE's work-group)"
            }
            PROBE => "idle ring's probe of its queue",
            MOE_DISPATCH => "moe dispatch (its puts, or the wait for every source PE's dispatch signal)",
            MOE_COMBINE => "moe combine (its puts, or the wait for every expert PE's combine signal)",
            BFS_FRONTIER => "bfs frontier exchange (its puts, or the wait for a source PE's message)",
            SSSP_ROUND => "sssp round exchange (its puts, or the wait for a source PE's message)",
            TEAM_REDUCE => "the library's reduce to all (cpnet_<type>_sum_reduce over CPNET_TEAM_WORLD)",
            _ => "unknown operation",
        }
    }
}

/// The `#define`s of [`ctl`] and [`op`], for a kernel source.
fn common_defines() -> String {
    let mut s = String::new();
    for (name, v) in [
        ("APP_CTL_BARRIER", ctl::BARRIER),
        ("APP_CTL_FAIL", ctl::FAIL),
        ("APP_CTL_FAIL_WG", ctl::FAIL_WG),
        ("APP_CTL_FAIL_ITER", ctl::FAIL_ITER),
        ("APP_CTL_FAIL_OP", ctl::FAIL_OP),
        ("APP_CTL_FAIL_PE", ctl::FAIL_PE),
        ("APP_CTL_FAIL_ADDR", ctl::FAIL_ADDR),
        ("APP_CTL_FAIL_EXPECTED", ctl::FAIL_EXPECTED),
        ("APP_CTL_FAIL_FOUND", ctl::FAIL_FOUND),
        ("APP_CTL_APP", ctl::APP),
        ("APP_CTL_WORDS", ctl::WORDS),
    ] {
        s += &format!("#define {name} {v}\n");
    }
    for (name, v) in [
        ("APP_OP_CTX_CREATE", op::CTX_CREATE),
        ("APP_OP_GRID_BARRIER", op::GRID_BARRIER),
        ("APP_OP_TOP_HALO", op::TOP_HALO),
        ("APP_OP_BOTTOM_HALO", op::BOTTOM_HALO),
        ("APP_OP_NORM", op::NORM),
        ("APP_OP_QUIET", op::QUIET),
        ("APP_OP_RING_RECV", op::RING_RECV),
        ("APP_OP_RING_ACK", op::RING_ACK),
        ("APP_OP_PROBE", op::PROBE),
        ("APP_OP_TEAM_REDUCE", op::TEAM_REDUCE),
    ] {
        s += &format!("#define {name} {v}ull\n");
    }
    s
}

/// A kernel source: the common `#define`s, the app's `defines` (name,
/// value text), the device helpers, then `body`.
pub fn kernel_source(defines: &[(&str, String)], body: &str) -> String {
    let mut s = common_defines();
    for (name, v) in defines {
        s += &format!("#define {name} {v}\n");
    }
    s.push_str(COMMON_CUH);
    s.push('\n');
    s.push_str(body);
    s
}

/// The device address of a buffer of the PE's stream (for a kernel's
/// parameter block).
pub fn dptr<T>(pe: &GpuPe, s: &CudaSlice<T>) -> u64 {
    let (p, _sync) = cudarc::driver::DevicePtr::device_ptr(s, pe.stream());
    p
}

/// A fresh, zeroed control block on the PE's stream.
///
/// # Errors
/// The allocation.
pub fn new_ctl(pe: &GpuPe) -> anyhow::Result<CudaSlice<u64>> {
    pe.stream()
        .alloc_zeros::<u64>(ctl::WORDS)
        .context("cuMemAlloc (kernel control block)")
}

/// The control block's words (after the kernels that write it ended).
///
/// # Errors
/// The copy.
pub fn read_ctl(pe: &GpuPe, ctl: &CudaSlice<u64>) -> anyhow::Result<Vec<u64>> {
    pe.stream()
        .clone_dtoh(ctl)
        .context("cuMemcpyDtoH (kernel control block)")
}

/// The failure a kernel recorded in its control block, in words; `None`
/// when it records none.
pub fn failure_text(me: i32, words: &[u64], iter_is: &str) -> Option<String> {
    let code = words[ctl::FAIL];
    if code == 0 {
        return None;
    }
    let what = ErrorCode::from_i32(code as i32)
        .map_or_else(|| format!("error code {code}"), |c| c.to_string());
    let addr = words[ctl::FAIL_ADDR];
    let mut text = format!(
        "PE {me} work-group {}: {} ({iter_is} {}): {what}",
        words[ctl::FAIL_WG],
        op::name(words[ctl::FAIL_OP]),
        words[ctl::FAIL_ITER]
    );
    if addr != u64::MAX {
        text += &format!(
            "; waited on PE {} heap+{addr:#x} for >= {}, found {}",
            words[ctl::FAIL_PE] as i64,
            words[ctl::FAIL_EXPECTED],
            words[ctl::FAIL_FOUND]
        );
    }
    Some(text)
}

/// After a launch: wait for the stream, then fail with everything known
/// about a failure: the kernel's record (`ctl` words), the status block
/// (cpnet's own waits), and the commands the proxy rejected. `what` names
/// the kernel; `iter_is` what the record's iteration field counts.
///
/// # Errors
/// As said; also a launch or execution error of the stream.
pub fn check_launch(
    pe: &GpuPe,
    ctl: &CudaSlice<u64>,
    what: &str,
    iter_is: &str,
) -> anyhow::Result<Vec<u64>> {
    let sync = pe.synchronize();
    let words = match &sync {
        // After a kernel fault the context is unusable; say what faulted.
        Err(cpnet::pe::Error::Gpu(_)) => None,
        _ => Some(read_ctl(pe, ctl)?),
    };
    let mut causes = Vec::new();
    if let Some(t) = words
        .as_deref()
        .and_then(|w| failure_text(pe.my_pe(), w, iter_is))
    {
        causes.push(t);
    }
    if let Err(e) = &sync {
        causes.push(e.to_string());
    }
    for c in pe.command_errors() {
        causes.push(c.to_string());
    }
    if !causes.is_empty() {
        bail!("{what} failed: {}", causes.join("; "));
    }
    Ok(words.unwrap_or_default())
}

/// How many blocks of `threads` threads of `func` a persistent
/// (cooperative) kernel of this PE may take: its share of the blocks that
/// fit on the GPU at once (under MPS every PE's grid must be resident at
/// the same time), less room for the proxy's landing agents when a peer is
/// reached through the proxy ([`GpuPe::max_persistent_blocks`]: without
/// that room the agent that applies the first incoming message never
/// starts, and the first exchange never completes).
///
/// # Errors
/// The driver queries; no room at all for the agents.
pub fn max_coresident(pe: &GpuPe, func: &CudaFunction, threads: u32) -> anyhow::Result<u32> {
    pe.max_persistent_blocks(func, threads, 0).context("size the persistent grid")
}

/// A one-dimensional launch of `blocks` blocks of `threads` threads, no
/// dynamic shared memory: the shape of every apps kernel.
pub fn grid(blocks: u32, threads: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 }
}

/// The grid of a persistent (cooperative) kernel (bfs, sssp): `wgs` if
/// given (checked against `max`, [`max_coresident`], which already leaves
/// the landing agents their room), else `max`.
///
/// # Errors
/// `wgs` outside `1..=max`.
pub fn persistent_grid(max: u32, wgs: Option<u32>, threads: u32) -> anyhow::Result<u32> {
    match wgs {
        Some(w) => {
            anyhow::ensure!(
                (1..=max).contains(&w),
                "-wgs {w}: between 1 and {max} blocks of {threads} threads (those that fit on this GPU at once for this PE, \
                 beside the proxy's landing agents)"
            );
            Ok(w)
        }
        None => Ok(max),
    }
}

/// Test helper: the number of fields `struct name { ... }` of a kernel
/// source declares, checking that each is an `app_u64`, `app_i64` or
/// `double` (8 bytes: the Rust mirrors are `u64`/`i64`/`f64` in the same
/// order, no padding).
#[cfg(test)]
pub(crate) fn c_struct_fields(src: &str, name: &str) -> usize {
    let body = src
        .split(&format!("struct {name} {{"))
        .nth(1)
        .and_then(|s| s.split("};").next())
        .unwrap_or_else(|| panic!("struct {name} in the source"));
    let mut fields = 0;
    let mut in_comment = false;
    for line in body.lines() {
        let mut code = String::new();
        let mut rest = line;
        loop {
            let mark = if in_comment { "*/" } else { "/*" };
            match rest.find(mark) {
                Some(i) => {
                    if !in_comment {
                        code += &rest[..i];
                    }
                    rest = &rest[i + 2..];
                    in_comment = !in_comment;
                }
                None => {
                    if !in_comment {
                        code += rest;
                    }
                    break;
                }
            }
        }
        if code.contains(';') {
            let t = code.trim();
            assert!(
                t.starts_with("app_u64 ") || t.starts_with("app_i64 ") || t.starts_with("double "),
                "{name}: {t}"
            );
            fields += t.matches(',').count() + 1;
        }
    }
    fields
}

/// Test helper: compile `src` with NVRTC for sm_90 and check it: no
/// compiler warning, and no non-coherent load (`ld.global.nc`, the
/// read-only path, which may return stale data for memory that other
/// blocks or the proxy write while the kernel runs). Skips, saying so on
/// stderr, where libnvrtc is missing (unless `CPNET_REQUIRE_NVRTC=1`, then
/// it panics).
///
/// # Panics
/// When the source does not compile, warns, or uses a non-coherent load.
#[cfg(test)]
pub(crate) fn check_kernels_compile(test: &str, src: &str) {
    use cpnet::device::nvrtc::{self, BuildOptions};
    if !nvrtc::is_available() {
        let why = nvrtc::version()
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            std::env::var("CPNET_REQUIRE_NVRTC").as_deref() != Ok("1"),
            "CPNET_REQUIRE_NVRTC=1 but {why}"
        );
        let line = format!("\n*** SKIPPED {test}: libnvrtc not found. {why}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        return;
    }
    let c = nvrtc::compile(src, &BuildOptions::default()).unwrap_or_else(|e| panic!("{test}: {e}"));
    assert!(
        c.log.trim().is_empty(),
        "{test}: NVRTC warnings:\n{}",
        c.log
    );
    assert!(
        !c.ptx.contains("ld.global.nc"),
        "{test}: a non-coherent load in the PTX"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reports_name_everything() {
        let mut w = vec![0u64; ctl::WORDS];
        assert_eq!(failure_text(1, &w, "iteration"), None);
        w[ctl::FAIL] = ErrorCode::Timeout as u64;
        w[ctl::FAIL_WG] = 3;
        w[ctl::FAIL_ITER] = 17;
        w[ctl::FAIL_OP] = op::TOP_HALO;
        w[ctl::FAIL_PE] = 1;
        w[ctl::FAIL_ADDR] = 0x40;
        w[ctl::FAIL_EXPECTED] = 17;
        w[ctl::FAIL_FOUND] = 16;
        let t = failure_text(1, &w, "iteration").unwrap();
        for part in [
            "PE 1 work-group 3",
            "top halo",
            "iteration 17",
            "heap+0x40",
            ">= 17",
            "found 16",
        ] {
            assert!(t.contains(part), "{t}");
        }
        w[ctl::FAIL_ADDR] = u64::MAX;
        let t = failure_text(1, &w, "iteration").unwrap();
        assert!(!t.contains("heap+"), "{t}");
    }

    #[test]
    fn sources_define_every_word_and_op_before_the_helpers() {
        let s = kernel_source(&[("X", "1".into())], "body");
        let helpers = s.find("app_fail_leader").unwrap();
        for name in ["APP_CTL_FAIL_FOUND", "APP_OP_PROBE", "X"] {
            assert!(s.find(&format!("#define {name} ")).unwrap() < helpers);
        }
        assert!(s.ends_with("body"));
    }
}
