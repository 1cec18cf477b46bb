//! End-to-end tests of the `gpulmt-run` launcher: environment of the ranks, exit
//! status, abort on a failing rank, signal forwarding, timeout, and removal of the
//! job's shared-memory objects after every run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpulmt::shm::job::{node_id, JobLayout, JobSegment, RankState};

const BIN: &str = env!("CARGO_BIN_EXE_gpulmt-run");

fn run(args: &[&str]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = Command::new(BIN).args(args).output().expect("run gpulmt-run");
    (out, t0.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `/dev/shm` entries of job `job` (its segment and `gpulmt-<job>-*`).
fn job_objects(job: &str) -> Vec<String> {
    let base = format!("gpulmt-{job}");
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&base))
        .collect()
}

fn shm_exists(name: &str) -> bool {
    Path::new("/dev/shm").join(name).exists()
}

/// A scratch directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("gpulmt-launcher-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn ranks_get_distinct_ids_and_objects_are_removed() {
    // Each rank prints its environment and leaves a job object and a sim object behind.
    let script = r#"
        touch "/dev/shm/gpulmt-$GPULMT_JOB-r$GPULMT_RANK" || exit 9
        touch "/dev/shm/gpulmt-sim-$$-dev0" || exit 9
        echo "$GPULMT_RANK $GPULMT_SIZE $GPULMT_LOCAL_RANK $GPULMT_LOCAL_SIZE $GPULMT_JOB $$"
    "#;
    let (out, _) = run(&["-n", "3", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let mut lines: Vec<Vec<String>> =
        text(&out.stdout).lines().map(|l| l.split_whitespace().map(String::from).collect()).collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let job = lines[0][4].clone();
    assert!(!job.is_empty());
    for (r, l) in lines.iter().enumerate() {
        assert_eq!(&l[..4], &[r.to_string(), "3".into(), r.to_string(), "3".into()], "{lines:?}");
        assert_eq!(l[4], job, "all ranks share one job id");
        assert!(!shm_exists(&format!("gpulmt-sim-{}-dev0", l[5])), "sim object of pid {} left", l[5]);
    }
    assert_eq!(job_objects(&job), Vec::<String>::new());

    // A second run gets another job id.
    let (out2, _) = run(&["-n", "1", "sh", "-c", "echo $GPULMT_JOB"]);
    assert_eq!(out2.status.code(), Some(0));
    assert_ne!(text(&out2.stdout).trim(), job);
}

#[test]
fn failing_rank_aborts_the_job_with_its_status() {
    let script = r#"
        echo "$GPULMT_JOB"
        touch "/dev/shm/gpulmt-$GPULMT_JOB-x$GPULMT_RANK"
        [ "$GPULMT_RANK" = 1 ] && exit 3
        sleep 30
    "#;
    // Default grace period (3 s) + 2 s to SIGKILL at most; far less than the 30 s sleep.
    let (out, took) = run(&["-n", "3", "--", "sh", "-c", script]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert!(took >= Duration::from_millis(2500), "the grace period was honored: {took:?}");
    assert!(stderr.contains("rank 1 (pid"), "{stderr}");
    assert!(stderr.contains("exited with status 3"), "{stderr}");
    let job = text(&out.stdout).lines().next().unwrap().to_owned();
    assert_eq!(job_objects(&job), Vec::<String>::new());

    // A short grace period is honored too; killed ranks report a signal.
    let (out, took) = run(&["-n", "2", "--abort-grace-ms", "100", "--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(3));
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(text(&out.stderr).contains("killed by signal SIGTERM"), "{}", text(&out.stderr));
}

#[test]
fn killed_rank_gives_128_plus_signal() {
    let (out, _) = run(&["-n", "2", "--abort-grace-ms", "0", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("killed by signal SIGKILL"));
}

#[test]
fn sigterm_to_launcher_kills_the_ranks() {
    let dir = scratch("sigterm");
    // Each rank records its pid and its job id, then sleeps in a grandchild process.
    let script = r#"
        touch "/dev/shm/gpulmt-$GPULMT_JOB-x"
        echo "$GPULMT_JOB" > "$D/job"
        sleep 30 &
        echo "$! $$" > "$D/pid.$GPULMT_RANK"
        wait
    "#;
    let child = Command::new(BIN)
        .args(["-n", "2", "--", "sh", "-c", script])
        .env("D", &dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let pid_files = [dir.join("pid.0"), dir.join("pid.1")];
    while !pid_files.iter().all(|f| std::fs::read_to_string(f).is_ok_and(|s| s.ends_with('\n'))) {
        assert!(t0.elapsed() < Duration::from_secs(10), "ranks did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let pids: Vec<i32> = pid_files
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(f).unwrap().split_whitespace().map(|p| p.parse().unwrap()).collect::<Vec<_>>()
        })
        .collect();
    // SAFETY: plain kill of the launcher we spawned.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let t1 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(t1.elapsed() < Duration::from_secs(5), "launcher took {:?} to exit", t1.elapsed());
    assert_eq!(out.status.code(), Some(128 + libc::SIGTERM), "stderr: {}", text(&out.stderr));
    // Ranks and their children (the sleeps) are gone; reaped orphans may take a moment.
    for pid in pids {
        let t = Instant::now();
        // SAFETY: signal 0 only probes.
        while unsafe { libc::kill(pid, 0) } == 0 {
            assert!(t.elapsed() < Duration::from_secs(3), "process {pid} survived the launcher");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let job = std::fs::read_to_string(dir.join("job")).unwrap().trim().to_owned();
    assert_eq!(job_objects(&job), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn timeout_kills_and_exits_124() {
    let (out, took) = run(&["-n", "2", "--timeout", "0.5", "--", "sh", "-c", "echo $GPULMT_JOB; sleep 30"]);
    assert_eq!(out.status.code(), Some(124), "stderr: {}", text(&out.stderr));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(text(&out.stderr).contains("timeout"));
    for job in text(&out.stdout).lines() {
        assert_eq!(job_objects(job), Vec::<String>::new());
    }
}

#[test]
fn bad_usage_exits_2() {
    for args in [
        &[][..],
        &["sh"],
        &["-n", "0", "true"],
        &["-n", "x", "true"],
        &["--bogus", "-n", "1", "true"],
        &["-n", "1", "--bind", "socket", "true"],
    ] {
        let (out, _) = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("usage: gpulmt-run"), "{args:?}: {}", text(&out.stderr));
    }
    let (out, _) = run(&["-n", "1", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(127), "stderr: {}", text(&out.stderr));
    let (out, _) = run(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn program_options_are_not_ours() {
    // Options after the program belong to it, even without "--".
    let (out, _) = run(&["-n2", "sh", "-c", "echo $GPULMT_SIZE", "-n", "9"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "2\n2\n");
}

#[test]
fn cleanup_removes_objects_of_dead_processes() {
    let mut c = Command::new("true").spawn().unwrap();
    let dead = c.id();
    c.wait().unwrap();
    let stale = format!("gpulmt-sim-{dead}-launchertest");
    let live = format!("gpulmt-sim-{}-launchertest", std::process::id());
    std::fs::write(Path::new("/dev/shm").join(&stale), b"").unwrap();
    std::fs::write(Path::new("/dev/shm").join(&live), b"").unwrap();
    let (out, _) = run(&["--cleanup"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("removed"), "{}", text(&out.stdout));
    assert!(!shm_exists(&stale));
    assert!(shm_exists(&live));
    std::fs::remove_file(Path::new("/dev/shm").join(&live)).unwrap();
}

/// Set in the environment of the ranks that run [`helper_rank`].
const HELPER_ENV: &str = "GPULMT_TEST_HELPER_DIR";

/// Not a test by itself: a rank program for [`launcher_marks_failed_rank_in_segment`],
/// which runs this test binary under gpulmt-run. Without the helper env it does nothing.
#[test]
fn helper_rank() {
    let Ok(dir) = std::env::var(HELPER_ENV) else { return };
    let job = std::env::var("GPULMT_JOB").unwrap();
    let rank: usize = std::env::var("GPULMT_RANK").unwrap().parse().unwrap();
    let layout = JobLayout { nranks: 2, ring_slots: 8, slot_size: 64, chunk_size: 4096, depth: 2 };
    if rank == 0 {
        let seg = JobSegment::create(&job, layout).unwrap();
        seg.claim_rank(0, std::process::id(), node_id(), 0).unwrap();
        // Only the launcher writes Failed for rank 1 (it exits without marking itself).
        let t0 = Instant::now();
        while seg.rank_state(1) != RankState::Failed {
            assert!(t0.elapsed() < Duration::from_secs(10), "launcher never marked rank 1 failed");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::fs::write(Path::new(&dir).join("saw-failed"), b"yes").unwrap();
        std::process::exit(0);
    } else {
        let seg = JobSegment::open(&job, Duration::from_secs(10)).unwrap();
        seg.claim_rank(1, std::process::id(), node_id(), 0).unwrap();
        std::process::exit(5);
    }
}

#[test]
fn launcher_marks_failed_rank_in_segment() {
    let dir = scratch("mark");
    let me = std::env::current_exe().unwrap();
    let t0 = Instant::now();
    let out = Command::new(BIN)
        .args(["-n", "2", "--abort-grace-ms", "10000", "--"])
        .arg(&me)
        .args(["--exact", "helper_rank", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, &dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "stderr: {}", text(&out.stderr));
    // Rank 0 saw the mark and exited by itself, long before the 10 s grace period.
    assert!(dir.join("saw-failed").exists(), "stdout: {}", text(&out.stdout));
    assert!(t0.elapsed() < Duration::from_secs(8), "took {:?}", t0.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Cpus_allowed_list` of each rank (a shell that reads its own status), rank order.
fn rank_cpu_lists(args: &[&str]) -> Vec<String> {
    let script = r#"echo "$GPULMT_RANK $(grep Cpus_allowed_list /proc/self/status | cut -f2)""#;
    let mut full: Vec<&str> = args.to_vec();
    full.extend(["--", "sh", "-c", script]);
    let (out, _) = run(&full);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let mut lines: Vec<(usize, String)> = text(&out.stdout)
        .lines()
        .map(|l| {
            let (r, cpus) = l.split_once(' ').expect("rank and CPU list");
            (r.parse().unwrap(), cpus.to_string())
        })
        .collect();
    lines.sort();
    lines.into_iter().map(|(_, c)| c).collect()
}

/// By default each rank runs on a CPU of its own (a single CPU, distinct across ranks),
/// while the ranks fit the launcher's CPUs; `--bind none`, or more ranks than CPUs, leaves
/// them the launcher's whole set.
#[test]
fn ranks_are_bound_to_cores_of_their_own() {
    let ours = gpulmt::binding::allowed_cpus();
    let whole = text(
        &Command::new("sh").args(["-c", "grep Cpus_allowed_list /proc/self/status | cut -f2"]).output().unwrap().stdout,
    )
    .trim()
    .to_string();
    let n = ours.len().min(2);
    let bound = rank_cpu_lists(&["-n", &n.to_string()]);
    let cpus: Vec<usize> =
        bound.iter().map(|c| c.parse().unwrap_or_else(|_| panic!("rank not bound to one CPU: {c}"))).collect();
    assert!(cpus.iter().all(|c| ours.contains(c)), "{cpus:?} outside {ours:?}");
    assert_eq!(cpus.iter().collect::<std::collections::BTreeSet<_>>().len(), n, "{cpus:?}");
    if ours.len() > 1 {
        for l in rank_cpu_lists(&["-n", &n.to_string(), "--bind", "none"]) {
            assert_eq!(l, whole);
        }
    }
    for l in rank_cpu_lists(&["-n", &(ours.len() + 1).to_string()]) {
        assert_eq!(l, whole, "oversubscribed ranks must not be bound");
    }
}
