//! The staged transport's wire format: the 64-byte header every message
//! starts with, the message kinds and flags, the completion-context tags,
//! and the landing records built from operations (`cpnet/agent.cuh`).

use cpnet_device::layout::{
    AgentRec, AmoOp, AmoType, CPNET_AGENT_F_INLINE, CPNET_AGENT_F_SIGNAL, CPNET_AGENT_K_COPY_OUT, CPNET_AGENT_K_PUT,
    SignalOp,
};

use super::HDR_BYTES;
use crate::decode::Op;

/// A message header (the first 64 bytes of every message). Little-endian,
/// the same on both ends (both are this code).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hdr {
    /// `K_*`.
    pub kind: u8,
    /// AMO: `AmoOp`; PUT with signal: `SignalOp`.
    pub sub: u8,
    /// AMO: `AmoType`.
    pub ty: u8,
    /// `F_*`.
    pub flags: u8,
    /// The sender's PE.
    pub src_pe: i32,
    /// The initiator's operation id, echoed by answers.
    pub tag: u64,
    /// PUT: destination offset; GET: source offset; AMO: word offset;
    /// BARRIER: round.
    pub dst: u64,
    /// Data bytes (PUT: following the header or inline; GET: to read).
    pub size: u64,
    /// Signal word offset (PUT with `F_SIGNAL`).
    pub sig: u64,
    /// Signal operand.
    pub signal: u64,
    /// Inline data; AMO operand; answers: the value; GET: offset of this chunk
    /// inside the operation; BARRIER: epoch.
    pub value: u64,
    /// AMO compare value; answers: the error code (0: none).
    pub cond: u64,
}

impl Hdr {
    /// A PUT header carries `op`'s signal, if `op` is a put-signal.
    pub(super) fn add_signal(&mut self, op: &Op) {
        if let Op::PutSignal { sig, signal, op: sop, .. } = *op {
            self.flags |= F_SIGNAL;
            self.sig = sig;
            self.signal = signal;
            self.sub = sop as u8;
        }
    }
}

const _: () = assert!(std::mem::size_of::<Hdr>() == HDR_BYTES);
const _: () = assert!(std::mem::offset_of!(Hdr, signal) == 40 && std::mem::offset_of!(Hdr, value) == 48);

pub(super) const K_PUT: u8 = 1;
pub(super) const K_ACK: u8 = 2;
pub(super) const K_GET: u8 = 3;
pub(super) const K_GET_REPLY: u8 = 4;
pub(super) const K_AMO: u8 = 5;
pub(super) const K_AMO_REPLY: u8 = 6;
pub(super) const K_BARRIER: u8 = 7;

pub(super) const F_SIGNAL: u8 = 1;
pub(super) const F_INLINE: u8 = 2;
/// A PUT whose data is in slot `value` of the sender's section of our
/// staging zone, not in the message; its ACK names the slot in `dst`
/// (`zone.rs`).
pub(super) const F_SLOT: u8 = 4;
/// Bits 4..7 of a request's flags: the sender's queue (mod 16), so that the
/// receiver lands the records of one queue in one landing lane, in order
/// ([`msg_lane`]).
pub(super) const F_LANE_SHIFT: u8 = 4;

/// The flag bits naming local queue `queue`'s landing lane to a receiver.
pub(super) fn lane_hint(queue: u32) -> u8 {
    ((queue & 15) as u8) << F_LANE_SHIFT
}

/// The landing lane key of a received request: its sender and the sender's
/// queue hint, so requests of one queue of one PE share a lane and those of
/// different queues or PEs spread over the lanes.
pub(super) fn msg_lane(h: &Hdr) -> u32 {
    (h.src_pe as u32).wrapping_add(u32::from(h.flags >> F_LANE_SHIFT))
}

/// Completion contexts: the buffer class in the top byte, the index below.
pub(super) const CTX_RECV: u64 = 1 << 56;
pub(super) const CTX_SEND_BIG: u64 = 2 << 56;
pub(super) const CTX_SEND_SMALL: u64 = 3 << 56;
pub(super) const CTX_MASK: u64 = (1 << 56) - 1;

/// The new value of a word after `op` (two's complement, masked to the type).
pub fn amo_apply(ty: AmoType, op: AmoOp, old: u64, value: u64, cond: u64) -> u64 {
    let m = if ty.size() == 8 { u64::MAX } else { (1u64 << (8 * ty.size())) - 1 };
    let (old, value, cond) = (old & m, value & m, cond & m);
    let new = match op {
        AmoOp::Fetch => old,
        AmoOp::Set | AmoOp::Swap => value,
        AmoOp::CompareSwap => {
            if old == cond {
                value
            } else {
                old
            }
        }
        AmoOp::FetchAdd | AmoOp::Add => old.wrapping_add(value),
        AmoOp::FetchAnd | AmoOp::And => old & value,
        AmoOp::FetchOr | AmoOp::Or => old | value,
        AmoOp::FetchXor | AmoOp::Xor => old ^ value,
        AmoOp::FetchMin | AmoOp::Min => {
            let less = match ty {
                // Sign-extend the masked 32-bit pattern.
                AmoType::Int32 => (value as u32 as i32) < (old as u32 as i32),
                AmoType::Int64 => (value as i64) < (old as i64),
                AmoType::Uint32 | AmoType::Uint64 => value < old,
            };
            if less { value } else { old }
        }
    };
    new & m
}

/// A landing record that writes `size` bytes at heap offset `dst` from the
/// device-visible address `src` (`None`: the inline `bits`), then the signal
/// `(sig, value, op)` if any.
pub(super) fn put_rec(dst: u64, size: u64, src: Option<u64>, bits: u64, signal: Option<(u64, u64, SignalOp)>) -> AgentRec {
    let mut r = AgentRec { kind: CPNET_AGENT_K_PUT as u8, dst, size, ..AgentRec::default() };
    match src {
        Some(a) => r.src = a,
        None => {
            r.flags |= CPNET_AGENT_F_INLINE as u8;
            r.value = bits;
        }
    }
    if let Some((sig, value, op)) = signal {
        r.flags |= CPNET_AGENT_F_SIGNAL as u8;
        r.sig = sig;
        r.signal = value;
        r.sub = op as u8;
    }
    r
}

/// A landing record that copies `size` bytes at heap offset `src` to the
/// device-visible host address `to`.
pub(super) fn copy_out_rec(src: u64, size: u64, to: u64) -> AgentRec {
    AgentRec { kind: CPNET_AGENT_K_COPY_OUT as u8, dst: src, size, src: to, ..AgentRec::default() }
}
