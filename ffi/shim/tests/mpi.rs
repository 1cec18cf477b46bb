//! The PMPI shim under a real MPI launcher: `tests/c/p2p.c`, a plain MPI program
//! compiled with `mpicc` (not linked against the shim), runs under
//! `mpirun -np 2`, `-np 3` and `-np 4` with `LD_PRELOAD=libgpulmt_mpi.so` on sim devices, and
//! checks every byte and status itself (placements D->D, D->H, H->D, H->H at 1, 176,
//! 4097 bytes, 1 MiB and 16 MiB, blocking and not; MPI_ANY_SOURCE; receives posted in
//! another tag order than sent; non-overtaking between device and host messages;
//! truncation; small receives into one buffer again and again; MPI_Sendrecv;
//! MPI_Probe/MPI_Iprobe then MPI_Recv; MPI_Cancel; MPI_Request_free;
//! MPI_Waitany/Waitsome/Testall/Testany/Testsome; self sends; a communicator with
//! reordered ranks), also across 2 pseudo-nodes (`GPULMT_PSEUDO_NODES=2`: device
//! messages to the other node staged through MPI). These tests assert that every rank
//! finished clean, which path the shim took (its counters), and that /dev/shm is clean
//! after.
//!
//! The shim's sim example, `examples/device_pingpong.c`, is built and run the same way
//! (as its comment tells a user to), so that it cannot rot.
//!
//! Needs `mpicc` and `mpirun` (Open MPI; `.ci/run` installs them); without them the
//! tests print why and pass without running anything.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpulmt_tests::{descendants, job_lock, objects_of, target_profile_dir};

/// The MPI the shim was built against (its build.rs says which) and its tools: the C
/// programs are compiled and launched with the same MPI, Open MPI (`mpicc`, `mpirun`) or
/// MPICH (`mpicc.mpich`, Hydra's `mpiexec.mpich`; built with
/// `MPICC=mpicc.mpich cargo test -p gpulmt-shim --target-dir target/mpich`).
struct Mpi {
    mpich: bool,
    cc: &'static str,
    launcher: &'static str,
}

fn mpi() -> &'static Mpi {
    static MPI: OnceLock<Mpi> = OnceLock::new();
    MPI.get_or_init(|| {
        let mpich = env!("GPULMT_SHIM_MPI") == "mpich";
        let found = env!("GPULMT_SHIM_MPICC");
        let cc = if !found.is_empty() {
            found
        } else if mpich {
            "mpicc.mpich"
        } else {
            "mpicc"
        };
        let launcher = match (mpich, on_path("mpiexec.mpich")) {
            (false, _) => "mpirun",
            (true, true) => "mpiexec.mpich",
            (true, false) => "mpiexec",
        };
        Mpi { mpich, cc, launcher }
    })
}

fn on_path(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the MPI's compiler and launcher are on PATH; prints why not.
fn have_mpi() -> bool {
    let m = mpi();
    let missing: Vec<&str> = [m.cc, m.launcher].into_iter().filter(|t| !on_path(t)).collect();
    if !missing.is_empty() {
        let install =
            if m.mpich { "apt-get install libmpich-dev mpich" } else { "apt-get install libopenmpi-dev openmpi-bin" };
        eprintln!(
            "SKIPPED: {} not found on PATH: the PMPI shim tests need the MPI installation the shim was built against ({install}; .ci/run does)",
            missing.join(" and ")
        );
        return false;
    }
    true
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The shim this `cargo test` built (`cargo test` leaves the cdylib in `deps/`).
fn shim_lib() -> PathBuf {
    let lib = target_profile_dir().join("deps").join("libgpulmt_mpi.so");
    assert!(lib.is_file(), "{} is missing: build it with `cargo build -p gpulmt-shim`", lib.display());
    lib
}

/// Compiles the C program `source` (relative to this crate) with mpicc and strict
/// warnings into the test directory as `name`.
fn mpicc(name: &str, source: &str) -> PathBuf {
    let dir = target_profile_dir().join("shim-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(name);
    let mut cmd = Command::new(mpi().cc);
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1"]);
    if mpi().mpich {
        // MPICH's MPI_STATUSES_IGNORE is `(MPI_Status *)1`, which GCC 12 takes for an
        // array of no statuses passed where the prototype wants some.
        cmd.arg("-Wno-stringop-overflow");
    }
    let o = cmd
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join(source))
        .arg("-o")
        .arg(&out)
        .output()
        .expect("run the MPI compiler wrapper");
    assert!(
        o.status.success(),
        "{} {source} failed:\n{}{}",
        mpi().cc,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// `tests/c/p2p.c`, compiled once.
fn p2p() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("p2p", "tests/c/p2p.c"))
}

/// `tests/c/barrier.c`, compiled once.
fn barrier() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("barrier", "tests/c/barrier.c"))
}

