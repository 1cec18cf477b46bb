//! stencil2d: SHOC's Stencil2D (9-point stencil, halo exchange) over gpulmt.
//! Run: `gpulmt-run -n 4 target/release/stencil2d --size 4096 --halo 1 --mode inter-k [--precision double] [--check]`;
//! `--help` lists every option. The program is `gpulmt_bench::stencil`.

fn main() {
    gpulmt::logging::init("warn");
    std::process::exit(gpulmt_bench::stencil::app::main());
}
