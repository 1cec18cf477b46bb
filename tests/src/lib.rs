//! Harness of gpulmt's multi-process integration tests.
//!
//! The tests in `tests/` start jobs of the `gpulmt-check` rank program (this crate's
//! binary) under the `gpulmt-run` launcher (the `gpulmt` crate's binary) with the sim
//! device backend, and assert the exit status and the lines the ranks print:
//!
//! ```text
//! job=<id>                                          (rank 0)
//! rank=R pid=P device=D size=N
//! rank=R protocols get=.. put=.. coop=.. shm=.. self=..
//! rank=R cache opens=.. closes=.. hits=.. misses=.. entries=.. evictions=..
//! rank=R ok <scenario>
//! ```
//!
//! Both binaries live next to the test executables: `target/<profile>/deps/<test>-<hash>`
//! runs, `target/<profile>/gpulmt-run` and `target/<profile>/gpulmt-check` are the
//! binaries. `cargo test -p gpulmt-tests` builds `gpulmt-check` but not the launcher of
//! another package: run `cargo build --workspace --bins` first.
//!
//! Jobs are serialized across threads and test processes with a file lock: every rank
//! busy-polls, so two jobs at once on a small CI machine would only slow each other
//! down (and timing assertions would become flaky).

pub mod live;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `target/<profile>/`, derived from the running test executable.
pub fn target_profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test executable has a directory");
    if deps.file_name().is_some_and(|n| n == "deps") {
        deps.parent().expect("deps has a parent").to_path_buf()
    } else {
        deps.to_path_buf()
    }
}

/// The repository's root directory.
pub fn repo_root() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the workspace").to_path_buf()
}

/// The directory of the C library `libgpulmt.so` that C programs are linked against:
/// `cargo test` leaves the cdylib it built in `deps/` (`cargo build` copies it up to
/// `target/<profile>/`), so that C programs run against the library under test.
pub fn c_lib_dir() -> PathBuf {
    let deps = target_profile_dir().join("deps");
    assert!(
        deps.join("libgpulmt.so").is_file(),
        "{} is missing: build the C library with `cargo build -p gpulmt-ffi`",
        deps.join("libgpulmt.so").display()
    );
    deps
}

/// The C compiler: `$CC`, else `cc`.
pub fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Compiles `source` (relative to the repository) with strict warnings against
/// `include/gpulmt.h` into `target/<profile>/ffi-examples/<out_name>`; `link` adds the
/// library ([`c_lib_dir`]). Returns the program's path.
pub fn compile_c(source: &str, out_name: &str, extra: &[&str], link: bool) -> PathBuf {
    compile_c_with(&c_compiler(), source, out_name, extra, link)
}

