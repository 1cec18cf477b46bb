// SpTS's CUDA kernels (bench/src/spts): the sync-free persistent kernel of the gio mode
// (seed 000's intra-kernel communication; Liu et al.'s synchronization-free SpTRSV) and
// the per-level kernel of the inter-k baseline. NVRTC compiles this behind
// include/gpulmt_device.cuh, with --fmad=false.
//
// Arithmetic: a row's value is b, minus each off-diagonal product in CSR order, over the
// diagonal, every operation rounded once (__dmul_rn, __dsub_rn, __ddiv_rn: never a fused
// multiply-add), exactly as matrix.rs's row_value: the result is bit-identical to the
// serial CPU reference.
//
// Arrays of a rank's plan (plan.rs, RankPlan), indexed by local row k: rowg (global row),
// ptr / col / val (off-diagonal entries: col is where the value is read in x), diag, b;
// gio: fidx / tmul / tbase per entry (the flag word it waits for and the value awaited),
// cptr / cons (consuming ranks on this node), the streams to other nodes (speer, sptr /
// srows, sstage, sdst); inter-k: optr / opos (outbox slots). x: the rank's symmetric
// xbuf (x by global row, then the inbox and the outbox); flags: a word per global row,
// then one per rank (streams' counts).

#define SPTS_FULL 0xffffffffu

// Local row k from the values in x (inter-k: every column final and in xbuf).
__device__ double spts_row_value(unsigned k, const unsigned *ptr, const unsigned *col, const double *val,
                                 const double *diag, const double *b, const double *x)
{
    double s = b[k];
    for (unsigned e = ptr[k]; e < ptr[k + 1]; e++) {
        s = __dsub_rn(s, __dmul_rn(val[e], x[col[e]]));
    }
    return __ddiv_rn(s, diag[k]);
}

// inter-k: one thread per row of one level (by_level: the level's local rows); the value
// goes to x and to its outbox slots, which the host then puts to the consuming ranks.
extern "C" __global__ void spts_level(const unsigned *by_level, unsigned count, const unsigned *rowg,
                                      const unsigned *ptr, const unsigned *col, const double *val, const double *diag,
                                      const double *b, const unsigned *optr, const unsigned *opos, double *x,
                                      double *outbox)
{
    unsigned t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= count) {
        return;
    }
    unsigned k = by_level[t];
    double v = spts_row_value(k, ptr, col, val, diag, b, x);
    x[rowg[k]] = v;
    for (unsigned o = optr[k]; o < optr[k + 1]; o++) {
        outbox[opos[o]] = v;
    }
}

// Largest batch of a stream's put (values): the first ones should not wait for a long run.
#define SPTS_BATCH 1024u

// gio, a stream's sender (lane 0 of a warp of its own): ships the rows of stream `st` in
// order, each batch whatever is solved from the first unshipped row on: waits for that
// row's flag, extends over the following rows already flagged, stages their values in
// the outbox (the heap: the proxy reads the source after the call), and puts them with the
// stream's count (counted on from earlier solves: (epoch - 1) * len + shipped) into the
// consumer's word flags[self_sig]. The fence before each put keeps the batches in order
// at the consumer (the queue path may reorder otherwise), so a count covers every value
// before it. Not inlined: its registers would otherwise count against the solver's.
__device__ __noinline__ void spts_stream(unsigned st, const unsigned *rowg, const unsigned *speer, const unsigned *sptr,
                            const unsigned *srows, const unsigned *sstage, const unsigned *sdst, double *x,
                            unsigned long long *flags, unsigned self_sig, unsigned long long epoch)
{
    const unsigned *rows = srows + sptr[st];
    unsigned len = sptr[st + 1] - sptr[st], cur = 0;
    double *stage = x + sstage[st], *dst = x + sdst[st];
    int peer = (int)speer[st];
    unsigned long long base = (epoch - 1ull) * len;
    while (cur < len) {
        gpulmt_signal_wait_until(&flags[rowg[rows[cur]]], GPULMT_CMP_GE, epoch);
        unsigned end = cur + 1;
        while (end < len && end - cur < SPTS_BATCH && gpulmt_ld_acquire_sys(&flags[rowg[rows[end]]]) >= epoch) {
            end++;
        }
        for (unsigned q = cur; q < end; q++) {
            stage[q] = x[rowg[rows[q]]];
        }
        gpulmt_fence();
        gpulmt_put_signal_nbi(dst + cur, stage + cur, (size_t)(end - cur) * sizeof(double), &flags[self_sig],
                              base + end, GPULMT_SIGNAL_SET, peer);
        cur = end;
    }
}

