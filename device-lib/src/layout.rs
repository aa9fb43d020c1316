//! The Rust mirror of `include/cpnet/cmd.h`, the one definition of every
//! GPU-visible layout.
//!
//! The constants (`CPNET_*`) are generated from the header's `#define`s by
//! `build.rs`; the structs below are written out by hand and a `const` block
//! asserts each one's size and every field offset against those constants,
//! so a change to the header that the mirror does not follow fails to build.
//! The header `static_assert`s the same numbers on the C/CUDA side.

use core::mem::{offset_of, size_of};

include!(concat!(env!("OUT_DIR"), "/cmd_h.rs"));

/// One command: a 64-byte slot of a queue (`cpnet_cmd_t`).
///
/// Offsets (`dst`, `src`, `sig`) are byte offsets into the symmetric heap,
/// never raw pointers. `commit` is written last (see THE QUEUE PROTOCOL in
/// `cmd.h`); producers leave it 0 here and [`crate::ring::Producer`] fills it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cmd {
    /// `CPNET_OP_*`.
    pub opcode: u8,
    /// `CPNET_F_*` bits.
    pub flags: u8,
    /// `CPNET_T_*` for AMOs, `CPNET_T_NONE` otherwise.
    pub dtype: u8,
    /// `CPNET_AMO_*` or `CPNET_SIGNAL_*`.
    pub subop: u8,
    /// Target PE.
    pub pe: i32,
    /// Payload bytes (PUT, GET, PUT_SIGNAL); element bytes (AMO).
    pub size: u64,
    /// Heap offset written: at `pe` (PUT, PUT_SIGNAL, AMO), local (GET).
    pub dst: u64,
    /// Heap offset read: local (PUT, PUT_SIGNAL), at `pe` (GET).
    pub src: u64,
    /// Inline payload (low `size` bytes, little-endian) or AMO operand.
    pub value: u64,
    /// AMO compare value (COMPARE_SWAP) or signal value (PUT_SIGNAL).
    pub cond: u64,
    /// Heap offset of the signal word at `pe` (PUT_SIGNAL).
    pub sig: u64,
    /// `seq + 1`, written last with release.
    pub commit: u64,
}

/// The queue's control block, written by the consumer only (`cpnet_queue_ctl_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCtl {
    /// Commands taken; the slots of every lower seq are free (C3).
    pub consumed: u64,
    /// Every command with `seq < completed` is complete (C4).
    pub completed: u64,
    /// Fetched value of the command `result_seq - 1`.
    pub result: u64,
    /// `seq + 1` of the command whose result is in `result`.
    pub result_seq: u64,
    /// `seq + 1` of the last rejected command, 0 if none.
    pub error_seq: u64,
    /// `CPNET_E_*` of that command.
    pub error: i32,
    /// Zero.
    pub error_pad: u32,
    /// Nonzero (a `CPNET_E_*`): the job is ending, every wait on this queue stops.
    pub abort: u64,
    /// `(seq + 1) << 8 | CPNET_E_*` of the last completed blocking command (C5).
    pub reply: u64,
}

/// The queue's producer block, written by the producer only (`cpnet_queue_prod_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueProd {
    /// Seq of the next command; persists across contexts.
    pub write_idx: u64,
    /// The last `ctl.consumed` the producer read (P1).
    pub cached_consumed: u64,
    /// 1 while a context owns the queue.
    pub in_use: u32,
    /// Work-group id of the owner, for error reports.
    pub owner: u32,
    /// Zero.
    pub reserved: [u64; 5],
}

/// The handle a kernel receives by value (`cpnet_handle_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handle {
    /// This PE.
    pub my_pe: i32,
    /// Number of PEs.
    pub n_pes: i32,
    /// Address of this PE's symmetric heap as the kernel sees it.
    pub heap_base: u64,
    /// Bytes in the symmetric heap (the same on every PE).
    pub heap_size: u64,
    /// Address of queue 0 of the pool as the kernel sees it.
    pub queues: u64,
    /// Queues in the pool.
    pub n_queues: u32,
    /// Slots per queue = `1 << log2_depth`.
    pub log2_depth: u32,
    /// Device-side wait timeout in nanoseconds (0: wait forever).
    pub wait_timeout_ns: u64,
    /// Address of the [`Status`] block as the kernel sees it.
    pub status: u64,
    /// Address of [`claim_words`]`(n_queues)` zeroed `u32` words in GPU
    /// memory: the queues' claim words, the status report's claim word, and
    /// the abort mirror the host fills when it aborts ([`claim_abort`]); 0:
    /// claim with the host-memory words and read aborts from host memory.
    pub claims: u64,
    /// Address of `n_pes` `u64` words in GPU memory, the peer-to-peer table:
    /// word `i` is where the kernel reaches PE `i`'s heap with its own loads
    /// and stores (its own heap for `my_pe`, a CUDA IPC mapping for a PE on
    /// this host), 0 where it cannot; 0: no table (every operation goes
    /// through the queue).
    pub peers: u64,
    /// Address of the payload slots (`cmd.h` P0) as the kernel sees it:
    /// pinned host memory, `n_queues << log2_depth` slots of
    /// [`Handle::payload_bytes`] each; 0: none.
    pub payload: u64,
    /// Bytes per payload slot (a power of two, at least 16); 0: no payload
    /// slots (puts over `CPNET_INLINE_MAX` bytes are read from the heap).
    pub payload_bytes: u32,
    /// Entries of the team table at [`Handle::teams`] ([`CPNET_MAX_TEAMS`]);
    /// 0: no table (team collectives fail with [`ErrorCode::BadTeam`]).
    pub n_teams: u32,
    /// Address of the team table in GPU memory: `n_teams` [`TeamDesc`],
    /// entry `t` for team handle `t`.
    pub teams: u64,
}

