//! Constructors of well-formed commands, one per operation of the device
//! API. The CPU work-group, tests and benchmarks build commands here; the GPU
//! builds the same bit patterns in `queue.cuh`.

use crate::layout::*;

/// A payload does not fit inline in a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("inline payload of {0} bytes does not fit in a command slot (at most {CPNET_INLINE_MAX} bytes)")]
pub struct InlineTooLarge(pub usize);

fn base(opcode: u8, pe: i32) -> Cmd {
    Cmd { opcode, pe, ..Cmd::default() }
}

/// Little-endian packing of up to 8 bytes into a word.
///
/// # Errors
/// [`InlineTooLarge`] if `bytes` is longer than 8.
pub fn pack_inline(bytes: &[u8]) -> Result<u64, InlineTooLarge> {
    if bytes.len() > CPNET_INLINE_MAX {
        return Err(InlineTooLarge(bytes.len()));
    }
    let mut w = [0u8; 8];
    w[..bytes.len()].copy_from_slice(bytes);
    Ok(u64::from_le_bytes(w))
}

impl Cmd {
    /// The operation's name as the device API spells it (`"putmem"`,
    /// `"atomic_fetch_add"`, ...), for error reports; `"command"` for an
    /// unknown opcode.
    pub fn op_name(&self) -> &'static str {
        match self.op() {
            Some(Opcode::Nop) => "nop",
            Some(Opcode::Put) => "putmem",
            Some(Opcode::Get) => "getmem",
            Some(Opcode::PutSignal) => "putmem_signal",
            Some(Opcode::Amo) => AmoOp::from_u8(self.subop).map_or("atomic", AmoOp::shmem_name),
            Some(Opcode::Fence) => "fence",
            Some(Opcode::Quiet) => "quiet",
            Some(Opcode::BarrierAll) => "barrier_all",
            None => "command",
        }
    }

    /// The heap offset the command addresses at its target PE: `src` for a
    /// get, `dst` otherwise.
    pub fn target_addr(&self) -> u64 {
        match self.op() {
            Some(Opcode::Get) => self.src,
            _ => self.dst,
        }
    }

    /// A no-op (round-trip probe).
    pub fn nop() -> Cmd {
        base(CPNET_OP_NOP, 0)
    }

    /// Put `size` bytes from local heap offset `src` to heap offset `dst` of `pe`.
    pub fn put(pe: i32, dst: u64, src: u64, size: u64) -> Cmd {
        Cmd { size, dst, src, ..base(CPNET_OP_PUT, pe) }
    }

    /// Put `payload` (at most 8 bytes) carried in the slot to `dst` of `pe`.
    ///
    /// # Errors
    /// [`InlineTooLarge`] for a longer payload.
    pub fn put_inline(pe: i32, dst: u64, payload: &[u8]) -> Result<Cmd, InlineTooLarge> {
        let value = pack_inline(payload)?;
        Ok(Cmd { flags: CPNET_F_INLINE, size: payload.len() as u64, dst, value, ..base(CPNET_OP_PUT, pe) })
    }

    /// Get `size` bytes from heap offset `src` of `pe` to local heap offset `dst`.
    pub fn get(pe: i32, dst: u64, src: u64, size: u64) -> Cmd {
        Cmd { size, dst, src, ..base(CPNET_OP_GET, pe) }
    }

    /// Get `size` (at most 8) bytes from `src` of `pe` into the control
    /// block's `result` (blocking).
    ///
    /// # Errors
    /// [`InlineTooLarge`] for `size > 8`.
    pub fn get_inline(pe: i32, src: u64, size: u64) -> Result<Cmd, InlineTooLarge> {
        if size > CPNET_INLINE_MAX as u64 {
            return Err(InlineTooLarge(size as usize));
        }
        Ok(Cmd { flags: CPNET_F_INLINE | CPNET_F_BLOCKING, size, src, ..base(CPNET_OP_GET, pe) })
    }

    /// Put, then update the signal word at `sig` of `pe` with `signal` by `op`.
    pub fn put_signal(pe: i32, dst: u64, src: u64, size: u64, sig: u64, signal: u64, op: SignalOp) -> Cmd {
        Cmd { subop: op as u8, size, dst, src, sig, cond: signal, ..base(CPNET_OP_PUT_SIGNAL, pe) }
    }

    /// [`Cmd::put_signal`] with the payload (at most 8 bytes) inline.
    ///
    /// # Errors
    /// [`InlineTooLarge`] for a longer payload.
    pub fn put_signal_inline(
        pe: i32,
        dst: u64,
        payload: &[u8],
        sig: u64,
        signal: u64,
        op: SignalOp,
    ) -> Result<Cmd, InlineTooLarge> {
        let value = pack_inline(payload)?;
        Ok(Cmd {
            flags: CPNET_F_INLINE,
            subop: op as u8,
            size: payload.len() as u64,
            dst,
            value,
            sig,
            cond: signal,
            ..base(CPNET_OP_PUT_SIGNAL, pe)
        })
    }

    /// An atomic `op` of type `ty` on heap offset `dst` of `pe`, operand
    /// `value`, compare value `cond` (COMPARE_SWAP). Fetching operations are
    /// marked blocking.
    pub fn amo(pe: i32, ty: AmoType, op: AmoOp, dst: u64, value: u64, cond: u64) -> Cmd {
        let flags = if op.fetches() { CPNET_F_BLOCKING } else { 0 };
        Cmd { flags, dtype: ty as u8, subop: op as u8, size: ty.size(), dst, value, cond, ..base(CPNET_OP_AMO, pe) }
    }

    /// Fence: order earlier puts/AMOs to each PE before later ones.
    pub fn fence() -> Cmd {
        base(CPNET_OP_FENCE, 0)
    }

    /// Quiet: flush every earlier operation of the queue.
    pub fn quiet() -> Cmd {
        Cmd { flags: CPNET_F_BLOCKING, ..base(CPNET_OP_QUIET, 0) }
    }

    /// Barrier across all PEs (after quiet).
    pub fn barrier_all() -> Cmd {
        Cmd { flags: CPNET_F_BLOCKING, ..base(CPNET_OP_BARRIER_ALL, 0) }
    }

    /// The same command with `CPNET_F_BLOCKING` set.
    pub fn blocking(mut self) -> Cmd {
        self.flags |= CPNET_F_BLOCKING;
        self
    }
}
