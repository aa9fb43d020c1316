//! The staged transport's per-operation state: slots, what follows a copy,
//! AMO completions, the dissemination barrier's round.

use cpnet_device::layout::{AmoOp, AmoType, ErrorCode, SignalOp};

use crate::decode::Op;
use crate::service::Tag;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) enum Phase {
    #[default]
    Free,
    /// Data moving; `outstanding` answers or copies pending.
    Data,
    /// A multi-chunk put-signal's data is acknowledged; its signal message
    /// is out.
    Signal,
}

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct OpSlot {
    pub(super) phase: Phase,
    pub(super) tag: Option<Tag>,
    pub(super) op: Option<Op>,
    pub(super) generation: u32,
    /// Chunks (requests) in total and started so far.
    pub(super) chunks: u32,
    pub(super) started: u32,
    /// Requests, copies or executor items started and not yet finished.
    pub(super) outstanding: u32,
    pub(super) error: Option<ErrorCode>,
    pub(super) value: u64,
    /// A put-signal whose signal goes as its own message once the data has
    /// landed (multi-chunk staged puts; ADD signals on the peer path).
    pub(super) signal_msg: bool,
}

/// What to do when a copy's event has passed.
#[derive(Clone, Copy, Debug)]
pub(super) enum After {
    /// Send the staged chunk in big buffer `buf` (`len` bytes with header) to `pe`.
    Send { buf: u32, len: usize, pe: i32 },
    /// Send the header in small buffer `buf` to `pe` (its data went into
    /// the target's staging zone).
    SendSmall { buf: u32, pe: i32 },
    /// A local copy of op `op` finished.
    LocalDone { op: u32 },
    /// A local `g` finished: the value is in the op's scratch word 2.
    LocalResult { op: u32 },
    /// A received PUT was applied: repost `recv`, then ACK (or run its
    /// signal first through the landing agent, in lane key `lane`: the
    /// message's; `sig`: word, operand, operation), naming the zone slot
    /// its data came from, if any.
    Applied { recv: u32, pe: i32, tag: u64, sig: Option<(u64, u64, SignalOp)>, lane: u32, slot: Option<u32> },
    /// One part of a copy split over the landing lanes was applied: join
    /// `join` of [`super::StagedTransport`] counts it, and the last part
    /// runs the join's `After`.
    Part { join: u32 },
    /// A GET reply was copied into the heap: repost `recv`, one answer less for `op`.
    GetApplied { recv: u32, op: u32 },
    /// An AMO (or ADD signal) ran in the landing agent; the record's value
    /// is the old value.
    Amo(AmoDone),
    /// A local put-signal's data copy finished: now its ADD signal.
    LocalThenAdd { op: u32, sig: u64, value: u64 },
}

#[derive(Clone, Copy, Debug)]
pub(super) enum AmoDone {
    Local { op: u32 },
    Reply { pe: i32, tag: u64 },
    Ack { pe: i32, tag: u64, slot: Option<u32> },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct AmoItem {
    pub(super) ty: AmoType,
    pub(super) op: AmoOp,
    pub(super) dst: u64,
    pub(super) value: u64,
    pub(super) cond: u64,
    pub(super) done: AmoDone,
    /// Landing lane key ([`StagedTransport::land`]).
    pub(super) lane: u32,
}

pub(super) struct BarrierState {
    pub(super) epoch: u64,
    pub(super) round: u32,
    pub(super) sent: bool,
}
