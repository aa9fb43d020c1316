//! The TCP rendezvous, end to end in one process: a server and one client
//! thread per PE. Each test is named after the protocol edge it pins down.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use cpnet::bootstrap::{Bootstrap, BootstrapError, PeerFailure, Server, ServerHandle};
use cpnet::env::{Launch, Launcher};

const CONNECT: Duration = Duration::from_secs(10);

/// Runs `f` on a thread and fails the test if it takes longer than `limit`
/// (a hang in the protocol must not hang `cargo test`).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("test body took longer than {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("test body panicked"),
    }
}

fn launch(pe: i32, n_pes: i32, addr: &str, launcher: Launcher) -> Launch {
    Launch {
        pe,
        n_pes,
        local_pe: pe,
        local_size: n_pes,
        bootstrap: Some(addr.to_owned()),
        launcher,
    }
}

fn server(n: i32, connect_timeout: Duration) -> (ServerHandle, String) {
    let s = Server::bind("127.0.0.1:0")
        .unwrap()
        .with_connect_timeout(connect_timeout)
        .spawn(n)
        .unwrap();
    let addr = s.local_addr().to_string();
    (s, addr)
}

fn connect(pe: i32, n: i32, addr: &str) -> Bootstrap {
    Bootstrap::connect(&launch(pe, n, addr, Launcher::CpnetRun), CONNECT).unwrap()
}

/// Runs `body(pe, bootstrap)` on one thread per PE and returns the results
/// in PE order.
fn each_pe<T: Send + 'static>(
    n: i32,
    addr: &str,
    body: impl Fn(i32, Bootstrap) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let body = Arc::new(body);
    let threads: Vec<_> = (0..n)
        .map(|pe| {
            let (addr, body) = (addr.to_owned(), body.clone());
            thread::spawn(move || body(pe, connect(pe, n, &addr)))
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

fn peer_failed(r: Result<impl std::fmt::Debug, BootstrapError>) -> (i32, String) {
    match r {
        Err(BootstrapError::PeerFailed { pe, reason }) => (pe, reason),
        other => panic!("expected PeerFailed, got {other:?}"),
    }
}

fn free_port_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn blob(pe: i32, round: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (pe as usize * 31 + round * 7 + i) as u8)
        .collect()
}

#[test]
fn bootstrap_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Bootstrap>();
    check::<ServerHandle>();
}

#[test]
fn allgather_every_size_many_rounds_then_finalize() {
    within(Duration::from_secs(60), || {
        const N: i32 = 4;
        // Per round, PE p contributes `len + p` bytes, except the all-empty
        // rounds (len 0 for every PE) to pin the zero-length edge.
        const LENS: [Option<usize>; 9] = [
            Some(0),
            None,
            Some(1),
            Some(3),
            Some(64),
            Some(4096),
            Some(1 << 20),
            None,
            Some(17),
        ];
        let (srv, addr) = server(N, CONNECT);
        let len_of = |pe: i32, round: usize| LENS[round].map_or(0, |l| l + pe as usize);
        let results = each_pe(N, &addr, move |pe, boot| {
            assert_eq!((boot.my_pe(), boot.n_pes()), (pe, N));
            for round in 0..LENS.len() {
                let got = boot.allgather(&blob(pe, round, len_of(pe, round))).unwrap();
                assert_eq!(got.len(), N as usize);
                for (q, b) in got.iter().enumerate() {
                    assert_eq!(
                        *b,
                        blob(q as i32, round, len_of(q as i32, round)),
                        "round {round}"
                    );
                }
            }
            for _ in 0..100 {
                boot.barrier().unwrap();
            }
            boot.finalize()
        });
        for r in results {
            r.unwrap();
        }
        assert_eq!(srv.join(), Ok(()));
    });
}

#[test]
fn barrier_waits_for_the_last_pe() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(3, CONNECT);
        let times = each_pe(3, &addr, |pe, boot| {
            if pe == 2 {
                thread::sleep(Duration::from_millis(300));
            }
            let t0 = Instant::now();
            boot.barrier().unwrap();
            let waited = t0.elapsed();
            boot.finalize().unwrap();
            waited
        });
        assert!(times[0] >= Duration::from_millis(200), "{times:?}");
        assert!(times[1] >= Duration::from_millis(200), "{times:?}");
        assert_eq!(srv.join(), Ok(()));
    });
}

