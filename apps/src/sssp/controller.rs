//! How delta-stepping chooses its bucket width (`delta`) and how many
//! work-groups relax each round: a fixed-delta baseline, and an online
//! controller that adapts both from measured progress.
//!
//! The adaptive controller runs at every bucket boundary on numbers every
//! PE has after the same reductions (so every PE takes the same decision):
//! the vertices the finished bucket settled (summed over the PEs), the
//! rounds it took and its time (the slowest PE's). Its progress rate is
//! settled vertices per second. It hill-climbs on that rate: it keeps
//! scaling delta in the same direction (x2 or /2) while the rate does not
//! fall and turns around when it does; a bucket that needed more than
//! [`MAX_ROUNDS`] rounds (vertices relaxed again and again: delta too wide,
//! Bellman-Ford-like rework) halves delta at once, and a bucket that
//! settled fewer than [`MIN_SETTLED`] vertices per active work-group
//! (delta too narrow: rounds with nothing to do) doubles it. Delta stays
//! within [`RANGE`] times its initial value either way. The active
//! work-groups of a round are `ceil(near / GRAIN)`, at most the PE's
//! work-groups: small frontiers do not wake every work-group.

/// A bucket that took more rounds than this halves delta.
pub const MAX_ROUNDS: u32 = 8;
/// A bucket that settled fewer vertices than this per active work-group doubles delta.
pub const MIN_SETTLED: u64 = 64;
/// Delta stays within `initial / RANGE ..= initial * RANGE`.
pub const RANGE: u64 = 64;
/// Near vertices (over all PEs, per PE-work-group) that justify one more active work-group.
pub const GRAIN: u64 = 256;

/// Fixed delta or the adaptive controller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// The baseline: delta and the work-groups stay as given.
    Fixed,
    /// Adapt delta and the active work-groups from measured progress.
    Adaptive,
}

/// What a finished bucket measured (the same on every PE).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Bucket {
    /// Vertices it settled, over all PEs.
    pub settled: u64,
    /// Relaxation rounds it took.
    pub rounds: u32,
    /// Seconds it took (the slowest PE).
    pub secs: f64,
}

/// The controller's state for one search.
#[derive(Clone, Debug)]
pub struct Controller {
    mode: Mode,
    initial: u64,
    delta: u64,
    wgs: u32,
    up: bool,
    last_rate: Option<f64>,
    /// Deltas used, one per bucket (for the report).
    pub history: Vec<u64>,
}

impl Controller {
    /// A controller starting at `delta` (fixed point, >= 1) with `wgs`
    /// work-groups per PE.
    pub fn new(mode: Mode, delta: u64, wgs: u32) -> Controller {
        let delta = delta.max(1);
        Controller { mode, initial: delta, delta, wgs: wgs.max(1), up: true, last_rate: None, history: vec![delta] }
    }

    /// The current delta.
    pub fn delta(&self) -> u64 {
        self.delta
    }

    /// Work-groups per PE to relax a round of `near` vertices (over all PEs).
    pub fn active(&self, near: u64, n_pes: i32) -> u32 {
        match self.mode {
            Mode::Fixed => self.wgs,
            Mode::Adaptive => (near.div_ceil(GRAIN * n_pes.max(1) as u64)).clamp(1, u64::from(self.wgs)) as u32,
        }
    }

    /// Account a finished bucket; returns the delta for the next one.
    pub fn bucket_done(&mut self, b: Bucket) -> u64 {
        if self.mode == Mode::Adaptive {
            let rate = b.settled as f64 / b.secs.max(1e-9);
            if b.rounds > MAX_ROUNDS {
                self.up = false;
            } else if b.settled < MIN_SETTLED * u64::from(self.wgs) {
                self.up = true;
            } else if let Some(last) = self.last_rate
                && rate < last
            {
                self.up = !self.up;
            }
            self.last_rate = Some(rate);
            let (lo, hi) = ((self.initial / RANGE).max(1), self.initial.saturating_mul(RANGE));
            self.delta = if self.up { self.delta.saturating_mul(2) } else { self.delta / 2 }.clamp(lo, hi);
        }
        self.history.push(self.delta);
        self.delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_never_moves_and_adaptive_follows_progress() {
        let mut f = Controller::new(Mode::Fixed, 100, 4);
        assert_eq!(f.bucket_done(Bucket { settled: 1, rounds: 50, secs: 1.0 }), 100);
        assert_eq!(f.active(1, 2), 4);
        let mut a = Controller::new(Mode::Adaptive, 100, 4);
        // Too little per bucket: wider.
        assert_eq!(a.bucket_done(Bucket { settled: 10, rounds: 1, secs: 0.1 }), 200);
        // Better rate: keep going.
        assert_eq!(a.bucket_done(Bucket { settled: 1000, rounds: 2, secs: 0.1 }), 400);
        // Worse rate: turn around.
        assert_eq!(a.bucket_done(Bucket { settled: 1000, rounds: 3, secs: 1.0 }), 200);
        // Rework: narrower.
        assert_eq!(a.bucket_done(Bucket { settled: 5000, rounds: 20, secs: 0.1 }), 100);
        assert_eq!(a.active(0, 2), 1);
        assert_eq!(a.active(2 * 256 * 3, 2), 3);
        assert_eq!(a.active(1 << 30, 2), 4);
        // Bounded.
        let mut b = Controller::new(Mode::Adaptive, 64, 1);
        for _ in 0..20 {
            b.bucket_done(Bucket { settled: 1, rounds: 1, secs: 1.0 });
        }
        assert_eq!(b.delta(), 64 * RANGE);
    }
}
