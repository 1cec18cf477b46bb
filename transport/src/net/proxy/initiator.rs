//! This rank's ops in flight: control packets, rendezvous data (SEND, RECV), and one-sided
//! ops on other ranks' windows (PUT, PUT_SIGNAL, GET, AMO), from start to completion.
//!
//! A one-sided op is an active message to the target's proxy ([`AmRequest`]): a PUT's
//! data rides in the request when small, else follows as a transfer under a one-sided
//! data tag; a GET's data comes back in the reply when small, else as a transfer the
//! initiator receives. The target replies once the data is written (and a PUT_SIGNAL's
//! signal after it) or read: the op completes only at the reply, so a quiet means
//! "visible at the target". An AMO is a request the target's proxy applies to the word
//! (`target.rs` says how it stays atomic); its reply carries the old value, which goes to
//! the packet's result address (if any) as a small GET's data would, before the op
//! completes.

use gpulmt_protocols::gio::{FailureKind, Flags, Op as PacketOp, OpFailure};
use gpulmt_protocols::Rank;

use super::net::Owner;
use super::take::{Held, Start};
use super::target::REPLY_TARGET_FAILED;
use super::Proxy;
use crate::device::{CopyTicket, MemoryKind};
use crate::net::iface::{Arrival, NetFail};
use crate::net::stream::{Dir, Place, Stream, StreamError, NET_LANE};
use crate::net::wire::{self, AmKind, AmReply, AmRequest, AM_INLINE};

/// A GET whose data comes inline in the reply.
struct InlineGet {
    dst: usize,
    size: usize,
    kind: MemoryKind,
    /// The host-to-device copy of the reply's bytes into device memory, and the bytes.
    copy: Option<(CopyTicket, Vec<u8>)>,
}

/// A PUT, PUT_SIGNAL or GET in flight.
struct OneSided {
    /// The request message (kept while on the wire), and its network operation then.
    _msg: Vec<u8>,
    req: Option<u64>,
    /// The data transfer (a large PUT's out, a large GET's in).
    data: Option<Stream>,
    replied: bool,
    inline_get: Option<InlineGet>,
}

enum Body {
    /// An enveloped control packet, and its network operation while on the wire.
    Ctrl {
        _msg: Vec<u8>,
        req: Option<u64>,
    },
    Data(Stream),
    OneSided(OneSided),
}

/// One of this rank's ops in flight.
pub(super) struct Op {
    pub queue: usize,
    pub seq: u64,
    peer: Rank,
    body: Body,
    /// The first thing that went wrong; the op completes with it.
    failure: Option<(OpFailure, String)>,
}

fn stream_failure(e: &StreamError) -> OpFailure {
    match e {
        StreamError::Net(f) => OpFailure::net(f.code()),
        StreamError::Copy(_) | StreamError::Size { .. } => OpFailure::net(-1),
        StreamError::Cancelled => OpFailure::cancelled(),
    }
}

impl Op {
    fn fail(&mut self, failure: OpFailure, text: String) {
        if self.failure.is_none() {
            self.failure = Some((failure, text));
        }
    }

    fn finished(&self) -> bool {
        match &self.body {
            Body::Ctrl { req, .. } => req.is_none(),
            Body::Data(s) => s.finished().is_some(),
            Body::OneSided(o) => {
                o.req.is_none()
                    && o.data.as_ref().is_none_or(|s| s.finished().is_some())
                    && o.inline_get.as_ref().is_none_or(|g| g.copy.is_none())
                    && (o.replied || self.failure.is_some())
            }
        }
    }

    fn stream(&mut self) -> Option<&mut Stream> {
        match &mut self.body {
            Body::Data(s) => Some(s),
            Body::OneSided(o) => o.data.as_mut(),
            Body::Ctrl { .. } => None,
        }
    }
}

impl Proxy {
    fn insert_op(&mut self, key: u64, qi: usize, held: &Held, body: Body) -> Start {
        let op = Op { queue: qi, seq: held.seq, peer: held.template.rank, body, failure: None };
        self.ops.insert(key, op);
        Start::Accepted
    }

    fn rank_failed(&self, rank: Rank) {
        self.shared.failed_ranks.put_unique(rank);
    }

