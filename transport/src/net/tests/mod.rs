//! Unit tests of the internode path over the in-process loopback network: several
//! [`NetPath`]s (one per "rank") in one process, each with its own proxy thread, on sim
//! devices. The loopback delays landings and send completions at random (seeded), so
//! completions come out of order.
//!
//! Files: this one (the harness), `two_sided.rs` (control packets, rendezvous data,
//! backpressure), `one_sided.rs` (windows, put, put-with-signal, get, fence, quiet),
//! `faults.rs` (bad packets, stalls, network errors, cancel, teardown), `pinning.rs`
//! (`GPULMT_NET_PROXY_CPU`).

mod faults;
mod one_sided;
mod pinning;
mod two_sided;

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpulmt_protocols::{NetId, Rank};

use super::iface::loopback::LoopbackFabric;
use super::NetPath;
use crate::config::NetConfig;
use crate::device::sim::{PeerMatrix, SimBackend, SimConfig};
use crate::device::Backend;
use crate::offnode::{NetError, OffNodePath, PostError};

/// Every wait in these tests gives up after this (a loaded 2-core machine is slow).
const PATIENCE: Duration = Duration::from_secs(60);

fn sim() -> Backend {
    let cfg = SimConfig {
        devices: 2,
        peer: PeerMatrix::All,
        ipc_open_us: 0,
        copy_inline: false,
        copy_done_ns: 0,
        refuse_opens: false,
        driver: None,
    };
    Arc::new(SimBackend::new(cfg).expect("sim backend"))
}

/// Small queues and pieces, so that rings wrap and transfers take many pieces.
fn small_cfg(slots: u32) -> NetConfig {
    NetConfig {
        eager_limit: 8192,
        // The engine's settings: the path alone never reads them.
        push_max: 0,
        push_sends: 0,
        // The context's three lanes, and two for one-sided producers.
        queues: 5,
        queue_slots: slots,
        batch: 4,
        chunk: 4096,
        depth: 3,
        ctrl_pool: 4,
        stall: Duration::from_secs(20),
        drain: Duration::from_secs(10),
        idle_sleep: Duration::from_micros(20),
        proxy_cpus: Vec::new(),
    }
}

/// `n` ranks, each reaching every other, over `fabric`.
fn world(fabric: &LoopbackFabric, n: u32, cfg: &NetConfig, backend: &Backend) -> Vec<NetPath> {
    (0..n)
        .map(|r| {
            let peers: Vec<Rank> = (0..n).filter(|&p| p != r).collect();
            NetPath::start_with(Box::new(fabric.endpoint(r)), &peers, cfg, backend.clone(), r).expect("start a path")
        })
        .collect()
}

/// Shuts every path down and checks it went clean.
fn shutdown_all(paths: &mut [NetPath]) {
    for p in paths.iter_mut() {
        p.shutdown(Instant::now() + Duration::from_secs(20)).expect("clean shutdown");
    }
}

/// Polls `paths` until `want` completions arrived at `which`, or panics.
fn wait_done(paths: &mut [NetPath], which: usize, want: usize) -> Vec<(NetId, Result<(), NetError>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while got.len() < want {
        for (i, p) in paths.iter_mut().enumerate() {
            if i == which {
                p.poll_done(&mut |id, r| got.push((id, r)));
            }
        }
        assert!(Instant::now() < deadline, "only {} of {want} completions at rank {which}: {got:?}", got.len());
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

/// Polls rank `which` until `want` control packets arrived, or panics.
fn wait_inbound(path: &mut NetPath, want: usize) -> Vec<(Rank, Vec<u8>)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while got.len() < want {
        path.poll_inbound(&mut |from, bytes| got.push((from, bytes)));
        assert!(Instant::now() < deadline, "only {} of {want} control packets arrived", got.len());
        std::thread::sleep(Duration::from_micros(200));
    }
    got
}

/// Waits until `cond` holds, looking every millisecond, or panics after `PATIENCE` saying
/// that `what` never happened.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "{what} within {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Retries a post while the path says "no resource", letting completions drain.
fn retry<T>(mut post: impl FnMut() -> Result<T, PostError>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match post() {
            Ok(v) => return v,
            Err(PostError::NoResource) => {
                assert!(Instant::now() < deadline, "a post found no resource for {PATIENCE:?}");
                std::thread::sleep(Duration::from_micros(100));
            }
            Err(e) => panic!("post failed: {e}"),
        }
    }
}

/// A buffer of `len` bytes at an odd offset, in host or sim device memory, that frees
/// itself.
struct Buf {
    backend: Backend,
    /// The vector holding a host buffer (of words: its start is 8-aligned, as a device
    /// allocation's is).
    _host: Option<Vec<u64>>,
    dev: Option<usize>,
    /// The buffer's address (inside the allocation, at the offset).
    addr: usize,
    len: usize,
}

const OFFSET: usize = 3;

impl Buf {
    fn new(backend: &Backend, device: Option<u32>, len: usize) -> Buf {
        match device {
            None => {
                let mut v = vec![0u64; (len + OFFSET + 5).div_ceil(8)];
                let addr = v.as_mut_ptr() as usize + OFFSET;
                Buf { backend: backend.clone(), _host: Some(v), dev: None, addr, len }
            }
            Some(d) => {
                let base = backend.alloc(d, len + OFFSET + 5).expect("sim alloc");
                Buf { backend: backend.clone(), _host: None, dev: Some(base), addr: base + OFFSET, len }
            }
        }
    }

    /// The 8-aligned start of the allocation, `OFFSET` bytes before the buffer.
    fn base(&self) -> usize {
        self.addr - OFFSET
    }

    fn mem(&self) -> crate::device::MemoryKind {
        self.backend.pointer_info(self.addr).expect("pointer info").kind
    }

    fn fill(&self, seed: u8) {
        let bytes = pattern(self.len, seed);
        // SAFETY: the buffer's own range; nothing else uses it meanwhile.
        unsafe { self.backend.copy_sync(self.addr, bytes.as_ptr() as usize, self.len) }.expect("fill");
    }

    fn read(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        // SAFETY: the buffer's own range; nothing writes it meanwhile.
        unsafe { self.backend.copy_sync(v.as_mut_ptr() as usize, self.addr, self.len) }.expect("read");
        v
    }

    /// The bytes just around the buffer (guards), which no op may touch.
    fn guards(&self) -> (Vec<u8>, Vec<u8>) {
        let mut before = vec![0u8; OFFSET];
        let mut after = vec![0u8; 5];
        // SAFETY: inside the allocation: OFFSET bytes before the buffer, 5 after.
        unsafe {
            self.backend.copy_sync(before.as_mut_ptr() as usize, self.addr - OFFSET, OFFSET).expect("guard");
            self.backend.copy_sync(after.as_mut_ptr() as usize, self.addr + self.len, 5).expect("guard");
        }
        (before, after)
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let Some(base) = self.dev {
            // SAFETY: every op on the buffer completed before the test drops it.
            unsafe { self.backend.free(base) }.expect("sim free");
        }
    }
}

/// Bytes that differ per position and seed.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(seed as u32 % 31) as u8 ^ seed).collect()
}
