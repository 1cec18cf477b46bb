//! The arithmetic of Stencil2D: the 9-point weighted stencil, the initial and
//! boundary values, and the single-rank CPU reference.
//!
//! The CPU code here serves both the sim devices (whose memory the CPU reads and
//! writes directly) and the reference that `--check` compares against, so the two can
//! only differ in what the decomposition does. `kernels.cu` restates [`point`] for
//! CUDA with the same association order; compiled with `--fmad=false` (the default,
//! see [`super::compute`]) it rounds exactly like this code, because Rust never
//! contracts a multiply and an add into an FMA.

use std::ops::{Add, Mul, Range};

use cudarc::driver::DeviceRepr;

use super::grid::Decomp;

/// The CUDA kernels, compiled at run time with `real` defined as the precision's type.
pub const CUDA_SOURCE: &str = include_str!("kernels.cu");

/// The floating-point types of `--precision`.
pub trait Real:
    Copy
    + Default
    + PartialEq
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Mul<Output = Self>
    + DeviceRepr
{
    /// The `--precision` value.
    const NAME: &'static str;
    /// The type in CUDA C.
    const C_TYPE: &'static str;
    /// Unit roundoff, for the tolerance of a check against FMA-contracted kernels.
    const EPSILON: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Whether two values are the same bits (bit-identical results, NaN included).
    fn same_bits(self, other: Self) -> bool;
}

impl Real for f32 {
    const NAME: &'static str = "single";
    const C_TYPE: &'static str = "float";
    const EPSILON: f64 = f32::EPSILON as f64;
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn same_bits(self, other: Self) -> bool {
        self.to_bits() == other.to_bits()
    }
}

impl Real for f64 {
    const NAME: &'static str = "double";
    const C_TYPE: &'static str = "double";
    const EPSILON: f64 = f64::EPSILON;
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn same_bits(self, other: Self) -> bool {
        self.to_bits() == other.to_bits()
    }
}

/// The stencil's weights, in the working precision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Weights<T> {
    pub center: T,
    pub cardinal: T,
    pub diagonal: T,
}

impl<T: Real> Weights<T> {
    pub fn new(center: f64, cardinal: f64, diagonal: f64) -> Self {
        Weights { center: T::from_f64(center), cardinal: T::from_f64(cardinal), diagonal: T::from_f64(diagonal) }
    }
}

/// The new value of the point at the centre of three 3-element windows (rows above,
/// at and below it). The association order is part of the contract with
/// `kernels.cu`: change both or neither.
#[inline(always)]
pub fn point<T: Real>(w: &Weights<T>, up: &[T], mid: &[T], down: &[T]) -> T {
    let cardinal = ((up[1] + down[1]) + mid[0]) + mid[2];
    let diagonal = ((up[0] + up[2]) + down[0]) + down[2];
    (w.center * mid[1] + w.cardinal * cardinal) + w.diagonal * diagonal
}

/// One row: `out[j]` from columns `j..j+3` of the three input rows, which are two
/// elements longer than `out`.
pub(super) fn stencil_row<T: Real>(w: &Weights<T>, up: &[T], mid: &[T], down: &[T], out: &mut [T]) {
    let n = out.len();
    let (up, mid, down) = (&up[..n + 2], &mid[..n + 2], &down[..n + 2]);
    for (((o, u), m), d) in out.iter_mut().zip(up.windows(3)).zip(mid.windows(3)).zip(down.windows(3)) {
        *o = point(w, u, m, d);
    }
}

/// Applies the stencil to columns `cols` of every row of `dst`, a band of whole rows
/// of a pitched array; `src` is the same band of the source array plus the row above
/// and the row below it. Splits the band over `threads` threads (the result does not
/// depend on the split).
pub fn stencil_band<T: Real>(
    w: &Weights<T>,
    src: &[T],
    dst: &mut [T],
    pitch: usize,
    cols: Range<usize>,
    threads: usize,
) {
    assert!(pitch > 0, "zero pitch");
    assert_eq!(dst.len() % pitch, 0, "band of {} elements with pitch {pitch}", dst.len());
    assert_eq!(src.len(), dst.len() + 2 * pitch, "the source band must have one more row on each side");
    assert!(cols.start >= 1 && cols.end < pitch && cols.start <= cols.end, "columns {cols:?} of a {pitch}-wide array");
    let rows = dst.len() / pitch;
    // Bands of fewer rows cost more in thread start-up than they save.
    let threads = threads.clamp(1, (rows / 64).max(1));
    let per = rows.div_ceil(threads);
    let (c0, c1) = (cols.start, cols.end);
    let band = |first: usize, out: &mut [T]| {
        for (i, out_row) in out.chunks_mut(pitch).enumerate() {
            let at = |r: usize| &src[r * pitch + c0 - 1..r * pitch + c1 + 1];
            // Row `first + i` of dst is row `first + i + 1` of src.
            let r = first + i;
            stencil_row(w, at(r), at(r + 1), at(r + 2), &mut out_row[c0..c1]);
        }
    };
    if threads == 1 {
        band(0, dst);
        return;
    }
    std::thread::scope(|s| {
        for (b, chunk) in dst.chunks_mut(per * pitch).enumerate() {
            let band = &band;
            s.spawn(move || band(b * per, chunk));
        }
    });
}

