//! Malformed commands (issue 7, reliability): random 64-byte slots, and
//! slots that are almost valid (a valid opcode with PE -1 or `n_pes`, huge
//! sizes, offsets at or past the heap end, `offset + size` overflowing,
//! misaligned AMO and signal addresses, unknown AMO types and
//! sub-operations, undefined flag bits), pushed through a real ring and a
//! real [`Service`](cpnet_proxy::service::Service) over the loopback
//! transport, on a heap with guard regions around it. Every slot is either
//! executed exactly as a reference model says or rejected with one of its
//! faults' codes, with nothing written; the proxy never panics and never
//! hangs. The harness (ring, service, guarded heap, model) is in
//! `malformed/harness.rs`, shared with the libFuzzer target in `fuzz/`.
//!
//! `PROPTEST_CASES` sets the number of random slots (default
//! [`DEFAULT_CASES`]); the test prints how many ran and how they ended.

use std::cell::RefCell;
use std::time::Instant;

use cpnet_device::layout::*;
use cpnet_device::ring::Outcome;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

#[path = "malformed/harness.rs"]
mod harness;

use harness::{Expect, HEAP, Harness, N_PES};

/// Random slots per run when `PROPTEST_CASES` is not set: a few seconds
/// (about 6) in a debug build on a 2-core CI machine.
const DEFAULT_CASES: u32 = 50_000;

/// Heap offsets: inside, at and just past the end, aligned or not, and the
/// values that overflow `offset + size`.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=HEAP,
        3 => (0..HEAP / 8).prop_map(|w| w * 8),
        1 => HEAP - 16..=HEAP + 16,
        1 => prop::sample::select(vec![0, HEAP, HEAP + 1, HEAP + 8, 1 << 32, 1 << 63, u64::MAX - HEAP, u64::MAX - 8, u64::MAX - 7, u64::MAX]),
        1 => any::<u64>(),
    ]
}

/// Sizes: inline sizes and one past them, whole heap, one past it, huge.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0..=9u64,
        2 => 0..=HEAP,
        1 => prop::sample::select(vec![16, 64, HEAP - 1, HEAP, HEAP + 1, 1 << 32, 1 << 63, u64::MAX - 1, u64::MAX]),
        1 => any::<u64>(),
    ]
}

/// Target PEs: the valid one, -1, `n_pes`, extremes.
fn pe() -> impl Strategy<Value = i32> {
    prop_oneof![
        6 => Just(0),
        2 => prop::sample::select(vec![-1, N_PES, N_PES + 1, i32::MIN, i32::MAX]),
        1 => any::<i32>(),
    ]
}

/// AMO operands and compare values (0 makes compare-and-swap hit on a zero heap).
fn operand() -> impl Strategy<Value = u64> {
    prop_oneof![
        2 => Just(0u64),
        1 => prop::sample::select(vec![1, u64::from(u32::MAX), u64::MAX, 1 << 32]),
        3 => any::<u64>(),
    ]
}

/// A byte that is usually `valid`'s and sometimes anything.
fn mostly(valid: impl Strategy<Value = u8> + 'static) -> BoxedStrategy<u8> {
    prop_oneof![12 => valid, 1 => any::<u8>()].boxed()
}

/// A command with a valid opcode (mostly) and each field near or at an edge.
fn near_valid() -> impl Strategy<Value = [u64; SLOT_WORDS]> {
    mostly(0..CPNET_OP_COUNT)
        .prop_flat_map(|op| {
            let dtype = if op == CPNET_OP_AMO { mostly(1..CPNET_T_COUNT) } else { mostly(Just(CPNET_T_NONE)) };
            let subop = match op {
                CPNET_OP_AMO => mostly(0..CPNET_AMO_COUNT),
                CPNET_OP_PUT_SIGNAL => mostly(0..CPNET_SIGNAL_COUNT),
                _ => mostly(Just(0)),
            };
            let flags = mostly(0..=CPNET_F_ALL);
            (
                (Just(op), flags, dtype, subop, pe(), any::<bool>()),
                (size(), offset(), offset(), operand(), operand(), offset(), any::<u64>()),
            )
        })
        .prop_map(|((opcode, flags, dtype, subop, pe, amo_size), (mut size, dst, src, value, cond, sig, commit))| {
            // Most AMOs carry their type's size, so that the other fields decide.
            if opcode == CPNET_OP_AMO && amo_size {
                size = match dtype {
                    CPNET_T_INT32 | CPNET_T_UINT32 => 4,
                    CPNET_T_INT64 | CPNET_T_UINT64 => 8,
                    _ => size,
                };
            }
            Cmd { opcode, flags, dtype, subop, pe, size, dst, src, value, cond, sig, commit }.to_words()
        })
}

