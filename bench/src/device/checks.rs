//! The device API's conformance checks (`device_check`, on GPUs; the kernels and what
//! each one proves are in `kernels.cu`). Every rank runs each check's kernel at once;
//! rank 0 gathers the ranks' results and judges them, one `name,ok|FAIL,detail` line per
//! check (as `bench/gpu/run.sh`'s checks print).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use gpulmt::{Context, SymPtr, Tag};

use super::{cuda_err, DeviceModule, Result};

/// Words of each rank's result buffer: mismatches, timeouts, then per-check values (at
/// most 2 + the ranks of the job for `atomics`).
const RES_WORDS: usize = 80;
/// Tag of the results rank 0 gathers.
const RESULT_TAG: Tag = 300;

/// How hard the checks push.
#[derive(Clone, Copy, Debug)]
pub struct CheckOptions {
    /// Iterations of the racing checks (fence, put_signal).
    pub iters: u32,
    /// Rounds of the round-based checks (quiet, barriers).
    pub rounds: u32,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { iters: 20000, rounds: 200 }
    }
}

/// One check's verdict (rank 0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

impl Verdict {
    /// The CSV line: `name,ok,detail` or `name,FAIL,detail`.
    pub fn line(&self) -> String {
        format!("{},{},{}", self.name, if self.ok { "ok" } else { "FAIL" }, self.detail.replace(',', ";"))
    }
}

/// Every check's name, in the order they run.
pub const CHECKS: [&str; 7] =
    ["fence_flag", "quiet_all", "put_signal_race", "atomics", "quiet_busy", "out_of_heap", "barrier_rounds"];

/// Runs the checks (`only`: just that one) on every rank; rank 0 returns the verdicts and
/// hands each to `each` as soon as it is known (a check that hangs or crawls is then
/// named by the last line printed, not hidden behind the others).
pub fn run(
    ctx: &mut Context,
    o: &CheckOptions,
    only: Option<&str>,
    mut each: impl FnMut(&Verdict),
) -> Result<Vec<Verdict>> {
    // The heap exists before the module is loaded: loading sets the device context.
    let res = ctx.sym_alloc(RES_WORDS * 8)?;
    let m = DeviceModule::load(ctx, super::KERNELS, "device_checks.cu", &[])?;
    let mut verdicts = Vec::new();
    for name in CHECKS.into_iter().filter(|c| only.is_none() || only == Some(*c)) {
        zero(ctx, res, RES_WORDS * 8)?;
        ctx.sym_device_errors_clear()?;
        if let Some(v) = one(ctx, &m, res, name, o)? {
            each(&v);
            verdicts.push(v);
        }
    }
    ctx.sym_free(res)?;
    Ok(verdicts)
}

