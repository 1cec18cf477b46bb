//! device_check: the device API (`include/gpulmt_device.cuh`) on GPUs, under the launcher.
//!
//! ```text
//! gpulmt-run -n 2 device_check                # conformance checks: name,ok|FAIL,detail
//! gpulmt-run -n 2 device_check --bench        # anchor,metric,bytes,value (beside NVSHMEM's)
//! device_check --compile-only                 # every kernel through NVRTC (Stencil2D's gio too), no GPU needed
//! ```
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
            if ctx.rank() == 0 {
                println!("anchor,metric,bytes,value");
                for r in &rows {
                    println!("{r}");
                    if let Some(path) = &o.csv {
                        let f: Vec<&str> = r.split(',').collect();
                        gpulmt_bench::append_csv(path, "anchor,metric,bytes,value", &f);
                    }
                }
            }
            true
        })
    } else {
        let co = checks::CheckOptions { iters: o.iters, rounds: o.rounds };
        checks::run(&mut ctx, &co, o.only.as_deref()).map(|verdicts| {
            for v in &verdicts {
                println!("{}", v.line());
            }
            verdicts.iter().all(|v| v.ok)
        })
    };
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