/// `tests/c/calls.c`, compiled once.
fn calls() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("calls", "tests/c/calls.c"))
}

/// `tests/c/rma.c`, compiled once.
fn rma() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("rma", "tests/c/rma.c"))
}

/// `tests/c/blocked.c`, compiled once.
fn blocked() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("blocked", "tests/c/blocked.c"))
}

/// `tests/c/coll.c`, compiled once.
fn coll() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("coll", "tests/c/coll.c"))
}

/// `tests/c/io.c`, compiled once.
fn io() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("io", "tests/c/io.c"))
}

/// `tests/c/devcoll.c`, compiled once.
fn devcoll() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("devcoll", "tests/c/devcoll.c"))
}

/// `tests/c/pcoll.c`, compiled once.
#[cfg(mpi_persistent_coll)]
fn pcoll() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("pcoll", "tests/c/pcoll.c"))
}

/// `examples/device_pingpong.c`, compiled once.
fn device_pingpong() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| mpicc("device_pingpong", "examples/device_pingpong.c"))
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    what: String,
    /// The processes mpirun started (seen while it ran): whose objects are the run's.
    pids: Vec<u32>,
}

impl Run {
    fn dump(&self) -> String {
        format!("{} exited with {:?}\n--- stdout\n{}--- stderr\n{}", self.what, self.code, self.stdout, self.stderr)
    }

    /// Sums counter `name` over the ranks' `rank R counters ...` lines.
    fn counter(&self, name: &str) -> u64 {
        self.counters(" counters ", name).iter().sum()
    }

    /// Counter `name` of each rank's line that contains `line` (`rank R <line> k=v ...`).
    fn counters(&self, line: &str, name: &str) -> Vec<u64> {
        self.stdout
            .lines()
            .filter(|l| l.contains(line))
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .map(|v| v.parse::<u64>().unwrap_or_else(|_| panic!("counter {name}={v}")))
                    .sum()
            })
            .collect()
    }

    fn assert_all_ok(&self, np: usize) {
        assert_eq!(self.code, Some(0), "{}", self.dump());
        for r in 0..np {
            assert!(
                self.stdout.lines().any(|l| l.starts_with(&format!("rank {r} ok checks="))),
                "rank {r} did not finish clean\n{}",
                self.dump()
            );
        }
        assert!(!self.stderr.contains("FAIL"), "{}", self.dump());
    }
}

/// How long a run may take before it counts as hung and is killed.
const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Runs `prog args` under the MPI's launcher with N ranks and only the given GPULMT_*
/// settings (plus GPULMT_DEVICE=sim), the shim preloaded if `preload`; kills it after
/// [`RUN_LIMIT`].
fn mpirun(prog: &Path, np: usize, preload: bool, env: &[(&str, &str)], args: &[&str]) -> Run {
    mpirun_within(prog, np, preload, env, args, RUN_LIMIT)
}

