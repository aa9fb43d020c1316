//! Raw bindings to the system libfabric (>= 1.17).
//!
//! * Everything libfabric exports as a real symbol (`fi_getinfo`, `fi_freeinfo`,
//!   `fi_dupinfo`, `fi_fabric`, `fi_strerror`, `fi_version`, `fi_tostr`, ...) is bound
//!   directly under its C name.
//! * libfabric's `static inline` calls (`fi_domain`, `fi_endpoint`, `fi_write`,
//!   `fi_atomic`, `fi_cq_read`, `fi_close`, ...) have no symbol; they are reached through
//!   the C shim in `shim/shim.c` as `cpnet_fi_<name>`, with the C signature unchanged.
//! * Enums are plain integer types with one constant per value, spelled as in C
//!   (`fi_op` and `FI_SUM`, `fi_datatype` and `FI_UINT64`).
//! * Macros that bindgen cannot evaluate (casts, function-like macros) are written out
//!   below; `shim.c` `_Static_assert`s that they still match the headers.
//!
//! Nothing here is safe to call without reading the libfabric man pages; the safe layer
//! lives in `cpnet-proxy`'s `fabric` module.

#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    unnecessary_transmutes,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::missing_safety_doc,
    rustdoc::all,
    unsafe_op_in_unsafe_fn
)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// `FI_VERSION(major, minor)` from `rdma/fabric.h`: the API version number passed to
/// `fi_getinfo(3)`.
pub const fn FI_VERSION(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The libfabric API version cpnet is written against: 1.17 (Debian 12, Ubuntu 24.04).
pub const CPNET_FI_API_VERSION: u32 = FI_VERSION(1, 17);

/// `FI_ADDR_UNSPEC` (`(uint64_t) -1`): no address / any source, see fi_av(3).
pub const FI_ADDR_UNSPEC: fi_addr_t = u64::MAX;

/// `FI_ADDR_NOTAVAIL` (`(uint64_t) -1`): the address could not be inserted, see fi_av(3).
pub const FI_ADDR_NOTAVAIL: fi_addr_t = u64::MAX;

/// `FI_KEY_NOTAVAIL` (`(uint64_t) -1`): no memory key, see fi_mr(3).
pub const FI_KEY_NOTAVAIL: u64 = u64::MAX;

/// `FI_SHARED_CONTEXT` (`SIZE_MAX`): a shared transmit/receive context count, see
/// fi_endpoint(3).
pub const FI_SHARED_CONTEXT: usize = usize::MAX;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_constants_match_headers() {
        assert_eq!(CPNET_FI_API_VERSION, 0x1_0011);
        assert!(FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION) >= CPNET_FI_API_VERSION);
    }

    #[test]
    fn runtime_library_is_new_enough() {
        // SAFETY: fi_version takes no arguments and returns a number.
        let runtime = unsafe { fi_version() };
        assert!(
            runtime >= CPNET_FI_API_VERSION,
            "libfabric at run time is older than 1.17"
        );
    }

    #[test]
    fn shim_links_and_strerror_is_text() {
        // SAFETY: fi_strerror accepts any errno and returns a static NUL-terminated string.
        let s = unsafe { core::ffi::CStr::from_ptr(fi_strerror(FI_EAGAIN)) };
        assert!(!s.to_bytes().is_empty());
        // SAFETY: fi_allocinfo has no preconditions; the result is freed right away.
        let info = unsafe { cpnet_fi_allocinfo() };
        assert!(!info.is_null());
        // SAFETY: `info` came from fi_allocinfo and is freed once.
        unsafe { fi_freeinfo(info) };
    }
}
