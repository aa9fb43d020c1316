//! libfabric transport plumbing: safe handles over `cpnet-fabric-sys`.
//!
//! Three layers, as in cudarc:
//!
//! * `cpnet_fabric_sys`: raw bindgen bindings plus the C shim for libfabric's
//!   `static inline` calls.
//! * [`result`]: one `unsafe fn` per libfabric call, returning [`Result`] with the
//!   call's name and `fi_strerror` text on failure; posting calls return
//!   [`Post::Again`] for `-FI_EAGAIN`.
//! * RAII types: [`Info`] → [`Fabric`] → [`Domain`] → [`CompletionQueue`],
//!   [`AddressVector`] → [`Endpoint`] → [`MemoryRegion`]. Each child holds an `Rc` to
//!   what it depends on and closes itself with `fi_close` on drop, so children always
//!   close before parents.
//!
//! What cpnet asks providers for (see [`InfoRequest`]): `FI_EP_RDM` endpoints with
//! `FI_RMA | FI_ATOMIC` (initiator and target), `FI_THREAD_DOMAIN`,
//! `FI_PROGRESS_MANUAL`, `FI_AV_TABLE`, `FI_ORDER_SAS`, and any of the memory
//! registration modes in [`MR_MODE_SUPPORTED`]. Completion queues are polled; progress
//! is made only while polling, on both the initiator and the target.
//!
//! Providers tested on loopback (one process, two domains), libfabric 1.17:
//!
//! * `shm`: needs no setup. Grants `mr_mode = FI_MR_VIRT_ADDR`, `msg_order =
//!   FI_ORDER_SAS`, atomics SUM/MIN/MAX/BAND/BOR/BXOR/WRITE (+READ fetching,
//!   CSWAP/MSWAP compare) on 32/64-bit integers. Plain writes land without the target
//!   polling, but atomics are applied, and fetching atomics complete, only while the
//!   target polls its queue. **shm does not check keys or bounds**: a plain write with
//!   a wrong key lands, and a fetching atomic or delivery-complete write with one never
//!   completes. Always build targets with [`RemoteMemory::target`].
//! * `tcp;ofi_rxm`: bind to loopback with
//!   [`InfoRequest::with_src_node`]`("127.0.0.1")` (or set `FI_TCP_IFACE=lo`);
//!   otherwise it picks the first non-loopback interface. Grants `mr_mode = 0` (offset
//!   addressing, keys chosen by us), `msg_order` SAS/RAS/WAS plus RMA RAR/RAW/WAW and
//!   ATOMIC RAR/RAW/WAW (no WAR), the same atomics as shm, emulated with messages that
//!   the target executes while polling its queue. A plain write completes at the
//!   initiator before it lands, and lands only when the target polls. A wrong key or
//!   address is rejected at the target: reads, atomics and `FI_DELIVERY_COMPLETE`
//!   writes complete in error, plain writes are dropped silently, and the connection
//!   to that peer is lost (later operations fail with `-FI_ENOTCONN`).
//!
//! Completion of a plain write or atomic therefore means "the local buffer may be
//! reused", not "visible at the target"; use `FI_DELIVERY_COMPLETE`
//! ([`Endpoint::writemsg`], [`Endpoint::atomicmsg`]) or a fetching operation where
//! visibility matters.
//!
//! Threading: `FI_THREAD_DOMAIN` means every object of a domain is used from one
//! thread at a time; the types are `!Send + !Sync` to make that a compile-time fact.
//! See [`Domain`] for handing a whole set to another thread.

mod av;
mod cq;
mod domain;
mod ep;
mod error;
mod info;
mod mr;
pub mod result;
mod types;

#[cfg(test)]
mod tests;

/// The `fi_writemsg`/`fi_atomicmsg` flag `FI_DELIVERY_COMPLETE` (fi_cq(3)
/// "Completion semantics"): the completion means "visible at the target".
pub const DELIVERY_COMPLETE: u64 = cpnet_fabric_sys::FI_DELIVERY_COMPLETE;

/// The ordering bit `FI_ORDER_RMA_RAW` (fi_getinfo(3)): an RMA read is
/// processed after the RMA writes issued before it to the same peer.
pub const ORDER_RMA_RAW: u64 = cpnet_fabric_sys::FI_ORDER_RMA_RAW;

pub use av::AddressVector;
pub use cq::CompletionQueue;
pub use domain::{Domain, Fabric};
pub use ep::Endpoint;
pub use error::{FabricError, Result, strerror};
pub use info::{CAPS, Info, InfoRequest, MODE_SUPPORTED, MR_MODE_SUPPORTED, MSG_CAPS, native_tcp_rdm};
pub use mr::{MR_ACCESS, MemoryRegion};
pub use result::{AtomicClass, Post};
pub use types::{
    AtomicOp, AtomicType, FiAddr, LocalBuf, LocalBufMut, MrDesc, MrKey, RemoteMemory, RemoteTarget,
};
