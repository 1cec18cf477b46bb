//! `gpulmt-check`: the rank program of gpulmt's multi-process integration tests.
//!
//! Run it under the launcher, one scenario per job:
//!
//! ```text
//! gpulmt-run -n 2 gpulmt-check pingpong --placement "D H" --sizes 0,1,65537 --offset 4096
//! gpulmt-run -n 4 gpulmt-check alltoall --iters 8
//! ```
//!
//! Every scenario checks the data it moves byte for byte (and the guard bytes around
//! receive buffers), and exits with status 1 and a `FAIL:` line on stderr at the first
//! mismatch or unexpected result. On success each rank prints, on stdout:
//!
//! ```text
//! job=<GPULMT_JOB>                                  (rank 0 only)
//! rank=R pid=P device=D size=N
//! rank=R protocols get=.. put=.. coop=.. shm=.. self=..
//! rank=R cache opens=.. closes=.. hits=.. misses=.. entries=..
//! rank=R ok <scenario>
//! ```
//!
//! After `finalize` every rank also checks that no simulated-device object of its own
//! process (`/dev/shm/gpulmt-sim-<pid>-*`) is left, and rank 0 that the job segment
//! (`/dev/shm/gpulmt-<job>`) is gone: the library's own cleanup, independent of the
//! launcher's.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use gpulmt::context::TAG_UB;
use gpulmt::{Context, Error, ProtoError, Rank, Request, Status, Tag};

// ---------------------------------------------------------------------------------
// Failure reporting
// ---------------------------------------------------------------------------------

static RANK: AtomicU32 = AtomicU32::new(u32::MAX);

/// Reports a failed check and exits with status 1.
fn fail(msg: impl std::fmt::Display) -> ! {
    use std::io::Write;
    let r = RANK.load(Ordering::Relaxed);
    let who = if r == u32::MAX { String::new() } else { format!("rank {r}: ") };
    // One write, so that lines of ranks failing together do not interleave.
    let line = format!("gpulmt-check: {who}FAIL: {msg}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::process::exit(1)
}

macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            fail(format!($($arg)+))
        }
    };
}

trait OrFail<T> {
    fn or_fail(self, what: impl std::fmt::Display) -> T;
}

impl<T, E: std::fmt::Display> OrFail<T> for Result<T, E> {
    fn or_fail(self, what: impl std::fmt::Display) -> T {
        match self {
            Ok(v) => v,
            Err(e) => fail(format!("{what}: unexpected error: {e}")),
        }
    }
}

// ---------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------

#[derive(Parser, Debug)]
#[command(name = "gpulmt-check", about = "Rank program of gpulmt's integration tests (run under gpulmt-run)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Rank 0 sends each size to rank 1, which checks it and sends it back.
    Pingpong {
        /// Memory of rank 0 and rank 1: "D D", "D H", "H D" or "H H".
        #[arg(long, default_value = "D D")]
        placement: String,
        /// Comma-separated message sizes (bytes; K/M suffixes allowed).
        #[arg(long, default_value = "0,1,7,4095,4096,65537,4194304,67108864")]
        sizes: String,
        /// Offset of every buffer inside its allocation (also the guard size).
        #[arg(long, default_value_t = 4096)]
        offset: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Every rank sends mixed messages to every other rank; ANY_SOURCE receives.
    Alltoall {
        #[arg(long, default_value_t = 4)]
        iters: u32,
        /// Also send a message to oneself each iteration.
        #[arg(long)]
        include_self: bool,
    },
    /// Ring exchange of device buffers among ranks that share one device.
    SameDevice {
        #[arg(long, default_value_t = 2)]
        iters: u32,
    },
    /// Messages larger than the receive buffer.
    Truncate {
        #[arg(long, default_value = "H H")]
        placement: String,
    },
    /// Zero-length messages, bad ranks and tags, cancel, iprobe.
    ZeroAndBad,
    /// Messages a rank sends to itself (eager and rendezvous, host and device).
    Selfsend,
    /// Rank 1 dies abruptly; rank 0's pending transfer must fail, not hang.
    Die {
        #[arg(long, value_enum, default_value_t = When::Before)]
        when: When,
        #[arg(long, value_enum, default_value_t = How::Exit)]
        how: How,
        /// Memory of rank 0 and rank 1 (host on both sides moves through SHM).
        #[arg(long, default_value = "H H")]
        placement: String,
        /// Whether rank 0 (the survivor) sends to or receives from rank 1.
        #[arg(long, value_enum, default_value_t = Role::Send)]
        role: Role,
        #[arg(long, default_value = "64M")]
        size: String,
        /// After the death, the survivor also frees (two-phase) the buffer of the
        /// transfer, which the dead rank may have had mapped.
        #[arg(long)]
        free_mapped: bool,
        /// The survivor's receive names no source (ANY_SOURCE); in a 2-rank job only
        /// the dead rank (or itself) could ever match it.
        #[arg(long)]
        any_source: bool,
    },
    /// A window of concurrent messages between ranks 0 and 1: with one tag they must
    /// match in send order (non-overtaking, eager and rendezvous mixed); with distinct
    /// tags the receives are posted in reverse order (SHM transfers queue per pair).
    Window {
        #[arg(long, default_value = "H H")]
        placement: String,
        #[arg(long, default_value_t = 12)]
        count: u32,
        #[arg(long, default_value = "1048577,10,3145728,0,65537,8193,8192")]
        sizes: String,
        #[arg(long)]
        same_tag: bool,
    },
    /// Rank 1 writes forged control packets straight into its ring to rank 0 (through
    /// the public `gpulmt::shm::job::JobSegment`): garbage, a wrong version, RTSs whose
    /// regions lie about their allocation or carry forged handles, answers to messages
    /// that do not exist. Rank 0 must count violations, fail the receives that matched
    /// forged RTSs without writing a byte, and keep working.
    Forged,
    /// Two-phase free across all ranks, interleaved with transfers.
    Free {
        #[arg(long, default_value_t = 2)]
        rounds: u32,
        /// Check that a transfer from a new allocation opens a new mapping on the
        /// receiver (true when the receiver maps the sender's buffer: GET).
        #[arg(long)]
        fresh_open: bool,
    },
    /// A window of concurrent sends of one device buffer: one mapping per allocation.
    Cache {
        #[arg(long, default_value_t = 64)]
        iters: u32,
        #[arg(long, default_value = "64K")]
        size: String,
        /// Expected handle-cache opens on the receiver (rank 1) and the sender (rank 0).
        #[arg(long)]
        expect_recv_opens: Option<u64>,
        #[arg(long)]
        expect_send_opens: Option<u64>,
    },
    /// A wildcard (ANY_SOURCE, ANY_TAG) receive posted before a barrier must receive
    /// the user's message, not the barrier's internal one.
    WildcardBarrier {
        #[arg(long, default_value_t = 5)]
        timeout_s: u64,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum When {
    /// Rank 1 dies once rank 0's message is waiting for it, before receiving anything.
    Before,
    /// Rank 1 dies after the transfer has started moving data.
    Mid,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum How {
    /// std::process::exit(3): no destructors, no finalize.
    Exit,
    /// SIGKILL to itself.
    Kill,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Send,
    Recv,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Host,
    Dev,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Host => "H",
            Kind::Dev => "D",
        })
    }
}

