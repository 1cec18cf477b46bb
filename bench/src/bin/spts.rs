//! spts: a distributed sparse lower-triangular solve (seed 000's SpTS) over gpulmt, in gio
//! mode (sync-free persistent kernels) or the inter-k baseline (a kernel per level).
//! Run: `gpulmt-run -n 4 target/release/spts --n 200000 --mode gio --check`;
//! `--help` lists every option. The program is `gpulmt_bench::spts`.

fn main() {
    gpulmt::logging::init("warn");
    std::process::exit(gpulmt_bench::spts::app::main());
}
