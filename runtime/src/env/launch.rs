//! Who this process is in its job: the PMI-style launch environment
//! ([`Launch`], [`Launcher`]): `CPNET_PE`... from cpnet-run, `RANK`... from
//! torchrun, `OMPI_COMM_WORLD_*` from Open MPI, `PMI_*` from MPICH/Hydra and
//! Intel MPI, `SLURM_*` from srun, and `CPNET_BOOTSTRAP_ADDR`. The variables are documented in the
//! [module docs](super).

use std::fmt;

use super::*;

/// Who started this process, i.e. where [`Launch`] found its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// Nobody: a single PE (no launch variable set).
    Single,
    /// `cpnet-run` (`CPNET_PE` ...); it runs the rendezvous server itself.
    CpnetRun,
    /// PyTorch's `torchrun` (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`, `GROUP_RANK`).
    Torchrun,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    Mpi,
    /// A PMI launcher, e.g. MPICH's or Intel MPI's `mpiexec` (`PMI_*`).
    Pmi,
    /// Slurm's `srun` (`SLURM_*`).
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Single => "no launcher (single PE)",
            Launcher::CpnetRun => "cpnet-run",
            Launcher::Torchrun => "torchrun",
            Launcher::Mpi => "mpirun (Open MPI)",
            Launcher::Pmi => "a PMI launcher (mpiexec)",
            Launcher::Slurm => "srun (Slurm)",
        })
    }
}

/// This process's place in the job, from the launcher's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// This PE's number, `0..n_pes`.
    pub pe: i32,
    /// Number of PEs in the job, >= 1.
    pub n_pes: i32,
    /// Rank among the PEs on this host, `0..local_size`.
    pub local_pe: i32,
    /// Number of PEs on this host, `1..=n_pes`.
    pub local_size: i32,
    /// `host:port` of the rendezvous (`CPNET_BOOTSTRAP_ADDR`); always `Some`
    /// when `n_pes > 1`. Kept as text: a host name is resolved when
    /// connecting, not when the environment is read.
    pub bootstrap: Option<String>,
    /// Where the numbers came from.
    pub launcher: Launcher,
}

impl Launch {
    /// A single PE: PE 0 of 1, no rendezvous.
    pub fn single() -> Launch {
        Launch {
            pe: 0,
            n_pes: 1,
            local_pe: 0,
            local_size: 1,
            bootstrap: None,
            launcher: Launcher::Single,
        }
    }

    /// Reads the launch variables of the process environment (see the
    /// module docs of `cpnet::env`).
    pub fn from_env() -> Result<Launch, EnvError> {
        Launch::from_lookup(process_env)
    }

