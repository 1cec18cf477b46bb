//! The SHM protocol's staging pipeline: each directed pair of ranks shares a ring of
//! `depth` host slots of `chunk_size` bytes. The sender fills free slots with the next
//! chunks of its queued SHM sends and announces each (CHUNK); the receiver copies it
//! out and frees the slot (CHUNK_ACK).
//!
//! Slots belong to the sender's ring ([`ShmRing`]), not to transfers, so a slot is
//! reused only after the receiver acknowledged it, even when the transfer that filled it
//! failed meanwhile. A receiver acknowledges every CHUNK, also of receives that failed,
//! so the sender's ring always drains.

use std::collections::VecDeque;

use crate::wire::Packet;
use crate::{MsgId, ProtoError, Rank};

use super::copies::OpOwner;
use super::{Action, CopyCmd, CopyEngine, Engine, Loc};

/// Where an SHM transfer stands.
#[derive(Debug)]
pub(super) struct ShmState {
    pub(super) nchunks: u32,
    /// Sender: next chunk to fill. Receiver: unused.
    next: u32,
    /// Sender: chunks filled. Receiver: chunks drained.
    pub(super) done: u32,
    /// Sender: chunks the receiver acknowledged.
    acked: u32,
}

impl ShmState {
    pub(super) fn new(len: u64, chunk: u64) -> Self {
        let nchunks = len.div_ceil(chunk) as u32;
        Self { nchunks, next: 0, done: 0, acked: 0 }
    }
}

/// What a slot of a sender's staging ring holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotUse {
    /// Chunk `.1` of message `.0` is being copied in.
    Filling(MsgId, u32),
    /// It is in, announced by CHUNK, and waits for its CHUNK_ACK.
    Filled(MsgId, u32),
}

/// The sender's side of its staging ring to one peer. Slots are owned here rather
/// than by the transfers, so a slot is reused only once the receiver acknowledged
/// it, even when the transfer that filled it failed and was torn down meanwhile.
#[derive(Debug, Default)]
pub(super) struct ShmRing {
    slots: Vec<Option<SlotUse>>,
    /// SHM sends to this peer in CTS order; the first with chunks left fills next.
    pub(super) queue: VecDeque<MsgId>,
}

/// A staging chunk of an SHM transfer: its index in the message and its slot.
#[derive(Clone, Copy, Debug)]
pub(super) struct StagedChunk {
    index: u32,
    pub(super) slot: u32,
}

impl Engine {
    /// Fills the free slots of the staging ring to `to` with the next chunks of the
    /// SHM sends queued on it, in order.
    pub(super) fn pump_shm(&mut self, to: Rank) {
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
            let id = self.new_copy(OpOwner::Send { msg, chunk: Some(c) });
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
    pub(super) fn free_slot(&mut self, to: Rank, slot: u32) {
        if let Some(ring) = self.shm_rings.get_mut(&to) {
            ring.slots[slot as usize] = None;
            self.pump_shm(to);
        }
    }

    /// The sender announced chunk `index` of `msg` in `slot`: copy it out into the
    /// receive's buffer (the copy's completion acknowledges it).
    pub(super) fn on_chunk(&mut self, from: Rank, msg: MsgId, index: u32, len: u32, slot: u32) {
        let chunk = self.cfg.chunk_size;
        let me = self.cfg.rank;
        if slot >= self.cfg.depth {
            return self.violation(
                from,
                format!("CHUNK {index} of message {msg} in slot {slot} of a {}-slot ring", self.cfg.depth),
            );
        }
        self.adopt_staged_put((from, msg));
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
        let id = self.new_copy(OpOwner::Recv { from, msg, chunk: Some(index) });
        self.emit(Action::Copy(CopyCmd {
            id,
            engine,
            lane: 0,
            src: Loc::Staging { from, to: me, slot },
            dst: Loc::User { req, offset: off },
            len: len as u64,
        }));
    }

    /// The receiver copied chunk `index` of `msg` out: its slot is free, and the send
    /// ends with its last acknowledgement.
    pub(super) fn on_chunk_ack(&mut self, from: Rank, msg: MsgId, index: u32) {
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

    /// Chunk `c` of SHM send `msg` is staged: announce it (CHUNK), and once every chunk
    /// is, complete the user's request, whose buffer is no longer read.
    pub(super) fn on_chunk_filled(&mut self, msg: MsgId, c: StagedChunk) {
        let s = self.sends.get_mut(&msg).expect("live send");
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
    }
}
