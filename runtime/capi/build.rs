//! Generates `cpnet.h`, the C declarations of every `extern "C"` function,
//! opaque type and constant of this crate, with cbindgen (cbindgen.toml),
//! into `$OUT_DIR/include/cpnet/cpnet.h`. scripts/install.sh installs it
//! beside the hand-written `include/shmem.h` that includes it.

fn main() {
    let crate_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("include/cpnet");
    std::fs::create_dir_all(&out).expect("create $OUT_DIR/include/cpnet");
    let config = cbindgen::Config::from_file(format!("{crate_dir}/cbindgen.toml")).expect("read cbindgen.toml");
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen: generate cpnet.h from runtime/capi/src")
        .write_to_file(out.join("cpnet.h"));
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=cbindgen.toml");
}
