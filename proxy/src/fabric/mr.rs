//! `MemoryRegion`: memory registered for local and remote access (fi_mr(3)).

use std::rc::Rc;

use cpnet_fabric_sys as sys;

use super::domain::Domain;
use super::ep::Endpoint;
use super::error::{FabricError, Result};
use super::result;
use super::types::{LocalBuf, LocalBufMut, MrDesc, MrKey, RemoteMemory};

/// Access every region is registered with: local source/destination of RMA and
/// atomics, and remote read/write target.
pub const MR_ACCESS: u64 =
    sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE;

/// A caller-owned byte range registered with a domain (fi_mr(3) `fi_mr_reg`), with
/// access [`MR_ACCESS`] on an RMA domain, plus `FI_SEND | FI_RECV` on a message one. Deregistered (`fi_close`) on drop; the memory itself stays
/// the caller's.
#[derive(Debug)]
pub struct MemoryRegion {
    raw: *mut sys::fid_mr,
    ptr: *mut u8,
    len: usize,
    key: MrKey,
    desc: MrDesc,
    virt_addr: bool,
    _ep: Option<Rc<Endpoint>>,
    _domain: Rc<Domain>,
}

impl MemoryRegion {
    /// Registers `ptr..ptr + len`.
    ///
    /// If the provider uses `FI_MR_ENDPOINT`, the region is bound to `ep` and enabled
    /// (then `ep` is required); otherwise `ep` is ignored. Without `FI_MR_PROV_KEY`
    /// the domain requests a key unique within it.
    ///
    /// # Safety
    /// 1. `ptr..ptr + len` is one live allocation of host memory that stays allocated
    ///    until the region is dropped.
    /// 2. While registered, peers may read and write the range at any time (from their
    ///    own processes, or during this process's completion polling). Local code must
    ///    access it only through raw pointers or atomics, never through `&`/`&mut`
    ///    references that assume nobody else changes it.
    ///
    /// # Errors
    /// [`FabricError::Invalid`] if the provider needs `FI_MR_ENDPOINT` and `ep` is
    /// `None` or of another domain; failures of `fi_mr_reg`, `fi_mr_bind`,
    /// `fi_mr_enable` and `fi_mr_key`.
    pub unsafe fn register(
        domain: &Rc<Domain>,
        ptr: *mut u8,
        len: usize,
        ep: Option<&Rc<Endpoint>>,
    ) -> Result<MemoryRegion> {
        let info = domain.info();
        let mr_mode = info.mr_mode();
        let bind_ep = if mr_mode & sys::FI_MR_ENDPOINT != 0 {
            match ep {
                Some(ep) if Rc::ptr_eq(ep.domain(), domain) => Some(Rc::clone(ep)),
                _ => {
                    return Err(FabricError::invalid(
                        "fi_mr_bind",
                        "provider uses FI_MR_ENDPOINT: pass an endpoint of the same domain",
                    ));
                }
            }
        } else {
            None
        };
        let requested_key = if mr_mode & sys::FI_MR_PROV_KEY != 0 {
            0
        } else {
            domain.next_requested_key()
        };
        // Access for what the domain was opened for: RMA/atomics ([`MR_ACCESS`])
        // and, on a message domain, sends and receives.
        let caps = info.caps();
        let mut access = 0;
        if caps & (sys::FI_RMA | sys::FI_ATOMIC) != 0 {
            access |= MR_ACCESS;
        }
        if caps & sys::FI_MSG != 0 {
            access |= sys::FI_SEND | sys::FI_RECV;
        }
        // SAFETY: the domain is open; the range is live and outlives the region
        // (contract 1).
        let raw = unsafe {
            result::mr_reg(
                domain.as_raw(),
                ptr.cast(),
                len,
                access,
                0,
                requested_key,
                0,
            )
        }?;
        let mut mr = MemoryRegion {
            raw,
            ptr,
            len,
            key: MrKey(0),
            desc: MrDesc::NONE,
            virt_addr: info.mr_virt_addr(),
            _ep: bind_ep,
            _domain: Rc::clone(domain),
        };
        if let Some(ep) = &mr._ep {
            // SAFETY: `raw` is open; the endpoint is open and our Rc keeps it open
            // longer than the region.
            unsafe {
                result::mr_bind(raw, &mut (*ep.as_raw()).fid, 0)?;
                result::mr_enable(raw)?;
            }
        }
        // SAFETY: `raw` is open (and enabled if it had to be).
        unsafe {
            mr.key = MrKey(result::mr_key(raw)?);
            mr.desc = MrDesc(result::mr_desc(raw));
        }
        Ok(mr)
    }

    /// The key peers use (fi_mr(3) `fi_mr_key`).
    pub fn key(&self) -> MrKey {
        self.key
    }

    /// The descriptor for local buffers in this region (fi_mr(3) `fi_mr_desc`).
    pub fn desc(&self) -> MrDesc {
        self.desc
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length of the region, in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What a peer needs to address this region: `base` is our virtual address under
    /// `FI_MR_VIRT_ADDR` and 0 under offset addressing.
    pub fn remote(&self) -> RemoteMemory {
        RemoteMemory {
            base: if self.virt_addr {
                self.ptr.addr() as u64
            } else {
                0
            },
            len: self.len as u64,
            key: self.key,
        }
    }

    /// A local source buffer at byte `offset` of this region.
    ///
    /// # Panics
    /// If `offset > len`.
    pub fn local(&self, offset: usize) -> LocalBuf {
        assert!(
            offset <= self.len,
            "offset {offset} outside region of {} bytes",
            self.len
        );
        LocalBuf {
            ptr: self.ptr.wrapping_add(offset),
            desc: self.desc,
        }
    }

    /// A local destination buffer at byte `offset` of this region.
    ///
    /// # Panics
    /// If `offset > len`.
    pub fn local_mut(&self, offset: usize) -> LocalBufMut {
        assert!(
            offset <= self.len,
            "offset {offset} outside region of {} bytes",
            self.len
        );
        LocalBufMut {
            ptr: self.ptr.wrapping_add(offset),
            desc: self.desc,
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: `raw` is open and has no children; the endpoint it may be bound to is
        // still open (our Rc drops after this); `raw` is not used after this.
        if let Err(e) = unsafe { result::close(&mut (*self.raw).fid) } {
            tracing::warn!(error = %e, "closing memory region");
        }
    }
}
