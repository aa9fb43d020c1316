//! The CPU variant of the multi-ring allreduce (`-variant cpu`, and the
//! library's reduce on CPU work-groups): the rings' state machine on CPU
//! work-groups, its sweep and its program. The algorithm, messages and
//! flow control are the parent module's documentation ([`super`]).

use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cpnet::Pe;
use cpnet::device::cpu::{Error as WgError, Result as WgResult, SymAddr};
use cpnet::device::cpu::ReduceOp;
use cpnet::device::layout::{Cmp, SignalOp};
use cpnet::device::sync::Spin;

use super::{Args, DataType, Elem, Layout, RingCount, RingPlan, heap_need, input_value, min_seg_elems, print_header, sweep_with, wrong_elements};
use crate::cli::init_pe;
use crate::mem::SymArray;
use crate::team::TeamBarrier;

/// How often an idle ring checks its queue for a failing job.
const PROBE_EVERY: Duration = Duration::from_millis(2);

/// What one ring needs to run an allreduce.
struct Ring<'a> {
    layout: Layout,
    plan: &'a RingPlan,
    ring: usize,
    in_place: bool,
    prev: i32,
    next: i32,
    timeout: Option<Duration>,
}

/// Whether the word at `addr` of the local heap is at least `v` (acquire).
fn reached(wg: &cpnet::WorkGroup, addr: SymAddr, v: u64) -> WgResult<bool> {
    wg.test::<u64>(addr, Cmp::Ge, v)
}

fn load(wg: &cpnet::WorkGroup, addr: SymAddr) -> u64 {
    // Acquire: pairs with the fabric's delivery of the signal or AMO that
    // wrote it (the runtime's put-then-signal guarantee).
    wg.heap()
        .atomic_u64(addr)
        .map(|a| a.load(Ordering::Acquire))
        .unwrap_or(0)
}

