//! `gpulmt-net-check`: a rank program for `mpirun` that drives the internode path
//! ([`gpulmt::net::NetPath`]) directly, every other rank counting as another node, and
//! checks every byte (`transport/tests/net_mpi.rs` runs it under `mpirun -np 2` and
//! `-np 3`, with the default transports and with `--mca btl tcp,self`).
//!
//! Steps, each ending in a barrier:
//! 1. control packets: 100 to every other rank, checked in order per sender;
//! 2. rendezvous data to the next rank (ring): sizes 0, 1, 4095, 65537, 4 MiB and 64 MiB,
//!    at odd offsets, every placement of sim-device and host memory;
//! 3. a burst of 64 transfers posted at once (a queue of `GPULMT_NET_QUEUE_SLOTS` slots
//!    under backpressure), nothing lost;
//! 4. one-sided: windows in host and device memory registered collectively; put,
//!    put with signal and get to the next rank, quiet; fence ordering two puts;
//! 5. a put outside the window: refused with an error completion, nothing written.
//!
//! Run with `GPULMT_DEVICE=sim`. Prints one line per rank; any failure panics, which
//! makes `mpirun` fail the job.

use std::time::{Duration, Instant};

use gpulmt::config::Config;
use gpulmt::device::{self, Backend, MemoryKind};
use gpulmt::mpi::rsmpi;
use gpulmt::net::{self, NetPath, QuietError};
use gpulmt::offnode::{NetError, OffNodePath, PostError};
use gpulmt_protocols::gio::SignalOp;
use gpulmt_protocols::{NetId, Rank};
use rsmpi::traits::{Communicator, CommunicatorCollectives};

/// Any wait gives up after this.
const PATIENCE: Duration = Duration::from_secs(120);
/// Bytes before each buffer inside its allocation (odd offsets).
const OFFSET: usize = 3;

/// A buffer at an odd offset in host or sim-device memory.
struct Buf {
    backend: Backend,
    _host: Option<Vec<u64>>,
    dev: Option<usize>,
    addr: usize,
    len: usize,
}

impl Buf {
    fn new(backend: &Backend, device: bool, len: usize) -> Buf {
        if device {
            let base = backend.alloc(0, len + OFFSET + 8).expect("device alloc");
            // SAFETY: the allocation's whole range is ours; zeroed so guards are known.
            unsafe { zero(backend, base, len + OFFSET + 8) };
            Buf { backend: backend.clone(), _host: None, dev: Some(base), addr: base + OFFSET, len }
        } else {
            let mut v = vec![0u64; (len + OFFSET + 8).div_ceil(8)];
            let addr = v.as_mut_ptr() as usize + OFFSET;
            Buf { backend: backend.clone(), _host: Some(v), dev: None, addr, len }
        }
    }

    fn mem(&self) -> MemoryKind {
        self.backend.pointer_info(self.addr).expect("pointer info").kind
    }

    fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at + bytes.len() <= self.len);
        // SAFETY: inside the buffer; nothing else uses it meanwhile.
        unsafe { self.backend.copy_sync(self.addr + at, bytes.as_ptr() as usize, bytes.len()) }.expect("write");
    }

    /// The buffer with `OFFSET` bytes before and 5 after it.
    fn read_all(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len + OFFSET + 5];
        // SAFETY: inside the allocation; nothing writes it meanwhile.
        unsafe { self.backend.copy_sync(v.as_mut_ptr() as usize, self.addr - OFFSET, v.len()) }.expect("read");
        v
    }

    /// Checks the buffer holds `want` and the bytes around it are zero.
    fn check(&self, want: &[u8], what: &str) {
        let all = self.read_all();
        assert!(all[..OFFSET].iter().all(|&b| b == 0), "{what}: bytes before the buffer were written");
        assert!(all[OFFSET + self.len..].iter().all(|&b| b == 0), "{what}: bytes after the buffer were written");
        // One slice comparison (memcmp even in a debug build); the first bad byte only on failure.
        if all[OFFSET..OFFSET + self.len] != want[..self.len] {
            let i = (0..self.len).find(|&i| all[OFFSET + i] != want[i]).expect("the slices differ");
            panic!("{what}: byte {i} of {} is {:#04x}, expected {:#04x}", self.len, all[OFFSET + i], want[i]);
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(base) = self.dev {
            // SAFETY: every op on the buffer was reported done before it drops.
            unsafe { self.backend.free(base) }.expect("device free");
        }
    }
}

