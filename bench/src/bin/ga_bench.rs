//! ga_bench: global arrays (`gpulmt-ga`, seed 003's evaluation) beside the raw gpulmt
//! transfer of the same bytes, in the same job.
//!
//! ```text
//! gpulmt-run -n 2 ga_bench [--max 64M] [--host] [--csv FILE]     (n >= 2)
//! ```
//!
//! - **bandwidth**: rank 0 puts and gets sections owned by rank 1 from a local buffer
//!   (device memory; `--host`: host memory), for three section shapes of each size:
//!   `rows` (whole rows of the owner's block: one contiguous copy), `cols64` (64-byte
//!   wide columns) and `cols8` (one element wide), each owner's block one 2-D copy
//!   (`cuMemcpy2D` on CUDA); beside it, `sym_put`/`sym_get` of the same bytes into rank
//!   1's heap (one copy).
//! - **latency**: short messages (`send_msg`/`recv_msg`) ping-pong between ranks 0 and 1,
//!   half the round trip, beside the context's own send/recv of the same bytes and a
//!   one-row put plus its get-back.
//! - **spmv**: y = A x with A a banded sparse matrix (CSR, each rank its block of rows),
//!   x and y global arrays (1 x N, block distribution): each rank gets the range of x its
//!   rows touch, multiplies on the host and puts its part of y; the communication time
//!   beside `sym_get` of the same ranges. Checked against the serial product.
//!
//! Rows on stdout and in `--csv`: `bench,ranks,shape,bytes,ga_us,raw_us,ga_mbps,raw_mbps`.
//! Timings are rank 0's (the other ranks serve and wait at barriers).

use std::time::Instant;

use clap::Parser;
use gpulmt::{Context, Rank};
use gpulmt_bench::append_csv;
use gpulmt_ga::{Dst, ElemType, GlobalArray, Layout, Section, Src};

const HEADER: &str = "bench,ranks,shape,bytes,ga_us,raw_us,ga_mbps,raw_mbps";
/// The user tag of the raw send/recv beside short messages.
const RAW_TAG: i32 = 7;

#[derive(Parser, Debug)]
#[command(name = "ga_bench", version, about = "Global arrays beside raw gpulmt transfers")]
struct Options {
    /// Largest section of the bandwidth runs (bytes; K/M suffixes).
    #[arg(long, default_value = "64M", value_parser = size_arg)]
    max: u64,
    /// Local buffers in host memory instead of device memory.
    #[arg(long)]
    host: bool,
    /// Rows of the SpMV matrix.
    #[arg(long, default_value_t = 1 << 20)]
    spmv_rows: usize,
    /// Iterations per point (fewer for large ones).
    #[arg(long, default_value_t = 200)]
    iters: u32,
    /// Append the rows to this CSV file too.
    #[arg(long)]
    csv: Option<String>,
}

fn size_arg(s: &str) -> Result<u64, String> {
    gpulmt::config::parse_size(s).ok_or_else(|| format!("'{s}' is not a size (e.g. 8, 64K, 64M)"))
}

fn die(what: &str, e: impl std::fmt::Display) -> ! {
    eprintln!("ga_bench: {what}: {e}");
    std::process::exit(1)
}

