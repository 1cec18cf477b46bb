//! The symmetric heap across ranks, through its host operations (the device side runs
//! on GPUs: `device_check` in the bench crate).
//!
//! Every rank allocates the same objects and prints their offsets (the test compares
//! them across ranks); then a ring of put_signal (each rank's data lands in its right
//! neighbour's heap before the signal it waits for), gets from the left neighbour,
//! exact totals of concurrent fetch-adds on rank 0's word, a compare-swap election, the
//! collective checks (different sizes on different ranks fail everywhere, and the heap
//! stays usable), the freed allocation refused, and the same offsets after a free. With
//! `--expect-unmapped` (peer access off between devices) only ranks of one device map
//! each other's heaps, and operations to the others are refused with a clear error; with
//! `--mismatched-heap` the ranks' heap sizes differ and the first allocation fails on all.

use gpulmt::sym::{Cmp, Signal, SignalOp};
use gpulmt::{Context, Rank, SymPtr};

use crate::report::OrFail;

/// Fetch-adds each rank makes on rank 0's counter.
const ADDS: u64 = 1000;
/// Bytes each rank puts into its neighbour's buffer.
const PIECE: usize = 3000;

fn pattern(rank: Rank, i: usize) -> u8 {
    (i as u64).wrapping_mul(31).wrapping_add(rank as u64 * 7 + 1) as u8
}

pub fn run(ctx: &mut Context, expect_unmapped: bool, mismatched_heap: bool) {
    let (me, n) = (ctx.rank(), ctx.size());
    if mismatched_heap {
        let e = ctx.sym_alloc(64).map(|_| ()).expect_err("heaps of different sizes must be refused");
        ensure!(e.to_string().contains("same GPULMT_SYM_HEAP"), "mismatched heaps: {e}");
        println!("rank={me} symheap refused=1");
        return;
    }
    let data = ctx.sym_alloc(PIECE).or_fail("sym_alloc of the data buffer");
    let sigs = ctx.sym_alloc(8 * n as usize).or_fail("sym_alloc of the signals");
    let counter = ctx.sym_alloc(16).or_fail("sym_alloc of the counter");
    let mapped: Vec<Rank> = (0..n).filter(|&r| ctx.sym_ptr(data.addr(), r).is_some()).collect();
    println!(
        "rank={me} symheap data={} sigs={} counter={} mapped={}",
        data.offset(),
        sigs.offset(),
        counter.offset(),
        mapped.len()
    );
    if expect_unmapped {
        unmapped(ctx, data, &mapped);
        finish_frees(ctx, [data, sigs, counter]);
        return;
    }
    ensure!(mapped.len() == n as usize, "mapped only {mapped:?} of {n} heaps with peer access everywhere");

    // Zero what the others will write, then wait until every rank has.
    for (p, len) in [(sigs, 8 * n as usize), (counter, 16)] {
        let zeros = vec![0u8; len];
        // SAFETY: a host buffer of `len` bytes.
        unsafe { ctx.sym_put(p.addr(), zeros.as_ptr(), len, me) }.or_fail("zeroing our own words");
    }
    ctx.barrier().or_fail("barrier after zeroing");

    // A ring of put_signal: our piece into the right neighbour, then its signal.
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let piece: Vec<u8> = (0..PIECE).map(|i| pattern(me, i)).collect();
    // SAFETY: `piece` holds PIECE readable bytes.
    unsafe {
        ctx.sym_put_signal(
            data.addr(),
            piece.as_ptr(),
            PIECE,
            Signal { addr: sigs.at(8 * me as usize), value: 1, op: SignalOp::Add },
            right,
        )
    }
    .or_fail("put_signal to the right neighbour");
    let seen = ctx
        .sym_signal_wait_until(sigs.at(8 * left as usize), Cmp::Ge, 1, Some(crate::report::PROMPTLY))
        .or_fail("waiting for the left neighbour's signal");
    ensure!(seen == Some(1), "left neighbour's signal: {seen:?}");
    let mut got = vec![0u8; PIECE];
    // SAFETY: `got` holds PIECE writable bytes.
    unsafe { ctx.sym_get(got.as_mut_ptr(), data.addr(), PIECE, me) }.or_fail("reading our own heap");
    ensure!((0..PIECE).all(|i| got[i] == pattern(left, i)), "the left neighbour's data is not in our heap");
    // A get from the left neighbour's heap: what its own left neighbour put there, once
    // every rank has seen its piece arrive.
    ctx.barrier().or_fail("barrier after the ring");
    let grand = (left + n - 1) % n;
    // SAFETY: as above.
    unsafe { ctx.sym_get(got.as_mut_ptr(), data.addr(), PIECE, left) }.or_fail("get from the left neighbour");
    ensure!((0..PIECE).all(|i| got[i] == pattern(grand, i)), "get from rank {left} read wrong bytes");

    // Concurrent fetch-adds from every rank on rank 0's word: exact totals.
    let mut olds = Vec::with_capacity(ADDS as usize);
    for _ in 0..ADDS {
        olds.push(ctx.sym_atomic_fetch_add(counter.addr(), 1, 0).or_fail("fetch-add on rank 0"));
    }
    ensure!(olds.windows(2).all(|w| w[0] < w[1]), "one rank's fetch-adds returned values out of order");
    // A compare-swap election on rank 0's second word: exactly one rank wins.
    let old = ctx.sym_atomic_compare_swap(counter.at(8), 0, me as u64 + 1, 0).or_fail("compare-swap on rank 0");
    let won = u8::from(old == 0);
    ctx.barrier().or_fail("barrier after the atomics");
    let total = ctx.sym_atomic_fetch(counter.addr(), 0).or_fail("fetch of rank 0's counter");
    ensure!(total == ADDS * n as u64, "rank 0's counter is {total}, not {}", ADDS * n as u64);
    let winner = ctx.sym_atomic_fetch(counter.at(8), 0).or_fail("fetch of the election word");
    ensure!((1..=n as u64).contains(&winner), "the election word holds {winner}");
    println!("rank={me} symatomics won={won} total={total} winner={}", winner - 1);

    // Ranks disagreeing on a size: every rank fails alike, and the heap stays usable.
    let e = ctx.sym_alloc(100 + me as usize).map(|_| ()).expect_err("sym_alloc with different sizes must fail");
    ensure!(e.to_string().contains("disagrees"), "disagreeing sizes: {e}");
    finish_frees(ctx, [data, sigs, counter]);
}

