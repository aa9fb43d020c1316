//! Executing a validated [`Op`] on this PE's own host heap: the loopback
//! path for operations whose target is the local PE (and the whole path of a
//! single-PE job). Atomics use the heap words as Rust atomics, so they are
//! atomic with respect to each other and to CPU work-groups' local waits.

use cpnet_device::cpu::{HeapView, SymAddr};
use cpnet_device::layout::{AmoOp, AmoType, ErrorCode, SignalOp};
use cpnet_device::ring::Outcome;
use cpnet_device::sync::Ordering;

use crate::decode::{GetDst, Op, PutSrc};

fn copy_within(heap: &HeapView, dst: u64, src: u64, size: u64) -> Result<(), ErrorCode> {
    heap.check(SymAddr(dst), size)?;
    heap.check(SymAddr(src), size)?;
    // SAFETY: both ranges are inside the heap (checked); `copy` allows
    // overlap. Concurrent readers of the destination see unspecified bytes
    // until the operation completes, as OpenSHMEM specifies for puts.
    unsafe { core::ptr::copy(heap.base().add(src as usize), heap.base().add(dst as usize), size as usize) };
    Ok(())
}

fn put(heap: &HeapView, dst: u64, src: PutSrc, size: u64) -> Result<(), ErrorCode> {
    match src {
        PutSrc::Heap(src) => copy_within(heap, dst, src, size),
        PutSrc::Inline(bits) => heap.write_bytes(SymAddr(dst), &bits.to_le_bytes()[..size as usize]),
        // Payload slots belong to GPU PEs' queues; a CPU PE's never has them.
        PutSrc::Payload | PutSrc::Host { .. } => Err(ErrorCode::BadOp),
    }
}

/// Apply an AMO to a local heap word; returns the old value (zero-extended).
///
/// # Errors
/// `BadAddr` / `BadAlign` (the decoder has already checked both).
pub fn amo_local(heap: &HeapView, ty: AmoType, op: AmoOp, dst: u64, value: u64, cond: u64) -> Result<u64, ErrorCode> {
    // AcqRel for read-modify-writes, Release for set, Acquire for fetch:
    // each pairs with the Acquire loads of local waiters (wait_until,
    // signal_wait_until) and with other AMOs on the same word.
    macro_rules! run {
        ($a:expr, $t:ty, $s:ty) => {{
            let a = $a;
            let signed = matches!(ty, AmoType::Int32 | AmoType::Int64);
            let v = value as $t;
            let c = cond as $t;
            let old = match op {
                AmoOp::Fetch => a.load(Ordering::Acquire),
                AmoOp::Set => {
                    a.store(v, Ordering::Release);
                    0
                }
                AmoOp::Swap => a.swap(v, Ordering::AcqRel),
                AmoOp::CompareSwap => match a.compare_exchange(c, v, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(o) | Err(o) => o,
                },
                AmoOp::FetchAdd | AmoOp::Add => a.fetch_add(v, Ordering::AcqRel),
                AmoOp::FetchAnd | AmoOp::And => a.fetch_and(v, Ordering::AcqRel),
                AmoOp::FetchOr | AmoOp::Or => a.fetch_or(v, Ordering::AcqRel),
                AmoOp::FetchXor | AmoOp::Xor => a.fetch_xor(v, Ordering::AcqRel),
                AmoOp::FetchMin | AmoOp::Min if signed => {
                    // CAS loop on the signed view (AcqRel on success, Acquire
                    // on a failed compare: pairs as the other RMWs above).
                    match a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| ((v as $s) < (o as $s)).then_some(v)) {
                        Ok(o) | Err(o) => o,
                    }
                }
                AmoOp::FetchMin | AmoOp::Min => a.fetch_min(v, Ordering::AcqRel),
            };
            u64::from(old)
        }};
    }
    Ok(match ty.size() {
        4 => run!(heap.atomic_u32(SymAddr(dst))?, u32, i32),
        _ => run!(heap.atomic_u64(SymAddr(dst))?, u64, i64),
    })
}

/// Apply `op`, whose target is this PE, to `heap`; the outcome to report.
/// Ordering ops (fence, quiet) are trivially satisfied: every local
/// operation is complete when this returns. Barrier is not local and is
/// rejected here (`BadOp`); the service handles it.
pub fn apply_local(heap: &HeapView, op: &Op) -> Outcome {
    let r = match *op {
        Op::Nop | Op::Fence | Op::Quiet => Ok(Outcome::Done),
        Op::BarrierAll => Err(ErrorCode::BadOp),
        Op::Put { dst, src, size, .. } => put(heap, dst, src, size).map(|_| Outcome::Done),
        Op::Get { dst: GetDst::Heap(dst), src, size, .. } => copy_within(heap, dst, src, size).map(|_| Outcome::Done),
        Op::Get { dst: GetDst::Result, src, size, .. } => {
            let mut b = [0u8; 8];
            heap.read_bytes(SymAddr(src), &mut b[..size as usize]).map(|_| Outcome::Value(u64::from_le_bytes(b)))
        }
        Op::PutSignal { dst, src, size, sig, signal, op, .. } => put(heap, dst, src, size).and_then(|_| {
            // Release: the data above is visible to whoever acquires the signal.
            let amo = match op {
                SignalOp::Set => AmoOp::Set,
                SignalOp::Add => AmoOp::Add,
            };
            amo_local(heap, AmoType::Uint64, amo, sig, signal, 0).map(|_| Outcome::Done)
        }),
        Op::Amo { ty, op, dst, value, cond, .. } => amo_local(heap, ty, op, dst, value, cond).map(|old| {
            if op.fetches() { Outcome::Value(old) } else { Outcome::Done }
        }),
    };
    r.unwrap_or_else(Outcome::Failed)
}
