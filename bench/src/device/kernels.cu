// The device API's conformance checks and benchmarks (device_check). NVRTC compiles this
// behind include/gpulmt_device.cuh (gpulmt::sym::nvrtc). Every PE runs the same kernel at
// once; a ring (PE p sends to p+1) makes each check work with any number of PEs.
//
// Each check writes its verdict into `res`, device memory of its own PE:
//   res[0] mismatches (data or values that broke the guarantee under test)
//   res[1] waits that timed out (TIMEOUT_NS: a hang becomes a FAIL line)
//   res[2..] what the host needs for totals (documented per kernel).

#define TIMEOUT_NS 10000000000ull

__device__ unsigned long long now_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Waits until this PE's signal word reaches at least v; then gpulmt_signal_wait_until,
// which returns at once, gives the acquire the check relies on. 0 on timeout.
__device__ int wait_ge(unsigned long long *sig, unsigned long long v, unsigned long long *res)
{
    unsigned long long t0 = now_ns();
    while (gpulmt_signal_fetch(sig) < v) {
        if (now_ns() - t0 > TIMEOUT_NS) {
            atomicAdd(&res[1], 1ull);
            return 0;
        }
    }
    gpulmt_signal_wait_until(sig, GPULMT_CMP_GE, v);
    return 1;
}

// A volatile read of a word of this PE's heap that peers write.
__device__ unsigned long long peek(const unsigned long long *p) { return *(volatile const unsigned long long *)p; }

// fence orders a put before a later put of the flag to the same PE. Block 0 sends rounds
// 1..iters to the next PE: 8 data words = i, fence, flag = i. Block 1 watches its own
// flag (from the previous PE) race ahead: whenever it sees flag f, every data word must
// be at least f (the sender never waits, so it may already be past f).
extern "C" __global__ void fence_flag(unsigned long long *data, unsigned long long *flag, int iters,
                                      unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes();
    if (threadIdx.x != 0) {
        return;
    }
    if (blockIdx.x == 0) {
        int peer = (me + 1) % n;
        /* The sources live in the heap (data[8..16] and data[16], written only here): the
         * queue path to an off-node PE takes global memory only, not local variables. */
        unsigned long long *v = data + 8, *fv = data + 16;
        for (unsigned long long i = 1; i <= (unsigned long long)iters; i++) {
            for (int k = 0; k < 8; k++) {
                v[k] = i;
            }
            *fv = i;
            gpulmt_put(data, v, 8 * sizeof *v, peer);
            gpulmt_fence();
            gpulmt_put(flag, fv, 8, peer);
        }
        return;
    }
    unsigned long long last = 0, t0 = now_ns();
    while (last < (unsigned long long)iters) {
        unsigned long long f = gpulmt_signal_fetch(flag);
        if (f == last) {
            if (now_ns() - t0 > TIMEOUT_NS) {
                res[1]++;
                return;
            }
            continue;
        }
        gpulmt_signal_wait_until(flag, GPULMT_CMP_GE, f); // the acquire after seeing f
        for (int k = 0; k < 8; k++) {
            if (peek(&data[k]) < f) {
                res[0]++;
            }
        }
        last = f;
        res[2]++; // distinct flags seen
    }
}

// quiet completes puts to every PE: each round, one block puts SLOT bytes of value r into
// its slot at every other PE (nbi), quiets, and then sets its flag there with a RELAXED
// atomic (which orders nothing by itself: only the quiet puts the data first). Each PE
// waits for every flag, checks every slot, and the PEs meet at barrier_all_block.
extern "C" __global__ void quiet_all(unsigned long long *slots, unsigned long long *src, unsigned long long *flags,
                                     int slot_words, int rounds, unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes();
    for (unsigned long long r = 1; r <= (unsigned long long)rounds; r++) {
        for (int k = threadIdx.x; k < slot_words; k += blockDim.x) {
            src[k] = r;
        }
        __syncthreads();
        for (int q = 0; q < n; q++) {
            if (q != me) {
                gpulmt_put_nbi_block(slots + (size_t)me * slot_words, src, (size_t)slot_words * 8, q);
            }
        }
        __syncthreads(); // every thread's stores observed by thread 0 before its quiet
        if (threadIdx.x == 0) {
            gpulmt_quiet();
            for (int q = 0; q < n; q++) {
                if (q != me) {
                    gpulmt_atomic_set(&flags[me], r, q);
                }
            }
            for (int q = 0; q < n; q++) {
                if (q != me) {
                    wait_ge(&flags[q], r, res);
                }
            }
        }
        __syncthreads();
        for (int q = 0; q < n; q++) {
            for (int k = threadIdx.x; q != me && k < slot_words; k += blockDim.x) {
                if (peek(&slots[(size_t)q * slot_words + k]) != r) {
                    atomicAdd(&res[0], 1ull);
                }
            }
        }
        gpulmt_barrier_all_block(); // nobody refills a slot someone still checks
    }
}

