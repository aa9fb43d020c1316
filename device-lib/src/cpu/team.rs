//! Team collectives of a CPU work-group (OpenSHMEM 1.5 §9.9, on a team of
//! §9.4): sync, barrier, broadcast, fcollect, collect, alltoall and the
//! reductions. The same algorithms, on the same scratch layout (`cmd.h`,
//! "Teams"), as the device collectives of `include/cpnet/team.cuh`, so a
//! kernel's work-group and a CPU work-group are interchangeable members.
//!
//! # Semantics
//!
//! Collective over the team: one work-group (or the host) of every member
//! calls the same collective with the same arguments, in the same order as
//! every other collective on that team. Members' collectives on one team
//! must not overlap (one work-group per PE at a time). `source` and `dest`
//! are symmetric. A call returns when this PE's part is done: its `dest`
//! holds the result and its `source` may be reused; it does not wait for
//! the other members to finish (as NVSHMEM's and OpenSHMEM's: only sync and
//! barrier synchronize). So a `dest` that other members write in a later
//! collective (broadcast, fcollect, collect, alltoall) may change as soon as
//! they have moved on: read the result first, then sync the team before the
//! next such collective (OpenSHMEM 1.5 §9.9: `dest` must be ready to accept
//! the data when the collective is called). A reduction's data only lands
//! in the team's scratch, so its `dest` needs no such sync.
//!
//! # Algorithms
//!
//! Every collective takes the next epoch `e` of the team (the scratch's
//! `SEQ` word, counted by each member alike). Data travels as
//! put-with-signal whose signal (the receiver's `SIG[sender]`) is SET to
//! `e`; a receiver waits until each sender's word reaches `e`. Signals only
//! grow, so no word is ever reset.
//!
//! * sync: dissemination, `ceil(log2 size)` rounds; in round `k` a member
//!   sets `SYNC[k]` of the member `2^k` further on and waits for its own.
//! * barrier: quiet, then sync.
//! * broadcast: the root puts into every member's `dest` (its own too);
//!   fcollect/alltoall: every member puts its block into every member's
//!   `dest`; collect: an fcollect of the sizes first (through the data
//!   buffers), then the blocks at their offsets.
//! * reductions: rounds of at most `chunk` bytes; in round `r` (the team's
//!   `ROUND` word) each member copies its part of `source` into its own slot
//!   of data buffer `r % 2`,
//!   puts that slot into the same slot of every other member, and, once
//!   every member's slot is there, folds the slots in team order (so every
//!   member gets the same bits, floating point included). A member reuses a
//!   buffer two rounds later only after every other member has moved past
//!   the round that read it (it waits for their data of the round between;
//!   collectives that are not all-to-all never touch the buffers).
//!   A fence after each round's puts keeps a round's signal from overtaking
//!   the previous round's data.
//!
//! Each collective ends with a quiet, so its puts are complete (and their
//! errors reported) when it returns.

use crate::cpu::{CpuCtx, Error, Result, SymAddr};
use crate::layout::{
    CPNET_TEAM_SCR_ROUND, CPNET_TEAM_SCR_SEQ, CPNET_TEAM_SCR_SIG, CPNET_TEAM_SCR_SYNC, CPNET_TEAM_SCR_XCHG, Cmp, ErrorCode, SignalOp,
    TeamDesc,
};

/// A reduction operator (OpenSHMEM 1.5 §9.9.12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Bitwise and (integer types).
    And,
    /// Bitwise or (integer types).
    Or,
    /// Bitwise exclusive or (integer types).
    Xor,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 7] =
        [ReduceOp::And, ReduceOp::Or, ReduceOp::Xor, ReduceOp::Min, ReduceOp::Max, ReduceOp::Sum, ReduceOp::Prod];

    /// The OpenSHMEM name (`shmem_TYPENAME_<name>_reduce`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::And => "and",
            ReduceOp::Or => "or",
            ReduceOp::Xor => "xor",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
        }
    }

    /// Whether the operator is bitwise (and, or, xor: integer types only).
    pub fn bitwise(self) -> bool {
        matches!(self, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor)
    }
}