/// Runs one check on every rank; rank 0 gets its verdict.
fn one(
    ctx: &mut Context,
    m: &DeviceModule,
    res: SymPtr,
    name: &'static str,
    o: &CheckOptions,
) -> Result<Option<Verdict>> {
    let (me, n) = (ctx.rank() as usize, ctx.size() as usize);
    let r = res.addr() as u64;
    let (iters, rounds) = (o.iters as i32, o.rounds as i32);
    let mut extra = Vec::new();
    let mut bufs = Vec::new();
    let f = m.function(name)?;
    let cfg =
        |grid: u32, block: u32| LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
    let mut alloc = |ctx: &mut Context, bytes: usize| -> Result<u64> {
        let p = ctx.sym_alloc(bytes)?;
        zero(ctx, p, bytes)?;
        bufs.push(p);
        Ok(p.addr() as u64)
    };
    // Grids and sizes per check: small, so every rank's kernel fits the GPU together.
    let (atomic_blocks, atomic_threads, atomic_k, locked) = (8u32, 128u32, (12 * n) as i32, 20i32);
    match name {
        "fence_flag" => {
            // data[0..8] is written by the peer; data[8..17] holds this rank's sources.
            let (data, flag) = (alloc(ctx, 17 * 8)?, alloc(ctx, 8)?);
            ctx.barrier()?;
            let mut l = m.stream.launch_builder(&f);
            l.arg(&data).arg(&flag).arg(&iters).arg(&r);
            // SAFETY: the arguments match fence_flag's parameters; the buffers are symmetric
            // allocations of the sizes it uses, on every rank.
            unsafe { l.launch(cfg(2, 32)) }.map_err(cuda_err("launching fence_flag"))?;
        }
        "quiet_all" => {
            let slot_words = 4096i32;
            let slots = alloc(ctx, n * slot_words as usize * 8)?;
            let src = alloc(ctx, slot_words as usize * 8)?;
            let flags = alloc(ctx, n * 8)?;
            ctx.barrier()?;
            let mut l = m.stream.launch_builder(&f);
            l.arg(&slots).arg(&src).arg(&flags).arg(&slot_words).arg(&rounds).arg(&r);
            // SAFETY: as above, for quiet_all.
            unsafe { l.launch(cfg(1, 256)) }.map_err(cuda_err("launching quiet_all"))?;
        }
        "put_signal_race" => {
            let (buf, src) = (alloc(ctx, 262144)?, alloc(ctx, 262144)?);
            let (sig, ack) = (alloc(ctx, 8)?, alloc(ctx, 8)?);
            ctx.barrier()?;
            let mut l = m.stream.launch_builder(&f);
            l.arg(&buf).arg(&src).arg(&sig).arg(&ack).arg(&iters).arg(&r);
            // SAFETY: as above, for put_signal_race.
            unsafe { l.launch(cfg(3, 256)) }.map_err(cuda_err("launching put_signal_race"))?;
        }
        "atomics" => {
            let words = alloc(ctx, 24)?;
            ctx.barrier()?;
            let mut l = m.stream.launch_builder(&f);
            l.arg(&words).arg(&atomic_k).arg(&locked).arg(&r);
            // SAFETY: as above, for atomics.
            unsafe { l.launch(cfg(atomic_blocks, atomic_threads)) }.map_err(cuda_err("launching atomics"))?;
            m.sync()?;
            ctx.barrier()?;
            extra.push(ctx.sym_atomic_fetch(words as usize, me as u32)?);
            extra.push(ctx.sym_atomic_fetch(words as usize + 16, me as u32)?);
        }
        "quiet_busy" => {
            let busy = 4u32;
            let (small, src) = (alloc(ctx, 256)?, alloc(ctx, 256)?);
            let (flag, ack, stop) = (alloc(ctx, 8)?, alloc(ctx, 8)?, alloc(ctx, 8)?);
            let (big, scratch) = (alloc(ctx, (busy as usize) << 20)?, alloc(ctx, 1 << 20)?);
            ctx.barrier()?;
            let mut l = m.stream.launch_builder(&f);
            l.arg(&small).arg(&src).arg(&flag).arg(&ack).arg(&big).arg(&scratch).arg(&rounds).arg(&stop).arg(&r);
            // SAFETY: as above, for quiet_busy (busy blocks write `big`, one MiB each).
            unsafe { l.launch(cfg(2 + busy, 256)) }.map_err(cuda_err("launching quiet_busy"))?;
        }
        "out_of_heap" => {
            let ok = alloc(ctx, 8)?;
            ctx.barrier()?;
            let mut l = m.stream.launch_builder(&f);
            l.arg(&ok).arg(&r);
            // SAFETY: as above, for out_of_heap: the accesses it makes outside the heap
            // are the ones the device checks must refuse before touching memory.
            unsafe { l.launch(cfg(1, 32)) }.map_err(cuda_err("launching out_of_heap"))?;
            m.sync()?;
            ctx.barrier()?;
            let e = ctx.sym_device_errors()?;
            let d = ctx.sym_device_ctx()?;
            extra.push(e.map_or(0, |e| e.count));
            extra.push(e.map_or(0, |e| u64::from(e.op == Some(gpulmt::sym::DeviceOp::Put))));
            extra
                .push(e.map_or(0, |e| u64::from(e.addr == d.heap_base + d.heap_size && e.pe as usize == (me + 1) % n)));
            extra.push(ctx.sym_atomic_fetch(ok as usize, me as u32)?);
        }
        "barrier_rounds" => {
            let (share, blocks) = (256i32, 4u32);
            let slot_words = share as usize * blocks as usize;
            let slots = alloc(ctx, n * slot_words * 8)?;
            let src = alloc(ctx, slot_words * 8)?;
            let got = alloc(ctx, slot_words * 8)?;
            ctx.barrier()?;
            let grid = blocks.min(m.resident_grid(&f, 256)?);
            let mut l = m.stream.launch_builder(&f);
            l.arg(&slots).arg(&src).arg(&share).arg(&rounds).arg(&got).arg(&r);
            // SAFETY: as above, for barrier_rounds; a cooperative launch keeps every block
            // resident, which its grid barrier needs.
            unsafe { l.launch_cooperative(cfg(grid, 256)) }.map_err(cuda_err("launching barrier_rounds"))?;
        }
        other => return Err(super::DeviceError(format!("unknown check {other}: the checks are {CHECKS:?}"))),
    }
    m.sync()?;
    ctx.barrier()?;
    let mut words = vec![0u64; RES_WORDS];
    // SAFETY: `res` is our symmetric allocation of RES_WORDS words; `words` holds as many.
    unsafe { ctx.sym_get(words.as_mut_ptr().cast(), res.addr(), RES_WORDS * 8, me as u32)? };
    words.extend(extra);
    for p in bufs {
        ctx.sym_free(p)?;
    }
    let all = gather(ctx, &words)?;
    Ok(all.map(|all| {
        judge(
            name,
            &all,
            n,
            (atomic_blocks * atomic_threads) as u64 * atomic_k as u64,
            locked as u64 * atomic_blocks as u64,
        )
    }))
}

