//! `Endpoint`: a reliable-datagram endpoint and its one-sided operations
//! (fi_endpoint(3), fi_rma(3), fi_atomic(3)).

use std::ffi::c_void;
use std::rc::Rc;

use cpnet_fabric_sys as sys;

use super::av::AddressVector;
use super::cq::{CompletionQueue, OpContext};
use super::domain::Domain;
use super::error::{FabricError, Result};
use super::result::{self, AtomicClass, Post};
#[cfg(doc)]
use super::types::RemoteMemory;
use super::types::{AtomicOp, AtomicType, LocalBuf, LocalBufMut, RemoteTarget};

/// An enabled `FI_EP_RDM` endpoint with one completion queue (for transmits and
/// receives, every operation completing: no `FI_SELECTIVE_COMPLETION`) and one
/// address vector.
///
/// Every operation is non-blocking and takes a `u64` user context that comes back
/// from [`CompletionQueue::poll`] exactly once, as a completion or as a
/// [`FabricError::Completion`]. When the provider is out of resources, the call
/// returns [`Post::Again`]: poll the completion queues and post again. No call here
/// blocks.
///
/// Operations are one-sided: the target does not take part, but under
/// `FI_PROGRESS_MANUAL` its completion queue must be polled for software-emulated
/// operations (rxm atomics) to make progress.
#[derive(Debug)]
pub struct Endpoint {
    raw: *mut sys::fid_ep,
    name: Vec<u8>,
    /// Whether contexts are boxed [`OpContext`]s (the provider needs `FI_CONTEXT`).
    boxed: bool,
    domain: Rc<Domain>,
    _cq: Rc<CompletionQueue>,
    _av: Rc<AddressVector>,
}

impl Endpoint {
    /// Opens an endpoint, binds `cq` (`FI_TRANSMIT | FI_RECV`) and `av`, enables it
    /// and reads its address (fi_endpoint(3), fi_cm(3) `fi_getname`).
    ///
    /// # Errors
    /// [`FabricError::Invalid`] if `cq` or `av` belong to another domain; failures of
    /// `fi_endpoint`, `fi_ep_bind`, `fi_enable` and `fi_getname`.
    pub fn open(
        domain: &Rc<Domain>,
        cq: &Rc<CompletionQueue>,
        av: &Rc<AddressVector>,
    ) -> Result<Rc<Endpoint>> {
        if !Rc::ptr_eq(cq.domain(), domain) || !Rc::ptr_eq(av.domain(), domain) {
            return Err(FabricError::invalid(
                "fi_ep_bind",
                "the completion queue and address vector must belong to the endpoint's domain",
            ));
        }
        // SAFETY: the domain is open and its info is the fi_info it was opened with.
        let raw = unsafe { result::endpoint(domain.as_raw(), domain.info().as_raw()) }?;
        let mut ep = Endpoint {
            raw,
            name: Vec::new(),
            boxed: domain.info().needs_op_context(),
            domain: Rc::clone(domain),
            _cq: Rc::clone(cq),
            _av: Rc::clone(av),
        };
        // SAFETY: `raw` is open and not yet enabled; the CQ and AV are open objects of
        // the same domain, and the Rcs in `ep` keep them open longer than the endpoint.
        unsafe {
            result::ep_bind(
                raw,
                &mut (*cq.as_raw()).fid,
                sys::FI_TRANSMIT | sys::FI_RECV,
            )?;
            result::ep_bind(raw, &mut (*av.as_raw()).fid, 0)?;
            result::enable(raw)?;
            ep.name = result::getname(&mut (*raw).fid)?;
        }
        Ok(Rc::new(ep))
    }

    /// This endpoint's address, to be inserted into peers' address vectors with
    /// [`AddressVector::insert`]. Its format is the provider's (a string for shm, a
    /// `sockaddr` for tcp).
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The domain this endpoint belongs to.
    pub fn domain(&self) -> &Rc<Domain> {
        &self.domain
    }

    /// The raw handle, for the thin layer. Valid while `self` lives.
    pub fn as_raw(&self) -> *mut sys::fid_ep {
        self.raw
    }

