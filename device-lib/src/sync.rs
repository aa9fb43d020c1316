//! The one module through which cpnet touches memory it shares with another
//! agent (a GPU, a proxy thread, another process), and the shim that swaps in
//! `loom` under `cfg(loom)` so the queue protocol can be model-checked.
//!
//! Shared memory is seen as an array of 64-bit words ([`Words`]); every access
//! is atomic with an explicit ordering (no default `SeqCst`). Outside loom a
//! [`Words`] is a view over raw memory (host heap, pinned memory mapped into
//! a GPU) through `AtomicU64::from_ptr`; under loom it owns loom atomics.

#[cfg(not(loom))]
pub use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub use loom::sync::atomic::{AtomicU64, Ordering};

#[cfg(not(loom))]
use core::ptr::NonNull;

/// A run of 64-bit words shared with another agent.
#[cfg(not(loom))]
#[derive(Clone, Copy, Debug)]
pub struct Words {
    base: NonNull<u64>,
    len: usize,
}

// SAFETY: a Words is only a view; every access through it is atomic, and
// `from_raw`'s contract makes the memory valid for as long as the view lives.
#[cfg(not(loom))]
unsafe impl Send for Words {}
// SAFETY: as for Send: all access is through atomics.
#[cfg(not(loom))]
unsafe impl Sync for Words {}

#[cfg(not(loom))]
impl Words {
    /// A view of `len` words at `base`.
    ///
    /// # Safety
    /// 1. `base` is non-null, 8-byte aligned and valid for reads and writes of
    ///    `len * 8` bytes for as long as this view or any copy of it is used.
    /// 2. Every other access to that memory, by any agent, is atomic (or is a
    ///    GPU access ordered by the protocol in `cmd.h`), never a plain Rust
    ///    reference to it.
    #[inline]
    pub unsafe fn from_raw(base: *mut u64, len: usize) -> Words {
        let base = NonNull::new(base).expect("Words::from_raw: null base");
        debug_assert!(base.as_ptr().is_aligned());
        Words { base, len }
    }

    /// Word `i` as an atomic.
    ///
    /// # Panics
    /// If `i` is out of range.
    #[inline]
    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len, "shared word {i} out of range ({} words)", self.len);
        // SAFETY: i < len, so the address is inside the region `from_raw`
        // made valid and 8-byte aligned (clauses 1 and 2).
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(i)) }
    }

    /// The 32-bit half-word at byte offset `byte` (a multiple of 4).
    ///
    /// # Panics
    /// If the offset is out of range or misaligned.
    #[inline]
    pub fn word32(&self, byte: usize) -> &AtomicU32 {
        assert!(byte.is_multiple_of(4) && byte + 4 <= self.len * 8, "shared u32 at byte {byte} out of range");
        // SAFETY: in range and 4-byte aligned (base is 8-aligned); same region
        // contract as `word`.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().cast::<u8>().add(byte).cast::<u32>()) }
    }

    /// Relaxed loads of the `N` words from word `start` on, with one bounds
    /// check for all of them (a queue slot's copy, C2 in `cmd.h`).
    ///
    /// # Panics
    /// If `start + N` is past the view.
    #[inline]
    pub fn load_relaxed<const N: usize>(&self, start: usize) -> [u64; N] {
        assert!(start + N <= self.len, "shared words {start}..{} out of range ({} words)", start + N, self.len);
        // SAFETY: every index is below `len` (checked above); same region
        // contract as `word`.
        core::array::from_fn(|i| unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(start + i)) }.load(Ordering::Relaxed))
    }

    /// A sub-view of `len` words starting at word `start`.
    #[inline]
    pub fn slice(&self, start: usize, len: usize) -> Words {
        assert!(start + len <= self.len, "sub-view out of range");
        // SAFETY: inside this view's region, so the same contract holds.
        unsafe { Words::from_raw(self.base.as_ptr().add(start), len) }
    }

    /// The address of word 0.
    pub fn as_ptr(&self) -> *mut u64 {
        self.base.as_ptr()
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no words.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A run of 64-bit words shared between loom threads.
#[cfg(loom)]
#[derive(Clone, Debug)]
pub struct Words {
    cells: std::sync::Arc<Vec<AtomicU64>>,
    start: usize,
    len: usize,
}

#[cfg(loom)]
impl Words {
    /// `len` zeroed words.
    pub fn new(len: usize) -> Words {
        Words { cells: std::sync::Arc::new((0..len).map(|_| AtomicU64::new(0)).collect()), start: 0, len }
    }

    /// Word `i` as an atomic.
    #[inline]
    pub fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.len);
        &self.cells[self.start + i]
    }

    /// Relaxed loads of the `N` words from word `start` on.
    pub fn load_relaxed<const N: usize>(&self, start: usize) -> [u64; N] {
        core::array::from_fn(|i| self.word(start + i).load(Ordering::Relaxed))
    }

    /// A sub-view.
    pub fn slice(&self, start: usize, len: usize) -> Words {
        assert!(start + len <= self.len);
        Words { cells: self.cells.clone(), start: self.start + start, len }
    }

    /// Number of words.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are no words.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// When a wait gives up. Under loom it never does (loom explores schedules,
/// not time).
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    #[cfg(not(loom))]
    at: Option<std::time::Instant>,
}

impl Deadline {
    /// A deadline `timeout` from now; `None` waits forever.
    pub fn after(timeout: Option<std::time::Duration>) -> Deadline {
        #[cfg(not(loom))]
        {
            Deadline { at: timeout.map(|t| std::time::Instant::now() + t) }
        }
        #[cfg(loom)]
        {
            let _ = timeout;
            Deadline {}
        }
    }

    /// A deadline that never passes.
    pub fn never() -> Deadline {
        Deadline::after(None)
    }

    /// Whether the deadline has passed.
    #[inline]
    pub fn expired(&self) -> bool {
        #[cfg(not(loom))]
        {
            self.at.is_some_and(|at| std::time::Instant::now() >= at)
        }
        #[cfg(loom)]
        {
            false
        }
    }
}

/// Bounded spinning with backoff: spin, then yield the CPU. Under loom each
/// step yields to the model's scheduler.
#[derive(Debug, Default)]
pub struct Spin {
    #[cfg(not(loom))]
    backoff: crossbeam_utils::Backoff,
}

impl Spin {
    /// A fresh backoff.
    pub fn new() -> Spin {
        Spin::default()
    }

    /// One step of waiting.
    #[inline]
    pub fn step(&self) {
        #[cfg(not(loom))]
        {
            if self.backoff.is_completed() {
                std::thread::yield_now();
            } else {
                self.backoff.snooze();
            }
        }
        #[cfg(loom)]
        loom::thread::yield_now();
    }

    /// Start over after progress.
    #[inline]
    pub fn reset(&self) {
        #[cfg(not(loom))]
        self.backoff.reset();
    }
}
