//! Thin layer: one function per libfabric call, returning [`Result`].
//!
//! Each function forwards to the raw binding (`cpnet_fabric_sys`, which reaches
//! libfabric's `static inline` calls through its C shim) and turns the return code into
//! `Ok(..)` or a [`FabricError`] that names the call. Posting calls map `-FI_EAGAIN` to
//! [`Post::Again`]. Nothing here owns or closes anything; the RAII types in the sibling
//! modules do. Pointer arguments are passed through unchanged, so every function is
//! `unsafe` and lists what the caller must uphold; the libfabric man page named on each
//! function is the full contract.

use std::ffi::{CStr, c_void};
use std::ptr;

use cpnet_fabric_sys as sys;

use super::error::{FabricError, Result, check};

/// Outcome of posting a non-blocking operation.
#[must_use = "an operation that returned Again was not posted and must be retried"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Post {
    /// The operation was queued; exactly one completion (success or error) carrying its
    /// context will be read from the endpoint's completion queue.
    Posted,
    /// `-FI_EAGAIN`: the provider is out of resources. Nothing was queued and no
    /// completion will arrive. Progress the completion queues (which frees resources
    /// and, with manual progress, drives the transfers) and post again.
    Again,
}

/// Maps the `ssize_t` return of a posting call.
fn post(call: &'static str, rc: isize) -> Result<Post> {
    if rc == -(sys::FI_EAGAIN as isize) {
        Ok(Post::Again)
    } else {
        check(call, rc as i64).map(|_| Post::Posted)
    }
}

/// Maps the `int` return of a call that yields an object through an out pointer.
fn opened<T>(call: &'static str, rc: i32, out: *mut T) -> Result<*mut T> {
    check(call, rc)?;
    if out.is_null() {
        return Err(FabricError::invalid(
            call,
            "provider returned success and a null object",
        ));
    }
    Ok(out)
}

/// fi_getinfo(3): the providers that match `hints`, as a linked list to be freed with
/// [`freeinfo`].
///
/// `-FI_ENODATA` (no provider matches) is returned as an error like any other.
///
/// # Safety
/// 1. `hints` is null or points to a valid `fi_info` (for example from [`allocinfo`]).
pub unsafe fn getinfo(
    version: u32,
    node: Option<&CStr>,
    service: Option<&CStr>,
    flags: u64,
    hints: *const sys::fi_info,
) -> Result<*mut sys::fi_info> {
    let mut info = ptr::null_mut();
    // SAFETY: node/service are NUL-terminated or null; hints is valid by the caller's
    // contract; `info` is a valid out pointer.
    let rc = unsafe {
        sys::fi_getinfo(
            version,
            node.map_or(ptr::null(), CStr::as_ptr),
            service.map_or(ptr::null(), CStr::as_ptr),
            flags,
            hints,
            &mut info,
        )
    };
    opened("fi_getinfo", rc, info)
}

/// fi_getinfo(3) `fi_allocinfo`: a zeroed `fi_info` with all attribute structs
/// allocated, to be freed with [`freeinfo`].
pub fn allocinfo() -> Result<*mut sys::fi_info> {
    // SAFETY: no preconditions; returns null on allocation failure.
    let info = unsafe { sys::cpnet_fi_allocinfo() };
    opened(
        "fi_allocinfo",
        if info.is_null() { -sys::FI_ENOMEM } else { 0 },
        info,
    )
}

/// fi_getinfo(3) `fi_dupinfo`: a deep copy of one `fi_info` (its `next` is not followed).
///
/// # Safety
/// 1. `info` points to a valid `fi_info`.
pub unsafe fn dupinfo(info: *const sys::fi_info) -> Result<*mut sys::fi_info> {
    // SAFETY: `info` is valid by the caller's contract.
    let dup = unsafe { sys::fi_dupinfo(info) };
    opened(
        "fi_dupinfo",
        if dup.is_null() { -sys::FI_ENOMEM } else { 0 },
        dup,
    )
}

/// fi_getinfo(3) `fi_freeinfo`: frees a whole `fi_info` list.
///
/// # Safety
/// 1. `info` came from [`getinfo`], [`allocinfo`] or [`dupinfo`] and is not used again.
pub unsafe fn freeinfo(info: *mut sys::fi_info) {
    // SAFETY: ownership of `info` passes to libfabric by the caller's contract.
    unsafe { sys::fi_freeinfo(info) }
}