impl Ring<'_> {
    /// One allreduce on this ring. `count` is the ring's message counter,
    /// `out_sent[b][j]` the message index + 1 of the last put that read
    /// piece `j` of block `b` of the output (0: none).
    fn allreduce<T: Elem>(
        &self,
        wg: &mut cpnet::WorkGroup,
        count: &mut RingCount,
        out_sent: &mut [Vec<u64>],
    ) -> WgResult<()> {
        let plan = self.plan;
        let heap = *wg.heap();
        let esize = size_of::<T>();
        let total = plan.seg_off + plan.seg_len;
        let input = SymArray::<T>::new(&heap, self.layout.input, total);
        let output = SymArray::<T>::new(&heap, self.layout.output, total);
        if plan.steps() == 0 {
            if !self.in_place && plan.seg_len > 0 {
                // SAFETY: this ring alone touches its segment; one PE sends
                // nothing, so no put reads the output.
                let (src, dst) = unsafe {
                    (
                        input.slice(plan.seg_off, plan.seg_len),
                        output.slice_mut(plan.seg_off, plan.seg_len),
                    )
                };
                dst.copy_from_slice(src);
            }
            return Ok(());
        }
        let k = self.layout.slots;
        let n_rs = plan.steps() / 2; // reduce-scatter steps
        let (ms, mr) = (plan.sends(), plan.recvs());
        let (base_s, base_r) = (count.sent, count.received);
        let ack_addr = self.layout.ack(self.ring);
        let mut acked = load(wg, ack_addr);
        let (mut ns, mut nr) = (0usize, 0usize);
        // Cursors: (step, piece) of the next send and receive.
        let (mut ss, mut sj) = (0usize, 0usize);
        let (mut rs, mut rj) = (0usize, 0usize);
        let skip_empty = |s: &mut usize, j: &mut usize, blocks: &[usize]| {
            while *s < blocks.len() && *j >= plan.pieces(blocks[*s]) {
                *s += 1;
                *j = 0;
            }
        };
        skip_empty(&mut ss, &mut sj, &plan.send_block);
        skip_empty(&mut rs, &mut rj, &plan.recv_block);
        let spin = Spin::new();
        let mut idle_since: Option<Instant> = None;
        let mut last_probe = Instant::now();
        while ns < ms || nr < mr {
            let mut progressed = false;
            // Sends: as many as the window and the data allow.
            while ns < ms {
                let g = base_s + ns as u64;
                if g + 1 > acked + k {
                    acked = load(wg, ack_addr);
                    if g + 1 > acked + k {
                        break;
                    }
                }
                // A piece of step s > 0 is the one received at step s - 1.
                if ss > 0 && nr <= plan.recv_off[ss - 1] + sj {
                    break;
                }
                let b = plan.send_block[ss];
                let (first, len) = plan.piece_range(b, sj);
                let from_output = ss > 0 || self.in_place;
                let src = if from_output {
                    output.addr(first)
                } else {
                    input.addr(first)
                };
                if from_output {
                    out_sent[b][sj] = g + 1;
                }
                let slot = g % k;
                wg.putmem_signal_nbi(
                    self.layout.stage(self.ring, slot),
                    src,
                    (len * esize) as u64,
                    self.layout.sig(self.ring, slot),
                    g + 1,
                    SignalOp::Set,
                    self.next,
                )?;
                ns += 1;
                sj += 1;
                skip_empty(&mut ss, &mut sj, &plan.send_block);
                progressed = true;
            }
            // Receives: in order, as they land.
            while nr < mr {
                let g = base_r + nr as u64;
                let slot = g % k;
                if !reached(wg, self.layout.sig(self.ring, slot), g + 1)? {
                    break;
                }
                let b = plan.recv_block[rs];
                // Never change output under a put still reading it.
                if out_sent[b][rj] > acked {
                    acked = load(wg, ack_addr);
                    if out_sent[b][rj] > acked {
                        break;
                    }
                }
                let (first, len) = plan.piece_range(b, rj);
                let staged = SymArray::<T>::new(&heap, self.layout.stage(self.ring, slot), len);
                // SAFETY: the slot holds message g (its signal, raised after
                // the data, was seen with acquire) and the sender rewrites it
                // only after our acknowledgement below. This piece of the
                // output is this ring's alone, and no put reads it any more
                // (checked against the acknowledgements just above). The
                // input is only read.
                unsafe {
                    let st = staged.slice(0, len);
                    let out = output.slice_mut(first, len);
                    if rs < n_rs {
                        if self.in_place {
                            for (o, &x) in out.iter_mut().zip(st) {
                                *o = T::add(x, *o);
                            }
                        } else {
                            for ((o, &x), &y) in out.iter_mut().zip(st).zip(input.slice(first, len))
                            {
                                *o = T::add(x, y);
                            }
                        }
                    } else {
                        out.copy_from_slice(st);
                    }
                }
                wg.atomic_add::<u64>(ack_addr, 1, self.prev)?;
                nr += 1;
                rj += 1;
                skip_empty(&mut rs, &mut rj, &plan.recv_block);
                progressed = true;
            }
            if progressed {
                idle_since = None;
                spin.reset();
                continue;
            }
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if let Some(t) = self.timeout
                && now - since > t
            {
                return Err(self.stuck(wg, base_s + ns as u64, base_r + nr as u64, nr < mr, t));
            }
            // Polling words says nothing about the job failing: a blocking
            // no-op now and then returns the queue's abort (a dead peer) or
            // the rejection of an earlier put, instead of spinning on.
            if now - last_probe > PROBE_EVERY {
                wg.nop()?;
                last_probe = Instant::now();
            }
            spin.step();
        }
        count.sent += ms as u64;
        count.received += mr as u64;
        Ok(())
    }

    /// The report of a ring that made no progress for `timeout`: the
    /// receive it waits for (signal word, expected and found value), or the
    /// acknowledgement.
    fn stuck(
        &self,
        wg: &cpnet::WorkGroup,
        next_send: u64,
        next_recv: u64,
        receiving: bool,
        timeout: Duration,
    ) -> WgError {
        let k = self.layout.slots;
        let (op, addr, expected) = if receiving {
            (
                "allreduce ring receive (signal of the message from the previous PE's work-group)",
                self.layout.sig(self.ring, next_recv % k),
                next_recv + 1,
            )
        } else {
            (
                "allreduce ring send window (acknowledgement from the next PE's work-group)",
                self.layout.ack(self.ring),
                (next_send + 1).saturating_sub(k),
            )
        };
        WgError::WaitTimeout {
            my_pe: wg.my_pe(),
            wg: wg.wg(),
            op,
            addr,
            cmp: Cmp::Ge,
            expected: i128::from(expected),
            found: i128::from(load(wg, addr)),
            timeout,
        }
    }
}