    /// A control packet: enveloped with its sequence number to that rank, sent. The
    /// message moves into the op (it must outlive the send); a refused one stays held.
    pub(super) fn start_ctrl(&mut self, qi: usize, held: &mut Held) -> Start {
        let rank = held.template.rank;
        let mut msg = held.ctrl.take().expect("a held CTRL keeps its message");
        wire::ctrl_seal(&mut msg, self.ctrl_out.get(&rank).copied().unwrap_or(0));
        let key = self.new_key();
        match self.net.send(Owner::Message { key }, rank, wire::CTRL_TAG, &msg) {
            Ok(Some(req)) => {
                // Counted only once accepted: the receiver waits for every number in turn.
                *self.ctrl_out.entry(rank).or_default() += 1;
                self.insert_op(key, qi, held, Body::Ctrl { _msg: msg, req: Some(req) })
            }
            Ok(None) => {
                held.ctrl = Some(msg);
                Start::Refused
            }
            Err(e) => {
                self.rank_failed(rank);
                Start::Failed(OpFailure::net(e.code()), format!("sending a control packet to rank {rank}: {e}"))
            }
        }
    }

    /// The data of a rendezvous, sent or received under the transfer's tag.
    pub(super) fn start_data(&mut self, qi: usize, held: &Held) -> Start {
        let (dir, addr, size, tag) = match held.packet.op {
            PacketOp::Send { src, size, tag } => (Dir::Send, src, size, tag),
            PacketOp::Recv { dst, size, tag } => (Dir::Recv, dst, size, tag),
            _ => unreachable!("start_data takes SEND and RECV"),
        };
        // A drain's data goes nowhere: no address to check.
        let place = if held.packet.flags.contains(Flags::DISCARD) {
            Place::Discard
        } else {
            match self.net.place(held.packet.op.code(), addr, size) {
                Ok((p, _)) => p,
                Err(bad) => return Start::Failed(OpFailure::bad_packet(&bad), bad.to_string()),
            }
        };
        let (rank, tag) = (held.template.rank, self.net.tags.rendezvous(tag));
        // SAFETY: the producer's post (OffNodePath::post_send / post_recv) keeps the range
        // valid, in the memory `place` found, until the op is reported done, which waits
        // for the stream to finish.
        let mut stream = unsafe { Stream::new(dir, rank, tag, addr as usize, size, place, self.net.pipe) };
        let key = self.new_key();
        self.net.with_io(key, |io| stream.advance(io));
        if !stream.accepted() {
            return Start::Refused;
        }
        self.insert_op(key, qi, held, Body::Data(stream))
    }

    /// A PUT or PUT_SIGNAL: the request (with the data if small), then the data.
    pub(super) fn start_put(&mut self, qi: usize, held: &Held) -> Start {
        let (src, offset, size, kind) = match held.packet.op {
            PacketOp::Put { src, dst_offset, size } => (src, dst_offset, size, AmKind::Put),
            PacketOp::PutSignal { src, dst_offset, size, signal_offset, signal_value, signal_op } => {
                (src, dst_offset, size, AmKind::PutSignal { signal_offset, signal_value, signal_op })
            }
            _ => unreachable!("start_put takes PUT and PUT_SIGNAL"),
        };
        // A PUT_SIGNAL of no data (a device's signal op) names no source (0): nothing to
        // look up.
        let found = match size {
            0 => Ok((self.net.place_of(MemoryKind::Host), MemoryKind::Host)),
            _ => self.net.place(held.packet.op.code(), src, size),
        };
        let (place, mem) = match found {
            Ok(p) => p,
            Err(bad) => return Start::Failed(OpFailure::bad_packet(&bad), bad.to_string()),
        };
        // Small data travels inside the request, from device memory too: staged as a
        // transfer of its own, each put of a few bytes took a 1 MiB bounce buffer at both
        // ends (pools past their cap grow for transfers that hold none: SpTS's put per
        // value grew them to about 1400 buffers a rank, each a pinned allocation) and a
        // data message of its own.
        let inline = size as usize <= AM_INLINE;
        let window = held.template.window.expect("the template check gives one-sided ops a window");
        let data_tag = self.net.tags.one_sided(self.one_sided_next);
        let key = self.new_key();
        let am = AmRequest { kind, op: key, window: window.id, offset, size, data_tag, inline };
        let mut msg = Vec::new();
        let from_device;
        let data: &[u8] = match (inline, size, mem) {
            (true, 1.., MemoryKind::Host) => {
                // SAFETY: the producer's post keeps src..src+size readable host memory
                // (checked host just above) until the op completes.
                unsafe { std::slice::from_raw_parts(src as *const u8, size as usize) }
            }
            (true, 1.., MemoryKind::Device(dev)) => {
                // SAFETY: src..src+size is device memory the producer keeps readable until
                // the op completes (checked device just above); the call waits for its copy.
                match unsafe { self.net.bounce.copy_out_small(dev, src as usize, size as usize) } {
                    Ok(bytes) => from_device = bytes,
                    Err(e) => {
                        return Start::Failed(
                            OpFailure::net(-1),
                            format!("copying a put's {size} bytes from the device: {e}"),
                        )
                    }
                }
                &from_device
            }
            _ => &[],
        };
        am.encode(data, &mut msg);
        self.one_sided(key, qi, held, msg, (!inline).then_some((Dir::Send, src, size, place, data_tag)), None)
    }

