//! Shared parts of the OSU-style benchmarks: options, buffers in host or device
//! memory, data validation, and output in the OSU format (so numbers compare line by
//! line with OSU micro-benchmark results) plus optional CSV.

use std::fs::OpenOptions;

pub mod device;
pub mod pair;
pub mod program;
pub mod report;
pub mod spts;
pub mod stencil;
pub mod window;

use clap::Parser;
use gpulmt::device::AllocKind;
use gpulmt::{Context, Error};

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    Host,
    Device,
}

impl Placement {
    pub fn letter(self) -> &'static str {
        match self {
            Placement::Host => "H",
            Placement::Device => "D",
        }
    }
    fn word(self) -> &'static str {
        match self {
            Placement::Host => "HOST (H)",
            Placement::Device => "DEVICE (D)",
        }
    }
}

/// The sizes of a `-m` range: 0 (if in range), then powers of two from max(min,1) to max.
pub fn sizes_in((lo, hi): (usize, usize)) -> Vec<usize> {
    let mut v = Vec::new();
    if lo == 0 {
        v.push(0);
    }
    let mut s = lo.max(1);
    while s <= hi {
        v.push(s);
        s *= 2;
    }
    v
}

/// Parses a buffer placement argument: D (device) or H (host), either case.
pub fn parse_placement(s: &str) -> Result<Placement, String> {
    match s {
        "H" | "h" => Ok(Placement::Host),
        "D" | "d" => Ok(Placement::Device),
        _ => Err(format!("buffer placement '{s}': use D (device) or H (host)")),
    }
}

/// Parses OSU's `-m` value: `min:max` or `max` (min 0), sizes like `4K` or `1M`.
pub fn parse_range(s: &str) -> Result<(usize, usize), String> {
    let size = |t: &str| gpulmt::config::parse_size(t).map(|v| v as usize).ok_or(format!("bad size '{t}'"));
    match s.split_once(':') {
        Some((a, b)) => {
            let lo = if a.is_empty() { 0 } else { size(a)? };
            let hi = size(b)?;
            if lo > hi {
                return Err(format!("-m {s}: min above max"));
            }
            Ok((lo, hi))
        }
        None => Ok((0, size(s)?)),
    }
}

/// Options common to the benchmarks (OSU names where OSU has them).
#[derive(Parser, Debug, Clone)]
pub struct Options {
    /// Message sizes `min:max` (OSU -m), e.g. `1:4M`; sizes double from min.
    #[arg(short = 'm', long = "message-size", value_parser = parse_range, default_value = "0:4M")]
    pub range: (usize, usize),
    /// Iterations per size (OSU -i); large messages use fewer (see --large-budget).
    #[arg(short = 'i', long = "iterations", default_value_t = 1000)]
    pub iterations: usize,
    /// Warm-up iterations per size (OSU -x).
    #[arg(short = 'x', long = "warmup", default_value_t = 100)]
    pub warmup: usize,
    /// Window size for bandwidth tests (OSU -W).
    #[arg(short = 'W', long = "window-size", default_value_t = 64)]
    pub window: usize,
    /// Validate every received byte (OSU -c).
    #[arg(short = 'c', long = "validation")]
    pub validate: bool,
    /// Force a rendezvous protocol (sets GPULMT_PROTOCOL): auto, get, put, coop, shm.
    #[arg(long)]
    pub protocol: Option<String>,
    /// Bytes moved per size at most (iterations shrink for large messages).
    #[arg(long, value_parser = |s: &str| gpulmt::config::parse_size(s).ok_or("bad size"), default_value = "8G")]
    pub large_budget: u64,
    /// Append results as CSV rows `bench,placement,protocol,bytes,metric,value`.
    #[arg(long)]
    pub csv: Option<String>,
    /// Print the handle-cache and protocol counters at the end.
    #[arg(long)]
    pub stats: bool,
    /// How device buffers are allocated (`docs/memory-kinds.md`): legacy (cudaMalloc),
    /// pool (the default cudaMallocAsync pool), pool-ipc (a pool with a POSIX-fd handle
    /// type), vmm, vmm-ipc (cuMemCreate + cuMemMap, one chunk), managed.
    #[arg(long, value_parser = |s: &str| AllocKind::from_name(s).ok_or("unknown memory kind"), default_value = "legacy")]
    pub mem: AllocKind,
    /// Send buffer placement (D or H).
    #[arg(value_parser = parse_placement, default_value = "H")]
    pub send: Placement,
    /// Receive buffer placement (D or H).
    #[arg(value_parser = parse_placement, default_value = "H")]
    pub recv: Placement,
}