/// One entry of a PE's team table (`cpnet_team_desc_t`): a strided set of
/// world PEs and where its collectives' scratch is (OpenSHMEM 1.5 §9.4;
/// the scratch layout is in `cmd.h`, "Teams").
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TeamDesc {
    /// World PE of team PE 0.
    pub start: i32,
    /// World-PE distance between consecutive team PEs (>= 1).
    pub stride: i32,
    /// Team PEs; 0: a free entry.
    pub size: i32,
    /// This PE's number in the team; -1: not a member.
    pub my_idx: i32,
    /// Heap offset of the team's scratch.
    pub scratch: u64,
    /// Bytes per sender per data buffer, and per LL buffer (a multiple of
    /// [`CPNET_TEAM_CHUNK_ALIGN`]).
    pub chunk: u32,
    /// Offset of the data area in the scratch.
    pub data_off: u32,
}

impl TeamDesc {
    /// The layout of a team of `size` PEs (`start`, `stride`) in `scratch_bytes`
    /// of scratch at heap offset `scratch`, as seen by world PE `me` (`cmd.h`
    /// "Teams": two data buffers, then two LL buffers, each `size` slots of
    /// `chunk` bytes); `None` when the scratch leaves less than
    /// [`CPNET_TEAM_CHUNK_ALIGN`] bytes per sender and buffer.
    pub fn new(start: i32, stride: i32, size: i32, me: i32, scratch: u64, scratch_bytes: u64) -> Option<TeamDesc> {
        if size <= 0 || stride <= 0 {
            return None;
        }
        let align = CPNET_TEAM_CHUNK_ALIGN as u64;
        let data_off = (CPNET_TEAM_SCR_SIG as u64 + 8 * size as u64).next_multiple_of(align);
        let chunk = scratch_bytes.checked_sub(data_off)? / (4 * size as u64) / align * align;
        if chunk == 0 {
            return None;
        }
        let rel = me - start;
        let my_idx = if rel >= 0 && rel % stride == 0 && rel / stride < size { rel / stride } else { -1 };
        Some(TeamDesc {
            start,
            stride,
            size,
            my_idx,
            scratch,
            chunk: u32::try_from(chunk.min(u32::MAX as u64 / align * align)).ok()?,
            data_off: u32::try_from(data_off).ok()?,
        })
    }

    /// World PE of team PE `idx` (`0..size`).
    pub fn world_pe(&self, idx: i32) -> i32 {
        self.start + idx * self.stride
    }

    /// Team PE of world PE `pe`, if a member (`shmem_team_translate_pe` to
    /// the team).
    pub fn team_pe(&self, pe: i32) -> Option<i32> {
        let rel = pe - self.start;
        (self.size > 0 && rel >= 0 && rel % self.stride == 0 && rel / self.stride < self.size).then_some(rel / self.stride)
    }

    /// Heap offset of scratch word `off` (a `CPNET_TEAM_SCR_*`).
    pub fn word(&self, off: usize) -> u64 {
        self.scratch + off as u64
    }

    /// Heap offset of data buffer `buf` (0 or 1), sender slot `j`.
    pub fn data(&self, buf: u64, j: i32) -> u64 {
        self.scratch + self.data_off as u64 + (buf * self.size as u64 + j as u64) * self.chunk as u64
    }

    /// Heap offset of LL buffer `buf` (0 or 1), sender slot `j`: past the
    /// data buffers (only GPU work-groups between peer-mapped PEs use them,
    /// `cpnet/team.cuh`).
    pub fn ll(&self, buf: u64, j: i32) -> u64 {
        self.data(2 + buf, j)
    }

    /// Bytes of the scratch this layout uses (through the last LL slot).
    pub fn scratch_used(&self) -> u64 {
        self.data_off as u64 + 4 * self.size as u64 * self.chunk as u64
    }
}

