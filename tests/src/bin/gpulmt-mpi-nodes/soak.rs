//! The soak of issue 46: every rank sends `count` messages to every other rank, on its
//! node and off it, with sizes around every protocol threshold (empty, eager, the
//! internode eager limit, the SHM chunk, the internode piece), from host and device
//! buffers, on three tags received by source and tag and one received by ANY_SOURCE.
//! Every receive is posted before the first send; sends go out with at most `window`
//! of them in flight. Every byte is checked, and per-source order on the wildcard tag.
//! The run must end: when no request completes for [`STALL`], the rank prints what is
//! still outstanding and aborts the job (a stall is a failure, never a timeout of the
//! harness alone).

use std::time::{Duration, Instant};

use gpulmt::{Context, Rank, Request, Status, Tag};

use crate::buffer::{fail, message, Buffer, OrFail};

/// No request of the rank completed for this long: the path stalled.
const STALL: Duration = Duration::from_secs(60);
/// The tag of the messages received by ANY_SOURCE.
const WILD_TAG: Tag = 77;
/// The tags of the messages received by source and tag.
const TAGS: [Tag; 3] = [10, 11, 12];

/// Sizes around the thresholds of the default settings (and of small test settings):
/// eager host limit 8K, internode eager 4K, NET piece 512K, SHM chunk 2M.
const SIZES: [usize; 16] =
    [0, 1, 15, 4095, 4096, 4097, 8191, 8192, 8193, 65536, 65537, 262_145, 524_287, 524_288, 524_289, 2_097_153];

/// The soak's settings (`soak --seed S --count N --window W`).
#[derive(Clone, Copy, Debug)]
pub struct Soak {
    pub seed: u64,
    pub count: usize,
    pub window: usize,
    /// Sizes to draw from instead of [`SIZES`] (`--sizes 4097,8193`).
    pub sizes: Option<&'static [usize]>,
}

/// One message of the plan: every rank computes the same plan for every pair.
#[derive(Clone, Copy, Debug)]
struct Planned {
    len: usize,
    tag: Tag,
    send_on_device: bool,
    recv_on_device: bool,
}

/// splitmix64: the plan's randomness, the same on every rank.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Soak {
    /// Message `i` from `src` to `dst`.
    fn planned(&self, src: Rank, dst: Rank, i: usize) -> Planned {
        let h = mix(self.seed ^ mix((u64::from(src) << 40) ^ (u64::from(dst) << 20) ^ i as u64));
        // Mostly small and medium messages; one in 16 from the large end of the list.
        let len = match self.sizes {
            Some(sizes) => sizes[(h >> 8) as usize % sizes.len()],
            None => SIZES[if h.is_multiple_of(16) { 11 + (h >> 8) as usize % 5 } else { (h >> 8) as usize % 11 }],
        };
        let tag = if (h >> 16).is_multiple_of(4) { WILD_TAG } else { TAGS[(h >> 20) as usize % TAGS.len()] };
        // Device buffers up to 1 MiB, so that sim's device memory holds every receive.
        let small = len <= 1 << 20;
        Planned {
            len,
            tag,
            send_on_device: small && (h >> 24).is_multiple_of(2),
            recv_on_device: small && (h >> 25).is_multiple_of(2),
        }
    }

    /// The bytes of message `i` from `src` to `dst`.
    fn bytes(&self, src: Rank, dst: Rank, i: usize, len: usize) -> Vec<u8> {
        message(mix(self.seed ^ (u64::from(src) << 48) ^ (u64::from(dst) << 32) ^ i as u64), len)
    }
}

/// A posted receive: the buffer, and the message it must get (for a wildcard receive,
/// found once its status names the sender).
struct Posted {
    buf: Buffer,
    req: Option<Request>,
    from: Option<(Rank, usize)>,
    status: Option<Status>,
}

/// A send in flight.
struct InFlight {
    buf: Buffer,
    req: Request,
    to: Rank,
    i: usize,
}