/// An element type of the reductions: OpenSHMEM 1.5 Table 10's integer and
/// floating types, plus `half::f16` and `half::bf16` (sum, prod, min, max).
pub trait ReduceType: Copy + PartialEq + core::fmt::Debug + Send + Sync + 'static {
    /// Bytes per element.
    const SIZE: usize;
    /// The OpenSHMEM TYPENAME ("int", "uint64", "double", "half", "bfloat16").
    const NAME: &'static str;
    /// Whether and/or/xor apply.
    const INTEGER: bool;
    /// The element at the start of `b` (little-endian, `SIZE` bytes).
    fn read(b: &[u8]) -> Self;
    /// Store the element at the start of `b`.
    fn write(self, b: &mut [u8]);
    /// `a op b`; bitwise operators are only asked of integer types.
    fn combine(op: ReduceOp, a: Self, b: Self) -> Self;
}

/// `ReduceType` for each `$t => $name`: little-endian bytes, and `combine`
/// as `|$op, $a, $b| $combine`.
macro_rules! reduce_type {
    ($integer:literal, |$op:ident, $a:ident, $b:ident| $combine:expr; $($t:ty => $name:literal),* $(,)?) => {$(
        impl ReduceType for $t {
            const SIZE: usize = size_of::<$t>();
            const NAME: &'static str = $name;
            const INTEGER: bool = $integer;
            fn read(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b[..Self::SIZE].try_into().expect("SIZE bytes"))
            }
            fn write(self, b: &mut [u8]) {
                b[..Self::SIZE].copy_from_slice(&self.to_le_bytes());
            }
            fn combine($op: ReduceOp, $a: Self, $b: Self) -> Self {
                $combine
            }
        }
    )*};
}
reduce_type!(true, |op, a, b| match op {
        ReduceOp::And => a & b,
        ReduceOp::Or => a | b,
        ReduceOp::Xor => a ^ b,
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
        ReduceOp::Sum => a.wrapping_add(b),
        ReduceOp::Prod => a.wrapping_mul(b),
    };
    i8 => "int8", i16 => "int16", i32 => "int32", i64 => "int64",
    u8 => "uint8", u16 => "uint16", u32 => "uint32", u64 => "uint64");
reduce_type!(false, |op, a, b| match op {
        ReduceOp::Min => if b < a { b } else { a },
        ReduceOp::Max => if b > a { b } else { a },
        ReduceOp::Sum => a + b,
        ReduceOp::Prod => a * b,
        ReduceOp::And | ReduceOp::Or | ReduceOp::Xor => unreachable!("bitwise reduction of a float"),
    };
    f32 => "float", f64 => "double", half::f16 => "half", half::bf16 => "bfloat16");

/// The operation name of a team sync in errors.
const OP_SYNC: &str = "team_sync";

impl CpuCtx {
    /// This PE's number in `team`, or `BadTeam` (a free entry, or not a member).
    fn team_me(&self, op: &'static str, team: &TeamDesc) -> Result<i32> {
        if team.size <= 0 || team.my_idx < 0 || team.my_idx >= team.size {
            return Err(self.local_err(op, self.pe.my_pe, SymAddr(team.scratch), ErrorCode::BadTeam));
        }
        Ok(team.my_idx)
    }

    /// The team's next epoch (its `SEQ` word, advanced).
    fn team_epoch(&self, op: &'static str, team: &TeamDesc) -> Result<u64> {
        let w = self.pe.heap.atomic_u64(SymAddr(team.word(CPNET_TEAM_SCR_SEQ))).map_err(|c| self.team_err(op, team, c))?;
        // Relaxed: only this PE's work-groups write the word, one at a time
        // (collectives on a team do not overlap within a PE).
        let e = w.load(core::sync::atomic::Ordering::Relaxed) + 1;
        w.store(e, core::sync::atomic::Ordering::Relaxed);
        Ok(e)
    }

    fn team_err(&self, op: &'static str, team: &TeamDesc, code: ErrorCode) -> Error {
        self.local_err(op, self.pe.my_pe, SymAddr(team.scratch), code)
    }

    /// The team's next round through the data buffers: its buffer (0 or 1).
    fn team_buffer(&self, op: &'static str, team: &TeamDesc) -> Result<u64> {
        let w = self.pe.heap.atomic_u64(SymAddr(team.word(CPNET_TEAM_SCR_ROUND))).map_err(|c| self.team_err(op, team, c))?;
        // Relaxed: as the SEQ word.
        let r = w.load(core::sync::atomic::Ordering::Relaxed);
        w.store(r + 1, core::sync::atomic::Ordering::Relaxed);
        Ok(r % 2)
    }

