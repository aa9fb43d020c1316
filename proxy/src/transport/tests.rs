//! Unit tests of the fabric transport: the peer card's encoding, and the
//! minimum AMOs over a real shm endpoint pair in one process (native
//! `FI_MIN` and the CAS loop).

use super::*;
use cpnet_device::cpu::HostHeap;

/// Two PEs' transports in this process over shm; `emulate`: minimum
/// AMOs take the CAS-loop path whatever the provider offers.
fn min_amos_on_the_fabric(emulate: bool) {
    const HEAP: u64 = 4096;
    let cfg = FabricConfig { provider: "shm".into(), src_node: None, reach_timeout: None };
    let heaps = [HostHeap::new(region_len(HEAP)), HostHeap::new(region_len(HEAP))];
    let eps: Vec<FabricEndpoint> =
        (0..2).map(|pe| FabricEndpoint::open(&cfg, pe, heaps[pe as usize].view(), HEAP).expect("shm endpoint")).collect();
    let cards: Vec<PeerCard> = eps.iter().map(FabricEndpoint::card).collect();
    let epoch = Arc::new(StdAtomicU64::new(0));
    let mut ts: Vec<FabricTransport> = eps.into_iter().map(|e| e.connect(&cards, epoch.clone()).expect("connect")).collect();
    if emulate {
        ts[0].min_native = [false; 4];
    }
    let target = heaps[1].view();
    let mut seq = 0;
    let mut run = |ts: &mut Vec<FabricTransport>, ty: AmoType, op: AmoOp, dst: u64, value: u64| -> Outcome {
        seq += 1;
        let tag = Tag { queue: 0, seq };
        let amo = Op::Amo { pe: 1, ty, op, dst, value, cond: 0 };
        let mut done = Vec::new();
        let mut tries = 0;
        loop {
            match ts[0].submit(tag, &amo) {
                Submit::Done(o) => return o,
                Submit::Pending => break,
                // -FI_EAGAIN while shm sets up the peer: progress, retry.
                Submit::Busy => {
                    tries += 1;
                    assert!(tries < 1_000_000, "{op:?} {ty:?} never accepted");
                    ts[0].progress(&mut done);
                    ts[1].progress(&mut Vec::new());
                }
            }
        }
        for _ in 0..1_000_000 {
            ts[0].progress(&mut done);
            ts[1].progress(&mut Vec::new());
            if let Some(f) = done.iter().find(|f| f.tag == tag) {
                return f.outcome;
            }
        }
        panic!("{op:?} {ty:?} never completed");
    };
    // int32 at 0: signed order; uint32 at 4; int64 at 8; uint64 at 16.
    target.write_bytes(SymAddr(0), &5i32.to_le_bytes()).unwrap();
    target.write_bytes(SymAddr(4), &5u32.to_le_bytes()).unwrap();
    target.write_bytes(SymAddr(8), &(-3i64).to_le_bytes()).unwrap();
    target.write_bytes(SymAddr(16), &u64::MAX.to_le_bytes()).unwrap();
    let m1 = u64::from(-1i32 as u32);
    assert_eq!(run(&mut ts, AmoType::Int32, AmoOp::FetchMin, 0, m1), Outcome::Value(5));
    assert_eq!(run(&mut ts, AmoType::Int32, AmoOp::FetchMin, 0, 7), Outcome::Value(m1), "-1 < 7 signed");
    assert_eq!(run(&mut ts, AmoType::Uint32, AmoOp::FetchMin, 4, m1), Outcome::Value(5), "0xffffffff > 5 unsigned");
    assert_eq!(run(&mut ts, AmoType::Uint32, AmoOp::Min, 4, 2), Outcome::Done);
    assert_eq!(run(&mut ts, AmoType::Int64, AmoOp::FetchMin, 8, (-9i64) as u64), Outcome::Value((-3i64) as u64));
    assert_eq!(run(&mut ts, AmoType::Uint64, AmoOp::Min, 16, 77), Outcome::Done);
    assert_eq!(run(&mut ts, AmoType::Uint64, AmoOp::FetchMin, 16, 80), Outcome::Value(77));
    let r = |o: u64, n: usize| {
        let mut b = [0u8; 8];
        target.read_bytes(SymAddr(o), &mut b[..n]).unwrap();
        u64::from_le_bytes(b)
    };
    assert_eq!((r(0, 4), r(4, 4), r(8, 8), r(16, 8)), (m1, 2, (-9i64) as u64, 77));
}

#[test]
fn min_amos_use_fi_min_on_shm() {
    min_amos_on_the_fabric(false);
}

#[test]
fn min_amos_fall_back_to_a_cas_loop_without_fi_min() {
    min_amos_on_the_fabric(true);
}

fn mem(base: u64) -> RemoteMemory {
    RemoteMemory { base, len: 4096 + base, key: MrKey(base ^ 0x55) }
}

#[test]
fn card_round_trips_with_and_without_a_mailbox() {
    for mailbox in [None, Some(mem(0x7000))] {
        let card = PeerCard { name: b"fi_shm://1234:0:1".to_vec(), mem: mem(0x1000), mailbox, provider: "shm".into() };
        assert_eq!(PeerCard::from_bytes(&card.to_bytes()), Some(card));
    }
}

#[test]
fn malformed_cards_are_refused() {
    let card = PeerCard { name: vec![7; 16], mem: mem(1), mailbox: Some(mem(2)), provider: "tcp;ofi_rxm".into() };
    let b = card.to_bytes();
    // Cut anywhere (but at the end of the card without its mailbox), or
    // a byte too many: not a card.
    for n in (0..b.len()).filter(|&n| n != 30 + 16 + 11) {
        assert_eq!(PeerCard::from_bytes(&b[..n]), None, "{n} bytes");
    }
    let mut long = b.clone();
    long.push(0);
    assert_eq!(PeerCard::from_bytes(&long), None);
}
