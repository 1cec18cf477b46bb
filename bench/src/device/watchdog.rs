//! The host's wait for a persistent kernel that waits for other ranks (Stencil2D's and
//! SpTS's gio modes): a kernel that makes no progress for a while is reported (where it
//! stopped, what it waits for) and the process exits with status 3, rather than hanging
//! the job: the kernel would still spin, so an error return would only hang again in the
//! teardown (the context's, MPI's) that waits for it and for the peers.

use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, DriverError};

/// Polls of the kernel's completion between two reads of the clock.
const POLLS_PER_CLOCK: u32 = 256;

/// Waits until `done` (recorded behind the kernel) completes. No read of the kernel's
/// progress in the first tenth of `stall` (timed runs shorter than that pay only the
/// polls), then one each tenth: when `progress` returns the same value for `stall`, prints
/// `report` of it and exits with status 3. `poll_error` turns a failed poll (the kernel
/// failed) into the caller's error.
pub fn wait_watched<P: PartialEq, E>(
    done: &CudaEvent,
    stall: Duration,
    mut progress: impl FnMut() -> Result<P, E>,
    report: impl FnOnce(&P) -> String,
    poll_error: impl Fn(DriverError) -> E,
) -> Result<(), E> {
    let (mut last, mut changed, mut checked) = (None, Instant::now(), Instant::now());
    let mut polls = 0u32;
    while !done.try_is_complete().map_err(&poll_error)? {
        polls = polls.wrapping_add(1);
        if !polls.is_multiple_of(POLLS_PER_CLOCK) || checked.elapsed() < stall / 10 {
            std::hint::spin_loop();
            continue;
        }
        checked = Instant::now();
        let now = progress()?;
        if last.as_ref() != Some(&now) {
            (last, changed) = (Some(now), checked);
        } else if changed.elapsed() >= stall {
            eprintln!("{}", report(&now));
            std::process::exit(3);
        }
    }
    Ok(())
}
