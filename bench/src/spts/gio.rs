//! SpTS's `gio` mode: the sync-free solve (Liu et al.; seed 000's intra-kernel
//! communication). Each solved row sets its ready flag; a row waits for its columns'
//! flags. Flags and x live in the symmetric heap: a local column's flag is set by the
//! local producer, a remote one's by its producer's put_signal (the value into
//! `xbuf[j]`, then `flags[j] = epoch`), one per consuming rank.
//!
//! - On CUDA one persistent kernel per rank (`spts_gio` in kernels.cu) solves every row
//!   of the rank, a warp per row, rows taken in increasing order (why that progresses:
//!   kernels.cu). Its grid is sized to stay resident beside the other ranks' kernels on
//!   the same GPU ([`DeviceModule::resident_grid`]), and the host waits for it with the
//!   watchdog ([`wait_watched`]).
//! - On sim the same protocol runs on the host: rows in increasing order, a wait for
//!   each remote column's flag, the value computed in CSR order, one host put_signal per
//!   consuming rank. The smallest unsolved row of the job always has its columns solved
//!   and is the next row of its owner, so the ranks progress.

use std::time::Duration;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use gpulmt::sym::{Signal, SignalOp};
use gpulmt::{Context, SymPtr};

use super::cuda::{self, cuda, DevicePlan};
use super::matrix::row_value;
use super::plan::{Dist, RankPlan};
use super::{wait_signal, Result, Solver};
use crate::device::watchdog::wait_watched;
use crate::device::DeviceModule;

/// The protocol on the host (sim).
pub struct HostGio {
    pub plan: RankPlan,
    pub dist: Dist,
    /// f64 x by global row (the plan's xbuf), and a u64 flag per global row.
    pub x: SymPtr,
    pub flags: SymPtr,
}

impl Solver for HostGio {
    fn solve(&mut self, ctx: &mut Context, epoch: u64) -> Result<()> {
        let me = ctx.rank();
        let p = &self.plan;
        let x = self.x.addr() as *mut f64;
        for (k, &i) in p.rows.iter().enumerate() {
            let (cols, _, vals) = p.entries(k);
            for &j in cols.iter().filter(|&&j| self.dist.owner(j as usize) != me) {
                wait_signal(
                    ctx,
                    self.flags.at(8 * j as usize),
                    epoch,
                    &format!("row {j} (rank {me}'s row {i} reads it)"),
                )?;
            }
            // SAFETY: sim heaps are host memory of this process; x holds n words. Every
            // column read is final: a local one solved earlier in this loop, a remote one
            // flagged after its put (the wait's acquire). Volatile: producers write x.
            let v = row_value(p.b[k], vals, cols, p.diag[k], |j| unsafe { x.add(j as usize).read_volatile() });
            // SAFETY: row i is this rank's: nobody else writes x[i] here.
            unsafe { x.add(i as usize).write_volatile(v) };
            let signal = Signal { addr: self.flags.at(8 * i as usize), value: epoch, op: SignalOp::Set };
            for &c in &p.cons[p.cptr[k] as usize..p.cptr[k + 1] as usize] {
                // SAFETY: `v` is 8 readable bytes until the call returns complete.
                unsafe { ctx.sym_put_signal(self.x.at(8 * i as usize), (&v as *const f64).cast(), 8, signal, c)? };
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "CPU on sim device memory, rows in order, values through the symmetric heap's host put_signal".into()
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
        // As many warps as rows at most, and no more blocks than stay resident beside the
        // other ranks' kernels on this GPU (a rank whose kernel cannot start stalls all).
        let resident = m.resident_grid(&f, BLOCK)?;
        let grid = (plan.len() as u32).div_ceil(BLOCK / 32).clamp(1, resident);
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
        l.arg(&d.cptr).arg(&d.cons).arg(&self.x).arg(&self.flags).arg(&epoch).arg(&ctl);
        let cfg = LaunchConfig { grid_dim: (self.grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match spts_gio's parameters in order and type; the plan's
        // arrays hold nrows rows (and their entries and consumers), x and flags are the
        // symmetric allocations of n words every rank made, ctl two words.
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
