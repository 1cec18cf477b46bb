//! The per-rank LMT protocol engine: eager, and the rendezvous protocols GET, PUT,
//! COOPERATE and SHM of the seed design, as one sans-IO state machine.
//!
//! Flow of a rendezvous (the receiver decides, on the RTS):
//! - GET: RTS(cookie) → receiver's engine copies from the mapped sender buffer →
//!   DONE(to sender).
//! - PUT: RTS → CTS(put, receiver cookie) → sender's engine copies → DONE(to receiver).
//! - COOPERATE: RTS → CTS(coop, cookie, split); the sender copies `[0, split)`, the
//!   receiver `[split, len)`; the receiver sends COOKIE when its part is done, the
//!   sender DONE when both parts are.
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

use std::collections::VecDeque;

// Keys are small integers chosen by us, not by an adversary: a fast hasher is safe.
use rustc_hash::FxHashMap as HashMap;

use crate::matching::{Matcher, Selector};
use crate::policy::{self, PeerLoad, PolicyConfig, Protocol, ProtocolChoice};
use crate::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet, Region};
use crate::{CopyId, MsgId, ProtoError, Rank, ReqId, Tag};

/// Static parameters of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub rank: Rank,
    pub size: u32,
    /// Node id of this rank; regions from other nodes cannot be mapped.
    pub node: u64,
    /// Host messages of at most this many bytes travel inline in the control packet.
    pub eager_limit: u64,
    /// The same for messages from device memory, whose payload must first be staged
    /// to the host by a copy engine: with peer access one GET copy is faster, so
    /// this is usually lower than `eager_limit`.
    pub device_eager_limit: u64,
    pub policy: PolicyConfig,
    /// SHM staging chunk size in bytes.
    pub chunk_size: u64,
    /// SHM staging slots per directed pair (pipeline depth).
    pub depth: u32,
    /// Largest single copy; longer ranges are split into pieces (0 = never split).
    pub copy_split: u64,
    /// Copy queues per engine the pieces of one transfer are spread over.
    pub lanes: u32,
    /// COOPERATE: the sender's share of the message, in thousandths.
    pub coop_sender_permille: u32,
    /// Device sends of at most this many bytes use a receiver's RTR when one waits for
    /// them; receives are offered by RTR only when this is not 0.
    pub rtr_put_max: u64,
    /// Number of devices on the node and whether device a's engine reaches device b
    /// (row-major `devices x devices`).
    pub devices: u32,
    pub peer_access: Vec<bool>,
}

impl EngineConfig {
    /// A configuration for `size` ranks with every device pair peer-accessible.
    pub fn new(rank: Rank, size: u32, devices: u32) -> Self {
        Self {
            rank,
            size,
            node: 0,
            eager_limit: 8192,
            device_eager_limit: 8192,
            policy: PolicyConfig::default(),
            chunk_size: 1 << 20,
            depth: 8,
            copy_split: 0,
            lanes: 1,
            coop_sender_permille: 500,
            rtr_put_max: 0,
            devices,
            peer_access: vec![true; (devices * devices) as usize],
        }
    }

    /// Whether device `a`'s engine can reach device `b`'s memory.
    pub fn can_access(&self, a: u32, b: u32) -> bool {
        a == b || (a < self.devices && b < self.devices && self.peer_access[(a * self.devices + b) as usize])
    }
}

/// A user buffer, as the engine needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufDesc {
    pub len: u64,
    /// The device holding it, None for host memory.
    pub device: Option<u32>,
    /// Its exported region (device buffers of rendezvous size; a sender's is required).
    pub region: Option<Region>,
}

impl BufDesc {
    pub fn host(len: u64) -> Self {
        Self { len, device: None, region: None }
    }
}

/// Completion status of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// The peer (for a receive: the sender).
    pub source: Rank,
    pub tag: Tag,
    /// Bytes moved.
    pub len: u64,
}

/// One end of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// The buffer of a local request, at `offset`.
    User { req: ReqId, offset: u64 },
    /// A peer's exported buffer, at `offset` from the start of the user's buffer
    /// (`region.offset + offset` from the allocation's start).
    Peer { peer: Rank, region: Region, offset: u64 },
    /// Staging slot `slot` of the directed pair `from -> to`, at its start.
    Staging { from: Rank, to: Rank, slot: u32 },
}

/// Which engine drives a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyEngine {
    /// The copy engine of this device.
    Device(u32),
    /// The CPU (both ends in host memory).
    Host,
}

/// A copy the transport must start, and report with [`Engine::on_copy_done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyCmd {
    pub id: CopyId,
    pub engine: CopyEngine,
    pub lane: u32,
    pub src: Loc,
    pub dst: Loc,
    pub len: u64,
}

/// What the transport must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a control packet (in order with earlier sends to the same rank).
    Send { to: Rank, packet: Packet },
    /// Start a copy.
    Copy(CopyCmd),
    /// Write an eager payload into the request's buffer at offset 0.
    Deliver { req: ReqId, payload: Vec<u8> },
    /// The request is complete.
    Complete { req: ReqId, result: Result<Status, ProtoError> },
    /// A rendezvous protocol was chosen for the request (for logs and counters).
    Chose { req: ReqId, peer: Rank, len: u64, choice: ProtocolChoice },
    /// A peer broke the protocol; the packet was dropped.
    Violation { peer: Rank, what: String },
    /// A peer offered this region (RTR): map it now, so that a send that uses the offer
    /// does not pay for opening the mapping (and one that does not, later, neither).
    MapPeer { peer: Rank, region: Region },
}

/// A message that arrived before its receive.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Unexpected {
    Eager { payload: Vec<u8> },
    Rts { msg: MsgId, len: u64, src: MemDesc },
}

/// A receive a peer offered by RTR, kept by the sender until used or stale.
#[derive(Clone, Copy, Debug)]
struct RtrOffer {
    recv: u64,
    expect: u64,
    tag: Tag,
    len: u64,
    dst: Region,
}