    /// Whether the endpoint supports atomic `op` on `ty` for the call family `class`,
    /// and for how many elements at most (fi_atomic(3) `fi_atomicvalid`,
    /// `fi_fetch_atomicvalid`, `fi_compare_atomicvalid`). `Ok(None)`: not supported.
    ///
    /// # Errors
    /// Failures of the validity call other than "not supported".
    pub fn atomic_valid(
        &self,
        class: AtomicClass,
        op: AtomicOp,
        ty: AtomicType,
    ) -> Result<Option<usize>> {
        // SAFETY: the endpoint is open.
        unsafe { result::atomic_valid(self.raw, class, ty.to_sys(), op.to_sys()) }
    }

    /// Whether [`Endpoint::atomic_valid`] grants at least one element of
    /// `op` on `ty` for `class`; a failed validity call counts as no.
    pub fn atomic_supported(&self, class: AtomicClass, op: AtomicOp, ty: AtomicType) -> bool {
        matches!(self.atomic_valid(class, op, ty), Ok(Some(n)) if n >= 1)
    }

    /// Frees the context of a post that did not queue an operation.
    fn settle(&self, ctx: *mut c_void, r: Result<Post>) -> Result<Post> {
        if !matches!(r, Ok(Post::Posted)) {
            // SAFETY: `ctx` came from OpContext::into_raw with `self.boxed` and the
            // provider did not take it, so this is its only release.
            unsafe { OpContext::from_raw(ctx, self.boxed) };
        }
        r
    }

    /// RMA write of `len` bytes from `src` to `dst` (fi_rma(3) `fi_write`).
    ///
    /// Completes (locally) when `src` may be reused; the data is then at the target
    /// as far as the provider's default completion semantic guarantees (see
    /// [`Endpoint::writemsg`] with `FI_DELIVERY_COMPLETE` for more).
    ///
    /// # Safety
    /// 1. `src.ptr..src.ptr + len` is readable, lies in a [`MemoryRegion`] of this
    ///    domain whose descriptor is `src.desc`, and stays allocated and unmodified
    ///    until the completion for `ctx` is read. (On [`Post::Again`] or an error
    ///    nothing was queued and the buffer is free at once.)
    /// 2. `dst.peer` came from the address vector bound to this endpoint.
    /// 3. `dst` addresses `len` bytes inside a region the peer registered, with that
    ///    region's key (build it with [`RemoteMemory::target`]). Providers differ in
    ///    checking this: `tcp;ofi_rxm` rejects a wrong key or address at the target
    ///    (reads, atomics and delivery-complete writes then complete in error; plain
    ///    writes are dropped silently; the connection is lost), but `shm` 1.17 does
    ///    not check at all, so a wrong target there corrupts the peer's memory or
    ///    never completes.
    ///
    /// # Errors
    /// `fi_write` failures other than `-FI_EAGAIN`.
    ///
    /// [`MemoryRegion`]: super::MemoryRegion
    pub unsafe fn write(
        &self,
        src: LocalBuf,
        len: usize,
        dst: RemoteTarget,
        ctx: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; the buffer and peer satisfy the
        // caller's contract (1, 2); `c` stays valid until its completion is read.
        let r = unsafe {
            result::write(
                self.raw,
                src.ptr.cast(),
                len,
                src.desc.0,
                dst.peer.0,
                dst.addr,
                dst.key.0,
                c,
            )
        };
        self.settle(c, r)
    }

