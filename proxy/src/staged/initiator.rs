//! The initiator's side of the staged transport: an operation of a local
//! work-group started on its path (this PE's heap, a peer's heap mapped by
//! CUDA IPC, or messages to a remote PE), its requests staged while credits
//! and buffers last, and its end once every request is answered.

use super::*;

impl StagedTransport {
    pub(super) fn start_op(&mut self, tag: Tag, op: &Op) -> Submit {
        if matches!(op, Op::Put { src: PutSrc::Payload, .. } | Op::PutSignal { src: PutSrc::Payload, .. }) {
            // The service locates payload slots (Service::set_payload);
            // one it could not place never gets here.
            return Submit::Done(Outcome::Failed(ErrorCode::BadOp));
        }
        let Some(i) = self.free_ops.pop() else { return Submit::Busy };
        let s = &mut self.ops[i as usize];
        s.generation = s.generation.wrapping_add(1);
        s.phase = Phase::Data;
        s.tag = Some(tag);
        s.op = Some(*op);
        s.chunks = 0;
        s.started = 0;
        s.outstanding = 0;
        s.error = None;
        s.value = 0;
        s.signal_msg = false;
        let pe = op.pe().expect("data operation");
        self.op_at[i as usize] = self.timing.then(std::time::Instant::now);
        let r = if pe == self.inner.my_pe {
            self.start_local(i, op)
        } else if let (Some(Some(peer)), false) = (self.inner.peer_heaps.get(pe as usize), matches!(op, Op::Amo { .. })) {
            self.start_peer(i, op, *peer)
        } else {
            self.start_remote(i, op)
        };
        match r {
            Ok(()) => Submit::Pending,
            Err(e) => {
                self.cuda_failed(&e);
                self.release_op(i);
                Submit::Done(Outcome::Failed(ErrorCode::Fabric))
            }
        }
    }

    pub(super) fn start_local(&mut self, i: u32, op: &Op) -> Result<(), CudaError> {
        let s = &mut self.ops[i as usize];
        s.outstanding = 1;
        match *op {
            Op::Put { dst, src, size, .. } | Op::PutSignal { dst, src, size, .. } => {
                let signal = match *op {
                    Op::PutSignal { sig, signal, op: sop, .. } => Some((sig, signal, sop)),
                    _ => None,
                };
                // A payload slot without a GPU mapping here (the proxy daemon
                // maps a PE's slots without registering them with CUDA) goes
                // by copy, not through the agent.
                if self.agent_sized(size) && !matches!(src, PutSrc::Host { dev: None, .. }) {
                    let rec = match src {
                        PutSrc::Heap(src) => put_rec(dst, size, Some(self.dev(src)), 0, signal),
                        PutSrc::Inline(bits) => put_rec(dst, size, None, bits, signal),
                        // The agent reads the payload slot through its GPU mapping.
                        PutSrc::Host { dev, .. } => put_rec(dst, size, dev, 0, signal),
                        PutSrc::Payload => unreachable!("refused in start_op"),
                    };
                    self.land(rec, After::LocalDone { op: i }, self.op_lane(i));
                    return Ok(());
                }
                self.local_put(i, dst, src, size)?;
                match signal {
                    Some((sig, signal, SignalOp::Set)) => {
                        // SAFETY: the op's own scratch word, not in any copy yet.
                        unsafe { self.scratch(i, 1).write(signal) };
                        // SAFETY: pinned scratch word kept until the event
                        // passes (the op holds it); sig is a decoder-checked
                        // heap offset.
                        unsafe { self.signal_set(sig, signal, self.scratch(i, 1).cast())? };
                    }
                    // The ADD runs in the agent after the data landed.
                    Some((sig, value, SignalOp::Add)) => return self.after(After::LocalThenAdd { op: i, sig, value }),
                    None => {}
                }
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Heap(dst), src, size, .. } => {
                if self.agent_sized(size) {
                    self.land(put_rec(dst, size, Some(self.dev(src)), 0, None), After::LocalDone { op: i }, self.op_lane(i));
                    return Ok(());
                }
                // SAFETY: decoder-checked heap ranges of this PE's heap.
                unsafe { self.inner.stream.dtod(self.dev(dst), self.dev(src), size as usize)? };
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Result, src, size, .. } => {
                // SAFETY: scratch word 2 is the op's; zeroed first so short
                // reads are zero-extended.
                unsafe { self.scratch(i, 2).write(0) };
                let to = self.staging_dev(self.scratch(i, 2).cast());
                self.land(copy_out_rec(src, size, to), After::LocalResult { op: i }, self.op_lane(i));
                Ok(())
            }
            Op::Amo { ty, op, dst, value, cond, .. } => {
                self.land_amo(AmoItem { ty, op, dst, value, cond, done: AmoDone::Local { op: i }, lane: self.op_lane(i) });
                Ok(())
            }
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => unreachable!("no data"),
        }
    }

