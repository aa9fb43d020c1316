//! Typed views of the local symmetric heap for compute loops.
//!
//! The apps compute directly on symmetric memory (as a GPU kernel computes
//! on its symmetric buffers), so they need `&[T]` / `&mut [T]` of parts of a
//! heap block while other threads (sibling work-groups, the proxy's fabric
//! operations, remote PEs' puts) touch other parts of it. [`SymArray`]
//! checks the bounds and alignment once, at creation; the slice accessors
//! are `unsafe` and each caller states, at the call, why no one else writes
//! the range it reads or touches the range it writes (the app's protocol:
//! work-group row ownership, team barriers, signals, acknowledgements).

use std::marker::PhantomData;

use cpnet::device::cpu::{HeapView, SymAddr};

/// `len` elements of `T` at symmetric address `addr` of this PE's heap.
#[derive(Debug)]
pub struct SymArray<T> {
    ptr: *mut T,
    len: usize,
    addr: SymAddr,
    _t: PhantomData<T>,
}

impl<T> Clone for SymArray<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SymArray<T> {}

// SAFETY: a SymArray is an address range in the heap, which lives as long
// as the PE; every access goes through the unsafe accessors below, whose
// callers guarantee the absence of conflicting accesses.
unsafe impl<T: Send> Send for SymArray<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for SymArray<T> {}

impl<T: Copy> SymArray<T> {
    /// The view of `len` elements at `addr`.
    ///
    /// # Panics
    /// If the range leaves the heap or `addr` is not aligned for `T` (both
    /// are programming errors of the app's heap layout).
    pub fn new(heap: &HeapView, addr: SymAddr, len: usize) -> SymArray<T> {
        let bytes = (len * size_of::<T>()) as u64;
        assert!(
            heap.check(addr, bytes).is_ok(),
            "{addr} + {bytes} bytes is outside the heap of {} bytes",
            heap.size()
        );
        assert!(
            addr.0.is_multiple_of(align_of::<T>() as u64),
            "{addr} is not aligned for {}",
            std::any::type_name::<T>()
        );
        // SAFETY: in bounds of the heap allocation (checked above), so the
        // offset stays inside one allocated object.
        let ptr = unsafe { heap.base().add(addr.0 as usize) }.cast::<T>();
        SymArray {
            ptr,
            len,
            addr,
            _t: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The symmetric address of element `i` (`i <= len`).
    pub fn addr(&self, i: usize) -> SymAddr {
        assert!(i <= self.len, "element {i} of {}", self.len);
        self.addr.add((i * size_of::<T>()) as u64)
    }

    /// Elements `[start, start + n)`, shared.
    ///
    /// # Safety
    /// 1. No one (thread of this process, proxy, remote PE) writes the range
    ///    while the slice lives.
    /// 2. Its contents were last written by a write that happens-before this
    ///    call (program order, a team barrier, or an acquire of a signal that
    ///    was raised after the data was delivered).
    ///
    /// # Panics
    /// If the range exceeds the array.
    pub unsafe fn slice(&self, start: usize, n: usize) -> &[T] {
        assert!(
            start + n <= self.len,
            "elements {start}..{} of {}",
            start + n,
            self.len
        );
        // SAFETY: in bounds (asserted) of the heap range checked in `new`;
        // aligned; the caller rules out concurrent writers (1, 2).
        unsafe { std::slice::from_raw_parts(self.ptr.add(start), n) }
    }

    /// Elements `[start, start + n)`, exclusive.
    ///
    /// # Safety
    /// 1. No one else reads or writes the range while the slice lives (in
    ///    particular, no fabric operation still reads it as a put source).
    ///
    /// # Panics
    /// If the range exceeds the array.
    #[allow(clippy::mut_from_ref)] // the exclusivity is the caller's protocol, stated above
    pub unsafe fn slice_mut(&self, start: usize, n: usize) -> &mut [T] {
        assert!(
            start + n <= self.len,
            "elements {start}..{} of {}",
            start + n,
            self.len
        );
        // SAFETY: in bounds (asserted) and aligned; exclusive by the
        // caller's guarantee (1).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), n) }
    }
}
