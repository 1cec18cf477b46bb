//! A call split into pieces (element ranges of a reduction, `split` in the collectives),
//! each piece's device buffers staged through a block of its own, two at a time: the
//! copy in of piece k+1 runs on the device's engine while the MPI library works on
//! piece k, and piece k's copy back runs while piece k+1 is waited for.

use std::ffi::c_int;

use super::region::Region;
use super::staged::{Copier, Staged, StagingError};
use crate::raw::SUCCESS;

/// A staged piece and its copies in flight.
struct InFlight {
    staged: Staged,
    copies: Vec<gpulmt::device::CopyTicket>,
}

/// Runs `call(k, staged)` for the pieces `0..pieces`, piece `k`'s buffers being
/// `regions(k)` (per argument; `None`: passed as given). Stops at the first call that
/// fails and returns its code; the pieces before it are copied back.
///
/// # Safety
/// As [`Staged::new`], for the regions of every piece, until this returns.
pub unsafe fn run_pieces(
    copier: &Copier,
    pieces: usize,
    regions: impl Fn(usize) -> Vec<Option<Region>>,
    mut call: impl FnMut(usize, &Staged) -> c_int,
) -> Result<c_int, StagingError> {
    let stage_in = |k: usize| -> Result<InFlight, StagingError> {
        // SAFETY: this function's contract.
        let staged = unsafe { Staged::new(regions(k)) }?;
        let copies = staged.start_in(copier)?;
        Ok(InFlight { staged, copies })
    };
    let mut next = if pieces > 0 { Some(stage_in(0)?) } else { None };
    let mut back: Option<InFlight> = None;
    let mut rc = SUCCESS;
    for k in 0..pieces {
        let Some(cur) = next.take() else { break };
        let waited = copier.wait(cur.copies);
        // The previous piece's block is free once its copy back has landed.
        let landed = back.take().map_or(Ok(()), |b| copier.wait(b.copies));
        waited?;
        landed?;
        if k + 1 < pieces {
            next = Some(stage_in(k + 1)?);
        }
        rc = call(k, &cur.staged);
        if rc != SUCCESS {
            break;
        }
        let copies = cur.staged.start_out(copier)?;
        back = Some(InFlight { staged: cur.staged, copies });
    }
    // Nothing may still write into blocks that go back to the pool.
    if let Some(n) = next {
        copier.wait(n.copies)?;
    }
    if let Some(b) = back {
        copier.wait(b.copies)?;
    }
    Ok(rc)
}
