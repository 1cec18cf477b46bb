//! osu_bibw over gpulmt: both ranks keep a window of sends in flight to each other;
//! aggregate bandwidth in MB/s (10^6 bytes per second).
//! Run: `gpulmt-run -n 2 target/release/osu_bibw [-m 1:1G] [-W 64] [-c] D D`.

fn main() {
    gpulmt::logging::init("warn");
    std::process::exit(gpulmt_bench::window::run(true));
}
