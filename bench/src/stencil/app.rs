//! The Stencil2D program: options, the time loop, the report and the check.
//!
//! The time loop runs `warmup + iters` steps in batches of `halo` steps, one halo
//! exchange per batch; only the last `iters` steps are timed, each rank on its own
//! clock between two barriers. The slowest rank's time per step is the result; the
//! communication share is the time a rank spends in the exchange (posting, packing,
//! staging copies, waiting, unpacking) over its total. In the overlap mode on CUDA
//! the interior kernel runs during that time, so the share then measures
//! communication that overlapped compute, and the gain shows as a shorter step.
//! There the boundary strips, which need the received halos, run on the comm queue
//! right behind the unpacking, beside the interior's tail rather than after it.

use std::fmt::Write as _;
use std::mem::size_of;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use gpulmt::device::BackendKind;
use gpulmt::{Context, Tag};

use super::check::{check, corrupt};
use super::compute::{self, BatchTimes, Mark};
use super::exchange::{Carrier, HaloExchange, NoExchange, PairwiseExchange, ProtocolTally};
use super::grid::{Decomp, ProcGrid, Side};
use super::kernel::{self, Real, Weights};
use super::{Result, StencilError};

/// How halos travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Device -> host copies, messages between host buffers, host -> device copies
    /// (the seed's shared-memory baseline).
    Staged,
    /// After the kernel, messages between device buffers (gpulmt's copy engines).
    InterK,
    /// As inter-k, with the first step's interior computed while the halos move and
    /// its boundary strips after.
    InterKOverlap,
    /// GPU-initiated (seed 000's intra-kernel mode): one persistent kernel puts the halos
    /// into the neighbours' symmetric fields with put_signal and waits for theirs.
    Gio,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Staged => "staged",
            Mode::InterK => "inter-k",
            Mode::InterKOverlap => "inter-k-overlap",
            Mode::Gio => "gio",
        }
    }

    /// Whether compute runs between the start and the end of an exchange.
    pub fn overlaps(self) -> bool {
        self == Mode::InterKOverlap
    }

    /// The exchange of this mode for the block `d`.
    fn exchange<T: Real>(self, ctx: &mut Context, d: &Decomp) -> Result<Box<dyn HaloExchange<T>>> {
        let carrier = match self {
            Mode::Staged => Carrier::HostStaged,
            Mode::InterK | Mode::InterKOverlap => Carrier::Device,
            Mode::Gio => unreachable!("the gio mode runs its own loop (stencil::gio)"),
        };
        Ok(Box::new(PairwiseExchange::<T>::new(ctx, d, carrier)?))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Precision {
    Single,
    Double,
}

/// Stencil2D (SHOC's 9-point stencil) with halo exchange over gpulmt.
///
/// Run: `gpulmt-run -n 4 target/release/stencil2d --size 4096 --halo 1 --mode inter-k`.
#[derive(Parser, Debug, Clone)]
#[command(name = "stencil2d", version)]
pub struct StencilOptions {
    /// Interior points per rank, N x N (weak scaling).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Global interior N x N split over the ranks instead (strong scaling).
    #[arg(long, conflicts_with = "size")]
    pub global: Option<usize>,
    #[arg(long, value_enum, default_value_t = Precision::Single)]
    pub precision: Precision,
    /// Ghost layers = steps between halo exchanges.
    #[arg(long, default_value_t = 1)]
    pub halo: usize,
    /// Timed steps.
    #[arg(long, default_value_t = 1000)]
    pub iters: usize,
    /// Untimed steps first, rounded up to whole exchanges (default: two exchanges' worth,
    /// which warms the kernels and opens the peer mappings of both arrays: with an odd
    /// halo width the exchanges alternate between them, and a mapping's first open costs
    /// about 1 ms on H200, 2.5 us a step over 400 steps).
    #[arg(long)]
    pub warmup: Option<usize>,
    #[arg(long, value_enum, default_value_t = Mode::InterK)]
    pub mode: Mode,
    /// Process grid ROWSxCOLS (default: as square as the rank count allows, rows >= cols).
    #[arg(long, value_parser = ProcGrid::parse)]
    pub grid: Option<ProcGrid>,
    #[arg(long, default_value_t = 0.25)]
    pub weight_center: f64,
    #[arg(long, default_value_t = 0.15)]
    pub weight_cardinal: f64,
    #[arg(long, default_value_t = 0.05)]
    pub weight_diagonal: f64,
    /// Compare with the single-rank CPU reference; exit 1 above the tolerance.
    #[arg(long)]
    pub check: bool,
    /// CUDA: let NVRTC contract multiply-adds into FMAs. Faster arithmetic, but the
    /// results are no longer bit-identical to the CPU: --check then allows a relative
    /// error of 4 unit roundoffs per step.
    #[arg(long)]
    pub fmad: bool,
    /// gio mode on CUDA: blocks of 256 threads per SM that the persistent kernel's
    /// registers must allow (its launch bounds). More blocks hide the compute steps'
    /// memory latency; fewer leave the halo puts registers instead of spills. On one
    /// H200 under MPS, 8 (32 registers) ran 1.7-2.2x faster than the compiler's choice
    /// (82 registers, 2 blocks an SM), 6 within 3 % of 8.
    #[arg(long, default_value_t = 8)]
    pub gio_min_blocks: u32,
    /// Append rows `bench,mode,precision,ranks,size,halo,metric,value`.
    #[arg(long)]
    pub csv: Option<String>,
    /// Force a rendezvous protocol (sets GPULMT_PROTOCOL): auto, get, put, coop, shm.
    #[arg(long)]
    pub protocol: Option<String>,
    /// CUDA diagnostics: time each batch on the device (when the first step's kernel,
    /// the exchange's comm-queue work and the batch end, and the idle gap between
    /// batches) and report the means. The events cost a little time of their own.
    #[arg(long)]
    pub timeline: bool,
    /// Diagnostics: skip the halo exchange (ghost cells keep stale values, so --check
    /// cannot pass), to time a mode's compute structure alone with any rank count.
    #[arg(long, hide = true, conflicts_with = "check")]
    pub no_exchange: bool,
    /// Diagnostics: print each rank's distribution of host-side batch intervals and exchange
    /// times (percentiles), to tell a steady slowdown of the device from occasional stalls.
    #[arg(long, hide = true)]
    pub host_intervals: bool,
    /// Testing the check: add 1 to one interior value of this rank before the check.
    #[arg(long, hide = true)]
    pub corrupt_rank: Option<u32>,
}

/// Tags of the report messages, apart from the halo tags (the check's: `super::check`).
const REPORT_LEN_TAG: Tag = 200;
const REPORT_TAG: Tag = 201;

/// Floating-point operations per point and step, counted as SHOC does for the
/// 9-point stencil: 3 multiplications and 8 additions.
const FLOPS_PER_POINT: f64 = 11.0;

/// The program: returns the exit status (0; 1 on failure or a failed check; 2 when
/// the options describe a problem that cannot run).
pub fn main() -> i32 {
    let o = StencilOptions::parse();
    if let Some(p) = &o.protocol {
        // SAFETY: called at start-up, before any thread exists.
        unsafe { std::env::set_var("GPULMT_PROTOCOL", p) };
    }
    // Under mpirun (built with the `mpi` feature) the job comes from MPI, so that it can
    // span (pseudo-)nodes: GPULMT_PSEUDO_NODES=2 puts neighbours on other nodes.
    crate::program::run_rank("stencil2d", |ctx| match o.precision {
        Precision::Single => run::<f32>(ctx, &o),
        Precision::Double => run::<f64>(ctx, &o),
    })
}

/// What one rank measured and saw, sent to rank 0 for the report.
#[derive(Clone, Debug, PartialEq)]
struct RankReport {
    device: u32,
    elapsed: f64,
    exchange: f64,
    exchanges: u64,
    /// Peer mappings opened during the timed steps (the warm-up should have opened all).
    timed_opens: u64,
    tally: ProtocolTally,
}

impl RankReport {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.device,
            self.elapsed,
            self.exchange,
            self.exchanges,
            self.timed_opens,
            self.tally.encode()
        )
    }

    fn decode(s: &str) -> Option<RankReport> {
        let mut f = s.splitn(6, ' ');
        Some(RankReport {
            device: f.next()?.parse().ok()?,
            elapsed: f.next()?.parse().ok()?,
            exchange: f.next()?.parse().ok()?,
            exchanges: f.next()?.parse().ok()?,
            timed_opens: f.next()?.parse().ok()?,
            tally: ProtocolTally::decode(f.next().unwrap_or(""))?,
        })
    }
}

