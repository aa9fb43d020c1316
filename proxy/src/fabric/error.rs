//! The one error type of the fabric layer.

use std::ffi::CStr;

use cpnet_fabric_sys as sys;

/// Everything that can go wrong in the fabric layer.
///
/// Retryable back-pressure (`-FI_EAGAIN` from a post) is *not* an error: the posting
/// calls return [`Post::Again`](super::Post::Again) instead, and an empty completion
/// queue polls as `Ok(0)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// A libfabric call returned a negative error code.
    #[error("{call} failed: {msg} (-{errno})", errno = -code)]
    Call {
        /// The libfabric call, e.g. `"fi_write"`.
        call: &'static str,
        /// The negative return code, e.g. `-FI_EINVAL` (-22).
        code: i32,
        /// `fi_strerror(-code)`.
        msg: String,
    },
    /// An operation was posted but completed in error; read from the completion queue
    /// with `fi_cq_readerr` (fi_cq(3)).
    #[error(
        "operation with context {ctx:#x} completed in error: {msg} (err {err}); \
         provider says: {prov_msg} (prov_errno {prov_errno})"
    )]
    Completion {
        /// The user context the operation was posted with.
        ctx: u64,
        /// `fi_cq_err_entry::err`: a positive `FI_E*` value.
        err: i32,
        /// `fi_cq_err_entry::prov_errno`: provider-specific, see `prov_msg`.
        prov_errno: i32,
        /// `fi_cq_err_entry::flags`: the kind of operation (`FI_RMA | FI_WRITE`, ...).
        flags: u64,
        /// `fi_strerror(err)`.
        msg: String,
        /// `fi_cq_strerror(prov_errno, err_data)`.
        prov_msg: String,
    },
    /// The safe layer refused a request before calling libfabric (for example an
    /// interior NUL in a provider name, or a memory region that needs an endpoint).
    #[error("{call}: {reason}")]
    Invalid {
        /// The libfabric call that was not made.
        call: &'static str,
        /// Why.
        reason: String,
    },
}

impl FabricError {
    /// Builds [`FabricError::Call`] from a negative libfabric return code.
    pub(crate) fn call(call: &'static str, rc: i64) -> Self {
        // Return codes are small negative errno values; anything outside i32 is garbage
        // from the provider and is reported as FI_EOTHER.
        let code = i32::try_from(rc).unwrap_or(-(sys::FI_EOTHER as i32));
        FabricError::Call {
            call,
            code,
            msg: strerror(code),
        }
    }

    /// Builds [`FabricError::Invalid`].
    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        FabricError::Invalid {
            call,
            reason: reason.into(),
        }
    }

    /// The negative libfabric error code: the return code for [`FabricError::Call`],
    /// `-err` for [`FabricError::Completion`], `-FI_EINVAL` for [`FabricError::Invalid`].
    pub fn code(&self) -> i32 {
        match self {
            FabricError::Call { code, .. } => *code,
            FabricError::Completion { err, .. } => -err.abs(),
            FabricError::Invalid { .. } => -sys::FI_EINVAL,
        }
    }

    /// The user context of the failed operation, for [`FabricError::Completion`].
    pub fn op_context(&self) -> Option<u64> {
        match self {
            FabricError::Completion { ctx, .. } => Some(*ctx),
            _ => None,
        }
    }
}

/// The fabric layer's result type.
pub type Result<T> = std::result::Result<T, FabricError>;

/// `fi_strerror(3)` text for a libfabric error code; the sign is ignored.
pub fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror accepts any int and returns a pointer to a NUL-terminated
    // string (a static table entry, or strerror's buffer for unknown values) that
    // we copy before returning.
    unsafe {
        let p = sys::fi_strerror(code.saturating_abs());
        if p.is_null() {
            return format!("unknown libfabric error {code}");
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// Maps a libfabric `int`/`ssize_t` return value to `Ok(rc)` (non-negative) or
/// [`FabricError::Call`].
pub(crate) fn check(call: &'static str, rc: impl Into<i64>) -> Result<i64> {
    let rc = rc.into();
    if rc < 0 {
        Err(FabricError::call(call, rc))
    } else {
        Ok(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_error_names_call_code_and_text() {
        let e = FabricError::call("fi_write", -i64::from(sys::FI_EINVAL));
        assert_eq!(e.code(), -22);
        let s = e.to_string();
        assert!(s.starts_with("fi_write failed: "), "{s}");
        assert!(s.ends_with("(-22)"), "{s}");
        assert!(s.to_lowercase().contains("invalid"), "{s}");
    }

    #[test]
    fn check_passes_non_negative_values_through() {
        assert_eq!(check("fi_cq_read", 3_isize as i64).unwrap(), 3);
        assert_eq!(check("fi_cq_read", -11).unwrap_err().code(), -11);
    }
}
