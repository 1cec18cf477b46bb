//! A ring over some ranks: each sends every size to the next and receives every size from
//! the previous, in every placement (H H, H D, D H, D D), checked byte for byte with the
//! bytes around each message.

use gpulmt::{Context, Rank};

use crate::buffer::{kind, message, Buffer, OrFail};

/// The four buffers of a ring step (send and receive, host and device), each large
/// enough for the largest size: allocated once, reused by every placement.
pub struct Buffers {
    send: [Buffer; 2],
    recv: [Buffer; 2],
}

impl Buffers {
    pub fn new(ctx: &mut Context, largest: usize) -> Buffers {
        let me = ctx.rank();
        let mut one = |device| Buffer::new(ctx, device, largest).or_fail(me, || format!("allocating {largest} bytes"));
        Buffers { send: [one(false), one(true)], recv: [one(false), one(true)] }
    }

    pub fn release(self) {
        let [a, b] = self.send;
        let [c, d] = self.recv;
        [a, b, c, d].into_iter().for_each(Buffer::release);
    }
}

/// The seed of the message `from` sends of `len` bytes with `tag`.
fn seed(from: Rank, len: usize, tag: i32) -> u64 {
    (u64::from(from) << 48) ^ ((len as u64) << 8) ^ tag as u64
}

/// Sends every size of `sizes` to `to` and receives every size from `from`, from memory
/// `send_dev` into memory `recv_dev`; returns the checks made.
fn exchange(ctx: &mut Context, bufs: &Buffers, to: Rank, from: Rank, sizes: &[usize], place: (bool, bool)) -> usize {
    let me = ctx.rank();
    let (send, recv) = (&bufs.send[place.0 as usize], &bufs.recv[place.1 as usize]);
    let name = format!("{} -> {}", kind(place.0), kind(place.1));
    for (i, &len) in sizes.iter().enumerate() {
        let tag = 100 + i as i32;
        let what = || format!("{name} {len} bytes to {to} / from {from}");
        send.fill(ctx, &message(seed(me, len, tag), len)).or_fail(me, what);
        recv.guard(ctx, len).or_fail(me, what);
        // SAFETY: both buffers hold OFFSET + len bytes past `at` and outlive the requests
        // (waited below).
        let r = unsafe { ctx.irecv(recv.at() as *mut u8, len, Some(from), Some(tag)) }.or_fail(me, what);
        // SAFETY: as above.
        let s = unsafe { ctx.isend(send.at() as *const u8, len, to, tag) }.or_fail(me, what);
        let st = ctx.wait_all(vec![s, r]).or_fail(me, what);
        if (st[1].source, st[1].tag, st[1].len) != (from, tag, len as u64) {
            crate::buffer::fail(me, format!("{}: status {:?}", what(), st[1]));
        }
        if let Err(e) = recv.check(ctx, &message(seed(from, len, tag), len), len).or_fail(me, what) {
            crate::buffer::fail(me, format!("{}: {e}", what()));
        }
    }
    sizes.len()
}

/// A ring over `ranks` (job ranks, this one among them): every placement, every size.
pub fn ring(ctx: &mut Context, ranks: &[Rank], sizes: &[usize]) -> usize {
    let at = ranks.iter().position(|&r| r == ctx.rank()).expect("this rank is in the ring");
    let n = ranks.len();
    let (to, from) = (ranks[(at + 1) % n], ranks[(at + n - 1) % n]);
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let bufs = Buffers::new(ctx, largest);
    let mut checks = 0;
    for place in [(false, false), (false, true), (true, false), (true, true)] {
        checks += exchange(ctx, &bufs, to, from, sizes, place);
    }
    bufs.release();
    checks
}
