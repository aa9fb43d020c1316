//! The device API compiles: every function of `<cpnet/device.cuh>`, every
//! typed variant, through the NVRTC helper, for sm_90; and a broken kernel
//! comes back as an error that carries the compiler log.
//!
//! Needs libnvrtc (the CUDA toolkit, or the PyPI package `nvidia-cuda-nvrtc`
//! with its `lib` directory on `LD_LIBRARY_PATH`), not a GPU. Without it the
//! tests print "SKIPPED" and pass, unless `CPNET_REQUIRE_NVRTC=1` (CI sets it),
//! in which case they fail.
#![cfg(feature = "nvrtc")]

use cpnet_device::nvrtc::{self, BuildOptions, NvrtcError};

/// True when libnvrtc is here; otherwise fails (CPNET_REQUIRE_NVRTC=1) or
/// skips loudly.
fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc::is_available() {
        return true;
    }
    let why = nvrtc::version().err().map(|e| e.to_string()).unwrap_or_default();
    if std::env::var("CPNET_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("CPNET_REQUIRE_NVRTC=1 but {why}");
    }
    // Straight to the stderr handle: libtest captures eprintln! of passing
    // tests, and a skip must be seen.
    let line = format!("\n*** SKIPPED {test}: libnvrtc not found. {why}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    false
}

/// A kernel that calls every function of the device API at least once, every
/// typed family through the header's own type lists.
const EVERY_CALL: &str = r#"
#include <cpnet/device.cuh>

#define RMA(NAME, TYPE)                                                     \
    {                                                                       \
        TYPE* p = (TYPE*)heap;                                              \
        sink += cpnet_##NAME##_put(&ctx, p, p + 8, 4, pe);                  \
        cpnet_##NAME##_put_nbi(&ctx, p, p + 8, 4, pe);                      \
        sink += cpnet_##NAME##_get(&ctx, p, p + 8, 4, pe);                  \
        cpnet_##NAME##_get_nbi(&ctx, p, p + 8, 4, pe);                      \
        cpnet_##NAME##_p(&ctx, p, (TYPE)1, pe);                             \
        sink += (long long)cpnet_##NAME##_g(&ctx, p, pe);                   \
    }

#define P2P(NAME, TYPE)                                                     \
    {                                                                       \
        TYPE* p = (TYPE*)heap;                                              \
        sink += cpnet_##NAME##_wait_until(&ctx, p, CPNET_CMP_GE, (TYPE)1);  \
        sink += cpnet_##NAME##_test(&ctx, p, CPNET_CMP_NE, (TYPE)2);        \
    }

#define AMO_EXT(NAME, TYPE, DT)                                             \
    {                                                                       \
        TYPE* p = (TYPE*)heap;                                              \
        sink += (long long)cpnet_##NAME##_atomic_fetch(&ctx, p, pe);        \
        cpnet_##NAME##_atomic_set(&ctx, p, (TYPE)3, pe);                    \
        sink += (long long)cpnet_##NAME##_atomic_swap(&ctx, p, (TYPE)4, pe); \
    }

#define AMO_STD(NAME, TYPE, DT)                                             \
    AMO_EXT(NAME, TYPE, DT)                                                 \
    {                                                                       \
        TYPE* p = (TYPE*)heap;                                              \
        sink += (long long)cpnet_##NAME##_atomic_compare_swap(&ctx, p, (TYPE)4, (TYPE)5, pe); \
        sink += (long long)cpnet_##NAME##_atomic_fetch_add(&ctx, p, (TYPE)6, pe); \
        cpnet_##NAME##_atomic_add(&ctx, p, (TYPE)7, pe);                    \
        sink += (long long)cpnet_##NAME##_atomic_fetch_inc(&ctx, p, pe);    \
        cpnet_##NAME##_atomic_inc(&ctx, p, pe);                             \
        sink += (long long)cpnet_##NAME##_atomic_fetch_min(&ctx, p, (TYPE)3, pe); \
        cpnet_##NAME##_atomic_min(&ctx, p, (TYPE)2, pe);                    \
    }

#define AMO_BIT(NAME, TYPE, DT)                                             \
    {                                                                       \
        TYPE* p = (TYPE*)heap;                                              \
        sink += (long long)cpnet_##NAME##_atomic_fetch_and(&ctx, p, (TYPE)1, pe); \
        cpnet_##NAME##_atomic_and(&ctx, p, (TYPE)1, pe);                    \
        sink += (long long)cpnet_##NAME##_atomic_fetch_or(&ctx, p, (TYPE)2, pe); \
        cpnet_##NAME##_atomic_or(&ctx, p, (TYPE)2, pe);                     \
        sink += (long long)cpnet_##NAME##_atomic_fetch_xor(&ctx, p, (TYPE)4, pe); \
        cpnet_##NAME##_atomic_xor(&ctx, p, (TYPE)4, pe);                    \
    }