/// Runs the benchmark on this rank; returns whether the check (if any) passed.
pub fn run<T: Real>(ctx: &mut Context, o: &StencilOptions) -> Result<bool> {
    let grid = o.grid.unwrap_or_else(|| ProcGrid::squarest(ctx.size()));
    if grid.size() != ctx.size() {
        return Err(StencilError::Config(format!(
            "the {grid} grid needs {} ranks, the job has {}",
            grid.size(),
            ctx.size()
        )));
    }
    if o.iters == 0 {
        return Err(StencilError::Config("--iters must be at least 1".into()));
    }
    let global = match o.global {
        Some(n) => (n, n),
        None => (grid.rows as usize * o.size, grid.cols as usize * o.size),
    };
    let d = Decomp::new(grid, ctx.rank(), global, o.halo).map_err(StencilError::Config)?;
    let weights = Weights::<T>::new(o.weight_center, o.weight_cardinal, o.weight_diagonal);
    if o.mode == Mode::Gio {
        return run_gio(ctx, o, &d, weights);
    }
    let mut dev = compute::for_context::<T>(ctx, weights, o.fmad)?;
    let dev = dev.as_mut();

    let bytes = d.len() * size_of::<T>();
    let fields = [ctx.mem_alloc(bytes)?, ctx.mem_alloc(bytes)?];
    // Both arrays start alike: the fixed boundary must be in each.
    let init = kernel::initial_field::<T>(&d);
    for f in fields {
        // SAFETY: `f` is an allocation of `bytes` from mem_alloc; `init` holds `d.len()` values.
        unsafe { ctx.copy_sync(f, init.as_ptr() as usize, bytes)? };
    }
    drop(init);
    let mut ex: Box<dyn HaloExchange<T>> =
        if o.no_exchange { Box::new(NoExchange::default()) } else { o.mode.exchange::<T>(ctx, &d)? };

    let h = d.halo;
    // Whole batches, so that the timed part starts with an exchange.
    let warmup = o.warmup.unwrap_or(2 * h).next_multiple_of(h);
    let steps = warmup + o.iters;
    let (pitch, inner, strips) = (d.pitch(), d.inner_region(), d.boundary_strips());
    let mut cur = 0;
    let mut step = 0;
    let mut t0 = Instant::now();
    let mut in_exchange = Duration::ZERO;
    let mut exchanges = 0u64;
    let timeline = o.timeline && dev.enable_timeline(steps.div_ceil(h))?;
    let mut warm_batches = 0;
    // Whether this rank sends halos (not without neighbours, nor with --no-exchange).
    let sends = !o.no_exchange && Side::ALL.iter().any(|s| d.neighbour(*s).is_some());
    let mut compute_wrote_edges = false;
    let mut opens_before_timing = 0;
    // --host-intervals: per timed batch, when it ended on the host and how long its exchange took.
    let mut batch_ends: Vec<Instant> = Vec::new();
    let mut exchange_us: Vec<f64> = Vec::new();
    while step < steps {
        if step == warmup {
            dev.sync_compute()?;
            ctx.barrier()?;
            t0 = Instant::now();
            opens_before_timing = ctx.stats().cache.opens;
            in_exchange = Duration::ZERO;
            exchanges = 0;
            warm_batches = step / h;
        }
        let batch = h.min(steps - step);
        // --host-intervals samples the timed batches.
        let sampled = o.host_intervals && step >= warmup;
        let (src, dst) = (fields[cur], fields[1 - cur]);
        dev.mark(Mark::Start)?;
        if o.mode.overlaps() {
            // Everything queued on the compute queue so far (the previous batch included):
            // the boundary below reads what it wrote and overwrites what it read.
            dev.compute_checkpoint()?;
            // The interior is queued first, so the device computes while the host posts
            // the exchange (posting first left it idle for the posting, several us a step).
            // The interior reads none of the ghost layers the receives write.
            dev.stencil(src, dst, pitch, inner)?;
            dev.mark(Mark::Kernel)?;
            if compute_wrote_edges {
                // The sends read edges the previous batch's later steps wrote on the compute
                // queue: wait for them on the host, with this interior already queued behind
                // them, so the device goes on computing.
                dev.wait_checkpoint()?;
            }
            let t = Instant::now();
            ex.start(ctx, dev, src)?;
            ex.finish_on_comm(ctx, dev, src)?;
            note_exchange(t.elapsed(), &mut in_exchange, sampled.then_some(&mut exchange_us));
            // Behind the unpacking on the comm queue, beside the interior: the step
            // then ends with the interior when the exchange was shorter.
            dev.comm_after_checkpoint()?;
            dev.stencil_on_comm(src, dst, pitch, &strips)?;
            dev.mark(Mark::Comm)?;
            // What follows (this batch's later steps, the next interior and exchange) reads
            // the boundary: the host waits for the comm queue while the interior still runs,
            // rather than making the compute queue wait for it (that cost device time at each
            // step's end on 2x H200).
            dev.sync_comm()?;
        } else {
            let t = Instant::now();
            ex.start(ctx, dev, src)?;
            ex.finish(ctx, dev, src)?;
            note_exchange(t.elapsed(), &mut in_exchange, sampled.then_some(&mut exchange_us));
            dev.mark(Mark::Comm)?;
            dev.stencil(src, dst, pitch, d.step_region(0))?;
            dev.mark(Mark::Kernel)?;
        }
        cur = 1 - cur;
        for k in 1..batch {
            dev.stencil(fields[cur], fields[1 - cur], pitch, d.step_region(k))?;
            cur = 1 - cur;
        }
        dev.mark(Mark::End)?;
        // The next exchange sends what this batch wrote, through copy engines that do not
        // wait for the compute queue, so the host must know it is done. Not here, where the
        // device would then idle until the host queues more: a rank that sends nothing
        // does not wait at all, and the overlap mode waits at the next batch, behind its
        // interior (one-step batches not even there: their sent edges are the boundary,
        // which the comm queue computed and the host already waited for).
        compute_wrote_edges = batch > 1;
        if sends && !o.mode.overlaps() {
            dev.sync_compute()?;
        }
        dev.end_batch();
        exchanges += 1;
        if sampled {
            batch_ends.push(Instant::now());
        }
        step += batch;
    }
    dev.sync_compute()?;
    dev.sync_comm()?;
    let elapsed = t0.elapsed();

    let mine = RankReport {
        device: ctx.device(),
        elapsed: elapsed.as_secs_f64(),
        exchange: in_exchange.as_secs_f64(),
        exchanges,
        timed_opens: ctx.stats().cache.opens - opens_before_timing,
        tally: ex.tally().clone(),
    };
    if o.host_intervals {
        let intervals: Vec<f64> = batch_ends.windows(2).map(|w| (w[1] - w[0]).as_secs_f64() * 1e6).collect();
        println!(
            "host intervals: rank {} {} over {} batches, us: batch {}; exchange {}",
            ctx.rank(),
            o.mode.name(),
            intervals.len(),
            percentiles(intervals),
            percentiles(exchange_us)
        );
    }
    if timeline {
        let mut times = TimelineSums::default();
        dev.timeline(warm_batches)?.iter().for_each(|b| times.add(b));
        println!("{}", times.line(ctx.rank(), o.mode));
    }
    let passed = conclude::<T>(ctx, o, &d, &weights, dev.describe(), (warmup, steps), &mine, fields[cur])?;

    ctx.mem_free(fields[0])?;
    ctx.mem_free(fields[1])?;
    ex.release(ctx)?;
    ctx.mem_free_commit()?;
    Ok(passed)
}

