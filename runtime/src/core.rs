//! What every kind of PE has once started, CPU or GPU ([`PeCore`]): launch
//! facts, tuning, the bootstrap, the symmetric allocator and the proxy, with
//! the collectives and the teardown they share, and what a PE does when a
//! peer fails (abort its queues, exit after `CPNET_ABORT_GRACE`).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cpnet_device::cpu::SymAddr;
use cpnet_device::layout::ErrorCode;
use cpnet_proxy::service::CommandError;
use cpnet_proxy::transport::EndpointFacts;

use crate::bootstrap::{Bootstrap, PeerFailure};
use crate::env::{Launch, Tuning};
use crate::error::{Error, Result};
use crate::proxy_link::ProxyLink;
use crate::team::Teams;

/// First-fit allocator over the heap's offsets. Every PE performs the same
/// sequence of collective calls, so every PE gets the same offsets.
#[derive(Debug)]
pub(crate) struct SymAlloc {
    /// Free blocks (offset, bytes), sorted by offset, coalesced.
    free: Vec<(u64, u64)>,
    /// Live blocks: offset -> bytes.
    live: std::collections::BTreeMap<u64, u64>,
}

/// Alignment of every symmetric allocation (a cache line).
pub const SHMALLOC_ALIGN: u64 = 64;

impl SymAlloc {
    pub(crate) fn new(size: u64) -> SymAlloc {
        SymAlloc { free: vec![(0, size)], live: Default::default() }
    }
    pub(crate) fn alloc(&mut self, bytes: u64) -> Option<u64> {
        let want = bytes.max(1).next_multiple_of(SHMALLOC_ALIGN);
        let i = self.free.iter().position(|&(_, len)| len >= want)?;
        let (off, len) = self.free[i];
        if len == want {
            self.free.remove(i);
        } else {
            self.free[i] = (off + want, len - want);
        }
        self.live.insert(off, want);
        Some(off)
    }
    pub(crate) fn release(&mut self, off: u64) -> bool {
        let Some(len) = self.live.remove(&off) else { return false };
        let i = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(i, (off, len));
        // Coalesce with the next, then the previous block.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
        true
    }
    pub(crate) fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(_, l)| l).sum()
    }
}

/// What every kind of PE has, CPU or GPU: launch facts, tuning, the
/// bootstrap, the symmetric allocator and the proxy threads, with the
/// collectives and the teardown they share. [`Pe`] and
/// [`GpuPe`](crate::gpu::GpuPe) wrap it with their own heap and queues.
pub(crate) struct PeCore {
    pub(crate) launch: Launch,
    pub(crate) tuning: Tuning,
    /// The provider and bind address init chose ([`crate::startup::default_fabric`]).
    fabric: cpnet_proxy::transport::FabricConfig,
    /// `None` only after finalize has handed it back.
    pub(crate) boot: Option<Bootstrap>,
    alloc: Mutex<SymAlloc>,
    /// The allocator's bytes (`CPNET_HEAP_SIZE` rounded up); the teams'
    /// scratch and the kind's reserve follow them.
    pub(crate) heap_size: u64,
    /// The team table (world, node, splits).
    pub(crate) teams: Teams,
    proxies: ProxyLink,
    /// The proxy threads were stopped (finalize, or abandon).
    stopped: bool,
}

impl PeCore {
    /// Bring up a PE whose proxy threads were spawned: install the failure
    /// handler (`abort` aborts the PE's queues), exchange the endpoints'
    /// cards and meet every PE at a barrier. **Collective.**
    ///
    /// # Errors
    /// [`Error::Bootstrap`], [`Error::Proxy`], [`Error::NotSymmetric`].
    pub(crate) fn start(
        launch: Launch,
        tuning: Tuning,
        fabric: cpnet_proxy::transport::FabricConfig,
        boot: Bootstrap,
        heap_size: u64,
        mut proxies: ProxyLink,
        abort: impl Fn(ErrorCode) + Send + Sync + 'static,
    ) -> Result<PeCore> {
        let me = launch.pe;
        boot.set_wait_timeout(setup_wait_timeout(&tuning));
        let abort: Arc<dyn Fn(ErrorCode) + Send + Sync> = Arc::new(abort);
        install_failure_handler(&boot, proxies.abandoner(), me, tuning.abort_grace, Arc::clone(&abort));
        let r = proxies.connect(&boot, me).and_then(|()| boot.barrier().map_err(|cause| Error::Bootstrap { pe: me, cause }));
        // Set up: from here on every host collective waits CPNET_COLLECTIVE_TIMEOUT.
        boot.set_wait_timeout(tuning.collective_timeout);
        let r = match r {
            Ok(()) => {
                let (abandon, grace, tell_job) = (proxies.abandoner(), tuning.abort_grace, boot.aborter());
                proxies.start_watchdog(
                    me,
                    tuning.proxy_stall_timeout,
                    Box::new(move |report: String| {
                        say(&report);
                        abandon();
                        abort(ErrorCode::Aborted);
                        let why = if report.contains("lost the proxy daemon") {
                            "the proxy daemon was lost"
                        } else if report.contains(" cannot reach PE ") {
                            "a peer is unreachable"
                        } else {
                            "a proxy thread stalled"
                        };
                        // Tell the job now, not when this process ends: the
                        // others stop polling their fabric first (libfabric
                        // 1.17's tcp;ofi_rxm crashed in fi_cq_read, 2 runs
                        // in 12, when a peer's connections closed under a
                        // live poll: tests/tests/reliability.rs).
                        tell_job(why);
                        exit_after_grace(me, grace, why.to_owned());
                    }),
                )
            }
            r => r,
        };
        // The team table: its scratch starts where the allocator's heap ends.
        let (per_team, slots) = (tuning.team_scratch, tuning.teams);
        let teams = r.and_then(|()| Teams::start(&boot, me, launch.n_pes, heap_size, per_team, slots));
        match teams {
            Ok(teams) => Ok(PeCore {
                launch,
                tuning,
                fabric,
                boot: Some(boot),
                alloc: Mutex::new(SymAlloc::new(heap_size)),
                heap_size,
                teams,
                proxies,
                stopped: false,
            }),
            Err(e) => {
                // Stop the proxy threads before the memory they serve goes.
                proxies.abandon();
                let _ = proxies.stop(me);
                Err(e)
            }
        }
    }