trait OrDie<T> {
    fn or_die(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrDie<T> for Result<T, E> {
    fn or_die(self, what: &str) -> T {
        self.unwrap_or_else(|e| die(what, e))
    }
}

/// One result row.
struct Row<'a> {
    bench: &'a str,
    shape: &'a str,
    bytes: usize,
    ga_us: f64,
    raw_us: f64,
}

fn emit(ctx: &Context, o: &Options, r: Row) {
    if ctx.rank() != 0 {
        return;
    }
    let mbps = |us: f64| if us > 0.0 { r.bytes as f64 / us } else { 0.0 };
    let rec = [
        r.bench.to_string(),
        ctx.size().to_string(),
        r.shape.to_string(),
        r.bytes.to_string(),
        format!("{:.2}", r.ga_us),
        format!("{:.2}", r.raw_us),
        format!("{:.1}", mbps(r.ga_us)),
        format!("{:.1}", mbps(r.raw_us)),
    ];
    println!("{}", rec.join(","));
    if let Some(path) = &o.csv {
        append_csv(path, HEADER, &rec.iter().map(String::as_str).collect::<Vec<_>>());
    }
}

/// Microseconds per call of `f`, over `iters` calls after one warm-up.
fn time(iters: u32, mut f: impl FnMut()) -> f64 {
    f();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / iters as f64
}

/// A local buffer of `bytes`: device memory of this rank, or host memory with `--host`.
struct Local {
    addr: usize,
    _host: Vec<u8>,
}

impl Local {
    fn new(ctx: &mut Context, o: &Options, bytes: usize) -> Local {
        if o.host {
            let mut v = vec![1u8; bytes];
            Local { addr: v.as_mut_ptr() as usize, _host: v }
        } else {
            Local { addr: ctx.mem_alloc(bytes).or_die("mem_alloc of the local buffer"), _host: Vec::new() }
        }
    }
}

fn main() {
    gpulmt::logging::init("warn");
    let o = Options::parse();
    let mut ctx = Context::init().or_die("Context::init");
    if ctx.size() < 2 {
        die("setup", "run it with at least 2 ranks (gpulmt-run -n 2 ga_bench)");
    }
    if ctx.rank() == 0 {
        println!("{HEADER}");
    }
    bandwidth(&mut ctx, &o);
    latency(&mut ctx, &o);
    spmv(&mut ctx, &o);
    ctx.finalize().or_die("finalize");
}

/// Put and get bandwidth against section shape, beside sym_put/sym_get of the same bytes.
fn bandwidth(ctx: &mut Context, o: &Options) {
    let max = o.max as usize;
    // Rank 1's block: 1024 doubles wide (the grid splits rows first: rows >= cols), deep
    // enough for `max` bytes in whole rows and for the narrow columns' row counts.
    let n = ctx.size() as usize;
    let cols = 1024usize;
    let rows_per_rank = (max / (8 * cols)).max(4096);
    let dims = [rows_per_rank * n, cols];
    let mut a = GlobalArray::create(ctx, ElemType::F64, dims, Layout::Grid { grid: [n, 1], block: None })
        .or_die("create the bandwidth array");
    let block = a.distribution(1).or_die("distribution")[0];
    let raw = ctx.sym_alloc(max).or_die("sym_alloc of the raw target");
    let local = Local::new(ctx, o, max);
    let me = ctx.rank();
    let mut bytes = 8usize;
    while bytes <= max {
        for (shape, width) in [("rows", cols), ("cols64", 8), ("cols8", 1)] {
            let elems = bytes / 8;
            let (h, w) =
                if width == cols { (elems.div_ceil(cols), elems.min(cols)) } else { (elems / width, width.min(elems)) };
            if h == 0 || h > block.rows() || (width < cols && bytes < 8 * width) {
                continue;
            }
            let s = Section::new(block.lo, [block.lo[0] + h, block.lo[1] + w]);
            let moved = 8 * s.len();
            // Fewer iterations for large sections and for many rows (each row a packet
            // off-node; on the engine a 2-D copy's time grows with its rows too).
            let iters =
                (o.iters as usize).min((256 << 20) / moved).min(20_000 / h).clamp(3, o.iters.max(3) as usize) as u32;
            if me == 0 {
                // SAFETY: `local` holds `max` >= moved bytes, used by nothing else meanwhile.
                let src = unsafe { Src::raw(local.addr as *const f64, moved / 8) };
                let put = time(iters, || a.put(ctx, s, src, w).or_die("put"));
                let raw_put = time(iters, || {
                    // SAFETY: `local` holds at least `moved` readable bytes.
                    unsafe { ctx.sym_put(raw.addr(), local.addr as *const u8, moved, 1) }.or_die("sym_put")
                });
                emit(ctx, o, Row { bench: "put", shape, bytes: moved, ga_us: put, raw_us: raw_put });
                let get = time(iters, || {
                    // SAFETY: as above; the get writes the local buffer, nothing reads it.
                    let dst = unsafe { Dst::raw(local.addr as *mut f64, moved / 8) };
                    a.get(ctx, s, dst, w).or_die("get")
                });
                let raw_get = time(iters, || {
                    // SAFETY: `local` holds at least `moved` bytes, written by nothing else.
                    unsafe { ctx.sym_get(local.addr as *mut u8, raw.addr(), moved, 1) }.or_die("sym_get")
                });
                emit(ctx, o, Row { bench: "get", shape, bytes: moved, ga_us: get, raw_us: raw_get });
            }
        }
        bytes *= 4;
    }
    ctx.barrier().or_die("barrier");
    a.destroy(ctx).or_die("destroy");
    ctx.sym_free(raw).or_die("sym_free");
}

/// Short-message latency between ranks 0 and 1, beside raw send/recv and a put + get.
fn latency(ctx: &mut Context, o: &Options) {
    let me = ctx.rank();
    let mut a = GlobalArray::create(ctx, ElemType::I64, [2, 512], Layout::Block).or_die("create the latency array");
    let mut buf = vec![0u8; 4096];
    let iters = o.iters.max(10) * 5;
    for bytes in [8usize, 64, 512, 4096] {
        let peer: Rank = 1 - me.min(1);
        let pingpong = |ctx: &mut Context, buf: &mut Vec<u8>, raw: bool| {
            let data = vec![3u8; bytes];
            if raw {
                if me == 0 {
                    ctx.send(&data, peer, RAW_TAG).or_die("send");
                    ctx.recv(&mut buf[..bytes], Some(peer), Some(RAW_TAG)).or_die("recv");
                } else {
                    ctx.recv(&mut buf[..bytes], Some(peer), Some(RAW_TAG)).or_die("recv");
                    ctx.send(&data, peer, RAW_TAG).or_die("send");
                }
            } else if me == 0 {
                gpulmt_ga::send_msg(ctx, peer, &data).or_die("send_msg");
                gpulmt_ga::recv_msg(ctx, Some(peer), buf).or_die("recv_msg");
            } else {
                gpulmt_ga::recv_msg(ctx, Some(peer), buf).or_die("recv_msg");
                gpulmt_ga::send_msg(ctx, peer, &data).or_die("send_msg");
            }
        };
        if me <= 1 {
            let msg = time(iters, || pingpong(ctx, &mut buf, false)) / 2.0;
            let raw = time(iters, || pingpong(ctx, &mut buf, true)) / 2.0;
            emit(ctx, o, Row { bench: "msg_latency", shape: "pingpong", bytes, ga_us: msg, raw_us: raw });
        }
        if me == 0 {
            // A put of the same bytes into rank 1's row and its get back: what a short
            // message saves over going through an array.
            let row = Section::new([1, 0], [2, bytes / 8]);
            let v = vec![5i64; bytes / 8];
            let mut back = vec![0i64; bytes / 8];
            let put_get = time(iters, || {
                a.put(ctx, row, &v, bytes / 8).or_die("put");
                a.get(ctx, row, &mut back, bytes / 8).or_die("get");
            }) / 2.0;
            emit(ctx, o, Row { bench: "put_latency", shape: "row", bytes, ga_us: put_get, raw_us: 0.0 });
        }
        ctx.barrier().or_die("barrier");
    }
    a.destroy(ctx).or_die("destroy");
}

/// The banded matrix: row i has entries at columns i + d for d in -BAND..=BAND (inside
/// the matrix), values from the indices.
const BAND: i64 = 8;
fn entry(i: usize, j: usize) -> f64 {
    ((i * 7 + j * 3) % 11) as f64 - 5.0
}
fn x_at(j: usize) -> f64 {
    (j % 13) as f64 * 0.5
}

/// Distributed SpMV over global arrays, beside sym_get of the same ranges of x.
fn spmv(ctx: &mut Context, o: &Options) {
    let (me, n) = (ctx.rank(), ctx.size() as usize);
    let rows = o.spmv_rows.max(n * 64);
    let dims = [1, rows];
    let mut x = GlobalArray::create(ctx, ElemType::F64, dims, Layout::Block).or_die("create x");
    let mut y = GlobalArray::create(ctx, ElemType::F64, dims, Layout::Block).or_die("create y");
    let mine = x.distribution(me).or_die("distribution")[0];
    let (r0, r1) = (mine.lo[1], mine.hi[1]);
    // Each rank fills its block of x.
    let xs: Vec<f64> = (r0..r1).map(x_at).collect();
    x.put(ctx, mine, &xs, xs.len()).or_die("put x");
    x.sync(ctx).or_die("sync x");
    // The local rows in CSR.
    let (mut ptr, mut col, mut val) = (vec![0usize], Vec::new(), Vec::new());
    for i in r0..r1 {
        for d in -BAND..=BAND {
            let j = i as i64 + d;
            if j >= 0 && (j as usize) < rows {
                col.push(j as usize);
                val.push(entry(i, j as usize));
            }
        }
        ptr.push(col.len());
    }
    // The range of x the rows touch.
    let lo = r0.saturating_sub(BAND as usize);
    let hi = (r1 + BAND as usize).min(rows);
    let need = Section::new([0, lo], [1, hi]);
    let mut xr = vec![0f64; hi - lo];
    let iters = 20;
    let t = Instant::now();
    for _ in 0..iters {
        x.get(ctx, need, &mut xr, hi - lo).or_die("get x range");
    }
    let comm = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let t = Instant::now();
    let mut yl = vec![0f64; r1 - r0];
    for _ in 0..iters {
        for (k, yv) in yl.iter_mut().enumerate() {
            *yv = (ptr[k]..ptr[k + 1]).map(|e| val[e] * xr[col[e] - lo]).sum();
        }
    }
    let compute = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    y.put(ctx, mine, &yl, yl.len()).or_die("put y");
    y.sync(ctx).or_die("sync y");
    // Raw: the same ranges of x, by sym_get from each owner's local block.
    let (xaddr, _) = x.local().or_die("local");
    let owners = x.locate(need).or_die("locate");
    let t = Instant::now();
    for _ in 0..iters {
        let mut at = 0;
        for (r, s) in &owners {
            let off = s.lo[1] - x.distribution(*r).or_die("distribution")[0].lo[1];
            // SAFETY: `xr` holds hi - lo doubles; the owners' parts cover need once.
            unsafe { ctx.sym_get(xr.as_mut_ptr().add(at) as *mut u8, xaddr + 8 * off, 8 * s.cols(), *r) }
                .or_die("sym_get");
            at += s.cols();
        }
    }
    let raw = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    emit(ctx, o, Row { bench: "spmv_comm", shape: "x_range", bytes: 8 * xr.len(), ga_us: comm, raw_us: raw });
    emit(ctx, o, Row { bench: "spmv_compute", shape: "host", bytes: 8 * val.len(), ga_us: compute, raw_us: 0.0 });
    // Check y against the serial product, on a sample of rows (rank 0).
    if me == 0 {
        let mut yall = vec![0f64; rows];
        y.get(ctx, Section::whole(dims), &mut yall, rows).or_die("get y");
        for i in (0..rows).step_by((rows / 4096).max(1)) {
            let want: f64 = (-BAND..=BAND)
                .map(|d| i as i64 + d)
                .filter(|&j| j >= 0 && (j as usize) < rows)
                .map(|j| entry(i, j as usize) * x_at(j as usize))
                .sum();
            if yall[i] != want {
                die("spmv check", format!("y[{i}] = {}, the serial product gives {want}", yall[i]));
            }
        }
        println!("# spmv: y checked against the serial product");
    }
    y.sync(ctx).or_die("sync");
    x.destroy(ctx).or_die("destroy x");
    y.destroy(ctx).or_die("destroy y");
}
