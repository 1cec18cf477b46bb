//! Stencil2D's `gio` mode (seed 000, section 6: "intra-kernel" networking). The fields
//! live in the symmetric heap; before each batch of `halo` steps a rank puts its edge
//! layers straight into its neighbours' ghost cells with put_signal, diagonal
//! neighbours included (so corners need no second phase), and waits for their signals;
//! then it computes the batch.
//!
//! - On CUDA one persistent kernel (`gio.cu`) runs every step of a run: no kernel
//!   boundary and no host call per step, as the mode is meant to be.
//! - On sim the same protocol runs on the host through the heap's host operations (the
//!   CPU computes, as for the other modes), so CI checks the exchange, its signals and
//!   the bit-identical result.
//! - A neighbour on another node (its heap not mapped here: the device API's queue
//!   path, through the GIO queues and the proxies) gets each halo as ONE packet instead
//!   of a put per row (a column halo has as many rows as the block, and each packet is
//!   a proxy's round trip): the sender packs the rectangle into a staging buffer of its
//!   heap, puts it with put_signal into the neighbour's inbox, and the receiver unpacks
//!   it into its ghost cells once the signal is there (`inbox` below).
//!
//! # Protocol (per neighbour pair, exchange `e` before batch `e`)
//! - Data: the sender sets `sigs[opposite(d)] = e + 1` at the neighbour in direction `d`
//!   after the halo (put_signal); the receiver waits for `sigs[d] >= e + 1` in its heap.
//! - Reuse: with halo 1 no acknowledgement is needed. A batch of one step reads one field
//!   and writes only the interior of the other, so the ghost cells exchange `e` writes
//!   (of the field batch `e - 1` writes) are touched by nobody until batch `e`; and a
//!   neighbour can only be one exchange ahead (it needed this rank's exchange first).
//!   With halo > 1 a batch writes ghost layers of both fields, so before exchange `e`
//!   each rank sets `sigs[8 + opposite(d)] = e` at each neighbour ("batch `e - 1` done")
//!   and waits for its neighbours' before writing into them.
//! - Inboxes (off-node neighbours): two per direction and two pack buffers, by the
//!   parity of `e`. A neighbour is at most one exchange ahead (its batch `e` needs this
//!   rank's exchange `e`), so its exchange `e + 1` never writes the inbox this rank may
//!   still unpack for `e`; and this rank packs exchange `e + 2` only after it received
//!   the neighbour's `e + 1`, which the neighbour sent after this rank's `e` signal,
//!   which its proxy wrote after the data: exchange `e`'s put has read its pack buffer.

use std::mem::size_of;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaEvent, CudaFunction, LaunchConfig, PushKernelArg};
use gpulmt::device::BackendKind;
use gpulmt::sym::{Cmp, Signal, SignalOp};
use gpulmt::{Context, SymPtr};

use super::grid::{Decomp, Side};
use super::kernel::{self, Real, Weights, CUDA_SOURCE};
use super::{Result, StencilError};
use crate::device::watchdog::wait_watched;
use crate::device::DeviceModule;

/// The persistent kernel, compiled behind the device header, `real` and kernels.cu.
pub const GIO_SOURCE: &str = include_str!("gio.cu");

/// Words of the signal block: data signals by direction, then acknowledgements.
const SIGNALS: usize = 16;

/// Buffers of each direction's staging block (off-node neighbours): two pack buffers,
/// then two inboxes, by exchange parity.
const STAGING_PER_DIR: usize = 4;

/// The eight neighbours, as (row step, column step).
const DIRS: [(i64, i64); 8] = [(-1, 0), (1, 0), (0, -1), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)];

/// The index of the direction opposite `d`.
fn opposite(d: usize) -> usize {
    let (dr, dc) = DIRS[d];
    DIRS.iter().position(|&x| x == (-dr, -dc)).expect("every direction has an opposite")
}