/// The rings of this PE and their message counters, which live as long as
/// the symmetric words that count the same messages.
struct Rings {
    layout: Layout,
    rings: usize,
    /// `-min-ring-bytes`.
    min_ring_bytes: u64,
    counts: Vec<Mutex<RingCount>>,
}

impl Rings {
    /// Run `warmup + iters` allreduces of `count` elements on every ring
    /// (one work-group per ring) with the buffers of `layout`; returns
    /// seconds per timed allreduce on this PE.
    #[allow(clippy::too_many_arguments)]
    fn run<T: Elem>(
        &self,
        pe: &Pe,
        layout: &Layout,
        count: usize,
        in_place: bool,
        warmup: u32,
        iters: u32,
        piece: usize,
    ) -> anyhow::Result<f64> {
        let (me, n) = (pe.my_pe(), pe.n_pes());
        let plans: Vec<RingPlan> = (0..self.rings)
            .map(|i| RingPlan::new(count, self.rings, i, n as usize, me as usize, piece, min_seg_elems::<T>(self.min_ring_bytes)))
            .collect();
        let team = TeamBarrier::new(self.rings);
        let elapsed = Mutex::new(0.0f64);
        let timeout = pe.pe_info().wait_timeout;
        pe.run_work_groups(self.rings as u32, |wg| {
            let i = wg.wg() as usize;
            let plan = &plans[i];
            let ring = Ring {
                layout: *layout,
                plan,
                ring: i,
                in_place,
                prev: (me + n - 1) % n,
                next: (me + 1) % n,
                timeout,
            };
            let mut out_sent: Vec<Vec<u64>> =
                (0..n as usize).map(|b| vec![0; plan.pieces(b)]).collect();
            let mut count_i = *self.counts[i]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let r = (|| {
                for _ in 0..warmup {
                    ring.allreduce::<T>(wg, &mut count_i, &mut out_sent)?;
                }
                if !team.wait() {
                    return Ok(());
                }
                let t = Instant::now();
                for _ in 0..iters {
                    ring.allreduce::<T>(wg, &mut count_i, &mut out_sent)?;
                }
                if !team.wait() {
                    return Ok(());
                }
                if i == 0 {
                    *elapsed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) =
                        t.elapsed().as_secs_f64();
                }
                Ok(())
            })();
            *self.counts[i]
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = count_i;
            if r.is_err() {
                team.abort();
            }
            r
        })?;
        let e = elapsed
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(if iters > 0 { e / f64::from(iters) } else { 0.0 })
    }
}

/// `warmup + iters` allreduces of `count` elements through the library
/// (`-algo team`): work-group 0 calls `CpuCtx::reduce` (sum) over the world
/// team, from `layout.input` into `layout.output` (the same address in
/// place, which the library allows). Returns seconds per timed allreduce.
fn team_run<T: Elem>(pe: &Pe, layout: &Layout, count: usize, warmup: u32, iters: u32) -> anyhow::Result<f64> {
    let world = pe.team_world();
    let elapsed = Mutex::new(0.0f64);
    pe.run_work_groups(1, |wg| {
        let mut one = || wg.reduce::<T>(&world, ReduceOp::Sum, layout.output, layout.input, count as u64);
        for _ in 0..warmup {
            one()?;
        }
        let t = Instant::now();
        for _ in 0..iters {
            one()?;
        }
        *elapsed.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = t.elapsed().as_secs_f64();
        Ok(())
    })?;
    let e = elapsed.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(if iters > 0 { e / f64::from(iters) } else { 0.0 })
}