/// Runs the soak with every other rank. Returns the checks made.
pub fn run(ctx: &mut Context, soak: Soak) -> usize {
    let me = ctx.rank();
    let size = ctx.size();
    let peers: Vec<Rank> = (0..size).filter(|&r| r != me).collect();
    let plan = |src: Rank, dst: Rank, i: usize| soak.planned(src, dst, i);
    let wild_max = peers
        .iter()
        .flat_map(|&s| (0..soak.count).map(move |i| (s, i)))
        .map(|(s, i)| plan(s, me, i))
        .filter(|p| p.tag == WILD_TAG)
        .map(|p| p.len)
        .max()
        .unwrap_or(0);

    // Every receive first: by source and tag in each source's order, then the wildcard
    // ones (as many as the plan sends this rank on that tag), sources interleaved.
    let mut posted: Vec<Posted> = Vec::new();
    let mut wild = 0usize;
    for i in 0..soak.count {
        for &s in &peers {
            let p = plan(s, me, i);
            if p.tag == WILD_TAG {
                wild += 1;
                continue;
            }
            let buf = Buffer::new(ctx, p.recv_on_device, p.len).or_fail(me, || "soak: receive buffer".into());
            buf.guard(ctx, p.len).or_fail(me, || "soak: guards".into());
            // SAFETY: the buffer holds p.len bytes past `at` and outlives the request.
            let r = unsafe { ctx.irecv(buf.at() as *mut u8, p.len, Some(s), Some(p.tag)) };
            let req = r.or_fail(me, || format!("soak: irecv {i} from {s}"));
            posted.push(Posted { buf, req: Some(req), from: Some((s, i)), status: None });
        }
    }
    for k in 0..wild {
        let buf = Buffer::new(ctx, k % 2 == 1, wild_max).or_fail(me, || "soak: wildcard buffer".into());
        buf.guard(ctx, wild_max).or_fail(me, || "soak: guards".into());
        // SAFETY: as above.
        let r = unsafe { ctx.irecv(buf.at() as *mut u8, wild_max, None, Some(WILD_TAG)) };
        let req = r.or_fail(me, || format!("soak: wildcard irecv {k}"));
        posted.push(Posted { buf, req: Some(req), from: None, status: None });
    }

    // The sends, message-major across the peers, at most `window` in flight.
    let order: Vec<(Rank, usize)> = (0..soak.count).flat_map(|i| peers.iter().map(move |&d| (d, i))).collect();
    let mut next = 0;
    let mut sending: Vec<InFlight> = Vec::new();
    let mut sent = 0;
    let mut received = 0;
    let mut last_done = Instant::now();
    while sent < order.len() || received < posted.len() {
        while sending.len() < soak.window.max(1) && next < order.len() {
            let (to, i) = order[next];
            next += 1;
            let p = plan(me, to, i);
            let buf = Buffer::new(ctx, p.send_on_device, p.len).or_fail(me, || "soak: send buffer".into());
            buf.fill(ctx, &soak.bytes(me, to, i, p.len)).or_fail(me, || "soak: fill".into());
            // SAFETY: as above, for reads; the buffer lives in `sending` until the send is done.
            let r = unsafe { ctx.isend(buf.at() as *const u8, p.len, to, p.tag) };
            let req = r.or_fail(me, || format!("soak: isend {i} to {to}"));
            sending.push(InFlight { buf, req, to, i });
        }
        let mut progressed = false;
        let mut k = 0;
        while k < sending.len() {
            let s = &sending[k];
            match ctx.test(&s.req) {
                Ok(None) => k += 1,
                Ok(Some(_)) => {
                    sending.swap_remove(k).buf.release();
                    sent += 1;
                    progressed = true;
                }
                Err(e) => fail(me, format!("soak: send {} to {}: {e}", s.i, s.to)),
            }
        }
        for p in posted.iter_mut().filter(|p| p.req.is_some()) {
            match ctx.test(p.req.as_ref().expect("filtered")) {
                Ok(None) => {}
                Ok(Some(st)) => {
                    p.req = None;
                    p.status = Some(st);
                    received += 1;
                    progressed = true;
                }
                Err(e) => fail(me, format!("soak: receive of {:?}: {e}", p.from)),
            }
        }
        if progressed {
            last_done = Instant::now();
        } else if last_done.elapsed() > STALL {
            let stuck: Vec<String> =
                sending.iter().map(|s| format!("{}#{} ({} B)", s.to, s.i, plan(me, s.to, s.i).len)).take(16).collect();
            let waiting = posted.iter().filter(|p| p.req.is_some()).count();
            fail(
                me,
                format!(
                    "soak stalled: nothing completed for {STALL:?}; {sent} of {} sends done, {} in flight \
                     (to#message: {}), {received} of {} receives done, {waiting} waiting; {:?}",
                    order.len(),
                    sending.len(),
                    stuck.join(", "),
                    posted.len(),
                    ctx.stats()
                ),
            );
        } else {
            std::thread::yield_now();
        }
    }

    // Every byte, and the wildcard tag's per-source order (non-overtaking).
    let mut cursor: Vec<usize> = vec![0; size as usize];
    let next_wild = |cursor: &mut Vec<usize>, s: Rank| -> Option<usize> {
        let at = &mut cursor[s as usize];
        while *at < soak.count {
            let i = *at;
            *at += 1;
            if plan(s, me, i).tag == WILD_TAG {
                return Some(i);
            }
        }
        None
    };
    let mut checks = 0;
    for p in posted {
        let st = p.status.expect("every receive completed");
        let (s, i) = match p.from {
            Some(f) => f,
            None => {
                let Some(i) = next_wild(&mut cursor, st.source) else {
                    fail(me, format!("soak: a wildcard receive got {st:?}, more than rank {} sent", st.source))
                };
                (st.source, i)
            }
        };
        let want = plan(s, me, i);
        if st.source != s || st.len != want.len as u64 || st.tag != want.tag {
            fail(me, format!("soak: message {i} from {s} ({want:?}) arrived as {st:?} (out of order?)"));
        }
        let bytes = soak.bytes(s, me, i, want.len);
        match p.buf.check(ctx, &bytes, want.len).or_fail(me, || "soak: read".into()) {
            Ok(()) => checks += 1,
            Err(e) => fail(me, format!("soak: message {i} from {s} ({} B): {e}", want.len)),
        }
        p.buf.release();
    }
    let st = ctx.stats();
    println!(
        "rank {me} soak: seed {} {} messages to each of {} peers, window {}, {checks} checked; rendezvous by \
         protocol {:?}, {} posts held back",
        soak.seed,
        soak.count,
        peers.len(),
        soak.window,
        st.protocols,
        st.backpressure
    );
    checks
}