fn parse_placement(s: &str) -> (Kind, Kind) {
    let ks: Vec<Kind> = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != ',' && *c != '-')
        .map(|c| match c.to_ascii_uppercase() {
            'D' => Kind::Dev,
            'H' => Kind::Host,
            _ => fail(format!("placement {s:?}: expected two of D (device) / H (host), e.g. \"D H\"")),
        })
        .collect();
    ensure!(ks.len() == 2, "placement {s:?}: expected two of D / H, e.g. \"D H\"");
    (ks[0], ks[1])
}

fn parse_size(s: &str) -> usize {
    gpulmt::config::parse_size(s).unwrap_or_else(|| fail(format!("{s:?} is not a size"))) as usize
}

fn parse_sizes(s: &str) -> Vec<usize> {
    s.split(',').filter(|t| !t.trim().is_empty()).map(parse_size).collect()
}

// ---------------------------------------------------------------------------------
// Data and buffers
// ---------------------------------------------------------------------------------

/// Deterministic pseudo-random bytes (splitmix64) from `seed`.
fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n.next_multiple_of(8)];
    let mut s = seed ^ 0x6a09_e667_f3bc_c908;
    for c in v.chunks_exact_mut(8) {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        c.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    v.truncate(n);
    v
}

/// Seed of the message `src -> dst` of iteration `iter` (alltoall, free...).
fn msg_seed(src: u32, dst: u32, iter: u32, salt: u64) -> u64 {
    ((src as u64) << 48) ^ ((dst as u64) << 32) ^ ((iter as u64) << 8) ^ salt.wrapping_mul(0x1000_0000_01b3)
}

/// Index of the first byte of `a` that is not `v`.
fn first_not(a: &[u8], v: u8) -> Option<usize> {
    // Compare against a filled buffer: memcmp is fast even in debug builds.
    if a == vec![v; a.len()].as_slice() {
        None
    } else {
        a.iter().position(|&b| b != v)
    }
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        None
    } else {
        Some(a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len())))
    }
}

const GUARD_SEND: u8 = 0xa5;
const GUARD_RECV: u8 = 0x5a;

/// A buffer of `len` bytes at offset `off` of an allocation of `len + 2*off` bytes
/// (device memory from `mem_alloc`, or a host Vec); the bytes around it are guards.
struct Buf {
    kind: Kind,
    host: Vec<u8>,
    dev: usize,
    total: usize,
    off: usize,
    len: usize,
}

impl Buf {
    fn new(ctx: &mut Context, kind: Kind, len: usize, off: usize, guard: u8) -> Buf {
        let total = len + 2 * off;
        let mut b = match kind {
            Kind::Host => Buf { kind, host: vec![guard; total], dev: 0, total, off, len },
            Kind::Dev => {
                let dev = ctx.mem_alloc(total).or_fail(format!("mem_alloc({total})"));
                Buf { kind, host: Vec::new(), dev, total, off, len }
            }
        };
        if kind == Kind::Dev {
            b.fill(ctx, guard);
        }
        b
    }