/// Number of `u32` words at [`Handle::claims`] for `n_queues` queues
/// (`CPNET_CLAIM_WORDS` in `cmd.h`).
pub const fn claim_words(n_queues: usize) -> usize {
    n_queues + CPNET_CLAIM_EXTRA
}

/// Index of the status report's claim word at [`Handle::claims`]
/// (`CPNET_CLAIM_REPORT`).
pub const fn claim_report(n_queues: usize) -> usize {
    n_queues + CPNET_CLAIM_AFTER_REPORT
}

/// Index of the abort mirror at [`Handle::claims`] (`CPNET_CLAIM_ABORT`):
/// a `CPNET_E_*`, 0 while the job runs. Device waits poll it in GPU memory.
pub const fn claim_abort(n_queues: usize) -> usize {
    n_queues + CPNET_CLAIM_AFTER_ABORT
}

const _: () = assert!(CPNET_CLAIM_AFTER_REPORT < CPNET_CLAIM_EXTRA && CPNET_CLAIM_AFTER_ABORT < CPNET_CLAIM_EXTRA);

// cmd.h's reduction operators number `cpu::ReduceOp::ALL` in its order
// (libcpnet maps a code to `ALL[code]`; team.cuh's enum takes the codes).
const _: () = assert!(
    CPNET_RED_AND == 0
        && CPNET_RED_OR == 1
        && CPNET_RED_XOR == 2
        && CPNET_RED_MIN == 3
        && CPNET_RED_MAX == 4
        && CPNET_RED_SUM == 5
        && CPNET_RED_PROD == 6
);

/// The PE-wide status block (`cpnet_status_t`): the host sets `abort`; a
/// kernel reports its first device-side error (a wait timeout) here.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Status {
    /// Nonzero (a `CPNET_E_*`): every device wait returns at once.
    pub abort: u32,
    /// First device-side error (`CPNET_E_*`), claimed by CAS from 0.
    pub dev_error: u32,
    /// The PE the failed wait or operation concerned.
    pub dev_pe: i32,
    /// The work-group (linear block id) that reported it.
    pub dev_wg: u32,
    /// Heap offset it waited on.
    pub dev_addr: u64,
    /// Value it waited for.
    pub dev_expected: u64,
    /// Value it last saw.
    pub dev_found: u64,
    /// `CPNET_CMP_*` of the wait.
    pub dev_cmp: u32,
    /// Queue claims so far (wrapping): every claim of a queue adds 1, with
    /// release, after setting the queue's `prod.in_use`; a proxy rereads
    /// the `in_use` words only when it changed.
    pub claim_gen: u32,
    /// Zero.
    pub reserved: [u32; 4],
}

impl Status {
    /// Decode a status block from its 32-bit words: `word(byte_offset)`
    /// loads the word at that offset (with the ordering the caller needs,
    /// normally Acquire on memory the GPU writes). 64-bit fields are read
    /// as two halves, low first, so a snapshot taken while a kernel runs may
    /// mix two reports; read it after the kernel, or as a hint.
    pub fn from_words(word: impl Fn(usize) -> u32) -> Status {
        let w64 = |off: usize| u64::from(word(off)) | (u64::from(word(off + 4)) << 32);
        Status {
            abort: word(CPNET_STATUS_OFF_ABORT),
            dev_error: word(CPNET_STATUS_OFF_DEV_ERROR),
            dev_pe: word(CPNET_STATUS_OFF_DEV_PE) as i32,
            dev_wg: word(CPNET_STATUS_OFF_DEV_WG),
            dev_addr: w64(CPNET_STATUS_OFF_DEV_ADDR),
            dev_expected: w64(CPNET_STATUS_OFF_DEV_EXPECTED),
            dev_found: w64(CPNET_STATUS_OFF_DEV_FOUND),
            dev_cmp: word(CPNET_STATUS_OFF_DEV_CMP),
            claim_gen: word(CPNET_STATUS_OFF_CLAIM_GEN),
            reserved: [0; 4],
        }
    }
}

/// One record of a landing ring (`cpnet_agent_rec_t`, THE LANDING AGENT
/// in `cmd.h`): what a GPU PE's proxy thread asks its landing agent to
/// apply to the GPU heap. Written by the proxy (A2, A3), read by the agent
/// (A4), which writes an AMO's old value back into `value` (A5).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentRec {
    /// `CPNET_AGENT_K_*`.
    pub kind: u8,
    /// `CPNET_SIGNAL_*` (a put's signal) or `CPNET_AMO_*`.
    pub sub: u8,
    /// `CPNET_T_*` (AMO).
    pub ty: u8,
    /// `CPNET_AGENT_F_*`.
    pub flags: u8,
    /// Zero.
    pub pad: u32,
    /// Heap offset written (PUT, AMO) or read (COPY_OUT).
    pub dst: u64,
    /// Bytes (PUT, COPY_OUT).
    pub size: u64,
    /// Device-visible address of host staging read (PUT) or written (COPY_OUT).
    pub src: u64,
    /// Heap offset of the signal word (PUT with a signal).
    pub sig: u64,
    /// Signal operand (PUT); compare value (AMO compare-swap).
    pub signal: u64,
    /// Inline data (PUT) or AMO operand.
    pub value: u64,
    /// Not sent: words 0..6 travel in LL form, whose tags carry the seq.
    pub reserved: u64,
}

