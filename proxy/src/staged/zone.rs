//! Same-host staging zones: with the `shm` provider every peer runs on this
//! host, so a put's data need not travel inside the message. Each service
//! thread keeps a *zone* of host memory that the same thread of every peer
//! maps into its own process; the initiator's copy engine (or landing
//! agent) writes a piece straight into its slot of the target's zone and
//! sends only the 64-byte header, and the target copies the slot into its
//! heap. The provider's own copy of the payload (CMA or its bounce buffers,
//! made by the receiving proxy thread on the CPU) is gone: two DMA copies
//! remain, as in NCCL's shared-memory transport. `CPNET_STAGE_SHARED=0`
//! turns it off.
//!
//! # Layout and flow control
//!
//! A zone is one `memfd` (memfd_create(2)): a header page holding a random
//! token, then one *section* per source PE of `CPNET_STAGE_SLOTS` slots of
//! `CPNET_STAGE_SLOT` bytes (default 4 of 1 MiB), the section's length
//! rounded up to a page. Source PE `s` maps only its own section (`mmap`
//! of `/proc/<pid>/fd/<fd>` at offset `PAGE + s * stride`) after checking
//! the token, and registers it with CUDA. A put through a zone moves in
//! pieces of one slot, each a request with its credit; the slot is given
//! back by the `ACK` that names it ([`super::F_SLOT`]), and a piece that
//! finds no free slot waits as one without a credit does.
//!
//! Why slots of 1 MiB: each piece costs the proxy thread a copy call and
//! an event on each side, some 10-15 µs of driver time, so pieces of the
//! messages' 256 KiB held one block's alltoall over shm to 21 GB/s a
//! direction; slots of 1 MiB moved 16 MiB per pair in 466-481 µs against
//! 748-820 (two H200s, docs/results.md "Session 23").
//!
//! A peer whose zone cannot be mapped (another PID namespace, a `/proc`
//! that refuses) falls back to data in the message, with a warning.

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use crate::cuda::{CudaError, Registered};

/// Bytes of a page: the header's size and the sections' alignment.
pub(super) const PAGE: usize = 4096;

/// Bytes of a zone card ([`ZoneCard::to_bytes`]).
pub(super) const CARD_BYTES: usize = 36;

/// What a peer needs to map its section of a zone: what a PE sends the
/// others (the staged transport's endpoint exchange; the runtime's pair
/// staging, `runtime/src/gpu/pair_stage.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZoneCard {
    /// Random, written at offset 0 of the zone: a mapped file with another
    /// token is not this zone (a PID reused or seen from another namespace).
    pub(super) token: u64,
    /// The owning process and its descriptor of the memfd.
    pub(super) pid: u32,
    pub(super) fd: u32,
    /// Bytes between sections (a multiple of [`PAGE`]).
    pub(super) stride: u64,
    /// Slots per section and bytes per slot.
    pub(super) slots: u32,
    pub(super) slot: u64,
}

impl ZoneCard {
    /// Little-endian, [`CARD_BYTES`] bytes.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(CARD_BYTES);
        b.extend_from_slice(&self.token.to_le_bytes());
        b.extend_from_slice(&self.pid.to_le_bytes());
        b.extend_from_slice(&self.fd.to_le_bytes());
        b.extend_from_slice(&self.stride.to_le_bytes());
        b.extend_from_slice(&self.slots.to_le_bytes());
        b.extend_from_slice(&self.slot.to_le_bytes());
        b
    }

    /// The inverse of [`ZoneCard::to_bytes`]; `None` if `b` is not one.
    pub fn from_bytes(b: &[u8]) -> Option<ZoneCard> {
        if b.len() != CARD_BYTES {
            return None;
        }
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let c = ZoneCard { token: u64_at(0), pid: u32_at(8), fd: u32_at(12), stride: u64_at(16), slots: u32_at(24), slot: u64_at(28) };
        let fits = c.slots > 0
            && c.slot > 0
            && c.stride.is_multiple_of(PAGE as u64)
            && u64::from(c.slots).checked_mul(c.slot).is_some_and(|n| n <= c.stride);
        fits.then_some(c)
    }
}

