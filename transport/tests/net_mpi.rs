//! The internode path under a real MPI launcher (feature `mpi`): `gpulmt-net-check`
//! (src/bin/gpulmt-net-check.rs) runs under `mpirun -np 2` and `-np 3` on sim devices,
//! every rank another node, with Open MPI's default transports and with
//! `--mca btl tcp,self`, and with 64-slot and 4-slot queues. The program checks every
//! byte itself (control packets in order, rendezvous data of every placement from 0 bytes
//! to 64 MiB at odd offsets, a burst past the queue's slots, one-sided put, put with
//! signal, get, fence and quiet into host and device windows, a refused bad put); these
//! tests check that every rank finished clean.
//!
//! Run with `cargo test -p gpulmt --features mpi --test net_mpi`, under the session's
//! test lock. Needs `mpirun` (Open MPI); without it the tests print why and pass.

#![cfg(feature = "mpi")]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_gpulmt-net-check");

/// One job at a time: each oversubscribes the machine already.
static ONE_JOB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn have_mpirun() -> bool {
    let found = Command::new("sh").args(["-c", "command -v mpirun"]).stdout(Stdio::null()).status();
    if !found.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: mpirun not found on PATH (apt-get install openmpi-bin libopenmpi-dev; .ci/run does)");
        return false;
    }
    true
}

/// Runs the check under `mpirun -np np` with `mca` options and `env`; kills it after 600 s.
fn run(np: usize, mca: &[&str], env: &[(&str, &str)]) {
    if !have_mpirun() {
        return;
    }
    let _one = ONE_JOB.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new("mpirun");
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()]).args(mca).arg(BIN);
    // Only the settings given here: a GPULMT_* of the caller's shell must not change the run.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("GPULMT_")) {
            cmd.env_remove(k);
        }
    }
    cmd.env("GPULMT_DEVICE", "sim").envs(env.iter().copied());
    let what = format!("mpirun -np {np} {} with {env:?}", mca.join(" "));
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start mpirun");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for mpirun") {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (reader.join().unwrap(), err_reader.join().unwrap());
    assert!(status.is_some(), "{what} hung (killed after 600 s)\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(status.unwrap().success(), "{what} failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for rank in 0..np {
        let line = format!("net-check rank {rank} of {np}: ok");
        assert!(
            stdout.contains(&line),
            "{what}: rank {rank} did not finish clean\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    // Only the expected refusal is logged as an error (one per rank: the bad put).
    let errors: Vec<&str> = stderr.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.len() == np && errors.iter().all(|l| l.contains("outside its")),
        "{what}: unexpected errors:\n{}",
        errors.join("\n")
    );
}

#[test]
fn two_ranks_default_transports() {
    run(2, &[], &[]);
}

#[test]
fn three_ranks_four_slot_queues() {
    run(3, &[], &[("GPULMT_NET_QUEUE_SLOTS", "4")]);
}

#[test]
fn two_ranks_over_tcp_four_slot_queues() {
    run(2, &["--mca", "btl", "tcp,self"], &[("GPULMT_NET_QUEUE_SLOTS", "4")]);
}

#[test]
fn three_ranks_over_tcp() {
    run(3, &["--mca", "btl", "tcp,self"], &[]);
}