    pub(crate) fn boot(&self) -> &Bootstrap {
        self.boot.as_ref().expect("the bootstrap lives until finalize")
    }

    pub(crate) fn my_pe(&self) -> i32 {
        self.launch.pe
    }

    pub(crate) fn n_pes(&self) -> i32 {
        self.launch.n_pes
    }

    /// The symmetric allocation of `bytes` (collective, checked alike on
    /// every PE): its heap offset.
    pub(crate) fn shmalloc(&self, bytes: u64) -> Result<u64> {
        check_symmetric(self.boot(), self.my_pe(), "shmalloc", bytes)?;
        let mut a = self.alloc.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        a.alloc(bytes).ok_or(Error::OutOfHeap {
            pe: self.my_pe(),
            requested: bytes,
            free: a.free_bytes(),
            heap: self.heap_size,
        })
    }

    pub(crate) fn shfree(&self, addr: SymAddr) -> Result<()> {
        check_symmetric(self.boot(), self.my_pe(), "shfree", addr.0)?;
        if self.alloc.lock().unwrap_or_else(std::sync::PoisonError::into_inner).release(addr.0) {
            Ok(())
        } else {
            Err(Error::BadFree { pe: self.my_pe(), addr: addr.0 })
        }
    }

    pub(crate) fn barrier_all(&self) -> Result<()> {
        self.boot().barrier().map_err(|cause| Error::Bootstrap { pe: self.my_pe(), cause })
    }

    pub(crate) fn allgather_bytes(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.boot().allgather(data).map_err(|cause| Error::Bootstrap { pe: self.my_pe(), cause })
    }

    /// The provider init chose (`CPNET_PROVIDER`, or the default for the
    /// PE's kind and hosts), as configured.
    pub(crate) fn provider(&self) -> &str {
        &self.fabric.provider
    }

    /// The provider and bind address init chose for this PE's transport,
    /// for the PE kinds' `fabric_config`.
    pub(crate) fn fabric_config(&self) -> cpnet_proxy::transport::FabricConfig {
        self.fabric.clone()
    }

    pub(crate) fn command_errors(&self) -> Vec<CommandError> {
        self.proxies.command_errors()
    }

    /// Per proxy thread, what its transport reports about itself (set at
    /// start: the threads are connected then).
    pub(crate) fn endpoint_facts(&self) -> &[EndpointFacts] {
        self.proxies.facts()
    }

    /// Barrier, stop the proxy after it has drained, leave the rendezvous.
    /// **Collective.**
    pub(crate) fn finalize(&mut self) -> Result<()> {
        let me = self.my_pe();
        self.barrier_all()?;
        self.proxies.stop(me)?;
        self.stopped = true;
        let n = self.proxies.command_errors().len();
        if n > 0 {
            tracing::warn!("PE {me}: {n} command(s) failed during the run (each reported to its work-group)");
        }
        match self.boot.take() {
            Some(b) => {
                // The PEs tear down their proxies (draining, closing
                // endpoints) at their own pace before they meet again.
                b.set_wait_timeout(setup_wait_timeout(&self.tuning));
                b.finalize().map_err(|cause| Error::Bootstrap { pe: me, cause })
            }
            None => Ok(()),
        }
    }

