/*
 * Point-to-point semantics of an MPI program run with libgpulmt_mpi.so preloaded:
 * plain MPI calls on buffers from gpulmt_mpi_alloc (device memory of the shim's
 * context: sim devices in CI, CUDA on GPUs) and malloc, with every byte checked.
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim ./p2p [thread]
 *
 * N >= 2; with "thread" the program starts MPI with MPI_Init_thread(FUNNELED), with
 * "multiple" with MPI_Init_thread(MULTIPLE) (the shim then keeps per-thread state).
 *
 * Built with -DP2P_CUDA_MALLOC (and the CUDA runtime: -lcudart), device buffers come
 * from cudaMalloc instead, as in an application that knows nothing of gpulmt; each
 * rank first selects GPU (node-local rank mod GPUs), the device the shim binds to.
 * Prints, per rank, "rank R counters ..." and "rank R ok checks=C" (or FAIL lines,
 * and then exits 1).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Not linked against the shim: its functions come from the preloaded library. */
#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

#ifdef P2P_CUDA_MALLOC
#include <cuda_runtime.h>
static void *dev_alloc(size_t n) {
  void *p = NULL;
  return cudaMalloc(&p, n) == cudaSuccess ? p : NULL;
}
static int dev_free(void *p) { return cudaFree(p) == cudaSuccess ? 0 : -1; }
static int dev_memcpy(void *dst, const void *src, size_t n) {
  return cudaMemcpy(dst, src, n, cudaMemcpyDefault) == cudaSuccess ? 0 : -1;
}
static void select_gpu(void) {
  MPI_Comm node;
  int local = 0, gpus = 0;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0 || cudaSetDevice(local % gpus) != cudaSuccess) {
    fprintf(stderr, "no usable CUDA device\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}
#else
static void *dev_alloc(size_t n) { return gpulmt_mpi_alloc(n); }
static int dev_free(void *p) { return gpulmt_mpi_free(p); }
static int dev_memcpy(void *dst, const void *src, size_t n) { return gpulmt_mpi_memcpy(dst, src, n); }
static void select_gpu(void) {}
#endif

static int rank, size, failures, checks;

#include "check.h"

enum { HOST = 0, DEV = 1 };
static const char *pname(int p) { return p == DEV ? "D" : "H"; }

typedef struct {
  unsigned char *p;
  size_t n;
  int dev;
} buf_t;

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define GUARD 64 /* receive buffers are this much larger than the message */

static buf_t balloc(int dev, size_t n) {
  buf_t b = {NULL, n, dev};
  b.p = dev ? dev_alloc(n ? n : 1) : malloc(n ? n : 1);
  if (!b.p) {
    fprintf(stderr, "rank %d: allocating %zu bytes (%s) failed\n", rank, n, pname(dev));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return b;
}

static void bfree(buf_t *b) {
  if (b->dev) {
    if (dev_free(b->p) != 0) FAIL("freeing device memory");
  } else {
    free(b->p);
  }
  b->p = NULL;
}

static unsigned char pat(size_t i, unsigned seed) {
  return (unsigned char)((i * 131u + seed * 7u + (i >> 9) + 1u) & 0xffu);
}

/* Writes the pattern into the first n bytes and 0xEE into the rest. */
static void fill(buf_t *b, size_t n, unsigned seed) {
  unsigned char *h = b->dev ? malloc(b->n ? b->n : 1) : b->p;
  for (size_t i = 0; i < b->n; i++) h[i] = i < n ? pat(i, seed) : 0xEE;
  if (b->dev) {
    if (dev_memcpy(b->p, h, b->n) != 0) FAIL("memcpy to device");
    free(h);
  }
}

/* Fills the whole buffer with 0xEE. */
static void clear(buf_t *b) { fill(b, 0, 0); }

/* The first n bytes hold the pattern and the rest is untouched (0xEE). */
static void verify(const buf_t *b, size_t n, unsigned seed, const char *what) {
  unsigned char *h = b->dev ? malloc(b->n ? b->n : 1) : b->p;
  if (b->dev && dev_memcpy(h, b->p, b->n) != 0) FAIL("memcpy from device");
  size_t bad = b->n, differing = 0;
  unsigned char got = 0, expect = 0;
  for (size_t i = 0; i < b->n; i++) {
    unsigned char want = i < n ? pat(i, seed) : 0xEE;
    if (h[i] != want) {
      if (!differing++) {
        bad = i;
        got = h[i];
        expect = want;
      }
    }
  }
  CHECK(bad == b->n, "%s: byte %zu of %zu (message %zu) is %#x, want %#x; %zu bytes differ", what, bad, b->n, n, got, expect,
        differing);
  if (b->dev) free(h);
}

static int count_of(const MPI_Status *st) {
  int n = -1;
  MPI_Get_count(st, MPI_BYTE, &n);
  return n;
}

static int error_class(int rc) {
  int c = rc;
  MPI_Error_class(rc, &c);
  return c;
}

static const size_t sizes[] = {1, 176 /* an envelope's size */, 4097, MiB, 16 * MiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Pairs (even, even+1): the even rank sends. */
static int pair_peer(void) {
  if (rank == size - 1 && size % 2) return -1;
  return rank ^ 1;
}

/* Every placement and size, blocking and non-blocking. */
static void placements(void) {
  int peer = pair_peer();
  if (peer < 0) return;
  int sender = rank % 2 == 0;
  for (int sp = 0; sp < 2; sp++)
    for (int rp = 0; rp < 2; rp++)
      for (size_t k = 0; k < NSIZES; k++)
        for (int nb = 0; nb < 2; nb++) {
          size_t n = sizes[k];
          unsigned seed = (unsigned)(sp * 1000 + rp * 100 + k * 10 + nb);
          int tag = 100 + (int)k;
          char what[96];
          snprintf(what, sizeof what, "%s->%s %zu bytes %s", pname(sp), pname(rp), n, nb ? "isend/irecv" : "send/recv");
          if (sender) {
            buf_t b = balloc(sp, n);
            fill(&b, n, seed);
            if (nb) {
              MPI_Request r;
              MPI_OK(MPI_Isend(b.p, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
              MPI_OK(MPI_Wait(&r, MPI_STATUS_IGNORE));
              CHECK(r == MPI_REQUEST_NULL, "%s: request not freed", what);
            } else {
              MPI_OK(MPI_Send(b.p, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD));
            }
            verify(&b, n, seed, what); /* the send buffer is untouched */
            bfree(&b);
          } else {
            buf_t b = balloc(rp, n + GUARD);
            clear(&b);
            MPI_Status st;
            if (nb) {
              MPI_Request r;
              MPI_OK(MPI_Irecv(b.p, (int)(n + GUARD), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
              MPI_OK(MPI_Wait(&r, &st));
            } else {
              MPI_OK(MPI_Recv(b.p, (int)(n + GUARD), MPI_BYTE, peer, tag, MPI_COMM_WORLD, &st));
            }
            CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == tag, "%s: status source %d tag %d", what, st.MPI_SOURCE, st.MPI_TAG);
            CHECK(count_of(&st) == (int)n, "%s: count %d", what, count_of(&st));
            verify(&b, n, seed, what);
            bfree(&b);
          }
        }
}

/* Rank 0 receives from every other rank with MPI_ANY_SOURCE / MPI_ANY_TAG. */
static void any_source(void) {
  const size_t lens[] = {4097, MiB};
  for (int k = 0; k < 2; k++) {
    size_t n = lens[k];
    if (rank == 0) {
      buf_t b = balloc(DEV, n + GUARD);
      int seen = 0;
      for (int i = 1; i < size; i++) {
        MPI_Status st;
        clear(&b);
        MPI_OK(MPI_Recv(b.p, (int)(n + GUARD), MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
        int src = st.MPI_SOURCE;
        CHECK(src > 0 && src < size && st.MPI_TAG == 200 + src, "any-source: source %d tag %d", src, st.MPI_TAG);
        CHECK(count_of(&st) == (int)n, "any-source: count %d", count_of(&st));
        if (src > 0 && src < size) {
          CHECK(!(seen & (1 << src)), "any-source: %d twice", src);
          seen |= 1 << src;
          verify(&b, n, (unsigned)(2000 + src + k), "any-source");
        }
      }
      bfree(&b);
    } else {
      buf_t b = balloc(rank % 2 ? DEV : HOST, n);
      fill(&b, n, (unsigned)(2000 + rank + k));
      MPI_OK(MPI_Send(b.p, (int)n, MPI_BYTE, 0, 200 + rank, MPI_COMM_WORLD));
      bfree(&b);
    }
    /* Rank 0 receives with any tag: the next round's messages must not be sent yet. */
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
  }
}

/* Messages of one sender received in another tag order than sent; and MPI's
 * non-overtaking order between a device message and a host message of one tag. */
static void tag_order(void) {
  int peer = pair_peer();
  if (peer < 0) return;
  const size_t lens[4] = {MiB, 1, 4097, 16};
  const int place[4] = {DEV, DEV, DEV, HOST};
  if (rank % 2 == 0) {
    buf_t b[4];
    MPI_Request r[4];
    for (int i = 0; i < 4; i++) {
      b[i] = balloc(place[i], lens[i]);
      fill(&b[i], lens[i], (unsigned)(300 + i));
      MPI_OK(MPI_Isend(b[i].p, (int)lens[i], MPI_BYTE, peer, 301 + i, MPI_COMM_WORLD, &r[i]));
    }
    MPI_OK(MPI_Waitall(4, r, MPI_STATUSES_IGNORE));
    for (int i = 0; i < 4; i++) bfree(&b[i]);
    /* Blocking receives in reverse order of sends. */
    buf_t x = balloc(DEV, MiB), y = balloc(DEV, MiB);
    fill(&x, MiB, 310);
    fill(&y, MiB, 311);
    MPI_OK(MPI_Isend(x.p, (int)MiB, MPI_BYTE, peer, 310, MPI_COMM_WORLD, &r[0]));
    MPI_OK(MPI_Isend(y.p, (int)MiB, MPI_BYTE, peer, 311, MPI_COMM_WORLD, &r[1]));
    MPI_OK(MPI_Waitall(2, r, MPI_STATUSES_IGNORE));
    /* One tag, device then host: must arrive in this order. */
    fill(&x, MiB, 320);
    buf_t h = balloc(HOST, 4097);
    fill(&h, 4097, 321);
    MPI_OK(MPI_Send(x.p, (int)MiB, MPI_BYTE, peer, 320, MPI_COMM_WORLD));
    MPI_OK(MPI_Send(h.p, 4097, MPI_BYTE, peer, 320, MPI_COMM_WORLD));
    bfree(&x);
    bfree(&y);
    bfree(&h);
  } else {
    /* Posted as 303, 301, 304, 302. */
    const int order[4] = {2, 0, 3, 1};
    buf_t b[4];
    MPI_Request r[4];
    MPI_Status st[4];
    for (int j = 0; j < 4; j++) {
      int i = order[j];
      b[j] = balloc(j % 2 ? HOST : DEV, lens[i] + GUARD);
      clear(&b[j]);
      MPI_OK(MPI_Irecv(b[j].p, (int)(lens[i] + GUARD), MPI_BYTE, peer, 301 + i, MPI_COMM_WORLD, &r[j]));
    }
    MPI_OK(MPI_Waitall(4, r, st));
    for (int j = 0; j < 4; j++) {
      int i = order[j];
      CHECK(st[j].MPI_TAG == 301 + i && count_of(&st[j]) == (int)lens[i], "tag order: recv %d got tag %d count %d", j, st[j].MPI_TAG,
            count_of(&st[j]));
      verify(&b[j], lens[i], (unsigned)(300 + i), "tag order");
      bfree(&b[j]);
    }
    buf_t x = balloc(DEV, MiB), y = balloc(HOST, MiB);
    clear(&x);
    clear(&y);
    MPI_Status s1, s2;
    MPI_OK(MPI_Recv(y.p, (int)MiB, MPI_BYTE, peer, 311, MPI_COMM_WORLD, &s2));
    MPI_OK(MPI_Recv(x.p, (int)MiB, MPI_BYTE, peer, 310, MPI_COMM_WORLD, &s1));
    verify(&x, MiB, 310, "reverse blocking 310");
    verify(&y, MiB, 311, "reverse blocking 311");
    /* Non-overtaking: the first receive (any tag) gets the device message. */
    buf_t h = balloc(HOST, MiB);
    clear(&x);
    clear(&h);
    MPI_Request q[2];
    MPI_OK(MPI_Irecv(h.p, (int)MiB, MPI_BYTE, peer, MPI_ANY_TAG, MPI_COMM_WORLD, &q[0]));
    MPI_OK(MPI_Irecv(x.p, (int)MiB, MPI_BYTE, peer, 320, MPI_COMM_WORLD, &q[1]));
    MPI_OK(MPI_Waitall(2, q, st));
    CHECK(count_of(&st[0]) == (int)MiB && count_of(&st[1]) == 4097, "non-overtaking: counts %d %d", count_of(&st[0]), count_of(&st[1]));
    verify(&h, MiB, 320, "non-overtaking first");
    verify(&x, 4097, 321, "non-overtaking second");
    bfree(&x);
    bfree(&y);
    bfree(&h);
  }
}

/* Truncation: MPI_ERR_TRUNCATE from every path, the sender unaffected. The receive
 * buffers are as large as the message, the count smaller: Open MPI 4.1 itself writes
 * a truncated message past the count (into the rest of the buffer). The shim's own
 * paths write nothing (gpulmt) or what fits (staged into a device buffer), which is
 * checked. */
static void truncation(void) {
  /* The errors go to the handler of the receive's communicator (errors return),
   * not to MPI_COMM_WORLD's (fatal here), also for non-blocking receives. */
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
  int peer = pair_peer();
  const int sp[4] = {DEV, HOST, HOST, DEV};
  const size_t sn[4] = {MiB, 8192, 8192, MiB};
  const int rp[4] = {DEV, DEV, HOST, HOST};
  for (int i = 0; i < 4 && peer >= 0; i++) {
    int nb = i >= 2;
    if (rank % 2 == 0) {
      buf_t b = balloc(sp[i], sn[i]);
      fill(&b, sn[i], 400);
      MPI_OK(MPI_Send(b.p, (int)sn[i], MPI_BYTE, peer, 400 + i, c));
      bfree(&b);
    } else {
      buf_t b = balloc(rp[i], sn[i] + GUARD);
      clear(&b);
      MPI_Status st;
      int rc;
      gpulmt_mpi_counters c0, c1;
      gpulmt_mpi_get_counters(&c0);
      if (nb) {
        MPI_Request r;
        MPI_OK(MPI_Irecv(b.p, 4097, MPI_BYTE, peer, 400 + i, c, &r));
        rc = MPI_Wait(&r, &st);
      } else {
        rc = MPI_Recv(b.p, 4097, MPI_BYTE, peer, 400 + i, c, &st);
      }
      char what[64];
      snprintf(what, sizeof what, "truncation %s(%zu)->%s(4097)%s", pname(sp[i]), sn[i], pname(rp[i]), nb ? " irecv" : "");
      CHECK(error_class(rc) == MPI_ERR_TRUNCATE, "%s: error class %d", what, error_class(rc));
      gpulmt_mpi_get_counters(&c1);
      if (c1.lmt_recvs > c0.lmt_recvs)
        verify(&b, 0, 400, what); /* gpulmt refused the transfer: nothing written */
      else if (rp[i] == DEV)
        verify(&b, 4097, 400, what); /* staged: what fits */
      bfree(&b);
    }
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_free(&c);
}

/* Blocking receives into host buffers smaller than an envelope (176 bytes), which the
 * shim takes into an envelope-sized buffer of its own while idle: data that fits lands
 * in the user's buffer with the right count; a longer message (host data, one of exactly
 * an envelope's size, or a device message) is MPI_ERR_TRUNCATE and writes nothing past
 * the count. */
static void small_recv(void) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  int peer = pair_peer();
  enum { CASES = 6 };
  const int sp[CASES] = {HOST, DEV, HOST, HOST, HOST, DEV};
  const size_t sn[CASES] = {8, 8, 0, 40, 176, 4097};
  const int cnt[CASES] = {8, 100, 16, 16, 100, 100};
  for (int i = 0; i < CASES && peer >= 0; i++) {
    if (rank % 2 == 0) {
      buf_t b = balloc(sp[i], sn[i]);
      fill(&b, sn[i], 700 + (unsigned)i);
      MPI_OK(MPI_Send(b.p, (int)sn[i], MPI_BYTE, peer, 700 + i, c));
      bfree(&b);
    } else {
      buf_t b = balloc(HOST, (size_t)cnt[i] + GUARD);
      clear(&b);
      MPI_Status st;
      int rc = MPI_Recv(b.p, cnt[i], MPI_BYTE, peer, 700 + i, c, &st);
      char what[64];
      snprintf(what, sizeof what, "small recv %s(%zu)->H(%d)", pname(sp[i]), sn[i], cnt[i]);
      if (sn[i] <= (size_t)cnt[i]) {
        MPI_OK(rc);
        CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == 700 + i && count_of(&st) == (int)sn[i], "%s: status %d %d %d", what,
              st.MPI_SOURCE, st.MPI_TAG, count_of(&st));
        verify(&b, sn[i], 700 + (unsigned)i, what);
      } else {
        CHECK(error_class(rc) == MPI_ERR_TRUNCATE, "%s: error class %d", what, error_class(rc));
        size_t past = 0;
        for (size_t k = (size_t)cnt[i]; k < b.n; k++) past += b.p[k] != 0xEE;
        CHECK(past == 0, "%s: %zu bytes written past the count", what, past);
      }
      bfree(&b);
    }
  }
  MPI_Comm_free(&c);
}

/* One host buffer, count and datatype received into (and sent from) again and again, as
 * in a ping-pong: the shim's fast path remembers such a buffer. Whatever arrives must
 * still be told apart: host messages, an envelope of a device send into the small
 * receive, a message too long for it. */
static void repeat_small(void) {
  int peer = pair_peer();
  if (peer < 0) return;
  enum { MSGS = 7 };
  const int sp[MSGS] = {HOST, HOST, HOST, DEV, HOST, DEV, HOST};
  const size_t sn[MSGS] = {8, 8, 8, 8, 40, 16, 16};
  const int cnt = 16;
  if (rank % 2 == 0) {
    buf_t h = balloc(HOST, 40), d = balloc(DEV, 16);
    for (int i = 0; i < MSGS; i++) {
      buf_t *b = sp[i] == DEV ? &d : &h;
      fill(b, sn[i], 900 + (unsigned)i);
      MPI_OK(MPI_Send(b->p, (int)sn[i], MPI_BYTE, peer, 900 + i, MPI_COMM_WORLD));
    }
    bfree(&h);
    bfree(&d);
  } else {
    buf_t b = balloc(HOST, (size_t)cnt + GUARD);
    for (int i = 0; i < MSGS; i++) {
      clear(&b);
      MPI_Status st;
      int rc = MPI_Recv(b.p, cnt, MPI_BYTE, peer, 900 + i, MPI_COMM_WORLD, &st);
      char what[64];
      snprintf(what, sizeof what, "repeated recv %d: %s(%zu)->H(%d)", i, pname(sp[i]), sn[i], cnt);
      if (sn[i] <= (size_t)cnt) {
        MPI_OK(rc);
        CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == 900 + i && count_of(&st) == (int)sn[i], "%s: status %d %d %d", what,
              st.MPI_SOURCE, st.MPI_TAG, count_of(&st));
        verify(&b, sn[i], 900 + (unsigned)i, what);
      } else {
        CHECK(error_class(rc) == MPI_ERR_TRUNCATE, "%s: error class %d", what, error_class(rc));
        size_t past = 0;
        for (size_t k = (size_t)cnt; k < b.n; k++) past += b.p[k] != 0xEE;
        CHECK(past == 0, "%s: %zu bytes written past the count", what, past);
      }
    }
    bfree(&b);
  }
}

/* MPI_Sendrecv around a ring, device to device and host to device. */
static void sendrecv_ring(void) {
  int to = (rank + 1) % size, from = (rank + size - 1) % size;
  for (int k = 0; k < 2; k++) {
    size_t n = k ? MiB : 4097;
    buf_t s = balloc(k ? DEV : HOST, n), r = balloc(DEV, n + GUARD);
    fill(&s, n, (unsigned)(500 + rank));
    clear(&r);
    MPI_Status st;
    MPI_OK(MPI_Sendrecv(s.p, (int)n, MPI_BYTE, to, 500 + k, r.p, (int)(n + GUARD), MPI_BYTE, from, 500 + k, MPI_COMM_WORLD, &st));
    CHECK(st.MPI_SOURCE == from && st.MPI_TAG == 500 + k && count_of(&st) == (int)n, "sendrecv: status %d %d %d", st.MPI_SOURCE,
          st.MPI_TAG, count_of(&st));
    verify(&r, n, (unsigned)(500 + from), "sendrecv");
    bfree(&s);
    bfree(&r);
  }
}

/* MPI_Probe / MPI_Iprobe report the payload's size, then MPI_Recv takes it. */
static void probe_then_recv(void) {
  int peer = pair_peer();
  if (peer < 0) return;
  const size_t lens[3] = {MiB, 176, 1};
  const int place[3] = {DEV, HOST, DEV};
  if (rank % 2 == 0) {
    for (int i = 0; i < 3; i++) {
      buf_t b = balloc(place[i], lens[i]);
      fill(&b, lens[i], (unsigned)(600 + i));
      MPI_OK(MPI_Send(b.p, (int)lens[i], MPI_BYTE, peer, 600 + i, MPI_COMM_WORLD));
      bfree(&b);
    }
  } else {
    for (int i = 0; i < 3; i++) {
      MPI_Status st;
      if (i == 1) {
        int flag = 0;
        while (!flag) MPI_OK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st));
      } else {
        MPI_OK(MPI_Probe(peer, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
      }
      int n = count_of(&st);
      CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == 600 + i && n == (int)lens[i], "probe %d: source %d tag %d count %d", i, st.MPI_SOURCE,
            st.MPI_TAG, n);
      if (n < 0) n = 0;
      buf_t b = balloc(i == 1 ? DEV : HOST, (size_t)n);
      clear(&b);
      MPI_Status rs;
      MPI_OK(MPI_Recv(b.p, n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &rs));
      CHECK(count_of(&rs) == n, "probe %d: received %d", i, count_of(&rs));
      verify(&b, (size_t)n, (unsigned)(600 + i), "probe then recv");
      bfree(&b);
    }
  }
}

/* MPI_Cancel of a receive nothing matches; MPI_Request_free of a device send. */
static void cancel_and_free(void) {
  int peer = pair_peer();
  if (peer < 0) return;
  buf_t b = balloc(DEV, 4097);
  MPI_Request r;
  MPI_Status st;
  MPI_OK(MPI_Irecv(b.p, 4097, MPI_BYTE, peer, 999, MPI_COMM_WORLD, &r));
  MPI_OK(MPI_Cancel(&r));
  MPI_OK(MPI_Wait(&r, &st));
  int cancelled = 0;
  MPI_Test_cancelled(&st, &cancelled);
  CHECK(cancelled, "cancel: not cancelled");
  bfree(&b);

  buf_t d = balloc(DEV, MiB);
  char ack = 0;
  if (rank % 2 == 0) {
    fill(&d, MiB, 700);
    MPI_OK(MPI_Isend(d.p, (int)MiB, MPI_BYTE, peer, 700, MPI_COMM_WORLD, &r));
    MPI_OK(MPI_Request_free(&r));
    CHECK(r == MPI_REQUEST_NULL, "request_free: handle not reset");
    MPI_OK(MPI_Recv(&ack, 1, MPI_CHAR, peer, 701, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    CHECK(ack == 'k', "request_free: ack %d", ack);
  } else {
    clear(&d);
    MPI_OK(MPI_Recv(d.p, (int)MiB, MPI_BYTE, peer, 700, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    verify(&d, MiB, 700, "request_free");
    ack = 'k';
    MPI_OK(MPI_Send(&ack, 1, MPI_CHAR, peer, 701, MPI_COMM_WORLD));
  }
  /* The ack tells the sender that its buffer is free again (MPI's rule for a freed
   * request); the shim finishes the send's bookkeeping in the background. */
  bfree(&d);
}

/* Waitany, Waitsome, Testall, Testany over device receives. */
static void completion_calls(void) {
  int peer = pair_peer();
  if (peer < 0) return;
  const size_t lens[3] = {4097, MiB, 1};
  for (int round = 0; round < 4; round++) {
    if (rank % 2 == 0) {
      buf_t b[3];
      MPI_Request r[3];
      for (int i = 0; i < 3; i++) {
        b[i] = balloc(DEV, lens[i]);
        fill(&b[i], lens[i], (unsigned)(800 + 10 * round + i));
        MPI_OK(MPI_Isend(b[i].p, (int)lens[i], MPI_BYTE, peer, 800 + i, MPI_COMM_WORLD, &r[i]));
      }
      int done = 0, flag = 0, idx;
      while (done < 3) { /* Testany on the send side */
        MPI_OK(MPI_Testany(3, r, &idx, &flag, MPI_STATUS_IGNORE));
        if (flag && idx != MPI_UNDEFINED) done++;
      }
      for (int i = 0; i < 3; i++) bfree(&b[i]);
    } else {
      buf_t b[3];
      MPI_Request r[3];
      MPI_Status st[3];
      for (int i = 0; i < 3; i++) {
        b[i] = balloc(DEV, lens[i] + GUARD);
        clear(&b[i]);
        MPI_OK(MPI_Irecv(b[i].p, (int)(lens[i] + GUARD), MPI_BYTE, peer, 800 + i, MPI_COMM_WORLD, &r[i]));
      }
      int got = 0;
      if (round == 0) {
        while (got < 3) {
          int idx;
          MPI_OK(MPI_Waitany(3, r, &idx, &st[0]));
          CHECK(idx >= 0 && idx < 3 && st[0].MPI_TAG == 800 + idx && count_of(&st[0]) == (int)lens[idx], "waitany: index %d tag %d", idx,
                st[0].MPI_TAG);
          got++;
        }
      } else if (round == 1) {
        while (got < 3) {
          int out, idx[3];
          MPI_OK(MPI_Waitsome(3, r, &out, idx, st));
          CHECK(out >= 1 && out <= 3, "waitsome: outcount %d", out);
          for (int j = 0; j < out && j < 3; j++)
            CHECK(st[j].MPI_TAG == 800 + idx[j] && count_of(&st[j]) == (int)lens[idx[j]], "waitsome: index %d tag %d", idx[j],
                  st[j].MPI_TAG);
          got += out;
        }
      } else if (round == 2) {
        int flag = 0;
        while (!flag) MPI_OK(MPI_Testall(3, r, &flag, st));
        for (int i = 0; i < 3; i++) CHECK(st[i].MPI_TAG == 800 + i && count_of(&st[i]) == (int)lens[i], "testall: %d", i);
      } else {
        while (got < 3) {
          int out, idx[3];
          MPI_OK(MPI_Testsome(3, r, &out, idx, st));
          if (out != MPI_UNDEFINED) got += out;
        }
      }
      for (int i = 0; i < 3; i++) {
        CHECK(r[i] == MPI_REQUEST_NULL, "completion round %d: request %d not freed", round, i);
        verify(&b[i], lens[i], (unsigned)(800 + 10 * round + i), "completion calls");
        bfree(&b[i]);
      }
    }
  }
}

/* A rank sends device buffers to itself. */
static void self_send(void) {
  for (int k = 0; k < 2; k++) {
    size_t n = k ? MiB : 4097;
    buf_t s = balloc(DEV, n), r = balloc(DEV, n);
    fill(&s, n, (unsigned)(900 + k));
    clear(&r);
    MPI_Request q;
    MPI_OK(MPI_Isend(s.p, (int)n, MPI_BYTE, rank, 900, MPI_COMM_WORLD, &q));
    MPI_OK(MPI_Recv(r.p, (int)n, MPI_BYTE, rank, 900, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
    MPI_OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
    verify(&r, n, (unsigned)(900 + k), "self send");
    bfree(&s);
    bfree(&r);
  }
}

/* Pairs exchange a window of WINDOW device messages each way at once (non-blocking),
 * more than a control ring holds with GPULMT_RING_SLOTS=4: gpulmt's packets then wait
 * in its outbox until the peer reads its ring, and must still all arrive, in order. */
#define WINDOW 96
static void window(void) {
  int peer = (rank == size - 1 && size % 2) ? -1 : rank ^ 1;
  if (peer < 0) return;
  size_t n = 4097;
  buf_t s[WINDOW], r[WINDOW];
  MPI_Request q[2 * WINDOW];
  for (int i = 0; i < WINDOW; i++) {
    s[i] = balloc(DEV, n);
    r[i] = balloc(DEV, n);
    fill(&s[i], n, (unsigned)(1100 + 2 * i + rank));
    clear(&r[i]);
    MPI_OK(MPI_Irecv(r[i].p, (int)n, MPI_BYTE, peer, 11, MPI_COMM_WORLD, &q[i]));
  }
  for (int i = 0; i < WINDOW; i++) MPI_OK(MPI_Isend(s[i].p, (int)n, MPI_BYTE, peer, 11, MPI_COMM_WORLD, &q[WINDOW + i]));
  MPI_OK(MPI_Waitall(2 * WINDOW, q, MPI_STATUSES_IGNORE));
  for (int i = 0; i < WINDOW; i++) {
    /* Same source and tag: MPI's order puts the peer's i-th send in the i-th receive. */
    verify(&r[i], n, (unsigned)(1100 + 2 * i + peer), "window");
    bfree(&s[i]);
    bfree(&r[i]);
  }
}

/* A communicator whose ranks are the world's reversed: rank translation. */
static void other_comm(void) {
  MPI_Comm rev;
  MPI_OK(MPI_Comm_split(MPI_COMM_WORLD, 0, size - rank, &rev));
  MPI_Comm_set_errhandler(rev, MPI_ERRORS_RETURN);
  int me;
  MPI_Comm_rank(rev, &me);
  CHECK(me == size - 1 - rank, "reversed rank %d", me);
  int peer = (me == size - 1 && size % 2) ? -1 : me ^ 1;
  if (peer >= 0) {
    buf_t b = balloc(DEV, MiB);
    if (me % 2 == 0) {
      fill(&b, MiB, 1000 + (unsigned)me);
      MPI_OK(MPI_Send(b.p, (int)MiB, MPI_BYTE, peer, 1, rev));
    } else {
      MPI_Status st;
      clear(&b);
      MPI_OK(MPI_Recv(b.p, (int)MiB, MPI_BYTE, MPI_ANY_SOURCE, 1, rev, &st));
      CHECK(st.MPI_SOURCE == peer, "reversed comm: source %d, want %d", st.MPI_SOURCE, peer);
      verify(&b, MiB, 1000 + (unsigned)peer, "reversed comm");
    }
    bfree(&b);
  }
  MPI_Comm_free(&rev);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "thread") == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  } else if (argc > 1 && strcmp(argv[1], "multiple") == 0) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided != MPI_THREAD_MULTIPLE) fprintf(stderr, "MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  if (!shim_test_begin(2, 0, 1)) return 3;
  select_gpu();
  struct {
    const char *name;
    void (*run)(void);
  } parts[] = {
      {"placements", placements},   {"any_source", any_source},       {"tag_order", tag_order},
      {"truncation", truncation},   {"sendrecv_ring", sendrecv_ring}, {"probe_then_recv", probe_then_recv},
      {"cancel_and_free", cancel_and_free}, {"completion_calls", completion_calls}, {"self_send", self_send},
      {"other_comm", other_comm},   {"small_recv", small_recv},       {"repeat_small", repeat_small},
      {"window", window},
  };
  /* P2P_PARTS=name,name,...: run only those parts (for debugging one of them). */
  const char *only = getenv("P2P_PARTS");
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    if (only && !strstr(only, parts[i].name)) continue;
    int before = failures;
    parts[i].run();
    shim_test_part_done(parts[i].name, before);
  }
  gpulmt_mpi_counters c;
  if (gpulmt_mpi_get_counters(&c) != 0) FAIL("gpulmt_mpi_get_counters");
  printf("rank %d counters lmt_sends=%llu lmt_recvs=%llu staged_sends=%llu staged_recvs=%llu host_recvs=%llu\n", rank,
         (unsigned long long)c.lmt_sends, (unsigned long long)c.lmt_recvs, (unsigned long long)c.staged_sends,
         (unsigned long long)c.staged_recvs, (unsigned long long)c.host_recvs);
  return shim_test_end();
}
