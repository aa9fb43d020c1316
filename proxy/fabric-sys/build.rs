//! Build script for `cpnet-fabric-sys`.
//!
//! 1. Finds the system libfabric (>= 1.17) with pkg-config and emits its link flags.
//! 2. Compiles `shim/shim.c`, which turns libfabric's `static inline` calls into
//!    exported `cpnet_fi_*` symbols (see `shim/shim.h`).
//! 3. Runs bindgen on `shim/shim.h` (which includes the libfabric headers) into
//!    `$OUT_DIR/bindings.rs`, allowlisted to `fi_*`, `fid*`, `FI_*` and `cpnet_fi_*`.

use std::env;
use std::path::PathBuf;

/// Oldest libfabric this crate supports (Debian 12 and Ubuntu 24.04 ship 1.17).
const MIN_LIBFABRIC: &str = "1.17";

/// Gives each `#define FI_*` the Rust type of the C field or argument it is used with,
/// instead of bindgen's default (the smallest type that holds the value, which would
/// make `FI_RMA` a `u32` but `FI_SOURCE` a `u64`).
#[derive(Debug)]
struct MacroTypes;

impl bindgen::callbacks::ParseCallbacks for MacroTypes {
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        if !name.starts_with("FI_") {
            return None;
        }
        let errno = name == "FI_SUCCESS"
            || name == "FI_ERRNO_OFFSET"
            || (name.starts_with("FI_E") && name != "FI_EVENT");
        Some(if errno {
            // Return codes: libfabric calls return `-FI_Exxx` as int / ssize_t.
            IntKind::Int
        } else if name.starts_with("FI_MR_") {
            // `fi_domain_attr::mr_mode` is an `int`.
            IntKind::Int
        } else if name.ends_with("_VERSION") || name == "FI_PROV_SPECIFIC" {
            IntKind::U32
        } else if name == "FI_COLLECTIVE_OFFSET" {
            IntKind::Int
        } else {
            // Capabilities, modes, operation flags and FI_ORDER_* are all uint64_t.
            IntKind::U64
        })
    }
}

fn main() {
    println!("cargo:rerun-if-changed=shim/shim.h");
    println!("cargo:rerun-if-changed=shim/shim.c");
    println!("cargo:rerun-if-changed=build.rs");

    let lib = pkg_config::Config::new()
        .atleast_version(MIN_LIBFABRIC)
        .probe("libfabric")
        .unwrap_or_else(|e| {
            panic!(
                "cpnet-fabric-sys needs libfabric >= {MIN_LIBFABRIC} and its pkg-config file \
                 (libfabric.pc).\n  On Debian/Ubuntu: sudo apt-get install libfabric-dev \
                 libfabric-bin pkg-config\n  For a libfabric in a non-standard prefix, set \
                 PKG_CONFIG_PATH=<prefix>/lib/pkgconfig.\npkg-config said: {e}"
            )
        });

    let mut build = cc::Build::new();
    build
        .file("shim/shim.c")
        .warnings(true)
        .extra_warnings(true);
    for inc in &lib.include_paths {
        build.include(inc);
    }
    build.compile("cpnet_fabric_shim");

    let clang_args = lib
        .include_paths
        .iter()
        .map(|p| format!("-I{}", p.display()));
    let bindings = bindgen::Builder::default()
        .header("shim/shim.h")
        .clang_args(clang_args)
        .rust_edition(bindgen::RustEdition::Edition2024)
        .allowlist_function("fi_.*")
        .allowlist_function("cpnet_fi_.*")
        .allowlist_type("fi_.*")
        .allowlist_type("fid.*")
        .allowlist_type("FI_.*")
        .allowlist_var("FI_.*")
        // `SIZE_MAX` comes out as an `i32` -1; src/lib.rs defines it as `usize::MAX`.
        .blocklist_item("FI_SHARED_CONTEXT")
        // `enum fi_op { FI_MIN, ... }` becomes `pub type fi_op = c_uint;` plus
        // `pub const FI_MIN: fi_op = 0;`, the same spelling as in C.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .parse_callbacks(Box::new(MacroTypes))
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .expect("bindgen failed on shim/shim.h (is libclang-dev installed?)");

    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("could not write bindings.rs to OUT_DIR");
}