/// Copies a `rows x cols` block between pitched arrays (element pitches): the CPU
/// version of `copy_block` in `kernels.cu`, which packs and unpacks halo columns.
///
/// # Safety
/// Both blocks must be valid for their pitched extent, not overlap, and not be
/// accessed by anyone else during the copy.
pub unsafe fn copy_block_raw<T: Copy>(
    dst: *mut T,
    dst_pitch: usize,
    src: *const T,
    src_pitch: usize,
    rows: usize,
    cols: usize,
) {
    for r in 0..rows {
        // SAFETY: row `r < rows` of both blocks lies in their pitched extent, which the caller
        // guarantees valid, disjoint and unshared.
        unsafe { std::ptr::copy_nonoverlapping(src.add(r * src_pitch), dst.add(r * dst_pitch), cols) };
    }
}

/// SplitMix64: a well-mixed hash of a cell's coordinates, cheap and reproducible.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The value of global cell `(i, j)` before step 0: pseudo-random in [0, 1) inside
/// the domain (SHOC starts from random data), another pseudo-random field outside it,
/// the fixed boundary. 24-bit fractions are exact in both precisions, so single and
/// double runs start from the same numbers.
pub fn initial_value(i: i64, j: i64, global: (usize, usize)) -> f64 {
    let inside = (0..global.0 as i64).contains(&i) && (0..global.1 as i64).contains(&j);
    let salt: u64 = if inside { 0x5354_454E_4349_4C32 } else { 0x424F_554E_4441_5259 };
    let h = mix(salt ^ mix(((i as u64) << 32) ^ (j as u64 & 0xFFFF_FFFF)));
    (h >> 40) as f64 / (1u64 << 24) as f64
}

/// A rank's local array (ghost cells included) before step 0. Ghost cells inside the
/// domain get their initial values too, though the first exchange overwrites them.
pub fn initial_field<T: Real>(d: &Decomp) -> Vec<T> {
    let p = d.pitch();
    (0..d.len())
        .map(|k| {
            let (i, j) = d.global_of(k / p, k % p);
            T::from_f64(initial_value(i, j, d.global))
        })
        .collect()
}

/// The whole problem on one rank: `steps` steps on the global interior with the
/// stencil code the sim devices run; returns the interior, row-major.
pub fn reference<T: Real>(global: (usize, usize), w: &Weights<T>, steps: usize, threads: usize) -> Vec<T> {
    let d = Decomp::single(global);
    let (p, rect) = (d.pitch(), d.step_region(0));
    let mut a = initial_field::<T>(&d);
    let mut b = a.clone();
    for _ in 0..steps {
        stencil_band(
            w,
            &a[(rect.r0 - 1) * p..(rect.r1 + 1) * p],
            &mut b[rect.r0 * p..rect.r1 * p],
            p,
            rect.c0..rect.c1,
            threads,
        );
        std::mem::swap(&mut a, &mut b);
    }
    d.extract_interior(&a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn point_weights_the_neighbourhood() {
        let w = Weights::<f64>::new(0.25, 0.15, 0.05);
        let (up, mid, down) = ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]);
        let want = 0.25 * 5.0 + 0.15 * (2.0 + 8.0 + 4.0 + 6.0) + 0.05 * (1.0 + 3.0 + 7.0 + 9.0);
        assert!((point(&w, &up, &mid, &down) - want).abs() < 1e-12);
    }

    #[test]
    fn threads_do_not_change_the_result() {
        let w = Weights::<f32>::new(0.25, 0.15, 0.05);
        let one = reference::<f32>((300, 70), &w, 5, 1);
        let four = reference::<f32>((300, 70), &w, 5, 4);
        assert!(one.iter().zip(&four).all(|(a, b)| a.same_bits(*b)));
    }

    #[test]
    fn initial_values_are_exact_in_single() {
        for (i, j) in [(-1, 0), (0, 0), (5, 7), (1000, -3)] {
            let v = initial_value(i, j, (100, 100));
            assert!((0.0..1.0).contains(&v));
            assert_eq!(v as f32 as f64, v);
        }
        assert_ne!(initial_value(0, 0, (1, 1)), initial_value(0, 1, (1, 1)));
    }
}