/// fi_fabric(3): opens the fabric described by `attr`.
///
/// # Safety
/// 1. `attr` points to the `fabric_attr` of a valid `fi_info` returned by [`getinfo`].
pub unsafe fn fabric(attr: *mut sys::fi_fabric_attr) -> Result<*mut sys::fid_fabric> {
    let mut out = ptr::null_mut();
    // SAFETY: attr valid by contract; `out` is a valid out pointer; null context.
    let rc = unsafe { sys::fi_fabric(attr, &mut out, ptr::null_mut()) };
    opened("fi_fabric", rc, out)
}

/// fi_domain(3): opens a domain of `fabric` for `info`.
///
/// # Safety
/// 1. `fabric` is an open fabric; `info` is a valid `fi_info` from [`getinfo`] for it.
pub unsafe fn domain(
    fabric: *mut sys::fid_fabric,
    info: *mut sys::fi_info,
) -> Result<*mut sys::fid_domain> {
    let mut out = ptr::null_mut();
    // SAFETY: both pointers valid by contract; `out` is a valid out pointer.
    let rc = unsafe { sys::cpnet_fi_domain(fabric, info, &mut out, ptr::null_mut()) };
    opened("fi_domain", rc, out)
}

/// fi_av(3) `fi_av_open`.
///
/// # Safety
/// 1. `domain` is an open domain; `attr` points to a valid `fi_av_attr`.
pub unsafe fn av_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_av_attr,
) -> Result<*mut sys::fid_av> {
    let mut out = ptr::null_mut();
    // SAFETY: pointers valid by contract; `out` is a valid out pointer.
    let rc = unsafe { sys::cpnet_fi_av_open(domain, attr, &mut out, ptr::null_mut()) };
    opened("fi_av_open", rc, out)
}

/// fi_av(3) `fi_av_insert`: inserts `fi_addr.len()` addresses packed in `addr` and
/// writes their `fi_addr_t` handles. Fails unless every address was inserted.
///
/// # Safety
/// 1. `av` is an open address vector.
/// 2. `addr` holds `fi_addr.len()` addresses in the provider's address format, laid
///    out as fi_av(3) describes (fixed-size, or consecutive NUL-terminated strings for
///    `FI_ADDR_STR`).
pub unsafe fn av_insert(
    av: *mut sys::fid_av,
    addr: &[u8],
    fi_addr: &mut [sys::fi_addr_t],
) -> Result<()> {
    // SAFETY: av valid by contract; `addr` holds the addresses (contract 2); `fi_addr`
    // has room for one handle per address; no flags; synchronous (null context).
    let rc = unsafe {
        sys::cpnet_fi_av_insert(
            av,
            addr.as_ptr().cast(),
            fi_addr.len(),
            fi_addr.as_mut_ptr(),
            0,
            ptr::null_mut(),
        )
    };
    let n = check("fi_av_insert", rc)?;
    if n as usize != fi_addr.len() {
        return Err(FabricError::invalid(
            "fi_av_insert",
            format!("inserted {n} of {} addresses", fi_addr.len()),
        ));
    }
    Ok(())
}

