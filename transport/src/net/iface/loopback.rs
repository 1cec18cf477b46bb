//! An in-process [`NetIface`]: several endpoints in one process joined by a shared
//! matching table, so the proxy can be unit-tested without MPI.
//!
//! It keeps MPI's matching rules (messages of one source and tag match receives in the
//! order sent and posted; unexpected messages wait for a receive) and adds what tests
//! need to shake the proxy:
//! - **random delays** ([`LoopbackFabric::with_delays`]): a matched message lands, and a
//!   send reports finished, at a random time up to a bound, so completions come out of
//!   order (data still goes to the receive it matched, as in MPI);
//! - **backpressure**: at most `max_in_flight` operations per endpoint, then
//!   [`Status::NoResource`];
//! - **rendezvous** ([`LoopbackFabric::rendezvous_above`]): a send longer than a bound
//!   finishes only once a receive matched it, as MPI's rendezvous protocol does (by
//!   default every send finishes by itself, as an eager one);
//! - **faults**: the next sends fail ([`LoopbackFabric::fail_sends`]), a rank dies
//!   ([`LoopbackFabric::kill`]).
//!
//! Message bytes are copied when sent, so a send's buffer is free once it is reported
//! finished as with MPI; a receive's bytes are written by the receiving endpoint's own
//! `iface_progress`, on its proxy's thread.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpulmt_protocols::Rank;

use super::{Arrival, IfaceCaps, NetFail, NetIface, ReqId, Status};

/// A message sent and not yet matched.
struct Message {
    source: Rank,
    tag: i32,
    data: Vec<u8>,
    /// The sender's operation, for cancelling it while unmatched.
    send: ReqId,
    /// The send finishes only once this message is matched (rendezvous).
    waits_for_match: bool,
}

/// A receive posted and not yet matched.
struct Posted {
    req: ReqId,
    from: Option<Rank>,
    tag: i32,
    buf: usize,
    len: usize,
}

/// A matched receive whose bytes land at `at`.
struct Landing {
    req: ReqId,
    buf: usize,
    len: usize,
    source: Rank,
    data: Vec<u8>,
    at: Instant,
}

#[derive(Default)]
struct Endpoint {
    /// Messages sent to this endpoint and not matched yet, in arrival order.
    unexpected: VecDeque<Message>,
    /// Receives of this endpoint not matched yet, in post order.
    posted: VecDeque<Posted>,
    landing: Vec<Landing>,
    /// Sends of this endpoint and when they report finished (None: once matched).
    sending: Vec<(ReqId, Option<Instant>)>,
    /// Operations of this endpoint finished with an error, to report.
    failed: Vec<(ReqId, NetFail)>,
    in_flight: usize,
}

struct Fabric {
    endpoints: Vec<Endpoint>,
    dead: Vec<bool>,
    max_delay: Duration,
    max_in_flight: usize,
    /// The next this many sends fail.
    fail_sends: usize,
    /// Sends longer than this finish only once matched.
    eager_max: usize,
    rng: u64,
}

impl Fabric {
    /// A delay in `0..=max_delay` (xorshift64*, seeded: runs repeat).
    fn delay(&mut self) -> Duration {
        if self.max_delay.is_zero() {
            return Duration::ZERO;
        }
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let r = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        self.max_delay.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
    }
}

fn matches(from: Option<Rank>, tag: i32, source: Rank, msg_tag: i32) -> bool {
    tag == msg_tag && from.is_none_or(|f| f == source)
}

/// The shared table of a set of loopback endpoints; clone it to reach it from tests.
#[derive(Clone)]
pub struct LoopbackFabric {
    inner: Arc<Mutex<Fabric>>,
}

impl LoopbackFabric {
    /// A fabric of `ranks` endpoints with no delays and room for `max_in_flight`
    /// operations per endpoint.
    pub fn new(ranks: u32, max_in_flight: usize) -> Self {
        Self::with_delays(ranks, max_in_flight, Duration::ZERO, 1)
    }

