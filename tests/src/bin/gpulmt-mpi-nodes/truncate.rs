//! Messages to a rank of another node larger than their receive buffer: the receive
//! fails with `Truncated` (the send succeeds, as in MPI), nothing past the buffer is
//! written, and the pair works on.

use gpulmt::{Context, ProtoError, Rank};

use crate::buffer::{fail, kind, message, Buffer, OrFail};

/// (message, receive buffer, sender's memory is device, receiver's is device): eager
/// and rendezvous sizes, off by one at the eager limit, an empty buffer.
const CASES: [(usize, usize, bool, bool); 5] = [
    (100, 50, false, true),
    (8192, 8191, true, false),
    (1, 0, false, false),
    (65537, 65536, true, true),
    (4 << 20, 4096, false, true),
];

/// Rank `me` sends each case to `to` and receives each from `from` (its partners on
/// other nodes). Returns the checks made.
pub fn run(ctx: &mut Context, to: Rank, from: Rank) -> usize {
    let me = ctx.rank();
    for (i, &(mlen, blen, sdev, rdev)) in CASES.iter().enumerate() {
        let tag = 200 + 2 * i as i32;
        let what = || format!("truncate {} -> {}: {mlen}-byte message into {blen} bytes", kind(sdev), kind(rdev));
        let send = Buffer::new(ctx, sdev, mlen).or_fail(me, what);
        let recv = Buffer::new(ctx, rdev, blen.max(1)).or_fail(me, what);
        send.fill(ctx, &message(i as u64 ^ (u64::from(me) << 32), mlen)).or_fail(me, what);
        recv.guard(ctx, blen).or_fail(me, what);
        // SAFETY: the buffers hold the lengths given past `at` and outlive the requests.
        let r = unsafe { ctx.irecv(recv.at() as *mut u8, blen, Some(from), Some(tag)) }.or_fail(me, what);
        // SAFETY: as above.
        let s = unsafe { ctx.isend(send.at() as *const u8, mlen, to, tag) }.or_fail(me, what);
        ctx.wait(s).or_fail(me, || format!("{}: the send must succeed", what()));
        match ctx.wait(r) {
            Err(e) => match e.as_transfer() {
                Some(ProtoError::Truncated { msg_len, buf_len })
                    if (*msg_len, *buf_len) == (mlen as u64, blen as u64) => {}
                _ => fail(me, format!("{}: expected Truncated {{ {mlen}, {blen} }}, got {e:?}", what())),
            },
            Ok(st) => fail(me, format!("{}: the receive succeeded ({st:?}), expected Truncated", what())),
        }
        // The buffer holds its old bytes or the message's prefix; nothing past it changed.
        let prefix = message(i as u64 ^ (u64::from(from) << 32), blen);
        let got = recv.read(ctx, blen).or_fail(me, what);
        let inside = &got[crate::buffer::OFFSET..crate::buffer::OFFSET + blen];
        if !(inside.iter().all(|&b| b == crate::buffer::GUARD) || inside == &prefix[..]) {
            fail(me, format!("{}: the buffer holds neither its old bytes nor the message's prefix", what()));
        }
        if let Err(e) = recv.check(ctx, &[], blen).or_fail(me, what) {
            fail(me, format!("{}: {e}", what()));
        }
        // The pair still works: a rendezvous-sized message each way.
        let ok = 65536 + 8;
        let (s2, r2) = (Buffer::new(ctx, sdev, ok).or_fail(me, what), Buffer::new(ctx, rdev, ok).or_fail(me, what));
        s2.fill(ctx, &message(7 ^ u64::from(me), ok)).or_fail(me, what);
        r2.guard(ctx, ok).or_fail(me, what);
        // SAFETY: as above.
        let r = unsafe { ctx.irecv(r2.at() as *mut u8, ok, Some(from), Some(tag + 1)) }.or_fail(me, what);
        // SAFETY: as above.
        let s = unsafe { ctx.isend(s2.at() as *const u8, ok, to, tag + 1) }.or_fail(me, what);
        ctx.wait_all(vec![s, r]).or_fail(me, || format!("{}: the message after it", what()));
        if let Err(e) = r2.check(ctx, &message(7 ^ u64::from(from), ok), ok).or_fail(me, what) {
            fail(me, format!("{}: the message after it: {e}", what()));
        }
        [send, recv, s2, r2].into_iter().for_each(Buffer::release);
    }
    CASES.len()
}