// gio: one persistent kernel solves all of this rank's rows, a warp per row.
//
// - Order: lane 0 takes the next local row from the counter ctl[0] (rows increasing, so
//   global rows increasing). A warp waits only for rows of smaller global index, which
//   on this rank were taken earlier by running warps, and on another rank are taken in
//   the same order there: the smallest unsolved row of the job is always held by a running
//   warp with every dependency solved, so the solve progresses, provided every rank's
//   kernel runs (its grid resident beside the others': spts/gio.rs sizes it).
// - Waiting: each lane waits for one entry's flag word, flags[fidx] >= epoch * tmul + tbase,
//   with an acquire at system scope (gpulmt_signal_wait_until): x[j]'s flag (j's row, set
//   by a local producer's release store or a mapped producer's put_signal), or, for a row
//   of another node, its stream's count; the value is then visible to this lane's following
//   load of x[col] (x[j], or the stream's inbox slot). The lane multiplies; lane 0
//   subtracts the products in CSR order (the shuffles).
// - Publishing: lane 0 stores x[i] and releases flags[i] (local consumers); after the
//   warp barrier, which orders lane 0's store before the other lanes' reads, the lanes
//   put x[i] with its flag to each consuming rank this rank maps (put_signal: the value,
//   then the flag, released). Consumers on other nodes get it through their stream: the
//   grid's first nstreams warps are senders (spts_stream), not solvers; they wait only for
//   rows solved by running warps, so the order argument above still holds.
// - epoch: this solve's number (flags from earlier solves are smaller: no reset between
//   solves). ctl[1] counts solved rows, for the host's watchdog.
extern "C" __global__ void __launch_bounds__(256)
    spts_gio(unsigned nrows, const unsigned *rowg, const unsigned *ptr, const unsigned *col, const double *val,
             const double *diag, const double *b, const unsigned *fidx, const unsigned *tmul,
             const unsigned long long *tbase, const unsigned *cptr, const unsigned *cons, unsigned nstreams,
             const unsigned *speer, const unsigned *sptr, const unsigned *srows, const unsigned *sstage,
             const unsigned *sdst, double *x, unsigned long long *flags, unsigned self_sig, unsigned long long epoch,
             unsigned long long *ctl)
{
    unsigned lane = threadIdx.x & 31u, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp < nstreams) {
        if (lane == 0) {
            spts_stream(warp, rowg, speer, sptr, srows, sstage, sdst, x, flags, self_sig, epoch);
        }
        __syncwarp();
    } else {
        for (;;) {
            unsigned k = 0;
            if (lane == 0) {
                k = (unsigned)atomicAdd(&ctl[0], 1ull);
            }
            k = __shfl_sync(SPTS_FULL, k, 0);
            if (k >= nrows) {
                break;
            }
            unsigned i = rowg[k], e0 = ptr[k], e1 = ptr[k + 1];
            double s = b[k];
            for (unsigned base = e0; base < e1; base += 32u) {
                unsigned e = base + lane;
                double p = 0.0;
                if (e < e1) {
                    gpulmt_signal_wait_until(&flags[fidx[e]], GPULMT_CMP_GE, epoch * tmul[e] + tbase[e]);
                    p = __dmul_rn(val[e], x[col[e]]);
                }
                unsigned m = e1 - base < 32u ? e1 - base : 32u;
                for (unsigned q = 0; q < m; q++) {
                    s = __dsub_rn(s, __shfl_sync(SPTS_FULL, p, q));
                }
            }
            double v = __ddiv_rn(s, diag[k]);
            if (lane == 0) {
                x[i] = v;
                gpulmt_st_release_sys(&flags[i], epoch);
            }
            __syncwarp();
            for (unsigned c = cptr[k] + lane; c < cptr[k + 1]; c += 32u) {
                gpulmt_put_signal_nbi(&x[i], &x[i], sizeof(double), &flags[i], epoch, GPULMT_SIGNAL_SET, (int)cons[c]);
            }
            if (lane == 0) {
                atomicAdd(&ctl[1], 1ull);
            }
        }
    }
    // The queue path's packets of this block acknowledged before the kernel ends.
    __syncthreads();
    if (threadIdx.x == 0) {
        gpulmt_quiet();
    }
}
