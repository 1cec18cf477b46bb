//! The per-rank LMT protocol engine: eager, and the rendezvous protocols GET, PUT,
//! COOPERATE and SHM of the seed design, as one sans-IO state machine; and, for a peer on
//! another node, eager and the NET rendezvous (`net`), matched by the same engine.
//!
//! Flow of a rendezvous (the receiver decides, on the RTS):
//! - GET: RTS(cookie) → receiver's engine copies from the mapped sender buffer →
//!   DONE(to sender).
//! - PUT: RTS → CTS(put, receiver cookie) → sender's engine copies → DONE(to receiver).
//! - COOPERATE: RTS → CTS(coop, cookie, split); the sender copies `[0, split)`, the
//!   receiver `[split, len)`; the receiver sends COOKIE when its part is done, the
//!   sender DONE when both parts are.
//! - NET (a peer on another node): RTS → the receiver posts the data receive (NetRecv)
//!   → CTS(net) → the sender sends the data (NetSend); the transport's MPI completes
//!   both sides. Pushed (most messages): RTS and NetSend at once, the receiver's
//!   NetRecv on the match, no CTS.
//! - SHM: RTS → CTS(shm); the sender fills the slots of the directed pair's staging
//!   ring while the receiver drains them; CHUNK says which slot holds chunk k of a
//!   message, CHUNK_ACK that the chunk was copied out and its slot is free. SHM sends
//!   to one peer fill the ring in CTS order, and the next one takes slots as soon as
//!   they free up, so back-to-back messages stream through the ring without draining
//!   it in between.
//!
//! - RTR (receiver-initiated PUT): a receive posted for one source and tag into an
//!   exported device buffer, which no other posted receive stands before, is offered
//!   to its sender at once: RTR(buffer, the sender's message number it takes). If
//!   that message is a device send of at most `rtr_put_max` bytes with that tag, the
//!   sender's engine pushes it straight away: RTR_PUT announces it (in message order),
//!   DONE(to receiver) ends it; no RTS, no CTS. Otherwise the offer goes stale (the
//!   sender counts past it) and the message travels as usual. Cancelling an offered
//!   receive asks the sender first (RTR_REVOKE): it answers RTR_REVOKED after any
//!   RTR_PUT it already sent, so a buffer is never written after its receive ended.
//!
//! A request whose copies are still running is never completed, even when it fails:
//! its buffer may still be read or written by an engine until they finish.
//!
//! This file holds the [`Engine`], its queue of actions and the dispatch of incoming
//! packets. The rest, one idea per module (each extends `impl Engine`):
//! - `config`, `request`, `action`: the types the transport exchanges with the engine
//!   ([`EngineConfig`], [`BufDesc`], [`Status`], [`Action`], [`CopyCmd`]);
//! - `send`, `recv`: the two sides of a message, from posting to completion;
//! - `rendezvous`: the receiver's choice of protocol on an RTS, and its start;
//! - `rtr`: receiver-initiated PUT (offers, pushes, waits, revokes);
//! - `shm`: the SHM staging ring;
//! - `copies`: the copies in flight and their completions;
//! - `net`: the NET rendezvous with ranks of other nodes, and what crosses nodes;
//! - `fallback`: a GET whose sender memory this rank cannot map, moved by SHM instead;
//! - `peer_failure`: what a peer's death ends.

mod action;
mod config;
mod copies;
mod fallback;
mod net;
mod peer_failure;
mod recv;
mod rendezvous;
mod request;
mod rtr;
mod send;
mod shm;

use std::collections::VecDeque;

// Keys are small integers chosen by us, not by an adversary: a fast hasher is safe.
use rustc_hash::FxHashMap as HashMap;

pub use action::{Action, CopyCmd, CopyEngine, Loc};
pub use config::EngineConfig;
pub use request::{BufDesc, Status};

use crate::matching::Matcher;
use crate::wire::{Dir, Packet};
use crate::{MsgId, ProtoError, Rank, ReqId};
use copies::OpWindow;
use recv::{PostedRecv, RecvXfer, Unexpected};
use rtr::{RtrOffer, RtrPeer};
use send::SendXfer;
use shm::ShmRing;

/// The last few keys of one kind seen here, newest last. As [`RecentXfers`]: transfers that
/// ended, by (peer, message), enough to tell a packet the peer sent before it learnt of the
/// end from a forged or stray one; as [`fallback`]'s memo: peer buffers this rank failed to
/// map, by (peer, buffer id).
#[derive(Debug)]
struct Recent<K>(VecDeque<K>);

impl<K> Default for Recent<K> {
    fn default() -> Self {
        Self(VecDeque::new())
    }
}

impl<K: PartialEq> Recent<K> {
    /// Keys remembered; older ones are forgotten (a packet about a forgotten transfer is
    /// then reported as a violation, and dropped all the same; a forgotten unmappable
    /// buffer is tried again, and falls back again).
    const KEPT: usize = 64;

