//! The CPU variant's iteration loop ([`run_cpu`]; the protocol, and why
//! nothing races, in the module docs of `jacobi.rs`): `-wgs W` persistent
//! work-groups per PE, halos by put-with-signal, the norm reduced from
//! inside the loop one iteration late.

use super::*;

/// The distributed state one PE's work-groups share.
struct Shared<'a> {
    args: &'a Args,
    grids: [SymArray<Real>; 2],
    nx: usize,
    chunk: usize,
    me: i32,
    n: i32,
    top_pe: i32,
    bottom_pe: i32,
    /// The bottom halo row index of the PE above (its chunk + 1).
    top_pe_halo: usize,
    sync: SymAddr,
    wgs: usize,
    team: TeamBarrier,
    /// Per work-group partial sums (f64 bits), by iteration parity.
    partials: Vec<[AtomicU64; 2]>,
    stop: AtomicBool,
    iters: AtomicU32,
    norms: Mutex<Vec<(u32, f64)>>,
}

impl Shared<'_> {
    /// Compute row `r` of `dst` from `src`; returns its squared-update sum.
    fn row(&self, src: SymArray<Real>, dst: SymArray<Real>, r: usize, check: bool) -> f64 {
        let nx = self.nx;
        // SAFETY: (module docs, "Why nothing races") rows r-1..=r+1 of `src`
        // are not written during this iteration: local rows were written
        // last iteration (team barrier since), halo rows were delivered
        // before the signal this work-group waited for, and the next remote
        // write into them needs this work-group's own signal of this
        // iteration. Row r of `dst` belongs to this work-group alone, and the
        // quiet at the top of the iteration completed any put that read it.
        let (above, row, below, out) = unsafe {
            (
                src.slice((r - 1) * nx, nx),
                src.slice(r * nx, nx),
                src.slice((r + 1) * nx, nx),
                dst.slice_mut(r * nx, nx),
            )
        };
        stencil_row(above, row, below, out, check)
    }

    /// Work-group 0, after a check iteration's barrier: put this PE's
    /// partial into slot `[parity][me]` of every PE, +1 on their counter.
    fn contribute(&self, wg: &mut cpnet::WorkGroup, it: u32, round: u64) -> WgResult<()> {
        use sync_block::*;
        let local: f64 = self
            .partials
            .iter()
            .map(|p| f64::from_bits(p[it as usize % 2].load(Ordering::Relaxed)))
            .sum();
        let par = round % 2;
        let src = self.sync.add(NORM_SRC + 8 * par);
        wg.heap()
            .write_bytes(src, &local.to_le_bytes())
            .expect("the sync block is in the heap");
        let slot = self
            .sync
            .add(NORM_SLOTS + 8 * (par * self.n as u64 + self.me as u64));
        for q in 0..self.n {
            // 8 bytes travel inline: `src` may change after the call.
            wg.putmem_signal_nbi(
                slot,
                src,
                8,
                self.sync.add(NORM_CNT + 64 * par),
                1,
                SignalOp::Add,
                q,
            )?;
        }
        Ok(())
    }

    /// Work-group 0: wait for every PE's contribution to `round` and return
    /// the norm (slots summed in PE order: the same bits on every PE).
    fn collect(&self, wg: &mut cpnet::WorkGroup, round: u64) -> WgResult<f64> {
        use sync_block::*;
        let par = round % 2;
        let want = self.n as u64 * (round / 2 + 1);
        wg.signal_wait_until(self.sync.add(NORM_CNT + 64 * par), Cmp::Ge, want)?;
        let mut sum = 0.0;
        for q in 0..self.n as u64 {
            let mut b = [0u8; 8];
            wg.heap()
                .read_bytes(
                    self.sync.add(NORM_SLOTS + 8 * (par * self.n as u64 + q)),
                    &mut b,
                )
                .expect("in the heap");
            sum += f64::from_le_bytes(b);
        }
        Ok(sum.sqrt())
    }

    /// The iteration loop of one work-group.
    fn work_group(&self, wg: &mut cpnet::WorkGroup) -> WgResult<()> {
        use sync_block::*;
        let (nx, chunk) = (self.nx, self.chunk);
        let w = wg.wg() as usize;
        let (r0, r1) = wg_rows(chunk, self.wgs, w);
        let owns_top = r0 == 1;
        let owns_bottom = r1 == chunk + 1;
        let leader = w == 0;
        let row_bytes = (nx * size_of::<Real>()) as u64;
        let mut round = 0u64; // norm rounds contributed so far
        let mut pending: Option<(u32, u64)> = None; // (iteration, round) not yet read
        for it in 0..self.args.niter {
            let (src, dst) = (
                self.grids[it as usize % 2],
                self.grids[(it as usize + 1) % 2],
            );
            let check = self.args.is_check(it);
            if owns_top || owns_bottom {
                // The rows pushed last iteration are delivered before this
                // work-group writes again (and the buffer they came from is
                // rewritten next iteration).
                wg.quiet()?;
            }
            let mut partial = 0.0;
            let (mut done_top, mut done_bottom) = (false, false);
            if owns_top {
                // Top halo of iteration it-1 (SET to it by the PE above).
                wg.signal_wait_until(self.sync.add(TOP_SIG), Cmp::Ge, u64::from(it))?;
                if chunk == 1 {
                    wg.signal_wait_until(self.sync.add(BOT_SIG), Cmp::Ge, u64::from(it))?;
                }
                partial += self.row(src, dst, 1, check);
                done_top = true;
                wg.putmem_signal_nbi(
                    dst.addr(self.top_pe_halo * nx),
                    dst.addr(nx),
                    row_bytes,
                    self.sync.add(BOT_SIG),
                    u64::from(it) + 1,
                    SignalOp::Set,
                    self.top_pe,
                )?;
                if chunk == 1 {
                    done_bottom = true;
                    wg.putmem_signal_nbi(
                        dst.addr(0),
                        dst.addr(nx),
                        row_bytes,
                        self.sync.add(TOP_SIG),
                        u64::from(it) + 1,
                        SignalOp::Set,
                        self.bottom_pe,
                    )?;
                }
            }
            if owns_bottom && !done_bottom {
                wg.signal_wait_until(self.sync.add(BOT_SIG), Cmp::Ge, u64::from(it))?;
                partial += self.row(src, dst, chunk, check);
                done_bottom = true;
                wg.putmem_signal_nbi(
                    dst.addr(0),
                    dst.addr(chunk * nx),
                    row_bytes,
                    self.sync.add(TOP_SIG),
                    u64::from(it) + 1,
                    SignalOp::Set,
                    self.bottom_pe,
                )?;
            }
            for r in r0..r1 {
                if (r == 1 && done_top) || (r == chunk && done_bottom) {
                    continue;
                }
                partial += self.row(src, dst, r, check);
            }
            self.partials[w][it as usize % 2].store(partial.to_bits(), Ordering::Relaxed);
            if leader && let Some((at, r)) = pending.take() {
                let norm = self.collect(wg, r)?;
                self.norms
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((at, norm));
                if norm <= TOL {
                    self.iters.store(it + 1, Ordering::Relaxed);
                    self.stop.store(true, Ordering::Relaxed);
                }
            }
            if !self.team.wait() {
                return Ok(()); // a sibling failed; its error is reported
            }
            if self.stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            if leader && check {
                self.contribute(wg, it, round)?;
                pending = Some((it, round));
                round += 1;
            }
        }
        if leader && let Some((at, r)) = pending {
            let norm = self.collect(wg, r)?;
            self.norms
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((at, norm));
        }
        Ok(())
    }
}

