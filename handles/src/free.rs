//! Two-phase free of GPU memory that node-local peers may have mapped.
//!
//! Freeing a buffer that a peer still has mapped through IPC does not give the
//! memory back (the peer's mapping keeps it alive), and closing the mapping
//! later races with the peer's reuse of its buffer ids. So freeing is split:
//!
//! 1. `free` only *marks* the buffer ([`FreeMarks`]); it stays allocated.
//! 2. A collective commit among the node-local ranks ([`FreeCommit`]) tells
//!    every peer which buffers are going away. Each peer closes its mappings of
//!    them (invalidating [`HandleCache`](crate::HandleCache) entries and
//!    waiting for in-flight users) and acknowledges. Only when every peer has
//!    acknowledged does the owner truly free its marked memory.
//!
//! This module does no IO: the caller sends the [`Outgoing`] messages it is
//! given, feeds received ones in, and drives the [`Phase`]s that need its
//! action. It never panics on bad input; protocol violations are
//! [`CommitError`]s.
//!
//! # Protocol, for the commit of epoch `e` on rank `r`
//!
//! * `start(marks)` sends `Marks{e, marks}` to every live peer.
//! * Peers' `Marks{e, ..}` are collected; they may arrive before `start` (a
//!   faster peer), and are then kept until `start`.
//! * With all live peers' marks in, the phase is [`Phase::CloseMappings`]: the
//!   caller invalidates its mappings of every buffer in
//!   [`peer_marks`](FreeCommit::peer_marks), waits until they are closed, and
//!   calls [`mappings_closed`](FreeCommit::mappings_closed), which sends
//!   `Ack{e}` to every live peer.
//! * With every live peer's ack in, the phase is [`Phase::ReleaseOwn`]: the
//!   caller takes its marks with [`release_own`](FreeCommit::release_own),
//!   frees them for real, and the phase is [`Phase::Done`].
//!
//! A peer acks only after closing its mappings of *our* marks, so no owner
//! frees memory that any live peer still maps. Epochs count commits from 0;
//! since every rank calls the collective in the same order, they agree. A
//! commit with nothing marked is still a full round, so that epochs stay in
//! step. A peer reported with [`on_peer_failed`](FreeCommit::on_peer_failed)
//! is no longer waited for, in this commit or later ones.
//!
//! A peer can be at most one epoch ahead (it cannot finish a commit without
//! our ack), so only marks for the next epoch are buffered; anything further
//! ahead, and any ack for an epoch not started here, is a protocol error.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

/// [`FreeMarks::mark`] of a buffer that is already marked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "buffer {key:?} is already marked for free; each buffer must be freed \
     once (double free in the application or the allocator)"
)]
pub struct DoubleFree<M> {
    /// The buffer freed twice.
    pub key: M,
}

/// Buffers freed since the last commit, waiting for [`FreeCommit::start`].
#[derive(Debug, Clone)]
pub struct FreeMarks<M> {
    /// Insertion order, so commits list buffers in the order they were freed.
    order: Vec<M>,
    set: HashSet<M>,
}

impl<M> Default for FreeMarks<M> {
    fn default() -> Self {
        FreeMarks { order: Vec::new(), set: HashSet::new() }
    }
}

impl<M: Clone + Eq + Hash> FreeMarks<M> {
    /// No buffer marked.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks `key` for free at the next commit.
    ///
    /// # Errors
    ///
    /// [`DoubleFree`] if it is already marked. Buffers handed to a commit
    /// in progress are no longer here: check
    /// [`FreeCommit::is_releasing`] too.
    pub fn mark(&mut self, key: M) -> Result<(), DoubleFree<M>> {
        if !self.set.insert(key.clone()) {
            return Err(DoubleFree { key });
        }
        self.order.push(key);
        Ok(())
    }

    /// True if `key` is marked and not yet committed.
    pub fn is_marked(&self, key: &M) -> bool {
        self.set.contains(key)
    }

    /// The marks in the order they were made.
    pub fn as_slice(&self) -> &[M] {
        &self.order
    }