/// Fill the input with PE `me`'s values (and the output with poison when
/// out-of-place).
fn prepare<T: Elem>(pe: &Pe, layout: &Layout, count: usize, in_place: bool) {
    let me = pe.my_pe() as usize;
    let input = SymArray::<T>::new(pe.heap(), layout.input, count);
    // SAFETY: no work-group runs; no peer reads or writes this PE's input
    // or output (peers write only staging slots and words).
    let inp = unsafe { input.slice_mut(0, count) };
    for (i, x) in inp.iter_mut().enumerate() {
        *x = T::from_small(input_value(me, i));
    }
    if !in_place {
        let output = SymArray::<T>::new(pe.heap(), layout.output, count);
        // SAFETY: as above.
        unsafe { output.slice_mut(0, count) }.fill(T::poison());
    }
}

/// Elements of the result (at `layout.output`) that differ from the exact sum.
fn count_wrong<T: Elem>(pe: &Pe, layout: &Layout, count: usize) -> u64 {
    let out = SymArray::<T>::new(pe.heap(), layout.output, count);
    // SAFETY: the run is over on this PE; nothing writes its output now.
    wrong_elements(unsafe { out.slice(0, count) }, pe.n_pes() as usize)
}

fn sweep<T: Elem>(pe: &Pe, args: &Args, rings: &Rings) -> anyhow::Result<u64> {
    let piece = (args.chunk / size_of::<T>() as u64) as usize;
    sweep_with::<T>(
        pe.my_pe(),
        pe.n_pes(),
        args,
        |blob| Ok(pe.allgather_bytes(blob)?),
        |count, in_place| {
            let layout = rings.layout.for_run(in_place);
            let team = args.use_team((count * size_of::<T>()) as u64);
            let run = |warmup, iters| {
                if team {
                    team_run::<T>(pe, &layout, count, warmup, iters)
                } else {
                    rings.run::<T>(pe, &layout, count, in_place, warmup, iters, piece)
                }
            };
            prepare::<T>(pe, &layout, count, in_place);
            pe.barrier_all()?;
            let secs = run(args.warmup, args.iters)?;
            let mut wrong = 0;
            if args.check == 1 {
                prepare::<T>(pe, &layout, count, in_place);
                run(0, 1)?;
                wrong = count_wrong::<T>(pe, &layout, count);
            }
            Ok((secs, wrong))
        },
    )
}

/// The CPU variant's program (`-variant cpu`). **Collective.** Returns the
/// total `#wrong`.
///
/// # Errors
/// Init and run errors.
pub(super) fn run(args: &Args) -> anyhow::Result<u64> {
    let (pe, raised) = init_pe(|_| heap_need(args))?;
    let (me, n) = (pe.my_pe(), pe.n_pes());
    let (r, k) = (u64::from(args.wgs), u64::from(args.slots));
    let data = args.max_bytes.max(8);
    let input = pe.shmalloc(data)?;
    let output = pe.shmalloc(data)?;
    let staging = pe.shmalloc(r * k * args.chunk)?;
    let sigs = pe.shmalloc(r * Layout::sig_stride(k))?;
    let acks = pe.shmalloc(64 * r)?;
    pe.heap()
        .write_bytes(sigs, &vec![0; (r * Layout::sig_stride(k)) as usize])?;
    pe.heap().write_bytes(acks, &vec![0; (64 * r) as usize])?;
    let layout = Layout {
        input,
        output,
        staging,
        sigs,
        acks,
        slots: k,
        chunk: args.chunk,
    };
    let rings = Rings {
        layout,
        rings: args.wgs as usize,
        min_ring_bytes: args.min_ring_bytes,
        counts: (0..args.wgs).map(|_| Mutex::default()).collect(),
    };
    pe.barrier_all()?;
    if me == 0 {
        print_header(args, n, pe.provider(), raised);
    }
    let wrong = match args.dtype {
        DataType::Float => sweep::<f32>(&pe, args, &rings)?,
        DataType::Int32 => sweep::<i32>(&pe, args, &rings)?,
        DataType::Double => sweep::<f64>(&pe, args, &rings)?,
    };
    pe.finalize()?;
    Ok(wrong)
}