/// A slot (random words, or near-valid), whether the heap starts zeroed,
/// and whether the slot is first stored raw with its own commit word.
fn case() -> impl Strategy<Value = ([u64; SLOT_WORDS], bool, bool)> {
    let slot = prop_oneof![1 => proptest::array::uniform8(any::<u64>()), 4 => near_valid()];
    (slot, any::<bool>(), prop::bool::weighted(0.25))
}

#[test]
fn malformed_commands_execute_or_reject() {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CASES);
    // No failure file (proptest finds no lib.rs beside an integration test
    // to put it next to): a failure prints its minimal input instead.
    let mut runner = TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() });
    let h = RefCell::new(Harness::new());
    let t = Instant::now();
    let r = runner.run(&case(), |(words, zero_heap, raw)| {
        let mut h = h.borrow_mut();
        h.fill(zero_heap);
        h.check(words, raw).map(drop).map_err(TestCaseError::fail)
    });
    let s = h.borrow().stats;
    let names = ["ok", "BAD_PE", "BAD_ADDR", "BAD_ALIGN", "BAD_SIZE", "BAD_OP"];
    let by_code: Vec<String> = names.iter().enumerate().skip(1).map(|(c, n)| format!("{n} {}", s.rejected[c])).collect();
    println!(
        "malformed_commands: {cases} cases, {} slots through the ring in {:.2} s: {} executed, {} rejected ({}); {} unpublished slots ignored",
        s.slots,
        t.elapsed().as_secs_f64(),
        s.executed,
        s.rejected_total(),
        by_code.join(", "),
        s.unpublished,
    );
    if let Err(e) = r {
        panic!("{e}");
    }
    if cases >= 5000 {
        // The strategies reach every outcome.
        assert!(s.executed > u64::from(cases) / 20, "too few executed: {s:?}");
        for c in [CPNET_E_BAD_PE, CPNET_E_BAD_ADDR, CPNET_E_BAD_ALIGN, CPNET_E_BAD_SIZE, CPNET_E_BAD_OP] {
            assert!(s.rejected[c as usize] > 0, "no rejection with code {c}: {s:?}");
        }
    }
}

