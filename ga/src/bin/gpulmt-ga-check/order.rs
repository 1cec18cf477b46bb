//! Ordering, exact accumulate totals, and non-blocking operations under fence.

use gpulmt::Context;
use gpulmt_ga::{Dst, ElemType, GlobalArray, Layout, Section, Src};

use crate::common::{OrFail, Rng};
use crate::ensure;

/// Rows of each rank's band in the ordering scenario.
const BAND: usize = 6;
/// Columns of its array.
const COLS: usize = 17;

/// Each rank works in its own band of rows (owned by several ranks: block-cyclic tiles
/// of 2x3), issuing overlapping puts, a get and an accumulate back to back, blocking and
/// not, with no fence in between: each must see the one before.
pub fn run(ctx: &mut Context, rounds: u32) {
    let (me, n) = (ctx.rank(), ctx.size());
    let dims = [BAND * n as usize, COLS];
    let mut a = GlobalArray::create(ctx, ElemType::F64, dims, Layout::BlockCyclic { block: [2, 3] }).or_fail("create");
    let mut rng = Rng::new(77 + me as u64);
    let band =
        |s: Section| Section::new([s.lo[0] + BAND * me as usize, s.lo[1]], [s.hi[0] + BAND * me as usize, s.hi[1]]);
    let mut checks = 0u64;
    for round in 0..rounds {
        let s1 = band(rng.section([BAND, COLS]));
        // s2 overlaps s1 (shares s1's first element) and may reach beyond it.
        let s2 = Section::new(
            s1.lo,
            [s1.lo[0] + 1 + rng.below(BAND - (s1.lo[0] % BAND)), s1.lo[1] + 1 + rng.below(COLS - s1.lo[1])],
        );
        let (v1, v2) = (round as f64 * 2.0 + 1.0, round as f64 * 2.0 + 2.0);
        let b1 = vec![v1; s1.len()];
        let b2 = vec![v2; s2.len()];
        let nb = round % 2 == 1;
        if nb {
            let h1 = a.put_nb(ctx, s1, Src::host(&b1), s1.cols()).or_fail("put_nb s1");
            let h2 = a.put_nb(ctx, s2, Src::host(&b2), s2.cols()).or_fail("put_nb s2");
            h2.wait().or_fail("wait s2");
            h1.wait().or_fail("wait s1");
        } else {
            a.put(ctx, s1, &b1, s1.cols()).or_fail("put s1");
            a.put(ctx, s2, &b2, s2.cols()).or_fail("put s2");
        }
        // Accumulate 0.5 onto s2, then read the union's bounding box right away.
        a.acc(ctx, s2, &vec![1.0; s2.len()], s2.cols(), 0.5).or_fail("acc s2");
        let bb = Section::new(s1.lo, [s1.hi[0].max(s2.hi[0]), s1.hi[1].max(s2.hi[1])]);
        let mut out = vec![f64::NAN; bb.len()];
        a.get(ctx, bb, &mut out, bb.cols()).or_fail("get");
        for i in bb.lo[0]..bb.hi[0] {
            for j in bb.lo[1]..bb.hi[1] {
                let e = Section::new([i, j], [i + 1, j + 1]);
                let got = out[(i - bb.lo[0]) * bb.cols() + j - bb.lo[1]];
                if s2.overlaps(&e) {
                    ensure!(got == v2 + 0.5, "round {round}: ({i},{j}) in s2 {s2} is {got}, not {}", v2 + 0.5);
                    checks += 1;
                } else if s1.overlaps(&e) {
                    ensure!(got == v1, "round {round}: ({i},{j}) in s1 {s1} only is {got}, not {v1}");
                    checks += 1;
                }
            }
        }
    }
    a.destroy(ctx).or_fail("destroy");
    println!("rank={me} ga-order checks={checks}");
}

/// Every rank accumulates `times` times into one section of an i64 and an f64 array
/// (block-cyclic: the section spans several owners): the totals are exact.
pub fn acc_total(ctx: &mut Context, times: u32) {
    let (me, n) = (ctx.rank(), ctx.size());
    let dims = [7, 9];
    let s = Section::new([1, 2], [6, 8]);
    let layout = Layout::BlockCyclic { block: [2, 2] };
    let mut ai = GlobalArray::create(ctx, ElemType::I64, dims, layout).or_fail("create i64");
    let mut af = GlobalArray::create(ctx, ElemType::F64, dims, layout).or_fail("create f64");
    let xi: Vec<i64> = (0..s.len() as i64).map(|k| k + 1).collect();
    let xf: Vec<f64> = xi.iter().map(|&v| v as f64).collect();
    for _ in 0..times {
        ai.acc(ctx, s, &xi, s.cols(), 2).or_fail("acc i64");
        af.acc(ctx, s, &xf, s.cols(), 2.0).or_fail("acc f64");
    }
    ai.sync(ctx).or_fail("sync");
    let mut gi = vec![0i64; dims[0] * dims[1]];
    let mut gf = vec![0f64; dims[0] * dims[1]];
    ai.get(ctx, Section::whole(dims), &mut gi, dims[1]).or_fail("get i64");
    af.get(ctx, Section::whole(dims), &mut gf, dims[1]).or_fail("get f64");
    let mut total = 0i64;
    for i in 0..dims[0] {
        for j in 0..dims[1] {
            let inside = Section::new([i, j], [i + 1, j + 1]).overlaps(&s);
            let want = if inside { xi[(i - 1) * s.cols() + j - 2] * 2 * times as i64 * n as i64 } else { 0 };
            ensure!(gi[i * dims[1] + j] == want, "i64 ({i},{j}) is {}, not {want}", gi[i * dims[1] + j]);
            ensure!(gf[i * dims[1] + j] == want as f64, "f64 ({i},{j}) is {}, not {want}", gf[i * dims[1] + j]);
            total += want;
        }
    }
    ai.destroy(ctx).or_fail("destroy i64");
    af.destroy(ctx).or_fail("destroy f64");
    println!("rank={me} ga-acc total={total}");
}

