//! The receiver's side of a message: posting, probing and cancelling receives, matching
//! them against arriving messages (eager payloads, RTSs), refusing bad RTSs, and ending
//! a receive on DONE, ABORT, its last copy or its network transfer.
//!
//! A message that arrives before its receive waits in the matcher as [`Unexpected`]; a
//! receive posted first waits as a [`PostedRecv`]. Once matched, an eager payload is
//! delivered at once, and a rendezvous is started (see `rendezvous`) and tracked as a
//! [`RecvXfer`] until its copies stop.

use crate::matching::Selector;
use crate::policy::Protocol;
use crate::wire::{AbortReason, Dir, MemDesc, Packet};
use crate::{MsgId, NetId, ProtoError, Rank, ReqId, Tag};

use super::rtr::Offered;
use super::shm::ShmState;
use super::{Action, BufDesc, Engine, Status};

/// A message that arrived before its receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Unexpected {
    Eager { payload: Vec<u8> },
    Rts { msg: MsgId, len: u64, src: MemDesc },
}

/// A posted receive that has not matched: its buffer, and its offer if it was offered.
#[derive(Clone, Copy, Debug)]
pub(super) struct PostedRecv {
    pub(super) buf: BufDesc,
    pub(super) offer: Option<Offered>,
}

/// A matched rendezvous receive in progress.
#[derive(Debug)]
pub(super) struct RecvXfer {
    pub(super) req: ReqId,
    pub(super) tag: Tag,
    pub(super) len: u64,
    pub(super) buf: BufDesc,
    pub(super) proto: Protocol,
    pub(super) pending: u32,
    /// COOPERATE: this side's part is done and COOKIE was sent.
    pub(super) part_done: bool,
    pub(super) shm: Option<ShmState>,
    /// NET: the network receive, while outstanding (also counted in `pending`).
    pub(super) net: Option<NetId>,
    pub(super) error: Option<ProtoError>,
    /// GET: a copy could not map the sender's buffer (its id, and why); once the copies
    /// stop, the message moves by SHM instead (`fallback`).
    pub(super) unmapped: Option<(u64, String)>,
    /// COOPERATE that failed here: the sender's copies into this buffer may still run, so
    /// the receive ends only on its ABORT (sent once they stopped) or its death.
    pub(super) awaiting_sender: bool,
}

/// Completion of an eager message of `msg_len` bytes into a `buf_len`-byte buffer.
fn eager_result(from: Rank, tag: Tag, msg_len: u64, buf_len: u64) -> Result<Status, ProtoError> {
    if msg_len > buf_len {
        Err(ProtoError::Truncated { msg_len, buf_len })
    } else {
        Ok(Status { source: from, tag, len: msg_len })
    }
}

impl Engine {
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

