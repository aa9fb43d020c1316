//! The command decoder: turns a 64-byte slot into a typed [`Op`] or rejects
//! it with the `CPNET_E_*` code that says why. Every field the operation uses
//! is checked here, once, before any transport sees it: the opcode, flag
//! bits, AMO type and sub-operation, the target PE, every heap range
//! (offset + size, overflow-checked), inline sizes and AMO/signal alignment.

use cpnet_device::layout::*;

/// What the decoder checks against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Number of PEs; valid targets are `0..n_pes`.
    pub n_pes: i32,
    /// Bytes in the symmetric heap (the same on every PE).
    pub heap_size: u64,
}

/// Where a put's data comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutSrc {
    /// Local heap offset.
    Heap(u64),
    /// Carried in the slot: the low `size` bytes, little-endian.
    Inline(u64),
    /// In the queue's payload slot for the command (`CPNET_F_PAYLOAD`,
    /// `cmd.h` P0), not yet located: the service turns it into
    /// [`PutSrc::Host`] (or rejects it) before a transport sees it.
    Payload,
    /// `size` bytes of host memory at `host` (this process's address),
    /// which the GPU sees at `dev`: the command's payload slot, readable
    /// until the command completes (`cmd.h` P0).
    Host {
        /// Address in this process.
        host: usize,
        /// The same bytes as a kernel (or the landing agent) addresses them;
        /// `None` where this process has no GPU mapping of them (the proxy
        /// daemon: they are copied instead).
        dev: Option<u64>,
    },
}

/// Where a get's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GetDst {
    /// Local heap offset.
    Heap(u64),
    /// The queue's control block `result` (at most 8 bytes).
    Result,
}

/// A validated command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Complete at once.
    Nop,
    /// Put `size` bytes to heap offset `dst` of `pe`.
    Put {
        /// Target PE.
        pe: i32,
        /// Target heap offset.
        dst: u64,
        /// Source.
        src: PutSrc,
        /// Bytes.
        size: u64,
    },
    /// Get `size` bytes from heap offset `src` of `pe`.
    Get {
        /// Source PE.
        pe: i32,
        /// Destination.
        dst: GetDst,
        /// Source heap offset at `pe`.
        src: u64,
        /// Bytes.
        size: u64,
    },
    /// Put, then update the 64-bit signal word `sig` of `pe`.
    PutSignal {
        /// Target PE.
        pe: i32,
        /// Target heap offset.
        dst: u64,
        /// Source.
        src: PutSrc,
        /// Bytes.
        size: u64,
        /// Heap offset of the signal word (8-aligned).
        sig: u64,
        /// Signal operand.
        signal: u64,
        /// SET or ADD.
        op: SignalOp,
    },
    /// Atomic memory operation on heap offset `dst` of `pe`.
    Amo {
        /// Target PE.
        pe: i32,
        /// Element type.
        ty: AmoType,
        /// Operation.
        op: AmoOp,
        /// Target heap offset (aligned to the element size).
        dst: u64,
        /// Operand (low `ty.size()` bytes used).
        value: u64,
        /// Compare value (COMPARE_SWAP).
        cond: u64,
    },
    /// Order earlier puts/AMOs before later ones, per target PE.
    Fence,
    /// Complete every earlier operation of the queue.
    Quiet,
    /// Quiet, then barrier across all PEs.
    BarrierAll,
}

impl Op {
    /// The target PE of a data operation.
    pub fn pe(&self) -> Option<i32> {
        match *self {
            Op::Put { pe, .. } | Op::Get { pe, .. } | Op::PutSignal { pe, .. } | Op::Amo { pe, .. } => Some(pe),
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => None,
        }
    }