    /// Sets every byte of the allocation to `v`.
    fn fill(&mut self, ctx: &Context, v: u8) {
        match self.kind {
            Kind::Host => self.host.fill(v),
            Kind::Dev if self.total > 0 => {
                let tmp = vec![v; self.total];
                // SAFETY: `dev` is this buffer's allocation of `total` bytes from mem_alloc, and
                // `&mut self` means no transfer of it is running.
                unsafe { ctx.copy_sync(self.dev, tmp.as_ptr() as usize, self.total) }.or_fail("copy_sync to device");
            }
            Kind::Dev => {}
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        match self.kind {
            // SAFETY: off <= total, inside (or one past) the Vec.
            Kind::Host => unsafe { self.host.as_mut_ptr().add(self.off) },
            Kind::Dev => (self.dev + self.off) as *mut u8,
        }
    }

    /// The whole allocation, guards included, as host bytes.
    fn whole(&self, ctx: &Context) -> Vec<u8> {
        match self.kind {
            Kind::Host => self.host.clone(),
            Kind::Dev => {
                let mut v = vec![0u8; self.total];
                if self.total > 0 {
                    // SAFETY: `dev` is this buffer's allocation of `total` bytes from mem_alloc;
                    // callers read it between transfers.
                    unsafe { ctx.copy_sync(v.as_mut_ptr() as usize, self.dev, self.total) }
                        .or_fail("copy_sync from device");
                }
                v
            }
        }
    }

    /// Writes `data` at the buffer's start.
    fn write(&mut self, ctx: &Context, data: &[u8]) {
        ensure!(data.len() <= self.len, "internal: {} bytes written into a {}-byte buffer", data.len(), self.len);
        match self.kind {
            Kind::Host => self.host[self.off..self.off + data.len()].copy_from_slice(data),
            Kind::Dev if !data.is_empty() => {
                // SAFETY: `data.len() <= len` (checked above) bytes at `off` of this buffer's
                // allocation of `len + 2 * off` bytes, with no transfer running (`&mut self`).
                unsafe { ctx.copy_sync(self.dev + self.off, data.as_ptr() as usize, data.len()) }
                    .or_fail("copy_sync to device")
            }
            Kind::Dev => {}
        }
    }

    /// Checks that the buffer starts with `expect` and that every other byte of the
    /// allocation (guards, and the buffer's tail past the message) is still `guard`.
    fn verify(&self, ctx: &Context, expect: &[u8], guard: u8, what: &str) {
        let w = self.whole(ctx);
        let (off, n) = (self.off, expect.len());
        let kind = self.kind;
        if let Some(i) = first_not(&w[..off], guard) {
            fail(format!(
                "{what}: guard byte {} before the {kind} buffer was overwritten ({:#04x}, expected {guard:#04x})",
                off - i,
                w[i]
            ));
        }
        if let Some(i) = first_diff(&w[off..off + n], expect) {
            let bad = w[off..off + n].iter().zip(expect).filter(|(a, b)| a != b).count();
            fail(format!(
                "{what}: {kind} data differs at byte {i} of {n}: got {:#04x}, expected {:#04x} ({bad} bytes differ)",
                w[off + i],
                expect[i]
            ));
        }
        if let Some(i) = first_not(&w[off + n..], guard) {
            fail(format!(
                "{what}: byte {} past the {n}-byte message in the {kind} buffer (of {} bytes + {} guard) was overwritten ({:#04x}, expected {guard:#04x})",
                i,
                self.len,
                off,
                w[off + n + i]
            ));
        }
    }

    /// Marks device memory for the next `mem_free_commit`.
    fn release(self, ctx: &mut Context) {
        if self.kind == Kind::Dev {
            ctx.mem_free(self.dev).or_fail("mem_free");
        }
    }
}

// ---------------------------------------------------------------------------------
// Small helpers around the API
// ---------------------------------------------------------------------------------

fn isend(ctx: &mut Context, b: &mut Buf, len: usize, dst: Rank, tag: Tag) -> Request {
    ensure!(len <= b.len, "internal: send of {len} from a {}-byte buffer", b.len);
    // SAFETY: the buffer outlives the request: every caller waits before dropping it.
    unsafe { ctx.isend(b.ptr(), len, dst, tag) }.or_fail(format!("isend of {len} bytes to {dst} tag {tag}"))
}

fn irecv(ctx: &mut Context, b: &mut Buf, src: Option<Rank>, tag: Option<Tag>) -> Request {
    // SAFETY: as in isend.
    unsafe { ctx.irecv(b.ptr(), b.len, src, tag) }.or_fail(format!("irecv of {} bytes from {src:?} tag {tag:?}", b.len))
}

fn expect_status(st: &Status, source: Rank, tag: Tag, len: usize, what: &str) {
    ensure!(
        st.source == source && st.tag == tag && st.len == len as u64,
        "{what}: status {st:?}, expected source {source} tag {tag} len {len}"
    );
}

fn print_stats(ctx: &Context) {
    let s = ctx.stats();
    let r = ctx.rank();
    let p = s.protocols;
    println!("rank={r} protocols get={} put={} coop={} shm={} self={}", p[0], p[1], p[2], p[3], p[4]);
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

/// `/dev/shm` entries whose name starts with `prefix`.
fn shm_entries(prefix: &str) -> Vec<String> {
    match std::fs::read_dir("/dev/shm") {
        Ok(d) => d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(prefix)).collect(),
        Err(_) => Vec::new(),
    }
}

fn my_sim_objects() -> Vec<String> {
    shm_entries(&format!("gpulmt-sim-{}-", std::process::id()))
}

/// Finalizes and checks that the library left nothing of this process in /dev/shm.
fn finish(ctx: Context, scenario: &str) {
    let violations = ctx.stats().violations;
    if violations != 0 {
        print_stats(&ctx);
        fail(format!("{violations} protocol violations were counted"));
    }
    finish_allowing_violations(ctx, scenario)
}

fn finish_allowing_violations(ctx: Context, scenario: &str) {
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

// ---------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------

fn need_ranks(ctx: &Context, n: u32, scenario: &str) {
    ensure!(ctx.size() >= n, "{scenario} needs at least {n} ranks (gpulmt-run -n {n}), got {}", ctx.size());
}

fn pingpong(ctx: &mut Context, placement: &str, sizes: &str, off: usize, seed: u64) {
    need_ranks(ctx, 2, "pingpong");
    let (k0, k1) = parse_placement(placement);
    let sizes = parse_sizes(sizes);
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    for (i, &size) in sizes.iter().enumerate() {
        let tag = 1 + i as Tag;
        let data = pattern(seed ^ (size as u64).wrapping_mul(0x9e37), size);
        let what = |dir: &str| format!("pingpong {k0}->{k1} size {size} ({dir})");
        let t0 = Instant::now();
        if me == 0 {
            let mut s = Buf::new(ctx, k0, size, off, GUARD_SEND);
            s.write(ctx, &data);
            let mut r = Buf::new(ctx, k0, size, off, GUARD_RECV);
            let rr = irecv(ctx, &mut r, Some(1), Some(tag));
            let sr = isend(ctx, &mut s, size, 1, tag);
            let st = ctx.wait(sr).or_fail(what("send 0->1"));
            expect_status(&st, 1, tag, size, &what("send status"));
            let st = ctx.wait(rr).or_fail(what("receive 1->0"));
            expect_status(&st, 1, tag, size, &what("receive status 1->0"));
            r.verify(ctx, &data, GUARD_RECV, &what("data back at rank 0"));
            s.verify(ctx, &data, GUARD_SEND, &what("rank 0's send buffer after the send"));
            s.release(ctx);
            r.release(ctx);
        } else {
            let mut r = Buf::new(ctx, k1, size, off, GUARD_RECV);
            if i % 2 == 0 {
                // Let the message arrive first: the unexpected-message path.
                let deadline = Instant::now() + Duration::from_secs(20);
                while ctx.iprobe(Some(0), Some(tag)).or_fail("iprobe").is_none() {
                    ensure!(Instant::now() < deadline, "{}: message never arrived (iprobe)", what("probe"));
                }
            }
            let rr = irecv(ctx, &mut r, Some(0), Some(tag));
            let st = ctx.wait(rr).or_fail(what("receive 0->1"));
            expect_status(&st, 0, tag, size, &what("receive status 0->1"));
            r.verify(ctx, &data, GUARD_RECV, &what("data at rank 1"));
            let sr = isend(ctx, &mut r, size, 0, tag);
            let st = ctx.wait(sr).or_fail(what("send 1->0"));
            expect_status(&st, 0, tag, size, &what("send status 1->0"));
            r.verify(ctx, &data, GUARD_RECV, &what("rank 1's buffer after sending it back"));
            r.release(ctx);
        }
        // Collective on both ranks: releases this size's device buffers.
        ctx.mem_free_commit().or_fail(what("mem_free_commit"));
        println!("rank={me} size={size} placement={k0}{k1} ms={:.1}", t0.elapsed().as_secs_f64() * 1e3);
    }
}

const A2A_SIZES: [usize; 7] = [0, 1, 100, 8192, 8193, 65539, 1 << 20];
const A2A_MAX: usize = 1 << 20;
const A2A_OFF: usize = 64;

fn a2a_hash(src: u32, dst: u32, iter: u32) -> u64 {
    let mut z = msg_seed(src, dst, iter, 7).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 27)
}

fn a2a_size(src: u32, dst: u32, iter: u32) -> usize {
    A2A_SIZES[(a2a_hash(src, dst, iter) % A2A_SIZES.len() as u64) as usize]
}

fn a2a_sender_kind(src: u32, dst: u32, iter: u32) -> Kind {
    if (a2a_hash(src, dst, iter) >> 20) & 1 == 1 {
        Kind::Dev
    } else {
        Kind::Host
    }
}

fn alltoall(ctx: &mut Context, iters: u32, include_self: bool) {
    let (me, n) = (ctx.rank(), ctx.size());
    let peers: Vec<u32> = (1..n).map(|k| (me + k) % n).chain(include_self.then_some(me)).collect();
    let slots = peers.len();
    // Receive buffers per slot (host and device), send buffers per destination.
    let mut rh: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Host, A2A_MAX, A2A_OFF, GUARD_RECV)).collect();
    let mut rd: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Dev, A2A_MAX, A2A_OFF, GUARD_RECV)).collect();
    let mut sh: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Host, A2A_MAX, A2A_OFF, GUARD_SEND)).collect();
    let mut sd: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Dev, A2A_MAX, A2A_OFF, GUARD_SEND)).collect();
    let mut received = 0u64;
    for iter in 0..iters {
        let tag = 100 + iter as Tag;
        let recv_kind = |j: usize| {
            if (me as usize + iter as usize + j) & 1 == 0 {
                Kind::Dev
            } else {
                Kind::Host
            }
        };
        let mut rreqs = Vec::new();
        for j in 0..slots {
            let b = if recv_kind(j) == Kind::Dev { &mut rd[j] } else { &mut rh[j] };
            if iter > 0 {
                b.fill(ctx, GUARD_RECV);
            }
            rreqs.push(irecv(ctx, b, None, Some(tag)));
        }
        let mut sreqs = Vec::new();
        for (j, &dst) in peers.iter().enumerate() {
            let len = a2a_size(me, dst, iter);
            let data = pattern(msg_seed(me, dst, iter, 1), len);
            let b = if a2a_sender_kind(me, dst, iter) == Kind::Dev { &mut sd[j] } else { &mut sh[j] };
            b.write(ctx, &data);
            sreqs.push(isend(ctx, b, len, dst, tag));
        }
        let statuses = ctx.wait_all(rreqs).or_fail(format!("alltoall iteration {iter}: receives"));
        let mut seen = BTreeSet::new();
        for (j, st) in statuses.iter().enumerate() {
            let src = st.source;
            ensure!(
                peers.contains(&src),
                "alltoall iteration {iter}: receive {j} completed with source {src}, not a peer ({st:?})"
            );
            ensure!(seen.insert(src), "alltoall iteration {iter}: two messages from rank {src}");
            let len = a2a_size(src, me, iter);
            expect_status(st, src, tag, len, &format!("alltoall iteration {iter} from {src}"));
            let data = pattern(msg_seed(src, me, iter, 1), len);
            let b = if recv_kind(j) == Kind::Dev { &rd[j] } else { &rh[j] };
            b.verify(
                ctx,
                &data,
                GUARD_RECV,
                &format!(
                    "alltoall iteration {iter}: {len} bytes from rank {src} ({} memory) into slot {j}",
                    a2a_sender_kind(src, me, iter)
                ),
            );
            received += 1;
        }
        ensure!(seen.len() == slots, "alltoall iteration {iter}: got messages from {seen:?}, expected {peers:?}");
        let sst = ctx.wait_all(sreqs).or_fail(format!("alltoall iteration {iter}: sends"));
        for (j, st) in sst.iter().enumerate() {
            expect_status(st, peers[j], tag, a2a_size(me, peers[j], iter), &format!("alltoall send status {iter}"));
        }
    }
    println!("rank={me} alltoall received={received}");
    for b in rd.into_iter().chain(sd) {
        b.release(ctx);
    }
    drop((rh, sh));
    ctx.mem_free_commit().or_fail("alltoall: final mem_free_commit");
}

