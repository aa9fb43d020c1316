//! Provider discovery: `fi_getinfo(3)` with the hints cpnet needs.

use std::ffi::{CStr, CString};
use std::fmt;

use cpnet_fabric_sys as sys;

use super::error::{FabricError, Result};
use super::result;

/// Capabilities cpnet asks for: one-sided RMA and atomics, as initiator and target.
pub const CAPS: u64 = sys::FI_RMA
    | sys::FI_ATOMIC
    | sys::FI_READ
    | sys::FI_WRITE
    | sys::FI_REMOTE_READ
    | sys::FI_REMOTE_WRITE;

/// Capabilities of a message endpoint (two-sided sends and receives), what the
/// staged GPU transport asks for: [`InfoRequest::with_caps`]`(MSG_CAPS)`.
pub const MSG_CAPS: u64 = sys::FI_MSG | sys::FI_SEND | sys::FI_RECV;

/// Memory-registration modes the fabric layer knows how to honour (fi_mr(3)). The
/// provider grants the subset it needs; [`Info::mr_mode`] reports it.
///
/// * `FI_MR_LOCAL`: local buffers need a descriptor; every call takes one.
/// * `FI_MR_VIRT_ADDR`: remote addresses are virtual addresses, not offsets;
///   [`RemoteMemory`](super::RemoteMemory) hides the difference.
/// * `FI_MR_ALLOCATED`: only allocated memory may be registered (always true for us).
/// * `FI_MR_PROV_KEY`: the provider chooses keys; otherwise the domain hands out
///   unique requested keys.
/// * `FI_MR_ENDPOINT`: regions are bound to an endpoint and enabled.
pub const MR_MODE_SUPPORTED: i32 = sys::FI_MR_LOCAL
    | sys::FI_MR_VIRT_ADDR
    | sys::FI_MR_ALLOCATED
    | sys::FI_MR_PROV_KEY
    | sys::FI_MR_ENDPOINT;

/// Endpoint modes the fabric layer can satisfy: it gives every operation its own
/// `fi_context2` when the provider asks for one (fi_getinfo(3) "MODE").
pub const MODE_SUPPORTED: u64 = sys::FI_CONTEXT | sys::FI_CONTEXT2;

/// What to ask `fi_getinfo` for, beyond the fixed requirements (RDM endpoint, [`CAPS`],
/// `FI_THREAD_DOMAIN`, manual progress, `FI_AV_TABLE`, `FI_ORDER_SAS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InfoRequest {
    /// Provider name filter, as `FI_PROVIDER` spells it: `"shm"`, `"tcp;ofi_rxm"`,
    /// `"verbs;ofi_rxm"`, `"efa"`, `"cxi"`. `None`: the best the library offers (the
    /// `FI_PROVIDER` environment variable, if set, still filters).
    pub provider: Option<String>,
    /// Local address to bind to (passed as `node` with `FI_SOURCE`), e.g. `"127.0.0.1"`
    /// to keep `tcp;ofi_rxm` on loopback. `None` for providers without IP addressing
    /// such as `shm`.
    pub src_node: Option<String>,
    /// Capabilities to ask for; `None` means [`CAPS`] (RMA and atomics).
    pub caps: Option<u64>,
    /// Memory-registration mode bits offered beyond [`MR_MODE_SUPPORTED`]
    /// (e.g. `FI_MR_HMEM`, which a provider needs to register GPU memory
    /// with `FI_HMEM`); 0 normally.
    pub mr_mode_extra: i32,
}

impl InfoRequest {
    /// A request for provider `name` (for example `"shm"` or `"tcp;ofi_rxm"`).
    pub fn provider(name: &str) -> Self {
        InfoRequest {
            provider: Some(name.to_owned()),
            src_node: None,
            caps: None,
            mr_mode_extra: 0,
        }
    }

    /// Offers memory-registration mode bits `bits` beyond [`MR_MODE_SUPPORTED`].
    pub fn with_mr_mode(mut self, bits: i32) -> Self {
        self.mr_mode_extra |= bits;
        self
    }

