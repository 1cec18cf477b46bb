//! The symmetric heap across nodes (issue 28): host operations to PEs of other nodes go
//! through the heap's GIO queue and the proxies, those to PEs of this node through the
//! mapped heaps, and every one is checked at its target, byte for byte:
//! - puts (blocking, and `_nbi` completed by `sym_quiet`) of sizes inline and streamed,
//!   to every PE, then gets of what every PE holds;
//! - put_signal: the target waits for the signal and must then see the data (never the
//!   signal first), rounds of `Add` (on CUDA made by the GPU for the host when the PE is
//!   of the same node, by its proxy through the GPU otherwise) and a final `Set`;
//! - fence: a large `_nbi` put, a fence, a small one to the same place: the small one's
//!   bytes are what the target holds after the quiet;
//! - atomics: every rank's fetch-adds on one word of PE 0 and of the last PE give the
//!   exact total, and the fetched values are a permutation (each add saw all the earlier
//!   ones); compare-swap has one winner; set, then fetch by another rank;
//! - accesses outside the heap's allocations are refused;
//! - the device's queue table ([`gpulmt::sym::QueueTable`]), used the way
//!   `include/gpulmt_device.cuh`'s `gpulmt_gio_post` uses it (a device producer
//!   emulated on the host, possible on sim where device memory is host memory): a PUT
//!   and a fetch-add AMO to an off-node PE complete with the data and the result where
//!   the header expects them, a signal op (a PUT_SIGNAL of no data) sets its word, and a
//!   PUT past the heap's end completes with an error (the proxy's check) while the queue
//!   goes on.

use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpulmt::mpi::rsmpi::traits::{Communicator, CommunicatorCollectives};
use gpulmt::sym::{Cmp, QueueTable, SendQueue, Signal, SignalOp};
use gpulmt::{Context, Rank};
use gpulmt_protocols::gio::{AmoOp, Flags, Op, Packet};

use crate::buffer::{fail, message, OrFail};

/// Bytes of each sender's slot in the data allocation.
const SLOT: usize = 70_000;
/// Sizes of the puts: empty-ish, inline, past the inline limit, several pieces.
const SIZES: [usize; 4] = [1, 4096, 4097, 65_537];
/// Fetch-adds each rank makes on each of the two counters.
const ADDS: u64 = 40;
const ROUNDS: u64 = 6;
const PATIENCE: Duration = Duration::from_secs(60);

fn seed(from: Rank, to: Rank, len: usize) -> u64 {
    ((from as u64) << 40) ^ ((to as u64) << 20) ^ len as u64
}

/// Reads `len` bytes of this rank's own heap at `addr`.
fn local(ctx: &Context, addr: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `v` is a host buffer of `len` bytes, written by the call only.
    unsafe { ctx.sym_get(v.as_mut_ptr(), addr, len, ctx.rank()) }.or_fail(ctx.rank(), || "reading the own heap".into());
    v
}

