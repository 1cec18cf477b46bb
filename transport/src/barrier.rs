//! [`Context::barrier`]: a dissemination barrier over zero-byte messages among job ranks,
//! so progress (and the internode path) continues while it waits. Finalize runs it among
//! the ranks of the node alone when no rank of another node can be reached.

use std::time::Instant;

use gpulmt_protocols::{Rank, Tag};

use crate::context::{Context, WaitPause};
use crate::error::{Error, Result};
use crate::Request;

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
        self.barrier_until(ranks, None)
    }

    /// The barrier, given up at `deadline` (finalize's: `GPULMT_INIT_TIMEOUT_MS`) with an
    /// error naming the rank it still waited for; its requests are then left to the
    /// context's teardown.
    pub(crate) fn barrier_until(&mut self, ranks: Option<&[Rank]>, deadline: Option<Instant>) -> Result<()> {
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
            match deadline {
                None => drop(self.wait_all(vec![s, r])?),
                Some(d) => {
                    let Some(waiting) = self.wait_both_until(s, r, d)? else {
                        step *= 2;
                        continue;
                    };
                    let what = match waiting {
                        Waiting::Send => format!("its message to rank {to} is still not sent"),
                        Waiting::Recv => format!("rank {from} has not arrived"),
                    };
                    return Err(Error::Bootstrap(format!(
                        "the barrier of finalize gave up after GPULMT_INIT_TIMEOUT_MS ({:?}): {what} (step {step} of \
                         the dissemination barrier among {n} ranks); raise GPULMT_INIT_TIMEOUT_MS where ranks \
                         reach finalize far apart",
                        self.cfg.init_timeout
                    )));
                }
            }
            step *= 2;
        }
        Ok(())
    }
}

/// Which of a barrier step's two requests a deadline found unfinished.
enum Waiting {
    Send,
    Recv,
}

impl Context {
    /// Waits for a barrier step's send and receive until `deadline`: `Ok(None)` once both
    /// ended, `Ok(Some(_))` with the one still unfinished at the deadline, or the error of
    /// one that failed.
    fn wait_both_until(&mut self, s: Request, r: Request, deadline: Instant) -> Result<Option<Waiting>> {
        let (mut s, mut r) = (Some(s), Some(r));
        let mut idle = WaitPause::default();
        let mut polls = 0u32;
        while s.is_some() || r.is_some() {
            for req in [&mut s, &mut r] {
                if let Some(q) = req.as_ref() {
                    if self.test(q)?.is_some() {
                        *req = None;
                    }
                }
            }
            polls += 1;
            // The clock every 64th poll: a barrier step usually ends in a few.
            if (s.is_some() || r.is_some()) && polls.is_multiple_of(64) && Instant::now() >= deadline {
                return Ok(Some(if r.is_some() { Waiting::Recv } else { Waiting::Send }));
            }
            idle.pause();
        }
        Ok(None)
    }
}