/// One halo message: `halo_put` of gio.cu, word for word.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HaloPut {
    pub peer: i64,
    pub src_r0: i64,
    pub src_c0: i64,
    pub rows: i64,
    pub cols: i64,
    pub dst_r0: i64,
    pub dst_c0: i64,
    pub dst_pitch: i64,
    pub sig: i64,
    pub recv: i64,
    /// Where the neighbour's message (same extent) lands in this rank's field: the
    /// ghost cells facing it (unpacked there from the inbox, off-node).
    pub recv_r0: i64,
    pub recv_c0: i64,
    /// Off-node neighbour ([`route_off_node`]): the symmetric addresses of this
    /// message's pack buffers here, of the neighbour's inboxes for it, and of this
    /// rank's inboxes for the neighbour's message (each the first of two, `slot` bytes
    /// apart, by exchange parity). 0: the neighbour's heap is mapped (direct puts).
    pub pack: i64,
    pub inbox_out: i64,
    pub inbox_in: i64,
    /// Bytes between a buffer and its other-parity twin.
    pub slot: i64,
}

/// The halo messages of `d`'s block: for each neighbour (diagonals too), its outer
/// `halo` interior layers into the neighbour's ghost cells facing it.
pub fn plan(d: &Decomp) -> Vec<HaloPut> {
    let (grid, h) = (d.grid, d.halo as i64);
    let (row, col) = grid.coords(d.rank);
    let (rows, cols) = (d.local.0 as i64, d.local.1 as i64);
    let mut v = Vec::new();
    for (i, &(dr, dc)) in DIRS.iter().enumerate() {
        let (nr, nc) = (row as i64 + dr, col as i64 + dc);
        if nr < 0 || nc < 0 || nr >= grid.rows as i64 || nc >= grid.cols as i64 {
            continue;
        }
        let peer = grid.rank_at(nr as u32, nc as u32);
        let n = Decomp::new(grid, peer, d.global, d.halo).expect("the neighbour's block exists");
        let (n_rows, n_cols) = (n.local.0 as i64, n.local.1 as i64);
        // Along one axis: (first layer sent, layers, first layer received at the neighbour).
        let axis = |step: i64, len: i64, n_len: i64| match step {
            -1 => (h, h, h + n_len),
            1 => (len, h, 0),
            _ => (h, len, h),
        };
        let (src_r0, nrows, dst_r0) = axis(dr, rows, n_rows);
        let (src_c0, ncols, dst_c0) = axis(dc, cols, n_cols);
        // The ghost cells facing the neighbour: before the interior, the interior's
        // extent, or after it.
        let ghost = |step: i64, len: i64| match step {
            -1 => 0,
            1 => h + len,
            _ => h,
        };
        v.push(HaloPut {
            peer: peer as i64,
            src_r0,
            src_c0,
            rows: nrows,
            cols: ncols,
            dst_r0,
            dst_c0,
            dst_pitch: n.pitch() as i64,
            sig: opposite(i) as i64,
            recv: i as i64,
            recv_r0: ghost(dr, rows),
            recv_c0: ghost(dc, cols),
            ..HaloPut::default()
        });
    }
    v
}

/// Bytes of one staging buffer: the largest halo message of any rank (a side of `halo`
/// layers; corners are smaller), rounded up to the heap's alignment.
pub fn staging_slot(d: &Decomp, elem: usize) -> usize {
    let side = (0..d.grid.size())
        .filter_map(|r| Decomp::new(d.grid, r, d.global, d.halo).ok())
        .map(|b| b.local.0.max(b.local.1))
        .max()
        .unwrap_or(0);
    (d.halo * side * elem).max(1).next_multiple_of(gpulmt::sym::ALIGN as usize)
}

/// Gives each message to a neighbour whose heap this rank does not map (another node)
/// its staging buffers in `staging` (a symmetric allocation of 8 directions x
/// `STAGING_PER_DIR` x `slot` bytes): the pack buffers of its direction here, the
/// inboxes of the opposite direction at the neighbour, and this rank's inboxes for
/// the neighbour's message.
pub fn route_off_node(plan: &mut [HaloPut], off_node: impl Fn(u32) -> bool, staging: usize, slot: usize) {
    let block = |dir: i64| (staging + dir as usize * STAGING_PER_DIR * slot) as i64;
    for p in plan.iter_mut().filter(|p| off_node(p.peer as u32)) {
        p.pack = block(p.recv);
        p.inbox_out = block(p.sig) + 2 * slot as i64;
        p.inbox_in = block(p.recv) + 2 * slot as i64;
        p.slot = slot as i64;
    }
}

/// Elements of the largest rank's array: the symmetric fields' size (every rank
/// allocates the same, and uses its own block's part).
pub fn field_len(d: &Decomp) -> usize {
    (0..d.grid.size()).map(|r| Decomp::new(d.grid, r, d.global, d.halo).map_or(0, |b| b.len())).max().unwrap_or(0)
}

