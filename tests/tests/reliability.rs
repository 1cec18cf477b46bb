//! Reliability of a job against its environment and its users (issue 31): each test
//! runs the rank program `gpulmt-fault` in the situation that used to break a job.
//!
//! - A rank killed under `mpirun` (no `gpulmt-run` to clean up): the job segment has
//!   no name left, and the next job's start removes the dead rank's device memory.
//! - A rank killed in a job without a launcher of ours: the rank that survives it
//!   removes its device memory.
//! - A `/dev/shm` smaller than the job segment (Docker's 64 MiB): init fails saying how
//!   much is needed and how to get it, no rank dies of SIGBUS.
//! - A killed rank whose parent does not reap it (a zombie): its peer fails at once.
//! - A 20 kHz SIGALRM interval timer (a profiler's): init's waits end on time.
//! - A second init in one process: refused at once, the first context unharmed.
//! - A job started by hand with a running job's `GPULMT_JOB`: it cannot reach that job.
//! - Two jobs started at once with one `GPULMT_JOB`: every process stops, none mixes.
//! - Misuse of the Rust API: errors, not crashes or silent successes.
//! - Another live gpulmt job on the machine: a job runs beside it and leaves it alone.

use std::path::Path;
use std::time::{Duration, Instant};

use gpulmt_tests::live::{signal, LiveJob};
use gpulmt_tests::{
    by_hand, check, in_private_dev_shm, job_lock, launcher_command, mpi_fault_program, mpirun_command, objects_of,
    private_dev_shm_possible, JobOutput,
};

const FAULT: &str = env!("CARGO_BIN_EXE_gpulmt-fault");

fn fault() -> &'static Path {
    Path::new(FAULT)
}

/// Runs `gpulmt-fault args` on `n` ranks under the launcher (job lock held by the caller).
fn run(n: usize, args: &[&str], env: &[(&str, &str)], limit: Duration) -> JobOutput {
    let cmd = launcher_command(n, 120, fault(), args, env);
    LiveJob::spawn(cmd, format!("gpulmt-run -n {n} gpulmt-fault {}", args.join(" "))).finish(limit)
}

/// The value of `key=` in the first stdout line that starts with `head`.
fn field(out: &JobOutput, head: &str, key: &str) -> Option<String> {
    let line = out.stdout.lines().find(|l| l.starts_with(head))?;
    let rest = line.split(&format!("{key}=")).nth(1)?;
    Some(rest.split_whitespace().next().unwrap_or("").to_string())
}

/// `mpirun -np N prog args` on sim devices, with only `env` of the `GPULMT_*` settings.
fn mpirun(np: usize, prog: &Path, args: &[&str], env: &[(&str, &str)]) -> LiveJob {
    let cmd = mpirun_command(np, &[], prog, args, env);
    LiveJob::spawn(cmd, format!("mpirun -np {np} {} {}", prog.display(), args.join(" ")))
}

/// A rank SIGKILLed mid-job under `mpirun`: nothing of the job is named any more once
/// mpirun is done (rank 0 removed the segment's name when every rank had joined), and
/// what the dead rank held (its simulated device memory) is removed by the next job's
/// start, found by the owner lock that died with it. Before, the segment (69 MB at np 2)
/// and every rank's sim objects stayed in /dev/shm for good.
#[test]
fn a_rank_killed_under_mpirun_leaves_nothing_the_next_job_does_not_remove() {
    let Some(prog) = mpi_fault_program() else { return };
    let _lock = job_lock();
    let mut job = mpirun(2, &prog, &["traffic", "--protocol", "get", "--millis", "20000"], &[]);
    let pids = job.ready_pids(2, Duration::from_secs(60));
    let name = job.wait_line(Duration::ZERO, |l| l.starts_with("rank=0 ready")).unwrap_or_default();
    std::thread::sleep(Duration::from_millis(300));
    if let Some(p) = &pids {
        signal(p[1], libc::SIGKILL);
    }
    let out = job.finish(Duration::from_secs(90));
    let pids = pids.unwrap_or_else(|| panic!("the ranks never got ready\n{}", out.dump()));
    check(out.code.is_some_and(|c| c != 0), &out, "mpirun must end, with a failure status");
    check(!out.stderr.contains("FAIL"), &out, "a rank saw something wrong");
    let job_id = name.split_whitespace().find_map(|w| w.strip_prefix("job=")).unwrap_or("").to_string();
    check(!job_id.is_empty(), &out, "rank 0 did not print its job");
    let named = objects_of(std::slice::from_ref(&job_id), &[]);
    check(named.is_empty(), &out, format!("the killed job's segment is still named: {named:?}"));
    // The next job on the node (here one rank of the launcher's) sweeps at its start.
    let next = run(1, &["join"], &[], Duration::from_secs(60));
    next.assert_code(0);
    let left = objects_of(&[job_id], &pids);
    check(left.is_empty(), &out, format!("left after the next job started: {left:?}"));
}

