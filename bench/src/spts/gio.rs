//! SpTS's `gio` mode: the sync-free solve (Liu et al.; seed 000's intra-kernel
//! communication). Each solved row sets its ready flag; a row waits for its columns'
//! flags. Flags and x live in the symmetric heap: a local column's flag is set by the
//! local producer, a remote one's by its producer's put_signal (the value into
//! `xbuf[j]`, then `flags[j] = epoch`), one per consuming rank of the same node. A rank of
//! another node gets a stream ([`super::plan::Stream`]): batches of the rows it reads, in
//! row order, each put with the stream's count as its signal (docs/spts.md).
//!
//! - On CUDA one persistent kernel per rank (`spts_gio` in kernels.cu) solves every row
//!   of the rank, a warp per row, rows taken in increasing order (why that progresses:
//!   kernels.cu). Its grid is sized to stay resident beside the other ranks' kernels on
//!   the same GPU ([`DeviceModule::resident_grid`]), and the host waits for it with the
//!   watchdog ([`wait_watched`]).
//! - On sim the same protocol runs on the host: rows in increasing order, a wait for
//!   each remote column's flag word, the value computed in CSR order, one host put_signal
//!   per consuming rank of the node, the streams flushed before every wait and at the
//!   end. The smallest unsolved row of the job always has its columns solved (and
//!   shipped: its producer flushed before it waited, or finished) and is the next row of
//!   its owner, so the ranks progress.

use std::time::Duration;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use gpulmt::sym::{Signal, SignalOp};
use gpulmt::{Context, SymPtr};

use super::cuda::{self, cuda, DevicePlan};
use super::matrix::row_value;
use super::plan::{Dist, RankPlan};
use super::{wait_signal, Result, Solver, SptsError};
use crate::device::watchdog::wait_watched;
use crate::device::DeviceModule;

/// The protocol on the host (sim).
pub struct HostGio {
    pub plan: RankPlan,
    pub dist: Dist,
    /// The plan's xbuf (f64 words), and its flags (a u64 per global row, then per rank).
    pub x: SymPtr,
    pub flags: SymPtr,
}

impl HostGio {
    /// Ships each stream's values solved so far (local rows below `solved`) that it has
    /// not shipped yet: one put_signal of them, the stream's count as the signal. Called
    /// before every wait, so no rank waits for a value this rank holds back.
    fn flush(&self, ctx: &Context, epoch: u64, solved: usize, shipped: &mut [usize]) -> Result<()> {
        let (p, me) = (&self.plan, ctx.rank() as usize);
        let x = self.x.addr() as *const f64;
        for (st, cur) in p.streams.iter().zip(shipped) {
            let end = st.rows.partition_point(|&k| (k as usize) < solved);
            if end <= *cur {
                continue;
            }
            // SAFETY: sim heaps are host memory of this process; these rows are solved.
            let vals: Vec<f64> = st.rows[*cur..end]
                .iter()
                .map(|&k| unsafe { x.add(p.rows[k as usize] as usize).read_volatile() })
                .collect();
            let count = (epoch - 1) * st.rows.len() as u64 + end as u64;
            let signal = Signal { addr: self.flags.at(8 * (p.n + me)), value: count, op: SignalOp::Set };
            // SAFETY: `vals` is readable until the call returns complete.
            unsafe {
                ctx.sym_put_signal(
                    self.x.at(8 * (st.dst + *cur)),
                    vals.as_ptr().cast(),
                    8 * vals.len(),
                    signal,
                    st.peer,
                )?
            };
            *cur = end;
        }
        Ok(())
    }
}

impl Solver for HostGio {
    fn solve(&mut self, ctx: &mut Context, epoch: u64) -> Result<()> {
        let me = ctx.rank();
        let p = &self.plan;
        let x = self.x.addr() as *mut f64;
        let mut shipped = vec![0; p.streams.len()];
        for (k, &i) in p.rows.iter().enumerate() {
            for e in p.range(k) {
                let f = p.fidx[e] as usize;
                if f < p.n && self.dist.owner(f) == me {
                    continue; // solved earlier in this loop
                }
                self.flush(ctx, epoch, k, &mut shipped)?;
                let need = epoch.wrapping_mul(u64::from(p.tmul[e])).wrapping_add(p.tbase[e]);
                wait_signal(ctx, self.flags.at(8 * f), need, &format!("flag word {f} (rank {me}'s row {i} reads it)"))?;
            }
            let (cols, _, vals) = p.entries(k);
            // SAFETY: sim heaps are host memory of this process; xbuf holds every column's
            // position. Every column read is final: a local one solved earlier in this
            // loop, a remote one flagged after its put (the wait's acquire). Volatile:
            // producers write xbuf.
            let v = row_value(p.b[k], vals, cols, p.diag[k], |j| unsafe { x.add(j as usize).read_volatile() });
            // SAFETY: row i is this rank's: nobody else writes x[i] here.
            unsafe { x.add(i as usize).write_volatile(v) };
            let signal = Signal { addr: self.flags.at(8 * i as usize), value: epoch, op: SignalOp::Set };
            for &c in &p.cons[p.cptr[k] as usize..p.cptr[k + 1] as usize] {
                // SAFETY: `v` is 8 readable bytes until the call returns complete.
                unsafe { ctx.sym_put_signal(self.x.at(8 * i as usize), (&v as *const f64).cast(), 8, signal, c)? };
            }
        }
        self.flush(ctx, epoch, p.len(), &mut shipped)
    }

    fn describe(&self) -> String {
        format!(
            "CPU on sim device memory, rows in order, values through the symmetric heap's host put_signal ({} \
             batched stream(s) to other nodes)",
            self.plan.streams.len()
        )
    }

