//! Repeated init and wait timeouts, one process with a thread per PE.

#[cfg(test)]
mod cycle_tests {
    //! Repeated init (module docs, "Repeated init"): one process, a thread
    //! per PE. The rest of the protocol is tested in `tests/bootstrap.rs`.

    use super::super::*;
    use std::io::Read;

    pub(super) const CONNECT: Duration = Duration::from_secs(10);

    /// Runs `f` on a thread; fails the test if it takes longer than `limit`.
    pub(super) fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
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

    pub(super) fn launch(pe: i32, n_pes: i32, addr: &str, launcher: Launcher) -> Launch {
        Launch {
            pe,
            n_pes,
            local_pe: pe,
            local_size: n_pes,
            bootstrap: Some(addr.to_owned()),
            launcher,
        }
    }

    /// A server like cpnet-run's: repeated init.
    pub(super) fn repeating(n: i32, connect_timeout: Duration) -> (ServerHandle, String) {
        let s = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_connect_timeout(connect_timeout)
            .with_repeated_init(true)
            .spawn(n)
            .unwrap();
        let addr = s.local_addr().to_string();
        (s, addr)
    }

    pub(super) fn join(pe: i32, n: i32, addr: &str) -> Bootstrap {
        Bootstrap::connect(&launch(pe, n, addr, Launcher::CpnetRun), CONNECT).unwrap()
    }

    pub(super) fn peer_failed<T: fmt::Debug>(r: Result<T, BootstrapError>) -> (i32, String) {
        match r {
            Err(BootstrapError::PeerFailed { pe, reason }) => (pe, reason),
            other => panic!("expected PeerFailed, got {other:?}"),
        }
    }

