//! `gpulmt-run`: the launcher of gpulmt jobs on one node.
//!
//! ```text
//! gpulmt-run -n N [--bind core|none] [--timeout SECS] [--abort-grace-ms MS] [--cleanup] [--] prog [args...]
//! gpulmt-run --cleanup
//! gpulmt-run --config-table
//! ```
//!
//! Starts N copies of `prog` with `GPULMT_JOB` (a fresh job id), `GPULMT_RANK`,
//! `GPULMT_SIZE`, `GPULMT_LOCAL_RANK` and `GPULMT_LOCAL_SIZE` set, each in its own
//! process group so that signals reach whatever the rank spawned (`sh -c` and friends),
//! and by default bound to a core of its own ([`gpulmt::binding`]).
//! It forwards SIGINT/SIGTERM/SIGHUP, and when a rank fails it marks the rank Failed in
//! the job segment (so peers fail their requests at once instead of hanging), waits the
//! abort grace period for the others to notice, then terminates them.
//!
//! Exit status: 0 if every rank exited 0; otherwise the first failing rank's exit code
//! (128 + signal if it was killed); 124 on `--timeout`; 2 on bad usage; 126/127 if the
//! program cannot be started.
//!
//! Whatever happens, the job's shared-memory objects are removed at the end: the job
//! segment and `gpulmt-<job>-*`, the simulated-device objects `gpulmt-sim-<pid>-*` of
//! every rank process, and whatever else owner locks prove abandoned (objects of the
//! processes a rank started, of jobs killed before). `--cleanup` removes leftovers of
//! jobs whose processes are all dead (e.g. after the launcher itself was SIGKILLed),
//! judging by pids and age too where there are no owner locks.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::error::ErrorKind;
use clap::{ColorChoice, Parser, ValueEnum};

use gpulmt::shm::job::{JobSegment, RankState, JOB_ENV, MAX_RANKS};
use gpulmt::shm::object::{remove_job_objects, remove_objects_with_prefix, SIM_PREFIX};
use gpulmt::shm::sweep::{sweep, Evidence};

/// The synopsis, printed with every usage error and at the top of `--help`.
const USAGE: &str = "usage: gpulmt-run -n N [--bind core|none] [--timeout SECS] [--abort-grace-ms MS] [--cleanup] [--] prog [args...]\n       gpulmt-run --cleanup\n       gpulmt-run --config-table";

const ENVIRONMENT: &str = "\
environment of each rank: GPULMT_JOB, GPULMT_RANK, GPULMT_SIZE, GPULMT_LOCAL_RANK,
GPULMT_LOCAL_SIZE. Set GPULMT_LOG (e.g. debug) for the launcher's own logs.";

/// How often the main loop polls children, signals and deadlines.
const POLL: Duration = Duration::from_millis(5);

/// From SIGTERM to SIGKILL when we terminate ranks.
const KILL_AFTER: Duration = Duration::from_secs(2);

/// Where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Bind {
    /// Each rank on a core of its own, one thread per physical core first; no binding
    /// when the ranks outnumber the CPUs this launcher may use.
    Core,
    /// The scheduler places them.
    None,
}

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "gpulmt-run",
    about = "Starts N ranks of a gpulmt job on this node.",
    override_usage = USAGE.trim_start_matches("usage: "),
    after_help = ENVIRONMENT,
    color = ColorChoice::Never,
    disable_version_flag = true
)]
struct Args {
    /// Number of ranks (1..=1024).
    #[arg(short = 'n', long = "np", value_name = "N", value_parser = parse_n)]
    n: Option<usize>,
    /// core: each rank on a core of its own, one thread per physical core
    /// first; no binding when the ranks outnumber the CPUs this launcher may use.
    /// none: the scheduler places them.
    #[arg(long, value_enum, value_name = "core|none", default_value = "core", hide_possible_values = true)]
    bind: Bind,
    /// Kill the job after SECS seconds (fractions allowed); exit 124.
    #[arg(long, value_name = "SECS", value_parser = parse_timeout, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// After a rank fails, wait MS ms for the others to exit before terminating them.
    #[arg(long = "abort-grace-ms", value_name = "MS", default_value = "3000", value_parser = parse_grace)]
    grace: Duration,
    /// Remove shared-memory leftovers of dead gpulmt jobs; alone, do only that.
    #[arg(long)]
    cleanup: bool,
    /// Print the configuration reference (every GPULMT_* setting) in Markdown, as
    /// docs/configuration.md holds it.
    #[arg(long)]
    config_table: bool,
    /// The program each rank runs, and its arguments: options after the program are its
    /// own, with or without `--`.
    #[arg(value_name = "prog [args...]", trailing_var_arg = true)]
    prog: Vec<OsString>,
}

