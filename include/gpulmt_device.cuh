/*
 * gpulmt_device.cuh: GPU-initiated communication on gpulmt's symmetric heap.
 *
 * A kernel moves data to any rank (PE) of the job by itself: puts, gets, put_signal,
 * signal waits, 64-bit atomics, fence, quiet and barriers, OpenSHMEM / NVSHMEM style
 * (docs/device-api.md is the reference, docs/memory-model.md the guarantees).
 *
 * - Self-contained: compiles under NVRTC with no include and no CUDA runtime header,
 *   and under nvcc (C++). Compiled as C by a host compiler, it declares only the shared
 *   layouts (gpulmt_device_ctx, the GIO packet encoding), for host code that fills them.
 * - The context: the host copies the 48 bytes of gpulmt_device_ctx that
 *   Context::sym_device_ctx / gpulmt_sym_device_ctx return into this module's
 *   __constant__ symbol `gpulmt_dctx` before the first launch (NVRTC / driver API:
 *   cuModuleGetGlobal(&p, &n, module, "gpulmt_dctx") and cuMemcpyHtoD; nvcc runtime:
 *   cudaMemcpyToSymbol(gpulmt_dctx, &ctx, sizeof ctx)). In a program of several
 *   translation units linked with -rdc, define GPULMT_DEVICE_CTX_EXTERN in all but one.
 *   A kernel that uses the API with no (or another version of the) context traps.
 * - Paths: a PE whose heap this process maps (same GPU, or a peer GPU over NVLink/PCIe
 *   through CUDA IPC) is reached by direct loads and stores; any other PE through the
 *   thread block's GIO send queue and the proxy (the off-node path, docs/internode.md):
 *   PEs of other nodes, whose heaps are windows of the internode path; a PE reached by
 *   neither (this node, no peer access; or a job of one node) is rejected like a bad
 *   address.
 * - Checks: every operation checks its PE and that its symmetric range lies in the
 *   heap's allocation area; a rejected one does nothing (a fetch returns 0) and is
 *   recorded in the PE's heap (read with Context::sym_device_errors /
 *   gpulmt_sym_device_errors). Define GPULMT_DEVICE_UNCHECKED to compile the checks out.
 * - Group calls (_warp, _block): every thread of the group calls with the same
 *   arguments (a full warp; every thread of the block).
 * - Memory ordering: each fence below says why it is there (seed 001: NVSHMEM's model;
 *   seed 000 section 4: GIO's visibility rules).
 *
 * SPDX-License-Identifier: MIT OR Apache-2.0
 */
#ifndef GPULMT_DEVICE_CUH
#define GPULMT_DEVICE_CUH

/* The types of every target (LP64 hosts, CUDA devices), without <stdint.h>, which NVRTC
 * lacks; 64-bit words are unsigned long long, the type CUDA's atomics take. */
typedef unsigned long long gpulmt_u64;
typedef unsigned int gpulmt_u32;
typedef int gpulmt_i32;

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define GPULMT_HD __host__ __device__ static inline
#define GPULMT_DEV __device__ static inline
#else
#define GPULMT_HD static inline
#endif

/* ---- Shared layouts: transport/src/sym/layout.rs, compared by a test ---------------- */

#define GPULMT_DEVICE_CTX_VERSION 1u

/* The control area at the start of every PE's heap. */
#define GPULMT_CTRL_ERRORS 0ull            /* [count, op << 32 | pe, address, bytes] */
#define GPULMT_CTRL_BARRIER_EPOCH 128ull   /* barrier_all calls this PE made */
#define GPULMT_CTRL_GRID_COUNT 384ull      /* blocks arrived at the local grid barrier */
#define GPULMT_CTRL_GRID_GENERATION 512ull /* local grid barriers completed */
#define GPULMT_CTRL_BASES 640ull           /* n_pes words: each PE's heap as mapped here */
/* n_pes words after the bases: word p, the last barrier_all epoch PE p announced here. */
#define GPULMT_CTRL_BARRIER_ARRIVALS_AT(n_pes) (GPULMT_CTRL_BASES + 8ull * (gpulmt_u64)(n_pes))

/* Ops named in the record of a rejected access. */
#define GPULMT_OP_PUT 1u
#define GPULMT_OP_GET 2u
#define GPULMT_OP_PUT_SIGNAL 3u
#define GPULMT_OP_SIGNAL 4u
#define GPULMT_OP_ATOMIC 5u
#define GPULMT_OP_PTR 6u

/* Signal updates of put_signal / signal_op. */
#define GPULMT_SIGNAL_SET 0
#define GPULMT_SIGNAL_ADD 1

/* Comparisons of signal_wait_until. */
#define GPULMT_CMP_EQ 0
#define GPULMT_CMP_NE 1
#define GPULMT_CMP_GT 2
#define GPULMT_CMP_GE 3
#define GPULMT_CMP_LT 4
#define GPULMT_CMP_LE 5

/* What a kernel knows of the job and the heaps (Rust: gpulmt::sym::DeviceCtx). */
typedef struct gpulmt_device_ctx {
    gpulmt_u32 version;   /* GPULMT_DEVICE_CTX_VERSION */
    gpulmt_i32 my_pe;     /* this rank */
    gpulmt_i32 n_pes;     /* ranks in the job */
    gpulmt_u32 reserved;  /* bytes of each heap before the first allocation */
    gpulmt_u64 heap_size; /* bytes of every heap */
    gpulmt_u64 heap_base; /* this PE's heap: symmetric addresses are addresses in it */
    gpulmt_u64 bases;     /* device address of n_pes words: heap bases as mapped here, 0: not mappable */
    gpulmt_u64 queues;    /* device address of a gpulmt_gio_queues, 0: no queue path (one node) */
} gpulmt_device_ctx;

/* ---- The GIO packet (protocols/src/gio/packet.rs) and the device's send queues ------- */

