//! The scenarios of `gpulmt-fault`, shared by its two builds: `gpulmt-fault` (started
//! by `gpulmt-run`) and `gpulmt-fault-mpi` (started by `mpirun`, feature `mpi`). See
//! `main.rs` for the lines each prints.

use std::io::Write;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use gpulmt::{Context, Error, ProtoError, Protocol, Request};

/// Forged packets and cookies carry message ids from here up, and tags from
/// [`FORGED_TAG`] up: nothing real uses them, so a forgery that decodes can never be
/// taken for real traffic (the receiver must still drop or park it, never crash).
const FORGED_MSG: u64 = 1 << 40;
const FORGED_TAG: i32 = 1000;

#[derive(Parser, Debug)]
#[command(name = "gpulmt-fault", about = "Rank program of gpulmt's fault-injection suite")]
pub struct Cli {
    /// Before init, a SIGALRM interval timer of this many microseconds with a handler
    /// that does nothing (as a sampling profiler's): every wait must still end on time.
    #[arg(long, global = true)]
    itimer_us: Option<u64>,
    /// RANK:MS: that rank waits MS milliseconds before it joins (init).
    #[arg(long, global = true)]
    late: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Proto {
    /// Host messages below the eager limit.
    Eager,
    /// Host messages: the SHM pipeline.
    Shm,
    /// Device messages; GPULMT_PROTOCOL (set by the caller) picks GET, PUT or COOPERATE.
    Get,
    Put,
    Coop,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Ranks 0 and 1 exchange checked messages for MILLIS ms (rank 0 decides when to
    /// stop). A peer that dies meanwhile must fail the survivor's transfer, which then
    /// finalizes and prints `survivor-ok`.
    Traffic {
        #[arg(long, value_enum)]
        protocol: Proto,
        #[arg(long, default_value_t = 1500)]
        millis: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Joins, prints `ready`, waits until the file HOLD exists, then exchanges a message
    /// and finalizes.
    Hold {
        #[arg(long)]
        hold: std::path::PathBuf,
    },
    /// Joins only: init, and finalize (a job that cannot start must fail init).
    Join,
    /// The last rank stays alive MILLIS ms without calling finalize, then exits; every
    /// other rank's finalize must give up within its bound (GPULMT_INIT_TIMEOUT_MS for
    /// the barrier, GPULMT_NET_DRAIN_MS for the drains) with an error naming the rank it
    /// waited for, and print `finalize-bounded ms=T err=...`.
    LateFinalize {
        #[arg(long, default_value_t = 20_000)]
        millis: u64,
    },
    /// A second init while the first context lives must fail at once; the first context
    /// then works and finalizes.
    SecondInit,
    /// Rank 1 forges PACKETS control packets into its ring to rank 0 (unsealed: as a
    /// third party would) between real device messages (whose regions cross that ring);
    /// rank 0 feeds COOKIES forged RTS cookies to `lmt_start_recv`. Every real message
    /// must arrive intact.
    Fuzz {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 200)]
        packets: u32,
        #[arg(long, default_value_t = 100)]
        cookies: u32,
    },
    /// Misuse of the Rust API: impossible lengths, NULL, released device memory.
    Misuse,
    /// Allocates BYTES of device memory (to run /dev/shm out) and reports the outcome.
    Alloc {
        #[arg(long)]
        bytes: String,
    },
}

/// Prints a line and flushes it at once (the driver reads lines as they come, and a
/// killed rank's buffered output would be lost).
macro_rules! say {
    ($($t:tt)*) => {{
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($t)*);
        let _ = out.flush();
    }};
}

/// Ends the rank with a `FAIL` line on stderr and status 1.
pub fn fail(what: impl std::fmt::Display) -> ! {
    eprintln!("FAIL rank={}: {what}", std::env::var("GPULMT_RANK").unwrap_or_else(|_| "?".into()));
    std::process::exit(1)
}

trait OrFail<T> {
    fn or_fail(self, what: &str) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: &str) -> T {
        self.unwrap_or_else(|e| fail(format!("{what}: {e}")))
    }
}

