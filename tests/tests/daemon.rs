//! The proxy daemon, `cpnet-proxyd` (issue 20), as real processes: PEs of
//! `cpnet-check` under `cpnet-run` with `CPNET_PROXY=daemon`, and raw
//! clients speaking the attach protocol over the real Unix socket. Each test
//! runs its own daemon in its own directory (`--persistent`, stopped at the
//! end), so tests do not share one.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use cpnet::daemon::shm::SharedMem;
use cpnet::daemon::wire::{self, Attach, ToDaemon, ToPe};

const CHECK: &str = env!("CARGO_BIN_EXE_cpnet-check");

/// One test at a time: the timing checks (a dead daemon noticed within
/// seconds) must not compete with other tests' jobs on a 2-core machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Live processes whose environment holds `needle` (e.g. a test's daemon
/// directory): what would be orphans after a job.
fn processes_with_env(needle: &str) -> Vec<u32> {
    cpnet_tests::procs::pids_where(|_, dir| {
        std::fs::read(dir.join("environ")).is_ok_and(|b| b.split(|&c| c == 0).any(|kv| kv == needle.as_bytes()))
    })
}

/// The `cpnet` package's binary `name` beside `cpnet-check` (built if missing).
fn sibling(name: &str) -> PathBuf {
    let dir = Path::new(CHECK).parent().expect("bin dir");
    let run = cpnet_tests::launch::cpnet_run(dir, env!("CARGO"));
    let p = dir.join(name);
    if !p.exists() {
        let st = Command::new(env!("CARGO")).args(["build", "-q", "-p", "cpnet", "--bin", name]).status().expect("cargo");
        assert!(st.success(), "building {name} failed");
    }
    let _ = run;
    p
}

/// A daemon of this test, in its own directory.
struct Daemon {
    dir: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    pid: u32,
}

impl Daemon {
    /// Starts `cpnet-proxyd --dir DIR --persistent` (as `user` through
    /// `setpriv` when given) and waits until its socket answers.
    fn start(name: &str, user: Option<&str>) -> Daemon {
        Daemon::start_for(name, user, None)
    }

