//! [`Transport`] for [`FabricTransport`]: the service's calls (submit an
//! operation, progress the completion queue, barrier, quiet and the failure
//! reports); the endpoint, its set-up and the operation stages are in the
//! parent module.

use super::*;

impl Transport for FabricTransport {
    fn submit(&mut self, tag: Tag, op: &Op) -> Submit {
        let Some(pe) = op.pe() else { return Submit::Done(apply_local(&self.inner.region, op)) };
        if pe == self.inner.my_pe {
            return Submit::Done(apply_local(&self.inner.region, op));
        }
        // Zero bytes move nothing (and some providers never complete an
        // empty delivery-complete write): done at once; a put-signal goes
        // straight to its signal.
        let empty = op.size() == 0;
        if empty && !matches!(op, Op::PutSignal { .. }) {
            return Submit::Done(Outcome::Done);
        }
        if op.from_payload() {
            // Payload slots belong to GPU PEs' queues (staged transport).
            return Submit::Done(Outcome::Failed(ErrorCode::BadOp));
        }
        if let Some(b) = &mut self.batcher {
            let mem = self.inner.batch.as_ref().expect("a batcher has its memory");
            if let Op::Put { dst, src, size, .. } = op
                && b.takes(pe, *size)
            {
                return b.put(mem, &self.inner.ep, tag, op, (pe, *dst, *src, *size), &mut self.early);
            }
            // B6: behind the batches to `pe` opened before it (the first
            // refusal fixes which; later retries wait for the same one).
            let held = self.behind.iter().position(|&(t, _)| t == tag);
            let need = match held {
                Some(i) => Some(self.behind[i].1),
                None => b.order_behind(mem, &self.inner.ep, pe, &mut self.early),
            };
            match need {
                Some(seq) if b.acked(pe) < seq => {
                    if held.is_none() {
                        self.behind.push((tag, seq));
                    }
                    return Submit::Busy;
                }
                _ => {
                    if let Some(i) = held {
                        self.behind.swap_remove(i);
                    }
                }
            }
        }
        let Some(slot) = self.free.pop() else { return Submit::Busy };
        let stage = match op {
            Op::Amo { ty, op: AmoOp::Min | AmoOp::FetchMin, .. } if !self.min_native[*ty as usize - 1] => Stage::MinRead,
            Op::PutSignal { .. } if empty => Stage::Signal,
            Op::PutSignal { .. } => Stage::Data,
            _ => Stage::Single,
        };
        self.slots[slot as usize] = SlotState { stage, tag: Some(tag), op: Some(*op) };
        match self.post(slot) {
            Ok(Post::Posted) => {
                self.watch.sent(pe);
                Submit::Pending
            }
            Ok(Post::Again) => {
                self.watch.blocked(pe);
                self.release(slot);
                Submit::Busy
            }
            Err(e) => {
                tracing::error!(
                    "PE {}: posting {} to PE {pe} at heap+{:#x} failed ({}): {e}",
                    self.inner.my_pe,
                    op.name(),
                    op.addr(),
                    self.inner.provider
                );
                self.release(slot);
                Submit::Done(Outcome::Failed(fabric_code(&e)))
            }
        }
    }