/// The end of a run on every rank: rank 0 prints the report (and CSV rows) from every
/// rank's `mine`, and with `--check` the gathered `field` is compared with the CPU
/// reference after `steps` steps (`warmup` of them untimed). Returns whether the check
/// passed (true without one).
#[allow(clippy::too_many_arguments)]
fn conclude<T: Real>(
    ctx: &mut Context,
    o: &StencilOptions,
    d: &Decomp,
    weights: &Weights<T>,
    compute: String,
    (warmup, steps): (usize, usize),
    mine: &RankReport,
    field: usize,
) -> Result<bool> {
    let reports = gather_reports(ctx, mine)?;
    let setup = Setup {
        o,
        d,
        ranks: ctx.size(),
        backend: ctx.backend_kind(),
        compute,
        warmup,
        precision: T::NAME,
        elem_bytes: size_of::<T>(),
    };
    if let Some(reports) = &reports {
        print!("{}", setup.report(reports));
        setup.csv(reports);
    }

    let mut passed = true;
    if o.check || o.corrupt_rank.is_some() {
        if o.corrupt_rank == Some(ctx.rank()) {
            corrupt::<T>(ctx, d, field)?;
        }
        if let Some(err) = check::<T>(ctx, d, field, weights, steps)? {
            let tolerance = setup.tolerance::<T>(steps);
            passed = err.max_rel <= tolerance.0;
            println!(
                "check: {} max relative error {:e} over {} points, {} not bit-identical{} vs the single-rank CPU reference \
                 (tolerance {:e}: {})",
                if passed { "PASS" } else { "FAIL" },
                err.max_rel,
                err.points,
                err.differing,
                err.worst.map(|(i, j)| format!(", worst at ({i},{j})")).unwrap_or_default(),
                tolerance.0,
                tolerance.1
            );
            setup.csv_row("check_max_rel_err", err.max_rel);
        }
    }

    Ok(passed)
}

