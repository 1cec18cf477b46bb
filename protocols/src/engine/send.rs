//! The sender's side of a message: posting it (eager inline, an RTS, or a push into
//! the receiver's RTR offer), answering the receiver's CTS with PUT or COOPERATE copies,
//! a place in the SHM ring or (to another node) a network send, and ending the send on
//! DONE, COOKIE, ABORT, its last copy or its network transfer.
//!
//! A rendezvous send is tracked ([`SendXfer`]) from its RTS until no engine reads its
//! buffer any more. Its request may complete before that (SHM completes it once every
//! chunk is staged), but never while a copy still reads the buffer.

use crate::policy::Protocol;
use crate::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet, Region};
use crate::{MsgId, NetId, ProtoError, Rank, ReqId, Tag};

use super::copies::OpOwner;
use super::shm::{ShmState, StagedChunk};
use super::{Action, BufDesc, CopyEngine, Engine, Loc, Status};

/// A rendezvous send in progress.
#[derive(Debug)]
pub(super) struct SendXfer {
    pub(super) req: ReqId,
    pub(super) to: Rank,
    tag: Tag,
    pub(super) buf: BufDesc,
    pub(super) proto: Option<Protocol>,
    /// Copies this side started and that have not finished.
    pub(super) pending: u32,
    /// COOPERATE: the receiver's COOKIE arrived.
    cookie: bool,
    /// The user request was completed (SHM completes it before the ring drains).
    completed: bool,
    pub(super) shm: Option<ShmState>,
    /// NET: the network send, while outstanding (also counted in `pending`).
    pub(super) net: Option<NetId>,
    /// NET: the data left with the RTS, without a CTS (counted in `pushed_sends`).
    pub(super) pushed: bool,
    pub(super) error: Option<ProtoError>,
    /// PUT or COOPERATE that failed: ABORT(to receiver) goes once this side's copies into
    /// the receiver's buffer stop, not before (its receive waits for it: `fail_recv`).
    abort_at_end: bool,
    /// PUT: a copy could not map the receiver's buffer; once the copies stop, the
    /// message is staged instead (`fallback`).
    pub(super) unmapped: bool,
}

impl SendXfer {
    /// A rendezvous send of `buf`, its protocol `proto` when already known.
    pub(super) fn new(req: ReqId, to: Rank, tag: Tag, buf: BufDesc, proto: Option<Protocol>, pending: u32) -> Self {
        Self {
            req,
            to,
            tag,
            buf,
            proto,
            pending,
            cookie: false,
            abort_at_end: false,
            unmapped: false,
            completed: false,
            shm: None,
            net: None,
            pushed: false,
            error: None,
        }
    }
}

impl Engine {
    /// Eager send fast path: checks the destination and assigns the message id; the
    /// caller then sends `Packet::Eager { msg, tag, payload }` to `to` itself (in
    /// order with this engine's other packets to `to`) and the send is complete.
    pub fn send_eager(&mut self, to: Rank) -> Result<MsgId, ProtoError> {
        if to >= self.cfg.size {
            return Err(ProtoError::BadRank { rank: to, size: self.cfg.size });
        }
        if self.dead[to as usize] {
            return Err(ProtoError::PeerFailed { rank: to });
        }
        let msg = self.next_msg;
        self.next_msg += 1;
        self.rtr[to as usize].sent += 1;
        Ok(msg)
    }

