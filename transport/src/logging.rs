//! The log subscriber of gpulmt's processes: `GPULMT_LOG` (tracing's `EnvFilter` syntax,
//! default `warn`) to standard error, coloured only when standard error is a terminal,
//! so that logs redirected to files and CI output stay plain text.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the subscriber, with `default` as the filter when `GPULMT_LOG` is not set. A
/// subscriber the process installed before (the application's own) is left in place.
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_env("GPULMT_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let ansi = std::io::stderr().is_terminal();
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).try_init();
}
