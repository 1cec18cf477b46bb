//! Copies in flight: who owns each ([`OpOwner`]), the id-indexed window that finds
//! it again on completion ([`OpWindow`]), issuing a range as split copies over the
//! lanes, and routing a completion to the send or receive that waits for it.
//!
//! Every copy issued is reported done exactly once, failed ones included: requests
//! complete only once their copies stop, because an engine may still read or write
//! their buffers until then. The network transfers of the NET rendezvous (`net`) follow
//! the same rule and are kept in a window of their own (their ids are another sequence).

use std::collections::VecDeque;

use super::shm::StagedChunk;
use super::{Action, CopyCmd, CopyEngine, Engine, Loc};
use crate::{CopyId, MsgId, Rank};

/// Who owns a copy (or network transfer) in flight; `chunk` is always None for a
/// network transfer.
#[derive(Clone, Copy, Debug)]
pub(super) enum OpOwner {
    Send {
        msg: MsgId,
        chunk: Option<StagedChunk>,
    },
    Recv {
        from: Rank,
        msg: MsgId,
        chunk: Option<u32>,
    },
    /// A network receive that drops a pushed message's data no receive wants
    /// ([`Action::NetDrain`](super::Action::NetDrain)); never a copy.
    Drain {
        from: Rank,
        msg: MsgId,
    },
}

/// The copies (or network transfers) in flight, by id. Ids are issued in sequence and
/// operations finish in about that order, so a window that starts at the oldest unfinished
/// one serves as the map, with no hashing on the path of every copy. A copy that finishes late keeps the window open
/// behind it (a slot per later copy) until it does; every copy issued is reported done,
/// failed ones included, so the window always closes.
#[derive(Debug, Default)]
pub(super) struct OpWindow {
    /// Id of `slots[0]`.
    base: u64,
    slots: VecDeque<Option<OpOwner>>,
    live: usize,
}

impl OpWindow {
    /// Adds the operation with the next id in sequence.
    pub(super) fn insert(&mut self, id: u64, owner: OpOwner) {
        if self.slots.is_empty() {
            self.base = id;
        }
        debug_assert_eq!(id, self.base + self.slots.len() as u64, "ids are inserted in sequence");
        self.slots.push_back(Some(owner));
        self.live += 1;
    }

    /// The operations in flight, with their ids, oldest first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &OpOwner)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, o)| o.as_ref().map(|o| (self.base + i as u64, o)))
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<OpOwner> {
        let i = usize::try_from(id.checked_sub(self.base)?).ok()?;
        let owner = self.slots.get_mut(i)?.take()?;
        self.live -= 1;
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base += 1;
        }
        Some(owner)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.live == 0
    }
}

impl Engine {
    /// Issues copies for `[start, end)`, split by `copy_split` over `lanes`; returns
    /// how many were issued.
    pub(super) fn issue_range(
        &mut self,
        owner: OpOwner,
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

    pub(super) fn new_copy(&mut self, owner: OpOwner) -> CopyId {
        let id = CopyId(self.next_copy);
        self.next_copy += 1;
        self.copies.insert(id.0, owner);
        id
    }

    /// A copy finished (Err carries the transport's description of the failure).
    pub fn on_copy_done(&mut self, id: CopyId, result: Result<(), String>) {
        let Some(owner) = self.copies.remove(id.0) else {
            return self.violation(self.cfg.rank, format!("completion of unknown copy {id:?}"));
        };
        self.copy_finished(owner, result);
    }

    /// Routes the end of a copy `owner` issued to the send or receive that waits for it.
    pub(super) fn copy_finished(&mut self, owner: OpOwner, result: Result<(), String>) {
        match owner {
            OpOwner::Send { msg, chunk } => self.on_send_copy_done(msg, chunk, result),
            OpOwner::Recv { from, msg, chunk } => self.on_recv_copy_done((from, msg), chunk, result),
            OpOwner::Drain { from, msg } => {
                self.violation(self.cfg.rank, format!("a copy reported for the drain of message {msg} of {from}"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(msg: MsgId) -> OpOwner {
        OpOwner::Send { msg, chunk: None }
    }

    fn msg_of(o: Option<OpOwner>) -> Option<MsgId> {
        match o {
            Some(OpOwner::Send { msg, .. }) => Some(msg),
            _ => None,
        }
    }

    #[test]
    fn copy_window_finds_copies_finished_in_any_order() {
        let mut w = OpWindow::default();
        for id in 10..20 {
            w.insert(id, owner(id));
        }
        // Out of order: the window stays open behind the oldest copy.
        for id in [12, 19, 15] {
            assert_eq!(msg_of(w.remove(id)), Some(id));
        }
        assert_eq!(w.slots.len(), 10);
        assert!(w.remove(12).is_none(), "each copy is reported once");
        assert!(w.remove(9).is_none() && w.remove(20).is_none(), "ids outside the window");
        for id in [10, 11, 13, 14] {
            assert_eq!(msg_of(w.remove(id)), Some(id));
        }
        // The oldest four and the holes behind them are gone.
        assert_eq!((w.base, w.slots.len(), w.live), (16, 4, 3));
        for id in [16, 17, 18] {
            assert_eq!(msg_of(w.remove(id)), Some(id));
        }
        assert!(w.is_empty() && w.slots.is_empty());
        // Empty, it starts again at the next id issued.
        w.insert(40, owner(40));
        assert_eq!(msg_of(w.remove(40)), Some(40));
        assert!(w.is_empty());
    }
}