/// A run in `gio` mode ([`super::gio`]): its own loop, then the same report and check.
fn run_gio<T: Real>(ctx: &mut Context, o: &StencilOptions, d: &Decomp, weights: Weights<T>) -> Result<bool> {
    if o.no_exchange || o.timeline || o.host_intervals {
        return Err(StencilError::Config(
            "--no-exchange, --timeline and --host-intervals do not apply to --mode gio (one kernel runs every step)"
                .into(),
        ));
    }
    let h = d.halo;
    let warmup = o.warmup.unwrap_or(2 * h).next_multiple_of(h);
    let g = super::gio::run::<T>(
        ctx,
        d,
        weights,
        warmup,
        o.iters,
        super::gio::GioBuild { fmad: o.fmad, min_blocks: o.gio_min_blocks },
    )?;
    let mut tally = ProtocolTally::default();
    for side in Side::ALL.into_iter().filter(|s| d.neighbour(*s).is_some()) {
        tally.count(side, "gio", (warmup / h) as u64 + g.exchanges);
    }
    let mine = RankReport {
        device: ctx.device(),
        elapsed: g.elapsed,
        exchange: g.exchange,
        exchanges: g.exchanges,
        timed_opens: 0,
        tally,
    };
    let passed = conclude::<T>(ctx, o, d, &weights, g.compute.clone(), (warmup, warmup + o.iters), &mine, g.field)?;
    g.release(ctx)?;
    ctx.mem_free_commit()?;
    Ok(passed)
}