    /// Reads the launch variables through `lookup` (name → value; `None` when
    /// unset). Pure: this is what [`Launch::from_env`] calls.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Launch, EnvError> {
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let (launcher, pe, n_pes, local_pe, local_size);
        if let Some(v) = get(PE) {
            launcher = Launcher::CpnetRun;
            let n = required(&get, N_PES, PE, Launcher::CpnetRun)?;
            n_pes = parse_count(N_PES, &n)?;
            pe = parse_rank(PE, &v, n_pes, N_PES)?;
            (local_pe, local_size) = local_pair(&get, (LOCAL_PE, LOCAL_SIZE), pe, n_pes, launcher)?;
        } else if let (Some(v), Some(_)) = (get(TORCH_RANK), get(TORCH_GROUP_RANK)) {
            // Before Open MPI, PMI and Slurm: `srun torchrun` and `mpirun
            // torchrun` set those for the launcher's task, which every worker
            // of the node inherits.
            launcher = Launcher::Torchrun;
            let n = required(&get, TORCH_WORLD_SIZE, TORCH_RANK, launcher)?;
            n_pes = parse_count(TORCH_WORLD_SIZE, &n)?;
            pe = parse_rank(TORCH_RANK, &v, n_pes, TORCH_WORLD_SIZE)?;
            (local_pe, local_size) = local_pair(&get, (TORCH_LOCAL_RANK, TORCH_LOCAL_WORLD_SIZE), pe, n_pes, launcher)?;
        } else if let Some(v) = get(OMPI_RANK) {
            launcher = Launcher::Mpi;
            let n = required(&get, OMPI_SIZE, OMPI_RANK, launcher)?;
            n_pes = parse_count(OMPI_SIZE, &n)?;
            pe = parse_rank(OMPI_RANK, &v, n_pes, OMPI_SIZE)?;
            (local_pe, local_size) = local_pair(
                &get,
                (OMPI_LOCAL_RANK, OMPI_LOCAL_SIZE),
                pe,
                n_pes,
                launcher,
            )?;
        } else if let Some(v) = get(PMI_RANK) {
            launcher = Launcher::Pmi;
            let n = required(&get, PMI_SIZE, PMI_RANK, launcher)?;
            n_pes = parse_count(PMI_SIZE, &n)?;
            pe = parse_rank(PMI_RANK, &v, n_pes, PMI_SIZE)?;
            (local_pe, local_size) = local_pair(
                &get,
                (MPI_LOCALRANKID, MPI_LOCALNRANKS),
                pe,
                n_pes,
                launcher,
            )?;
        } else if let Some(v) = get(SLURM_PROCID) {
            launcher = Launcher::Slurm;
            let n = required(&get, SLURM_NTASKS, SLURM_PROCID, launcher)?;
            n_pes = parse_count(SLURM_NTASKS, &n)?;
            pe = parse_rank(SLURM_PROCID, &v, n_pes, SLURM_NTASKS)?;
            // SLURM_NTASKS_PER_NODE is "4" when uniform, "2(x3),1" when not;
            // only the plain form tells us this node's count.
            let per_node = get(SLURM_NTASKS_PER_NODE)
                .and_then(|s| s.trim().parse::<i32>().ok())
                .filter(|&k| (1..=n_pes).contains(&k));
            match (get(SLURM_LOCALID), per_node) {
                (Some(l), Some(k)) => {
                    local_size = k;
                    local_pe = parse_rank(SLURM_LOCALID, &l, k, SLURM_NTASKS_PER_NODE)?;
                }
                (Some(l), None) => {
                    local_size = n_pes;
                    local_pe = parse_rank(SLURM_LOCALID, &l, n_pes, SLURM_NTASKS)?;
                }
                (None, _) => {
                    local_size = n_pes;
                    local_pe = pe;
                }
            }
        } else {
            let mut single = Launch::single();
            single.bootstrap = get(BOOTSTRAP_ADDR).map(|s| s.trim().to_owned());
            if let Some(addr) = &single.bootstrap {
                check_host_port(addr)?;
            }
            return Ok(single);
        }

        let bootstrap = match get(BOOTSTRAP_ADDR) {
            Some(addr) => {
                let addr = addr.trim().to_owned();
                check_host_port(&addr)?;
                Some(addr)
            }
            None if n_pes > 1 && launcher == Launcher::Torchrun => Some(torchrun_rendezvous(&get)?),
            None if n_pes > 1 => {
                let why = if launcher == Launcher::CpnetRun {
                    format!(
                        "this job has {n_pes} PEs ({PE} is set); cpnet-run sets it, so this \
                         process was probably not started by cpnet-run: start it with \
                         `cpnet-run -n {n_pes} ...`, or set {BOOTSTRAP_ADDR}=host:port"
                    )
                } else {
                    format!(
                        "this job has {n_pes} PEs (started by {launcher}); set it to a \
                         host:port that PE 0's host can bind and every PE can reach, e.g. \
                         {BOOTSTRAP_ADDR}=$(hostname):29500 exported to all ranks (PE 0 runs \
                         the rendezvous there)"
                    )
                };
                return Err(EnvError::Missing {
                    var: BOOTSTRAP_ADDR,
                    why,
                });
            }
            None => None,
        };

        Ok(Launch {
            pe,
            n_pes,
            local_pe,
            local_size,
            bootstrap,
            launcher,
        })
    }
}

