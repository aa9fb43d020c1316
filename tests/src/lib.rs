//! # cpnet-tests
//!
//! Multi-PE integration tests: `cpnet-check` (src/bin) holds the scenarios,
//! each run as N real processes under the launcher by `tests/multi_pe.rs`,
//! over the real libfabric providers (`shm`, `tcp;ofi_rxm`).
//!
//! This library holds what the scenarios share.
#![warn(missing_docs)]

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

/// A seeded random stream for the stress scenarios (reproducible per seed,
/// PE and work-group).
pub struct Rng(StdRng);

impl Rng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }

    /// 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0.random()
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
}

/// Compare two byte strings; on mismatch a message with the first differing
/// offset and both values, prefixed by `what()`.
///
/// # Errors
/// The message, when they differ.
pub fn check_eq(got: &[u8], want: &[u8], what: impl FnOnce() -> String) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    if got.len() != want.len() {
        return Err(format!("{}: {} bytes, expected {}", what(), got.len(), want.len()));
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
    let bad = got.iter().zip(want).filter(|(a, b)| a != b).count();
    Err(format!("{}: {bad} of {} bytes differ, first at offset {i}: {:#04x}, expected {:#04x}", what(), got.len(), got[i], want[i]))
}