/// Adds one exchange's time to the total, and to `samples` (microseconds, for
/// `--host-intervals`) when given.
fn note_exchange(took: Duration, total: &mut Duration, samples: Option<&mut Vec<f64>>) {
    *total += took;
    if let Some(v) = samples {
        v.push(took.as_secs_f64() * 1e6);
    }
}

/// `mean m, p10 .. p50 .. p90 .. p99 .. max` of `v` (for `--host-intervals`).
fn percentiles(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    format!(
        "mean {mean:.2} p10 {:.2} p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}",
        at(0.1),
        at(0.5),
        at(0.9),
        at(0.99),
        v[v.len() - 1]
    )
}

/// Means of the `--timeline` marks over the timed batches.
#[derive(Default)]
struct TimelineSums {
    batches: u64,
    kernel: f64,
    comm: f64,
    end: f64,
    gaps: u64,
    gap: f64,
}

impl TimelineSums {
    fn add(&mut self, b: &BatchTimes) {
        self.batches += 1;
        self.kernel += b.kernel;
        self.comm += b.comm;
        self.end += b.end;
        if let Some(g) = b.gap {
            self.gaps += 1;
            self.gap += g;
        }
    }

    fn line(&self, rank: u32, mode: Mode) -> String {
        let n = self.batches.max(1) as f64;
        format!(
            "timeline: rank {rank} {} over {} batches, us after the batch's start on the GPU: first kernel ends {:.2}, \
             comm queue done {:.2}, batch ends {:.2}; idle between batches {:.2}",
            mode.name(),
            self.batches,
            self.kernel / n,
            self.comm / n,
            self.end / n,
            self.gap / self.gaps.max(1) as f64
        )
    }
}