    /// How many buffers are marked.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// True when nothing is marked.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Takes the marks for [`FreeCommit::start`], leaving none.
    pub fn take(&mut self) -> Vec<M> {
        self.set.clear();
        std::mem::take(&mut self.order)
    }
}

/// A message of the commit protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FreeMsg<M> {
    /// The sender's buffers to be freed in commit `epoch`.
    Marks {
        /// The commit.
        epoch: u64,
        /// Buffers the receiver must stop mapping.
        marks: Vec<M>,
    },
    /// The sender has closed its mappings of the receiver's marks of `epoch`.
    Ack {
        /// The commit.
        epoch: u64,
    },
}

impl<M> FreeMsg<M> {
    /// The commit this message belongs to.
    pub fn epoch(&self) -> u64 {
        match self {
            FreeMsg::Marks { epoch, .. } | FreeMsg::Ack { epoch } => *epoch,
        }
    }
}

/// A message to send to rank `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing<M> {
    /// Destination node-local rank.
    pub to: usize,
    /// What to send.
    pub msg: FreeMsg<M>,
}

/// Where a [`FreeCommit`] stands; the phases needing the caller say so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// No commit started yet.
    Idle,
    /// Waiting for peers' marks ([`FreeCommit::waiting_for`] says whose).
    CollectingMarks,
    /// Caller: close mappings of every buffer in [`FreeCommit::peer_marks`],
    /// then call [`FreeCommit::mappings_closed`].
    CloseMappings,
    /// Waiting for peers' acks ([`FreeCommit::waiting_for`] says whose).
    AwaitingAcks,
    /// Caller: call [`FreeCommit::release_own`] and free what it returns.
    ReleaseOwn,
    /// The commit is over; the next [`FreeCommit::start`] begins another.
    Done,
}

/// Errors of [`FreeCommit`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    /// Bad `ranks`/`rank` given to [`FreeCommit::new`].
    #[error("rank {rank} is not in 0..{ranks}; pass this rank's node-local rank and the node-local size")]
    InvalidRank {
        /// This rank as given.
        rank: usize,
        /// Node-local size as given.
        ranks: usize,
    },
    /// A message or failure report names a rank outside `0..ranks`.
    #[error("rank {from} is not a node-local rank (0..{ranks}); the message is corrupt or misrouted, drop it")]
    UnknownRank {
        /// The rank named.
        from: usize,
        /// Node-local size.
        ranks: usize,
    },
    /// A message or failure report names this rank itself.
    #[error("rank {rank} got a free-commit message from itself or was reported failed to itself; the message is misrouted, drop it")]
    FromSelf {
        /// This rank.
        rank: usize,
    },
    /// A message from a rank already reported failed.
    #[error(
        "message from rank {from}, which was reported failed; it is no longer part of the commit, drop the message"
    )]
    FromFailedPeer {
        /// The sender.
        from: usize,
    },
    /// A second `Marks` from one peer for one epoch.
    #[error(
        "duplicate marks from rank {from} for commit {epoch}; the sender or the transport repeated a message, drop it"
    )]
    DuplicateMarks {
        /// The sender.
        from: usize,
        /// The commit.
        epoch: u64,
    },
    /// A second `Ack` from one peer for one epoch.
    #[error(
        "duplicate ack from rank {from} for commit {epoch}; the sender or the transport repeated a message, drop it"
    )]
    DuplicateAck {
        /// The sender.
        from: usize,
        /// The commit.
        epoch: u64,
    },
    /// A message for a commit that is over.
    #[error(
        "message from rank {from} for commit {epoch}, but commit {current} is the latest here; it is stale, drop it"
    )]
    StaleEpoch {
        /// The sender.
        from: usize,
        /// The message's commit.
        epoch: u64,
        /// The latest commit started here.
        current: u64,
    },
    /// Marks for a commit more than one ahead, or an ack for a commit not
    /// started here: the peer's commits are out of step with ours.
    #[error("message from rank {from} for commit {epoch}, but the latest commit started here is {started:?} (marks may run one commit ahead, acks none); the ranks' calls to mem_free_commit are out of step")]
    FutureEpoch {
        /// The sender.
        from: usize,
        /// The message's commit.
        epoch: u64,
        /// The latest commit started here, if any.
        started: Option<u64>,
    },
    /// `start` while a commit is in progress.
    #[error("commit {epoch} is still in phase {phase:?}; finish it (drive it to Done) before starting another")]
    Busy {
        /// The commit in progress.
        epoch: u64,
        /// Its phase.
        phase: Phase,
    },
    /// A caller step taken in the wrong phase.
    #[error("{op} is only valid in phase {expected:?}, but the commit is in {phase:?}; check phase() before calling")]
    WrongPhase {
        /// The call made.
        op: &'static str,
        /// The phase it needs.
        expected: Phase,
        /// The phase now.
        phase: Phase,
    },
}