    /// A GET: the request, and (if large) the receive of its data.
    pub(super) fn start_get(&mut self, qi: usize, held: &Held) -> Start {
        let PacketOp::Get { dst, src_offset, size } = held.packet.op else { unreachable!("start_get takes GET") };
        let (place, kind) = match self.net.place(held.packet.op.code(), dst, size) {
            Ok(p) => p,
            Err(bad) => return Start::Failed(OpFailure::bad_packet(&bad), bad.to_string()),
        };
        let inline = size as usize <= AM_INLINE;
        let window = held.template.window.expect("the template check gives one-sided ops a window");
        let data_tag = self.net.tags.one_sided(self.one_sided_next);
        let key = self.new_key();
        let am =
            AmRequest { kind: AmKind::Get, op: key, window: window.id, offset: src_offset, size, data_tag, inline };
        let mut msg = Vec::new();
        am.encode(&[], &mut msg);
        let inline_get = inline.then_some(InlineGet { dst: dst as usize, size: size as usize, kind, copy: None });
        self.one_sided(key, qi, held, msg, (!inline).then_some((Dir::Recv, dst, size, place, data_tag)), inline_get)
    }

    /// An AMO: the request; the reply's old value goes to `result` (0: nowhere).
    pub(super) fn start_amo(&mut self, qi: usize, held: &Held) -> Start {
        let PacketOp::Amo { amo, offset, operand, compare, result } = held.packet.op else {
            unreachable!("start_amo takes AMO")
        };
        let inline_get = match result {
            0 => None,
            r => match self.net.place(held.packet.op.code(), r, 8) {
                Ok((_, kind)) => Some(InlineGet { dst: r as usize, size: 8, kind, copy: None }),
                Err(bad) => return Start::Failed(OpFailure::bad_packet(&bad), bad.to_string()),
            },
        };
        let window = held.template.window.expect("the template check gives one-sided ops a window");
        let key = self.new_key();
        let kind = AmKind::Amo { amo, operand, compare };
        let am = AmRequest { kind, op: key, window: window.id, offset, size: 8, data_tag: 0, inline: false };
        let mut msg = Vec::new();
        am.encode(&[], &mut msg);
        self.one_sided(key, qi, held, msg, None, inline_get)
    }

    /// Sends a one-sided request and starts its data transfer, if it has one.
    fn one_sided(
        &mut self,
        key: u64,
        qi: usize,
        held: &Held,
        msg: Vec<u8>,
        data: Option<(Dir, u64, u64, crate::net::stream::Place, i32)>,
        inline_get: Option<InlineGet>,
    ) -> Start {
        let rank = held.template.rank;
        let req = match self.net.send(Owner::Message { key }, rank, wire::AM_TAG, &msg) {
            Ok(Some(req)) => req,
            Ok(None) => return Start::Refused,
            Err(e) => {
                return Start::Failed(
                    OpFailure::net(e.code()),
                    format!("sending a one-sided request to rank {rank}: {e}"),
                )
            }
        };
        let data = data.map(|(dir, addr, size, place, tag)| {
            self.one_sided_next += 1;
            // SAFETY: the producer's post keeps the local range valid in the memory
            // `place` found until the op completes, which waits for the stream.
            let mut s = unsafe { Stream::new(dir, rank, tag, addr as usize, size, place, self.net.pipe) };
            self.net.with_io(key, |io| s.advance(io));
            s
        });
        let body = Body::OneSided(OneSided { _msg: msg, req: Some(req), data, replied: false, inline_get });
        self.insert_op(key, qi, held, body)
    }