    /// As [`Daemon::start`]; with `gpu`, the daemon of that GPU (`--gpu`).
    fn start_for(name: &str, user: Option<&str>, gpu: Option<&str>) -> Daemon {
        let dir = PathBuf::from(format!("/tmp/cpnet-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&dir).expect("daemon dir");
        let log = PathBuf::from(format!("{}.log", dir.display()));
        let out = std::fs::File::create(&log).expect("log file");
        let mut cmd = match user {
            None => Command::new(sibling("cpnet-proxyd")),
            Some(u) => {
                let st = Command::new("chown").arg(format!("{u}:")).arg(&dir).arg(&log).status().expect("chown");
                assert!(st.success(), "chown {u} {}", dir.display());
                let mut c = Command::new("setpriv");
                // Numeric ids: the group of `nobody` is `nogroup` on Debian, `nobody` elsewhere.
                let id = |flag: &str| String::from_utf8_lossy(&Command::new("id").args([flag, u]).output().expect("id").stdout).trim().to_owned();
                c.args(["--reuid", &id("-u"), "--regid", &id("-g"), "--clear-groups", "--"]).arg(sibling("cpnet-proxyd"));
                c
            }
        };
        if let Some(g) = gpu {
            cmd.arg("--gpu").arg(g);
        }
        cmd.arg("--dir").arg(&dir).arg("--persistent").env("RUST_LOG", "info").stdin(Stdio::null()).stdout(out.try_clone().unwrap()).stderr(out);
        let child = cmd.spawn().expect("start cpnet-proxyd");
        let pid = child.id();
        let socket = match gpu {
            Some(g) => dir.join(format!("proxyd-{g}.sock")),
            None => dir.join("proxyd.sock"),
        };
        let d = Daemon { dir, socket, log, child: Some(child), pid };
        let t = Instant::now();
        while !d.log().contains("serving") {
            assert!(t.elapsed() < Duration::from_secs(20), "the daemon did not come up:\n{}", d.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn socket(&self) -> PathBuf {
        self.socket.clone()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Open fds of the daemon.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map(|d| d.count()).unwrap_or(0)
    }

    /// Its mappings of PEs' memfds.
    fn memfd_maps(&self) -> usize {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap_or_default().lines().filter(|l| l.contains("memfd:cpnet")).count()
    }

    /// Its resident set, KiB (`VmRSS`).
    fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
            .unwrap_or(0)
    }

    fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists() && !std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default().contains(") Z ")
    }

    fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CPNET_PROXY".into(), "daemon".into()),
            ("CPNET_PROXYD_DIR".into(), self.dir.display().to_string()),
            ("CPNET_PROVIDER".into(), "shm".into()),
            ("CPNET_WAIT_TIMEOUT".into(), "60".into()),
            ("RUST_LOG".into(), "warn".into()),
        ]
    }

    fn kill(&mut self, sig: i32) -> Option<ExitStatus> {
        let mut c = self.child.take()?;
        // SAFETY: kill(2) on the daemon this test started, not yet reaped.
        unsafe { libc::kill(c.id() as i32, sig) };
        c.wait().ok()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A running job: `cpnet-run -n N -- cpnet-check args` with `env`.
fn spawn_job(n: u32, args: &[&str], env: &[(String, String)]) -> (Child, Instant) {
    spawn_program(CHECK, n, args, env)
}

/// A running job: `cpnet-run -n N -- program args` with `env`.
fn spawn_program(program: &str, n: u32, args: &[&str], env: &[(String, String)]) -> (Child, Instant) {
    let mut cmd = Command::new(sibling("cpnet-run"));
    cmd.args(["-n", &n.to_string(), "--grace", "25", "--"]).arg(program).args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    (cmd.spawn().expect("start cpnet-run"), Instant::now())
}

/// Waits for a job (at most `limit`): its status, output and wall time.
fn finish((child, t): (Child, Instant), limit: Duration) -> (ExitStatus, String, Duration) {
    let j = cpnet_tests::launch::finish(child, t, limit, "the job");
    (j.status, j.all, j.elapsed)
}

fn assert_ok(n: u32, (status, all, _): &(ExitStatus, String, Duration), what: &str) {
    assert!(status.success(), "{what} failed ({status}):\n{all}");
    for pe in 0..n {
        assert!(all.contains(&format!("PE {pe}: OK")), "{what}: PE {pe} did not report OK:\n{all}");
    }
}

/// An Attach of a one-PE job whose memory this test made (memfds sealed).
fn attach_msg(job: u64, token: u8, pe: i32, n_pes: i32) -> (Attach, [std::os::fd::OwnedFd; 2], [SharedMem; 2]) {
    let heap_size = 64 << 10;
    let region_len = cpnet::proxy::transport::region_len(heap_size);
    let (q, qfd) = SharedMem::create("cpnet-test-queues", cpnet::device::ring::QueueGeometry::new(64).unwrap().bytes()).unwrap();
    let (r, rfd) = SharedMem::create("cpnet-test-heap", region_len as usize).unwrap();
    let att = Attach {
        job,
        token: [token; 16],
        pe,
        n_pes,
        heap_size,
        region_len,
        queues: 1,
        depth: 64,
        threads: 1,
        idle_sleep_us: 0,
        stall_ms: 0,
        provider: "shm".into(),
        src_node: String::new(),
        gpu: None,
    };
    (att, [qfd, rfd], [q, r])
}

/// Connects and sends `frame` (with `fds`); the daemon's first answer, if any.
fn raw(d: &Daemon, frame: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> (UnixStream, Option<ToPe>) {
    let s = UnixStream::connect(d.socket()).expect("connect to the daemon");
    wire::send(&s, frame, fds).expect("send");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let reply = match wire::recv(&s) {
        Ok(Some(f)) => Some(ToPe::decode(f.kind, &f.body).expect("the daemon's answer decodes")),
        _ => None,
    };
    (s, reply)
}

fn refused(reply: Option<ToPe>, what: &str) -> String {
    match reply {
        Some(ToPe::Refused(r)) => r,
        other => panic!("{what}: expected Refused, got {other:?}"),
    }
}

/// Waits until the daemon's log has `n` lines containing `needle`.
fn wait_log(d: &Daemon, needle: &str, n: usize) -> String {
    let t = Instant::now();
    loop {
        let log = d.log();
        if log.lines().filter(|l| l.contains(needle)).count() >= n {
            return log;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "no {n} line(s) with {needle:?} in the daemon's log:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn ops_and_stress_pass_through_the_daemon() {
    let _one = serial();
    let d = Daemon::start("ops", None);
    let env = d.env();
    assert_ok(2, &finish(spawn_job(2, &["ops"], &env), Duration::from_secs(300)), "daemon ops over shm");
    assert_ok(2, &finish(spawn_job(2, &["stress", "--ops", "50000"], &env), Duration::from_secs(300)), "daemon stress over shm");
    let mut tcp = env.clone();
    tcp.retain(|(k, _)| k != "CPNET_PROVIDER");
    tcp.push(("CPNET_PROVIDER".into(), "tcp;ofi_rxm".into()));
    assert_ok(2, &finish(spawn_job(2, &["ops"], &tcp), Duration::from_secs(300)), "daemon ops over tcp");
    let log = d.log();
    assert_eq!(log.matches(" detached").count(), 6, "every PE attached and detached:\n{log}");
    assert!(d.alive());
}

#[test]
fn repeated_init_attaches_again_and_each_cycle_is_released() {
    let _one = serial();
    let d = Daemon::start("reinit", None);
    let r = finish(spawn_program(env!("CARGO_BIN_EXE_cpnet-cycles"), 2, &["--cycles", "12"], &d.env()), Duration::from_secs(300));
    assert!(r.0.success(), "cpnet-cycles through the daemon:\n{}", r.1);
    assert!(r.1.contains("PE 0: OK (12 cycles") && r.1.contains("PE 1: OK (12 cycles"), "{}", r.1);
    // Every cycle's sessions were closed when both PEs of that cycle had
    // left, not all at the end.
    wait_log(&d, "endpoints closed", 12);
    assert_eq!(d.memfd_maps(), 0);
}

#[test]
fn under_mpirun_the_pes_start_one_daemon_and_share_a_job_key() {
    let _one = serial();
    // No cpnet-run: Open MPI's variables, PE 0 hosts the rendezvous, no job
    // key in the environment, no daemon running.
    let dir = PathBuf::from(format!("/tmp/cpnet-test-mpi-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = 20000 + (std::process::id() % 20000);
    let pes: Vec<Child> = (0..2)
        .map(|r: u32| {
            Command::new(CHECK)
                .arg("ops")
                .env("OMPI_COMM_WORLD_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_SIZE", "2")
                .env("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string())
                .env("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
                .env("CPNET_BOOTSTRAP_ADDR", format!("127.0.0.1:{port}"))
                .env("CPNET_PROXY", "daemon")
                .env("CPNET_PROXYD_DIR", &dir)
                .env("CPNET_PROXYD_LINGER", "1")
                .env("CPNET_PROVIDER", "shm")
                .env_remove("CPNET_JOB_ID")
                .env_remove("CPNET_JOB_TOKEN")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start a PE")
        })
        .collect();
    let t = Instant::now();
    for (r, pe) in pes.into_iter().enumerate() {
        let j = cpnet_tests::launch::finish(pe, t, Duration::from_secs(120), &format!("PE {r}"));
        assert!(j.status.success() && j.all.contains(&format!("PE {r}: OK")), "PE {r}:\n{}", j.all);
    }
    let log = std::fs::read_to_string(dir.join("proxyd.log")).unwrap_or_default();
    let jobs: std::collections::HashSet<&str> =
        log.lines().filter(|l| l.contains(" attached: ")).filter_map(|l| l.split(" of job ").nth(1)?.split(' ').next()).collect();
    assert_eq!(jobs.len(), 1, "both PEs in one job (PE 0's key):\n{log}");
    assert_eq!(log.matches("serving").count(), 1, "one daemon served:\n{log}");
    // It lingers out by itself.
    let t = Instant::now();
    while dir.join("proxyd.sock").exists() {
        assert!(t.elapsed() < Duration::from_secs(20), "the daemon did not linger out:\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_jobs_at_once_on_one_daemon_see_only_their_own_memory() {
    let _one = serial();
    let d = Daemon::start("isolation", None);
    let env = d.env();
    let a = spawn_job(2, &["isolation", "--tag", "11", "--hold", "5"], &env);
    let b = spawn_job(2, &["isolation", "--tag", "22", "--hold", "5"], &env);
    let (ra, rb) = (finish(a, Duration::from_secs(300)), finish(b, Duration::from_secs(300)));
    assert_ok(2, &ra, "job A");
    assert_ok(2, &rb, "job B");
    for (r, tag) in [(&ra, 11), (&rb, 22)] {
        assert!(r.1.contains(&format!("job {tag}: 65536 bytes from PE 1, all its own job's")), "{}", r.1);
        assert!(r.1.contains("put to PE 3 (not in this job): refused"), "{}", r.1);
    }
    // Both jobs were attached at the same time: 4 PEs attached before the first detached.
    let log = d.log();
    let jobs: std::collections::HashSet<&str> =
        log.lines().filter(|l| l.contains(" attached: ")).filter_map(|l| l.split(" of job ").nth(1)?.split(' ').next()).collect();
    assert_eq!(jobs.len(), 2, "two jobs:\n{log}");
    let first_detach = log.find(" detached").expect("detaches");
    assert_eq!(log[..first_detach].matches(" attached: ").count(), 4, "both jobs ran at once:\n{log}");
}

#[test]
fn wrong_token_duplicate_pe_and_malformed_messages_are_refused_and_the_daemon_goes_on() {
    let _one = serial();
    let d = Daemon::start("refuse", None);
    // PE 0 of job 7, token 1: accepted; it holds the job open.
    let (att, fds, _mem) = attach_msg(7, 1, 0, 2);
    let (_holder, reply) = raw(&d, &ToDaemon::Attach(att).encode(), &[fds[0].as_fd(), fds[1].as_fd()]);
    assert!(matches!(reply, Some(ToPe::Accepted { .. })), "{reply:?}");

    let (att, fds, _m) = attach_msg(7, 2, 1, 2);
    let r = refused(raw(&d, &ToDaemon::Attach(att).encode(), &[fds[0].as_fd(), fds[1].as_fd()]).1, "wrong token");
    assert!(r.contains("wrong token for job 0x7"), "{r}");
    let (att, fds, _m) = attach_msg(7, 1, 0, 2);
    let r = refused(raw(&d, &ToDaemon::Attach(att).encode(), &[fds[0].as_fd(), fds[1].as_fd()]).1, "PE twice");
    assert!(r.contains("attached already"), "{r}");
    let (att, fds, _m) = attach_msg(7, 1, 1, 3);
    let r = refused(raw(&d, &ToDaemon::Attach(att).encode(), &[fds[0].as_fd(), fds[1].as_fd()]).1, "another size");
    assert!(r.contains("has 2 PEs"), "{r}");

    // Malformed: not our protocol, another version, a truncated frame, a
    // truncated body, no fds, an unsealed memfd, a first message that is not Attach.
    let r = refused(raw(&d, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", &[]).1, "garbage");
    assert!(r.contains("bad magic"), "{r}");
    let mut v2 = ToDaemon::Detach.encode();
    v2[4] = 9;
    assert!(refused(raw(&d, &v2, &[]).1, "version").contains("protocol version 9"));
    let (att, fds, _m) = attach_msg(8, 1, 0, 1);
    let full = ToDaemon::Attach(att).encode();
    {
        // A header announcing more than comes, then EOF.
        let s = UnixStream::connect(d.socket()).unwrap();
        wire::send(&s, &full[..full.len() - 10], &[fds[0].as_fd(), fds[1].as_fd()]).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let f = wire::recv(&s).unwrap().expect("an answer");
        let r = refused(Some(ToPe::decode(f.kind, &f.body).unwrap()), "truncated frame");
        assert!(r.contains("truncated message"), "{r}");
    }
    let mut short = full[..wire::HEADER + 20].to_vec();
    short[8..12].copy_from_slice(&20u32.to_le_bytes());
    let r = refused(raw(&d, &short, &[fds[0].as_fd(), fds[1].as_fd()]).1, "truncated body");
    assert!(r.contains("truncated: "), "{r}");
    assert!(refused(raw(&d, &full, &[]).1, "no fds").contains("2 file descriptors"));
    let plain = rustix::fs::memfd_create("cpnet-test-unsealed", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&plain, cpnet::device::ring::QueueGeometry::new(64).unwrap().bytes() as u64).unwrap();
    assert!(refused(raw(&d, &full, &[plain.as_fd(), fds[1].as_fd()]).1, "unsealed").contains("not sealed"));
    assert!(refused(raw(&d, &ToDaemon::Errors.encode(), &[]).1, "not Attach").contains("must be Attach"));

    let log = wait_log(&d, "refused", 10);
    for needle in ["wrong token", "attached already", "bad magic", "protocol version 9", "truncated message", "truncated: ", "2 file descriptors", "not sealed", "must be Attach"] {
        assert!(log.lines().any(|l| l.contains("refused") && l.contains(needle)), "no log line for {needle:?}:\n{log}");
    }
    drop(_holder);
    wait_log(&d, "went away without detaching", 1);
    // It goes on serving.
    assert_ok(2, &finish(spawn_job(2, &["ops"], &d.env()), Duration::from_secs(300)), "ops after the refusals");
}

/// A GPU PE's Attach as a PE would send it for GPU `uuid`, and its three
/// memfds (pool, status, payload slots of 1 KiB).
fn borrow(f: &[std::os::fd::OwnedFd]) -> Vec<std::os::fd::BorrowedFd<'_>> {
    f.iter().map(|f| f.as_fd()).collect()
}

fn gpu_attach_msg(job: u64, uuid: [u8; 16]) -> (Attach, Vec<std::os::fd::OwnedFd>, Vec<SharedMem>) {
    let (mut att, _cpu_fds, _cpu_mem) = attach_msg(job, 1, 0, 1);
    att.region_len = 0;
    att.gpu = Some(wire::GpuAttach { uuid, payload_bytes: 1024, tuning: vec![("CPNET_AGENT_LANES".into(), "1".into())] });
    let geom = cpnet::device::ring::QueueGeometry::new(64).unwrap();
    let page = |n: usize| n.max(1).div_ceil(4096) * 4096;
    let (mut fds, mut mem) = (Vec::new(), Vec::new());
    for (name, len) in [("cpnet-test-gpu-queues", geom.bytes()), ("cpnet-test-gpu-status", 64), ("cpnet-test-gpu-payload", 64 * 1024)] {
        let (m, fd) = SharedMem::create(name, page(len)).unwrap();
        fds.push(fd);
        mem.push(m);
    }
    (att, fds, mem)
}

/// GPU PEs go to their GPU's daemon: the host's daemon of CPU PEs refuses
/// them, a GPU's daemon refuses another GPU's PEs and malformed GPU
/// attaches (fd count, a heap region, payload size), each with its reason
/// in the log, and both go on serving. (Without a GPU, a daemon of a GPU
/// also refuses the matching UUID: it has no device; the GPU machine's
/// tests attach real GPU PEs, tests/tests/gpu_multi_pe.rs.)
#[test]
fn gpu_attaches_go_to_their_gpus_daemon_and_malformed_ones_are_refused() {
    let _one = serial();
    let uuid = [0x5d; 16];
    let name = wire::uuid_string(&uuid);
    let other = wire::uuid_string(&[0x11; 16]);

    let cpu = Daemon::start("gpu-at-cpu", None);
    let (att, fds, _m) = gpu_attach_msg(21, uuid);
    let r = refused(raw(&cpu, &ToDaemon::Attach(att).encode(), &borrow(&fds)).1, "GPU PE at the CPU daemon");
    assert!(r.contains("this daemon serves CPU PEs") && r.contains(&format!("proxyd-{name}.sock")), "{r}");

    let gd = Daemon::start_for("gpu-daemon", None, Some(&other));
    let (att, fds, _m) = gpu_attach_msg(22, uuid);
    let r = refused(raw(&gd, &ToDaemon::Attach(att.clone()).encode(), &borrow(&fds)).1, "another GPU");
    assert!(r.contains(&format!("this daemon serves {other}")) && r.contains(&name), "{r}");
    let r = refused(raw(&gd, &ToDaemon::Attach(att.clone()).encode(), &borrow(&fds[..2])).1, "two fds");
    assert!(r.contains("must carry 3 file descriptors"), "{r}");
    let mut with_region = att.clone();
    with_region.region_len = 4096;
    let r = refused(raw(&gd, &ToDaemon::Attach(with_region).encode(), &borrow(&fds)).1, "a region");
    assert!(r.contains("stays in GPU memory"), "{r}");
    let mut odd = att.clone();
    odd.gpu.as_mut().unwrap().payload_bytes = 1000;
    let r = refused(raw(&gd, &ToDaemon::Attach(odd).encode(), &borrow(&fds)).1, "payload size");
    assert!(r.contains("payload slots of 1000 bytes"), "{r}");
    // The matching UUID on a machine whose daemon sees no such GPU.
    let (att, fds, _m) = gpu_attach_msg(23, [0x11; 16]);
    let r = refused(raw(&gd, &ToDaemon::Attach(att).encode(), &borrow(&fds)).1, "no such device");
    assert!(r.contains("no CUDA driver") || r.contains("no visible CUDA device has UUID"), "{r}");
    let log = wait_log(&gd, "refused", 5);
    for needle in ["this daemon serves", "must carry 3", "stays in GPU memory", "payload slots of 1000", "UUID"] {
        assert!(log.lines().any(|l| l.contains("refused") && l.contains(needle)) || needle == "UUID", "no log line for {needle:?}:\n{log}");
    }
    assert!(gd.alive() && cpu.alive(), "both daemons go on");
    // The CPU daemon still serves its PEs.
    assert_ok(2, &finish(spawn_job(2, &["ops"], &cpu.env()), Duration::from_secs(300)), "ops after the GPU refusals");
    // A malformed --gpu is a usage error.
    let st = Command::new(sibling("cpnet-proxyd")).args(["--gpu", "GPU-nope", "--dir", "/nonexistent"]).status().unwrap();
    assert_eq!(st.code(), Some(2), "--gpu GPU-nope");
}

#[test]
fn another_uid_is_refused() {
    let _one = serial();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("SKIP another_uid_is_refused: needs root and setpriv to run the daemon as nobody");
        return;
    }
    // The daemon runs as nobody; this test (root, who may open nobody's
    // directory) is the other user.
    let d = Daemon::start("uid", Some("nobody"));
    let (att, fds, _m) = attach_msg(9, 1, 0, 1);
    let r = refused(raw(&d, &ToDaemon::Attach(att).encode(), &[fds[0].as_fd(), fds[1].as_fd()]).1, "root at nobody's daemon");
    assert!(r.contains("uid 0 is not this daemon's user (uid 65534)"), "{r}");
    let log = wait_log(&d, "refused", 1);
    assert!(log.contains("(uid 0): uid 0 is not this daemon's user"), "{log}");
    assert!(d.alive());
}

#[test]
fn a_killed_pe_is_cleaned_up_its_peers_fail_and_another_job_finishes() {
    let _one = serial();
    let d = Daemon::start("pekill", None);
    let env = d.env();
    let fds0 = d.fds();
    let other = spawn_job(2, &["stress", "--ops", "60000"], &env);
    let dying = spawn_job(3, &["peer-death", "--victim", "1"], &env);
    let (st, all, took) = finish(dying, Duration::from_secs(120));
    assert!(!st.success(), "the job with a dead PE must fail:\n{all}");
    for pe in [0, 2] {
        let line = all.lines().find(|l| l.starts_with(&format!("cpnet: PE {pe}: PE 1 failed: process (pid "))).unwrap_or("");
        assert!(line.ends_with("killed by signal 9 (SIGKILL); aborting this PE"), "PE {pe} says what it says without a daemon:\n{all}");
    }
    assert!(took < Duration::from_secs(60), "took {took:?}");
    assert_ok(2, &finish(other, Duration::from_secs(300)), "the other job on the same daemon");
    let log = wait_log(&d, "went away without detaching", 1);
    assert!(log.contains("PE 1 of job"), "{log}");
    wait_log(&d, "left: 3 PE(s)' endpoints closed", 1);
    wait_log(&d, " detached", 2);
    let t = Instant::now();
    while d.memfd_maps() > 0 && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(d.memfd_maps(), 0, "the daemon still maps PEs' memory");
    assert!(d.fds() <= fds0 + 2, "fds: {fds0} before, {} after", d.fds());
    assert!(d.alive());
}

#[test]
fn a_killed_daemon_fails_every_attached_pe_and_leaves_nothing() {
    let _one = serial();
    let mut d = Daemon::start("dkill", None);
    let mut env = d.env();
    env.push(("CPNET_ABORT_GRACE".into(), "3".into()));
    let pid = d.pid;
    let job = spawn_job(2, &["stress", "--ops", "100000000"], &env);
    wait_log(&d, " attached: ", 2);
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    d.kill(libc::SIGKILL);
    let (st, all, _) = finish(job, Duration::from_secs(120));
    let after = killed.elapsed();
    assert!(!st.success(), "the job must fail without its daemon:\n{all}");
    // Each PE names the daemon, or (when a peer noticed first and told the
    // job through the rendezvous before this PE's own link did) says its
    // peer failed because the proxy daemon was lost; at least one names it.
    let names = |pe: i32| all.contains(&format!("cpnet: PE {pe}: lost the proxy daemon cpnet-proxyd (pid {pid}, socket {}", d.socket().display()));
    assert!(names(0) || names(1), "a PE must name the daemon:\n{all}");
    for pe in 0..2 {
        let told = all.contains(&format!("cpnet: PE {pe}: PE {} failed: the proxy daemon was lost", 1 - pe));
        assert!(names(pe) || told, "PE {pe} must name the daemon or its loss:\n{all}");
    }
    // Within the abort grace (3 s) plus the launcher's reaction, well under
    // the watchdog's 10 s.
    assert!(after < Duration::from_secs(10), "the PEs took {after:?} to end");
    assert!(!d.socket().exists(), "the dead daemon's socket is left");
    let shm: Vec<_> = std::fs::read_dir("/dev/shm").unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).filter(|n| n.starts_with(&format!("{pid}:"))).collect();
    assert!(shm.is_empty(), "shm regions of the dead daemon: {shm:?}");
    let orphans = processes_with_env(&format!("CPNET_PROXYD_DIR={}", d.dir.display()));
    assert!(orphans.is_empty(), "processes of the job left: {orphans:?}");
}

#[test]
fn attach_and_detach_1000_times_leaks_no_fd_and_no_memory() {
    let _one = serial();
    let d = Daemon::start("cycles", None);
    // The daemon's libfabric shm regions (`<pid>:<n>:<m>`); /dev/shm is
    // shared with every other process of the machine.
    let prefix = format!("{}:", d.pid);
    let shm_count = || {
        std::fs::read_dir("/dev/shm")
            .map(|dir| dir.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&prefix)).count())
            .unwrap_or(0)
    };
    let cycle = |i: u64| {
        let (att, fds, _mem) = attach_msg(1000 + i, 5, 0, 1);
        let (s, reply) = raw(&d, &ToDaemon::Attach(att).encode(), &[fds[0].as_fd(), fds[1].as_fd()]);
        drop(fds);
        let Some(ToPe::Accepted { cards, .. }) = reply else { panic!("cycle {i}: {reply:?}") };
        wire::send(&s, &ToDaemon::Peers(vec![cards]).encode(), &[]).unwrap();
        let next = |s: &UnixStream| {
            let f = wire::recv(s).unwrap().expect("answer");
            ToPe::decode(f.kind, &f.body).unwrap()
        };
        assert!(matches!(next(&s), ToPe::Ready(_)), "cycle {i}");
        wire::send(&s, &ToDaemon::Detach.encode(), &[]).unwrap();
        assert!(matches!(next(&s), ToPe::Detached(e) if e.is_empty()), "cycle {i}");
    };
    // Warm up (libfabric's one-time state), then measure.
    for i in 0..5 {
        cycle(i);
    }
    wait_log(&d, "endpoints closed", 5);
    std::thread::sleep(Duration::from_millis(200));
    let (fd0, shm0) = (d.fds(), shm_count());
    // The resident set after 100, 550 and 1000: a leak grows as much in
    // the second 450 attaches as in the first; the allocator's and
    // libfabric's caches settle.
    let mut rss = [0u64; 3];
    let t = Instant::now();
    for i in 5..1005 {
        cycle(i);
        if i == 104 || i == 554 {
            wait_log(&d, "endpoints closed", i as usize + 1);
            rss[usize::from(i == 554)] = d.rss_kib();
        }
    }
    wait_log(&d, "endpoints closed", 1005);
    std::thread::sleep(Duration::from_millis(200));
    let (fd1, shm1, maps) = (d.fds(), shm_count(), d.memfd_maps());
    rss[2] = d.rss_kib();
    println!(
        "1000 attach/detach cycles in {:.1} s: daemon fds {fd0} -> {fd1}, daemon's /dev/shm regions {shm0} -> {shm1}, memfd mappings left {maps}, resident set {} / {} / {} KiB after 100 / 550 / 1000",
        t.elapsed().as_secs_f64(),
        rss[0],
        rss[1],
        rss[2]
    );
    assert!(fd1 <= fd0, "the daemon's fds: {fd0} before, {fd1} after");
    // A page leaked per attach would be 1.8 MiB over the last 450. Measured
    // on the 2-core VM (the daemon trims malloc's free pages after each
    // job): +96 to +128 KiB there, debug and release builds alike.
    assert!(
        rss[2] <= rss[1] + 1024,
        "the daemon's resident set grew from {} to {} KiB over the last 450 attaches ({} after the first 100)",
        rss[1],
        rss[2],
        rss[0]
    );
    assert!(shm1 <= shm0, "/dev/shm: {shm0} before, {shm1} after");
    assert_eq!(maps, 0, "memfd mappings left in the daemon");
    let _ = std::io::stdout().flush();
}

#[test]
fn a_daemon_with_nothing_attached_lingers_then_exits_and_a_second_one_yields() {
    let _one = serial();
    let dir = PathBuf::from(format!("/tmp/cpnet-test-linger-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    let start = || Command::new(sibling("cpnet-proxyd")).arg("--dir").arg(&dir).args(["--linger", "1"]).stderr(Stdio::piped()).spawn().unwrap();
    let first = start();
    let t0 = Instant::now();
    while !dir.join("proxyd.sock").exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no socket");
        std::thread::sleep(Duration::from_millis(10));
    }
    let second = start().wait_with_output().unwrap();
    assert!(second.status.success(), "{second:?}");
    assert!(String::from_utf8_lossy(&second.stderr).contains("another cpnet-proxyd holds"), "{second:?}");
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stderr).contains("nothing attached for 1.0 s: exiting"), "{out:?}");
    assert!(t0.elapsed() < Duration::from_secs(15));
    assert!(!dir.join("proxyd.sock").exists(), "the socket is removed at exit");
    // A directory others can open is refused.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bad = start().wait_with_output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("others can open it"), "{bad:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