    /// Init/allgather/barrier/finalize cycles `cycles` on each of `n`
    /// threads, back to back (a PE re-joins while the server may not have
    /// seen the others' previous connections close).
    fn cycle_threads(n: i32, cycles: std::ops::Range<u64>, addr: &str, launcher: Launcher) {
        let threads: Vec<_> = (0..n)
            .map(|pe| {
                let (addr, cycles) = (addr.to_owned(), cycles.clone());
                thread::spawn(move || {
                    for c in cycles {
                        let boot = Bootstrap::connect(&launch(pe, n, &addr, launcher), CONNECT)
                            .unwrap_or_else(|e| panic!("PE {pe} cycle {c}: {e}"));
                        if launcher == Launcher::CpnetRun {
                            assert_eq!(boot.cycle, c, "PE {pe}");
                        }
                        let mine = [pe as u8, c as u8];
                        let all = boot.allgather(&mine).unwrap();
                        let want: Vec<Vec<u8>> = (0..n).map(|q| vec![q as u8, c as u8]).collect();
                        assert_eq!(all, want, "PE {pe} cycle {c}");
                        boot.barrier().unwrap();
                        boot.finalize().unwrap_or_else(|e| panic!("PE {pe} cycle {c}: {e}"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn repeating_server_serves_cycle_after_cycle() {
        within(Duration::from_secs(60), || {
            let (srv, addr) = repeating(3, CONNECT);
            cycle_threads(3, 0..30, &addr, Launcher::CpnetRun);
            assert!(!srv.is_finished(), "a repeating server waits for the next cycle");
            for pe in 0..3 {
                srv.notify_exit(pe, "process (pid 1) exited with status 0");
            }
            // Every PE ended after its last finalize: the job is just over.
            assert_eq!(srv.shutdown(), Ok(()));
        });
    }

    #[test]
    fn pe0_hosted_rendezvous_serves_repeated_init() {
        within(Duration::from_secs(60), || {
            let addr = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .to_string();
            cycle_threads(3, 0..30, &addr, Launcher::Mpi);
            // PE 0 joined its last server in finalize: the port is free.
            TcpListener::bind(&addr).unwrap();
        });
    }

    #[test]
    fn pe_that_ended_fails_the_next_cycle_whoever_comes_first() {
        within(Duration::from_secs(30), || {
            // The exit is known before PE 0 starts the next cycle.
            let (srv, addr) = repeating(2, CONNECT);
            cycle_threads(2, 0..1, &addr, Launcher::CpnetRun);
            srv.notify_exit(1, "process (pid 9) exited with status 0");
            thread::sleep(Duration::from_millis(50));
            let late = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), CONNECT);
            let (pe, reason) = peer_failed(late);
            assert_eq!(pe, 1, "{reason}");
            assert!(
                reason.contains("exited with status 0 without joining the job's init #2")
                    && reason.contains("which PE 0 started"),
                "{reason}"
            );
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);

            // PE 0 starts the next cycle first; the exit comes while it waits.
            let (srv, addr) = repeating(2, CONNECT);
            cycle_threads(2, 0..2, &addr, Launcher::CpnetRun);
            let pe0 = join(0, 2, &addr);
            let waiting = thread::spawn(move || peer_failed(pe0.barrier()));
            thread::sleep(Duration::from_millis(100));
            srv.notify_exit(1, "process (pid 9) exited with status 0");
            let (pe, reason) = waiting.join().unwrap();
            assert_eq!(pe, 1, "{reason}");
            assert!(reason.contains("without joining the job's init #3"), "{reason}");
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn cycle_that_never_completes_fails_after_the_connect_timeout() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, Duration::from_secs(1));
            cycle_threads(2, 0..1, &addr, Launcher::CpnetRun);
            // Time between cycles is the program's: no deadline runs then.
            thread::sleep(Duration::from_millis(1500));
            cycle_threads(2, 1..2, &addr, Launcher::CpnetRun);
            let t0 = Instant::now();
            let pe0 = join(0, 2, &addr);
            let (pe, reason) = peer_failed(pe0.barrier());
            let elapsed = t0.elapsed();
            assert_eq!(pe, 1, "{reason}");
            assert!(
                reason.contains(&format!(
                    "PE 1 never reached the rendezvous at {addr} for the job's init #3 \
                     within 1s of PE 0"
                )),
                "{reason}"
            );
            assert!(
                elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5),
                "{elapsed:?}"
            );
            drop(pe0);
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn failure_between_cycles_is_final() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, CONNECT);
            cycle_threads(2, 0..1, &addr, Launcher::CpnetRun);
            srv.notify_failure(1, "process (pid 9) killed by signal 9 (SIGKILL)");
            thread::sleep(Duration::from_millis(50));
            for _ in 0..2 {
                let late = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), CONNECT);
                assert_eq!(
                    peer_failed(late),
                    (1, "process (pid 9) killed by signal 9 (SIGKILL)".to_owned())
                );
            }
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    /// Hello and Welcome on a raw socket; returns it and the cycle.
    pub(super) fn raw_join(pe: i32, n: i32, addr: &str) -> (TcpStream, u64) {
        let mut s = TcpStream::connect(addr).unwrap();
        send_frame(&mut s, &wire::hello(pe, n)).unwrap();
        (s.try_clone().unwrap(), expect_cycle(&mut s))
    }

    pub(super) fn expect_cycle(s: &mut TcpStream) -> u64 {
        let (kind, body) = wire::read_frame(s, wire::MAX_FRAME).unwrap().unwrap();
        match wire::decode_to_client(kind, &body).unwrap() {
            ToClient::Welcome { cycle } => cycle,
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn an_earlier_cycles_connection_never_counts_in_a_later_one() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, CONNECT);
            let (mut a, ca) = raw_join(0, 2, &addr);
            let (mut b, cb) = raw_join(1, 2, &addr);
            assert_eq!((ca, cb), (0, 0));
            for s in [&mut a, &mut b] {
                send_frame(s, &wire::bye(None)).unwrap();
            }
            for s in [&mut a, &mut b] {
                let (kind, _) = wire::read_frame(s, wire::MAX_FRAME).unwrap().unwrap();
                assert_eq!(kind, wire::BYE_ACK);
                // The server closed its side after ByeAck.
                assert!(wire::read_frame(s, wire::MAX_FRAME).unwrap().is_none());
            }
            // Cycle 1 starts while cycle 0's connections are still open; a
            // late Gather of round 0 on one of them must not be counted (it
            // would make PE 0 "send round 0 twice" below).
            let pe0 = join(0, 2, &addr);
            assert_eq!(pe0.cycle, 1);
            send_frame(&mut a, &wire::gather(0, None, b"stale").unwrap()).unwrap();
            let a2 = addr.clone();
            let pe1 = thread::spawn(move || {
                let b = join(1, 2, &a2);
                let all = b.allgather(b"new1").unwrap();
                b.finalize().unwrap();
                all
            });
            assert_eq!(pe0.allgather(b"new0").unwrap(), vec![b"new0".to_vec(), b"new1".to_vec()]);
            // Cycle 0's connections closing now is no failure either.
            drop(a);
            let mut rest = Vec::new();
            let _ = b.read_to_end(&mut rest);
            drop(b);
            thread::sleep(Duration::from_millis(50));
            assert!(pe0.failure().is_none(), "{:?}", pe0.failure());
            pe0.finalize().unwrap();
            assert_eq!(pe1.join().unwrap(), vec![b"new0".to_vec(), b"new1".to_vec()]);
            assert_eq!(srv.shutdown(), Ok(()));
        });
    }
}

#[cfg(test)]
mod wait_timeout_tests {
    //! Host collectives honour the wait timeout (module docs, "Wait
    //! timeout"): one process, a thread per PE.