    /// The operation's name, as error reports print it (`"putmem"`,
    /// `"getmem"`, `"atomic_fetch_add"`, ...), the same as
    /// [`Cmd::op_name`](cpnet_device::layout::Cmd::op_name) gives for its command.
    pub fn name(&self) -> &'static str {
        match *self {
            Op::Nop => "nop",
            Op::Put { .. } => "putmem",
            Op::Get { .. } => "getmem",
            Op::PutSignal { .. } => "putmem_signal",
            Op::Amo { op, .. } => op.shmem_name(),
            Op::Fence => "fence",
            Op::Quiet => "quiet",
            Op::BarrierAll => "barrier_all",
        }
    }

    /// The remote heap offset the operation touches at its target PE (the
    /// source of a get, the destination otherwise); 0 for ordering ops.
    pub fn addr(&self) -> u64 {
        match *self {
            Op::Put { dst, .. } | Op::PutSignal { dst, .. } | Op::Amo { dst, .. } => dst,
            Op::Get { src, .. } => src,
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => 0,
        }
    }

    /// Whether a put's data is in a payload slot ([`PutSrc::Payload`] or
    /// [`PutSrc::Host`]): only transports of GPU PEs serve those.
    pub fn from_payload(&self) -> bool {
        matches!(
            *self,
            Op::Put { src: PutSrc::Payload | PutSrc::Host { .. }, .. }
                | Op::PutSignal { src: PutSrc::Payload | PutSrc::Host { .. }, .. }
        )
    }

    /// Bytes moved (the element size for an AMO); 0 for ordering ops.
    pub fn size(&self) -> u64 {
        match *self {
            Op::Put { size, .. } | Op::PutSignal { size, .. } | Op::Get { size, .. } => size,
            Op::Amo { ty, .. } => ty.size(),
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => 0,
        }
    }
}

fn range(off: u64, size: u64, lim: &Limits) -> Result<(), ErrorCode> {
    match off.checked_add(size) {
        Some(end) if end <= lim.heap_size => Ok(()),
        _ => Err(ErrorCode::BadAddr),
    }
}

fn target(pe: i32, lim: &Limits) -> Result<i32, ErrorCode> {
    if (0..lim.n_pes).contains(&pe) { Ok(pe) } else { Err(ErrorCode::BadPe) }
}

fn put_src(cmd: &Cmd, lim: &Limits) -> Result<PutSrc, ErrorCode> {
    if cmd.flags & CPNET_F_PAYLOAD != 0 {
        // Its size against the slot is checked where the slot is known
        // (Service::locate_payload).
        if cmd.flags & CPNET_F_INLINE != 0 || cmd.src != 0 {
            return Err(ErrorCode::BadOp);
        }
        Ok(PutSrc::Payload)
    } else if cmd.flags & CPNET_F_INLINE != 0 {
        if cmd.size > CPNET_INLINE_MAX as u64 {
            return Err(ErrorCode::BadSize);
        }
        Ok(PutSrc::Inline(cmd.value))
    } else {
        range(cmd.src, cmd.size, lim)?;
        Ok(PutSrc::Heap(cmd.src))
    }
}

