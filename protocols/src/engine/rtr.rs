//! RTR, the receiver-initiated PUT: a receive offered to its sender before the message
//! exists, so that a small device message is pushed straight into it (no RTS, no CTS).
//!
//! The receiver offers a receive ([`Engine::offer_rtr`]) only where nothing else can
//! take the sender's next message first, and names that message by count. The sender
//! keeps offers per peer ([`RtrPeer`]), uses the one that names its next message, lets
//! stale ones go, and learns from offers that came just too late whether a send should
//! wait a moment for one (the credit and probe below). Cancelling an offered receive
//! goes through the sender (RTR_REVOKE, RTR_REVOKED), so a buffer is never written
//! after its receive ended.

use std::collections::VecDeque;

use crate::policy::{Protocol, ProtocolChoice};
use crate::wire::{AbortReason, Dir, Packet, Region};
use crate::{MsgId, ProtoError, Rank, ReqId, Tag};

use super::copies::OpOwner;
use super::recv::{PostedRecv, RecvXfer};
use super::send::SendXfer;
use super::{Action, BufDesc, CopyEngine, Engine, Loc};

/// A receive a peer offered by RTR, kept by the sender until used or stale.
#[derive(Clone, Copy, Debug)]
pub(super) struct RtrOffer {
    pub(super) recv: u64,
    pub(super) expect: u64,
    pub(super) tag: Tag,
    pub(super) len: u64,
    pub(super) dst: Region,
}

/// What this rank knows of one peer for RTR.
#[derive(Debug)]
pub(super) struct RtrPeer {
    /// Messages (eager, RTS, RTR_PUT) this rank sent the peer, and messages from it that
    /// arrived here: an RTR names the message it takes by this count.
    pub(super) sent: u64,
    pub(super) arrived: u64,
    /// Its RTRs this rank has not used yet, oldest first.
    pub(super) offers: VecDeque<RtrOffer>,
    /// Its last RTR named the message this rank had just sent without it (an RTS on its
    /// way): the next send may wait a moment for an offer
    /// ([`Engine::rtr_wait_begin`]).
    pub(super) late: bool,
    /// Waits for its offers left before sends stop waiting, and sends since the credit
    /// ran out (see [`RTR_WAIT_PROBE`]).
    pub(super) credit: u8,
    pub(super) probe: u32,
    /// The allocation (device, buffer id) of its last offer, which was mapped then: a
    /// ping-pong offers the same buffer every time, and one mapping request per
    /// allocation is enough (should the cache have closed it since, the push reopens it).
    pub(super) mapped: Option<(u32, u64)>,
    /// This rank has sent the peer device memory by rendezvous, so its offers are worth
    /// mapping (a rank that only sends it host memory never pushes into them).
    pub(super) sends_device: bool,
}

impl Default for RtrPeer {
    fn default() -> Self {
        Self {
            sent: 0,
            arrived: 0,
            offers: VecDeque::new(),
            late: false,
            credit: RTR_WAIT_CREDIT,
            probe: 0,
            mapped: None,
            sends_device: false,
        }
    }
}

/// A receive of ours offered to its sender by RTR, not matched yet.
#[derive(Clone, Copy, Debug)]
pub(super) struct Offered {
    pub(super) to: Rank,
    tag: Tag,
    /// Cancel was asked: RTR_REVOKE sent, RTR_REVOKED awaited.
    pub(super) cancelling: bool,
}

/// Most unused RTRs kept per peer; older ones are dropped (their messages then travel
/// as usual).
const RTR_OFFERS_KEPT: usize = 64;

/// Waits for late offers a peer may fail before sends to it stop waiting; each offer
/// used gives one back, up to this many.
const RTR_WAIT_CREDIT: u8 = 4;

/// Without credit, every this many sends that could wait for a late offer wait once
/// anyway, so that a peer whose offers come in time again is noticed.
const RTR_WAIT_PROBE: u32 = 64;