    /// A signal-only put: set `word` of team PE `idx` to `e`.
    fn team_signal(&mut self, team: &TeamDesc, word: u64, e: u64, idx: i32) -> Result<()> {
        self.putmem_signal_nbi(SymAddr(word), SymAddr(word), 0, SymAddr(word), e, SignalOp::Set, team.world_pe(idx))
    }

    /// Wait until the local `word` reaches `e`.
    fn team_wait(&self, word: u64, e: u64) -> Result<()> {
        self.signal_wait_until(SymAddr(word), Cmp::Ge, e).map(drop)
    }

    /// Copy `nbytes` within the local heap.
    fn local_copy(&self, op: &'static str, dest: SymAddr, source: SymAddr, nbytes: u64) -> Result<()> {
        if nbytes == 0 || dest == source {
            return Ok(());
        }
        let mut buf = vec![0u8; nbytes as usize];
        let me = self.pe.my_pe;
        self.pe.heap.read_bytes(source, &mut buf).map_err(|c| self.local_err(op, me, source, c))?;
        self.pe.heap.write_bytes(dest, &buf).map_err(|c| self.local_err(op, me, dest, c))
    }

    fn sync_rounds(&mut self, team: &TeamDesc, me: i32, e: u64) -> Result<()> {
        let n = team.size;
        let mut k = 0usize;
        while (1i64 << k) < i64::from(n) {
            let word = team.word(CPNET_TEAM_SCR_SYNC) + 8 * k as u64;
            let partner = ((i64::from(me) + (1i64 << k)) % i64::from(n)) as i32;
            self.team_signal(team, word, e, partner)?;
            self.team_wait(word, e)?;
            k += 1;
        }
        Ok(())
    }

    /// Wait until every member of `team` has called it (`shmem_team_sync`,
    /// OpenSHMEM 1.5 §9.9.2). Does not complete this PE's earlier puts (see
    /// [`CpuCtx::team_barrier`]). **Collective** over the team.
    ///
    /// # Errors
    /// `BadTeam` (a free entry, or this PE is not a member); queue errors;
    /// [`Error::WaitTimeout`] when a member does not arrive in time.
    pub fn team_sync(&mut self, team: &TeamDesc) -> Result<()> {
        let me = self.team_me(OP_SYNC, team)?;
        let e = self.team_epoch(OP_SYNC, team)?;
        self.sync_rounds(team, me, e)
    }

    /// Quiet, then [`CpuCtx::team_sync`]: every put and AMO issued by each
    /// member before it is complete when it returns on any member (the
    /// team form of `shmem_barrier_all`, §9.9.1). **Collective** over the team.
    ///
    /// # Errors
    /// As [`CpuCtx::team_sync`].
    pub fn team_barrier(&mut self, team: &TeamDesc) -> Result<()> {
        self.team_me("team_barrier", team)?;
        self.quiet()?;
        self.team_sync(team)
    }

    /// Copy `nbytes` from `source` on team PE `root` to `dest` on every
    /// member, `root` included (`shmem_broadcastmem`, §9.9.7).
    /// **Collective** over the team.
    ///
    /// # Errors
    /// `BadTeam`; `BadPe` for a root outside the team; the put's errors;
    /// wait timeouts.
    pub fn broadcastmem(&mut self, team: &TeamDesc, dest: SymAddr, source: SymAddr, nbytes: u64, root: i32) -> Result<()> {
        const OP: &str = "broadcastmem";
        let me = self.team_me(OP, team)?;
        if root < 0 || root >= team.size {
            return Err(self.local_err(OP, root, dest, ErrorCode::BadPe));
        }
        let e = self.team_epoch(OP, team)?;
        let sig = team.word(CPNET_TEAM_SCR_SIG) + 8 * root as u64;
        if me == root {
            self.local_copy(OP, dest, source, nbytes)?;
            for j in (0..team.size).filter(|&j| j != me) {
                self.putmem_signal_nbi(dest, source, nbytes, SymAddr(sig), e, SignalOp::Set, team.world_pe(j))?;
            }
            self.quiet()
        } else {
            self.team_wait(sig, e)
        }
    }

