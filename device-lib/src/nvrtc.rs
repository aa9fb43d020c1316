//! The NVRTC build helper: compiles CUDA C++ kernels that
//! `#include <cpnet/device.cuh>` at run time, with NVRTC loaded dynamically
//! through cudarc.
//!
//! Every header of `device-lib/include/cpnet` is embedded in this crate
//! ([`headers`]) and handed to NVRTC as an in-memory header under its include
//! name (`"cpnet/cmd.h"`, `"cpnet/device.cuh"`, ...), so a kernel source needs
//! no include path and no file next to the binary:
//!
//! ```no_run
//! use cpnet_device::nvrtc::{compile_kernel, BuildOptions};
//!
//! let src = r#"
//!     #include <cpnet/device.cuh>
//!     extern "C" __global__ void ping(cpnet_handle_t h) {
//!         __shared__ cpnet_ctx_t ctx;
//!         if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;
//!         cpnet_nop(&ctx);
//!         cpnet_ctx_destroy(&ctx);
//!     }
//! "#;
//! let image = compile_kernel(src, &BuildOptions::default())?; // sm_90 CUBIN
//! # Ok::<(), cpnet_device::nvrtc::NvrtcError>(())
//! ```
//!
//! # Loading libnvrtc
//!
//! Nothing here links against CUDA: the crate builds, and everything that
//! does not compile a kernel works, on a machine without it. The first
//! compilation loads libnvrtc by the names cudarc searches
//! ([`library_candidates`]: `libnvrtc.so`, `libnvrtc.so.13`, ...) through the
//! dynamic loader, so its directory must be on `LD_LIBRARY_PATH` (or in the
//! loader's cache). Either the CUDA toolkit (`/usr/local/cuda/lib64`) or the
//! PyPI package `nvidia-cuda-nvrtc`
//! (`site-packages/nvidia/cu13/lib`) provides it. A missing library is
//! [`NvrtcError::NotFound`], never a panic.

use std::ffi::{CStr, CString, c_char, c_int};
use std::panic::{self, AssertUnwindSafe};

use cudarc::nvrtc::sys;
pub use cudarc::nvrtc::Ptx;

/// Every header of `include/cpnet`, as (include name, contents). The names
/// are what a kernel writes in `#include <...>`.
const HEADERS: &[(&str, &str)] = &[
    ("cpnet/cmd.h", include_str!("../include/cpnet/cmd.h")),
    ("cpnet/ptx.cuh", include_str!("../include/cpnet/ptx.cuh")),
    ("cpnet/queue.cuh", include_str!("../include/cpnet/queue.cuh")),
    ("cpnet/device.cuh", include_str!("../include/cpnet/device.cuh")),
    ("cpnet/rma.cuh", include_str!("../include/cpnet/rma.cuh")),
    ("cpnet/amo.cuh", include_str!("../include/cpnet/amo.cuh")),
    ("cpnet/agent.cuh", include_str!("../include/cpnet/agent.cuh")),
    ("cpnet/team.cuh", include_str!("../include/cpnet/team.cuh")),
    ("cpnet/team_reduce.cuh", include_str!("../include/cpnet/team_reduce.cuh")),
    ("cpnet/grid.cuh", include_str!("../include/cpnet/grid.cuh")),
    ("cpnet/pair.cuh", include_str!("../include/cpnet/pair.cuh")),
];

/// The cpnet device headers embedded in this crate, as (include name,
/// contents) pairs: `("cpnet/cmd.h", ...)`, `("cpnet/ptx.cuh", ...)`,
/// `("cpnet/queue.cuh", ...)`, `("cpnet/device.cuh", ...)`,
/// `("cpnet/rma.cuh", ...)`, `("cpnet/amo.cuh", ...)`,
/// `("cpnet/agent.cuh", ...)`, `("cpnet/team.cuh", ...)`,
/// `("cpnet/team_reduce.cuh", ...)`, `("cpnet/grid.cuh", ...)`,
/// `("cpnet/pair.cuh", ...)`. The same text
/// [`compile`] hands to NVRTC; other build paths (nvcc, a cache) can write
/// them out under these names.
pub fn headers() -> &'static [(&'static str, &'static str)] {
    HEADERS
}