/// As [`mpirun`], killed (and failed) after `limit`.
fn mpirun_within(prog: &Path, np: usize, preload: bool, env: &[(&str, &str)], args: &[&str], limit: Duration) -> Run {
    let (mut cmd, what) = launch_command(prog, np, preload, env, args);
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start the MPI launcher");
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = pipe(Box::new(child.stdout.take().unwrap()));
    let err = pipe(Box::new(child.stderr.take().unwrap()));
    let t0 = Instant::now();
    let mut term_sent = None;
    let mut pids = Vec::new();
    let status = loop {
        for p in descendants(child.id()) {
            if !pids.contains(&p) {
                pids.push(p);
            }
        }
        if let Some(s) = child.try_wait().expect("wait for the MPI launcher") {
            break s;
        }
        match term_sent {
            None if t0.elapsed() > limit => {
                // mpirun and Hydra forward SIGTERM to their ranks; SIGKILL would orphan them.
                // SAFETY: signalling our own child process.
                unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
                term_sent = Some(Instant::now());
            }
            Some(t) if t.elapsed() > Duration::from_secs(20) => {
                let _ = child.kill();
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let run = Run { code: status.code(), stdout: out.join().unwrap(), stderr: err.join().unwrap(), what, pids };
    assert!(term_sent.is_none(), "timed out after {} s (hung?)\n{}", limit.as_secs(), run.dump());
    run
}

/// The MPI launcher's command line for `prog args` on `np` ranks with only the given
/// GPULMT_* settings (plus GPULMT_DEVICE=sim), the shim preloaded if `preload`; and how
/// to name it in messages.
fn launch_command(prog: &Path, np: usize, preload: bool, env: &[(&str, &str)], args: &[&str]) -> (Command, String) {
    let m = mpi();
    let mut cmd = Command::new(m.launcher);
    if m.mpich {
        // Hydra runs as root and oversubscribes without being asked.
        cmd.args(["-n", &np.to_string()]);
    } else {
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()]);
    }
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("GPULMT_") || k == "LD_PRELOAD") {
            cmd.env_remove(k);
        }
    }
    let mut vars = vec![("GPULMT_DEVICE".to_string(), "sim".to_string())];
    if preload {
        vars.push(("LD_PRELOAD".into(), shim_lib().display().to_string()));
    }
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in &vars {
        if m.mpich {
            cmd.arg("-genv").arg(k).arg(v);
        } else {
            cmd.arg("-x").arg(format!("{k}={v}"));
        }
    }
    cmd.arg(prog).args(args);
    let what = format!(
        "{} -n {np} {} {} {}",
        m.launcher,
        vars.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "),
        prog.file_name().unwrap_or_default().to_string_lossy(),
        args.join(" ")
    );
    (cmd, what)
}

/// The rank counts at which to run a program of many collectives: all of `nps` under
/// Open MPI, under MPICH those the machine has cores for. MPICH 4.0's ranks busy-poll
/// without yielding, so with more ranks than cores each collective waits for time
/// slices: an 8-byte MPI_Allreduce at np 4 on 2 cores took 8 ms, with or without the
/// shim, and `coll` took 45 s instead of 1 s.
fn collective_nps(nps: &[usize]) -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (run, skip): (Vec<usize>, Vec<usize>) = nps.iter().partition(|&&np| !mpi().mpich || np <= cores.max(2));
    if !skip.is_empty() {
        eprintln!("SKIPPED under MPICH on {cores} cores: np {skip:?} (see collective_nps)");
    }
    run
}

/// Runs `prog` with the shim and checks that it left no shared memory behind: none of
/// the objects of its processes (what other jobs on the machine make is theirs).
fn clean_run(prog: &Path, np: usize, env: &[(&str, &str)], args: &[&str]) -> Run {
    clean_run_within(prog, np, env, args, RUN_LIMIT)
}

/// As [`clean_run`], killed (and failed) after `limit`.
fn clean_run_within(prog: &Path, np: usize, env: &[(&str, &str)], args: &[&str], limit: Duration) -> Run {
    let run = mpirun_within(prog, np, true, env, args, limit);
    assert!(
        run.pids.len() >= np,
        "saw {} processes of mpirun, expected its {np} ranks\n{}",
        run.pids.len(),
        run.dump()
    );
    let left = objects_of(&[], &run.pids);
    assert!(left.is_empty(), "/dev/shm objects left behind: {left:?}\n{}", run.dump());
    run
}