    /// Unless stopped already: stop the proxy threads without draining. Runs in
    /// `Drop`; owners call it earlier when something must happen between
    /// (a GPU PE aborts its queues first), and hold the core before their
    /// heap and queues so the threads end before those are freed.
    pub(crate) fn abandon(&mut self) {
        if !self.stopped {
            self.proxies.abandon();
            let _ = self.proxies.stop(self.launch.pe);
            self.stopped = true;
        }
    }

    /// Whether the proxy threads were stopped (finalize, or abandon).
    pub(crate) fn stopped(&self) -> bool {
        self.stopped
    }
}

/// Allgather `arg` and check every PE passed the same value (also the
/// collective's barrier). **Collective.**
pub(crate) fn check_symmetric(boot: &Bootstrap, me: i32, call: &'static str, arg: u64) -> Result<()> {
    match first_mismatch(boot, me, &[arg])? {
        Some((peer, b)) => Err(Error::NotSymmetric { pe: me, call, detail: format!("this PE passed {arg}, PE {peer} passed {:?}", b) }),
        None => Ok(()),
    }
}

/// Allgather `words` (little-endian) and return the first PE whose
/// contribution differs from this PE's, with that contribution's bytes
/// (`check_symmetric`, `startup::check_layout`). **Collective** (also a
/// barrier).
///
/// # Errors
/// [`Error::Bootstrap`].
pub(crate) fn first_mismatch(boot: &Bootstrap, me: i32, words: &[u64]) -> Result<Option<(usize, Vec<u8>)>> {
    let mine: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = boot.allgather(&mine).map_err(|source| Error::Bootstrap { pe: me, cause: source })?;
    Ok(all.into_iter().enumerate().find(|(_, b)| *b != mine))
}

/// On a peer failure reported by the bootstrap: log it, let the proxy stop
/// without draining, `abort` the PE's queues (waits return `PEER_DEAD` at
/// once), and exit the process with status 1 if the program has not ended
/// within `grace`.
fn install_failure_handler(
    boot: &Bootstrap,
    abandon: Arc<dyn Fn() + Send + Sync>,
    me: i32,
    grace: Duration,
    abort: Arc<dyn Fn(ErrorCode) + Send + Sync>,
) {
    let fired = AtomicBool::new(false);
    boot.set_failure_handler(Box::new(move |f: &PeerFailure| {
        if fired.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        say(&format!("cpnet: PE {me}: {f}; aborting this PE"));
        abandon();
        abort(ErrorCode::PeerDead);
        exit_after_grace(me, grace, f.to_string());
    }));
}

/// Exit the process with status 1 unless the program ends within `grace`
/// (a thread sleeps it out): the last step of aborting a PE, after a peer
/// failure or a stalled proxy thread (`why`).
fn exit_after_grace(me: i32, grace: Duration, why: String) {
    let _ = std::thread::Builder::new().name("cpnet-abort".into()).spawn(move || {
        std::thread::sleep(grace);
        say(&format!(
            "cpnet: PE {me}: the program did not end within {:.1} s of the failure ({why}); exiting with status 1",
            grace.as_secs_f64()
        ));
        // _exit, not exit: other threads may be inside libfabric
        // (holding its locks) or blocked on a dead peer; running
        // atexit handlers and library destructors under them can
        // hang the exit itself.
        // SAFETY: _exit(2) ends the process at once; nothing after
        // it runs, and stderr is unbuffered (the line above is out).
        unsafe { libc::_exit(1) };
    });
}

/// One line to stderr in a single write, so lines of several PEs sharing
/// the terminal do not interleave.
fn say(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().lock().write_all(format!("{line}\n").as_bytes());
}

impl Drop for PeCore {
    fn drop(&mut self) {
        self.abandon();
    }
}

/// The wait timeout of the host collectives of init (after the PE joined the
/// rendezvous) and of finalize's last one: the larger of
/// `CPNET_COLLECTIVE_TIMEOUT` and `CPNET_CONNECT_TIMEOUT` (`None`, forever,
/// if the collective timeout is), since PEs set up and tear down their
/// fabric, heaps and GPU at their own pace, as they start at their own
/// pace; every other host collective waits `CPNET_COLLECTIVE_TIMEOUT`. See
/// [`Bootstrap::set_wait_timeout`].
pub(crate) fn setup_wait_timeout(tuning: &Tuning) -> Option<Duration> {
    tuning.collective_timeout.map(|t| t.max(tuning.connect_timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_allocator_is_first_fit_and_coalesces() {
        let mut a = SymAlloc::new(1024);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(100).unwrap();
        let z = a.alloc(64).unwrap();
        assert_eq!((x, y, z), (0, 64, 192));
        assert!(a.alloc(1024).is_none());
        assert!(a.release(y));
        assert!(!a.release(y), "double free is refused");
        assert_eq!(a.alloc(128), Some(64), "the hole is reused");
        assert!(a.release(64) && a.release(x) && a.release(z));
        assert_eq!(a.free, vec![(0, 1024)], "everything coalesces back");
    }
}
