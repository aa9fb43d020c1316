//! The work-groups of one PE synchronize among themselves with a
//! [`TeamBarrier`]: the CPU stand-in for a grid-wide barrier of a persistent
//! kernel. Unlike `std::sync::Barrier` it can be broken: a work-group that
//! fails calls [`TeamBarrier::abort`], and every other work-group's
//! [`TeamBarrier::wait`] returns `false` at once instead of waiting forever
//! for a member that will never arrive.

use std::sync::{Condvar, Mutex, PoisonError};

/// A reusable barrier for `n` work-group threads that a failing member can
/// break.
#[derive(Debug)]
pub struct TeamBarrier {
    n: usize,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Members that have arrived in the current generation.
    arrived: usize,
    /// Completed generations.
    generation: u64,
    /// Set by `abort`; never cleared.
    broken: bool,
}

impl TeamBarrier {
    /// A barrier for `n` members (`n >= 1`).
    pub fn new(n: usize) -> TeamBarrier {
        TeamBarrier {
            n: n.max(1),
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        }
    }

    /// Wait until all `n` members have called `wait` in this generation.
    /// Returns `true` then, and `false` (at once, or as soon as it happens)
    /// if the barrier is broken. Everything a member did before its `wait`
    /// happens-before everything every member does after its `wait` returns.
    pub fn wait(&self) -> bool {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.broken {
            return false;
        }
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return true;
        }
        let generation = s.generation;
        while s.generation == generation && !s.broken {
            s = self.cv.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.generation != generation
    }

    /// Break the barrier: every current and future `wait` returns `false`.
    pub fn abort(&self) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .broken = true;
        self.cv.notify_all();
    }

    /// Whether [`TeamBarrier::abort`] was called.
    pub fn is_broken(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .broken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_generation_waits_for_every_member() {
        let b = TeamBarrier::new(4);
        let counter = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for round in 0..100 {
                        counter.fetch_add(1, Ordering::Relaxed);
                        assert!(b.wait());
                        assert!(counter.load(Ordering::Relaxed) >= 4 * (round + 1));
                        assert!(b.wait());
                    }
                });
            }
        });
    }

    #[test]
    fn abort_releases_waiters() {
        let b = TeamBarrier::new(3);
        std::thread::scope(|s| {
            let w1 = s.spawn(|| b.wait());
            let w2 = s.spawn(|| b.wait());
            std::thread::sleep(std::time::Duration::from_millis(20));
            b.abort();
            assert!(!w1.join().unwrap());
            assert!(!w2.join().unwrap());
        });
        assert!(!b.wait(), "a broken barrier stays broken");
        assert!(b.is_broken());
    }
}
