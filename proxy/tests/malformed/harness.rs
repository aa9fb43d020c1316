//! The harness behind the malformed-command checks: the property test
//! `tests/malformed_commands.rs` and the libFuzzer target
//! `fuzz/fuzz_targets/decode_execute.rs` both include this file.
//!
//! One [`Harness`] is one real queue ([`QueuePool::new_host`], written by a
//! real [`Producer`]) consumed by a real [`Service`] over a
//! [`LoopbackTransport`] on a host heap of [`HEAP`] bytes that sits between
//! two guard regions of [`GUARD`] bytes (one allocation; the service and the
//! decoder's [`Limits`] see only the middle). [`Harness::check`] pushes one
//! 64-byte slot through it, polls the service until the command completes
//! (at most [`MAX_PASSES`] passes: a command that never completes is a
//! failure, not a hang), and compares everything the proxy can touch with
//! [`model`], a small reference model written from the command layout of
//! `cmd.h` (not from `decode.rs`):
//!
//! - rejected: the code is one of the faults the model finds in the slot,
//!   the service's report names the queue, seq, operation, PE, address and
//!   size, the control block's `error`/`error_seq` (and `reply`, for a
//!   blocking command) carry the code, the producer's waits return
//!   `Rejected` with it, and not one byte of the heap or the guards changed;
//! - accepted: no report, the heap equals the model's heap byte for byte,
//!   fetched values (inline get, fetching AMOs) arrive in `result` and
//!   through the producer's waits, and the guards are untouched.

#![allow(dead_code)] // each includer uses its own part of the harness

use cpnet_device::cpu::{HeapView, HostHeap, SymAddr};
use cpnet_device::layout::*;
use cpnet_device::ring::{Outcome, Producer, QueueGeometry, QueuePool, RingError};
use cpnet_device::sync::{Deadline, Ordering};
use cpnet_proxy::decode::Limits;
use cpnet_proxy::service::{LoopbackTransport, Service};

/// Bytes of the heap the proxy serves (the decoder's `heap_size`).
pub const HEAP: u64 = 4096;
/// Bytes of each guard region, below and above the heap.
pub const GUARD: usize = 4096;
/// Number of PEs in the decoder's limits (a single-PE job: every valid
/// target is this PE, served by the loopback transport).
pub const N_PES: i32 = 1;
/// Work-group id recorded as the queue's owner (checked in reports).
pub const OWNER: u32 = 7;
/// Ring depth: small, so slots are reused every few commands (laps).
pub const DEPTH: u32 = 4;
/// Service passes after which a command that has not completed is a hang.
pub const MAX_PASSES: u32 = 1000;

const SLOT0_WORD: usize = CPNET_QUEUE_OFF_SLOTS / 8;

/// What the reference model expects of one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Rejected; the code must be one of the faults in this bit set
    /// (bit `code` set for each `CPNET_E_*` the slot violates).
    Reject(u32),
    /// Executed; the model's heap is the expected heap.
    Accept(Outcome),
}

/// Counts of what the harness saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Slots pushed through the ring.
    pub slots: u64,
    /// Executed (accepted by the decoder).
    pub executed: u64,
    /// Rejected, per `CPNET_E_*` code (index = code).
    pub rejected: [u64; CPNET_E_COUNT as usize],
    /// Slots first written with a commit word that does not publish them,
    /// checked to be ignored by the consumer.
    pub unpublished: u64,
}

impl Stats {
    /// Rejected in total.
    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }
}

/// One queue, one service and one guarded heap.
pub struct Harness {
    // Declared (and so dropped) before `mem`: the service's transport and
    // the heap view point into it.
    svc: Service<LoopbackTransport>,
    prod: Producer,
    full: HeapView,
    mem: HostHeap,
    before: Vec<u8>,
    expect: Vec<u8>,
    after: Vec<u8>,
    /// The two fillings of [`Harness::fill`]: zero heap, pattern heap.
    templates: [Vec<u8>; 2],
    /// What has been seen so far.
    pub stats: Stats,
}

fn heap_range() -> core::ops::Range<usize> {
    GUARD..GUARD + HEAP as usize
}

impl Default for Harness {
    fn default() -> Self {
        Harness::new()
    }
}