/// Rank 0 gets every rank's report (in rank order); the others get None.
fn gather_reports(ctx: &mut Context, mine: &RankReport) -> Result<Option<Vec<RankReport>>> {
    let text = mine.encode();
    if ctx.rank() != 0 {
        ctx.send(&(text.len() as u64).to_le_bytes(), 0, REPORT_LEN_TAG)?;
        ctx.send(text.as_bytes(), 0, REPORT_TAG)?;
        return Ok(None);
    }
    let mut all = vec![mine.clone()];
    for r in 1..ctx.size() {
        let mut len = [0u8; 8];
        ctx.recv(&mut len, Some(r), Some(REPORT_LEN_TAG))?;
        let mut buf = vec![0u8; u64::from_le_bytes(len) as usize];
        ctx.recv(&mut buf, Some(r), Some(REPORT_TAG))?;
        let report = std::str::from_utf8(&buf).ok().and_then(RankReport::decode);
        all.push(report.ok_or_else(|| StencilError::Protocol(format!("rank {r} sent an unreadable report")))?);
    }
    Ok(Some(all))
}

/// The run's parameters, for the report.
struct Setup<'a> {
    o: &'a StencilOptions,
    d: &'a Decomp,
    ranks: u32,
    backend: BackendKind,
    compute: String,
    warmup: usize,
    precision: &'static str,
    elem_bytes: usize,
}

