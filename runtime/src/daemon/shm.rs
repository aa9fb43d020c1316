//! Shared memory between a PE and the daemon: a sealed memfd, mapped
//! `MAP_SHARED` by both sides ([`SharedMem`]).
//!
//! The PE creates it ([`SharedMem::create`]), sizes it, and seals its size
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`) before it passes the fd
//! over the socket: the daemon maps it too ([`SharedMem::map`]) and
//! registers it with libfabric, and a PE that could still shrink the file
//! could make the daemon's accesses fault (SIGBUS) and so kill every other
//! PE it serves. The daemon refuses an fd without those seals, or of another
//! size than the attach message says.
//!
//! A memfd has no name in any file system: it is freed when the last
//! mapping and the last fd are gone, whoever dies first, so nothing is ever
//! left in `/dev/shm`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// The seals a shared region must carry.
const SEALS: SealFlags = SealFlags::SHRINK.union(SealFlags::GROW).union(SealFlags::SEAL);

/// One mapping of a memfd, read-write and shared; unmapped on drop.
#[derive(Debug)]
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; what is stored in it is reached only
// through views (`Words`, `HeapView`) whose accesses are atomics or copies
// that the OpenSHMEM semantics allow to race, as for `HostHeap`.
unsafe impl Send for SharedMem {}
// SAFETY: as above.
unsafe impl Sync for SharedMem {}

impl SharedMem {
    /// A new zeroed region of `len` bytes (> 0), sealed at that size, and
    /// its fd (close-on-exec) to pass to the daemon. `name` shows in
    /// `/proc/<pid>/fd` (e.g. `cpnet-heap-pe3`).
    ///
    /// # Errors
    /// The failing call (`memfd_create`, `ftruncate`, `fcntl(F_ADD_SEALS)`,
    /// `mmap`) with the OS error.
    pub fn create(name: &str, len: usize) -> io::Result<(SharedMem, OwnedFd)> {
        let what = |call: &str, e: rustix::io::Errno| io::Error::other(format!("{call} ({name}, {len} bytes): {e}"));
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(|e| what("memfd_create", e))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| what("ftruncate", e))?;
        rustix::fs::fcntl_add_seals(&fd, SEALS).map_err(|e| what("fcntl(F_ADD_SEALS)", e))?;
        let mem = SharedMem::map_unchecked(&fd, len).map_err(|e| what("mmap", e))?;
        Ok((mem, fd))
    }

    /// Maps a region a PE passed: checks that `fd` is a memfd of exactly
    /// `len` bytes whose size is sealed, then maps it.
    ///
    /// # Errors
    /// A message naming what is wrong (size, seals) or the failing call.
    pub fn map(fd: &OwnedFd, len: usize) -> Result<SharedMem, String> {
        let seals = rustix::fs::fcntl_get_seals(fd).map_err(|e| format!("not a sealable memfd (F_GET_SEALS: {e})"))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(format!("the memfd's size is not sealed (seals {seals:?}; want SHRINK|GROW)"));
        }
        let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat: {e}"))?;
        if st.st_size as u64 != len as u64 {
            return Err(format!("the memfd holds {} bytes, the attach message says {len}", st.st_size));
        }
        SharedMem::map_unchecked(fd, len).map_err(|e| format!("mmap of {len} bytes: {e}"))
    }

    fn map_unchecked(fd: &OwnedFd, len: usize) -> Result<SharedMem, rustix::io::Errno> {
        if len == 0 {
            return Err(rustix::io::Errno::INVAL);
        }
        // SAFETY: a fresh mapping chosen by the kernel (null hint, no
        // MAP_FIXED), so no existing memory is replaced; `len` > 0 bytes of
        // a file at least that long (sealed at its size by the caller or
        // checked above).
        let p = unsafe {
            rustix::mm::mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, fd.as_fd(), 0)
        }?;
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(rustix::io::Errno::NOMEM)?;
        Ok(SharedMem { ptr, len })
    }

    /// The first byte (page-aligned).
    pub fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: `len` > 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly one mapping made in
        // `map_unchecked`, unmapped once, here; every view of it is gone
        // (the owners drop this after the threads using it are joined).
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_mappings_see_one_memory_and_size_is_sealed() {
        let (a, fd) = SharedMem::create("cpnet-test", 8192).unwrap();
        let b = SharedMem::map(&fd, 8192).unwrap();
        // SAFETY: both are live 8 KiB mappings; single-threaded test.
        unsafe {
            a.base().add(100).write(42);
            assert_eq!(b.base().add(100).read(), 42);
        }
        assert!(SharedMem::map(&fd, 4096).unwrap_err().contains("8192 bytes"), "a wrong size is refused");
        assert!(rustix::fs::ftruncate(&fd, 100).is_err(), "the size is sealed");
        let plain = rustix::fs::memfd_create("unsealed", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&plain, 4096).unwrap();
        assert!(SharedMem::map(&plain, 4096).unwrap_err().contains("seal"), "an unsealed memfd is refused");
    }
}