extern "C" __global__ void every_call(cpnet_handle_t h, unsigned char* heap, long long* out)
{
    __shared__ cpnet_ctx_t ctx;
    long long sink = 0;
    if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;
    const int pe = (cpnet_my_pe(&ctx) + 1) % cpnet_n_pes(&ctx);
    uint64_t* sig = (uint64_t*)(heap + 1024);

    sink += cpnet_nop(&ctx);
    sink += cpnet_putmem(&ctx, heap, heap + 64, 100, pe);
    cpnet_putmem_nbi(&ctx, heap, heap + 64, 3, pe);
    sink += cpnet_getmem(&ctx, heap, heap + 64, 7, pe);
    cpnet_getmem_nbi(&ctx, heap, heap + 64, 4096, pe);
    sink += cpnet_putmem_signal(&ctx, heap, heap + 64, 256, sig, 1, CPNET_SIGNAL_SET, pe);
    cpnet_putmem_signal_nbi(&ctx, heap, heap + 64, 0, sig, 1, CPNET_SIGNAL_ADD, pe);
    sink += (long long)cpnet_signal_fetch(&ctx, sig);
    sink += (long long)cpnet_signal_wait_until(&ctx, sig, CPNET_CMP_GE, 2);
    cpnet_fence(&ctx);
    sink += (long long)cpnet_float_ord_atomic_fetch_min(&ctx, (uint32_t*)heap, -1.5f, pe);
    cpnet_float_ord_atomic_min(&ctx, (uint32_t*)heap, 2.0f, pe);
    sink += (long long)cpnet_double_ord_atomic_fetch_min(&ctx, (uint64_t*)heap, -1.5, pe);
    cpnet_double_ord_atomic_min(&ctx, (uint64_t*)heap, 2.0, pe);
    sink += cpnet_quiet(&ctx);
    sink += cpnet_barrier_all(&ctx);
    sink += cpnet_ctx_last_error(&ctx);

    CPNET_RMA_TYPES(RMA)
    CPNET_P2P_TYPES(P2P)
    CPNET_AMO_STANDARD_TYPES(AMO_STD)
    CPNET_AMO_EXTENDED_ONLY_TYPES(AMO_EXT)
    CPNET_AMO_BITWISE_TYPES(AMO_BIT)

    sink += cpnet_ctx_destroy(&ctx);
    out[blockIdx.x * blockDim.x + threadIdx.x] = sink;
}
"#;

/// Every generated name of one family, to check the PTX defines them all
/// (a macro list that silently lost an entry would otherwise go unnoticed).
fn typed_names() -> Vec<String> {
    let rma = [
        "char", "schar", "short", "int", "long", "longlong", "uchar", "ushort", "uint", "ulong", "ulonglong", "int8",
        "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "size", "ptrdiff", "float", "double",
    ];
    let p2p = ["int", "long", "longlong", "uint", "ulong", "ulonglong", "int32", "int64", "uint32", "uint64", "size", "ptrdiff"];
    let bitwise = ["uint", "ulong", "ulonglong", "int32", "int64", "uint32", "uint64"];
    let mut names = Vec::new();
    for t in rma {
        for f in ["put", "put_nbi", "get", "get_nbi", "p", "g"] {
            names.push(format!("cpnet_{t}_{f}"));
        }
    }
    for t in p2p {
        names.push(format!("cpnet_{t}_wait_until"));
        names.push(format!("cpnet_{t}_test"));
        for f in ["fetch", "set", "swap", "compare_swap", "fetch_add", "add", "fetch_inc", "inc"] {
            names.push(format!("cpnet_{t}_atomic_{f}"));
        }
    }
    for t in ["float", "double"] {
        for f in ["fetch", "set", "swap"] {
            names.push(format!("cpnet_{t}_atomic_{f}"));
        }
    }
    for t in bitwise {
        for f in ["fetch_and", "and", "fetch_or", "or", "fetch_xor", "xor"] {
            names.push(format!("cpnet_{t}_atomic_{f}"));
        }
    }
    names
}

