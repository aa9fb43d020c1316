//! libFuzzer target: arbitrary bytes become 64-byte command slots, each
//! pushed through a real ring and consumed by a real proxy `Service` over
//! the loopback transport, on a heap with guard regions around it; every
//! slot must be executed exactly as the reference model says or rejected
//! with one of its faults' codes, with nothing written (the harness of
//! `tests/malformed_commands.rs`, included from `tests/malformed/harness.rs`).
//! A difference, a panic, a hang (a command not complete after
//! `MAX_PASSES` service passes) or an AddressSanitizer report is a crash.
//!
//! Input: byte 0 holds options (bit 0: heap starts zeroed, else patterned;
//! bit 1: store each slot raw, with its own commit word, before the
//! producer publishes it); then one slot per 64 bytes, the last padded
//! with zeros. The heap is refilled for every input, so a crash replays.

#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;

#[path = "../../tests/malformed/harness.rs"]
mod harness;

thread_local! {
    static HARNESS: RefCell<harness::Harness> = RefCell::new(harness::Harness::new());
}

fuzz_target!(|data: &[u8]| {
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
    });
});
