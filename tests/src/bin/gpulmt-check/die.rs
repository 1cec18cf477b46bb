//! `die`: rank 1 dies abruptly (exits or is SIGKILLed) before or in the middle of a
//! transfer with rank 0. Rank 0 must see the transfer fail with PeerFailed or Aborted
//! instead of hanging, fail new operations with the dead rank at once, keep working with
//! the other survivors (a message each way, a two-phase free among them), and finalize.

use std::time::{Duration, Instant};

use clap::ValueEnum;
use gpulmt::{Context, ProtoError, Tag};

use crate::api::{expect_status, irecv, isend, my_sim_objects, need_ranks};
use crate::buffers::{msg_seed, parse_placement, parse_size, pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::{fail, OrFail, PROMPTLY};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum When {
    /// Rank 1 dies once rank 0's message is waiting for it, before receiving anything.
    Before,
    /// Rank 1 dies after the transfer has started moving data.
    Mid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum How {
    /// std::process::exit(3): no destructors, no finalize.
    Exit,
    /// SIGKILL to itself.
    Kill,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Send,
    Recv,
}

pub fn die_now(how: How) -> ! {
    println!("rank=1 dying how={how:?}");
    match how {
        How::Exit => std::process::exit(3),
        How::Kill => {
            // SAFETY: signalling ourselves; SIGKILL cannot be caught.
            unsafe { libc::raise(libc::SIGKILL) };
            unreachable!("SIGKILL returned")
        }
    }
}

pub const DIE_TAG: Tag = 77;

/// Rank 1 dies abruptly in the middle of a transfer with rank 0, which must see its
/// request fail in bounded time and then exit 0 printing `survivor-ok`.
#[allow(clippy::too_many_arguments)]
pub fn run(
    ctx: Context,
    when: When,
    how: How,
    placement: &str,
    role: Role,
    size: &str,
    free_mapped: bool,
    any_source: bool,
) -> ! {
    need_ranks(&ctx, 2, "die");
    let (k0, k1) = parse_placement(placement);
    let len = parse_size(size);
    match ctx.rank() {
        0 => survivor(ctx, k0, role, len, free_mapped, any_source),
        1 => victim(ctx, k1, when, how, role, len),
        _ => bystander(ctx),
    }
}

/// Survivors other than rank 0 keep working with rank 0 after rank 1 died: a device
/// message each way, then a two-phase free among the survivors.
pub fn survivors_carry_on(ctx: &mut Context, mine: Option<Buf>) {
    let (me, n) = (ctx.rank(), ctx.size());
    let len = (1 << 20) + 3;
    let mut buf = Buf::new(ctx, Kind::Dev, len, 64, GUARD_RECV);
    let t0 = Instant::now();
    if me == 0 {
        for r in 2..n {
            buf.write(ctx, &pattern(msg_seed(0, r, 0, 11), len));
            let sr = isend(ctx, &mut buf, len, r, DIE_TAG + 3);
            ctx.wait(sr).or_fail(format!("after rank 1 died: send to rank {r}"));
            buf.fill(ctx, GUARD_RECV);
            let rr = irecv(ctx, &mut buf, Some(r), Some(DIE_TAG + 4));
            let st = ctx.wait(rr).or_fail(format!("after rank 1 died: receive from rank {r}"));
            expect_status(&st, r, DIE_TAG + 4, len, "after rank 1 died");
            buf.verify(
                ctx,
                &pattern(msg_seed(r, 0, 0, 11), len),
                GUARD_RECV,
                &format!("after rank 1 died: data from rank {r}"),
            );
        }
    } else {
        let rr = irecv(ctx, &mut buf, Some(0), Some(DIE_TAG + 3));
        let st = ctx.wait(rr).or_fail("after rank 1 died: receive from rank 0");
        expect_status(&st, 0, DIE_TAG + 3, len, "after rank 1 died");
        buf.verify(ctx, &pattern(msg_seed(0, me, 0, 11), len), GUARD_RECV, "after rank 1 died: data from rank 0");
        buf.write(ctx, &pattern(msg_seed(me, 0, 0, 11), len));
        let sr = isend(ctx, &mut buf, len, 0, DIE_TAG + 4);
        ctx.wait(sr).or_fail("after rank 1 died: send to rank 0");
    }
    // Two-phase free among the survivors (the dead rank cannot take part).
    buf.release(ctx);
    if let Some(b) = mine {
        b.release(ctx);
    }
    let res = ctx.mem_free_commit();
    println!(
        "rank={me} mem_free_commit after a peer died: {}",
        match &res {
            Ok(()) => "Ok".to_string(),
            Err(e) => format!("Err({e})"),
        }
    );
    ensure!(t0.elapsed() < PROMPTLY, "survivors' exchange and commit took {:?}", t0.elapsed());
    res.or_fail("mem_free_commit among survivors after a peer died");
}

pub fn bystander(mut ctx: Context) -> ! {
    let me = ctx.rank();
    survivors_carry_on(&mut ctx, None);
    finalize_survivor(ctx, me)
}

/// A survivor's end: finalize cannot synchronise with a dead rank, so it must return
/// quickly, not hang; the context's device memory must be gone with it.
pub fn finalize_survivor(ctx: Context, me: u32) -> ! {
    let t = Instant::now();
    let fin = ctx.finalize();
    // A finalize that waited for the dead rank would take GPULMT_INIT_TIMEOUT_MS (30 s).
    ensure!(t.elapsed() < PROMPTLY, "finalize with a dead peer took {:?}", t.elapsed());
    println!(
        "rank={me} finalize with a dead peer: {}",
        match &fin {
            Ok(()) => "Ok".to_string(),
            Err(e) => format!("Err({e})"),
        }
    );
    let left = my_sim_objects();
    ensure!(left.is_empty(), "after finalize (with a dead peer), sim device objects of this process remain: {left:?}");
    println!("survivor-ok");
    std::process::exit(0)
}

pub fn survivor(mut ctx: Context, kind: Kind, role: Role, len: usize, free_mapped: bool, any_source: bool) -> ! {
    let ctx_ = &mut ctx;
    let mut b = Buf::new(ctx_, kind, len, 4096, GUARD_SEND);
    let req = match role {
        Role::Send => {
            b.write(ctx_, &pattern(99, len));
            isend(ctx_, &mut b, len, 1, DIE_TAG)
        }
        Role::Recv => irecv(ctx_, &mut b, if any_source { None } else { Some(1) }, Some(DIE_TAG)),
    };
    let t0 = Instant::now();
    let res = ctx_.wait(req);
    let took = t0.elapsed();
    match res {
        Ok(st) => fail(format!("the transfer with the dead rank 1 completed Ok ({st:?}) after {took:?}")),
        Err(e) => match e.as_transfer() {
            Some(ProtoError::PeerFailed { rank: 1 }) | Some(ProtoError::Aborted { rank: 1, .. }) => {
                println!("rank=0 transfer failed after {:.0} ms: {e}", took.as_secs_f64() * 1e3)
            }
            _ => fail(format!("the transfer with the dead rank 1 failed with {e:?}, expected PeerFailed or Aborted")),
        },
    }
    // The event is the failure above; a wait that never noticed would not get here.
    ensure!(took < PROMPTLY, "noticing the dead peer took {took:?}");
    // New operations with the dead peer fail at once instead of hanging.
    let t1 = Instant::now();
    let mut small = Buf::new(ctx_, Kind::Host, 65536, 0, GUARD_SEND);
    let r = isend(ctx_, &mut small, 65536, 1, DIE_TAG + 1);
    match ctx_.wait(r) {
        Err(e) if matches!(e.as_transfer(), Some(ProtoError::PeerFailed { rank: 1 })) => {}
        other => fail(format!("a send to the dead rank 1 completed with {other:?}, expected PeerFailed")),
    }
    let r = irecv(ctx_, &mut small, Some(1), Some(DIE_TAG + 2));
    match ctx_.wait(r) {
        Err(e) if matches!(e.as_transfer(), Some(ProtoError::PeerFailed { rank: 1 })) => {}
        other => fail(format!("a receive from the dead rank 1 completed with {other:?}, expected PeerFailed")),
    }
    ensure!(t1.elapsed() < PROMPTLY, "operations with the dead peer took {:?}", t1.elapsed());
    // Self-messages still work.
    let mut one = [0u8; 4];
    // SAFETY: the bytes are a static literal, valid for as long as the request lives.
    let sr = unsafe { ctx_.isend(b"ping".as_ptr(), 4, 0, 5) }.or_fail("self-send after a peer died");
    ctx_.recv(&mut one, Some(0), Some(5)).or_fail("self-receive after a peer died");
    ctx_.wait(sr).or_fail("self-send after a peer died");
    ensure!(&one == b"ping", "self-message after a peer died: {one:?}");
    drop(small);
    // Unless asked, keep the transfer's buffer (the dead rank may have mapped it): it
    // is released at finalize.
    survivors_carry_on(ctx_, if free_mapped { Some(b) } else { None });
    finalize_survivor(ctx, 0)
}

pub fn victim(mut ctx: Context, kind: Kind, when: When, how: How, role: Role, len: usize) -> ! {
    let ctx = &mut ctx;
    let mut b = Buf::new(ctx, kind, len, 4096, GUARD_RECV);
    let deadline = Instant::now() + Duration::from_secs(20);
    match (role, when) {
        (Role::Send, When::Before) => {
            // Wait until rank 0's message is here (so it is waiting on it), then die.
            while ctx.iprobe(Some(0), Some(DIE_TAG)).or_fail("iprobe").is_none() {
                ensure!(Instant::now() < deadline, "rank 0's message never arrived");
            }
            die_now(how)
        }
        (Role::Recv, When::Before) => {
            // Rank 0 waits on a receive that this rank never sends to.
            std::thread::sleep(Duration::from_millis(100));
            die_now(how)
        }
        (Role::Send, When::Mid) if kind == Kind::Host => {
            // Host copies run inside progress and one call may drain the whole SHM
            // pipeline, so a watcher thread kills the process as soon as the third
            // chunk has landed in the receive buffer.
            let chunk = ctx.config().chunk_size as usize;
            ensure!(len >= 4 * chunk, "die --when mid: the message must span at least 4 SHM chunks");
            let watch = b.ptr() as usize + 2 * chunk;
            std::thread::spawn(move || loop {
                // SAFETY: inside the receive buffer, which lives until the process
                // dies; a racy read of bytes being written is what we want here.
                let w = unsafe { std::ptr::read_volatile(watch as *const u64) };
                if w != u64::from_ne_bytes([GUARD_RECV; 8]) {
                    println!("rank=1 third chunk arrived");
                    die_now(how);
                }
                std::hint::spin_loop();
            });
            let r = irecv(ctx, &mut b, Some(0), Some(DIE_TAG));
            let res = ctx.wait(r);
            fail(format!("the transfer completed ({res:?}) before rank 1 could die mid-way"))
        }
        (_, When::Mid) => {
            ensure!(
                kind == Kind::Dev,
                "die --when mid with rank 1 sending needs a device buffer on rank 1 (host copies may finish the whole message in one progress call)"
            );
            let r = match role {
                Role::Send => irecv(ctx, &mut b, Some(0), Some(DIE_TAG)),
                Role::Recv => {
                    b.write(ctx, &pattern(99, len));
                    isend(ctx, &mut b, len, 0, DIE_TAG)
                }
            };
            // Device copies are asynchronous and an SHM pipeline waits for them, so a
            // progress call cannot finish the message: die once this rank's engine
            // copies (receiving: GET or SHM; sending: PUT or SHM; a GET sender copies
            // nothing, and its receiver may legitimately complete).
            while ctx.stats().copies < 1 {
                ensure!(
                    ctx.test(&r).or_fail("test").is_none(),
                    "the transfer completed before rank 1 could die mid-way (a GET sender never copies: use PUT or SHM)"
                );
                ensure!(Instant::now() < deadline, "the transfer never started");
            }
            println!("rank=1 copies={} when dying", ctx.stats().copies);
            die_now(how)
        }
    }
}
