//! The variables' parsing, through lookup closures (no process environment).

use super::*;
use std::collections::HashMap;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn bytes_plain_and_suffixes() {
    assert_eq!(parse_bytes("0"), Some(0));
    assert_eq!(parse_bytes("4096"), Some(4096));
    assert_eq!(parse_bytes(" 4096 "), Some(4096));
    assert_eq!(parse_bytes("1K"), Some(1024));
    assert_eq!(parse_bytes("1k"), Some(1024));
    assert_eq!(parse_bytes("3KiB"), Some(3 * 1024));
    assert_eq!(parse_bytes("64M"), Some(64 << 20));
    assert_eq!(parse_bytes("64 MiB"), Some(64 << 20));
    assert_eq!(parse_bytes("2G"), Some(2 << 30));
    assert_eq!(parse_bytes("2gib"), Some(2 << 30));
}

#[test]
fn bytes_rejects_garbage_and_overflow() {
    for bad in [
        "", " ", "M", "-1", "+1", "1.5G", "1T", "1KB", "1 K B", "12x", "0x10", "1e6",
    ] {
        assert_eq!(parse_bytes(bad), None, "{bad:?}");
    }
    assert_eq!(parse_bytes("18446744073709551615"), Some(u64::MAX));
    assert_eq!(parse_bytes("18446744073709551616"), None);
    assert_eq!(parse_bytes("17179869184G"), None); // 2^34 GiB = 2^64
}

#[test]
fn seconds() {
    assert_eq!(parse_seconds("5"), Some(Duration::from_secs(5)));
    assert_eq!(parse_seconds("0.25"), Some(Duration::from_millis(250)));
    assert_eq!(parse_seconds("0"), Some(Duration::ZERO));
    for bad in ["-1", "nan", "inf", "1e400", "5s", ""] {
        assert_eq!(parse_seconds(bad), None, "{bad:?}");
    }
}

#[test]
fn launch_single_when_nothing_set() {
    assert_eq!(Launch::from_lookup(env(&[])).unwrap(), Launch::single());
}

#[test]
fn launch_cpnet_run() {
    let l = Launch::from_lookup(env(&[
        (PE, "2"),
        (N_PES, "4"),
        (LOCAL_PE, "2"),
        (LOCAL_SIZE, "4"),
        (BOOTSTRAP_ADDR, "127.0.0.1:4000"),
    ]))
    .unwrap();
    assert_eq!(
        l,
        Launch {
            pe: 2,
            n_pes: 4,
            local_pe: 2,
            local_size: 4,
            bootstrap: Some("127.0.0.1:4000".into()),
            launcher: Launcher::CpnetRun,
        }
    );
}

#[test]
fn launch_cpnet_wins_over_mpi() {
    let l = Launch::from_lookup(env(&[
        (PE, "1"),
        (N_PES, "2"),
        (OMPI_RANK, "0"),
        (OMPI_SIZE, "8"),
        (BOOTSTRAP_ADDR, "h:1"),
    ]))
    .unwrap();
    assert_eq!((l.pe, l.n_pes, l.launcher), (1, 2, Launcher::CpnetRun));
    assert_eq!((l.local_pe, l.local_size), (1, 2));
}

#[test]
fn launch_open_mpi() {
    let l = Launch::from_lookup(env(&[
        (OMPI_RANK, "5"),
        (OMPI_SIZE, "8"),
        (OMPI_LOCAL_RANK, "1"),
        (OMPI_LOCAL_SIZE, "4"),
        (BOOTSTRAP_ADDR, "node01:29500"),
    ]))
    .unwrap();
    assert_eq!(
        (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher),
        (5, 8, 1, 4, Launcher::Mpi)
    );
}

