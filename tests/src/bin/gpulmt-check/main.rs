//! `gpulmt-check`: the rank program of gpulmt's multi-process integration tests.
//!
//! Run it under the launcher, one scenario per job:
//!
//! ```text
//! gpulmt-run -n 2 gpulmt-check pingpong --placement "D H" --sizes 0,1,65537 --offset 4096
//! gpulmt-run -n 4 gpulmt-check alltoall --iters 8
//! ```
//!
//! Every scenario checks the data it moves byte for byte (and the guard bytes around
//! receive buffers), and exits with status 1 and a `FAIL:` line on stderr at the first
//! mismatch or unexpected result. On success each rank prints, on stdout:
//!
//! ```text
//! job=<GPULMT_JOB>                                  (rank 0 only)
//! rank=R pid=P device=D size=N
//! rank=R protocols get=.. put=.. coop=.. shm=.. self=..
//! rank=R kinds staged=..                            (rendezvous buffers no peer can map)
//! rank=R cache opens=.. closes=.. hits=.. misses=.. entries=..
//! rank=R ok <scenario>
//! ```
//!
//! After `finalize` every rank also checks that no simulated-device object of its own
//! process (`/dev/shm/gpulmt-sim-<pid>-*`) is left, and rank 0 that the job segment
//! (`/dev/shm/gpulmt-<job>`) is gone: the library's own cleanup, independent of the
//! launcher's.
//!
//! Each scenario is a module of its own (`run` is its entry point); [`buffers`], [`api`]
//! and [`report`] hold what they share.

#[macro_use]
mod report;
mod alltoall;
mod api;
mod bad_arguments;
mod buffers;
mod cache;
mod die;
mod forged;
mod free;
mod pingpong;
mod same_device;
mod selfsend;
mod sym;
mod truncate;
mod wildcard_barrier;
mod window;

use std::sync::atomic::Ordering;

use clap::{Parser, Subcommand};
use gpulmt::Context;

use crate::api::{finish, finish_allowing_violations};
use crate::die::{How, Role, When};
use crate::report::{fail, RANK};

// ---------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------

#[derive(Parser, Debug)]
#[command(name = "gpulmt-check", about = "Rank program of gpulmt's integration tests (run under gpulmt-run)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Rank 0 sends each size to rank 1, which checks it and sends it back.
    Pingpong {
        /// Memory of rank 0 and rank 1: "D D", "D H", "H D" or "H H".
        #[arg(long, default_value = "D D")]
        placement: String,
        /// Comma-separated message sizes (bytes; K/M suffixes allowed).
        #[arg(long, default_value = "0,1,7,4095,4096,65537,4194304,67108864")]
        sizes: String,
        /// Offset of every buffer inside its allocation (also the guard size).
        #[arg(long, default_value_t = 4096)]
        offset: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Kind of rank 0's device memory: legacy, pool, pool-ipc, vmm, vmm-ipc, managed
        /// (VMM with `:CHUNKS`, e.g. vmm-ipc:3).
        #[arg(long, default_value = "legacy")]
        mem0: String,
        /// Kind of rank 1's device memory.
        #[arg(long, default_value = "legacy")]
        mem1: String,
    },
    /// Every rank sends mixed messages to every other rank; ANY_SOURCE receives.
    Alltoall {
        #[arg(long, default_value_t = 4)]
        iters: u32,
        /// Also send a message to oneself each iteration.
        #[arg(long)]
        include_self: bool,
    },
    /// Ring exchange of device buffers among ranks that share one device.
    SameDevice {
        #[arg(long, default_value_t = 2)]
        iters: u32,
    },
    /// Messages larger than the receive buffer.
    Truncate {
        #[arg(long, default_value = "H H")]
        placement: String,
    },
    /// Zero-length messages, bad ranks and tags, cancel, iprobe.
    ZeroAndBad,
    /// Messages a rank sends to itself (eager and rendezvous, host and device).
    Selfsend,
    /// Rank 1 dies abruptly; rank 0's pending transfer must fail, not hang.
    Die {
        #[arg(long, value_enum, default_value_t = When::Before)]
        when: When,
        #[arg(long, value_enum, default_value_t = How::Exit)]
        how: How,
        /// Memory of rank 0 and rank 1 (host on both sides moves through SHM).
        #[arg(long, default_value = "H H")]
        placement: String,
        /// Whether rank 0 (the survivor) sends to or receives from rank 1.
        #[arg(long, value_enum, default_value_t = Role::Send)]
        role: Role,
        #[arg(long, default_value = "64M")]
        size: String,
        /// After the death, the survivor also frees (two-phase) the buffer of the
        /// transfer, which the dead rank may have had mapped.
        #[arg(long)]
        free_mapped: bool,
        /// The survivor's receive names no source (ANY_SOURCE); in a 2-rank job only
        /// the dead rank (or itself) could ever match it.
        #[arg(long)]
        any_source: bool,
    },
    /// A window of concurrent messages between ranks 0 and 1: with one tag they must
    /// match in send order (non-overtaking, eager and rendezvous mixed); with distinct
    /// tags the receives are posted in reverse order (SHM transfers queue per pair).
    Window {
        #[arg(long, default_value = "H H")]
        placement: String,
        #[arg(long, default_value_t = 12)]
        count: u32,
        #[arg(long, default_value = "1048577,10,3145728,0,65537,8193,8192")]
        sizes: String,
        #[arg(long)]
        same_tag: bool,
    },
    /// Rank 1 writes forged control packets straight into its ring to rank 0 (through
    /// the public `gpulmt::shm::job::JobSegment`): garbage, a wrong version, RTSs whose
    /// regions lie about their allocation or carry forged handles, answers to messages
    /// that do not exist. Rank 0 must count violations, fail the receives that matched
    /// forged RTSs without writing a byte, and keep working.
    Forged,
    /// Two-phase free across all ranks, interleaved with transfers.
    Free {
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Check that a transfer from a new allocation opens a new mapping on the
        /// receiver (true when the receiver maps the sender's buffer: GET).
        #[arg(long)]
        fresh_open: bool,
    },
    /// A window of concurrent sends of one device buffer: one mapping per allocation.
    Cache {
        #[arg(long, default_value_t = 64)]
        iters: u32,
        #[arg(long, default_value = "64K")]
        size: String,
        /// Expected handle-cache opens on the receiver (rank 1) and the sender (rank 0).
        #[arg(long)]
        expect_recv_opens: Option<u64>,
        #[arg(long)]
        expect_send_opens: Option<u64>,
    },
    /// The symmetric heap through its host operations: same offsets everywhere, a
    /// put_signal ring, gets, exact atomic totals, collective checks, frees.
    Sym {
        /// Peer access is off between devices: only ranks of one device map each other.
        #[arg(long)]
        expect_unmapped: bool,
        /// Each rank asks for another GPULMT_SYM_HEAP: the first sym_alloc must fail on
        /// every rank, saying so.
        #[arg(long)]
        mismatched_heap: bool,
    },
    /// A wildcard (ANY_SOURCE, ANY_TAG) receive posted before a barrier must receive
    /// the user's message, not the barrier's internal one.
    WildcardBarrier {
        /// The watchdog: the failure mode is a hang, reported after this many seconds
        /// (the scenario takes milliseconds; a wide margin for a loaded machine, below
        /// the 30 s launcher timeout of its test).
        #[arg(long, default_value_t = 20)]
        timeout_s: u64,
    },
}