/// A rank SIGKILLed in a job that no launcher of ours watches (started by hand here, as
/// `mpirun` does): the rank that survives it removes the dead one's simulated device
/// memory once it sees it dead, before it leaves, and no next job is needed (issue 46;
/// before, the memory stayed until the next gpulmt job started on the node).
#[test]
fn the_survivor_of_a_killed_rank_removes_what_it_left() {
    let _lock = job_lock();
    let id = format!("survivor{}", std::process::id());
    let hold = std::env::temp_dir().join(format!("gpulmt-hold-survivor-{}", std::process::id()));
    let _ = std::fs::remove_file(&hold);
    let mut ranks: Vec<LiveJob> = ["0", "1"]
        .into_iter()
        .map(|rank| {
            let cmd = by_hand(fault(), &id, rank, "2", &["hold", "--hold", hold.to_str().unwrap()], &[]);
            LiveJob::spawn(cmd, format!("by hand: GPULMT_JOB={id} GPULMT_RANK={rank} gpulmt-fault hold"))
        })
        .collect();
    let holding = (0..2).all(|r| {
        let head = format!("rank={r} holding");
        ranks[r].wait_line(Duration::from_secs(60), |l| l.starts_with(&head)).is_some()
    });
    let dead = ranks[1].pid();
    let before = objects_of(&[], &[dead]);
    signal(dead, libc::SIGKILL);
    let killed = ranks.pop().unwrap().finish(Duration::from_secs(30));
    std::fs::write(&hold, b"go").unwrap();
    let survivor = ranks.pop().unwrap().finish(Duration::from_secs(60));
    let _ = std::fs::remove_file(&hold);
    check(holding, &survivor, "the ranks never held their memory");
    check(killed.code.is_none(), &killed, "rank 1 must die of the signal");
    check(!before.is_empty(), &killed, "rank 1 had no simulated device memory to leave");
    check(survivor.code.is_some(), &survivor, "the survivor must end by itself");
    let left = objects_of(&[], &[dead]);
    check(left.is_empty(), &survivor, format!("the killed rank's objects outlived its survivor: {left:?}"));
}

/// `gpulmt-run -n N gpulmt-fault args` in a mount namespace of its own whose /dev/shm is
/// a tmpfs of `size`.
fn run_with_dev_shm(size: &str, n: usize, args: &[&str], env: &[(&str, &str)]) -> JobOutput {
    let cmd = in_private_dev_shm(size, &launcher_command(n, 60, fault(), args, env));
    LiveJob::spawn(cmd, format!("(/dev/shm of {size}) gpulmt-run -n {n} gpulmt-fault {}", args.join(" ")))
        .finish(Duration::from_secs(90))
}

