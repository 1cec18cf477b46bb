//! Where Stencil2D's arithmetic runs: CUDA kernels on the rank's GPU, or the CPU on
//! the memory of a sim device. Both sit behind [`Compute`], so the time loop and the
//! halo exchange are the same code for both backends.
//!
//! Work goes to two queues, as the overlap mode needs: the *compute* queue runs the
//! stencil, the *comm* queue packs and unpacks halo columns. On CUDA they are two
//! streams of the rank's primary context (the one gpulmt's backend retains too, so
//! `mem_alloc` pointers are valid in it); on sim, where every call completes before it
//! returns, the queues are only an ordering and the synchronisation calls do nothing.
//!
//! gpulmt's copy engines do not wait for either queue: whatever a message reads must
//! be complete (`sync_compute`/`sync_comm`) before it is sent, and the stencil must be
//! ordered after the unpacking of received halos (`compute_after_comm`).

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use gpulmt::device::BackendKind;
use gpulmt::Context;

use super::grid::Rect;
use super::kernel::{self, Real, Weights, CUDA_SOURCE};
use super::{Result, StencilError};

/// The operations of a time step. Addresses are gpulmt device addresses in bytes;
/// pitches, rows and columns count elements.
pub trait Compute<T: Real> {
    /// For the report: what runs the arithmetic, and how.
    fn describe(&self) -> String;

    /// Queues one stencil step on `rect` of the arrays at `src` and `dst` (the same
    /// layout, `pitch` elements per row) on the compute queue.
    fn stencil(&mut self, src: usize, dst: usize, pitch: usize, rect: Rect) -> Result<()>;

    /// Queues one stencil step on each of `rects` on the comm queue, behind the
    /// unpacking queued there: the overlap mode's boundary, which then runs beside
    /// the interior still computing on the compute queue instead of after it. The
    /// rectangles must not overlap what the compute queue writes meanwhile.
    fn stencil_on_comm(&mut self, src: usize, dst: usize, pitch: usize, rects: &[Rect]) -> Result<()>;

    /// Queues a copy of a `rows x cols` block between pitched arrays on the comm queue
    /// (packing and unpacking of halo columns).
    fn copy_block(
        &mut self,
        dst: usize,
        dst_pitch: usize,
        src: usize,
        src_pitch: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()>;

    /// Waits for the compute queue.
    fn sync_compute(&mut self) -> Result<()>;

    /// Waits for the comm queue.
    fn sync_comm(&mut self) -> Result<()>;

    /// Orders later compute-queue work after the comm-queue work queued so far,
    /// without blocking the host.
    fn compute_after_comm(&mut self) -> Result<()>;

    /// Remembers the compute queue's current end (everything queued on it so far), for
    /// [`comm_after_checkpoint`](Self::comm_after_checkpoint).
    fn compute_checkpoint(&mut self) -> Result<()>;

    /// Orders later comm-queue work after the last checkpoint of the compute queue,
    /// without blocking the host (the compute queue is not held up).
    fn comm_after_checkpoint(&mut self) -> Result<()>;

    /// Waits on the host until the compute queue has passed its last checkpoint (work
    /// queued after it may still run).
    fn wait_checkpoint(&mut self) -> Result<()>;

    /// `--timeline`: starts recording GPU timestamps at [`Mark`]s for up to `batches`
    /// batches; false where the backend has no device clock (sim).
    fn enable_timeline(&mut self, _batches: usize) -> Result<bool> {
        Ok(false)
    }

    /// Records `mark` of the current batch on its queue (nothing unless enabled).
    fn mark(&mut self, _mark: Mark) -> Result<()> {
        Ok(())
    }

    /// Ends the current batch's marks (the next mark starts another batch). Nothing is
    /// read back until [`Self::timeline`], so the timeline adds no host wait between
    /// batches.
    fn end_batch(&mut self) {}

    /// After the last batch completed: every recorded batch's times, the first
    /// `skip` batches (warm-up) left out.
    fn timeline(&mut self, _skip: usize) -> Result<Vec<BatchTimes>> {
        Ok(Vec::new())
    }
}

/// Points of a batch the timeline records (`--timeline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Compute queue, before the batch's first kernel (or, in the modes that exchange
    /// first, before the exchange is posted).
    Start = 0,
    /// Compute queue, after the first step's main kernel: the interior in the overlap
    /// mode, the whole step otherwise.
    Kernel = 1,
    /// Comm queue, after the exchange's last work there (the overlap mode's boundary).
    Comm = 2,
    /// Compute queue, after the batch's last kernel.
    End = 3,
}

