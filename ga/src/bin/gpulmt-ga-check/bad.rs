//! Every bad input is refused with its error, and nothing is written outside the array
//! (nor inside it); short messages around a ring.

use gpulmt::Context;
use gpulmt_ga::{recv_msg, send_msg, Dst, ElemType, GaError, GlobalArray, Layout, Section, Src};

use crate::common::OrFail;
use crate::ensure;

/// Checks that `r` is the error `want` names, and counts it.
fn refused<T: std::fmt::Debug>(count: &mut u64, what: &str, r: Result<T, GaError>, want: fn(&GaError) -> bool) {
    match r {
        Err(e) if want(&e) => {
            ensure!(!e.to_string().is_empty(), "{what}: an empty message");
            *count += 1;
        }
        Err(e) => crate::common::fail(format!("{what}: refused with the wrong error: {e}")),
        Ok(v) => crate::common::fail(format!("{what}: accepted ({v:?})")),
    }
}

fn oob(e: &GaError) -> bool {
    matches!(e, GaError::OutOfBounds { .. })
}
fn mismatch(e: &GaError) -> bool {
    matches!(e, GaError::TypeMismatch { .. })
}
fn small(e: &GaError) -> bool {
    matches!(e, GaError::BufferTooSmall { .. })
}
fn invalid(e: &GaError) -> bool {
    matches!(e, GaError::InvalidArgument(_))
}
fn destroyed(e: &GaError) -> bool {
    matches!(e, GaError::Destroyed { .. })
}

pub fn run(ctx: &mut Context) {
    let (me, n) = (ctx.rank(), ctx.size());
    let dims = [6, 5];
    let mut a = GlobalArray::create(ctx, ElemType::I32, dims, Layout::BlockCyclic { block: [2, 2] }).or_fail("create");
    let pattern: Vec<i32> = (0..30).map(|k| k * 3 + 1).collect();
    if me == 0 {
        a.put(ctx, Section::whole(dims), &pattern, 5).or_fail("put of the pattern");
    }
    a.sync(ctx).or_fail("sync");
    let mut k = 0u64;
    let big = vec![9i32; 100];
    let mut out = vec![0i32; 100];
    // Sections outside the array, or inverted.
    for s in [
        Section::new([0, 0], [7, 2]),
        Section::new([5, 4], [6, 6]),
        Section::new([3, 0], [2, 2]),
        Section::new([6, 0], [7, 1]),
    ] {
        refused(&mut k, "put out of bounds", a.put(ctx, s, &big, 10), oob);
        refused(&mut k, "get out of bounds", a.get(ctx, s, &mut out, 10), oob);
        refused(&mut k, "acc out of bounds", a.acc(ctx, s, &big, 10, 1), oob);
        refused(&mut k, "locate out of bounds", a.locate(s), oob);
    }
    // Another element type.
    let s = Section::new([1, 1], [3, 4]);
    refused(&mut k, "put of f64", a.put(ctx, s, &vec![1.0f64; 6], 3), mismatch);
    refused(&mut k, "get into i64", a.get(ctx, s, &mut vec![0i64; 6], 3), mismatch);
    refused(&mut k, "acc of f32", a.acc(ctx, s, &vec![1.0f32; 6], 3, 1.0), mismatch);
    // Buffers too small for the section with their leading dimension (2 rows of 3:
    // 3 + 3 with ld 3, 4 + 3 with ld 4).
    refused(&mut k, "put from 5", a.put(ctx, s, &big[..5], 3), small);
    refused(&mut k, "get into 6 with ld 4", a.get(ctx, s, &mut out[..6], 4), small);
    refused(&mut k, "acc from 6 with ld 4", a.acc(ctx, s, &big[..6], 4, 1), small);
    // SAFETY: never dereferenced: the call is refused for the length alone.
    refused(&mut k, "put_nb from a raw 2", a.put_nb(ctx, s, unsafe { Src::raw(big.as_ptr(), 2) }, 3), small);
    refused(&mut k, "get_nb into a raw 2", a.get_nb(ctx, s, Dst::host(&mut out[..2]), 3), small);
    // A leading dimension below the section's width.
    refused(&mut k, "put with ld 2", a.put(ctx, s, &big, 2), invalid);
    // Ranks and layouts that do not exist.
    refused(&mut k, "distribution of rank n", a.distribution(n), invalid);
    refused(&mut k, "create with a zero dim", GlobalArray::create(ctx, ElemType::F32, [0, 3], Layout::Block), invalid);
    refused(
        &mut k,
        "create on a grid of other size",
        GlobalArray::create(ctx, ElemType::F32, [4, 4], Layout::Grid { grid: [n as usize + 1, 1], block: None }),
        invalid,
    );
    // Ranks that disagree: every rank fails, none waits.
    refused(
        &mut k,
        "create with different dims per rank",
        GlobalArray::create(ctx, ElemType::F64, [4 + me as usize, 4], Layout::Block),
        invalid,
    );
    refused(&mut k, "send_msg to rank n", send_msg(ctx, n, b"x"), invalid);
    // Sizes whose arithmetic overflows (issue 46): refused, never wrapped to a small size.
    for dims in [[usize::MAX, 2], [1 << 33, 1 << 33], [1 << 61, 1]] {
        refused(
            &mut k,
            "create beyond the address space",
            GlobalArray::create(ctx, ElemType::F64, dims, Layout::Block),
            invalid,
        );
    }
    refused(
        &mut k,
        "create on a grid whose size overflows",
        GlobalArray::create(ctx, ElemType::F32, [4, 4], Layout::Grid { grid: [usize::MAX, 2], block: None }),
        invalid,
    );
    refused(
        &mut k,
        "register SIZE_MAX bytes",
        gpulmt_ga::Registered::<i64>::new(ctx, usize::MAX / 8 + 1).map(|r| r.len()),
        invalid,
    );
    // SAFETY: never read: the call is refused on its sizes before any copy.
    let huge = unsafe { Src::raw(big.as_ptr(), usize::MAX) };
    refused(
        &mut k,
        "put with an ld that overflows",
        a.put(ctx, Section::new([0, 0], [3, 2]), huge, usize::MAX / 2),
        invalid,
    );
    // A device buffer freed by mem_free + mem_free_commit: refused, not read (isend refuses it too).
    let dev = ctx.mem_alloc(4096).or_fail("mem_alloc");
    ctx.mem_free(dev).or_fail("mem_free");
    ctx.mem_free_commit().or_fail("mem_free_commit");
    // SAFETY: never read: the freed range is refused before any copy.
    let freed = unsafe { Src::raw(dev as *const i32, 1024) };
    refused(&mut k, "put from a freed device buffer", a.put(ctx, Section::new([0, 0], [2, 2]), freed, 2), |e| {
        matches!(e, GaError::Transport(_)) && e.to_string().contains("released")
    });
    // Nothing changed: the array still holds the pattern, on every rank's view.
    a.sync(ctx).or_fail("sync after the refusals");
    let mut whole = vec![0i32; 30];
    a.get(ctx, Section::whole(dims), &mut whole, 5).or_fail("get");
    ensure!(whole == pattern, "a refused call changed the array: {whole:?}");
    // Nor was the buffer of a refused get written.
    ensure!(out.iter().all(|&v| v == 0), "a refused get wrote its buffer");
    // The heap is still usable: another array after the refused creates.
    let mut b = GlobalArray::create(ctx, ElemType::I64, [3, 3], Layout::Block).or_fail("create after refusals");
    b.destroy(ctx).or_fail("destroy b");
    // A destroyed array refuses everything.
    a.destroy(ctx).or_fail("destroy");
    refused(&mut k, "put after destroy", a.put(ctx, s, &big, 3), destroyed);
    refused(&mut k, "get after destroy", a.get(ctx, s, &mut out, 3), destroyed);
    refused(&mut k, "acc after destroy", a.acc(ctx, s, &big, 3, 1), destroyed);
    refused(&mut k, "locate after destroy", a.locate(s), destroyed);
    refused(&mut k, "distribution after destroy", a.distribution(0), destroyed);
    refused(&mut k, "local after destroy", a.local(), destroyed);
    refused(&mut k, "fence after destroy", a.fence(ctx), destroyed);
    refused(&mut k, "destroy twice", a.destroy(ctx), destroyed);
    println!("rank={me} ga-bad refused={k}");
}

