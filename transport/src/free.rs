//! Two-phase free of device memory (seed design): `mem_free` only marks an
//! allocation; the collective `mem_free_commit` exchanges the marks among the
//! node-local ranks, every rank closes its mappings of marked buffers (waiting for
//! transfers in flight), acknowledges, and only then do owners release the memory.
//! The commit's state machine is `gpulmt_handles::FreeCommit`; this is its I/O.
//!
//! The commit runs among the ranks of this rank's node only, by local index: no region
//! ever goes to another node, so no rank there maps this rank's memory, and a free
//! packet from a rank of another node breaks the protocol.

use gpulmt_handles::{FreeMsg, Outgoing, Phase};
use gpulmt_protocols::wire::Packet;
use gpulmt_protocols::Rank;

use crate::context::Context;
use crate::device::MemoryKind;
use crate::error::{Error, Result};

impl Context {
    /// Marks device memory from [`mem_alloc`](Self::mem_alloc) to be freed at the
    /// next [`mem_free_commit`](Self::mem_free_commit); it stays valid until then.
    pub fn mem_free(&mut self, ptr: usize) -> Result<()> {
        let info = self.backend.pointer_info(ptr)?;
        let known = matches!(info.kind, MemoryKind::Device(_))
            && info.base == ptr
            && self.allocations.get(&info.buffer_id) == Some(&ptr);
        if !known {
            return Err(Error::Free(format!(
                "{ptr:#x} was not returned by mem_alloc (or was already released); free only what mem_alloc gave"
            )));
        }
        if self.free_commit.is_releasing(&info.buffer_id) {
            return Err(Error::Free(format!("{ptr:#x} is already being freed by the commit in progress")));
        }
        self.free_marks
            .mark(info.buffer_id)
            .map_err(|_| Error::Free(format!("double free of {ptr:#x}: it is already marked for the next commit")))?;
        // A VMM range's other chunks are allocations of their own to peers, which may map
        // them: the commit closes those mappings too (and frees the range by its first).
        let end = info.base + info.span;
        let mut at = info.base + info.size;
        while at < end {
            let chunk = self.backend.pointer_info(at)?;
            if chunk.kind == MemoryKind::Host || chunk.size == 0 {
                break;
            }
            // Marked once per range: a second mark of the same range failed above already.
            let _ = self.free_marks.mark(chunk.buffer_id);
            at = chunk.base + chunk.size;
        }
        Ok(())
    }

    /// Collective over the ranks of this rank's node (every rank of the node must call
    /// it; each node commits on its own): releases the memory marked by
    /// [`mem_free`](Self::mem_free) on every rank of the node, after every rank of the
    /// node closed its mappings of it. Safe to call with nothing marked.
    pub fn mem_free_commit(&mut self) -> Result<()> {
        let marks = self.free_marks.take();
        let out = self.free_commit.start(marks).map_err(|e| Error::Free(e.to_string()))?;
        self.send_free(out);
        let mut errors = Vec::new();
        loop {
            self.progress()?;
            match self.free_commit.phase() {
                Phase::CollectingMarks | Phase::AwaitingAcks => {}
                Phase::CloseMappings => {
                    // The commit speaks local indices, the handle cache job ranks.
                    let topo = &self.topo;
                    let doomed: Vec<(Rank, Vec<u64>)> =
                        self.free_commit.peer_marks().map(|(l, m)| (topo.job_rank_of(l), m.to_vec())).collect();
                    let hit = |k: &crate::mapping::PeerBufferKey| {
                        doomed.iter().any(|(r, ids)| *r == k.peer && ids.contains(&k.buffer_id))
                    };
                    self.cache.invalidate_where(hit);
                    // Mappings still used by copies close at their last release.
                    while self.cache.count_open_where(hit) > 0 {
                        self.progress()?;
                    }
                    let out = self.free_commit.mappings_closed().map_err(|e| Error::Free(e.to_string()))?;
                    self.send_free(out);
                }
                Phase::ReleaseOwn => {
                    for id in self.free_commit.release_own().map_err(|e| Error::Free(e.to_string()))? {
                        self.exports.forget(&id);
                        if let Some(ptr) = self.allocations.remove(&id) {
                            // SAFETY: every rank closed its mappings of the buffer before
                            // this phase, and mem_free ended its validity at this commit:
                            // a request on it must have completed (isend/irecv's contract),
                            // so no copy of ours is in flight on it.
                            match unsafe { self.backend.free(ptr) } {
                                Ok(()) => {}
                                // A peer that died while mapping the buffer never closed
                                // its mapping; the memory is released all the same.
                                Err(e @ crate::device::DeviceError::FreedWhileMapped { .. })
                                    if self.topo.node_members().iter().any(|&r| self.engine.is_peer_failed(r)) =>
                                {
                                    tracing::warn!(error = %e, "freed a buffer that a failed peer still mapped");
                                }
                                Err(e) => errors.push(e.to_string()),
                            }
                        }
                    }
                }
                Phase::Done => break,
                Phase::Idle => unreachable!("a started commit is never idle"),
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(Error::Free(format!("releasing marked memory: {}", errors.join("; "))))
        }
    }

    fn send_free(&mut self, out: Vec<Outgoing<u64>>) {
        for o in out {
            let p = match o.msg {
                FreeMsg::Marks { epoch, marks } => Packet::FreeMarks { epoch, buffer_ids: marks },
                FreeMsg::Ack { epoch } => Packet::FreeAck { epoch },
            };
            let to = self.topo.job_rank_of(o.to);
            self.send_packet(to, p);
        }
    }

    /// A free-commit packet from job rank `from`, which must share this node.
    pub(crate) fn on_free_packet(&mut self, from: Rank, p: Packet) {
        let Some(local) = self.topo.local_of(from) else {
            self.stats.violations += 1;
            tracing::warn!(peer = from, "dropped a free-commit message from a rank of another node");
            return;
        };
        let msg = match p {
            Packet::FreeMarks { epoch, buffer_ids } => FreeMsg::Marks { epoch, marks: buffer_ids },
            Packet::FreeAck { epoch } => FreeMsg::Ack { epoch },
            _ => return,
        };
        if let Err(e) = self.free_commit.on_message(local, msg) {
            self.stats.violations += 1;
            tracing::warn!(peer = from, error = %e, "dropped a free-commit message");
        }
    }

    /// Job rank `r` failed: a commit stops waiting for it if it shares this node.
    pub(crate) fn free_peer_failed(&mut self, r: Rank) {
        let Some(local) = self.topo.local_of(r) else { return };
        if let Err(e) = self.free_commit.on_peer_failed(local) {
            tracing::warn!(peer = r, error = %e, "two-phase free: peer failure");
        }
    }
}