/// GPU times of one batch, microseconds after its start.
#[derive(Clone, Copy, Debug, Default)]
pub struct BatchTimes {
    pub kernel: f64,
    pub comm: f64,
    pub end: f64,
    /// From the previous batch's end to this one's start: the device idles while the
    /// host synchronizes and queues (None for the first batch).
    pub gap: Option<f64>,
}

/// The implementation for the context's backend, on the device the rank is bound to.
pub fn for_context<T: Real>(ctx: &Context, weights: Weights<T>, fmad: bool) -> Result<Box<dyn Compute<T>>> {
    match ctx.backend_kind() {
        BackendKind::Sim => Ok(Box::new(SimCompute { weights })),
        BackendKind::Cuda => Ok(Box::new(CudaCompute::new(ctx.device(), weights, fmad)?)),
    }
}

/// The CPU on sim device memory.
///
/// A sim device pointer is the address of a shared-memory mapping in this process, so
/// the stencil runs on it in place, through slices made from the raw addresses rather
/// than copies through `copy_sync` (which would double the memory traffic). The slices
/// cover exactly the rows a step reads (`src`) and writes (`dst`); no transfer in
/// flight touches them, which is what makes them sound while the sim copy engines run:
/// the overlap mode's interior reads no ghost row a receive may be writing (see
/// [`super::grid::Decomp::inner_region`]), and every other step runs while no
/// transfer is in flight.
pub struct SimCompute<T> {
    weights: Weights<T>,
}

impl<T: Real> Compute<T> for SimCompute<T> {
    fn describe(&self) -> String {
        "CPU on sim device memory (in place)".into()
    }

    fn stencil(&mut self, src: usize, dst: usize, pitch: usize, rect: Rect) -> Result<()> {
        if rect.is_empty() {
            return Ok(());
        }
        // SAFETY: src and dst are distinct allocations of at least (r1 + 1) * pitch
        // elements (the region never touches the outermost ring); during the call no
        // one writes the rows taken from src (copy engines may read them: sends) and
        // no one else touches the rows of dst (see the type's documentation).
        let (src_rows, dst_rows) = unsafe {
            (
                std::slice::from_raw_parts((src as *const T).add((rect.r0 - 1) * pitch), (rect.rows() + 2) * pitch),
                std::slice::from_raw_parts_mut((dst as *mut T).add(rect.r0 * pitch), rect.rows() * pitch),
            )
        };
        // One thread: the ranks of a sim job share the host's cores already.
        kernel::stencil_band(&self.weights, src_rows, dst_rows, pitch, rect.c0..rect.c1, 1);
        Ok(())
    }

    fn stencil_on_comm(&mut self, src: usize, dst: usize, pitch: usize, rects: &[Rect]) -> Result<()> {
        // One queue in effect: every call has completed when it returns.
        rects.iter().try_for_each(|r| self.stencil(src, dst, pitch, *r))
    }

    fn copy_block(
        &mut self,
        dst: usize,
        dst_pitch: usize,
        src: usize,
        src_pitch: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        // SAFETY: the caller's blocks lie in live allocations, in different buffers
        // (a field and a message buffer), and no transfer uses them during the call.
        unsafe { kernel::copy_block_raw(dst as *mut T, dst_pitch, src as *const T, src_pitch, rows, cols) };
        Ok(())
    }

    fn sync_compute(&mut self) -> Result<()> {
        Ok(())
    }

    fn sync_comm(&mut self) -> Result<()> {
        Ok(())
    }

    fn compute_after_comm(&mut self) -> Result<()> {
        Ok(())
    }

    fn compute_checkpoint(&mut self) -> Result<()> {
        Ok(())
    }

    fn comm_after_checkpoint(&mut self) -> Result<()> {
        Ok(())
    }

    fn wait_checkpoint(&mut self) -> Result<()> {
        Ok(())
    }
}

/// Threads per block of the stencil: a warp along a row, 8 rows.
const STENCIL_BLOCK: (u32, u32) = (32, 8);
/// Threads per block of `copy_block`.
const COPY_BLOCK: u32 = 256;

fn cuda_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> StencilError {
    move |e| StencilError::Cuda(format!("{what}: {e}"))
}

/// NVRTC-compiled kernels on the rank's GPU.
pub struct CudaCompute<T> {
    device: u32,
    name: String,
    fmad: bool,
    weights: Weights<T>,
    compute: Arc<CudaStream>,
    comm: Arc<CudaStream>,
    /// Recorded on the comm stream and waited for by the compute stream; one event
    /// reused, rather than one created per exchange.
    comm_done: CudaEvent,
    /// The compute stream's checkpoint, waited for by the comm stream.
    checkpoint: CudaEvent,
    stencil: CudaFunction,
    copy: CudaFunction,
    /// `--timeline`: a set of timing events per batch, read back after the run.
    marks: Option<Timeline>,
    /// Holds the primary context retained for as long as the streams live.
    _ctx: Arc<CudaContext>,
    _real: PhantomData<T>,
}

