//! osu_bw over gpulmt: rank 0 keeps a window of sends in flight to rank 1, which
//! acknowledges each window; bandwidth in MB/s (10^6 bytes per second).
//! Run: `gpulmt-run -n 2 target/release/osu_bw [-m 1:1G] [-W 64] [-c] D D`.

fn main() {
    gpulmt::logging::init("warn");
    std::process::exit(gpulmt_bench::window::run(false));
}