/// What this rank knows of one peer for RTR.
#[derive(Debug)]
struct RtrPeer {
    /// Messages (eager, RTS, RTR_PUT) this rank sent the peer, and messages from it that
    /// arrived here: an RTR names the message it takes by this count.
    sent: u64,
    arrived: u64,
    /// Its RTRs this rank has not used yet, oldest first.
    offers: VecDeque<RtrOffer>,
    /// Its last RTR named the message this rank had just sent without it (an RTS on its
    /// way): the next send may wait a moment for an offer
    /// ([`Engine::rtr_wait_begin`]).
    late: bool,
    /// Waits for its offers left before sends stop waiting, and sends since the credit
    /// ran out (see [`RTR_WAIT_PROBE`]).
    credit: u8,
    probe: u32,
    /// The allocation (device, buffer id) of its last offer, which was mapped then: a
    /// ping-pong offers the same buffer every time, and one mapping request per
    /// allocation is enough (should the cache have closed it since, the push reopens it).
    mapped: Option<(u32, u64)>,
    /// This rank has sent the peer device memory by rendezvous, so its offers are worth
    /// mapping (a rank that only sends it host memory never pushes into them).
    sends_device: bool,
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

/// A posted receive that has not matched: its buffer, and its offer if it was offered.
#[derive(Clone, Copy, Debug)]
struct PostedRecv {
    buf: BufDesc,
    offer: Option<Offered>,
}

/// A receive of ours offered to its sender by RTR, not matched yet.
#[derive(Clone, Copy, Debug)]
struct Offered {
    to: Rank,
    tag: Tag,
    /// Cancel was asked: RTR_REVOKE sent, RTR_REVOKED awaited.
    cancelling: bool,
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

/// How many failed SHM receives an engine remembers (see `Engine::failed_shm_recvs`).
const FAILED_SHM_MEMORY: usize = 64;

/// Where an SHM transfer stands.
#[derive(Debug)]
struct ShmState {
    nchunks: u32,
    /// Sender: next chunk to fill. Receiver: unused.
    next: u32,
    /// Sender: chunks filled. Receiver: chunks drained.
    done: u32,
    /// Sender: chunks the receiver acknowledged.
    acked: u32,
}

impl ShmState {
    fn new(len: u64, chunk: u64) -> Self {
        let nchunks = len.div_ceil(chunk) as u32;
        Self { nchunks, next: 0, done: 0, acked: 0 }
    }
}

/// What a slot of a sender's staging ring holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotUse {
    /// Chunk `.1` of message `.0` is being copied in.
    Filling(MsgId, u32),
    /// It is in, announced by CHUNK, and waits for its CHUNK_ACK.
    Filled(MsgId, u32),
}

/// The sender's side of its staging ring to one peer. Slots are owned here rather
/// than by the transfers, so a slot is reused only once the receiver acknowledged
/// it, even when the transfer that filled it failed and was torn down meanwhile.
#[derive(Debug, Default)]
struct ShmRing {
    slots: Vec<Option<SlotUse>>,
    /// SHM sends to this peer in CTS order; the first with chunks left fills next.
    queue: VecDeque<MsgId>,
}

/// A staging chunk of an SHM transfer: its index in the message and its slot.
#[derive(Clone, Copy, Debug)]
struct StagedChunk {
    index: u32,
    slot: u32,
}

#[derive(Debug)]
struct SendXfer {
    req: ReqId,
    to: Rank,
    tag: Tag,
    buf: BufDesc,
    proto: Option<Protocol>,
    /// Copies this side started and that have not finished.
    pending: u32,
    /// COOPERATE: the receiver's COOKIE arrived.
    cookie: bool,
    /// The user request was completed (SHM completes it before the ring drains).
    completed: bool,
    shm: Option<ShmState>,
    error: Option<ProtoError>,
}

impl SendXfer {
    /// A rendezvous send of `buf`, its protocol `proto` when already known.
    fn new(req: ReqId, to: Rank, tag: Tag, buf: BufDesc, proto: Option<Protocol>, pending: u32) -> Self {
        Self { req, to, tag, buf, proto, pending, cookie: false, completed: false, shm: None, error: None }
    }
}

#[derive(Debug)]
struct RecvXfer {
    req: ReqId,
    tag: Tag,
    len: u64,
    buf: BufDesc,
    proto: Protocol,
    pending: u32,
    /// COOPERATE: this side's part is done and COOKIE was sent.
    part_done: bool,
    shm: Option<ShmState>,
    error: Option<ProtoError>,
}

/// Who owns a copy in flight.
#[derive(Clone, Copy, Debug)]
enum CopyOwner {
    Send { msg: MsgId, chunk: Option<StagedChunk> },
    Recv { from: Rank, msg: MsgId, chunk: Option<u32> },
}

/// The copies in flight, by id. Ids are issued in sequence and copies finish in about that
/// order, so a window that starts at the oldest unfinished copy serves as the map, with no
/// hashing on the path of every copy. A copy that finishes late keeps the window open
/// behind it (a slot per later copy) until it does; every copy issued is reported done,
/// failed ones included, so the window always closes.
#[derive(Debug, Default)]
struct CopyWindow {
    /// Id of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<CopyOwner>>,
    live: usize,
}

impl CopyWindow {
    /// Adds the copy with the next id in sequence.
    fn insert(&mut self, id: CopyId, owner: CopyOwner) {
        if self.slots.is_empty() {
            self.base = id.0;
        }
        debug_assert_eq!(id.0, self.base + self.slots.len() as u64, "copy ids are inserted in sequence");
        self.slots.push_back(Some(owner));
        self.live += 1;
    }

    fn remove(&mut self, id: CopyId) -> Option<CopyOwner> {
        let i = usize::try_from(id.0.checked_sub(self.base)?).ok()?;
        let owner = self.slots.get_mut(i)?.take()?;
        self.live -= 1;
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(owner)
    }

    fn is_empty(&self) -> bool {
        self.live == 0
    }
}

/// Completion of an eager message of `msg_len` bytes into a `buf_len`-byte buffer.
fn eager_result(from: Rank, tag: Tag, msg_len: u64, buf_len: u64) -> Result<Status, ProtoError> {
    if msg_len > buf_len {
        Err(ProtoError::Truncated { msg_len, buf_len })
    } else {
        Ok(Status { source: from, tag, len: msg_len })
    }
}

/// The protocol engine of one rank.
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
    copies: CopyWindow,
    /// Per destination: the staging ring and the SHM sends that use it.
    shm_rings: HashMap<Rank, ShmRing>,
    /// The latest SHM receives that failed while their sender lived: CHUNKs it sent
    /// before it learnt of the failure are acknowledged without complaint.
    failed_shm_recvs: VecDeque<(Rank, MsgId)>,
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
            copies: CopyWindow::default(),
            shm_rings: HashMap::default(),
            failed_shm_recvs: VecDeque::new(),
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
    /// memory travels eagerly: the caller then passes its payload to
    /// [`post_send`](Self::post_send). Empty messages always do.
    pub fn is_eager(&self, len: u64, device: bool) -> bool {
        len == 0 || len <= if device { self.cfg.device_eager_limit } else { self.cfg.eager_limit }
    }

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

