// Stencil2D's GIO mode (seed 000, section 6, "intra-kernel"): one persistent kernel runs
// every step of a run. Before each batch of `halo` steps its first blocks put this rank's
// edge layers straight into the neighbours' ghost cells (put2d_signal_block, one block per
// neighbour, diagonal neighbours included so that corners need no second phase) and wait
// for the neighbours' signals; the grid then computes the batch, a grid barrier between
// steps. No kernel boundary and no host call per step.
//
// A neighbour on another node (not mapped here: the queue path through the proxies) gets
// each halo as one packet: the block packs the rectangle into a staging buffer of this
// heap, thread 0 puts it with put_signal into the neighbour's inbox, and the receiving
// block unpacks its own inbox into the ghost cells after the signal (gio.rs: `Inboxes`
// says why two of each, by exchange parity, suffice). put2d over the queue would be one
// packet, a proxy round trip, per row of a column halo.
//
// NVRTC compiles this behind include/gpulmt_device.cuh, `typedef ... real;` and
// kernels.cu (stencil9_point). Launch requirement: every block resident (a cooperative
// launch sized for this rank's share of the GPU), since gpulmt_sync_grid waits for all.

// One halo message (16 words; gio.rs fills them): the neighbour, the rectangle of this
// rank's field it gets (rows x cols from (src_r0, src_c0)), where it lands in the
// neighbour's field (dst_r0, dst_c0, dst_pitch elements a row), the signal word it sets
// there (sigs[sig] = exchange + 1) and the word here its own message signals (recv);
// where the neighbour's message lands here (recv_r0, recv_c0); off-node, the staging
// buffers (pack here, inbox_out there, inbox_in here: each the first of two, slot bytes
// apart by exchange parity; pack == 0: the neighbour is mapped, direct puts).
struct halo_put {
    long long peer, src_r0, src_c0, rows, cols, dst_r0, dst_c0, dst_pitch, sig, recv, recv_r0, recv_c0, pack,
        inbox_out, inbox_in, slot;
};