    use super::cycle_tests::{CONNECT, expect_cycle, join, launch, peer_failed, repeating, within};
    use super::super::*;
    use super::super::client::SERVER_SLACK;

    const T: Duration = Duration::from_millis(300);

    /// A server that ends after one cycle (PE 0's under mpirun).
    fn single(n: i32) -> (ServerHandle, String) {
        let s = Server::bind("127.0.0.1:0")
            .unwrap()
            .with_connect_timeout(CONNECT)
            .spawn(n)
            .unwrap();
        let addr = s.local_addr().to_string();
        (s, addr)
    }

    fn join_with(pe: i32, n: i32, addr: &str, timeout: Option<Duration>) -> Bootstrap {
        let b = join(pe, n, addr);
        b.set_wait_timeout(timeout);
        b
    }

    /// A PE that joined but does not call the collective: it waits until
    /// it hears of the failure; then its own barrier fails with it too.
    fn stuck(b: Bootstrap) -> thread::JoinHandle<(i32, String)> {
        thread::spawn(move || {
            let t0 = Instant::now();
            while b.failure().is_none() {
                assert!(t0.elapsed() < Duration::from_secs(20), "never told");
                thread::sleep(Duration::from_millis(5));
            }
            peer_failed(b.barrier())
        })
    }

    fn barrier_in_thread(b: Bootstrap) -> thread::JoinHandle<(i32, String)> {
        thread::spawn(move || peer_failed(b.barrier()))
    }

