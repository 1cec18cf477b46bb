//! GPU-initiated communication on the GPU: kernels that use the device API
//! (`include/gpulmt_device.cuh`), compiled at run time with NVRTC, loaded on the rank's
//! GPU with its device context, and launched by `device_check` (the conformance checks,
//! [`checks`], and the benchmarks beside NVSHMEM's anchor, [`perf`]) and by Stencil2D's
//! `gio` mode.
//!
//! Loading sets the module's `gpulmt_dctx` symbol from
//! [`gpulmt::Context::sym_device_ctx`], so the context must have its symmetric heap
//! (a `sym_alloc`) first. Kernels that wait for other PEs must run at the same time as
//! theirs: ranks sharing a GPU need MPS, and a kernel's grid must leave room for the
//! other ranks' ([`DeviceModule::resident_grid`]). Which ranks share it comes from the
//! GPUs' UUIDs, exchanged when a module loads: a node's rank table does not know, since
//! pseudo-nodes (`GPULMT_PSEUDO_NODES`) split one host, and one GPU, into several nodes.

pub mod checks;
pub mod perf;
pub mod watchdog;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use gpulmt::device::BackendKind;
use gpulmt::{Context, Tag};

/// The kernels of `device_check`.
pub const KERNELS: &str = include_str!("kernels.cu");

/// Tag of the GPU identities that ranks exchange when they load a module.
const GPU_ID_TAG: Tag = 210;

/// The kernels of [`KERNELS`] (every `extern "C" __global__` in it).
pub fn kernel_names(source: &str) -> Vec<&str> {
    source
        .split("extern \"C\" __global__ void ")
        .skip(1)
        .filter_map(|rest| rest.split('(').next())
        .map(str::trim)
        .collect()
}

/// A failed step, with what was attempted.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DeviceError(pub String);

impl From<gpulmt::Error> for DeviceError {
    fn from(e: gpulmt::Error) -> Self {
        DeviceError(e.to_string())
    }
}

/// The result of this module's calls.
pub type Result<T> = std::result::Result<T, DeviceError>;