#[test]
fn every_device_api_function_compiles_for_sm_90() {
    if !nvrtc_or_skip("every_device_api_function_compiles_for_sm_90") {
        return;
    }
    let opts = BuildOptions { name: "every_call.cu".into(), ..BuildOptions::default() };
    let out = match nvrtc::compile(EVERY_CALL, &opts) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    };
    assert!(out.cubin.as_ref().is_some_and(|c| !c.is_empty()), "sm_90 gives a CUBIN");
    assert!(out.ptx.contains(".entry every_call"), "kernel entry in the PTX");
    // The protocol's ordered accesses survive as written (queue.cuh, ptx.cuh).
    for insn in [
        "st.release.sys.global.u64",
        "ld.acquire.sys.global.u64",
        "ld.relaxed.sys.global.u64",
        "ld.relaxed.sys.global.u32",
        "atom.cas.acquire.sys.global.b32",
        "atom.cas.acq_rel.sys.global.b32",
        "st.release.sys.global.u32",
        "fence.acq_rel.sys",
        "st.global.v2.u64",
        "%globaltimer",
        "nanosleep",
    ] {
        assert!(out.ptx.contains(insn), "PTX lacks `{insn}`");
    }
    // No `volatile`-based protocol accesses: every protocol load is scoped.
    assert!(!out.ptx.contains("ld.volatile"), "a volatile load slipped into the protocol");
    // Every typed function the macros should generate is referenced by the
    // kernel, i.e. exists (NVRTC inlines them, so check the source list
    // against the header instead).
    // The typed API's headers (device.cuh and the files it includes).
    let header: String = ["cpnet/device.cuh", "cpnet/rma.cuh", "cpnet/amo.cuh"]
        .iter()
        .map(|name| nvrtc::headers().iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not embedded")).1)
        .collect();
    for list in ["CPNET_RMA_TYPES", "CPNET_P2P_TYPES", "CPNET_AMO_STANDARD_TYPES", "CPNET_AMO_BITWISE_TYPES"] {
        assert!(header.contains(&format!("{list}(X)")), "{list} missing");
    }
    assert_eq!(typed_names().len(), 23 * 6 + 12 * 10 + 2 * 3 + 7 * 6);
    for f in ["CPNET_AMO_STANDARD_TYPES(CPNET_DEFINE_AMO_MIN)", "cpnet_float_ord_atomic_min", "cpnet_f64_ord"] {
        assert!(header.contains(f), "{f} missing from the device headers");
    }
    println!("every_call: {} bytes of PTX, {} bytes of CUBIN", out.ptx.len(), out.cubin.as_ref().unwrap().len());
    if !out.log.is_empty() {
        println!("NVRTC log:\n{}", out.log);
    }
}

/// Every typed name, called one by one by a generated kernel: proves each
/// exists with the documented signature (a missing or misspelt one fails to
/// compile, naming it).
#[test]
fn every_typed_name_exists_with_its_signature() {
    if !nvrtc_or_skip("every_typed_name_exists_with_its_signature") {
        return;
    }
    let mut body = String::new();
    for name in typed_names() {
        let (ty, f) = split_typed(&name);
        let t = c_type(ty);
        let call = match f {
            "put" | "put_nbi" | "get" | "get_nbi" => format!("{name}(&ctx, ({t}*)heap, ({t}*)heap + 8, 2, pe);"),
            "p" => format!("{name}(&ctx, ({t}*)heap, ({t})1, pe);"),
            "g" => format!("s += (long long){name}(&ctx, ({t}*)heap, pe);"),
            "wait_until" | "test" => format!("s += {name}(&ctx, ({t}*)heap, CPNET_CMP_EQ, ({t})1);"),
            "atomic_fetch" => format!("s += (long long){name}(&ctx, ({t}*)heap, pe);"),
            "atomic_fetch_inc" => format!("s += (long long){name}(&ctx, ({t}*)heap, pe);"),
            "atomic_inc" => format!("{name}(&ctx, ({t}*)heap, pe);"),
            "atomic_compare_swap" => format!("s += (long long){name}(&ctx, ({t}*)heap, ({t})1, ({t})2, pe);"),
            f if f.starts_with("atomic_fetch") || f == "atomic_swap" => {
                format!("s += (long long){name}(&ctx, ({t}*)heap, ({t})1, pe);")
            }
            _ => format!("{name}(&ctx, ({t}*)heap, ({t})1, pe);"),
        };
        body.push_str("    ");
        body.push_str(&call);
        body.push('\n');
    }
    let src = format!(
        "#include <cpnet/device.cuh>\n\
         extern \"C\" __global__ void typed(cpnet_handle_t h, unsigned char* heap, long long* out) {{\n\
         __shared__ cpnet_ctx_t ctx;\n long long s = 0;\n\
         if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;\n int pe = 0;\n{body}\
         cpnet_ctx_destroy(&ctx);\n out[threadIdx.x] = s;\n}}\n"
    );
    let opts = BuildOptions { name: "typed.cu".into(), arch: "compute_90".into(), ..BuildOptions::default() };
    match nvrtc::compile(&src, &opts) {
        Ok(out) => assert!(out.cubin.is_none(), "compute_90 gives PTX only"),
        Err(e) => panic!("{e}"),
    }
}

