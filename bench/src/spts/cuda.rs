//! SpTS on the GPU: the kernels (`kernels.cu`, compiled by NVRTC behind the device
//! header, without FMA contraction) and a rank's plan in device memory.

use std::mem::size_of;

use cudarc::driver::CudaFunction;
use gpulmt::Context;

use super::plan::RankPlan;
use super::{Result, SptsError};
use crate::device::DeviceModule;

/// The kernels: `spts_gio` and `spts_level`.
pub const SOURCE: &str = include_str!("kernels.cu");

/// NVRTC's options: every multiply and add rounded on its own, as the CPU reference.
pub const OPTIONS: [&str; 1] = ["--fmad=false"];

/// The file name NVRTC reports errors against.
pub const FILE: &str = "spts_kernels.cu";

/// Compiles [`SOURCE`] with NVRTC (no GPU needed); the error says what failed.
pub fn compile_check() -> std::result::Result<(), String> {
    gpulmt::sym::nvrtc::compile_device_kernels(SOURCE, FILE, &OPTIONS).map(drop)
}

/// Loads the kernels on the rank's GPU (collective: [`DeviceModule::load`]) and returns
/// the one named `kernel`.
pub fn load(ctx: &mut Context, kernel: &str) -> Result<(DeviceModule, CudaFunction)> {
    let m = DeviceModule::load(ctx, SOURCE, FILE, &OPTIONS)?;
    let f = m.function(kernel)?;
    Ok((m, f))
}

pub fn cuda(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> SptsError {
    move |e| SptsError::Cuda(format!("{what}: {e}"))
}

/// A rank's plan in device memory (addresses of `mem_alloc`ations), as the kernels take it.
pub struct DevicePlan {
    pub rows: u64,
    pub ptr: u64,
    /// The columns of the mode: global (gio) or xbuf positions (inter-k).
    pub col: u64,
    pub val: u64,
    pub diag: u64,
    pub b: u64,
    /// gio: each entry's flag word and awaited value (`RankPlan::fidx`, `tmul`, `tbase`).
    pub fidx: u64,
    pub tmul: u64,
    pub tbase: u64,
    pub cptr: u64,
    pub cons: u64,
    pub optr: u64,
    pub opos: u64,
    pub by_level: u64,
    /// gio's streams, flattened: each one's peer, its rows `srows[sptr[s]..sptr[s + 1]]`
    /// (local), its staging and destination positions in xbuf.
    pub nstreams: u32,
    pub speer: u64,
    pub sptr: u64,
    pub srows: u64,
    pub sstage: u64,
    pub sdst: u64,
    allocs: Vec<usize>,
}

impl DevicePlan {
    /// Copies `p` to the GPU, with the inter-k columns when `interk`.
    pub fn upload(ctx: &mut Context, p: &RankPlan, interk: bool) -> Result<DevicePlan> {
        let mut allocs = Vec::new();
        let col = if interk { &p.col_interk } else { &p.col };
        let st = &p.streams;
        let pos = |f: fn(&super::plan::Stream) -> usize| st.iter().map(|s| f(s) as u32).collect::<Vec<u32>>();
        let mut sptr = vec![0u32];
        sptr.extend(st.iter().scan(0u32, |acc, s| {
            *acc += s.rows.len() as u32;
            Some(*acc)
        }));
        let srows: Vec<u32> = st.iter().flat_map(|s| s.rows.iter().copied()).collect();
        Ok(DevicePlan {
            rows: upload(ctx, &p.rows, &mut allocs)?,
            ptr: upload(ctx, &p.ptr, &mut allocs)?,
            col: upload(ctx, col, &mut allocs)?,
            val: upload(ctx, &p.val, &mut allocs)?,
            diag: upload(ctx, &p.diag, &mut allocs)?,
            b: upload(ctx, &p.b, &mut allocs)?,
            fidx: upload(ctx, &p.fidx, &mut allocs)?,
            tmul: upload(ctx, &p.tmul, &mut allocs)?,
            tbase: upload(ctx, &p.tbase, &mut allocs)?,
            cptr: upload(ctx, &p.cptr, &mut allocs)?,
            cons: upload(ctx, &p.cons, &mut allocs)?,
            optr: upload(ctx, &p.optr, &mut allocs)?,
            opos: upload(ctx, &p.opos, &mut allocs)?,
            by_level: upload(ctx, &p.by_level, &mut allocs)?,
            nstreams: st.len() as u32,
            speer: upload(ctx, &st.iter().map(|s| s.peer).collect::<Vec<u32>>(), &mut allocs)?,
            sptr: upload(ctx, &sptr, &mut allocs)?,
            srows: upload(ctx, &srows, &mut allocs)?,
            sstage: upload(ctx, &pos(|s| s.stage), &mut allocs)?,
            sdst: upload(ctx, &pos(|s| s.dst), &mut allocs)?,
            allocs,
        })
    }

    pub fn release(self, ctx: &mut Context) -> Result<()> {
        for a in self.allocs {
            ctx.mem_free(a)?;
        }
        Ok(())
    }
}

/// A device copy of `v` (at least one word, so that an empty array has an address).
fn upload<T: Copy>(ctx: &mut Context, v: &[T], allocs: &mut Vec<usize>) -> Result<u64> {
    let bytes = std::mem::size_of_val(v);
    let d = ctx.mem_alloc(bytes.max(size_of::<u64>()))?;
    allocs.push(d);
    if bytes > 0 {
        // SAFETY: `d` is a fresh allocation of at least `bytes`; `v` holds `bytes` bytes of
        // plain values (u32 / f64).
        unsafe { ctx.copy_sync(d, v.as_ptr() as usize, bytes)? };
    }
    Ok(d as u64)
}
