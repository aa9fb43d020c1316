//! GPU PEs served by their GPU's proxy daemon (`cpnet-proxyd --gpu UUID`,
//! docs/runtime.md "The proxy daemon"): the operation matrix through the
//! daemon on the network path, a daemon killed mid-run, and attach/detach
//! cycles that leak nothing.
//!
//! The daemon's landing agents are kernels of another process, so they need
//! MPS to run beside the PEs' kernels: every test here needs a GPU under MPS
//! (../shared/DEVICE.md), prints a loud SKIPPED line without one and passes,
//! unless `CPNET_REQUIRE_GPU=1` (then a missing GPU or MPS fails).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cpnet_tests::{gpu, procs};
use cpnet_tests::launch::{self, Job};

const SHM: &str = "shm";
const TCP: &str = "tcp;ofi_rxm";

/// Whether an MPS control daemon runs on this machine.
fn mps_running() -> bool {
    !procs::pids_where(|_, dir| procs::read(dir, "comm").trim().starts_with("nvidia-cuda-mps")).is_empty()
}

/// Whether to run: a GPU under MPS; else a loud skip (a failure with
/// `CPNET_REQUIRE_GPU=1`).
fn have_gpu_and_mps(test: &str) -> bool {
    let why = match gpu::gpu_available() {
        Err(why) => why,
        Ok(_) if !mps_running() => "no MPS control daemon runs (nvidia-cuda-mps-control -d, ../shared/DEVICE.md)".to_owned(),
        Ok(_) => return true,
    };
    if std::env::var("CPNET_REQUIRE_GPU").as_deref() == Ok("1") {
        panic!("CPNET_REQUIRE_GPU=1 but {why}");
    }
    eprintln!("SKIPPED {test}: {why} (set CPNET_REQUIRE_GPU=1 to make this a failure)");
    false
}