    pub(super) fn local_put(&mut self, i: u32, dst: u64, src: PutSrc, size: u64) -> Result<(), CudaError> {
        if size == 0 {
            return Ok(());
        }
        match src {
            // SAFETY: decoder-checked heap ranges of this PE's heap.
            PutSrc::Heap(src) => unsafe { self.inner.stream.dtod(self.dev(dst), self.dev(src), size as usize) },
            PutSrc::Inline(bits) => {
                // SAFETY: the op's own scratch word.
                unsafe { self.scratch(i, 0).write(bits) };
                // SAFETY: pinned scratch word (size <= 8) kept until the event
                // passes; decoder-checked destination.
                unsafe { self.inner.stream.htod(self.dev(dst), self.scratch(i, 0).cast(), size as usize) }
            }
            // SAFETY: the command's payload slot, unchanged until the command
            // completes (cmd.h P0), which is after this copy's event: pinned
            // in process; in the proxy daemon pageable (not registered there),
            // which the driver stages before the call returns. Decoder-checked
            // destination.
            PutSrc::Host { host, .. } => unsafe { self.inner.stream.htod(self.dev(dst), host as *const u8, size as usize) },
            PutSrc::Payload => unreachable!("refused in start_op"),
        }
    }

    /// The peer path: `peer` is the target's heap mapped into this process.
    pub(super) fn start_peer(&mut self, i: u32, op: &Op, peer: u64) -> Result<(), CudaError> {
        let s = &mut self.ops[i as usize];
        s.outstanding = 1;
        s.chunks = 1;
        s.started = 1;
        match *op {
            Op::Put { dst, src, size, .. } | Op::PutSignal { dst, src, size, .. } => {
                if size > 0 {
                    match src {
                        // SAFETY: decoder-checked ranges of our heap and of
                        // the peer's (same size), mapped by CUDA IPC.
                        PutSrc::Heap(src) => unsafe { self.inner.stream.dtod(peer + dst, self.dev(src), size as usize)? },
                        PutSrc::Inline(bits) => {
                            // SAFETY: the op's own scratch word.
                            unsafe { self.scratch(i, 0).write(bits) };
                            // SAFETY: pinned word kept until the event passes;
                            // checked range in the mapped peer heap.
                            unsafe { self.inner.stream.htod(peer + dst, self.scratch(i, 0).cast(), size as usize)? };
                        }
                        // SAFETY: the command's pinned payload slot, unchanged
                        // until the command completes (after this copy's event,
                        // cmd.h P0); checked range in the mapped peer heap.
                        PutSrc::Host { host, .. } => unsafe { self.inner.stream.htod(peer + dst, host as *const u8, size as usize)? },
                        PutSrc::Payload => unreachable!("refused in start_op"),
                    }
                }
                if let Op::PutSignal { sig, signal, op: sop, .. } = *op {
                    match sop {
                        SignalOp::Set => {
                            // SAFETY: the op's own scratch word.
                            unsafe { self.scratch(i, 1).write(signal) };
                            // SAFETY: as above; after the data on the same
                            // stream, so the signal never overtakes it.
                            unsafe { self.inner.stream.htod(peer + sig, self.scratch(i, 1).cast(), 8)? };
                        }
                        // Atomic at the target: its executor, by message,
                        // once the data has landed.
                        SignalOp::Add => self.ops[i as usize].signal_msg = true,
                    }
                }
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Heap(dst), src, size, .. } => {
                // SAFETY: decoder-checked ranges (ours, and the mapped peer's).
                unsafe { self.inner.stream.dtod(self.dev(dst), peer + src, size as usize)? };
                self.after(After::LocalDone { op: i })
            }
            Op::Get { dst: GetDst::Result, src, size, .. } => {
                // SAFETY: the op's own scratch word, zeroed for short reads.
                unsafe { self.scratch(i, 2).write(0) };
                // SAFETY: pinned word (8 >= size) read after the event passes.
                unsafe { self.inner.stream.dtoh(self.scratch(i, 2).cast(), peer + src, size as usize)? };
                self.after(After::LocalResult { op: i })
            }
            Op::Amo { .. } | Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => unreachable!("not on the peer path"),
        }
    }

    /// Bytes per request of op `op` to `pe`: a zone slot for a put of heap
    /// data through the peer's zone, a message's chunk otherwise.
    pub(super) fn piece(&self, op: &Op, pe: i32) -> u64 {
        let zone_put = matches!(op, Op::Put { src: PutSrc::Heap(_), .. } | Op::PutSignal { src: PutSrc::Heap(_), .. })
            && self.peer_zones.get(pe as usize).is_some_and(Option::is_some);
        if zone_put { self.inner.cfg.slot as u64 } else { self.inner.cfg.chunk as u64 }
    }