    fn remember(&mut self, key: K) {
        if self.0.len() == Self::KEPT {
            self.0.pop_front();
        }
        self.0.push_back(key);
    }

    fn contains(&self, key: &K) -> bool {
        self.0.contains(key)
    }
}

type RecentXfers = Recent<(Rank, MsgId)>;

/// The protocol engine of one rank.
///
/// Its methods, by role:
/// - the user's requests: [`post_send`](Self::post_send), [`post_recv`](Self::post_recv),
///   [`post_matched_recv`](Self::post_matched_recv), [`cancel_recv`](Self::cancel_recv),
///   [`probe`](Self::probe), and the eager fast paths [`send_eager`](Self::send_eager) and
///   [`take_eager_match`](Self::take_eager_match);
/// - events from the transport: [`on_packet`](Self::on_packet),
///   [`on_copy_done`](Self::on_copy_done), [`on_copy_unmappable`](Self::on_copy_unmappable),
///   [`on_net_done`](Self::on_net_done),
///   [`on_peer_failed`](Self::on_peer_failed);
/// - a send's wait for an RTR offer: [`rtr_eligible`](Self::rtr_eligible),
///   [`rtr_wait_begin`](Self::rtr_wait_begin), [`rtr_ready`](Self::rtr_ready),
///   [`rtr_wait_failed`](Self::rtr_wait_failed);
/// - output: [`poll_action`](Self::poll_action) (and [`has_actions`](Self::has_actions));
/// - state: [`config`](Self::config), [`is_eager_to`](Self::is_eager_to),
///   [`is_eager`](Self::is_eager),
///   [`is_idle`](Self::is_idle), [`in_flight`](Self::in_flight),
///   [`is_peer_failed`](Self::is_peer_failed).
///
/// Inputs only change state and queue actions; the transport performs the actions in
/// the order [`poll_action`](Self::poll_action) returns them.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    next_msg: MsgId,
    next_copy: u64,
    matcher: Matcher<Unexpected>,
    /// Posted receives that have not matched, with their buffers and offers (one map:
    /// posting, pushing into and matching a receive each look it up once).
    posted: HashMap<ReqId, PostedRecv>,
    sends: HashMap<MsgId, SendXfer>,
    recvs: HashMap<(Rank, MsgId), RecvXfer>,
    copies: OpWindow,
    /// Network transfers (NET rendezvous) in flight, by [`NetId`](crate::NetId).
    nets: OpWindow,
    next_net: u64,
    /// Pushed NET sends not finished (at most `net_push_sends`).
    pushed_sends: u32,
    /// Per destination: the staging ring and the SHM sends that use it.
    shm_rings: HashMap<Rank, ShmRing>,
    /// The latest SHM receives that failed while their sender lived: CHUNKs it sent
    /// before it learnt of the failure are acknowledged without complaint.
    failed_shm_recvs: RecentXfers,
    /// The latest sends that ended while their receiver lived and that it may still
    /// ABORT (or COOKIE), which is then dropped without complaint: NET sends (its network
    /// receive failed after ours completed), and failed PUT or COOPERATE sends (its own
    /// failure, or the COOKIE of its finished part, crossed ours).
    ended_sends: RecentXfers,
    /// Peer buffers this rank failed to map, by (peer, buffer id): their later messages
    /// take a protocol that needs no mapping of them (`fallback`).
    unmappable: Recent<(Rank, u64)>,
    dead: Vec<bool>,
    /// Per peer: rendezvous sends to it not finished yet (its engine may be
    /// moving them: the policy avoids loading it further).
    sends_to: Vec<u32>,
    /// Per peer: its messages our engine is pulling (GET) and its engine is pushing
    /// here (PUT, RTR), unfinished: the policy's balance spreads windows by them.
    pulling: Vec<u32>,
    pushing: Vec<u32>,
    /// Per peer: message counts and offers for RTR.
    rtr: Vec<RtrPeer>,
    actions: VecDeque<Action>,
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Self {
        assert!(cfg.chunk_size > 0 && cfg.depth > 0, "SHM chunk size and depth must be positive");
        assert!(cfg.rank < cfg.size, "rank {} outside job of {}", cfg.rank, cfg.size);
        assert!(
            cfg.on_node.len() == cfg.size as usize && cfg.is_on_node(cfg.rank),
            "on_node needs one entry per rank of the job, true for this rank"
        );
        let dead = vec![false; cfg.size as usize];
        let sends_to = vec![0; cfg.size as usize];
        let n = cfg.size as usize;
        Self {
            cfg,
            next_msg: 1,
            next_copy: 1,
            matcher: Matcher::default(),
            posted: HashMap::default(),
            sends: HashMap::default(),
            recvs: HashMap::default(),
            copies: OpWindow::default(),
            nets: OpWindow::default(),
            next_net: 1,
            pushed_sends: 0,
            shm_rings: HashMap::default(),
            failed_shm_recvs: RecentXfers::default(),
            ended_sends: RecentXfers::default(),
            unmappable: Recent::default(),
            dead,
            sends_to,
            pulling: vec![0; n],
            pushing: vec![0; n],
            rtr: (0..n).map(|_| RtrPeer::default()).collect(),
            actions: VecDeque::new(),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Whether a message of `len` bytes from host (or, with `device`, device)
    /// memory to a rank of this node travels eagerly: the caller then passes its payload
    /// to [`post_send`](Self::post_send). Empty messages always do. For a destination
    /// that may be on another node, ask [`is_eager_to`](Self::is_eager_to).
    pub fn is_eager(&self, len: u64, device: bool) -> bool {
        len == 0 || len <= if device { self.cfg.device_eager_limit } else { self.cfg.eager_limit }
    }

    /// Whether an action waits: lets a transport skip the loop that takes them (most
    /// passes of a poll loop have none).
    #[inline]
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Next action for the transport to perform.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether any request, copy, network transfer or SHM ring is still active.
    pub fn is_idle(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty() && self.copies.is_empty() && self.nets.is_empty()
    }

    /// Requests in flight (sends and matched receives) and posted receives.
    pub fn in_flight(&self) -> usize {
        self.sends.len() + self.recvs.len() + self.posted.len()
    }

    /// Queues an action for [`poll_action`](Self::poll_action).
    fn emit(&mut self, a: Action) {
        self.actions.push_back(a);
    }

    /// Queues a control packet to `to`, unless `to` died (nothing would read it).
    fn send(&mut self, to: Rank, packet: Packet) {
        if !self.dead[to as usize] {
            self.emit(Action::Send { to, packet });
        }
    }

    /// Queues the completion of a request.
    fn complete(&mut self, req: ReqId, result: Result<Status, ProtoError>) {
        self.emit(Action::Complete { req, result });
    }

    /// Reports a peer's protocol violation (the packet at fault is dropped by the caller).
    fn violation(&mut self, peer: Rank, what: String) {
        self.emit(Action::Violation { peer, what });
    }

    /// A control packet arrived from `from`.
    pub fn on_packet(&mut self, from: Rank, packet: Packet) {
        if from >= self.cfg.size {
            return self.violation(from, format!("packet from rank {from} outside the job"));
        }
        if !self.cfg.is_on_node(from) && !Self::crosses_nodes(&packet) {
            let what =
                format!("{packet:?} from rank {from} on another node: only eager, RTS, CTS and ABORT cross nodes");
            return self.violation(from, what);
        }
        if matches!(packet, Packet::Eager { .. } | Packet::Rts { .. } | Packet::RtrPut { .. }) {
            self.rtr[from as usize].arrived += 1;
        }
        match packet {
            Packet::Eager { tag, payload, .. } => {
                let u = Unexpected::Eager { payload };
                self.arrive(from, tag, u);
            }
            Packet::Rts { msg, tag, len, src } => {
                if self.check_rts(from, msg, len, &src) {
                    self.arrive(from, tag, Unexpected::Rts { msg, len, src });
                }
            }
            Packet::Cts { msg, mode, dst, split } => self.on_cts(from, msg, mode, dst, split),
            Packet::Cookie { msg } => self.on_cookie(from, msg),
            Packet::Done { msg, dir: Dir::ToSender } => self.on_done_to_sender(from, msg),
            Packet::Done { msg, dir: Dir::ToReceiver } => self.on_done_to_receiver(from, msg),
            Packet::Chunk { msg, index, len, slot } => self.on_chunk(from, msg, index, len, slot),
            Packet::ChunkAck { msg, index } => self.on_chunk_ack(from, msg, index),
            Packet::Abort { msg, reason, dir: Dir::ToSender } => self.on_abort_to_sender(from, msg, reason),
            Packet::Abort { msg, reason, dir: Dir::ToReceiver } => self.on_abort_to_receiver(from, msg, reason),
            Packet::Rtr { recv, expect, tag, len, dst } => self.on_rtr(from, RtrOffer { recv, expect, tag, len, dst }),
            Packet::RtrPut { msg, tag, len, recv } => self.on_rtr_put(from, msg, tag, len, ReqId(recv)),
            Packet::RtrRevoke { recv } => self.on_rtr_revoke(from, recv),
            Packet::RtrRevoked { recv } => self.on_rtr_revoked(from, recv),
            Packet::FreeMarks { .. } | Packet::FreeAck { .. } => {
                self.violation(from, "free-commit packet routed to the LMT engine".into())
            }
        }
    }
}