/// The neighbour mask of the kernel: bit 0 north, 1 south, 2 west, 3 east.
fn nb_mask(d: &Decomp) -> u32 {
    Side::ALL.iter().enumerate().filter(|(_, s)| d.neighbour(**s).is_some()).map(|(i, _)| 1u32 << i).sum()
}

/// What a GIO run measured on this rank.
pub struct GioRun {
    /// The timed steps, seconds.
    pub elapsed: f64,
    /// Time in exchanges during them, seconds (waiting for neighbours included).
    pub exchange: f64,
    /// Exchanges during them.
    pub exchanges: u64,
    /// The field with the result.
    pub field: usize,
    /// What computed.
    pub compute: String,
    fields: [SymPtr; 2],
    sigs: SymPtr,
    staging: SymPtr,
    engine: Box<dyn Engine>,
    /// Neighbours reached through the queues and the proxies (another node).
    pub off_node: Vec<u32>,
}

impl GioRun {
    /// Frees the fields and the engine's memory (collective; the caller commits frees).
    pub fn release(self, ctx: &mut Context) -> Result<()> {
        self.engine.release(ctx)?;
        for p in [self.fields[0], self.fields[1], self.sigs, self.staging] {
            ctx.sym_free(p)?;
        }
        Ok(())
    }
}

/// Where a GIO run's steps execute.
trait Engine {
    /// Runs `steps` steps from field `cur0`, the first exchange numbered `exchange0`
    /// (queued on CUDA: [`sync`](Self::sync) waits).
    fn run(&mut self, ctx: &mut Context, exchange0: u64, steps: usize, cur0: usize) -> Result<()>;
    fn sync(&mut self, ctx: &Context) -> Result<()>;
    /// Seconds spent in exchanges so far (after a sync).
    fn exchange_seconds(&mut self, ctx: &Context) -> Result<f64>;
    fn describe(&self) -> String;
    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()>;
}

/// How the persistent kernel is compiled (CUDA).
#[derive(Clone, Copy, Debug)]
pub struct GioBuild {
    /// NVRTC may contract multiply-adds (results no longer bit-identical to the CPU).
    pub fmad: bool,
    /// Blocks of 256 threads per SM that the kernel's registers must allow (its launch
    /// bounds, `GIO_MIN_BLOCKS` in gio.cu).
    pub min_blocks: u32,
}

/// Runs Stencil2D in GIO mode: `warmup` untimed steps, then `iters` timed ones.
pub fn run<T: Real>(
    ctx: &mut Context,
    d: &Decomp,
    w: Weights<T>,
    warmup: usize,
    iters: usize,
    build: GioBuild,
) -> Result<GioRun> {
    let bytes = field_len(d) * size_of::<T>();
    let fields = [ctx.sym_alloc(bytes)?, ctx.sym_alloc(bytes)?];
    let sigs = ctx.sym_alloc(SIGNALS * 8)?;
    let slot = staging_slot(d, size_of::<T>());
    let staging = ctx.sym_alloc(DIRS.len() * STAGING_PER_DIR * slot)?;
    let init = kernel::initial_field::<T>(d);
    for f in fields {
        // SAFETY: `init` holds d.len() <= field_len values; the field is ours.
        unsafe { ctx.sym_put(f.addr(), init.as_ptr().cast(), d.len() * size_of::<T>(), ctx.rank())? };
    }
    let zeros = [0u64; SIGNALS];
    // SAFETY: `zeros` holds SIGNALS words.
    unsafe { ctx.sym_put(sigs.addr(), zeros.as_ptr().cast(), SIGNALS * 8, ctx.rank())? };
    let mut plan = plan(d);
    let heaps = ctx.sym_heaps();
    let off_node = |pe: u32| heaps[pe as usize].mapped.is_none();
    route_off_node(&mut plan, off_node, staging.addr(), slot);
    let off_node: Vec<u32> = plan.iter().filter(|p| p.pack != 0).map(|p| p.peer as u32).collect();
    let mut engine: Box<dyn Engine> = match ctx.backend_kind() {
        BackendKind::Sim => Box::new(HostEngine::<T> { d: d.clone(), plan, fields, sigs, w, exchange: Duration::ZERO }),
        BackendKind::Cuda => Box::new(CudaEngine::<T>::new(ctx, d, plan, fields, sigs, w, build)?),
    };
    // Every rank's fields and signals are initialised before any neighbour writes them.
    ctx.barrier()?;
    let h = d.halo;
    engine.run(ctx, 0, warmup, 0)?;
    engine.sync(ctx)?;
    ctx.barrier()?;
    let before = engine.exchange_seconds(ctx)?;
    let t0 = Instant::now();
    engine.run(ctx, (warmup / h) as u64, iters, warmup % 2)?;
    engine.sync(ctx)?;
    let elapsed = t0.elapsed().as_secs_f64();
    let exchange = engine.exchange_seconds(ctx)? - before;
    Ok(GioRun {
        elapsed,
        exchange,
        exchanges: iters.div_ceil(h) as u64,
        field: fields[(warmup + iters) % 2].addr(),
        compute: engine.describe(),
        fields,
        sigs,
        staging,
        engine,
        off_node,
    })
}