/// The CPU variant on this PE: allocate and initialize the chunk
/// (**collective**), run the loop on `args.wgs` work-groups, return the
/// run and the buffer that holds the final chunk. See the module docs.
///
/// # Errors
/// Heap allocation, and the first work-group error (naming PE, work-group,
/// operation and address).
pub fn run_cpu(pe: &Pe, args: &Args) -> anyhow::Result<(Solution, SymArray<Real>, SymArray<Real>)> {
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let part = Partition::new(args.ny, n as usize);
    let chunk = part.chunk(me as usize);
    let nx = args.nx;
    let rows = part.chunk_high + 2;
    let bytes = (nx * rows * size_of::<Real>()) as u64;
    let a = [pe.shmalloc(bytes)?, pe.shmalloc(bytes)?];
    let sync = pe.shmalloc(sync_block::bytes(n as usize))?;
    let heap = pe.heap();
    heap.write_bytes(sync, &vec![0u8; sync_block::bytes(n as usize) as usize])?;
    let grids = [
        SymArray::<Real>::new(heap, a[0], nx * rows),
        SymArray::<Real>::new(heap, a[1], nx * rows),
    ];
    let offset = part.iy_start_global(me as usize) - 1;
    for g in &grids {
        // SAFETY: no work-group runs yet and no peer writes this PE's grids
        // before the barrier below.
        let cells = unsafe { g.slice_mut(0, nx * rows) };
        cells.fill(0.0);
        for r in 0..chunk + 2 {
            let y0 = boundary(offset + r, args.ny);
            cells[r * nx] = y0;
            cells[r * nx + nx - 1] = y0;
        }
    }
    let top_pe = if me > 0 { me - 1 } else { n - 1 };
    let bottom_pe = (me + 1) % n;
    let wgs = args.cpu_work_groups().min(chunk);
    let shared = Shared {
        args,
        grids,
        nx,
        chunk,
        me,
        n,
        top_pe,
        bottom_pe,
        top_pe_halo: part.chunk(top_pe as usize) + 1,
        sync,
        wgs,
        team: TeamBarrier::new(wgs),
        partials: (0..wgs).map(|_| Default::default()).collect(),
        stop: AtomicBool::new(false),
        iters: AtomicU32::new(args.niter),
        norms: Mutex::new(Vec::new()),
    };
    pe.barrier_all()?;
    let t = Instant::now();
    pe.run_work_groups(wgs as u32, |wg| {
        let r = shared.work_group(wg);
        if r.is_err() {
            shared.team.abort();
        }
        r
    })?;
    pe.barrier_all()?;
    let secs = t.elapsed().as_secs_f64();
    let iters = shared.iters.load(Ordering::Relaxed);
    let norms = shared
        .norms
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let fin = grids[iters as usize % 2];
    let scratch = grids[(iters as usize + 1) % 2];
    Ok((Solution { iters, norms, secs }, fin, scratch))
}
