//! Random arrays and random sections from every rank at once, against a serial
//! reference every rank keeps (all ranks draw from one seeded generator, so each knows
//! what every other did).
//!
//! Per array: rounds of (every rank puts a section, the sections of one round disjoint
//! so that the outcome does not depend on timing; sync; every rank gets a random section
//! and compares; every rank accumulates into a random section, overlaps allowed; sync;
//! compare again), then every rank gets the whole array. Buffers are host, device or
//! registered at random, with random leading dimensions; the padding between rows must
//! come back untouched from a get.

use gpulmt::Context;
use gpulmt_ga::{ElemType, GlobalArray, Layout, Section};

use crate::common::{acc_or_put, get_into, put_from, OrFail, Place, Rng, Scratch, Val};
use crate::ensure;

/// Arrays per type.
const ARRAYS: usize = 3;
/// The largest dimension drawn.
const DIM: usize = 40;
/// Value of the padding between a buffer's rows (never a value the test puts).
const PAD: i64 = -7777;

pub fn run(ctx: &mut Context, seed: u64, rounds: u32) {
    let mut rng = Rng::new(seed);
    let dev = Scratch::new(ctx, DIM * (DIM + 3) * 8);
    let mut checked = 0u64;
    let mut arrays = 0u64;
    for k in 0..ARRAYS * 4 {
        let dims = [1 + rng.below(DIM), 1 + rng.below(DIM)];
        let layout = pick_layout(&mut rng, ctx.size() as usize);
        let ty = [ElemType::F32, ElemType::F64, ElemType::I32, ElemType::I64][k % 4];
        checked += match ty {
            ElemType::F32 => one::<f32>(ctx, &mut rng, ty, dims, layout, rounds, &dev),
            ElemType::F64 => one::<f64>(ctx, &mut rng, ty, dims, layout, rounds, &dev),
            ElemType::I32 => one::<i32>(ctx, &mut rng, ty, dims, layout, rounds, &dev),
            ElemType::I64 => one::<i64>(ctx, &mut rng, ty, dims, layout, rounds, &dev),
        };
        arrays += 1;
    }
    println!("rank={} ga-random arrays={arrays} checked={checked}", ctx.rank());
}

fn pick_layout(rng: &mut Rng, n: usize) -> Layout {
    match rng.below(3) {
        0 => Layout::Block,
        1 => Layout::BlockCyclic { block: [1 + rng.below(6), 1 + rng.below(6)] },
        _ => {
            let divisors: Vec<usize> = (1..=n).filter(|d| n.is_multiple_of(*d)).collect();
            let d = divisors[rng.below(divisors.len())];
            let block = (rng.below(2) == 0).then(|| [1 + rng.below(8), 1 + rng.below(8)]);
            Layout::Grid { grid: [d, n / d], block }
        }
    }
}

/// The value rank `r` puts at element `(i, j)` in round `round`.
fn value(round: u32, r: u32, i: usize, j: usize) -> i64 {
    ((round as i64 * 131 + r as i64 * 17 + i as i64 * 7 + j as i64 * 3) % 97) + 1
}

/// A buffer holding `s` with leading dimension `ld`, elements from `f`, padding PAD.
fn buffer<T: Val>(s: &Section, ld: usize, f: impl Fn(usize, usize) -> i64) -> Vec<T> {
    let mut b = vec![T::of(PAD); (s.rows() - 1) * ld + s.cols()];
    for i in 0..s.rows() {
        for j in 0..s.cols() {
            b[i * ld + j] = T::of(f(s.lo[0] + i, s.lo[1] + j));
        }
    }
    b
}