    /// Asks for capabilities `caps` instead of [`CAPS`] (for example [`MSG_CAPS`]).
    pub fn with_caps(mut self, caps: u64) -> Self {
        self.caps = Some(caps);
        self
    }

    /// Binds to local address `node` (see [`InfoRequest::src_node`]).
    pub fn with_src_node(mut self, node: &str) -> Self {
        self.src_node = Some(node.to_owned());
        self
    }
}

/// The provider name (as `FI_PROVIDER` and `CPNET_PROVIDER` spell it) of this
/// libfabric's *native* TCP reliable-datagram endpoint, if it has one: `net`
/// in libfabric 1.17 (the `xnet` provider, protocol `FI_PROTO_XNET`), `tcp`
/// from 1.18 on, where xnet became the tcp provider. Plain sockets as under
/// `tcp;ofi_rxm`, without rxm's layer over connected endpoints: on the two-H200
/// host, `fi_pingpong -e rdm` one-way 5.2 / 5.4 / 9.5 µs at 8 B / 1 KiB / 16 KiB
/// against rxm's 8.4 / 9.9 / 15.0 µs, and Jacobi 4096² over the GPU network path
/// 1.62x one GPU against 0.78x (docs/results.md, "Session 19").
///
/// Asked with [`MSG_CAPS`]: the GPU PEs' staged transport needs messages only.
/// libfabric 1.17's `net` lists `FI_ATOMIC` but its RDM endpoint has no atomic
/// operations (`fi_fetch_atomic` returns `-FI_ENOSYS`), so CPU PEs, whose
/// transport needs them, do not use it ([`crate::transport::FabricEndpoint::open`]
/// refuses it). `None` when neither name gives an `FI_PROTO_XNET` endpoint.
/// Asked once per process; `FI_PROVIDER`, if set, still filters.
pub fn native_tcp_rdm() -> Option<&'static str> {
    static FOUND: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *FOUND.get_or_init(|| {
        ["net", "tcp"].into_iter().find(|name| {
            Info::get(&InfoRequest::provider(name).with_caps(MSG_CAPS))
                .is_ok_and(|i| i.protocol() == sys::FI_PROTO_XNET)
        })
    })
}

/// One provider configuration returned by `fi_getinfo(3)`: what the provider granted.
///
/// Owns a single `fi_info` (freed with `fi_freeinfo`). The fabric, domain and endpoint
/// opened from it keep their own copies.
pub struct Info {
    /// Owned, non-null, `next` is null.
    raw: *mut sys::fi_info,
}

impl Info {
    /// Calls `fi_getinfo(3)` (API 1.17) with cpnet's hints and returns the first match.
    ///
    /// # Errors
    /// `fi_getinfo` with `-FI_ENODATA` (-61) if no provider grants RMA + atomics on RDM
    /// endpoints with these hints; [`FabricError::Invalid`] if a string has a NUL.
    pub fn get(req: &InfoRequest) -> Result<Info> {
        let hints = Hints::new(req)?;
        let node = req
            .src_node
            .as_deref()
            .map(CString::new)
            .transpose()
            .map_err(|_| FabricError::invalid("fi_getinfo", "src_node contains a NUL byte"))?;
        let flags = if node.is_some() { sys::FI_SOURCE } else { 0 };
        // SAFETY: `hints.0` is a valid fi_info built by fi_allocinfo and filled in above.
        let list = unsafe {
            result::getinfo(
                sys::CPNET_FI_API_VERSION,
                node.as_deref(),
                None,
                flags,
                hints.0,
            )
        }?;
        // Keep the first entry; free the whole list.
        // SAFETY: `list` is a valid, non-null list head from fi_getinfo.
        let first = unsafe { result::dupinfo(list) };
        // SAFETY: `list` came from fi_getinfo and is not used again.
        unsafe { result::freeinfo(list) };
        let raw = first?;
        // SAFETY: `raw` is our own copy; clearing `next` makes it a one-entry list
        // (fi_dupinfo does not copy `next`, this only makes that explicit).
        unsafe { (*raw).next = std::ptr::null_mut() };
        Ok(Info { raw })
    }