#[test]
fn device_buffers_move_through_gpulmt_with_mpi_semantics() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    // 3 ranks: one rank without a partner in the pairwise parts. Below
    // MPI_THREAD_MULTIPLE the shim shares its host-message state between threads, with
    // it each thread has its own (hostmem.rs): both are run.
    for (np, args) in [(2, &[][..]), (3, &[][..]), (4, &["thread"][..]), (2, &["multiple"][..])] {
        let run = clean_run(p2p(), np, &[], args);
        run.assert_all_ok(np);
        assert!(
            run.counter("lmt_sends") > 0 && run.counter("lmt_recvs") > 0,
            "no device message went through gpulmt\n{}",
            run.dump()
        );
        assert_eq!(run.counter("lmt_sends"), run.counter("lmt_recvs"), "{}", run.dump());
        assert_eq!(run.counter("staged_sends"), 0, "device sends within a node were staged\n{}", run.dump());
    }
}

/// Issue 27: the same program across 2 pseudo-nodes (`GPULMT_PSEUDO_NODES=2`, as the
/// internode tests split one machine) of 1 and of 2 ranks, every byte checked by the
/// program alike. By default (`GPULMT_MPI_OFFNODE=queues`) the shim's context spans the
/// job and has the internode path: device messages above its eager limit to the other
/// node go as envelopes whose payload the GIO queues and proxies move (`lmt_sends`), the
/// smaller ones are staged for the MPI library (`staged_sends`). With
/// `GPULMT_MPI_OFFNODE=mpi` every device message to the other node is staged.
#[test]
fn device_buffers_cross_pseudo_nodes_through_the_queues_or_staged_through_mpi() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for (offnode, np) in [("queues", 2), ("queues", 4), ("mpi", 2), ("mpi", 4)] {
        let env = [("GPULMT_PSEUDO_NODES", "2"), ("GPULMT_MPI_OFFNODE", offnode)];
        let run = clean_run(p2p(), np, &env, &[]);
        run.assert_all_ok(np);
        let (staged, lmt) = (run.counters(" counters ", "staged_sends"), run.counters(" counters ", "lmt_sends"));
        assert_eq!(staged.len(), np, "a counters line per rank\n{}", run.dump());
        assert_eq!(run.counter("lmt_sends"), run.counter("lmt_recvs"), "{}", run.dump());
        match (offnode, np) {
            // Each rank is a node of its own: gpulmt moves only the two device sends of
            // the `self_send` part unless the queues carry the large ones (some 100 per
            // rank); the small ones are staged either way.
            ("queues", 2) => {
                assert!(
                    lmt.iter().all(|&l| l > 50),
                    "large device sends across nodes were not moved by gpulmt\n{}",
                    run.dump()
                );
                assert!(
                    staged.iter().sum::<u64>() > 0,
                    "no small device message across nodes was staged\n{}",
                    run.dump()
                );
            }
            ("mpi", 2) => {
                assert!(staged.iter().all(|&s| s >= 50), "device sends across nodes went elsewhere\n{}", run.dump());
                assert!(lmt.iter().all(|&l| l == 2), "gpulmt moved a message across nodes\n{}", run.dump());
            }
            // Ranks 0 and 1 (node 0) and 2 and 3 (node 1) pair up in the pairwise parts.
            _ => {
                assert!(lmt.iter().all(|&l| l > 50), "device messages within a pseudo-node were staged\n{}", run.dump())
            }
        }
    }
}

/// Issue 31, item 1: a rank with an MPI_Irecv (host or device buffer) or a device
/// MPI_Isend in flight and a rank with nothing in flight both call MPI_Barrier; the
/// barrier must complete (the shim once issued PMPI_Ibarrier on the one and
/// PMPI_Barrier on the other, which MPI never matches: a hang). The program's
/// watchdog fails a case stuck for 30 s, and the run is killed after 120 s.
///
/// The stall of `p2p thread` at np 4 past its 300 s limit on a loaded machine (issue 31)
/// was this mismatch: the shim with the old barrier, run beside two busy loops on the 2
/// cores, hung in 1 of 3 runs after the part `repeat_small` (ranks 0 and 3 in
/// PMPI_Ibarrier and PMPI_Wait, ranks 1 and 2 in PMPI_Barrier); with the fix 20 of 20
/// such runs passed (7-30 s each).
#[test]
fn barrier_completes_whatever_each_rank_has_in_flight() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in [2, 4] {
        let run = clean_run_within(barrier(), np, &[], &[], Duration::from_secs(120));
        run.assert_all_ok(np);
        assert!(!run.stderr.contains("watchdog"), "{}", run.dump());
    }
}

