//! Falling back to SHM when this rank cannot map a peer's memory ("fall back, never
//! fail": `docs/memory-kinds.md`).
//!
//! The sender announced an exported buffer (an RTS with a region) and the policy chose
//! GET, but the transport failed to open the mapping of it for a copy: the handle was
//! refused, the import failed, the exporter's fd server could not be reached. Nothing was
//! read or written by such a copy. Once the receive's other copies stop (they may have
//! mapped the buffer, or failed the same way), the receive turns into an SHM one: a
//! CTS(shm) asks the sender to stage the whole message, which a GET's sender (waiting for
//! DONE, with no protocol of its own yet) accepts as for any SHM receive.
//!
//! Every buffer that failed to map is remembered (per peer and buffer id, the last
//! [`Recent::KEPT`](super::Recent)), and the transport hears of it once
//! ([`Action::Unmappable`]): its later messages are chosen for as memory no peer can map
//! (no GET, no COOPERATE), and a receive buffer a peer offered by RTR that failed to map
//! is never pushed into (the message takes an RTS instead).
//!
//! A PUT (CTS or RTR) whose sender cannot map the receiver's buffer falls back the same
//! way from the other side: once the send's copies stop, the sender stages the whole
//! message through the ring, and the receiver, waiting for DONE with nothing of its own in
//! flight, takes the first CHUNK as word of it and turns into an SHM receive.
//!
//! COOPERATE, where both sides copy at once, falls back either way without two copies
//! ever writing one range at once: if the receiver's part cannot map, it sends CTS(shm)
//! instead of COOKIE once its copies stop, and the sender stages the whole message once
//! its own part's copies stopped; if the sender's part cannot map, it stages the whole
//! message once its copies stopped and the receiver's COOKIE came.

use crate::policy::{Protocol, ProtocolChoice};
use crate::wire::{CtsMode, Packet};
use crate::{CopyId, MsgId, Rank};

use super::copies::OpOwner;
use super::shm::ShmState;
use super::{Action, Engine};

impl Engine {
    /// Copy `id` could not start: the transport failed to map the peer buffer with id
    /// `buffer_id` for it, so it read and wrote nothing (`what` says why). A GET falls
    /// back to SHM; any other copy fails as [`on_copy_done`](Self::on_copy_done) with
    /// the error would.
    pub fn on_copy_unmappable(&mut self, id: CopyId, buffer_id: u64, what: String) {
        let Some(owner) = self.copies.remove(id.0) else {
            return self.violation(self.cfg.rank, format!("completion of unknown copy {id:?}"));
        };
        let peer = match owner {
            OpOwner::Send { msg, .. } => self.sends.get(&msg).map(|s| s.to),
            OpOwner::Recv { from, .. } => Some(from),
            OpOwner::Drain { .. } => None,
        };
        if let Some(peer) = peer {
            self.on_peer_unmappable(peer, buffer_id, what.clone());
        }
        let key = match owner {
            OpOwner::Recv { from, msg, chunk: None } => (from, msg),
            OpOwner::Send { msg, chunk: None } => return self.put_unmappable(msg, what),
            other => return self.copy_finished(other, Err(what)),
        };
        let Some(r) = self.recvs.get_mut(&key) else { return };
        if !matches!(r.proto, Protocol::Get | Protocol::Coop) {
            return self.copy_finished(owner, Err(what));
        }
        r.pending -= 1;
        if r.error.is_some() {
            return self.finish_recv(key);
        }
        r.unmapped.get_or_insert((buffer_id, what));
        if r.pending == 0 {
            self.fall_back_to_shm(key);
        }
    }

    /// The transport failed to map peer `peer`'s buffer `buffer_id` (`what` says why),
    /// for a copy or ahead of one (an offered receive buffer): it is remembered, so that
    /// no later message maps it, and reported once.
    pub fn on_peer_unmappable(&mut self, peer: Rank, buffer_id: u64, what: String) {
        if !self.unmappable.contains(&(peer, buffer_id)) {
            self.unmappable.remember((peer, buffer_id));
            self.emit(Action::Unmappable { peer, buffer_id, what });
        }
    }

