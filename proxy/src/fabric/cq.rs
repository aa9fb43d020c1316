//! `CompletionQueue`: where posted operations report back (fi_cq(3)).

use std::ffi::c_void;
use std::rc::Rc;

use cpnet_fabric_sys as sys;

use super::domain::Domain;
use super::error::{FabricError, Result, strerror};
use super::result::{self, CqRead};

/// Most entries read by one `fi_cq_read` in [`CompletionQueue::poll`].
const POLL_BATCH: usize = 64;

/// The per-operation context handed to providers that require `FI_CONTEXT` or
/// `FI_CONTEXT2` (fi_getinfo(3) "MODE"): the provider owns `fi` until the completion is
/// read; `user` is the caller's context id. Allocated at post, freed when the
/// completion (or error completion) is read, or at once if the post fails.
#[repr(C)]
pub(crate) struct OpContext {
    /// Must be first: the provider treats the context pointer as a `fi_context2 *`.
    fi: sys::fi_context2,
    user: u64,
}

impl OpContext {
    /// Turns a user context id into the `void *context` to post with.
    pub(crate) fn into_raw(user: u64, boxed: bool) -> *mut c_void {
        if boxed {
            Box::into_raw(Box::new(OpContext {
                fi: sys::fi_context2::default(),
                user,
            }))
            .cast()
        } else {
            std::ptr::without_provenance_mut(user as usize)
        }
    }

    /// Turns a context pointer back into the user id, freeing it if boxed.
    ///
    /// # Safety
    /// 1. `raw` came from [`OpContext::into_raw`] with the same `boxed`, and (if boxed)
    ///    this is the only call for it.
    pub(crate) unsafe fn from_raw(raw: *mut c_void, boxed: bool) -> u64 {
        if !boxed {
            return raw.addr() as u64;
        }
        if raw.is_null() {
            // Not an operation of ours (e.g. a provider-internal event); report 0.
            return 0;
        }
        // SAFETY: `raw` came from Box::into_raw in into_raw and is freed only here
        // (contract 1).
        unsafe { Box::from_raw(raw.cast::<OpContext>()) }.user
    }
}

/// A completion queue of format `FI_CQ_FORMAT_CONTEXT` without a wait object: it is
/// polled, never waited on (fi_cq(3)).
///
/// With `FI_PROGRESS_MANUAL` (what cpnet asks for), polling is also what moves data:
/// a target endpoint's queue must be polled too, or operations emulated in software
/// at the target (rxm atomics, for instance) never finish.
#[derive(Debug)]
pub struct CompletionQueue {
    raw: *mut sys::fid_cq,
    /// Whether operation contexts are boxed [`OpContext`]s (provider needs FI_CONTEXT).
    boxed: bool,
    domain: Rc<Domain>,
}

impl CompletionQueue {
    /// Opens a queue with room for `size` entries (0: provider default).
    ///
    /// # Errors
    /// `fi_cq_open` failures.
    pub fn open(domain: &Rc<Domain>, size: usize) -> Result<Rc<CompletionQueue>> {
        let mut attr = sys::fi_cq_attr {
            size,
            format: sys::FI_CQ_FORMAT_CONTEXT,
            wait_obj: sys::FI_WAIT_NONE,
            ..Default::default()
        };
        // SAFETY: the domain is open (the Rc keeps it so); `attr` is a valid attr.
        let raw = unsafe { result::cq_open(domain.as_raw(), &mut attr) }?;
        Ok(Rc::new(CompletionQueue {
            raw,
            boxed: domain.info().needs_op_context(),
            domain: Rc::clone(domain),
        }))
    }

    /// Reads up to `out.len()` (at most 64) completions, writes their user contexts to
    /// `out` and returns how many. Never blocks; `Ok(0)` when nothing completed.
    ///
    /// Also drives progress for every endpoint bound to this queue.
    ///
    /// # Errors
    /// * [`FabricError::Completion`] when the next completion is an error: the failed
    ///   operation's context is in it and the entry is consumed, so the next call
    ///   continues with later completions.
    /// * `fi_cq_read` / `fi_cq_readerr` failures.
    pub fn poll(&self, out: &mut [u64]) -> Result<usize> {
        let mut buf = [sys::fi_cq_entry::default(); POLL_BATCH];
        let n = out.len().min(POLL_BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the queue is open and was created with FI_CQ_FORMAT_CONTEXT.
        match unsafe { result::cq_read(self.raw, &mut buf[..n]) }? {
            CqRead::Empty => Ok(0),
            CqRead::Entries(k) => {
                for (o, e) in out.iter_mut().zip(&buf[..k]) {
                    // SAFETY: every context on this queue was made by OpContext::into_raw
                    // with `self.boxed` (endpoints check they share our domain, and so
                    // its mode) and completes exactly once.
                    *o = unsafe { OpContext::from_raw(e.op_context, self.boxed) };
                }
                Ok(k)
            }
            CqRead::ErrorAvailable => Err(self.read_error()),
        }
    }

    /// Pops the error entry at the head of the queue and turns it into an error.
    fn read_error(&self) -> FabricError {
        // SAFETY: the queue is open.
        let entry = match unsafe { result::cq_readerr(self.raw) } {
            Ok(Some(e)) => e,
            Ok(None) => {
                return FabricError::invalid(
                    "fi_cq_readerr",
                    "fi_cq_read said -FI_EAVAIL but no error entry was found",
                );
            }
            Err(e) => return e,
        };
        // SAFETY: err_data belongs to the entry just read from this queue and is still
        // valid (no read since).
        let prov_msg = unsafe { result::cq_strerror(self.raw, entry.prov_errno, entry.err_data) };
        // SAFETY: as in `poll`: the context was made by OpContext::into_raw with
        // `self.boxed` and this error entry is its one completion.
        let ctx = unsafe { OpContext::from_raw(entry.op_context, self.boxed) };
        FabricError::Completion {
            ctx,
            err: entry.err,
            prov_errno: entry.prov_errno,
            flags: entry.flags,
            msg: strerror(entry.err),
            prov_msg,
        }
    }

    /// The domain this queue belongs to.
    pub fn domain(&self) -> &Rc<Domain> {
        &self.domain
    }

    /// The raw handle, for the thin layer. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::fid_cq {
        self.raw
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // Boxed contexts of operations still in flight leak here; the proxy quiesces
        // (polls until nothing is outstanding) before tearing down.
        // SAFETY: endpoints bound to us hold an Rc, so they are closed; `raw` is not
        // used after this.
        if let Err(e) = unsafe { result::close(&mut (*self.raw).fid) } {
            tracing::warn!(error = %e, "closing completion queue");
        }
    }
}