/// Issue 30, item 1: a rank that started a device MPI_Isend and then blocks in a
/// collective (host or staged device buffers, or a communicator constructor) keeps
/// that transfer moving, so that its partner's MPI_Recv, issued before the partner
/// enters the collective, completes. With the protocols in which the sender copies
/// (put, shm, coop) this needs the sender's progress during the collective (the
/// shim's helper thread); every case hung before. With MPI_THREAD_MULTIPLE, also the
/// other direction: a posted device MPI_Irecv is matched during the collective. The
/// program's watchdog fails a case stuck for 30 s.
#[test]
fn blocking_collectives_keep_device_transfers_moving() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    let cases: [(usize, &str, &[&str]); 8] = [
        (2, "put", &[]),
        (2, "shm", &[]),
        (2, "coop", &[]),
        (2, "put", &["multiple"]),
        (2, "shm", &["multiple"]),
        (2, "get", &["multiple"]),
        (4, "put", &[]),
        (4, "shm", &["multiple"]),
    ];
    for (np, protocol, args) in cases {
        let run = clean_run_within(blocked(), np, &[("GPULMT_PROTOCOL", protocol)], args, Duration::from_secs(120));
        run.assert_all_ok(np);
        assert!(!run.stderr.contains("watchdog"), "{}", run.dump());
    }
}

/// Issue 30: the point-to-point calls beyond plain sends and receives on device buffers
/// give what the same calls give on host buffers: buffered and ready sends, persistent
/// requests started again and again (with MPI_Startall, MPI_Request_free, MPI_Cancel,
/// MPI_Request_get_status, an inactive request in a wait), the program's matched probes
/// and receives (of envelopes, data, 176-byte host data, after a plain probe, behind an
/// earlier posted receive, truncated), MPI_Sendrecv_replace, and derived datatypes with
/// gaps on either side (tests/c/calls.c says more). Its barriers per exchange make it a
/// program of many collectives (see `collective_nps`). Also across 2 pseudo-nodes.
#[test]
fn point_to_point_calls_on_device_buffers_match_host_buffers() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in collective_nps(&[2, 3, 4]) {
        let run = clean_run_within(calls(), np, &[], &[], Duration::from_secs(180));
        run.assert_all_ok(np);
        assert!(run.stderr.contains("MPI_Start: the persistent request is still active"), "{}", run.dump());
    }
    // Across 2 pseudo-nodes of one rank each, envelopes come from the other node through
    // the GIO queues: the program's matched probes of them need a placeholder message on
    // a communicator of more than one rank (MPICH 4.0 crashed receiving one on the node's
    // communicator of one rank).
    let run = clean_run_within(calls(), 2, &[("GPULMT_PSEUDO_NODES", "2")], &[], Duration::from_secs(180));
    run.assert_all_ok(2);
}

/// Issue 30: one-sided communication with device memory: windows of MPI_Win_create over
/// device buffers (host shadows kept coherent at the separate model's synchronizations)
/// and device origin buffers, with fence, post/start/complete/wait and passive target
/// (lock/unlock, flush, lock_all), every value checked in five placements; a dynamic
/// window refuses device memory with an error naming the call (tests/c/rma.c).
#[test]
fn one_sided_communication_on_device_memory_matches_host_memory() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in collective_nps(&[2, 3, 4]) {
        let run = clean_run_within(rma(), np, &[], &[], Duration::from_secs(120));
        run.assert_all_ok(np);
        assert!(run.stderr.contains("MPI_Win_attach: device memory cannot be attached"), "{}", run.dump());
    }
}