    /// Every member's `nbytes` at `source` into `dest` of every member, in
    /// team order: `dest[j * nbytes..]` is team PE `j`'s block
    /// (`shmem_fcollectmem`, §9.9.9). `dest` holds `size * nbytes` bytes.
    /// **Collective** over the team.
    ///
    /// # Errors
    /// As [`CpuCtx::broadcastmem`].
    pub fn fcollectmem(&mut self, team: &TeamDesc, dest: SymAddr, source: SymAddr, nbytes: u64) -> Result<()> {
        let me = self.team_me("fcollectmem", team)?;
        let e = self.team_epoch("fcollectmem", team)?;
        self.blocks_to_all("fcollectmem", team, me, e, |_| (dest.add(me as u64 * nbytes), source, nbytes))
    }

    /// Block `j` of `source` (`nbytes` each) to block `me` of `dest` on team
    /// PE `j`, for every `j` (`shmem_alltoallmem`, §9.9.10). Both hold
    /// `size * nbytes` bytes. **Collective** over the team.
    ///
    /// # Errors
    /// As [`CpuCtx::broadcastmem`].
    pub fn alltoallmem(&mut self, team: &TeamDesc, dest: SymAddr, source: SymAddr, nbytes: u64) -> Result<()> {
        let me = self.team_me("alltoallmem", team)?;
        let e = self.team_epoch("alltoallmem", team)?;
        let (mo, n) = (me as u64, nbytes);
        self.blocks_to_all("alltoallmem", team, me, e, |j| (dest.add(mo * n), source.add(j as u64 * n), n))
    }

    /// Every member's `nbytes` (which may differ between members) at
    /// `source`, concatenated in team order into `dest` of every member
    /// (`shmem_collectmem`, §9.9.8); returns the total bytes. `dest` must
    /// hold the sum of the members' sizes. **Collective** over the team
    /// (two epochs: the sizes first).
    ///
    /// # Errors
    /// As [`CpuCtx::broadcastmem`].
    pub fn collectmem(&mut self, team: &TeamDesc, dest: SymAddr, source: SymAddr, nbytes: u64) -> Result<u64> {
        const OP: &str = "collectmem";
        let me = self.team_me(OP, team)?;
        // The sizes: an exchange through the data buffers (8 bytes each).
        let e = self.team_epoch(OP, team)?;
        let buf = self.team_buffer(OP, team)?;
        let slot = |j: i32| SymAddr(team.data(buf, j));
        self.pe.heap.write_bytes(slot(me), &nbytes.to_le_bytes()).map_err(|c| self.team_err(OP, team, c))?;
        self.blocks_to_all(OP, team, me, e, |_| (slot(me), slot(me), 8))?;
        let mut sizes = Vec::with_capacity(team.size as usize);
        for j in 0..team.size {
            let mut b = [0u8; 8];
            self.pe.heap.read_bytes(slot(j), &mut b).map_err(|c| self.team_err(OP, team, c))?;
            sizes.push(u64::from_le_bytes(b));
        }
        let offset: u64 = sizes[..me as usize].iter().sum();
        let e = self.team_epoch(OP, team)?;
        self.blocks_to_all(OP, team, me, e, |_| (dest.add(offset), source, nbytes))?;
        Ok(sizes.iter().sum())
    }

    /// The body of fcollect, alltoall and collect: `block(j)` = (where at
    /// team PE `j`, from where here, bytes) for every member `j` (this PE
    /// by a local copy), each put signalling `SIG[me]` = `e` at `j`; then
    /// wait for every other member's signal, and quiet.
    fn blocks_to_all(
        &mut self,
        op: &'static str,
        team: &TeamDesc,
        me: i32,
        e: u64,
        block: impl Fn(i32) -> (SymAddr, SymAddr, u64),
    ) -> Result<()> {
        let sig = |j: i32| team.word(CPNET_TEAM_SCR_SIG) + 8 * j as u64;
        for k in 1..team.size {
            // Start with the next member, so the members do not all send to
            // team PE 0 first.
            let j = (me + k) % team.size;
            let (to, from, n) = block(j);
            self.putmem_signal_nbi(to, from, n, SymAddr(sig(me)), e, SignalOp::Set, team.world_pe(j))?;
        }
        let (to, from, n) = block(me);
        self.local_copy(op, to, from, n)?;
        for j in (0..team.size).filter(|&j| j != me) {
            self.team_wait(sig(j), e)?;
        }
        self.quiet()
    }

