//! Small helpers around the gpulmt API shared by the scenarios: posting transfers of a
//! [`Buf`], checking statuses and expected errors, printing the counters the tests
//! read, and finishing a rank with the check that the library left nothing in /dev/shm.

use std::sync::atomic::Ordering;

use gpulmt::{Context, Error, Rank, Request, Status, Tag};

use crate::buffers::Buf;
use crate::report::{fail, OrFail, RANK};

pub fn isend(ctx: &mut Context, b: &mut Buf, len: usize, dst: Rank, tag: Tag) -> Request {
    ensure!(len <= b.len, "internal: send of {len} from a {}-byte buffer", b.len);
    // SAFETY: the buffer outlives the request: every caller waits before dropping it.
    unsafe { ctx.isend(b.ptr(), len, dst, tag) }.or_fail(format!("isend of {len} bytes to {dst} tag {tag}"))
}

pub fn irecv(ctx: &mut Context, b: &mut Buf, src: Option<Rank>, tag: Option<Tag>) -> Request {
    // SAFETY: as in isend.
    unsafe { ctx.irecv(b.ptr(), b.len, src, tag) }.or_fail(format!("irecv of {} bytes from {src:?} tag {tag:?}", b.len))
}

pub fn expect_status(st: &Status, source: Rank, tag: Tag, len: usize, what: &str) {
    ensure!(
        st.source == source && st.tag == tag && st.len == len as u64,
        "{what}: status {st:?}, expected source {source} tag {tag} len {len}"
    );
}

pub fn print_stats(ctx: &Context) {
    let s = ctx.stats();
    let r = ctx.rank();
    let p = s.protocols;
    println!("rank={r} protocols get={} put={} coop={} shm={} self={}", p[0], p[1], p[2], p[3], p[4]);
    println!("rank={r} kinds staged={} fallbacks={}", s.staged_kinds, s.open_fallbacks);
    let c = s.cache;
    println!(
        "rank={r} cache opens={} closes={} hits={} misses={} entries={} evictions={}",
        c.opens, c.closes, c.hits, c.misses, c.entries, c.evictions
    );
    println!(
        "rank={r} packets sent={} received={} violations={} backpressure={} copies={} probed={}",
        s.packets_sent, s.packets_received, s.violations, s.backpressure, s.copies, s.probed
    );
}

pub fn my_sim_objects() -> Vec<String> {
    gpulmt::shm::object::entries(&format!("gpulmt-sim-{}-", std::process::id()))
}

/// Finalizes and checks that the library left nothing of this process in /dev/shm.
pub fn finish(ctx: Context, scenario: &str) {
    let violations = ctx.stats().violations;
    if violations != 0 {
        print_stats(&ctx);
        fail(format!("{violations} protocol violations were counted"));
    }
    finish_allowing_violations(ctx, scenario)
}

pub fn finish_allowing_violations(ctx: Context, scenario: &str) {
    let r = ctx.rank();
    let job = std::env::var("GPULMT_JOB").unwrap_or_default();
    print_stats(&ctx);
    ctx.finalize().or_fail("finalize");
    let left = my_sim_objects();
    ensure!(left.is_empty(), "after finalize, sim device objects of this process remain in /dev/shm: {left:?}");
    if r == 0 && !job.is_empty() {
        let seg = format!("gpulmt-{job}");
        ensure!(
            !std::path::Path::new("/dev/shm").join(&seg).exists(),
            "after finalize, rank 0 left the job segment /dev/shm/{seg}"
        );
    }
    println!("rank={r} ok {scenario}");
}

pub fn need_ranks(ctx: &Context, n: u32, scenario: &str) {
    ensure!(ctx.size() >= n, "{scenario} needs at least {n} ranks (gpulmt-run -n {n}), got {}", ctx.size());
}

pub fn expect_err(r: Result<Request, Error>, what: &str, ok: impl Fn(&Error) -> bool) {
    match r {
        Ok(req) => fail(format!("{what}: accepted (request {}), expected an error", req.id())),
        Err(e) if ok(&e) => println!("rank={} rejected {what}: {e}", RANK.load(Ordering::Relaxed)),
        Err(e) => fail(format!("{what}: wrong error {e:?}")),
    }
}