    /// Posts a send of `buf` to `to` with `tag`: eager with `payload` (the buffer's
    /// bytes; the caller decides with [`is_eager_to`](Self::is_eager_to)), else a
    /// rendezvous (which a host that does its own matching may use at any size). A
    /// rendezvous to a rank of this node needs a device buffer's region; one to another
    /// node never sends it (see `net`).
    pub fn post_send(&mut self, req: ReqId, to: Rank, tag: Tag, buf: BufDesc, payload: Option<Vec<u8>>) {
        if to >= self.cfg.size {
            return self.complete(req, Err(ProtoError::BadRank { rank: to, size: self.cfg.size }));
        }
        if self.dead[to as usize] {
            return self.complete(req, Err(ProtoError::PeerFailed { rank: to }));
        }
        let msg = self.next_msg;
        self.next_msg += 1;
        if let Some(payload) = payload {
            if payload.len() as u64 != buf.len {
                let what = format!("eager payload of {} bytes for a {}-byte buffer", payload.len(), buf.len);
                return self.complete(req, Err(ProtoError::Unsupported { what }));
            }
            self.rtr[to as usize].sent += 1;
            self.send(to, Packet::Eager { msg, tag, payload });
            return self.complete(req, Ok(Status { source: to, tag, len: buf.len }));
        }
        if buf.len == 0 {
            let what = "a rendezvous needs a non-empty buffer: send empty messages eagerly".into();
            return self.complete(req, Err(ProtoError::Unsupported { what }));
        }
        let off_node = !self.cfg.is_on_node(to);
        let push = off_node && buf.len <= self.cfg.net_push_max && self.pushed_sends < self.cfg.net_push_sends;
        let src = match (buf.device, buf.region) {
            // Nothing of this rank is mapped on another node: the network moves the data.
            _ if off_node => MemDesc::Net { pushed: push },
            (None, _) => MemDesc::Host,
            (Some(_), Some(r)) => MemDesc::Device(r),
            // Memory of a kind no peer maps (the transport found its export impossible):
            // staged through shared memory like host memory.
            (Some(_), None) => MemDesc::Staged,
        };
        if buf.device.is_some() {
            self.rtr[to as usize].sends_device = true;
        }
        if let Some(offer) = self.take_rtr(to, tag, &buf) {
            return self.put_offered(req, msg, to, tag, buf, offer);
        }
        self.rtr[to as usize].sent += 1;
        self.sends_to[to as usize] += 1;
        let staged = buf.device.is_some();
        let mut x = SendXfer::new(req, to, tag, buf, None, 0);
        x.pushed = push;
        self.sends.insert(msg, x);
        let rts = Packet::Rts { msg, tag, len: buf.len, src };
        if !push {
            return self.send(to, rts);
        }
        // The transport posts both to the same rank in this order. Device data before
        // the RTS: its staging copy (a driver call, then the copy) is the longest step of
        // the transfer and waits for nothing, while the receiver posts its receive long
        // before the copied data can arrive. Host data after it: its first piece goes to
        // the network at once, and ahead of the RTS it would only delay the match.
        self.pushed_sends += 1;
        if staged {
            self.post_net_send(msg);
            self.send(to, rts);
        } else {
            self.send(to, rts);
            self.post_net_send(msg);
        }
    }

    /// The receiver chose PUT, COOPERATE, SHM or NET for `msg` (CTS): start this side's part.
    /// A CTS that does not fit the send fails it, and the receiver is told.
    pub(super) fn on_cts(&mut self, from: Rank, msg: MsgId, mode: CtsMode, dst: Option<Region>, split: u64) {
        let mode_fits = self.cts_mode_fits_peer(from, mode);
        let Some(s) = self.sends.get_mut(&msg) else {
            // Tell the receiver, whose request would otherwise wait for a DONE that
            // never comes (the RTS it answers was not ours: forged or stale).
            self.violation(from, format!("CTS for unknown message {msg}"));
            return self.send(from, Packet::Abort { msg, reason: AbortReason::BadRequest, dir: Dir::ToReceiver });
        };
        if s.to == from && s.proto == Some(Protocol::Coop) && mode == CtsMode::Shm && !s.cookie {
            // The receiver could not map this buffer for its part: the whole message is
            // staged once this side's part stopped (`fallback`).
            s.unmapped = true;
            s.cookie = true;
            return self.try_finish_send(msg);
        }
        if s.to != from || s.proto.is_some() {
            return self.violation(from, format!("CTS for message {msg} not awaiting one"));
        }
        let len = s.buf.len;
        let (req, dev) = (s.req, s.buf.device);
        let bad = |what: &str| format!("CTS {mode:?} for message {msg}: {what}");
        if !mode_fits {
            let what = bad("NET is the protocol with a rank on another node, and only with one");
            self.violation(from, what.clone());
            return self.fail_send(msg, ProtoError::Protocol { rank: from, what }, true);
        }
        match mode {
            CtsMode::Put | CtsMode::Coop => {
                let Some(region) = dst.filter(|r| r.covers(len)) else {
                    let what = bad("receiver region missing or smaller than the message");
                    self.violation(from, what.clone());
                    return self.fail_send(msg, ProtoError::Protocol { rank: from, what }, true);
                };
                let Some(dev) = dev else {
                    let what = bad("sender buffer is host memory");
                    self.violation(from, what.clone());
                    return self.fail_send(msg, ProtoError::Protocol { rank: from, what }, true);
                };
                if !self.cfg.can_access(dev, region.device) || region.node != self.cfg.node {
                    let what = bad("this device cannot reach the receiver's");
                    self.violation(from, what.clone());
                    return self.fail_send(msg, ProtoError::Protocol { rank: from, what }, true);
                }
                let end = if mode == CtsMode::Put { len } else { split };
                if end > len || (mode == CtsMode::Coop && end == 0) {
                    let what = bad("split outside the message");
                    self.violation(from, what.clone());
                    return self.fail_send(msg, ProtoError::Protocol { rank: from, what }, true);
                }
                let proto = if mode == CtsMode::Put { Protocol::Put } else { Protocol::Coop };
                let n = self.issue_range(
                    OpOwner::Send { msg, chunk: None },
                    CopyEngine::Device(dev),
                    |o| Loc::User { req, offset: o },
                    |o| Loc::Peer { peer: from, region, offset: o },
                    0,
                    end,
                );
                let s = self.sends.get_mut(&msg).expect("checked above");
                s.proto = Some(proto);
                s.pending += n;
            }
            CtsMode::Net => {
                if dst.is_some() {
                    let what = bad("a region for a rank on another node");
                    self.violation(from, what.clone());
                    return self.fail_send(msg, ProtoError::Protocol { rank: from, what }, true);
                }
                self.post_net_send(msg);
            }
            CtsMode::Shm => {
                s.proto = Some(Protocol::Shm);
                s.shm = Some(ShmState::new(len, self.cfg.chunk_size));
                self.shm_rings.entry(from).or_default().queue.push_back(msg);
                self.pump_shm(from);
            }
        }
    }