    fn progress(&mut self, done: &mut Vec<Finished>) {
        done.append(&mut self.early);
        for _ in 0..4 {
            let mut buf = std::mem::take(&mut self.poll_buf);
            let r = self.inner.cq.poll(&mut buf);
            let n = match r {
                Ok(n) => n,
                Err(e) => {
                    match e.op_context() {
                        Some(ctx) if (ctx as usize) < self.slots.len() => self.fail(ctx as u32, &e, done),
                        Some(ctx) if ctx >= CTX_SEND && self.batcher.is_some() => {
                            let mem = self.inner.batch.as_ref().expect("a batcher has its memory");
                            self.batcher.as_mut().expect("checked").failed(mem, &self.inner.ep, ctx, &e, done);
                        }
                        _ => tracing::error!("PE {}: completion queue: {e}", self.inner.my_pe),
                    }
                    self.poll_buf = buf;
                    continue;
                }
            };
            for &ctx in &buf[..n] {
                if ctx >= CTX_SEND {
                    let mem = self.inner.batch.as_ref().expect("batch contexts come from a batcher");
                    self.batcher.as_mut().expect("batch contexts come from a batcher").completed(mem, &self.inner.ep, ctx);
                } else {
                    self.completed(ctx as u32, done);
                }
            }
            self.poll_buf = buf;
            if n < 64 {
                break;
            }
        }
        for _ in 0..self.deferred.len() {
            let Some(slot) = self.deferred.pop_front() else { break };
            self.post_or_defer(slot, done);
        }
        if let Some(b) = &mut self.batcher {
            let mem = self.inner.batch.as_ref().expect("a batcher has its memory");
            b.progress(mem, &self.inner.ep, done);
        }
    }

    fn end_pass(&mut self, waits: bool, done: &mut Vec<Finished>) {
        if let Some(b) = &mut self.batcher {
            let mem = self.inner.batch.as_ref().expect("a batcher has its memory");
            b.flush(mem, &self.inner.ep, waits, done);
        }
    }

    fn fatal(&mut self) -> Option<String> {
        let o = match self.watch.overdue() {
            Some(o) => Some(o),
            None => self.batcher.as_mut().and_then(|b| b.watch.overdue()),
        }?;
        // An operation of that peer still in flight, for the report.
        let batched = self.batcher.as_ref().and_then(|b| b.oldest(o.pe));
        let oldest = match self.slots.iter().filter_map(|s| s.op.as_ref()).find(|op| op.pe() == Some(o.pe)) {
            Some(op) => Some((op, String::new())),
            None => batched.as_ref().map(|(op, n)| (op, format!(", in a batch of puts ({n} waiting)"))),
        };
        Some(unreachable_report(self.inner.my_pe, &o, &self.inner.granted.provider, oldest, &self.peer_addrs))
    }

    fn barrier(&mut self, start: bool) -> Result<bool, ErrorCode> {
        if self.n_pes <= 1 {
            return Ok(true);
        }
        if start {
            // Relaxed: barriers of one PE are sequential (barrier_all is
            // called by one work-group at a time), so the counter only needs
            // atomicity across this PE's service threads.
            self.barrier.epoch = self.barrier_epoch.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            self.barrier.round = 0;
            self.barrier.posted = false;
            self.barrier.failed = None;
        }
        loop {
            if let Some(code) = self.barrier.failed.take() {
                return Err(code);
            }
            if self.barrier.round == self.rounds {
                return Ok(true);
            }
            if !self.barrier.posted {
                let Some(slot) = self.free.pop() else { return Ok(false) };
                let peer = (self.inner.my_pe + (1 << self.barrier.round)) % self.n_pes;
                self.slots[slot as usize] = SlotState { stage: Stage::BarrierFlag(peer), tag: None, op: None };
                match self.post(slot) {
                    Ok(Post::Posted) => {
                        self.watch.sent(peer);
                        self.barrier.posted = true;
                    }
                    Ok(Post::Again) => {
                        self.watch.blocked(peer);
                        self.release(slot);
                        return Ok(false);
                    }
                    Err(e) => {
                        let mut sink = Vec::new();
                        self.fail(slot, &e, &mut sink);
                        continue;
                    }
                }
            }
            // Dissemination (Hensgen, Finkel, Manber 1988): in round r we
            // signal PE + 2^r and wait for PE - 2^r's signal. Flags only
            // grow, one per barrier, so ">= epoch" is this barrier's arrival.
            if self.load_flag(self.barrier.round) >= self.barrier.epoch {
                self.barrier.round += 1;
                self.barrier.posted = false;
            } else {
                return Ok(false);
            }
        }
    }
}