/// The protocol on the host, through the heap's host operations (sim: the CPU computes
/// on the fields in place, as `SimCompute` does).
struct HostEngine<T> {
    d: Decomp,
    plan: Vec<HaloPut>,
    fields: [SymPtr; 2],
    sigs: SymPtr,
    w: Weights<T>,
    exchange: Duration,
}

/// The offset of exchange `e`'s buffer among a message's two staging buffers.
fn parity(e: u64, p: &HaloPut) -> usize {
    (e % 2) as usize * p.slot as usize
}

/// How long a host wait for a neighbour's signal may take before the run fails.
const HOST_WAIT: Duration = Duration::from_secs(60);

impl<T: Real> HostEngine<T> {
    fn wait(&self, ctx: &Context, word: usize, value: u64) -> Result<()> {
        match ctx.sym_signal_wait_until(self.sigs.at(8 * word), Cmp::Ge, value, Some(HOST_WAIT))? {
            Some(_) => Ok(()),
            None => Err(StencilError::Protocol(format!("no signal {value} in word {word} after {HOST_WAIT:?}"))),
        }
    }

    fn exchange(&mut self, ctx: &mut Context, e: u64, src: SymPtr) -> Result<()> {
        let t = Instant::now();
        let (elem, pitch) = (size_of::<T>(), self.d.pitch());
        for p in &self.plan {
            let peer = p.peer as u32;
            if self.d.halo > 1 {
                ctx.sym_atomic_set(self.sigs.at(8 * (8 + p.sig as usize)), e, peer)?;
                self.wait(ctx, 8 + p.recv as usize, e)?;
            }
            if p.pack != 0 {
                // Off-node: the rectangle packed, one put_signal into the inbox.
                let len = p.cols as usize * elem;
                let mut packed = vec![0u8; p.rows as usize * len];
                for (r, row) in packed.chunks_mut(len).enumerate() {
                    let from = src.at(((p.src_r0 as usize + r) * pitch + p.src_c0 as usize) * elem);
                    // SAFETY: `row` is `len` bytes of host memory, written by the call only.
                    unsafe { ctx.sym_get(row.as_mut_ptr(), from, len, ctx.rank())? };
                }
                let signal = Signal { addr: self.sigs.at(8 * p.sig as usize), value: e + 1, op: SignalOp::Set };
                let to = p.inbox_out as usize + parity(e, p);
                // SAFETY: `packed` outlives the call, which is complete on return.
                unsafe { ctx.sym_put_signal(to, packed.as_ptr(), packed.len(), signal, peer)? };
                continue;
            }
            for r in 0..p.rows as usize {
                let from = src.at(((p.src_r0 as usize + r) * pitch + p.src_c0 as usize) * elem);
                let to = src.at(((p.dst_r0 as usize + r) * p.dst_pitch as usize + p.dst_c0 as usize) * elem);
                let len = p.cols as usize * elem;
                // SAFETY: `from` is `len` bytes of our own field (sim: host memory), which
                // nothing writes during the exchange.
                unsafe {
                    if r + 1 < p.rows as usize {
                        ctx.sym_put(to, from as *const u8, len, peer)?;
                    } else {
                        let signal = Signal { addr: self.sigs.at(8 * p.sig as usize), value: e + 1, op: SignalOp::Set };
                        ctx.sym_put_signal(to, from as *const u8, len, signal, peer)?;
                    }
                }
            }
        }
        for p in &self.plan {
            self.wait(ctx, p.recv as usize, e + 1)?;
            if p.pack != 0 {
                // The neighbour's message, from this rank's inbox into the ghost cells.
                let len = p.cols as usize * elem;
                let mut packed = vec![0u8; p.rows as usize * len];
                let inbox = p.inbox_in as usize + parity(e, p);
                // SAFETY: `packed` is host memory of its length, written by the calls only.
                unsafe { ctx.sym_get(packed.as_mut_ptr(), inbox, packed.len(), ctx.rank())? };
                for (r, row) in packed.chunks(len).enumerate() {
                    let to = src.at(((p.recv_r0 as usize + r) * pitch + p.recv_c0 as usize) * elem);
                    // SAFETY: `row` is `len` readable bytes.
                    unsafe { ctx.sym_put(to, row.as_ptr(), len, ctx.rank())? };
                }
            }
        }
        self.exchange += t.elapsed();
        Ok(())
    }