#[test]
fn launch_pmi_with_and_without_local() {
    let l = Launch::from_lookup(env(&[
        (PMI_RANK, "3"),
        (PMI_SIZE, "4"),
        (BOOTSTRAP_ADDR, "[::1]:29500"),
    ]))
    .unwrap();
    assert_eq!(
        (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher),
        (3, 4, 3, 4, Launcher::Pmi)
    );
    let l = Launch::from_lookup(env(&[
        (PMI_RANK, "3"),
        (PMI_SIZE, "4"),
        (MPI_LOCALRANKID, "1"),
        (MPI_LOCALNRANKS, "2"),
        (BOOTSTRAP_ADDR, "h:1"),
    ]))
    .unwrap();
    assert_eq!((l.local_pe, l.local_size), (1, 2));
}

#[test]
fn launch_slurm_plain_and_nonuniform_per_node() {
    let base = [
        (SLURM_PROCID, "6"),
        (SLURM_NTASKS, "8"),
        (SLURM_LOCALID, "2"),
        (BOOTSTRAP_ADDR, "h:1"),
    ];
    let mut plain = base.to_vec();
    plain.push((SLURM_NTASKS_PER_NODE, "4"));
    let l = Launch::from_lookup(env(&plain)).unwrap();
    assert_eq!(
        (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher),
        (6, 8, 2, 4, Launcher::Slurm)
    );
    let mut odd = base.to_vec();
    odd.push((SLURM_NTASKS_PER_NODE, "2(x3),2"));
    let l = Launch::from_lookup(env(&odd)).unwrap();
    assert_eq!((l.local_pe, l.local_size), (2, 8));
}

#[test]
fn launch_errors_name_the_variable() {
    let e = Launch::from_lookup(env(&[(PE, "4"), (N_PES, "4"), (BOOTSTRAP_ADDR, "h:1")]))
        .unwrap_err();
    assert!(
        matches!(&e, EnvError::Invalid { var, .. } if *var == PE),
        "{e}"
    );
    assert!(e.to_string().contains("0..4"), "{e}");

    let e = Launch::from_lookup(env(&[(PE, "0")])).unwrap_err();
    assert!(
        matches!(&e, EnvError::Missing { var, .. } if *var == N_PES),
        "{e}"
    );

    let e = Launch::from_lookup(env(&[(N_PES, "two"), (PE, "0")])).unwrap_err();
    assert!(
        matches!(&e, EnvError::Invalid { var, .. } if *var == N_PES),
        "{e}"
    );

    let e = Launch::from_lookup(env(&[(OMPI_RANK, "0"), (OMPI_SIZE, "2")])).unwrap_err();
    assert!(
        matches!(&e, EnvError::Missing { var, .. } if *var == BOOTSTRAP_ADDR),
        "{e}"
    );
    assert!(e.to_string().contains("PE 0"), "{e}");

    let e = Launch::from_lookup(env(&[
        (OMPI_RANK, "0"),
        (OMPI_SIZE, "2"),
        (BOOTSTRAP_ADDR, "no-port"),
    ]))
    .unwrap_err();
    assert!(
        matches!(&e, EnvError::Invalid { var, .. } if *var == BOOTSTRAP_ADDR),
        "{e}"
    );

    let e = Launch::from_lookup(env(&[
        (PE, "1"),
        (N_PES, "2"),
        (LOCAL_PE, "1"),
        (BOOTSTRAP_ADDR, "h:1"),
    ]))
    .unwrap_err();
    assert!(
        matches!(&e, EnvError::Missing { var, .. } if *var == LOCAL_SIZE),
        "{e}"
    );

    let e = Launch::from_lookup(env(&[
        (PE, "1"),
        (N_PES, "2"),
        (LOCAL_PE, "1"),
        (LOCAL_SIZE, "3"),
        (BOOTSTRAP_ADDR, "h:1"),
    ]))
    .unwrap_err();
    assert!(
        matches!(&e, EnvError::Invalid { var, .. } if *var == LOCAL_SIZE),
        "{e}"
    );
}

