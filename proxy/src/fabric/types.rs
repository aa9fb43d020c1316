//! Small value types shared by the fabric objects: addresses, keys, descriptors and
//! atomic operation names.

use std::ffi::c_void;
use std::ptr;

use cpnet_fabric_sys as sys;

/// A peer's handle in an [`AddressVector`](super::AddressVector) (`fi_addr_t`,
/// fi_av(3)). Only meaningful with endpoints bound to the vector it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FiAddr(pub sys::fi_addr_t);

/// A remote memory key (fi_mr(3) `fi_mr_key`): what a peer passes to access a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MrKey(pub u64);

/// A local memory descriptor (fi_mr(3) `fi_mr_desc`), passed with local buffers. Null
/// when the provider does not need one (no `FI_MR_LOCAL`). Valid while its
/// [`MemoryRegion`](super::MemoryRegion) is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MrDesc(pub *mut c_void);

impl MrDesc {
    /// No descriptor (for providers without `FI_MR_LOCAL`).
    pub const NONE: MrDesc = MrDesc(ptr::null_mut());
}

/// A local source buffer: a pointer into registered memory and its descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBuf {
    /// First byte.
    pub ptr: *const u8,
    /// Descriptor of the region that holds it.
    pub desc: MrDesc,
}

/// A local destination buffer: a pointer into registered memory and its descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalBufMut {
    /// First byte.
    pub ptr: *mut u8,
    /// Descriptor of the region that holds it.
    pub desc: MrDesc,
}

/// Where a one-sided operation lands: the peer, the address in the peer's region (as
/// the provider wants it: virtual address or offset) and the region's key.
/// Build it with [`RemoteMemory::target`], which honours `FI_MR_VIRT_ADDR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteTarget {
    /// The peer.
    pub peer: FiAddr,
    /// Address passed to libfabric (`addr` in fi_rma(3)/fi_atomic(3)).
    pub addr: u64,
    /// The region's key.
    pub key: MrKey,
}

/// What a peer needs to reach one of our registered regions; exchanged at init.
///
/// `base` is the region's virtual address when the provider uses `FI_MR_VIRT_ADDR`
/// and 0 otherwise (offset addressing), so `base + offset` is always the address
/// libfabric expects (fi_mr(3) "FI_MR_VIRT_ADDR").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteMemory {
    /// Address of byte 0 of the region, as the provider addresses it.
    pub base: u64,
    /// Length of the region, in bytes.
    pub len: u64,
    /// The region's key.
    pub key: MrKey,
}

impl RemoteMemory {
    /// The target for `len` bytes at byte `offset` of this region on `peer`, or `None`
    /// if `offset..offset+len` is not inside the region.
    pub fn target(&self, peer: FiAddr, offset: u64, len: u64) -> Option<RemoteTarget> {
        let end = offset.checked_add(len)?;
        (end <= self.len).then(|| RemoteTarget {
            peer,
            addr: self.base + offset,
            key: self.key,
        })
    }
}

/// Atomic operations (fi_atomic(3) "OPERATION"). Which ones a provider supports for a
/// type is asked with [`Endpoint::atomic_valid`](super::Endpoint::atomic_valid).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AtomicOp {
    /// `FI_MIN`: target = min(target, operand).
    Min,
    /// `FI_MAX`: target = max(target, operand).
    Max,
    /// `FI_SUM`: target += operand.
    Sum,
    /// `FI_PROD`: target *= operand.
    Prod,
    /// `FI_BOR`: target |= operand.
    Bor,
    /// `FI_BAND`: target &= operand.
    Band,
    /// `FI_BXOR`: target ^= operand.
    Bxor,
    /// `FI_ATOMIC_READ`: fetch only; the operand is ignored (fetch calls only).
    Read,
    /// `FI_ATOMIC_WRITE`: target = operand (with fetch: swap).
    Write,
    /// `FI_CSWAP`: if target == compare { target = operand } (compare calls only).
    Cswap,
    /// `FI_MSWAP`: target = (operand & compare) | (target & !compare) (compare calls).
    Mswap,
}

impl AtomicOp {
    /// The libfabric value.
    pub fn to_sys(self) -> sys::fi_op {
        match self {
            AtomicOp::Min => sys::FI_MIN,
            AtomicOp::Max => sys::FI_MAX,
            AtomicOp::Sum => sys::FI_SUM,
            AtomicOp::Prod => sys::FI_PROD,
            AtomicOp::Bor => sys::FI_BOR,
            AtomicOp::Band => sys::FI_BAND,
            AtomicOp::Bxor => sys::FI_BXOR,
            AtomicOp::Read => sys::FI_ATOMIC_READ,
            AtomicOp::Write => sys::FI_ATOMIC_WRITE,
            AtomicOp::Cswap => sys::FI_CSWAP,
            AtomicOp::Mswap => sys::FI_MSWAP,
        }
    }
}

/// Atomic element types (fi_atomic(3) "DATATYPES"); the ones OpenSHMEM atomics use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AtomicType {
    /// `FI_INT32`.
    I32,
    /// `FI_UINT32`.
    U32,
    /// `FI_INT64`.
    I64,
    /// `FI_UINT64`.
    U64,
    /// `FI_FLOAT`.
    F32,
    /// `FI_DOUBLE`.
    F64,
}

impl AtomicType {
    /// The libfabric value.
    pub fn to_sys(self) -> sys::fi_datatype {
        match self {
            AtomicType::I32 => sys::FI_INT32,
            AtomicType::U32 => sys::FI_UINT32,
            AtomicType::I64 => sys::FI_INT64,
            AtomicType::U64 => sys::FI_UINT64,
            AtomicType::F32 => sys::FI_FLOAT,
            AtomicType::F64 => sys::FI_DOUBLE,
        }
    }

    /// Size of one element, in bytes.
    pub fn size(self) -> usize {
        match self {
            AtomicType::I32 | AtomicType::U32 | AtomicType::F32 => 4,
            AtomicType::I64 | AtomicType::U64 | AtomicType::F64 => 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_target_bounds_are_inclusive_of_the_last_byte_only() {
        let m = RemoteMemory {
            base: 0x1000,
            len: 64,
            key: MrKey(7),
        };
        let p = FiAddr(1);
        assert_eq!(m.target(p, 56, 8).unwrap().addr, 0x1038);
        assert!(m.target(p, 57, 8).is_none());
        assert!(m.target(p, 64, 0).is_some());
        assert!(m.target(p, u64::MAX, 2).is_none());
    }
}
