//! Peer death: a rank exits or is SIGKILLed in the middle of a large transfer; the
//! survivor's request must fail (PeerFailed or Aborted) in bounded time, and nothing
//! of the job may be left in /dev/shm afterwards (normal and killed runs alike).

use std::time::Duration;

use gpulmt::shm::object::entries;
use gpulmt_tests::{Job, JobOutput};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-check");

/// Runs `die` on `n` ranks with `args`; asserts the launcher's status (rank 1's),
/// that every other rank survived, and the time bound.
///
/// The rank program asserts the events (the transfer failed with PeerFailed or Aborted,
/// new operations failed, the survivors went on) and bounds each step. The job's bound
/// here is wide, for a loaded 2-core CI machine: such a job takes a second or two, and
/// one that waited for the dead rank would run into the launcher's 60 s timeout (exit
/// 124, not rank 1's status).
fn die_n(n: usize, args: &[&str], env: &[(&str, &str)], code: i32) -> JobOutput {
    let mut all = vec!["die"];
    all.extend_from_slice(args);
    let out = Job::new(CHECK, n, &all).envs(env).timeout_s(60).run();
    out.assert_code(code);
    let survivors = out.stdout.lines().filter(|l| l.trim() == "survivor-ok").count();
    assert_eq!(survivors, n - 1, "every rank but rank 1 must survive its death\n{}", out.dump());
    assert!(out.has_line("rank=1 dying how=Exit") || out.has_line("rank=1 dying how=Kill"), "{}", out.dump());
    assert!(out.stdout.contains("rank=0 transfer failed after"), "{}", out.dump());
    assert!(!out.stderr.contains("FAIL"), "{}", out.dump());
    let expect = if code == 3 { "rank 1 (pid" } else { "killed by signal SIGKILL" };
    assert!(out.stderr.contains(expect), "the launcher did not report rank 1's end\n{}", out.dump());
    assert!(out.elapsed < Duration::from_secs(45), "the job took {:?}\n{}", out.elapsed, out.dump());
    out
}

fn die(args: &[&str], env: &[(&str, &str)], code: i32) -> JobOutput {
    die_n(2, args, env, code)
}

#[test]
fn peer_exits_before_receiving_a_64mib_shm_message() {
    die(&["--when", "before", "--placement", "H H"], &[], 3);
}

#[test]
fn peer_exits_mid_shm_transfer() {
    // Rank 1 receives and exits once the third chunk has landed.
    let out = die(&["--when", "mid", "--placement", "H H"], &[], 3);
    assert!(out.has_line("rank=1 third chunk arrived"), "{}", out.dump());
    // Rank 1 sends from device memory through SHM, and exits mid-way.
    die(&["--when", "mid", "--placement", "H D", "--role", "recv"], &[], 3);
}

#[test]
fn peer_killed_mid_get_transfer() {
    die(&["--when", "mid", "--how", "kill", "--placement", "D D"], &[], 137);
}

#[test]
fn peer_killed_mid_put_transfer() {
    die(
        &["--when", "mid", "--how", "kill", "--placement", "D D", "--role", "recv"],
        &[("GPULMT_PROTOCOL", "put")],
        137,
    );
}

#[test]
fn peer_killed_before_device_transfers() {
    die(&["--when", "before", "--how", "kill", "--placement", "D D"], &[], 137);
    die(&["--when", "before", "--how", "kill", "--placement", "D D"], &[("GPULMT_PROTOCOL", "put")], 137);
    die(&["--when", "before", "--placement", "D D", "--role", "recv"], &[], 3);
}

#[test]
fn peer_killed_mid_device_shm_transfer() {
    die(&["--when", "mid", "--how", "kill", "--placement", "D D"], &[("GPULMT_SIM_PEER", "none")], 137);
}