    /// As [`new`](Self::new), with every landing and send completion delayed by a random
    /// time up to `max_delay`, drawn from `seed`.
    pub fn with_delays(ranks: u32, max_in_flight: usize, max_delay: Duration, seed: u64) -> Self {
        let fabric = Fabric {
            endpoints: (0..ranks).map(|_| Endpoint::default()).collect(),
            dead: vec![false; ranks as usize],
            max_delay,
            max_in_flight,
            fail_sends: 0,
            eager_max: usize::MAX,
            rng: seed | 1,
        };
        LoopbackFabric { inner: Arc::new(Mutex::new(fabric)) }
    }

    fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The endpoint of `rank`.
    pub fn endpoint(&self, rank: Rank) -> LoopbackIface {
        let size = self.lock().endpoints.len() as u32;
        assert!(rank < size, "loopback rank {rank} of {size}");
        LoopbackIface { fabric: self.clone(), rank, size }
    }

    /// From now on a send of more than `len` bytes finishes only once a receive matched
    /// it, as under MPI's rendezvous protocol.
    pub fn rendezvous_above(&self, len: usize) {
        self.lock().eager_max = len;
    }

    /// The next `n` sends (of any endpoint) fail with an error, as an MPI error would.
    pub fn fail_sends(&self, n: usize) {
        self.lock().fail_sends = n;
    }

    /// Rank `rank` dies: messages to it vanish, sends to it fail, and receives waiting
    /// for it specifically fail.
    pub fn kill(&self, rank: Rank) {
        let mut f = self.lock();
        f.dead[rank as usize] = true;
        for ep in &mut f.endpoints {
            let (gone, keep): (Vec<Posted>, Vec<Posted>) = ep.posted.drain(..).partition(|p| p.from == Some(rank));
            ep.posted = keep.into();
            ep.failed.extend(gone.into_iter().map(|p| (p.req, NetFail::PeerGone { rank })));
        }
        // Rendezvous sends to it that no receive matched will never be.
        let stranded: Vec<Message> = f.endpoints[rank as usize].unexpected.drain(..).collect();
        for m in stranded.into_iter().filter(|m| m.waits_for_match) {
            let sender = &mut f.endpoints[m.source as usize];
            sender.sending.retain(|&(r, _)| r != m.send);
            sender.failed.push((m.send, NetFail::PeerGone { rank }));
        }
    }

    /// Operations in flight over all endpoints, and messages sent and never matched.
    pub fn pending(&self) -> (usize, usize) {
        let f = self.lock();
        (f.endpoints.iter().map(|e| e.in_flight).sum(), f.endpoints.iter().map(|e| e.unexpected.len()).sum())
    }
}

/// One rank's endpoint of a [`LoopbackFabric`].
pub struct LoopbackIface {
    fabric: LoopbackFabric,
    rank: Rank,
    size: u32,
}

impl NetIface for LoopbackIface {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn caps(&self) -> IfaceCaps {
        IfaceCaps { device_memory: false, max_tag: i32::MAX }
    }

    unsafe fn ep_send(
        &mut self,
        req: ReqId,
        to: Rank,
        tag: i32,
        buf: usize,
        len: usize,
    ) -> Result<Status<()>, NetFail> {
        let mut f = self.fabric.lock();
        if to >= self.size || f.dead[to as usize] {
            return Err(NetFail::PeerGone { rank: to });
        }
        if f.fail_sends > 0 {
            f.fail_sends -= 1;
            return Err(NetFail::Call { call: "loopback send", code: 99, message: "injected failure".into() });
        }
        if f.endpoints[self.rank as usize].in_flight >= f.max_in_flight {
            return Ok(Status::NoResource);
        }
        let data = match len {
            0 => Vec::new(),
            // SAFETY: ep_send's contract keeps buf..buf+len readable during this call.
            _ => unsafe { std::slice::from_raw_parts(buf as *const u8, len) }.to_vec(),
        };
        let (land_delay, send_delay) = (f.delay(), f.delay());
        let now = Instant::now();
        let waits_for_match = len > f.eager_max;
        let dst = &mut f.endpoints[to as usize];
        let mut finish = Some(now + send_delay);
        match dst.posted.iter().position(|p| matches(p.from, p.tag, self.rank, tag)) {
            Some(i) => {
                let p = dst.posted.remove(i).expect("position found");
                dst.landing.push(Landing {
                    req: p.req,
                    buf: p.buf,
                    len: p.len,
                    source: self.rank,
                    data,
                    at: now + land_delay,
                });
            }
            None => {
                dst.unexpected.push_back(Message { source: self.rank, tag, data, send: req, waits_for_match });
                if waits_for_match {
                    finish = None;
                }
            }
        }
        let me = &mut f.endpoints[self.rank as usize];
        me.in_flight += 1;
        me.sending.push((req, finish));
        Ok(Status::InProgress)
    }