// The sizes put_signal_race cycles through (multiples of 8: the data are u64 words).
__device__ unsigned long long race_size(unsigned long long i)
{
    const unsigned long long sizes[6] = {8, 24, 520, 4096, 65536, 262144};
    return sizes[i % 6];
}

// put_signal never shows the signal before the data. Block 0 sends iteration i (words of
// value i, the size cycling, by a thread, a warp or the block in turn, the signal added
// or set) to the next PE and waits for its ack. Block 1 waits for the signal, checks the
// exact data, acks. Block 2 races: it reads the signal with no flow control and checks
// that the data it then reads are at least that iteration's.
extern "C" __global__ void put_signal_race(unsigned long long *buf, unsigned long long *src, unsigned long long *sig,
                                           unsigned long long *ack, int iters, unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
    unsigned long long last = (unsigned long long)iters;
    if (blockIdx.x == 0) {
        for (unsigned long long i = 1; i <= last; i++) {
            unsigned long long size = race_size(i), words = size / 8;
            for (unsigned long long k = threadIdx.x; k < words; k += blockDim.x) {
                src[k] = i;
            }
            __syncthreads();
            int how = (int)(i % 3), op = (i & 4) ? GPULMT_SIGNAL_ADD : GPULMT_SIGNAL_SET;
            unsigned long long value = op == GPULMT_SIGNAL_ADD ? 1 : i; // ADD: the signal was i - 1
            if (how == 0 && threadIdx.x == 0) {
                gpulmt_put_signal(buf, src, size, sig, value, op, next);
            } else if (how == 1 && threadIdx.x < 32) {
                gpulmt_put_signal_warp(buf, src, size, sig, value, op, next);
            } else if (how == 2) {
                gpulmt_put_signal_block(buf, src, size, sig, value, op, next);
            }
            if (threadIdx.x == 0) {
                wait_ge(ack, i, res);
            }
            __syncthreads();
        }
    } else if (blockIdx.x == 1) {
        for (unsigned long long i = 1; i <= last; i++) {
            if (threadIdx.x == 0) {
                wait_ge(sig, i, res);
            }
            __syncthreads();
            unsigned long long words = race_size(i) / 8;
            for (unsigned long long k = threadIdx.x; k < words; k += blockDim.x) {
                if (peek(&buf[k]) != i) {
                    atomicAdd(&res[0], 1ull);
                }
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                gpulmt_signal_op(ack, i, GPULMT_SIGNAL_SET, prev);
            }
        }
    } else if (threadIdx.x == 0) {
        unsigned long long seen = 0, t0 = now_ns();
        while (seen < last && now_ns() - t0 < TIMEOUT_NS) {
            unsigned long long s = gpulmt_signal_fetch(sig);
            if (s == 0 || s == seen) {
                continue;
            }
            gpulmt_signal_wait_until(sig, GPULMT_CMP_GE, s);
            unsigned long long words = race_size(s) / 8;
            if (peek(&buf[0]) < s || peek(&buf[words - 1]) < s) {
                res[0]++;
            }
            seen = s;
            res[2]++; // signals the racer saw
        }
    }
}

// Concurrent atomics give exact totals. Every thread of every block makes k fetch-adds of
// 1, the j-th on PE (me + j) % n's counter (k a multiple of n, so each PE's counter gets
// blocks * threads * k in all), adding the old values it got into res[2 + target]: over
// all PEs those sums must be 0 + 1 + ... + (total - 1). Thread 0 of each block also takes
// a compare-swap lock on PE 0 `locked` times and increments a plain counter under it.
extern "C" __global__ void atomics(unsigned long long *words, int k, int locked, unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes();
    for (int j = 0; j < k; j++) {
        int t = (me + j) % n;
        unsigned long long old = gpulmt_atomic_fetch_add(&words[0], 1, t);
        atomicAdd(&res[2 + t], old);
    }
    if (threadIdx.x != 0) {
        return;
    }
    for (int j = 0; j < locked; j++) {
        unsigned long long t0 = now_ns();
        while (gpulmt_atomic_compare_swap(&words[1], 0, 1, 0) != 0) {
            if (now_ns() - t0 > TIMEOUT_NS) {
                res[1]++;
                return;
            }
        }
        gpulmt_fence(); // acquire: the previous holder's increment is visible
        unsigned long long v = gpulmt_atomic_fetch(&words[2], 0);
        gpulmt_atomic_set(&words[2], v + 1, 0);
        gpulmt_fence(); // the increment lands before the unlock (same PE)
        gpulmt_atomic_set(&words[1], 0, 0);
    }
}