/// A fresh daemon directory (0700) for one test, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        use std::os::unix::fs::DirBuilderExt;
        let d = PathBuf::from(format!("/tmp/cpnet-gpud-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::DirBuilder::new().mode(0o700).create(&d).expect("daemon dir");
        Dir(d)
    }

    /// The environment of a daemon-served job on the network path.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CPNET_PROXY", "daemon".into()),
            ("CPNET_PROXYD_DIR", self.0.display().to_string()),
            ("CPNET_PROXYD_LINGER", "2".into()),
            ("CPNET_GPU_IPC", "0".into()),
            ("CPNET_GPU_P2P", "0".into()),
            ("CPNET_HEAP_SIZE", "256M".into()),
            // The daemon inherits its starter's RUST_LOG: its attach lines are info.
            ("RUST_LOG", "warn,cpnet::daemon=info,cpnet::gpu::daemon=debug".into()),
        ]
    }

    /// The daemons' logs.
    fn logs(&self) -> String {
        let mut all = String::new();
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if e.path().extension().is_some_and(|x| x == "log") {
                all += &std::fs::read_to_string(e.path()).unwrap_or_default();
            }
        }
        all
    }

    /// Pids of the daemons serving this directory.
    fn daemon_pids(&self) -> Vec<u32> {
        let needle = self.0.display().to_string();
        procs::pids_where(|_, dir| {
            let cmd = procs::read(dir, "cmdline");
            cmd.contains("cpnet-proxyd") && cmd.contains(&needle)
        })
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        for pid in self.daemon_pids() {
            // SAFETY: kill(2) on a daemon of this test's directory.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn check() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_cpnet-gpu-check"))
}

fn run(n: u32, provider: &str, args: &[&str], env: &[(&str, String)], limit: Duration) -> Job {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    launch::run(check(), n, provider, args, &env, limit)
}

/// Every scenario of the GPU operation matrix, through the daemons (one per
/// GPU the PEs use), on the network path, over shm (and ops over tcp): the
/// same checks as in-process, and the daemons' logs show the attaches.
#[test]
fn the_operation_matrix_passes_through_the_gpu_daemon() {
    if !have_gpu_and_mps("the_operation_matrix_passes_through_the_gpu_daemon") {
        return;
    }
    let d = Dir::new("matrix");
    for (provider, args) in [
        (SHM, &["ops"][..]),
        (SHM, &["amo", "--iters", "30"][..]),
        (SHM, &["order", "--rounds", "100", "--msgs", "300"][..]),
        (SHM, &["barrier", "--rounds", "50"][..]),
        (SHM, &["collectives"][..]),
        (TCP, &["ops"][..]),
    ] {
        let j = run(2, provider, args, &d.env(), Duration::from_secs(300));
        assert!(j.status.success(), "{args:?} over {provider} through the daemon failed:\n{}\n--- daemon logs ---\n{}", j.all, d.logs());
    }
    let logs = d.logs();
    assert!(logs.contains("for GPU-") && logs.contains("attached"), "the daemons' logs show no GPU attach:\n{logs}");
}

/// A job of `cpnet-gpu-check args` on `n` PEs with `env`, started now
/// (not waited for); killed with its PEs (SIGTERM to cpnet-run) on drop
/// unless finished.
struct Started {
    child: Option<std::process::Child>,
    t: Instant,
}

impl Started {
    fn new(n: u32, args: &[&str], env: &[(&str, String)]) -> Started {
        let launcher = launch::cpnet_run(check().parent().unwrap(), env!("CARGO"));
        let mut cmd = Command::new(&launcher);
        cmd.args(["-n", &n.to_string(), "--grace", "25", "--"]).arg(check()).args(args);
        cmd.env("CPNET_PROVIDER", SHM).env("CPNET_WAIT_TIMEOUT", "120").env("RUST_LOG", "warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        Started { child: Some(cmd.spawn().expect("start cpnet-run")), t: Instant::now() }
    }

    /// Panics if the job ended already.
    fn running(&mut self, what: &str) {
        let c = self.child.as_mut().unwrap();
        if let Ok(Some(st)) = c.try_wait() {
            let j = launch::finish(self.child.take().unwrap(), self.t, Duration::from_secs(5), what);
            panic!("{what} ended early ({st}):\n{}", j.all);
        }
    }

    fn finish(mut self, limit: Duration, what: &str) -> Job {
        launch::finish(self.child.take().unwrap(), self.t, limit, what)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the launcher this test started; it kills its PEs.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// Pids of this job's PEs (children of cpnet-run running cpnet-gpu-check
/// with `needle` in their environment).
fn pes_with_env(needle: &str) -> Vec<u32> {
    procs::pids_where(|_, dir| {
        let cmd = procs::read(dir, "cmdline");
        cmd.contains("cpnet-gpu-check") && !cmd.contains("cpnet-run") && procs::read(dir, "environ").contains(needle)
    })
}

/// How a job that is not asserted on ended, for the test's output.
fn ending(j: &Job) -> String {
    if j.status.success() { "finished correctly".to_owned() } else { format!("failed ({})", j.status) }
}

/// Waits until the daemons of `d` logged `n` attaches, the job running.
fn wait_attached(d: &Dir, job: &mut Started, n: usize, what: &str) {
    let t = Instant::now();
    while d.logs().matches(") attached: ").count() < n {
        job.running(what);
        assert!(t.elapsed() < Duration::from_secs(120), "{what}: not {n} attaches within 120 s:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    job.running(what);
}

/// A daemon killed mid-run: every attached PE exits non-zero within the
/// watchdog bound, naming the daemon (its socket names the GPU); no socket
/// is left after cpnet-run's clean-up. (A job on the same GPUs with its own
/// in-process proxies runs meanwhile; how it ends is printed.)
#[test]
fn a_killed_gpu_daemon_fails_every_attached_pe() {
    if !have_gpu_and_mps("a_killed_gpu_daemon_fails_every_attached_pe") {
        return;
    }
    let d = Dir::new("kill");
    let mut job = Started::new(2, &["barrier", "--rounds", "100000000"], &d.env());
    let mut bystander_env = d.env();
    bystander_env.retain(|(k, _)| !k.starts_with("CPNET_PROXY"));
    bystander_env.push(("CPNET_PROXY", "inprocess".into()));
    let mut bystander = Started::new(2, &["barrier", "--rounds", "400000"], &bystander_env);
    wait_attached(&d, &mut job, 2, "the daemon's job");
    bystander.running("the bystander job");
    let pids = d.daemon_pids();
    assert!(!pids.is_empty(), "no daemon process found");
    let killed = Instant::now();
    for pid in &pids {
        // SAFETY: kill(2) on the daemons of this test's directory.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    let j = job.finish(Duration::from_secs(120), "the job whose daemon was killed");
    let took = killed.elapsed();
    assert!(!j.status.success(), "the job succeeded without its daemon:\n{}", j.all);
    assert!(j.all.contains("lost the proxy daemon") && j.all.contains("proxyd-GPU-"), "no PE named the daemon and its GPU:\n{}", j.all);
    assert!(took < Duration::from_secs(60), "the PEs took {took:?} to go");
    let socks: Vec<_> =
        std::fs::read_dir(&d.0).into_iter().flatten().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "sock")).collect();
    assert!(socks.is_empty(), "sockets left: {socks:?}");
    // Not asserted: the daemon owned the PEs' heaps, so kernels still
    // touching them may fault when it dies, and under MPS a fault tears down
    // every client of that GPU (docs/runtime.md, "Faults").
    let b = bystander.finish(Duration::from_secs(300), "the bystander job");
    eprintln!("the in-process job on the same GPUs: {}", ending(&b));
}

/// A PE killed mid-run: its job's other PE exits non-zero and the daemon
/// notices (its log) and cleans up the session. Another job on the same
/// daemon runs meanwhile; how it ends is printed, not asserted: under MPS a
/// process killed while its kernel ran was a fatal error for the other
/// clients of that GPU in our runs, also with in-process proxies and no
/// daemon at all (docs/results.md "GPU PEs through the daemon").
#[test]
fn a_killed_pe_fails_its_job() {
    if !have_gpu_and_mps("a_killed_pe_fails_its_job") {
        return;
    }
    let d = Dir::new("pekill");
    let mut env_a = d.env();
    env_a.push(("CPNET_TEST_JOB", "victim".into()));
    let mut a = Started::new(2, &["barrier", "--rounds", "100000000"], &env_a);
    wait_attached(&d, &mut a, 2, "the victim job");
    let mut b = Started::new(2, &["barrier", "--rounds", "400000"], &d.env());
    wait_attached(&d, &mut b, 4, "the other job");
    let victims = pes_with_env("CPNET_TEST_JOB=victim");
    assert_eq!(victims.len(), 2, "the victim job's PEs: {victims:?}");
    let killed = Instant::now();
    // SAFETY: kill(2) on a PE of the victim job this test started.
    unsafe { libc::kill(victims[0] as i32, libc::SIGKILL) };
    let ja = a.finish(Duration::from_secs(120), "the victim job");
    assert!(!ja.status.success(), "the victim job succeeded:\n{}", ja.all);
    assert!(killed.elapsed() < Duration::from_secs(60), "the victim's peer took {:?} to go", killed.elapsed());
    let t = Instant::now();
    while !d.logs().contains("went away without detaching") {
        assert!(t.elapsed() < Duration::from_secs(30), "the daemon did not notice:\n{}", d.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let jb = b.finish(Duration::from_secs(300), "the other job");
    eprintln!("the other job on the same daemon: {}", ending(&jb));
}

/// Attach and detach many times against one persistent daemon of GPU 0:
/// its open fds, memfd mappings and GPU memory come back to what they were
/// after the first job.
#[test]
fn attach_detach_cycles_leak_no_fd_mapping_or_gpu_memory() {
    if !have_gpu_and_mps("attach_detach_cycles_leak_no_fd_mapping_or_gpu_memory") {
        return;
    }
    let cycles: usize = std::env::var("CPNET_TEST_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let d = Dir::new("cycles");
    let out = Command::new("nvidia-smi").args(["--query-gpu=uuid", "--format=csv,noheader", "-i", "0"]).output().expect("nvidia-smi");
    let uuid = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let bin = check().parent().unwrap().join("cpnet-proxyd");
    let log = std::fs::File::create(d.0.join("test-daemon.log")).unwrap();
    let mut daemon = Command::new(bin)
        .args(["--gpu", &uuid, "--persistent", "--dir"])
        .arg(&d.0)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start cpnet-proxyd");
    let mut env = d.env();
    env.push(("CUDA_VISIBLE_DEVICES", "0".into()));
    // The daemon's fds and memfd mappings, and GPU 0's memory in use
    // (device-wide: under MPS nvidia-smi does not attribute memory to the
    // daemon's process; nothing else runs on the GPU during this test).
    let probe = |pid: u32| {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default().lines().filter(|l| l.contains("memfd:cpnet")).count();
        let q = Command::new("nvidia-smi").args(["--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"]).output().unwrap();
        let mib: i64 = String::from_utf8_lossy(&q.stdout).trim().parse().unwrap_or(-1);
        (fds, maps, mib)
    };
    let mut first = None;
    for i in 0..cycles {
        let j = run(2, SHM, &["barrier", "--rounds", "2"], &env, Duration::from_secs(120));
        assert!(j.status.success(), "cycle {i} failed:\n{}\n{}", j.all, d.logs());
        std::thread::sleep(Duration::from_millis(300));
        let now = probe(daemon.id());
        eprintln!("cycle {i}: daemon fds {}, memfd maps {}, GPU 0 memory used {} MiB", now.0, now.1, now.2);
        match first {
            None => first = Some(now),
            Some(f) => {
                assert_eq!((now.0, now.1), (f.0, f.1), "cycle {i}: the daemon's fds or memfd mappings grew");
                // A PE's heap is 260 MiB: a leaked one would show.
                assert!(now.2 <= f.2 + 64, "cycle {i}: GPU 0 memory {} MiB after {} MiB at the first cycle", now.2, f.2);
            }
        }
    }
    let _ = daemon.kill();
    let _ = daemon.wait();
}
