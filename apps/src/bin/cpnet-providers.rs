//! What each libfabric provider on this machine offers cpnet (issue 19,
//! item 3: "what each provider on these machines offers is written down").
//!
//! For every provider named (default: the ones cpnet knows of), asks
//! `fi_getinfo(3)` with cpnet's own hints (RDM endpoint, `FI_THREAD_DOMAIN`,
//! manual progress, `FI_AV_TABLE`, `FI_ORDER_SAS`) for:
//!
//! - **rma**: `FI_RMA | FI_ATOMIC` (+ `FI_MSG` for put batches): what CPU
//!   PEs need (`cpnet_proxy::transport`); with the granted provider, inject
//!   size, largest message, memory-registration mode and message order;
//! - **msg**: `FI_MSG` alone: what GPU PEs' staged active messages need
//!   (`cpnet_proxy::staged`);
//! - **hmem**: the rma request plus `FI_HMEM` and `FI_MR_HMEM` (registering
//!   GPU memory: the zero-copy path, docs/gpu-data-paths.md);
//! - **atomics**: on an endpoint of the rma request, which `fi_op` x
//!   `fi_datatype` pairs `fi_atomicvalid` / `fi_fetch_atomicvalid` /
//!   `fi_compare_atomicvalid` accept (fi_atomic(3)).
//!
//! No peer is needed: one process, nothing sent. Output: one block per
//! provider, meant for docs/results.md.
//!
//! `cpnet-providers` or `cpnet-providers shm 'tcp;ofi_rxm'`

use std::rc::Rc;

use clap::Parser;
use cpnet_fabric_sys as sys;
use cpnet_proxy::fabric::{
    AddressVector, AtomicClass, AtomicOp, AtomicType, CAPS, CompletionQueue, Domain, Endpoint, Fabric, Info,
    InfoRequest, MSG_CAPS,
};

#[derive(Parser)]
#[command(about = "What each libfabric provider here offers cpnet (fi_getinfo with cpnet's hints, fi_atomicvalid)")]
struct Args {
    /// Providers as FI_PROVIDER spells them; default: the ones cpnet knows.
    providers: Vec<String>,
    /// Local address to bind IP providers to (their fi_getinfo may need one).
    #[arg(long, default_value = "127.0.0.1")]
    node: String,
}

const KNOWN: [&str; 10] =
    ["shm", "tcp;ofi_rxm", "net", "verbs;ofi_rxm", "efa", "cxi", "psm3", "opx", "udp;ofi_rxd", "sockets"];

fn main() {
    let args = Args::parse();
    let list: Vec<String> =
        if args.providers.is_empty() { KNOWN.iter().map(|s| (*s).to_owned()).collect() } else { args.providers };
    let v = fi_version();
    println!("# cpnet-providers: libfabric {v}, fi_getinfo with cpnet's hints (RDM, FI_THREAD_DOMAIN, manual progress, FI_AV_TABLE, FI_ORDER_SAS)");
    for p in &list {
        report(p, &args.node);
    }
}

fn fi_version() -> String {
    // SAFETY: fi_version(3) has no preconditions and returns a value.
    let v = unsafe { sys::fi_version() };
    format!("{}.{}", v >> 16, v & 0xffff)
}

fn request(provider: &str, node: &str, caps: u64) -> InfoRequest {
    let r = InfoRequest::provider(provider).with_caps(caps);
    if provider.starts_with("shm") { r } else { r.with_src_node(node) }
}