impl AgentRec {
    /// Slot words 0..[`CPNET_AGENT_LL_WORDS`] of record `seq` in its landing
    /// ring slot (`cmd.h`, "LL form"): half `h` of the record's words 0..6,
    /// little-endian, in the low 32 bits of word `h`, the tag
    /// `(seq + 1) as u32` in the high 32 bits.
    pub fn ll_words(&self, seq: u64) -> [u64; CPNET_AGENT_LL_WORDS] {
        let w0 = u64::from(self.kind)
            | u64::from(self.sub) << 8
            | u64::from(self.ty) << 16
            | u64::from(self.flags) << 24
            | u64::from(self.pad) << 32;
        let words = [w0, self.dst, self.size, self.src, self.sig, self.signal, self.value];
        let tag = u64::from((seq + 1) as u32) << 32;
        let mut out = [0u64; CPNET_AGENT_LL_WORDS];
        for (h, o) in out.iter_mut().enumerate() {
            *o = tag | (words[h / 2] >> (32 * (h % 2))) & 0xffff_ffff;
        }
        out
    }
}

/// The control block of a landing ring (`cpnet_agent_ctl_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentCtl {
    /// Records applied (A5: the agent's release store).
    pub done: u64,
    /// 1 from launch (proxy) until the agent exits (A7).
    pub running: u32,
    /// Nonzero: the agent exits at once (teardown).
    pub stop: u32,
    /// Records the agent refused (range outside the heap).
    pub bad: u64,
    /// Agent launches so far.
    pub launches: u64,
    /// ns the agent spent reading records after seeing their commit, summed.
    pub t_read: u64,
    /// ns spent applying records, summed.
    pub t_apply: u64,
    /// ns spent publishing `done`, summed.
    pub t_publish: u64,
    /// Zero.
    pub reserved: u64,
}

macro_rules! assert_layout {
    ($t:ty, $size:expr, { $($field:ident => $off:expr),* $(,)? }) => {
        const _: () = {
            assert!(size_of::<$t>() == $size, concat!("size of ", stringify!($t)));
            $(assert!(offset_of!($t, $field) == $off, concat!(stringify!($t), ".", stringify!($field)));)*
        };
    };
}