impl Setup<'_> {
    fn bench(&self) -> &'static str {
        if self.o.global.is_some() {
            "stencil2d-strong"
        } else {
            "stencil2d"
        }
    }

    /// The CSV `size` column: points per rank side (weak) or global side (strong).
    fn size(&self) -> usize {
        self.o.global.unwrap_or(self.o.size)
    }

    /// The slowest rank's time per timed step, in seconds.
    fn step_time(&self, reports: &[RankReport]) -> f64 {
        reports.iter().map(|r| r.elapsed).fold(0.0, f64::max) / self.o.iters as f64
    }

    /// Mean and largest communication share over the ranks, in percent.
    fn comm_share(reports: &[RankReport]) -> (f64, f64) {
        let shares: Vec<f64> = reports.iter().map(|r| 100.0 * r.exchange / r.elapsed.max(f64::MIN_POSITIVE)).collect();
        (shares.iter().sum::<f64>() / shares.len() as f64, shares.iter().copied().fold(0.0, f64::max))
    }

    fn gflops(&self, reports: &[RankReport]) -> f64 {
        let points = (self.d.global.0 * self.d.global.1) as f64;
        FLOPS_PER_POINT * points / self.step_time(reports) / 1e9
    }

    /// Halo receives per protocol label over all ranks and sides.
    fn protocol_totals(reports: &[RankReport]) -> Vec<(String, u64)> {
        let mut totals = std::collections::BTreeMap::<String, u64>::new();
        for r in reports {
            for side in Side::ALL {
                for (p, n) in r.tally.side(side) {
                    *totals.entry(p.clone()).or_default() += n;
                }
            }
        }
        totals.into_iter().collect()
    }

    /// The allowed relative error and why.
    fn tolerance<T: Real>(&self, steps: usize) -> (f64, &'static str) {
        if self.backend == BackendKind::Cuda && self.o.fmad {
            // Each step rounds a contracted multiply-add once instead of twice per
            // term; the differences add up at most linearly over the steps.
            (
                4.0 * T::EPSILON * steps as f64,
                "FMA contraction (--fmad) rounds differently from the CPU, 4 unit roundoffs per step",
            )
        } else if self.backend == BackendKind::Cuda {
            (0.0, "bit-identical: NVRTC --fmad=false rounds every operation like the CPU")
        } else {
            (0.0, "bit-identical: sim devices run the reference's own code")
        }
    }

    fn report(&self, reports: &[RankReport]) -> String {
        let (o, d) = (self.o, self.d);
        let mut s = String::new();
        let _ = writeln!(s, "# gpulmt Stencil2D (SHOC 9-point stencil) v{}", env!("CARGO_PKG_VERSION"));
        let _ = writeln!(
            s,
            "# backend {}: {} | mode {} | precision {} | {} ranks as a {} grid | halo {}",
            self.backend,
            self.compute,
            o.mode.name(),
            self.precision,
            self.ranks,
            d.grid,
            d.halo
        );
        let scaling = match o.global {
            Some(_) => "strong scaling".to_string(),
            None => format!("{0}x{0} per rank, weak scaling", o.size),
        };
        let _ = writeln!(
            s,
            "# global interior {}x{} ({scaling}) | {} timed steps after {} warm-up | weights {} {} {} | protocol {}",
            d.global.0,
            d.global.1,
            o.iters,
            self.warmup,
            o.weight_center,
            o.weight_cardinal,
            o.weight_diagonal,
            std::env::var("GPULMT_PROTOCOL").unwrap_or_else(|_| "auto".into())
        );
        let _ = writeln!(
            s,
            "# {:>4} {:>6} {:>22} {:>14} {:>14} {:>10}",
            "rank", "device", "block (offset)", "time/step us", "exchange us", "comm %"
        );
        for (r, rep) in reports.iter().enumerate() {
            let b = Decomp::new(d.grid, r as u32, d.global, d.halo).expect("every rank built this block");
            let block = format!("{}x{} ({},{})", b.local.0, b.local.1, b.offset.0, b.offset.1);
            let _ = writeln!(
                s,
                "  {:>4} {:>6} {:>22} {:>14.2} {:>14.2} {:>10.1}",
                r,
                rep.device,
                block,
                1e6 * rep.elapsed / o.iters as f64,
                1e6 * rep.exchange / rep.exchanges.max(1) as f64,
                100.0 * rep.exchange / rep.elapsed.max(f64::MIN_POSITIVE)
            );
        }
        let _ = writeln!(
            s,
            "# halo messages per neighbour pair: the protocol the receiver chose, counted over every exchange \
             (warm-up included); a+b: the phase's two receives took both"
        );
        let _ = writeln!(s, "# {:>4} {:>4} {:>6} {:>8} {:>10}  protocol", "from", "to", "side", "devices", "bytes");
        for (r, rep) in reports.iter().enumerate() {
            let b = Decomp::new(d.grid, r as u32, d.global, d.halo).expect("every rank built this block");
            for side in Side::ALL {
                let Some(from) = b.neighbour(side) else { continue };
                let _ = writeln!(
                    s,
                    "  {:>4} {:>4} {:>6} {:>8} {:>10}  {}",
                    from,
                    r,
                    side.name(),
                    format!("{}->{}", reports[from as usize].device, rep.device),
                    b.message_len(side) * self.elem_bytes,
                    rep.tally.describe(side)
                );
            }
        }
        let (mean, max) = Self::comm_share(reports);
        let totals: Vec<String> = Self::protocol_totals(reports).iter().map(|(p, n)| format!("{p} x{n}")).collect();
        let _ = writeln!(
            s,
            "summary: {:.2} us/step | comm share {:.1} % (max {:.1} %) | {:.2} GFLOP/s | {} exchanges/rank timed | halos {}",
            1e6 * self.step_time(reports),
            mean,
            max,
            self.gflops(reports),
            reports[0].exchanges,
            if totals.is_empty() { "none".to_string() } else { totals.join(", ") }
        );
        let _ = writeln!(
            s,
            "# peer mappings opened during the timed steps: {} (the warm-up opens them: each costs about 1 ms on H200)",
            reports.iter().map(|r| r.timed_opens).sum::<u64>()
        );
        s
    }

    /// The CSV rows of the run (rank 0, with `--csv`).
    fn csv(&self, reports: &[RankReport]) {
        let (mean, max) = Self::comm_share(reports);
        let exchange =
            reports.iter().map(|r| r.exchange / r.exchanges.max(1) as f64).sum::<f64>() / reports.len() as f64;
        self.csv_row("time_per_iter_us", 1e6 * self.step_time(reports));
        self.csv_row("comm_share_pct", mean);
        self.csv_row("comm_share_max_pct", max);
        self.csv_row("exchange_us", 1e6 * exchange);
        self.csv_row("gflops", self.gflops(reports));
        for (p, n) in Self::protocol_totals(reports) {
            self.csv_row(&format!("halo_msgs_{p}"), n as f64);
        }
    }

    /// Appends one row of `--csv` output (header first when the file is new).
    fn csv_row(&self, metric: &str, value: f64) {
        let Some(path) = &self.o.csv else { return };
        let record = [
            self.bench().to_string(),
            self.o.mode.name().to_string(),
            self.precision.to_string(),
            self.ranks.to_string(),
            self.size().to_string(),
            self.d.halo.to_string(),
            metric.to_string(),
            value.to_string(),
        ];
        crate::append_csv(path, crate::report::STENCIL_HEADER, &record.each_ref().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use super::super::exchange::PROTOCOLS;
    use super::*;

    #[test]
    fn reports_survive_the_text_form() {
        let mut tally = ProtocolTally::default();
        tally.record(&[Side::South], &[0; PROTOCOLS.len()], &[1, 0, 0, 0, 0]);
        let r = RankReport { device: 1, elapsed: 0.25, exchange: 1e-3, exchanges: 7, timed_opens: 2, tally };
        assert_eq!(RankReport::decode(&r.encode()), Some(r.clone()));
        let empty = RankReport { tally: ProtocolTally::default(), ..r };
        assert_eq!(RankReport::decode(&empty.encode()), Some(empty));
    }

    #[test]
    fn options_parse() {
        let o = StencilOptions::try_parse_from([
            "stencil2d",
            "--mode",
            "inter-k-overlap",
            "--precision",
            "double",
            "--grid",
            "1x4",
        ])
        .unwrap();
        assert_eq!(
            (o.mode, o.precision, o.grid),
            (Mode::InterKOverlap, Precision::Double, Some(ProcGrid { rows: 1, cols: 4 }))
        );
        assert!(StencilOptions::try_parse_from(["stencil2d", "--size", "8", "--global", "16"]).is_err());
    }
}
