//! The proxy watchdog: one thread per PE that notices a proxy service
//! thread which stopped making progress (stuck inside a libfabric or CUDA
//! call, a deadlock in a provider, an injected fault) and ends the PE with a
//! report of what was pending, instead of letting every work-group wait
//! until its own wait timeout with nothing to say about the cause.
//!
//! Each service thread publishes a [`Heartbeat`]: a counter of polling
//! passes (it moves every pass, idle or busy) and the transport call it is
//! in. The watchdog looks every `timeout / 4` (10 ms to 1 s); a thread whose
//! counter has not moved for `CPNET_PROXY_STALL_TIMEOUT` (default 10 s,
//! [`crate::env`]) while it is inside its loop is stalled. The report names
//! the PE, the thread, the call it is stuck in (with the command, target PE
//! and address when it is a submit), and for each of its queues with work:
//! the work-group, the commands taken and not complete, and the commands
//! waiting to be taken (the first one decoded). Then the PE is aborted as on
//! a peer failure: every queue's abort word is set (waits return
//! `ABORTED`), and the process exits with status 1 if the program has not
//! ended within `CPNET_ABORT_GRACE`.
//!
//! The watchdog also ends the PE when a service thread's transport made a
//! fatal report ([`Heartbeat::fatal`]: a peer the fabric cannot reach,
//! `CPNET_REACH_TIMEOUT`), with that report; this works with the stall
//! detection off too.
//!
//! A thread that has not started its loop yet (connecting) or has left it
//! (stopped) is not watched. When the watchdog itself wakes far later than
//! planned (the process was stopped by a debugger or SIGSTOP, or starved),
//! it starts counting again instead of blaming the service threads.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cpnet_device::layout::Opcode;
use cpnet_device::ring::QueueMem;
use cpnet_proxy::service::{Heartbeat, Phase};

/// What the watchdog watches of one service thread.
pub(crate) struct Watched {
    /// The thread's index (`cpnet-proxy-<t>`).
    pub(crate) thread: usize,
    /// Its published progress.
    pub(crate) heartbeat: Arc<Heartbeat>,
    /// The queues it serves (views, for the report). For queues in GPU
    /// memory these are the host shadows its mirror keeps
    /// (`cpnet_proxy::mirror`): the control blocks are the consumer's own,
    /// the producer blocks and slots as of the mirror's last pull (a slot
    /// the consumer has not reached may read torn; it is only printed).
    pub(crate) queues: Vec<QueueMem>,
}

/// A running watchdog; [`Watchdog::stop`] (or drop) ends it.
pub(crate) struct Watchdog {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Start watching `watched` for PE `me`: a thread still for `timeout`
    /// (`None`: stalls are not watched), or one whose transport made a
    /// fatal report, makes the watchdog call `on_stall` once with the
    /// report, and end.
    pub(crate) fn spawn(
        me: i32,
        watched: Vec<Watched>,
        timeout: Option<Duration>,
        on_stall: Box<dyn FnOnce(String) + Send>,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("cpnet-watchdog".into())
            .spawn(move || watch(me, &watched, timeout, &flag, on_stall))?;
        Ok(Watchdog { stop, handle: Some(handle) })
    }