#[test]
fn single_pe_is_local() {
    let boot = Bootstrap::connect(&Launch::single(), CONNECT).unwrap();
    assert_eq!(boot.allgather(b"me").unwrap(), vec![b"me".to_vec()]);
    boot.barrier().unwrap();
    assert!(boot.failure().is_none());
    boot.finalize().unwrap();
}

#[test]
fn dropped_pe_fails_the_others_pending_barrier_and_calls_the_handler() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(3, CONNECT);
        let calls = Arc::new(Mutex::new(Vec::<PeerFailure>::new()));
        let calls2 = calls.clone();
        let results = each_pe(3, &addr, move |pe, boot| {
            boot.barrier().unwrap(); // all joined
            if pe == 2 {
                thread::sleep(Duration::from_millis(300));
                drop(boot); // like a process dying: no Bye
                return None;
            }
            let calls = calls2.clone();
            boot.set_failure_handler(Box::new(move |f| calls.lock().unwrap().push(f.clone())));
            let t0 = Instant::now();
            let r = boot.barrier();
            let elapsed = t0.elapsed();
            // Later collectives fail the same way, at once.
            let again = peer_failed(boot.barrier());
            let fin = peer_failed(boot.finalize());
            Some((peer_failed(r), elapsed, again, fin))
        });
        for (pe, r) in results.into_iter().enumerate().take(2) {
            let ((failed, reason), elapsed, again, fin) = r.unwrap();
            assert_eq!(failed, 2, "PE {pe}: {reason}");
            assert!(reason.contains("connection to PE 2 lost"), "{reason}");
            assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
            assert_eq!(again.0, 2);
            assert_eq!(fin.0, 2);
        }
        let calls = calls.lock().unwrap();
        assert_eq!(calls.len(), 2, "handler once per surviving PE: {calls:?}");
        assert!(calls.iter().all(|f| f.pe == 2));
        assert_eq!(
            calls[0].to_string(),
            format!("PE 2 failed: {}", calls[0].reason)
        );
        assert_eq!(srv.join().unwrap_err().pe, 2);
    });
}

#[test]
fn abort_is_one_sided_and_named_after_the_aborting_pe() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(3, CONNECT);
        let handler_calls = Arc::new(AtomicUsize::new(0));
        let hc = handler_calls.clone();
        let results = each_pe(3, &addr, move |pe, boot| {
            let hc = hc.clone();
            boot.set_failure_handler(Box::new(move |_| {
                hc.fetch_add(1, Ordering::SeqCst);
            }));
            boot.barrier().unwrap(); // all joined
            if pe == 1 {
                thread::sleep(Duration::from_millis(100));
                boot.abort("out of device memory");
                // Our own collectives fail too, naming us.
                let own = peer_failed(boot.barrier());
                // Stay connected a while: the others must learn from the
                // Abort, not from the connection closing.
                thread::sleep(Duration::from_millis(500));
                return own;
            }
            peer_failed(boot.barrier())
        });
        for (pe, (failed, reason)) in results.iter().enumerate() {
            assert_eq!(*failed, 1, "PE {pe}");
            assert_eq!(reason, "out of device memory", "PE {pe}");
        }
        // PEs 0 and 2 heard of it; PE 1's own abort calls no handler.
        assert_eq!(handler_calls.load(Ordering::SeqCst), 2);
        let f = srv.join().unwrap_err();
        assert_eq!((f.pe, f.reason.as_str()), (1, "out of device memory"));
    });
}

#[test]
fn handler_set_after_the_failure_is_called_at_once() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(2, CONNECT);
        let results = each_pe(2, &addr, |pe, boot| {
            boot.barrier().unwrap(); // both joined
            if pe == 1 {
                boot.abort("bad input");
                thread::sleep(Duration::from_millis(300));
                return true;
            }
            let _ = boot.barrier();
            let called = Arc::new(AtomicUsize::new(0));
            let c = called.clone();
            boot.set_failure_handler(Box::new(move |f| {
                assert_eq!(f.pe, 1);
                c.fetch_add(1, Ordering::SeqCst);
            }));
            // Called on this thread, before set_failure_handler returned; and only once.
            let once = called.load(Ordering::SeqCst) == 1;
            boot.set_failure_handler(Box::new(|_| panic!("must not be called again")));
            once && boot.failure().is_some_and(|f| f.reason == "bad input")
        });
        assert_eq!(results, vec![true, true]);
        drop(srv);
    });
}

