//! How a rank reports a failed check: one `FAIL:` line on stderr and exit status 1, at
//! the first mismatch or unexpected result ([`fail`], `ensure!`, [`OrFail`]).

use std::sync::atomic::{AtomicU32, Ordering};

pub static RANK: AtomicU32 = AtomicU32::new(u32::MAX);

/// Reports a failed check and exits with status 1.
pub fn fail(msg: impl std::fmt::Display) -> ! {
    use std::io::Write;
    let r = RANK.load(Ordering::Relaxed);
    let who = if r == u32::MAX { String::new() } else { format!("rank {r}: ") };
    // One write, so that lines of ranks failing together do not interleave.
    let line = format!("gpulmt-check: {who}FAIL: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::process::exit(1)
}

/// Fails unless `$cond`, with the message of `format!`.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            $crate::report::fail(format!($($arg)+))
        }
    };
}

/// What must happen at once or soon (an invalid call rejected, a dead peer noticed by the
/// liveness check every 20 ms, a finalize beside a dead peer) takes milliseconds; this
/// bound leaves a wide margin for a loaded 2-core CI machine. It stays below the 30 s
/// of a wait for `GPULMT_INIT_TIMEOUT_MS`, so that waiting for a dead peer is told from
/// slowness; a real hang ends at the launcher's `--timeout` of the test's job.
pub const PROMPTLY: std::time::Duration = std::time::Duration::from_secs(20);

/// Unwraps a result or fails the check, naming what was attempted.
pub trait OrFail<T> {
    fn or_fail(self, what: impl std::fmt::Display) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: impl std::fmt::Display) -> T {
        match self {
            Ok(v) => v,
            Err(e) => fail(format!("{what}: unexpected error: {e}")),
        }
    }
}