#[test]
fn launch_one_pe_needs_no_addr_and_empty_is_unset() {
    let l =
        Launch::from_lookup(env(&[(PE, "0"), (N_PES, "1"), (BOOTSTRAP_ADDR, " ")])).unwrap();
    assert_eq!((l.pe, l.n_pes, l.bootstrap), (0, 1, None));
    let l = Launch::from_lookup(env(&[(PE, ""), (OMPI_RANK, "")])).unwrap();
    assert_eq!(l, Launch::single());
}

#[test]
fn tuning_defaults() {
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!(t, Tuning::default());
    assert_eq!(t.heap_size, 64 << 20);
    assert_eq!(t.proxy_threads, 1);
    assert_eq!(t.queues, 64);
    assert_eq!(t.queue_depth, 64);
    assert_eq!(t.wait_timeout, Some(Duration::from_secs(60)));
    assert_eq!(t.abort_grace, Duration::from_secs(5));
    assert_eq!(t.connect_timeout, Duration::from_secs(60));
    assert_eq!(t.reach_timeout, Some(Duration::from_secs(30)));
    assert_eq!((t.provider, t.fabric_node), (None, None));
}

#[test]
fn tuning_all_set() {
    let t = Tuning::from_lookup(env(&[
        (PROVIDER, "tcp;ofi_rxm"),
        (FABRIC_NODE, "10.0.0.7"),
        (HEAP_SIZE, "1G"),
        (PROXY_THREADS, "4"),
        (QUEUES, "128"),
        (QUEUE_DEPTH, "1024"),
        (WAIT_TIMEOUT, "2.5"),
        (ABORT_GRACE, "0"),
        (CONNECT_TIMEOUT, "0.5"),
        (PROXY_STALL_TIMEOUT, "1.5"),
        (COLLECTIVE_TIMEOUT, "30"),
        (INJECT_PROXY_STALL, "2:100:1"),
        (REACH_TIMEOUT, "3"),
    ]))
    .unwrap();
    assert_eq!(t.reach_timeout, Some(Duration::from_secs(3)));
    assert_eq!(t.proxy_stall_timeout, Some(Duration::from_millis(1500)));
    assert_eq!(t.collective_timeout, Some(Duration::from_secs(30)));
    assert_eq!(t.inject_proxy_stall, Some((2, 100, Some(1))));
    assert_eq!(t.provider.as_deref(), Some("tcp;ofi_rxm"));
    assert_eq!(t.fabric_node.as_deref(), Some("10.0.0.7"));
    assert_eq!(t.heap_size, 1 << 30);
    assert_eq!(t.proxy_threads, 4);
    assert_eq!(t.queues, 128);
    assert_eq!(t.queue_depth, 1024);
    assert_eq!(t.wait_timeout, Some(Duration::from_millis(2500)));
    assert_eq!(t.abort_grace, Duration::ZERO);
    assert_eq!(t.connect_timeout, Duration::from_millis(500));
}

#[test]
fn tuning_wait_forever() {
    for v in ["0", "none", "NONE", "0.0"] {
        let t = Tuning::from_lookup(env(&[(WAIT_TIMEOUT, v)])).unwrap();
        assert_eq!(t.wait_timeout, None, "{v}");
        let t = Tuning::from_lookup(env(&[(PROXY_STALL_TIMEOUT, v)])).unwrap();
        assert_eq!(t.proxy_stall_timeout, None, "watchdog off: {v}");
        let t = Tuning::from_lookup(env(&[(COLLECTIVE_TIMEOUT, v)])).unwrap();
        assert_eq!(t.collective_timeout, None, "collectives wait forever: {v}");
    }
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!(t.collective_timeout, Some(DEFAULT_COLLECTIVE_TIMEOUT));
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!(t.proxy_stall_timeout, Some(DEFAULT_PROXY_STALL_TIMEOUT));
    assert_eq!(t.inject_proxy_stall, None);
}

