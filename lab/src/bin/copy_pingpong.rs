//! copy_pingpong: the floor of any copy-engine ping-pong between two processes, the anchor
//! for `osu_latency` D D at small sizes.
//!
//! Two processes, one per device, each with an IPC mapping of the other's receive buffer
//! opened once. Each leg is exactly what a rendezvous PUT cannot do without: one copy
//! pushed by the sender's engine into the peer's buffer (gpulmt's own `copy_async`, i.e.
//! `cuMemcpyAsync` on a non-blocking stream), polled to completion (`copy_poll`, i.e.
//! `cuStreamQuery`), then one store of a sequence number into a shared-memory word that
//! the peer spins on. No matching, no requests, no packets, no offers: what gpulmt adds to
//! this is its protocol's cost, and what this costs is the machine's.
//!
//! Prints `anchor,metric,bytes,value` rows (`copy_pingpong,half_rtt_us,<bytes>,<us>`, the
//! format of ../shared/device's anchors) so bench-report compares osu_latency with it.
//! Each size runs `--iters` timed round trips after `--warmup`, and the bytes each side
//! received are checked against the pattern the other sent; a mismatch exits non-zero.
//! Runs on whatever backend `GPULMT_DEVICE` selects (sim as well, for CI).
//! Run: `copy_pingpong [-m 8:8] [-i 20000]`.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::os::unix::io::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use clap::Parser;
use gpulmt::config::Config;
use gpulmt::device::{self, Backend, DevId, IpcHandle, Mapping, IPC_HANDLE_BYTES};

/// How long a rank waits for the other before it gives up.
const STALL: std::time::Duration = std::time::Duration::from_secs(60);

/// Names the shared file in the child's environment.
const CHILD_ENV: &str = "GPULMT_COPY_PINGPONG_SHARED";
/// The CPU the child binds itself to, when binding.
const CHILD_CPU_ENV: &str = "GPULMT_COPY_PINGPONG_CPU";

fn bind(cpu: usize) {
    if let Err(e) = gpulmt::binding::bind_to(cpu) {
        die(format!("binding to CPU {cpu} failed: {e} (try --bind none)"));
    }
}

#[derive(Parser, Debug)]
#[command(about = "Copy-engine ping-pong floor between two processes (an anchor for osu_latency D D)")]
struct Args {
    /// Sizes as MIN:MAX (OSU -m), powers of two between them (K and M suffixes
    /// accepted); a zero size is left out (no copy to time).
    #[arg(short = 'm', long, value_parser = gpulmt_bench::parse_range, default_value = "8:8")]
    sizes: (usize, usize),
    /// Timed round trips per size.
    #[arg(short = 'i', long, default_value_t = 20000)]
    iters: u64,
    /// Untimed round trips before them.
    #[arg(short = 'w', long, default_value_t = 1000)]
    warmup: u64,
    /// `core`: each process on a core of its own, as `gpulmt-run` binds its ranks by
    /// default (so that the floor and osu_latency spin the same way); `none`: unbound.
    #[arg(long, default_value = "core", value_parser = ["core", "none"])]
    bind: String,
}

/// The shared page: both receive buffers' handles, a ready word, and one sequence word per
/// direction, each on its own cache line so that a spinning reader does not steal the
/// line the other side is writing.
#[repr(C, align(64))]
struct Shared {
    handle: [[u8; IPC_HANDLE_BYTES]; 2],
    /// Set by the child once its handle is published and the parent's is open.
    child_ready: AtomicU32,
    _pad0: [u8; 60],
    /// Legs sent by rank r, in `seq[r]` (a round trip is one of each).
    seq: [Seq; 2],
    /// Set by a rank that found wrong bytes, so that the other stops waiting.
    failed: AtomicU32,
}

#[repr(C, align(64))]
struct Seq(AtomicU64);

fn die(what: impl std::fmt::Display) -> ! {
    eprintln!("copy_pingpong: {what}");
    std::process::exit(1);
}

/// Maps the shared file (created and sized by the parent).
fn map_shared(file: &File) -> &'static Shared {
    let len = std::mem::size_of::<Shared>();
    // SAFETY: a fresh shared mapping of a file at least `len` long; the memory stays mapped
    // for the life of the process, and Shared holds only bytes and atomics.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, file.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        die(format!("mmap of the shared page failed: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: as above: `p` is a live mapping of `len` bytes, page-aligned, never unmapped.
    unsafe { &*(p as *const Shared) }
}

/// The byte rank `r` sends at size `len` (differs by rank and size, so stale data fails).
fn pattern(r: usize, len: usize) -> u8 {
    (0x31 + 0x40 * r as u8) ^ (len.trailing_zeros() as u8)
}