    /// Eager receive fast path: if a posted receive takes an eager message from
    /// `from` with `tag` and `len` bytes, removes it and returns it with the
    /// completion to report once the caller has copied `min(len, buffer)` bytes in.
    /// None: no receive is waiting; hand the packet to [`on_packet`](Self::on_packet).
    pub fn take_eager_match(
        &mut self,
        from: Rank,
        tag: Tag,
        len: u64,
    ) -> Option<(ReqId, BufDesc, Result<Status, ProtoError>)> {
        let req = self.matcher.take_posted(from, tag)?;
        self.rtr[from as usize].arrived += 1;
        let buf = self.posted.remove(&req).expect("posted receive has a buffer").buf;
        Some((req, buf, eager_result(from, tag, len, buf.len)))
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

    /// Whether any request, copy or SHM ring is still active.
    pub fn is_idle(&self) -> bool {
        self.sends.is_empty() && self.recvs.is_empty() && self.copies.is_empty()
    }

    /// Requests in flight (sends and matched receives) and posted receives.
    pub fn in_flight(&self) -> usize {
        self.sends.len() + self.recvs.len() + self.posted.len()
    }

    fn emit(&mut self, a: Action) {
        self.actions.push_back(a);
    }

    fn send(&mut self, to: Rank, packet: Packet) {
        if !self.dead[to as usize] {
            self.emit(Action::Send { to, packet });
        }
    }

    fn complete(&mut self, req: ReqId, result: Result<Status, ProtoError>) {
        self.emit(Action::Complete { req, result });
    }

    fn violation(&mut self, peer: Rank, what: String) {
        self.emit(Action::Violation { peer, what });
    }

    /// Posts a send of `buf` to `to` with `tag`: eager with `payload` (the buffer's
    /// bytes; the caller decides with [`is_eager`](Self::is_eager)), else a
    /// rendezvous (which a host that does its own matching may use at any size).
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
        let src = match (buf.device, buf.region) {
            (None, _) => MemDesc::Host,
            (Some(_), Some(r)) => MemDesc::Device(r),
            (Some(d), None) => {
                return self.complete(
                    req,
                    Err(ProtoError::Unsupported { what: format!("device {d} buffer was not exported for rendezvous") }),
                )
            }
        };
        if buf.device.is_some() {
            self.rtr[to as usize].sends_device = true;
        }
        if let Some(offer) = self.take_rtr(to, tag, &buf) {
            return self.put_offered(req, msg, to, tag, buf, offer);
        }
        self.rtr[to as usize].sent += 1;
        self.send(to, Packet::Rts { msg, tag, len: buf.len, src });
        self.sends_to[to as usize] += 1;
        self.sends.insert(msg, SendXfer::new(req, to, tag, buf, None, 0));
    }

    /// Posts a receive into `buf` from `source` (None = any) with `tag` (None = any).
    pub fn post_recv(&mut self, req: ReqId, source: Option<Rank>, tag: Option<Tag>, buf: BufDesc) {
        if let Some(s) = source {
            if s >= self.cfg.size {
                return self.complete(req, Err(ProtoError::BadRank { rank: s, size: self.cfg.size }));
            }
        }
        match self.matcher.post(req, Selector { source, tag }) {
            Some((from, tag, u)) => self.start_recv(req, from, tag, buf, u),
            None => {
                if let Some(s) = source {
                    if self.dead[s as usize] {
                        self.matcher.cancel(req);
                        return self.complete(req, Err(ProtoError::PeerFailed { rank: s }));
                    }
                }
                let offer = self.offer_rtr(req, source, tag, &buf);
                self.posted.insert(req, PostedRecv { buf, offer });
            }
        }
    }

    /// Offers a just-posted receive to its sender (RTR) where nothing can take the
    /// sender's next message first: one source and tag, no earlier posted receive for
    /// them, an exported device buffer. Returns the offer made, if any.
    fn offer_rtr(&mut self, req: ReqId, source: Option<Rank>, tag: Option<Tag>, buf: &BufDesc) -> Option<Offered> {
        let (Some(from), Some(tag), Some(dst)) = (source, tag, buf.region) else { return None };
        if self.cfg.rtr_put_max == 0 || from == self.cfg.rank || buf.device.is_none() || buf.len == 0 {
            return None; // Nothing can push into it.
        }
        if self.matcher.first_posted(from, tag) != Some(req) {
            return None;
        }
        let expect = self.rtr[from as usize].arrived;
        self.send(from, Packet::Rtr { recv: req.0, expect, tag, len: buf.len, dst });
        Some(Offered { to: from, tag, cancelling: false })
    }

    /// Whether a send of `buf` to `to` is of the kind an RTR can carry: device memory, not
    /// empty, at most `rtr_put_max` bytes, to another rank. The transport looks for
    /// offers (and may wait for one) only for these.
    pub fn rtr_eligible(&self, to: Rank, buf: &BufDesc) -> bool {
        buf.device.is_some()
            && buf.len > 0
            && buf.len <= self.cfg.rtr_put_max
            && to != self.cfg.rank
            && to < self.cfg.size
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
        p.offers.front().is_some_and(|o| {
            o.expect == p.sent && o.tag == tag && buf.len <= o.len && self.cfg.can_access(dev, o.dst.device)
        })
    }

    /// The peer's RTR for the message this rank sends it next, if this send of `buf`
    /// with `tag` can use it.
    fn take_rtr(&mut self, to: Rank, tag: Tag, buf: &BufDesc) -> Option<RtrOffer> {
        if self.rtr_eligible(to, buf) && self.rtr_ready(to, tag, buf) {
            self.rtr[to as usize].offers.pop_front()
        } else {
            None
        }
    }