fn same_device(ctx: &mut Context, iters: u32) {
    let (me, n) = (ctx.rank(), ctx.size());
    need_ranks(ctx, 2, "same-device");
    ensure!(
        ctx.device() == 0,
        "same-device: rank {me} is on device {}, expected 0 (run with GPULMT_SIM_DEVICES=1)",
        ctx.device()
    );
    let right = (me + 1) % n;
    let left = (me + n - 1) % n;
    let sizes = [1usize, 4096, 65537, 1 << 20];
    for iter in 0..iters {
        for (i, &len) in sizes.iter().enumerate() {
            let tag = (iter * 16 + i as u32) as Tag;
            let mut s = Buf::new(ctx, Kind::Dev, len, 512, GUARD_SEND);
            s.write(ctx, &pattern(msg_seed(me, right, iter, len as u64), len));
            let mut r = Buf::new(ctx, Kind::Dev, len, 512, GUARD_RECV);
            let rr = irecv(ctx, &mut r, Some(left), Some(tag));
            let sr = isend(ctx, &mut s, len, right, tag);
            let st = ctx.wait(rr).or_fail("same-device receive");
            expect_status(&st, left, tag, len, "same-device receive");
            ctx.wait(sr).or_fail("same-device send");
            r.verify(
                ctx,
                &pattern(msg_seed(left, me, iter, len as u64), len),
                GUARD_RECV,
                &format!("same-device {len} bytes from {left}"),
            );
            s.release(ctx);
            r.release(ctx);
        }
        ctx.mem_free_commit().or_fail("same-device mem_free_commit");
    }
}

fn truncate(ctx: &mut Context, placement: &str) {
    need_ranks(ctx, 2, "truncate");
    let (k0, k1) = parse_placement(placement);
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    // (message, receive buffer): eager and rendezvous sizes, off by one, and empty.
    let cases = [(100usize, 50usize), (8192, 8191), (1, 0), (65537, 65536), (1 << 20, 1 << 19), (4 << 20, 4096)];
    let off = 256;
    for (i, &(mlen, blen)) in cases.iter().enumerate() {
        let tag = 10 + 2 * i as Tag;
        let data = pattern(msg_seed(0, 1, i as u32, 3), mlen);
        let what = format!("truncate {k0}->{k1}: {mlen}-byte message into {blen}-byte buffer");
        if me == 0 {
            let mut s = Buf::new(ctx, k0, mlen, off, GUARD_SEND);
            s.write(ctx, &data);
            let sr = isend(ctx, &mut s, mlen, 1, tag);
            // MPI: the send of a truncated message succeeds; the receiver reports it.
            let st = ctx.wait(sr).or_fail(format!("{what}: the sender must complete Ok"));
            expect_status(&st, 1, tag, mlen, &what);
            s.release(ctx);
        } else {
            let mut r = Buf::new(ctx, k1, blen, off, GUARD_RECV);
            let rr = irecv(ctx, &mut r, Some(0), Some(tag));
            match ctx.wait(rr) {
                Err(e) => match e.as_transfer() {
                    Some(ProtoError::Truncated { msg_len, buf_len }) => ensure!(
                        *msg_len == mlen as u64 && *buf_len == blen as u64,
                        "{what}: Truncated {{ msg_len: {msg_len}, buf_len: {buf_len} }}, expected {mlen} and {blen}"
                    ),
                    _ => fail(format!("{what}: expected Error::Transfer(Truncated), got {e:?}")),
                },
                Ok(st) => fail(format!("{what}: receive succeeded ({st:?}), expected Truncated")),
            }
            // The buffer holds nothing or the message's prefix; nothing past it changed.
            let w = r.whole(ctx);
            let inside = &w[off..off + blen];
            ensure!(
                first_not(inside, GUARD_RECV).is_none() || inside == &data[..blen],
                "{what}: the receive buffer holds neither its old bytes nor the message's prefix"
            );
            if let Some(i) = first_not(&w[off + blen..], GUARD_RECV) {
                fail(format!("{what}: guard byte {i} after the receive buffer was overwritten"));
            }
            if let Some(i) = first_not(&w[..off], GUARD_RECV) {
                fail(format!("{what}: guard byte {i} before the receive buffer was overwritten"));
            }
            r.release(ctx);
        }
        // The pair still works: a rendezvous-sized message each way.
        let ok_len = 65536 + 8;
        let back = pattern(msg_seed(1, 0, i as u32, 4), ok_len);
        let fwd = pattern(msg_seed(0, 1, i as u32, 4), ok_len);
        let (mine, theirs, kind) = if me == 0 { (&fwd, &back, k0) } else { (&back, &fwd, k1) };
        let peer = 1 - me;
        let mut s = Buf::new(ctx, kind, ok_len, off, GUARD_SEND);
        s.write(ctx, mine);
        let mut r = Buf::new(ctx, kind, ok_len, off, GUARD_RECV);
        let rr = irecv(ctx, &mut r, Some(peer), Some(tag + 1));
        let sr = isend(ctx, &mut s, ok_len, peer, tag + 1);
        let st = ctx.wait(rr).or_fail(format!("{what}: the normal message after it"));
        expect_status(&st, peer, tag + 1, ok_len, &what);
        ctx.wait(sr).or_fail(format!("{what}: the normal send after it"));
        r.verify(ctx, theirs, GUARD_RECV, &format!("{what}: the normal message after it"));
        s.release(ctx);
        r.release(ctx);
        ctx.mem_free_commit().or_fail("truncate: mem_free_commit");
    }
}