/// `iters` rounds of a ring of short messages (each rank to its right neighbour), of
/// sizes 1..=256 bytes; a message longer than the receive buffer fails.
pub fn messages(ctx: &mut Context, iters: u32) {
    let (me, n) = (ctx.rank(), ctx.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let payload = |from: u32, i: u32, len: usize| -> Vec<u8> {
        (0..len).map(|k| (from as usize * 31 + i as usize * 7 + k) as u8).collect()
    };
    let mut buf = vec![0u8; 256];
    let start = std::time::Instant::now();
    for i in 0..iters {
        let len = 1 + (i as usize * 37) % 256;
        send_msg(ctx, right, &payload(me, i, len)).or_fail("send_msg");
        let (from, got) = recv_msg(ctx, Some(left), &mut buf).or_fail("recv_msg");
        ensure!(from == left && got == len, "message {i}: {got} bytes from {from}, expected {len} from {left}");
        ensure!(buf[..got] == payload(left, i, len), "message {i} from {left} has other bytes");
    }
    let per = start.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
    // A message longer than the buffer is refused on the receiver.
    send_msg(ctx, right, &[1u8; 64]).or_fail("send_msg of 64 bytes");
    let e = recv_msg(ctx, Some(left), &mut buf[..8]).map(|_| ()).expect_err("a 64-byte message into 8 bytes must fail");
    ensure!(e.to_string().to_lowercase().contains("trunc"), "truncation says so: {e}");
    ctx.barrier().or_fail("barrier");
    println!("rank={me} ga-msg rounds={iters} round_us={}", per as u64);
}