/// Turns a driver error into a [`DeviceError`] naming the step.
pub fn cuda_err(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DeviceError {
    move |e| DeviceError(format!("CUDA: {what}: {e}"))
}

/// Kernels using the device API, loaded on one rank's GPU with its device context.
pub struct DeviceModule {
    pub stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    /// Multiprocessors of the GPU (for grids that must be resident).
    pub sms: u32,
    /// Ranks of the job on this GPU, of every node (pseudo-nodes share one): resident
    /// grids share it with theirs.
    pub ranks_here: u32,
    _cuda: Arc<CudaContext>,
}

impl DeviceModule {
    /// Compiles `kernels` behind the device header with NVRTC (`options` added), loads
    /// them on `ctx`'s GPU (its primary context, the one gpulmt's backend uses, so heap
    /// addresses are valid), and sets their `gpulmt_dctx`. Collective: every rank loads
    /// (the ranks learn which of them share a GPU).
    pub fn load(ctx: &mut Context, kernels: &str, name: &str, options: &[&str]) -> Result<Self> {
        if ctx.backend_kind() != BackendKind::Cuda {
            return Err(DeviceError(format!(
                "the device API runs on CUDA GPUs; this rank uses the {} backend",
                ctx.backend_kind()
            )));
        }
        let ptx = gpulmt::sym::nvrtc::compile_device_kernels(kernels, name, options).map_err(DeviceError)?;
        let cuda = CudaContext::new(ctx.device() as usize).map_err(cuda_err("retaining the primary context"))?;
        let module = cuda.load_module(ptx).map_err(cuda_err("loading the module"))?;
        let stream = cuda.new_stream().map_err(cuda_err("creating a stream"))?;
        let sms = cuda
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(cuda_err("reading the multiprocessor count"))? as u32;
        let d = ctx.sym_device_ctx()?;
        // SAFETY: DeviceCtx is repr(C) without padding (four 4-byte fields, then four
        // 8-byte ones), so all of its bytes are initialized; the view lives as long as `d`.
        let bytes = unsafe {
            std::slice::from_raw_parts((&d as *const gpulmt::sym::DeviceCtx).cast::<u8>(), std::mem::size_of_val(&d))
        };
        {
            let mut sym = module.get_global("gpulmt_dctx", &stream).map_err(cuda_err("finding gpulmt_dctx"))?;
            if sym.len() != bytes.len() {
                return Err(DeviceError(format!(
                    "the module's gpulmt_dctx has {} bytes, the library's context {}: build the kernels against \
                     this gpulmt's gpulmt_device.cuh",
                    sym.len(),
                    bytes.len()
                )));
            }
            stream.memcpy_htod(bytes, &mut sym).map_err(cuda_err("setting gpulmt_dctx"))?;
        }
        stream.synchronize().map_err(cuda_err("setting gpulmt_dctx"))?;
        let uuid = cuda.uuid().map_err(cuda_err("reading the GPU's UUID"))?.bytes.map(|b| b as u8);
        let ranks_here = ranks_sharing_gpu(ctx, uuid)?;
        Ok(DeviceModule { stream, module, sms, ranks_here, _cuda: cuda })
    }

    /// A kernel of the module.
    pub fn function(&self, name: &str) -> Result<CudaFunction> {
        self.module.load_function(name).map_err(|e| DeviceError(format!("CUDA: kernel {name}: {e}")))
    }

    /// The most blocks of `threads` threads of `f` that can be resident at once while
    /// every other rank on this GPU runs as many (the launch requirement of kernels
    /// that wait for each other's blocks and PEs: `gpulmt_sync_grid`, `barrier_all`).
    pub fn resident_grid(&self, f: &CudaFunction, threads: u32) -> Result<u32> {
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
            .map_err(cuda_err("asking the occupancy"))?;
        Ok((per_sm * self.sms / self.ranks_here.max(1)).max(1))
    }

    /// Waits for the module's stream.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().map_err(cuda_err("waiting for the kernels"))
    }
}

/// How many ranks of the job run on the GPU whose UUID is `uuid` (this rank's),
/// collective: rank 0 gathers every rank's UUID and sends the list back. UUIDs, not
/// device ordinals of a node: two pseudo-nodes of one host are two nodes on one GPU, and
/// a persistent grid sized as if it had the GPU alone leaves the other rank's kernel no
/// room to become resident (Stencil2D gio across 2 pseudo-nodes on one H200: 1024
/// blocks each where 1056 fit, and each kernel waited for the other's signals forever).
fn ranks_sharing_gpu(ctx: &mut Context, uuid: [u8; 16]) -> Result<u32> {
    let (me, n) = (ctx.rank() as usize, ctx.size() as usize);
    let mut all = vec![0u8; 16 * n];
    if me == 0 {
        all[..16].copy_from_slice(&uuid);
        for r in 1..n {
            ctx.recv(&mut all[16 * r..16 * (r + 1)], Some(r as u32), Some(GPU_ID_TAG))?;
        }
        for r in 1..n {
            ctx.send(&all, r as u32, GPU_ID_TAG)?;
        }
    } else {
        ctx.send(&uuid, 0, GPU_ID_TAG)?;
        ctx.recv(&mut all, Some(0), Some(GPU_ID_TAG))?;
    }
    Ok(count_equal(&all, &uuid))
}

/// The 16-byte records of `all` equal to `uuid`.
fn count_equal(all: &[u8], uuid: &[u8; 16]) -> u32 {
    all.chunks_exact(16).filter(|id| *id == uuid).count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pseudo-nodes on one GPU and a third rank on another: the ranks of the shared
    /// GPU count each other, the other counts itself.
    #[test]
    fn ranks_on_one_gpu_count_each_other_across_nodes() {
        let (a, b) = ([7u8; 16], [9u8; 16]);
        let all: Vec<u8> = [a, a, b].concat();
        assert_eq!(count_equal(&all, &a), 2);
        assert_eq!(count_equal(&all, &b), 1);
    }
}
