//! Report over one results directory: `bench-report DIR [--out DIR]`.
//!
//! Reads gpulmt.csv, anchors.csv, staged_mpi.csv, mpi_sm.csv and (when present)
//! split.csv from DIR; writes summary.csv, protocols.csv, latency.svg,
//! bandwidth.svg and bibw.svg into --out (default DIR); prints a Markdown table of
//! the key points to stdout. Where DIR has stencil.csv, also writes
//! stencil_table.csv, stencil_overlap.csv and stencil.svg and prints a Markdown
//! section on them (DIR may hold stencil.csv without gpulmt.csv). See
//! `gpulmt_bench::report`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(name = "bench-report", about = "Summary CSVs, SVG plots and a key-point table from a results directory")]
struct Args {
    /// Results directory (gpulmt.csv, anchors.csv, staged_mpi.csv, mpi_sm.csv, split.csv, stencil.csv)
    dir: PathBuf,
    /// Where to write the outputs (default: DIR)
    #[arg(long)]
    out: Option<PathBuf>,
}

fn main() -> ExitCode {
    gpulmt::logging::init("warn");
    let args = Args::parse();
    let out = args.out.unwrap_or_else(|| args.dir.clone());
    match gpulmt_bench::report::run(&args.dir, &out) {
        Ok(o) => {
            for f in &o.files {
                eprintln!("wrote {}", f.display());
            }
            print!("{}", o.table);
            if let Some(stencil) = &o.stencil {
                if !o.table.is_empty() {
                    println!();
                }
                print!("{stencil}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench-report: {e}");
            ExitCode::FAILURE
        }
    }
}