/// fi_av(3) `fi_av_straddr`: the provider's printable form of one address (for
/// example `fi_sockaddr_in://10.0.0.1:40000` for tcp), for messages and logs only.
///
/// # Safety
/// 1. `av` is an open address vector.
/// 2. `addr` holds one address in the provider's address format, followed by
///    enough zero bytes that a provider reading by its own format's length stays
///    inside it (see [`AddressVector::straddr`](super::AddressVector::straddr)).
pub unsafe fn av_straddr(av: *mut sys::fid_av, addr: &[u8]) -> Result<String> {
    let mut buf = vec![0u8; 256];
    let mut len = buf.len();
    // SAFETY: av and addr valid by contract; `buf` is writable for `len` bytes.
    let mut out = unsafe { sys::cpnet_fi_av_straddr(av, addr.as_ptr().cast(), buf.as_mut_ptr().cast(), &mut len) };
    if !out.is_null() && len > buf.len() {
        // Truncated: `len` now holds the size needed (NUL included).
        buf.resize(len, 0);
        // SAFETY: as above, with the buffer grown to the size the provider asked for.
        out = unsafe { sys::cpnet_fi_av_straddr(av, addr.as_ptr().cast(), buf.as_mut_ptr().cast(), &mut len) };
    }
    if out.is_null() {
        return Err(FabricError::invalid("fi_av_straddr", "the provider could not format the address"));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// fi_cq(3) `fi_cq_open`.
///
/// # Safety
/// 1. `domain` is an open domain; `attr` points to a valid `fi_cq_attr`.
pub unsafe fn cq_open(
    domain: *mut sys::fid_domain,
    attr: *mut sys::fi_cq_attr,
) -> Result<*mut sys::fid_cq> {
    let mut out = ptr::null_mut();
    // SAFETY: pointers valid by contract; `out` is a valid out pointer.
    let rc = unsafe { sys::cpnet_fi_cq_open(domain, attr, &mut out, ptr::null_mut()) };
    opened("fi_cq_open", rc, out)
}

/// Result of one [`cq_read`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CqRead {
    /// This many entries were written to the buffer (at least one).
    Entries(usize),
    /// `-FI_EAGAIN`: nothing completed.
    Empty,
    /// `-FI_EAVAIL`: an error entry is at the head; read it with [`cq_readerr`].
    ErrorAvailable,
}

/// fi_cq(3) `fi_cq_read` for `FI_CQ_FORMAT_CONTEXT` queues.
///
/// # Safety
/// 1. `cq` is an open completion queue of format `FI_CQ_FORMAT_CONTEXT`.
pub unsafe fn cq_read(cq: *mut sys::fid_cq, buf: &mut [sys::fi_cq_entry]) -> Result<CqRead> {
    // SAFETY: cq valid by contract; `buf` has room for buf.len() context entries,
    // which is the entry format of the queue (contract 1).
    let rc = unsafe { sys::cpnet_fi_cq_read(cq, buf.as_mut_ptr().cast(), buf.len()) };
    if rc == -(sys::FI_EAGAIN as isize) {
        Ok(CqRead::Empty)
    } else if rc == -(sys::FI_EAVAIL as isize) {
        Ok(CqRead::ErrorAvailable)
    } else {
        check("fi_cq_read", rc as i64).map(|n| CqRead::Entries(n as usize))
    }
}

/// fi_cq(3) `fi_cq_readerr`: pops the error entry at the head of the queue, or `None`
/// if there is none.
///
/// The entry's `err_data` points into provider memory that stays valid only until the
/// next read of this queue.
///
/// # Safety
/// 1. `cq` is an open completion queue.
pub unsafe fn cq_readerr(cq: *mut sys::fid_cq) -> Result<Option<sys::fi_cq_err_entry>> {
    // err_data_size = 0 asks the provider to use its own err_data buffer (API >= 1.5).
    let mut entry = sys::fi_cq_err_entry::default();
    // SAFETY: cq valid by contract; `entry` is a writable fi_cq_err_entry.
    let rc = unsafe { sys::cpnet_fi_cq_readerr(cq, &mut entry, 0) };
    if rc == -(sys::FI_EAGAIN as isize) {
        return Ok(None);
    }
    check("fi_cq_readerr", rc as i64)?;
    Ok(Some(entry))
}

/// fi_cq(3) `fi_cq_strerror`: provider text for an error entry's `prov_errno`.
///
/// # Safety
/// 1. `cq` is an open completion queue and `err_data` is the `err_data` of an entry
///    just read from it with [`cq_readerr`] (or null).
pub unsafe fn cq_strerror(
    cq: *mut sys::fid_cq,
    prov_errno: i32,
    err_data: *const c_void,
) -> String {
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: cq/err_data valid by contract; `buf` is writable for its length.
    let p =
        unsafe { sys::cpnet_fi_cq_strerror(cq, prov_errno, err_data, buf.as_mut_ptr(), buf.len()) };
    if p.is_null() {
        return format!("prov_errno {prov_errno}");
    }
    // SAFETY: fi_cq_strerror returns a NUL-terminated string, either `buf` (which it
    // terminated) or provider-owned static text; we copy it at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// fi_endpoint(3) `fi_endpoint`: opens an active endpoint.
///
/// # Safety
/// 1. `domain` is an open domain; `info` is a valid `fi_info` for it.
pub unsafe fn endpoint(
    domain: *mut sys::fid_domain,
    info: *mut sys::fi_info,
) -> Result<*mut sys::fid_ep> {
    let mut out = ptr::null_mut();
    // SAFETY: pointers valid by contract; `out` is a valid out pointer.
    let rc = unsafe { sys::cpnet_fi_endpoint(domain, info, &mut out, ptr::null_mut()) };
    opened("fi_endpoint", rc, out)
}

/// fi_endpoint(3) `fi_ep_bind`: binds a CQ, AV or counter to an endpoint.
///
/// # Safety
/// 1. `ep` is an open, not yet enabled endpoint; `bfid` is the `fid` of an open object
///    of the same domain that outlives the endpoint.
pub unsafe fn ep_bind(ep: *mut sys::fid_ep, bfid: *mut sys::fid, flags: u64) -> Result<()> {
    // SAFETY: pointers valid by contract.
    check("fi_ep_bind", unsafe {
        sys::cpnet_fi_ep_bind(ep, bfid, flags)
    })
    .map(drop)
}

/// fi_endpoint(3) `fi_enable`.
///
/// # Safety
/// 1. `ep` is an open endpoint with its CQ and AV bound.
pub unsafe fn enable(ep: *mut sys::fid_ep) -> Result<()> {
    // SAFETY: ep valid by contract.
    check("fi_enable", unsafe { sys::cpnet_fi_enable(ep) }).map(drop)
}

/// fi_cm(3) `fi_getname`: the endpoint's address, in the provider's format.
///
/// # Safety
/// 1. `fid` is the `fid` of an open, enabled endpoint.
pub unsafe fn getname(fid: *mut sys::fid) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    let mut len = buf.len();
    // SAFETY: fid valid by contract; `buf` is writable for `len` bytes.
    let mut rc = unsafe { sys::cpnet_fi_getname(fid, buf.as_mut_ptr().cast(), &mut len) };
    if rc == -(sys::FI_ETOOSMALL as i32) {
        // `len` now holds the size needed.
        buf.resize(len, 0);
        // SAFETY: as above, with the buffer grown to the size the provider asked for.
        rc = unsafe { sys::cpnet_fi_getname(fid, buf.as_mut_ptr().cast(), &mut len) };
    }
    check("fi_getname", rc)?;
    buf.truncate(len);
    Ok(buf)
}

/// fi_mr(3) `fi_mr_reg`.
///
/// # Safety
/// 1. `domain` is an open domain.
/// 2. `buf..buf+len` is memory that stays allocated until the region is closed.
#[allow(clippy::too_many_arguments)] // mirrors the C signature
pub unsafe fn mr_reg(
    domain: *mut sys::fid_domain,
    buf: *const c_void,
    len: usize,
    access: u64,
    offset: u64,
    requested_key: u64,
    flags: u64,
) -> Result<*mut sys::fid_mr> {
    let mut out = ptr::null_mut();
    // SAFETY: domain and buffer valid by contract; `out` is a valid out pointer.
    let rc = unsafe {
        sys::cpnet_fi_mr_reg(
            domain,
            buf,
            len,
            access,
            offset,
            requested_key,
            flags,
            &mut out,
            ptr::null_mut(),
        )
    };
    opened("fi_mr_reg", rc, out)
}

/// fi_mr(3) `fi_mr_key`: the key a peer uses to access the region.
///
/// Fails with `-FI_ENOKEY` while the key is not available (`FI_KEY_NOTAVAIL`, which
/// happens for `FI_MR_ENDPOINT` regions before [`mr_enable`]).
///
/// # Safety
/// 1. `mr` is an open memory region.
pub unsafe fn mr_key(mr: *mut sys::fid_mr) -> Result<u64> {
    // SAFETY: mr valid by contract.
    let key = unsafe { sys::cpnet_fi_mr_key(mr) };
    if key == sys::FI_KEY_NOTAVAIL {
        return Err(FabricError::call("fi_mr_key", -i64::from(sys::FI_ENOKEY)));
    }
    Ok(key)
}

/// fi_mr(3) `fi_mr_desc`: the local descriptor passed with local buffers.
///
/// # Safety
/// 1. `mr` is an open memory region.
pub unsafe fn mr_desc(mr: *mut sys::fid_mr) -> *mut c_void {
    // SAFETY: mr valid by contract.
    unsafe { sys::cpnet_fi_mr_desc(mr) }
}

/// fi_mr(3) `fi_mr_bind`: binds a region to an endpoint (`FI_MR_ENDPOINT`).
///
/// # Safety
/// 1. `mr` is an open region, `bfid` the `fid` of an open endpoint that outlives it.
pub unsafe fn mr_bind(mr: *mut sys::fid_mr, bfid: *mut sys::fid, flags: u64) -> Result<()> {
    // SAFETY: pointers valid by contract.
    check("fi_mr_bind", unsafe {
        sys::cpnet_fi_mr_bind(mr, bfid, flags)
    })
    .map(drop)
}

/// fi_mr(3) `fi_mr_enable`.
///
/// # Safety
/// 1. `mr` is an open region, bound as its provider requires.
pub unsafe fn mr_enable(mr: *mut sys::fid_mr) -> Result<()> {
    // SAFETY: mr valid by contract.
    check("fi_mr_enable", unsafe { sys::cpnet_fi_mr_enable(mr) }).map(drop)
}

/// fabric(7) `fi_close`.
///
/// # Safety
/// 1. `fid` is an open object whose children are all closed; it is not used again.
pub unsafe fn close(fid: *mut sys::fid) -> Result<()> {
    // SAFETY: fid valid and childless by contract.
    check("fi_close", unsafe { sys::cpnet_fi_close(fid) }).map(drop)
}

/// fi_rma(3) `fi_write`.
///
/// # Safety
/// 1. `ep` is an open, enabled endpoint.
/// 2. `buf..buf+len` stays valid and unmodified until the completion is read, and is
///    registered with descriptor `desc` if the provider needs `FI_MR_LOCAL`.
/// 3. `context` is what the completion will report; if the provider requires
///    `FI_CONTEXT`/`FI_CONTEXT2` it points to a `fi_context2` that stays valid until then.
#[allow(clippy::too_many_arguments)] // mirrors the C signature
pub unsafe fn write(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe { sys::cpnet_fi_write(ep, buf, len, desc, dest_addr, addr, key, context) };
    post("fi_write", rc)
}

/// fi_rma(3) `fi_writemsg`.
///
/// # Safety
/// 1. `ep` is an open, enabled endpoint; `msg` and everything it points to are valid,
///    with the same lifetime rules for the local buffers and context as [`write()`].
pub unsafe fn writemsg(ep: *mut sys::fid_ep, msg: &sys::fi_msg_rma, flags: u64) -> Result<Post> {
    // SAFETY: forwarded contract.
    post("fi_writemsg", unsafe {
        sys::cpnet_fi_writemsg(ep, msg, flags)
    })
}

/// fi_rma(3) `fi_inject_write`: the buffer is copied (or sent) before the call
/// returns, and no completion is ever written for the operation.
///
/// # Safety
/// 1. `ep` is an open, enabled endpoint; `buf..buf+len` is readable for the call, and
///    `len` is at most the endpoint's `inject_size`.
/// 2. `dest_addr` came from the address vector bound to `ep`, and `addr`/`key` name
///    `len` bytes of a region the peer registered.
pub unsafe fn inject_write(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe { sys::cpnet_fi_inject_write(ep, buf, len, dest_addr, addr, key) };
    post("fi_inject_write", rc)
}

/// fi_msg(3) `fi_send`.
///
/// # Safety
/// 1. `ep` is an open, enabled endpoint with `FI_MSG` | `FI_SEND`.
/// 2. `buf..buf+len` stays valid and unmodified until the completion is read, and is
///    registered with descriptor `desc` if the provider needs `FI_MR_LOCAL`.
/// 3. `context` as for [`write()`].
pub unsafe fn send(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    len: usize,
    desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe { sys::cpnet_fi_send(ep, buf, len, desc, dest_addr, context) };
    post("fi_send", rc)
}

/// fi_msg(3) `fi_recv`.
///
/// # Safety
/// 1. `ep` is an open, enabled endpoint with `FI_MSG` | `FI_RECV`.
/// 2. `buf..buf+len` is written by the provider and must not be read or written by
///    anyone else until the completion is read; registered as for [`send()`].
/// 3. `context` as for [`write()`].
pub unsafe fn recv(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: sys::fi_addr_t,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe { sys::cpnet_fi_recv(ep, buf, len, desc, src_addr, context) };
    post("fi_recv", rc)
}

/// fi_rma(3) `fi_read`.
///
/// # Safety
/// 1. Like [`write()`], except that `buf..buf+len` is written by the provider and must not
///    be read or written by anyone else until the completion is read.
#[allow(clippy::too_many_arguments)] // mirrors the C signature
pub unsafe fn read(
    ep: *mut sys::fid_ep,
    buf: *mut c_void,
    len: usize,
    desc: *mut c_void,
    src_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe { sys::cpnet_fi_read(ep, buf, len, desc, src_addr, addr, key, context) };
    post("fi_read", rc)
}

/// fi_atomic(3) `fi_atomic`.
///
/// # Safety
/// 1. Like [`write()`], with `buf` holding `count` elements of `datatype`.
#[allow(clippy::too_many_arguments)] // mirrors the C signature
pub unsafe fn atomic(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe {
        sys::cpnet_fi_atomic(
            ep, buf, count, desc, dest_addr, addr, key, datatype, op, context,
        )
    };
    post("fi_atomic", rc)
}

/// fi_atomic(3) `fi_atomicmsg`.
///
/// # Safety
/// 1. Like [`writemsg`], for a `fi_msg_atomic`.
pub unsafe fn atomicmsg(
    ep: *mut sys::fid_ep,
    msg: &sys::fi_msg_atomic,
    flags: u64,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    post("fi_atomicmsg", unsafe {
        sys::cpnet_fi_atomicmsg(ep, msg, flags)
    })
}

/// fi_atomic(3) `fi_fetch_atomic`.
///
/// # Safety
/// 1. Like [`atomic`]; `result` (`count` elements, descriptor `result_desc`) is written
///    by the provider and must not be accessed until the completion is read.
#[allow(clippy::too_many_arguments)] // mirrors the C signature
pub unsafe fn fetch_atomic(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe {
        sys::cpnet_fi_fetch_atomic(
            ep,
            buf,
            count,
            desc,
            result,
            result_desc,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context,
        )
    };
    post("fi_fetch_atomic", rc)
}

/// fi_atomic(3) `fi_compare_atomic`.
///
/// # Safety
/// 1. Like [`fetch_atomic`]; `compare` (`count` elements, descriptor `compare_desc`)
///    stays valid and unmodified until the completion is read.
#[allow(clippy::too_many_arguments)] // mirrors the C signature
pub unsafe fn compare_atomic(
    ep: *mut sys::fid_ep,
    buf: *const c_void,
    count: usize,
    desc: *mut c_void,
    compare: *const c_void,
    compare_desc: *mut c_void,
    result: *mut c_void,
    result_desc: *mut c_void,
    dest_addr: sys::fi_addr_t,
    addr: u64,
    key: u64,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
    context: *mut c_void,
) -> Result<Post> {
    // SAFETY: forwarded contract.
    let rc = unsafe {
        sys::cpnet_fi_compare_atomic(
            ep,
            buf,
            count,
            desc,
            compare,
            compare_desc,
            result,
            result_desc,
            dest_addr,
            addr,
            key,
            datatype,
            op,
            context,
        )
    };
    post("fi_compare_atomic", rc)
}

/// Which family of atomic calls a validity query is about (fi_atomic(3)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AtomicClass {
    /// `fi_atomic` (`fi_atomicvalid`).
    Plain,
    /// `fi_fetch_atomic` (`fi_fetch_atomicvalid`).
    Fetch,
    /// `fi_compare_atomic` (`fi_compare_atomicvalid`).
    Compare,
}