assert_layout!(Cmd, CPNET_SLOT_BYTES, {
    opcode => CPNET_CMD_OFF_OPCODE, flags => CPNET_CMD_OFF_FLAGS, dtype => CPNET_CMD_OFF_DTYPE,
    subop => CPNET_CMD_OFF_SUBOP, pe => CPNET_CMD_OFF_PE, size => CPNET_CMD_OFF_SIZE,
    dst => CPNET_CMD_OFF_DST, src => CPNET_CMD_OFF_SRC, value => CPNET_CMD_OFF_VALUE,
    cond => CPNET_CMD_OFF_COND, sig => CPNET_CMD_OFF_SIG, commit => CPNET_CMD_OFF_COMMIT,
});
assert_layout!(QueueCtl, CPNET_CTL_BYTES, {
    consumed => CPNET_CTL_OFF_CONSUMED, completed => CPNET_CTL_OFF_COMPLETED,
    result => CPNET_CTL_OFF_RESULT, result_seq => CPNET_CTL_OFF_RESULT_SEQ,
    error_seq => CPNET_CTL_OFF_ERROR_SEQ, error => CPNET_CTL_OFF_ERROR, abort => CPNET_CTL_OFF_ABORT,
    reply => CPNET_CTL_OFF_REPLY,
});
assert_layout!(QueueProd, CPNET_PROD_BYTES, {
    write_idx => CPNET_PROD_OFF_WRITE_IDX, cached_consumed => CPNET_PROD_OFF_CACHED_CONSUMED,
    in_use => CPNET_PROD_OFF_IN_USE, owner => CPNET_PROD_OFF_OWNER,
});
assert_layout!(Handle, CPNET_HANDLE_BYTES, {
    my_pe => CPNET_HANDLE_OFF_MY_PE, n_pes => CPNET_HANDLE_OFF_N_PES,
    heap_base => CPNET_HANDLE_OFF_HEAP_BASE, heap_size => CPNET_HANDLE_OFF_HEAP_SIZE,
    queues => CPNET_HANDLE_OFF_QUEUES, n_queues => CPNET_HANDLE_OFF_N_QUEUES,
    log2_depth => CPNET_HANDLE_OFF_LOG2_DEPTH, wait_timeout_ns => CPNET_HANDLE_OFF_WAIT_TIMEOUT_NS,
    status => CPNET_HANDLE_OFF_STATUS, claims => CPNET_HANDLE_OFF_CLAIMS,
    peers => CPNET_HANDLE_OFF_PEERS, payload => CPNET_HANDLE_OFF_PAYLOAD,
    payload_bytes => CPNET_HANDLE_OFF_PAYLOAD_BYTES, n_teams => CPNET_HANDLE_OFF_N_TEAMS,
    teams => CPNET_HANDLE_OFF_TEAMS,
});
assert_layout!(TeamDesc, CPNET_TEAM_DESC_BYTES, {
    start => CPNET_TEAM_DESC_OFF_START, stride => CPNET_TEAM_DESC_OFF_STRIDE, size => CPNET_TEAM_DESC_OFF_SIZE,
    my_idx => CPNET_TEAM_DESC_OFF_MY_IDX, scratch => CPNET_TEAM_DESC_OFF_SCRATCH, chunk => CPNET_TEAM_DESC_OFF_CHUNK,
    data_off => CPNET_TEAM_DESC_OFF_DATA_OFF,
});
assert_layout!(Status, CPNET_STATUS_BYTES, {
    abort => CPNET_STATUS_OFF_ABORT, dev_error => CPNET_STATUS_OFF_DEV_ERROR,
    dev_pe => CPNET_STATUS_OFF_DEV_PE, dev_wg => CPNET_STATUS_OFF_DEV_WG,
    dev_addr => CPNET_STATUS_OFF_DEV_ADDR, dev_expected => CPNET_STATUS_OFF_DEV_EXPECTED,
    dev_found => CPNET_STATUS_OFF_DEV_FOUND, dev_cmp => CPNET_STATUS_OFF_DEV_CMP,
    claim_gen => CPNET_STATUS_OFF_CLAIM_GEN,
});
assert_layout!(AgentRec, CPNET_AGENT_REC_BYTES, {
    kind => CPNET_AGENT_REC_OFF_KIND, sub => CPNET_AGENT_REC_OFF_SUB, ty => CPNET_AGENT_REC_OFF_TY,
    flags => CPNET_AGENT_REC_OFF_FLAGS, dst => CPNET_AGENT_REC_OFF_DST, size => CPNET_AGENT_REC_OFF_SIZE,
    src => CPNET_AGENT_REC_OFF_SRC, sig => CPNET_AGENT_REC_OFF_SIG, signal => CPNET_AGENT_REC_OFF_SIGNAL,
    value => CPNET_AGENT_REC_OFF_VALUE, reserved => CPNET_AGENT_REC_OFF_RESERVED,
});
assert_layout!(AgentCtl, CPNET_AGENT_CTL_BYTES, {
    done => CPNET_AGENT_CTL_OFF_DONE, running => CPNET_AGENT_CTL_OFF_RUNNING, stop => CPNET_AGENT_CTL_OFF_STOP,
    bad => CPNET_AGENT_CTL_OFF_BAD, launches => CPNET_AGENT_CTL_OFF_LAUNCHES,
    t_read => CPNET_AGENT_CTL_OFF_T_READ, t_apply => CPNET_AGENT_CTL_OFF_T_APPLY,
    t_publish => CPNET_AGENT_CTL_OFF_T_PUBLISH,
});
const _: () = {
    assert!(CPNET_CMD_OFF_COMMIT == CPNET_CMD_COMMIT_WORD * 8);
    assert!(CPNET_QUEUE_OFF_PROD == CPNET_CTL_BYTES);
    assert!(CPNET_QUEUE_OFF_SLOTS == CPNET_CTL_BYTES + CPNET_PROD_BYTES);
    assert!(CPNET_QUEUE_HEADER_BYTES == CPNET_QUEUE_OFF_SLOTS);
    assert!(CPNET_DEFAULT_DEPTH.is_power_of_two());
    assert!(CPNET_AGENT_DEFAULT_DEPTH.is_power_of_two());
    assert!(CPNET_MIN_DEPTH.is_power_of_two() && CPNET_MAX_DEPTH.is_power_of_two());
};

/// Words (8 bytes each) in one slot.
pub const SLOT_WORDS: usize = CPNET_SLOT_BYTES / 8;

impl Cmd {
    /// The slot as eight little-endian 64-bit words, as it sits in the ring.
    #[inline]
    pub fn to_words(&self) -> [u64; SLOT_WORDS] {
        // SAFETY: Cmd is repr(C), 64 bytes with no padding (asserted above:
        // its field offsets are dense), and every field is a plain integer, so
        // its bytes are fully initialized and any reading of them as u64 is valid.
        unsafe { core::mem::transmute::<Cmd, [u64; SLOT_WORDS]>(*self) }
    }