#[test]
fn tuning_rejects_out_of_range() {
    for (var, bad) in [
        (HEAP_SIZE, "0"),
        (HEAP_SIZE, "64X"),
        (PROXY_THREADS, "0"),
        (PROXY_THREADS, "65"),
        (QUEUES, "0"),
        (QUEUES, "-3"),
        (QUEUE_DEPTH, "1"),
        (QUEUE_DEPTH, "48"),
        (QUEUE_DEPTH, "131072"),
        (WAIT_TIMEOUT, "-1"),
        (WAIT_TIMEOUT, "forever"),
        (ABORT_GRACE, "soon"),
        (CONNECT_TIMEOUT, "0"),
        (PROXY_STALL_TIMEOUT, "later"),
        (COLLECTIVE_TIMEOUT, "-2"),
        (INJECT_PROXY_STALL, "1"),
        (INJECT_PROXY_STALL, "0:0"),
        (INJECT_PROXY_STALL, "a:3"),
        (INJECT_PROXY_STALL, "0:3:x"),
    ] {
        let e = Tuning::from_lookup(env(&[(var, bad)])).unwrap_err();
        match &e {
            EnvError::Invalid { var: v, value, .. } => {
                assert_eq!((*v, value.as_str()), (var, bad));
            }
            other => panic!("{var}={bad}: {other}"),
        }
        let msg = e.to_string();
        assert!(msg.contains(var) && msg.contains(bad), "{msg}");
    }
}

#[test]
fn queue_depth_edges() {
    for ok in ["2", "65536"] {
        assert!(
            Tuning::from_lookup(env(&[(QUEUE_DEPTH, ok)])).is_ok(),
            "{ok}"
        );
    }
}

