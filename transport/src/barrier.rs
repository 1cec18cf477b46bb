//! [`Context::barrier`]: a dissemination barrier over zero-byte messages among job ranks,
//! so progress (and the internode path) continues while it waits. Finalize runs it among
//! the ranks of the node alone when no rank of another node can be reached.

use gpulmt_protocols::{Rank, Tag};

use crate::context::Context;
use crate::error::Result;

/// The reserved tag of the barrier's messages.
const BARRIER_TAG: Tag = i32::MAX - 1;

impl Context {
    /// Synchronises all ranks of the job, on every node (dissemination barrier over
    /// zero-byte messages, so progress continues while waiting).
    pub fn barrier(&mut self) -> Result<()> {
        self.barrier_among(None)
    }

    /// The dissemination barrier among `ranks` (job ranks, this one among them), or
    /// among every rank of the job.
    pub(crate) fn barrier_among(&mut self, ranks: Option<&[Rank]>) -> Result<()> {
        let (me, n) = match ranks {
            Some(r) => {
                let me = r.iter().position(|&x| x == self.rank()).expect("a barrier among ranks that include this one");
                (me as u32, r.len() as u32)
            }
            None => (self.rank(), self.size()),
        };
        let rank_at = |i: u32| ranks.map_or(i, |r| r[i as usize]);
        let mut step = 1;
        while step < n {
            let to = rank_at((me + step) % n);
            let from = rank_at((me + n - step) % n);
            let mut byte = 0u8;
            // SAFETY: zero-length buffers are never dereferenced, and `byte` outlives both
            // requests (wait_all below completes them).
            let r = unsafe { self.irecv_tagged(&mut byte, 0, Some(from), Some(BARRIER_TAG))? };
            // SAFETY: as for the receive.
            let s = unsafe { self.isend_tagged(&byte, 0, to, BARRIER_TAG)? };
            self.wait_all(vec![s, r])?;
            step *= 2;
        }
        Ok(())
    }
}