impl Harness {
    /// A fresh queue (depth [`DEPTH`], claimed by [`OWNER`]), service and heap.
    pub fn new() -> Harness {
        let total = 2 * GUARD + HEAP as usize;
        let mem = HostHeap::new(total as u64);
        let full = mem.view();
        // SAFETY: GUARD..GUARD + HEAP lies inside the allocation of `total`
        // bytes; GUARD is a multiple of 64, so the base stays 64-aligned;
        // `mem` lives in the same struct and is dropped after the service
        // (field order). This thread is the only one that touches it.
        let heap = unsafe { HeapView::from_raw(full.base().add(GUARD), HEAP) };
        let pool = QueuePool::new_host(1, QueueGeometry::new(DEPTH).expect("depth"));
        let q = pool.queue(0);
        assert!(q.try_claim(OWNER));
        let prod = Producer::new(q.clone());
        let svc = Service::new(vec![q], LoopbackTransport::new(heap), Limits { n_pes: N_PES, heap_size: HEAP }, 0);
        let template = |zero_heap: bool| -> Vec<u8> {
            (0..total)
                .map(|i| if zero_heap && heap_range().contains(&i) { 0 } else { (i as u32).wrapping_mul(0x9E37_79B1).to_le_bytes()[3] ^ 0xA5 })
                .collect()
        };
        Harness {
            svc,
            prod,
            full,
            mem,
            before: vec![0; total],
            expect: vec![0; total],
            after: vec![0; total],
            templates: [template(true), template(false)],
            stats: Stats::default(),
        }
    }

    /// Fill the whole allocation deterministically: the guards with a
    /// pattern, the heap with zeros (`zero_heap`, so that compare-and-swap
    /// with `cond == 0` hits) or with the same kind of pattern.
    pub fn fill(&mut self, zero_heap: bool) {
        let t = &self.templates[usize::from(!zero_heap)];
        self.full.write_bytes(SymAddr(0), t).expect("fill");
    }