#[test]
fn gpu_pes_default_to_more_proxy_threads_unless_told() {
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!((t.proxy_threads, t.gpu_proxy_threads), (DEFAULT_PROXY_THREADS, DEFAULT_GPU_PROXY_THREADS));
    let t = Tuning::from_lookup(env(&[(PROXY_THREADS, "2")])).unwrap();
    assert_eq!((t.proxy_threads, t.gpu_proxy_threads), (2, 2), "an explicit count applies to both");
    assert_eq!(Tuning::from_lookup(env(&[])).unwrap().gpu_service_threads(), DEFAULT_GPU_PROXY_THREADS);
    assert_eq!(Tuning::from_lookup(env(&[(QUEUES, "2")])).unwrap().gpu_service_threads(), 2, "at most one per queue");
    let t = Tuning::from_lookup(env(&[(GPU_IPC, "0"), (STAGE_CHUNK, "64K"), (STAGE_CREDITS, "4")])).unwrap();
    assert_eq!((t.gpu_ipc, t.stage_chunk, t.stage_credits), (false, 65536, 4));
    let t = Tuning::from_lookup(env(&[(AGENT_BYTES, "4K"), (AGENT_IDLE, "500")])).unwrap();
    assert_eq!((t.agent_bytes, t.agent_idle), (4096, Duration::from_micros(500)));
    assert!(Tuning::from_lookup(env(&[(STAGE_CHUNK, "64K"), (AGENT_BYTES, "128K")])).is_err(), "agent bytes above the chunk");
    assert!(Tuning::from_lookup(env(&[(AGENT_IDLE, "0")])).is_err());
    assert_eq!(Tuning::from_lookup(env(&[(AGENT_LANES, "8")])).unwrap().agent_lanes, 8);
    assert!(Tuning::from_lookup(env(&[(AGENT_LANES, "0")])).is_err());
    assert!(Tuning::from_lookup(env(&[(AGENT_LANES, "17")])).is_err());
    assert!(Tuning::from_lookup(env(&[])).unwrap().agent_split, "copies split over the lanes by default");
    assert!(!Tuning::from_lookup(env(&[(AGENT_SPLIT, "0")])).unwrap().agent_split);
    assert!(Tuning::from_lookup(env(&[(AGENT_SPLIT, "2")])).is_err());
    assert_eq!(Tuning::from_lookup(env(&[])).unwrap().reduce_scratch, 24 << 20, "24 MiB of reduce scratch by default: 8 MiB landing, 16 MiB in-place copy");
    assert_eq!(Tuning::from_lookup(env(&[(REDUCE_SCRATCH, "0")])).unwrap().reduce_scratch, 0);
    assert_eq!(Tuning::from_lookup(env(&[(REDUCE_SCRATCH, "4M")])).unwrap().reduce_scratch, 4 << 20);
    for bad in ["100", "2G", "-1", "x"] {
        assert!(Tuning::from_lookup(env(&[(REDUCE_SCRATCH, bad)])).is_err(), "{bad}");
    }
    let t = Tuning::from_lookup(env(&[(TEAMS, "4"), (TEAM_SCRATCH, "64K")])).unwrap();
    assert_eq!((t.teams, t.team_scratch), (4, 65536));
    for (name, bad) in [(TEAMS, "1"), (TEAMS, "65"), (TEAM_SCRATCH, "1K"), (TEAM_SCRATCH, "4100"), (TEAM_SCRATCH, "128M")] {
        assert!(Tuning::from_lookup(env(&[(name, bad)])).is_err(), "{name}={bad}");
    }
    assert_eq!(Tuning::from_lookup(env(&[])).unwrap().payload_bytes, 4096);
    assert_eq!(Tuning::from_lookup(env(&[(PAYLOAD_BYTES, "1K")])).unwrap().payload_bytes, 1024);
    assert_eq!(Tuning::from_lookup(env(&[(PAYLOAD_BYTES, "0")])).unwrap().payload_bytes, 0);
    for bad in ["8", "100", "128K", "x"] {
        assert!(Tuning::from_lookup(env(&[(PAYLOAD_BYTES, bad)])).is_err(), "{bad}");
    }
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!(t.payload_slot_bytes(), 4096, "64 queues x 64 slots x 4 KiB = 16 MiB fits");
    let t = Tuning::from_lookup(env(&[(QUEUES, "1024")])).unwrap();
    assert_eq!(t.payload_slot_bytes(), 1024, "halved to fit 64 MiB");
    let t = Tuning::from_lookup(env(&[(QUEUES, "1000000")])).unwrap();
    assert_eq!(t.payload_slot_bytes(), 0, "not even 16 bytes fit");
    let t = Tuning::from_lookup(env(&[(STAGE_CHUNK, "1000")])).unwrap();
    assert_eq!(t.payload_slot_bytes(), 512, "at most one chunk, a power of two");
    assert!(Tuning::from_lookup(env(&[(GPU_IPC, "yes")])).is_err());
    assert!(Tuning::from_lookup(env(&[])).unwrap().gpu_p2p, "peer-to-peer stores are the default");
    assert!(!Tuning::from_lookup(env(&[(GPU_P2P, "0")])).unwrap().gpu_p2p);
    assert!(Tuning::from_lookup(env(&[(GPU_P2P, "on")])).is_err());
    assert!(Tuning::from_lookup(env(&[(STAGE_CREDITS, "0")])).is_err());
}

#[test]
fn the_pair_staging_is_on_unless_told() {
    assert!(Tuning::from_lookup(env(&[])).unwrap().pair_stage);
    assert!(!Tuning::from_lookup(env(&[(PAIR_STAGE, "0")])).unwrap().pair_stage);
    assert!(Tuning::from_lookup(env(&[(PAIR_STAGE, "on")])).is_err());
}

#[test]
fn the_pair_staging_goes_in_chunks_of_512k_on_blocks_by_size_unless_told() {
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!((t.pair_chunk, t.pair_blocks), (512 << 10, 0));
    let t = Tuning::from_lookup(env(&[(PAIR_CHUNK, "128K"), (PAIR_BLOCKS, "8")])).unwrap();
    assert_eq!((t.pair_chunk, t.pair_blocks), (128 << 10, 8));
    for bad in ["2K", "8M", "4097", "lots"] {
        assert!(Tuning::from_lookup(env(&[(PAIR_CHUNK, bad)])).is_err(), "{bad}");
    }
    for bad in ["128", "-1", "x"] {
        assert!(Tuning::from_lookup(env(&[(PAIR_BLOCKS, bad)])).is_err(), "{bad}");
    }
}