    /// One step on `step_region(k)`, row by row through slices of exactly the cells it
    /// reads and writes: neighbours write other cells of these arrays meanwhile.
    fn step(&self, src: usize, dst: usize, k: usize) {
        let (r, p) = (self.d.step_region(k), self.d.pitch());
        if r.is_empty() {
            return;
        }
        let n = r.cols();
        for i in r.r0..r.r1 {
            let row = |base: usize, at: usize| (base as *const T).wrapping_add(at * p + r.c0 - 1);
            // SAFETY: the source rows i-1..=i+1, columns c0-1..c1+1, lie in our field and
            // nothing writes them during the step (see the module's protocol); the
            // destination row's columns c0..c1 are ours alone (no neighbour writes them).
            unsafe {
                let (up, mid, down) = (
                    std::slice::from_raw_parts(row(src, i - 1), n + 2),
                    std::slice::from_raw_parts(row(src, i), n + 2),
                    std::slice::from_raw_parts(row(src, i + 1), n + 2),
                );
                let out = std::slice::from_raw_parts_mut((dst as *mut T).add(i * p + r.c0), n);
                kernel::stencil_row(&self.w, up, mid, down, out);
            }
        }
    }
}

impl<T: Real> Engine for HostEngine<T> {
    fn run(&mut self, ctx: &mut Context, exchange0: u64, steps: usize, cur0: usize) -> Result<()> {
        let (mut cur, mut e, mut step, h) = (cur0, exchange0, 0, self.d.halo);
        while step < steps {
            self.exchange(ctx, e, self.fields[cur])?;
            for k in 0..h.min(steps - step) {
                self.step(self.fields[cur].addr(), self.fields[1 - cur].addr(), k);
                cur = 1 - cur;
            }
            step += h.min(steps - step);
            e += 1;
        }
        Ok(())
    }

    fn sync(&mut self, _ctx: &Context) -> Result<()> {
        Ok(())
    }

    fn exchange_seconds(&mut self, _ctx: &Context) -> Result<f64> {
        Ok(self.exchange.as_secs_f64())
    }

    fn describe(&self) -> String {
        "CPU on sim device memory, halos through the symmetric heap's host put_signal".into()
    }

    fn release(self: Box<Self>, _ctx: &mut Context) -> Result<()> {
        Ok(())
    }
}

/// The persistent kernel on the rank's GPU.
struct CudaEngine<T> {
    m: DeviceModule,
    f: CudaFunction,
    d: Decomp,
    fields: [SymPtr; 2],
    sigs: SymPtr,
    w: Weights<T>,
    /// Device memory: the plan, and [`PROGRESS_WORDS`] words: the kernel's exchange
    /// time (ns), the last exchange its grid passed + 1 (the watchdog's).
    plan_dev: usize,
    nplan: i32,
    ns_dev: usize,
    grid: u32,
    name: String,
    /// The plan on the host, and the grid's limits, for the watchdog's report.
    plan: Vec<HaloPut>,
    resident: u32,
    ranks_here: u32,
    /// The launch [`sync`](Engine::sync) waits for: its completion event, its first
    /// exchange and its number of exchanges.
    launched: Option<(CudaEvent, u64, u64)>,
}

/// Words of the kernel's progress block (`exchange_ns` in gio.cu).
const PROGRESS_WORDS: usize = 2;