impl<T: Real> CudaCompute<T> {
    /// Compiles the kernels for `T` and loads them on device `device`. `fmad` lets
    /// NVRTC contract multiply-adds into FMAs (faster, but no longer bit-identical to
    /// the CPU reference).
    pub fn new(device: u32, weights: Weights<T>, fmad: bool) -> Result<Self> {
        // cudarc panics when it cannot load a library; ask first and say what to do.
        // SAFETY: only tries to dlopen the library.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(StencilError::Cuda(
                "libnvrtc (the CUDA runtime compiler) was not found: install the CUDA toolkit's NVRTC \
                 or add its lib64 directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        // The primary context: the one gpulmt's CUDA backend uses for this device.
        let ctx = CudaContext::new(device as usize).map_err(cuda_err("retaining the primary context"))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let source = format!("typedef {} real;\n{}", T::C_TYPE, CUDA_SOURCE);
        let opts = CompileOptions { fmad: Some(fmad), name: Some("stencil2d.cu".into()), ..Default::default() };
        let ptx = compile_ptx_with_opts(source, opts).map_err(|e| StencilError::Cuda(format!("NVRTC: {e:?}")))?;
        let module = ctx.load_module(ptx).map_err(cuda_err("loading the stencil module"))?;
        let stencil = module.load_function("stencil9").map_err(cuda_err("stencil9"))?;
        let copy = module.load_function("copy_block").map_err(cuda_err("copy_block"))?;
        let compute = ctx.new_stream().map_err(cuda_err("creating the compute stream"))?;
        // The comm stream gets the highest priority: in the overlap mode its small pack
        // and unpack kernels would otherwise wait for SMs until the interior kernel's
        // last blocks are scheduled, and the halos would not move during it.
        // (The context is current: CudaContext::new bound it to this thread.)
        let (_, highest) =
            cudarc::driver::result::stream::get_priority_range().map_err(cuda_err("stream priorities"))?;
        let comm = ctx.new_stream_with_priority(highest).map_err(cuda_err("creating the comm stream"))?;
        let comm_done = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(cuda_err("creating an event"))?;
        let checkpoint = ctx
            .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(cuda_err("creating an event"))?;
        Ok(CudaCompute {
            device,
            name,
            fmad,
            weights,
            compute,
            comm,
            comm_done,
            checkpoint,
            stencil,
            copy,
            marks: None,
            _ctx: ctx,
            _real: PhantomData,
        })
    }
}

/// Timing events of every batch; `cur` is the batch being recorded.
struct Timeline {
    sets: Vec<[CudaEvent; 4]>,
    cur: usize,
}

impl<T: Real> Compute<T> for CudaCompute<T> {
    fn describe(&self) -> String {
        format!(
            "CUDA kernels (NVRTC, --fmad={}) on GPU {} ({})",
            if self.fmad { "true" } else { "false" },
            self.device,
            self.name
        )
    }

    fn stencil(&mut self, src: usize, dst: usize, pitch: usize, rect: Rect) -> Result<()> {
        self.launch_stencil(&self.compute, src, dst, pitch, rect)
    }

    fn stencil_on_comm(&mut self, src: usize, dst: usize, pitch: usize, rects: &[Rect]) -> Result<()> {
        rects.iter().try_for_each(|r| self.launch_stencil(&self.comm, src, dst, pitch, *r))
    }

