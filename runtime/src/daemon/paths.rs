//! Where the daemon lives and how one is found or started: the per-user
//! directory (mode 0700), its socket, election lock and log
//! ([`DaemonPaths`]), and [`ensure_running`], which a PE or `cpnet-run` calls
//! to reach the host's daemon, starting one if none answers.
//!
//! The election is the lock: a daemon holds an exclusive `flock` on
//! `proxyd.lock` for its whole life and only then binds `proxyd.sock`
//! (removing a socket file a dead daemon left). Several processes that find
//! no daemon may each start one; exactly one gets the lock, the others exit
//! at once ("another daemon holds the lock"), and everyone connects to the
//! winner. So a socket file with no daemon behind it is stale exactly when
//! the lock is free, whatever the pid it was.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

/// The daemon's files in one directory (`CPNET_PROXYD_DIR`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonPaths {
    /// The directory, mode 0700, owned by this user.
    pub dir: PathBuf,
    /// `proxyd.sock`: the Unix socket PEs attach on.
    pub socket: PathBuf,
    /// `proxyd.lock`: held (flock) by the running daemon.
    pub lock: PathBuf,
    /// `proxyd.log`: the log of daemons started by PEs or cpnet-run.
    pub log: PathBuf,
    /// The GPU a per-GPU daemon serves (its UUID, `GPU-…`); `None` for the
    /// host's daemon of CPU PEs.
    pub gpu: Option<String>,
}

impl DaemonPaths {
    /// The files of the daemon in `dir`.
    pub fn in_dir(dir: &Path) -> DaemonPaths {
        DaemonPaths {
            dir: dir.to_owned(),
            socket: dir.join("proxyd.sock"),
            lock: dir.join("proxyd.lock"),
            log: dir.join("proxyd.log"),
            gpu: None,
        }
    }

    /// The files of the daemon of GPU `uuid` (`GPU-…`, as nvidia-smi prints
    /// it) in `dir`: `proxyd-<uuid>.sock`, `.lock` and `.log`. One daemon per
    /// GPU: named by UUID, so that PEs with different `CUDA_VISIBLE_DEVICES`
    /// find the same one.
    pub fn for_gpu(dir: &Path, uuid: &str) -> DaemonPaths {
        DaemonPaths {
            dir: dir.to_owned(),
            socket: dir.join(format!("proxyd-{uuid}.sock")),
            lock: dir.join(format!("proxyd-{uuid}.lock")),
            log: dir.join(format!("proxyd-{uuid}.log")),
            gpu: Some(uuid.to_owned()),
        }
    }

    /// Every daemon's files in `dir`: the CPU PEs' and one per GPU whose
    /// lock file is there.
    pub fn all_in_dir(dir: &Path) -> Vec<DaemonPaths> {
        let mut all = vec![DaemonPaths::in_dir(dir)];
        if let Ok(rd) = fs::read_dir(dir) {
            for e in rd.flatten() {
                let name = e.file_name();
                let name = name.to_string_lossy();
                if let Some(uuid) = name.strip_prefix("proxyd-").and_then(|n| n.strip_suffix(".lock")) {
                    all.push(DaemonPaths::for_gpu(dir, uuid));
                }
            }
        }
        all
    }

    /// Creates the directory (mode 0700) if missing, and checks that this
    /// user owns it and nobody else can open it.
    ///
    /// # Errors
    /// What is wrong, naming the directory: owner, mode, or the failing call.
    pub fn ensure_dir(&self) -> Result<(), String> {
        let d = &self.dir;
        match fs::DirBuilder::new().mode(0o700).recursive(false).create(d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // A missing parent ($XDG_RUNTIME_DIR itself): create the
                // chain, the last component 0700.
                fs::DirBuilder::new()
                    .mode(0o700)
                    .recursive(true)
                    .create(d)
                    .map_err(|e| format!("cannot create the daemon directory {}: {e}", d.display()))?;
            }
            Err(e) => return Err(format!("cannot create the daemon directory {}: {e}", d.display())),
        }
        let md = fs::symlink_metadata(d).map_err(|e| format!("cannot stat the daemon directory {}: {e}", d.display()))?;
        let uid = rustix::process::geteuid().as_raw();
        if !md.is_dir() {
            return Err(format!("the daemon directory {} is not a directory (a symlink?)", d.display()));
        }
        if md.uid() != uid {
            return Err(format!(
                "the daemon directory {} belongs to uid {}, not to this user (uid {uid}); set CPNET_PROXYD_DIR",
                d.display(),
                md.uid()
            ));
        }
        if md.mode() & 0o077 != 0 {
            return Err(format!(
                "the daemon directory {} has mode {:o}: others can open it (want 0700; chmod 700 it)",
                d.display(),
                md.mode() & 0o777
            ));
        }
        Ok(())
    }

    /// Opens the lock file (creating it, mode 0600) and tries to take its
    /// exclusive lock without waiting: `Ok(Some(file))` holds the lock for
    /// as long as `file` is open, `Ok(None)`: a daemon holds it.
    ///
    /// # Errors
    /// The failing open or flock.
    pub fn try_lock(&self) -> io::Result<Option<fs::File>> {
        let f = OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&self.lock)?;
        match rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(f)),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether a daemon is alive here (holds the lock).
    pub fn daemon_alive(&self) -> bool {
        self.dir.is_dir() && matches!(self.try_lock(), Ok(None))
    }

    /// Removes what dead daemons in `dir` left: the socket of every daemon
    /// there (the CPU PEs' one and each GPU's) whose lock no daemon holds,
    /// then, if there was one, the libfabric shm regions of dead processes
    /// (one pass for all). Returns how many sockets it removed. cpnet-run
    /// calls it after a job.
    pub fn clean_up_dead_daemons(dir: &Path) -> usize {
        let mut removed = 0;
        for p in DaemonPaths::all_in_dir(dir) {
            if !p.socket.exists() {
                continue;
            }
            // Held while removing: no daemon can start and bind meanwhile.
            if let Ok(Some(_lock)) = p.try_lock() {
                let _ = fs::remove_file(&p.socket);
                removed += 1;
            }
        }
        if removed > 0 {
            crate::proxy_threads::clean_stale_shm_regions();
        }
        removed
    }
}