    /// The network reported op `key`'s single message (a control packet, a request).
    pub(super) fn on_message(&mut self, key: u64, result: Result<Arrival, NetFail>) {
        let Some(op) = self.ops.get_mut(&key) else { return };
        let peer = op.peer;
        let failed = result.err();
        match &mut op.body {
            Body::Ctrl { req, .. } => *req = None,
            Body::OneSided(o) => o.req = None,
            Body::Data(_) => unreachable!("data ops send pieces only"),
        }
        if let Some(e) = failed {
            op.fail(OpFailure::net(e.code()), format!("sending to rank {peer}: {e}"));
            if let Some(s) = op.stream() {
                // The target never saw the request: nobody will take or send the data.
                s.fail(StreamError::Net(e), &mut *self.net.iface);
            }
            if matches!(op.body, Body::Ctrl { .. }) {
                self.rank_failed(peer);
            }
        }
        self.finish_if_done(key);
    }

    /// The network reported piece `piece` of op (or target op) `key`.
    pub(super) fn on_piece(&mut self, key: u64, piece: u64, result: Result<Arrival, NetFail>) {
        if let Some(s) = self.ops.get_mut(&key).and_then(Op::stream) {
            self.net.with_io(key, |io| s.on_wire(piece, result, io));
            self.finish_if_done(key);
        } else if let Some(s) = self.targets.get_mut(&key).and_then(|t| t.data.as_mut()) {
            self.net.with_io(key, |io| s.on_wire(piece, result, io));
        } else {
            tracing::error!(key, piece, "GIO proxy: a piece's completion for no transfer");
        }
    }

    /// A reply to one of this rank's one-sided requests.
    pub(super) fn on_reply(&mut self, source: Rank, msg: &[u8]) {
        let Some((reply, inline)) = AmReply::decode(msg) else {
            return tracing::error!(source, len = msg.len(), "GIO proxy: malformed one-sided reply dropped");
        };
        let Some(op) = self.ops.get_mut(&reply.op).filter(|op| op.peer == source) else {
            // An op cancelled and completed already; its reply comes late.
            return tracing::debug!(source, op = reply.op, "GIO proxy: reply for no op in flight");
        };
        let Body::OneSided(o) = &mut op.body else {
            return tracing::error!(source, op = reply.op, "GIO proxy: reply for an op that is not one-sided");
        };
        o.replied = true;
        if reply.status != 0 {
            let (failure, text) = match reply.status {
                REPLY_TARGET_FAILED => {
                    (OpFailure::net(-1), format!("rank {source}'s proxy could not move the data of the one-sided op"))
                }
                code => (
                    OpFailure { kind: FailureKind::BadPacket, detail: code },
                    format!("rank {source} refused the one-sided op (bad packet kind {code}: no such window, or outside it)"),
                ),
            };
            if let Some(s) = o.data.as_mut() {
                s.fail(StreamError::Cancelled, &mut *self.net.iface);
            }
            op.fail(failure, text);
        } else if let Some(g) = o.inline_get.as_mut() {
            if inline.len() != g.size {
                let text = format!("rank {source} returned {} bytes for a GET of {}", inline.len(), g.size);
                op.fail(OpFailure::net(-1), text);
            } else if let (MemoryKind::Device(dev), 1..) = (g.kind, g.size) {
                let bytes = inline.to_vec();
                // SAFETY: the producer's post keeps dst..dst+size writable device memory
                // (its allocation checked when the op started) until the op completes,
                // which waits for this copy; `bytes` is held with it.
                match unsafe { self.net.backend.copy_async(dev, NET_LANE, g.dst, bytes.as_ptr() as usize, g.size) } {
                    Ok(t) => g.copy = Some((t, bytes)),
                    Err(e) => op.fail(OpFailure::net(-1), format!("copying a GET's data to the device: {e}")),
                }
            } else if g.size > 0 {
                // SAFETY: the producer's post keeps dst..dst+size writable host memory
                // until the op completes; `inline` holds exactly size bytes.
                unsafe { std::ptr::copy_nonoverlapping(inline.as_ptr(), g.dst as *mut u8, g.size) };
            }
        }
        self.finish_if_done(reply.op);
    }