    /// Sends `buf` by pushing it into the receive the peer offered: the copy first (it
    /// is what the receiver waits for), then RTR_PUT, which takes the message's place
    /// in the order of this rank's messages to the peer.
    fn put_offered(&mut self, req: ReqId, msg: MsgId, to: Rank, tag: Tag, buf: BufDesc, offer: RtrOffer) {
        let dev = buf.device.expect("take_rtr checked");
        let p = &mut self.rtr[to as usize];
        p.credit = (p.credit + 1).min(RTR_WAIT_CREDIT);
        p.sent += 1;
        self.sends_to[to as usize] += 1;
        let pending = self.issue_range(
            CopyOwner::Send { msg, chunk: None },
            CopyEngine::Device(dev),
            |o| Loc::User { req, offset: o },
            |o| Loc::Peer { peer: to, region: offer.dst, offset: o },
            0,
            buf.len,
        );
        self.send(to, Packet::RtrPut { msg, tag, len: buf.len, recv: offer.recv });
        self.sends.insert(msg, SendXfer::new(req, to, tag, buf, Some(Protocol::Put), pending));
    }

    /// MPI_Iprobe: the envelope of the earliest unexpected message `source`/`tag` matches.
    pub fn probe(&self, source: Option<Rank>, tag: Option<Tag>) -> Option<Status> {
        self.matcher.probe(Selector { source, tag }).map(|(s, t, u)| Status {
            source: *s,
            tag: *t,
            len: match u {
                Unexpected::Eager { payload } => payload.len() as u64,
                Unexpected::Rts { len, .. } => *len,
            },
        })
    }

    /// Cancels a receive that has not matched; false if it already matched.
    /// A receive offered by RTR is cancelled once its sender confirms it will not push
    /// into it (RTR_REVOKED); should the sender have pushed already, it completes as
    /// received instead (as an MPI cancel that lost the race with a match).
    pub fn cancel_recv(&mut self, req: ReqId) -> bool {
        if let Some(o) = self.posted.get_mut(&req).and_then(|p| p.offer.as_mut()) {
            if !o.cancelling {
                o.cancelling = true;
                let to = o.to;
                self.send(to, Packet::RtrRevoke { recv: req.0 });
            }
            return true;
        }
        if self.matcher.cancel(req) {
            self.posted.remove(&req);
            self.complete(req, Err(ProtoError::Cancelled));
            true
        } else {
            false
        }
    }