/// How long the GIO kernel may pass no exchange, with none of this rank's signal words
/// changing, before the watchdog reports where it stopped and ends the process.
const GIO_STALL: Duration = Duration::from_secs(10);

fn cuda(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> StencilError {
    move |e| StencilError::Cuda(format!("{what}: {e}"))
}

impl<T: Real> CudaEngine<T> {
    fn new(
        ctx: &mut Context,
        d: &Decomp,
        plan: Vec<HaloPut>,
        fields: [SymPtr; 2],
        sigs: SymPtr,
        w: Weights<T>,
        build: GioBuild,
    ) -> Result<Self> {
        let source = format!("typedef {} real;\n{CUDA_SOURCE}\n{GIO_SOURCE}", T::C_TYPE);
        let fmad_opt = if build.fmad { "--fmad=true" } else { "--fmad=false" };
        let bounds = format!("-DGIO_MIN_BLOCKS={}", build.min_blocks.max(1));
        let m = DeviceModule::load(ctx, &source, "stencil2d_gio.cu", &[fmad_opt, &bounds])
            .map_err(|e| StencilError::Cuda(e.0))?;
        let f = m.function("stencil_gio").map_err(|e| StencilError::Cuda(e.0))?;
        if m.ranks_here > 1 && ctx.backend().mps_enabled(ctx.device()) == Some(false) {
            eprintln!(
                "stencil2d: warning: {} ranks share GPU {} without MPS: their persistent kernels wait for each \
                 other and are time-sliced (start MPS)",
                m.ranks_here,
                ctx.device()
            );
        }
        // Enough blocks for the largest step's tiles, at most what stays resident beside
        // the other ranks' kernels on this GPU, at least one per halo message.
        let r = d.step_region(0);
        let tiles = (r.cols().div_ceil(32) * r.rows().div_ceil(8)).max(1) as u32;
        let resident = m.resident_grid(&f, 256).map_err(|e| StencilError::Cuda(e.0))?;
        let grid = tiles.min(resident).max(plan.len() as u32);
        if grid > resident {
            return Err(StencilError::Cuda(format!(
                "the GIO kernel needs {grid} resident blocks for its {} halo messages, the GPU holds {resident} \
                 per rank",
                plan.len()
            )));
        }
        let plan_bytes = (plan.len().max(1)) * size_of::<HaloPut>();
        let plan_dev = ctx.mem_alloc(plan_bytes)?;
        // SAFETY: `plan` holds plan.len() HaloPuts (repr(C) words); plan_dev as many bytes.
        unsafe { ctx.copy_sync(plan_dev, plan.as_ptr() as usize, plan.len() * size_of::<HaloPut>())? };
        let ns_dev = ctx.mem_alloc(PROGRESS_WORDS * 8)?;
        let zero = [0u64; PROGRESS_WORDS];
        // SAFETY: an allocation of PROGRESS_WORDS words and as many host words.
        unsafe { ctx.copy_sync(ns_dev, zero.as_ptr() as usize, PROGRESS_WORDS * 8)? };
        let name = m.stream.context().name().unwrap_or_else(|_| "unknown GPU".into());
        let ranks_here = m.ranks_here;
        Ok(CudaEngine {
            m,
            f,
            d: d.clone(),
            fields,
            sigs,
            w,
            plan_dev,
            nplan: plan.len() as i32,
            ns_dev,
            grid,
            name: format!(
                "{name}, {grid} blocks, launch bounds 256x{}, {fmad_opt}, {} rank(s) on this GPU",
                build.min_blocks.max(1),
                ranks_here
            ),
            plan,
            resident,
            ranks_here,
            launched: None,
        })
    }
}

/// What the watchdog reads of a running GIO kernel: the last exchange its grid passed
/// + 1 (0: none yet in this launch's numbering), and this rank's signal words.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Progress {
    passed: u64,
    sigs: [u64; SIGNALS],
}

impl<T> CudaEngine<T> {
    /// Reads the kernel's progress word and this rank's signal words while it runs
    /// (copies on gpulmt's own streams, which do not wait for the kernel's).
    fn progress(&self, ctx: &Context) -> Result<Progress> {
        let mut p = Progress { passed: 0, sigs: [0; SIGNALS] };
        // SAFETY: ns_dev is our allocation of PROGRESS_WORDS words; the kernel only
        // stores to word 1 (a whole aligned word), and `p.passed` is 8 host bytes.
        unsafe { ctx.copy_sync(&mut p.passed as *mut u64 as usize, self.ns_dev + 8, 8)? };
        // SAFETY: `p.sigs` holds SIGNALS words, the size of our `sigs` allocation.
        unsafe { ctx.sym_get(p.sigs.as_mut_ptr().cast(), self.sigs.addr(), SIGNALS * 8, ctx.rank())? };
        Ok(p)
    }