impl Engine {
    /// Offers a just-posted receive to its sender (RTR) where nothing can take the
    /// sender's next message first: one source and tag, no earlier posted receive for
    /// them, an exported device buffer. Returns the offer made, if any.
    pub(super) fn offer_rtr(
        &mut self,
        req: ReqId,
        source: Option<Rank>,
        tag: Option<Tag>,
        buf: &BufDesc,
    ) -> Option<Offered> {
        let (Some(from), Some(tag), Some(dst)) = (source, tag, buf.region) else { return None };
        if self.cfg.rtr_put_max == 0 || from == self.cfg.rank || buf.device.is_none() || buf.len == 0 {
            return None; // Nothing can push into it.
        }
        if !self.cfg.is_on_node(from) {
            return None; // Its region must not leave the node, and nothing there could map it.
        }
        if self.matcher.first_posted(from, tag) != Some(req) {
            return None;
        }
        let expect = self.rtr[from as usize].arrived;
        self.send(from, Packet::Rtr { recv: req.0, expect, tag, len: buf.len, dst });
        Some(Offered { to: from, tag, cancelling: false })
    }

    /// Whether a send of `buf` to `to` is of the kind an RTR can carry: device memory, not
    /// empty, at most `rtr_put_max` bytes, to another rank of this node. The transport
    /// looks for offers (and may wait for one) only for these.
    pub fn rtr_eligible(&self, to: Rank, buf: &BufDesc) -> bool {
        buf.device.is_some()
            && buf.len > 0
            && buf.len <= self.cfg.rtr_put_max
            && to != self.cfg.rank
            && self.cfg.is_on_node(to)
    }

    /// Whether an eligible send of `buf` with `tag` to `to` that finds no offer should
    /// wait a moment for one, taking packets meanwhile until [`rtr_ready`](Self::rtr_ready),
    /// and call [`rtr_wait_failed`](Self::rtr_wait_failed) if none comes: so when the
    /// peer's last offer came just too late and waiting has paid off lately. (A blocking
    /// ping-pong offers each receive only once its previous send completed, so the offer
    /// and the next send race.) Call once per send.
    pub fn rtr_wait_begin(&mut self, to: Rank, tag: Tag, buf: &BufDesc) -> bool {
        if !self.rtr_eligible(to, buf) || !self.rtr[to as usize].late || self.rtr_ready(to, tag, buf) {
            return false;
        }
        let p = &mut self.rtr[to as usize];
        if p.credit == 0 {
            p.probe += 1;
            if p.probe < RTR_WAIT_PROBE {
                return false;
            }
            p.probe = 0;
        }
        true
    }

    /// No offer came while the caller waited: it costs a credit, and no send waits again
    /// until an offer is late again.
    pub fn rtr_wait_failed(&mut self, to: Rank) {
        if let Some(p) = self.rtr.get_mut(to as usize) {
            p.late = false;
            p.credit = p.credit.saturating_sub(1);
        }
    }

    /// Whether the peer's oldest live offer fits this eligible send (it is then the front
    /// of its queue); drops stale offers (for messages already sent) on the way.
    pub fn rtr_ready(&mut self, to: Rank, tag: Tag, buf: &BufDesc) -> bool {
        let Some(dev) = buf.device else { return false };
        let p = &mut self.rtr[to as usize];
        while p.offers.front().is_some_and(|o| o.expect < p.sent) {
            p.offers.pop_front();
        }
        let p = &self.rtr[to as usize];
        p.offers.front().is_some_and(|o| {
            o.expect == p.sent && o.tag == tag && buf.len <= o.len && self.cfg.can_access(dev, o.dst.device)
                // An offered buffer this rank failed to map is never pushed into (`fallback`).
                && !self.is_unmappable(to, o.dst.buffer_id)
        })
    }

    /// The peer's RTR for the message this rank sends it next, if this send of `buf`
    /// with `tag` can use it.
    pub(super) fn take_rtr(&mut self, to: Rank, tag: Tag, buf: &BufDesc) -> Option<RtrOffer> {
        if self.rtr_eligible(to, buf) && self.rtr_ready(to, tag, buf) {
            self.rtr[to as usize].offers.pop_front()
        } else {
            None
        }
    }