    unsafe fn ep_recv(
        &mut self,
        req: ReqId,
        from: Option<Rank>,
        tag: i32,
        buf: usize,
        len: usize,
    ) -> Result<Status<Arrival>, NetFail> {
        let mut f = self.fabric.lock();
        if let Some(r) = from.filter(|&r| r >= self.size || f.dead[r as usize]) {
            return Err(NetFail::PeerGone { rank: r });
        }
        if f.endpoints[self.rank as usize].in_flight >= f.max_in_flight {
            return Ok(Status::NoResource);
        }
        let (delay, send_delay) = (f.delay(), f.delay());
        let me = &mut f.endpoints[self.rank as usize];
        me.in_flight += 1;
        match me.unexpected.iter().position(|m| matches(from, tag, m.source, m.tag)) {
            Some(i) => {
                let m = me.unexpected.remove(i).expect("position found");
                let at = Instant::now() + delay;
                let (source, send, waits) = (m.source, m.send, m.waits_for_match);
                me.landing.push(Landing { req, buf, len, source, data: m.data, at });
                if waits {
                    // Matched at last: the sender's operation may finish now.
                    let sender = &mut f.endpoints[source as usize];
                    if let Some(s) = sender.sending.iter_mut().find(|(r, _)| *r == send) {
                        s.1 = Some(Instant::now() + send_delay);
                    }
                }
            }
            None => me.posted.push_back(Posted { req, from, tag, buf, len }),
        }
        Ok(Status::InProgress)
    }

    fn ep_cancel(&mut self, req: ReqId) {
        let mut f = self.fabric.lock();
        let me = &mut f.endpoints[self.rank as usize];
        if let Some(i) = me.posted.iter().position(|p| p.req == req) {
            me.posted.remove(i);
            me.failed.push((req, NetFail::Cancelled));
            return;
        }
        if me.sending.iter().any(|&(r, _)| r == req) {
            // A send is cancelled only while no receive matched it.
            let rank = self.rank;
            for ep in 0..f.endpoints.len() {
                let q = &mut f.endpoints[ep].unexpected;
                if let Some(i) = q.iter().position(|m| m.source == rank && m.send == req) {
                    q.remove(i);
                    let me = &mut f.endpoints[rank as usize];
                    me.sending.retain(|&(r, _)| r != req);
                    me.failed.push((req, NetFail::Cancelled));
                    return;
                }
            }
        }
    }

    fn iface_progress(&mut self, done: &mut dyn FnMut(ReqId, Result<Arrival, NetFail>)) -> usize {
        let now = Instant::now();
        let mut report = Vec::new();
        {
            let mut f = self.fabric.lock();
            let me = &mut f.endpoints[self.rank as usize];
            for (req, fail) in me.failed.drain(..) {
                report.push((req, Err(fail)));
            }
            let mut i = 0;
            while i < me.landing.len() {
                if me.landing[i].at > now {
                    i += 1;
                    continue;
                }
                let l = me.landing.swap_remove(i);
                let n = l.data.len().min(l.len);
                // SAFETY: ep_recv's contract keeps buf..buf+len writable and unused by
                // others until this report; n <= len.
                unsafe { std::ptr::copy_nonoverlapping(l.data.as_ptr(), l.buf as *mut u8, n) };
                let result = match l.data.len() > l.len {
                    true => Err(NetFail::Truncated { len: l.len, got: l.data.len() }),
                    false => Ok(Arrival { source: l.source, len: n }),
                };
                report.push((l.req, result));
            }
            let rank = self.rank;
            me.sending.retain(|&(req, at)| match at.is_some_and(|at| at <= now) {
                true => {
                    report.push((req, Ok(Arrival { source: rank, len: 0 })));
                    false
                }
                false => true,
            });
            me.in_flight -= report.len();
        }
        let n = report.len();
        for (req, result) in report {
            done(req, result);
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.fabric.lock().endpoints[self.rank as usize].in_flight
    }
}
