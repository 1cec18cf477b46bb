//! device_check: the device API (`include/gpulmt_device.cuh`) on GPUs, under the launcher.
//!
//! ```text
//! gpulmt-run -n 2 device_check                # conformance checks: name,ok|FAIL,detail
//! gpulmt-run -n 2 device_check --bench        # anchor,metric,bytes,value (beside NVSHMEM's)
//! device_check --compile-only                 # every kernel through NVRTC (Stencil2D's gio too), no GPU needed
//! # across nodes (feature `mpi`): the checks with PE 1 on another pseudo-node, then the
//! # queue path's latencies and Open MPI's own host-to-host latency between the same ranks
//! mpirun -np 2 -x GPULMT_PSEUDO_NODES=2 device_check --offnode
//! ```
//!
//! `--offnode` on sim runs the host's half (put+quiet through the heap's host queue, and
//! MPI's ping-pong) and says what it skips.
//!
//! Ranks sharing a GPU need MPS (their kernels wait for each other). On the sim backend
//! there are no kernels to run: it says so and exits 0. Exit status 1 when a check fails.

use clap::Parser;
use gpulmt::Context;
use gpulmt_bench::device::{checks, kernel_names, perf, KERNELS};

#[derive(Parser, Debug)]
#[command(name = "device_check", version, about = "The device API's conformance checks and benchmarks on GPUs")]
struct Options {
    /// Run the benchmarks (put_signal ping-pong, one block's put bandwidth) instead.
    #[arg(long)]
    bench: bool,
    /// Compile every kernel with NVRTC and exit (no job, no GPU).
    #[arg(long)]
    compile_only: bool,
    /// Only this check.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(checks::CHECKS))]
    only: Option<String>,
    /// Iterations of the racing checks.
    #[arg(long, default_value_t = checks::CheckOptions::default().iters)]
    iters: u32,
    /// Rounds of the round-based checks.
    #[arg(long, default_value_t = checks::CheckOptions::default().rounds)]
    rounds: u32,
    /// Largest message of the benchmarks (bytes; K/M suffixes).
    #[arg(long, default_value = "64M", value_parser = size_arg)]
    max: u64,
    /// Benchmarks: kernels compiled without the device checks (GPULMT_DEVICE_UNCHECKED).
    #[arg(long)]
    unchecked: bool,
    /// Append the benchmark rows to this CSV file too.
    #[arg(long)]
    csv: Option<String>,
    /// Under mpirun with PEs on different (pseudo-)nodes: the checks, then the queue
    /// path's latencies (put+quiet at 8 B, a queue push to the proxy's pop) beside MPI's
    /// host-to-host latency on the same transport (build with `--features mpi`).
    #[arg(long)]
    offnode: bool,
}

/// A size like 64M.
fn size_arg(s: &str) -> Result<u64, String> {
    gpulmt::config::parse_size(s).ok_or_else(|| format!("'{s}' is not a size (e.g. 8, 64K, 64M)"))
}

fn main() {
    gpulmt::logging::init("warn");
    let o = Options::parse();
    if o.compile_only {
        for opts in [&[][..], &["-DGPULMT_DEVICE_UNCHECKED"]] {
            if let Err(e) = gpulmt::sym::nvrtc::compile_device_kernels(KERNELS, "device_checks.cu", opts) {
                eprintln!("device_check: {e}");
                std::process::exit(if gpulmt::sym::nvrtc::nvrtc_available() { 1 } else { 2 });
            }
        }
        println!(
            "device_check: {} kernels compiled with NVRTC: {}",
            kernel_names(KERNELS).len(),
            kernel_names(KERNELS).join(" ")
        );
        // Stencil2D's gio mode, in both precisions, as it compiles them.
        use gpulmt_bench::stencil::{gio::GIO_SOURCE, kernel::CUDA_SOURCE};
        for real in ["float", "double"] {
            let source = format!("typedef {real} real;\n{CUDA_SOURCE}\n{GIO_SOURCE}");
            if let Err(e) = gpulmt::sym::nvrtc::compile_device_kernels(&source, "stencil2d_gio.cu", &["--fmad=false"]) {
                eprintln!("device_check: {e}");
                std::process::exit(1);
            }
        }
        println!("device_check: stencil_gio compiled with NVRTC (float, double)");
        return;
    }
    if o.offnode {
        offnode(&o);
    }
    let mut ctx = Context::init().unwrap_or_else(|e| {
        eprintln!("device_check: init: {e}");
        std::process::exit(1)
    });
    if ctx.backend_kind() != gpulmt::device::BackendKind::Cuda {
        if ctx.rank() == 0 {
            println!("device_check: skipped: the device API runs on CUDA GPUs, this job uses sim devices");
        }
        let _ = ctx.finalize();
        return;
    }
    let outcome = if o.bench {
        perf::run(&mut ctx, o.max as usize, o.unchecked).map(|rows| {
            print_rows(&ctx, &o, &rows);
            true
        })
    } else {
        run_checks(&mut ctx, &o)
    };
    finish(ctx, outcome);
}