fn expect_err(r: Result<Request, Error>, what: &str, ok: impl Fn(&Error) -> bool) {
    match r {
        Ok(req) => fail(format!("{what}: accepted (request {}), expected an error", req.id())),
        Err(e) if ok(&e) => println!("rank={} rejected {what}: {e}", RANK.load(Ordering::Relaxed)),
        Err(e) => fail(format!("{what}: wrong error {e:?}")),
    }
}

fn zero_and_bad(ctx: &mut Context) {
    need_ranks(ctx, 2, "zero-and-bad");
    let (me, n) = (ctx.rank(), ctx.size());
    if me >= 2 {
        return;
    }
    let peer = 1 - me;
    let mut small = Buf::new(ctx, Kind::Host, 16, 16, GUARD_RECV);
    let mut dev = Buf::new(ctx, Kind::Dev, 4096, 0, GUARD_RECV);

    // Bad destination / source ranks: an error at once, no hang.
    let t0 = Instant::now();
    let is_bad_rank = |r: u32| move |e: &Error| matches!(e.as_transfer(), Some(ProtoError::BadRank { rank, size }) if *rank == r && *size == n);
    expect_err(unsafe { ctx.isend(small.ptr(), 4, n, 1) }, "isend to rank == size", is_bad_rank(n));
    expect_err(unsafe { ctx.isend(small.ptr(), 0, n + 5, 1) }, "zero-length isend to rank > size", is_bad_rank(n + 5));
    expect_err(
        unsafe { ctx.isend(dev.ptr(), 4096, u32::MAX, 1) },
        "device isend to rank u32::MAX",
        is_bad_rank(u32::MAX),
    );
    expect_err(unsafe { ctx.irecv(small.ptr(), 16, Some(n), Some(1)) }, "irecv from rank == size", is_bad_rank(n));
    // Bad tags.
    let invalid = |e: &Error| matches!(e, Error::InvalidArgument(_));
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, -1) }, "isend with tag -1", invalid);
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, i32::MIN) }, "isend with tag i32::MIN", invalid);
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, TAG_UB) }, "isend with the reserved tag TAG_UB", invalid);
    expect_err(unsafe { ctx.isend(small.ptr(), 4, peer, i32::MAX - 1) }, "isend with the barrier's tag", invalid);
    expect_err(unsafe { ctx.irecv(small.ptr(), 16, Some(peer), Some(-7)) }, "irecv with tag -7", invalid);
    expect_err(unsafe { ctx.irecv(small.ptr(), 16, None, Some(TAG_UB)) }, "irecv with tag TAG_UB", invalid);
    // A device range running past its allocation.
    expect_err(
        unsafe { ctx.isend(dev.ptr().add(100), 4096, peer, 1) },
        "isend of a device range past the end of its allocation",
        invalid,
    );
    expect_err(
        unsafe { ctx.irecv(dev.ptr().add(4000), 200_000, Some(peer), Some(1)) },
        "irecv into a device range past the end of its allocation",
        invalid,
    );
    // Unknown request.
    match ctx.test(&Request::from_id(0xdead_beef)) {
        Err(Error::InvalidArgument(_)) => {}
        other => fail(format!("test of an unknown request: {other:?}, expected InvalidArgument")),
    }
    ensure!(t0.elapsed() < Duration::from_secs(2), "rejecting bad arguments took {:?}", t0.elapsed());

    // Cancel a receive that cannot match.
    let rq = irecv(ctx, &mut small, Some(peer), Some(999));
    ensure!(ctx.cancel(&rq), "cancel of an unmatched receive returned false");
    match ctx.wait(rq) {
        Err(e) if matches!(e.as_transfer(), Some(ProtoError::Cancelled)) => {}
        other => fail(format!("a cancelled receive completed with {other:?}, expected Cancelled")),
    }

    let top = TAG_UB - 1;
    if me == 0 {
        // Zero-length messages from host (dangling pointer), device memory, with the
        // largest user tag; then a 3-byte message for iprobe.
        let dangling = std::ptr::NonNull::<u8>::dangling().as_ptr();
        let r1 = unsafe { ctx.isend(dangling, 0, 1, 10) }.or_fail("zero-length isend from a dangling host pointer");
        let r2 = unsafe { ctx.isend(dev.ptr(), 0, 1, 11) }.or_fail("zero-length isend from device memory");
        let r3 = unsafe { ctx.isend(dangling, 0, 1, top) }.or_fail("zero-length isend with tag TAG_UB-1");
        let r4 = unsafe { ctx.isend(std::ptr::null(), 0, 1, 12) }.or_fail("zero-length isend from a null pointer");
        let probe = [1u8, 2, 3];
        let r5 = unsafe { ctx.isend(probe.as_ptr(), 3, 1, 20) }.or_fail("3-byte isend");
        for (i, st) in ctx.wait_all(vec![r1, r2, r3, r4, r5]).or_fail("zero-length sends").iter().enumerate() {
            let (tag, len) = [(10, 0), (11, 0), (top, 0), (12, 0), (20, 3)][i];
            expect_status(st, 1, tag, len, "zero-length send status");
        }
        // And one zero-length message back into device memory.
        let rr = irecv(ctx, &mut dev, Some(1), Some(13));
        let st = ctx.wait(rr).or_fail("zero-length receive into device memory");
        expect_status(&st, 1, 13, 0, "zero-length receive into device memory");
        dev.verify(ctx, &[], GUARD_RECV, "device buffer after a zero-length receive");
    } else {
        // Into a 16-byte host buffer: nothing may be written.
        let rr = irecv(ctx, &mut small, Some(0), Some(10));
        let st = ctx.wait(rr).or_fail("zero-length receive");
        expect_status(&st, 0, 10, 0, "zero-length receive");
        small.verify(ctx, &[], GUARD_RECV, "16-byte buffer after a zero-length receive");
        // Into device memory.
        let rr = irecv(ctx, &mut dev, Some(0), Some(11));
        let st = ctx.wait(rr).or_fail("zero-length receive into device memory");
        expect_status(&st, 0, 11, 0, "zero-length receive into device memory");
        dev.verify(ctx, &[], GUARD_RECV, "device buffer after a zero-length receive");
        // Zero-length receive buffer, any tag (the TAG_UB-1 message is next in order).
        let rr = unsafe { ctx.irecv(std::ptr::null_mut(), 0, Some(0), None) }.or_fail("zero-length irecv, any tag");
        let st = ctx.wait(rr).or_fail("zero-length receive with any tag");
        expect_status(&st, 0, top, 0, "zero-length receive, any tag");
        let rr = unsafe { ctx.irecv(std::ptr::null_mut(), 0, Some(0), Some(12)) }.or_fail("zero-length irecv, null");
        let st = ctx.wait(rr).or_fail("zero-length receive into a null pointer");
        expect_status(&st, 0, 12, 0, "zero-length receive into a null pointer");
        // iprobe sees the envelope without consuming it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let st = loop {
            ensure!(ctx.iprobe(Some(0), Some(21)).or_fail("iprobe").is_none(), "iprobe matched tag 21, never sent");
            if let Some(st) = ctx.iprobe(Some(0), Some(20)).or_fail("iprobe") {
                break st;
            }
            ensure!(Instant::now() < deadline, "iprobe never saw the 3-byte message");
        };
        expect_status(&st, 0, 20, 3, "iprobe");
        let again = ctx.iprobe(None, None).or_fail("iprobe(any, any)");
        ensure!(again == Some(st), "a second iprobe saw {again:?}, expected {st:?} (iprobe must not consume)");
        let mut got = [0u8; 8];
        let st = ctx.recv(&mut got, None, Some(20)).or_fail("receive of the probed message");
        expect_status(&st, 0, 20, 3, "receive of the probed message");
        ensure!(got == [1, 2, 3, 0, 0, 0, 0, 0], "probed message: got {got:?}");
        ensure!(ctx.iprobe(Some(0), None).or_fail("iprobe").is_none(), "iprobe still sees a consumed message");
        let sr = unsafe { ctx.isend(dev.ptr(), 0, 0, 13) }.or_fail("zero-length isend into device memory");
        ctx.wait(sr).or_fail("zero-length send 1->0");
    }
    dev.release(ctx);
    ctx.mem_free_commit().or_fail("mem_free_commit");
}

