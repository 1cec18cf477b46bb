//! The device API's benchmarks beside NVSHMEM's (`../shared/device/peers/nvshmem_lat.cu`):
//! the same kernels, sizes, iteration counts and CUDA-event timing, so the rows compare
//! one for one with the anchor's (`anchor,metric,bytes,value`):
//! - `gpulmt_put_signal_pingpong,half_rtt_us`: one block (512 threads) on PEs 0 and 1,
//!   `put_signal_nbi_block` and a signal wait each way, half the round trip;
//! - `gpulmt_put_block_1cta,GBps`: one block of 1024 threads on PE 0, `put_nbi_block` to
//!   PE 1 `iters` times, then quiet.
//!
//! Other ranks of the job take part in the barriers only.
//!
//! Across nodes ([`offnode`]): the queue path's put+quiet latency at 8 B, from the GPU and
//! from the host, and the time from a queue push to the proxy's pop.

use cudarc::driver::{CudaEvent, LaunchConfig, PushKernelArg};
use gpulmt::Context;

use super::{cuda_err, DeviceError, DeviceModule, Result};

/// The sizes of a run: 8 B, then times 8 up to `max` (the anchor's).
pub fn sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(8usize), |s| s.checked_mul(8)).take_while(|s| *s <= max).collect()
}

/// Ping-pong iterations at `size` (the anchor's).
pub fn pingpong_iters(size: usize) -> i32 {
    match size {
        s if s <= 65536 => 20000,
        s if s <= 4 << 20 => 2000,
        _ => 200,
    }
}

/// Bandwidth iterations at `size` (the anchor's).
pub fn putbw_iters(size: usize) -> i32 {
    match size {
        s if s <= 65536 => 10000,
        s if s <= 4 << 20 => 1000,
        _ => 100,
    }
}

fn event(m: &DeviceModule) -> Result<CudaEvent> {
    m.stream
        .context()
        .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda_err("creating an event"))
}