    /// The command held in eight slot words (the inverse of [`Cmd::to_words`]).
    #[inline]
    pub fn from_words(words: [u64; SLOT_WORDS]) -> Cmd {
        // SAFETY: same size (asserted), and every bit pattern is a valid Cmd
        // since all of its fields are plain integers.
        unsafe { core::mem::transmute::<[u64; SLOT_WORDS], Cmd>(words) }
    }

    /// The opcode, if it is one cmd.h defines.
    pub fn op(&self) -> Option<Opcode> {
        Opcode::from_u8(self.opcode)
    }
}

macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident : $repr:ty { $($(#[$vm:meta])* $v:ident = $c:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name { $($(#[$vm])* $v = $c),* }
        impl $name {
            /// Every value, in cmd.h order.
            pub const ALL: &'static [$name] = &[$($name::$v),*];
            /// The variant whose cmd.h code is `v`, if any.
            pub fn from_u8(v: $repr) -> Option<$name> {
                match v { $(x if x == $c => Some($name::$v),)* _ => None }
            }
            /// The cmd.h name, e.g. for error reports.
            pub fn name(self) -> &'static str {
                match self { $($name::$v => stringify!($c)),* }
            }
        }
        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result { f.write_str(self.name()) }
        }
    };
}

c_enum!(
    /// Command opcodes (`CPNET_OP_*`).
    Opcode: u8 {
        /// No operation (round-trip probe).
        Nop = CPNET_OP_NOP,
        /// Put (OpenSHMEM 1.5 §9.5.1).
        Put = CPNET_OP_PUT,
        /// Get (§9.5.3).
        Get = CPNET_OP_GET,
        /// Put with signal (§9.8.1).
        PutSignal = CPNET_OP_PUT_SIGNAL,
        /// Atomic memory operation (§9.7).
        Amo = CPNET_OP_AMO,
        /// Fence (§9.9.1).
        Fence = CPNET_OP_FENCE,
        /// Quiet (§9.9.2).
        Quiet = CPNET_OP_QUIET,
        /// Barrier across all PEs (§9.8.2 of 1.4 / sync of 1.5).
        BarrierAll = CPNET_OP_BARRIER_ALL,
    }
);

c_enum!(
    /// AMO element types (`CPNET_T_*`).
    AmoType: u8 {
        /// 32-bit signed.
        Int32 = CPNET_T_INT32,
        /// 32-bit unsigned.
        Uint32 = CPNET_T_UINT32,
        /// 64-bit signed.
        Int64 = CPNET_T_INT64,
        /// 64-bit unsigned.
        Uint64 = CPNET_T_UINT64,
    }
);

impl AmoType {
    /// Element size in bytes.
    pub fn size(self) -> u64 {
        match self {
            AmoType::Int32 | AmoType::Uint32 => 4,
            AmoType::Int64 | AmoType::Uint64 => 8,
        }
    }
}

c_enum!(
    /// AMO operations (`CPNET_AMO_*`, OpenSHMEM 1.5 §9.7).
    AmoOp: u8 {
        /// Atomic fetch.
        Fetch = CPNET_AMO_FETCH,
        /// Atomic set.
        Set = CPNET_AMO_SET,
        /// Atomic swap.
        Swap = CPNET_AMO_SWAP,
        /// Atomic conditional swap.
        CompareSwap = CPNET_AMO_COMPARE_SWAP,
        /// Atomic fetch-and-add.
        FetchAdd = CPNET_AMO_FETCH_ADD,
        /// Atomic add.
        Add = CPNET_AMO_ADD,
        /// Atomic fetch-and-AND.
        FetchAnd = CPNET_AMO_FETCH_AND,
        /// Atomic AND.
        And = CPNET_AMO_AND,
        /// Atomic fetch-and-OR.
        FetchOr = CPNET_AMO_FETCH_OR,
        /// Atomic OR.
        Or = CPNET_AMO_OR,
        /// Atomic fetch-and-XOR.
        FetchXor = CPNET_AMO_FETCH_XOR,
        /// Atomic XOR.
        Xor = CPNET_AMO_XOR,
        /// Atomic fetch-and-minimum (cpnet extension to OpenSHMEM 1.5:
        /// signed or unsigned by the type; floats as ordered integers,
        /// [`crate::ordered`]).
        FetchMin = CPNET_AMO_FETCH_MIN,
        /// Atomic minimum (cpnet extension, as [`AmoOp::FetchMin`]).
        Min = CPNET_AMO_MIN,
    }
);