#[test]
fn staging_zones_are_on_with_four_slots_of_a_mebibyte_unless_told() {
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!((t.stage_shared, t.stage_slot, t.stage_slots), (true, 1 << 20, 4));
    let t = Tuning::from_lookup(env(&[(STAGE_SHARED, "0"), (STAGE_SLOT, "256K"), (STAGE_SLOTS, "8")])).unwrap();
    assert_eq!((t.stage_shared, t.stage_slot, t.stage_slots), (false, 256 << 10, 8));
    for (name, bad) in [(STAGE_SHARED, "yes"), (STAGE_SLOT, "1K"), (STAGE_SLOT, "2G"), (STAGE_SLOTS, "0"), (STAGE_SLOTS, "65"), (STAGE_SLOTS, "x")] {
        assert!(Tuning::from_lookup(env(&[(name, bad)])).is_err(), "{name}={bad}");
    }
}

#[test]
fn transport_map_off_by_default_on_with_1_nothing_else() {
    assert!(!Tuning::from_lookup(env(&[])).unwrap().transport_map);
    assert!(!Tuning::from_lookup(env(&[(TRANSPORT_MAP, "0")])).unwrap().transport_map);
    assert!(!Tuning::from_lookup(env(&[(TRANSPORT_MAP, " ")])).unwrap().transport_map, "empty is unset");
    assert!(Tuning::from_lookup(env(&[(TRANSPORT_MAP, "1")])).unwrap().transport_map);
    assert!(Tuning::from_lookup(env(&[(TRANSPORT_MAP, " 1 ")])).unwrap().transport_map);
    for bad in ["yes", "on", "true", "2", "-1"] {
        let e = Tuning::from_lookup(env(&[(TRANSPORT_MAP, bad)])).unwrap_err();
        assert!(matches!(&e, EnvError::Invalid { var, value, .. } if *var == TRANSPORT_MAP && value == bad), "{e}");
        assert!(e.to_string().contains("0 or 1"), "{e}");
    }
}

#[test]
fn queue_mem_host_by_default_device_on_request_nothing_else() {
    assert_eq!(Tuning::from_lookup(env(&[])).unwrap().queue_mem, QueuePlacement::Host);
    for (v, want) in [("host", QueuePlacement::Host), ("device", QueuePlacement::Device), (" Device ", QueuePlacement::Device), ("", QueuePlacement::Host)] {
        assert_eq!(Tuning::from_lookup(env(&[(QUEUE_MEM, v)])).unwrap().queue_mem, want, "{v:?}");
    }
    for bad in ["gpu", "mapped", "1", "device,host"] {
        let e = Tuning::from_lookup(env(&[(QUEUE_MEM, bad)])).unwrap_err();
        assert!(matches!(&e, EnvError::Invalid { var, value, .. } if *var == QUEUE_MEM && value == bad), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("CPNET_QUEUE_MEM") && msg.contains("host") && msg.contains("device"), "{msg}");
    }
    assert_eq!(QueuePlacement::Device.to_string(), "device");
}

