//! `cpnet-check collectives`: every team collective of a CPU work-group
//! (OpenSHMEM 1.5 §9.9) on the world team, on a strided split and (with 4
//! PEs or more) on the teams of a 2D split, at odd sizes and at sizes that
//! take several rounds of a team's scratch; every element checked against
//! the value computed here; then bad input (a team this PE is not in, a
//! root outside the team, a bitwise reduction of floats) and a split made
//! after a destroy (a reused table entry).

use anyhow::{Context, Result, bail, ensure};
use cpnet::device::cpu::{Error as WorkGroupError, ReduceOp, ReduceType, SymAddr};
use cpnet::device::layout::{ErrorCode, TeamDesc};
use cpnet::{Pe, Team, WorkGroup};

/// Byte `i` of PE `pe`'s contribution `k` (never the same for two PEs).
fn pat(pe: i32, k: u64, i: u64) -> u8 {
    (pe as u64 * 31 + k * 17 + i * 7 + 1) as u8
}

/// Element `i` of world PE `pe`'s reduction source, as raw bits that every
/// type reads as a valid, modest value.
fn elem<T: ReduceType>(pe: i32, i: u64) -> T {
    let mut b = [0u8; 8];
    let v: i64 = (pe as i64 + 1) * 3 + (i % 11) as i64 - 5;
    // Integers: the value itself; floats: a small exact value.
    let f = v as f64 * 0.5;
    match (T::INTEGER, T::SIZE) {
        (true, n) => b[..n].copy_from_slice(&v.to_le_bytes()[..n]),
        (false, 8) => b.copy_from_slice(&f.to_le_bytes()),
        (false, 4) => b[..4].copy_from_slice(&(f as f32).to_le_bytes()),
        (false, _) if T::NAME == "half" => b[..2].copy_from_slice(&half::f16::from_f64(f).to_le_bytes()),
        (false, _) => b[..2].copy_from_slice(&half::bf16::from_f64(f).to_le_bytes()),
    }
    T::read(&b)
}

struct Ctx<'a> {
    pe: &'a Pe,
    wg: WorkGroup,
    /// Symmetric areas: sources and destinations, `AREA` bytes each.
    src: SymAddr,
    dst: SymAddr,
}

const AREA: u64 = 1 << 20;

impl Ctx<'_> {
    fn write(&self, a: SymAddr, data: &[u8]) -> Result<()> {
        self.pe.heap().write_bytes(a, data).map_err(|c| anyhow::anyhow!("write heap+{:#x}: {c}", a.0))
    }
    fn read(&self, a: SymAddr, n: u64) -> Result<Vec<u8>> {
        let mut v = vec![0u8; n as usize];
        self.pe.heap().read_bytes(a, &mut v).map_err(|c| anyhow::anyhow!("read heap+{:#x}: {c}", a.0))?;
        Ok(v)
    }
}

fn team_name(t: &Team) -> String {
    format!("team {} (start {}, stride {}, size {})", t.id(), t.start, t.stride, t.size)
}