    /// COOPERATE: the receiver's part is done; the send ends once this side's is too.
    pub(super) fn on_cookie(&mut self, from: Rank, msg: MsgId) {
        match self.sends.get_mut(&msg) {
            Some(s) if s.to == from && s.proto == Some(Protocol::Coop) && !s.cookie => {
                s.cookie = true;
                self.try_finish_send(msg);
            }
            // Our failure crossed the receiver's finished part.
            _ if self.ended_sends.contains(&(from, msg)) => {}
            _ => self.violation(from, format!("COOKIE for unknown or non-cooperative message {msg}")),
        }
    }

    /// DONE to the sender ends a GET: the receiver pulled everything; our buffer is free.
    pub(super) fn on_done_to_sender(&mut self, from: Rank, msg: MsgId) {
        match self.sends.get_mut(&msg) {
            Some(s) if s.to == from && s.proto.is_none() => {
                s.proto = Some(Protocol::Get);
                self.finish_send(msg);
            }
            _ => self.violation(from, format!("DONE for message {msg} that awaits none")),
        }
    }

    /// The receiver gave the message up (it was truncated, a copy failed, or the RTS was
    /// refused).
    pub(super) fn on_abort_to_sender(&mut self, from: Rank, msg: MsgId, reason: AbortReason) {
        match self.sends.get(&msg) {
            Some(s) if s.to == from => {
                if reason == AbortReason::Truncated && s.proto.is_none() {
                    // MPI: the send succeeds; the receiver reports the truncation.
                    self.finish_send(msg);
                } else {
                    let err = ProtoError::Aborted { rank: from, reason: format!("{reason:?}") };
                    // A receiver that failed while this side writes into its buffer
                    // (COOPERATE) waits for word that the writing stopped.
                    if s.proto == Some(Protocol::Coop) {
                        self.sends.get_mut(&msg).expect("matched above").abort_at_end = true;
                    }
                    self.fail_send(msg, err, false);
                }
            }
            _ if self.ended_sends.contains(&(from, msg)) => {}
            _ => self.violation(from, format!("ABORT for unknown message {msg}")),
        }
    }

