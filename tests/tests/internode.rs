//! One gpulmt job across nodes (issue 27), on one machine: `gpulmt-mpi-nodes`
//! (src/bin/gpulmt-mpi-nodes/) under `mpirun` on sim devices with `GPULMT_PSEUDO_NODES`,
//! so that ranks of different pseudo-nodes share no memory and reach each other only
//! through the internode path (GIO queues and the proxy over MPI). The program checks
//! every byte itself (every placement D D, D H, H D, H H; sizes 0 to 64 MiB at an
//! offset; ANY_SOURCE over senders of its own node and of others in non-overtaking
//! order; truncation; a burst past the queue's slots; gpulmt's barrier; the symmetric
//! heap's puts, gets, put_signal, fence, quiet and atomics to PEs of other nodes, with
//! exact atomic totals from every rank, out-of-heap accesses refused, and the device's
//! queue table driven as the device header drives it) and aborts the job at the first
//! failure; these tests check that every rank finished clean, in 2 nodes x 2 ranks, 2
//! nodes x 1 rank and 3 nodes x 1 rank, over Open MPI's default transports and over
//! `--mca btl tcp,self` with 4-slot queues, and that a rank killed mid-transfer ends the
//! job with an error in bounded time.
//!
//! Run with `cargo test -p gpulmt-tests --features mpi --test internode` after
//! `cargo build -p gpulmt-tests --features mpi --bin gpulmt-mpi-nodes`, under the
//! session's test lock (`.ci/run` does). Without `mpirun` the tests print why and pass.

#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use gpulmt_tests::live::LiveJob;
use gpulmt_tests::{check, job_lock, mpirun_command, JobOutput};

const NODES: &str = env!("CARGO_BIN_EXE_gpulmt-mpi-nodes");

fn have_mpirun() -> bool {
    let found = Command::new("sh").args(["-c", "command -v mpirun"]).output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev; .ci/run does)");
    }
    found
}

/// Runs `gpulmt-mpi-nodes args` on `np` ranks split into `nodes` pseudo-nodes, with
/// mpirun options `mca` and the settings `env`; ends it after `limit`.
fn run(np: usize, nodes: usize, mca: &[&str], args: &[&str], env: &[(&str, &str)], limit: Duration) -> JobOutput {
    let nodes = nodes.to_string();
    let mut settings = vec![("GPULMT_PSEUDO_NODES", nodes.as_str())];
    settings.extend_from_slice(env);
    let cmd = mpirun_command(np, mca, Path::new(NODES), args, &settings);
    let what = format!("mpirun -np {np} {} gpulmt-mpi-nodes {} with {settings:?}", mca.join(" "), args.join(" "));
    LiveJob::spawn(cmd, what).finish(limit)
}

/// Every rank printed its node and `rank R ok`, nothing failed, within `limit`.
fn assert_clean(out: &JobOutput, np: usize, nodes: usize, limit: Duration) {
    check(out.elapsed < limit, out, format!("the job ran past {limit:?} and was ended"));
    check(out.code == Some(0), out, "mpirun must exit 0");
    check(!out.stderr.contains("FAIL"), out, "a rank reported a failure");
    let per_node = np / nodes;
    for r in 0..np {
        let node = format!("rank {r} node {} local {} of {per_node} ", r / per_node, r % per_node);
        check(out.stdout.lines().any(|l| l.starts_with(&node)), out, format!("no `{node}...` line"));
        let ok = format!("rank {r} ok checks=");
        check(out.stdout.lines().any(|l| l.starts_with(&ok)), out, format!("rank {r} did not finish clean"));
    }
}

#[test]
fn two_nodes_of_two_ranks() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    let limit = Duration::from_secs(300);
    let out = run(4, 2, &[], &[], &[], limit);
    assert_clean(&out, 4, 2, limit);
}

/// The smallest job across nodes: every PE but this one is off-node (the symmetric heap
/// maps nothing, everything goes through the queues).
#[test]
fn two_nodes_of_one_rank() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    let limit = Duration::from_secs(300);
    let out = run(2, 2, &[], &["--max", "4M"], &[], limit);
    assert_clean(&out, 2, 2, limit);
}

#[test]
fn three_nodes_of_one_rank() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    let limit = Duration::from_secs(300);
    let out = run(3, 3, &[], &[], &[], limit);
    assert_clean(&out, 3, 3, limit);
}

/// Open MPI's TCP transport only, and 4-slot GIO queues: the burst must meet
/// backpressure (the program fails if no post was held back) and lose nothing. Sizes up
/// to 4 MiB (64 MiB ran above).
#[test]
fn two_nodes_over_tcp_with_four_slot_queues() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    let limit = Duration::from_secs(300);
    let mca = ["--mca", "btl", "tcp,self"];
    let out = run(4, 2, &mca, &["--max", "4M"], &[("GPULMT_NET_QUEUE_SLOTS", "4")], limit);
    assert_clean(&out, 4, 2, limit);
    let pressed = out.stdout.lines().filter(|l| l.contains("burst:") && !l.contains(" 0 posts held back")).count();
    check(pressed > 0, &out, "no rank's burst met backpressure in 4-slot queues");
}

/// The last rank (node 1) kills itself while it sends 64 MiB to rank 0 (node 0): the job
/// must end with an error status well within the bound, no rank hanging it.
#[test]
fn a_rank_killed_mid_transfer_ends_the_job_with_an_error() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    let limit = Duration::from_secs(120);
    let out = run(4, 2, &[], &["die"], &[], limit);
    check(out.stdout.contains("rank 3 killing itself mid-transfer"), &out, "the victim never started its transfer");
    check(out.elapsed < limit, &out, "the job hung after a rank died (ended by the test)");
    check(out.code.is_some_and(|c| c != 0), &out, "mpirun must report the death with an error status");
    check(!out.stderr.contains("FAIL"), &out, "a rank saw something wrong before the death");
}