    #[test]
    fn a_pe_that_never_arrives_is_named_on_every_pe() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(3);
            let pes: Vec<Bootstrap> = (0..3).map(|p| join_with(p, 3, &addr, Some(T))).collect();
            // Round 0 completes; PE 1 then never comes to round 1.
            let pes: Vec<Bootstrap> = pes
                .into_iter()
                .map(|b| {
                    thread::spawn(move || {
                        b.barrier().unwrap();
                        b
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect();
            let [p0, p1, p2]: [Bootstrap; 3] = pes.try_into().unwrap();
            let t0 = Instant::now();
            let waiting: Vec<_> = [p0, p2]
                .into_iter()
                .map(|b| thread::spawn(move || peer_failed(b.allgather(b"x"))))
                .collect();
            let p1 = stuck(p1);
            let mut reports: Vec<(i32, String)> =
                waiting.into_iter().map(|t| t.join().unwrap()).collect();
            let elapsed = t0.elapsed();
            reports.push(p1.join().unwrap());
            assert!(elapsed >= T && elapsed < Duration::from_secs(5), "{elapsed:?}");
            for (pe, reason) in &reports {
                assert_eq!(*pe, 1, "{reason}");
                assert!(
                    reason.starts_with("collective timeout: PE 0 gave up on allgather/barrier round 1 after waiting ")
                        || reason.starts_with("collective timeout: PE 2 gave up on allgather/barrier round 1 after waiting "),
                    "{reason}"
                );
                assert!(
                    reason.contains("s (its wait timeout: 0.3s); not arrived: PE 1 (2 of 3 PEs had). Is it stuck")
                        && reason.contains("Raise CPNET_COLLECTIVE_TIMEOUT"),
                    "{reason}"
                );
            }
            // Every PE got the same report.
            assert!(reports.windows(2).all(|w| w[0] == w[1]), "{reports:?}");
            assert_eq!(srv.join().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn several_missing_pes_are_listed_and_none_is_blamed() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(4);
            let p0 = join_with(0, 4, &addr, Some(T));
            let others: Vec<_> = (1..4).map(|p| stuck(join_with(p, 4, &addr, None))).collect();
            let (pe, reason) = peer_failed(p0.barrier());
            assert_eq!(pe, -1, "{reason}");
            assert!(
                reason.contains("PE 0 gave up on allgather/barrier round 0 after waiting")
                    && reason.contains("not arrived: 3 PEs (1, 2, 3) (1 of 4 PEs had). Are they stuck"),
                "{reason}"
            );
            for t in others {
                assert_eq!(t.join().unwrap(), (pe, reason.clone()));
            }
            drop(p0);
            assert_eq!(srv.join().unwrap_err().pe, -1);
        });
    }

    #[test]
    fn pes_may_disagree_the_first_deadline_decides() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(4);
            // PE 0 waits forever, PE 1 for 3 s, both from t = 0; PE 2 for
            // 0.3 s from t = 0.5: its deadline (0.8 s) is the first. PE 3
            // never comes.
            let t0 = Instant::now();
            let a = barrier_in_thread(join_with(0, 4, &addr, None));
            let b = barrier_in_thread(join_with(1, 4, &addr, Some(Duration::from_secs(3))));
            let p2 = join_with(2, 4, &addr, Some(T));
            let d = stuck(join_with(3, 4, &addr, Some(T)));
            thread::sleep(Duration::from_millis(500));
            let (pe, reason) = peer_failed(p2.barrier());
            let elapsed = t0.elapsed();
            assert!(
                elapsed >= Duration::from_millis(800) && elapsed < Duration::from_millis(2900),
                "{elapsed:?}"
            );
            assert_eq!(pe, 3, "{reason}");
            assert!(
                reason.starts_with("collective timeout: PE 2 gave up on allgather/barrier round 0")
                    && reason.contains("not arrived: PE 3 (3 of 4 PEs had)"),
                "{reason}"
            );
            for t in [a, b, d] {
                assert_eq!(t.join().unwrap(), (pe, reason.clone()));
            }
            drop(p2);
            assert_eq!(srv.join().unwrap_err().pe, 3);
        });
    }