    /// A copy of send `msg` finished: a PUT or COOPERATE piece, or the fill of SHM chunk
    /// `chunk`.
    pub(super) fn on_send_copy_done(&mut self, msg: MsgId, chunk: Option<StagedChunk>, result: Result<(), String>) {
        let Some(s) = self.sends.get_mut(&msg) else { return };
        s.pending -= 1;
        if result.is_err() || s.error.is_some() {
            // A fill that will not be announced: the receiver never reads its slot.
            if let Some(c) = chunk {
                let to = s.to;
                self.free_slot(to, c.slot);
            }
        }
        if let Err(what) = result {
            return self.fail_send(msg, ProtoError::CopyFailed { what }, true);
        }
        let Some(s) = self.sends.get_mut(&msg) else { return };
        if s.error.is_some() {
            return self.try_finish_send(msg);
        }
        match chunk {
            Some(c) => self.on_chunk_filled(msg, c),
            None => self.try_finish_send(msg),
        }
    }

    /// PUT and COOPERATE senders finish when their copies are done (and, for
    /// COOPERATE, the receiver's COOKIE arrived); failed sends when no copy runs.
    pub(super) fn try_finish_send(&mut self, msg: MsgId) {
        let Some(s) = self.sends.get(&msg) else { return };
        if s.pending > 0 {
            return;
        }
        if s.error.is_some() {
            return self.finish_send(msg);
        }
        // A COOPERATE stages once the receiver's part ended too (COOKIE, or its CTS(shm)).
        if s.unmapped && (s.proto != Some(Protocol::Coop) || s.cookie) {
            return self.stage_put(msg);
        }
        let ready = match s.proto {
            Some(Protocol::Put) => true,
            Some(Protocol::Coop) => s.cookie,
            // MPI completed the receiver's side too: nothing to tell it.
            Some(Protocol::Net) => return self.finish_send(msg),
            _ => false,
        };
        if ready {
            let to = s.to;
            self.send(to, Packet::Done { msg, dir: Dir::ToReceiver });
            self.finish_send(msg);
        }
    }

    /// Completes the user's request of send `msg`, once (SHM completes it before the
    /// transfer ends, so this is called again at the end).
    pub(super) fn complete_send_request(&mut self, msg: MsgId) {
        let s = self.sends.get_mut(&msg).expect("live send");
        if s.completed {
            return;
        }
        s.completed = true;
        let (req, result) = match &s.error {
            Some(e) => (s.req, Err(e.clone())),
            None => (s.req, Ok(Status { source: s.to, tag: s.tag, len: s.buf.len })),
        };
        self.complete(req, result);
    }

    /// Ends a send: completes its request (with its error, if any) and releases its
    /// SHM ring, unless copies still run (it then ends at the last one).
    pub(super) fn finish_send(&mut self, msg: MsgId) {
        let Some(s) = self.sends.get(&msg) else { return };
        if s.pending > 0 {
            return;
        }
        self.complete_send_request(msg);
        let s = self.sends.remove(&msg).expect("live send");
        if s.abort_at_end && !self.dead[s.to as usize] {
            // This side's copies into the receiver's buffer stopped: it may end now.
            self.send(s.to, Packet::Abort { msg, reason: AbortReason::CopyFailed, dir: Dir::ToReceiver });
            self.ended_sends.remember((s.to, msg));
        }
        self.sends_to[s.to as usize] -= 1;
        if s.pushed {
            self.pushed_sends -= 1;
        }
        if s.proto == Some(Protocol::Net) && !self.dead[s.to as usize] {
            // MPI may complete our side before the receiver's fails; it then says so.
            self.ended_sends.remember((s.to, msg));
        }
        if s.proto == Some(Protocol::Shm) {
            if let Some(ring) = self.shm_rings.get_mut(&s.to) {
                ring.queue.retain(|m| *m != msg);
            }
        }
    }

    /// Fails send `msg` with `err` (the first error stands), telling the receiver if
    /// `notify`; it ends once its copies stop, and its network send, which it asks to end.
    pub(super) fn fail_send(&mut self, msg: MsgId, err: ProtoError, notify: bool) {
        let Some(s) = self.sends.get_mut(&msg) else { return };
        if s.error.is_none() {
            s.error = Some(err);
            let (to, net) = (s.to, s.net);
            if notify && matches!(s.proto, Some(Protocol::Put | Protocol::Coop)) {
                // The receiver ends its receive on the ABORT: not while copies of this
                // side may still write into its buffer (finish_send sends it).
                s.abort_at_end = true;
            } else if notify {
                self.send(to, Packet::Abort { msg, reason: AbortReason::CopyFailed, dir: Dir::ToReceiver });
            }
            if let Some(id) = net {
                self.emit(Action::NetCancel { id });
            }
        }
        self.finish_send(msg);
    }
}
