//! `--check`: the gathered result of a run against the single-rank CPU reference
//! ([`kernel::reference`]), value by value; and `--corrupt-rank`, which makes one value
//! wrong to show that the check catches it.

use std::mem::size_of;

use gpulmt::Context;

use super::grid::Decomp;
use super::kernel::{self, Real, Weights};
use super::{Result, StencilError};

/// The tag of the fields gathered to rank 0.
const FIELD_TAG: gpulmt::Tag = 202;

/// How far a result is from the reference.
pub struct CheckError {
    pub max_rel: f64,
    pub points: usize,
    pub differing: usize,
    /// Global coordinates of the largest relative error, if any value differs.
    pub worst: Option<(usize, usize)>,
}

/// Copies a field's interior to the host.
fn interior_of<T: Real>(ctx: &Context, d: &Decomp, field: usize) -> Result<Vec<T>> {
    let mut all = vec![T::default(); d.len()];
    // SAFETY: `field` is one of the run's two fields, allocations of `d.len()` values from
    // mem_alloc that no transfer writes between steps; `all` holds as many.
    unsafe { ctx.copy_sync(all.as_mut_ptr() as usize, field, d.len() * size_of::<T>())? };
    Ok(d.extract_interior(&all))
}

/// Gathers the result to rank 0 and compares it with the CPU reference there
/// (`steps` steps); None on the other ranks.
pub fn check<T: Real>(
    ctx: &mut Context,
    d: &Decomp,
    field: usize,
    w: &Weights<T>,
    steps: usize,
) -> Result<Option<CheckError>> {
    let mine = interior_of::<T>(ctx, d, field)?;
    let as_bytes = |v: &[T]| {
        // SAFETY: f32/f64 have no padding and every byte pattern is a valid u8.
        unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
    };
    if ctx.rank() != 0 {
        ctx.send(as_bytes(&mine), 0, FIELD_TAG)?;
        return Ok(None);
    }
    let (gr, gc) = d.global;
    let mut result = vec![T::default(); gr * gc];
    for r in 0..ctx.size() {
        let b = Decomp::new(d.grid, r, d.global, d.halo).map_err(StencilError::Config)?;
        let block = if r == 0 {
            mine.clone()
        } else {
            let mut v = vec![T::default(); b.local.0 * b.local.1];
            // SAFETY: as above; any bytes make valid f32/f64 values.
            let buf = unsafe {
                std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v.as_slice()))
            };
            ctx.recv(buf, Some(r), Some(FIELD_TAG))?;
            v
        };
        for (i, row) in block.chunks(b.local.1).enumerate() {
            let at = (b.offset.0 + i) * gc + b.offset.1;
            result[at..at + b.local.1].copy_from_slice(row);
        }
    }
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let want = kernel::reference::<T>(d.global, w, steps, threads);
    let mut err = CheckError { max_rel: 0.0, points: want.len(), differing: 0, worst: None };
    for (k, (got, want)) in result.iter().zip(&want).enumerate() {
        if got.same_bits(*want) {
            continue;
        }
        err.differing += 1;
        let (g, w) = (got.to_f64(), want.to_f64());
        let rel = (g - w).abs() / w.abs().max(f64::MIN_POSITIVE);
        // NaN compares false: count it as infinitely wrong.
        let rel = if rel.is_nan() { f64::INFINITY } else { rel };
        if err.worst.is_none() || rel > err.max_rel {
            err.max_rel = rel;
            err.worst = Some((k / gc, k % gc));
        }
    }
    Ok(Some(err))
}

/// Adds 1 to the first interior value of `field` (for testing the check).
pub fn corrupt<T: Real>(ctx: &Context, d: &Decomp, field: usize) -> Result<()> {
    let at = field + (d.halo * d.pitch() + d.halo) * size_of::<T>();
    let mut v = T::default();
    // SAFETY: `at` is a value inside `field`, one of the run's two fields (allocations of
    // `d.len()` values from mem_alloc) that no transfer uses between steps; `v` is one value.
    unsafe {
        ctx.copy_sync(&mut v as *mut T as usize, at, size_of::<T>())?;
        v = v + T::from_f64(1.0);
        ctx.copy_sync(at, &v as *const T as usize, size_of::<T>())?;
    }
    Ok(())
}
