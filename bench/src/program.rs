//! What the application benchmarks (Stencil2D, SpTS) share: their error type and the life
//! of a rank's program (join the job, run, finalize, the exit status).

use gpulmt::Context;

/// What can go wrong in an application benchmark's run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Transport(#[from] gpulmt::Error),
    #[error("CUDA: {0}")]
    Cuda(String),
    /// A problem the options describe that cannot run (exit status 2).
    #[error("{0}")]
    Config(String),
    /// A peer sent something the program does not expect, or its signal did not come.
    #[error("{0}")]
    Protocol(String),
}

impl From<crate::device::DeviceError> for AppError {
    fn from(e: crate::device::DeviceError) -> Self {
        AppError::Cuda(e.0)
    }
}

/// A rank of program `name`: joins the job (through MPI under mpirun with the `mpi`
/// feature, else from gpulmt-run's environment: [`crate::pair::join`]), runs `run`, and
/// finalizes. Returns the exit status: 0; 1 on failure or when `run` reports a failed
/// check (false); 2 for a [`AppError::Config`].
pub fn run_rank(name: &str, run: impl FnOnce(&mut Context) -> Result<bool, AppError>) -> i32 {
    let mut ctx = match crate::pair::join() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: init: {e}");
            return 1;
        }
    };
    match run(&mut ctx) {
        Ok(passed) => {
            if let Err(e) = ctx.finalize() {
                eprintln!("{name}: finalize: {e}");
                return 1;
            }
            crate::pair::finalize_mpi();
            i32::from(!passed)
        }
        Err(e) => {
            // Dropping the context marks this rank failed, so peers stop waiting.
            eprintln!("{name}: rank {}: {e}", ctx.rank());
            if matches!(e, AppError::Config(_)) {
                2
            } else {
                1
            }
        }
    }
}