/// As [`compile_c`], with the compiler `compiler` (`mpicc` for a program that calls MPI).
pub fn compile_c_with(compiler: &str, source: &str, out_name: &str, extra: &[&str], link: bool) -> PathBuf {
    let root = repo_root();
    let dir = target_profile_dir().join("ffi-examples");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(out_name);
    let mut cmd = Command::new(compiler);
    cmd.args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-g", "-O1"])
        .args(extra)
        .arg("-I")
        .arg(root.join("include"))
        .arg(root.join(source))
        .arg("-o")
        .arg(&out);
    if link {
        let lib = c_lib_dir();
        cmd.arg("-L").arg(&lib).arg(format!("-Wl,-rpath,{}", lib.display())).arg("-lgpulmt");
    }
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot run the C compiler `{compiler}`: {e} (set CC)"));
    assert!(
        o.status.success(),
        "compiling {source} failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The launcher, `target/<profile>/gpulmt-run`; panics with the command to build it.
pub fn launcher() -> PathBuf {
    let p = target_profile_dir().join("gpulmt-run");
    assert!(
        p.is_file(),
        "the launcher {} is missing: run `cargo build --workspace --bins` before `cargo test -p gpulmt-tests`",
        p.display()
    );
    p
}

/// `target/<profile>/gpulmt-info`; panics with the command to build it.
pub fn info_program() -> PathBuf {
    let p = target_profile_dir().join("gpulmt-info");
    assert!(p.is_file(), "{} is missing: run `cargo build --workspace --bins` first", p.display());
    p
}

/// The rank program. Tests pass `env!("CARGO_BIN_EXE_gpulmt-check")`; this is the
/// fallback next to the launcher.
pub fn check_program(from_cargo: Option<&str>) -> PathBuf {
    let p = from_cargo.map(PathBuf::from).unwrap_or_else(|| target_profile_dir().join("gpulmt-check"));
    assert!(p.is_file(), "the rank program {} is missing: run `cargo build --workspace --bins`", p.display());
    p
}

/// Runs a benchmark program to its end under the job lock, with no `GPULMT_*` variable of
/// the test's own environment but `envs`, and returns its output with a text of its exit
/// code, stdout and stderr for assertion messages.
pub fn run_program(program: &str, envs: &[(&str, &str)], args: &[&str]) -> (std::process::Output, String) {
    let _lock = job_lock();
    let mut cmd = Command::new(program);
    without_gpulmt_env(&mut cmd);
    let out = cmd.envs(envs.iter().copied()).args(args).output().unwrap_or_else(|e| panic!("start {program}: {e}"));
    let text = format!(
        "exit {:?}\n--- stdout ---\n{}--- stderr ---\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out, text)
}

/// Removes every `GPULMT_*` variable of the test's own environment from `cmd`: a job
/// runs with the settings its test gives, none inherited from the caller's shell.
pub fn without_gpulmt_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("GPULMT_")) {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Prints a fault-injection count line (`fault-suite <category>: ...`) and appends it to
/// `target/<profile>/fault-suite.log`, which `.ci/run` shows: the suite's own categories
/// (`tests/tests/faults.rs`) and the soaks of other suites report alike.
pub fn record_fault_counts(line: &str) {
    use std::io::Write;
    eprintln!("{line}");
    println!("{line}");
    if let Ok(mut f) =
        std::fs::OpenOptions::new().create(true).append(true).open(target_profile_dir().join("fault-suite.log"))
    {
        let _ = writeln!(f, "{line}");
    }
}

/// One rank of a job started by hand, without a launcher (as a user's script, or a
/// second job that reuses an id, would): `prog args` with `GPULMT_JOB`, `GPULMT_RANK`,
/// `GPULMT_SIZE`, sim devices and `env`, and no other `GPULMT_*` setting.
pub fn by_hand(prog: &Path, job: &str, rank: &str, size: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(prog);
    without_gpulmt_env(&mut cmd)
        .args(args)
        .envs([("GPULMT_DEVICE", "sim"), ("GPULMT_JOB", job), ("GPULMT_RANK", rank), ("GPULMT_SIZE", size)])
        .envs(env.iter().copied());
    cmd
}

/// `gpulmt-run -n N --timeout T -- prog args` with only `env` of the `GPULMT_*`
/// settings (plus `GPULMT_DEVICE=sim`).
pub fn launcher_command(
    n: usize,
    timeout_s: u64,
    prog: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(launcher());
    cmd.arg("-n").arg(n.to_string()).arg("--timeout").arg(timeout_s.to_string()).arg("--").arg(prog).args(args);
    without_gpulmt_env(&mut cmd).env("GPULMT_DEVICE", "sim").envs(env.iter().copied());
    cmd
}

/// `mpirun -np N [mca...] prog args` on sim devices, with only `env` of the `GPULMT_*`
/// settings (passed to the ranks with `-x`); `mca` are extra mpirun options
/// (`["--mca", "btl", "tcp,self"]`).
pub fn mpirun_command(np: usize, mca: &[&str], prog: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new("mpirun");
    without_gpulmt_env(&mut cmd).args(["--allow-run-as-root", "--oversubscribe", "-np", &np.to_string()]).args(mca);
    for (k, v) in [("GPULMT_DEVICE", "sim")].iter().chain(env) {
        cmd.arg("-x").arg(format!("{k}={v}"));
    }
    cmd.arg(prog).args(args);
    cmd
}

/// Whether `mpirun` is on PATH; prints why a test skips where it is not.
pub fn have_mpirun() -> bool {
    let found = Command::new("sh").args(["-c", "command -v mpirun"]).output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: mpirun is not on PATH (apt-get install openmpi-bin libopenmpi-dev; .ci/run does)");
    }
    found
}

/// `gpulmt-fault-mpi` (the fault-injection rank program started by `mpirun`, built with
/// the `mpi` feature; `.ci/run` builds it) where it and `mpirun` exist; `None` (saying
/// why) where either is missing.
pub fn mpi_fault_program() -> Option<PathBuf> {
    let prog = target_profile_dir().join("gpulmt-fault-mpi");
    if !have_mpirun() {
        return None;
    }
    if !prog.is_file() {
        eprintln!(
            "SKIPPED: {} is missing: cargo build -p gpulmt-tests --features mpi --bin gpulmt-fault-mpi (.ci/run does)",
            prog.display()
        );
        return None;
    }
    Some(prog)
}

/// The fault-injection suite's rank program for the PMPI shim (`tests/c/shim_traffic.c`,
/// a plain MPI program compiled with `mpicc`, not linked against gpulmt) and the shim
/// to preload into it, `libgpulmt_mpi.so` of this build; `None` (saying why) where
/// `mpicc`, `mpirun` or the shim is missing.
pub fn shim_fault_program() -> Option<(PathBuf, PathBuf)> {
    let have = |t: &str| {
        Command::new("sh").args(["-c", &format!("command -v {t}")]).output().is_ok_and(|o| o.status.success())
    };
    if !have("mpicc") || !have("mpirun") {
        eprintln!("SKIPPED: mpicc or mpirun is not on PATH (apt-get install libopenmpi-dev openmpi-bin; .ci/run does)");
        return None;
    }
    // `cargo build` copies the cdylib up to target/<profile>/; `cargo test` of the shim
    // leaves it in deps/ only.
    let dir = target_profile_dir();
    let Some(shim) =
        [dir.join("libgpulmt_mpi.so"), dir.join("deps").join("libgpulmt_mpi.so")].into_iter().find(|p| p.is_file())
    else {
        eprintln!("SKIPPED: libgpulmt_mpi.so is not built (cargo build -p gpulmt-shim)");
        return None;
    };
    let out_dir = dir.join("ffi-examples");
    std::fs::create_dir_all(&out_dir).unwrap();
    let prog = out_dir.join("shim_traffic");
    let root = repo_root();
    let o = Command::new("mpicc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-g", "-O1", "-I"])
        .arg(root.join("ffi/shim/include"))
        .arg(root.join("tests/c/shim_traffic.c"))
        .arg("-o")
        .arg(&prog)
        .output()
        .expect("run mpicc");
    assert!(
        o.status.success(),
        "mpicc tests/c/shim_traffic.c failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    Some((prog, shim))
}

/// Whether this process may give a command a mount namespace of its own with a private
/// /dev/shm (as root: `unshare -m`, `mount -t tmpfs`); prints why not.
pub fn private_dev_shm_possible() -> bool {
    let ok = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("SKIPPED: cannot mount a private /dev/shm (needs root: unshare -m, mount -t tmpfs)");
    }
    ok
}

/// `inner` run in a mount namespace of its own whose /dev/shm is a tmpfs of `size`
/// (`8m`, `64m`...): how a test gives a job a small or full /dev/shm without touching
/// the machine's. See [`private_dev_shm_possible`].
pub fn in_private_dev_shm(size: &str, inner: &Command) -> Command {
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "sh", "-c", &format!("mount -t tmpfs -o size={size} tmpfs /dev/shm && exec \"$@\""), "sh"]);
    cmd.arg(inner.get_program()).args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd
}