    fn copy_block(
        &mut self,
        dst: usize,
        dst_pitch: usize,
        src: usize,
        src_pitch: usize,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let n = rows * cols;
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: ((n as u32).div_ceil(COPY_BLOCK), 1, 1),
            block_dim: (COPY_BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (dst, dst_pitch, src, src_pitch) = (dst as u64, dst_pitch as u64, src as u64, src_pitch as u64);
        let (rows, cols) = (rows as u32, cols as u32);
        let mut launch = self.comm.launch_builder(&self.copy);
        launch.arg(&dst).arg(&dst_pitch).arg(&src).arg(&src_pitch).arg(&rows).arg(&cols);
        // SAFETY: the arguments match copy_block's parameters; the blocks lie in
        // allocations of the caller.
        unsafe { launch.launch(cfg) }.map_err(cuda_err("launching copy_block"))?;
        Ok(())
    }

    fn sync_compute(&mut self) -> Result<()> {
        self.compute.synchronize().map_err(cuda_err("synchronizing the compute stream"))
    }

    fn sync_comm(&mut self) -> Result<()> {
        self.comm.synchronize().map_err(cuda_err("synchronizing the comm stream"))
    }

    fn compute_after_comm(&mut self) -> Result<()> {
        self.comm_done.record(&self.comm).map_err(cuda_err("recording the comm event"))?;
        self.compute.wait(&self.comm_done).map_err(cuda_err("ordering compute after comm"))
    }

    fn compute_checkpoint(&mut self) -> Result<()> {
        self.checkpoint.record(&self.compute).map_err(cuda_err("recording the compute checkpoint"))
    }

    fn comm_after_checkpoint(&mut self) -> Result<()> {
        self.comm.wait(&self.checkpoint).map_err(cuda_err("ordering comm after the compute checkpoint"))
    }

    fn wait_checkpoint(&mut self) -> Result<()> {
        self.checkpoint.synchronize().map_err(cuda_err("waiting for the compute checkpoint"))
    }

    fn enable_timeline(&mut self, batches: usize) -> Result<bool> {
        let ctx = self.compute.context().clone();
        let ev = || {
            ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(cuda_err("creating a timing event"))
        };
        let sets = (0..batches).map(|_| Ok([ev()?, ev()?, ev()?, ev()?])).collect::<Result<Vec<_>>>()?;
        self.marks = Some(Timeline { sets, cur: 0 });
        Ok(true)
    }

    fn mark(&mut self, mark: Mark) -> Result<()> {
        let Some(t) = &self.marks else { return Ok(()) };
        let Some(set) = t.sets.get(t.cur) else { return Ok(()) };
        let stream = if mark == Mark::Comm { &self.comm } else { &self.compute };
        set[mark as usize].record(stream).map_err(cuda_err("recording a timeline mark"))
    }

    fn end_batch(&mut self) {
        if let Some(t) = &mut self.marks {
            t.cur += 1;
        }
    }

    fn timeline(&mut self, skip: usize) -> Result<Vec<BatchTimes>> {
        let Some(t) = &self.marks else { return Ok(Vec::new()) };
        let us = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b).map(|ms| ms as f64 * 1e3).map_err(cuda_err("reading a timeline mark"))
        };
        let n = t.cur.min(t.sets.len());
        (skip.min(n)..n)
            .map(|i| {
                let set = &t.sets[i];
                Ok(BatchTimes {
                    kernel: us(&set[0], &set[1])?,
                    comm: us(&set[0], &set[2])?,
                    end: us(&set[0], &set[3])?,
                    gap: if i > 0 { Some(us(&t.sets[i - 1][3], &set[0])?) } else { None },
                })
            })
            .collect()
    }
}

impl<T: Real> CudaCompute<T> {
    /// Queues stencil9 on `rect` on `stream`.
    fn launch_stencil(&self, stream: &Arc<CudaStream>, src: usize, dst: usize, pitch: usize, rect: Rect) -> Result<()> {
        if rect.is_empty() {
            return Ok(());
        }
        // Thin strips (the overlap mode's boundary, a few rows) in blocks one row high: an
        // 8-row block over a 1-row strip leaves 7 of 8 threads idle while holding an SM
        // slot the interior kernel beside it could use.
        let (bx, by) =
            if rect.rows() < STENCIL_BLOCK.1 as usize { (STENCIL_BLOCK.0 * STENCIL_BLOCK.1, 1) } else { STENCIL_BLOCK };
        let cfg = LaunchConfig {
            grid_dim: ((rect.cols() as u32).div_ceil(bx), (rect.rows() as u32).div_ceil(by), 1),
            block_dim: (bx, by, 1),
            shared_mem_bytes: 0,
        };
        let (src, dst, pitch) = (src as u64, dst as u64, pitch as u64);
        let (r0, r1, c0, c1) = (rect.r0 as u32, rect.r1 as u32, rect.c0 as u32, rect.c1 as u32);
        let w = self.weights;
        let mut launch = stream.launch_builder(&self.stencil);
        launch.arg(&src).arg(&dst).arg(&pitch).arg(&r0).arg(&r1).arg(&c0).arg(&c1);
        launch.arg(&w.center).arg(&w.cardinal).arg(&w.diagonal);
        // SAFETY: the arguments match stencil9's parameters in order and type; the
        // region keeps every access inside the two arrays.
        unsafe { launch.launch(cfg) }.map_err(cuda_err("launching stencil9"))?;
        Ok(())
    }
}