/// The landing agent's kernel (`cpnet/agent.cuh`): NVRTC source of one
/// `extern "C"` kernel named [`AGENT_KERNEL`] with the parameters
/// `(cpnet_agent_ctl_t*, cpnet_agent_rec_t*, uint32_t log2_depth, uint8_t*
/// heap, uint64_t heap_size, uint64_t idle_ns)`, launched with one block of
/// `CPNET_AGENT_THREADS` threads; at least 8 such blocks fit on an SM (its
/// launch bounds), which keeps it to 32 registers per thread: the runtime
/// counts on that when it leaves room for agents beside persistent kernels.
pub const AGENT_SOURCE: &str = r#"
#include <cpnet/agent.cuh>
extern "C" __global__ void __launch_bounds__(CPNET_AGENT_THREADS, 8)
cpnet_agent(cpnet_agent_ctl_t* ctl, uint64_t* ring, uint32_t log2_depth,
            uint8_t* heap, uint64_t heap_size, uint64_t idle_ns)
{
    cpnet_agent_run(ctl, ring, log2_depth, heap, heap_size, idle_ns);
}
"#;

/// The kernel name in [`AGENT_SOURCE`].
pub const AGENT_KERNEL: &str = "cpnet_agent";

/// How to compile a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildOptions {
    /// Target: a real architecture `sm_XY` (NVRTC emits PTX and a CUBIN for
    /// exactly that GPU; [`compile_kernel`] returns the CUBIN) or a virtual
    /// one `compute_XY` (PTX only, JIT-compiled by the driver at load).
    /// Default `sm_90` (H100/H200). cpnet needs 70 or newer.
    pub arch: String,
    /// More NVRTC options, appended after cpnet's own (`-D...`, `-lineinfo`,
    /// `-G`, `--maxrregcount=N`, `-default-device`, ...).
    pub extra: Vec<String>,
    /// The program's name, as NVRTC shows it in diagnostics. Default
    /// `"cpnet_kernel.cu"`.
    pub name: String,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions { arch: "sm_90".to_owned(), extra: Vec::new(), name: "cpnet_kernel.cu".to_owned() }
    }
}

impl BuildOptions {
    /// Options for the GPU of compute capability `major.minor` (e.g. from
    /// `CudaContext::compute_capability`): `arch = sm_{major}{minor}`.
    pub fn for_compute_capability(major: u32, minor: u32) -> BuildOptions {
        BuildOptions { arch: format!("sm_{major}{minor}"), ..BuildOptions::default() }
    }

    /// The full NVRTC command line these options give: `-std=c++17`,
    /// `--gpu-architecture=<arch>`, `-DCPNET_NVRTC=1`, then `extra`.
    ///
    /// `-default-device` is deliberately not passed: the headers mark every
    /// function `__device__`, and a kernel source that does the same compiles
    /// unchanged with nvcc.
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![
            "-std=c++17".to_owned(),
            format!("--gpu-architecture={}", self.arch),
            "-DCPNET_NVRTC=1".to_owned(),
        ];
        args.extend(self.extra.iter().cloned());
        args
    }
}

/// What went wrong in [`compile`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvrtcError {
    /// libnvrtc could not be loaded.
    #[error(
        "libnvrtc could not be loaded (the dynamic loader searched for {searched:?}{detail}): \
         install the CUDA toolkit or the PyPI package nvidia-cuda-nvrtc, and put the directory \
         that holds libnvrtc.so.* (e.g. /usr/local/cuda/lib64, or \
         site-packages/nvidia/cu13/lib of that package) on LD_LIBRARY_PATH"
    )]
    NotFound {
        /// The library names tried, in order.
        searched: Vec<String>,
        /// More about the failure (a missing symbol), or empty.
        detail: String,
    },
    /// The source, the program name or an option contains a NUL byte.
    #[error("{what} contains a NUL byte")]
    Nul {
        /// Which input.
        what: &'static str,
    },
    /// The kernel did not compile. `log` is NVRTC's full diagnostic output.
    #[error("NVRTC could not compile {name} for {arch} ({code}); options {options:?}; compiler log:\n{log}")]
    Compile {
        /// The program name.
        name: String,
        /// The target architecture.
        arch: String,
        /// The NVRTC result code, by name.
        code: String,
        /// The options passed.
        options: Vec<String>,
        /// The full compiler log.
        log: String,
    },
    /// Another NVRTC call failed.
    #[error("{call} failed: {code}")]
    Call {
        /// The NVRTC function.
        call: &'static str,
        /// The NVRTC result code, by name.
        code: String,
    },
}

impl NvrtcError {
    /// The compiler log, for [`NvrtcError::Compile`].
    pub fn log(&self) -> Option<&str> {
        match self {
            NvrtcError::Compile { log, .. } => Some(log),
            _ => None,
        }
    }
}