#[test]
fn duplicate_pe_is_rejected_and_the_job_goes_on() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(2, CONNECT);
        let first = connect(0, 2, &addr);
        let dup = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), CONNECT);
        match dup {
            Err(BootstrapError::Rejected { reason, addr: a }) => {
                assert!(reason.contains("PE 0 has already joined"), "{reason}");
                assert_eq!(a, addr);
            }
            other => panic!("expected Rejected, got {other:?}"),
        }
        let a2 = addr.clone();
        let second = thread::spawn(move || {
            let b = connect(1, 2, &a2);
            b.barrier().unwrap();
            b.finalize()
        });
        first.barrier().unwrap();
        first.finalize().unwrap();
        second.join().unwrap().unwrap();
        assert_eq!(srv.join(), Ok(()));
    });
}

#[test]
fn wrong_job_size_and_out_of_range_pe_are_rejected() {
    within(Duration::from_secs(30), || {
        let (_srv, addr) = server(2, CONNECT);
        let e = Bootstrap::connect(&launch(1, 3, &addr, Launcher::CpnetRun), CONNECT).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, BootstrapError::Rejected { .. }) && msg.contains("job of 2 PEs"),
            "{msg}"
        );
    });
    // An out-of-range PE never gets past Launch validation on the client.
    let e =
        Bootstrap::connect(&launch(5, 2, "127.0.0.1:1", Launcher::CpnetRun), CONNECT).unwrap_err();
    assert!(matches!(e, BootstrapError::Config(_)), "{e}");
}

#[test]
fn pe_that_never_arrives_fails_the_job_after_the_connect_timeout() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(3, Duration::from_secs(1));
        let t0 = Instant::now();
        let threads: Vec<_> = (0..2)
            .map(|pe| {
                let addr = addr.clone();
                thread::spawn(move || {
                    let boot = connect(pe, 3, &addr);
                    (peer_failed(boot.barrier()), boot)
                })
            })
            .collect();
        let mut boots = Vec::new();
        for t in threads {
            let ((pe, reason), boot) = t.join().unwrap();
            boots.push(boot);
            assert_eq!(pe, 2);
            assert!(
                reason.contains("PE 2 never reached the rendezvous")
                    && reason.contains(&addr)
                    && reason.contains("within 1s"),
                "{reason}"
            );
        }
        let elapsed = t0.elapsed();
        assert!(
            elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(4),
            "{elapsed:?}"
        );
        // A late PE, while the server is still up (PEs 0 and 1 are still
        // connected), is told why the job is over.
        let late = Bootstrap::connect(&launch(2, 3, &addr, Launcher::CpnetRun), CONNECT);
        assert_eq!(peer_failed(late).0, 2);
        // The server ends once the joined PEs are gone.
        drop(boots);
        assert_eq!(srv.join().unwrap_err().pe, 2);
    });
}

#[test]
fn owner_notice_reaches_every_pe() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(3, CONNECT);
        let srv = Arc::new(srv);
        let s2 = srv.clone();
        let results = each_pe(3, &addr, move |pe, boot| {
            boot.barrier().unwrap(); // all joined
            if pe == 0 {
                thread::sleep(Duration::from_millis(200));
                s2.notify_failure(1, "process (pid 4242) killed by signal 9 (SIGKILL)");
            }
            // Including PE 1: the owner may be wrong about it being dead.
            peer_failed(boot.barrier())
        });
        for r in results {
            assert_eq!(
                r,
                (1, "process (pid 4242) killed by signal 9 (SIGKILL)".into())
            );
        }
        let srv = Arc::into_inner(srv).unwrap();
        assert_eq!(srv.join().unwrap_err().pe, 1);
    });
}

#[test]
fn lost_peer_delay_lets_the_owners_notice_win() {
    within(Duration::from_secs(30), || {
        let srv = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_lost_peer_delay(Duration::from_millis(500))
            .spawn(2)
            .unwrap();
        let addr = srv.local_addr().to_string();
        let pe0 = connect(0, 2, &addr);
        let pe1 = connect(1, 2, &addr);
        let pe0 = thread::spawn(move || peer_failed(pe0.barrier()));
        thread::sleep(Duration::from_millis(100));
        drop(pe1); // the EOF comes first ...
        thread::sleep(Duration::from_millis(50));
        srv.notify_failure(1, "process (pid 7) exited with status 3"); // ... the owner's word wins
        let (pe, reason) = pe0.join().unwrap();
        assert_eq!(
            (pe, reason.as_str()),
            (1, "process (pid 7) exited with status 3")
        );
        drop(srv);
    });
}

