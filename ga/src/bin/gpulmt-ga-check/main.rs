//! The rank program of the Global Arrays layer's multi-process tests (`ga/tests/`), run
//! under the `gpulmt-run` launcher: each subcommand is one scenario, every rank prints
//! `rank=R <section> key=value...` counters the tests assert, then `rank=R ok <scenario>`.
//! A failed check prints `rank=R FAIL ...` on stderr and exits 1.

mod bad;
mod common;
mod order;
mod random;

use clap::{Parser, Subcommand};
use gpulmt::Context;

#[derive(Parser)]
#[command(about = "Global Arrays scenarios, one rank of a gpulmt-run job")]
struct Cli {
    /// Started by mpirun, not the launcher: bootstrap from MPI (`gpulmt::mpi`), so that
    /// the job may span nodes or pseudo-nodes (`GPULMT_PSEUDO_NODES`).
    #[cfg(feature = "mpi")]
    #[arg(long)]
    mpi: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Random arrays (every type, block and block-cyclic layouts, random dims), random
    /// sections put, got and accumulated from every rank at once, from host, device and
    /// registered buffers, compared after each sync with a serial reference.
    Random {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Rounds of put, check, acc, check per array.
        #[arg(long, default_value_t = 4)]
        rounds: u32,
    },
    /// Overlapping sections from one rank complete in program order (blocking and not).
    Order {
        #[arg(long, default_value_t = 20)]
        rounds: u32,
    },
    /// Every rank accumulates into one section `times` times: the exact total.
    AccTotal {
        #[arg(long, default_value_t = 40)]
        times: u32,
    },
    /// Non-blocking put, get and acc completed by fence and handles.
    Nb,
    /// Every bad input is refused, nothing is written outside the array.
    Bad,
    /// Short messages around a ring.
    Msg {
        #[arg(long, default_value_t = 100)]
        iters: u32,
    },
}

/// The context from the launcher's job.
fn from_launcher() -> Context {
    Context::init().unwrap_or_else(|e| common::fail(format!("Context::init: {e}")))
}

/// The context: from MPI with `--mpi` (MPI_THREAD_MULTIPLE: the internode path's proxy
/// thread calls MPI beside this one), else from the launcher.
#[cfg(feature = "mpi")]
fn init(cli: &Cli) -> (Context, Option<gpulmt::mpi::rsmpi::environment::Universe>) {
    use gpulmt::mpi::rsmpi::{self, Threading};
    if !cli.mpi {
        return (from_launcher(), None);
    }
    let (universe, _) = rsmpi::initialize_with_threading(Threading::Multiple)
        .unwrap_or_else(|| common::fail("MPI_Init_thread: MPI was initialized already".into()));
    let ctx =
        gpulmt::mpi::init_from_mpi(&universe.world()).unwrap_or_else(|e| common::fail(format!("init_from_mpi: {e}")));
    (ctx, Some(universe))
}

/// The context from the launcher (this build has no MPI bootstrap: feature `mpi`).
#[cfg(not(feature = "mpi"))]
fn init(_cli: &Cli) -> (Context, ()) {
    (from_launcher(), ())
}

fn main() {
    gpulmt::logging::init("warn");
    let cli = Cli::parse();
    // The MPI universe (with `--mpi`) lives until the end: MPI finalizes when it drops,
    // after the context did.
    let (mut ctx, _universe) = init(&cli);
    let me = ctx.rank();
    common::RANK.store(me, std::sync::atomic::Ordering::Relaxed);
    if me == 0 {
        println!("job={}", std::env::var("GPULMT_JOB").unwrap_or_default());
    }
    println!("rank={me} pid={} device={} size={}", std::process::id(), ctx.device(), ctx.size());
    let name = match cli.cmd {
        Cmd::Random { seed, rounds } => {
            random::run(&mut ctx, seed, rounds);
            "random"
        }
        Cmd::Order { rounds } => {
            order::run(&mut ctx, rounds);
            "order"
        }
        Cmd::AccTotal { times } => {
            order::acc_total(&mut ctx, times);
            "acc-total"
        }
        Cmd::Nb => {
            order::non_blocking(&mut ctx);
            "nb"
        }
        Cmd::Bad => {
            bad::run(&mut ctx);
            "bad"
        }
        Cmd::Msg { iters } => {
            bad::messages(&mut ctx, iters);
            "msg"
        }
    };
    ctx.finalize().unwrap_or_else(|e| common::fail(format!("finalize: {e}")));
    println!("rank={me} ok {name}");
}
