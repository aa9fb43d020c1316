//! `Fabric` and `Domain`: the roots of every other fabric object.

use std::cell::Cell;
use std::rc::Rc;

use cpnet_fabric_sys as sys;

use super::error::Result;
use super::info::Info;
use super::result;

/// An open fabric (fi_fabric(3)): the provider instance everything else hangs off.
///
/// Closed with `fi_close` when the last [`Domain`] opened from it is gone.
#[derive(Debug)]
pub struct Fabric {
    raw: *mut sys::fid_fabric,
    info: Info,
}

impl Fabric {
    /// Opens the fabric that `info` describes (`fi_fabric`).
    ///
    /// # Errors
    /// `fi_fabric` failures.
    pub fn open(info: &Info) -> Result<Rc<Fabric>> {
        let info = info.clone();
        // SAFETY: `info` is a valid fi_info from fi_getinfo, so its fabric_attr is too.
        let raw = unsafe { result::fabric((*info.as_raw()).fabric_attr) }?;
        Ok(Rc::new(Fabric { raw, info }))
    }

    /// The configuration this fabric was opened with.
    pub fn info(&self) -> &Info {
        &self.info
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: every domain holds an Rc to us, so none is left; `raw` is not used
        // after this.
        if let Err(e) = unsafe { result::close(&mut (*self.raw).fid) } {
            tracing::warn!(error = %e, "closing fabric");
        }
    }
}

/// An open domain (fi_domain(3)): one NIC (or, for shm, this host) of the fabric.
///
/// Threading is `FI_THREAD_DOMAIN`: the domain and every object opened from it must be
/// used from one thread at a time. The types are therefore neither `Send` nor `Sync`
/// (they share their parents through `Rc`). To hand a whole set of fabric objects to a
/// service thread, create them on that thread, or move them together in one struct
/// that owns every object of the domain and carries its own `unsafe impl Send`.
#[derive(Debug)]
pub struct Domain {
    raw: *mut sys::fid_domain,
    info: Info,
    /// Next key to request when the provider does not pick keys (no `FI_MR_PROV_KEY`).
    next_key: Cell<u64>,
    _fabric: Rc<Fabric>,
}

impl Domain {
    /// Opens a domain of `fabric` (`fi_domain`), with the fabric's configuration.
    ///
    /// # Errors
    /// `fi_domain` failures.
    pub fn open(fabric: &Rc<Fabric>) -> Result<Rc<Domain>> {
        let info = fabric.info.clone();
        // SAFETY: `fabric.raw` is open (the Rc keeps it so); `info` is a valid fi_info
        // for this fabric.
        let raw = unsafe { result::domain(fabric.raw, info.as_raw()) }?;
        Ok(Rc::new(Domain {
            raw,
            info,
            next_key: Cell::new(1),
            _fabric: Rc::clone(fabric),
        }))
    }

    /// The configuration this domain was opened with; children use it too.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// The raw handle, for the thin layer. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::fid_domain {
        self.raw
    }

    /// A key to request for a new memory region, unique in this domain.
    pub(crate) fn next_requested_key(&self) -> u64 {
        let k = self.next_key.get();
        self.next_key.set(k + 1);
        k
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: every child holds an Rc to us, so all are closed; `raw` is not used
        // after this.
        if let Err(e) = unsafe { result::close(&mut (*self.raw).fid) } {
            tracing::warn!(error = %e, "closing domain");
        }
    }
}