impl AmoOp {
    /// The OpenSHMEM 1.5 routine name (§9.7), e.g. `"atomic_fetch_add"`.
    pub fn shmem_name(self) -> &'static str {
        match self {
            AmoOp::Fetch => "atomic_fetch",
            AmoOp::Set => "atomic_set",
            AmoOp::Swap => "atomic_swap",
            AmoOp::CompareSwap => "atomic_compare_swap",
            AmoOp::FetchAdd => "atomic_fetch_add",
            AmoOp::Add => "atomic_add",
            AmoOp::FetchAnd => "atomic_fetch_and",
            AmoOp::And => "atomic_and",
            AmoOp::FetchOr => "atomic_fetch_or",
            AmoOp::Or => "atomic_or",
            AmoOp::FetchXor => "atomic_fetch_xor",
            AmoOp::Xor => "atomic_xor",
            AmoOp::FetchMin => "atomic_fetch_min",
            AmoOp::Min => "atomic_min",
        }
    }

    /// Whether the operation returns the old value.
    pub fn fetches(self) -> bool {
        matches!(
            self,
            AmoOp::Fetch
                | AmoOp::Swap
                | AmoOp::CompareSwap
                | AmoOp::FetchAdd
                | AmoOp::FetchAnd
                | AmoOp::FetchOr
                | AmoOp::FetchXor
                | AmoOp::FetchMin
        )
    }
}

c_enum!(
    /// Signal update operations (`CPNET_SIGNAL_*`, OpenSHMEM 1.5 §9.8.1).
    SignalOp: u8 {
        /// `SHMEM_SIGNAL_SET`.
        Set = CPNET_SIGNAL_SET,
        /// `SHMEM_SIGNAL_ADD`.
        Add = CPNET_SIGNAL_ADD,
    }
);

c_enum!(
    /// Point-to-point comparisons (`CPNET_CMP_*`, OpenSHMEM 1.5 §9.10).
    Cmp: u8 {
        /// Equal.
        Eq = CPNET_CMP_EQ,
        /// Not equal.
        Ne = CPNET_CMP_NE,
        /// Greater than.
        Gt = CPNET_CMP_GT,
        /// Greater than or equal.
        Ge = CPNET_CMP_GE,
        /// Less than.
        Lt = CPNET_CMP_LT,
        /// Less than or equal.
        Le = CPNET_CMP_LE,
    }
);

impl Cmp {
    /// Whether `found <cmp> expected` holds.
    pub fn holds<T: PartialOrd>(self, found: T, expected: T) -> bool {
        match self {
            Cmp::Eq => found == expected,
            Cmp::Ne => found != expected,
            Cmp::Gt => found > expected,
            Cmp::Ge => found >= expected,
            Cmp::Lt => found < expected,
            Cmp::Le => found <= expected,
        }
    }
}

/// Error codes carried in the control block and the status block (`CPNET_E_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum ErrorCode {
    /// The target PE is outside `0..n_pes`.
    BadPe = CPNET_E_BAD_PE,
    /// An address range is outside the symmetric heap.
    BadAddr = CPNET_E_BAD_ADDR,
    /// An AMO or signal address is not aligned to its element size.
    BadAlign = CPNET_E_BAD_ALIGN,
    /// A size is invalid (inline payload over 8 bytes, AMO size mismatch).
    BadSize = CPNET_E_BAD_SIZE,
    /// Unknown opcode, flag, type or sub-operation.
    BadOp = CPNET_E_BAD_OP,
    /// The target PE died or left.
    PeerDead = CPNET_E_PEER_DEAD,
    /// A wait passed its timeout.
    Timeout = CPNET_E_TIMEOUT,
    /// The fabric reported an error for the operation.
    Fabric = CPNET_E_FABRIC,
    /// The job is ending.
    Aborted = CPNET_E_ABORTED,
    /// No free queue in the pool.
    NoQueue = CPNET_E_NO_QUEUE,
    /// A team handle that names no live team, or a team collective called
    /// by a PE outside the team.
    BadTeam = CPNET_E_BAD_TEAM,
}

impl ErrorCode {
    /// Every code, in cmd.h order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::BadPe,
        ErrorCode::BadAddr,
        ErrorCode::BadAlign,
        ErrorCode::BadSize,
        ErrorCode::BadOp,
        ErrorCode::PeerDead,
        ErrorCode::Timeout,
        ErrorCode::Fabric,
        ErrorCode::Aborted,
        ErrorCode::NoQueue,
        ErrorCode::BadTeam,
    ];

    /// The code for `v`, `None` for `CPNET_E_OK` and unknown values.
    pub fn from_i32(v: i32) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| *c as i32 == v)
    }

    /// A short description.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorCode::BadPe => "PE out of range",
            ErrorCode::BadAddr => "address outside the symmetric heap",
            ErrorCode::BadAlign => "misaligned atomic or signal address",
            ErrorCode::BadSize => "invalid size",
            ErrorCode::BadOp => "malformed command",
            ErrorCode::PeerDead => "peer PE is dead",
            ErrorCode::Timeout => "wait timed out",
            ErrorCode::Fabric => "fabric error",
            ErrorCode::Aborted => "job aborted",
            ErrorCode::NoQueue => "no free queue",
            ErrorCode::BadTeam => "not a live team, or this PE is not in it",
        }
    }
}