/// What the command line asks for.
enum Parsed {
    Run(Args),
    /// `--help`: clap's text, to print.
    Help(String),
    ConfigTable,
}

fn parse_args(args: impl Iterator<Item = OsString>) -> Result<Parsed, String> {
    let a = match Args::try_parse_from(std::iter::once(OsString::from("gpulmt-run")).chain(args)) {
        Ok(a) => a,
        Err(e) if e.kind() == ErrorKind::DisplayHelp => return Ok(Parsed::Help(e.to_string())),
        // clap's message without its own usage lines: the caller prints ours.
        Err(e) => {
            let text = e.to_string();
            let first = text.split("\n\n").next().unwrap_or(&text);
            return Err(first.trim_start_matches("error: ").trim().to_string());
        }
    };
    if a.config_table {
        return Ok(Parsed::ConfigTable);
    }
    if a.prog.is_empty() {
        if !a.cleanup {
            return Err("no program to run".into());
        }
        if a.n.is_some() || a.timeout.is_some() {
            return Err("-n/--timeout need a program to run".into());
        }
    } else if a.n.is_none() {
        return Err("-n N is required".into());
    }
    Ok(Parsed::Run(a))
}

fn parse_n(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if (1..=MAX_RANKS as usize).contains(&n) => Ok(n),
        _ => Err(format!("must be a number of ranks in 1..={MAX_RANKS}")),
    }
}