/// Runs the checks; returns how many were made.
pub fn run(ctx: &mut Context, world: &impl Communicator) -> usize {
    let (me, n) = (ctx.rank(), ctx.size());
    let data = ctx.sym_alloc(SLOT * n as usize).or_fail(me, || "sym_alloc of the data".into());
    let stage = ctx.sym_alloc(SLOT).or_fail(me, || "sym_alloc of the staging area".into());
    // Words: 0 the fetch-add counter, 1 compare-swap, 2 set, 3.. one signal per rank.
    let words = ctx.sym_alloc(8 * (3 + n as usize)).or_fail(me, || "sym_alloc of the words".into());
    let zeros = vec![0u8; words.len()];
    // SAFETY: a host buffer readable for the call.
    unsafe { ctx.sym_put(words.addr(), zeros.as_ptr(), zeros.len(), me) }.or_fail(me, || "zeroing".into());
    let off_node: Vec<Rank> = (0..n).filter(|&r| !ctx.topology().on_node(r)).collect();
    let mut checks = 0;
    if ctx.sym_heaps().iter().enumerate().any(|(r, h)| h.mapped.is_none() != off_node.contains(&(r as Rank))) {
        fail(me, format!("heaps mapped: {:?}; off-node PEs {off_node:?}", ctx.sym_heaps()));
    }
    world.barrier();

    // Puts to every PE, alternating blocking and _nbi + quiet; then gets of every slot.
    for &len in &SIZES {
        let mut held = Vec::new();
        for pe in (0..n).filter(|&p| p != me) {
            let m = message(seed(me, pe, len), len);
            let dst = data.at(me as usize * SLOT);
            // SAFETY: `m` stays alive and unchanged until the quiet below (held).
            let put = unsafe {
                if pe % 2 == 0 {
                    ctx.sym_put(dst, m.as_ptr(), len, pe)
                } else {
                    ctx.sym_put_nbi(dst, m.as_ptr(), len, pe)
                }
            };
            put.or_fail(me, || format!("sym_put of {len} bytes to PE {pe}"));
            held.push(m);
        }
        ctx.sym_quiet().or_fail(me, || "sym_quiet after the puts".into());
        drop(held);
        world.barrier();
        for from in (0..n).filter(|&p| p != me) {
            let got = local(ctx, data.at(from as usize * SLOT), len);
            if got != message(seed(from, me, len), len) {
                fail(me, format!("the put of {len} bytes from PE {from} did not land intact"));
            }
        }
        for pe in (0..n).filter(|&p| p != me) {
            let mut got = vec![0u8; len];
            // SAFETY: `got` is a host buffer of `len` bytes, unused until the quiet.
            unsafe { ctx.sym_get_nbi(got.as_mut_ptr(), data.at(me as usize * SLOT), len, pe) }
                .or_fail(me, || format!("sym_get_nbi of {len} bytes from PE {pe}"));
            ctx.sym_quiet().or_fail(me, || "sym_quiet after a get".into());
            if got != message(seed(me, pe, len), len) {
                fail(me, format!("the get of {len} bytes from PE {pe} did not return what it holds"));
            }
        }
        world.barrier();
        checks += 2;
    }

    // put_signal around the ring of every PE: the signal never shows before the data.
    let (to, from) = ((me + 1) % n, (me + n - 1) % n);
    let sig_of = |r: Rank| words.at(8 * (3 + r as usize));
    for round in 0..ROUNDS {
        let len = if round % 2 == 0 { 8 } else { 5000 };
        let m = message(seed(me, to, len) + round, len);
        let signal = Signal { addr: sig_of(me), value: 1, op: SignalOp::Add };
        // SAFETY: `m` outlives the call, which is complete on return.
        unsafe { ctx.sym_put_signal(stage.addr(), m.as_ptr(), len, signal, to) }
            .or_fail(me, || format!("sym_put_signal round {round} to PE {to}"));
        let seen = ctx
            .sym_signal_wait_until(sig_of(from), Cmp::Ge, round + 1, Some(PATIENCE))
            .or_fail(me, || "sym_signal_wait_until".into());
        if seen != Some(round + 1) {
            fail(me, format!("round {round}: the signal from PE {from} is {seen:?}"));
        }
        if local(ctx, stage.addr(), len) != message(seed(from, me, len) + round, len) {
            fail(me, format!("round {round}: PE {from}'s signal arrived before its data"));
        }
        world.barrier();
        checks += 1;
    }
    let signal = Signal { addr: sig_of(me), value: 1000, op: SignalOp::Set };
    // SAFETY: a one-byte host array, read during the call.
    unsafe { ctx.sym_put_signal(stage.addr(), [0u8; 1].as_ptr(), 1, signal, to) }.or_fail(me, || "signal set".into());
    let seen = ctx.sym_signal_wait_until(sig_of(from), Cmp::Eq, 1000, Some(PATIENCE)).or_fail(me, || "wait".into());
    if seen != Some(1000) {
        fail(me, format!("the signal set from PE {from} is {seen:?}"));
    }
    world.barrier();

    // fence: a large _nbi put, a fence, an 8-byte one over its start.
    let big = message(seed(me, to, 60_000), 60_000);
    let small = message(seed(me, to, 8) ^ 0xfe, 8);
    let dst = data.at(me as usize * SLOT);
    // SAFETY: `big` and `small` live until the quiet below.
    unsafe {
        ctx.sym_put_nbi(dst, big.as_ptr(), big.len(), to).or_fail(me, || "the fenced put".into());
        ctx.sym_fence();
        ctx.sym_put_nbi(dst, small.as_ptr(), 8, to).or_fail(me, || "the put after the fence".into());
    }
    ctx.sym_quiet().or_fail(me, || "quiet after the fence".into());
    world.barrier();
    let got = local(ctx, data.at(from as usize * SLOT), 60_000);
    let (want_big, want_small) = (message(seed(from, me, 60_000), 60_000), message(seed(from, me, 8) ^ 0xfe, 8));
    if got[..8] != want_small[..] || got[8..] != want_big[8..] {
        fail(me, format!("PE {from}'s put after its fence did not land after the one before"));
    }
    checks += 1;
    world.barrier();

    // Atomics: exact totals, distinct fetched values, one compare-swap winner. The counters
    // live on PE 0 and the last PE, one of which is on every rank's node: on CUDA the GPU
    // makes an on-node PE's atomics for the host, the proxy's through its GPU an off-node
    // PE's, and both must count.
    {
        let counters = [0, n - 1];
        let mut olds = Vec::new();
        for i in 0..ADDS {
            for &pe in &counters {
                let old = ctx.sym_atomic_fetch_add(words.at(0), 1, pe).or_fail(me, || format!("fetch-add {i} on {pe}"));
                olds.push(old + ((pe as u64) << 32));
            }
        }
        let won = ctx.sym_atomic_compare_swap(words.at(8), 0, me as u64 + 1, 0).or_fail(me, || "compare-swap".into());
        ctx.sym_atomic_set(words.at(16), 100 + me as u64, to).or_fail(me, || "atomic set".into());
        world.barrier();
        let mut all = vec![0u64; olds.len() * n as usize];
        world.all_gather_into(&olds[..], &mut all[..]);
        for &pe in &counters {
            let total = ctx.sym_atomic_fetch(words.at(0), pe).or_fail(me, || "fetch".into());
            if total != ADDS * n as u64 * if counters[0] == counters[1] { 2 } else { 1 } {
                fail(me, format!("PE {pe}'s counter is {total} after {ADDS} adds from each of {n} ranks"));
            }
            let mut seen: Vec<u64> = all.iter().filter(|&&o| o >> 32 == pe as u64).map(|o| o & 0xffff_ffff).collect();
            seen.sort_unstable();
            if seen != (0..total).collect::<Vec<_>>() {
                fail(me, format!("PE {pe}'s fetch-adds returned {seen:?}, not each value once"));
            }
        }
        let mut wins = vec![0u64; n as usize];
        world.all_gather_into(&won, &mut wins[..]);
        let cas = ctx.sym_atomic_fetch(words.at(8), 0).or_fail(me, || "fetch".into());
        let winners: Vec<Rank> = (0..n).filter(|&r| wins[r as usize] == 0).collect();
        if winners.len() != 1 || cas != winners[0] as u64 + 1 {
            fail(me, format!("compare-swap: ranks {winners:?} saw 0, the word holds {cas}"));
        }
        let set = ctx.sym_atomic_fetch(words.at(16), to).or_fail(me, || "fetch of the set word".into());
        let expect = 100 + ((to + n - 1) % n) as u64;
        if set != expect {
            fail(me, format!("PE {to}'s set word is {set}, not {expect}"));
        }
        checks += 3;
    }

    // Accesses outside the heap's allocations are refused before anything moves.
    for pe in [to, me] {
        let refused = ctx.sym_atomic_fetch_add(words.at(words.len() + 256), 1, pe).is_err()
            // SAFETY: a host buffer of 16 bytes, not read on refusal.
            && unsafe { ctx.sym_put(data.at(data.len() - 8), [0u8; 16].as_ptr(), 16, pe) }.is_err();
        if !refused {
            fail(me, format!("an access past an allocation on PE {pe} was not refused"));
        }
    }
    checks += 1;

    if !off_node.is_empty() {
        checks += device_queue(ctx, &off_node, stage.addr());
    }
    world.barrier();
    for p in [words, stage, data] {
        ctx.sym_free(p).or_fail(me, || "sym_free".into());
    }
    if !off_node.is_empty() {
        checks += device_puts_across_free(ctx, world, &off_node);
    }
    checks
}