    /// Advances every op's transfer and copies; completes those finished.
    pub(super) fn advance_ops(&mut self) -> bool {
        let mut work = false;
        let keys: Vec<u64> = self.ops.keys().copied().collect();
        for key in keys {
            let Some(op) = self.ops.get_mut(&key) else { continue };
            if let Body::OneSided(OneSided { inline_get: Some(g), .. }) = &mut op.body {
                if let Some((t, _)) = &g.copy {
                    match self.net.backend.copy_poll(*t) {
                        Ok(false) => {}
                        Ok(true) => g.copy = None,
                        Err(e) => {
                            g.copy = None;
                            op.fail(OpFailure::net(-1), format!("copying a GET's data to the device: {e}"));
                        }
                    }
                }
            }
            if let Some(s) = op.stream() {
                work |= self.net.with_io(key, |io| s.advance(io));
            }
            work |= self.finish_if_done(key);
        }
        work
    }

    /// Completes op `key` if every part of it has stopped; true if it did.
    fn finish_if_done(&mut self, key: u64) -> bool {
        if !self.ops.get(&key).is_some_and(Op::finished) {
            return false;
        }
        let mut op = self.ops.remove(&key).expect("checked above");
        if let Some(Some(Err(e))) = op.stream().map(|s| s.finished()) {
            op.fail(stream_failure(&e), format!("data transfer with rank {}: {e}", op.peer));
        }
        self.queues[op.queue].gate.on_complete(op.peer);
        self.complete(op.queue, op.seq, op.failure.map_or(Ok(()), Err));
        true
    }

    fn cancel(op: &mut Op, net: &mut super::Net, why: &str) {
        op.fail(OpFailure::cancelled(), why.to_string());
        match &mut op.body {
            Body::Ctrl { req: Some(r), .. } => net.iface.ep_cancel(*r),
            Body::Ctrl { req: None, .. } => {}
            Body::Data(s) => s.fail(StreamError::Cancelled, &mut *net.iface),
            Body::OneSided(o) => {
                if let Some(r) = o.req {
                    net.iface.ep_cancel(r);
                }
                if let Some(s) = o.data.as_mut() {
                    s.fail(StreamError::Cancelled, &mut *net.iface);
                }
            }
        }
    }

    /// Ends op `seq` of queue `qi` soon (the context gave up on it).
    pub(super) fn cancel_op(&mut self, qi: usize, seq: u64) {
        let found = self.ops.iter_mut().find(|(_, op)| op.queue == qi && op.seq == seq);
        match found {
            Some((&key, op)) => {
                Self::cancel(op, &mut self.net, "cancelled: its request failed first");
                self.finish_if_done(key);
            }
            // Not started yet (still in its slot, or held by a fence): it fails when it
            // would start. One that completed already is not pending.
            None if self.queues[qi].tracker.pending(seq) => {
                self.cancels.insert((qi, seq));
            }
            None => {}
        }
    }

    /// Shutdown past its deadline: cancels every op, fails what is held or not taken.
    pub(super) fn cancel_all(&mut self) {
        let keys: Vec<u64> = self.ops.keys().copied().collect();
        for key in &keys {
            if let Some(op) = self.ops.get_mut(key) {
                Self::cancel(op, &mut self.net, "cancelled at shutdown: still in flight at the drain deadline");
            }
        }
        for key in keys {
            self.finish_if_done(key);
        }
        self.cancel_targets();
        for qi in 0..self.queues.len() {
            for (_, held) in self.queues[qi].gate.take_held() {
                let text = "cancelled at shutdown: held by a fence at the drain deadline".to_string();
                self.complete(qi, held.seq, Err((OpFailure::cancelled(), text)));
            }
            if !self.queues[qi].dead {
                let (head, tail) = (self.queues[qi].consumer.head(), self.queues[qi].mem.load_tail());
                self.fail_queue(qi, head, tail, crate::net::queue::QueueState::Closed);
            }
        }
    }
}