/// With a third rank, the survivors go on exchanging device messages and run a
/// two-phase free among themselves after rank 1 died.
#[test]
fn survivors_keep_working_after_a_peer_died() {
    let out = die_n(3, &["--when", "mid", "--placement", "D D"], &[], 3);
    for r in [0, 2] {
        let line = format!("rank={r} mem_free_commit after a peer died: Ok");
        assert!(out.has_line(&line), "missing `{line}`\n{}", out.dump());
    }
}

/// Freeing a buffer that the dead rank had mapped must succeed: the mapping died with
/// its process (CUDA releases it). The sim backend still counts the dead process as a
/// mapper (transport/src/device/sim.rs, `Header::mappers` is decremented only by a
/// live close), so `mem_free_commit` fails with FreedWhileMapped.
#[test]
fn freeing_a_buffer_mapped_by_a_dead_peer() {
    die(&["--when", "mid", "--how", "kill", "--placement", "D D", "--free-mapped"], &[], 137);
}

/// The litter checks, in one test so that they run one after another: no /dev/shm
/// object of the job (segment, `gpulmt-<job>-*`) or of its rank processes
/// (`gpulmt-sim-<pid>-*`) survives a normal run, nor a run whose rank was killed.
#[test]
fn no_shm_litter_after_normal_and_killed_runs() {
    // The filter finds real names: plant objects named like a job's and a rank's.
    let fake = JobOutput {
        what: "planted".into(),
        code: Some(0),
        stdout: "job=litterprobe\nrank=0 pid=999999999 device=0 size=1\n".into(),
        stderr: String::new(),
        elapsed: Duration::ZERO,
    };
    let planted = ["gpulmt-litterprobe", "gpulmt-litterprobe-x", "gpulmt-sim-999999999-0-1"];
    for p in planted {
        std::fs::write(format!("/dev/shm/{p}"), b"x").unwrap();
    }
    let found = fake.litter();
    for p in planted {
        let _ = std::fs::remove_file(format!("/dev/shm/{p}"));
    }
    assert_eq!(found, planted.iter().map(|s| s.to_string()).collect::<Vec<_>>());

    let before = entries("gpulmt-");
    // A normal run with device memory, peer mappings and SHM staging.
    let out = Job::new(CHECK, 3, &["alltoall", "--iters", "2"]).run();
    out.assert_ok(3, "alltoall");
    assert!(out.job().is_some() && out.pids().len() == 3, "ranks did not print job and pids\n{}", out.dump());
    out.assert_no_litter();
    // A killed run: rank 1 is SIGKILLed holding device memory mapped by rank 0.
    let killed = die(&["--when", "mid", "--how", "kill", "--placement", "D D"], &[], 137);
    assert!(killed.job().is_some() && killed.pids().len() == 2, "{}", killed.dump());
    killed.assert_no_litter();
    // Nothing new of these jobs appeared, whatever other test suites did meanwhile.
    let after = entries("gpulmt-");
    let new: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    let ours: Vec<&&String> = new
        .iter()
        .filter(|n| {
            [&out, &killed].iter().any(|o| {
                o.job().is_some_and(|j| n.contains(&j)) || o.pids().iter().any(|p| n.contains(&format!("-{p}-")))
            })
        })
        .collect();
    assert!(ours.is_empty(), "new /dev/shm entries of these jobs: {ours:?}");
}

/// An ANY_SOURCE receive in a 2-rank job whose other rank died can never match (short
/// of a message to oneself), yet `wait` spins until the launcher kills the survivor:
/// `Engine::on_peer_failed` (protocols/src/engine.rs) fails only receives posted for
/// that very source (`Matcher::drain_posted_from`), contrary to `Context::wait`'s
/// "never hangs on a dead peer" (MPI ULFM fails such receives with
/// MPI_ERR_PROC_FAILED_PENDING).
#[test]
fn any_source_receive_fails_when_every_peer_died() {
    die(&["--when", "before", "--role", "recv", "--any-source"], &[], 3);
}