/// A /dev/shm smaller than the job segment: rank 0's init fails with what the segment
/// needs and how to enlarge /dev/shm, and no rank dies of SIGBUS (before: every rank
/// did, on first touch of the sparse segment). A segment that fits, with device memory
/// that does not: the allocation fails as out of memory does, and the job goes on.
#[test]
fn a_dev_shm_too_small_fails_init_saying_how_to_raise_it() {
    if !private_dev_shm_possible() {
        return;
    }
    let _lock = job_lock();
    let out = run_with_dev_shm("8m", 2, &["join"], &[]);
    check(!out.stderr.contains("SIGBUS"), &out, "a rank died of SIGBUS");
    let line = out.stdout.lines().find(|l| l.starts_with("rank=0 init-failed")).unwrap_or("");
    for want in ["needs", "--shm-size", "remount", "GPULMT_CHUNK_SIZE"] {
        check(line.contains(want), &out, format!("rank 0's init error does not say {want:?}"));
    }
    check(out.code == Some(2), &out, "the job must end with rank 0's init failure (exit 2)");

    // Staging of 64 KiB x 2 per pair: the segment fits 8 MiB, 16 MiB of device memory not.
    let small = [("GPULMT_CHUNK_SIZE", "64K"), ("GPULMT_PIPELINE_DEPTH", "2")];
    let out = run_with_dev_shm("8m", 2, &["alloc", "--bytes", "16M"], &small);
    out.assert_code(0);
    check(!out.stderr.contains("SIGBUS"), &out, "a rank died of SIGBUS");
    for r in 0..2 {
        let line = out.stdout.lines().find(|l| l.starts_with(&format!("rank={r} alloc-failed"))).unwrap_or("");
        check(line.contains("sim device allocation") && line.contains("--shm-size"), &out, "the allocation error");
        check(out.has_line(&format!("rank={r} ok alloc")), &out, "the job goes on after a failed allocation");
    }
}

/// Rank 1 runs under a parent that never reaps it (`sh` that became `sleep`), and is
/// SIGKILLed: a zombie, which `kill(pid, 0)` still finds. Rank 0 must fail its transfer
/// within a bound (before: only once the parent exited, 60 s here).
#[test]
fn a_killed_rank_that_nobody_reaps_fails_its_peer_at_once() {
    let _lock = job_lock();
    let script = r#"if [ "$GPULMT_RANK" = 1 ]; then "$0" "$@" & exec sleep 60; else exec "$0" "$@"; fi"#;
    let mut args = vec!["-c", script];
    args.push(FAULT);
    args.extend(["traffic", "--protocol", "shm", "--millis", "30000"]);
    let cmd = launcher_command(2, 120, Path::new("sh"), &args, &[]);
    let mut job = LiveJob::spawn(cmd, "gpulmt-run -n 2 sh -c '... & exec sleep 60' gpulmt-fault traffic");
    let pids = job.ready_pids(2, Duration::from_secs(60));
    let mut zombie = false;
    let mut noticed = None;
    if let Some(p) = &pids {
        std::thread::sleep(Duration::from_millis(200));
        signal(p[1], libc::SIGKILL);
        let t0 = Instant::now();
        noticed = job.wait_line(Duration::from_secs(15), |l| l.starts_with("rank=0 peer-failed")).map(|_| t0.elapsed());
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", p[1])).unwrap_or_default();
        zombie = stat.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
        // End rank 1's `sleep` (the zombie's parent), which ends the job.
        let parent = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(pp) = parent {
            signal(pp, libc::SIGKILL);
        }
    }
    let out = job.finish(Duration::from_secs(90));
    check(pids.is_some(), &out, "the ranks never got ready");
    check(zombie || noticed.is_none(), &out, "rank 1 was not a zombie when rank 0 noticed");
    let took = noticed.unwrap_or_else(|| panic!("rank 0 never noticed its zombie peer\n{}", out.dump()));
    check(took < Duration::from_secs(5), &out, format!("rank 0 noticed its zombie peer after {took:?}"));
    check(out.has_line("rank=0 survivor-ok") || out.stdout.contains("rank=0 survivor-ok"), &out, "survivor");
    check(!out.stderr.contains("FAIL"), &out, "a rank saw something wrong");
}