#[allow(clippy::too_many_arguments)]
fn one<T: Val>(
    ctx: &mut Context,
    rng: &mut Rng,
    ty: ElemType,
    dims: [usize; 2],
    layout: Layout,
    rounds: u32,
    dev: &Scratch,
) -> u64 {
    let (me, n) = (ctx.rank(), ctx.size());
    let what = format!("{ty} {dims:?} {layout:?}");
    let mut a = GlobalArray::create(ctx, ty, dims, layout).or_fail(&format!("create {what}"));
    // The distribution covers the array once.
    let owned: usize =
        (0..n).map(|r| a.distribution(r).or_fail("distribution").iter().map(Section::len).sum::<usize>()).sum();
    ensure!(owned == dims[0] * dims[1], "{what}: the distribution covers {owned} elements");
    let mut reference = vec![0i64; dims[0] * dims[1]];
    let mut checked = 0;
    for round in 0..rounds {
        // Puts: disjoint sections, one per rank.
        let mut taken: Vec<Section> = Vec::new();
        let mut mine = None;
        for r in 0..n {
            let s = (0..10).map(|_| rng.section(dims)).find(|s| taken.iter().all(|t| !t.overlaps(s)));
            let (ld_pad, place) = (rng.below(3), Place::pick(rng));
            let Some(s) = s else { continue };
            taken.push(s);
            for i in s.lo[0]..s.hi[0] {
                for j in s.lo[1]..s.hi[1] {
                    reference[i * dims[1] + j] = value(round, r, i, j);
                }
            }
            if r == me {
                mine = Some((s, s.cols() + ld_pad, place));
            }
        }
        if let Some((s, ld, place)) = mine {
            let data = buffer::<T>(&s, ld, |i, j| value(round, me, i, j));
            put_from(ctx, &a, s, &data, ld, place, dev);
        }
        a.sync(ctx).or_fail("sync after puts");
        checked += check::<T>(ctx, rng, &a, &reference, dev, &what);
        // Accumulates: any sections, overlaps allowed.
        let mut mine = None;
        for r in 0..n {
            let s = rng.section(dims);
            let scale = [1i64, 2, -1, 3][rng.below(4)];
            let (ld_pad, place) = (rng.below(3), Place::pick(rng));
            for i in s.lo[0]..s.hi[0] {
                for j in s.lo[1]..s.hi[1] {
                    reference[i * dims[1] + j] += scale * value(round + 1000, r, i, j);
                }
            }
            if r == me {
                mine = Some((s, s.cols() + ld_pad, place, scale));
            }
        }
        let (s, ld, place, scale) = mine.expect("every rank accumulates");
        let data = buffer::<T>(&s, ld, |i, j| value(round + 1000, me, i, j));
        acc_or_put(ctx, &a, s, &data, ld, place, dev, Some(T::of(scale)));
        a.sync(ctx).or_fail("sync after accumulates");
        checked += check::<T>(ctx, rng, &a, &reference, dev, &what);
    }
    // The whole array, on every rank.
    let whole = Section::whole(dims);
    let mut out = vec![T::of(PAD); dims[0] * dims[1]];
    a.get(ctx, whole, &mut out, dims[1]).or_fail("get of the whole array");
    for (k, (got, want)) in out.iter().zip(&reference).enumerate() {
        ensure!(*got == T::of(*want), "{what}: element {k} is {got:?}, the reference says {want}");
    }
    a.destroy(ctx).or_fail("destroy");
    checked + out.len() as u64
}

/// Every rank gets a random section (random ld, random place) and compares it with the
/// reference, and the padding with PAD; returns the elements compared.
fn check<T: Val>(
    ctx: &mut Context,
    rng: &mut Rng,
    a: &GlobalArray,
    reference: &[i64],
    dev: &Scratch,
    what: &str,
) -> u64 {
    let dims = a.dims();
    let mut mine = None;
    for r in 0..ctx.size() {
        let s = rng.section(dims);
        let (ld_pad, place) = (rng.below(3), Place::pick(rng));
        if r == ctx.rank() {
            mine = Some((s, s.cols() + ld_pad, place));
        }
    }
    let (s, ld, place) = mine.expect("every rank checks");
    let mut out = vec![T::of(PAD); (s.rows() - 1) * ld + s.cols()];
    get_into(ctx, a, s, &mut out, ld, place, dev);
    for (k, got) in out.iter().enumerate() {
        let (i, j) = (k / ld, k % ld);
        let want = if j < s.cols() { reference[(s.lo[0] + i) * dims[1] + s.lo[1] + j] } else { PAD };
        ensure!(
            *got == T::of(want),
            "{what}: get {s} ld {ld} via {place:?}: element ({i},{j}) is {got:?}, expected {want}"
        );
    }
    // No rank writes again before every rank has compared.
    ctx.barrier().or_fail("barrier after the check");
    s.len() as u64
}