/// Every collective on `team` (this PE a member).
fn on_team(c: &mut Ctx, team: &Team) -> Result<()> {
    let (me, n) = (team.my_pe(), team.n_pes());
    let name = team_name(team);
    let wpe = |j: i32| team.world_pe(j).expect("member");
    for _ in 0..3 {
        c.wg.team_sync(team)?;
        c.wg.team_barrier(team)?;
    }
    // broadcast, every root, odd sizes and one larger than a chunk.
    for (k, nbytes) in [1u64, 7, 1000, u64::from(team.chunk) * 2 + 5].into_iter().enumerate() {
        for root in 0..n {
            let k = k as u64 * 100 + root as u64;
            let mine: Vec<u8> = (0..nbytes).map(|i| pat(wpe(me), k, i)).collect();
            c.write(c.src, &mine)?;
            c.write(c.dst, &vec![0; nbytes as usize])?;
            // dest is reused: nobody may write it before this PE checked
            // the last result (the collectives themselves do not wait).
            c.wg.team_sync(team)?;
            c.wg.broadcastmem(team, c.dst, c.src, nbytes, root)?;
            let want: Vec<u8> = (0..nbytes).map(|i| pat(wpe(root), k, i)).collect();
            crate::check_eq(&c.read(c.dst, nbytes)?, &want, || format!("{name}: broadcast of {nbytes} B from {root}"))
                .map_err(anyhow::Error::msg)?;
        }
    }
    // fcollect and alltoall.
    for nbytes in [1u64, 13, 4096] {
        let mine: Vec<u8> = (0..nbytes).map(|i| pat(wpe(me), 7, i)).collect();
        c.write(c.src, &mine)?;
        c.wg.team_sync(team)?;
        c.wg.fcollectmem(team, c.dst, c.src, nbytes)?;
        let want: Vec<u8> = (0..n).flat_map(|j| (0..nbytes).map(move |i| pat(wpe(j), 7, i))).collect();
        crate::check_eq(&c.read(c.dst, nbytes * n as u64)?, &want, || format!("{name}: fcollect of {nbytes} B"))
            .map_err(anyhow::Error::msg)?;

        // Block j of the source is meant for team PE j: pat(me, 50 + j, i).
        let blocks: Vec<u8> = (0..n).flat_map(|j| (0..nbytes).map(move |i| pat(wpe(me), 50 + j as u64, i))).collect();
        c.write(c.src, &blocks)?;
        c.wg.team_sync(team)?;
        c.wg.alltoallmem(team, c.dst, c.src, nbytes)?;
        let want: Vec<u8> = (0..n).flat_map(|j| (0..nbytes).map(move |i| pat(wpe(j), 50 + me as u64, i))).collect();
        crate::check_eq(&c.read(c.dst, nbytes * n as u64)?, &want, || format!("{name}: alltoall of {nbytes} B"))
            .map_err(anyhow::Error::msg)?;
    }
    // collect: team PE j gives 5 * (j + 1) bytes.
    let size_of = |j: i32| 5 * (j as u64 + 1);
    let mine: Vec<u8> = (0..size_of(me)).map(|i| pat(wpe(me), 9, i)).collect();
    c.write(c.src, &mine)?;
    c.wg.team_sync(team)?;
    let total = c.wg.collectmem(team, c.dst, c.src, size_of(me))?;
    let want: Vec<u8> = (0..n).flat_map(|j| (0..size_of(j)).map(move |i| pat(wpe(j), 9, i))).collect();
    ensure!(total == want.len() as u64, "{name}: collect says {total} bytes, expected {}", want.len());
    crate::check_eq(&c.read(c.dst, total)?, &want, || format!("{name}: collect")).map_err(anyhow::Error::msg)?;

    // Reductions: every type, every operator that applies, odd counts and
    // a count that takes three rounds of the scratch.
    macro_rules! each_type {
        ($($t:ty),*) => {$( reduce_all::<$t>(c, team)?; )*};
    }
    each_type!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, half::f16, half::bf16);
    Ok(())
}

fn reduce_all<T: ReduceType>(c: &mut Ctx, team: &Team) -> Result<()> {
    let n = team.n_pes();
    let per_round = u64::from(team.chunk) / T::SIZE as u64;
    let me_w = team.world_pe(team.my_pe()).expect("member");
    for op in ReduceOp::ALL.into_iter().filter(|o| T::INTEGER || !o.bitwise()) {
        for count in [1u64, 7, 1000.min(AREA / T::SIZE as u64), per_round * 2 + 3] {
            let mut src = vec![0u8; count as usize * T::SIZE];
            for i in 0..count {
                elem::<T>(me_w, i).write(&mut src[i as usize * T::SIZE..]);
            }
            c.write(c.src, &src)?;
            // In place (dest == source) for the odd count, apart otherwise.
            let dst = if count == 7 { c.src } else { c.dst };
            c.wg.reduce::<T>(team, op, dst, c.src, count)?;
            let got = c.read(dst, count * T::SIZE as u64)?;
            for i in 0..count {
                let want = (1..n).fold(elem::<T>(team.world_pe(0).expect("member"), i), |a, j| {
                    T::combine(op, a, elem::<T>(team.world_pe(j).expect("member"), i))
                });
                let g = T::read(&got[i as usize * T::SIZE..]);
                if g != want {
                    bail!(
                        "{}: {}_{}_reduce of {count}: element {i} is {g:?}, expected {want:?}",
                        team_name(team),
                        T::NAME,
                        op.name()
                    );
                }
            }
        }
    }
    Ok(())
}

