//! `selfsend`: messages a rank sends to itself, eager and rendezvous, host and device,
//! posted in either order, and truncated ones.

use gpulmt::{Context, ProtoError, Tag};

use crate::api::{expect_status, irecv, isend};
use crate::buffers::{first_not, msg_seed, pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::{fail, OrFail};

pub fn run(ctx: &mut Context) {
    let me = ctx.rank();
    let cases: [(Kind, Kind, usize); 8] = [
        (Kind::Host, Kind::Host, 0),
        (Kind::Host, Kind::Host, 100),
        (Kind::Host, Kind::Host, 1 << 20),
        (Kind::Dev, Kind::Dev, 1),
        (Kind::Dev, Kind::Dev, 1 << 20),
        (Kind::Host, Kind::Dev, 1 << 20),
        (Kind::Dev, Kind::Host, 1 << 20),
        (Kind::Host, Kind::Dev, 300),
    ];
    for (i, &(ks, kr, len)) in cases.iter().enumerate() {
        let tag = 50 + i as Tag;
        let data = pattern(msg_seed(me, me, i as u32, 9), len);
        let what = format!("self-send {ks}->{kr} of {len} bytes");
        let mut s = Buf::new(ctx, ks, len, 128, GUARD_SEND);
        s.write(ctx, &data);
        let mut r = Buf::new(ctx, kr, len, 128, GUARD_RECV);
        // Alternate: send first (unexpected) or receive first.
        let (sr, rr) = if i % 2 == 0 {
            let sr = isend(ctx, &mut s, len, me, tag);
            (sr, irecv(ctx, &mut r, Some(me), Some(tag)))
        } else {
            let rr = irecv(ctx, &mut r, Some(me), Some(tag));
            (isend(ctx, &mut s, len, me, tag), rr)
        };
        let st = ctx.wait(rr).or_fail(format!("{what}: receive"));
        expect_status(&st, me, tag, len, &what);
        ctx.wait(sr).or_fail(format!("{what}: send"));
        r.verify(ctx, &data, GUARD_RECV, &what);
        s.verify(ctx, &data, GUARD_SEND, &format!("{what}: send buffer"));
        s.release(ctx);
        r.release(ctx);
    }
    // Truncated messages to oneself: eager and rendezvous.
    for (i, (mlen, blen)) in [(100usize, 99usize), (1 << 20, 4096)].into_iter().enumerate() {
        let tag = 70 + i as Tag;
        let what = format!("self-send of {mlen} bytes into {blen}");
        let mut s = Buf::new(ctx, Kind::Host, mlen, 0, GUARD_SEND);
        s.write(ctx, &pattern(5, mlen));
        let mut r = Buf::new(ctx, Kind::Host, blen, 64, GUARD_RECV);
        let sr = isend(ctx, &mut s, mlen, me, tag);
        let rr = irecv(ctx, &mut r, Some(me), Some(tag));
        match ctx.wait(rr) {
            Err(e) if matches!(e.as_transfer(), Some(ProtoError::Truncated { msg_len, buf_len }) if *msg_len == mlen as u64 && *buf_len == blen as u64) =>
                {}
            other => fail(format!("{what}: receive completed with {other:?}, expected Truncated")),
        }
        ctx.wait(sr).or_fail(format!("{what}: the send must complete Ok"));
        let w = r.whole(ctx);
        ensure!(
            first_not(&w[64 + blen..], GUARD_RECV).is_none(),
            "{what}: guard bytes after the buffer were overwritten"
        );
    }
    ctx.mem_free_commit().or_fail("self-send: mem_free_commit");
}