/// Bytes of one section: `slots` slots of `slot` bytes, page-rounded.
pub(super) fn stride(slots: u32, slot: usize) -> usize {
    (slots as usize * slot).div_ceil(PAGE) * PAGE
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
pub(super) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    /// `mmap(MAP_SHARED)` of `len` bytes of `fd` at `offset` (page-aligned).
    fn new(fd: i32, offset: usize, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; nothing else is at
        // that address; `fd` is open for the duration of the call.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, offset as libc::off_t)
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    pub(super) fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `new`, unmapped once; its users (copies and the
        // CUDA registration) ended before (field order of the owners).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The memory of a zone, before CUDA registers it (the part unit tests
/// without a GPU can reach).
#[derive(Debug)]
pub(super) struct ZoneMem {
    pub(super) map: Mapping,
    /// Kept open for the zone's life: peers open it as `/proc/<pid>/fd/<fd>`.
    _fd: OwnedFd,
    pub(super) card: ZoneCard,
}

impl ZoneMem {
    /// A zone for `n_pes` source PEs of `slots` slots of `slot` bytes.
    pub(super) fn create(n_pes: i32, slots: u32, slot: usize) -> std::io::Result<ZoneMem> {
        let stride = stride(slots, slot);
        let len = PAGE + n_pes.max(1) as usize * stride;
        // SAFETY: a NUL-terminated name; flags are valid.
        let raw = unsafe { libc::memfd_create(c"cpnet-stage-zone".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: memfd_create returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: `fd` is an open memfd.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut token = 0u64;
        // SAFETY: writes at most 8 bytes into `token`.
        let got = unsafe { libc::getrandom((&raw mut token).cast(), 8, 0) };
        if got != 8 {
            token = super::mono_ns() ^ (u64::from(std::process::id()) << 32);
        }
        let map = Mapping::new(fd.as_raw_fd(), 0, len)?;
        // SAFETY: offset 0 of our fresh mapping; the zone is not shared yet.
        unsafe { map.ptr.cast::<u64>().write(token) };
        let card = ZoneCard {
            token,
            pid: std::process::id(),
            fd: fd.as_raw_fd() as u32,
            stride: stride as u64,
            slots,
            slot: slot as u64,
        };
        Ok(ZoneMem { map, _fd: fd, card })
    }

    /// Bytes of the whole zone.
    pub(super) fn len(&self) -> usize {
        self.map.len
    }

    /// Offset of slot `slot` of source `src`'s section.
    pub(super) fn slot_offset(&self, src: i32, slot: u32) -> usize {
        PAGE + src as usize * self.card.stride as usize + slot as usize * self.card.slot as usize
    }
}

/// Map source `me`'s section of the zone `card` describes (another
/// process's). Checks the token first.
pub(super) fn map_section(card: &ZoneCard, me: i32) -> std::io::Result<Mapping> {
    let path = format!("/proc/{}/fd/{}", card.pid, card.fd);
    let f = File::options().read(true).write(true).open(&path)?;
    let mut t = [0u8; 8];
    f.read_exact_at(&mut t, 0)?;
    if u64::from_le_bytes(t) != card.token {
        return Err(std::io::Error::other(format!("{path} is not the zone of this job (token differs)")));
    }
    let off = PAGE + me as usize * card.stride as usize;
    Mapping::new(f.as_raw_fd(), off, card.stride as usize)
}

/// A zone of this process, registered with CUDA (the copy engines read it,
/// the landing agent reads it at [`Zone::dev`]): each staged transport
/// thread's, and the runtime's pair staging.
#[derive(Debug)]
pub struct Zone {
    // Field order is drop order: unregister before unmapping.
    reg: Registered,
    pub(super) mem: ZoneMem,
}

impl Zone {
    /// Create and register a zone of `n_pes` sections (one per source PE)
    /// of `slots` slots of `slot` bytes, with the CUDA context current.
    ///
    /// # Errors
    /// `memfd_create`, `ftruncate`, `mmap`, `cuMemHostRegister`, as text.
    pub fn new(n_pes: i32, slots: u32, slot: usize) -> Result<Zone, String> {
        let mem = ZoneMem::create(n_pes, slots, slot).map_err(|e| format!("memfd zone: {e}"))?;
        // SAFETY: the mapping is live and page-aligned, owned by `mem`, which
        // drops after `reg` (field order).
        let reg = unsafe { Registered::new(mem.map.ptr(), mem.len(), "cuMemHostRegister (staging zone)") }
            .map_err(|e: CudaError| e.to_string())?;
        Ok(Zone { reg, mem })
    }

    /// Host address of slot `slot` of source `src`.
    pub(super) fn host(&self, src: i32, slot: u32) -> *mut u8 {
        // SAFETY: inside the mapping (callers check src < n_pes, slot < slots).
        unsafe { self.mem.map.ptr().add(self.mem.slot_offset(src, slot)) }
    }

    /// Device address of slot `slot` of source `src` (`src < n_pes`, `slot
    /// < slots`), as kernels of the context current at [`Zone::new`] see it.
    pub fn dev(&self, src: i32, slot: u32) -> u64 {
        self.reg.dev_ptr() + self.mem.slot_offset(src, slot) as u64
    }

    /// Slots per section (`CPNET_STAGE_SLOTS`).
    pub(super) fn slots(&self) -> u32 {
        self.mem.card.slots
    }

    /// What a peer needs to map its section ([`PeerZone::open`]).
    pub fn card(&self) -> ZoneCard {
        self.mem.card
    }
}

/// Our section of a peer's zone, mapped and registered.
#[derive(Debug)]
pub struct PeerZone {
    // Field order is drop order: unregister before unmapping.
    reg: Registered,
    map: Mapping,
    slot: usize,
}

impl PeerZone {
    /// Map and register source `me`'s section of the zone `card` describes
    /// (another process's, through `/proc/<pid>/fd/<fd>` after checking its
    /// token), with the CUDA context current.
    ///
    /// # Errors
    /// The open, a token that differs, `mmap`, `cuMemHostRegister`, as text.
    pub fn open(card: &ZoneCard, me: i32) -> Result<PeerZone, String> {
        let map = map_section(card, me).map_err(|e| format!("mapping /proc/{}/fd/{}: {e}", card.pid, card.fd))?;
        // SAFETY: the mapping is live and page-aligned, owned by the value,
        // which drops `reg` first (field order).
        let reg = unsafe { Registered::new(map.ptr(), map.len, "cuMemHostRegister (peer staging zone)") }
            .map_err(|e| e.to_string())?;
        Ok(PeerZone { reg, map, slot: card.slot as usize })
    }

    /// Host address of our slot `slot` in the peer's zone.
    pub(super) fn host(&self, slot: u32) -> *mut u8 {
        // SAFETY: inside the section (slot < slots, checked by the caller's
        // free list, whose slots are 0..slots).
        unsafe { self.map.ptr().add(slot as usize * self.slot) }
    }

    /// Device address of our slot `slot` (`< slots`) in the peer's zone, as
    /// kernels of the context current at [`PeerZone::open`] see it.
    pub fn dev(&self, slot: u32) -> u64 {
        self.reg.dev_ptr() + (slot as usize * self.slot) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn card_round_trips_and_rejects_what_does_not_fit() {
        let c = ZoneCard { token: 0x1234_5678_9abc_def0, pid: 42, fd: 7, stride: 2 << 20, slots: 8, slot: 256 << 10 };
        assert_eq!(ZoneCard::from_bytes(&c.to_bytes()), Some(c));
        assert_eq!(c.to_bytes().len(), CARD_BYTES);
        assert_eq!(ZoneCard::from_bytes(&c.to_bytes()[..CARD_BYTES - 1]), None, "truncated");
        let too_many = ZoneCard { slots: 9, ..c };
        assert_eq!(ZoneCard::from_bytes(&too_many.to_bytes()), None, "slots past the stride");
        let odd = ZoneCard { stride: (2 << 20) + 1, ..c };
        assert_eq!(ZoneCard::from_bytes(&odd.to_bytes()), None, "stride not page-aligned");
        assert_eq!(ZoneCard::from_bytes(&ZoneCard { slots: 0, ..c }.to_bytes()), None);
    }

    #[test]
    fn stride_rounds_to_pages() {
        assert_eq!(stride(8, 256 << 10), 2 << 20);
        assert_eq!(stride(3, 1000), PAGE);
        assert_eq!(stride(5, 1000), 2 * PAGE);
    }

    #[test]
    fn a_peer_maps_its_section_and_sees_the_owners_writes() {
        let z = ZoneMem::create(3, 4, 1000).unwrap();
        assert_eq!(z.len(), PAGE + 3 * PAGE);
        for src in 0..3 {
            let m = map_section(&z.card, src).unwrap();
            for slot in 0..4u32 {
                let off = z.slot_offset(src, slot);
                // SAFETY: inside both mappings of the same memfd.
                unsafe {
                    m.ptr().add(slot as usize * 1000).write(src as u8 * 10 + slot as u8 + 1);
                    assert_eq!(z.map.ptr().add(off).read(), src as u8 * 10 + slot as u8 + 1);
                }
            }
        }
    }

    #[test]
    fn a_wrong_token_is_refused() {
        let z = ZoneMem::create(2, 2, 4096).unwrap();
        let bad = ZoneCard { token: z.card.token ^ 1, ..z.card };
        let e = map_section(&bad, 1).unwrap_err();
        assert!(e.to_string().contains("token differs"), "{e}");
        let gone = ZoneCard { fd: 100_000, ..z.card };
        assert!(map_section(&gone, 1).is_err());
    }
}