fn selfsend(ctx: &mut Context) {
    let me = ctx.rank();
    let cases: [(Kind, Kind, usize); 8] = [
        (Kind::Host, Kind::Host, 0),
        (Kind::Host, Kind::Host, 100),
        (Kind::Host, Kind::Host, 1 << 20),
        (Kind::Dev, Kind::Dev, 1),
        (Kind::Dev, Kind::Dev, 1 << 20),
        (Kind::Host, Kind::Dev, 1 << 20),
        (Kind::Dev, Kind::Host, 1 << 20),
        (Kind::Host, Kind::Dev, 300),
    ];
    for (i, &(ks, kr, len)) in cases.iter().enumerate() {
        let tag = 50 + i as Tag;
        let data = pattern(msg_seed(me, me, i as u32, 9), len);
        let what = format!("self-send {ks}->{kr} of {len} bytes");
        let mut s = Buf::new(ctx, ks, len, 128, GUARD_SEND);
        s.write(ctx, &data);
        let mut r = Buf::new(ctx, kr, len, 128, GUARD_RECV);
        // Alternate: send first (unexpected) or receive first.
        let (sr, rr) = if i % 2 == 0 {
            let sr = isend(ctx, &mut s, len, me, tag);
            (sr, irecv(ctx, &mut r, Some(me), Some(tag)))
        } else {
            let rr = irecv(ctx, &mut r, Some(me), Some(tag));
            (isend(ctx, &mut s, len, me, tag), rr)
        };
        let st = ctx.wait(rr).or_fail(format!("{what}: receive"));
        expect_status(&st, me, tag, len, &what);
        ctx.wait(sr).or_fail(format!("{what}: send"));
        r.verify(ctx, &data, GUARD_RECV, &what);
        s.verify(ctx, &data, GUARD_SEND, &format!("{what}: send buffer"));
        s.release(ctx);
        r.release(ctx);
    }
    // Truncated messages to oneself: eager and rendezvous.
    for (i, (mlen, blen)) in [(100usize, 99usize), (1 << 20, 4096)].into_iter().enumerate() {
        let tag = 70 + i as Tag;
        let what = format!("self-send of {mlen} bytes into {blen}");
        let mut s = Buf::new(ctx, Kind::Host, mlen, 0, GUARD_SEND);
        s.write(ctx, &pattern(5, mlen));
        let mut r = Buf::new(ctx, Kind::Host, blen, 64, GUARD_RECV);
        let sr = isend(ctx, &mut s, mlen, me, tag);
        let rr = irecv(ctx, &mut r, Some(me), Some(tag));
        match ctx.wait(rr) {
            Err(e) if matches!(e.as_transfer(), Some(ProtoError::Truncated { msg_len, buf_len }) if *msg_len == mlen as u64 && *buf_len == blen as u64) =>
                {}
            other => fail(format!("{what}: receive completed with {other:?}, expected Truncated")),
        }
        ctx.wait(sr).or_fail(format!("{what}: the send must complete Ok"));
        let w = r.whole(ctx);
        ensure!(
            first_not(&w[64 + blen..], GUARD_RECV).is_none(),
            "{what}: guard bytes after the buffer were overwritten"
        );
    }
    ctx.mem_free_commit().or_fail("self-send: mem_free_commit");
}