    pub(super) fn start_remote(&mut self, i: u32, op: &Op) -> Result<(), CudaError> {
        let chunk = self.piece(op, op.pe().expect("data operation"));
        let s = &mut self.ops[i as usize];
        s.chunks = match *op {
            Op::Put { src: PutSrc::Heap(_), size, .. } | Op::PutSignal { src: PutSrc::Heap(_), size, .. } => {
                size.div_ceil(chunk).max(1) as u32
            }
            Op::Get { size, .. } => size.div_ceil(chunk).max(1) as u32,
            _ => 1,
        };
        s.signal_msg = s.chunks > 1 && matches!(op, Op::PutSignal { .. });
        self.to_stage.push_back(i);
        self.stage_all()
    }

    /// Start requests of the ops waiting in `to_stage`, in order, while
    /// credits and buffers last.
    pub(super) fn stage_all(&mut self) -> Result<(), CudaError> {
        while let Some(&i) = self.to_stage.front() {
            if !self.stage_one(i)? {
                break;
            }
            let s = self.ops[i as usize];
            if s.started >= s.chunks {
                self.to_stage.pop_front();
            }
        }
        Ok(())
    }

    /// Start the next request of op `i`; false when out of credits or buffers.
    pub(super) fn stage_one(&mut self, i: u32) -> Result<bool, CudaError> {
        let s = self.ops[i as usize];
        if s.started >= s.chunks {
            return Ok(true);
        }
        let op = s.op.expect("staged op");
        let pe = op.pe().expect("data op");
        if self.credits[pe as usize] == 0 {
            return Ok(false);
        }
        let chunk = self.piece(&op, pe);
        let k = u64::from(s.started);
        let tag = self.tag_of(i);
        // The receiver lands this op's records in the lane of our queue.
        let hint = lane_hint(self.op_lane(i));
        if s.phase == Phase::Signal {
            assert!(matches!(op, Op::PutSignal { .. }), "signal phase of a put-signal");
            let mut h = self.hdr(K_PUT);
            h.tag = tag;
            h.flags |= hint;
            h.add_signal(&op);
            self.send_small(pe, h, Some(i));
            self.credits[pe as usize] -= 1;
            self.watch.sent(pe);
            let s = &mut self.ops[i as usize];
            s.started += 1;
            s.outstanding += 1;
            return Ok(true);
        }
        match op {
            Op::Put { dst, src: PutSrc::Heap(src), size, .. } | Op::PutSignal { dst, src: PutSrc::Heap(src), size, .. }
                if self.peer_zones[pe as usize].is_some() =>
            {
                // The chunk goes by DMA (or the agent) into our slot of the
                // target's zone; the message is the header alone.
                let Some(sb) = self.free_small.pop() else { return Ok(false) };
                let Some(slot) = self.free_slots[pe as usize].pop() else {
                    self.free_small.push(sb);
                    return Ok(false);
                };
                let off = k * chunk;
                let len = (size - off.min(size)).min(chunk);
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.flags |= hint | F_SLOT;
                h.dst = dst + off;
                h.size = len;
                h.value = u64::from(slot);
                if s.chunks == 1 {
                    h.add_signal(&op);
                }
                Self::write_hdr(self.small_ptr(sb), &h);
                self.small_owner[sb as usize] = Some(i);
                let z = self.peer_zones[pe as usize].as_ref().expect("checked by the match guard");
                let (to_host, to_dev) = (z.host(slot), z.dev(slot));
                // SAFETY: our slot of the peer's zone (registered) is ours
                // until its ACK, which follows this copy and the send; the
                // source range is decoder-checked.
                unsafe { self.copy_out(src + off, len, to_host, to_dev, After::SendSmall { buf: sb, pe }, self.op_lane(i))? };
            }
            Op::Put { dst, src: PutSrc::Heap(src), size, .. } | Op::PutSignal { dst, src: PutSrc::Heap(src), size, .. } => {
                let Some(b) = self.free_big.pop() else { return Ok(false) };
                let off = k * chunk;
                let len = (size - off.min(size)).min(chunk);
                let last = s.started + 1 == s.chunks;
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.flags |= hint;
                h.dst = dst + off;
                h.size = len;
                if last && s.chunks == 1 {
                    h.add_signal(&op);
                }
                Self::write_hdr(self.big_ptr(b), &h);
                self.big_owner[b as usize] = Some(i);
                let send = After::Send { buf: b, len: HDR_BYTES + len as usize, pe };
                let (to_host, to_dev) = self.big_payload(b);
                // SAFETY: the big buffer is ours (popped) until its send
                // completes; the source range is decoder-checked.
                unsafe { self.copy_out(src + off, len, to_host, to_dev, send, self.op_lane(i))? };
            }
            Op::Put { dst, src: PutSrc::Host { host, .. }, size, .. }
            | Op::PutSignal { dst, src: PutSrc::Host { host, .. }, size, .. } => {
                // The work-group wrote the data into host memory (cmd.h P0):
                // no copy out of the GPU, sent at once, in one request
                // (Service::set_payload's slots are at most one chunk).
                let Some(b) = self.free_big.pop() else { return Ok(false) };
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.flags |= hint;
                h.dst = dst;
                h.size = size;
                h.add_signal(&op);
                Self::write_hdr(self.big_ptr(b), &h);
                self.big_owner[b as usize] = Some(i);
                // SAFETY: the payload slot holds `size` bytes, unchanged until
                // the command completes (P0), which is after this; big buffer
                // b is ours (popped) and holds HDR_BYTES + one chunk >= size.
                unsafe { std::ptr::copy_nonoverlapping(host as *const u8, self.big_ptr(b).add(HDR_BYTES), size as usize) };
                self.post_send(CTX_SEND_BIG | u64::from(b), HDR_BYTES + size as usize, pe);
            }
            Op::Put { src: PutSrc::Payload, .. } | Op::PutSignal { src: PutSrc::Payload, .. } => {
                unreachable!("refused in start_op")
            }
            Op::Put { dst, src: PutSrc::Inline(bits), size, .. }
            | Op::PutSignal { dst, src: PutSrc::Inline(bits), size, .. } => {
                let mut h = self.hdr(K_PUT);
                h.tag = tag;
                h.flags |= hint;
                h.dst = dst;
                h.size = size;
                h.flags |= F_INLINE;
                h.value = bits;
                h.add_signal(&op);
                self.send_small(pe, h, Some(i));
            }
            Op::Get { src, size, .. } => {
                let off = k * chunk;
                let len = (size - off.min(size)).min(chunk);
                let mut h = self.hdr(K_GET);
                h.tag = tag;
                h.flags |= hint;
                h.dst = src + off;
                h.size = len;
                h.value = off;
                self.send_small(pe, h, Some(i));
            }
            Op::Amo { ty, op: aop, dst, value, cond, .. } => {
                let mut h = self.hdr(K_AMO);
                h.tag = tag;
                h.flags |= hint;
                h.dst = dst;
                h.ty = ty as u8;
                h.sub = aop as u8;
                h.value = value;
                h.cond = cond;
                self.send_small(pe, h, Some(i));
            }
            Op::Nop | Op::Fence | Op::Quiet | Op::BarrierAll => unreachable!("no data"),
        }
        self.credits[pe as usize] -= 1;
        self.watch.sent(pe);
        let s = &mut self.ops[i as usize];
        s.started += 1;
        s.outstanding += 1;
        if s.started == 1
            && let Some(t) = self.op_at[i as usize]
        {
            StageClock::add(&mut self.clock.post, t);
        }
        Ok(true)
    }

