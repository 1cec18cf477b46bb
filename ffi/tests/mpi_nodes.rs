//! The C endpoint API across nodes (issue 27): `tests/c/mpi_nodes.c`, compiled with
//! `mpicc` against `include/gpulmt.h` and the cdylib this `cargo test` built (with the
//! feature `mpi`), joins a job over an MPI communicator with `gpulmt_init_mpi` under
//! `mpirun` on sim devices, split into 2 pseudo-nodes (`GPULMT_PSEUDO_NODES=2`) of 1 and
//! of 2 ranks, so that ranks of different nodes reach each other only through the
//! internode path. The program checks every byte itself (every placement H/D to H/D at
//! 0 B to 4 MiB at an odd offset with guard bytes, every pair of ranks, ANY_SOURCE over
//! every sender, truncation across nodes, `gpulmt_init_mpi` called wrongly) and aborts
//! the job at the first failure; these tests check that every rank finished clean, over
//! `MPI_COMM_WORLD` (2 x 1) and over a communicator of the program's with its ranks
//! reversed (2 x 2), and that below `MPI_THREAD_MULTIPLE` every rank is refused with an
//! error that says what to do.
//!
//! Run with `cargo build -p gpulmt-ffi --features mpi --target-dir target/ffi-mpi` (an
//! integration test does not build the cdylib), then `cargo test -p gpulmt-ffi --features
//! mpi --test mpi_nodes --target-dir target/ffi-mpi`, under the session's test lock (`.ci/run` does). The target dir of its
//! own keeps the library with MPI apart from the one without: both are
//! `deps/libgpulmt.so`, and after a build without the feature cargo finds the featured
//! build fresh and leaves the file as it is (the program then fails with
//! `GPULMT_ERR_UNSUPPORTED`). Without `mpirun` or `mpicc` the tests print why and pass.

#![cfg(feature = "mpi")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use gpulmt_tests::live::LiveJob;
use gpulmt_tests::{check, compile_c_with, have_mpirun, job_lock, mpirun_command, JobOutput};

/// Whether `mpicc` (the wrapper of the MPI the library was built against) is on PATH.
fn have_mpicc() -> bool {
    let found = Command::new("sh").args(["-c", "command -v mpicc"]).output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: mpicc is not on PATH (apt-get install libopenmpi-dev; .ci/run does)");
    }
    found
}

/// `tests/c/mpi_nodes.c`, compiled once.
fn program() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| compile_c_with("mpicc", "ffi/tests/c/mpi_nodes.c", "mpi_nodes", &["-std=c11"], true))
}

/// Runs the program on `np` ranks in 2 pseudo-nodes in `mode` (`world`, `split` or
/// `funneled`), and checks that it exited 0 within the limit, no rank failing, and that
/// every rank printed `rank R <ok>`.
fn run_clean(np: usize, mode: &str, ok: &str) -> JobOutput {
    let limit = Duration::from_secs(300);
    let cmd = mpirun_command(np, &[], program(), &[mode], &[("GPULMT_PSEUDO_NODES", "2")]);
    let out = LiveJob::spawn(cmd, format!("mpirun -np {np} mpi_nodes {mode} in 2 pseudo-nodes")).finish(limit);
    check(out.elapsed < limit, &out, format!("the job ran past {limit:?} and was ended"));
    check(out.code == Some(0), &out, "mpirun must exit 0");
    check(!out.stderr.contains("FAIL"), &out, "a rank reported a failure");
    for r in 0..np {
        let line = format!("rank {r} {ok}");
        check(out.stdout.lines().any(|l| l.starts_with(&line)), &out, format!("no `{line}...` line"));
    }
    out
}

/// The smallest job across nodes: each rank a node of its own, over MPI_COMM_WORLD.
#[test]
fn two_nodes_of_one_rank_over_the_world() {
    if !have_mpirun() || !have_mpicc() {
        return;
    }
    let _lock = job_lock();
    run_clean(2, "world", "of 2 ok checks=");
}

/// Each pseudo-node with two ranks (pairs on the node and across it), over a
/// communicator whose ranks run in the reverse order of the world's.
#[test]
fn two_nodes_of_two_ranks_over_a_communicator_of_the_program() {
    if !have_mpirun() || !have_mpicc() {
        return;
    }
    let _lock = job_lock();
    run_clean(4, "split", "of 4 ok checks=");
}

/// MPI at `MPI_THREAD_FUNNELED` across nodes: every rank's `gpulmt_init_mpi` fails with
/// `GPULMT_ERR_BOOTSTRAP` and a message naming `MPI_THREAD_MULTIPLE` (the program checks),
/// and none hangs.
#[test]
fn below_thread_multiple_every_rank_is_refused_with_a_clear_error() {
    if !have_mpirun() || !have_mpicc() {
        return;
    }
    let _lock = job_lock();
    run_clean(4, "funneled", "refused ok: ");
}