    /// Reduce `nreduce` elements of `source` over the members with `op` into
    /// `dest` of every member (`shmem_TYPENAME_OP_reduce`, §9.9.12; "reduce
    /// to all"). Every member gets the same bits: the slots are folded in
    /// team order. `dest` may be `source`. **Collective** over the team.
    ///
    /// # Errors
    /// `BadOp` for a bitwise `op` on a floating type; as
    /// [`CpuCtx::broadcastmem`].
    pub fn reduce<T: ReduceType>(
        &mut self,
        team: &TeamDesc,
        op: ReduceOp,
        dest: SymAddr,
        source: SymAddr,
        nreduce: u64,
    ) -> Result<()> {
        const OP: &str = "reduce";
        let me = self.team_me(OP, team)?;
        if op.bitwise() && !T::INTEGER {
            return Err(self.local_err(OP, self.pe.my_pe, dest, ErrorCode::BadOp));
        }
        let size = T::SIZE as u64;
        let per_round = u64::from(team.chunk) / size;
        let sig = |j: i32| team.word(CPNET_TEAM_SCR_SIG) + 8 * j as u64;
        let mut done = 0u64;
        // One round even for nreduce == 0: every member takes the same epochs.
        loop {
            let n = per_round.min(nreduce - done);
            let bytes = n * size;
            let e = self.team_epoch(OP, team)?;
            let buf = self.team_buffer(OP, team)?;
            let mine = SymAddr(team.data(buf, me));
            self.local_copy(OP, mine, source.add(done * size), bytes)?;
            for k in 1..team.size {
                let j = (me + k) % team.size;
                self.putmem_signal_nbi(mine, mine, bytes, SymAddr(sig(me)), e, SignalOp::Set, team.world_pe(j))?;
            }
            self.fence()?;
            for j in (0..team.size).filter(|&j| j != me) {
                self.team_wait(sig(j), e)?;
            }
            if bytes > 0 {
                let mut acc = vec![0u8; bytes as usize];
                let mut other = vec![0u8; bytes as usize];
                self.pe.heap.read_bytes(SymAddr(team.data(buf, 0)), &mut acc).map_err(|c| self.team_err(OP, team, c))?;
                for j in 1..team.size {
                    self.pe.heap.read_bytes(SymAddr(team.data(buf, j)), &mut other).map_err(|c| self.team_err(OP, team, c))?;
                    for (a, b) in acc.chunks_exact_mut(T::SIZE).zip(other.chunks_exact(T::SIZE)) {
                        T::combine(op, T::read(a), T::read(b)).write(a);
                    }
                }
                let at = dest.add(done * size);
                self.pe.heap.write_bytes(at, &acc).map_err(|c| self.local_err(OP, self.pe.my_pe, at, c))?;
            }
            done += n;
            if done >= nreduce {
                break;
            }
        }
        self.quiet()
    }

    /// The agreement of a team split (`shmem_team_split_strided`, §9.4.3):
    /// the bitwise AND of every parent member's `value` (its mask of free
    /// team-table entries), through the parent's scratch. **Collective**
    /// over `parent`.
    ///
    /// # Errors
    /// As [`CpuCtx::reduce`].
    pub fn team_agree(&mut self, parent: &TeamDesc, value: u64) -> Result<u64> {
        let (src, dst) = (SymAddr(parent.word(CPNET_TEAM_SCR_XCHG)), SymAddr(parent.word(CPNET_TEAM_SCR_XCHG + 8)));
        self.pe.heap.write_bytes(src, &value.to_le_bytes()).map_err(|c| self.team_err("team_split", parent, c))?;
        self.reduce::<u64>(parent, ReduceOp::And, dst, src, 1)?;
        let mut b = [0u8; 8];
        self.pe.heap.read_bytes(dst, &mut b).map_err(|c| self.team_err("team_split", parent, c))?;
        Ok(u64::from_le_bytes(b))
    }
}
