//! A rank killed mid-transfer: the last rank (on another node than rank 0) starts
//! sending 64 MiB of device memory to rank 0 and kills itself (SIGKILL) while the
//! transfer runs. Nothing here ends the job: `mpirun` must (its test bounds the time),
//! and no rank may hang it meanwhile.

use std::io::Write;
use std::time::{Duration, Instant};

use gpulmt::mpi::rsmpi::traits::{Communicator, CommunicatorCollectives};
use gpulmt::Context;

use crate::buffer::{fail, message, Buffer, OrFail};

const LEN: usize = 64 << 20;
const TAG: i32 = 77;

pub fn run(ctx: &mut Context, world: &impl Communicator) -> ! {
    let me = ctx.rank();
    let victim = ctx.size() - 1;
    if ctx.topology().on_node(victim) && me == 0 {
        fail(me, "die: the last rank must run on another node than rank 0".into());
    }
    if me == 0 {
        let buf = Buffer::new(ctx, true, LEN).or_fail(me, || "die: buffer".into());
        // SAFETY: the buffer holds LEN bytes past `at` and lives until the process ends.
        let r = unsafe { ctx.irecv(buf.at() as *mut u8, LEN, Some(victim), Some(TAG)) }.or_fail(me, || "irecv".into());
        world.barrier();
        // mpirun ends the job when the victim dies; if gpulmt sees it first, it says so.
        match ctx.wait(r) {
            Ok(st) => fail(me, format!("die: the receive from the killed rank completed: {st:?}")),
            Err(e) => println!("rank {me} saw the transfer fail: {e}"),
        }
        std::process::exit(3);
    }
    if me == victim {
        let buf = Buffer::new(ctx, true, LEN).or_fail(me, || "die: buffer".into());
        buf.fill(ctx, &message(9, LEN)).or_fail(me, || "die: fill".into());
        world.barrier();
        // SAFETY: the buffer holds LEN bytes past `at`; the process dies before it goes.
        let _s = unsafe { ctx.isend(buf.at() as *const u8, LEN, 0, TAG) }.or_fail(me, || "isend".into());
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(30) {
            ctx.progress().or_fail(me, || "progress".into());
        }
        println!("rank {me} killing itself mid-transfer");
        let _ = std::io::stdout().flush();
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(std::process::id() as i32, libc::SIGKILL) };
    }
    world.barrier();
    // The other ranks wait in MPI for a barrier the victim never joins: mpirun ends them.
    std::thread::sleep(Duration::from_secs(600));
    fail(me, "die: still running 600 s after the victim died".into())
}