/// Validate `cmd` against `lim`.
///
/// # Errors
/// `BadOp` (unknown opcode, flag bit, type or sub-operation; a type or
/// sub-operation on a command that takes none), `BadPe`, `BadAddr` (a range
/// outside the heap, overflow included), `BadSize` (inline over 8 bytes, AMO
/// size not the type's), `BadAlign` (AMO or signal word misaligned).
#[inline]
pub fn decode(cmd: &Cmd, lim: &Limits) -> Result<Op, ErrorCode> {
    let op = Opcode::from_u8(cmd.opcode).ok_or(ErrorCode::BadOp)?;
    if cmd.flags & !CPNET_F_ALL != 0 {
        return Err(ErrorCode::BadOp);
    }
    if op != Opcode::Amo && cmd.dtype != CPNET_T_NONE {
        return Err(ErrorCode::BadOp);
    }
    if !matches!(op, Opcode::Amo | Opcode::PutSignal) && cmd.subop != 0 {
        return Err(ErrorCode::BadOp);
    }
    if !matches!(op, Opcode::Put | Opcode::PutSignal) && cmd.flags & CPNET_F_PAYLOAD != 0 {
        return Err(ErrorCode::BadOp);
    }
    match op {
        Opcode::Nop => Ok(Op::Nop),
        Opcode::Fence => Ok(Op::Fence),
        Opcode::Quiet => Ok(Op::Quiet),
        Opcode::BarrierAll => Ok(Op::BarrierAll),
        Opcode::Put => {
            let pe = target(cmd.pe, lim)?;
            let src = put_src(cmd, lim)?;
            range(cmd.dst, cmd.size, lim)?;
            Ok(Op::Put { pe, dst: cmd.dst, src, size: cmd.size })
        }
        Opcode::Get => {
            let pe = target(cmd.pe, lim)?;
            range(cmd.src, cmd.size, lim)?;
            let dst = if cmd.flags & CPNET_F_INLINE != 0 {
                if cmd.size > CPNET_INLINE_MAX as u64 {
                    return Err(ErrorCode::BadSize);
                }
                GetDst::Result
            } else {
                range(cmd.dst, cmd.size, lim)?;
                GetDst::Heap(cmd.dst)
            };
            Ok(Op::Get { pe, dst, src: cmd.src, size: cmd.size })
        }
        Opcode::PutSignal => {
            let sig_op = SignalOp::from_u8(cmd.subop).ok_or(ErrorCode::BadOp)?;
            let pe = target(cmd.pe, lim)?;
            let src = put_src(cmd, lim)?;
            range(cmd.dst, cmd.size, lim)?;
            range(cmd.sig, 8, lim)?;
            if !cmd.sig.is_multiple_of(8) {
                return Err(ErrorCode::BadAlign);
            }
            Ok(Op::PutSignal { pe, dst: cmd.dst, src, size: cmd.size, sig: cmd.sig, signal: cmd.cond, op: sig_op })
        }
        Opcode::Amo => {
            let ty = AmoType::from_u8(cmd.dtype).ok_or(ErrorCode::BadOp)?;
            let amo = AmoOp::from_u8(cmd.subop).ok_or(ErrorCode::BadOp)?;
            let pe = target(cmd.pe, lim)?;
            if cmd.size != ty.size() {
                return Err(ErrorCode::BadSize);
            }
            range(cmd.dst, cmd.size, lim)?;
            if !cmd.dst.is_multiple_of(cmd.size) {
                return Err(ErrorCode::BadAlign);
            }
            Ok(Op::Amo { pe, ty, op: amo, dst: cmd.dst, value: cmd.value, cond: cmd.cond })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: Limits = Limits { n_pes: 2, heap_size: 4096 };

    #[test]
    fn rejects_each_bad_field_with_its_code() {
        assert_eq!(decode(&Cmd::put(2, 0, 0, 8), &LIM), Err(ErrorCode::BadPe));
        assert_eq!(decode(&Cmd::put(-1, 0, 0, 8), &LIM), Err(ErrorCode::BadPe));
        assert_eq!(decode(&Cmd::put(1, 4090, 0, 8), &LIM), Err(ErrorCode::BadAddr));
        assert_eq!(decode(&Cmd::put(1, u64::MAX - 2, 0, 8), &LIM), Err(ErrorCode::BadAddr), "overflow");
        assert_eq!(decode(&Cmd::get(1, 0, 4096, 1), &LIM), Err(ErrorCode::BadAddr));
        let mut c = Cmd::put_inline(1, 0, &[1; 8]).unwrap();
        c.size = 9;
        assert_eq!(decode(&c, &LIM), Err(ErrorCode::BadSize), "oversize inline payload");
        assert_eq!(decode(&Cmd::amo(1, AmoType::Uint64, AmoOp::Add, 4, 1, 0), &LIM), Err(ErrorCode::BadAlign));
        assert_eq!(decode(&Cmd::amo(1, AmoType::Int32, AmoOp::Add, 4, 1, 0), &LIM).map(|_| ()), Ok(()));
        let sig = Cmd::put_signal(1, 0, 0, 8, 12, 1, SignalOp::Set);
        assert_eq!(decode(&sig, &LIM), Err(ErrorCode::BadAlign));
        let mut bad = Cmd::nop();
        bad.opcode = CPNET_OP_COUNT;
        assert_eq!(decode(&bad, &LIM), Err(ErrorCode::BadOp));
        let mut bad = Cmd::nop();
        bad.flags = 0x80;
        assert_eq!(decode(&bad, &LIM), Err(ErrorCode::BadOp));
        let mut bad = Cmd::amo(1, AmoType::Int64, AmoOp::Add, 8, 1, 0);
        bad.subop = CPNET_AMO_COUNT;
        assert_eq!(decode(&bad, &LIM), Err(ErrorCode::BadOp));
        bad.subop = CPNET_AMO_ADD;
        bad.size = 4;
        assert_eq!(decode(&bad, &LIM), Err(ErrorCode::BadSize));
    }

    #[test]
    fn payload_flag_only_on_puts_and_alone() {
        let mut c = Cmd::put(1, 64, 0, 100);
        c.flags = CPNET_F_PAYLOAD;
        assert_eq!(decode(&c, &LIM), Ok(Op::Put { pe: 1, dst: 64, src: PutSrc::Payload, size: 100 }));
        let mut s = Cmd::put_signal(1, 64, 0, 100, 8, 1, SignalOp::Add);
        s.flags = CPNET_F_PAYLOAD;
        assert!(matches!(decode(&s, &LIM), Ok(Op::PutSignal { src: PutSrc::Payload, .. })));
        let mut both = c;
        both.flags = CPNET_F_PAYLOAD | CPNET_F_INLINE;
        assert_eq!(decode(&both, &LIM), Err(ErrorCode::BadOp), "payload and inline");
        let mut with_src = c;
        with_src.src = 8;
        assert_eq!(decode(&with_src, &LIM), Err(ErrorCode::BadOp), "payload with a heap source");
        let mut get = Cmd::get(1, 0, 64, 16);
        get.flags = CPNET_F_PAYLOAD;
        assert_eq!(decode(&get, &LIM), Err(ErrorCode::BadOp), "payload on a get");
        let mut amo = Cmd::amo(1, AmoType::Uint64, AmoOp::Add, 8, 1, 0);
        amo.flags = CPNET_F_PAYLOAD;
        assert_eq!(decode(&amo, &LIM), Err(ErrorCode::BadOp), "payload on an AMO");
        c.dst = 4090;
        assert_eq!(decode(&c, &LIM), Err(ErrorCode::BadAddr), "destination still checked");
    }

    #[test]
    fn zero_length_put_at_heap_end_is_valid() {
        assert_eq!(
            decode(&Cmd::put(1, 4096, 4096, 0), &LIM),
            Ok(Op::Put { pe: 1, dst: 4096, src: PutSrc::Heap(4096), size: 0 })
        );
    }

    proptest::proptest! {
        /// Any 64 bytes either decode to an operation whose every range lies
        /// in the heap, or are rejected; decoding never panics.
        #[test]
        fn random_slots_decode_or_reject(words in proptest::array::uniform8(proptest::num::u64::ANY)) {
            let cmd = Cmd::from_words(words);
            if let Ok(op) = decode(&cmd, &LIM) {
                if let Some(pe) = op.pe() { proptest::prop_assert!((0..LIM.n_pes).contains(&pe)); }
                match op {
                    Op::Put { dst, size, .. } | Op::PutSignal { dst, size, .. } => proptest::prop_assert!(dst + size <= LIM.heap_size),
                    Op::Get { src, size, .. } => proptest::prop_assert!(src + size <= LIM.heap_size),
                    Op::Amo { dst, ty, .. } => proptest::prop_assert!(dst + ty.size() <= LIM.heap_size && dst % ty.size() == 0),
                    _ => {}
                }
            }
        }
    }
}
