//! The SpTS program: options, the timed solves, the check and the report.
//!
//! A run makes `--warmup` untimed solves, then `--iters` timed ones; each solve starts
//! after a barrier and ends when this rank's part is done, timed on each rank's clock.
//! The result is the slowest rank's mean time per solve.

use std::time::Instant;

use clap::{Parser, ValueEnum};
use gpulmt::device::BackendKind;
use gpulmt::{Context, SymPtr, Tag};

use super::gio::{CudaGio, HostGio};
use super::interk::{CpuLevels, CudaLevels, InterK};
use super::matrix::{self, Csr, Shape};
use super::plan::{Dist, RankPlan};
use super::{cuda, Result, Solver, SptsError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One persistent kernel per rank, sync-free, values put with their flags
    /// (GPU-initiated, seed 000's intra-kernel mode).
    Gio,
    /// A kernel per dependency level, the host exchanging values between levels.
    InterK,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Gio => "gio",
            Mode::InterK => "inter-k",
        }
    }
}

impl SptsOptions {
    /// The mode as the report and the CSV name it: `gio-unbatched` with `--unbatched`.
    pub fn mode_label(&self) -> &'static str {
        match (self.mode, self.unbatched) {
            (Mode::Gio, true) => "gio-unbatched",
            (m, _) => m.name(),
        }
    }
}

/// SpTS: a distributed sparse lower-triangular solve L x = b over gpulmt's symmetric heap.
///
/// Run: `gpulmt-run -n 4 target/release/spts --n 200000 --mode gio --check`.
#[derive(Parser, Debug, Clone)]
#[command(name = "spts", version)]
pub struct SptsOptions {
    /// Rows of the synthetic matrix.
    #[arg(long, default_value_t = 100_000)]
    pub n: usize,
    /// Off-diagonal entries per row (synthetic).
    #[arg(long, default_value_t = 4)]
    pub offdiag: usize,
    /// Near entries lie within this many columns left of the diagonal (synthetic).
    #[arg(long, default_value_t = 32)]
    pub band: usize,
    /// Of every 8 off-diagonal entries, how many are long-range (synthetic).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub far_eighths: u32,
    /// Seed of the matrix's structure and values and of b.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Read the sparsity pattern from this MatrixMarket file (its lower triangle; values
    /// from the seed) instead of generating one.
    #[arg(long)]
    pub mtx: Option<String>,
    /// Deal rows in blocks of this many round-robin (block-cyclic; default: one
    /// contiguous block per rank).
    #[arg(long)]
    pub cyclic: Option<usize>,
    #[arg(long, value_enum, default_value_t = Mode::Gio)]
    pub mode: Mode,
    /// gio: every remote value as its own put_signal, to other nodes too (default: to a
    /// rank of another node, a stream of batches in row order).
    #[arg(long)]
    pub unbatched: bool,
    /// Timed solves.
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// Untimed solves first.
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Compare every row with the serial CPU reference (bit for bit); exit 1 otherwise.
    #[arg(long)]
    pub check: bool,
    /// Append the row `bench,mode,ranks,n,nnz,levels,time_ms` (rank 0).
    #[arg(long)]
    pub csv: Option<String>,
    /// Compile the CUDA kernels with NVRTC and exit (no job, no GPU needed): 0 compiled,
    /// 1 failed, 2 NVRTC is not installed here.
    #[arg(long)]
    pub compile_only: bool,
    /// Testing the check: add 1 to this rank's first row before the check.
    #[arg(long, hide = true)]
    pub corrupt_rank: Option<u32>,
}

/// The `--csv` header.
pub const CSV_HEADER: &str = "bench,mode,ranks,n,nnz,levels,time_ms";

/// Tag of the ranks' results sent to rank 0.
const RESULT_TAG: Tag = 220;

/// The program: returns the exit status (0; 1 on failure or a failed check; 2 when the
/// options describe a problem that cannot run).
pub fn main() -> i32 {
    let o = SptsOptions::parse();
    if o.compile_only {
        return match cuda::compile_check() {
            Ok(()) => {
                println!("spts: spts_gio and spts_level compiled with NVRTC ({})", cuda::OPTIONS.join(" "));
                0
            }
            Err(e) => {
                eprintln!("spts: {e}");
                if gpulmt::sym::nvrtc::nvrtc_available() {
                    1
                } else {
                    eprintln!("spts: NVRTC is not installed here (add the CUDA toolkit's lib64 to LD_LIBRARY_PATH)");
                    2
                }
            }
        };
    }
    crate::program::run_rank("spts", |ctx| run(ctx, &o))
}

/// The matrix of the options.
pub fn matrix(o: &SptsOptions) -> Result<Csr> {
    match &o.mtx {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| SptsError::Config(format!("cannot read the matrix {path}: {e}")))?;
            Csr::from_matrix_market(&text, o.seed).map_err(|e| SptsError::Config(format!("{path}: {e}")))
        }
        None => Ok(Csr::generate(&Shape {
            n: o.n,
            offdiag: o.offdiag,
            band: o.band,
            far_eighths: o.far_eighths,
            seed: o.seed,
        })),
    }
}