    /// End the watchdog and join it.
    pub(crate) fn stop(&mut self) {
        let (lock, cv) = &*self.stop;
        *lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = true;
        cv.notify_all();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch(
    me: i32,
    watched: &[Watched],
    timeout: Option<Duration>,
    stop: &(Mutex<bool>, Condvar),
    on_stall: Box<dyn FnOnce(String) + Send>,
) {
    let period = timeout.map_or(Duration::from_millis(250), |t| (t / 4).clamp(Duration::from_millis(10), Duration::from_secs(1)));
    // Per thread: the pass count last seen and since when it has not moved.
    let mut seen: Vec<(u64, Instant)> = watched.iter().map(|w| (w.heartbeat.passes(), Instant::now())).collect();
    let (lock, cv) = stop;
    let mut stopped = lock.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut looked = Instant::now();
    loop {
        let (guard, _) = cv.wait_timeout(stopped, period).unwrap_or_else(std::sync::PoisonError::into_inner);
        stopped = guard;
        if *stopped {
            return;
        }
        let now = Instant::now();
        // A look far later than planned means the whole process did not run
        // (stopped by SIGSTOP or a debugger, a suspended VM, a starved
        // machine): the service threads could not move either, so their
        // stillness so far says nothing. Start counting again.
        let late = now - looked > 2 * period + Duration::from_millis(500);
        looked = now;
        for (w, (last, since)) in watched.iter().zip(seen.iter_mut()) {
            if let Some(fatal) = w.heartbeat.fatal() {
                drop(stopped);
                on_stall(format!("cpnet: {fatal}; aborting this PE"));
                return;
            }
            let Some(timeout) = timeout else { continue };
            let passes = w.heartbeat.passes();
            if late || passes != *last || passes == 0 || w.heartbeat.step().phase == Phase::Stopped {
                (*last, *since) = (passes, now);
                continue;
            }
            let still = now - *since;
            if still >= timeout {
                drop(stopped);
                on_stall(report(me, w, still, timeout));
                return;
            }
        }
    }
}

/// The stall report of thread `w`.
fn report(me: i32, w: &Watched, still: Duration, timeout: Duration) -> String {
    let step = w.heartbeat.step();
    let owner = |qi: u32| w.queues.get(qi as usize).map_or(u32::MAX, QueueMem::owner);
    let doing = match step.phase {
        Phase::Submit => format!(
            "inside the transport's submit of {} to PE {} at heap+{:#x} (queue {}, work-group {}, seq {})",
            step.op,
            step.pe,
            step.addr,
            step.queue,
            owner(step.queue),
            step.seq
        ),
        Phase::Barrier => format!("inside the transport's barrier for queue {} (work-group {})", step.queue, owner(step.queue)),
        Phase::Progress => "inside the transport's progress call (completions)".to_owned(),
        Phase::Mirror => "in its queue mirror (copies of the queues in GPU memory, CPNET_QUEUE_MEM=device): a copy or \
                          synchronize hangs, or one failed (logged above)"
            .to_owned(),
        Phase::Polling | Phase::Stopped => "between transport calls".to_owned(),
    };
    let mut pending = Vec::new();
    for (qi, q) in w.queues.iter().enumerate() {
        let ctl = q.ctl_snapshot();
        let taken = ctl.consumed.saturating_sub(ctl.completed);
        let depth = u64::from(q.geometry().depth());
        let waiting: Vec<_> = (ctl.consumed..ctl.consumed + depth).map_while(|s| q.peek(s)).collect();
        if taken == 0 && waiting.is_empty() {
            continue;
        }
        let mut line = format!("queue {qi} (work-group {}): {taken} taken and not complete, {} waiting", q.owner(), waiting.len());
        if let Some(c) = waiting.first() {
            let what = match c.op() {
                Some(Opcode::Put | Opcode::Get | Opcode::PutSignal | Opcode::Amo) => {
                    format!("{} to PE {} at heap+{:#x}, {} bytes", c.op_name(), c.pe, c.target_addr(), c.size)
                }
                _ => c.op_name().to_owned(),
            };
            line += &format!(" (next: {what}, seq {})", ctl.consumed);
        }
        pending.push(line);
    }
    let pending = if pending.is_empty() { "no command pending on its queues".to_owned() } else { pending.join("; ") };
    format!(
        "cpnet: PE {me}: watchdog: proxy thread {} (cpnet-proxy-{}) has made no progress for {:.1} s \
         (CPNET_PROXY_STALL_TIMEOUT={}): it is {doing}, after {} commands taken; pending: {pending}; aborting this PE",
        w.thread,
        w.thread,
        still.as_secs_f64(),
        timeout.as_secs_f64(),
        w.heartbeat.taken()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpnet_device::layout::Cmd;
    use cpnet_device::ring::{Producer, QueueGeometry, QueuePool};
    use cpnet_proxy::service::{LoopbackTransport, Service};

    /// A real service over a real queue and the loopback transport, hung by
    /// the injected stall in its 3rd submit: the watchdog reports the
    /// thread, the command it is stuck in and the queue's pending commands.
    #[test]
    fn a_stuck_service_is_reported_with_its_pending_commands() {
        let pool = QueuePool::new_host(2, QueueGeometry::new(8).unwrap());
        let heap = cpnet_device::cpu::HostHeap::new(4096);
        let view = heap.view();
        let hb = Arc::new(Heartbeat::default());
        let release = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (q0, q1) = (pool.queue(0), pool.queue(1));
        let svc = {
            let (hb, release, stop, q1) = (Arc::clone(&hb), Arc::clone(&release), Arc::clone(&release), q1.clone());
            std::thread::spawn(move || {
                let mut s = Service::new(vec![q0, q1], LoopbackTransport::new(view), cpnet_proxy::decode::Limits { n_pes: 1, heap_size: 4096 }, 0);
                s.set_heartbeat(hb);
                // Acquire: pairs with the test's Release store below.
                s.inject_stall(3, Box::new(move || release.load(std::sync::atomic::Ordering::Acquire)));
                s.run(move || stop.load(std::sync::atomic::Ordering::Acquire));
            })
        };
        assert!(q1_claim(&pool));
        let mut p = Producer::new(pool.queue(1));
        for i in 0..5u64 {
            p.try_push(&Cmd::put_inline(0, 64 + 8 * i, &i.to_le_bytes()).unwrap()).expect("room");
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let mut dog = Watchdog::spawn(
            0,
            vec![Watched { thread: 0, heartbeat: Arc::clone(&hb), queues: vec![pool.queue(0), q1.clone()] }],
            Some(Duration::from_millis(200)),
            Box::new(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        let report = rx.recv_timeout(Duration::from_secs(20)).expect("the watchdog reports the stall");
        // Release: pairs with the service's Acquire loads.
        release.store(true, std::sync::atomic::Ordering::Release);
        svc.join().unwrap();
        dog.stop();
        assert!(report.contains("PE 0: watchdog: proxy thread 0"), "{report}");
        assert!(report.contains("submit of putmem to PE 0 at heap+0x50 (queue 1, work-group 7, seq 2)"), "{report}");
        assert!(report.contains("queue 1 (work-group 7): 1 taken and not complete, 2 waiting (next: putmem to PE 0 at heap+0x58"), "{report}");
        assert!(report.contains("after 3 commands taken"), "{report}");
    }

    /// A service whose queue mirror failed (queues in GPU memory) stops
    /// counting passes: the watchdog reports it, saying so.
    #[test]
    fn a_service_stopped_by_its_queue_mirror_is_reported() {
        use cpnet_proxy::mirror::{HostCopies, QueueMirror};
        let geom = QueueGeometry::new(8).unwrap();
        let (device, shadows) = (QueuePool::new_host(1, geom), QueuePool::new_host(1, geom));
        let heap = cpnet_device::cpu::HostHeap::new(4096);
        let view = heap.view();
        let hb = Arc::new(Heartbeat::default());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let svc = {
            let (hb, stop, device, shadows) = (Arc::clone(&hb), Arc::clone(&stop), device.clone(), shadows.clone());
            std::thread::spawn(move || {
                let copies = HostCopies::new(&device, &shadows).fail_at_wait(3);
                let limits = cpnet_proxy::decode::Limits { n_pes: 1, heap_size: 4096 };
                let mut s = Service::with_mirror(QueueMirror::new(Box::new(copies)), LoopbackTransport::new(view), limits, 0);
                s.set_heartbeat(hb);
                // Acquire: pairs with the test's Release store below.
                s.run(move || stop.load(std::sync::atomic::Ordering::Acquire));
            })
        };
        assert!(device.queue(0).try_claim(4));
        let (tx, rx) = std::sync::mpsc::channel();
        let mut dog = Watchdog::spawn(
            0,
            vec![Watched { thread: 0, heartbeat: Arc::clone(&hb), queues: vec![shadows.queue(0)] }],
            Some(Duration::from_millis(200)),
            Box::new(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        let report = rx.recv_timeout(Duration::from_secs(20)).expect("the watchdog reports the broken mirror");
        // Release: pairs with the service's Acquire load.
        stop.store(true, std::sync::atomic::Ordering::Release);
        svc.join().unwrap();
        dog.stop();
        assert!(report.contains("proxy thread 0") && report.contains("in its queue mirror"), "{report}");
    }

    fn q1_claim(pool: &QueuePool) -> bool {
        pool.queue(1).try_claim(7)
    }

    /// A service over queue `q` of a 4 KiB heap, with the transport `make`
    /// builds on the service's thread, publishing `hb`, polling until `stop`.
    fn spawn_service<T: cpnet_proxy::service::Transport>(
        q: QueueMem,
        make: impl FnOnce() -> T + Send + 'static,
        hb: &Arc<Heartbeat>,
        stop: &Arc<std::sync::atomic::AtomicBool>,
    ) -> JoinHandle<()> {
        let (hb, stop) = (Arc::clone(hb), Arc::clone(stop));
        std::thread::spawn(move || {
            let mut s = Service::new(vec![q], make(), cpnet_proxy::decode::Limits { n_pes: 1, heap_size: 4096 }, 0);
            s.set_heartbeat(hb);
            // Acquire: pairs with the test's Release store of `stop`.
            s.run(move || stop.load(std::sync::atomic::Ordering::Acquire));
        })
    }

    /// A service that keeps polling is never reported, busy or idle.
    #[test]
    fn a_live_service_is_not_reported() {
        let pool = QueuePool::new_host(1, QueueGeometry::new(8).unwrap());
        let heap = cpnet_device::cpu::HostHeap::new(4096);
        let view = heap.view();
        let hb = Arc::new(Heartbeat::default());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let svc = spawn_service(pool.queue(0), move || LoopbackTransport::new(view), &hb, &stop);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut dog = Watchdog::spawn(
            0,
            vec![Watched { thread: 0, heartbeat: hb, queues: vec![pool.queue(0)] }],
            // Long enough that a loaded 2-core machine (builds beside the
            // tests) does not leave the service unscheduled that long.
            Some(Duration::from_millis(500)),
            Box::new(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(2000)).is_err(), "no report for a live service");
        // Release: pairs with the service's Acquire load.
        stop.store(true, std::sync::atomic::Ordering::Release);
        svc.join().unwrap();
        dog.stop();
    }

    /// The loopback transport, with a fatal report after a few calls.
    struct Unreachable {
        inner: LoopbackTransport,
        calls: u32,
    }

    impl cpnet_proxy::service::Transport for Unreachable {
        fn submit(&mut self, tag: cpnet_proxy::service::Tag, op: &cpnet_proxy::decode::Op) -> cpnet_proxy::service::Submit {
            self.inner.submit(tag, op)
        }
        fn progress(&mut self, done: &mut Vec<cpnet_proxy::service::Finished>) {
            self.inner.progress(done);
        }
        fn barrier(&mut self, start: bool) -> Result<bool, cpnet_device::layout::ErrorCode> {
            self.inner.barrier(start)
        }
        fn fatal(&mut self) -> Option<String> {
            self.calls += 1;
            (self.calls == 3).then(|| "PE 0 cannot reach PE 1 over tcp;ofi_rxm: test".to_owned())
        }
    }

    /// A transport's fatal report (an unreachable peer) ends the PE through
    /// the watchdog even with stall detection off, once, with the report.
    #[test]
    fn a_fatal_report_is_passed_on_with_stalls_unwatched() {
        let pool = QueuePool::new_host(1, QueueGeometry::new(8).unwrap());
        let heap = cpnet_device::cpu::HostHeap::new(4096);
        let view = heap.view();
        let hb = Arc::new(Heartbeat::default());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let svc = spawn_service(pool.queue(0), move || Unreachable { inner: LoopbackTransport::new(view), calls: 0 }, &hb, &stop);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut dog = Watchdog::spawn(
            0,
            vec![Watched { thread: 0, heartbeat: Arc::clone(&hb), queues: vec![pool.queue(0)] }],
            None,
            Box::new(move |r| tx.send(r).unwrap()),
        )
        .unwrap();
        let report = rx.recv_timeout(Duration::from_secs(20)).expect("the watchdog passes the fatal report on");
        assert_eq!(report, "cpnet: PE 0 cannot reach PE 1 over tcp;ofi_rxm: test; aborting this PE");
        assert_eq!(hb.fatal(), Some("PE 0 cannot reach PE 1 over tcp;ofi_rxm: test"));
        // Release: pairs with the service's Acquire load.
        stop.store(true, std::sync::atomic::Ordering::Release);
        svc.join().unwrap();
        dog.stop();
    }
}