    /// RMA write with operation flags (fi_rma(3) `fi_writemsg`): `FI_FENCE`,
    /// `FI_DELIVERY_COMPLETE`, `FI_INJECT_COMPLETE`, `FI_TRANSMIT_COMPLETE`,
    /// `FI_INJECT`, ... as the provider supports (unsupported flags fail with
    /// `-FI_EINVAL`/`-FI_EOPNOTSUPP` or are ignored, per provider). `FI_COMPLETION` is
    /// always added so the operation reports to the completion queue.
    ///
    /// # Safety
    /// 1. As [`Endpoint::write`] (with `FI_INJECT` the buffer is free on return).
    ///
    /// # Errors
    /// `fi_writemsg` failures other than `-FI_EAGAIN`.
    pub unsafe fn writemsg(
        &self,
        src: LocalBuf,
        len: usize,
        dst: RemoteTarget,
        ctx: u64,
        flags: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        let iov = sys::iovec {
            iov_base: src.ptr.cast_mut().cast(),
            iov_len: len,
        };
        let mut desc = src.desc.0;
        let rma = sys::fi_rma_iov {
            addr: dst.addr,
            len,
            key: dst.key.0,
        };
        let msg = sys::fi_msg_rma {
            msg_iov: &iov,
            desc: &mut desc,
            iov_count: 1,
            addr: dst.peer.0,
            rma_iov: &rma,
            rma_iov_count: 1,
            context: c,
            data: 0,
        };
        // SAFETY: as in `write`; the message and its iov arrays only need to live for
        // the call (cpnet never accepts FI_ASYNC_IOV mode).
        let r = unsafe { result::writemsg(self.raw, &msg, flags | sys::FI_COMPLETION) };
        self.settle(c, r)
    }

    /// RMA write of `src` to `dst` that returns the buffer at once and writes no
    /// completion (fi_rma(3) `fi_inject_write`). With [`Post::Posted`] the data is on
    /// its way: nothing reports when it lands. Order a later operation behind it
    /// (`FI_ORDER_RMA_RAW` and a read, for instance) to learn that.
    ///
    /// # Safety
    /// 1. `src.len()` is at most the endpoint's inject size
    ///    ([`Info::inject_size`](super::Info::inject_size)).
    /// 2. `dst.peer` came from the address vector bound to this endpoint, and `dst`
    ///    addresses `src.len()` bytes inside a region the peer registered, with its
    ///    key, as in [`Endpoint::write`].
    ///
    /// # Errors
    /// `fi_inject_write` failures other than `-FI_EAGAIN`.
    pub unsafe fn inject_write(&self, src: &[u8], dst: RemoteTarget) -> Result<Post> {
        // SAFETY: the endpoint is open and enabled; `src` is readable for the call and
        // not larger than the inject size, the target per contract (1, 2).
        unsafe {
            result::inject_write(
                self.raw,
                src.as_ptr().cast(),
                src.len(),
                dst.peer.0,
                dst.addr,
                dst.key.0,
            )
        }
    }

    /// RMA read of `len` bytes from `src` into `dst` (fi_rma(3) `fi_read`). The data is
    /// in `dst` when the completion is read.
    ///
    /// # Safety
    /// 1. `dst.ptr..dst.ptr + len` is writable, lies in a [`MemoryRegion`] of this
    ///    domain whose descriptor is `dst.desc`, stays allocated until the completion
    ///    for `ctx` is read, and nobody else reads or writes it until then.
    /// 2. `src.peer` came from the address vector bound to this endpoint.
    /// 3. `src` addresses `len` bytes inside a region the peer registered, with its
    ///    key, as in [`Endpoint::write`].
    ///
    /// # Errors
    /// `fi_read` failures other than `-FI_EAGAIN`.
    ///
    /// [`MemoryRegion`]: super::MemoryRegion
    pub unsafe fn read(
        &self,
        dst: LocalBufMut,
        len: usize,
        src: RemoteTarget,
        ctx: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; buffer and peer per contract (1, 2).
        let r = unsafe {
            result::read(
                self.raw,
                dst.ptr.cast(),
                len,
                dst.desc.0,
                src.peer.0,
                src.addr,
                src.key.0,
                c,
            )
        };
        self.settle(c, r)
    }