/// Under a 20 kHz SIGALRM timer, a rank waiting for a late rank 0 gives up at its init
/// timeout (before, its sleeps restarted with the timer slack added at every signal and
/// took seconds each); and a whole job runs its traffic and finishes.
#[test]
fn waits_end_on_time_under_a_20khz_interval_timer() {
    let _lock = job_lock();
    let env = [("GPULMT_INIT_TIMEOUT_MS", "500")];
    let out = run(2, &["--itimer-us", "50", "--late", "0:2500", "join"], &env, Duration::from_secs(60));
    let ms: u64 = field(&out, "rank=1 init-failed", "ms").and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
    check(ms < 1500, &out, format!("rank 1 gave up {ms} ms after it began to wait (timeout 500 ms)"));
    for protocol in ["shm", "get"] {
        let out = run(
            2,
            &["--itimer-us", "50", "traffic", "--protocol", protocol, "--millis", "300"],
            &[],
            Duration::from_secs(90),
        );
        out.assert_ok(2, "traffic");
    }
}

/// Finalize ends within its documented bound though a rank never reaches it (alive,
/// busy elsewhere): the barrier gives up after GPULMT_INIT_TIMEOUT_MS, naming the rank
/// it waited for, and the rank returns an error instead of waiting for good (issue 46:
/// finalize after a stall never returned).
#[test]
fn finalize_gives_up_on_a_rank_that_never_arrives_within_its_bound() {
    let _lock = job_lock();
    let env = [("GPULMT_INIT_TIMEOUT_MS", "2000"), ("GPULMT_NET_DRAIN_MS", "500")];
    let out = run(3, &["late-finalize", "--millis", "12000"], &env, Duration::from_secs(60));
    for r in 0..2 {
        let head = format!("rank={r} finalize-bounded");
        let Some(ms) = field(&out, &head, "ms").and_then(|v| v.parse::<u64>().ok()) else {
            check(false, &out, format!("rank {r} did not report its bounded finalize"));
            unreachable!()
        };
        // The barrier's 2 s, the node's own barrier's 2 s, the drain; a loaded machine
        // adds some.
        check(
            ms < 9_000,
            &out,
            format!("rank {r}'s finalize took {ms} ms, past its bound (the last rank left after 12 s)"),
        );
        let line = out.stdout.lines().find(|l| l.starts_with(&head)).unwrap_or("");
        check(line.contains("GPULMT_INIT_TIMEOUT_MS"), &out, format!("rank {r}'s error does not say which bound"));
    }
    check(out.stdout.lines().any(|l| l.contains("has not arrived")), &out, "no error names the rank waited for");
}

/// A second init while the first context lives: refused at once on every rank, naming
/// the live context; the first context then works and finalizes (before: rank 1's second
/// init attached to the job's segment, waited 30 s and broke the first's finalize).
#[test]
fn a_second_init_is_refused_and_the_first_context_goes_on() {
    let _lock = job_lock();
    let out = run(2, &["second-init"], &[], Duration::from_secs(60));
    out.assert_ok(2, "second-init");
    for r in 0..2 {
        let line = out.stdout.lines().find(|l| l.starts_with(&format!("rank={r} second-init-refused"))).unwrap_or("");
        check(line.contains("already live"), &out, format!("rank {r}'s refusal does not name the live context"));
    }
}