/// Holds the lock that serializes jobs (see the module documentation).
pub struct JobLock(#[allow(dead_code)] File);

pub fn job_lock() -> JobLock {
    let path = target_profile_dir().join("gpulmt-tests.lock");
    let f = File::options()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: a valid open descriptor; flock has no memory-safety preconditions.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "flock {}: {e}", path.display());
    }
    JobLock(f)
}

/// What one job did.
#[derive(Debug)]
pub struct JobOutput {
    pub what: String,
    /// The launcher's exit code (None if it was killed by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Counters one rank printed.
pub type Counters = BTreeMap<String, u64>;

impl JobOutput {
    /// Everything, for assertion messages.
    pub fn dump(&self) -> String {
        format!(
            "job `{}`: exit {:?} after {:.2} s\n--- stdout ---\n{}--- stderr ---\n{}",
            self.what,
            self.code,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }

    pub fn assert_code(&self, code: i32) -> &Self {
        assert_eq!(self.code, Some(code), "unexpected exit status\n{}", self.dump());
        self
    }

    /// Exit 0, and every rank of `n` printed `rank=R ok <scenario>`.
    pub fn assert_ok(&self, n: usize, scenario: &str) -> &Self {
        self.assert_code(0);
        for r in 0..n {
            let line = format!("rank={r} ok {scenario}");
            assert!(self.stdout.lines().any(|l| l == line), "missing `{line}`\n{}", self.dump());
        }
        assert!(!self.stderr.contains("FAIL"), "a rank reported a failure\n{}", self.dump());
        self
    }

    pub fn has_line(&self, line: &str) -> bool {
        self.stdout.lines().any(|l| l.trim() == line)
    }

    /// The job id rank 0 printed.
    pub fn job(&self) -> Option<String> {
        self.stdout.lines().find_map(|l| l.strip_prefix("job=")).map(|s| s.trim().to_string())
    }

    /// The pids the ranks printed.
    pub fn pids(&self) -> Vec<u32> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("rank="))
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("pid=")))
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// `key=value` counters of rank `r`'s line that starts with `rank=R <section>`.
    pub fn counters(&self, rank: usize, section: &str) -> Counters {
        let head = format!("rank={rank} {section} ");
        let line = self
            .stdout
            .lines()
            .find(|l| l.starts_with(&head))
            .unwrap_or_else(|| panic!("no `{head}...` line\n{}", self.dump()));
        line[head.len()..]
            .split_whitespace()
            .filter_map(|kv| {
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect()
    }

    pub fn protocols(&self, rank: usize) -> Counters {
        self.counters(rank, "protocols")
    }

    pub fn cache(&self, rank: usize) -> Counters {
        self.counters(rank, "cache")
    }

    /// Asserts that nothing of this job is left in /dev/shm: its segment and objects
    /// (`gpulmt-<job>`, `gpulmt-<job>-*`) and the sim device objects of its ranks
    /// (`gpulmt-sim-<pid>-*`).
    pub fn assert_no_litter(&self) -> &Self {
        let left = self.litter();
        assert!(left.is_empty(), "/dev/shm objects of this job were left behind: {left:?}\n{}", self.dump());
        self
    }

    pub fn litter(&self) -> Vec<String> {
        objects_of(&self.job().into_iter().collect::<Vec<_>>(), &self.pids())
    }
}

/// The gpulmt objects in `/dev/shm` that belong to the given jobs or processes: job
/// segments and their objects (`gpulmt-<job>`, `gpulmt-<job>-*`), the simulated device
/// memory of the processes (`gpulmt-sim-<pid>-*`), and the segments of jobs they made
/// from MPI (`gpulmt-mpi<pid>x*`, named after local rank 0). Leak checks look only at
/// these, so that another job running on the machine meanwhile cannot fail them.
pub fn objects_of(jobs: &[String], pids: &[u32]) -> Vec<String> {
    gpulmt::shm::object::entries(gpulmt::shm::object::OBJECT_PREFIX)
        .into_iter()
        .filter(|n| {
            let of_job = jobs.iter().any(|j| {
                let base = format!("gpulmt-{j}");
                n == &base || n.starts_with(&format!("{base}-"))
            });
            let of_pid = pids
                .iter()
                .any(|p| n.starts_with(&format!("gpulmt-sim-{p}-")) || n.starts_with(&format!("gpulmt-mpi{p}x")));
            of_job || of_pid
        })
        .collect()
}

/// The processes descended from `pid` (children, their children...), from the parent
/// pids of `/proc/*/stat`: how a test finds the ranks that an MPI launcher started.
pub fn descendants(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
    };
    let all: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter_map(|p| Some((p, parent_of(p)?)))
                .collect()
        })
        .unwrap_or_default();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(all.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

/// A job to run: `gpulmt-run -n N --timeout T -- gpulmt-check <args>`.
pub struct Job {
    n: usize,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout_s: u64,
    check: PathBuf,
}

impl Job {
    /// `check` is `env!("CARGO_BIN_EXE_gpulmt-check")`.
    pub fn new(check: &str, n: usize, args: &[&str]) -> Job {
        Job {
            n,
            args: args.iter().map(|s| s.to_string()).collect(),
            env: vec![("GPULMT_DEVICE".into(), "sim".into())],
            timeout_s: 60,
            check: check_program(Some(check)),
        }
    }

    pub fn env(mut self, k: &str, v: &str) -> Job {
        self.env.retain(|(key, _)| key != k);
        self.env.push((k.into(), v.into()));
        self
    }

    pub fn envs(mut self, kv: &[(&str, &str)]) -> Job {
        for (k, v) in kv {
            self = self.env(k, v);
        }
        self
    }

    /// The launcher's `--timeout`: a hang fails the test (exit 124) instead of CI.
    pub fn timeout_s(mut self, t: u64) -> Job {
        self.timeout_s = t;
        self
    }

    pub fn describe(&self) -> String {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{} gpulmt-run -n {} gpulmt-check {}", env.join(" "), self.n, self.args.join(" "))
    }

    /// Runs the job (holding the job lock) and checks that it left nothing in /dev/shm.
    pub fn run(&self) -> JobOutput {
        let _lock = job_lock();
        let mut cmd = Command::new(launcher());
        cmd.arg("-n").arg(self.n.to_string()).arg("--timeout").arg(self.timeout_s.to_string()).arg("--");
        cmd.arg(&self.check).args(&self.args);
        // Only the settings of this test: none inherited from the caller's shell.
        without_gpulmt_env(&mut cmd);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null());
        let t0 = Instant::now();
        let out = cmd.output().unwrap_or_else(|e| panic!("cannot start {}: {e}", launcher().display()));
        let o = JobOutput {
            what: self.describe(),
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: t0.elapsed(),
        };
        o.assert_no_litter();
        o
    }
}