__device__ unsigned long long gio_now(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One block's halo message of exchange e from field src: the acknowledgement (halo > 1),
// the put with its signal, the wait for the neighbour's, and off-node the unpacking of its
// inbox. Not inlined: the device header's puts need registers that the compute steps of
// the caller, held to GIO_MIN_BLOCKS by the launch bounds, would otherwise spill around.
__device__ __noinline__ void gio_halo(const struct halo_put *p, real *src, unsigned long long pitch, unsigned halo,
                                     unsigned long long *sigs, unsigned long long e)
{
    const size_t elem = sizeof(real);
    int peer = (int)p->peer;
    if (halo > 1) {
        if (threadIdx.x == 0 && threadIdx.y == 0) {
            gpulmt_signal_op(&sigs[8 + p->sig], e, GPULMT_SIGNAL_SET, peer);
            gpulmt_signal_wait_until(&sigs[8 + p->recv], GPULMT_CMP_GE, e);
        }
        __syncthreads();
    }
    unsigned t = gpulmt_block_thread(), nt = gpulmt_block_threads();
    unsigned long long cells = (unsigned long long)p->rows * (unsigned long long)p->cols;
    size_t par = (size_t)(e & 1ull) * (size_t)p->slot;
    if (p->pack) {
        real *pk = (real *)(p->pack + par);
        const real *from = src + p->src_r0 * (long long)pitch + p->src_c0;
        for (unsigned long long i = t; i < cells; i += nt) {
            pk[i] = from[(i / p->cols) * pitch + i % p->cols];
        }
        // Every thread's share packed before thread 0 posts: the post's release
        // (the packet's commit word) is cumulative, so the proxy that takes the
        // packet reads the whole buffer.
        __syncthreads();
        if (t == 0) {
            gpulmt_put_signal_nbi((char *)(p->inbox_out + par), pk, (size_t)cells * elem, &sigs[p->sig], e + 1,
                                  GPULMT_SIGNAL_SET, peer);
        }
    } else {
        gpulmt_put2d_signal_block(src + p->dst_r0 * p->dst_pitch + p->dst_c0, (size_t)p->dst_pitch * elem,
                                  src + p->src_r0 * (long long)pitch + p->src_c0, (size_t)pitch * elem,
                                  (size_t)p->cols * elem, (size_t)p->rows, &sigs[p->sig], e + 1,
                                  GPULMT_SIGNAL_SET, peer);
    }
    if (t == 0) {
        gpulmt_signal_wait_until(&sigs[p->recv], GPULMT_CMP_GE, e + 1);
    }
    if (p->pack) {
        // Thread 0's acquire of the signal, which the proxy wrote after the data,
        // then the block barrier: the inbox is complete for every thread. Volatile
        // loads: this SM read the same inbox two exchanges ago.
        __syncthreads();
        const volatile real *in = (const volatile real *)(p->inbox_in + par);
        real *to = src + p->recv_r0 * (long long)pitch + p->recv_c0;
        for (unsigned long long i = t; i < cells; i += nt) {
            to[(i / p->cols) * pitch + i % p->cols] = in[i];
        }
    }
}

// `steps` steps from field `cur0` (0: f0, 1: f1), the first exchange numbered `exchange0`.
// sigs: 16 symmetric words, [0, 8) data signals by direction, [8, 16) acknowledgements
// (halo > 1 only: a neighbour may write ghost cells only once this rank finished the
// batch that used them; with halo 1 a batch never touches the ghost cells of the field
// the next exchange writes). nb_mask: bit 0 north, 1 south, 2 west, 3 east neighbour.
// exchange_ns: [0] time block 0 spent from the start of each exchange to the barrier after
// it; [1] the number of the last exchange the grid passed, plus one (the host's watchdog).
// GIO_MIN_BLOCKS (stencil2d --gio-min-blocks): the blocks per SM that the kernel's
// registers must allow. The halo puts inlined from the device header would take 82
// registers a thread, 3 blocks of 256 an SM; the compute steps are memory bound and need
// more threads in flight than that to hide the loads' latency (8: 1.7-2.2x faster on one
// H200 under MPS than the compiler's choice; the spills land in the halo puts, which
// gio_halo keeps out of the compute loop: 64 bytes of spill stores in the kernel with
// it, 240 inlined, by ptxas -v for sm_90, single precision).
#ifndef GIO_MIN_BLOCKS
#define GIO_MIN_BLOCKS 8
#endif
extern "C" __global__ void __launch_bounds__(256, GIO_MIN_BLOCKS) stencil_gio(real *f0, real *f1, unsigned long long pitch, unsigned long long rows,
                                       unsigned nb_mask, unsigned halo, const struct halo_put *plan, int nplan,
                                       unsigned long long *sigs, unsigned long long exchange0,
                                       unsigned long long steps, int cur0, real w_center, real w_cardinal,
                                       real w_diagonal, unsigned long long *exchange_ns)
{
    unsigned long long step = 0, e = exchange0, spent = 0;
    int cur = cur0;
    const unsigned tiles_x_of = 32, tiles_y_of = 8;
    while (step < steps) {
        unsigned long long t0 = gio_now();
        real *src = cur ? f1 : f0;
        if ((int)blockIdx.x < nplan) {
            gio_halo(&plan[blockIdx.x], src, pitch, halo, sigs, e);
        }
        gpulmt_sync_grid(); // every ghost cell in, seen by every block
        if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
            spent += gio_now() - t0;
            // The host's watchdog (gio.rs, CudaEngine::sync): exchanges the grid passed.
            *(volatile unsigned long long *)&exchange_ns[1] = e + 1;
        }
        unsigned long long batch = steps - step < halo ? steps - step : halo;
        for (unsigned long long k = 0; k < batch; k++) {
            // Decomp::step_region(k): k + 1 layers in from a neighbour side, halo from a boundary.
            unsigned long long m_n = (nb_mask & 1) ? k + 1 : halo, m_s = (nb_mask & 2) ? k + 1 : halo;
            unsigned long long m_w = (nb_mask & 4) ? k + 1 : halo, m_e = (nb_mask & 8) ? k + 1 : halo;
            unsigned r0 = (unsigned)m_n, r1 = (unsigned)(rows - m_s), c0 = (unsigned)m_w, c1 = (unsigned)(pitch - m_e);
            const real *s = cur ? f1 : f0;
            real *d = cur ? f0 : f1;
            unsigned tx = (c1 - c0 + tiles_x_of - 1) / tiles_x_of, ty = (r1 - r0 + tiles_y_of - 1) / tiles_y_of;
            for (unsigned t = blockIdx.x; r1 > r0 && c1 > c0 && t < tx * ty; t += gridDim.x) {
                unsigned i = r0 + (t / tx) * tiles_y_of + threadIdx.y, j = c0 + (t % tx) * tiles_x_of + threadIdx.x;
                if (i < r1 && j < c1) {
                    d[(size_t)i * pitch + j] = stencil9_point(s, pitch, i, j, w_center, w_cardinal, w_diagonal);
                }
            }
            gpulmt_sync_grid(); // the next step (or exchange) reads what this one wrote
            cur = 1 - cur;
        }
        step += batch;
        e++;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0) {
        *exchange_ns += spent;
    }
}