    /// Where a stalled kernel stopped, and what it waits for.
    fn stall_report(&self, rank: u32, p: &Progress, exchange0: u64, exchanges: u64) -> String {
        let e = p.passed.max(exchange0);
        let mut r = format!(
            "stencil2d: rank {rank}: the GIO kernel made no progress for {GIO_STALL:?}: its grid passed {} of \
             exchanges {exchange0}..{}, so it stops in exchange {e} or in the batch before it; {} blocks \
             (resident limit {} for {} rank(s) on this GPU: the kernels of every rank on it must be resident \
             at once)",
            p.passed.saturating_sub(exchange0),
            exchange0 + exchanges,
            self.grid,
            self.resident,
            self.ranks_here,
        );
        for h in &self.plan {
            let (got, ack) = (p.sigs[h.recv as usize], p.sigs[8 + h.recv as usize]);
            let how = if h.pack != 0 { "off-node, inbox" } else { "mapped, direct" };
            r += &format!(
                "\n  block for neighbour {} ({how}): data signal word {} = {got} (exchange {e} needs >= {})",
                h.peer,
                h.recv,
                e + 1
            );
            if self.d.halo > 1 {
                r += &format!(", acknowledgement word {} = {ack} (needs >= {e})", 8 + h.recv);
            }
        }
        r + "\n  exiting with status 3: the kernel would spin forever"
    }
}

impl<T: Real> Engine for CudaEngine<T> {
    fn run(&mut self, _ctx: &mut Context, exchange0: u64, steps: usize, cur0: usize) -> Result<()> {
        let (f0, f1) = (self.fields[0].addr() as u64, self.fields[1].addr() as u64);
        let (pitch, rows) = (self.d.pitch() as u64, self.d.padded_rows() as u64);
        let (mask, halo, plan, sigs) =
            (nb_mask(&self.d), self.d.halo as u32, self.plan_dev as u64, self.sigs.addr() as u64);
        let (steps, cur0, ns) = (steps as u64, cur0 as i32, self.ns_dev as u64);
        let w = self.w;
        let mut l = self.m.stream.launch_builder(&self.f);
        l.arg(&f0).arg(&f1).arg(&pitch).arg(&rows).arg(&mask).arg(&halo).arg(&plan).arg(&self.nplan).arg(&sigs);
        l.arg(&exchange0).arg(&steps).arg(&cur0).arg(&w.center).arg(&w.cardinal).arg(&w.diagonal).arg(&ns);
        let cfg = LaunchConfig { grid_dim: (self.grid, 1, 1), block_dim: (32, 8, 1), shared_mem_bytes: 0 };
        // SAFETY: the arguments match stencil_gio's parameters in order and type; the fields
        // and signals are symmetric allocations of the sizes it uses on every rank, the plan
        // is nplan entries; the grid is resident (cooperative launch), as gpulmt_sync_grid
        // needs.
        unsafe { l.launch_cooperative(cfg) }.map_err(cuda("launching stencil_gio"))?;
        let done = self.m.stream.record_event(None).map_err(cuda("recording stencil_gio's end"))?;
        self.launched = Some((done, exchange0, (steps as usize).div_ceil(self.d.halo) as u64));
        Ok(())
    }

    /// Waits for the kernel, as a watchdog ([`wait_watched`]): a kernel that passes no
    /// exchange and sees none of its signal words change for [`GIO_STALL`] is reported
    /// and the process exits.
    fn sync(&mut self, ctx: &Context) -> Result<()> {
        let Some((done, exchange0, exchanges)) = self.launched.take() else { return Ok(()) };
        wait_watched(
            &done,
            GIO_STALL,
            || self.progress(ctx),
            |now| self.stall_report(ctx.rank(), now, exchange0, exchanges),
            cuda("running stencil_gio"),
        )
    }