// quiet in one block while others still have operations in flight. Blocks 2.. stream 1 MiB
// puts to the next PE until block 0 is done. Block 0, each round: puts 256 bytes of value
// r, quiets, sets the flag with a relaxed atomic, waits for the ack. Block 1 checks the
// 256 bytes when the flag says r, and acks. res[2]: the busy blocks' puts.
// The busy blocks end without a quiet, on purpose: across nodes up to a ring of their
// 1 MiB puts is still in flight when the kernel ends, and sym_free must complete them
// before the next check gets the same offsets (barrier_rounds, which runs last, found
// them landing in its fresh allocations before sym_free did: offnode_probe3).
extern "C" __global__ void quiet_busy(unsigned long long *small, unsigned long long *src, unsigned long long *flag,
                                      unsigned long long *ack, char *big, char *scratch, int rounds,
                                      unsigned long long *stop, unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes(), next = (me + 1) % n, prev = (me + n - 1) % n;
    const size_t chunk = 1 << 20;
    if (blockIdx.x >= 2) {
        unsigned long long puts = 0;
        while (*(volatile unsigned long long *)stop == 0) {
            gpulmt_put_nbi_block(big + (blockIdx.x - 2) * chunk, scratch, chunk, next);
            puts++;
        }
        if (threadIdx.x == 0) {
            atomicAdd(&res[2], puts);
        }
        return;
    }
    for (unsigned long long r = 1; r <= (unsigned long long)rounds; r++) {
        if (blockIdx.x == 0) {
            for (int k = threadIdx.x; k < 32; k += blockDim.x) {
                src[k] = r;
            }
            __syncthreads();
            gpulmt_put_nbi_block(small, src, 256, next);
            __syncthreads();
            if (threadIdx.x == 0) {
                gpulmt_quiet();
                gpulmt_atomic_set(flag, r, next);
                wait_ge(ack, r, res);
            }
            __syncthreads();
        } else {
            if (threadIdx.x == 0) {
                wait_ge(flag, r, res);
            }
            __syncthreads();
            for (int k = threadIdx.x; k < 32; k += blockDim.x) {
                if (peek(&small[k]) != r) {
                    atomicAdd(&res[0], 1ull);
                }
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                gpulmt_signal_op(ack, r, GPULMT_SIGNAL_SET, prev);
            }
        }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *(volatile unsigned long long *)stop = 1;
    }
}

// Accesses outside the heap are rejected by the device checks, and a valid one after
// them still works: past the heap's end, a PE outside the job, a misaligned atomic, a
// get from the control area, a signal straddling the end. Then one fetch-add of 1 on the
// next PE's `ok`. The host reads the record: 5 rejections, the first a put past the end.
extern "C" __global__ void out_of_heap(unsigned long long *ok, unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes(), next = (me + 1) % n;
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    char *end = (char *)gpulmt_dctx.heap_base + gpulmt_dctx.heap_size;
    unsigned long long v = 7, got = 0;
    gpulmt_put(end, &v, 8, next);
    gpulmt_put(ok, &v, 8, n);
    gpulmt_atomic_fetch_add((unsigned long long *)((char *)ok + 4), 1, next);
    gpulmt_get(&got, (char *)gpulmt_dctx.heap_base + 8, 8, next);
    gpulmt_put_signal(ok, &v, 8, (unsigned long long *)(end - 8) + 1, 1, GPULMT_SIGNAL_SET, next);
    gpulmt_atomic_fetch_add(ok, 1, next);
    res[2] = got; // the rejected get left it alone: 0
}