    /// Push `words` (a whole slot; its commit word is the producer's to
    /// write) through the ring and the service, and check the result against
    /// the model. With `unpublished_first`, the eight words are first
    /// stored into the slot raw, commit word included: unless that commit
    /// word happens to publish the slot, the consumer must ignore it.
    ///
    /// # Errors
    /// A description of the first difference from the model.
    pub fn check(&mut self, words: [u64; SLOT_WORDS], unpublished_first: bool) -> Result<Expect, String> {
        let cmd = Cmd::from_words(words);
        let seq = self.prod.write_idx();
        let ctl0 = self.prod.mem().ctl_snapshot();
        self.full.read_bytes(SymAddr(0), &mut self.before).expect("snapshot");

        if unpublished_first && words[CPNET_CMD_COMMIT_WORD] != seq + 1 {
            self.write_raw(seq, words);
            for _ in 0..3 {
                self.svc.poll_once();
            }
            let ctl = self.prod.mem().ctl_snapshot();
            if ctl.consumed != seq || ctl != ctl0 {
                return Err(format!("an unpublished slot (commit {:#x}, seq {seq}) was taken: {ctl:?}", words[7]));
            }
            if let Some(d) = self.diff_since_before() {
                return Err(format!("an unpublished slot changed memory: {d}"));
            }
            self.stats.unpublished += 1;
        }

        self.expect.copy_from_slice(&self.before);
        let exp = model(&cmd, &mut self.expect[heap_range()]);
        self.prod.try_push(&cmd).ok_or("ring full with nothing outstanding")?;
        self.stats.slots += 1;
        let mut passes = 0;
        while self.prod.completed() <= seq {
            if passes == MAX_PASSES {
                return Err(format!("{cmd:?} (seq {seq}) not complete after {MAX_PASSES} service passes"));
            }
            self.svc.poll_once();
            passes += 1;
        }
        let ctl = self.prod.mem().ctl_snapshot();
        let errors = self.svc.take_errors();
        let blocking = cmd.flags & CPNET_F_BLOCKING != 0;
        let ctx = || format!("{cmd:?} (seq {seq}), model {exp:?}");
        if ctl.consumed != seq + 1 || ctl.completed != seq + 1 || self.svc.outstanding() != 0 {
            return Err(format!("{}: queue not quiescent after it: {ctl:?}", ctx()));
        }
        self.full.read_bytes(SymAddr(0), &mut self.after).expect("snapshot");
        if let Some(d) = first_diff(&self.after, &self.expect) {
            return Err(format!("{}: memory differs from the model: {d}", ctx()));
        }
        match exp {
            Expect::Reject(allowed) => {
                let [e] = &errors[..] else { return Err(format!("{}: {} reports, expected 1: {errors:?}", ctx(), errors.len())) };
                let code = e.code as i32;
                if allowed & (1 << code) == 0 {
                    return Err(format!("{}: rejected with {:?}, which is not one of its faults", ctx(), e.code));
                }
                let addr = if cmd.opcode == CPNET_OP_GET { cmd.src } else { cmd.dst };
                let named = e.my_pe == 0
                    && e.wg == OWNER
                    && e.queue == 0
                    && e.seq == seq
                    && e.op == cmd.op_name()
                    && e.pe == cmd.pe
                    && e.addr == addr
                    && e.size == cmd.size;
                if !named {
                    return Err(format!("{}: report does not name the command: {e:?}", ctx()));
                }
                if ctl.error_seq != seq + 1 || ctl.error != code || ctl.result_seq != ctl0.result_seq {
                    return Err(format!("{}: control block after rejection: {ctl:?}", ctx()));
                }
                let want_reply = if blocking { ((seq + 1) << 8) | code as u64 } else { ctl0.reply };
                if ctl.reply != want_reply {
                    return Err(format!("{}: reply {:#x}, expected {want_reply:#x}", ctx(), ctl.reply));
                }
                let rejected = Err(RingError::Rejected { seq, code: e.code });
                if blocking {
                    let r = self.prod.wait_reply(seq, false, &Deadline::never());
                    if r != rejected.clone() {
                        return Err(format!("{}: producer's wait_reply gave {r:?}", ctx()));
                    }
                }
                let r = self.prod.wait_complete(seq, false, &Deadline::never());
                if r != rejected {
                    return Err(format!("{}: producer's wait_complete gave {r:?}", ctx()));
                }
                self.stats.rejected[code as usize] += 1;
            }
            Expect::Accept(outcome) => {
                if !errors.is_empty() {
                    return Err(format!("{}: accepted by the model, reported: {errors:?}", ctx()));
                }
                if ctl.error_seq != ctl0.error_seq {
                    return Err(format!("{}: error word written for an accepted command: {ctl:?}", ctx()));
                }
                let value = match outcome {
                    Outcome::Value(v) => {
                        if ctl.result != v || ctl.result_seq != seq + 1 {
                            return Err(format!("{}: result {:#x} (seq {}), expected {v:#x}", ctx(), ctl.result, ctl.result_seq));
                        }
                        Some(v)
                    }
                    _ => {
                        if ctl.result_seq != ctl0.result_seq {
                            return Err(format!("{}: result written for a command that returns none: {ctl:?}", ctx()));
                        }
                        None
                    }
                };
                let want_reply = if blocking { (seq + 1) << 8 } else { ctl0.reply };
                if ctl.reply != want_reply {
                    return Err(format!("{}: reply {:#x}, expected {want_reply:#x}", ctx(), ctl.reply));
                }
                let want = Ok(value.unwrap_or(0));
                if blocking {
                    let r = self.prod.wait_reply(seq, value.is_some(), &Deadline::never());
                    if r != want {
                        return Err(format!("{}: producer's wait_reply gave {r:?}", ctx()));
                    }
                }
                let r = self.prod.wait_complete(seq, value.is_some(), &Deadline::never());
                if r != want {
                    return Err(format!("{}: producer's wait_complete gave {r:?}", ctx()));
                }
                self.stats.executed += 1;
            }
        }
        Ok(exp)
    }

    /// Store all eight words of slot `seq`, commit word included, as a
    /// producer that publishes garbage would.
    fn write_raw(&self, seq: u64, words: [u64; SLOT_WORDS]) {
        let mem = self.prod.mem();
        let slot = SLOT0_WORD + (seq & mem.geometry().mask()) as usize * SLOT_WORDS;
        for (w, &v) in words.iter().enumerate() {
            // Release: as P3 would (pairs with the consumer's acquire load
            // of the commit word in C1); the test only needs the stores.
            mem.words().word(slot + w).store(v, Ordering::Release);
        }
    }

    fn diff_since_before(&mut self) -> Option<String> {
        self.full.read_bytes(SymAddr(0), &mut self.after).expect("snapshot");
        first_diff(&self.after, &self.before)
    }
}

/// Where `got` first differs from `want` (whole allocation: guards and
/// heap), named by region.
fn first_diff(got: &[u8], want: &[u8]) -> Option<String> {
    if got == want {
        return None; // memcmp: the common case, fast even in a debug build
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b)?;
    let region = if i < GUARD {
        format!("LOW GUARD at heap-{:#x}", GUARD - i)
    } else if i < GUARD + HEAP as usize {
        format!("heap+{:#x}", i - GUARD)
    } else {
        format!("HIGH GUARD at heap+{:#x}", i - GUARD)
    };
    let n = got[i..].iter().zip(&want[i..]).filter(|(a, b)| a != b).count();
    Some(format!("{region}: {:#04x}, expected {:#04x} ({n} bytes differ from there on)", got[i], want[i]))
}