struct Side {
    rank: usize,
    dev: DevId,
    b: Backend,
    shared: &'static Shared,
    /// Own send and receive buffers (device memory of `dev`), `max` bytes each.
    send: usize,
    recv: usize,
    /// The peer's receive buffer, mapped for `dev`'s engine.
    peer: Mapping,
}

impl Side {
    fn new(rank: usize, shared: &'static Shared, max: usize) -> Side {
        let b = device::select(Config::from_env().unwrap_or_else(|e| die(e)).device).unwrap_or_else(|e| die(e));
        if b.device_count() < 1 {
            die("no device");
        }
        let dev = (rank as u32) % b.device_count();
        let (send, recv) = (b.alloc(dev, max).unwrap_or_else(|e| die(e)), b.alloc(dev, max).unwrap_or_else(|e| die(e)));
        let h = b.export_handle(recv).unwrap_or_else(|e| die(e));
        // SAFETY: each rank writes only its own handle slot, before the other reads it
        // (the child before child_ready, the parent before spawning the child).
        unsafe { std::ptr::write_volatile(shared.handle[rank].as_ptr() as *mut [u8; IPC_HANDLE_BYTES], h.0) };
        let placeholder = Mapping { ptr: 0, size: 0 };
        Side { rank, dev, b, shared, send, recv, peer: placeholder }
    }

    fn open_peer(&mut self) {
        // SAFETY: the peer wrote its slot before we were told to read it (see `new`).
        let raw = unsafe {
            std::ptr::read_volatile(self.shared.handle[1 - self.rank].as_ptr() as *const [u8; IPC_HANDLE_BYTES])
        };
        self.peer = self.b.open_handle(&IpcHandle(raw), self.dev).unwrap_or_else(|e| die(e));
    }

    /// Waits until the peer has sent `n` legs; false if it reported a failure. A peer
    /// silent for [`STALL`] is taken for dead (this is a benchmark: no recovery).
    fn wait_peer(&self, n: u64) -> bool {
        // Acquire: the peer's copy finished before it stored `n`, so its bytes are ours to read.
        let w = &self.shared.seq[1 - self.rank].0;
        let mut spins = 0u32;
        let mut since = None;
        while w.load(Ordering::Acquire) < n {
            if self.shared.failed.load(Ordering::Relaxed) != 0 {
                return false;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1 << 20) && since.get_or_insert_with(Instant::now).elapsed() > STALL {
                die(format!("rank {} heard nothing from the other process for {STALL:?}", self.rank));
            }
            std::hint::spin_loop();
        }
        true
    }

    /// One leg: copy into the peer's buffer, wait for it, tell the peer.
    fn leg(&self, len: usize, n: u64) {
        // SAFETY: `send` and the peer's receive buffer (mapped) hold `max >= len` bytes and
        // stay allocated and mapped until `close`; the copy is waited for just below, and
        // the peer reads its buffer only once told (`seq`) that the copy finished.
        let t = unsafe { self.b.copy_async(self.dev, 0, self.peer.ptr, self.send, len) }.unwrap_or_else(|e| die(e));
        while !self.b.copy_poll(t).unwrap_or_else(|e| die(e)) {
            std::hint::spin_loop();
        }
        // Release: the copy completed before the peer can see `n`.
        self.shared.seq[self.rank].0.store(n, Ordering::Release);
    }

    /// Runs every size; rank 0 returns each size's half round trip in microseconds.
    fn run(&self, sizes: &[usize], warmup: u64, iters: u64) -> Vec<(usize, f64)> {
        let mut out = Vec::new();
        let mut n = 0u64;
        for &len in sizes {
            let mine = vec![pattern(self.rank, len); len];
            // SAFETY: `send` holds `max >= len` bytes, and no copy of ours runs meanwhile.
            unsafe { self.b.copy_sync(self.send, mine.as_ptr() as usize, len) }.unwrap_or_else(|e| die(e));
            let mut start = Instant::now();
            for i in 0..warmup + iters {
                if i == warmup {
                    start = Instant::now();
                }
                n += 1;
                let ok = if self.rank == 0 {
                    self.leg(len, n);
                    self.wait_peer(n)
                } else {
                    let ok = self.wait_peer(n);
                    self.leg(len, n);
                    ok
                };
                if !ok {
                    die("the other process found wrong bytes");
                }
            }
            let half_rtt = start.elapsed().as_secs_f64() * 1e6 / (2.0 * iters.max(1) as f64);
            let mut got = vec![0u8; len];
            // SAFETY: `recv` holds `max >= len` bytes, and the peer's last leg has landed
            // (wait_peer) and it writes no more before the barrier below.
            unsafe { self.b.copy_sync(got.as_mut_ptr() as usize, self.recv, len) }.unwrap_or_else(|e| die(e));
            let want = pattern(1 - self.rank, len);
            if let Some(at) = got.iter().position(|&x| x != want) {
                self.shared.failed.store(1, Ordering::Relaxed);
                die(format!(
                    "rank {} received {:#04x} at byte {at} of {len}, expected {want:#04x}",
                    self.rank, got[at]
                ));
            }
            // A barrier without copies: the next size's first leg must not land before the
            // peer has checked this size's bytes.
            n += 1;
            self.shared.seq[self.rank].0.store(n, Ordering::Release);
            if !self.wait_peer(n) {
                die("the other process found wrong bytes");
            }
            out.push((len, half_rtt));
        }
        out
    }

