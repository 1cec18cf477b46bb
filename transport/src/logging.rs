//! The log subscriber of gpulmt's own processes: `GPULMT_LOG` (tracing's `EnvFilter`
//! syntax, default `warn`) to standard error, coloured only when standard error is a
//! terminal, so that logs redirected to files and CI output stay plain text.
//!
//! The library never installs it: a Rust application that links gpulmt keeps its own
//! subscriber (or none). gpulmt's binaries call [`init`] at the top of `main`, and the C
//! entry points that create a context call it, since a C program has no subscriber of its
//! own to keep.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the subscriber as the process's global default, with `default` as the filter
/// when `GPULMT_LOG` is not set. A subscriber the process installed before is left in
/// place, so calling it twice, or after the application chose its own, changes nothing.
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_env("GPULMT_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}