fn main() {
    gpulmt::logging::init("warn");
    let cli = Cli::parse();
    if let Cmd::Sym { mismatched_heap: true, .. } = cli.cmd {
        let rank: u64 = std::env::var("GPULMT_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(0);
        // Before any thread exists (set_var's only requirement).
        std::env::set_var("GPULMT_SYM_HEAP", ((1 + rank) << 20).to_string());
    }
    let mut ctx = Context::init().unwrap_or_else(|e| fail(format!("Context::init: {e}")));
    RANK.store(ctx.rank(), Ordering::Relaxed);
    let me = ctx.rank();
    if me == 0 {
        println!("job={}", std::env::var("GPULMT_JOB").unwrap_or_default());
    }
    println!("rank={me} pid={} device={} size={}", std::process::id(), ctx.device(), ctx.size());
    let name = match &cli.cmd {
        Cmd::Pingpong { placement, sizes, offset, seed, mem0, mem1 } => {
            pingpong::run(&mut ctx, placement, sizes, *offset, *seed, [mem0.as_str(), mem1.as_str()]);
            "pingpong"
        }
        Cmd::Alltoall { iters, include_self } => {
            alltoall::run(&mut ctx, *iters, *include_self);
            "alltoall"
        }
        Cmd::SameDevice { iters } => {
            same_device::run(&mut ctx, *iters);
            "same-device"
        }
        Cmd::Truncate { placement } => {
            truncate::run(&mut ctx, placement);
            "truncate"
        }
        Cmd::ZeroAndBad => {
            bad_arguments::run(&mut ctx);
            "zero-and-bad"
        }
        Cmd::Selfsend => {
            selfsend::run(&mut ctx);
            "selfsend"
        }
        Cmd::Die { when, how, placement, role, size, free_mapped, any_source } => {
            die::run(ctx, *when, *how, placement, *role, size, *free_mapped, *any_source)
        }
        Cmd::Window { placement, count, sizes, same_tag } => {
            window::run(&mut ctx, placement, *count, sizes, *same_tag);
            "window"
        }
        Cmd::Forged => {
            forged::run(&mut ctx);
            // Both ranks count violations here (rank 1 for the answers to messages it
            // never sent): skip the zero-violation check of `finish`.
            finish_allowing_violations(ctx, "forged");
            return;
        }
        Cmd::Free { rounds, fresh_open } => {
            free::run(&mut ctx, *rounds, *fresh_open);
            "free"
        }
        Cmd::Cache { iters, size, expect_recv_opens, expect_send_opens } => {
            cache::run(&mut ctx, *iters, size, *expect_recv_opens, *expect_send_opens);
            "cache"
        }
        Cmd::Sym { expect_unmapped, mismatched_heap } => {
            sym::run(&mut ctx, *expect_unmapped, *mismatched_heap);
            "sym"
        }
        Cmd::WildcardBarrier { timeout_s } => {
            wildcard_barrier::run(&mut ctx, *timeout_s);
            "wildcard-barrier"
        }
    };
    finish(ctx, name);
}