/// fi_atomic(3) `fi_atomicvalid` / `fi_fetch_atomicvalid` / `fi_compare_atomicvalid`:
/// `Some(max element count)` if the endpoint supports the operation, `None` if not
/// (`-FI_EOPNOTSUPP` or `-FI_ENOSYS`).
///
/// # Safety
/// 1. `ep` is an open endpoint.
pub unsafe fn atomic_valid(
    ep: *mut sys::fid_ep,
    class: AtomicClass,
    datatype: sys::fi_datatype,
    op: sys::fi_op,
) -> Result<Option<usize>> {
    let mut count = 0usize;
    // SAFETY: ep valid by contract; `count` is a valid out pointer.
    let (call, rc) = unsafe {
        match class {
            AtomicClass::Plain => (
                "fi_atomicvalid",
                sys::cpnet_fi_atomicvalid(ep, datatype, op, &mut count),
            ),
            AtomicClass::Fetch => (
                "fi_fetch_atomicvalid",
                sys::cpnet_fi_fetch_atomicvalid(ep, datatype, op, &mut count),
            ),
            AtomicClass::Compare => (
                "fi_compare_atomicvalid",
                sys::cpnet_fi_compare_atomicvalid(ep, datatype, op, &mut count),
            ),
        }
    };
    if rc == -sys::FI_EOPNOTSUPP || rc == -sys::FI_ENOSYS {
        return Ok(None);
    }
    check(call, rc)?;
    Ok(Some(count))
}
