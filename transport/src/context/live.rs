//! One live context per rank of a job in a process.
//!
//! A second `init` of a rank whose context is still live would register the rank again
//! in the job's segment, arrive at its barriers a second time and break the first
//! context's job (its peers wait for arrivals that never balance, its finalize fails).
//! It is refused at once instead, naming the live context. Several ranks of one job in
//! one process (threads as ranks, as tests and benchmarks do) remain allowed, and so is
//! a new context for a rank once the earlier one is finalized or dropped.

use std::sync::Mutex;

use crate::context::JobInfo;
use crate::error::{Error, Result};

/// (job, rank) of every live context of this process.
static LIVE: Mutex<Vec<(String, u32)>> = Mutex::new(Vec::new());

/// The claim of a (job, rank) by a context of this process; released when dropped.
#[derive(Debug)]
pub(crate) struct LiveClaim {
    job: String,
    rank: u32,
}

impl LiveClaim {
    /// Claims `info`'s rank of its job for a new context, or says which context holds it.
    pub(crate) fn take(info: &JobInfo) -> Result<LiveClaim> {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        if live.iter().any(|(j, r)| *j == info.job && *r == info.rank) {
            return Err(Error::Bootstrap(format!(
                "a context for rank {} of job {} is already live in this process (pid {}): finalize it before \
                 initializing again (one context per rank; a second init would break the first's job)",
                info.rank,
                info.job,
                std::process::id()
            )));
        }
        live.push((info.job.clone(), info.rank));
        Ok(LiveClaim { job: info.job.clone(), rank: info.rank })
    }
}

impl Drop for LiveClaim {
    fn drop(&mut self) {
        let mut live = LIVE.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|(j, r)| !(*j == self.job && *r == self.rank));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_claim_per_rank_of_a_job() {
        let info = |rank| JobInfo { job: format!("livetest{}", std::process::id()), rank, size: 2 };
        let a = LiveClaim::take(&info(0)).unwrap();
        let e = LiveClaim::take(&info(0)).unwrap_err();
        assert!(e.to_string().contains("already live"), "{e}");
        let b = LiveClaim::take(&info(1)).unwrap();
        drop(a);
        let again = LiveClaim::take(&info(0)).unwrap();
        drop((b, again));
    }
}