    fn close(self) {
        // SAFETY: every leg was waited for, and nothing touches the mapping afterwards.
        unsafe { self.b.close_handle(self.peer) }.unwrap_or_else(|e| die(e));
        // The peer may still have our receive buffer mapped until it is done.
        for p in [self.send, self.recv] {
            // SAFETY: no copy of ours runs on them and nothing touches them afterwards; the
            // peer's copies into `recv` ended with the last size's barrier.
            let _ = unsafe { self.b.free(p) };
        }
    }
}

fn main() {
    gpulmt::logging::init("warn");
    let args = Args::parse();
    let sizes: Vec<usize> = gpulmt_bench::sizes_in(args.sizes).into_iter().filter(|&s| s > 0).collect();
    let max = sizes.iter().copied().max().unwrap_or(1);
    if let Ok(path) = std::env::var(CHILD_ENV) {
        let file =
            OpenOptions::new().read(true).write(true).open(&path).unwrap_or_else(|e| die(format!("{path}: {e}")));
        let shared = map_shared(&file);
        if let Ok(cpu) = std::env::var(CHILD_CPU_ENV) {
            bind(cpu.parse().unwrap_or_else(|_| die(format!("{CHILD_CPU_ENV}={cpu:?} is not a CPU number"))));
        }
        let mut side = Side::new(1, shared, max);
        side.open_peer();
        shared.child_ready.store(1, Ordering::Release);
        side.run(&sizes, args.warmup, args.iters);
        // Both must be done with the other's buffer before either frees its own.
        shared.seq[1].0.store(u64::MAX, Ordering::Release);
        side.wait_peer(u64::MAX);
        side.close();
        return;
    }
    let path = std::env::temp_dir().join(format!("gpulmt-copy-pingpong-{}", std::process::id()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap_or_else(|e| die(format!("{}: {e}", path.display())));
    file.set_len(std::mem::size_of::<Shared>() as u64).unwrap_or_else(|e| die(e));
    let shared = map_shared(&file);
    let cpus = if args.bind == "core" { gpulmt::binding::cpus_for_ranks(2) } else { None };
    if let Some(c) = &cpus {
        bind(c[0]);
    }
    let mut side = Side::new(0, shared, max);
    let exe = std::env::current_exe().unwrap_or_else(|e| die(e));
    let mut child = Command::new(exe);
    if let Some(c) = &cpus {
        child.env(CHILD_CPU_ENV, c[1].to_string());
    }
    let mut child = child
        .args(std::env::args().skip(1))
        .env(CHILD_ENV, &path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| die(format!("spawning the second process: {e}")));
    let child_out = child.stdout.take().unwrap();
    while shared.child_ready.load(Ordering::Acquire) == 0 {
        if let Ok(Some(status)) = child.try_wait() {
            let _ = std::fs::remove_file(&path);
            die(format!("the second process ended before it was ready: {status}"));
        }
        std::thread::yield_now();
    }
    side.open_peer();
    let rows = side.run(&sizes, args.warmup, args.iters);
    shared.seq[0].0.store(u64::MAX, Ordering::Release);
    side.wait_peer(u64::MAX);
    side.close();
    for line in BufReader::new(child_out).lines().map_while(Result::ok) {
        println!("{line}");
    }
    let status = child.wait().unwrap_or_else(|e| die(e));
    let _ = std::fs::remove_file(&path);
    if !status.success() {
        die(format!("the second process failed: {status}"));
    }
    println!("anchor,metric,bytes,value");
    for (len, us) in rows {
        println!("copy_pingpong,half_rtt_us,{len},{us:.3}");
    }
}
