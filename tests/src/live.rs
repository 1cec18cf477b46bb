//! Jobs watched while they run: their output read line by line as the ranks print it,
//! so that a test can act at a moment of the job (kill a rank once it is `ready`), and
//! ended within a bound whatever happens (a hang fails the test, it does not hang it).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::JobOutput;

/// A running job (`gpulmt-run` or `mpirun` and its ranks).
pub struct LiveJob {
    what: String,
    child: Child,
    lines: Receiver<String>,
    /// Every stdout line seen so far.
    seen: Vec<String>,
    stdout: Option<JoinHandle<()>>,
    stderr: Option<JoinHandle<String>>,
    started: Instant,
}

impl LiveJob {
    /// Starts `cmd` with its stdout and stderr piped (stdin closed).
    pub fn spawn(mut cmd: Command, what: impl Into<String>) -> LiveJob {
        let what = what.into();
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let (tx, lines) = channel();
        let out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().expect("piped");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        LiveJob {
            what,
            child,
            lines,
            seen: Vec::new(),
            stdout: Some(stdout),
            stderr: Some(stderr),
            started: Instant::now(),
        }
    }

    /// The launcher's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `limit` for a stdout line that `want` accepts; returns it.
    pub fn wait_line(&mut self, limit: Duration, want: impl Fn(&str) -> bool) -> Option<String> {
        if let Some(l) = self.seen.iter().find(|l| want(l)) {
            return Some(l.clone());
        }
        let end = Instant::now() + limit;
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = want(&l);
                    self.seen.push(l.clone());
                    if hit {
                        return Some(l);
                    }
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Waits for every rank of `n` to print `rank=R ready pid=P ...`; returns their pids
    /// by rank (None if they did not within `limit`).
    pub fn ready_pids(&mut self, n: usize, limit: Duration) -> Option<Vec<u32>> {
        let end = Instant::now() + limit;
        let mut pids = vec![0u32; n];
        for (r, pid) in pids.iter_mut().enumerate() {
            let head = format!("rank={r} ready ");
            let line = self.wait_line(end.saturating_duration_since(Instant::now()), |l| l.starts_with(&head))?;
            *pid = line.split_whitespace().find_map(|w| w.strip_prefix("pid="))?.parse().ok()?;
        }
        Some(pids)
    }

    /// Waits up to `limit` for the job to end; past it, SIGTERM, then SIGKILL 5 s later
    /// (the output then says so). Returns everything it printed.
    pub fn finish(mut self, limit: Duration) -> JobOutput {
        let mut killed = None;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for the job") {
                break s;
            }
            let t = self.started.elapsed();
            if t > limit && killed.is_none() {
                // SAFETY: signalling our own child (the launcher forwards it to the ranks).
                unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
                killed = Some(t);
            }
            if killed.is_some_and(|k| t > k + Duration::from_secs(5)) {
                let _ = self.child.kill();
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(h) = self.stdout.take() {
            let _ = h.join();
        }
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        let mut stderr = self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        if let Some(k) = killed {
            stderr.push_str(&format!("\n[test harness: HUNG, terminated after {:.1} s]\n", k.as_secs_f64()));
        }
        JobOutput {
            what: self.what,
            code: if killed.is_some() { None } else { status.code() },
            stdout: self.seen.iter().map(|l| format!("{l}\n")).collect(),
            stderr,
            elapsed: self.started.elapsed(),
        }
    }
}

/// Sends `sig` to `pid`; false if the process is gone already.
pub fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(pid as i32, sig) == 0 }
}