#[test]
fn proxy_daemon_variables() {
    let t = Tuning::from_lookup(env(&[])).unwrap();
    assert_eq!((t.proxy, t.job.clone(), t.in_daemon), (None, None, false));
    assert_eq!(t.proxyd_linger, DEFAULT_PROXYD_LINGER);
    let t = Tuning::from_lookup(env(&[(XDG_RUNTIME_DIR, "/run/user/7")])).unwrap();
    assert_eq!(t.proxyd_dir, std::path::Path::new("/run/user/7/cpnet"));
    let token = "00112233445566778899aabbccddeeff";
    let t = Tuning::from_lookup(env(&[
        (PROXY, "daemon"),
        (PROXYD_DIR, "/tmp/d"),
        (PROXYD, "/opt/cpnet-proxyd"),
        (PROXYD_LINGER, "0.5"),
        (JOB_ID, "42"),
        (JOB_TOKEN, token),
    ]))
    .unwrap();
    assert_eq!(t.proxy, Some(ProxyMode::Daemon));
    assert_eq!(t.proxyd_dir, std::path::Path::new("/tmp/d"));
    assert_eq!(t.proxyd_bin.as_deref(), Some(std::path::Path::new("/opt/cpnet-proxyd")));
    assert_eq!(t.proxyd_linger, Duration::from_millis(500));
    let k = t.job.unwrap();
    assert_eq!((k.id, k.token_hex()), (42, token.to_owned()));
    assert!(!format!("{k:?}").contains("0011"), "the token is never printed");
    for (var, val, want) in [
        (PROXY, "remote", "inprocess or daemon"),
        (PROXY_IDLE, "nap", "spin or park"),
        (PROXYD_LINGER, "-1", "seconds >= 0"),
    ] {
        let e = Tuning::from_lookup(env(&[(var, val)])).unwrap_err().to_string();
        assert!(e.contains(var) && e.contains(want), "{e}");
    }
    let e = Tuning::from_lookup(env(&[(JOB_ID, "1"), (JOB_TOKEN, "xyz")])).unwrap_err().to_string();
    assert!(e.contains(JOB_TOKEN) && e.contains("32 hex digits") && !e.contains("xyz"), "{e}");
    let e = Tuning::from_lookup(env(&[(JOB_ID, "1")])).unwrap_err().to_string();
    assert!(e.contains(JOB_TOKEN) && e.contains("is not set"), "{e}");
}

#[test]
fn idle_spin_and_park() {
    let t = Tuning::from_lookup(env(&[(PROXY_IDLE, "park")])).unwrap();
    assert_eq!(t.proxy_idle_sleep, Some(DEFAULT_PARK_SLEEP));
    let t = Tuning::from_lookup(env(&[(PROXY_IDLE, "park"), (PROXY_IDLE_SLEEP, "250")])).unwrap();
    assert_eq!(t.proxy_idle_sleep, Some(Duration::from_micros(250)));
    let t = Tuning::from_lookup(env(&[(PROXY_IDLE, "spin"), (PROXY_IDLE_SLEEP, "250")])).unwrap();
    assert_eq!(t.proxy_idle_sleep, None, "spin wins over a sleep");
}

#[test]
fn launch_torchrun_with_its_rendezvous_default() {
    let base = [
        (TORCH_RANK, "5"),
        (TORCH_WORLD_SIZE, "8"),
        (TORCH_LOCAL_RANK, "1"),
        (TORCH_LOCAL_WORLD_SIZE, "4"),
        (TORCH_GROUP_RANK, "1"),
        (TORCH_MASTER_ADDR, "node01"),
        (TORCH_MASTER_PORT, "29500"),
    ];
    let l = Launch::from_lookup(env(&base)).unwrap();
    assert_eq!(
        (l.pe, l.n_pes, l.local_pe, l.local_size, l.launcher, l.bootstrap.as_deref()),
        (5, 8, 1, 4, Launcher::Torchrun, Some("node01:29501"))
    );
    // CPNET_BOOTSTRAP_ADDR wins; an IPv6 MASTER_ADDR gets its brackets.
    let mut set = base.to_vec();
    set.push((BOOTSTRAP_ADDR, "h:7"));
    assert_eq!(Launch::from_lookup(env(&set)).unwrap().bootstrap.as_deref(), Some("h:7"));
    let mut v6 = base.to_vec();
    v6[5] = (TORCH_MASTER_ADDR, "::1");
    assert_eq!(Launch::from_lookup(env(&v6)).unwrap().bootstrap.as_deref(), Some("[::1]:29501"));
    // Ahead of Slurm and Open MPI (`srun torchrun`: SLURM_PROCID is the node's task).
    let mut under_srun = base.to_vec();
    under_srun.extend([(SLURM_PROCID, "1"), (SLURM_NTASKS, "2"), (OMPI_RANK, "0"), (OMPI_SIZE, "2")]);
    let l = Launch::from_lookup(env(&under_srun)).unwrap();
    assert_eq!((l.pe, l.n_pes, l.launcher), (5, 8, Launcher::Torchrun));
    // RANK alone (no GROUP_RANK) is not torchrun: a single PE.
    assert_eq!(Launch::from_lookup(env(&[(TORCH_RANK, "3")])).unwrap().launcher, Launcher::Single);
}