/// Named edge cases, each with the one code it must get (or executed).
#[test]
fn edge_cases_get_their_codes() {
    let mut h = Harness::new();
    let put = |dst, src, size| Cmd::put(0, dst, src, size);
    let amo = |ty, op, dst| Cmd::amo(0, ty, op, dst, 5, 0);
    let reject = |c: i32| Expect::Reject(1 << c);
    let cases: Vec<(&str, Cmd, Option<Expect>)> = vec![
        ("PE -1", Cmd::put(-1, 0, 0, 8), Some(reject(CPNET_E_BAD_PE))),
        ("PE n_pes", Cmd::get(N_PES, 0, 0, 8), Some(reject(CPNET_E_BAD_PE))),
        ("dst at the end", put(HEAP, 0, 1), Some(reject(CPNET_E_BAD_ADDR))),
        ("src one past the end", put(0, HEAP - 7, 8), Some(reject(CPNET_E_BAD_ADDR))),
        ("offset + size overflows", put(u64::MAX - 2, 0, 8), Some(reject(CPNET_E_BAD_ADDR))),
        ("size overflows from 1", put(1, 0, u64::MAX), Some(reject(CPNET_E_BAD_ADDR))),
        ("huge get", Cmd::get(0, 0, 0, 1 << 63), Some(reject(CPNET_E_BAD_ADDR))),
        ("zero bytes at the end", put(HEAP, HEAP, 0), Some(Expect::Accept(Outcome::Done))),
        ("whole heap onto itself", put(0, 0, HEAP), Some(Expect::Accept(Outcome::Done))),
        ("overlapping copy", put(1, 0, HEAP - 1), Some(Expect::Accept(Outcome::Done))),
        ("last word", amo(AmoType::Uint64, AmoOp::FetchAdd, HEAP - 8), None),
        ("misaligned u64 AMO", amo(AmoType::Int64, AmoOp::Add, 4), Some(reject(CPNET_E_BAD_ALIGN))),
        ("misaligned u32 AMO", amo(AmoType::Uint32, AmoOp::Swap, 2), Some(reject(CPNET_E_BAD_ALIGN))),
        ("AMO past the end", amo(AmoType::Int32, AmoOp::Set, HEAP), Some(reject(CPNET_E_BAD_ADDR))),
        ("u32 AMO on the last word", amo(AmoType::Uint32, AmoOp::CompareSwap, HEAP - 4), None),
        ("signal misaligned", Cmd::put_signal(0, 0, 8, 8, 12, 1, SignalOp::Add), Some(reject(CPNET_E_BAD_ALIGN))),
        ("signal past the end", Cmd::put_signal(0, 0, 8, 8, HEAP, 1, SignalOp::Set), Some(reject(CPNET_E_BAD_ADDR))),
        ("signal overlaps data", Cmd::put_signal(0, 64, 0, 16, 64, 3, SignalOp::Add), Some(Expect::Accept(Outcome::Done))),
    ];
    let mut mutated = vec![];
    let mut c = Cmd::put_inline(0, 0, &[1; 8]).unwrap();
    c.size = 9;
    mutated.push(("inline put of 9 bytes", c, Some(reject(CPNET_E_BAD_SIZE))));
    let mut c = Cmd::get_inline(0, 0, 8).unwrap();
    c.size = 9;
    mutated.push(("inline get of 9 bytes", c, Some(reject(CPNET_E_BAD_SIZE))));
    let mut c = amo(AmoType::Uint64, AmoOp::Add, 0);
    c.size = 4;
    mutated.push(("AMO size not its type's", c, Some(reject(CPNET_E_BAD_SIZE))));
    let mut c = amo(AmoType::Uint64, AmoOp::Add, 0);
    c.dtype = CPNET_T_COUNT;
    mutated.push(("unknown AMO type", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = amo(AmoType::Uint64, AmoOp::Add, 0);
    c.dtype = CPNET_T_NONE;
    mutated.push(("AMO without a type", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = amo(AmoType::Uint64, AmoOp::Add, 0);
    c.subop = CPNET_AMO_COUNT;
    mutated.push(("unknown AMO op", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = Cmd::put_signal(0, 0, 8, 8, 16, 1, SignalOp::Set);
    c.subop = CPNET_SIGNAL_COUNT;
    mutated.push(("unknown signal op", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = put(0, 8, 8);
    c.flags = 0x80;
    mutated.push(("undefined flag bit", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = put(0, 8, 8);
    c.dtype = CPNET_T_UINT64;
    mutated.push(("type on a put", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = Cmd::fence();
    c.subop = 1;
    mutated.push(("sub-operation on a fence", c, Some(reject(CPNET_E_BAD_OP))));
    let mut c = Cmd::nop();
    c.opcode = 0xff;
    mutated.push(("opcode 255", c, Some(reject(CPNET_E_BAD_OP))));
    mutated.push(("inline get of the last 8 bytes", Cmd::get_inline(0, HEAP - 8, 8).unwrap(), None));
    mutated.push(("inline get of 3 bytes", Cmd::get_inline(0, 5, 3).unwrap(), None));
    mutated.push(("inline get of 0 bytes at the end", Cmd::get_inline(0, HEAP, 0).unwrap(), Some(Expect::Accept(Outcome::Value(0)))));
    mutated.push(("inline get past the end", Cmd::get_inline(0, HEAP - 4, 8).unwrap(), Some(reject(CPNET_E_BAD_ADDR))));
    mutated.push(("blocking nop", Cmd::nop().blocking(), Some(Expect::Accept(Outcome::Done))));
    mutated.push(("barrier", Cmd::barrier_all(), Some(Expect::Accept(Outcome::Done))));
    for zero_heap in [false, true] {
        for (what, cmd, want) in cases.iter().chain(&mutated) {
            for raw in [false, true] {
                h.fill(zero_heap);
                let got = h.check(cmd.to_words(), raw).unwrap_or_else(|e| panic!("{what}: {e}"));
                if let Some(want) = want {
                    assert_eq!(&got, want, "{what}");
                }
            }
        }
    }
    // The fetching AMO on the last word and the inline get returned values
    // (checked against the model inside `check`).
    assert!(h.stats.executed > 0 && h.stats.rejected_total() > 0);
}