    fn exchange_seconds(&mut self, ctx: &Context) -> Result<f64> {
        let mut ns = 0u64;
        // SAFETY: ns_dev is our 8-byte allocation; no kernel runs (after sync).
        unsafe { ctx.copy_sync(&mut ns as *mut u64 as usize, self.ns_dev, 8)? };
        Ok(ns as f64 * 1e-9)
    }

    fn describe(&self) -> String {
        format!("one persistent CUDA kernel (NVRTC, device API) on GPU ({})", self.name)
    }

    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()> {
        ctx.mem_free(self.plan_dev)?;
        ctx.mem_free(self.ns_dev)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::grid::ProcGrid;
    use super::*;

    /// In a 3x3 grid the middle rank sends to all 8 neighbours, and each message lands
    /// where the neighbour's own plan says it receives from this side.
    #[test]
    fn the_middle_of_a_3x3_grid_talks_to_eight_neighbours_symmetrically() {
        let grid = ProcGrid { rows: 3, cols: 3 };
        let d = Decomp::new(grid, 4, (30, 33), 2).unwrap();
        let p = plan(&d);
        assert_eq!(p.len(), 8);
        let north = p.iter().find(|m| m.peer == 1).unwrap();
        assert_eq!((north.src_r0, north.rows, north.dst_r0, north.src_c0, north.cols), (2, 2, 12, 2, 11));
        let se = p.iter().find(|m| m.peer == 8).unwrap();
        assert_eq!((se.src_r0, se.src_c0, se.rows, se.cols, se.dst_r0, se.dst_c0), (10, 11, 2, 2, 0, 0));
        for m in &p {
            let n = Decomp::new(grid, m.peer as u32, d.global, d.halo).unwrap();
            let back = plan(&n).into_iter().find(|b| b.peer == 4).expect("the neighbour sends back");
            assert_eq!((m.sig, m.recv), (back.recv, back.sig), "signal words pair up");
            assert_eq!((m.rows, m.cols), (back.rows, back.cols), "same extent both ways");
            assert_eq!(
                (m.recv_r0, m.recv_c0),
                (back.dst_r0, back.dst_c0),
                "the neighbour's message lands where it is unpacked"
            );
        }
        assert_eq!(nb_mask(&d), 0b1111);
        let corner = Decomp::new(grid, 0, (30, 33), 2).unwrap();
        assert_eq!(plan(&corner).len(), 3);
        assert_eq!(nb_mask(&corner), 0b1010);
        assert_eq!(field_len(&corner), (10 + 4) * (11 + 4));
    }

    /// Off-node neighbours: each message's inbox at the neighbour is the one the
    /// neighbour unpacks from for this rank, every buffer of a rank is distinct, and
    /// mapped neighbours keep direct puts.
    #[test]
    fn off_node_messages_meet_the_neighbours_inboxes() {
        let grid = ProcGrid { rows: 3, cols: 3 };
        let (staging, slot) = (1 << 20, 4096);
        let routed = |rank: u32| {
            let d = Decomp::new(grid, rank, (30, 33), 1).unwrap();
            let mut p = plan(&d);
            // Ranks of the first grid row on one node, the others on another.
            route_off_node(&mut p, |peer| (peer < 3) != (rank < 3), staging, slot);
            p
        };
        let middle = routed(4);
        let north = middle.iter().find(|m| m.peer == 1).unwrap();
        let back = routed(1).into_iter().find(|b| b.peer == 4).unwrap();
        assert_eq!(north.inbox_out, back.inbox_in);
        assert_eq!(back.inbox_out, north.inbox_in);
        assert!(north.slot == slot as i64 && back.slot == slot as i64);
        let mut bufs: Vec<i64> = middle.iter().filter(|m| m.pack != 0).flat_map(|m| [m.pack, m.inbox_in]).collect();
        assert_eq!(bufs.len(), 6, "three neighbours of the first row are off-node");
        bufs.sort_unstable();
        bufs.dedup();
        assert_eq!(bufs.len(), 6, "every pack buffer and inbox of a rank is its own");
        assert!(bufs.iter().all(|&b| b >= staging as i64 && b + 2 * slot as i64 <= (staging + 32 * slot) as i64));
        assert!(middle.iter().filter(|m| m.peer >= 3).all(|m| m.pack == 0 && m.inbox_out == 0), "same node: direct");
        let d = Decomp::new(grid, 4, (30, 33), 2).unwrap();
        assert_eq!(staging_slot(&d, 8), (2 * 11 * 8usize).next_multiple_of(256));
    }
}