/// Posts through the device's queue 0 as `gpulmt_gio_post` does: a PUT of 16 bytes of
/// `src` (this heap) to the same offset of the first off-node PE's heap, then a
/// fetch-add of 5 on its word at `src + 64` whose old value goes to the queue's result
/// slot; checks both at the target through host gets. Sim only (device memory is host
/// memory there); on CUDA the GPU check runs it (bench's device_check).
fn device_queue(ctx: &Context, off_node: &[Rank], src: usize) -> usize {
    let me = ctx.rank();
    let dctx = ctx.sym_device_ctx().or_fail(me, || "sym_device_ctx".into());
    if dctx.queues == 0 || ctx.sym_device_queues() == 0 {
        fail(me, "the device context has no queue table although PEs live on other nodes".into());
    }
    // The default leaves kernels 6 queues (of 9: the context's two, the heap's host calls'
    // one): with 5, device_check's quiet_busy put a flooding block on the queue of the
    // block that quiets, and took 1.25 s a round instead of under 20 ms (docs/device-api.md).
    if std::env::var_os("GPULMT_NET_QUEUES").is_none() && ctx.sym_device_queues() != 6 {
        fail(me, format!("kernels got {} GIO queues by default, not 6", ctx.sym_device_queues()));
    }
    if ctx.backend_kind() != gpulmt::device::BackendKind::Sim {
        return 0;
    }
    // SAFETY: on sim, device memory and the queues' mapped memory are this process's
    // host memory; the table and its records were written at setup and stay until
    // finalize, after this.
    let sq = unsafe { DeviceSq::open(dctx.queues) };
    for r in 0..ctx.size() {
        let t = sq.target_of(r);
        if (t >= 0) != off_node.contains(&r) {
            fail(me, format!("the device's template of PE {r} is {t}; off-node PEs {off_node:?}"));
        }
    }
    let pe = off_node[0];
    // Each rank's own part of the staging area, so that ranks sharing a target do not
    // write over each other.
    let src = src + 1024 * (me as usize + 1);
    let pattern = message(seed(me, pe, 16) ^ 0xd0, 16);
    // SAFETY: 16 bytes of host memory read by the call.
    unsafe { ctx.sym_put(src, pattern.as_ptr(), 16, me) }.or_fail(me, || "filling the source".into());
    let offset = (src as u64) - dctx.heap_base;
    let expect_failed = std::cell::Cell::new(0u64);
    let post_as = |result_slot: bool, make: &dyn Fn(u64) -> (Op, Flags)| -> u64 {
        let pos = sq.post(me, pe, result_slot, make);
        sq.wait(me, pos);
        if sq.u64_at(sq.q.cq_failed).load(Ordering::Acquire) != expect_failed.get() {
            fail(me, format!("the device queue's op {pos} failed"));
        }
        pos
    };
    let post = |make: &dyn Fn(u64) -> (Op, Flags)| post_as(false, make);
    post(&|_| (Op::Put { src: src as u64, dst_offset: offset, size: 16 }, Flags::SRC_DEVICE));
    let mut got = [0u8; 16];
    // SAFETY: 16 bytes of host memory written by the call.
    unsafe { ctx.sym_get(got.as_mut_ptr(), src, 16, pe) }.or_fail(me, || "reading back the device put".into());
    if got[..] != pattern[..] {
        fail(me, format!("the device queue's put to PE {pe} did not land"));
    }
    let word = src + 64;
    let before = ctx.sym_atomic_fetch(word, pe).or_fail(me, || "fetch".into());
    // The header's fetching AMO names the queue's result slot of its own position (pinned
    // host memory: no DST_DEVICE).
    let result_of = |pos: u64| sq.q.results + (pos & (sq.q.slots - 1)) * 8;
    let amo = |pos: u64| {
        let op = Op::Amo { amo: AmoOp::FetchAdd, offset: offset + 64, operand: 5, compare: 0, result: result_of(pos) };
        (op, Flags::NONE)
    };
    let pos = post_as(true, &amo);
    let old = sq.u64_at(result_of(pos)).load(Ordering::Acquire);
    sq.release_result(pos);
    let after = ctx.sym_atomic_fetch(word, pe).or_fail(me, || "fetch".into());
    if after != before.wrapping_add(5) || old != before {
        fail(me, format!("the device AMO on PE {pe}: {before} -> {after}, fetched {old}"));
    }
    // gpulmt_signal_op on the queue path: a PUT_SIGNAL of no data, from no source.
    let signal = Op::PutSignal {
        src: 0,
        dst_offset: offset + 128,
        size: 0,
        signal_offset: offset + 128,
        signal_value: 9 + me as u64,
        signal_op: SignalOp::Set,
    };
    post(&|_| (signal, Flags::NONE));
    let seen = ctx.sym_atomic_fetch(src + 128, pe).or_fail(me, || "fetch of the signal".into());
    if seen != 9 + me as u64 {
        fail(me, format!("the device signal set on PE {pe} left {seen}"));
    }
    // Past the end of the heap (what the header's own check would have refused): the
    // proxy refuses it with an error completion, and the queue goes on.
    expect_failed.set(1);
    let beyond = Op::Put { src: src as u64, dst_offset: dctx.heap_size - 8, size: 16 };
    post(&|_| (beyond, Flags::SRC_DEVICE));
    post(&|_| (Op::Put { src: src as u64, dst_offset: offset, size: 16 }, Flags::SRC_DEVICE));
    4
}