/// `Ok` if `r` failed with `code`.
fn expect_code<R>(r: std::result::Result<R, WorkGroupError>, code: ErrorCode, what: &str) -> Result<()> {
    match r {
        Err(e) if e.code() == code => Ok(()),
        Err(e) => bail!("{what}: failed with {e}, expected {code}"),
        Ok(_) => bail!("{what}: accepted, expected {code}"),
    }
}

/// The scenario (**collective**: every PE runs it).
///
/// # Errors
/// The first wrong value or failed call, naming team, collective, size and
/// element.
pub fn collectives(pe: &Pe) -> Result<()> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let src = pe.shmalloc(AREA)?;
    let dst = pe.shmalloc(AREA)?;
    let mut c = Ctx { pe, wg: pe.ctx_create(0)?, src, dst };

    let world = pe.team_world();
    ensure!(world.my_pe() == me && world.n_pes() == n, "world team: PE {} of {}", world.my_pe(), world.n_pes());
    on_team(&mut c, &world).context("world team")?;
    let node = pe.team_node();
    ensure!(node.my_pe() >= 0, "node team: this PE is not in it");
    on_team(&mut c, &node).context("node team")?;

    // The even PEs of the world (odd ones get None).
    let evens = pe.team_split_strided(&world, 0, 2, (n + 1) / 2)?;
    ensure!(evens.is_some() == (me % 2 == 0), "split: PE {me} membership of the even team");
    if let Some(t) = &evens {
        ensure!(t.my_pe() == me / 2 && t.translate_pe(t.my_pe(), &world) == me, "even team numbering");
        on_team(&mut c, t).context("even team")?;
    }
    if n >= 4 {
        let (row, col) = pe.team_split_2d(&world, 2)?;
        let row_size = 2.min(n - me / 2 * 2);
        ensure!(row.n_pes() == row_size && row.my_pe() == me % 2, "2D split: row team {}", team_name(&row));
        ensure!(col.my_pe() == me / 2 && col.n_pes() == (n - me % 2 + 1) / 2, "2D split: column team {}", team_name(&col));
        on_team(&mut c, &row).context("2D row team")?;
        on_team(&mut c, &col).context("2D column team")?;
        pe.team_destroy(col)?;
        pe.team_destroy(row)?;
    }

    // Bad input: a free entry, a root outside the team, a float xor.
    let free = TeamDesc::default();
    expect_code(c.wg.team_sync(&free), ErrorCode::BadTeam, "team_sync on a free entry")?;
    expect_code(c.wg.broadcastmem(&world, dst, src, 8, n), ErrorCode::BadPe, "broadcast from a root outside the team")?;
    expect_code(c.wg.reduce::<f32>(&world, ReduceOp::Xor, dst, src, 4), ErrorCode::BadOp, "xor of floats")?;
    // The team still works after the refusals.
    c.wg.team_barrier(&world)?;

    // Destroy and split again: the entry is reused, its scratch cleared.
    let id = evens.as_ref().map(Team::id);
    if let Some(t) = evens {
        pe.team_destroy(t)?;
    }
    let again = pe.team_split_strided(&world, 0, 2, (n + 1) / 2)?;
    if let Some(t) = &again {
        ensure!(Some(t.id()) == id, "the split after destroy took entry {}, expected {id:?}", t.id());
        reduce_all::<u64>(&mut c, t).context("even team, second time")?;
    }
    if let Some(t) = again {
        pe.team_destroy(t)?;
    }
    c.wg.destroy()?;
    Ok(())
}