    /// The raw `fi_info`, for the thin layer. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::fi_info {
        self.raw
    }

    fn info(&self) -> &sys::fi_info {
        // SAFETY: `raw` is non-null and owned by `self` (type invariant).
        unsafe { &*self.raw }
    }

    fn domain_attr(&self) -> &sys::fi_domain_attr {
        // SAFETY: fi_getinfo always fills in domain_attr; it lives as long as `raw`.
        unsafe { &*self.info().domain_attr }
    }

    fn fabric_attr(&self) -> &sys::fi_fabric_attr {
        // SAFETY: fi_getinfo always fills in fabric_attr; it lives as long as `raw`.
        unsafe { &*self.info().fabric_attr }
    }

    fn tx_attr(&self) -> &sys::fi_tx_attr {
        // SAFETY: fi_getinfo always fills in tx_attr; it lives as long as `raw`.
        unsafe { &*self.info().tx_attr }
    }

    /// Provider name, e.g. `"shm"` or `"tcp;ofi_rxm"` (`fi_fabric_attr::prov_name`).
    pub fn provider_name(&self) -> String {
        cstr_or_empty(self.fabric_attr().prov_name)
    }

    /// Fabric name (`fi_fabric_attr::name`), e.g. the IP subnet for tcp.
    pub fn fabric_name(&self) -> String {
        cstr_or_empty(self.fabric_attr().name)
    }

    /// Domain name (`fi_domain_attr::name`), e.g. the interface for tcp.
    pub fn domain_name(&self) -> String {
        cstr_or_empty(self.domain_attr().name)
    }

    /// Wire protocol of the endpoint (`fi_ep_attr::protocol`, `FI_PROTO_*`):
    /// `FI_PROTO_RXM` for `tcp;ofi_rxm`, `FI_PROTO_XNET` for the native TCP
    /// RDM endpoint ([`native_tcp_rdm`]).
    pub fn protocol(&self) -> u32 {
        // SAFETY: fi_getinfo always fills in ep_attr; it lives as long as `raw`.
        unsafe { (*self.info().ep_attr).protocol }
    }

    /// Granted capabilities (`fi_info::caps`, `FI_*` bits).
    pub fn caps(&self) -> u64 {
        self.info().caps
    }

    /// Modes the application must honour (`fi_info::mode`), a subset of
    /// [`MODE_SUPPORTED`].
    pub fn mode(&self) -> u64 {
        self.info().mode
    }

    /// Whether every operation needs its own `fi_context`/`fi_context2`.
    pub fn needs_op_context(&self) -> bool {
        self.mode() & MODE_SUPPORTED != 0
    }

    /// Granted memory-registration mode (`fi_domain_attr::mr_mode`, `FI_MR_*` bits).
    pub fn mr_mode(&self) -> i32 {
        self.domain_attr().mr_mode
    }

    /// Whether remote addresses are virtual addresses (`FI_MR_VIRT_ADDR`) rather than
    /// offsets into the region.
    pub fn mr_virt_addr(&self) -> bool {
        self.mr_mode() & sys::FI_MR_VIRT_ADDR != 0
    }

    /// Granted transmit ordering (`fi_tx_attr::msg_order`, `FI_ORDER_*` bits).
    pub fn msg_order(&self) -> u64 {
        self.tx_attr().msg_order
    }

    /// Largest single transfer, in bytes (`fi_ep_attr::max_msg_size`).
    pub fn max_msg_size(&self) -> usize {
        // SAFETY: fi_getinfo always fills in ep_attr; it lives as long as `raw`.
        unsafe { (*self.info().ep_attr).max_msg_size }
    }

    /// Largest transfer that may be injected, in bytes (`fi_tx_attr::inject_size`).
    pub fn inject_size(&self) -> usize {
        self.tx_attr().inject_size
    }

    /// Whether atomics were granted (`FI_ATOMIC` in caps). Which operations and types
    /// are supported is asked per endpoint with
    /// [`Endpoint::atomic_valid`](super::Endpoint::atomic_valid).
    pub fn has_atomics(&self) -> bool {
        self.caps() & sys::FI_ATOMIC != 0
    }

    /// Granted threading model (`fi_domain_attr::threading`, `FI_THREAD_*`).
    pub fn threading(&self) -> sys::fi_threading {
        self.domain_attr().threading
    }

    /// Granted data progress model (`FI_PROGRESS_AUTO` or `FI_PROGRESS_MANUAL`).
    pub fn data_progress(&self) -> sys::fi_progress {
        self.domain_attr().data_progress
    }
}