/// A compiled kernel image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The PTX text (always present).
    pub ptx: String,
    /// The CUBIN for `arch` when `arch` is a real architecture (`sm_XY`).
    pub cubin: Option<Vec<u8>>,
    /// NVRTC's log: warnings, or empty.
    pub log: String,
    /// The architecture it was compiled for.
    pub arch: String,
}

impl Compiled {
    /// The image to load with cudarc (`CudaContext::load_module`): the CUBIN
    /// when there is one (no JIT at load, exactly this GPU), else the PTX.
    pub fn image(&self) -> Ptx {
        match &self.cubin {
            Some(cubin) => Ptx::from_binary(cubin.clone()),
            None => Ptx::from_src(self.ptx.clone()),
        }
    }
}

/// The library names searched for libnvrtc, in order (cudarc's list for
/// `nvrtc`, without repeats).
pub fn library_candidates() -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates("nvrtc") {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names
}

/// Whether libnvrtc can be loaded here.
pub fn is_available() -> bool {
    // SAFETY: only tries to dlopen the candidate names and closes them again;
    // loading libnvrtc runs no code of ours.
    unsafe { sys::is_culib_present() }
}

fn not_found(detail: String) -> NvrtcError {
    NvrtcError::NotFound { searched: library_candidates(), detail }
}

/// Run `f`, which calls into libnvrtc, turning a loader panic of cudarc
/// (library or symbol missing) into [`NvrtcError::NotFound`].
fn with_nvrtc<T>(f: impl FnOnce() -> Result<T, NvrtcError>) -> Result<T, NvrtcError> {
    if !is_available() {
        return Err(not_found(String::new()));
    }
    match panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Err(not_found(format!("; {msg}")))
        }
    }
}

fn code_name(r: sys::nvrtcResult) -> String {
    format!("{r:?}")
}

fn check(call: &'static str, r: sys::nvrtcResult) -> Result<(), NvrtcError> {
    match r {
        sys::nvrtcResult::NVRTC_SUCCESS => Ok(()),
        other => Err(NvrtcError::Call { call, code: code_name(other) }),
    }
}

/// The version of the libnvrtc that is loaded, as (major, minor).
pub fn version() -> Result<(i32, i32), NvrtcError> {
    with_nvrtc(|| {
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        // SAFETY: two valid out-pointers to c_int.
        check("nvrtcVersion", unsafe { sys::nvrtcVersion(&mut major, &mut minor) })?;
        Ok((major, minor))
    })
}

/// An NVRTC program, destroyed on drop.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: self.0 came from a successful nvrtcCreateProgram and is
        // destroyed exactly once, here. The result is ignored: nothing useful
        // can be done about a failure to free.
        let _ = unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    /// A string NVRTC returns through a size query and a fill call.
    fn text(
        &self,
        size_call: &'static str,
        size: unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult,
        fill_call: &'static str,
        fill: unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult,
    ) -> Result<Vec<u8>, NvrtcError> {
        let mut n: usize = 0;
        // SAFETY: a live program and a valid out-pointer.
        check(size_call, unsafe { size(self.0, &mut n) })?;
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: `buf` holds the `n` bytes NVRTC said it will write.
        check(fill_call, unsafe { fill(self.0, buf.as_mut_ptr().cast::<c_char>()) })?;
        buf.truncate(n);
        Ok(buf)
    }

    fn log(&self) -> Result<String, NvrtcError> {
        let bytes = self.text(
            "nvrtcGetProgramLogSize",
            sys::nvrtcGetProgramLogSize,
            "nvrtcGetProgramLog",
            sys::nvrtcGetProgramLog,
        )?;
        Ok(c_text(&bytes))
    }
}

/// The text of a NUL-terminated buffer, lossily as UTF-8, trimmed.
fn c_text(bytes: &[u8]) -> String {
    let s = CStr::from_bytes_until_nul(bytes).map(CStr::to_bytes).unwrap_or(bytes);
    String::from_utf8_lossy(s).trim_end().to_owned()
}