    /// An answer (or local step) of op `i` finished; complete it when all did.
    pub(super) fn answered(&mut self, i: u32, done: &mut Vec<Finished>) {
        let s = &mut self.ops[i as usize];
        s.outstanding = s.outstanding.saturating_sub(1);
        self.maybe_finish(i, done);
    }

    pub(super) fn maybe_finish(&mut self, i: u32, done: &mut Vec<Finished>) {
        let s = self.ops[i as usize];
        if s.phase == Phase::Free || s.outstanding > 0 || s.started < s.chunks {
            return;
        }
        let op = s.op.expect("live op");
        // A put-signal with `signal_msg` sends its signal after its data
        // landed, as one more request (stage_one builds it in phase Signal).
        if s.error.is_none() && s.phase == Phase::Data && s.signal_msg {
            let st = &mut self.ops[i as usize];
            st.phase = Phase::Signal;
            st.chunks += 1;
            self.to_stage.push_back(i);
            return;
        }
        let outcome = match s.error {
            Some(code) => Outcome::Failed(code),
            None => match op {
                Op::Get { dst: GetDst::Result, .. } => Outcome::Value(s.value),
                Op::Amo { op: aop, .. } if aop.fetches() => Outcome::Value(s.value),
                _ => Outcome::Done,
            },
        };
        if let Some(tag) = s.tag {
            done.push(Finished { tag, outcome, op });
        }
        if op.pe() != Some(self.inner.my_pe)
            && let Some(t) = self.op_at[i as usize].take()
        {
            StageClock::add(&mut self.clock.answer, t);
        }
        self.release_op(i);
    }

    pub(super) fn release_op(&mut self, i: u32) {
        let s = &mut self.ops[i as usize];
        s.phase = Phase::Free;
        s.tag = None;
        s.op = None;
        self.free_ops.push(i);
    }
}