/// One commit's state.
#[derive(Debug)]
struct Round<M> {
    epoch: u64,
    phase: Phase,
    /// This rank's marks; moved out by `release_own`.
    own: Vec<M>,
    /// Marks received per rank.
    peer_marks: Vec<Option<Vec<M>>>,
    /// Acks received per rank.
    acks: Vec<bool>,
}

/// The two-phase free commit of one rank among `ranks` node-local ranks; see
/// the module docs. Reusable: one value drives every commit of the job.
#[derive(Debug)]
pub struct FreeCommit<M> {
    ranks: usize,
    rank: usize,
    /// Peers reported failed; never waited for again.
    failed: Vec<bool>,
    /// Epoch of the next `start`.
    next_epoch: u64,
    /// The commit in progress or last finished.
    round: Option<Round<M>>,
    /// Marks that arrived before `start`, by epoch and sender.
    early: BTreeMap<u64, Vec<Option<Vec<M>>>>,
}

impl<M: Clone> FreeCommit<M> {
    /// The commit state of node-local rank `rank` among `ranks`.
    ///
    /// # Errors
    ///
    /// [`CommitError::InvalidRank`] unless `rank < ranks`.
    pub fn new(ranks: usize, rank: usize) -> Result<Self, CommitError> {
        if rank >= ranks {
            return Err(CommitError::InvalidRank { rank, ranks });
        }
        Ok(FreeCommit { ranks, rank, failed: vec![false; ranks], next_epoch: 0, round: None, early: BTreeMap::new() })
    }

    /// Node-local size.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Where the commit stands.
    pub fn phase(&self) -> Phase {
        self.round.as_ref().map_or(Phase::Idle, |r| r.phase)
    }

    /// Epoch of the commit in progress or last finished; `None` before the
    /// first `start`.
    pub fn epoch(&self) -> Option<u64> {
        self.round.as_ref().map(|r| r.epoch)
    }

    /// True if `rank` was reported failed.
    pub fn is_failed(&self, rank: usize) -> bool {
        self.failed.get(rank).copied().unwrap_or(false)
    }

    /// Starts the next commit with this rank's `marks` (possibly none).
    /// Returns the `Marks` messages to send.
    ///
    /// # Errors
    ///
    /// [`CommitError::Busy`] if a commit is in progress.
    pub fn start(&mut self, marks: Vec<M>) -> Result<Vec<Outgoing<M>>, CommitError> {
        match self.phase() {
            Phase::Idle | Phase::Done => {}
            phase => return Err(CommitError::Busy { epoch: self.epoch().unwrap_or(0), phase }),
        }
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let mut peer_marks = self.early.remove(&epoch).unwrap_or_else(|| vec![None; self.ranks]);
        // Only the next epoch is ever buffered, but drop anything older anyway.
        self.early.retain(|&e, _| e > epoch);
        for (peer, failed) in self.failed.iter().enumerate() {
            if *failed {
                peer_marks[peer] = None;
            }
        }
        let out =
            self.live_peers().map(|to| Outgoing { to, msg: FreeMsg::Marks { epoch, marks: marks.clone() } }).collect();
        self.round =
            Some(Round { epoch, phase: Phase::CollectingMarks, own: marks, peer_marks, acks: vec![false; self.ranks] });
        self.advance();
        Ok(out)
    }