/// Compile `source` (a CUDA C++ translation unit) with the cpnet headers
/// available as `<cpnet/...>`, returning the PTX, the CUBIN (for a real
/// architecture) and the log.
///
/// Errors: [`NvrtcError::NotFound`] when libnvrtc cannot be loaded;
/// [`NvrtcError::Compile`] with the full compiler log when the source does
/// not compile; [`NvrtcError::Nul`] / [`NvrtcError::Call`] otherwise.
pub fn compile(source: &str, opts: &BuildOptions) -> Result<Compiled, NvrtcError> {
    let src = CString::new(source).map_err(|_| NvrtcError::Nul { what: "the kernel source" })?;
    let name = CString::new(opts.name.as_str()).map_err(|_| NvrtcError::Nul { what: "the program name" })?;
    let args = opts.args();
    let c_args = args
        .iter()
        .map(|a| CString::new(a.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| NvrtcError::Nul { what: "a compiler option" })?;
    let hdr_names: Vec<CString> = HEADERS.iter().map(|(n, _)| CString::new(*n).expect("header name")).collect();
    let hdr_texts: Vec<CString> = HEADERS
        .iter()
        .map(|(n, t)| CString::new(*t).unwrap_or_else(|_| panic!("embedded header {n} contains NUL")))
        .collect();

    with_nvrtc(move || {
        let hdr_name_ptrs: Vec<*const c_char> = hdr_names.iter().map(|c| c.as_ptr()).collect();
        let hdr_text_ptrs: Vec<*const c_char> = hdr_texts.iter().map(|c| c.as_ptr()).collect();
        let arg_ptrs: Vec<*const c_char> = c_args.iter().map(|c| c.as_ptr()).collect();

        let mut raw: sys::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: every pointer is a NUL-terminated string that outlives the
        // program (the CStrings live until this closure returns, after the
        // Program guard is dropped); the header arrays have HEADERS.len()
        // entries each.
        check("nvrtcCreateProgram", unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                src.as_ptr(),
                name.as_ptr(),
                HEADERS.len() as c_int,
                hdr_text_ptrs.as_ptr(),
                hdr_name_ptrs.as_ptr(),
            )
        })?;
        let prog = Program(raw);

        // SAFETY: a live program; `arg_ptrs` has arg_ptrs.len() valid strings.
        let r = unsafe { sys::nvrtcCompileProgram(prog.0, arg_ptrs.len() as c_int, arg_ptrs.as_ptr()) };
        let log = prog.log()?;
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(NvrtcError::Compile {
                name: opts.name.clone(),
                arch: opts.arch.clone(),
                code: code_name(r),
                options: args.clone(),
                log,
            });
        }

        let ptx = c_text(&prog.text("nvrtcGetPTXSize", sys::nvrtcGetPTXSize, "nvrtcGetPTX", sys::nvrtcGetPTX)?);
        let cubin = if opts.arch.starts_with("sm_") {
            let bin = prog.text("nvrtcGetCUBINSize", sys::nvrtcGetCUBINSize, "nvrtcGetCUBIN", sys::nvrtcGetCUBIN)?;
            (!bin.is_empty()).then_some(bin)
        } else {
            None
        };
        Ok(Compiled { ptx, cubin, log, arch: opts.arch.clone() })
    })
}

/// Compile `source` as [`compile`] does and return the image to load with
/// cudarc: the CUBIN for a real architecture (`sm_XY`), the PTX for a
/// virtual one (`compute_XY`).
pub fn compile_kernel(source: &str, opts: &BuildOptions) -> Result<Ptx, NvrtcError> {
    compile(source, opts).map(|c| c.image())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_header_is_embedded_under_its_include_name() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("include/cpnet");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".h") || n.ends_with(".cuh"))
            .map(|n| format!("cpnet/{n}"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = headers().iter().map(|(n, _)| (*n).to_owned()).collect();
        embedded.sort();
        assert_eq!(embedded, on_disk, "add new headers of include/cpnet to HEADERS in nvrtc.rs");
        for (name, text) in headers() {
            let file = std::fs::read_to_string(dir.join(name.trim_start_matches("cpnet/"))).unwrap();
            assert_eq!(*text, file, "{name} is stale");
        }
    }

    #[test]
    fn default_options_target_sm_90_with_cxx17() {
        let args = BuildOptions::default().args();
        assert!(args.contains(&"-std=c++17".to_owned()));
        assert!(args.contains(&"--gpu-architecture=sm_90".to_owned()));
        assert_eq!(BuildOptions::for_compute_capability(8, 6).arch, "sm_86");
    }

    #[test]
    fn not_found_names_the_search_and_the_fix() {
        let msg = not_found(String::new()).to_string();
        assert!(msg.contains("LD_LIBRARY_PATH") && msg.contains("nvidia-cuda-nvrtc"), "{msg}");
        assert!(msg.contains("libnvrtc"), "{msg}");
    }
}