impl core::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.describe())
    }
}

impl std::error::Error for ErrorCode {}

const _: () = {
    assert!(Opcode::ALL.len() == CPNET_OP_COUNT as usize);
    assert!(AmoType::ALL.len() + 1 == CPNET_T_COUNT as usize);
    assert!(AmoOp::ALL.len() == CPNET_AMO_COUNT as usize);
    assert!(SignalOp::ALL.len() == CPNET_SIGNAL_COUNT as usize);
    assert!(Cmp::ALL.len() == CPNET_CMP_COUNT as usize);
    assert!(ErrorCode::ALL.len() + 1 == CPNET_E_COUNT as usize);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn team_data_and_ll_buffers_do_not_overlap_and_fit_the_scratch() {
        for (size, bytes) in [(1, 4096u64), (2, 128 << 10), (3, 128 << 10), (7, 1 << 20), (64, 128 << 10)] {
            let d = TeamDesc::new(0, 1, size, 0, 1 << 20, bytes).expect("a layout");
            let chunk = u64::from(d.chunk);
            assert!(chunk >= (CPNET_TEAM_CHUNK_ALIGN as u64) && chunk % (CPNET_TEAM_CHUNK_ALIGN as u64) == 0);
            assert!(u64::from(d.data_off) >= CPNET_TEAM_SCR_SIG as u64 + 8 * size as u64, "data after the signals");
            // The four buffers in order, each `size` slots of `chunk` bytes.
            assert_eq!(d.data(1, 0), d.data(0, size - 1) + chunk);
            assert_eq!(d.ll(0, 0), d.data(1, size - 1) + chunk, "LL buffers right after the data buffers");
            assert_eq!(d.ll(1, 0), d.ll(0, size - 1) + chunk);
            assert_eq!(d.ll(1, size - 1) + chunk, d.scratch + d.scratch_used());
            assert!(d.scratch_used() <= bytes, "size {size}: {} of {bytes} bytes", d.scratch_used());
        }
        assert!(TeamDesc::new(0, 1, 64, 0, 0, 4096).is_none(), "too small a scratch for 64 PEs");
    }

    #[test]
    fn agent_ll_words_carry_the_record_halves_and_the_tag() {
        let r = AgentRec { kind: 1, sub: 2, ty: 3, flags: 4, pad: 0, dst: 5, size: 6, src: 7, sig: 8, signal: 9, value: u64::MAX - 1, reserved: 0 };
        let w = r.ll_words(41);
        // SAFETY: AgentRec is repr(C), 64 bytes of integers (asserted above).
        let raw: [u32; 16] = unsafe { std::mem::transmute(r) };
        for (h, word) in w.iter().enumerate() {
            assert_eq!(word >> 32, 42, "tag of half {h}");
            assert_eq!(*word as u32, raw[h], "half {h} is the in-memory half on this little-endian host");
        }
        assert_eq!(r.ll_words(u64::from(u32::MAX))[0] >> 32, 0, "the tag wraps with the lap");
    }

    #[test]
    fn cmd_words_round_trip() {
        let c = Cmd {
            opcode: CPNET_OP_PUT_SIGNAL,
            flags: CPNET_F_BLOCKING,
            dtype: 0,
            subop: CPNET_SIGNAL_ADD,
            pe: 3,
            size: 4096,
            dst: 64,
            src: 128,
            value: 0xdead_beef,
            cond: 7,
            sig: 8,
            commit: 0,
        };
        let w = c.to_words();
        assert_eq!(w[1], 4096);
        assert_eq!(w[0] & 0xff, u64::from(CPNET_OP_PUT_SIGNAL));
        assert_eq!(w[0] >> 32, 3);
        assert_eq!(Cmd::from_words(w), c);
    }

    #[test]
    fn enums_match_header_codes() {
        for op in Opcode::ALL {
            assert_eq!(Opcode::from_u8(*op as u8), Some(*op));
        }
        assert_eq!(Opcode::from_u8(CPNET_OP_COUNT), None);
        assert!(AmoOp::FetchAdd.fetches() && !AmoOp::Add.fetches());
        assert_eq!(ErrorCode::from_i32(CPNET_E_BAD_PE), Some(ErrorCode::BadPe));
        assert_eq!(ErrorCode::from_i32(CPNET_E_OK), None);
    }
}