// barrier_all across the grid and the PEs, and get: each round every block writes its
// share of this PE's slot at every PE (nbi), barrier_all, every block checks its share of
// every slot here, block 0 also gets the next PE's slot of this PE, barrier_all again.
extern "C" __global__ void barrier_rounds(unsigned long long *slots, unsigned long long *src, int share, int rounds,
                                          unsigned long long *got, unsigned long long *res)
{
    int me = gpulmt_my_pe(), n = gpulmt_n_pes();
    int slot_words = share * gridDim.x;
    unsigned long long *mine = src + blockIdx.x * share;
    for (unsigned long long r = 1; r <= (unsigned long long)rounds; r++) {
        for (int k = threadIdx.x; k < share; k += blockDim.x) {
            mine[k] = r * 1000 + me;
        }
        __syncthreads();
        for (int q = 0; q < n; q++) {
            gpulmt_put_nbi_block(slots + (size_t)me * slot_words + blockIdx.x * share, mine, (size_t)share * 8, q);
        }
        gpulmt_barrier_all();
        for (int q = 0; q < n; q++) {
            for (int k = threadIdx.x; k < share; k += blockDim.x) {
                if (peek(&slots[(size_t)q * slot_words + blockIdx.x * share + k]) != r * 1000 + q) {
                    atomicAdd(&res[0], 1ull);
                }
            }
        }
        if (blockIdx.x == 0) {
            gpulmt_get_block(got, slots + (size_t)me * slot_words, (size_t)slot_words * 8, (me + 1) % n);
            for (int k = threadIdx.x; k < slot_words; k += blockDim.x) {
                if (got[k] != r * 1000 + me) {
                    atomicAdd(&res[0], 1ull);
                }
            }
        }
        gpulmt_barrier_all();
    }
}

// ---- Benchmarks (the NVSHMEM anchor's kernels, ../shared/device/peers/nvshmem_lat.cu) ----

// put_signal ping-pong of one block between PEs 0 and 1: PE 1 waits, answers; PE 0 sends,
// waits. Signal values continue from `base` across launches.
extern "C" __global__ void pingpong(char *dst, char *src, unsigned long long *sig, unsigned long long size, int iters,
                                    int base, int peer)
{
    int pe = gpulmt_my_pe();
    for (unsigned long long i = base + 1; i <= (unsigned long long)(base + iters); i++) {
        if (pe == 1) {
            if (threadIdx.x == 0) {
                gpulmt_signal_wait_until(sig, GPULMT_CMP_GE, i);
            }
            __syncthreads();
        }
        gpulmt_put_signal_nbi_block(dst, src, size, sig, i, GPULMT_SIGNAL_SET, peer);
        if (pe == 0) {
            if (threadIdx.x == 0) {
                gpulmt_signal_wait_until(sig, GPULMT_CMP_GE, i);
            }
            __syncthreads();
        }
    }
    if (threadIdx.x == 0) {
        gpulmt_quiet();
    }
}

// One block's put bandwidth: iters puts of size bytes, then quiet.
extern "C" __global__ void putbw(char *dst, char *src, unsigned long long size, int iters, int peer)
{
    for (int i = 0; i < iters; i++) {
        gpulmt_put_nbi_block(dst, src, size, peer);
    }
    if (threadIdx.x == 0) {
        gpulmt_quiet();
    }
}

// ---- Across nodes (the queue path): put+quiet latency and a queue push's trip to the proxy ----

// One thread: iters times an 8-byte (size) put_nbi to peer, then quiet: the queue path's
// put+quiet latency (the proxy carries each put, the target's proxy acknowledges it).
extern "C" __global__ void put_quiet_lat(char *dst, char *src, unsigned long long size, int iters, int peer)
{
    if (threadIdx.x != 0) {
        return;
    }
    for (int i = 0; i < iters; i++) {
        gpulmt_put_nbi(dst, src, size, peer);
        gpulmt_quiet();
    }
}

// One thread: iters NOP packets to peer through this block's queue, each waited for: the
// time from a push to the proxy's pop (a NOP completes when the proxy takes it), plus the
// completion counter's way back to the GPU. stamps[0..2]: globaltimer before and after.
extern "C" __global__ void gio_push_pop(int iters, int peer, unsigned long long *stamps)
{
    if (threadIdx.x != 0) {
        return;
    }
    const gpulmt_gio_sq *q = gpulmt_gio_my_sq();
    if (!q) {
        stamps[0] = stamps[1] = 0;
        return;
    }
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (int i = 0; i < iters; i++) {
        gpulmt_u64 pos = gpulmt_gio_post(q, peer, GPULMT_GIO_OP_NOP, 0, 0, 0, 0, 0, 0, 0, 0);
        gpulmt_gio_wait(q, pos);
    }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    stamps[0] = t0;
    stamps[1] = t1;
}