    /// Sends `buf` by pushing it into the receive the peer offered: the copy first (it
    /// is what the receiver waits for), then RTR_PUT, which takes the message's place
    /// in the order of this rank's messages to the peer.
    pub(super) fn put_offered(&mut self, req: ReqId, msg: MsgId, to: Rank, tag: Tag, buf: BufDesc, offer: RtrOffer) {
        let dev = buf.device.expect("take_rtr checked");
        let p = &mut self.rtr[to as usize];
        p.credit = (p.credit + 1).min(RTR_WAIT_CREDIT);
        p.sent += 1;
        self.sends_to[to as usize] += 1;
        let pending = self.issue_range(
            OpOwner::Send { msg, chunk: None },
            CopyEngine::Device(dev),
            |o| Loc::User { req, offset: o },
            |o| Loc::Peer { peer: to, region: offer.dst, offset: o },
            0,
            buf.len,
        );
        self.send(to, Packet::RtrPut { msg, tag, len: buf.len, recv: offer.recv });
        self.sends.insert(msg, SendXfer::new(req, to, tag, buf, Some(Protocol::Put), pending));
    }

    /// A peer offered one of its receives: keep the offer for the message it names, or,
    /// if that message went out already, note whether the offer came just too late.
    pub(super) fn on_rtr(&mut self, from: Rank, offer: RtrOffer) {
        let d = &offer.dst;
        if !d.covers(offer.len) || d.node != self.cfg.node || d.device >= self.cfg.devices {
            return self.violation(
                from,
                format!("RTR for receive {}: region outside its allocation or not on this node", offer.recv),
            );
        }
        // Mapped even when stale (the receive buffer is likely offered again, in time), by
        // a rank that sends this peer device memory.
        let alloc = Some((d.device, d.buffer_id));
        let p = &mut self.rtr[from as usize];
        let map = p.sends_device && p.mapped != alloc;
        if map {
            p.mapped = alloc;
        }
        if offer.expect < p.sent {
            // That message went out already; if it was the last one, the offer was late.
            p.late = offer.expect + 1 == p.sent;
        } else {
            if p.offers.len() == RTR_OFFERS_KEPT {
                p.offers.pop_front();
            }
            p.offers.push_back(offer);
        }
        if map {
            self.emit(Action::MapPeer { peer: from, region: offer.dst });
        }
    }

    /// The peer pushes its next message into a receive this rank offered.
    pub(super) fn on_rtr_put(&mut self, from: Rank, msg: MsgId, tag: Tag, len: u64, req: ReqId) {
        let Some(PostedRecv { buf, offer: Some(o) }) = self.posted.get(&req).copied() else {
            // The sender writes into a buffer that was never offered to it.
            self.violation(from, format!("RTR_PUT {msg} into receive {} that was not offered", req.0));
            return self.send(from, Packet::Abort { msg, reason: AbortReason::BadRequest, dir: Dir::ToSender });
        };
        if o.to != from || o.tag != tag || len > buf.len || len == 0 {
            self.violation(from, format!("RTR_PUT {msg} of {len} bytes, tag {tag}, does not fit receive {}", req.0));
            return self.send(from, Packet::Abort { msg, reason: AbortReason::BadRequest, dir: Dir::ToSender });
        }
        self.matcher.cancel(req);
        self.posted.remove(&req);
        let choice =
            ProtocolChoice { protocol: Protocol::Put, reason: "offered by RTR: the sender's engine pushed at once" };
        self.emit(Action::Chose { req, peer: from, len, choice });
        self.insert_recv(
            (from, msg),
            RecvXfer {
                req,
                tag,
                len,
                buf,
                proto: Protocol::Put,
                pending: 0,
                part_done: false,
                shm: None,
                net: None,
                error: None,
                unmapped: None,
                awaiting_sender: false,
            },
        );
    }

    /// The peer cancels an offered receive: forget the offer, and confirm after any
    /// RTR_PUT already sent (packets to a peer stay in order).
    pub(super) fn on_rtr_revoke(&mut self, from: Rank, recv: u64) {
        self.rtr[from as usize].offers.retain(|o| o.recv != recv);
        self.send(from, Packet::RtrRevoked { recv });
    }

    /// The sender will not push into an offered receive whose cancel was asked: it is
    /// cancelled now.
    pub(super) fn on_rtr_revoked(&mut self, from: Rank, recv: u64) {
        let req = ReqId(recv);
        // Not offered any more: an RTR_PUT or another message took it first.
        if matches!(self.posted.get(&req).and_then(|p| p.offer), Some(o) if o.to == from && o.cancelling) {
            self.matcher.cancel(req);
            self.posted.remove(&req);
            self.complete(req, Err(ProtoError::Cancelled));
        }
    }
}