// ---------------------------------------------------------------------------------
// Expected protocol counts (the policy of protocols/src/policy.rs, restated)
// ---------------------------------------------------------------------------------

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    H,
    D,
}

/// Parses "D H" into (rank 0, rank 1).
pub fn placement(p: &str) -> (Mem, Mem) {
    let v: Vec<Mem> = p
        .chars()
        .filter_map(|c| match c {
            'D' => Some(Mem::D),
            'H' => Some(Mem::H),
            _ => None,
        })
        .collect();
    assert_eq!(v.len(), 2, "placement {p:?}");
    (v[0], v[1])
}

/// What the test environment sets that decides protocols.
#[derive(Clone, Copy, Debug)]
pub struct Setup<'a> {
    /// GPULMT_PROTOCOL (auto, get, put, coop, shm).
    pub protocol: &'a str,
    pub eager_limit: u64,
    pub device_eager_limit: u64,
    /// Whether the two ranks' devices reach each other (different devices).
    pub peer_access: bool,
    /// Both ranks on one device.
    pub same_device: bool,
    /// GPULMT_COOP_MIN: `auto` cooperates from this size (one-way traffic).
    pub coop_min: u64,
    /// GPULMT_PUT_MIN: below `coop_min`, `auto` pushes from this size (one-way traffic).
    pub put_min: u64,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            protocol: "auto",
            eager_limit: 8192,
            device_eager_limit: 0,
            peer_access: true,
            same_device: false,
            coop_min: 2 << 20,
            put_min: 512 << 10,
        }
    }
}

