//! The lab notebook's shared parts: how the probes time an operation and print its row.
//!
//! The probes in `src/bin` each served one investigation (where a small copy's time goes,
//! what a resident copy kernel costs, what a window's issue costs, the host path per leg,
//! the copy ping-pong floor); their findings are condensed in `docs/performance.md`. They
//! are not part of the product: `cargo build` at the root leaves this crate out, `cargo
//! build -p gpulmt-lab` builds it. The probes that time single driver calls call cudarc's
//! raw bindings directly (`cudarc::driver::sys`) on streams, events and pinned memory that
//! cudarc's safe API set up; gpulmt's own backend is what they compare against.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use cudarc::driver::{CudaContext, DeviceRepr, PinnedHostSlice, ValidAsZeroBits};

/// Runs `op` `warm + reps` times; the host-timed microseconds of the last `reps`.
pub fn timed(warm: usize, reps: usize, mut op: impl FnMut()) -> Vec<f64> {
    let mut t = Vec::with_capacity(reps);
    for i in 0..warm + reps {
        let x = Instant::now();
        op();
        if i >= warm {
            t.push(x.elapsed().as_secs_f64() * 1e6);
        }
    }
    t
}

/// Prints `probe,variant,median,mean,p90` of the samples (microseconds).
pub fn print_row(probe: &str, variant: &str, mut t: Vec<f64>) {
    let mean = t.iter().sum::<f64>() / t.len() as f64;
    t.sort_by(f64::total_cmp);
    println!("{probe},{variant},{:.3},{mean:.3},{:.3}", t[t.len() / 2], t[t.len() * 9 / 10]);
}

/// Calls a driver query (`cuStreamQuery`, `cuEventQuery`, ...) until it answers success,
/// spinning while it answers not ready; any other answer ends the probe, naming `what`.
pub fn spin_until_ready(what: &str, mut query: impl FnMut() -> CUresult) {
    loop {
        match query() {
            CUresult::CUDA_SUCCESS => return,
            CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
            r => panic!("{what} failed: {r:?}"),
        }
    }
}

/// `n` zeroed values of pinned host memory that kernels of every context can read and
/// write (a descriptor, a completion word): the allocation (freed when dropped), its host
/// address and its device address. cudarc allocates it; the device address is the one
/// driver query cudarc's safe API does not offer.
pub fn mapped_pinned<T: DeviceRepr + ValidAsZeroBits>(
    ctx: &Arc<CudaContext>,
    n: usize,
) -> (PinnedHostSlice<T>, *mut T, CUdeviceptr) {
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    // SAFETY: the memory is zeroed below before anything reads it.
    let mut slice = unsafe { ctx.alloc_pinned_with_flags::<T>(n, flags) }.expect("cuMemHostAlloc");
    let host = slice.as_mut_ptr().expect("pinned memory");
    // SAFETY: `host` is the start of the `n`-value allocation just made; all-zero bits are a
    // valid `T` (`ValidAsZeroBits`).
    unsafe { std::ptr::write_bytes(host, 0, n) };
    let mut dev = 0;
    // SAFETY: `host` was allocated with CU_MEMHOSTALLOC_DEVICEMAP; `dev` is a local out-value.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) }.result().expect("cuMemHostGetDevicePointer");
    (slice, host, dev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_keeps_only_the_timed_repetitions() {
        let mut calls = 0;
        let t = timed(3, 5, || calls += 1);
        assert_eq!(calls, 8);
        assert_eq!(t.len(), 5);
        assert!(t.iter().all(|&us| us >= 0.0));
    }

    #[test]
    fn spin_until_ready_returns_at_the_first_success() {
        let mut answers =
            [CUresult::CUDA_ERROR_NOT_READY, CUresult::CUDA_ERROR_NOT_READY, CUresult::CUDA_SUCCESS].into_iter();
        let mut asked = 0;
        spin_until_ready("query", || {
            asked += 1;
            answers.next().unwrap()
        });
        assert_eq!(asked, 3);
    }

    #[test]
    #[should_panic(expected = "cuStreamQuery failed")]
    fn spin_until_ready_names_a_failed_query() {
        spin_until_ready("cuStreamQuery", || CUresult::CUDA_ERROR_INVALID_VALUE);
    }
}