    /// Handles a received message.
    ///
    /// # Errors
    ///
    /// See [`on_marks`](Self::on_marks) and [`on_ack`](Self::on_ack).
    pub fn on_message(&mut self, from: usize, msg: FreeMsg<M>) -> Result<(), CommitError> {
        match msg {
            FreeMsg::Marks { epoch, marks } => self.on_marks(from, epoch, marks),
            FreeMsg::Ack { epoch } => self.on_ack(from, epoch),
        }
    }

    /// Records rank `from`'s marks for commit `epoch`: the buffers of `from`
    /// that this rank must stop mapping.
    ///
    /// # Errors
    ///
    /// Unknown, self or failed sender; duplicate; stale or future epoch.
    /// The state is unchanged on error.
    pub fn on_marks(&mut self, from: usize, epoch: u64, marks: Vec<M>) -> Result<(), CommitError> {
        self.check_sender(from)?;
        let started = self.epoch();
        if let Some(round) = self.round.as_mut().filter(|r| r.epoch == epoch) {
            let slot = &mut round.peer_marks[from];
            if slot.is_some() {
                return Err(CommitError::DuplicateMarks { from, epoch });
            }
            *slot = Some(marks);
            self.advance();
            return Ok(());
        }
        if epoch < self.next_epoch {
            return Err(CommitError::StaleEpoch { from, epoch, current: started.unwrap_or(0) });
        }
        if epoch > self.next_epoch {
            return Err(CommitError::FutureEpoch { from, epoch, started });
        }
        let ranks = self.ranks;
        let slot = &mut self.early.entry(epoch).or_insert_with(|| vec![None; ranks])[from];
        if slot.is_some() {
            return Err(CommitError::DuplicateMarks { from, epoch });
        }
        *slot = Some(marks);
        Ok(())
    }

    /// Records rank `from`'s ack of commit `epoch`: it has closed its mappings
    /// of this rank's marks.
    ///
    /// # Errors
    ///
    /// Unknown, self or failed sender; duplicate; stale epoch; an epoch not
    /// started here (a peer cannot ack marks it has not been sent).
    pub fn on_ack(&mut self, from: usize, epoch: u64) -> Result<(), CommitError> {
        self.check_sender(from)?;
        let started = self.epoch();
        let Some(round) = self.round.as_mut().filter(|r| r.epoch == epoch) else {
            return Err(match started {
                Some(current) if epoch < current => CommitError::StaleEpoch { from, epoch, current },
                _ => CommitError::FutureEpoch { from, epoch, started },
            });
        };
        if round.acks[from] {
            return Err(CommitError::DuplicateAck { from, epoch });
        }
        round.acks[from] = true;
        self.advance();
        Ok(())
    }

    /// The caller has closed its mappings of every buffer in
    /// [`peer_marks`](Self::peer_marks). Returns the `Ack` messages to send.
    ///
    /// # Errors
    ///
    /// [`CommitError::WrongPhase`] unless the phase is
    /// [`Phase::CloseMappings`] (before that, not all marks are known).
    pub fn mappings_closed(&mut self) -> Result<Vec<Outgoing<M>>, CommitError> {
        self.expect_phase("mappings_closed", Phase::CloseMappings)?;
        let peers: Vec<usize> = self.live_peers().collect();
        let Some(round) = self.round.as_mut() else {
            return Ok(Vec::new()); // unreachable: the phase check needs a round
        };
        let epoch = round.epoch;
        round.phase = Phase::AwaitingAcks;
        self.advance();
        Ok(peers.into_iter().map(|to| Outgoing { to, msg: FreeMsg::Ack { epoch } }).collect())
    }

    /// Every live peer has unmapped this rank's marks: returns them for the
    /// caller to free for real, and ends the commit.
    ///
    /// # Errors
    ///
    /// [`CommitError::WrongPhase`] unless the phase is [`Phase::ReleaseOwn`].
    pub fn release_own(&mut self) -> Result<Vec<M>, CommitError> {
        self.expect_phase("release_own", Phase::ReleaseOwn)?;
        let Some(round) = self.round.as_mut() else {
            return Ok(Vec::new()); // unreachable: the phase check needs a round
        };
        round.phase = Phase::Done;
        Ok(std::mem::take(&mut round.own))
    }