/// What one rank measured and found, sent to rank 0.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct RankResult {
    /// Seconds of the timed solves.
    elapsed: f64,
    rows: u64,
    /// Rows not bit-identical to the reference, the largest relative error, and the first
    /// such row (u64::MAX: none).
    differing: u64,
    max_rel: f64,
    first_bad: u64,
}

impl RankResult {
    fn encode(&self) -> [u8; 40] {
        let mut b = [0u8; 40];
        for (k, w) in [self.elapsed.to_bits(), self.rows, self.differing, self.max_rel.to_bits(), self.first_bad]
            .into_iter()
            .enumerate()
        {
            b[8 * k..8 * k + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8; 40]) -> RankResult {
        let w = |k: usize| u64::from_le_bytes(b[8 * k..8 * k + 8].try_into().expect("8 bytes"));
        RankResult {
            elapsed: f64::from_bits(w(0)),
            rows: w(1),
            differing: w(2),
            max_rel: f64::from_bits(w(3)),
            first_bad: w(4),
        }
    }
}

/// Runs SpTS on this rank; returns whether the check (if any) passed.
pub fn run(ctx: &mut Context, o: &SptsOptions) -> Result<bool> {
    if o.iters == 0 {
        return Err(SptsError::Config("--iters must be at least 1".into()));
    }
    let m = matrix(o)?;
    if m.n == 0 {
        return Err(SptsError::Config("the matrix has no rows".into()));
    }
    let b = matrix::rhs(m.n, o.seed);
    let dist = Dist::new(m.n, ctx.size(), o.cyclic);
    let me = ctx.rank();
    let ranks = ctx.size() as usize;
    // Symmetric: every rank computes the same sizes. The flags first: with the heap in
    // place, which peers' heaps this rank maps is known (the others get gio streams).
    let flags = ctx.sym_alloc(8 * (m.n + ranks))?;
    let heaps = ctx.sym_heaps();
    let off_node = |pe: u32| !o.unbatched && heaps[pe as usize].mapped.is_none();
    let plan = RankPlan::new(&m, &b, dist, me, &off_node);
    let xbuf = ctx.sym_alloc(8 * plan.xbuf_len())?;
    let sigs = ctx.sym_alloc(8 * ranks)?;
    for (p, words) in [(flags, m.n + ranks), (sigs, ranks), (xbuf, plan.xbuf_len())] {
        let zeros = vec![0u64; words];
        // SAFETY: `zeros` holds the allocation's words; the allocation is ours.
        unsafe { ctx.sym_put(p.addr(), zeros.as_ptr().cast(), 8 * words, me)? };
    }
    let mut solver: Box<dyn Solver> = match (o.mode, ctx.backend_kind()) {
        (Mode::Gio, BackendKind::Sim) => Box::new(HostGio { plan: plan.clone(), dist, x: xbuf, flags }),
        (Mode::Gio, BackendKind::Cuda) => Box::new(CudaGio::new(ctx, &plan, xbuf, flags)?),
        (Mode::InterK, kind) => {
            let compute: Box<dyn super::interk::LevelCompute> = match kind {
                BackendKind::Sim => Box::new(CpuLevels { xbuf }),
                BackendKind::Cuda => Box::new(CudaLevels::new(ctx, &plan, xbuf)?),
            };
            Box::new(InterK { plan: plan.clone(), xbuf, sigs, compute })
        }
    };
    // Every rank's flags, signals and x are zero before anyone writes into them.
    ctx.barrier()?;
    let mut elapsed = 0.0;
    for epoch in 1..=(o.warmup + o.iters) as u64 {
        ctx.barrier()?;
        let t0 = Instant::now();
        solver.solve(ctx, epoch)?;
        if epoch > o.warmup as u64 {
            elapsed += t0.elapsed().as_secs_f64();
        }
    }
    ctx.barrier()?;
    let mut mine = RankResult { elapsed, rows: plan.len() as u64, first_bad: u64::MAX, ..RankResult::default() };
    if o.check || o.corrupt_rank.is_some() {
        compare(ctx, o, &m, &b, &plan, xbuf, &mut mine)?;
    }
    let describe = solver.describe();
    solver.release(ctx)?;
    for p in [xbuf, flags, sigs] {
        ctx.sym_free(p)?;
    }
    ctx.mem_free_commit()?;
    conclude(ctx, o, &m, &plan, &describe, mine)
}

/// This rank's rows of x against the serial reference.
fn compare(
    ctx: &mut Context,
    o: &SptsOptions,
    m: &Csr,
    b: &[f64],
    plan: &RankPlan,
    xbuf: SymPtr,
    mine: &mut RankResult,
) -> Result<()> {
    let mut x = vec![0.0f64; m.n];
    // SAFETY: `x` holds n f64s; x is the first n words of our xbuf.
    unsafe { ctx.sym_get(x.as_mut_ptr().cast(), xbuf.addr(), 8 * m.n, ctx.rank())? };
    if o.corrupt_rank == Some(ctx.rank()) {
        if let Some(&i) = plan.rows.first() {
            x[i as usize] += 1.0;
        }
    }
    let want = matrix::reference(m, b);
    for &i in &plan.rows {
        let (got, w) = (x[i as usize], want[i as usize]);
        if got.to_bits() != w.to_bits() {
            mine.differing += 1;
            mine.first_bad = mine.first_bad.min(i as u64);
            let rel = if got.is_finite() { (got - w).abs() / w.abs().max(f64::MIN_POSITIVE) } else { f64::INFINITY };
            mine.max_rel = mine.max_rel.max(rel);
        }
    }
    Ok(())
}

/// Rank 0 gathers every rank's result, prints the report (and the check's line), and
/// writes the CSV row; returns whether the check passed (true without one).
fn conclude(
    ctx: &mut Context,
    o: &SptsOptions,
    m: &Csr,
    plan: &RankPlan,
    describe: &str,
    mine: RankResult,
) -> Result<bool> {
    if ctx.rank() != 0 {
        ctx.send(&mine.encode(), 0, RESULT_TAG)?;
        return Ok(true);
    }
    let mut all = vec![mine];
    for r in 1..ctx.size() {
        let mut buf = [0u8; 40];
        ctx.recv(&mut buf, Some(r), Some(RESULT_TAG))?;
        all.push(RankResult::decode(&buf));
    }
    let time_ms = 1e3 * all.iter().map(|r| r.elapsed).fold(0.0, f64::max) / o.iters as f64;
    let source = o.mtx.as_deref().map_or_else(
        || {
            format!(
                "synthetic (seed {}, {} off-diagonals a row, band {}, {}/8 far)",
                o.seed, o.offdiag, o.band, o.far_eighths
            )
        },
        |p| format!("{p} (values from seed {})", o.seed),
    );
    let dist = o.cyclic.map_or("contiguous blocks".to_string(), |c| format!("block-cyclic, {c} rows a block"));
    let remote = match o.mode {
        Mode::Gio => format!(
            "{} values one by one, {} in streams to other nodes",
            plan.cons.len(),
            plan.streams.iter().map(|s| s.rows.len()).sum::<usize>()
        ),
        Mode::InterK => {
            let chunks = plan.sends.iter().flatten();
            format!("{} values in {} level chunks", chunks.clone().map(|c| c.count).sum::<usize>(), chunks.count())
        }
    };
    println!("# gpulmt SpTS (sparse lower-triangular solve) v{}", env!("CARGO_PKG_VERSION"));
    println!("# backend {}: {describe} | mode {} | {} ranks, {dist}", ctx.backend_kind(), o.mode_label(), ctx.size());
    println!(
        "# matrix {source}: n {} nnz {} levels {} | {} timed solves after {} warm-up",
        m.n,
        m.nnz(),
        plan.levels,
        o.iters,
        o.warmup
    );
    println!("# {:>4} {:>10} {:>14}", "rank", "rows", "time/solve ms");
    for (r, res) in all.iter().enumerate() {
        println!("  {:>4} {:>10} {:>14.3}", r, res.rows, 1e3 * res.elapsed / o.iters as f64);
    }
    println!(
        "summary: mode {} ranks {} n {} nnz {} levels {} time_ms {time_ms:.3} | rank 0 sends {remote} a solve",
        o.mode_label(),
        ctx.size(),
        m.n,
        m.nnz(),
        plan.levels
    );
    if let Some(path) = &o.csv {
        let record = [
            "spts".to_string(),
            o.mode_label().to_string(),
            ctx.size().to_string(),
            m.n.to_string(),
            m.nnz().to_string(),
            plan.levels.to_string(),
            format!("{time_ms:.4}"),
        ];
        crate::append_csv(path, CSV_HEADER, &record.each_ref().map(String::as_str));
    }
    if !(o.check || o.corrupt_rank.is_some()) {
        return Ok(true);
    }
    let differing: u64 = all.iter().map(|r| r.differing).sum();
    let max_rel = all.iter().map(|r| r.max_rel).fold(0.0, f64::max);
    let first = all.iter().map(|r| r.first_bad).min().filter(|&f| f != u64::MAX);
    let passed = differing == 0;
    println!(
        "check: {} {} rows, {differing} not bit-identical to the serial CPU reference (max relative error {max_rel:e}{})",
        if passed { "PASS" } else { "FAIL" },
        m.n,
        first.map(|f| format!(", first at row {f}")).unwrap_or_default()
    );
    Ok(passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_survive_their_bytes() {
        let r = RankResult { elapsed: 0.5, rows: 7, differing: 2, max_rel: 1e-3, first_bad: 9 };
        assert_eq!(RankResult::decode(&r.encode()), r);
    }

    #[test]
    fn options_parse() {
        let o = SptsOptions::try_parse_from(["spts", "--mode", "inter-k", "--cyclic", "64", "--n", "10"]).unwrap();
        assert_eq!((o.mode, o.cyclic, o.n), (Mode::InterK, Some(64), 10));
        assert!(SptsOptions::try_parse_from(["spts", "--far-eighths", "9"]).is_err());
    }
}