fn die_now(how: How) -> ! {
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

const DIE_TAG: Tag = 77;

/// Rank 1 dies abruptly in the middle of a transfer with rank 0, which must see its
/// request fail in bounded time and then exit 0 printing `survivor-ok`.
#[allow(clippy::too_many_arguments)]
fn die(
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
fn survivors_carry_on(ctx: &mut Context, mine: Option<Buf>) {
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
    ensure!(t0.elapsed() < Duration::from_secs(5), "survivors' exchange and commit took {:?}", t0.elapsed());
    res.or_fail("mem_free_commit among survivors after a peer died");
}

fn bystander(mut ctx: Context) -> ! {
    let me = ctx.rank();
    survivors_carry_on(&mut ctx, None);
    finalize_survivor(ctx, me)
}

/// A survivor's end: finalize cannot synchronise with a dead rank, so it must return
/// quickly, not hang; the context's device memory must be gone with it.
fn finalize_survivor(ctx: Context, me: u32) -> ! {
    let t = Instant::now();
    let fin = ctx.finalize();
    ensure!(t.elapsed() < Duration::from_secs(5), "finalize with a dead peer took {:?}", t.elapsed());
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

fn survivor(mut ctx: Context, kind: Kind, role: Role, len: usize, free_mapped: bool, any_source: bool) -> ! {
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
    ensure!(took < Duration::from_secs(5), "noticing the dead peer took {took:?}");
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
    ensure!(t1.elapsed() < Duration::from_secs(2), "operations with the dead peer took {:?}", t1.elapsed());
    // Self-messages still work.
    let mut one = [0u8; 4];
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

fn victim(mut ctx: Context, kind: Kind, when: When, how: How, role: Role, len: usize) -> ! {
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

fn free(ctx: &mut Context, rounds: u32, fresh_open: bool) {
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

fn window(ctx: &mut Context, placement: &str, count: u32, sizes: &str, same_tag: bool) {
    need_ranks(ctx, 2, "window");
    let (k0, k1) = parse_placement(placement);
    let sizes = parse_sizes(sizes);
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    let k = count as usize;
    let size = |i: usize| sizes[i % sizes.len()];
    let max = sizes.iter().copied().max().unwrap_or(0);
    let tag = |i: usize| if same_tag { 5 } else { 5 + i as Tag };
    let data = |i: usize| pattern(msg_seed(0, 1, i as u32, 13), size(i));
    if me == 0 {
        let mut bufs: Vec<Buf> = (0..k).map(|i| Buf::new(ctx, k0, size(i), 64, GUARD_SEND)).collect();
        let mut reqs = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.write(ctx, &data(i));
            reqs.push(isend(ctx, b, size(i), 1, tag(i)));
        }
        let st = ctx.wait_all(reqs).or_fail("window: sends");
        for (i, st) in st.iter().enumerate() {
            expect_status(st, 1, tag(i), size(i), &format!("window: send {i}"));
        }
        for b in bufs {
            b.release(ctx);
        }
    } else {
        // Every receive buffer holds the largest message: with one tag, only the order
        // of matching decides which message lands where.
        let mut bufs: Vec<Buf> = (0..k).map(|_| Buf::new(ctx, k1, max, 64, GUARD_RECV)).collect();
        let order: Vec<usize> = if same_tag { (0..k).collect() } else { (0..k).rev().collect() };
        let mut reqs = Vec::new();
        for &i in &order {
            reqs.push(irecv(ctx, &mut bufs[i], Some(0), Some(tag(i))));
        }
        let st = ctx.wait_all(reqs).or_fail("window: receives");
        for (j, &i) in order.iter().enumerate() {
            expect_status(
                &st[j],
                0,
                tag(i),
                size(i),
                &format!("window: receive of message {i} (non-overtaking order)"),
            );
            bufs[i].verify(ctx, &data(i), GUARD_RECV, &format!("window: message {i} of {} bytes", size(i)));
        }
        for b in bufs {
            b.release(ctx);
        }
    }
    ctx.mem_free_commit().or_fail("window: mem_free_commit");
}

const FORGED_LEN: usize = 1 << 20;
const FORGED_MSG: u64 = 1 << 40;

fn forged(ctx: &mut Context) {
    use gpulmt::shm::job::{node_id, JobSegment};
    use gpulmt_protocols::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet, Region, WIRE_VERSION};
    need_ranks(ctx, 2, "forged");
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    // Receives that forged RTSs match (tags 42..=44).
    let tags: [Tag; 3] = [42, 43, 44];
    if me == 0 {
        let mut bufs: Vec<Buf> = (0..3).map(|_| Buf::new(ctx, Kind::Dev, FORGED_LEN, 4096, GUARD_RECV)).collect();
        let reqs: Vec<Request> = bufs.iter_mut().zip(tags).map(|(b, t)| irecv(ctx, b, Some(1), Some(t))).collect();
        let v0 = ctx.stats().violations;
        ctx.send(b"ready", 1, 1).or_fail("forged: ready");
        let mut done = [0u8; 4];
        ctx.recv(&mut done, Some(1), Some(2)).or_fail("forged: done");
        let t0 = Instant::now();
        let mut reqs = reqs.into_iter();
        for (i, what) in
            [(0, "an RTS whose region claims more than its allocation"), (1, "an RTS with a forged handle")]
        {
            let r = reqs.next().expect("three requests");
            match ctx.wait(r) {
                Err(e) if e.as_transfer().is_some() => println!("rank=0 forged: {what}: {e}"),
                other => fail(format!(
                    "forged: the receive matched by {what} completed with {other:?}, expected a transfer error"
                )),
            }
            bufs[i].verify(ctx, &[], GUARD_RECV, &format!("forged: receive buffer after {what}"));
        }
        // The RTS of another node was refused: its receive is still waiting.
        let r = reqs.next().expect("three requests");
        ensure!(ctx.test(&r).or_fail("test").is_none(), "forged: a receive matched an RTS of another node");
        ensure!(ctx.cancel(&r), "forged: cancel");
        ensure!(
            matches!(ctx.wait(r), Err(e) if matches!(e.as_transfer(), Some(ProtoError::Cancelled))),
            "forged: cancelled receive"
        );
        bufs[2].verify(ctx, &[], GUARD_RECV, "forged: receive buffer of the refused RTS");
        ensure!(t0.elapsed() < Duration::from_secs(5), "forged: failing forged transfers took {:?}", t0.elapsed());
        let violations = ctx.stats().violations - v0;
        println!("rank=0 forged violations={violations}");
        ensure!(violations >= 12, "forged: only {violations} protocol violations counted for 16 forged packets");
        // Still working: a real rendezvous from rank 1 and one back.
        let mut b = Buf::new(ctx, Kind::Dev, FORGED_LEN, 4096, GUARD_RECV);
        let rr = irecv(ctx, &mut b, Some(1), Some(3));
        let st = ctx.wait(rr).or_fail("forged: a real message after the forged ones");
        expect_status(&st, 1, 3, FORGED_LEN, "forged: real message");
        b.verify(ctx, &pattern(17, FORGED_LEN), GUARD_RECV, "forged: real message after the forged ones");
        let sr = isend(ctx, &mut b, FORGED_LEN, 1, 4);
        ctx.wait(sr).or_fail("forged: a real message back");
        b.release(ctx);
        for b in bufs {
            b.release(ctx);
        }
    } else {
        let mut x = Buf::new(ctx, Kind::Dev, 65536, 0, GUARD_SEND);
        x.write(ctx, &pattern(16, 65536));
        let info = ctx.backend().pointer_info(x.dev).or_fail("pointer_info");
        let handle = ctx.backend().export_handle(x.dev).or_fail("export_handle").0;
        let region = Region {
            handle,
            alloc_size: 65536,
            offset: 0,
            device: ctx.device(),
            node: node_id(),
            buffer_id: info.buffer_id,
        };
        let job = std::env::var("GPULMT_JOB").unwrap_or_else(|_| fail("forged: GPULMT_JOB is not set"));
        let seg = JobSegment::open(&job, Duration::from_secs(5)).or_fail("forged: opening the job segment");
        let mut ready = [0u8; 5];
        ctx.recv(&mut ready, Some(0), Some(1)).or_fail("forged: ready");
        let rts = |n: u64, tag: Tag, len: u64, src: MemDesc| Packet::Rts { msg: FORGED_MSG + n, tag, len, src };
        let big = FORGED_LEN as u64;
        let dev = |r: Region| MemDesc::Device(r);
        let mut wrong_version = Packet::Done { msg: FORGED_MSG, dir: Dir::ToSender }.to_vec();
        wrong_version[0] = WIRE_VERSION.wrapping_add(1);
        let packets: Vec<Vec<u8>> = vec![
            vec![0xff; 40],
            wrong_version,
            // The region does not cover the message.
            rts(1, 41, big, dev(region)).to_vec(),
            // Lies about the allocation's size: a real 64 KiB handle claimed as 1 MiB.
            rts(2, 42, big, dev(Region { alloc_size: big, ..region })).to_vec(),
            // A forged handle.
            rts(3, 43, big, dev(Region { handle: [0xab; 64], alloc_size: big, buffer_id: 999_999, ..region })).to_vec(),
            // Another node's memory.
            rts(4, 44, big, dev(Region { alloc_size: big, node: region.node ^ 1, ..region })).to_vec(),
            // A device that does not exist.
            rts(5, 45, big, dev(Region { alloc_size: big, device: 999, ..region })).to_vec(),
            // An empty rendezvous.
            rts(6, 46, 0, MemDesc::Host).to_vec(),
            // An offset that overflows.
            rts(7, 47, big, dev(Region { offset: u64::MAX - 10, alloc_size: big, ..region })).to_vec(),
            // Answers to messages that do not exist.
            Packet::Cts { msg: FORGED_MSG + 8, mode: CtsMode::Put, dst: Some(region), split: 0 }.to_vec(),
            Packet::Done { msg: FORGED_MSG + 9, dir: Dir::ToSender }.to_vec(),
            Packet::Done { msg: FORGED_MSG + 10, dir: Dir::ToReceiver }.to_vec(),
            Packet::Chunk { msg: FORGED_MSG + 11, index: 0, len: 10, slot: u32::MAX }.to_vec(),
            Packet::Cookie { msg: FORGED_MSG + 12 }.to_vec(),
            Packet::Abort { msg: FORGED_MSG + 13, reason: AbortReason::CopyFailed, dir: Dir::ToSender }.to_vec(),
            Packet::FreeAck { epoch: 123_456 }.to_vec(),
        ];
        // This rank's context has no packet of its own waiting for this ring, and
        // nothing else runs meanwhile, so the ring stays single-producer.
        let ring = seg.ring(1, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &packets {
            while !ring.try_push(p).or_fail("forged: pushing into the ring") {
                ensure!(Instant::now() < deadline, "forged: rank 0 does not drain its ring");
                std::thread::yield_now();
            }
        }
        drop(seg);
        ctx.send(b"done", 0, 2).or_fail("forged: done");
        let mut b = Buf::new(ctx, Kind::Dev, FORGED_LEN, 4096, GUARD_SEND);
        b.write(ctx, &pattern(17, FORGED_LEN));
        let sr = isend(ctx, &mut b, FORGED_LEN, 0, 3);
        ctx.wait(sr).or_fail("forged: a real message after the forged ones");
        b.fill(ctx, GUARD_RECV);
        let rr = irecv(ctx, &mut b, Some(0), Some(4));
        ctx.wait(rr).or_fail("forged: a real message back");
        b.verify(ctx, &pattern(17, FORGED_LEN), GUARD_RECV, "forged: real message back");
        b.release(ctx);
        x.release(ctx);
    }
    ctx.mem_free_commit().or_fail("forged: mem_free_commit");
}

fn cache(ctx: &mut Context, iters: u32, size: &str, expect_recv: Option<u64>, expect_send: Option<u64>) {
    need_ranks(ctx, 2, "cache");
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    let msg = parse_size(size);
    let w = iters as usize;
    // One allocation on each side; rank 1 receives every message at its own offset.
    let mut buf = Buf::new(ctx, Kind::Dev, w * msg, 4096, if me == 0 { GUARD_SEND } else { GUARD_RECV });
    let piece = |i: usize| pattern(msg_seed(0, 1, i as u32, 5), msg);
    let t0 = Instant::now();
    for phase in 0..2 {
        let tag = 1 + phase as Tag;
        if me == 0 {
            // Phase 0: every send from the same range; phase 1: from different offsets.
            let mut all = Vec::with_capacity(w * msg);
            for i in 0..w {
                all.extend_from_slice(&piece(if phase == 0 { 0 } else { i }));
            }
            buf.write(ctx, &all);
            let base = buf.ptr();
            let reqs: Vec<Request> = (0..w)
                .map(|i| {
                    let off = if phase == 0 { 0 } else { i * msg };
                    // SAFETY: inside `buf`, which outlives the requests (wait_all below).
                    unsafe { ctx.isend(base.add(off), msg, 1, tag) }.or_fail(format!("cache: isend {i}"))
                })
                .collect();
            for st in ctx.wait_all(reqs).or_fail("cache: window of sends") {
                expect_status(&st, 1, tag, msg, "cache: send status");
            }
        } else {
            buf.fill(ctx, GUARD_RECV);
            let base = buf.ptr();
            let reqs: Vec<Request> = (0..w)
                .map(|i| {
                    // SAFETY: as above.
                    unsafe { ctx.irecv(base.add(i * msg), msg, Some(0), Some(tag)) }
                        .or_fail(format!("cache: irecv {i}"))
                })
                .collect();
            for st in ctx.wait_all(reqs).or_fail("cache: window of receives") {
                expect_status(&st, 0, tag, msg, "cache: receive status");
            }
            let mut all = Vec::with_capacity(w * msg);
            for i in 0..w {
                all.extend_from_slice(&piece(if phase == 0 { 0 } else { i }));
            }
            buf.verify(ctx, &all, GUARD_RECV, &format!("cache phase {phase}: {w} messages of {msg} bytes"));
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let c = ctx.stats().cache;
    println!("rank={me} window size={w} msg={msg} ms={ms:.1} opens={} hits={} misses={}", c.opens, c.hits, c.misses);
    let expect = if me == 1 { expect_recv } else { expect_send };
    if let Some(e) = expect {
        ensure!(
            c.opens == e,
            "cache: {} opened {} mappings of its peer's single allocation, expected {e}",
            if me == 1 { "receiver" } else { "sender" },
            c.opens
        );
    }
    buf.release(ctx);
    ctx.mem_free_commit().or_fail("cache: mem_free_commit");
}

fn wildcard_barrier(ctx: &mut Context, timeout_s: u64) {
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

fn main() {
    gpulmt::logging::init("warn");
    let cli = Cli::parse();
    let mut ctx = Context::init().unwrap_or_else(|e| fail(format!("Context::init: {e}")));
    RANK.store(ctx.rank(), Ordering::Relaxed);
    let me = ctx.rank();
    if me == 0 {
        println!("job={}", std::env::var("GPULMT_JOB").unwrap_or_default());
    }
    println!("rank={me} pid={} device={} size={}", std::process::id(), ctx.device(), ctx.size());
    let name = match &cli.cmd {
        Cmd::Pingpong { placement, sizes, offset, seed } => {
            pingpong(&mut ctx, placement, sizes, *offset, *seed);
            "pingpong"
        }
        Cmd::Alltoall { iters, include_self } => {
            alltoall(&mut ctx, *iters, *include_self);
            "alltoall"
        }
        Cmd::SameDevice { iters } => {
            same_device(&mut ctx, *iters);
            "same-device"
        }
        Cmd::Truncate { placement } => {
            truncate(&mut ctx, placement);
            "truncate"
        }
        Cmd::ZeroAndBad => {
            zero_and_bad(&mut ctx);
            "zero-and-bad"
        }
        Cmd::Selfsend => {
            selfsend(&mut ctx);
            "selfsend"
        }
        Cmd::Die { when, how, placement, role, size, free_mapped, any_source } => {
            die(ctx, *when, *how, placement, *role, size, *free_mapped, *any_source)
        }
        Cmd::Window { placement, count, sizes, same_tag } => {
            window(&mut ctx, placement, *count, sizes, *same_tag);
            "window"
        }
        Cmd::Forged => {
            forged(&mut ctx);
            // Both ranks count violations here (rank 1 for the answers to messages it
            // never sent): skip the zero-violation check of `finish`.
            finish_allowing_violations(ctx, "forged");
            return;
        }
        Cmd::Free { rounds, fresh_open } => {
            free(&mut ctx, *rounds, *fresh_open);
            "free"
        }
        Cmd::Cache { iters, size, expect_recv_opens, expect_send_opens } => {
            cache(&mut ctx, *iters, size, *expect_recv_opens, *expect_send_opens);
            "cache"
        }
        Cmd::WildcardBarrier { timeout_s } => {
            wildcard_barrier(&mut ctx, *timeout_s);
            "wildcard-barrier"
        }
    };
    finish(ctx, name);
}