    fn release(self: Box<Self>, _ctx: &mut Context) -> Result<()> {
        Ok(())
    }
}

/// How long the kernel may solve no row before the watchdog reports it and exits.
const GIO_STALL: Duration = Duration::from_secs(10);

/// Threads of a block: 8 warps, a row each at a time.
const BLOCK: u32 = 256;

/// The persistent kernel on the rank's GPU.
pub struct CudaGio {
    m: DeviceModule,
    f: CudaFunction,
    dp: DevicePlan,
    nrows: u32,
    x: u64,
    flags: u64,
    /// This rank's stream word at its consumers: flags[n + rank].
    self_sig: u32,
    /// Device words, reset before each launch: [0] the row counter, [1] rows solved.
    ctl: usize,
    grid: u32,
    resident: u32,
    name: String,
}

impl CudaGio {
    pub fn new(ctx: &mut Context, plan: &RankPlan, x: SymPtr, flags: SymPtr) -> Result<CudaGio> {
        let (m, f) = cuda::load(ctx, "spts_gio")?;
        if m.ranks_here > 1 && ctx.backend().mps_enabled(ctx.device()) == Some(false) {
            eprintln!(
                "spts: warning: {} ranks share GPU {} without MPS: their persistent kernels wait for each other and \
                 are time-sliced (start MPS)",
                m.ranks_here,
                ctx.device()
            );
        }
        // A warp per stream and as many as rows at most, and no more blocks than stay
        // resident beside the other ranks' kernels on this GPU (a rank whose kernel cannot
        // start stalls all).
        let resident = m.resident_grid(&f, BLOCK)?;
        let warps = (plan.streams.len() + plan.len()) as u32;
        let grid = warps.div_ceil(BLOCK / 32).clamp(1, resident);
        if grid * (BLOCK / 32) <= plan.streams.len() as u32 {
            return Err(SptsError::Cuda(format!(
                "the GIO kernel needs more than {} warps for its streams to other nodes, the GPU holds {grid} \
                 blocks of {BLOCK} per rank",
                plan.streams.len()
            )));
        }
        let dp = DevicePlan::upload(ctx, plan, false)?;
        let ctl = ctx.mem_alloc(16)?;
        let name = m.stream.context().name().unwrap_or_else(|_| "unknown GPU".into());
        let name =
            format!("{name}, {grid} blocks of {BLOCK} (resident limit {resident}), {} rank(s) on it", m.ranks_here);
        Ok(CudaGio {
            m,
            f,
            dp,
            nrows: plan.len() as u32,
            x: x.addr() as u64,
            flags: flags.addr() as u64,
            self_sig: (plan.n + ctx.rank() as usize) as u32,
            ctl,
            grid,
            resident,
            name,
        })
    }

    /// Rows the running solve has solved, read while the kernel runs.
    fn solved(&self, ctx: &Context) -> Result<u64> {
        let mut v = 0u64;
        // SAFETY: ctl is our 16-byte allocation; the kernel adds to word 1 atomically
        // (an aligned whole word), and `v` is 8 host bytes.
        unsafe { ctx.copy_sync(&mut v as *mut u64 as usize, self.ctl + 8, 8)? };
        Ok(v)
    }
}

impl Solver for CudaGio {
    fn solve(&mut self, ctx: &mut Context, epoch: u64) -> Result<()> {
        let zero = [0u64; 2];
        // SAFETY: ctl's two words; no kernel runs (the previous solve was waited for).
        unsafe { ctx.copy_sync(self.ctl, zero.as_ptr() as usize, 16)? };
        let d = &self.dp;
        let ctl = self.ctl as u64;
        let mut l = self.m.stream.launch_builder(&self.f);
        l.arg(&self.nrows).arg(&d.rows).arg(&d.ptr).arg(&d.col).arg(&d.val).arg(&d.diag).arg(&d.b);
        l.arg(&d.fidx).arg(&d.tmul).arg(&d.tbase).arg(&d.cptr).arg(&d.cons);
        l.arg(&d.nstreams).arg(&d.speer).arg(&d.sptr).arg(&d.srows).arg(&d.sstage).arg(&d.sdst);
        l.arg(&self.x).arg(&self.flags).arg(&self.self_sig).arg(&epoch).arg(&ctl);
        let cfg = LaunchConfig { grid_dim: (self.grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match spts_gio's parameters in order and type; the plan's
        // arrays hold nrows rows (and their entries, consumers and streams), x is the
        // symmetric xbuf every rank made (every column and stream position lies in it),
        // flags its n + ranks words, ctl two words.
        unsafe { l.launch(cfg) }.map_err(cuda("launching spts_gio"))?;
        let done = self.m.stream.record_event(None).map_err(cuda("recording spts_gio's end"))?;
        let (rank, nrows, grid, resident, here) = (ctx.rank(), self.nrows, self.grid, self.resident, self.m.ranks_here);
        wait_watched(
            &done,
            GIO_STALL,
            || self.solved(ctx),
            |now| {
                format!(
                    "spts: rank {rank}: the GIO kernel solved no row for {GIO_STALL:?}: {} of its {nrows} rows of \
                     solve {epoch} done; {grid} blocks (resident limit {resident} for {here} rank(s) on this GPU: \
                     every rank's kernel must be resident at once)\n  exiting with status 3: the kernel would spin \
                     forever",
                    now
                )
            },
            cuda("running spts_gio"),
        )
    }

    fn describe(&self) -> String {
        format!("one persistent CUDA kernel (NVRTC, device API), a warp per row, on GPU ({})", self.name)
    }

    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()> {
        ctx.mem_free(self.ctl)?;
        self.dp.release(ctx)
    }
}