/// Issue 30: every collective (blocking and not) on device buffers, staged through host
/// memory, gives what the same call gives on host buffers: every predefined op on every
/// type it applies to, a user op on a derived type, odd counts, MPI_IN_PLACE, gaps,
/// mixed placements in one call (tests/c/coll.c says what else). Sim device memory is
/// host-addressable, so the staging counters are what show that the shim staged. Then
/// with a 1 MiB cap: large reductions split on every rank and agree, and collectives
/// over the cap fail with an error naming the call.
#[test]
fn collectives_on_device_buffers_match_host_buffers() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in collective_nps(&[2, 3, 4]) {
        // The staged path: the device path (tested below) would take the large all-device
        // MPI_Bcast, MPI_Allgather and MPI_Allreduce calls.
        let run = clean_run_within(coll(), np, STAGED_ONLY, &[], Duration::from_secs(120));
        run.assert_all_ok(np);
        let staged = run.counters(" staging ", "staged_calls");
        assert!(staged.len() == np && staged.iter().all(|&n| n > 0), "some rank staged nothing\n{}", run.dump());
        assert!(run.counters(" staging ", "split_calls").iter().all(|&n| n == 0), "{}", run.dump());
        // The shim's own error messages reach the user on stderr too (under MPICH only there).
        assert!(
            run.stderr.contains("MPI_Allreduce: device buffers in a collective on an intercommunicator"),
            "{}",
            run.dump()
        );

        let env = [STAGED_ONLY[0], ("GPULMT_MPI_STAGING_MAX", "1M")];
        let run = clean_run_within(coll(), np, &env, &["small"], Duration::from_secs(120));
        run.assert_all_ok(np);
        let split = run.counters(" staging ", "split_calls");
        assert!(split.len() == np && split.iter().all(|&n| n > 0), "no reduction was split\n{}", run.dump());
        assert!(run.stderr.contains("MPI_Bcast: staging 2M of device data"), "{}", run.dump());
    }
}

