//! `zero-and-bad`: bad ranks, tags and ranges are rejected at once with the right
//! error; a receive that cannot match can be cancelled; zero-length messages (from
//! dangling, null and device pointers) complete without writing a byte; iprobe sees an
//! envelope without consuming it.

use std::time::{Duration, Instant};

use gpulmt::context::TAG_UB;
use gpulmt::{Context, Error, ProtoError, Request};

use crate::api::{expect_err, expect_status, irecv, need_ranks};
use crate::buffers::{Buf, Kind, GUARD_RECV};
use crate::report::{fail, OrFail, PROMPTLY};

pub fn run(ctx: &mut Context) {
    need_ranks(ctx, 2, "zero-and-bad");
    let (me, n) = (ctx.rank(), ctx.size());
    if me >= 2 {
        return;
    }
    let peer = 1 - me;
    let mut small = Buf::new(ctx, Kind::Host, 16, 16, GUARD_RECV);
    let mut dev = Buf::new(ctx, Kind::Dev, 4096, 0, GUARD_RECV);

    // Bad destination / source ranks: an error at once, no hang.
    let t0 = Instant::now();
    let is_bad_rank = |r: u32| move |e: &Error| matches!(e.as_transfer(), Some(ProtoError::BadRank { rank, size }) if *rank == r && *size == n);
    // SAFETY: `small` and `dev` live to the end of this function, past any request; the call
    // must be rejected, and one accepted would fail the process at once (expect_err).
    expect_err(unsafe { ctx.isend(small.ptr(), 4, n, 1) }, "isend to rank == size", is_bad_rank(n));
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.isend(small.ptr(), 0, n + 5, 1) }, "zero-length isend to rank > size", is_bad_rank(n + 5));
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(
        unsafe { ctx.isend(dev.ptr(), 4096, u32::MAX, 1) },
        "device isend to rank u32::MAX",
        is_bad_rank(u32::MAX),
    );
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.irecv(small.ptr(), 16, Some(n), Some(1)) }, "irecv from rank == size", is_bad_rank(n));
    // Bad tags.
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument(_));
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, -1) }, "isend with tag -1", invalid);
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, i32::MIN) }, "isend with tag i32::MIN", invalid);
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, TAG_UB) }, "isend with the reserved tag TAG_UB", invalid);
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, i32::MAX - 1) }, "isend with the barrier's tag", invalid);
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.irecv(small.ptr(), 16, Some(peer), Some(-7)) }, "irecv with tag -7", invalid);
    // SAFETY: as for the first rejected call: the buffer outlives the call and any request.
    expect_err(unsafe { ctx.irecv(small.ptr(), 16, None, Some(TAG_UB)) }, "irecv with tag TAG_UB", invalid);
    // A device range running past its allocation (device addresses: offset without
    // `add`, whose in-bounds rule is about host allocations).
    // SAFETY: the range runs past `dev`'s allocation on purpose: the call must reject it
    // before touching a byte, and one accepted would fail the process at once.
    expect_err(
        unsafe { ctx.isend(dev.ptr().wrapping_add(100), 4096, peer, 1) },
        "isend of a device range past the end of its allocation",
        invalid,
    );
    // SAFETY: as the previous call: a range past the allocation, to be rejected untouched.
    expect_err(
        unsafe { ctx.irecv(dev.ptr().wrapping_add(4000), 200_000, Some(peer), Some(1)) },
        "irecv into a device range past the end of its allocation",
        invalid,
    );
    // Unknown request.
    match ctx.test(&Request::from_id(0xdead_beef)) {
        Err(Error::InvalidArgument(_)) => {}
        other => fail(format!("test of an unknown request: {other:?}, expected InvalidArgument")),
    }
    // Each call above returned its error (the event); none may have waited for anything.
    ensure!(t0.elapsed() < PROMPTLY, "rejecting bad arguments took {:?}", t0.elapsed());

    // Cancel a receive that cannot match.
    let rq = irecv(ctx, &mut small, Some(peer), Some(999));
    ensure!(ctx.cancel(&rq), "cancel of an unmatched receive returned false");
    match ctx.wait(rq) {
        Err(e) if matches!(e.as_transfer(), Some(ProtoError::Cancelled)) => {}
        other => fail(format!("a cancelled receive completed with {other:?}, expected Cancelled")),
    }

    let top = TAG_UB - 1;
    if me == 0 {
        // Zero-length messages from host (dangling pointer), device memory, with the
        // largest user tag; then a 3-byte message for iprobe.
        let dangling = std::ptr::NonNull::<u8>::dangling().as_ptr();
        // SAFETY: a zero-length range is never read or written, whatever the pointer.
        let r1 = unsafe { ctx.isend(dangling, 0, 1, 10) }.or_fail("zero-length isend from a dangling host pointer");
        // SAFETY: a zero-length range of `dev`, which outlives the request.
        let r2 = unsafe { ctx.isend(dev.ptr(), 0, 1, 11) }.or_fail("zero-length isend from device memory");
        // SAFETY: a zero-length range is never read or written, whatever the pointer.
        let r3 = unsafe { ctx.isend(dangling, 0, 1, top) }.or_fail("zero-length isend with tag TAG_UB-1");
        // SAFETY: a zero-length range is never read or written, whatever the pointer.
        let r4 = unsafe { ctx.isend(std::ptr::null(), 0, 1, 12) }.or_fail("zero-length isend from a null pointer");
        let probe = [1u8, 2, 3];
        // SAFETY: `probe` outlives the request, which wait_all completes below.
        let r5 = unsafe { ctx.isend(probe.as_ptr(), 3, 1, 20) }.or_fail("3-byte isend");
        for (i, st) in ctx.wait_all(vec![r1, r2, r3, r4, r5]).or_fail("zero-length sends").iter().enumerate() {
            let (tag, len) = [(10, 0), (11, 0), (top, 0), (12, 0), (20, 3)][i];
            expect_status(st, 1, tag, len, "zero-length send status");
        }
        // And one zero-length message back into device memory.
        let rr = irecv(ctx, &mut dev, Some(1), Some(13));
        let st = ctx.wait(rr).or_fail("zero-length receive into device memory");
        expect_status(&st, 1, 13, 0, "zero-length receive into device memory");
        dev.verify(ctx, &[], GUARD_RECV, "device buffer after a zero-length receive");
    } else {
        // Into a 16-byte host buffer: nothing may be written.
        let rr = irecv(ctx, &mut small, Some(0), Some(10));
        let st = ctx.wait(rr).or_fail("zero-length receive");
        expect_status(&st, 0, 10, 0, "zero-length receive");
        small.verify(ctx, &[], GUARD_RECV, "16-byte buffer after a zero-length receive");
        // Into device memory.
        let rr = irecv(ctx, &mut dev, Some(0), Some(11));
        let st = ctx.wait(rr).or_fail("zero-length receive into device memory");
        expect_status(&st, 0, 11, 0, "zero-length receive into device memory");
        dev.verify(ctx, &[], GUARD_RECV, "device buffer after a zero-length receive");
        // Zero-length receive buffer, any tag (the TAG_UB-1 message is next in order).
        // SAFETY: a zero-length range is never read or written, whatever the pointer.
        let rr = unsafe { ctx.irecv(std::ptr::null_mut(), 0, Some(0), None) }.or_fail("zero-length irecv, any tag");
        let st = ctx.wait(rr).or_fail("zero-length receive with any tag");
        expect_status(&st, 0, top, 0, "zero-length receive, any tag");
        // SAFETY: a zero-length range is never read or written, whatever the pointer.
        let rr = unsafe { ctx.irecv(std::ptr::null_mut(), 0, Some(0), Some(12)) }.or_fail("zero-length irecv, null");
        let st = ctx.wait(rr).or_fail("zero-length receive into a null pointer");
        expect_status(&st, 0, 12, 0, "zero-length receive into a null pointer");
        // iprobe sees the envelope without consuming it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let st = loop {
            ensure!(ctx.iprobe(Some(0), Some(21)).or_fail("iprobe").is_none(), "iprobe matched tag 21, never sent");
            if let Some(st) = ctx.iprobe(Some(0), Some(20)).or_fail("iprobe") {
                break st;
            }
            ensure!(Instant::now() < deadline, "iprobe never saw the 3-byte message");
        };
        expect_status(&st, 0, 20, 3, "iprobe");
        let again = ctx.iprobe(None, None).or_fail("iprobe(any, any)");
        ensure!(again == Some(st), "a second iprobe saw {again:?}, expected {st:?} (iprobe must not consume)");
        let mut got = [0u8; 8];
        let st = ctx.recv(&mut got, None, Some(20)).or_fail("receive of the probed message");
        expect_status(&st, 0, 20, 3, "receive of the probed message");
        ensure!(got == [1, 2, 3, 0, 0, 0, 0, 0], "probed message: got {got:?}");
        ensure!(ctx.iprobe(Some(0), None).or_fail("iprobe").is_none(), "iprobe still sees a consumed message");
        // SAFETY: a zero-length range of `dev`, which outlives the request.
        let sr = unsafe { ctx.isend(dev.ptr(), 0, 0, 13) }.or_fail("zero-length isend into device memory");
        ctx.wait(sr).or_fail("zero-length send 1->0");
    }
    dev.release(ctx);
    ctx.mem_free_commit().or_fail("mem_free_commit");
}