/// Zeroes `len` bytes at `at`.
///
/// # Safety
/// `at..at+len` is memory of `backend` nothing else uses meanwhile.
unsafe fn zero(backend: &Backend, at: usize, len: usize) {
    let z = vec![0u8; len];
    // SAFETY: this function's contract.
    unsafe { backend.copy_sync(at, z.as_ptr() as usize, len) }.expect("zero");
}

/// `len` pseudo-random bytes of `seed`: eight bytes per xorshift step, so that the 64 MiB
/// buffers of a debug build (CI's) are made in a fraction of a second.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = vec![0u8; len];
    for chunk in v.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    v
}

fn retry(path: &mut NetPath, mut post: impl FnMut(&mut NetPath) -> Result<(), PostError>) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match post(path) {
            Ok(()) => return,
            Err(PostError::NoResource) if Instant::now() < deadline => std::thread::sleep(Duration::from_micros(50)),
            Err(e) => panic!("post failed: {e}"),
        }
    }
}

fn wait_done(path: &mut NetPath, want: usize) -> Vec<(NetId, Result<(), NetError>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while got.len() < want {
        path.poll_done(&mut |id, r| got.push((id, r)));
        assert!(Instant::now() < deadline, "{} of {want} transfers completed", got.len());
        std::thread::sleep(Duration::from_micros(50));
    }
    got
}

struct Rank_ {
    me: Rank,
    n: Rank,
    backend: Backend,
    path: NetPath,
    checks: usize,
}

impl Rank_ {
    fn next(&self) -> Rank {
        (self.me + 1) % self.n
    }

    fn prev(&self) -> Rank {
        (self.me + self.n - 1) % self.n
    }

    /// Step 1: control packets in order per sender.
    fn control(&mut self) {
        const EACH: u32 = 100;
        for i in 0..EACH {
            for to in (0..self.n).filter(|&r| r != self.me) {
                let mut pkt = pattern(1 + (i as usize * 131) % 9000, i as u64 + 7 * self.me as u64);
                pkt.splice(0..0, [self.me.to_le_bytes(), i.to_le_bytes()].concat());
                retry(&mut self.path, |p| p.post_ctrl(to, &pkt));
            }
        }
        let want = (self.n - 1) as usize * EACH as usize;
        let mut got: Vec<(Rank, Vec<u8>)> = Vec::new();
        let deadline = Instant::now() + PATIENCE;
        while got.len() < want {
            self.path.poll_inbound(&mut |from, b| got.push((from, b)));
            self.path.poll_done(&mut |id, r| panic!("no data op posted yet: {id:?} {r:?}"));
            assert!(Instant::now() < deadline, "{} of {want} control packets arrived", got.len());
            std::thread::sleep(Duration::from_micros(50));
        }
        let mut next = vec![0u32; self.n as usize];
        for (from, b) in got {
            let sender = u32::from_le_bytes(b[..4].try_into().unwrap());
            let i = u32::from_le_bytes(b[4..8].try_into().unwrap());
            assert_eq!(sender, from, "a control packet says it is from {sender}, MPI says {from}");
            assert_eq!(i, next[from as usize], "control packets of rank {from} out of order");
            assert_eq!(b[8..], pattern(1 + (i as usize * 131) % 9000, i as u64 + 7 * from as u64)[..]);
            next[from as usize] += 1;
            self.checks += 1;
        }
    }

    /// Step 2: one transfer to the next rank (and one from the previous) per size and
    /// placement, waited for and checked.
    fn rendezvous(&mut self) {
        let mut xfer = 1000u64;
        for len in [0usize, 1, 4095, 65537, 4 << 20, 64 << 20] {
            for (src_dev, dst_dev) in [(false, false), (true, false), (false, true), (true, true)] {
                xfer += 1;
                let src = Buf::new(&self.backend, src_dev, len);
                let dst = Buf::new(&self.backend, dst_dev, len);
                src.write(0, &pattern(len, xfer * 31 + self.me as u64));
                let (prev, next) = (self.prev(), self.next());
                // SAFETY: both buffers live until their ops are reported done below.
                unsafe {
                    let (d, s) = ((dst.addr, dst.mem()), (src.addr, src.mem()));
                    retry(&mut self.path, |p| p.post_recv(NetId(2 * xfer), prev, xfer, d.0, len, d.1));
                    // Every other one pushed: on the path's queue for pushed sends.
                    let pushed = xfer % 2 == 1;
                    retry(&mut self.path, |p| p.post_send(NetId(2 * xfer + 1), next, xfer, s.0, len, s.1, pushed));
                }
                let mut done = wait_done(&mut self.path, 2);
                done.sort_by_key(|(id, _)| id.0);
                assert_eq!(done, vec![(NetId(2 * xfer), Ok(())), (NetId(2 * xfer + 1), Ok(()))], "{len} bytes");
                let what = format!("{len} bytes from rank {prev} ({}) into {}", place(src_dev), place(dst_dev));
                dst.check(&pattern(len, xfer * 31 + prev as u64), &what);
                self.checks += 1;
            }
        }
    }

