//! `same-device`: a ring exchange of device buffers among ranks that share one device.

use gpulmt::{Context, Tag};

use crate::api::{expect_status, irecv, isend, need_ranks};
use crate::buffers::{msg_seed, pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::OrFail;

pub fn run(ctx: &mut Context, iters: u32) {
    let (me, n) = (ctx.rank(), ctx.size());
    need_ranks(ctx, 2, "same-device");
    ensure!(
        ctx.device() == 0,
        "same-device: rank {me} is on device {}, expected 0 (run with GPULMT_SIM_DEVICES=1)",
        ctx.device()
    );
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let sizes = [1usize, 4096, 65537, 1 << 20];
    for iter in 0..iters {
        for (i, &len) in sizes.iter().enumerate() {
            let tag = (iter * 16 + i as u32) as Tag;
            let mut s = Buf::new(ctx, Kind::Dev, len, 512, GUARD_SEND);
            s.write(ctx, &pattern(msg_seed(me, right, iter, len as u64), len));
            let mut r = Buf::new(ctx, Kind::Dev, len, 512, GUARD_RECV);
            let rr = irecv(ctx, &mut r, Some(left), Some(tag));
            let sr = isend(ctx, &mut s, len, right, tag);
            let st = ctx.wait(rr).or_fail("same-device receive");
            expect_status(&st, left, tag, len, "same-device receive");
            ctx.wait(sr).or_fail("same-device send");
            r.verify(
                ctx,
                &pattern(msg_seed(left, me, iter, len as u64), len),
                GUARD_RECV,
                &format!("same-device {len} bytes from {left}"),
            );
            s.release(ctx);
            r.release(ctx);
        }
        ctx.mem_free_commit().or_fail("same-device mem_free_commit");
    }
}