/// Frees the objects, checks a freed one is refused, and that the next allocation takes
/// the first one's offset again (the allocator is deterministic).
fn finish_frees(ctx: &mut Context, objects: [SymPtr; 3]) {
    let me = ctx.rank();
    for p in objects {
        ctx.sym_free(p).or_fail("sym_free");
    }
    let e = ctx.sym_atomic_fetch(objects[2].addr(), me).map(|_| ()).expect_err("a freed allocation must be refused");
    ensure!(e.to_string().contains("not inside one live symmetric allocation"), "freed allocation: {e}");
    let again = ctx.sym_alloc(64).or_fail("sym_alloc after the frees");
    ensure!(again.offset() == objects[0].offset(), "offset {} after freeing everything", again.offset());
    ctx.sym_free(again).or_fail("sym_free");
}

/// Peer access only within a device: the heaps of ranks on other devices are refused.
fn unmapped(ctx: &mut Context, data: SymPtr, mapped: &[Rank]) {
    let me = ctx.rank();
    let heaps = ctx.sym_heaps().to_vec();
    for (r, h) in heaps.iter().enumerate() {
        let same_device = h.device == ctx.device();
        ensure!(same_device == mapped.contains(&(r as Rank)), "rank {r} (device {}) mapped: {mapped:?}", h.device);
        if !same_device {
            let e = ctx.sym_atomic_fetch(data.addr(), r as Rank).map(|_| ()).expect_err("an unmapped PE");
            ensure!(e.to_string().contains("not mapped by this rank"), "unmapped PE {r}: {e}");
        }
    }
    println!("rank={me} symunmapped count={}", heaps.len() - mapped.len());
}