    /// Atomic update of `count` elements of type `ty` at `dst` with the operands at
    /// `src` (fi_atomic(3) `fi_atomic`). Atomic with respect to other libfabric atomics
    /// on the same words through the same provider, not to CPU stores at the target.
    ///
    /// # Safety
    /// 1. `src.ptr` points to `count` elements of `ty`, with the rules of
    ///    [`Endpoint::write`] for the buffer.
    /// 2. `dst.peer` came from the address vector bound to this endpoint.
    /// 3. `dst` addresses `count` elements of `ty` inside a region the peer registered,
    ///    with its key, naturally aligned, as in [`Endpoint::write`].
    ///
    /// # Errors
    /// `fi_atomic` failures other than `-FI_EAGAIN`, e.g. `-FI_EOPNOTSUPP` for an
    /// operation the provider does not support (check with
    /// [`Endpoint::atomic_valid`]).
    pub unsafe fn atomic(
        &self,
        op: AtomicOp,
        ty: AtomicType,
        src: LocalBuf,
        count: usize,
        dst: RemoteTarget,
        ctx: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; buffer and peer per contract (1, 2).
        let r = unsafe {
            result::atomic(
                self.raw,
                src.ptr.cast(),
                count,
                src.desc.0,
                dst.peer.0,
                dst.addr,
                dst.key.0,
                ty.to_sys(),
                op.to_sys(),
                c,
            )
        };
        self.settle(c, r)
    }

    /// Atomic update with operation flags (fi_atomic(3) `fi_atomicmsg`), e.g.
    /// `FI_FENCE` or `FI_DELIVERY_COMPLETE` where the provider supports them.
    /// `FI_COMPLETION` is always added.
    ///
    /// # Safety
    /// 1. As [`Endpoint::atomic`].
    ///
    /// # Errors
    /// `fi_atomicmsg` failures other than `-FI_EAGAIN`.
    #[allow(clippy::too_many_arguments)] // an atomic is op, type, operand, count, target
    pub unsafe fn atomicmsg(
        &self,
        op: AtomicOp,
        ty: AtomicType,
        src: LocalBuf,
        count: usize,
        dst: RemoteTarget,
        ctx: u64,
        flags: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        let ioc = sys::fi_ioc {
            addr: src.ptr.cast_mut().cast(),
            count,
        };
        let mut desc = src.desc.0;
        let rma = sys::fi_rma_ioc {
            addr: dst.addr,
            count,
            key: dst.key.0,
        };
        let msg = sys::fi_msg_atomic {
            msg_iov: &ioc,
            desc: &mut desc,
            iov_count: 1,
            addr: dst.peer.0,
            rma_iov: &rma,
            rma_iov_count: 1,
            datatype: ty.to_sys(),
            op: op.to_sys(),
            context: c,
            data: 0,
        };
        // SAFETY: as in `atomic`; the message only needs to live for the call.
        let r = unsafe { result::atomicmsg(self.raw, &msg, flags | sys::FI_COMPLETION) };
        self.settle(c, r)
    }

    /// Fetching atomic (fi_atomic(3) `fi_fetch_atomic`): applies `op` with the
    /// operands at `src` to `count` elements at `dst` and writes the previous values to
    /// `result`. `AtomicOp::Read` ignores the operand (`src` must still be a valid
    /// pointer); `AtomicOp::Write` is a swap.
    ///
    /// # Safety
    /// 1. `src` as in [`Endpoint::atomic`] (`count` elements of `ty`).
    /// 2. `result.ptr` has room for `count` elements of `ty`, with the rules of
    ///    [`Endpoint::read`] for the buffer.
    /// 3. `dst.peer` came from the address vector bound to this endpoint, and `dst`
    ///    addresses `count` elements of `ty` as in [`Endpoint::atomic`].
    ///
    /// # Errors
    /// `fi_fetch_atomic` failures other than `-FI_EAGAIN`.
    #[allow(clippy::too_many_arguments)] // an atomic is op, type, operand, result, count, target
    pub unsafe fn fetch_atomic(
        &self,
        op: AtomicOp,
        ty: AtomicType,
        src: LocalBuf,
        result: LocalBufMut,
        count: usize,
        dst: RemoteTarget,
        ctx: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; buffers and peer per contract.
        let r = unsafe {
            result::fetch_atomic(
                self.raw,
                src.ptr.cast(),
                count,
                src.desc.0,
                result.ptr.cast(),
                result.desc.0,
                dst.peer.0,
                dst.addr,
                dst.key.0,
                ty.to_sys(),
                op.to_sys(),
                c,
            )
        };
        self.settle(c, r)
    }