/// Which rendezvous protocol the receiver should choose for `len` bytes from a
/// sender's `src` memory into `dst` memory; None when the message travels eagerly.
pub fn expected_protocol(s: &Setup, src: Mem, dst: Mem, len: u64) -> Option<&'static str> {
    let limit = if src == Mem::D { s.device_eager_limit } else { s.eager_limit };
    if len == 0 || len <= limit {
        return None;
    }
    if src == Mem::H || dst == Mem::H {
        return Some("shm");
    }
    let reach = s.same_device || s.peer_access;
    if !reach {
        return Some("shm");
    }
    // COOPERATE splits at the sender's half, aligned down to 4 KiB; nothing to split
    // means GET.
    let split = (len * 500 / 1000) & !0xfff;
    Some(match s.protocol {
        "auto" if !s.same_device && len >= s.coop_min && split > 0 && split < len => "coop",
        "auto" if !s.same_device && len >= s.put_min => "put",
        "get" | "auto" => "get",
        "put" => "put",
        "coop" if split == 0 || split >= len => "get",
        "coop" => "coop",
        "shm" => "shm",
        p => panic!("unknown protocol {p}"),
    })
}

/// Protocol counts with GET and PUT taken together: under `auto`, a receive offered
/// by RTR (posted before its message arrives) may be pushed into by the sender instead
/// of pulled, as timing has it. (get + put, coop, shm, self).
pub fn rtr_merged(c: &Counters) -> (u64, u64, u64, u64) {
    (c["get"] + c["put"], c["coop"], c["shm"], c["self"])
}

/// Per rank, the protocol counts of `pingpong` over `sizes`.
pub fn expected_pingpong(s: &Setup, p0: Mem, p1: Mem, sizes: &[u64]) -> [Counters; 2] {
    let mut c: [Counters; 2] = Default::default();
    for m in &mut c {
        for k in ["get", "put", "coop", "shm", "self"] {
            m.insert(k.into(), 0);
        }
    }
    for &len in sizes {
        // 0 -> 1, counted by the receiver, then 1 -> 0.
        if let Some(p) = expected_protocol(s, p0, p1, len) {
            *c[1].get_mut(p).unwrap() += 1;
        }
        if let Some(p) = expected_protocol(s, p1, p0, len) {
            *c[0].get_mut(p).unwrap() += 1;
        }
    }
    c
}

/// Parses a `--sizes` list like the rank program does (plain byte counts).
pub fn sizes(list: &str) -> Vec<u64> {
    list.split(',').map(|s| s.trim().parse().expect("size")).collect()
}

/// Asserts `cond`, or panics with the job's output.
#[track_caller]
pub fn check(cond: bool, out: &JobOutput, what: impl std::fmt::Display) {
    assert!(cond, "{what}\n{}", out.dump());
}
