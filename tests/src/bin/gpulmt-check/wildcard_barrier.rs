//! `wildcard-barrier`: an ANY_SOURCE/ANY_TAG receive posted before a barrier receives the
//! user's message, not one of the barrier's internal ones.

use std::time::Duration;

use gpulmt::Context;

use crate::api::{expect_status, need_ranks};
use crate::report::{fail, OrFail};

pub fn run(ctx: &mut Context, timeout_s: u64) {
    need_ranks(ctx, 2, "wildcard-barrier");
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    // A watchdog: the failure mode is a hang.
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(timeout_s));
        fail(format!("wildcard-barrier: still not done after {timeout_s} s (barrier or receive hangs)"));
    });
    if me == 0 {
        let mut got = [0u8; 64];
        // SAFETY: `got` outlives the request.
        let r = unsafe { ctx.irecv(got.as_mut_ptr(), 64, None, None) }.or_fail("wildcard irecv");
        ctx.barrier().or_fail("barrier with a wildcard receive posted");
        let st = ctx.wait(r).or_fail("wildcard receive");
        expect_status(&st, 1, 7, 5, "the wildcard receive posted before the barrier");
        ensure!(&got[..5] == b"hello", "wildcard receive: got {:?}", &got[..5]);
    } else {
        ctx.barrier().or_fail("barrier");
        ctx.send(b"hello", 0, 7).or_fail("send");
    }
}