    /// Compare-atomic (fi_atomic(3) `fi_compare_atomic`): for `AtomicOp::Cswap`, each
    /// element at `dst` that equals the one at `compare` is replaced by the one at
    /// `src`; the previous values go to `result`.
    ///
    /// # Safety
    /// 1. `src` and `compare` as `src` in [`Endpoint::atomic`] (`count` elements each).
    /// 2. `result` as in [`Endpoint::fetch_atomic`].
    /// 3. `dst.peer` came from the address vector bound to this endpoint, and `dst`
    ///    addresses `count` elements of `ty` as in [`Endpoint::atomic`].
    ///
    /// # Errors
    /// `fi_compare_atomic` failures other than `-FI_EAGAIN`.
    #[allow(clippy::too_many_arguments)] // op, type, operand, compare, result, count, target
    pub unsafe fn compare_atomic(
        &self,
        op: AtomicOp,
        ty: AtomicType,
        src: LocalBuf,
        compare: LocalBuf,
        result: LocalBufMut,
        count: usize,
        dst: RemoteTarget,
        ctx: u64,
    ) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; buffers and peer per contract.
        let r = unsafe {
            result::compare_atomic(
                self.raw,
                src.ptr.cast(),
                count,
                src.desc.0,
                compare.ptr.cast(),
                compare.desc.0,
                result.ptr.cast(),
                result.desc.0,
                dst.peer.0,
                dst.addr,
                dst.key.0,
                ty.to_sys(),
                op.to_sys(),
                c,
            )
        };
        self.settle(c, r)
    }

    /// Sends `len` bytes from `src` to `dest` as one message (fi_msg(3) `fi_send`);
    /// the peer receives it into a buffer it posted with [`Endpoint::recv`]. The
    /// completion means `src` may be reused (the provider's default completion).
    ///
    /// # Safety
    /// 1. As [`Endpoint::write`] for `src` and `len`; `dest` came from this
    ///    endpoint's address vector.
    /// 2. The endpoint was opened with `FI_MSG` (an [`InfoRequest`](super::InfoRequest)
    ///    with [`MSG_CAPS`](super::MSG_CAPS)).
    ///
    /// # Errors
    /// `fi_send` failures other than `-FI_EAGAIN`.
    pub unsafe fn send(&self, src: LocalBuf, len: usize, dest: super::types::FiAddr, ctx: u64) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; buffer and peer per contract.
        let r = unsafe { result::send(self.raw, src.ptr.cast(), len, src.desc.0, dest.0, c) };
        self.settle(c, r)
    }

    /// Posts `dst` (`len` bytes) to receive one message from any peer (fi_msg(3)
    /// `fi_recv` with `FI_ADDR_UNSPEC`). Its completion reports `ctx`; a message
    /// longer than `len` completes in error (`FI_ETRUNC`).
    ///
    /// # Safety
    /// 1. `dst.ptr..dst.ptr + len` is writable, lies in a registered region of this
    ///    domain whose descriptor is `dst.desc`, and is not touched by anyone else
    ///    until the completion for `ctx` is read.
    /// 2. The endpoint was opened with `FI_MSG`.
    ///
    /// # Errors
    /// `fi_recv` failures other than `-FI_EAGAIN`.
    pub unsafe fn recv(&self, dst: LocalBufMut, len: usize, ctx: u64) -> Result<Post> {
        let c = OpContext::into_raw(ctx, self.boxed);
        // SAFETY: the endpoint is open and enabled; buffer per contract.
        let r = unsafe { result::recv(self.raw, dst.ptr.cast(), len, dst.desc.0, sys::FI_ADDR_UNSPEC, c) };
        self.settle(c, r)
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: memory regions bound to us hold an Rc, so they are closed; the CQ and
        // AV we are bound to are still open (our Rcs drop after this); `raw` is not
        // used after this.
        if let Err(e) = unsafe { result::close(&mut (*self.raw).fid) } {
            tracing::warn!(error = %e, "closing endpoint");
        }
    }
}