impl Options {
    /// Parses the command line and applies `--protocol` before the context reads
    /// the environment.
    pub fn from_args() -> Options {
        let o = Options::parse();
        if let Some(p) = &o.protocol {
            // SAFETY: called at start-up, before any thread exists.
            unsafe { std::env::set_var("GPULMT_PROTOCOL", p) };
        }
        o
    }

    /// Sizes to run: see [`sizes_in`].
    pub fn sizes(&self) -> Vec<usize> {
        sizes_in(self.range)
    }

    /// Iterations and warm-up for a size, bounded by the byte budget so that
    /// gigabyte messages finish in seconds.
    pub fn iterations_for(&self, size: usize, per_iter_msgs: usize) -> (usize, usize) {
        let bytes = (size.max(1) * per_iter_msgs.max(1)) as u64;
        let cap = (self.large_budget / bytes).max(10) as usize;
        let iters = self.iterations.min(cap);
        let warm = self.warmup.min((iters / 10).max(2));
        (iters, warm)
    }

    pub fn protocol_name(&self) -> String {
        std::env::var("GPULMT_PROTOCOL").unwrap_or_else(|_| "auto".into())
    }
}

/// A buffer of `len` bytes in host or device memory.
pub struct Buffer {
    pub ptr: usize,
    pub len: usize,
    pub placement: Placement,
    _host: Option<Vec<u8>>,
}

impl Buffer {
    pub fn new(ctx: &mut Context, placement: Placement, len: usize) -> Result<Buffer, Error> {
        Self::new_as(ctx, placement, AllocKind::Legacy, len)
    }

    /// [`new`](Self::new) whose device memory is of kind `mem`.
    pub fn new_as(ctx: &mut Context, placement: Placement, mem: AllocKind, len: usize) -> Result<Buffer, Error> {
        let len = len.max(1);
        Ok(match placement {
            Placement::Host => {
                let mut v = vec![0u8; len];
                Buffer { ptr: v.as_mut_ptr() as usize, len, placement, _host: Some(v) }
            }
            Placement::Device => Buffer { ptr: ctx.mem_alloc_as(len, mem, 1)?, len, placement, _host: None },
        })
    }

    /// Fills the first `n` bytes with the pattern of `seed`.
    pub fn fill(&self, ctx: &Context, n: usize, seed: u64) -> Result<(), Error> {
        assert!(n <= self.len, "filling {n} bytes of a {}-byte buffer", self.len);
        let data = pattern(seed, n);
        // SAFETY: `ptr` is this buffer's own memory of `len` bytes (its vector, or its
        // allocation from mem_alloc, as `new` made it); `data` holds `n`.
        unsafe { ctx.copy_sync(self.ptr, data.as_ptr() as usize, n) }
    }

    /// Checks the first `n` bytes hold the pattern of `seed`.
    pub fn check(&self, ctx: &Context, n: usize, seed: u64) -> Result<(), String> {
        assert!(n <= self.len, "checking {n} bytes of a {}-byte buffer", self.len);
        let mut got = vec![0u8; n];
        // SAFETY: as in `fill`; `got` holds `n`.
        unsafe { ctx.copy_sync(got.as_mut_ptr() as usize, self.ptr, n) }.map_err(|e| e.to_string())?;
        let want = pattern(seed, n);
        match got.iter().zip(&want).position(|(a, b)| a != b) {
            None => Ok(()),
            Some(i) => {
                Err(format!("validation failed at byte {i} of {n}: got {:#04x}, expected {:#04x}", got[i], want[i]))
            }
        }
    }

    pub fn free(self, ctx: &mut Context) -> Result<(), Error> {
        if self.placement == Placement::Device {
            ctx.mem_free(self.ptr)?;
        }
        Ok(())
    }
}

/// Bytes derived from a seed (xorshift), cheap and reproducible on both ranks.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) | 1;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// OSU's column width for every column after the size (`FIELD_WIDTH` in OSU's util).
const FIELD_WIDTH: usize = 20;

/// Prints the OSU header for a benchmark; with `-c`, OSU 7.x's `Validation` column too.
pub fn header(ctx: &Context, title: &str, o: &Options, column: &str) {
    println!("# gpulmt {title} (OSU format) v{}", env!("CARGO_PKG_VERSION"));
    println!(
        "# Backend {} | protocol {} | ranks {} | devices: rank 0 bound to {}",
        ctx.backend_kind(),
        o.protocol_name(),
        ctx.size(),
        ctx.device()
    );
    println!("# Send Buffer on {} and Receive Buffer on {}", o.send.word(), o.recv.word());
    let validation = if o.validate { format!("{:>FIELD_WIDTH$}", "Validation") } else { String::new() };
    println!("{:<10}{column:>FIELD_WIDTH$}{validation}", "# Size");
}