/// Every team name of `cpnet/team.cuh` (OpenSHMEM 1.5 §9.9 tables) with
/// its documented signature: the reductions of each type list (and, or,
/// xor on the bitwise types; min, max, sum, prod on the arithmetic ones,
/// half and bfloat16 included), the typed data collectives of every RMA
/// type, the *mem forms, sync, barrier and the queries.
#[test]
fn every_team_name_exists_with_its_signature() {
    if !nvrtc_or_skip("every_team_name_exists_with_its_signature") {
        return;
    }
    let bitwise = [
        "uchar", "ushort", "uint", "ulong", "ulonglong", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
        "uint64", "size",
    ];
    let arith = [
        "char", "schar", "short", "int", "long", "longlong", "ptrdiff", "uchar", "ushort", "uint", "ulong", "ulonglong",
        "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "size", "float", "double", "half",
        "bfloat16",
    ];
    let rma = [
        "char", "schar", "short", "int", "long", "longlong", "uchar", "ushort", "uint", "ulong", "ulonglong", "int8",
        "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "size", "ptrdiff", "float", "double",
    ];
    let ty = |t: &str| match t {
        "half" => "cpnet_half_t",
        "bfloat16" => "cpnet_bfloat16_t",
        t => c_type(t),
    };
    let mut body = String::new();
    let mut call = |name: String, t: &str, extra: &str| {
        body.push_str(&format!("    s |= {name}(&ctx, team, ({t}*)heap, ({t}*)heap + 64, 3{extra});\n"));
    };
    for t in bitwise {
        for op in ["and", "or", "xor"] {
            call(format!("cpnet_{t}_{op}_reduce"), ty(t), "");
        }
    }
    for t in arith {
        for op in ["min", "max", "sum", "prod"] {
            call(format!("cpnet_{t}_{op}_reduce"), ty(t), "");
        }
    }
    for t in rma {
        call(format!("cpnet_{t}_broadcast"), ty(t), ", 0");
        for f in ["collect", "fcollect", "alltoall"] {
            call(format!("cpnet_{t}_{f}"), ty(t), "");
        }
    }
    let src = format!(
        "#include <cpnet/device.cuh>\n\
         extern \"C\" __global__ void team_names(cpnet_handle_t h, int team, unsigned char* heap, int* out) {{\n\
         __shared__ cpnet_ctx_t ctx;\n int s = 0;\n cpnet_size_t total = 0;\n\
         if (cpnet_ctx_create(&h, &ctx) != CPNET_E_OK) return;\n{body}\
         s |= cpnet_broadcastmem(&ctx, team, heap, heap + 64, 8, 0);\n\
         s |= cpnet_fcollectmem(&ctx, team, heap, heap + 64, 8);\n\
         s |= cpnet_collectmem(&ctx, team, heap, heap + 64, 8);\n\
         s |= cpnet_collectmem(&ctx, team, heap, heap + 64, 8, &total);\n\
         s |= cpnet_alltoallmem(&ctx, team, heap, heap + 64, 8);\n\
         s |= cpnet_team_sync(&ctx, team) | cpnet_team_barrier(&ctx, CPNET_TEAM_NODE);\n\
         s += cpnet_team_my_pe(&ctx, team) + cpnet_team_n_pes(&ctx, team) + cpnet_team_translate_pe(&ctx, team, 0, CPNET_TEAM_WORLD);\n\
         cpnet_ctx_destroy(&ctx);\n out[threadIdx.x] = s + (int)total;\n}}\n"
    );
    let opts = BuildOptions { name: "team_names.cu".into(), arch: "compute_90".into(), ..BuildOptions::default() };
    match nvrtc::compile(&src, &opts) {
        Ok(out) => assert!(out.log.trim().is_empty(), "NVRTC warnings:\n{}", out.log),
        Err(e) => panic!("{e}"),
    }
}

