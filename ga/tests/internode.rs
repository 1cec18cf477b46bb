//! Global arrays across pseudo-nodes (issue 29 over the internode path of issue 27):
//! `gpulmt-ga-check --mpi` under `mpirun` on sim devices with `GPULMT_PSEUDO_NODES`, so
//! that ranks of different pseudo-nodes share no memory and the arrays' heaps reach each
//! other only through the GIO queues and the proxy. The scenarios are those of
//! `tests/ga.rs` (random sections from every rank against a serial reference, overlapping
//! sections in order, exact accumulate totals, non-blocking operations under fence), on 2
//! nodes of 2 ranks (each owner on- and off-node at once) and 3 nodes of 1 rank (every
//! other owner off-node).
//!
//! Run with `cargo test -p gpulmt-ga --features mpi --test internode`, under the session's
//! test lock (`.ci/run` does). Without `mpirun` the tests print why and pass.

#![cfg(feature = "mpi")]

use std::path::Path;
use std::time::Duration;

use gpulmt_tests::live::LiveJob;
use gpulmt_tests::{have_mpirun, job_lock, mpirun_command, JobOutput};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-ga-check");

/// The shapes: (ranks, pseudo-nodes).
const SHAPES: [(usize, usize); 2] = [(4, 2), (3, 3)];

/// Runs `gpulmt-ga-check --mpi args` on `np` ranks in `nodes` pseudo-nodes; every rank
/// must finish `scenario` clean.
fn run(np: usize, nodes: usize, args: &[&str], scenario: &str) -> JobOutput {
    let nodes = nodes.to_string();
    let settings = [("GPULMT_PSEUDO_NODES", nodes.as_str())];
    let args: Vec<&str> = ["--mpi"].iter().chain(args).copied().collect();
    let cmd = mpirun_command(np, &[], Path::new(CHECK), &args, &settings);
    let what = format!("mpirun -np {np} gpulmt-ga-check {} with {settings:?}", args.join(" "));
    let out = LiveJob::spawn(cmd, what).finish(Duration::from_secs(300));
    out.assert_ok(np, scenario);
    out
}

#[test]
fn random_sections_across_pseudo_nodes_match_a_serial_reference() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    for ((np, nodes), seed) in SHAPES.into_iter().zip(["21", "22"]) {
        let out = run(np, nodes, &["random", "--seed", seed, "--rounds", "2"], "random");
        for r in 0..np {
            let c = out.counters(r, "ga-random");
            assert_eq!(c["arrays"], 12, "rank {r}\n{}", out.dump());
            assert!(c["checked"] > 0, "rank {r} compared nothing\n{}", out.dump());
        }
    }
}

#[test]
fn accumulates_across_pseudo_nodes_give_the_exact_total() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    for (np, nodes) in SHAPES {
        let out = run(np, nodes, &["acc-total", "--times", "10"], "acc-total");
        // Section [1..6, 2..8] of x = 1..=30, scale 2, 10 times per rank.
        let expected = (1..=30u64).sum::<u64>() * 2 * 10 * np as u64;
        for r in 0..np {
            assert_eq!(out.counters(r, "ga-acc")["total"], expected, "rank {r}\n{}", out.dump());
        }
    }
}

#[test]
fn overlapping_and_non_blocking_operations_across_pseudo_nodes_complete_in_order() {
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    for (np, nodes) in SHAPES {
        let out = run(np, nodes, &["order", "--rounds", "8"], "order");
        for r in 0..np {
            assert!(out.counters(r, "ga-order")["checks"] > 0, "rank {r}\n{}", out.dump());
        }
        let out = run(np, nodes, &["nb"], "nb");
        for r in 0..np {
            assert_eq!(out.counters(r, "ga-nb")["ok"], 1, "rank {r}\n{}", out.dump());
        }
    }
}
