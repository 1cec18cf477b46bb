//! `gpulmt-fault`: the rank program of the fault-injection suite (`tests/faults.rs`)
//! and of the reliability tests, run under `gpulmt-run`; `gpulmt-fault-mpi` (feature
//! `mpi`, `mpi.rs`) is the same program started by `mpirun`.
//!
//! ```text
//! gpulmt-run -n 2 gpulmt-fault traffic --protocol get --millis 1500
//! ```
//!
//! Every rank prints, on stdout, flushed line by line so that a driver can act on them
//! while the job runs (kill a rank once it is `ready`):
//!
//! ```text
//! rank=R ready pid=P job=J size=N          after init
//! rank=R holding                           hold: device memory allocated, waiting
//! rank=R init-failed ms=T err=...          init failed (exit 2)
//! rank=R peer-failed ms=T err=...          a transfer failed because the peer died
//! rank=R survivor-ok ...                   ... and this rank finalized after it
//! rank=R ok <scenario>                     finished clean
//! ```
//!
//! and `FAIL rank=R: ...` on stderr (exit 1) on anything unexpected: corrupt data, a
//! wrong error, a bound exceeded.

use clap::Parser;

mod scenarios;

fn main() {
    let cli = scenarios::Cli::parse();
    std::process::exit(scenarios::main(cli, gpulmt::Context::init));
}
