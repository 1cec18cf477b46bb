//! `free`: two-phase free across all ranks, interleaved with transfers: a buffer freed
//! while its peer has it mapped, misuse refused (double free, host and interior
//! pointers, null), a new allocation at a recycled address mapped afresh, and nothing
//! left in the handle cache or /dev/shm at the end.

use gpulmt::{Context, Error, Tag};

use crate::api::{irecv, isend, my_sim_objects, need_ranks};
use crate::buffers::{msg_seed, pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::{fail, OrFail};

pub fn run(ctx: &mut Context, rounds: u32, fresh_open: bool) {
    let (me, n) = (ctx.rank(), ctx.size());
    need_ranks(ctx, 2, "free");
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let sz = 256 << 10;
    let data = |who: u32, round: u32, which: u64| pattern(msg_seed(who, 0, round, which), sz);
    let mut b = Buf::new(ctx, Kind::Dev, sz, 0, GUARD_RECV);
    let mut d = Buf::new(ctx, Kind::Dev, sz, 0, GUARD_RECV);
    for round in 0..rounds {
        let what = |s: &str| format!("free round {round}: {s}");
        let tag = 10 * round as Tag;
        // A: sent to the right neighbour, which maps it (GET).
        let mut a = Buf::new(ctx, Kind::Dev, sz, 0, GUARD_SEND);
        let a_ptr = a.dev;
        a.write(ctx, &data(me, round, 1));
        b.fill(ctx, GUARD_RECV);
        let rr = irecv(ctx, &mut b, Some(left), Some(tag));
        let sr = isend(ctx, &mut a, sz, right, tag);
        ctx.wait_all(vec![rr, sr]).or_fail(what("transfer from A"));
        b.verify(ctx, &data(left, round, 1), GUARD_RECV, &what("data from the left neighbour's A"));

        // Round 2 in flight (from C) while A is freed with a commit.
        let mut c = Buf::new(ctx, Kind::Dev, sz, 0, GUARD_SEND);
        c.write(ctx, &data(me, round, 2));
        d.fill(ctx, GUARD_RECV);
        let rr = irecv(ctx, &mut d, Some(left), Some(tag + 1));
        let sr = isend(ctx, &mut c, sz, right, tag + 1);
        ctx.mem_free(a_ptr).or_fail(what("mem_free(A)"));
        match ctx.mem_free(a_ptr) {
            Err(Error::Free(_)) => {}
            other => fail(what(&format!("double mem_free(A) returned {other:?}, expected Error::Free"))),
        }
        let host = [0u8; 64];
        match ctx.mem_free(host.as_ptr() as usize) {
            Err(Error::Free(_)) => {}
            other => fail(what(&format!("mem_free of a host pointer returned {other:?}, expected Error::Free"))),
        }
        match ctx.mem_free(c.dev + 8) {
            Err(Error::Free(_)) => {}
            other => fail(what(&format!(
                "mem_free of a pointer inside an allocation returned {other:?}, expected Error::Free"
            ))),
        }
        match ctx.mem_free(0) {
            Err(_) => {}
            Ok(()) => fail(what("mem_free(null) succeeded")),
        }
        ctx.mem_free_commit().or_fail(what("mem_free_commit with transfers in flight"));
        ctx.wait_all(vec![rr, sr]).or_fail(what("transfer from C across the commit"));
        d.verify(ctx, &data(left, round, 2), GUARD_RECV, &what("data from the left neighbour's C"));
        // A is gone: freeing it again is an error.
        match ctx.mem_free(a_ptr) {
            Err(Error::Free(_)) => {}
            other => fail(what(&format!("mem_free of released A returned {other:?}, expected Error::Free"))),
        }
        // A commit with nothing marked.
        ctx.mem_free_commit().or_fail(what("mem_free_commit with nothing marked"));

        // A2: possibly at A's address; the neighbour must map it afresh.
        let opens_before = ctx.stats().cache.opens;
        let mut a2 = Buf::new(ctx, Kind::Dev, sz, 0, GUARD_SEND);
        println!("rank={me} round={round} realloc recycled_address={}", a2.dev == a_ptr);
        a2.write(ctx, &data(me, round, 3));
        b.fill(ctx, GUARD_RECV);
        let rr = irecv(ctx, &mut b, Some(left), Some(tag + 2));
        let sr = isend(ctx, &mut a2, sz, right, tag + 2);
        ctx.wait_all(vec![rr, sr]).or_fail(what("transfer from the new allocation"));
        b.verify(ctx, &data(left, round, 3), GUARD_RECV, &what("data from the left neighbour's new allocation"));
        if fresh_open {
            let opens = ctx.stats().cache.opens;
            ensure!(
                opens == opens_before + 1,
                "{}",
                what(&format!(
                    "the neighbour's new allocation was not opened afresh (opens {opens_before} -> {opens})"
                ))
            );
        }
        // Free A2 and C; double free is an error.
        let a2_ptr = a2.dev;
        a2.release(ctx);
        match ctx.mem_free(a2_ptr) {
            Err(Error::Free(_)) => {}
            other => fail(what(&format!("double mem_free(A2) returned {other:?}, expected Error::Free"))),
        }
        c.release(ctx);
        ctx.mem_free_commit().or_fail(what("mem_free_commit of A2 and C"));
    }
    b.release(ctx);
    d.release(ctx);
    ctx.mem_free_commit().or_fail("free: final mem_free_commit");
    let c = ctx.stats().cache;
    ensure!(
        c.opens == c.closes && c.entries == 0 && c.leases == 0,
        "free: after freeing everything, the handle cache still holds mappings: opens {} closes {} entries {} leases {}",
        c.opens,
        c.closes,
        c.entries,
        c.leases
    );
    let left_objs = my_sim_objects();
    ensure!(
        left_objs.is_empty(),
        "free: after freeing every allocation and committing, /dev/shm still has {left_objs:?}"
    );
}