/// A kernel's puts through the queue path are still in flight when the kernel ends
/// (unless it quieted), and `sym_free` must complete them before the memory they write
/// can be handed out again: device_check's `barrier_rounds` failed across pseudo-nodes
/// when it ran after `quiet_busy`, whose kernel ended with 1 MiB puts queued that then
/// wrote over `barrier_rounds`' fresh allocations at the same offsets (git history:
/// bench/results/h200x1/offnode_probe3 at c15a975). Here each rank posts many large puts into its
/// slot at an off-node PE through device queue 0 and does not wait (the kernel ends),
/// frees, allocates the same bytes again (same offset), fills its own copy and, once its
/// own queue has drained and every rank got there, expects its fill intact: a put that
/// landed after the free would have left the old pattern.
fn device_puts_across_free(ctx: &mut Context, world: &impl Communicator, off_node: &[Rank]) -> usize {
    // Puts of several pieces (GPULMT_NET_CHUNK, 1 MiB), a few in flight at a time: the
    // frees' and the allocation's small messages overtake their later pieces, so that a
    // put left behind lands after the fill.
    const SLOT: usize = 8 << 20;
    const PUTS: usize = 4;
    let (me, n) = (ctx.rank(), ctx.size() as usize);
    if ctx.backend_kind() != gpulmt::device::BackendKind::Sim {
        return 0;
    }
    let victim = ctx.sym_alloc(SLOT * n).or_fail(me, || "sym_alloc of the put targets".into());
    let src = ctx.sym_alloc(SLOT).or_fail(me, || "sym_alloc of the put source".into());
    let old = vec![0xa5u8; SLOT];
    // SAFETY: a host buffer of SLOT bytes, read by the call.
    unsafe { ctx.sym_put(src.addr(), old.as_ptr(), SLOT, me) }.or_fail(me, || "filling the source".into());
    world.barrier();
    let dctx = ctx.sym_device_ctx().or_fail(me, || "sym_device_ctx".into());
    // SAFETY: as in device_queue: sim, the table lives until finalize.
    let sq = unsafe { DeviceSq::open(dctx.queues) };
    let pe = off_node[0];
    let offset = victim.at(me as usize * SLOT) as u64 - dctx.heap_base;
    let put = Op::Put { src: src.addr() as u64, dst_offset: offset, size: SLOT as u64 };
    let mut last = 0;
    for _ in 0..PUTS {
        last = sq.post(me, pe, false, &|_| (put, Flags::SRC_DEVICE));
    }
    // The kernel ends here, without a quiet.
    for p in [src, victim] {
        ctx.sym_free(p).or_fail(me, || "sym_free with device puts in flight".into());
    }
    let again = ctx.sym_alloc(SLOT * n).or_fail(me, || "sym_alloc after the free".into());
    if again.offset() != victim.offset() {
        fail(me, format!("the allocation after the free is at {}, not {}", again.offset(), victim.offset()));
    }
    let fresh = vec![0x3cu8; SLOT * n];
    // SAFETY: a host buffer of the allocation's size, read by the call.
    unsafe { ctx.sym_put(again.addr(), fresh.as_ptr(), fresh.len(), me) }.or_fail(me, || "filling".into());
    sq.wait(me, last);
    world.barrier();
    let got = local(ctx, again.addr(), fresh.len());
    if let Some(at) = got.iter().position(|&b| b != 0x3c) {
        fail(
            me,
            format!(
                "byte {at} of the allocation after sym_free holds {:#x}, not the fill 0x3c: a device put posted \
                 before the free landed after it",
                got[at]
            ),
        );
    }
    ctx.sym_free(again).or_fail(me, || "sym_free".into());
    1
}

