//! `truncate`: messages larger than their receive buffer fail the receive with
//! `Truncated` (the send succeeds), write nothing past the buffer, and leave the pair
//! working.

use gpulmt::{Context, ProtoError, Tag};

use crate::api::{expect_status, irecv, isend, need_ranks};
use crate::buffers::{first_not, msg_seed, parse_placement, pattern, Buf, GUARD_RECV, GUARD_SEND};
use crate::report::{fail, OrFail};

pub fn run(ctx: &mut Context, placement: &str) {
    need_ranks(ctx, 2, "truncate");
    let (k0, k1) = parse_placement(placement);
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    // (message, receive buffer): eager and rendezvous sizes, off by one, and empty.
    let cases = [(100usize, 50usize), (8192, 8191), (1, 0), (65537, 65536), (1 << 20, 1 << 19), (4 << 20, 4096)];
    let off = 256;
    for (i, &(mlen, blen)) in cases.iter().enumerate() {
        let tag = 10 + 2 * i as Tag;
        let data = pattern(msg_seed(0, 1, i as u32, 3), mlen);
        let what = format!("truncate {k0}->{k1}: {mlen}-byte message into {blen}-byte buffer");
        if me == 0 {
            let mut s = Buf::new(ctx, k0, mlen, off, GUARD_SEND);
            s.write(ctx, &data);
            let sr = isend(ctx, &mut s, mlen, 1, tag);
            // MPI: the send of a truncated message succeeds; the receiver reports it.
            let st = ctx.wait(sr).or_fail(format!("{what}: the sender must complete Ok"));
            expect_status(&st, 1, tag, mlen, &what);
            s.release(ctx);
        } else {
            let mut r = Buf::new(ctx, k1, blen, off, GUARD_RECV);
            let rr = irecv(ctx, &mut r, Some(0), Some(tag));
            match ctx.wait(rr) {
                Err(e) => match e.as_transfer() {
                    Some(ProtoError::Truncated { msg_len, buf_len }) => ensure!(
                        *msg_len == mlen as u64 && *buf_len == blen as u64,
                        "{what}: Truncated {{ msg_len: {msg_len}, buf_len: {buf_len} }}, expected {mlen} and {blen}"
                    ),
                    _ => fail(format!("{what}: expected Error::Transfer(Truncated), got {e:?}")),
                },
                Ok(st) => fail(format!("{what}: receive succeeded ({st:?}), expected Truncated")),
            }
            // The buffer holds nothing or the message's prefix; nothing past it changed.
            let w = r.whole(ctx);
            let inside = &w[off..off + blen];
            ensure!(
                first_not(inside, GUARD_RECV).is_none() || inside == &data[..blen],
                "{what}: the receive buffer holds neither its old bytes nor the message's prefix"
            );
            if let Some(i) = first_not(&w[off + blen..], GUARD_RECV) {
                fail(format!("{what}: guard byte {i} after the receive buffer was overwritten"));
            }
            if let Some(i) = first_not(&w[..off], GUARD_RECV) {
                fail(format!("{what}: guard byte {i} before the receive buffer was overwritten"));
            }
            r.release(ctx);
        }
        // The pair still works: a rendezvous-sized message each way.
        let ok_len = 65536 + 8;
        let back = pattern(msg_seed(1, 0, i as u32, 4), ok_len);
        let fwd = pattern(msg_seed(0, 1, i as u32, 4), ok_len);
        let (mine, theirs, kind) = if me == 0 { (&fwd, &back, k0) } else { (&back, &fwd, k1) };
        let peer = 1 - me;
        let mut s = Buf::new(ctx, kind, ok_len, off, GUARD_SEND);
        s.write(ctx, mine);
        let mut r = Buf::new(ctx, kind, ok_len, off, GUARD_RECV);
        let rr = irecv(ctx, &mut r, Some(peer), Some(tag + 1));
        let sr = isend(ctx, &mut s, ok_len, peer, tag + 1);
        let st = ctx.wait(rr).or_fail(format!("{what}: the normal message after it"));
        expect_status(&st, peer, tag + 1, ok_len, &what);
        ctx.wait(sr).or_fail(format!("{what}: the normal send after it"));
        r.verify(ctx, theirs, GUARD_RECV, &format!("{what}: the normal message after it"));
        s.release(ctx);
        r.release(ctx);
        ctx.mem_free_commit().or_fail("truncate: mem_free_commit");
    }
}
