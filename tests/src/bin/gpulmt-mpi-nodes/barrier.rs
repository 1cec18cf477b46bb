//! gpulmt's barrier across nodes (`Context::barrier`): no rank leaves it before every
//! rank entered. Each rank leaves a mark in a directory all ranks share (one host) just
//! before it enters; after the barrier every mark must be there. A late rank (a
//! different one each round) makes the others wait for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gpulmt::mpi::rsmpi::traits::{Communicator, CommunicatorCollectives, Root};
use gpulmt::Context;

use crate::buffer::{fail, OrFail};

const ROUNDS: u32 = 3;

fn mark(dir: &Path, round: u32, rank: u32) -> PathBuf {
    dir.join(format!("{round}.{rank}"))
}

/// Runs the rounds; returns the checks made.
pub fn run(ctx: &mut Context, world: &impl Communicator) -> usize {
    let me = ctx.rank();
    // A directory of this job: rank 0's pid names it.
    let mut pid = std::process::id();
    world.process_at_rank(0).broadcast_into(&mut pid);
    let dir = std::env::temp_dir().join(format!("gpulmt-mpi-nodes-barrier-{pid}"));
    if me == 0 {
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(me, format!("creating {}: {e}", dir.display())));
    }
    world.barrier();
    for round in 0..ROUNDS {
        if me == round % ctx.size() {
            std::thread::sleep(Duration::from_millis(200));
        }
        std::fs::write(mark(&dir, round, me), b"")
            .unwrap_or_else(|e| fail(me, format!("writing a mark in {}: {e}", dir.display())));
        ctx.barrier().or_fail(me, || format!("barrier round {round}"));
        if let Some(r) = (0..ctx.size()).find(|&r| !mark(&dir, round, r).exists()) {
            fail(me, format!("barrier round {round}: left it before rank {r} entered"));
        }
    }
    world.barrier();
    if me == 0 {
        let _ = std::fs::remove_dir_all(&dir);
    }
    ROUNDS as usize
}