/// Connects to the daemon of `paths`, starting `bin` (`cpnet-proxyd`) if
/// none answers, and retrying until `timeout`. The daemon started here runs
/// in its own process group, its output appended to `proxyd.log`; a thread of
/// this process reaps it when it exits.
///
/// # Errors
/// The directory is unsafe ([`DaemonPaths::ensure_dir`]), the binary cannot
/// be started, or no daemon answered within `timeout` (the message points
/// at the log).
pub fn ensure_running(paths: &DaemonPaths, bin: Option<&Path>, linger: Duration, timeout: Duration) -> Result<UnixStream, String> {
    paths.ensure_dir()?;
    if let Ok(s) = UnixStream::connect(&paths.socket) {
        return Ok(s);
    }
    let deadline = Instant::now() + timeout;
    if !paths.daemon_alive() {
        start(paths, bin, linger)?;
    }
    let mut wait = Duration::from_millis(2);
    loop {
        match UnixStream::connect(&paths.socket) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(format!(
                    "no cpnet-proxyd answered on {} within {:.1} s ({e}); see {}",
                    paths.socket.display(),
                    timeout.as_secs_f64(),
                    paths.log.display()
                ));
            }
            Err(_) => {
                std::thread::sleep(wait);
                wait = (wait * 2).min(Duration::from_millis(50));
            }
        }
    }
}

/// The daemon binary: `bin`, else `cpnet-proxyd` next to this program, else
/// on `PATH`.
fn daemon_binary(bin: Option<&Path>) -> PathBuf {
    if let Some(b) = bin {
        return b.to_owned();
    }
    let beside = std::env::current_exe().ok().and_then(|p| {
        // Test binaries live in target/<profile>/deps; the daemon one level up.
        let dir = p.parent()?;
        [dir.join("cpnet-proxyd"), dir.parent()?.join("cpnet-proxyd")].into_iter().find(|c| c.is_file())
    });
    beside.unwrap_or_else(|| PathBuf::from("cpnet-proxyd"))
}

fn start(paths: &DaemonPaths, bin: Option<&Path>, linger: Duration) -> Result<(), String> {
    let bin = daemon_binary(bin);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&paths.log)
        .map_err(|e| format!("cannot open the daemon log {}: {e}", paths.log.display()))?;
    let log2 = log.try_clone().map_err(|e| format!("cannot open the daemon log {}: {e}", paths.log.display()))?;
    let mut cmd = Command::new(&bin);
    if let Some(uuid) = &paths.gpu {
        cmd.arg("--gpu").arg(uuid);
    }
    cmd.arg("--dir")
        .arg(&paths.dir)
        .arg("--linger")
        .arg(format!("{}", linger.as_secs_f64()))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        // Its own process group: cpnet-run's signals to a PE's group (and
        // the terminal's) do not reach it; it outlives its starter.
        .process_group(0);
    use std::os::unix::process::CommandExt;
    let mut child = cmd.spawn().map_err(|e| format!("cannot start the proxy daemon {}: {e}", bin.display()))?;
    tracing::debug!(pid = child.id(), bin = %bin.display(), "started cpnet-proxyd");
    let _ = std::thread::Builder::new().name("cpnet-proxyd-reaper".into()).spawn(move || child.wait());
    // The directory's mode stays checked by the daemon itself.
    let _ = fs::set_permissions(&paths.log, fs::Permissions::from_mode(0o600));
    Ok(())
}