    /// Stops waiting for `rank`, now and in later commits; its buffered early
    /// marks are dropped. Idempotent.
    ///
    /// The caller should also invalidate every mapping of that peer, since
    /// its memory is gone.
    ///
    /// # Errors
    ///
    /// [`CommitError::UnknownRank`] or [`CommitError::FromSelf`].
    pub fn on_peer_failed(&mut self, rank: usize) -> Result<(), CommitError> {
        if rank >= self.ranks {
            return Err(CommitError::UnknownRank { from: rank, ranks: self.ranks });
        }
        if rank == self.rank {
            return Err(CommitError::FromSelf { rank });
        }
        self.failed[rank] = true;
        for marks in self.early.values_mut() {
            marks[rank] = None;
        }
        self.advance();
        Ok(())
    }

    /// Peers' marks received for the current commit, as `(rank, marks)`.
    /// Complete once the phase is past [`Phase::CollectingMarks`]; the caller
    /// may start closing mappings earlier.
    pub fn peer_marks(&self) -> impl Iterator<Item = (usize, &[M])> + '_ {
        self.round.iter().flat_map(|round| {
            round.peer_marks.iter().enumerate().filter_map(|(rank, marks)| marks.as_deref().map(|m| (rank, m)))
        })
    }

    /// This rank's marks in the commit in progress, until `release_own`.
    pub fn own_marks(&self) -> &[M] {
        self.round.as_ref().map_or(&[], |r| &r.own)
    }

    /// True if `key` is in this rank's marks of the commit in progress (so a
    /// second free of it is a double free).
    pub fn is_releasing(&self, key: &M) -> bool
    where
        M: PartialEq,
    {
        self.own_marks().contains(key)
    }

    /// Live peers this rank waits for in the current phase: marks in
    /// [`Phase::CollectingMarks`], acks in [`Phase::AwaitingAcks`], else none.
    /// For timeout diagnostics.
    pub fn waiting_for(&self) -> Vec<usize> {
        let Some(round) = self.round.as_ref() else {
            return Vec::new();
        };
        let peers = self.live_peers();
        match round.phase {
            Phase::CollectingMarks => peers.filter(|&p| round.peer_marks[p].is_none()).collect(),
            Phase::AwaitingAcks => peers.filter(|&p| !round.acks[p]).collect(),
            _ => Vec::new(),
        }
    }

    fn live_peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.ranks).filter(move |&p| p != self.rank && !self.failed[p])
    }

    fn check_sender(&self, from: usize) -> Result<(), CommitError> {
        if from >= self.ranks {
            return Err(CommitError::UnknownRank { from, ranks: self.ranks });
        }
        if from == self.rank {
            return Err(CommitError::FromSelf { rank: from });
        }
        if self.failed[from] {
            return Err(CommitError::FromFailedPeer { from });
        }
        Ok(())
    }

    fn expect_phase(&self, op: &'static str, expected: Phase) -> Result<(), CommitError> {
        let phase = self.phase();
        if phase == expected {
            Ok(())
        } else {
            Err(CommitError::WrongPhase { op, expected, phase })
        }
    }

    /// Moves through the phases that wait only on peers.
    fn advance(&mut self) {
        let (rank, failed) = (self.rank, &self.failed);
        let Some(round) = self.round.as_mut() else {
            return;
        };
        let live = |p: &usize| *p != rank && !failed[*p];
        if round.phase == Phase::CollectingMarks && (0..self.ranks).filter(live).all(|p| round.peer_marks[p].is_some())
        {
            round.phase = Phase::CloseMappings;
        }
        if round.phase == Phase::AwaitingAcks && (0..self.ranks).filter(live).all(|p| round.acks[p]) {
            round.phase = Phase::ReleaseOwn;
        }
    }
}