#[test]
fn launch_torchrun_errors_name_the_variable() {
    let base = [
        (TORCH_RANK, "0"),
        (TORCH_WORLD_SIZE, "2"),
        (TORCH_LOCAL_RANK, "0"),
        (TORCH_LOCAL_WORLD_SIZE, "2"),
        (TORCH_GROUP_RANK, "0"),
        (TORCH_MASTER_ADDR, "127.0.0.1"),
        (TORCH_MASTER_PORT, "29500"),
    ];
    let without = |var: &str| base.iter().copied().filter(|(k, _)| *k != var).collect::<Vec<_>>();
    for var in [TORCH_MASTER_ADDR, TORCH_MASTER_PORT] {
        let e = Launch::from_lookup(env(&without(var))).unwrap_err().to_string();
        assert!(e.contains(var) && e.contains("torchrun") && e.contains(BOOTSTRAP_ADDR), "{e}");
    }
    let e = Launch::from_lookup(env(&without(TORCH_WORLD_SIZE))).unwrap_err().to_string();
    assert!(e.contains(TORCH_WORLD_SIZE), "{e}");
    let mut top = base.to_vec();
    top[6] = (TORCH_MASTER_PORT, "65535");
    let e = Launch::from_lookup(env(&top)).unwrap_err().to_string();
    assert!(e.contains(TORCH_MASTER_PORT) && e.contains("65535"), "{e}");
    let mut bad = base.to_vec();
    bad[0] = (TORCH_RANK, "2");
    let e = Launch::from_lookup(env(&bad)).unwrap_err().to_string();
    assert!(e.contains(TORCH_RANK), "{e}");
}

#[test]
fn proxy_cpus_lists_and_the_cpu_of_each_thread() {
    assert_eq!(parse_cpu_list("0,2,4-6"), Some(vec![0, 2, 4, 5, 6]));
    assert_eq!(parse_cpu_list(" 7 "), Some(vec![7]));
    assert_eq!(parse_cpu_list("1023"), Some(vec![1023]));
    for bad in ["", "5-3", "1024", "0-1024", "a", "1,,2", "-1", "1-"] {
        assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
    }
    let t = Tuning::from_lookup(env(&[(PROXY_CPUS, "8-11")])).unwrap();
    assert_eq!(t.proxy_cpus, vec![8, 9, 10, 11]);
    // 2 threads per PE: PE 0 on 8, 9; PE 1 on 10, 11; PE 2 wraps to 8, 9.
    let cpus: Vec<_> = (0..3).flat_map(|pe| (0..2).map(move |th| (pe, th))).map(|(pe, th)| t.proxy_cpu(pe, 2, th).unwrap()).collect();
    assert_eq!(cpus, [8, 9, 10, 11, 8, 9]);
    assert_eq!(Tuning::default().proxy_cpu(0, 4, 0), None);
    let e = Tuning::from_lookup(env(&[(PROXY_CPUS, "3-1")])).unwrap_err().to_string();
    assert!(e.contains(PROXY_CPUS) && e.contains("taskset"), "{e}");
}