    /// Step 3: many transfers posted at once, more than the queue has slots.
    fn burst(&mut self) {
        const N: u64 = 64;
        let len = 70_000;
        let srcs: Vec<Buf> = (0..N).map(|i| Buf::new(&self.backend, i % 2 == 0, len)).collect();
        let dsts: Vec<Buf> = (0..N).map(|i| Buf::new(&self.backend, i % 3 == 0, len)).collect();
        for (i, s) in srcs.iter().enumerate() {
            s.write(0, &pattern(len, 5000 + i as u64 + 100 * self.me as u64));
        }
        let (prev, next) = (self.prev(), self.next());
        let mut done = Vec::new();
        for i in 0..N {
            let (d, s) = (&dsts[i as usize], &srcs[i as usize]);
            // SAFETY: the buffers live until every op is reported done below.
            unsafe {
                retry(&mut self.path, |p| {
                    p.poll_done(&mut |id, r| done.push((id, r)));
                    p.post_recv(NetId(10_000 + i), prev, 5000 + i, d.addr, len, d.mem())
                });
                retry(&mut self.path, |p| {
                    p.poll_done(&mut |id, r| done.push((id, r)));
                    p.post_send(NetId(20_000 + i), next, 5000 + i, s.addr, len, s.mem(), i % 4 == 0)
                });
            }
        }
        let left = 2 * N as usize - done.len();
        done.extend(wait_done(&mut self.path, left));
        assert!(done.iter().all(|(_, r)| r.is_ok()), "a burst transfer failed: {done:?}");
        let mut ids: Vec<u64> = done.iter().map(|(id, _)| id.0).collect();
        ids.sort_unstable();
        let want: Vec<u64> = (10_000..10_000 + N).chain(20_000..20_000 + N).collect();
        assert_eq!(ids, want, "each burst transfer completes once");
        for (i, d) in dsts.iter().enumerate() {
            d.check(&pattern(len, 5000 + i as u64 + 100 * prev as u64), &format!("burst transfer {i}"));
            self.checks += 1;
        }
    }

