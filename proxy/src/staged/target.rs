//! The target's side of the staged transport: a received message (a put
//! and its signal, an AMO, a get, a reply or an ACK to one of our own
//! operations, a barrier notice) acted on, its buffer reposted.

use super::*;

impl StagedTransport {
    /// A message arrived in receive buffer `r`.
    pub(super) fn on_recv(&mut self, r: u32, done: &mut Vec<Finished>) -> Result<(), CudaError> {
        let p = self.recv_ptr(r);
        let h = Self::read_hdr(p);
        if h.src_pe < 0 || h.src_pe >= self.inner.n_pes || h.src_pe == self.inner.my_pe {
            tracing::error!("PE {}: staged transport: message of kind {} from unknown PE {}", self.inner.my_pe, h.kind, h.src_pe);
            self.repost(r);
            return Ok(());
        }
        let heap = self.inner.heap.size;
        let in_heap = |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= heap);
        match h.kind {
            K_PUT => {
                let pe = h.src_pe;
                self.recv_at[r as usize] = self.timing.then(std::time::Instant::now);
                if self.timing {
                    let acc = if h.flags & F_INLINE != 0 { &mut self.clock.req_wire_small } else { &mut self.clock.req_wire_big };
                    StageClock::add_wire(acc, h.cond);
                }
                let sig_ok = h.flags & F_SIGNAL == 0 || (in_heap(h.sig, 8) && h.sig.is_multiple_of(8));
                let len_ok = if h.flags & F_INLINE != 0 {
                    h.size <= 8
                } else if h.flags & F_SLOT != 0 {
                    h.size <= self.inner.cfg.slot as u64
                } else {
                    h.size <= self.inner.cfg.chunk as u64
                };
                // The data is in slot `value` of the sender's zone section.
                let slot = (h.flags & F_SLOT != 0).then_some(h.value.min(u64::from(u32::MAX)) as u32);
                let slot_ok = match slot {
                    None => true,
                    Some(k) => h.flags & F_INLINE == 0 && self.inner.zone.as_ref().is_some_and(|z| k < z.slots()),
                };
                if !in_heap(h.dst, h.size) || !sig_ok || !len_ok || !slot_ok {
                    self.repost(r);
                    let code = if slot_ok { ErrorCode::BadAddr } else { ErrorCode::BadOp };
                    self.send_ack(pe, h.tag, slot, code as u64);
                    return Ok(());
                }
                // Where the payload is: our zone's slot, or after the header.
                let (data_host, data_dev) = match (slot, &self.inner.zone) {
                    (Some(k), Some(z)) => (z.host(pe, k).cast_const(), z.dev(pe, k)),
                    // SAFETY: the payload follows the header in the buffer.
                    _ => (unsafe { p.add(HDR_BYTES) }.cast_const(), self.staging_dev(unsafe { p.add(HDR_BYTES) })),
                };
                let signal = (h.flags & F_SIGNAL != 0)
                    .then(|| (h.sig, h.signal, SignalOp::from_u8(h.sub).unwrap_or(SignalOp::Set)));
                if h.flags & F_INLINE != 0 || self.agent_sized(h.size) {
                    let rec = if h.flags & F_INLINE != 0 {
                        put_rec(h.dst, h.size, None, h.value, signal)
                    } else {
                        put_rec(h.dst, h.size, Some(data_dev), 0, signal)
                    };
                    self.land(rec, After::Applied { recv: r, pe, tag: h.tag, sig: None, lane: msg_lane(&h), slot }, msg_lane(&h));
                    return Ok(());
                }
                if h.size > 0 && self.agent_parts(h.size) > 1 {
                    // Split over the lanes; the signal after the last part.
                    let after = After::Applied { recv: r, pe, tag: h.tag, sig: signal, lane: msg_lane(&h), slot };
                    let dst = h.dst;
                    self.land_split(h.size, msg_lane(&h), after, |lo, len| put_rec(dst + lo, len, Some(data_dev + lo), 0, None));
                    return Ok(());
                }
                if h.size > 0 {
                    let src = if h.flags & F_INLINE != 0 {
                        // SAFETY: the header's `value` field inside the buffer.
                        unsafe { p.add(std::mem::offset_of!(Hdr, value)) }.cast_const()
                    } else {
                        data_host
                    };
                    // SAFETY: the receive buffer (pinned) is not reposted, and
                    // the zone slot (registered) not reused (its ACK goes after
                    // this), until this copy's event passes; the range is
                    // checked above.
                    unsafe { self.inner.stream.htod(self.dev(h.dst), src, h.size as usize)? };
                }
                let mut sig = None;
                if h.flags & F_SIGNAL != 0 {
                    match SignalOp::from_u8(h.sub) {
                        Some(SignalOp::Add) => sig = Some((h.sig, h.signal, SignalOp::Add)),
                        _ => {
                            // SAFETY: the header's `signal` field, pinned, kept
                            // until the event passes; the word is checked above.
                            unsafe { self.signal_set(h.sig, h.signal, p.add(std::mem::offset_of!(Hdr, signal)))? };
                        }
                    }
                }
                self.after(After::Applied { recv: r, pe, tag: h.tag, sig, lane: msg_lane(&h), slot })?;
            }
            K_GET => {
                self.repost(r);
                if !in_heap(h.dst, h.size) || h.size > self.inner.cfg.chunk as u64 {
                    let mut a = self.hdr(K_GET_REPLY);
                    a.tag = h.tag;
                    a.cond = ErrorCode::BadAddr as u64;
                    self.send_small(h.src_pe, a, None);
                } else {
                    self.get_wait.push_back(h);
                    self.serve_gets()?;
                }
            }
            K_AMO => {
                self.repost(r);
                let (ty, op) = (AmoType::from_u8(h.ty), AmoOp::from_u8(h.sub));
                match (ty, op) {
                    (Some(ty), Some(op)) if in_heap(h.dst, ty.size()) && h.dst.is_multiple_of(ty.size()) => {
                        self.land_amo(AmoItem {
                            ty,
                            op,
                            dst: h.dst,
                            value: h.value,
                            cond: h.cond,
                            done: AmoDone::Reply { pe: h.src_pe, tag: h.tag },
                            lane: msg_lane(&h),
                        });
                    }
                    _ => {
                        let mut a = self.hdr(K_AMO_REPLY);
                        a.tag = h.tag;
                        a.cond = ErrorCode::BadAddr as u64;
                        self.send_small(h.src_pe, a, None);
                    }
                }
            }
            K_ACK | K_AMO_REPLY => {
                self.repost(r);
                if self.timing && h.kind == K_ACK {
                    StageClock::add_wire(&mut self.clock.ack_wire, h.value);
                }
                self.credits[h.src_pe as usize] += 1;
                self.watch.answered(h.src_pe);
                if h.kind == K_ACK && h.flags & F_SLOT != 0 && h.dst < u64::from(self.inner.cfg.slots) {
                    self.free_slots[h.src_pe as usize].push(h.dst as u32);
                }
                if let Some(i) = self.op_of(h.tag) {
                    if h.cond != 0 {
                        self.ops[i as usize].error.get_or_insert(ErrorCode::from_i32(h.cond as i32).unwrap_or(ErrorCode::Fabric));
                    }
                    if h.kind == K_AMO_REPLY {
                        self.ops[i as usize].value = h.value;
                    }
                    self.answered(i, done);
                }
            }
            K_GET_REPLY => {
                self.credits[h.src_pe as usize] += 1;
                self.watch.answered(h.src_pe);
                let Some(i) = self.op_of(h.tag) else {
                    self.repost(r);
                    return Ok(());
                };
                if h.cond != 0 {
                    self.repost(r);
                    self.ops[i as usize].error.get_or_insert(ErrorCode::from_i32(h.cond as i32).unwrap_or(ErrorCode::Fabric));
                    self.answered(i, done);
                    return Ok(());
                }
                match self.ops[i as usize].op {
                    Some(Op::Get { dst: GetDst::Result, size, .. }) => {
                        let mut b = [0u8; 8];
                        let n = (size as usize).min(8);
                        // SAFETY: the reply's payload follows its header; at
                        // most 8 bytes, inside the buffer.
                        unsafe { std::ptr::copy_nonoverlapping(p.add(HDR_BYTES), b.as_mut_ptr(), n) };
                        self.ops[i as usize].value = u64::from_le_bytes(b);
                        self.repost(r);
                        self.answered(i, done);
                    }
                    Some(Op::Get { dst: GetDst::Heap(dst), .. }) if self.agent_moves(h.size) => {
                        // SAFETY: the payload follows the header in the buffer.
                        let from = self.staging_dev(unsafe { p.add(HDR_BYTES) });
                        let to = dst + h.value;
                        let after = After::GetApplied { recv: r, op: i };
                        self.land_split(h.size, self.op_lane(i), after, |lo, len| put_rec(to + lo, len, Some(from + lo), 0, None));
                    }
                    Some(Op::Get { dst: GetDst::Heap(dst), .. }) => {
                        if h.size > 0 {
                            // SAFETY: pinned payload kept until the event
                            // passes (reposted then); the local range is inside
                            // the decoder-checked destination (offset h.value).
                            unsafe { self.inner.stream.htod(self.dev(dst + h.value), p.add(HDR_BYTES), h.size as usize)? };
                        }
                        self.after(After::GetApplied { recv: r, op: i })?;
                    }
                    _ => self.repost(r),
                }
            }
            K_BARRIER => {
                self.repost(r);
                if let Some(a) = self.inner.shared.arrived.get(h.dst as usize) {
                    // Release: pairs with the Acquire load in `barrier`, so the
                    // thread that sees the arrival sees this thread's earlier
                    // work (nothing more is needed: data completion is by ACK).
                    a.fetch_max(h.value, Ordering::AcqRel);
                }
            }
            other => {
                self.repost(r);
                tracing::error!("PE {}: staged transport: unknown message kind {other} from PE {}", self.inner.my_pe, h.src_pe);
            }
        }
        Ok(())
    }

    /// ACK request `tag` of `pe` with error `code` (0: none), giving back
    /// zone slot `slot` if its data came in one.
    pub(super) fn send_ack(&mut self, pe: i32, tag: u64, slot: Option<u32>, code: u64) {
        let mut a = self.hdr(K_ACK);
        a.tag = tag;
        a.cond = code;
        if let Some(k) = slot {
            a.flags |= F_SLOT;
            a.dst = u64::from(k);
        }
        self.send_small(pe, a, None);
    }

    pub(super) fn repost(&mut self, r: u32) {
        if let Err(e) = self.post_recv(r) {
            tracing::error!("PE {}: reposting a receive buffer: {e}", self.inner.my_pe);
        }
    }

    /// Serve waiting GET requests while send buffers last.
    pub(super) fn serve_gets(&mut self) -> Result<(), CudaError> {
        while let Some(h) = self.get_wait.front().copied() {
            let Some(b) = self.free_big.pop() else { break };
            self.get_wait.pop_front();
            let mut a = self.hdr(K_GET_REPLY);
            a.tag = h.tag;
            a.size = h.size;
            a.value = h.value;
            Self::write_hdr(self.big_ptr(b), &a);
            self.big_owner[b as usize] = None;
            let send = After::Send { buf: b, len: HDR_BYTES + h.size as usize, pe: h.src_pe };
            let (to_host, to_dev) = self.big_payload(b);
            // SAFETY: the big buffer is ours until its send completes; the
            // range was checked against the heap.
            unsafe { self.copy_out(h.dst, h.size, to_host, to_dev, send, msg_lane(&h))? };
        }
        Ok(())
    }
}