fn split_typed(name: &str) -> (&str, &str) {
    let rest = name.strip_prefix("cpnet_").unwrap();
    // Longest first, so "ulonglong" is not taken for "ulong" + "long...".
    const TYPES: [&str; 23] = [
        "ulonglong", "longlong", "ptrdiff", "double", "float", "schar", "uchar", "ushort", "ulong", "uint8", "uint16",
        "uint32", "uint64", "int8", "int16", "int32", "int64", "short", "char", "uint", "long", "size", "int",
    ];
    for ty in TYPES {
        if let Some(f) = rest.strip_prefix(ty).and_then(|r| r.strip_prefix('_')) {
            return (ty, f);
        }
    }
    panic!("no type in {name}")
}

fn c_type(ty: &str) -> &'static str {
    match ty {
        "char" => "char",
        "schar" => "signed char",
        "short" | "int16" => "short",
        "int" => "int",
        "long" => "long",
        "longlong" => "long long",
        "uchar" => "unsigned char",
        "ushort" | "uint16" => "unsigned short",
        "uint" => "unsigned int",
        "ulong" => "unsigned long",
        "ulonglong" => "unsigned long long",
        "int8" => "int8_t",
        "int32" => "int32_t",
        "int64" => "int64_t",
        "uint8" => "uint8_t",
        "uint32" => "uint32_t",
        "uint64" => "uint64_t",
        "size" => "cpnet_size_t",
        "ptrdiff" => "cpnet_ptrdiff_t",
        "float" => "float",
        "double" => "double",
        other => panic!("unknown type {other}"),
    }
}

#[test]
fn a_broken_kernel_returns_the_compiler_log() {
    if !nvrtc_or_skip("a_broken_kernel_returns_the_compiler_log") {
        return;
    }
    let src = r#"
        #include <cpnet/device.cuh>
        extern "C" __global__ void broken(cpnet_handle_t h) {
            __shared__ cpnet_ctx_t ctx;
            cpnet_ctx_create(&h, &ctx);
            cpnet_putmem(&ctx, no_such_symbol, 0, 8, 0);
        }
    "#;
    let opts = BuildOptions { name: "broken.cu".into(), ..BuildOptions::default() };
    let err = nvrtc::compile_kernel(src, &opts).expect_err("must not compile");
    let log = err.log().expect("a compile error carries the log").to_owned();
    assert!(matches!(err, NvrtcError::Compile { .. }), "{err:?}");
    assert!(log.contains("no_such_symbol"), "log names the culprit:\n{log}");
    assert!(log.contains("broken.cu"), "log names the program:\n{log}");
    let shown = err.to_string();
    assert!(shown.contains(&log) && shown.contains("sm_90"), "Display carries the log and the arch:\n{shown}");
}

#[test]
fn each_header_compiles_on_its_own() {
    if !nvrtc_or_skip("each_header_compiles_on_its_own") {
        return;
    }
    for (name, _) in nvrtc::headers() {
        let src = format!("#include <{name}>\nextern \"C\" __global__ void k(int* p) {{ if (p) *p = 1; }}\n");
        let opts = BuildOptions { name: format!("only_{}.cu", name.replace('/', "_")), ..BuildOptions::default() };
        if let Err(e) = nvrtc::compile(&src, &opts) {
            panic!("{name} alone: {e}");
        }
    }
}

#[test]
fn libnvrtc_version_is_reported() {
    if !nvrtc_or_skip("libnvrtc_version_is_reported") {
        return;
    }
    let (major, minor) = nvrtc::version().expect("nvrtcVersion");
    println!("libnvrtc {major}.{minor}");
    assert!(major >= 12, "cpnet is built against CUDA 13 bindings; found libnvrtc {major}.{minor}");
}

/// The landing agent (cpnet/agent.cuh) compiles for sm_90 and keeps its
/// protocol accesses (A4: acquire of the commit word; A5/A7: release stores
/// of `done` and `running`; cache-volatile loads of host staging).
#[test]
fn landing_agent_compiles_for_sm_90() {
    if !nvrtc_or_skip("landing_agent_compiles_for_sm_90") {
        return;
    }
    let opts = BuildOptions { name: "agent.cu".into(), ..BuildOptions::default() };
    let out = nvrtc::compile(nvrtc::AGENT_SOURCE, &opts).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.ptx.contains(&format!(".entry {}", nvrtc::AGENT_KERNEL)), "agent entry in the PTX");
    for insn in ["ld.acquire.sys.global.u64", "st.release.sys.global.u64", "st.release.sys.global.u32", "st.release.gpu.global.u64", "fence.acq_rel.gpu", "ld.global.cv"] {
        assert!(out.ptx.contains(insn), "agent PTX lacks `{insn}`");
    }
}