    /// Whether this rank failed to map peer `peer`'s buffer `buffer_id` lately.
    pub(super) fn is_unmappable(&self, peer: Rank, buffer_id: u64) -> bool {
        self.unmappable.contains(&(peer, buffer_id))
    }

    /// A PUT copy (CTS, RTR, or a COOPERATE's part) of send `msg` could not map the
    /// receiver's buffer: the message is staged once the send's copies stop (and, for
    /// COOPERATE, the receiver's part: its COOKIE); any other send's copy fails.
    fn put_unmappable(&mut self, msg: MsgId, what: String) {
        let Some(s) = self.sends.get_mut(&msg) else { return };
        if !matches!(s.proto, Some(Protocol::Put | Protocol::Coop)) {
            return self.copy_finished(OpOwner::Send { msg, chunk: None }, Err(what));
        }
        s.pending -= 1;
        s.unmapped = true;
        self.try_finish_send(msg);
    }

    /// Turns PUT send `msg`, whose copies all stopped and one of which could not map the
    /// receiver's buffer, into an SHM send of the whole message: its first CHUNK tells
    /// the receiver ([`adopt_staged_put`](Self::adopt_staged_put)).
    pub(super) fn stage_put(&mut self, msg: MsgId) {
        let chunk_size = self.cfg.chunk_size;
        let Some(s) = self.sends.get_mut(&msg) else { return };
        s.unmapped = false;
        s.proto = Some(Protocol::Shm);
        s.shm = Some(ShmState::new(s.buf.len, chunk_size));
        let to = s.to;
        self.shm_rings.entry(to).or_default().queue.push_back(msg);
        self.pump_shm(to);
    }

    /// A CHUNK arrived for receive `key`: if it is a PUT (CTS or RTR) with nothing of
    /// its own in flight, its sender could not map this buffer and stages the message
    /// instead, and the receive becomes an SHM one.
    pub(super) fn adopt_staged_put(&mut self, key: (Rank, MsgId)) {
        let Some(r) = self.recvs.get_mut(&key) else { return };
        // A COOPERATE's sender stages only once this side's part is done (COOKIE sent).
        let waits = match r.proto {
            Protocol::Put => true,
            Protocol::Coop => r.part_done,
            _ => false,
        };
        if !waits || r.shm.is_some() || r.pending > 0 || r.error.is_some() {
            return;
        }
        self.recv_becomes_shm(key, "the sender could not map this buffer: it stages the message through shared memory");
    }

    /// Turns GET or COOPERATE receive `key`, whose copies all stopped and one of which
    /// could not map the sender's buffer, into an SHM receive of the whole message. A
    /// COOPERATE's sender takes the CTS(shm) as the end of this side's part, and stages
    /// the whole message once its own part's copies stopped (so no two copies write
    /// this buffer at once).
    pub(super) fn fall_back_to_shm(&mut self, key: (Rank, MsgId)) {
        let Some(r) = self.recvs.get_mut(&key) else { return };
        if r.unmapped.take().is_none() {
            return;
        }
        self.recv_becomes_shm(key, "the sender's buffer could not be mapped here: it is staged through shared memory");
        let (from, msg) = key;
        self.send(from, Packet::Cts { msg, mode: CtsMode::Shm, dst: None, split: 0 });
    }

    /// Receive `key` becomes an SHM receive of the whole message, leaving the per-peer
    /// count of the protocol it had (`load_of`), and says so (`reason`).
    fn recv_becomes_shm(&mut self, key: (Rank, MsgId), reason: &'static str) {
        let chunk_size = self.cfg.chunk_size;
        let Some(r) = self.recvs.get_mut(&key) else { return };
        let was = r.proto;
        r.proto = Protocol::Shm;
        r.shm = Some(ShmState::new(r.len, chunk_size));
        let (req, len) = (r.req, r.len);
        if let Some(n) = self.load_of(key.0, was) {
            *n -= 1;
        }
        self.emit(Action::Chose { req, peer: key.0, len, choice: ProtocolChoice { protocol: Protocol::Shm, reason } });
    }
}