/// A job started by hand with the `GPULMT_JOB` of a running job cannot reach it: once
/// every rank joined, the segment has no name; a hand-started rank 1 times out waiting
/// for one, a hand-started rank 0 makes its own and removes it when it fails. The running
/// job then finishes clean (before: the hand-started rank attached to its segment,
/// registered over its rank 1 and marked it failed).
#[test]
fn a_job_started_by_hand_with_a_running_jobs_id_cannot_reach_it() {
    let _lock = job_lock();
    let hold = std::env::temp_dir().join(format!("gpulmt-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&hold);
    let args = ["hold", "--hold", hold.to_str().unwrap()];
    let mut job = LiveJob::spawn(launcher_command(2, 120, fault(), &args, &[]), "gpulmt-run -n 2 gpulmt-fault hold");
    let ready = job.ready_pids(2, Duration::from_secs(60));
    let line = job.wait_line(Duration::ZERO, |l| l.starts_with("rank=0 ready")).unwrap_or_default();
    let id = line.split_whitespace().find_map(|w| w.strip_prefix("job=")).unwrap_or("").to_string();
    let mut intruders = Vec::new();
    if ready.is_some() {
        for rank in ["1", "0"] {
            let cmd = by_hand(fault(), &id, rank, "2", &["join"], &[("GPULMT_INIT_TIMEOUT_MS", "700")]);
            let o = LiveJob::spawn(cmd, format!("by hand: GPULMT_JOB={id} GPULMT_RANK={rank} gpulmt-fault join"))
                .finish(Duration::from_secs(30));
            intruders.push(o);
        }
    }
    std::fs::write(&hold, b"go").unwrap();
    let out = job.finish(Duration::from_secs(90));
    let _ = std::fs::remove_file(&hold);
    check(ready.is_some() && !id.is_empty(), &out, "the job never got ready");
    for o in &intruders {
        check(o.code == Some(2), o, "the hand-started rank must fail its init (exit 2)");
    }
    out.assert_ok(2, "hold");
    let left = objects_of(&[id], &[]);
    check(left.is_empty(), &out, format!("objects of the job left: {left:?}"));
}

/// Two jobs started by hand at once with one `GPULMT_JOB` (issue 46): job A's rank 0
/// made the segment and job B's rank 1 took rank 1 in it. Then A's rank 1 is refused its
/// rank, and B's rank 0 the segment; either refusal marks the job contested, so A's rank
/// 0 and B's rank 1 stop at once with an error that says why and what to do, instead of
/// going on as one job of two programs (before: they waited for rank 2 until the init
/// timeout, and with two ranks ran on mixed). Steps are ordered by what the test sees
/// in the segment, so each run makes the same collision.
#[test]
fn two_jobs_started_at_once_with_one_id_stop_rather_than_mix() {
    use gpulmt::shm::job::{JobSegment, RankState};
    let _lock = job_lock();
    let said = |o: &JobOutput, what: &str| o.stdout.contains(what) || o.stderr.contains(what);
    for second in ["rank 1", "rank 0"] {
        let id = format!("twin{}r{}", std::process::id(), &second[5..]);
        let start = |rank: &str, what: &str| {
            let cmd = by_hand(fault(), &id, rank, "3", &["join"], &[("GPULMT_INIT_TIMEOUT_MS", "60000")]);
            LiveJob::spawn(cmd, format!("{what}: GPULMT_JOB={id} GPULMT_RANK={rank} GPULMT_SIZE=3 gpulmt-fault join"))
        };
        let a0 = start("0", "job A");
        let seg = JobSegment::open(&id, Duration::from_secs(30)).expect("job A's rank 0 makes the segment");
        let b1 = start("1", "job B");
        let end = Instant::now() + Duration::from_secs(30);
        while seg.rank_state(1) != RankState::Alive && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
        let intruder = if second == "rank 1" { start("1", "job A") } else { start("0", "job B") };
        let intruder_pid = intruder.pid();
        let refused = intruder.finish(Duration::from_secs(30));
        let t0 = Instant::now();
        let (a0, b1) = (a0.finish(Duration::from_secs(30)), b1.finish(Duration::from_secs(30)));
        let took = t0.elapsed();
        let contested = seg.contested();
        drop(seg);
        check(refused.code == Some(2), &refused, format!("the second {second} must be refused (exit 2)"));
        let why = if second == "rank 1" { "already held" } else { "already exists" };
        check(said(&refused, why), &refused, format!("the refusal must say the {second} is {why}"));
        check(
            contested == Some(intruder_pid),
            &refused,
            format!("the job is marked by the refused process: {contested:?}"),
        );
        for o in [&a0, &b1] {
            check(o.code == Some(2), o, "a rank of the contested job must fail its init (exit 2)");
            check(said(o, "same GPULMT_JOB"), o, "its error must say that two jobs share the id");
        }
        check(took < Duration::from_secs(20), &a0, format!("the contested job's ranks took {took:?} to stop"));
        let left = objects_of(std::slice::from_ref(&id), &[]);
        check(left.is_empty(), &a0, format!("objects of the job left: {left:?}"));
    }
}

/// Tests do not need the machine to themselves (item 9): beside another live gpulmt job
/// (held open, its device memory mapped), a job of every protocol runs, its leak check
/// finds nothing of its own left, and the sweep the next job's start runs leaves the live
/// job's objects alone; that job then finishes clean.
#[test]
fn a_job_beside_another_live_job_runs_and_leaves_it_alone() {
    use gpulmt::shm::sweep::{sweep, Evidence};
    let _lock = job_lock();
    let hold = std::env::temp_dir().join(format!("gpulmt-hold-beside-{}", std::process::id()));
    let _ = std::fs::remove_file(&hold);
    let args = ["hold", "--hold", hold.to_str().unwrap()];
    let mut other = LiveJob::spawn(launcher_command(2, 120, fault(), &args, &[]), "gpulmt-run -n 2 gpulmt-fault hold");
    let mut ready = other.ready_pids(2, Duration::from_secs(60));
    for r in 0..2 {
        let head = format!("rank={r} holding");
        if other.wait_line(Duration::from_secs(60), |l| l.starts_with(&head)).is_none() {
            ready = None;
        }
    }
    let theirs = ready.as_deref().map(|p| objects_of(&[], p)).unwrap_or_default();
    let mut mine = Vec::new();
    if ready.is_some() {
        for protocol in ["get", "put", "shm"] {
            let out = run(2, &["traffic", "--protocol", protocol, "--millis", "300"], &[], Duration::from_secs(90));
            let pids: Vec<u32> = out.stdout.lines().filter_map(|l| l.strip_prefix("pid=")?.parse().ok()).collect();
            mine.push((protocol, out, pids));
        }
    }
    sweep(Evidence::Locks);
    let theirs_after = ready.as_deref().map(|p| objects_of(&[], p)).unwrap_or_default();
    std::fs::write(&hold, b"go").unwrap();
    let out = other.finish(Duration::from_secs(90));
    let _ = std::fs::remove_file(&hold);
    check(ready.is_some(), &out, "the other job never got ready");
    check(!theirs.is_empty(), &out, "the other job holds no objects to leave alone (the test would prove nothing)");
    for (protocol, o, _) in &mine {
        for r in 0..2 {
            check(o.has_line(&format!("rank={r} ok traffic")), o, format!("{protocol} beside a live job: rank {r}"));
        }
    }
    check(theirs_after == theirs, &out, format!("the sweep touched the live job: {theirs:?} -> {theirs_after:?}"));
    out.assert_ok(2, "hold");
    let left = ready.as_deref().map(|p| objects_of(&[], p)).unwrap_or_default();
    check(left.is_empty(), &out, format!("objects of the held job left after it finished: {left:?}"));
}

/// Misuse of the Rust API: lengths no buffer can have (`usize::MAX` from a 64-byte
/// buffer used to be accepted), NULL, and device memory after `mem_free` +
/// `mem_free_commit` (used to crash with SIGSEGV in a copy) are refused with
/// InvalidArgument; the context keeps working.
#[test]
fn misuse_of_the_rust_api_is_refused() {
    let _lock = job_lock();
    for protocol_env in [&[][..], &[("GPULMT_PROTOCOL", "shm")][..]] {
        let out = run(1, &["misuse"], protocol_env, Duration::from_secs(60));
        out.assert_ok(1, "misuse");
        let refused = out.stdout.lines().filter(|l| l.starts_with("rank=0 refused")).count();
        check(refused == 8, &out, format!("{refused} misuses refused, expected 8"));
    }
}