    /// A matched message starts moving into `buf`.
    fn start_recv(&mut self, req: ReqId, from: Rank, tag: Tag, buf: BufDesc, u: Unexpected) {
        match u {
            Unexpected::Eager { mut payload } => {
                let result = eager_result(from, tag, payload.len() as u64, buf.len);
                payload.truncate(buf.len as usize);
                if !payload.is_empty() {
                    self.emit(Action::Deliver { req, payload });
                }
                self.complete(req, result);
            }
            Unexpected::Rts { msg, len, src } => self.start_rendezvous(req, from, msg, tag, len, src, buf),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn start_rendezvous(&mut self, req: ReqId, from: Rank, msg: MsgId, tag: Tag, len: u64, src: MemDesc, buf: BufDesc) {
        if len > buf.len {
            self.send(from, Packet::Abort { msg, reason: AbortReason::Truncated, dir: Dir::ToSender });
            return self.complete(req, Err(ProtoError::Truncated { msg_len: len, buf_len: buf.len }));
        }
        let choice = if from == self.cfg.rank {
            ProtocolChoice { protocol: Protocol::SelfCopy, reason: "sender and receiver are the same rank" }
        } else {
            let cfg = &self.cfg;
            let f = from as usize;
            let load =
                PeerLoad { sender_busy: self.sends_to[f] > 0, pulling: self.pulling[f], pushing: self.pushing[f] };
            policy::choose(&cfg.policy, &src, buf.device, buf.region.is_some(), len, load, |a, b| cfg.can_access(a, b))
        };
        let mut choice = choice;
        let split = self.coop_split(len);
        if choice.protocol == Protocol::Coop && (split == 0 || split >= len) {
            choice = ProtocolChoice { protocol: Protocol::Get, reason: "message too small to split: receiver pulls" };
        }
        self.emit(Action::Chose { req, peer: from, len, choice });
        let mut x = RecvXfer {
            req,
            tag,
            len,
            buf,
            proto: choice.protocol,
            pending: 0,
            part_done: false,
            shm: None,
            error: None,
        };
        let owner = |chunk| CopyOwner::Recv { from, msg, chunk };
        match choice.protocol {
            Protocol::SelfCopy => {
                // The sender is this engine: copy straight between the two user buffers.
                let Some(s) = self.sends.get_mut(&msg) else {
                    self.violation(from, format!("self RTS {msg} without a send"));
                    return self.complete(req, Err(ProtoError::Protocol { rank: from, what: "lost self send".into() }));
                };
                s.proto = Some(Protocol::SelfCopy);
                let sreq = s.req;
                let engine = match (s.buf.device, buf.device) {
                    (Some(d), _) | (None, Some(d)) => CopyEngine::Device(d),
                    (None, None) => CopyEngine::Host,
                };
                x.pending = self.issue_range(
                    owner(None),
                    engine,
                    |o| Loc::User { req: sreq, offset: o },
                    |o| Loc::User { req, offset: o },
                    0,
                    len,
                );
            }
            Protocol::Get => {
                let (MemDesc::Device(region), Some(dev)) = (src, buf.device) else { unreachable!("policy") };
                x.pending = self.issue_range(
                    owner(None),
                    CopyEngine::Device(dev),
                    |o| Loc::Peer { peer: from, region, offset: o },
                    |o| Loc::User { req, offset: o },
                    0,
                    len,
                );
            }
            Protocol::Put => {
                self.send(from, Packet::Cts { msg, mode: CtsMode::Put, dst: buf.region, split: len });
            }
            Protocol::Coop => {
                let (MemDesc::Device(region), Some(dev)) = (src, buf.device) else { unreachable!("policy") };
                self.send(from, Packet::Cts { msg, mode: CtsMode::Coop, dst: buf.region, split });
                x.pending = self.issue_range(
                    owner(None),
                    CopyEngine::Device(dev),
                    |o| Loc::Peer { peer: from, region, offset: o },
                    |o| Loc::User { req, offset: o },
                    split,
                    len,
                );
            }
            Protocol::Shm => {
                self.send(from, Packet::Cts { msg, mode: CtsMode::Shm, dst: None, split: 0 });
                x.shm = Some(ShmState::new(len, self.cfg.chunk_size));
            }
        }
        self.insert_recv((from, msg), x);
    }

    /// Starts tracking a receive, counted in its sender's engine load.
    fn insert_recv(&mut self, key: (Rank, MsgId), x: RecvXfer) {
        if let Some(n) = self.load_of(key.0, x.proto) {
            *n += 1;
        }
        self.recvs.insert(key, x);
    }

    /// The per-peer count a receive by `proto` is part of, if any.
    fn load_of(&mut self, from: Rank, proto: Protocol) -> Option<&mut u32> {
        match proto {
            Protocol::Get => Some(&mut self.pulling[from as usize]),
            Protocol::Put => Some(&mut self.pushing[from as usize]),
            _ => None,
        }
    }

    /// Where COOPERATE splits a message: the sender's share, aligned down to 4 KiB
    /// so neither engine's part starts mid-page.
    fn coop_split(&self, len: u64) -> u64 {
        let raw = (len as u128 * self.cfg.coop_sender_permille as u128 / 1000) as u64;
        raw & !0xfff
    }

    /// Issues copies for `[start, end)`, split by `copy_split` over `lanes`; returns
    /// how many were issued.
    fn issue_range(
        &mut self,
        owner: CopyOwner,
        engine: CopyEngine,
        src: impl Fn(u64) -> Loc,
        dst: impl Fn(u64) -> Loc,
        start: u64,
        end: u64,
    ) -> u32 {
        let piece = if self.cfg.copy_split == 0 { end - start } else { self.cfg.copy_split };
        let mut n = 0;
        let mut off = start;
        while off < end {
            let len = piece.min(end - off);
            let id = self.new_copy(owner);
            let lane = n % self.cfg.lanes.max(1);
            self.emit(Action::Copy(CopyCmd { id, engine, lane, src: src(off), dst: dst(off), len }));
            n += 1;
            off += len;
        }
        n
    }

    fn new_copy(&mut self, owner: CopyOwner) -> CopyId {
        let id = CopyId(self.next_copy);
        self.next_copy += 1;
        self.copies.insert(id, owner);
        id
    }

    /// A control packet arrived from `from`.
    pub fn on_packet(&mut self, from: Rank, packet: Packet) {
        if from >= self.cfg.size {
            return self.violation(from, format!("packet from rank {from} outside the job"));
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
            Packet::Cookie { msg } => match self.sends.get_mut(&msg) {
                Some(s) if s.to == from && s.proto == Some(Protocol::Coop) && !s.cookie => {
                    s.cookie = true;
                    self.try_finish_send(msg);
                }
                _ => self.violation(from, format!("COOKIE for unknown or non-cooperative message {msg}")),
            },
            Packet::Done { msg, dir: Dir::ToSender } => match self.sends.get_mut(&msg) {
                Some(s) if s.to == from && s.proto.is_none() => {
                    // GET: the receiver pulled everything; our buffer is free.
                    s.proto = Some(Protocol::Get);
                    self.finish_send(msg);
                }
                _ => self.violation(from, format!("DONE for message {msg} that awaits none")),
            },
            Packet::Done { msg, dir: Dir::ToReceiver } => match self.recvs.get(&(from, msg)) {
                Some(r) if matches!(r.proto, Protocol::Put | Protocol::Coop) && r.error.is_none() => {
                    if r.proto == Protocol::Coop && !r.part_done {
                        self.violation(from, format!("DONE for cooperative message {msg} before its COOKIE"));
                    } else {
                        self.finish_recv((from, msg));
                    }
                }
                _ => self.violation(from, format!("DONE for unknown message {msg} from rank {from}")),
            },
            Packet::Chunk { msg, index, len, slot } => self.on_chunk(from, msg, index, len, slot),
            Packet::ChunkAck { msg, index } => self.on_chunk_ack(from, msg, index),
            Packet::Abort { msg, reason, dir: Dir::ToSender } => match self.sends.get(&msg) {
                Some(s) if s.to == from => {
                    if reason == AbortReason::Truncated && s.proto.is_none() {
                        // MPI: the send succeeds; the receiver reports the truncation.
                        self.finish_send(msg);
                    } else {
                        let err = ProtoError::Aborted { rank: from, reason: format!("{reason:?}") };
                        self.fail_send(msg, err, false);
                    }
                }
                _ => self.violation(from, format!("ABORT for unknown message {msg}")),
            },
            Packet::Abort { msg, reason, dir: Dir::ToReceiver } => {
                if self.recvs.contains_key(&(from, msg)) {
                    let err = ProtoError::Aborted { rank: from, reason: format!("{reason:?}") };
                    self.fail_recv((from, msg), err, false);
                } else {
                    // An unmatched RTS whose sender gave up: drop it.
                    self.matcher.retain_unexpected(|s, u| {
                        !(s == from && matches!(u, Unexpected::Rts { msg: m, .. } if *m == msg))
                    });
                }
            }
            Packet::Rtr { recv, expect, tag, len, dst } => self.on_rtr(from, RtrOffer { recv, expect, tag, len, dst }),
            Packet::RtrPut { msg, tag, len, recv } => self.on_rtr_put(from, msg, tag, len, ReqId(recv)),
            Packet::RtrRevoke { recv } => {
                self.rtr[from as usize].offers.retain(|o| o.recv != recv);
                self.send(from, Packet::RtrRevoked { recv });
            }
            Packet::RtrRevoked { recv } => {
                let req = ReqId(recv);
                // Not offered any more: an RTR_PUT or another message took it first.
                if matches!(self.posted.get(&req).and_then(|p| p.offer), Some(o) if o.to == from && o.cancelling) {
                    self.matcher.cancel(req);
                    self.posted.remove(&req);
                    self.complete(req, Err(ProtoError::Cancelled));
                }
            }
            Packet::FreeMarks { .. } | Packet::FreeAck { .. } => {
                self.violation(from, "free-commit packet routed to the LMT engine".into())
            }
        }
    }

    fn on_rtr(&mut self, from: Rank, offer: RtrOffer) {
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
    fn on_rtr_put(&mut self, from: Rank, msg: MsgId, tag: Tag, len: u64, req: ReqId) {
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
            RecvXfer { req, tag, len, buf, proto: Protocol::Put, pending: 0, part_done: false, shm: None, error: None },
        );
    }

    /// Whether an RTS is acceptable; a bad one is reported and refused (ABORT), so
    /// it can never make this rank read or write outside the exported allocation.
    fn check_rts(&mut self, from: Rank, msg: MsgId, len: u64, src: &MemDesc) -> bool {
        let refuse = |e: &mut Self, reason, what: String| {
            e.violation(from, what);
            e.send(from, Packet::Abort { msg, reason, dir: Dir::ToSender });
            false
        };
        if let MemDesc::Device(r) = src {
            if !r.covers(len) {
                let what = format!(
                    "RTS {msg}: {len} bytes at offset {} exceed the {}-byte allocation",
                    r.offset, r.alloc_size
                );
                return refuse(self, AbortReason::BadRequest, what);
            }
            if r.node != self.cfg.node {
                return refuse(
                    self,
                    AbortReason::Unsupported,
                    format!("RTS {msg}: buffer on node {:#x}, not this node", r.node),
                );
            }
            if r.device >= self.cfg.devices {
                return refuse(
                    self,
                    AbortReason::BadRequest,
                    format!("RTS {msg}: device {} does not exist here", r.device),
                );
            }
        }
        if len == 0 {
            return refuse(self, AbortReason::BadRequest, format!("RTS {msg} for an empty message"));
        }
        true
    }

    /// For a host that matches messages itself (the LMT plugin ABI): starts
    /// receiving the message announced by `rts` (an RTS packet from `from`, as the
    /// host carried it) into `buf`. Returns false, having completed `req` with an
    /// error, if `rts` is not an acceptable RTS.
    pub fn post_matched_recv(&mut self, req: ReqId, from: Rank, rts: Packet, buf: BufDesc) -> bool {
        let Packet::Rts { msg, tag, len, src } = rts else {
            let what = format!("expected an RTS cookie, got {rts:?}");
            self.complete(req, Err(ProtoError::Protocol { rank: from, what }));
            return false;
        };
        if from >= self.cfg.size || !self.check_rts(from, msg, len, &src) {
            let what = format!("RTS {msg} refused");
            self.complete(req, Err(ProtoError::Protocol { rank: from, what }));
            return false;
        }
        self.start_rendezvous(req, from, msg, tag, len, src, buf);
        true
    }

    fn arrive(&mut self, from: Rank, tag: Tag, u: Unexpected) {
        if let Some((req, u)) = self.matcher.arrive(from, tag, u) {
            // Matched as usual: any RTR for it is stale (this was the message it named).
            let buf = self.posted.remove(&req).expect("posted receive has a buffer").buf;
            self.start_recv(req, from, tag, buf, u);
        }
    }

    fn on_cts(&mut self, from: Rank, msg: MsgId, mode: CtsMode, dst: Option<Region>, split: u64) {
        let Some(s) = self.sends.get_mut(&msg) else {
            // Tell the receiver, whose request would otherwise wait for a DONE that
            // never comes (the RTS it answers was not ours: forged or stale).
            self.violation(from, format!("CTS for unknown message {msg}"));
            return self.send(from, Packet::Abort { msg, reason: AbortReason::BadRequest, dir: Dir::ToReceiver });
        };
        if s.to != from || s.proto.is_some() {
            return self.violation(from, format!("CTS for message {msg} not awaiting one"));
        }
        let len = s.buf.len;
        let (req, dev) = (s.req, s.buf.device);
        let bad = |what: &str| format!("CTS {mode:?} for message {msg}: {what}");
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
                    CopyOwner::Send { msg, chunk: None },
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
            CtsMode::Shm => {
                s.proto = Some(Protocol::Shm);
                s.shm = Some(ShmState::new(len, self.cfg.chunk_size));
                self.shm_rings.entry(from).or_default().queue.push_back(msg);
                self.pump_shm(from);
            }
        }
    }

    /// Fills the free slots of the staging ring to `to` with the next chunks of the
    /// SHM sends queued on it, in order.
    fn pump_shm(&mut self, to: Rank) {
        let (depth, chunk, me) = (self.cfg.depth as usize, self.cfg.chunk_size, self.cfg.rank);
        let Engine { shm_rings, sends, .. } = self;
        let Some(ring) = shm_rings.get_mut(&to) else { return };
        if ring.slots.is_empty() {
            ring.slots = vec![None; depth];
        }
        // (message, chunk, request, byte offset, bytes, engine)
        let mut cmds = Vec::new();
        let mut queued = ring.queue.iter();
        let mut current = queued.next().copied();
        for (slot, owner) in ring.slots.iter_mut().enumerate().filter(|(_, o)| o.is_none()) {
            // The first queued send with chunks left to fill (failed ones fill no more).
            let next = loop {
                let Some(msg) = current else { break None };
                let s = &sends[&msg];
                let st = s.shm.as_ref().expect("SHM send has SHM state");
                if s.error.is_none() && st.next < st.nchunks {
                    break Some(msg);
                }
                current = queued.next().copied();
            };
            let Some(msg) = next else { break };
            let s = sends.get_mut(&msg).expect("queued SHM send is live");
            let st = s.shm.as_mut().expect("SHM send has SHM state");
            let k = st.next;
            st.next += 1;
            s.pending += 1;
            let off = k as u64 * chunk;
            let engine = s.buf.device.map_or(CopyEngine::Host, CopyEngine::Device);
            *owner = Some(SlotUse::Filling(msg, k));
            cmds.push((
                msg,
                StagedChunk { index: k, slot: slot as u32 },
                s.req,
                off,
                chunk.min(s.buf.len - off),
                engine,
            ));
        }
        for (msg, c, req, off, n, engine) in cmds {
            let id = self.new_copy(CopyOwner::Send { msg, chunk: Some(c) });
            self.emit(Action::Copy(CopyCmd {
                id,
                engine,
                lane: 0,
                src: Loc::User { req, offset: off },
                dst: Loc::Staging { from: me, to, slot: c.slot },
                len: n,
            }));
        }
    }

    /// Marks `slot` of the ring to `to` free and lets the queued sends fill it.
    fn free_slot(&mut self, to: Rank, slot: u32) {
        if let Some(ring) = self.shm_rings.get_mut(&to) {
            ring.slots[slot as usize] = None;
            self.pump_shm(to);
        }
    }

    fn on_chunk(&mut self, from: Rank, msg: MsgId, index: u32, len: u32, slot: u32) {
        let chunk = self.cfg.chunk_size;
        let me = self.cfg.rank;
        if slot >= self.cfg.depth {
            return self.violation(
                from,
                format!("CHUNK {index} of message {msg} in slot {slot} of a {}-slot ring", self.cfg.depth),
            );
        }
        let Some(r) = self.recvs.get_mut(&(from, msg)) else {
            // Nothing is read from the slot; the acknowledgement keeps the sender's
            // ring moving.
            if !self.failed_shm_recvs.contains(&(from, msg)) {
                self.violation(from, format!("CHUNK for unknown message {msg}"));
            }
            return self.send(from, Packet::ChunkAck { msg, index });
        };
        let Some(st) = r.shm.as_ref() else {
            return self.violation(from, format!("CHUNK for message {msg} not moving through SHM"));
        };
        let off = index as u64 * chunk;
        let expect = if index < st.nchunks { chunk.min(r.len - off) } else { 0 };
        if index >= st.nchunks || len as u64 != expect {
            let what = format!("CHUNK {index} of {len} bytes for message {msg} outside its {} chunks", st.nchunks);
            self.violation(from, what.clone());
            return self.fail_recv((from, msg), ProtoError::Protocol { rank: from, what }, true);
        }
        if r.error.is_some() {
            // Failed already: acknowledge so the sender's ring keeps moving.
            return self.send(from, Packet::ChunkAck { msg, index });
        }
        let req = r.req;
        let engine = r.buf.device.map_or(CopyEngine::Host, CopyEngine::Device);
        r.pending += 1;
        let id = self.new_copy(CopyOwner::Recv { from, msg, chunk: Some(index) });
        self.emit(Action::Copy(CopyCmd {
            id,
            engine,
            lane: 0,
            src: Loc::Staging { from, to: me, slot },
            dst: Loc::User { req, offset: off },
            len: len as u64,
        }));
    }

    fn on_chunk_ack(&mut self, from: Rank, msg: MsgId, index: u32) {
        let filled = Some(SlotUse::Filled(msg, index));
        let Some(slot) = self.shm_rings.get(&from).and_then(|ring| ring.slots.iter().position(|o| *o == filled)) else {
            return self
                .violation(from, format!("CHUNK_ACK {index} for message {msg}: no such chunk waits in the ring"));
        };
        // The send may have failed and gone; the slot is free either way.
        let finished = match self.sends.get_mut(&msg) {
            Some(s) => {
                let st = s.shm.as_mut().expect("a ring slot's send moves through SHM");
                st.acked += 1;
                st.acked == st.nchunks
            }
            None => false,
        };
        if finished {
            self.finish_send(msg);
        }
        self.free_slot(from, slot as u32);
    }

    /// A copy finished (Err carries the transport's description of the failure).
    pub fn on_copy_done(&mut self, id: CopyId, result: Result<(), String>) {
        let Some(owner) = self.copies.remove(id) else {
            return self.violation(self.cfg.rank, format!("completion of unknown copy {id:?}"));
        };
        match owner {
            CopyOwner::Send { msg, chunk } => {
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
                if let Some(c) = chunk {
                    let st = s.shm.as_mut().expect("chunk copy of an SHM send");
                    st.done += 1;
                    let len = self.cfg.chunk_size.min(s.buf.len - c.index as u64 * self.cfg.chunk_size) as u32;
                    let (to, all_filled) = (s.to, st.done == st.nchunks);
                    if let Some(ring) = self.shm_rings.get_mut(&to) {
                        ring.slots[c.slot as usize] = Some(SlotUse::Filled(msg, c.index));
                    }
                    self.send(to, Packet::Chunk { msg, index: c.index, len, slot: c.slot });
                    if all_filled {
                        // The user's buffer is no longer read; the ring drains on.
                        self.complete_send_request(msg);
                    }
                } else {
                    self.try_finish_send(msg);
                }
            }
            CopyOwner::Recv { from, msg, chunk } => {
                let key = (from, msg);
                let Some(r) = self.recvs.get_mut(&key) else { return };
                r.pending -= 1;
                if let Some(index) = chunk {
                    // The slot is no longer read, whatever became of the copy.
                    self.send(from, Packet::ChunkAck { msg, index });
                }
                let Some(r) = self.recvs.get_mut(&key) else { return };
                if let Err(what) = result {
                    return self.fail_recv(key, ProtoError::CopyFailed { what }, true);
                }
                if r.error.is_some() {
                    return self.finish_recv(key);
                }
                match (r.proto, chunk) {
                    (Protocol::Shm, Some(_)) => {
                        let st = r.shm.as_mut().expect("SHM receive");
                        st.done += 1;
                        let all = st.done == st.nchunks;
                        if all {
                            self.finish_recv(key);
                        }
                    }
                    (Protocol::Get, _) if r.pending == 0 => {
                        self.send(from, Packet::Done { msg, dir: Dir::ToSender });
                        self.finish_recv(key);
                    }
                    (Protocol::Coop, _) if r.pending == 0 => {
                        r.part_done = true;
                        self.send(from, Packet::Cookie { msg });
                    }
                    (Protocol::SelfCopy, _) if r.pending == 0 => {
                        self.finish_send(msg);
                        self.finish_recv(key);
                    }
                    _ => {}
                }
            }
        }
    }

    /// PUT and COOPERATE senders finish when their copies are done (and, for
    /// COOPERATE, the receiver's COOKIE arrived); failed sends when no copy runs.
    fn try_finish_send(&mut self, msg: MsgId) {
        let Some(s) = self.sends.get(&msg) else { return };
        if s.pending > 0 {
            return;
        }
        if s.error.is_some() {
            return self.finish_send(msg);
        }
        let ready = match s.proto {
            Some(Protocol::Put) => true,
            Some(Protocol::Coop) => s.cookie,
            _ => false,
        };
        if ready {
            let to = s.to;
            self.send(to, Packet::Done { msg, dir: Dir::ToReceiver });
            self.finish_send(msg);
        }
    }

    fn complete_send_request(&mut self, msg: MsgId) {
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
    fn finish_send(&mut self, msg: MsgId) {
        let Some(s) = self.sends.get(&msg) else { return };
        if s.pending > 0 {
            return;
        }
        self.complete_send_request(msg);
        let s = self.sends.remove(&msg).expect("live send");
        self.sends_to[s.to as usize] -= 1;
        if s.proto == Some(Protocol::Shm) {
            if let Some(ring) = self.shm_rings.get_mut(&s.to) {
                ring.queue.retain(|m| *m != msg);
            }
        }
    }

    fn finish_recv(&mut self, key: (Rank, MsgId)) {
        let Some(r) = self.recvs.get(&key) else { return };
        if r.pending > 0 {
            return;
        }
        let r = self.recvs.remove(&key).expect("live receive");
        if let Some(n) = self.load_of(key.0, r.proto) {
            *n -= 1;
        }
        if r.proto == Protocol::Shm && r.error.is_some() && !self.dead[key.0 as usize] {
            // The sender may have announced chunks before it learnt of the failure.
            if self.failed_shm_recvs.len() == FAILED_SHM_MEMORY {
                self.failed_shm_recvs.pop_front();
            }
            self.failed_shm_recvs.push_back(key);
        }
        let result = match r.error {
            Some(e) => Err(e),
            None => Ok(Status { source: key.0, tag: r.tag, len: r.len }),
        };
        self.complete(r.req, result);
    }

    fn fail_send(&mut self, msg: MsgId, err: ProtoError, notify: bool) {
        let Some(s) = self.sends.get_mut(&msg) else { return };
        if s.error.is_none() {
            s.error = Some(err);
            if notify {
                let to = s.to;
                self.send(to, Packet::Abort { msg, reason: AbortReason::CopyFailed, dir: Dir::ToReceiver });
            }
        }
        self.finish_send(msg);
    }

    fn fail_recv(&mut self, key: (Rank, MsgId), err: ProtoError, notify: bool) {
        let Some(r) = self.recvs.get_mut(&key) else { return };
        if r.error.is_none() {
            r.error = Some(err);
            if notify {
                self.send(key.0, Packet::Abort { msg: key.1, reason: AbortReason::CopyFailed, dir: Dir::ToSender });
            }
        }
        self.finish_recv(key);
    }

    /// Rank `peer` died or exited: its transfers fail (once their copies stop), and
    /// receives that can only match it fail now.
    pub fn on_peer_failed(&mut self, peer: Rank) {
        if peer >= self.cfg.size || self.dead[peer as usize] || peer == self.cfg.rank {
            return;
        }
        self.dead[peer as usize] = true;
        // No offers from it or waits for them; its counts no longer matter.
        self.rtr[peer as usize] = RtrPeer { credit: 0, ..RtrPeer::default() };
        for p in self.posted.values_mut() {
            if p.offer.is_some_and(|o| o.to == peer) {
                p.offer = None;
            }
        }
        let err = ProtoError::PeerFailed { rank: peer };
        let sends: Vec<MsgId> = self.sends.iter().filter(|(_, s)| s.to == peer).map(|(m, _)| *m).collect();
        self.shm_rings.remove(&peer);
        for msg in sends {
            self.fail_send(msg, err.clone(), false);
        }
        let recvs: Vec<(Rank, MsgId)> = self.recvs.keys().filter(|(f, _)| *f == peer).copied().collect();
        for key in recvs {
            self.fail_recv(key, err.clone(), false);
        }
        for req in self.matcher.drain_posted_from(peer) {
            self.posted.remove(&req);
            self.complete(req, Err(err.clone()));
        }
        // With no live peer left, a wildcard receive could only be matched by this
        // rank itself; fail it rather than wait forever (MPI's fault-tolerance
        // extension reports such receives as failed too).
        let me = self.cfg.rank as usize;
        if self.dead.iter().enumerate().all(|(r, d)| *d || r == me) {
            for req in self.matcher.drain_posted_where(|sel| sel.source.is_none()) {
                self.posted.remove(&req);
                self.complete(req, Err(err.clone()));
            }
        }
        // Its eager messages already arrived whole and stay receivable; its RTSs
        // can never be fetched.
        self.matcher.retain_unexpected(|s, u| !(s == peer && matches!(u, Unexpected::Rts { .. })));
    }

    /// Whether a peer was declared failed.
    pub fn is_peer_failed(&self, peer: Rank) -> bool {
        self.dead.get(peer as usize).copied().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(msg: MsgId) -> CopyOwner {
        CopyOwner::Send { msg, chunk: None }
    }

    fn msg_of(o: Option<CopyOwner>) -> Option<MsgId> {
        match o {
            Some(CopyOwner::Send { msg, .. }) => Some(msg),
            _ => None,
        }
    }

    #[test]
    fn copy_window_finds_copies_finished_in_any_order() {
        let mut w = CopyWindow::default();
        for id in 10..20 {
            w.insert(CopyId(id), owner(id));
        }
        // Out of order: the window stays open behind the oldest copy.
        for id in [12, 19, 15] {
            assert_eq!(msg_of(w.remove(CopyId(id))), Some(id));
        }
        assert_eq!(w.slots.len(), 10);
        assert!(w.remove(CopyId(12)).is_none(), "each copy is reported once");
        assert!(w.remove(CopyId(9)).is_none() && w.remove(CopyId(20)).is_none(), "ids outside the window");
        for id in [10, 11, 13, 14] {
            assert_eq!(msg_of(w.remove(CopyId(id))), Some(id));
        }
        // The oldest four and the holes behind them are gone.
        assert_eq!((w.base, w.slots.len(), w.live), (16, 4, 3));
        for id in [16, 17, 18] {
            assert_eq!(msg_of(w.remove(CopyId(id))), Some(id));
        }
        assert!(w.is_empty() && w.slots.is_empty());
        // Empty, it starts again at the next id issued.
        w.insert(CopyId(40), owner(40));
        assert_eq!(msg_of(w.remove(CopyId(40))), Some(40));
        assert!(w.is_empty());
    }
}