    /// Steps 4 and 5: windows, put, put with signal, get, fence, quiet, a refused put.
    fn one_sided(&mut self, world: &impl CommunicatorCollectives) {
        const WIN: usize = 1 << 20;
        // 8-aligned windows: the allocations' starts (signals need aligned words).
        let wins = [Buf::new(&self.backend, false, WIN), Buf::new(&self.backend, true, WIN)];
        for (id, w) in wins.iter().enumerate() {
            // SAFETY: the windows live until the path is shut down (end of main).
            let got = unsafe { net::register_window(&mut self.path, world, w.addr - OFFSET, WIN as u64, w.mem()) };
            assert_eq!(got.expect("register window"), id as u32);
        }
        let next = self.next();
        let mut q = self.path.queue().expect("a free queue");
        let src = Buf::new(&self.backend, true, 300_000);
        let data = pattern(300_000, 77 + self.me as u64);
        src.write(0, &data);
        // Window offsets are from the allocation's start, OFFSET bytes before the buffer.
        for w in 0..2u32 {
            // SAFETY: src lives until the quiet below completed the ops.
            unsafe {
                q.put_nbi(next, w, 64, src.addr, 10, src.mem()).expect("put");
                q.put_nbi(next, w, 4096, src.addr, 300_000, src.mem()).expect("put");
                q.put_signal_nbi(next, w, 400_000, src.addr, 5000, src.mem(), 8, 41, SignalOp::Add).expect("put");
                q.put_signal_nbi(next, w, 500_000, src.addr, 5000, src.mem(), 8, 1, SignalOp::Add).expect("put");
                // fence: the second put to offset 900_000 lands last.
                q.put_nbi(next, w, 900_000, src.addr, 100_000, src.mem()).expect("put");
                q.fence();
                q.put_nbi(next, w, 900_000, src.addr + 1000, 8, src.mem()).expect("put");
            }
        }
        q.quiet(Instant::now() + PATIENCE).expect("quiet");
        world.barrier();
        let prev_data = pattern(300_000, 77 + self.prev() as u64);
        for (w, win) in wins.iter().enumerate() {
            let all = win.read_all();
            let at = |off: usize| &all[off..];
            assert_eq!(&at(64)[..10], &prev_data[..10], "window {w}: small put");
            assert!(at(4096)[..300_000] == prev_data[..], "window {w}: large put");
            assert_eq!(u64::from_le_bytes(at(8)[..8].try_into().unwrap()), 42, "window {w}: signal");
            assert!(at(400_000)[..5000] == prev_data[..5000] && at(500_000)[..5000] == prev_data[..5000]);
            assert_eq!(&at(900_000)[..8], &prev_data[1000..1008], "window {w}: fenced put");
            assert!(at(900_008)[..99_992] == prev_data[8..100_000], "window {w}: put before the fence");
            self.checks += 6;
        }
        // Get back what this rank put into the next rank's windows.
        for w in 0..2u32 {
            for (dev, len) in [(false, 10usize), (true, 300_000)] {
                let dst = Buf::new(&self.backend, dev, len);
                let off = if len == 10 { 64 } else { 4096 };
                // SAFETY: dst lives until the quiet below.
                unsafe { q.get_nbi(next, w, off, dst.addr, len, dst.mem()) }.expect("get");
                q.quiet(Instant::now() + PATIENCE).expect("quiet");
                dst.check(&data[..len], &format!("get of {len} bytes from window {w}"));
                self.checks += 1;
            }
        }
        // Step 5: outside the window: refused, an error completion, nothing written.
        // SAFETY: src lives until the quiet below.
        unsafe { q.put_nbi(next, 0, WIN as u64 - 4, src.addr, 8, src.mem()) }.expect("post");
        match q.quiet(Instant::now() + PATIENCE) {
            Err(QuietError::Failed { text, .. }) => assert!(text.contains("outside"), "{text}"),
            other => panic!("a put outside the window: {other:?}"),
        }
        self.checks += 1;
        drop(q);
        world.barrier();
        drop(wins);
    }
}

fn place(device: bool) -> &'static str {
    if device {
        "device"
    } else {
        "host"
    }
}

/// Makes a panic end the whole job at once: unwinding would reach MPI_Finalize (rsmpi's
/// `Universe` drop), which waits for ranks that wait for this one.
fn abort_job_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        // SAFETY: MPI is initialised (the hook is set after it); MPI_Abort ends the job.
        unsafe { rsmpi::ffi::MPI_Abort(rsmpi::ffi::RSMPI_COMM_WORLD, 1) };
    }));
}

fn main() {
    gpulmt::logging::init("warn");
    let (universe, threading) =
        rsmpi::initialize_with_threading(rsmpi::Threading::Multiple).expect("MPI initialises once");
    assert_eq!(threading, rsmpi::Threading::Multiple, "this MPI library lacks MPI_THREAD_MULTIPLE");
    abort_job_on_panic();
    let world = universe.world();
    let (me, n) = (world.rank() as Rank, world.size() as Rank);
    assert!(n >= 2, "run with at least 2 ranks");
    let cfg = Config::from_env().expect("GPULMT_* settings");
    let backend = device::select(cfg.device).expect("a device backend");
    let peers: Vec<Rank> = (0..n).filter(|&r| r != me).collect();
    let path = net::start(&world, &peers, &cfg.net, backend.clone()).expect("start the internode path");
    let mut r = Rank_ { me, n, backend, path, checks: 0 };
    let t0 = Instant::now();
    r.control();
    world.barrier();
    r.rendezvous();
    world.barrier();
    r.burst();
    world.barrier();
    r.one_sided(&world);
    r.path.shutdown(Instant::now() + cfg.net.drain).expect("clean shutdown");
    println!("net-check rank {me} of {n}: ok, {} checks in {:.1?}", r.checks, t0.elapsed());
    drop(r);
    drop(universe);
}