fn bit(code: i32) -> u32 {
    1 << code
}

/// The reference model: what a proxy must do with `cmd` on a single-PE job
/// whose heap is `heap` (updated in place when the command executes).
///
/// Written from the field descriptions of `cmd.h`: an opcode below
/// `CPNET_OP_COUNT`, no flag bit outside `CPNET_F_ALL`, `dtype` NONE except
/// for AMOs, `subop` 0 except for AMOs (`CPNET_AMO_*`) and PUT_SIGNAL
/// (`CPNET_SIGNAL_*`); a target PE in `0..n_pes`; every byte range
/// (`offset + size`, without wrapping) inside the heap; inline payloads of
/// at most 8 bytes; an AMO's `size` equal to its type's and its address
/// aligned to it; the signal word 8 bytes, 8-aligned; no `CPNET_F_PAYLOAD`
/// (the queue has no payload slots). A slot that breaks any
/// rule is rejected with the code of one of the rules it breaks; the set of
/// all of them is returned.
pub fn model(cmd: &Cmd, heap: &mut [u8]) -> Expect {
    let hs = heap.len() as u64;
    let fits = |off: u64, len: u64| off.checked_add(len).is_some_and(|end| end <= hs);
    let mut bad = 0u32;
    let op = cmd.opcode;
    if op >= CPNET_OP_COUNT {
        return Expect::Reject(bit(CPNET_E_BAD_OP));
    }
    if cmd.flags & !CPNET_F_ALL != 0 {
        bad |= bit(CPNET_E_BAD_OP);
    }
    // Payload slots (cmd.h P0) belong to GPU PEs' queues; this one has none,
    // so the flag is refused on every opcode.
    if cmd.flags & CPNET_F_PAYLOAD != 0 {
        bad |= bit(CPNET_E_BAD_OP);
    }
    if op != CPNET_OP_AMO && cmd.dtype != CPNET_T_NONE {
        bad |= bit(CPNET_E_BAD_OP);
    }
    if op != CPNET_OP_AMO && op != CPNET_OP_PUT_SIGNAL && cmd.subop != 0 {
        bad |= bit(CPNET_E_BAD_OP);
    }
    let inline = cmd.flags & CPNET_F_INLINE != 0;
    let inline_max = CPNET_INLINE_MAX as u64;
    if matches!(op, CPNET_OP_PUT | CPNET_OP_GET | CPNET_OP_PUT_SIGNAL | CPNET_OP_AMO) && !(0..N_PES).contains(&cmd.pe) {
        bad |= bit(CPNET_E_BAD_PE);
    }
    // The put part of PUT and PUT_SIGNAL: source (inline or heap), destination.
    let put_checks = |bad: &mut u32| {
        if inline {
            if cmd.size > inline_max {
                *bad |= bit(CPNET_E_BAD_SIZE);
            }
        } else if !fits(cmd.src, cmd.size) {
            *bad |= bit(CPNET_E_BAD_ADDR);
        }
        if !fits(cmd.dst, cmd.size) {
            *bad |= bit(CPNET_E_BAD_ADDR);
        }
    };
    let mut amo_size = 0u64;
    match op {
        CPNET_OP_PUT => put_checks(&mut bad),
        CPNET_OP_GET => {
            if !fits(cmd.src, cmd.size) {
                bad |= bit(CPNET_E_BAD_ADDR);
            }
            if inline {
                if cmd.size > inline_max {
                    bad |= bit(CPNET_E_BAD_SIZE);
                }
            } else if !fits(cmd.dst, cmd.size) {
                bad |= bit(CPNET_E_BAD_ADDR);
            }
        }
        CPNET_OP_PUT_SIGNAL => {
            if cmd.subop >= CPNET_SIGNAL_COUNT {
                bad |= bit(CPNET_E_BAD_OP);
            }
            put_checks(&mut bad);
            if !fits(cmd.sig, 8) {
                bad |= bit(CPNET_E_BAD_ADDR);
            }
            if !cmd.sig.is_multiple_of(8) {
                bad |= bit(CPNET_E_BAD_ALIGN);
            }
        }
        CPNET_OP_AMO => {
            if cmd.subop >= CPNET_AMO_COUNT {
                bad |= bit(CPNET_E_BAD_OP);
            }
            amo_size = match cmd.dtype {
                CPNET_T_INT32 | CPNET_T_UINT32 => 4,
                CPNET_T_INT64 | CPNET_T_UINT64 => 8,
                _ => {
                    bad |= bit(CPNET_E_BAD_OP);
                    0
                }
            };
            if amo_size != 0 {
                if cmd.size != amo_size {
                    bad |= bit(CPNET_E_BAD_SIZE);
                }
                if !fits(cmd.dst, amo_size) {
                    bad |= bit(CPNET_E_BAD_ADDR);
                }
                if !cmd.dst.is_multiple_of(amo_size) {
                    bad |= bit(CPNET_E_BAD_ALIGN);
                }
            }
        }
        _ => {} // NOP, FENCE, QUIET, BARRIER_ALL: no operands
    }
    if bad != 0 {
        return Expect::Reject(bad);
    }

    // Valid: execute on the model heap.
    let r = |h: &[u8], off: u64, n: u64| -> u64 {
        let mut b = [0u8; 8];
        b[..n as usize].copy_from_slice(&h[off as usize..(off + n) as usize]);
        u64::from_le_bytes(b)
    };
    let w = |h: &mut [u8], off: u64, n: u64, v: u64| {
        h[off as usize..(off + n) as usize].copy_from_slice(&v.to_le_bytes()[..n as usize]);
    };
    let put = |h: &mut [u8]| {
        let data: Vec<u8> = if inline {
            cmd.value.to_le_bytes()[..cmd.size as usize].to_vec()
        } else {
            h[cmd.src as usize..(cmd.src + cmd.size) as usize].to_vec()
        };
        h[cmd.dst as usize..(cmd.dst + cmd.size) as usize].copy_from_slice(&data);
    };
    match op {
        CPNET_OP_PUT => {
            put(heap);
            Expect::Accept(Outcome::Done)
        }
        CPNET_OP_GET if inline => Expect::Accept(Outcome::Value(r(heap, cmd.src, cmd.size))),
        CPNET_OP_GET => {
            let data = heap[cmd.src as usize..(cmd.src + cmd.size) as usize].to_vec();
            heap[cmd.dst as usize..(cmd.dst + cmd.size) as usize].copy_from_slice(&data);
            Expect::Accept(Outcome::Done)
        }
        CPNET_OP_PUT_SIGNAL => {
            put(heap);
            let old = r(heap, cmd.sig, 8);
            let new = if cmd.subop == CPNET_SIGNAL_SET { cmd.cond } else { old.wrapping_add(cmd.cond) };
            w(heap, cmd.sig, 8, new);
            Expect::Accept(Outcome::Done)
        }
        CPNET_OP_AMO => {
            let mask = if amo_size == 8 { u64::MAX } else { u64::from(u32::MAX) };
            let (v, c) = (cmd.value & mask, cmd.cond & mask);
            let old = r(heap, cmd.dst, amo_size);
            let new = match cmd.subop {
                CPNET_AMO_FETCH => old,
                CPNET_AMO_SET | CPNET_AMO_SWAP => v,
                CPNET_AMO_COMPARE_SWAP => {
                    if old == c {
                        v
                    } else {
                        old
                    }
                }
                CPNET_AMO_FETCH_ADD | CPNET_AMO_ADD => old.wrapping_add(v) & mask,
                CPNET_AMO_FETCH_AND | CPNET_AMO_AND => old & v,
                CPNET_AMO_FETCH_OR | CPNET_AMO_OR => old | v,
                CPNET_AMO_FETCH_MIN | CPNET_AMO_MIN => {
                    let signed = matches!(cmd.dtype, CPNET_T_INT32 | CPNET_T_INT64);
                    let as_signed = |x: u64| if amo_size == 8 { x as i64 } else { i64::from(x as u32 as i32) };
                    let less = if signed { as_signed(v) < as_signed(old) } else { v < old };
                    if less { v } else { old }
                }
                _ => old ^ v, // FETCH_XOR, XOR
            };
            w(heap, cmd.dst, amo_size, new);
            let fetches = matches!(
                cmd.subop,
                CPNET_AMO_FETCH
                    | CPNET_AMO_SWAP
                    | CPNET_AMO_COMPARE_SWAP
                    | CPNET_AMO_FETCH_ADD
                    | CPNET_AMO_FETCH_AND
                    | CPNET_AMO_FETCH_OR
                    | CPNET_AMO_FETCH_XOR
                    | CPNET_AMO_FETCH_MIN
            );
            Expect::Accept(if fetches { Outcome::Value(old) } else { Outcome::Done })
        }
        _ => Expect::Accept(Outcome::Done),
    }
}