fn parse_timeout(v: &str) -> Result<Duration, String> {
    let secs: f64 = v.parse().map_err(|_| "not a number of seconds".to_string())?;
    if !(secs > 0.0 && secs.is_finite() && secs < 1e9) {
        return Err("must be a positive number of seconds".into());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_grace(v: &str) -> Result<Duration, String> {
    v.parse().map(Duration::from_millis).map_err(|_| "not a number of milliseconds".into())
}

/// Signals received and not handled yet, as a bit mask (bit = signal number).
static PENDING_SIGNALS: AtomicU32 = AtomicU32::new(0);

/// The handler only records the signal: everything else happens in the main loop
/// (only async-signal-safe work may run here, and an atomic RMW is).
extern "C" fn on_signal(sig: libc::c_int) {
    PENDING_SIGNALS.fetch_or(1 << sig, Ordering::Relaxed);
}

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn install_signal_handlers() -> io::Result<()> {
    for sig in FORWARDED {
        // SAFETY: a zeroed sigaction is valid; we fill the handler, mask and flags.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SA_RESTART: our own syscalls (waitpid, nanosleep) need not handle EINTR.
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: sa_mask is a valid sigset_t to initialize.
        if unsafe { libc::sigemptyset(&mut sa.sa_mask) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: valid signal number and sigaction; the handler is async-signal-safe.
        if unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

/// A job id unique on this node: the launcher's pid and the time, in hex. The nanos are
/// zero-padded to a fixed width so that no id is a prefix of another.
fn new_job_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    format!("{:x}-{:016x}", std::process::id(), nanos)
}

/// One started rank.
struct Rank {
    pid: libc::pid_t,
    running: bool,
}

/// The launcher's state while the job runs.
struct Launcher {
    job: String,
    ranks: Vec<Rank>,
    /// The job segment, once seen (rank 0 creates it, and removes its name once every
    /// rank has mapped it: the launcher looks for it from the start), to mark failed ranks.
    segment: Option<JobSegment>,
}

impl Launcher {
    /// Sends `sig` to the process group of every rank, running or not: a rank that has
    /// exited may have left children behind. Each rank leads its own group (pgid = pid).
    fn signal_all(&self, sig: libc::c_int) {
        for (r, rank) in self.ranks.iter().enumerate() {
            // SAFETY: kill has no memory-safety preconditions.
            if unsafe { libc::kill(-rank.pid, sig) } != 0 {
                let e = io::Error::last_os_error();
                // ESRCH: the group is already gone, which is what we want.
                if e.raw_os_error() != Some(libc::ESRCH) {
                    eprintln!("gpulmt-run: cannot send {} to rank {r} (pid {}): {e}", signal_name(sig), rank.pid);
                }
            }
        }
    }

    /// Opens the job segment if it exists and is initialized (one attempt, no waiting).
    /// Only a segment one of our ranks created is ours: after our rank 0 removed the name,
    /// another job started by hand with our job id may have made one of its own.
    fn segment(&mut self) -> Option<&JobSegment> {
        if self.segment.is_none() {
            match JobSegment::open(&self.job, Duration::ZERO) {
                Ok(s) if is_descendant(s.creator_pid(), std::process::id()) => self.segment = Some(s),
                Ok(s) => tracing::warn!(
                    creator = s.creator_pid(),
                    "a segment named after this job was made by a process this launcher did not start; ignored"
                ),
                // Rank 0 may not have created it (yet, or ever): nothing to mark then.
                Err(e) => tracing::debug!(error = %e, "job segment not available"),
            }
        }
        self.segment.as_ref()
    }

    /// Marks rank `r` Failed in the job segment so that its peers stop waiting for it.
    fn mark_failed(&mut self, r: usize) {
        if let Some(seg) = self.segment() {
            if r < seg.nranks() {
                seg.mark_state(r, RankState::Failed);
            } else {
                eprintln!("gpulmt-run: job segment has {} ranks, cannot mark rank {r} failed", seg.nranks());
            }
        }
    }

    /// Reaps every child that has exited; returns (rank, failure exit code) of those
    /// that failed, in the order they were reaped.
    fn reap(&mut self) -> Vec<(usize, u8)> {
        let mut failed = Vec::new();
        loop {
            let mut status: libc::c_int = 0;
            // SAFETY: status is a valid out-pointer.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid == 0 {
                break;
            }
            if pid < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    // No children left at all.
                    Some(libc::ECHILD) => {
                        for rank in &mut self.ranks {
                            rank.running = false;
                        }
                    }
                    _ => eprintln!("gpulmt-run: waitpid failed: {e}"),
                }
                break;
            }
            let Some(r) = self.ranks.iter().position(|k| k.pid == pid) else { continue };
            self.ranks[r].running = false;
            let code = if libc::WIFEXITED(status) {
                let code = libc::WEXITSTATUS(status);
                if code == 0 {
                    continue;
                }
                eprintln!("gpulmt-run: rank {r} (pid {pid}) exited with status {code}");
                code as u8
            } else if libc::WIFSIGNALED(status) {
                let sig = libc::WTERMSIG(status);
                eprintln!("gpulmt-run: rank {r} (pid {pid}) killed by signal {}", signal_name(sig));
                (128 + sig).min(255) as u8
            } else {
                continue; // stopped/continued: not an exit (we do not ask for these)
            };
            self.mark_failed(r);
            failed.push((r, code));
        }
        failed
    }

    /// Removes the job's shared-memory objects and the simulated-device objects of its
    /// processes: the ranks we started and the pids they registered in the job segment
    /// (which differ when a rank runs the real program under `sh -c`).
    fn cleanup(&mut self) {
        let mut pids: Vec<u32> = self.ranks.iter().map(|r| r.pid as u32).collect();
        if let Some(seg) = self.segment() {
            pids.extend((0..seg.nranks()).map(|r| seg.rank_pid(r)).filter(|&p| p != 0));
        }
        // Unmap before unlinking; the order does not matter to the kernel, but nothing
        // of this job should stay referenced past this point.
        self.segment = None;
        pids.sort_unstable();
        pids.dedup();
        let mut removed = remove_job_objects(&self.job);
        for pid in pids {
            removed += remove_objects_with_prefix(&format!("{SIM_PREFIX}{pid}-"));
        }
        // What processes the ranks started left, and leftovers of jobs killed before.
        removed += sweep(Evidence::Locks);
        tracing::debug!(job = %self.job, removed, "removed the job's shared-memory objects");
    }
}

/// Whether `pid` is `ancestor` or one of its descendants (by the parent pids of
/// `/proc/<pid>/stat`; false where /proc cannot tell).
fn is_descendant(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..64 {
        if pid == ancestor {
            return true;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        // "pid (comm) state ppid ...": the command may hold spaces and parentheses.
        let Some(ppid) = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)) else {
            return false;
        };
        match ppid.parse() {
            Ok(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// Spawns rank `r` of `n`.
fn spawn_rank(prog: &[OsString], job: &str, r: usize, n: usize, cpu: Option<usize>) -> io::Result<libc::pid_t> {
    let mut cmd = Command::new(&prog[0]);
    cmd.args(&prog[1..])
        .env(JOB_ENV, job)
        .env("GPULMT_RANK", r.to_string())
        .env("GPULMT_SIZE", n.to_string())
        .env("GPULMT_LOCAL_RANK", r.to_string())
        .env("GPULMT_LOCAL_SIZE", n.to_string())
        // Own process group: our signals reach the rank's whole process tree, and the
        // terminal's ^C reaches only us (we forward it once, not twice).
        .process_group(0);
    if r != 0 {
        // Only rank 0 reads the launcher's stdin (as with mpirun).
        cmd.stdin(Stdio::null());
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure only makes async-signal-safe syscalls (prctl, getppid,
    // sched_setaffinity).
    unsafe {
        cmd.pre_exec(move || {
            if let Some(cpu) = cpu {
                // Best effort: the CPU was in our own allowed set a moment ago, and a rank
                // that runs unbound is slower, not wrong.
                let _ = gpulmt::binding::bind_to(cpu);
            }
            // If the launcher is SIGKILLed it cannot clean up; at least take the ranks
            // down with it rather than leave them spinning on a dead job.
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The launcher may have died before prctl took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            let _ = parent;
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // The Child handle is dropped without waiting: the main loop reaps with waitpid.
    Ok(child.id() as libc::pid_t)
}

fn run(args: Args) -> u8 {
    if args.cleanup {
        let removed = sweep(Evidence::Any);
        println!("gpulmt-run: removed {removed} stale shared-memory object(s)");
        if args.prog.is_empty() {
            return 0;
        }
    }
    let n = args.n.expect("checked by parse_args");
    if let Err(e) = install_signal_handlers() {
        eprintln!("gpulmt-run: cannot install signal handlers: {e}");
        return 1;
    }
    let mut l = Launcher { job: new_job_id(), ranks: Vec::with_capacity(n), segment: None };
    let cpus = if args.bind == Bind::Core { gpulmt::binding::cpus_for_ranks(n) } else { None };
    tracing::debug!(job = %l.job, n, ?cpus, "starting job");

    for r in 0..n {
        match spawn_rank(&args.prog, &l.job, r, n, cpus.as_ref().map(|c| c[r])) {
            Ok(pid) => l.ranks.push(Rank { pid, running: true }),
            Err(e) => {
                eprintln!("gpulmt-run: cannot start rank {r}: {}: {e}", args.prog[0].to_string_lossy());
                // Take down the ranks already started, wait for them, clean up.
                l.signal_all(libc::SIGKILL);
                while l.ranks.iter().any(|k| k.running) {
                    l.reap();
                    std::thread::sleep(POLL);
                }
                l.cleanup();
                return match e.kind() {
                    io::ErrorKind::NotFound => 127,
                    io::ErrorKind::PermissionDenied => 126,
                    _ => 1,
                };
            }
        }
    }

    let start = Instant::now();
    let deadline = args.timeout.map(|t| start + t);
    let mut first_failure: Option<u8> = None;
    let mut timed_out = false;
    // When to SIGTERM the ranks after a failure, and when to SIGKILL what is left.
    let mut terminate_at: Option<Instant> = None;
    let mut terminated = false;
    let mut kill_at: Option<Instant> = None;

    while l.ranks.iter().any(|k| k.running) {
        let now = Instant::now();
        // Until it is seen: its name lives only while the ranks start.
        if l.segment.is_none() {
            l.segment();
        }
        for (_, code) in l.reap() {
            // Ranks we kill after a timeout do not define the exit status.
            if first_failure.is_none() && !timed_out {
                first_failure = Some(code);
                terminate_at = Some(now + args.grace);
            }
        }
        if !l.ranks.iter().any(|k| k.running) {
            break;
        }

        let sigs = PENDING_SIGNALS.swap(0, Ordering::Relaxed);
        for sig in FORWARDED {
            if sigs & (1 << sig) != 0 {
                eprintln!("gpulmt-run: received {}, forwarding it to the ranks", signal_name(sig));
                l.signal_all(sig);
                // Ranks get the grace period to exit on their own after a signal, then
                // the usual SIGTERM/SIGKILL.
                terminate_at.get_or_insert(now + args.grace);
            }
        }

        if let Some(d) = deadline {
            if now >= d && !timed_out {
                timed_out = true;
                eprintln!(
                    "gpulmt-run: timeout of {:.3} s reached, terminating the ranks",
                    args.timeout.unwrap_or_default().as_secs_f64()
                );
                for r in 0..l.ranks.len() {
                    if l.ranks[r].running {
                        l.mark_failed(r);
                    }
                }
                l.signal_all(libc::SIGTERM);
                terminated = true;
                kill_at = Some(kill_at.map_or(now + KILL_AFTER, |k| k.min(now + KILL_AFTER)));
            }
        }

        if let Some(t) = terminate_at {
            if now >= t && !terminated {
                terminated = true;
                eprintln!("gpulmt-run: terminating the remaining ranks");
                l.signal_all(libc::SIGTERM);
                kill_at = Some(now + KILL_AFTER);
            }
        }

        if let Some(k) = kill_at {
            if now >= k {
                eprintln!("gpulmt-run: ranks still running {} s after SIGTERM, sending SIGKILL", KILL_AFTER.as_secs());
                l.signal_all(libc::SIGKILL);
                // SIGKILL cannot be ignored: no need to repeat it.
                kill_at = None;
            }
        }

        std::thread::sleep(POLL);
    }

    // Also reached after signals and timeouts: nothing of the job may stay in /dev/shm.
    l.cleanup();
    match (first_failure, timed_out) {
        (Some(code), _) => code,
        (None, true) => 124,
        (None, false) => 0,
    }
}

fn main() -> ExitCode {
    // Never fails the launcher over logging.
    gpulmt::logging::init("warn");

    match parse_args(std::env::args_os().skip(1)) {
        Ok(Parsed::Help(text)) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok(Parsed::ConfigTable) => {
            print!("{}", gpulmt::config::reference_markdown());
            ExitCode::SUCCESS
        }
        Ok(Parsed::Run(args)) => ExitCode::from(run(args)),
        Err(msg) => {
            eprintln!("gpulmt-run: {msg}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