/// Issue 30: MPI-IO on device buffers: every blocking and non-blocking read and write
/// (explicit offsets, individual, shared and ordered file pointers, collective forms)
/// staged, each write checked through a host read of the file and each read byte for
/// byte with a guard, a strided read leaving its gaps; split collectives and
/// neighbourhood collectives refuse device buffers with an error naming the call and
/// run on host buffers (tests/c/io.c says more).
#[test]
fn file_io_on_device_buffers_matches_host_buffers() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in collective_nps(&[2, 3, 4]) {
        let dir = target_profile_dir().join("shim-tests").join(format!("io-{}-{np}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let run = clean_run_within(io(), np, &[], &[dir.to_str().unwrap()], Duration::from_secs(120));
        run.assert_all_ok(np);
        for call in ["MPI_File_write_at_all_begin", "MPI_File_read_all_begin"] {
            assert!(run.stderr.contains(&format!("{call}: device buffers in split collective")), "{}", run.dump());
        }
        for call in ["MPI_Neighbor_allgather", "MPI_Ineighbor_alltoall"] {
            assert!(run.stderr.contains(&format!("{call}: device buffers in neighborhood")), "{}", run.dump());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// Issue 30: MPI-4's persistent collectives (every `MPI_*_init` collective with buffers)
/// on device buffers, each started three times with new data, give what the blocking
/// call gives on host buffers; every start on device buffers is staged by the shim (its
/// counters: sim memory is host-addressable, so the library alone would pass the byte
/// checks), with device buffers on every rank and on even ranks only; MPI_Startall,
/// freeing an active request refused, and a persistent neighborhood collective refusing
/// device buffers (tests/c/pcoll.c). Only where the MPI library
/// declares them (build.rs: MPICH 4, not Open MPI 4.1).
#[test]
fn persistent_collectives_on_device_buffers_match_host_buffers() {
    #[cfg(not(mpi_persistent_coll))]
    eprintln!("SKIPPED: the MPI the shim was built against has no persistent collectives (MPI-4; MPICH 4 has)");
    #[cfg(mpi_persistent_coll)]
    {
        if !have_mpi() {
            return;
        }
        let _lock = job_lock();
        for np in collective_nps(&[2, 3, 4]) {
            let run = clean_run_within(pcoll(), np, &[], &[], Duration::from_secs(120));
            run.assert_all_ok(np);
            assert!(
                run.stderr.contains("MPI_Request_free: the persistent collective is still active"),
                "{}",
                run.dump()
            );
            assert!(
                run.stderr.contains("MPI_Neighbor_allgather_init: device buffers in neighborhood"),
                "{}",
                run.dump()
            );
        }
    }
}

/// Collectives only on the staged path.
const STAGED_ONLY: &[(&str, &str)] = &[("GPULMT_MPI_COLL_DEVICE_MIN", "off")];

/// Issue 30's fast paths: MPI_Bcast, MPI_Allgather, MPI_Allreduce and
/// MPI_Reduce_scatter_block of at least
/// GPULMT_MPI_COLL_DEVICE_MIN bytes with device buffers on every rank move over gpulmt's
/// point-to-point path, the reduction on the device (on sim the host loop in its place),
/// and give what the library gives on host buffers: every op and type the path reduces,
/// in place or not, odd counts, roots first and last; exactly those calls take it (not
/// small ones, a host buffer on one rank, ops without a kernel), and none with `off`
/// (tests/c/devcoll.c).
#[test]
fn large_collectives_on_device_buffers_move_over_gpulmt() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in collective_nps(&[2, 3, 4]) {
        let env = [("GPULMT_MPI_COLL_DEVICE_MIN", "64K")];
        let run = clean_run_within(devcoll(), np, &env, &[], Duration::from_secs(120));
        run.assert_all_ok(np);
        // 2 broadcasts, 2 allgathers, 48 allreduces of every op and type, 3 on duplicates,
        // 13 reduce-scatters.
        let calls = run.counters(" devcoll ", "device_collectives");
        assert!(calls.len() == np && calls.iter().all(|&n| n == 68), "{calls:?}\n{}", run.dump());
    }
    let run = clean_run_within(devcoll(), 2, STAGED_ONLY, &["off"], Duration::from_secs(120));
    run.assert_all_ok(2);
    assert_eq!(run.counters(" devcoll ", "device_collectives"), [0, 0], "{}", run.dump());
}

/// Issue 46: device collectives only on communicators other than MPI_COMM_WORLD (a dup and a
/// split kept until MPI_Finalize, and dups freed before it): right answers, and a clean
/// finalize (Open MPI aborted in MPI_Comm_delete_attr: the shim deleted its attribute from
/// MPI_COMM_WORLD, which never had it).
#[test]
fn device_collectives_on_other_communicators_finalize_cleanly() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in collective_nps(&[2, 3]) {
        let env = [("GPULMT_MPI_COLL_DEVICE_MIN", "64K")];
        let run = clean_run_within(devcoll(), np, &env, &["others-only"], Duration::from_secs(120));
        run.assert_all_ok(np);
        // 2 x (allreduce + bcast) on the kept ones, 3 allreduces on freed dups.
        let calls = run.counters(" devcoll ", "device_collectives");
        assert!(calls.len() == np && calls.iter().all(|&n| n == 7), "{calls:?}\n{}", run.dump());
    }
}

/// With rings of 4 slots, the window part puts more packets to a peer than its ring
/// holds: they wait in gpulmt's outbox while the shim polls, and all arrive.
#[test]
fn device_messages_keep_mpi_semantics_when_control_rings_fill() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    let run = clean_run(p2p(), 2, &[("GPULMT_RING_SLOTS", "4")], &[]);
    run.assert_all_ok(2);
    assert!(run.counter("lmt_sends") >= 96, "the window's device messages did not go through gpulmt\n{}", run.dump());
}

#[test]
fn device_buffers_staged_through_host_memory_keep_mpi_semantics() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    // Every device message below 1 GiB is staged: the path of device buffers sent to
    // ranks on other nodes.
    for np in [2, 4] {
        let run = clean_run(p2p(), np, &[("GPULMT_MPI_LMT_MIN", "1G")], &[]);
        run.assert_all_ok(np);
        assert_eq!(run.counter("lmt_sends"), 0, "{}", run.dump());
        assert!(run.counter("staged_sends") > 0 && run.counter("staged_recvs") > 0, "{}", run.dump());
    }
}

#[test]
fn the_program_runs_only_with_the_shim_active() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    // Not preloaded, or preloaded and switched off: the program sees no shim and stops.
    for (preload, env) in [(false, &[][..]), (true, &[("GPULMT_MPI_DISABLE", "1")][..])] {
        let run = mpirun(p2p(), 2, preload, env, &[]);
        assert_ne!(run.code, Some(0), "{}", run.dump());
        assert!(run.stderr.contains("the gpulmt shim is not active"), "{}", run.dump());
    }
}