#[test]
fn collective_mismatch_is_reported_not_hung() {
    within(Duration::from_secs(30), || {
        let (srv, addr) = server(2, CONNECT);
        let results = each_pe(2, &addr, |pe, boot| {
            boot.barrier().unwrap(); // both joined
            if pe == 0 {
                thread::sleep(Duration::from_millis(300));
                peer_failed(boot.finalize())
            } else {
                peer_failed(boot.barrier())
            }
        });
        // Both hear the same verdict; it blames whichever PE's call arrived
        // second (PE 0's finalize, unless the machine is very loaded).
        assert_eq!(results[0], results[1]);
        let (pe, reason) = &results[0];
        assert!(reason.contains("collective mismatch"), "{reason}");
        assert!(
            reason.contains(&format!("PE {pe} called")),
            "{pe}: {reason}"
        );
        assert!(srv.join().is_err());
    });
}

#[test]
fn pe0_hosts_the_rendezvous_without_cpnet_run() {
    within(Duration::from_secs(30), || {
        let addr = free_port_addr();
        let threads: Vec<_> = (0..3)
            .map(|pe| {
                let addr = addr.clone();
                thread::spawn(move || {
                    // The others start first and must retry until PE 0 binds.
                    if pe == 0 {
                        thread::sleep(Duration::from_millis(300));
                    }
                    let boot =
                        Bootstrap::connect(&launch(pe, 3, &addr, Launcher::Mpi), CONNECT).unwrap();
                    let all = boot.allgather(&[pe as u8; 5]).unwrap();
                    assert_eq!(all, (0..3).map(|q| vec![q as u8; 5]).collect::<Vec<_>>());
                    boot.barrier().unwrap();
                    boot.finalize()
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap().unwrap();
        }
        // PE 0 joined its server in finalize: the port is free again.
        TcpListener::bind(&addr).unwrap();
    });
}

#[test]
fn hosting_pe0_dying_fails_the_others() {
    within(Duration::from_secs(30), || {
        let addr = free_port_addr();
        let pe0 = Bootstrap::connect(&launch(0, 2, &addr, Launcher::Slurm), CONNECT).unwrap();
        let pe1 = Bootstrap::connect(&launch(1, 2, &addr, Launcher::Slurm), CONNECT).unwrap();
        let pe1 = thread::spawn(move || peer_failed(pe1.barrier()));
        thread::sleep(Duration::from_millis(300));
        drop(pe0);
        let (pe, reason) = pe1.join().unwrap();
        assert_eq!(pe, 0, "{reason}");
    });
}

#[test]
fn unreachable_rendezvous_times_out_naming_the_address() {
    let addr = free_port_addr(); // nobody listens there any more
    let t0 = Instant::now();
    let e = Bootstrap::connect(
        &launch(1, 2, &addr, Launcher::CpnetRun),
        Duration::from_millis(300),
    )
    .unwrap_err();
    let elapsed = t0.elapsed();
    let msg = e.to_string();
    assert!(matches!(e, BootstrapError::Timeout { .. }), "{msg}");
    assert!(msg.contains(&addr) && msg.contains("PE 1"), "{msg}");
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3),
        "{elapsed:?}"
    );
}

#[test]
fn something_else_on_the_port_is_not_a_rendezvous() {
    within(Duration::from_secs(30), || {
        // A listener that accepts and says something that is not a frame.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        thread::spawn(move || {
            use std::io::Write;
            let (mut s, _) = l.accept().unwrap();
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            thread::sleep(Duration::from_millis(500));
        });
        let e = Bootstrap::connect(&launch(1, 2, &addr, Launcher::CpnetRun), CONNECT).unwrap_err();
        assert!(
            matches!(e, BootstrapError::Io { .. } | BootstrapError::Protocol(_)),
            "{e}"
        );
        assert!(e.to_string().contains(&addr), "{e}");
    });
}