/// The verdict of `name` from every rank's results (`[mismatches, timeouts, ..]`, the
/// check's own values from index 2, and what the host appended after RES_WORDS).
fn judge(name: &'static str, all: &[Vec<u64>], n: usize, per_counter: u64, per_rank_locked: u64) -> Verdict {
    let sum = |i: usize| all.iter().map(|r| r[i]).sum::<u64>();
    let (bad, timeouts) = (sum(0), sum(1));
    let mut ok = bad == 0 && timeouts == 0;
    let mut detail = format!("ranks={n} mismatches={bad} timeouts={timeouts}");
    let host = |r: &Vec<u64>, i: usize| r[RES_WORDS + i];
    match name {
        "fence_flag" | "put_signal_race" => {
            ok &= all.iter().all(|r| r[2] > 0);
            detail += &format!(" observed={}", sum(2));
        }
        "atomics" => {
            let want_sum = per_counter * per_counter.saturating_sub(1) / 2;
            let sums_ok = (0..n).all(|t| sum(2 + t) == want_sum);
            let totals_ok = all.iter().all(|r| host(r, 0) == per_counter);
            let locked = host(&all[0], 1);
            ok &= sums_ok && totals_ok && locked == per_rank_locked * n as u64;
            detail += &format!(
                " counter={} (want {per_counter}) old-value sums exact={sums_ok} locked={locked} (want {})",
                host(&all[0], 0),
                per_rank_locked * n as u64
            );
        }
        "quiet_busy" => {
            ok &= all.iter().all(|r| r[2] > 0);
            detail += &format!(" busy_puts={}", sum(2));
        }
        "out_of_heap" => {
            let each = all.iter().all(|r| host(r, 0) == 5 && host(r, 1) == 1 && host(r, 2) == 1 && host(r, 3) == 1);
            ok &= each && sum(2) == 0;
            detail += &format!(
                " rejected={} first_is_put_past_end={} valid_op_after={}",
                host(&all[0], 0),
                host(&all[0], 2),
                host(&all[0], 3)
            );
        }
        _ => {}
    }
    Verdict { name, ok, detail }
}

/// Rank 0 gets every rank's words (in rank order); the others get None.
fn gather(ctx: &mut Context, words: &[u64]) -> Result<Option<Vec<Vec<u64>>>> {
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    if ctx.rank() != 0 {
        ctx.send(&bytes, 0, RESULT_TAG)?;
        return Ok(None);
    }
    let mut all = vec![words.to_vec()];
    for r in 1..ctx.size() {
        let mut buf = vec![0u8; bytes.len()];
        ctx.recv(&mut buf, Some(r), Some(RESULT_TAG))?;
        all.push(buf.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect());
    }
    Ok(Some(all))
}

/// Zeroes this rank's copy of `bytes` of `p`.
fn zero(ctx: &Context, p: SymPtr, bytes: usize) -> Result<()> {
    let zeros = vec![0u8; bytes];
    // SAFETY: `zeros` holds `bytes` readable bytes.
    unsafe { ctx.sym_put(p.addr(), zeros.as_ptr(), bytes, ctx.rank())? };
    Ok(())
}