/// A small deterministic generator (splitmix64): the driver's seed replays a run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c908)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The contents of message `round` of `seed`.
fn pattern(seed: u64, round: u64, n: usize) -> Vec<u8> {
    let mut r = Rng::new(seed.wrapping_mul(1_000_003) ^ round);
    let mut v = vec![0u8; n.next_multiple_of(8)];
    for c in v.chunks_exact_mut(8) {
        c.copy_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Installs a SIGALRM handler that does nothing (no SA_RESTART: system calls are
/// interrupted) and an interval timer of `us` microseconds.
fn start_itimer(us: u64) {
    extern "C" fn on_alarm(_: libc::c_int) {}
    // SAFETY: a zeroed sigaction is valid; the handler does nothing, which is
    // async-signal-safe; the timer values are plain integers.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_alarm as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()) != 0 {
            fail("sigaction(SIGALRM)");
        }
        let tick = libc::timeval { tv_sec: (us / 1_000_000) as _, tv_usec: (us % 1_000_000) as _ };
        let it = libc::itimerval { it_interval: tick, it_value: tick };
        if libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) != 0 {
            fail("setitimer");
        }
    }
}

/// Runs the scenario of the command line with a context from `init`; returns the exit
/// status (the caller exits with it once MPI, if any, is finalized).
pub fn main(cli: Cli, init: impl Fn() -> gpulmt::Result<Context>) -> i32 {
    let rank: u32 = std::env::var("GPULMT_RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(u32::MAX);
    if let Some(us) = cli.itimer_us {
        start_itimer(us);
    }
    if let Some((r, ms)) = cli.late.as_deref().and_then(|l| l.split_once(':')) {
        if r.parse() == Ok(rank) {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        }
    }
    let t0 = Instant::now();
    let ctx = match init() {
        Ok(c) => c,
        Err(e) => {
            say!("rank={rank} init-failed ms={} err={e}", t0.elapsed().as_millis());
            return 2;
        }
    };
    let rank = ctx.rank();
    say!("rank={rank} ready pid={} job={} size={}", std::process::id(), ctx.job_segment().job(), ctx.size());
    match cli.cmd {
        Cmd::Traffic { protocol, millis, seed } => traffic(ctx, protocol, Duration::from_millis(millis), seed),
        Cmd::Hold { hold } => hold_then_exchange(ctx, &hold),
        Cmd::Join => finish(ctx, "join"),
        Cmd::LateFinalize { millis } => late_finalize(ctx, Duration::from_millis(millis)),
        Cmd::SecondInit => second_init(ctx, init),
        Cmd::Fuzz { seed, packets, cookies } => fuzz(ctx, seed, packets, cookies),
        Cmd::Misuse => misuse(ctx),
        Cmd::Alloc { bytes } => alloc(ctx, &bytes),
    }
}

fn finish(ctx: Context, what: &str) -> i32 {
    let rank = ctx.rank();
    ctx.finalize().or_fail("finalize");
    say!("rank={rank} ok {what}");
    0
}

/// `late-finalize`: the last rank never reaches finalize while the others wait in it.
fn late_finalize(ctx: Context, stay: Duration) -> i32 {
    let (rank, last) = (ctx.rank(), ctx.size() - 1);
    if rank == last {
        std::thread::sleep(stay);
        // Gone without finalize: what it left is the next job's to sweep.
        std::process::exit(0);
    }
    let t = Instant::now();
    match ctx.finalize() {
        Ok(()) => fail("finalize succeeded though the last rank never reached it"),
        Err(e) => {
            say!("rank={rank} finalize-bounded ms={} err={e}", t.elapsed().as_millis());
            0
        }
    }
}

/// The end of a rank whose peer died: the failed transfer was reported; finalize must
/// come back promptly (it cannot synchronise with the dead rank).
fn survive(ctx: Context, e: &Error, t: Instant) -> i32 {
    let rank = ctx.rank();
    if !is_peer_failure(e) {
        fail(format!("a transfer failed with {e}, expected PeerFailed or Aborted"));
    }
    say!("rank={rank} peer-failed ms={} err={e}", t.elapsed().as_millis());
    let t = Instant::now();
    let fin = ctx.finalize();
    say!(
        "rank={rank} survivor-ok finalize_ms={} finalize={:?}",
        t.elapsed().as_millis(),
        fin.err().map(|e| e.to_string())
    );
    0
}

/// Whether `e` is what a transfer with a dead peer fails with.
fn is_peer_failure(e: &Error) -> bool {
    matches!(e.as_transfer(), Some(ProtoError::PeerFailed { .. }) | Some(ProtoError::Aborted { .. }))
}

/// A message buffer of `len` bytes in host or device memory.
struct Buf {
    host: Vec<u8>,
    dev: Option<usize>,
}

impl Buf {
    fn new(ctx: &mut Context, len: usize, device: bool) -> Buf {
        let dev = device.then(|| ctx.mem_alloc(len).or_fail("mem_alloc"));
        Buf { host: vec![0; len], dev }
    }
    fn ptr(&mut self) -> *mut u8 {
        self.dev.map_or(self.host.as_mut_ptr(), |d| d as *mut u8)
    }
    fn write(&mut self, ctx: &Context, data: &[u8]) {
        self.host.copy_from_slice(data);
        if let Some(d) = self.dev {
            // SAFETY: d is a live allocation of host.len() bytes; host is ours.
            unsafe { ctx.copy_sync(d, self.host.as_ptr() as usize, data.len()) }.or_fail("copy to device");
        }
    }
    fn read(&mut self, ctx: &Context) -> &[u8] {
        if let Some(d) = self.dev {
            let n = self.host.len();
            // SAFETY: as in write, the other way.
            unsafe { ctx.copy_sync(self.host.as_mut_ptr() as usize, d, n) }.or_fail("copy from device");
        }
        &self.host
    }
}

fn wait(ctx: &mut Context, r: Request) -> Result<(), Error> {
    ctx.wait(r).map(|_| ())
}

fn traffic(mut ctx: Context, proto: Proto, millis: Duration, seed: u64) -> i32 {
    let (me, n) = (ctx.rank(), ctx.size());
    if me >= 2 || n < 2 {
        return finish(ctx, "traffic (idle)");
    }
    let (len, device) = match proto {
        Proto::Eager => (1000, false),
        Proto::Shm => (300_000, false),
        Proto::Get | Proto::Put | Proto::Coop => (1 << 20, true),
    };
    let ctx_ = &mut ctx;
    let mut buf = Buf::new(ctx_, len, device);
    let start = Instant::now();
    let mut round = 0u64;
    let mut last = Instant::now();
    let result: Result<(), Error> = (|| loop {
        last = Instant::now();
        if me == 0 {
            let go = [u8::from(start.elapsed() < millis)];
            ctx_.send(&go, 1, 1)?;
            if go[0] == 0 {
                return Ok(());
            }
            buf.write(ctx_, &pattern(seed, round, len));
            // SAFETY: the buffer outlives the request (waited right here).
            let r = unsafe { ctx_.isend(buf.ptr(), len, 1, 2) }?;
            wait(ctx_, r)?;
            // SAFETY: as above.
            let r = unsafe { ctx_.irecv(buf.ptr(), len, Some(1), Some(3)) }?;
            wait(ctx_, r)?;
            if buf.read(ctx_) != pattern(seed ^ 1, round, len) {
                fail(format!("round {round}: the {len}-byte {proto:?} message from rank 1 is corrupt"));
            }
        } else {
            let mut go = [0u8];
            ctx_.recv(&mut go, Some(0), Some(1))?;
            if go[0] == 0 {
                return Ok(());
            }
            // SAFETY: the buffer outlives the request (waited right here).
            let r = unsafe { ctx_.irecv(buf.ptr(), len, Some(0), Some(2)) }?;
            wait(ctx_, r)?;
            if buf.read(ctx_) != pattern(seed, round, len) {
                fail(format!("round {round}: the {len}-byte {proto:?} message from rank 0 is corrupt"));
            }
            buf.write(ctx_, &pattern(seed ^ 1, round, len));
            // SAFETY: as above.
            let r = unsafe { ctx_.isend(buf.ptr(), len, 0, 3) }?;
            wait(ctx_, r)?;
        }
        round += 1;
    })();
    match result {
        Ok(()) => {
            say!("rank={me} rounds={round}");
            // The peer may die after the last round: then finalize fails as a transfer
            // with it would.
            let t = Instant::now();
            match ctx.finalize() {
                Ok(()) => {
                    say!("rank={me} ok traffic");
                    0
                }
                Err(e) if is_peer_failure(&e) => {
                    say!("rank={me} peer-failed ms={} err=at finalize: {e}", t.elapsed().as_millis());
                    say!("rank={me} survivor-ok finalize_ms={}", t.elapsed().as_millis());
                    0
                }
                Err(e) => fail(format!("finalize: {e}")),
            }
        }
        Err(e) => survive(ctx, &e, last),
    }
}

fn hold_then_exchange(mut ctx: Context, hold: &std::path::Path) -> i32 {
    // Device memory held through the hold: what a live job has for a sweep to leave alone.
    let held = ctx.mem_alloc(1 << 20).or_fail("device memory to hold");
    say!("rank={} holding", ctx.rank());
    let t0 = Instant::now();
    while !hold.exists() {
        if t0.elapsed() > Duration::from_secs(60) {
            fail(format!("{} never appeared", hold.display()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let (me, n) = (ctx.rank(), ctx.size());
    if n >= 2 && me < 2 {
        let mut got = [0u8; 5];
        if me == 0 {
            ctx.send(b"after", 1, 7).or_fail("send after the hold");
            ctx.recv(&mut got, Some(1), Some(8)).or_fail("receive after the hold");
        } else {
            ctx.recv(&mut got, Some(0), Some(7)).or_fail("receive after the hold");
            ctx.send(b"after", 0, 8).or_fail("send after the hold");
        }
        if &got != b"after" {
            fail(format!("the message after the hold is {got:?}"));
        }
    }
    ctx.mem_free(held).or_fail("freeing the held device memory");
    ctx.mem_free_commit().or_fail("committing the free");
    finish(ctx, "hold")
}

fn second_init(mut ctx: Context, init: impl Fn() -> gpulmt::Result<Context>) -> i32 {
    let t = Instant::now();
    match init() {
        Ok(_) => fail("a second init of a live rank succeeded"),
        Err(e) => {
            let ms = t.elapsed().as_millis();
            if ms > 2000 {
                fail(format!("the second init took {ms} ms to fail"));
            }
            say!("rank={} second-init-refused ms={ms} err={e}", ctx.rank());
        }
    }
    // The first context is intact: a barrier and a message round.
    ctx.barrier().or_fail("barrier after the refused second init");
    finish(ctx, "second-init")
}

/// A forged control packet for rank 0's ring (see the constants at the top): a real
/// packet shape with forged ids and tags, then mutated; `None` when the mutation made a
/// packet that could pass for real traffic or reach the two-phase free.
fn forge(r: &mut Rng, n: u64) -> Option<Vec<u8>> {
    use gpulmt_protocols::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet, Region, HANDLE_BYTES, WIRE_VERSION};
    let msg = FORGED_MSG + n;
    let tag = FORGED_TAG + (n % 50) as i32;
    let mut handle = [0u8; HANDLE_BYTES];
    handle.iter_mut().for_each(|b| *b = r.next() as u8);
    let region = Region {
        handle,
        alloc_size: r.below(1 << 24),
        offset: r.below(1 << 20),
        device: r.below(3) as u32,
        node: r.next(),
        buffer_id: r.next() | 1,
    };
    let p = match r.below(10) {
        0 => Packet::Eager { msg, tag, payload: (0..r.below(200)).map(|_| r.next() as u8).collect() },
        1 => Packet::Rts { msg, tag, len: r.below(1 << 22), src: MemDesc::Host },
        2 => Packet::Rts { msg, tag, len: r.below(1 << 22), src: MemDesc::Device(region) },
        3 => Packet::Cts { msg, mode: CtsMode::Put, dst: Some(region), split: r.below(1 << 20) },
        4 => Packet::Done { msg, dir: if r.below(2) == 0 { Dir::ToSender } else { Dir::ToReceiver } },
        5 => Packet::Chunk { msg, index: r.below(8) as u32, len: r.below(1 << 21) as u32, slot: r.next() as u32 },
        6 => Packet::ChunkAck { msg, index: r.below(8) as u32 },
        7 => Packet::Abort { msg, reason: AbortReason::Truncated, dir: Dir::ToSender },
        8 => Packet::Cookie { msg },
        _ => {
            // Garbage behind a valid version byte.
            let mut v: Vec<u8> = (0..1 + r.below(120)).map(|_| r.next() as u8).collect();
            v[0] = WIRE_VERSION;
            return Some(v);
        }
    };
    let mut v = p.to_vec();
    match r.below(4) {
        0 => {}
        1 => {
            for _ in 0..1 + r.below(4) {
                let i = r.below(v.len() as u64) as usize;
                v[i] ^= 1 << r.below(8);
            }
        }
        2 => v.truncate(r.below(v.len() as u64) as usize),
        _ => v.extend((0..1 + r.below(16)).map(|_| r.next() as u8)),
    }
    if v.is_empty() {
        return None;
    }
    match Packet::decode(&v) {
        Ok(Packet::FreeMarks { .. } | Packet::FreeAck { .. }) => None,
        Ok(Packet::Rtr { .. } | Packet::RtrRevoke { .. } | Packet::RtrRevoked { .. }) => None,
        Ok(p) if p.msg().is_some_and(|m| m < FORGED_MSG) => None,
        Ok(Packet::Eager { tag, .. } | Packet::Rts { tag, .. } | Packet::RtrPut { tag, .. }) if tag < FORGED_TAG => {
            None
        }
        _ => Some(v),
    }
}

fn fuzz(mut ctx: Context, seed: u64, packets: u32, cookies: u32) -> i32 {
    use gpulmt_protocols::wire::{MemDesc, Packet};
    let (me, n) = (ctx.rank(), ctx.size());
    if me >= 2 || n < 2 {
        return finish(ctx, "fuzz (idle)");
    }
    let rounds = 20u64;
    let mut r = Rng::new(seed.wrapping_add(me as u64));
    // Real traffic: device messages, one buffer per length (GET, and PUT by the policy
    // or an RTR offer), so that the ring rank 1 forges into carries the regions of its
    // send buffers, mostly short: the forged regions must not push them out of rank 0's
    // memo (issue 31).
    const LENS: [usize; 3] = [3000, 300_000, 1 << 20];
    let len_of = |round: u64| LENS[(round % 3) as usize];
    let mut bufs: Vec<Buf> = LENS.iter().map(|&n| Buf::new(&mut ctx, n, true)).collect();
    let buf_of = |round: u64| (round % 3) as usize;
    if me == 1 {
        let ring = ctx.job_segment().ring(1, 0);
        let (mut forged, mut skipped) = (0u64, 0u64);
        for round in 0..rounds {
            let buf = &mut bufs[buf_of(round)];
            buf.write(&ctx, &pattern(seed, round, len_of(round)));
            // SAFETY: the buffer outlives the request (waited right here).
            let req = unsafe { ctx.isend(buf.ptr(), len_of(round), 0, 5) }.or_fail("fuzz: a real message");
            wait(&mut ctx, req).or_fail("fuzz: a real message");
            // Only this thread pushes to the ring, and only once the context has nothing
            // of its own waiting for it: the ring stays single-producer and in order.
            while ctx.control_pending() {
                ctx.progress().or_fail("fuzz: progress");
            }
            for k in 0..packets as u64 / rounds {
                match forge(&mut r, round * 1000 + k) {
                    Some(p) => match ring.try_push(&p) {
                        Ok(true) => forged += 1,
                        Ok(false) => {
                            ctx.progress().or_fail("fuzz: progress");
                            skipped += 1
                        }
                        Err(_) => skipped += 1,
                    },
                    None => skipped += 1,
                }
            }
        }
        let mut done = [0u8];
        ctx.recv(&mut done, Some(0), Some(6)).or_fail("fuzz: done");
        say!("rank=1 forged={forged} skipped={skipped}");
    } else {
        let v0 = ctx.stats().violations;
        for round in 0..rounds {
            let want = pattern(seed, round, len_of(round));
            let buf = &mut bufs[buf_of(round)];
            // SAFETY: the buffer outlives the request (waited right here).
            let req = unsafe { ctx.irecv(buf.ptr(), want.len(), Some(1), Some(5)) }.or_fail("fuzz: a real message");
            let st = ctx.wait(req).or_fail("fuzz: a real message");
            if st.len as usize != want.len() || buf.read(&ctx) != want {
                fail(format!("fuzz: real message {round} is corrupt ({} bytes)", st.len));
            }
        }
        let s = ctx.stats();
        let (get, put, coop) =
            (s.protocol_count(Protocol::Get), s.protocol_count(Protocol::Put), s.protocol_count(Protocol::Coop));
        say!("rank=0 device get={get} put={put} coop={coop}");
        // Forged RTS cookies: shapes of real ones, mutated; each is refused or starts a
        // receive that never completes (nobody sends that message), never more.
        let (mut refused, mut started) = (0u64, 0u64);
        let mut sink = vec![0u8; 1 << 16];
        for k in 0..cookies as u64 {
            let rts =
                Packet::Rts { msg: FORGED_MSG + (1 << 30) + k, tag: 0, len: r.below(1 << 16), src: MemDesc::Host };
            let mut c = rts.to_vec();
            for _ in 0..r.below(4) {
                let i = r.below(c.len() as u64) as usize;
                c[i] = r.next() as u8;
            }
            if r.below(4) == 0 {
                c.truncate(r.below(c.len() as u64) as usize);
            }
            // SAFETY: the sink outlives the context (finalized below, before it drops).
            match unsafe { ctx.lmt_start_recv(1, &c, sink.as_mut_ptr(), sink.len()) } {
                Ok(_) => started += 1,
                Err(_) => refused += 1,
            }
            let junk: Vec<u8> = (0..r.below(120)).map(|_| r.next() as u8).collect();
            if ctx.lmt_handle_cts(1, &junk).is_err() {
                refused += 1;
            }
        }
        ctx.send(&[1], 1, 6).or_fail("fuzz: done");
        let violations = ctx.stats().violations - v0;
        say!("rank=0 violations={violations} cookies_refused={refused} cookies_started={started}");
        let rank = ctx.rank();
        // Receives that forged cookies started never complete: finalize warns of them.
        ctx.finalize().or_fail("finalize");
        drop(sink);
        say!("rank={rank} ok fuzz");
        return 0;
    }
    finish(ctx, "fuzz")
}

/// Each call must fail with InvalidArgument and leave the context working.
fn misuse(mut ctx: Context) -> i32 {
    let me = ctx.rank();
    let expect_invalid = |what: &str, r: gpulmt::Result<Request>| match r {
        Err(Error::InvalidArgument(m)) => say!("rank={me} refused {what}: {m}"),
        Err(e) => fail(format!("{what}: expected InvalidArgument, got {e}")),
        Ok(_) => fail(format!("{what}: accepted")),
    };
    let small = [0u8; 64];
    // SAFETY: every call below is refused before it touches its buffer.
    unsafe {
        expect_invalid("isend of usize::MAX bytes", ctx.isend(small.as_ptr(), usize::MAX, me, 1));
        expect_invalid("isend past the address space", ctx.isend(small.as_ptr(), usize::MAX / 2 + 2, me, 1));
        expect_invalid("irecv of usize::MAX bytes", ctx.irecv(small.as_ptr() as *mut u8, usize::MAX, None, None));
        expect_invalid("isend from NULL", ctx.isend(std::ptr::null(), 8, me, 1));
    }
    // Device memory released by the two-phase free.
    let d = ctx.mem_alloc(1 << 20).or_fail("mem_alloc");
    ctx.mem_free(d).or_fail("mem_free");
    ctx.mem_free_commit().or_fail("mem_free_commit");
    for len in [64, 1 << 20] {
        // SAFETY: refused: the memory was released.
        expect_invalid("isend from released device memory", unsafe { ctx.isend(d as *const u8, len, me, 1) });
        // SAFETY: as above.
        expect_invalid("irecv into released device memory", unsafe { ctx.irecv(d as *mut u8, len, None, Some(1)) });
    }
    // Still working: a message to itself.
    let mut got = [0u8; 4];
    // SAFETY: a static literal outlives the request.
    let s = unsafe { ctx.isend(b"fine".as_ptr(), 4, me, 2) }.or_fail("isend after misuse");
    ctx.recv(&mut got, Some(me), Some(2)).or_fail("recv after misuse");
    ctx.wait(s).or_fail("wait after misuse");
    if &got != b"fine" {
        fail(format!("self message after misuse: {got:?}"));
    }
    finish(ctx, "misuse")
}

fn alloc(mut ctx: Context, bytes: &str) -> i32 {
    let n = gpulmt::config::parse_size(bytes).unwrap_or_else(|| fail(format!("{bytes:?} is not a size"))) as usize;
    let me = ctx.rank();
    match ctx.mem_alloc(n) {
        Ok(p) => {
            say!("rank={me} alloc-ok bytes={n}");
            ctx.mem_free(p).or_fail("mem_free");
        }
        Err(e) => say!("rank={me} alloc-failed bytes={n} err={e}"),
    }
    ctx.mem_free_commit().or_fail("mem_free_commit");
    finish(ctx, "alloc")
}