/// The first send queue of a device context's table, read and written as device code
/// does, from the host (sim).
struct DeviceSq {
    q: SendQueue,
}

impl DeviceSq {
    /// # Safety
    /// `table` is the address of a [`QueueTable`] with at least one record, and every
    /// address in its first record is host memory of this process that stays mapped
    /// while the result lives (sim), accessed atomically by everyone else.
    unsafe fn open(table: u64) -> DeviceSq {
        // SAFETY: the contract: a table and its first record, readable.
        let q = unsafe {
            let t = std::ptr::read(table as *const QueueTable);
            std::ptr::read(t.sq as *const SendQueue)
        };
        DeviceSq { q }
    }

    fn u64_at(&self, addr: u64) -> &AtomicU64 {
        // SAFETY: `addr` is one of the record's words (open's contract), 8-aligned.
        unsafe { AtomicU64::from_ptr(addr as *mut u64) }
    }

    fn u32_at(&self, addr: u64) -> &AtomicU32 {
        // SAFETY: as in u64_at, a 4-aligned word of the record's arrays.
        unsafe { AtomicU32::from_ptr(addr as *mut u32) }
    }

    /// Posts one packet to `pe` as `gpulmt_gio_post` does: fence marks, a reserved
    /// position under the credit rule, its result word once free, words 1-7, the commit
    /// word with release, the doorbell (max, release). `make` gives the op for the
    /// position; `result_slot`: it fetches into the slot's result word, which
    /// [`release_result`](Self::release_result) frees once read. Returns the position.
    fn post(&self, me: Rank, pe: Rank, result_slot: bool, make: &dyn Fn(u64) -> (Op, Flags)) -> u64 {
        let target = self.target_of(pe) as u32;
        let epoch = self.u32_at(self.q.fence_epoch).load(Ordering::Relaxed) + 1;
        let prev = self.u32_at(self.q.fence_epoch_of_pe + 4 * pe as u64).swap(epoch, Ordering::Relaxed);
        let pos = self.u64_at(self.q.reserve).fetch_add(1, Ordering::Relaxed);
        let (op, flags) = make(pos);
        let flags = if prev != 0 && prev < epoch { flags.union(Flags::FENCE) } else { flags };
        let deadline = Instant::now() + PATIENCE;
        while pos >= self.u64_at(self.q.head).load(Ordering::Acquire) + self.q.slots {
            if Instant::now() > deadline {
                fail(me, "the device queue never gave credit".into());
            }
        }
        let freed = self.u64_at(self.q.result_free + (pos & (self.q.slots - 1)) * 8);
        while freed.load(Ordering::Acquire) + self.q.slots <= pos {
            if Instant::now() > deadline {
                fail(me, "the device queue's result word was never released".into());
            }
        }
        if !result_slot {
            freed.store(pos + 1, Ordering::Release);
        }
        let slot = self.q.ring + (pos & (self.q.slots - 1)) * 64;
        let words = Packet { op, flags, target, cookie: pos }.encode(pos, self.q.slots).words;
        for (i, w) in words.iter().enumerate().skip(1) {
            self.u64_at(slot + 8 * i as u64).store(*w, Ordering::Relaxed);
        }
        self.u64_at(slot).store(words[0], Ordering::Release);
        self.u64_at(self.q.doorbell).fetch_max(pos + 1, Ordering::Release);
        pos
    }

    /// Frees the result word of the fetching op at `pos` once its result was read
    /// (`gpulmt_amo`'s release).
    fn release_result(&self, pos: u64) {
        self.u64_at(self.q.result_free + (pos & (self.q.slots - 1)) * 8).store(pos + 1, Ordering::Release);
    }

    /// Waits until the op at `pos` completed (`gpulmt_gio_wait`).
    fn wait(&self, me: Rank, pos: u64) {
        let deadline = Instant::now() + PATIENCE;
        while self.u64_at(self.q.cq_done).load(Ordering::Acquire) <= pos {
            if Instant::now() > deadline {
                fail(me, format!("the device queue's op {pos} never completed"));
            }
            std::thread::yield_now();
        }
    }

    /// The queue's template of PE `pe`, -1 where it has none.
    fn target_of(&self, pe: Rank) -> i32 {
        // SAFETY: target_of_pe holds n_pes i32 (open's contract); pe is a PE of the job.
        unsafe { AtomicI32::from_ptr((self.q.target_of_pe as *mut i32).add(pe as usize)) }.load(Ordering::Relaxed)
    }
}