/// torchrun's default rendezvous: `MASTER_ADDR:MASTER_PORT+1`. torchrun
/// sets both for every worker, naming rank 0's host and the port its store
/// holds (the elastic agent's, or rank 0's own under `init_process_group`),
/// so rank 0 (PE 0) serves cpnet's rendezvous on the next port.
fn torchrun_rendezvous(get: &impl Fn(&str) -> Option<String>) -> Result<String, EnvError> {
    let missing = |var: &'static str| EnvError::Missing {
        var,
        why: format!(
            "this job was started by torchrun and {BOOTSTRAP_ADDR} is not set: cpnet's rendezvous goes to \
             MASTER_ADDR:MASTER_PORT+1 (set {BOOTSTRAP_ADDR}=host:port to choose another)"
        ),
    };
    let host = get(TORCH_MASTER_ADDR).ok_or_else(|| missing(TORCH_MASTER_ADDR))?;
    let port = get(TORCH_MASTER_PORT).ok_or_else(|| missing(TORCH_MASTER_PORT))?;
    let next = port
        .trim()
        .parse::<u16>()
        .ok()
        .and_then(|p| p.checked_add(1))
        .ok_or_else(|| invalid(TORCH_MASTER_PORT, &port, "a TCP port below 65535 (cpnet's rendezvous takes the next one)"))?;
    let host = host.trim();
    // An IPv6 literal needs its brackets in host:port.
    let addr = if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{next}") } else { format!("{host}:{next}") };
    check_host_port(&addr)?;
    Ok(addr)
}

/// `var` must be set because `because` is (both belong to `launcher`).
pub(super) fn required(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
    because: &'static str,
    launcher: Launcher,
) -> Result<String, EnvError> {
    get(var).ok_or_else(|| EnvError::Missing {
        var,
        why: format!("{because} is set (looks like {launcher}); both are needed"),
    })
}

/// A job size: an integer >= 1.
pub(super) fn parse_count(var: &'static str, v: &str) -> Result<i32, EnvError> {
    v.trim()
        .parse::<i32>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| invalid(var, v, "an integer >= 1"))
}

/// A rank: an integer in `0..n`, where `n` came from `n_var`.
pub(super) fn parse_rank(var: &'static str, v: &str, n: i32, n_var: &'static str) -> Result<i32, EnvError> {
    v.trim()
        .parse::<i32>()
        .ok()
        .filter(|r| (0..n).contains(r))
        .ok_or_else(|| invalid(var, v, &format!("an integer in 0..{n} ({n_var}={n})")))
}

/// The local rank and size from the pair `(rank_var, size_var)`; when the
/// launcher does not set them, every PE is taken to be on this host.
pub(super) fn local_pair(
    get: &impl Fn(&str) -> Option<String>,
    (rank_var, size_var): (&'static str, &'static str),
    pe: i32,
    n_pes: i32,
    launcher: Launcher,
) -> Result<(i32, i32), EnvError> {
    match (get(rank_var), get(size_var)) {
        (None, None) => Ok((pe, n_pes)),
        (Some(r), Some(s)) => {
            let size = s
                .trim()
                .parse::<i32>()
                .ok()
                .filter(|k| (1..=n_pes).contains(k))
                .ok_or_else(|| {
                    invalid(
                        size_var,
                        &s,
                        &format!("an integer in 1..={n_pes} (the job size)"),
                    )
                })?;
            let rank = parse_rank(rank_var, &r, size, size_var)?;
            Ok((rank, size))
        }
        (Some(_), None) => Err(EnvError::Missing {
            var: size_var,
            why: format!("{rank_var} is set (looks like {launcher}); both are needed"),
        }),
        (None, Some(_)) => Err(EnvError::Missing {
            var: rank_var,
            why: format!("{size_var} is set (looks like {launcher}); both are needed"),
        }),
    }
}

/// Checks that `addr` has the form `host:port` (or `[v6]:port`) with a
/// numeric port; the host is resolved later, when connecting.
pub(super) fn check_host_port(addr: &str) -> Result<(), EnvError> {
    let ok = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if ok {
        Ok(())
    } else {
        Err(invalid(
            BOOTSTRAP_ADDR,
            addr,
            "host:port, e.g. 10.0.0.1:29500, node01:29500 or [::1]:29500",
        ))
    }
}