#define GPULMT_GIO_OP_NOP 0u
#define GPULMT_GIO_OP_PUT 4u
#define GPULMT_GIO_OP_PUT_SIGNAL 5u
#define GPULMT_GIO_OP_GET 6u
#define GPULMT_GIO_OP_AMO 7u
#define GPULMT_GIO_FLAG_SRC_DEVICE 1u
#define GPULMT_GIO_FLAG_DST_DEVICE 2u
#define GPULMT_GIO_FLAG_FENCE 4u
#define GPULMT_GIO_AMO_FETCH_ADD 0u
#define GPULMT_GIO_AMO_COMPARE_SWAP 1u
#define GPULMT_GIO_AMO_SET 2u
#define GPULMT_GIO_AMO_FETCH 3u
/* Word positions: 0 commit, 1 local address, 2 remote offset, 3 size, 4 arg0, 5 arg1, 7 cookie. */
#define GPULMT_GIO_WORDS 8

/* One send queue as device code posts to it (Rust: gpulmt::sym::SendQueue). Every field
 * is an address in this process, device-visible (pinned host memory is mapped at the
 * same address under UVA, so the proxy reads the same words). The heap fills one per
 * GIO queue the internode path leaves for device code (transport/src/sym/offnode.rs):
 * ring, doorbell, head and counters are the queue's pinned memory, results pinned memory
 * too; reserve, the fence words and target_of_pe device memory. */
typedef struct gpulmt_gio_sq {
    gpulmt_u64 ring;              /* slots packets of 64 bytes */
    gpulmt_u64 slots;             /* a power of two */
    gpulmt_u64 reserve;           /* u64, device memory: positions reserved (atomic) */
    gpulmt_u64 doorbell;          /* u64: the tail published to the proxy */
    gpulmt_u64 head;              /* u64 the proxy writes: packets taken (credits) */
    gpulmt_u64 cq_done;           /* u64 the proxy writes: ops below it completed */
    gpulmt_u64 cq_failed;         /* u64 the proxy writes: ops below cq_done that failed */
    gpulmt_u64 results;           /* slots u64 the proxy writes: an AMO's fetched value */
    gpulmt_u64 target_of_pe;      /* n_pes i32: this queue's template index of each PE, -1: none */
    gpulmt_u64 fence_epoch_of_pe; /* n_pes u32, device memory: fence epoch of each target's last op */
    gpulmt_u64 fence_epoch;       /* u32, device memory: fences called on this queue */
    gpulmt_u64 result_free;       /* slots u64, device memory: per slot, 1 + the position of the
                                   * last op that released its result word */
} gpulmt_gio_sq;

typedef struct gpulmt_gio_queues {
    gpulmt_u32 n_sq; /* block b posts to sq[b % n_sq] */
    gpulmt_u32 pad;
    gpulmt_u64 sq;   /* device address of n_sq gpulmt_gio_sq */
} gpulmt_gio_queues;

/* The commit word of a packet at position pos of a ring of slots: op, flags, variant,
 * target and the commit bit (lap parity XOR 1), so that one release store publishes the
 * whole packet (protocols: gio::commit_word). */
GPULMT_HD gpulmt_u64 gpulmt_gio_commit_word(gpulmt_u64 pos, gpulmt_u64 slots, gpulmt_u32 op, gpulmt_u32 flags,
                                            gpulmt_u32 variant, gpulmt_u32 target)
{
    gpulmt_u64 parity = (pos / slots) & 1ull;
    return (gpulmt_u64)(op & 0xffu) | (gpulmt_u64)(flags & 0xffu) << 8 | (gpulmt_u64)(variant & 0xffu) << 16 |
           (gpulmt_u64)(target & 0x7fffffffu) << 32 | (parity ^ 1ull) << 63;
}

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
/* ======================== Device code ================================================ */

#ifdef GPULMT_DEVICE_CTX_EXTERN
extern __constant__ gpulmt_device_ctx gpulmt_dctx;
#else
/* The context of this module's kernels: set by the host before launching them. */
__constant__ gpulmt_device_ctx gpulmt_dctx;
#endif

/* ---- Memory-model primitives (PTX ISA memory consistency model) ---------------------- */

/* A fence at system scope: orders this thread's earlier memory operations before its
 * later ones as seen by every observer of the system (other processes' kernels on this
 * GPU, peer GPUs, the host and the proxy). It is cumulative: writes this thread observed
 * (from its block through bar.sync, from its grid through the grid barrier) are ordered
 * too. acq_rel, not sc: gpulmt needs ordering, not a single total order of fences. */
