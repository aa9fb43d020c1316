//! `AddressVector`: peer addresses to `fi_addr_t` handles (fi_av(3)).

use std::rc::Rc;

use cpnet_fabric_sys as sys;

use super::domain::Domain;
use super::error::Result;
use super::result;
use super::types::FiAddr;

/// Zero bytes appended to an address before `fi_av_insert` (see
/// [`AddressVector::insert`]); libfabric addresses are at most a few dozen bytes.
const ADDR_PAD: usize = 256;

/// An address vector of type `FI_AV_TABLE` (fi_av(3)): peers are numbered 0, 1, 2...
/// in insertion order.
#[derive(Debug)]
pub struct AddressVector {
    raw: *mut sys::fid_av,
    domain: Rc<Domain>,
}

impl AddressVector {
    /// Opens an `FI_AV_TABLE` address vector sized for `count` peers (a hint; it grows).
    ///
    /// # Errors
    /// `fi_av_open` failures.
    pub fn open(domain: &Rc<Domain>, count: usize) -> Result<Rc<AddressVector>> {
        let mut attr = sys::fi_av_attr {
            type_: sys::FI_AV_TABLE,
            count,
            ..Default::default()
        };
        // SAFETY: the domain is open (the Rc keeps it so); `attr` is a valid attr.
        let raw = unsafe { result::av_open(domain.as_raw(), &mut attr) }?;
        Ok(Rc::new(AddressVector {
            raw,
            domain: Rc::clone(domain),
        }))
    }

    /// Inserts one peer address, as returned by the peer's
    /// [`Endpoint::name`](super::Endpoint::name), and returns its handle.
    ///
    /// This is a local call; nothing is sent to the peer.
    ///
    /// # Errors
    /// `fi_av_insert` failures, e.g. `-FI_EINVAL` for an address of the wrong format.
    pub fn insert(&self, addr: &[u8]) -> Result<FiAddr> {
        // Providers parse the address by its own format (a sockaddr family, a NUL-
        // terminated string for FI_ADDR_STR), not by our length, so a malformed address
        // could make them read past `addr`. Copy it into a zero-padded buffer so any
        // such read stays in bounds and a string is always terminated.
        let mut padded = Vec::with_capacity(addr.len() + ADDR_PAD);
        padded.extend_from_slice(addr);
        padded.resize(addr.len() + ADDR_PAD, 0);
        let mut out = [sys::FI_ADDR_NOTAVAIL];
        // SAFETY: the AV is open; `padded` holds one address followed by ADDR_PAD zero
        // bytes, more than any provider address format is long.
        unsafe { result::av_insert(self.raw, &padded, &mut out) }?;
        Ok(FiAddr(out[0]))
    }

    /// The provider's printable form of a peer address as returned by the peer's
    /// [`Endpoint::name`](super::Endpoint::name) (fi_av(3) `fi_av_straddr`), e.g.
    /// `fi_sockaddr_in://10.0.0.1:40000` for tcp: for messages and the transport map.
    /// A local call; the address need not be inserted.
    ///
    /// # Errors
    /// [`FabricError::Invalid`](super::FabricError::Invalid) when the provider cannot
    /// format it.
    pub fn straddr(&self, addr: &[u8]) -> Result<String> {
        // Zero-padded as in `insert`: the provider reads by its own format.
        let mut padded = Vec::with_capacity(addr.len() + ADDR_PAD);
        padded.extend_from_slice(addr);
        padded.resize(addr.len() + ADDR_PAD, 0);
        // SAFETY: the AV is open; `padded` holds one address followed by ADDR_PAD zero
        // bytes, more than any provider address format is long.
        unsafe { result::av_straddr(self.raw, &padded) }
    }

    /// The domain this vector belongs to.
    pub fn domain(&self) -> &Rc<Domain> {
        &self.domain
    }

    /// The raw handle, for the thin layer. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::fid_av {
        self.raw
    }
}

impl Drop for AddressVector {
    fn drop(&mut self) {
        // SAFETY: endpoints bound to us hold an Rc, so they are closed; `raw` is not
        // used after this.
        if let Err(e) = unsafe { result::close(&mut (*self.raw).fid) } {
            tracing::warn!(error = %e, "closing address vector");
        }
    }
}
