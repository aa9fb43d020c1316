//! SIGINT and SIGTERM handlers for cpnet's own programs (`cpnet-run`,
//! `cpnet-proxyd`): each installs a handler that only stores into an atomic
//! flag its main loop polls.

use std::io;

/// Installs `handler` for SIGINT and SIGTERM (`SA_RESTART`, empty mask).
/// The handler must be async-signal-safe: a lock-free atomic store, nothing
/// else.
///
/// # Errors
/// `sigaction` failed.
pub fn on_sigint_sigterm(handler: extern "C" fn(libc::c_int)) -> io::Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `libc::sigaction` is a plain C struct for which all-zero
        // bytes is a valid value (no handler, no flags, empty mask).
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = handler as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: `sa.sa_mask` is a valid, writable sigset_t.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: `sa` is initialised; the handler is async-signal-safe by
        // this function's contract; a null old-action pointer is allowed.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}