    /// Whether an RTS is acceptable; a bad one is reported and refused (ABORT), so
    /// it can never make this rank read or write outside the exported allocation, nor
    /// map memory of a rank on another node (each node's ranks say [`MemDesc::Net`] to
    /// the others, and only to them).
    pub(super) fn check_rts(&mut self, from: Rank, msg: MsgId, len: u64, src: &MemDesc) -> bool {
        let refuse = |e: &mut Self, reason, what: String| {
            e.violation(from, what);
            e.send(from, Packet::Abort { msg, reason, dir: Dir::ToSender });
            false
        };
        match (src, self.cfg.is_on_node(from)) {
            (MemDesc::Net { .. }, true) => {
                let what = format!("RTS {msg}: a network rendezvous from rank {from}, which shares this node");
                return refuse(self, AbortReason::Unsupported, what);
            }
            (MemDesc::Host | MemDesc::Staged | MemDesc::Device(_), false) => {
                let what = format!("RTS {msg} from rank {from}, on another node, names its buffer: only NET moves it");
                return refuse(self, AbortReason::BadRequest, what);
            }
            _ => {}
        }
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

    /// An eager message or RTS from `from` arrived: it starts moving if a posted receive
    /// takes it, else it waits as unexpected.
    pub(super) fn arrive(&mut self, from: Rank, tag: Tag, u: Unexpected) {
        if let Some((req, u)) = self.matcher.arrive(from, tag, u) {
            // Matched as usual: any RTR for it is stale (this was the message it named).
            let buf = self.posted.remove(&req).expect("posted receive has a buffer").buf;
            self.start_recv(req, from, tag, buf, u);
        }
    }

    /// DONE to the receiver ends a PUT or COOPERATE: the sender's copies are done (for
    /// COOPERATE, after this side's COOKIE).
    pub(super) fn on_done_to_receiver(&mut self, from: Rank, msg: MsgId) {
        match self.recvs.get(&(from, msg)) {
            Some(r) if matches!(r.proto, Protocol::Put | Protocol::Coop) && r.error.is_none() => {
                if r.proto == Protocol::Coop && !r.part_done {
                    self.violation(from, format!("DONE for cooperative message {msg} before its COOKIE"));
                } else {
                    self.finish_recv((from, msg));
                }
            }
            _ => self.violation(from, format!("DONE for unknown message {msg} from rank {from}")),
        }
    }

    /// The sender gave the message up.
    pub(super) fn on_abort_to_receiver(&mut self, from: Rank, msg: MsgId, reason: AbortReason) {
        if self.recvs.contains_key(&(from, msg)) {
            let err = ProtoError::Aborted { rank: from, reason: format!("{reason:?}") };
            self.fail_recv((from, msg), err, false);
        } else {
            // An unmatched RTS whose sender gave up: drop it.
            self.matcher
                .retain_unexpected(|s, u| !(s == from && matches!(u, Unexpected::Rts { msg: m, .. } if *m == msg)));
        }
    }

    /// A copy of the receive `key` finished: a GET or COOPERATE piece, a copy from this
    /// rank's own send, or the drain of SHM chunk `chunk`.
    pub(super) fn on_recv_copy_done(&mut self, key: (Rank, MsgId), chunk: Option<u32>, result: Result<(), String>) {
        let (from, msg) = key;
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
        if r.unmapped.is_some() {
            // A sibling copy could not map the sender's buffer: the whole message moves
            // by SHM once the others stop.
            if r.pending == 0 {
                self.fall_back_to_shm(key);
            }
            return;
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
            // MPI completed the sender's side too: nothing to tell it.
            (Protocol::Net, _) if r.pending == 0 => self.finish_recv(key),
            _ => {}
        }
    }

    /// Ends a receive once its copies stop: completes its request (with its error, if
    /// any) and updates the peer's load.
    pub(super) fn finish_recv(&mut self, key: (Rank, MsgId)) {
        let Some(r) = self.recvs.get(&key) else { return };
        if r.pending > 0 || r.awaiting_sender {
            return;
        }
        let r = self.recvs.remove(&key).expect("live receive");
        if let Some(n) = self.load_of(key.0, r.proto) {
            *n -= 1;
        }
        if r.proto == Protocol::Shm && r.error.is_some() && !self.dead[key.0 as usize] {
            // The sender may have announced chunks before it learnt of the failure.
            self.failed_shm_recvs.remember(key);
        }
        let result = match r.error {
            Some(e) => Err(e),
            None => Ok(Status { source: key.0, tag: r.tag, len: r.len }),
        };
        self.complete(r.req, result);
    }

    /// Fails receive `key` with `err` (the first error stands), telling the sender if
    /// `notify`; it ends once its copies stop, and its network receive, which it asks to
    /// end.
    pub(super) fn fail_recv(&mut self, key: (Rank, MsgId), err: ProtoError, notify: bool) {
        let Some(r) = self.recvs.get_mut(&key) else { return };
        if !notify {
            // The sender said so or died: its copies into this buffer stopped.
            r.awaiting_sender = false;
        }
        if r.error.is_none() {
            // The ABORT this sends makes the sender answer once its copies stopped.
            r.awaiting_sender = notify && r.proto == Protocol::Coop && !r.part_done && !self.dead[key.0 as usize];
            r.error = Some(err);
            let net = r.net;
            if notify {
                self.send(key.0, Packet::Abort { msg: key.1, reason: AbortReason::CopyFailed, dir: Dir::ToSender });
            }
            if let Some(id) = net {
                self.emit(Action::NetCancel { id });
            }
        }
        self.finish_recv(key);
    }
}
