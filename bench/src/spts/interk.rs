//! SpTS's `inter-k` baseline: level-set scheduling. Rows of one level depend only on
//! earlier levels, so each level is one kernel (a thread per row); between levels the
//! host exchanges what the level solved: for each consuming rank, the level's values it
//! reads, packed by the kernel into the outbox, go as one put_signal into its inbox
//! (`signal[me] = stamp`, see [`stamp`]); then the host waits for the chunks of the
//! level that this rank consumes. A rank computes the next level once they are in.
//!
//! On CUDA the kernels queue on one stream, and the host waits for it only at levels
//! where it sends; on sim the CPU computes each level on the heap in place.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use gpulmt::sym::{Signal, SignalOp};
use gpulmt::{Context, SymPtr};

use super::cuda::{self, cuda, DevicePlan};
use super::matrix::row_value;
use super::plan::RankPlan;
use super::{wait_signal, Result, Solver};
use crate::device::DeviceModule;

/// The signal value of level `level` of solve `epoch`: increasing over the levels and
/// solves, so a receiver's wait (>=) for a chunk is met by it or by any later one of the
/// same sender, which puts in order, each put complete before the next.
pub fn stamp(epoch: u64, level: usize, levels: usize) -> u64 {
    epoch * (levels as u64 + 1) + level as u64 + 1
}

/// Where a level's rows are computed.
pub trait LevelCompute {
    /// Queues (CUDA) or computes (sim) level `l`.
    fn level(&mut self, ctx: &mut Context, p: &RankPlan, l: usize) -> Result<()>;
    /// Waits until the queued levels are done.
    fn sync(&mut self) -> Result<()>;
    fn describe(&self) -> String;
    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()>;
}

/// The level loop and the exchange, on any [`LevelCompute`].
pub struct InterK {
    pub plan: RankPlan,
    /// The plan's xbuf (f64 words) and a signal word per rank.
    pub xbuf: SymPtr,
    pub sigs: SymPtr,
    pub compute: Box<dyn LevelCompute>,
}

impl Solver for InterK {
    fn solve(&mut self, ctx: &mut Context, epoch: u64) -> Result<()> {
        let (p, me) = (&self.plan, ctx.rank());
        let mut staged = Vec::new();
        for l in 0..p.levels {
            if p.lptr[l + 1] > p.lptr[l] {
                self.compute.level(ctx, p, l)?;
            }
            let value = stamp(epoch, l, p.levels);
            if let (Some(first), Some(last)) = (p.sends[l].first(), p.sends[l].last()) {
                // The level's outbox chunks are contiguous: one copy to the host, then a
                // put_signal per consumer.
                self.compute.sync()?;
                let (from, words) = (first.outbox, last.outbox + last.count - first.outbox);
                staged.resize(words, 0.0f64);
                let at = self.xbuf.at(8 * (p.outbox_at() + from));
                // SAFETY: `staged` holds `words` f64s; the range lies in our xbuf's outbox.
                unsafe { ctx.sym_get(staged.as_mut_ptr().cast(), at, 8 * words, me)? };
                let signal = Signal { addr: self.sigs.at(8 * me as usize), value, op: SignalOp::Set };
                for ch in &p.sends[l] {
                    let src = &staged[ch.outbox - from..ch.outbox - from + ch.count];
                    let dst = self.xbuf.at(8 * (p.n + ch.inbox));
                    // SAFETY: `src` is readable until the call returns complete.
                    unsafe { ctx.sym_put_signal(dst, src.as_ptr().cast(), 8 * ch.count, signal, ch.peer)? };
                }
            }
            for &s in &p.recvs[l] {
                wait_signal(ctx, self.sigs.at(8 * s as usize), value, &format!("rank {s}'s values of level {l}"))?;
            }
        }
        self.compute.sync()
    }

    fn describe(&self) -> String {
        self.compute.describe()
    }

    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()> {
        self.compute.release(ctx)
    }
}

/// The CPU on sim device memory (the heap is host memory there).
pub struct CpuLevels {
    pub xbuf: SymPtr,
}

impl LevelCompute for CpuLevels {
    fn level(&mut self, _ctx: &mut Context, p: &RankPlan, l: usize) -> Result<()> {
        let x = self.xbuf.addr() as *mut f64;
        for &k in &p.by_level[p.lptr[l]..p.lptr[l + 1]] {
            let k = k as usize;
            let (_, cols, vals) = p.entries(k);
            // SAFETY: sim heaps are host memory of this process; xbuf holds xbuf_len words
            // and every column position lies in it. The columns are final: local ones of
            // earlier levels, inbox ones waited for. Volatile: other ranks put into the
            // inbox meanwhile (other words).
            let v = row_value(p.b[k], vals, cols, p.diag[k], |j| unsafe { x.add(j as usize).read_volatile() });
            // SAFETY: x[row] and the row's outbox slots are this rank's alone.
            unsafe {
                x.add(p.rows[k] as usize).write_volatile(v);
                for &o in &p.opos[p.optr[k] as usize..p.optr[k + 1] as usize] {
                    x.add(p.outbox_at() + o as usize).write_volatile(v);
                }
            }
        }
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        "CPU on sim device memory, a level at a time, values through the symmetric heap's host put_signal".into()
    }

    fn release(self: Box<Self>, _ctx: &mut Context) -> Result<()> {
        Ok(())
    }
}

/// Threads of a block of `spts_level`.
const BLOCK: u32 = 256;

/// A kernel per level on the rank's GPU.
pub struct CudaLevels {
    m: DeviceModule,
    f: CudaFunction,
    dp: DevicePlan,
    x: u64,
    outbox: u64,
    name: String,
}

impl CudaLevels {
    pub fn new(ctx: &mut Context, plan: &RankPlan, xbuf: SymPtr) -> Result<CudaLevels> {
        let (m, f) = cuda::load(ctx, "spts_level")?;
        let dp = DevicePlan::upload(ctx, plan, true)?;
        let name = m.stream.context().name().unwrap_or_else(|_| "unknown GPU".into());
        Ok(CudaLevels { m, f, dp, x: xbuf.addr() as u64, outbox: xbuf.at(8 * plan.outbox_at()) as u64, name })
    }
}

impl LevelCompute for CudaLevels {
    fn level(&mut self, _ctx: &mut Context, p: &RankPlan, l: usize) -> Result<()> {
        let count = (p.lptr[l + 1] - p.lptr[l]) as u32;
        let by_level = self.dp.by_level + 4 * p.lptr[l] as u64;
        let d = &self.dp;
        let mut b = self.m.stream.launch_builder(&self.f);
        b.arg(&by_level).arg(&count).arg(&d.rows).arg(&d.ptr).arg(&d.col).arg(&d.val).arg(&d.diag).arg(&d.b);
        b.arg(&d.optr).arg(&d.opos).arg(&self.x).arg(&self.outbox);
        let cfg =
            LaunchConfig { grid_dim: (count.div_ceil(BLOCK), 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match spts_level's in order and type; by_level points at
        // `count` local rows of the uploaded plan, whose inter-k columns and outbox slots
        // lie in xbuf (the symmetric allocation of xbuf_len words).
        unsafe { b.launch(cfg) }.map_err(cuda("launching spts_level"))?;
        Ok(())
    }

    fn sync(&mut self) -> Result<()> {
        Ok(self.m.sync()?)
    }

    fn describe(&self) -> String {
        format!("a CUDA kernel per level (NVRTC) on GPU ({}), the host exchanging between levels", self.name)
    }

    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()> {
        self.dp.release(ctx)
    }
}