/// One result row in OSU's format: the size, the value with two decimals and, with `-c`,
/// `Pass` or `Fail` (OSU 7.x's `VALIDATION_STATUS`) for whether both ranks received every
/// byte right.
pub fn result_line(o: &Options, size: usize, value: f64, passed: bool) -> String {
    let mut line = format!("{size:<10}{value:>FIELD_WIDTH$.2}");
    if o.validate {
        line.push_str(&format!("{:>FIELD_WIDTH$}", if passed { "Pass" } else { "Fail" }));
    }
    line
}

/// Tag of the validation verdict rank 1 sends rank 0 (apart from the benchmarks' own).
const VERDICT_TAG: i32 = 90;

/// Joins the two ranks' validation of one size, outside the timing: rank 1 sends rank 0
/// whether its own check passed, and rank 0 answers whether both did (rank 1 and any
/// further rank answer their own verdict). Both ranks must call it for every validated size.
pub fn pair_verdict(ctx: &mut Context, me: u32, passed: bool) -> Result<bool, Error> {
    match me {
        0 => {
            let mut theirs = [0u8];
            ctx.recv(&mut theirs, Some(1), Some(VERDICT_TAG))?;
            Ok(passed && theirs[0] == 1)
        }
        1 => {
            ctx.send(&[u8::from(passed)], 0, VERDICT_TAG)?;
            Ok(passed)
        }
        _ => Ok(passed),
    }
}

/// Appends one row of `--csv` output: `bench,placement,protocol,bytes,metric,value`.
pub fn csv_row(o: &Options, bench: &str, bytes: usize, metric: &str, value: f64) {
    let Some(path) = &o.csv else { return };
    let placement = format!("{} {}", o.send.letter(), o.recv.letter());
    let record = [bench, &placement, &o.protocol_name(), &bytes.to_string(), metric, &format!("{value:.4}")];
    append_csv(path, report::POINTS_HEADER, &record);
}

/// Appends one record to the CSV file at `path` (the `header` constant's names first when
/// the file is new or empty). A file that cannot be written is reported, not fatal: the
/// table on stdout holds the same results.
pub fn append_csv(path: &str, header: &str, record: &[&str]) {
    let fresh = std::fs::metadata(path).map(|m| m.len() == 0).unwrap_or(true);
    let written = OpenOptions::new().create(true).append(true).open(path).map_err(csv::Error::from).and_then(|f| {
        let mut w = csv::Writer::from_writer(f);
        if fresh {
            w.write_record(header.split(','))?;
        }
        w.write_record(record)?;
        Ok(w.flush()?)
    });
    if let Err(e) = written {
        eprintln!("cannot write {path}: {e}");
    }
}

/// Prints counters at the end, when asked.
pub fn print_stats(ctx: &Context, o: &Options) {
    if !o.stats {
        return;
    }
    let s = ctx.stats();
    println!(
        "# rank {} protocols get={} put={} coop={} shm={} staged={} fallbacks={} | cache hits={} misses={} opens={} closes={} evictions={} open_ms={:.3} | packets sent={} backpressure={} violations={}",
        ctx.rank(),
        s.protocols[0],
        s.protocols[1],
        s.protocols[2],
        s.protocols[3],
        s.staged_kinds,
        s.open_fallbacks,
        s.cache.hits,
        s.cache.misses,
        s.cache.opens,
        s.cache.closes,
        s.cache.evictions,
        s.cache.open_nanos as f64 / 1e6,
        s.packets_sent,
        s.backpressure,
        s.violations
    );
}

/// Exits with a message on error (benchmarks have no one to return to).
pub fn or_die<T>(r: Result<T, Error>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {what}: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(args: &[&str]) -> Options {
        Options::parse_from(std::iter::once("osu_test").chain(args.iter().copied()))
    }

    #[test]
    fn a_result_line_has_osu_widths_and_a_validation_column_only_with_c() {
        assert_eq!(result_line(&options(&[]), 8, 7.319, true), format!("{:<10}{:>20}", 8, "7.32"));
        let c = options(&["-c"]);
        assert_eq!(result_line(&c, 4096, 12.0, true), format!("{:<10}{:>20}{:>20}", 4096, "12.00", "Pass"));
        assert_eq!(result_line(&c, 1, 0.5, false), format!("{:<10}{:>20}{:>20}", 1, "0.50", "Fail"));
    }
}