    #[test]
    fn collectives_within_the_timeout_and_time_between_them_are_fine() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(3);
            let threads: Vec<_> = (0..3)
                .map(|pe| {
                    let addr = addr.clone();
                    thread::spawn(move || {
                        let b = join_with(pe, 3, &addr, Some(T));
                        for round in 0..4u64 {
                            // Arrivals spread over 0.1 s of the 0.3 s.
                            thread::sleep(Duration::from_millis(50 * pe as u64));
                            let all = b.allgather(&[pe as u8]).unwrap();
                            assert_eq!(all, vec![vec![0], vec![1], vec![2]], "round {round}");
                            // Longer than the timeout, between collectives.
                            if round == 1 {
                                thread::sleep(Duration::from_millis(600));
                            }
                        }
                        b.finalize().unwrap();
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            assert_eq!(srv.join(), Ok(()));
        });
    }

    #[test]
    fn the_clock_starts_when_the_last_pe_joined() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(2);
            let p0 = join_with(0, 2, &addr, Some(T));
            let a = thread::spawn(move || {
                p0.barrier().unwrap();
                p0.finalize().unwrap();
            });
            // PE 1 joins after PE 0 waited twice its timeout (the connect
            // timeout is 10 s): not a collective timeout.
            thread::sleep(Duration::from_millis(700));
            let p1 = join_with(1, 2, &addr, Some(T));
            thread::sleep(Duration::from_millis(100));
            p1.barrier().unwrap();
            p1.finalize().unwrap();
            a.join().unwrap();
            assert_eq!(srv.join(), Ok(()));
        });
    }

    #[test]
    fn finalize_times_out_too() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(2);
            let p0 = join_with(0, 2, &addr, Some(T));
            let p1 = stuck(join_with(1, 2, &addr, None));
            let (pe, reason) = match p0.finalize() {
                Err(BootstrapError::PeerFailed { pe, reason }) => (pe, reason),
                r => panic!("{r:?}"),
            };
            assert_eq!(pe, 1);
            assert!(
                reason.starts_with("collective timeout: PE 0 gave up on finalize after waiting")
                    && reason.contains("not arrived: PE 1 (1 of 2 PEs had)"),
                "{reason}"
            );
            assert_eq!(p1.join().unwrap(), (pe, reason));
            assert_eq!(srv.join().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn a_later_init_cycle_is_named() {
        within(Duration::from_secs(30), || {
            let (srv, addr) = repeating(2, CONNECT);
            for _ in 0..2 {
                let b = thread::spawn({
                    let addr = addr.clone();
                    move || join_with(1, 2, &addr, Some(T)).finalize().unwrap()
                });
                join_with(0, 2, &addr, Some(T)).finalize().unwrap();
                b.join().unwrap();
            }
            let p0 = join_with(0, 2, &addr, Some(T));
            let p1 = stuck(join_with(1, 2, &addr, Some(T)));
            let (pe, reason) = peer_failed(p0.barrier());
            assert_eq!(pe, 1);
            assert!(
                reason.starts_with(
                    "collective timeout: PE 0 gave up on allgather/barrier round 0 of the \
                     job's init #3 after waiting"
                ),
                "{reason}"
            );
            assert_eq!(p1.join().unwrap(), (pe, reason));
            drop(p0);
            assert_eq!(srv.shutdown().unwrap_err().pe, 1);
        });
    }

    #[test]
    fn a_client_gives_up_on_a_silent_rendezvous_and_aborts() {
        within(Duration::from_secs(30), || {
            // A "rendezvous" that welcomes PE 0 and then says nothing.
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let silent = thread::spawn(move || {
                let (mut s, _) = listener.accept().unwrap();
                let (kind, _) = wire::read_frame(&mut s, wire::MAX_FRAME).unwrap().unwrap();
                assert_eq!(kind, wire::HELLO);
                send_frame(&mut s, &wire::welcome(0)).unwrap();
                let mut got = Vec::new();
                while let Ok(Some((kind, body))) = wire::read_frame(&mut s, wire::MAX_FRAME) {
                    got.push(wire::decode_to_server(kind, body).unwrap());
                }
                got
            });
            let connect = Duration::from_millis(200);
            let b = Bootstrap::connect(&launch(0, 2, &addr, Launcher::CpnetRun), connect).unwrap();
            b.set_wait_timeout(Some(T));
            let t0 = Instant::now();
            let e = b.barrier().unwrap_err();
            let elapsed = t0.elapsed();
            let limit = T + connect + SERVER_SLACK;
            assert!(elapsed >= limit && elapsed < limit + Duration::from_secs(3), "{elapsed:?}");
            let BootstrapError::Timeout { what } = &e else {
                panic!("{e:?}")
            };
            assert!(
                what.starts_with("waiting for the rendezvous: PE 0 gave up on barrier round 0 after ")
                    && what.contains(&format!("the rendezvous at {addr} neither completed it")),
                "{what}"
            );
            // It aborted: its later collectives fail, and the server was told.
            assert_eq!(b.failure().map(|f| f.pe), Some(0));
            drop(b);
            let got = silent.join().unwrap();
            assert!(
                matches!(&got[..], [ToServer::Gather { round: 0, timeout_ms: 300, .. }, ToServer::Abort { reason }] if reason.contains("gave up on barrier round 0")),
                "{got:?}"
            );
        });
    }

    #[test]
    fn welcome_and_gather_on_a_raw_socket_carry_the_timeout() {
        // What the server counts is what the PE sent: a raw Gather with a
        // 0.2 s timeout against a PE that never comes.
        within(Duration::from_secs(30), || {
            let (srv, addr) = single(2);
            let mut s = TcpStream::connect(&addr).unwrap();
            send_frame(&mut s, &wire::hello(0, 2)).unwrap();
            assert_eq!(expect_cycle(&mut s), 0);
            let p1 = stuck(join(1, 2, &addr));
            send_frame(&mut s, &wire::gather(0, Some(Duration::from_millis(200)), b"").unwrap()).unwrap();
            let (kind, body) = wire::read_frame(&mut s, wire::MAX_FRAME).unwrap().unwrap();
            match wire::decode_to_client(kind, &body).unwrap() {
                ToClient::Aborted { pe, reason } => {
                    assert_eq!(pe, 1);
                    assert!(reason.contains("(its wait timeout: 0.2s)"), "{reason}");
                }
                m => panic!("{m:?}"),
            }
            assert_eq!(p1.join().unwrap().0, 1);
            drop(s);
            assert_eq!(srv.join().unwrap_err().pe, 1);
        });
    }
}

