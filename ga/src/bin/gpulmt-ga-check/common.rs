//! What the scenarios share: failing, a seeded generator, exact test values of every
//! element type, and buffers in host, device or registered memory.

use std::sync::atomic::AtomicU32;

use gpulmt::Context;
use gpulmt_ga::{Dst, Element, GlobalArray, Registered, Section, Src};

/// This rank, for failure messages.
pub static RANK: AtomicU32 = AtomicU32::new(u32::MAX);

/// Reports a failed check and exits.
pub fn fail(msg: String) -> ! {
    eprintln!("rank={} FAIL {msg}", RANK.load(std::sync::atomic::Ordering::Relaxed));
    std::process::exit(1)
}

/// Fails with the message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($c:expr, $($m:tt)*) => {
        if !$c {
            $crate::common::fail(format!($($m)*));
        }
    };
}

/// Unwraps, or fails saying what was being done.
pub trait OrFail<T> {
    fn or_fail(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> T {
        self.unwrap_or_else(|e| fail(format!("{what}: {e}")))
    }
}

/// splitmix64: the same sequence on every rank from the same seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x1234_5678)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A random section of an array of `dims` (never empty).
    pub fn section(&mut self, dims: [usize; 2]) -> Section {
        let (r0, c0) = (self.below(dims[0]), self.below(dims[1]));
        let (r1, c1) = (r0 + 1 + self.below(dims[0] - r0), c0 + 1 + self.below(dims[1] - c0));
        Section::new([r0, c0], [r1, c1])
    }
}

/// Element types with exact small integer values.
pub trait Val: Element {
    fn of(v: i64) -> Self;
}

impl Val for f32 {
    fn of(v: i64) -> Self {
        v as f32
    }
}
impl Val for f64 {
    fn of(v: i64) -> Self {
        v as f64
    }
}
impl Val for i32 {
    fn of(v: i64) -> Self {
        v as i32
    }
}
impl Val for i64 {
    fn of(v: i64) -> Self {
        v
    }
}

/// Where a local buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Host,
    Device,
    Registered,
}

impl Place {
    pub fn pick(rng: &mut Rng) -> Place {
        [Place::Host, Place::Device, Place::Registered][rng.below(3)]
    }
}

/// A scratch buffer in device memory, reused by every device-placed operation.
pub struct Scratch {
    pub addr: usize,
    pub bytes: usize,
}

impl Scratch {
    pub fn new(ctx: &mut Context, bytes: usize) -> Scratch {
        Scratch { addr: ctx.mem_alloc(bytes).or_fail("mem_alloc of the device scratch buffer"), bytes }
    }
}

/// Puts `data` into `s` of `a` (leading dimension `ld`) from a buffer at `place`.
pub fn put_from<T: Val>(
    ctx: &Context,
    a: &GlobalArray,
    s: Section,
    data: &[T],
    ld: usize,
    place: Place,
    dev: &Scratch,
) {
    acc_or_put(ctx, a, s, data, ld, place, dev, None)
}

/// Accumulates `scale * data` into `s` from a buffer at `place`.
#[allow(clippy::too_many_arguments)]
pub fn acc_or_put<T: Val>(
    ctx: &Context,
    a: &GlobalArray,
    s: Section,
    data: &[T],
    ld: usize,
    place: Place,
    dev: &Scratch,
    scale: Option<T>,
) {
    let op = |src: Src<'_, T>| match scale {
        None => a.put(ctx, s, src, ld),
        Some(k) => a.acc(ctx, s, src, ld, k),
    };
    let what = if scale.is_some() { "acc" } else { "put" };
    match place {
        Place::Host => op(Src::host(data)),
        Place::Registered => {
            let mut r = Registered::<T>::new(ctx, data.len()).or_fail("Registered::new");
            r.copy_from_slice(data);
            op((&r).into())
        }
        Place::Device => {
            let bytes = std::mem::size_of_val(data);
            ensure!(bytes <= dev.bytes, "scratch too small");
            // SAFETY: the scratch buffer holds `bytes`; `data` is a host slice of as many.
            unsafe { ctx.copy_sync(dev.addr, data.as_ptr() as usize, bytes) }.or_fail("filling the device buffer");
            // SAFETY: the scratch buffer is device memory of this rank holding `data.len()`
            // elements, used by nothing else meanwhile.
            op(unsafe { Src::raw(dev.addr as *const T, data.len()) })
        }
    }
    .or_fail(&format!("{what} {s} ld {ld} from {place:?}"));
}

/// Gets `s` of `a` into `out` (leading dimension `ld`) through a buffer at `place`.
pub fn get_into<T: Val>(
    ctx: &Context,
    a: &GlobalArray,
    s: Section,
    out: &mut [T],
    ld: usize,
    place: Place,
    dev: &Scratch,
) {
    let what = format!("get {s} ld {ld} into {place:?}");
    match place {
        Place::Host => a.get(ctx, s, Dst::host(out), ld).or_fail(&what),
        Place::Registered => {
            let mut r = Registered::<T>::new(ctx, out.len()).or_fail("Registered::new");
            r.copy_from_slice(out);
            a.get(ctx, s, &mut r, ld).or_fail(&what);
            out.copy_from_slice(&r);
        }
        Place::Device => {
            let bytes = std::mem::size_of_val(out);
            ensure!(bytes <= dev.bytes, "scratch too small");
            // SAFETY: as in acc_or_put: the buffer keeps `out`'s padding so that the
            // comparison can check that the get left it alone.
            unsafe { ctx.copy_sync(dev.addr, out.as_ptr() as usize, bytes) }.or_fail("filling the device buffer");
            // SAFETY: the scratch buffer holds `out.len()` elements, used by nothing else.
            a.get(ctx, s, unsafe { Dst::raw(dev.addr as *mut T, out.len()) }, ld).or_fail(&what);
            // SAFETY: as above, in the other direction.
            unsafe { ctx.copy_sync(out.as_mut_ptr() as usize, dev.addr, bytes) }.or_fail("reading the device buffer");
        }
    }
}