/// Runs both benchmarks up to `max` bytes; rank 0 returns the CSV rows (no header).
pub fn run(ctx: &mut Context, max: usize, unchecked: bool) -> Result<Vec<String>> {
    if ctx.size() < 2 {
        return Err(DeviceError("the device benchmarks need 2 ranks (PEs 0 and 1)".into()));
    }
    let pe = ctx.rank();
    let (dst, src, sig) = (ctx.sym_alloc(max)?, ctx.sym_alloc(max)?, ctx.sym_alloc(8)?);
    ctx.sym_atomic_set(sig.addr(), 0, pe)?;
    let opts: &[&str] = if unchecked { &["-DGPULMT_DEVICE_UNCHECKED"] } else { &[] };
    let m = DeviceModule::load(ctx, super::KERNELS, "device_perf.cu", opts)?;
    let suffix = if unchecked { "_unchecked" } else { "" };
    let (pingpong, putbw) = (m.function("pingpong")?, m.function("putbw")?);
    let (a, b) = (event(&m)?, event(&m)?);
    let (d, s, g) = (dst.addr() as u64, src.addr() as u64, sig.addr() as u64);
    let peer = 1 - pe.min(1) as i32;
    let mut rows = Vec::new();
    let mut base = 0i32;
    for size in sizes(max) {
        let iters = pingpong_iters(size);
        let warm = iters / 10;
        let bytes = size as u64;
        let launch = |count: i32, from: i32| -> Result<()> {
            if pe > 1 {
                return Ok(());
            }
            let mut l = m.stream.launch_builder(&pingpong);
            l.arg(&d).arg(&s).arg(&g).arg(&bytes).arg(&count).arg(&from).arg(&peer);
            let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (512, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: the arguments match pingpong's parameters; dst and src are symmetric
            // allocations of `max` >= `size` bytes, sig one word, on every rank.
            unsafe { l.launch(cfg) }.map(|_| ()).map_err(cuda_err("launching pingpong"))
        };
        ctx.barrier()?;
        launch(warm, base)?;
        base += warm;
        m.sync()?;
        ctx.barrier()?;
        a.record(&m.stream).map_err(cuda_err("recording an event"))?;
        launch(iters, base)?;
        base += iters;
        b.record(&m.stream).map_err(cuda_err("recording an event"))?;
        b.synchronize().map_err(cuda_err("waiting for pingpong"))?;
        let ms = a.elapsed_ms(&b).map_err(cuda_err("reading the events"))? as f64;
        if pe == 0 {
            rows.push(format!(
                "gpulmt_put_signal_pingpong{suffix},half_rtt_us,{size},{:.3}",
                ms * 1000.0 / iters as f64 / 2.0
            ));
        }
    }
    for size in sizes(max) {
        let iters = putbw_iters(size);
        let bytes = size as u64;
        ctx.barrier()?;
        if pe == 0 {
            let launch = |count: i32| -> Result<()> {
                let mut l = m.stream.launch_builder(&putbw);
                l.arg(&d).arg(&s).arg(&bytes).arg(&count).arg(&peer);
                let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
                // SAFETY: the arguments match putbw's parameters; as for pingpong.
                unsafe { l.launch(cfg) }.map(|_| ()).map_err(cuda_err("launching putbw"))
            };
            launch(iters / 10 + 1)?;
            m.sync()?;
            a.record(&m.stream).map_err(cuda_err("recording an event"))?;
            launch(iters)?;
            b.record(&m.stream).map_err(cuda_err("recording an event"))?;
            b.synchronize().map_err(cuda_err("waiting for putbw"))?;
            let ms = a.elapsed_ms(&b).map_err(cuda_err("reading the events"))? as f64;
            rows.push(format!(
                "gpulmt_put_block_1cta{suffix},GBps,{size},{:.3}",
                size as f64 * iters as f64 / (ms * 1e6)
            ));
        }
    }
    ctx.barrier()?;
    // Each PE's signal holds the last round's number: no round was lost or doubled.
    let last = ctx.sym_atomic_fetch(sig.addr(), pe)?;
    if pe <= 1 && last != base as u64 {
        return Err(DeviceError(format!("PE {pe}'s ping-pong signal ended at {last}, not {base}")));
    }
    for p in [dst, src, sig] {
        ctx.sym_free(p)?;
    }
    Ok(rows)
}

/// Iterations of the off-node latencies (each a round trip through the proxies).
pub const OFFNODE_ITERS: i32 = 2000;

/// The queue path's latencies, PE 0 to PE 1 on another node (`device_check --offnode`,
/// under mpirun with `GPULMT_PSEUDO_NODES=2`); rank 0 returns the rows:
/// - `gpulmt_offnode_put_quiet,lat_us,8`: one thread's `put_nbi` of 8 B and `quiet`;
/// - `gpulmt_gio_push_pop,rtt_us,0`: one thread's NOP push, waited for until its
///   completion (the proxy's pop and the counter's way back; MSCCL++ reports 1.97 us for
///   push to pop on H200);
/// - `gpulmt_offnode_put_quiet_host,lat_us,8`: the same put+quiet from the host
///   (`sym_put_nbi` and `sym_quiet` through the heap's host queue), the only row on sim.
pub fn offnode(ctx: &mut Context, iters: i32) -> Result<Vec<String>> {
    if ctx.size() < 2 || ctx.topology().on_node(1 - ctx.rank().min(1)) {
        return Err(DeviceError(
            "the off-node benchmarks need PEs 0 and 1 on different nodes (mpirun -np 2 with GPULMT_PSEUDO_NODES=2)"
                .into(),
        ));
    }
    let pe = ctx.rank();
    let (dst, src) = (ctx.sym_alloc(4096)?, ctx.sym_alloc(4096)?);
    let peer = 1 - pe.min(1) as i32;
    let mut rows = Vec::new();
    // The host's put+quiet.
    ctx.barrier()?;
    if pe == 0 {
        let byte = [7u8; 8];
        let lat = |n: i32| -> Result<f64> {
            let t = std::time::Instant::now();
            for _ in 0..n {
                // SAFETY: `byte` outlives the quiet that follows at once.
                unsafe { ctx.sym_put_nbi(dst.addr(), byte.as_ptr(), 8, peer as u32)? };
                ctx.sym_quiet()?;
            }
            Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
        };
        lat(iters / 10 + 1)?;
        rows.push(format!("gpulmt_offnode_put_quiet_host,lat_us,8,{:.3}", lat(iters)?));
    }
    ctx.barrier()?;
    if ctx.backend_kind() == gpulmt::device::BackendKind::Cuda {
        let m = DeviceModule::load(ctx, super::KERNELS, "device_offnode.cu", &[])?;
        let (putq, pushpop) = (m.function("put_quiet_lat")?, m.function("gio_push_pop")?);
        let (a, b) = (event(&m)?, event(&m)?);
        let (d, s, size) = (dst.addr() as u64, src.addr() as u64, 8u64);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
        if pe == 0 {
            for (count, timed) in [(iters / 10 + 1, false), (iters, true)] {
                a.record(&m.stream).map_err(cuda_err("recording an event"))?;
                let mut l = m.stream.launch_builder(&putq);
                l.arg(&d).arg(&s).arg(&size).arg(&count).arg(&peer);
                // SAFETY: the arguments match put_quiet_lat's; dst and src are symmetric
                // allocations of 4096 >= 8 bytes on every rank.
                unsafe { l.launch(one) }.map_err(cuda_err("launching put_quiet_lat"))?;
                b.record(&m.stream).map_err(cuda_err("recording an event"))?;
                b.synchronize().map_err(cuda_err("waiting for put_quiet_lat"))?;
                if timed {
                    let ms = a.elapsed_ms(&b).map_err(cuda_err("reading the events"))? as f64;
                    rows.push(format!("gpulmt_offnode_put_quiet,lat_us,8,{:.3}", ms * 1000.0 / count as f64));
                }
            }
            let mut stamps = m.stream.alloc_zeros::<u64>(2).map_err(cuda_err("allocating the stamps"))?;
            for count in [iters / 10 + 1, iters] {
                let mut l = m.stream.launch_builder(&pushpop);
                l.arg(&count).arg(&peer).arg(&mut stamps);
                // SAFETY: the arguments match gio_push_pop's; `stamps` holds 2 words.
                unsafe { l.launch(one) }.map_err(cuda_err("launching gio_push_pop"))?;
            }
            let t = m.stream.clone_dtoh(&stamps).map_err(cuda_err("reading the stamps"))?;
            if t[1] <= t[0] {
                return Err(DeviceError("gio_push_pop: this block has no GIO queue (sym_device_queues is 0)".into()));
            }
            rows.push(format!("gpulmt_gio_push_pop,rtt_us,0,{:.3}", (t[1] - t[0]) as f64 / 1000.0 / iters as f64));
        }
        ctx.barrier()?;
    }
    for p in [dst, src] {
        ctx.sym_free(p)?;
    }
    Ok(rows)
}