fn report(provider: &str, node: &str) {
    println!("## {provider}");
    let rma = Info::get(&request(provider, node, CAPS | MSG_CAPS)).or_else(|_| Info::get(&request(provider, node, CAPS)));
    match &rma {
        Ok(i) => {
            println!(
                "rma: yes (granted {}; messages too: {}; inject {} B; max message {} B; mr_mode {:#x}; msg_order{})",
                i.provider_name(),
                if i.caps() & sys::FI_MSG != 0 { "yes" } else { "no" },
                i.inject_size(),
                i.max_msg_size(),
                i.mr_mode(),
                order(i.msg_order())
            );
        }
        Err(e) => println!("rma: no ({e})"),
    }
    match Info::get(&request(provider, node, MSG_CAPS)) {
        Ok(i) => println!(
            "msg: yes (granted {}; inject {} B; max message {} B)",
            i.provider_name(),
            i.inject_size(),
            i.max_msg_size()
        ),
        Err(e) => println!("msg: no ({e})"),
    }
    // FI_HMEM with each kind of operation: providers grant it for some only
    // (shm 1.17: RMA and messages, not atomics).
    let rma_only = CAPS & !sys::FI_ATOMIC;
    let mut granted = Vec::new();
    for (caps, what) in [(CAPS, "rma+atomics"), (rma_only, "rma"), (MSG_CAPS, "msg")] {
        if let Ok(i) = Info::get(&request(provider, node, caps | sys::FI_HMEM).with_mr_mode(sys::FI_MR_HMEM)) {
            granted.push(format!("{what} (mr_mode {:#x})", i.mr_mode()));
        }
    }
    if granted.is_empty() {
        println!("hmem: no (fi_getinfo with FI_HMEM and FI_MR_HMEM: no data for rma+atomics, rma or msg)");
    } else {
        println!(
            "hmem: granted with {} (device memory may be registered where libfabric finds the CUDA driver at run \
             time; cpnet does not register its GPU heap yet)",
            granted.join(", ")
        );
    }
    if let Ok(i) = rma {
        match atomics(&i) {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => println!("atomics: could not open an endpoint to ask: {e}"),
        }
    }
}

fn order(o: u64) -> String {
    let names = [
        (sys::FI_ORDER_SAS, "SAS"),
        (sys::FI_ORDER_RAR, "RAR"),
        (sys::FI_ORDER_RAW, "RAW"),
        (sys::FI_ORDER_WAR, "WAR"),
        (sys::FI_ORDER_WAW, "WAW"),
        (sys::FI_ORDER_ATOMIC_RAW, "ATOMIC_RAW"),
        (sys::FI_ORDER_ATOMIC_WAW, "ATOMIC_WAW"),
    ];
    let s: Vec<&str> = names.iter().filter(|(b, _)| o & b != 0).map(|(_, n)| *n).collect();
    if s.is_empty() { " none".to_owned() } else { format!(" {}", s.join(",")) }
}

/// Per class (plain, fetch, compare): the ops valid for every one of
/// cpnet's four integer types, and the float types' support.
fn atomics(info: &Info) -> Result<Vec<String>, cpnet_proxy::fabric::FabricError> {
    let fabric = Fabric::open(info)?;
    let domain: Rc<Domain> = Domain::open(&fabric)?;
    let cq = CompletionQueue::open(&domain, 16)?;
    let av = AddressVector::open(&domain, 4)?;
    let ep = Endpoint::open(&domain, &cq, &av)?;
    let ops = [
        (AtomicOp::Sum, "sum"),
        (AtomicOp::Min, "min"),
        (AtomicOp::Max, "max"),
        (AtomicOp::Prod, "prod"),
        (AtomicOp::Band, "band"),
        (AtomicOp::Bor, "bor"),
        (AtomicOp::Bxor, "bxor"),
        (AtomicOp::Read, "read"),
        (AtomicOp::Write, "write"),
        (AtomicOp::Cswap, "cswap"),
        (AtomicOp::Mswap, "mswap"),
    ];
    let ints = [AtomicType::I32, AtomicType::U32, AtomicType::I64, AtomicType::U64];
    let floats = [AtomicType::F32, AtomicType::F64];
    let mut out = Vec::new();
    for (class, name) in [(AtomicClass::Plain, "fi_atomic"), (AtomicClass::Fetch, "fi_fetch_atomic"), (AtomicClass::Compare, "fi_compare_atomic")] {
        let mut int_ok = Vec::new();
        let mut float_ok = Vec::new();
        for &(op, opn) in &ops {
            let valid = |ty: AtomicType| ep.atomic_supported(class, op, ty);
            if ints.iter().all(|&t| valid(t)) {
                int_ok.push(opn);
            }
            if floats.iter().all(|&t| valid(t)) {
                float_ok.push(opn);
            }
        }
        out.push(format!(
            "atomics {name}: 32/64-bit integers: {}; float/double: {}",
            if int_ok.is_empty() { "none".to_owned() } else { int_ok.join(" ") },
            if float_ok.is_empty() { "none".to_owned() } else { float_ok.join(" ") }
        ));
    }
    Ok(out)
}