/// Non-blocking puts of disjoint sections (rank r's columns), fence, sync: every rank
/// sees them all; non-blocking gets and accumulates completed by their handles.
pub fn non_blocking(ctx: &mut Context) {
    let (me, n) = (ctx.rank(), ctx.size() as usize);
    let dims = [12, 4 * n];
    let mut a = GlobalArray::create(ctx, ElemType::I32, dims, Layout::Block).or_fail("create");
    let cols = Section::new([0, 4 * me as usize], [12, 4 * me as usize + 4]);
    let mine: Vec<i32> = (0..cols.len() as i32).map(|k| k + 100 * me as i32).collect();
    // Four puts of three rows each, all in flight before the fence.
    let handles: Vec<_> = (0..4)
        .map(|q| {
            let s = Section::new([3 * q, cols.lo[1]], [3 * q + 3, cols.hi[1]]);
            a.put_nb(ctx, s, Src::host(&mine[12 * q..12 * q + 12]), 4).or_fail("put_nb")
        })
        .collect();
    a.fence(ctx).or_fail("fence");
    ensure!(handles.iter().all(|h| h.test()), "a put is incomplete after fence");
    drop(handles);
    a.sync(ctx).or_fail("sync");
    let mut whole = vec![0i32; dims[0] * dims[1]];
    {
        let h = a.get_nb(ctx, Section::whole(dims), Dst::host(&mut whole), dims[1]).or_fail("get_nb");
        h.wait().or_fail("wait get");
    }
    for r in 0..n {
        for i in 0..12 {
            for j in 0..4 {
                let want = (i * 4 + j) as i32 + 100 * r as i32;
                ensure!(whole[i * dims[1] + 4 * r + j] == want, "rank {r}'s ({i},{j}) is wrong after fence and sync");
            }
        }
    }
    // Overlapping non-blocking operations from one rank, no fence between them: eight
    // puts of the same strided block (a column band, rows of another rank's tiles too),
    // a get after the fifth sees the fifth, and the last put wins. Each handle is waited
    // on, out of order.
    a.sync(ctx).or_fail("sync");
    let bufs: Vec<Vec<i32>> = (1..=8).map(|v| vec![v * 1000 + me as i32; cols.len()]).collect();
    let mut seen = vec![0i32; cols.len()];
    {
        let ctx: &Context = ctx;
        let mut handles = Vec::new();
        for b in &bufs[..5] {
            handles.push(a.put_nb(ctx, cols, Src::host(b), 4).or_fail("overlapping put_nb"));
        }
        let seen_h = a.get_nb(ctx, cols, Dst::host(&mut seen), 4).or_fail("get_nb between puts");
        for b in &bufs[5..] {
            handles.push(a.put_nb(ctx, cols, Src::host(b), 4).or_fail("overlapping put_nb"));
        }
        seen_h.wait().or_fail("wait get_nb");
        ensure!(handles.iter().all(|h| h.test()), "the wait on the get completed every earlier operation");
        for h in handles.into_iter().rev() {
            h.wait().or_fail("wait put_nb");
        }
    }
    ensure!(seen.iter().all(|&v| v == 5000 + me as i32), "a get issued after the fifth put saw {:?}", &seen[..4]);
    a.get(ctx, cols, &mut seen, 4).or_fail("get after the puts");
    ensure!(seen.iter().all(|&v| v == 8000 + me as i32), "the last put did not win: {:?}", &seen[..4]);
    // Put them back (a blocking put behind a non-blocking one of the same section, no
    // wait between: the blocking one lands last).
    let h = a.put_nb(ctx, cols, Src::host(&bufs[0]), 4).or_fail("put_nb before put");
    a.put(ctx, cols, &mine, 4).or_fail("put behind put_nb");
    h.wait().or_fail("wait put_nb before put");
    a.get(ctx, cols, &mut seen, 4).or_fail("get after put");
    ensure!(seen == mine, "a blocking put behind a non-blocking one did not land last");
    // No rank accumulates before every rank has compared.
    a.sync(ctx).or_fail("sync");
    let ones = vec![1i32; dims[0] * dims[1]];
    a.acc_nb(ctx, Section::whole(dims), Src::host(&ones), dims[1], 1).or_fail("acc_nb").wait().or_fail("wait acc");
    a.sync(ctx).or_fail("sync");
    a.get(ctx, Section::whole(dims), &mut whole, dims[1]).or_fail("get");
    ensure!(whole[0] == n as i32, "after every rank's acc_nb, (0,0) is {}", whole[0]);
    // An operation left pending at destroy: the destroy completes it, and a wait after
    // it is an error that says so (only a detached operation can outlive the borrow of
    // the context that destroy needs). Every rank has compared before any rank puts.
    a.sync(ctx).or_fail("sync");
    let pending = {
        let h = a.put_nb(ctx, cols, Src::host(&mine), 4).or_fail("put_nb before destroy");
        // SAFETY: `mine` lives, unchanged, until the end of this function.
        unsafe { h.into_pending() }
    };
    a.destroy(ctx).or_fail("destroy");
    match pending.wait(ctx) {
        Err(gpulmt_ga::GaError::Destroyed { .. }) => {}
        other => crate::common::fail(format!("a wait after destroy gave {other:?}, not Destroyed")),
    }
    println!("rank={me} ga-nb ok=1");
}
