//! libFuzzer target: arbitrary bytes become 64-byte command slots, each
//! pushed through a real ring and consumed by a real proxy `Service` over
//! the loopback transport, on a heap with guard regions around it; every
//! slot must be executed exactly as the reference model says or rejected
//! with one of its faults' codes, with nothing written (the harness of
//! `tests/malformed_commands.rs`, included from `tests/malformed/harness.rs`).
//! A difference, a panic, a hang (a command not complete after
//! `MAX_PASSES` service passes) or an AddressSanitizer report is a crash.
//!
//! At exit it prints how many slots went through the ring and how they
//! ended (libFuzzer's own count, "Done N runs", counts inputs).
//!
//! Input: byte 0 holds options (bit 0: heap starts zeroed, else patterned;
//! bit 1: store each slot raw, with its own commit word, before the
//! producer publishes it); then one slot per 64 bytes, the last padded
//! with zeros. The heap is refilled for every input, so a crash replays.

#![no_main]

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/malformed/harness.rs"]
mod harness;

thread_local! {
    static HARNESS: RefCell<harness::Harness> = RefCell::new(harness::Harness::new());
}

/// Slots, executed, rejected, ignored unpublished slots: copies of the
/// harness's counts for the exit report (thread-locals are gone by then).
/// Relaxed: written and read by libFuzzer's one thread (atexit runs on it).
static COUNTS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];
static AT_EXIT: Once = Once::new();

extern "C" fn report() {
    let [slots, executed, rejected, unpublished] = COUNTS.each_ref().map(|c| c.load(Ordering::Relaxed));
    eprintln!(
        "decode_execute: {slots} slots through the ring: {executed} executed, {rejected} rejected; {unpublished} unpublished slots ignored"
    );
}

fuzz_target!(|data: &[u8]| {
    // SAFETY: `report` is an extern "C" fn with no arguments that only
    // reads atomics and writes to stderr; registered once.
    AT_EXIT.call_once(|| assert_eq!(unsafe { libc::atexit(report) }, 0));
    let Some((&opts, slots)) = data.split_first() else { return };
    HARNESS.with(|h| {
        let mut h = h.borrow_mut();
        h.fill(opts & 1 != 0);
        for chunk in slots.chunks(64) {
            let mut bytes = [0u8; 64];
            bytes[..chunk.len()].copy_from_slice(chunk);
            let words: [u64; 8] = core::array::from_fn(|i| u64::from_le_bytes(bytes[8 * i..8 * i + 8].try_into().unwrap()));
            if let Err(e) = h.check(words, opts & 2 != 0) {
                panic!("{e}");
            }
        }
        let s = h.stats;
        for (c, v) in COUNTS.iter().zip([s.slots, s.executed, s.rejected_total(), s.unpublished]) {
            c.store(v, Ordering::Relaxed);
        }
    });
});