impl Clone for Info {
    fn clone(&self) -> Self {
        // SAFETY: `raw` is a valid fi_info (type invariant).
        let raw = unsafe { result::dupinfo(self.raw) }.expect("fi_dupinfo failed: out of memory");
        Info { raw }
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: `raw` is owned by `self` and not used after this.
        unsafe { result::freeinfo(self.raw) }
    }
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Info")
            .field("provider", &self.provider_name())
            .field("fabric", &self.fabric_name())
            .field("domain", &self.domain_name())
            .field("caps", &format_args!("{:#x}", self.caps()))
            .field("mode", &format_args!("{:#x}", self.mode()))
            .field("mr_mode", &format_args!("{:#x}", self.mr_mode()))
            .field("msg_order", &format_args!("{:#x}", self.msg_order()))
            .field("max_msg_size", &self.max_msg_size())
            .field("inject_size", &self.inject_size())
            .field("threading", &self.threading())
            .field("data_progress", &self.data_progress())
            .finish()
    }
}

/// The hints `fi_info`, freed on drop.
struct Hints(*mut sys::fi_info);

impl Hints {
    fn new(req: &InfoRequest) -> Result<Hints> {
        let hints = Hints(result::allocinfo()?);
        let prov = req
            .provider
            .as_deref()
            .map(CString::new)
            .transpose()
            .map_err(|_| FabricError::invalid("fi_getinfo", "provider name contains a NUL byte"))?;
        // SAFETY: fi_allocinfo returned a zeroed fi_info whose attr pointers are all
        // allocated; we only write plain fields. prov_name must be malloc'd because
        // fi_freeinfo frees it: libc::strdup does that.
        unsafe {
            let h = &mut *hints.0;
            h.caps = req.caps.unwrap_or(CAPS);
            h.mode = MODE_SUPPORTED;
            (*h.ep_attr).type_ = sys::FI_EP_RDM;
            let d = &mut *h.domain_attr;
            d.threading = sys::FI_THREAD_DOMAIN;
            d.control_progress = sys::FI_PROGRESS_MANUAL;
            d.data_progress = sys::FI_PROGRESS_MANUAL;
            d.mr_mode = MR_MODE_SUPPORTED | req.mr_mode_extra;
            d.av_type = sys::FI_AV_TABLE;
            (*h.tx_attr).msg_order = sys::FI_ORDER_SAS;
            (*h.rx_attr).msg_order = sys::FI_ORDER_SAS;
            if let Some(p) = &prov {
                let dup = libc::strdup(p.as_ptr());
                if dup.is_null() {
                    return Err(FabricError::call("fi_getinfo", -i64::from(sys::FI_ENOMEM)));
                }
                (*h.fabric_attr).prov_name = dup;
            }
        }
        Ok(hints)
    }
}

impl Drop for Hints {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from fi_allocinfo and is not used after this; the
        // strdup'd prov_name is freed by fi_freeinfo.
        unsafe { result::freeinfo(self.0) }
    }
}

fn cstr_or_empty(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: libfabric attribute strings are NUL-terminated and live as long as the
    // fi_info they belong to, which outlives this call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