/// Rank 0 prints the benchmark rows (and appends them to `--csv`).
fn print_rows(ctx: &Context, o: &Options, rows: &[String]) {
    if ctx.rank() == 0 {
        println!("anchor,metric,bytes,value");
        for r in rows {
            println!("{r}");
            if let Some(path) = &o.csv {
                let f: Vec<&str> = r.split(',').collect();
                gpulmt_bench::append_csv(path, "anchor,metric,bytes,value", &f);
            }
        }
    }
}

/// The conformance checks; whether all passed.
fn run_checks(ctx: &mut Context, o: &Options) -> gpulmt_bench::device::Result<bool> {
    let co = checks::CheckOptions { iters: o.iters, rounds: o.rounds };
    checks::run(ctx, &co, o.only.as_deref(), |v| println!("{}", v.line())).map(|verdicts| verdicts.iter().all(|v| v.ok))
}

/// `--offnode`: the job from MPI (pseudo-nodes), the checks on GPUs, the queue path's
/// latencies and MPI's own; exits.
#[cfg(feature = "mpi")]
fn offnode(o: &Options) -> ! {
    use gpulmt::mpi::rsmpi::traits::{Communicator, Destination, Source};
    use gpulmt::mpi::rsmpi::Threading;
    let (universe, _) = gpulmt::mpi::rsmpi::initialize_with_threading(Threading::Multiple).unwrap_or_else(|| {
        eprintln!("device_check: MPI_Init_thread failed (run --offnode under mpirun)");
        std::process::exit(1)
    });
    let world = universe.world();
    let mut ctx = gpulmt::mpi::init_from_mpi(&world).unwrap_or_else(|e| {
        eprintln!("device_check: init_from_mpi: {e}");
        std::process::exit(1)
    });
    let cuda = ctx.backend_kind() == gpulmt::device::BackendKind::Cuda;
    let mut passed = true;
    if cuda {
        match run_checks(&mut ctx, o) {
            Ok(p) => passed = p,
            Err(e) => finish(ctx, Err(e)),
        }
    } else if ctx.rank() == 0 {
        println!("device_check: sim devices: the kernels' checks and latencies are skipped, the host's run");
    }
    let iters = if cuda { perf::OFFNODE_ITERS } else { perf::OFFNODE_ITERS / 10 };
    let mut rows = match perf::offnode(&mut ctx, iters) {
        Ok(rows) => rows,
        Err(e) => finish(ctx, Err(e)),
    };
    // MPI's own host-to-host ping-pong of 8 bytes between the same two ranks, over the
    // transport the proxies use (the anchor of the queue path's latency).
    let (me, n) = (world.rank(), iters / 10 + 1 + iters);
    let mut buf = [0u8; 8];
    let t = std::time::Instant::now();
    let mut start = t;
    for i in 0..n {
        if i == iters / 10 + 1 {
            start = std::time::Instant::now();
        }
        match me {
            0 => {
                world.process_at_rank(1).send(&buf[..]);
                world.process_at_rank(1).receive_into(&mut buf[..]);
            }
            1 => {
                world.process_at_rank(0).receive_into(&mut buf[..]);
                world.process_at_rank(0).send(&buf[..]);
            }
            _ => break,
        }
    }
    if me == 0 {
        let half = start.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0;
        rows.push(format!("openmpi_host_pingpong,half_rtt_us,8,{half:.3}"));
    }
    print_rows(&ctx, o, &rows);
    let code = match ctx.finalize() {
        Ok(()) => i32::from(!passed),
        Err(e) => {
            eprintln!("device_check: finalize: {e}");
            1
        }
    };
    drop(universe);
    std::process::exit(code)
}

#[cfg(not(feature = "mpi"))]
fn offnode(_: &Options) -> ! {
    eprintln!("device_check: --offnode needs MPI: build with `cargo build -p gpulmt-bench --features mpi`");
    std::process::exit(2)
}

/// Finalizes and exits: 0 when everything passed.
fn finish(ctx: Context, outcome: gpulmt_bench::device::Result<bool>) -> ! {
    match outcome {
        Ok(passed) => {
            if let Err(e) = ctx.finalize() {
                eprintln!("device_check: finalize: {e}");
                std::process::exit(1);
            }
            std::process::exit(i32::from(!passed));
        }
        Err(e) => {
            eprintln!("device_check: rank {}: {e}", ctx.rank());
            std::process::exit(1);
        }
    }
}