/// The sim example a user builds and runs from its comment (README.md): device buffers
/// from `gpulmt_mpi_alloc` on sim devices ping-pong between two ranks through gpulmt,
/// every byte checked by the program; a third rank only takes part in the barriers.
#[test]
fn the_sim_example_pingpongs_device_buffers_through_gpulmt() {
    if !have_mpi() {
        return;
    }
    let _lock = job_lock();
    for np in [2, 3] {
        let run = clean_run(device_pingpong(), np, &[], &["5"]);
        assert_eq!(run.code, Some(0), "{}", run.dump());
        assert!(!run.stderr.contains("FAIL"), "{}", run.dump());
        // Both partners checked every round; each sent its 6 sizes x 5 rounds through gpulmt.
        for r in 0..2 {
            let line = run
                .stdout
                .lines()
                .find(|l| l.starts_with(&format!("rank {r} ok ")))
                .unwrap_or_else(|| panic!("rank {r} did not finish clean\n{}", run.dump()));
            assert!(line.contains("lmt_sends=30 lmt_recvs=30 staged_sends=0"), "rank {r}: {line}\n{}", run.dump());
        }
        // A latency row per size.
        let rows = run.stdout.lines().filter(|l| l.split_whitespace().count() == 2 && !l.starts_with('#')).count();
        assert_eq!(rows, 6, "{}", run.dump());
    }
    // Without the shim the program says what is missing.
    let run = mpirun(device_pingpong(), 2, false, &[], &[]);
    assert_ne!(run.code, Some(0), "{}", run.dump());
    assert!(run.stderr.contains("LD_PRELOAD=/path/to/libgpulmt_mpi.so"), "{}", run.dump());
}

/// A rank of a shim job SIGKILLed mid-run (no gpulmt-run to clean up after mpirun): the
/// job segment has no name left (rank 0 removed it when every rank had joined), and what
/// the dead processes held (their simulated device memory) is abandoned by their owner
/// locks, which the sweep at the start of the next job on the node removes.
#[test]
fn a_rank_killed_mid_run_leaves_nothing_the_next_job_does_not_remove() {
    use gpulmt::shm::sweep::{sweep, Evidence};
    use gpulmt_tests::live::{signal, LiveJob};
    if !have_mpi() {
        return;
    }
    let prog = p2p();
    let _lock = job_lock();
    let (mut cmd, _) = launch_command(prog, 2, true, &[], &[]);
    gpulmt_tests::without_gpulmt_env(&mut cmd).env_remove("LD_PRELOAD");
    let mut job = LiveJob::spawn(cmd, "mpirun -np 2 (shim) p2p, rank killed after its first part");
    let started = job.wait_line(Duration::from_secs(120), |l| l.starts_with("part ") && l.ends_with(" done"));
    let pids = descendants(job.pid());
    if started.is_some() {
        if let Some(&victim) = pids.iter().max() {
            signal(victim, libc::SIGKILL);
        }
    }
    let out = job.finish(Duration::from_secs(120));
    assert!(started.is_some() && pids.len() >= 2, "the job never ran a part\n{}", out.dump());
    assert!(out.code.is_some_and(|c| c != 0), "mpirun must end with a failure\n{}", out.dump());
    let named: Vec<String> = objects_of(&[], &pids).into_iter().filter(|n| n.starts_with("gpulmt-mpi")).collect();
    assert!(named.is_empty(), "the job segment is still named: {named:?}\n{}", out.dump());
    // The next job starts once this one's processes are gone: mpirun may return while a
    // rank it told to stop is still exiting (and holding its owner lock) on a loaded host.
    let gone_by = std::time::Instant::now() + Duration::from_secs(30);
    while pids.iter().any(|&p| gpulmt::shm::owner::pid_alive(p)) && std::time::Instant::now() < gone_by {
        std::thread::sleep(Duration::from_millis(20));
    }
    sweep(Evidence::Locks);
    let left = objects_of(&[], &pids);
    assert!(left.is_empty(), "left after the sweep a job's start runs: {left:?}\n{}", out.dump());
}