GPULMT_DEV void gpulmt_fence_sys(void) { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

GPULMT_DEV gpulmt_u64 gpulmt_ld_relaxed_sys(const gpulmt_u64 *p)
{
    gpulmt_u64 v;
    /* Strong at system scope: each load reaches the point of coherence, so a spin sees a
     * remote PE's store instead of a stale line of this SM's L1. */
    asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

GPULMT_DEV gpulmt_u64 gpulmt_ld_acquire_sys(const gpulmt_u64 *p)
{
    gpulmt_u64 v;
    asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

GPULMT_DEV gpulmt_u64 gpulmt_ld_acquire_gpu(const gpulmt_u64 *p)
{
    gpulmt_u64 v;
    asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* A release store at system scope: every earlier write of this thread (and, by
 * cumulativity, of its group after the group's barrier) is visible to whoever observes
 * this store and then acquires. What makes put_signal's data land before its signal. */
GPULMT_DEV void gpulmt_st_release_sys(gpulmt_u64 *p, gpulmt_u64 v)
{
    asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/* A release store at GPU scope: for words only this GPU's threads share. */
GPULMT_DEV void gpulmt_st_release_gpu(gpulmt_u64 *p, gpulmt_u64 v)
{
    asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

GPULMT_DEV void gpulmt_red_release_add_sys(gpulmt_u64 *p, gpulmt_u64 v)
{
    asm volatile("red.release.sys.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

GPULMT_DEV gpulmt_u64 gpulmt_atom_add_sys(gpulmt_u64 *p, gpulmt_u64 v)
{
    gpulmt_u64 old;
    asm volatile("atom.relaxed.sys.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

GPULMT_DEV gpulmt_u64 gpulmt_atom_cas_sys(gpulmt_u64 *p, gpulmt_u64 cond, gpulmt_u64 v)
{
    gpulmt_u64 old;
    asm volatile("atom.relaxed.sys.cas.b64 %0, [%1], %2, %3;" : "=l"(old) : "l"(p), "l"(cond), "l"(v) : "memory");
    return old;
}

GPULMT_DEV gpulmt_u64 gpulmt_atom_exch_sys(gpulmt_u64 *p, gpulmt_u64 v)
{
    gpulmt_u64 old;
    asm volatile("atom.relaxed.sys.exch.b64 %0, [%1], %2;" : "=l"(old) : "l"(p), "l"(v) : "memory");
    return old;
}

GPULMT_DEV unsigned gpulmt_block_thread(void)
{
    return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}

GPULMT_DEV unsigned gpulmt_block_threads(void) { return blockDim.x * blockDim.y * blockDim.z; }

GPULMT_DEV unsigned gpulmt_lane(void) { return gpulmt_block_thread() & 31u; }

/* ---- The context, the checks, the direct path ------------------------------------------ */

GPULMT_DEV int gpulmt_my_pe(void) { return gpulmt_dctx.my_pe; }
GPULMT_DEV int gpulmt_n_pes(void) { return gpulmt_dctx.n_pes; }

GPULMT_DEV gpulmt_u64 *gpulmt_ctrl(gpulmt_u64 offset) { return (gpulmt_u64 *)(gpulmt_dctx.heap_base + offset); }

/* Records a rejected access in this PE's heap: the count, and the first one's details. */
GPULMT_DEV void gpulmt_reject(gpulmt_u32 op, int pe, const void *sym, gpulmt_u64 bytes)
{
    gpulmt_u64 *rec = gpulmt_ctrl(GPULMT_CTRL_ERRORS);
    if (gpulmt_atom_add_sys(rec, 1) == 0) {
        rec[1] = (gpulmt_u64)op << 32 | (gpulmt_u32)pe;
        rec[2] = (gpulmt_u64)sym;
        rec[3] = bytes;
    }
}

/* Traps when the host never set this module's context (or set another version's). */
GPULMT_DEV void gpulmt_require_ctx(void)
{
    if (gpulmt_dctx.version != GPULMT_DEVICE_CTX_VERSION) {
        __trap(); /* gpulmt_dctx was not set: see the top of this header */
    }
}

/* Whether [sym, sym + bytes) lies in the heap's allocation area and pe is a PE of the
 * job; records the access otherwise. Traps when the host never set the context. */
GPULMT_DEV int gpulmt_check(gpulmt_u32 op, const void *sym, gpulmt_u64 bytes, int pe)
{
    gpulmt_require_ctx();
#ifdef GPULMT_DEVICE_UNCHECKED
    return 1;
#else
    gpulmt_u64 a = (gpulmt_u64)sym, lo = gpulmt_dctx.heap_base + gpulmt_dctx.reserved,
               hi = gpulmt_dctx.heap_base + gpulmt_dctx.heap_size;
    if (pe >= 0 && pe < gpulmt_dctx.n_pes && a >= lo && a <= hi && bytes <= hi - a) {
        return 1;
    }
    gpulmt_reject(op, pe, sym, bytes);
    return 0;
#endif
}

/* The address of pe's copy of a symmetric address on the direct path, or 0 (not mappable). */
GPULMT_DEV gpulmt_u64 gpulmt_direct(const void *sym, int pe)
{
    gpulmt_u64 base = ((const gpulmt_u64 *)gpulmt_dctx.bases)[pe];
    return base ? base + ((gpulmt_u64)sym - gpulmt_dctx.heap_base) : 0;
}

/* A local pointer to pe's copy of sym for direct loads and stores (NVSHMEM's nvshmem_ptr),
 * or NULL where pe's heap is not mapped here (or the address is rejected). */
GPULMT_DEV void *gpulmt_ptr(const void *sym, int pe)
{
    return gpulmt_check(GPULMT_OP_PTR, sym, 0, pe) ? (void *)gpulmt_direct(sym, pe) : (void *)0;
}

/* Copies n bytes, thread `t` of `nt` taking every nt-th piece: 16-byte vectors where both
 * ends allow, four in flight per thread (loads before stores, for one CTA's bandwidth),
 * then 8-byte words, then bytes. `fresh` loads with ld.volatile (relaxed at system
 * scope): a get must not read a line this SM's L1 cached before the peer changed it. */
GPULMT_DEV void gpulmt_copy(char *dst, const char *src, gpulmt_u64 n, unsigned t, unsigned nt, int fresh)
{
    gpulmt_u64 done = 0, align = (gpulmt_u64)dst | (gpulmt_u64)src;
    if ((align & 15) == 0) {
        gpulmt_u64 vecs = n / 16, i = t;
        uint4 *d = (uint4 *)dst;
        const uint4 *s = (const uint4 *)src;
        for (; i + 3ull * nt < vecs; i += 4ull * nt) {
            uint4 v[4];
            for (int k = 0; k < 4; k++) {
                const uint4 *p = s + i + (gpulmt_u64)k * nt;
                if (fresh) {
                    asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w)
                                 : "l"(p)
                                 : "memory");
                } else {
                    v[k] = *p;
                }
            }
            for (int k = 0; k < 4; k++) {
                d[i + (gpulmt_u64)k * nt] = v[k];
            }
        }
        for (; i < vecs; i += nt) {
            uint4 v;
            if (fresh) {
                asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                             : "l"(s + i)
                             : "memory");
            } else {
                v = s[i];
            }
            d[i] = v;
        }
        done = vecs * 16;
    }
    if ((align & 7) == 0) {
        gpulmt_u64 *d = (gpulmt_u64 *)(dst + done);
        const gpulmt_u64 *s = (const gpulmt_u64 *)(src + done);
        gpulmt_u64 words = (n - done) / 8;
        for (gpulmt_u64 i = t; i < words; i += nt) {
            d[i] = fresh ? ((volatile const gpulmt_u64 *)s)[i] : s[i];
        }
        done += words * 8;
    }
    for (gpulmt_u64 i = done + t; i < n; i += nt) {
        dst[i] = fresh ? ((volatile const char *)src)[i] : src[i];
    }
}

/* Applies a signal update with release at system scope (see gpulmt_st_release_sys). */
GPULMT_DEV void gpulmt_signal_release(gpulmt_u64 *word, gpulmt_u64 value, int op)
{
    if (op == GPULMT_SIGNAL_ADD) {
        gpulmt_red_release_add_sys(word, value);
    } else {
        gpulmt_st_release_sys(word, value);
    }
}

/* ---- The queue path: GIO packets in the block's send queue (off-node PEs) ------------ */
/* Against protocols/src/gio's format; the proxy (transport/src/net/proxy) takes the
 * packets, checks them against its templates (the target PE's heap window), and the
 * target's proxy checks the range again before it touches the heap. */

/* This block's send queue, or NULL where there is no queue path (a job of one node). */
GPULMT_DEV const gpulmt_gio_sq *gpulmt_gio_my_sq(void)
{
    const gpulmt_gio_queues *q = (const gpulmt_gio_queues *)gpulmt_dctx.queues;
    if (!q || q->n_sq == 0) {
        return (const gpulmt_gio_sq *)0;
    }
    unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    return (const gpulmt_gio_sq *)q->sq + b % q->n_sq;
}

/* Posts one packet to pe through q; returns its position. `result_slot`: word 1 is this
 * packet's word of q->results (an AMO that fetches), not `local`. */
GPULMT_DEV gpulmt_u64 gpulmt_gio_post(const gpulmt_gio_sq *q, int pe, gpulmt_u32 op, gpulmt_u32 flags,
                                      gpulmt_u32 variant, gpulmt_u64 local, int result_slot, gpulmt_u64 remote,
                                      gpulmt_u64 size, gpulmt_u64 arg0, gpulmt_u64 arg1)
{
    gpulmt_u32 target = (gpulmt_u32)((const gpulmt_i32 *)q->target_of_pe)[pe];
    /* Fence marks (protocols: gio::FenceMarks): the first op to a target after a fence
     * carries FENCE when an op to that target came before it. */
    gpulmt_u32 epoch = *(volatile const gpulmt_u32 *)q->fence_epoch + 1u;
    gpulmt_u32 prev = atomicExch((unsigned *)q->fence_epoch_of_pe + pe, epoch);
    /* A NOP orders nothing, and the proxy refuses FENCE on it. */
    if (prev != 0u && prev < epoch && op != GPULMT_GIO_OP_NOP) {
        flags |= GPULMT_GIO_FLAG_FENCE;
    }
    gpulmt_u64 pos = atomicAdd((unsigned long long *)q->reserve, 1ull);
    /* Credits: the slot is free once the proxy took the packet of the previous lap. The
     * acquire orders our writes to the slot after the proxy's reads of the old packet. */
    while (pos >= gpulmt_ld_acquire_sys((const gpulmt_u64 *)q->head) + q->slots) {
    }
    /* The slot's result word is this lap's once the previous lap's op released it (a
     * fetching AMO after reading its result, any other op at once): ring slots are
     * recycled when the proxy takes a packet, and without this a later AMO's result could
     * land on the word before the earlier AMO's thread read it. Acquire: that read is
     * ordered before this packet's commit, so before the proxy's next write of the word. */
    gpulmt_u64 *freed = (gpulmt_u64 *)q->result_free + (pos & (q->slots - 1ull));
    while (gpulmt_ld_acquire_gpu(freed) + q->slots <= pos) {
    }
    if (!result_slot) {
        gpulmt_st_release_gpu(freed, pos + 1ull);
    }
    gpulmt_u64 *slot = (gpulmt_u64 *)(q->ring + (pos & (q->slots - 1ull)) * 64ull);
    slot[1] = result_slot ? q->results + (pos & (q->slots - 1ull)) * 8ull : local;
    slot[2] = remote;
    slot[3] = size;
    slot[4] = arg0;
    slot[5] = arg1;
    slot[7] = pos; /* the cookie: the position, echoed in the proxy's logs */
    /* The commit word last, with release at system scope: the proxy's acquire load of
     * word 0 sees the whole packet or the previous lap's (seed 000, section 4: the
     * consumer must never read a half-written command; GPU stores are otherwise unordered
     * on their way to host memory). */
    gpulmt_st_release_sys(slot, gpulmt_gio_commit_word(pos, q->slots, op, flags, variant, target));
    /* The doorbell (max: the block's threads commit in any order); release, so a proxy
     * that reads it finds the packet committed. */
    asm volatile("red.release.sys.max.u64 [%0], %1;" ::"l"(q->doorbell), "l"(pos + 1ull) : "memory");
    return pos;
}

/* Waits until the op at pos has completed. Acquire: what the proxy wrote for it (a get's
 * data, an AMO's result) is visible after. */
GPULMT_DEV void gpulmt_gio_wait(const gpulmt_gio_sq *q, gpulmt_u64 pos)
{
    while (gpulmt_ld_acquire_sys((const gpulmt_u64 *)q->cq_done) <= pos) {
    }
}

/* An op to a PE this process does not map: through the block's queue when it reaches pe,
 * else rejected. Returns the position, or ~0 when rejected. */
GPULMT_DEV gpulmt_u64 gpulmt_queue_op(gpulmt_u32 check_op, const void *sym, int pe, gpulmt_u32 op, gpulmt_u32 flags,
                                      gpulmt_u32 variant, gpulmt_u64 local, int result_slot, gpulmt_u64 size,
                                      gpulmt_u64 arg0, gpulmt_u64 arg1, int wait)
{
    const gpulmt_gio_sq *q = gpulmt_gio_my_sq();
    if (!q || ((const gpulmt_i32 *)q->target_of_pe)[pe] < 0) {
        gpulmt_reject(check_op, pe, sym, size);
        return ~0ull;
    }
    /* The proxy reads a put's source (writes a get's destination) on the host after this
     * call: a thread's local variables and shared memory have no address there (the proxy
     * would copy from a wrong one), so the queue path takes global memory only (the heap,
     * cudaMalloc'd or mapped host memory), as NVSHMEM's proxy transports take registered
     * memory. Rejected as an access error, never posted. */
    if ((flags & (GPULMT_GIO_FLAG_SRC_DEVICE | GPULMT_GIO_FLAG_DST_DEVICE)) && size > 0 && local
        && !__isGlobal((const void *)local)) {
        gpulmt_reject(check_op, pe, sym, size);
        return ~0ull;
    }
    gpulmt_u64 pos = gpulmt_gio_post(q, pe, op, flags, variant, local, result_slot,
                                     (gpulmt_u64)sym - gpulmt_dctx.heap_base, size, arg0, arg1);
    if (wait) {
        gpulmt_gio_wait(q, pos);
    }
    return pos;
}

/* ---- Ordering and completion ------------------------------------------------------------ */

/* Orders this thread's earlier puts, AMOs and signals to each PE before its later ones to
 * the same PE (not its gets; not other threads'). Direct path: a system-scope fence.
 * Queue path: the next op to each target waits at the proxy for the earlier ones. */
GPULMT_DEV void gpulmt_fence(void)
{
    gpulmt_fence_sys();
    const gpulmt_gio_sq *q = gpulmt_gio_my_sq();
    if (q) {
        atomicAdd((unsigned *)q->fence_epoch, 1u);
    }
}

/* Completes this thread's earlier operations to every PE: ordered before anything it
 * does next, at system scope (direct path), and acknowledged by their targets (queue
 * path: waits for every op of the block's queue posted so far). Other blocks' operations
 * are not waited for. */
GPULMT_DEV void gpulmt_quiet(void)
{
    /* Direct path: the stores are in the memory system; the fence makes them visible
     * before any later operation of this thread (a flag, a signal) at system scope. */
    gpulmt_fence_sys();
    const gpulmt_gio_sq *q = gpulmt_gio_my_sq();
    if (q) {
        gpulmt_u64 until = *(volatile const gpulmt_u64 *)q->reserve;
        while (gpulmt_ld_acquire_sys((const gpulmt_u64 *)q->cq_done) < until) {
        }
    }
}

/* ---- Put, get, put_signal ---------------------------------------------------------------- */

/* The body of every put: the group's share of the copy (direct) or the leader's packet. */
GPULMT_DEV void gpulmt_put_group(void *dst, const void *src, size_t n, int pe, unsigned t, unsigned nt, int wait)
{
    if (!gpulmt_check(GPULMT_OP_PUT, dst, n, pe)) {
        return;
    }
    gpulmt_u64 to = gpulmt_direct(dst, pe);
    if (to) {
        gpulmt_copy((char *)to, (const char *)src, n, t, nt, 0);
    } else if (t == 0) {
        gpulmt_queue_op(GPULMT_OP_PUT, dst, pe, GPULMT_GIO_OP_PUT, GPULMT_GIO_FLAG_SRC_DEVICE, 0, (gpulmt_u64)src, 0, n,
                        0, 0, wait);
    }
}

/* put: n bytes at src (this thread's memory) to pe's copy of the symmetric dst. Returns
 * when src may be reused; complete at quiet. put_nbi: src must stay unchanged until
 * quiet (the queue path reads it later; the direct path has copied it already). */
GPULMT_DEV void gpulmt_put(void *dst, const void *src, size_t n, int pe) { gpulmt_put_group(dst, src, n, pe, 0, 1, 1); }
GPULMT_DEV void gpulmt_put_nbi(void *dst, const void *src, size_t n, int pe) { gpulmt_put_group(dst, src, n, pe, 0, 1, 0); }
GPULMT_DEV void gpulmt_put_warp(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_put_group(dst, src, n, pe, gpulmt_lane(), 32, 1);
    __syncwarp(); /* src reusable by every lane */
}
GPULMT_DEV void gpulmt_put_nbi_warp(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_put_group(dst, src, n, pe, gpulmt_lane(), 32, 0);
}
GPULMT_DEV void gpulmt_put_block(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_put_group(dst, src, n, pe, gpulmt_block_thread(), gpulmt_block_threads(), 1);
    __syncthreads(); /* src reusable by every thread */
}
GPULMT_DEV void gpulmt_put_nbi_block(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_put_group(dst, src, n, pe, gpulmt_block_thread(), gpulmt_block_threads(), 0);
}

/* The body of every get. */
GPULMT_DEV void gpulmt_get_group(void *dst, const void *src, size_t n, int pe, unsigned t, unsigned nt, int wait)
{
    if (!gpulmt_check(GPULMT_OP_GET, src, n, pe)) {
        return;
    }
    gpulmt_u64 from = gpulmt_direct(src, pe);
    if (from) {
        gpulmt_copy((char *)dst, (const char *)from, n, t, nt, 1);
    } else if (t == 0) {
        gpulmt_queue_op(GPULMT_OP_GET, src, pe, GPULMT_GIO_OP_GET, GPULMT_GIO_FLAG_DST_DEVICE, 0, (gpulmt_u64)dst, 0, n,
                        0, 0, wait);
    }
}

/* get: n bytes of pe's copy of the symmetric src into dst; the data is in dst on return
 * (for the whole group after a _warp/_block call). get_nbi: in dst after quiet. */
GPULMT_DEV void gpulmt_get(void *dst, const void *src, size_t n, int pe) { gpulmt_get_group(dst, src, n, pe, 0, 1, 1); }
GPULMT_DEV void gpulmt_get_nbi(void *dst, const void *src, size_t n, int pe) { gpulmt_get_group(dst, src, n, pe, 0, 1, 0); }
GPULMT_DEV void gpulmt_get_warp(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_get_group(dst, src, n, pe, gpulmt_lane(), 32, 1);
    __syncwarp(); /* every lane's share is in dst for the whole warp */
}
GPULMT_DEV void gpulmt_get_nbi_warp(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_get_group(dst, src, n, pe, gpulmt_lane(), 32, 0);
}
GPULMT_DEV void gpulmt_get_block(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_get_group(dst, src, n, pe, gpulmt_block_thread(), gpulmt_block_threads(), 1);
    __syncthreads(); /* every thread's share is in dst for the whole block */
}
GPULMT_DEV void gpulmt_get_nbi_block(void *dst, const void *src, size_t n, int pe)
{
    gpulmt_get_group(dst, src, n, pe, gpulmt_block_thread(), gpulmt_block_threads(), 0);
}

/* Whether sig is an aligned signal word of the heap (a rejected one is recorded). */
GPULMT_DEV int gpulmt_check_word(gpulmt_u32 op, const void *sig, int pe)
{
    if (((gpulmt_u64)sig & 7ull) != 0) {
        gpulmt_reject(op, pe, sig, 8);
        return 0;
    }
    return gpulmt_check(op, sig, 8, pe);
}

/* Updates pe's copy of the signal word sig: set or add value, with release (direct) or
 * as a 0-byte PUT_SIGNAL packet (queue). Ordered after this thread's earlier writes. */
GPULMT_DEV void gpulmt_signal_op(gpulmt_u64 *sig, gpulmt_u64 value, int op, int pe)
{
    if (!gpulmt_check_word(GPULMT_OP_SIGNAL, sig, pe)) {
        return;
    }
    gpulmt_u64 to = gpulmt_direct(sig, pe);
    if (to) {
        gpulmt_signal_release((gpulmt_u64 *)to, value, op);
    } else {
        gpulmt_queue_op(GPULMT_OP_SIGNAL, sig, pe, GPULMT_GIO_OP_PUT_SIGNAL, 0, (gpulmt_u32)op, 0, 0, 0,
                        (gpulmt_u64)sig - gpulmt_dctx.heap_base, value, 0);
    }
}

/* The body of every put_signal: the data, the group's barrier, the leader's signal. */
GPULMT_DEV void gpulmt_put_signal_group(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value,
                                        int op, int pe, unsigned t, unsigned nt, int wait, int group)
{
    if (!gpulmt_check(GPULMT_OP_PUT_SIGNAL, dst, n, pe) || !gpulmt_check_word(GPULMT_OP_PUT_SIGNAL, sig, pe)) {
        return;
    }
    gpulmt_u64 to = gpulmt_direct(dst, pe);
    if (to) {
        gpulmt_copy((char *)to, (const char *)src, n, t, nt, 0);
        /* Every thread's share is written before the leader signals: the group barrier
         * (bar.sync / bar.warp.sync, ordering memory among its threads) puts them before
         * the leader's release in causality order, and the release is cumulative, so a PE
         * that sees the signal and acquires sees all the data. */
        if (group == 2) {
            __syncthreads();
        } else if (group == 1) {
            __syncwarp();
        }
        if (t == 0) {
            gpulmt_signal_release((gpulmt_u64 *)gpulmt_direct(sig, pe), value, op);
        }
    } else if (t == 0) {
        /* One packet: the proxy writes the data, then the signal (protocols: PUT_SIGNAL). */
        gpulmt_queue_op(GPULMT_OP_PUT_SIGNAL, dst, pe, GPULMT_GIO_OP_PUT_SIGNAL, GPULMT_GIO_FLAG_SRC_DEVICE,
                        (gpulmt_u32)op, (gpulmt_u64)src, 0, n, (gpulmt_u64)sig - gpulmt_dctx.heap_base, value, wait);
    }
}

/* put_signal: put, then update pe's signal word sig (set or add value): a PE that sees
 * the signal's new value and then reads the data (after signal_wait_until) sees all of
 * it. Blocking: src reusable on return; _nbi: src unchanged until quiet. */
GPULMT_DEV void gpulmt_put_signal(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value, int op, int pe)
{
    gpulmt_put_signal_group(dst, src, n, sig, value, op, pe, 0, 1, 1, 0);
}
GPULMT_DEV void gpulmt_put_signal_nbi(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value, int op,
                                      int pe)
{
    gpulmt_put_signal_group(dst, src, n, sig, value, op, pe, 0, 1, 0, 0);
}
GPULMT_DEV void gpulmt_put_signal_warp(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value, int op,
                                       int pe)
{
    gpulmt_put_signal_group(dst, src, n, sig, value, op, pe, gpulmt_lane(), 32, 1, 1);
    __syncwarp();
}
GPULMT_DEV void gpulmt_put_signal_nbi_warp(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value,
                                           int op, int pe)
{
    gpulmt_put_signal_group(dst, src, n, sig, value, op, pe, gpulmt_lane(), 32, 0, 1);
}
GPULMT_DEV void gpulmt_put_signal_block(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value, int op,
                                        int pe)
{
    gpulmt_put_signal_group(dst, src, n, sig, value, op, pe, gpulmt_block_thread(), gpulmt_block_threads(), 1, 2);
    __syncthreads();
}
GPULMT_DEV void gpulmt_put_signal_nbi_block(void *dst, const void *src, size_t n, gpulmt_u64 *sig, gpulmt_u64 value,
                                            int op, int pe)
{
    gpulmt_put_signal_group(dst, src, n, sig, value, op, pe, gpulmt_block_thread(), gpulmt_block_threads(), 0, 2);
}

/* A rectangle of rows x width bytes from src (rows spitch bytes apart) into pe's copy of
 * the symmetric dst (rows dpitch bytes apart), by the whole block: a halo column of a 2D
 * grid in one call. Nonblocking: src unchanged until quiet (or the signal of
 * gpulmt_put2d_signal_block). */
GPULMT_DEV void gpulmt_put2d_nbi_block(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                       size_t rows, int pe)
{
    if (rows == 0 || width == 0) {
        return;
    }
    if (!gpulmt_check(GPULMT_OP_PUT, dst, (gpulmt_u64)(rows - 1) * dpitch + width, pe)) {
        return;
    }
    gpulmt_u64 to = gpulmt_direct(dst, pe);
    unsigned t = gpulmt_block_thread(), nt = gpulmt_block_threads();
    if (!to) {
        for (size_t r = 0; r < rows; r++) { /* one PUT packet a row */
            if (t == 0) {
                gpulmt_queue_op(GPULMT_OP_PUT, (const char *)dst + r * dpitch, pe, GPULMT_GIO_OP_PUT,
                                GPULMT_GIO_FLAG_SRC_DEVICE, 0, (gpulmt_u64)src + r * spitch, 0, width, 0, 0, 0);
            }
        }
        return;
    }
    /* The widest word that divides both ends, both pitches and the width. */
    gpulmt_u64 all = to | (gpulmt_u64)src | dpitch | spitch | width;
    unsigned w = (all & 15) == 0 ? 16 : (all & 7) == 0 ? 8 : (all & 3) == 0 ? 4 : 1;
    gpulmt_u64 per_row = width / w, total = per_row * rows;
    for (gpulmt_u64 i = t; i < total; i += nt) {
        gpulmt_u64 r = i / per_row, c = (i % per_row) * w;
        char *d = (char *)to + r * dpitch + c;
        const char *s = (const char *)src + r * spitch + c;
        if (w == 16) {
            *(uint4 *)d = *(const uint4 *)s;
        } else if (w == 8) {
            *(gpulmt_u64 *)d = *(const gpulmt_u64 *)s;
        } else if (w == 4) {
            *(gpulmt_u32 *)d = *(const gpulmt_u32 *)s;
        } else {
            *d = *s;
        }
    }
}

/* gpulmt_put2d_nbi_block, then the signal update (by thread 0 after the block's barrier,
 * as put_signal_block). On the queue path the rows go as PUTs and the signal as a fenced
 * 0-byte PUT_SIGNAL. */
GPULMT_DEV void gpulmt_put2d_signal_block(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                                          size_t rows, gpulmt_u64 *sig, gpulmt_u64 value, int op, int pe)
{
    gpulmt_put2d_nbi_block(dst, dpitch, src, spitch, width, rows, pe);
    __syncthreads(); /* see gpulmt_put_signal_group: the release below is cumulative */
    if (gpulmt_block_thread() == 0) {
        if (pe >= 0 && pe < gpulmt_dctx.n_pes && !gpulmt_direct(sig, pe)) {
            gpulmt_fence(); /* queue path: the signal's packet waits for the rows' */
        }
        gpulmt_signal_op(sig, value, op, pe);
    }
    __syncthreads();
}

/* ---- Signals and atomics ---------------------------------------------------------------------- */

/* This PE's signal word sig, read atomically (relaxed: no ordering). */
GPULMT_DEV gpulmt_u64 gpulmt_signal_fetch(const gpulmt_u64 *sig)
{
    return gpulmt_check_word(GPULMT_OP_SIGNAL, sig, gpulmt_dctx.my_pe) ? gpulmt_ld_relaxed_sys(sig) : 0;
}

GPULMT_DEV int gpulmt_cmp(gpulmt_u64 seen, int cmp, gpulmt_u64 value)
{
    switch (cmp) {
    case GPULMT_CMP_EQ: return seen == value;
    case GPULMT_CMP_NE: return seen != value;
    case GPULMT_CMP_GT: return seen > value;
    case GPULMT_CMP_GE: return seen >= value;
    case GPULMT_CMP_LT: return seen < value;
    default: return seen <= value;
    }
}

/* Waits until this PE's signal word sig compares (GPULMT_CMP_*) true against value;
 * returns the value seen. Afterwards this thread sees every write the signalling PE made
 * before its signal (put_signal's data). */
GPULMT_DEV gpulmt_u64 gpulmt_signal_wait_until(gpulmt_u64 *sig, int cmp, gpulmt_u64 value)
{
    if (!gpulmt_check_word(GPULMT_OP_SIGNAL, sig, gpulmt_dctx.my_pe)) {
        return 0;
    }
    gpulmt_u64 seen;
    /* Acquire loads at system scope: the one that sees the awaited value synchronizes with
     * the release that wrote it (put_signal's), so the data published before that signal
     * is visible to this thread's later loads, and this SM's L1 holds no stale line of it.
     * Cheaper at the moment it matters than relaxed polling and a fence after it: no
     * wait for this thread's own outstanding stores. */
    do {
        seen = gpulmt_ld_acquire_sys(sig);
    } while (!gpulmt_cmp(seen, cmp, value));
    return seen;
}

/* The body of the 64-bit atomics on pe's copy of the symmetric word dst. Direct path:
 * relaxed atomics at system scope (atomic among all PEs' atomics on the word; unordered,
 * as NVSHMEM's: use fence or quiet to order them). Queue path: an AMO packet; the
 * fetching ones wait for the result. */
GPULMT_DEV gpulmt_u64 gpulmt_amo(gpulmt_u64 *dst, gpulmt_u32 amo, gpulmt_u64 operand, gpulmt_u64 compare, int fetch,
                                 int pe)
{
    if (!gpulmt_check_word(GPULMT_OP_ATOMIC, dst, pe)) {
        return 0;
    }
    gpulmt_u64 to = gpulmt_direct(dst, pe);
    if (to) {
        gpulmt_u64 *w = (gpulmt_u64 *)to;
        switch (amo) {
        case GPULMT_GIO_AMO_FETCH_ADD: return gpulmt_atom_add_sys(w, operand);
        case GPULMT_GIO_AMO_COMPARE_SWAP: return gpulmt_atom_cas_sys(w, compare, operand);
        case GPULMT_GIO_AMO_SET: return gpulmt_atom_exch_sys(w, operand);
        default: return gpulmt_ld_relaxed_sys(w);
        }
    }
    /* The result word is in q->results, pinned host memory: no DST_DEVICE. */
    gpulmt_u64 pos =
        gpulmt_queue_op(GPULMT_OP_ATOMIC, dst, pe, GPULMT_GIO_OP_AMO, 0, amo, 0, fetch, 8, operand, compare, fetch);
    if (!fetch || pos == ~0ull) {
        return 0;
    }
    const gpulmt_gio_sq *q = gpulmt_gio_my_sq();
    gpulmt_u64 old = *(volatile const gpulmt_u64 *)(q->results + (pos & (q->slots - 1ull)) * 8ull);
    /* Release: the read above happens before the next lap's op may use the word. */
    gpulmt_st_release_gpu((gpulmt_u64 *)q->result_free + (pos & (q->slots - 1ull)), pos + 1ull);
    return old;
}

GPULMT_DEV gpulmt_u64 gpulmt_atomic_fetch_add(gpulmt_u64 *dst, gpulmt_u64 value, int pe)
{
    return gpulmt_amo(dst, GPULMT_GIO_AMO_FETCH_ADD, value, 0, 1, pe);
}
GPULMT_DEV void gpulmt_atomic_add(gpulmt_u64 *dst, gpulmt_u64 value, int pe)
{
    gpulmt_amo(dst, GPULMT_GIO_AMO_FETCH_ADD, value, 0, 0, pe);
}
/* Stores value where the word equals cond; returns the old value. */
GPULMT_DEV gpulmt_u64 gpulmt_atomic_compare_swap(gpulmt_u64 *dst, gpulmt_u64 cond, gpulmt_u64 value, int pe)
{
    return gpulmt_amo(dst, GPULMT_GIO_AMO_COMPARE_SWAP, value, cond, 1, pe);
}
/* Stores value atomically; returns the old value (direct path; 0 on the queue path). */
GPULMT_DEV gpulmt_u64 gpulmt_atomic_swap(gpulmt_u64 *dst, gpulmt_u64 value, int pe)
{
    return gpulmt_amo(dst, GPULMT_GIO_AMO_SET, value, 0, 0, pe);
}
GPULMT_DEV void gpulmt_atomic_set(gpulmt_u64 *dst, gpulmt_u64 value, int pe)
{
    gpulmt_amo(dst, GPULMT_GIO_AMO_SET, value, 0, 0, pe);
}
GPULMT_DEV gpulmt_u64 gpulmt_atomic_fetch(gpulmt_u64 *dst, int pe)
{
    return gpulmt_amo(dst, GPULMT_GIO_AMO_FETCH, 0, 0, 1, pe);
}

/* ---- Barriers ------------------------------------------------------------------------------ */

/* A barrier of every block of this kernel's grid, and a gpu-scope acquire/release among
 * them. LAUNCH REQUIREMENT: every block resident at once (a cooperative launch, or a
 * persistent grid no larger than the occupancy allows, shared with the kernels of the
 * other ranks on this GPU), and one such kernel at a time per PE (the words live in the
 * PE's heap). */
GPULMT_DEV void gpulmt_sync_grid(void)
{
    gpulmt_require_ctx();
    __syncthreads();
    if (gpulmt_block_thread() == 0) {
        gpulmt_u64 *count = gpulmt_ctrl(GPULMT_CTRL_GRID_COUNT), *gen = gpulmt_ctrl(GPULMT_CTRL_GRID_GENERATION);
        gpulmt_u64 blocks = (gpulmt_u64)gridDim.x * gridDim.y * gridDim.z;
        /* Read before arriving: the generation cannot move until this block arrives. */
        gpulmt_u64 g = gpulmt_ld_acquire_gpu(gen);
        gpulmt_u64 arrived;
        /* acq_rel: publishes this block's writes (gathered by __syncthreads) to the block
         * that completes the barrier, and takes the earlier arrivals'. */
        asm volatile("atom.acq_rel.gpu.add.u64 %0, [%1], 1;" : "=l"(arrived) : "l"(count) : "memory");
        if (arrived + 1 == blocks) {
            *(volatile gpulmt_u64 *)count = 0; /* before the release below: the next barrier starts at 0 */
            asm volatile("st.release.gpu.u64 [%0], %1;" ::"l"(gen), "l"(g + 1) : "memory");
        } else {
            while (gpulmt_ld_acquire_gpu(gen) == g) {
            }
        }
    }
    __syncthreads();
}

/* A barrier of every PE, called by every thread of ONE block per PE: when it returns,
 * every PE's operations issued before it are complete and visible (quiet + sync). */
GPULMT_DEV void gpulmt_barrier_all_block(void)
{
    gpulmt_require_ctx();
    __syncthreads();
    if (gpulmt_block_thread() == 0) {
        gpulmt_quiet();
        /* Every block's queue, not only this one's: barrier_all follows a grid barrier,
         * so the other blocks' operations are posted, and they must be complete too. */
        const gpulmt_gio_queues *qs = (const gpulmt_gio_queues *)gpulmt_dctx.queues;
        for (gpulmt_u32 i = 0; qs && i < qs->n_sq; i++) {
            const gpulmt_gio_sq *q = (const gpulmt_gio_sq *)qs->sq + i;
            gpulmt_u64 until = *(volatile const gpulmt_u64 *)q->reserve;
            while (gpulmt_ld_acquire_sys((const gpulmt_u64 *)q->cq_done) < until) {
            }
        }
        gpulmt_u64 *epoch = gpulmt_ctrl(GPULMT_CTRL_BARRIER_EPOCH);
        gpulmt_u64 e = *epoch + 1; /* only this thread of this PE touches it */
        *epoch = e;
        int n = gpulmt_dctx.n_pes, me = gpulmt_dctx.my_pe;
        gpulmt_u64 *arrivals = gpulmt_ctrl(GPULMT_CTRL_BARRIER_ARRIVALS_AT(n));
        for (int pe = 0; pe < n; pe++) {
            /* This PE's word at pe: one writer, so a store, not an add (an add would cost
             * an off-node PE's proxy a round trip through the target GPU's copy server). */
            gpulmt_u64 to = gpulmt_direct(&arrivals[me], pe);
            if (to) {
                /* Release: this block's writes before the barrier (cumulative after the
                 * __syncthreads) are visible to a PE that sees this epoch and acquires. */
                asm volatile("st.release.sys.u64 [%0], %1;" ::"l"(to), "l"(e) : "memory");
            } else {
                /* The proxy writes it after this PE's earlier operations to pe (quiet above). */
                gpulmt_queue_op(GPULMT_OP_SIGNAL, &arrivals[me], pe, GPULMT_GIO_OP_PUT_SIGNAL, 0, GPULMT_SIGNAL_SET, 0,
                                0, 0, (gpulmt_u64)&arrivals[me] - gpulmt_dctx.heap_base, e, 0);
            }
        }
        /* Every PE's e-th arrival: each word reaches e (epochs only grow). Acquire, as in
         * signal_wait_until, pairs with the arrival's release. */
        for (int pe = 0; pe < n; pe++) {
            while (gpulmt_ld_acquire_sys(&arrivals[pe]) < e) {
            }
        }
    }
    __syncthreads();
}

/* A barrier of every PE, called by every thread of every block of the grid (the launch
 * requirement of gpulmt_sync_grid). */
GPULMT_DEV void gpulmt_barrier_all(void)
{
    gpulmt_sync_grid();
    if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
        gpulmt_barrier_all_block();
    }
    gpulmt_sync_grid();
}

#endif /* device code */
#endif /* GPULMT_DEVICE_CUH */
