/*
 * The point-to-point calls beyond plain sends and receives on device buffers under
 * libgpulmt_mpi.so (issue 30): buffered and ready sends (MPI_Bsend, MPI_Ibsend, MPI_Rsend,
 * MPI_Irsend), persistent requests (MPI_Send_init, MPI_Ssend_init, MPI_Bsend_init,
 * MPI_Rsend_init, MPI_Recv_init, MPI_Start, MPI_Startall, started again and again,
 * MPI_Request_free, MPI_Cancel, MPI_Request_get_status), matched probes of the program
 * (MPI_Mprobe, MPI_Improbe, MPI_Mrecv, MPI_Imrecv), MPI_Sendrecv_replace, and derived
 * (non-contiguous) datatypes on device buffers (vector, indexed, struct with gaps).
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim ./calls
 *
 * Pairs (even, even+1): the even rank sends. Every case runs in four placements (send
 * and receive buffer each host or device memory) and its result is checked byte for
 * byte against what the same call gives on host buffers: the receive buffer (with a
 * guard past it, and the gaps of its datatype, marked before) must equal the sent
 * elements packed with the send type and unpacked with the receive type into a marked
 * host buffer (MPI_Pack/MPI_Unpack), with the right source, tag and count. A sender
 * overwrites its buffer as soon as its send completes (MPI_Bsend: returns), so data
 * that was not copied or sent in time shows. Since sim device memory is
 * host-addressable, a library reading it directly would pass too: the shim's counters
 * show that each device buffer went through the shim (gpulmt or staging).
 *
 * Prints "rank R ok checks=C" (or FAIL lines, and then exits 1).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

static int rank, size, failures, checks;
static char current[200];
#define CHECK_CONTEXT current
#include "check.h"

#define GUARD 64
#define MiB ((size_t)1 << 20)
enum { HOST = 0, DEV = 1 };
static const char *pname(int p) { return p ? "D" : "H"; }

/* ---- Buffers. ---- */

typedef struct {
  unsigned char *p;
  size_t n;
  int dev;
} buf_t;

static buf_t balloc(int dev, size_t n) {
  buf_t b = {NULL, n, dev};
  b.p = dev ? gpulmt_mpi_alloc(n ? n : 1) : malloc(n ? n : 1);
  if (!b.p) {
    fprintf(stderr, "rank %d: allocating %zu bytes failed\n", rank, n);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return b;
}

static void bfree(buf_t *b) {
  if (b->dev)
    gpulmt_mpi_free(b->p);
  else
    free(b->p);
  b->p = NULL;
}

static void bput(buf_t *b, const unsigned char *h) {
  if (b->dev) {
    if (gpulmt_mpi_memcpy(b->p, h, b->n) != 0) FAIL("memcpy to device");
  } else {
    memcpy(b->p, h, b->n);
  }
}

/* A host copy of the whole buffer (to free). */
static unsigned char *bget(const buf_t *b) {
  unsigned char *h = malloc(b->n ? b->n : 1);
  if (b->dev) {
    if (gpulmt_mpi_memcpy(h, b->p, b->n) != 0) FAIL("memcpy from device");
  } else {
    memcpy(h, b->p, b->n);
  }
  return h;
}

static void bfill(buf_t *b, unsigned seed) {
  unsigned char *h = malloc(b->n ? b->n : 1);
  for (size_t i = 0; i < b->n; i++) h[i] = (unsigned char)((i * 131u + seed * 29u + (i >> 8) + 3u) & 0xffu);
  bput(b, h);
  free(h);
}

static void bmark(buf_t *b, unsigned char m) {
  unsigned char *h = malloc(b->n ? b->n : 1);
  memset(h, m, b->n);
  bput(b, h);
  free(h);
}

/* ---- Datatypes. ---- */

/* Each derived type with gaps, and (+3) a contiguous type of the same type signature
 * per element (MPI matches a message by type signature: MPI_BYTE only with MPI_BYTE). */
enum { T_BYTE, T_VEC, T_IDX, T_STRUCT, T_VEC_FLAT, T_IDX_FLAT, T_STRUCT_FLAT, NTYPES };
static const char *const tname[NTYPES] = {"bytes", "vector", "indexed", "struct", "6 ints", "6 ints", "packed struct"};
static MPI_Datatype dtypes[NTYPES];
#define FLAT(t) ((t) + 3)

static void make_types(void) {
  dtypes[T_BYTE] = MPI_BYTE;
  MPI_Type_vector(3, 2, 3, MPI_INT, &dtypes[T_VEC]); /* 24 bytes of data in 32 */
  int bl[3] = {1, 3, 2}, dis[3] = {0, 2, 7};
  MPI_Type_indexed(3, bl, dis, MPI_INT, &dtypes[T_IDX]); /* ints 0, 2-4, 7-8 */
  struct s {
    int a;
    double b;
    char c[3];
  };
  int sbl[3] = {1, 1, 3};
  MPI_Aint sdis[3] = {offsetof(struct s, a), offsetof(struct s, b), offsetof(struct s, c)};
  MPI_Datatype st[3] = {MPI_INT, MPI_DOUBLE, MPI_CHAR}, tmp;
  MPI_Type_create_struct(3, sbl, sdis, st, &tmp);
  MPI_Type_create_resized(tmp, 0, 40, &dtypes[T_STRUCT]); /* gaps inside and a tail */
  MPI_Type_free(&tmp);
  MPI_Type_contiguous(6, MPI_INT, &dtypes[T_VEC_FLAT]);
  MPI_Type_contiguous(6, MPI_INT, &dtypes[T_IDX_FLAT]);
  MPI_Aint pdis[3] = {0, 4, 12};
  MPI_Type_create_struct(3, sbl, pdis, st, &dtypes[T_STRUCT_FLAT]); /* 15 bytes, no gap */
  for (int t = 1; t < NTYPES; t++) MPI_Type_commit(&dtypes[t]);
}

/* Bytes a buffer of `count` elements of type t spans (lower bounds are 0 here). */
static size_t span(int t, int count) {
  MPI_Aint lb, ext, tlb, text;
  MPI_Type_get_extent(dtypes[t], &lb, &ext);
  MPI_Type_get_true_extent(dtypes[t], &tlb, &text);
  return count ? (size_t)((count - 1) * ext + tlb + text) : 0;
}

static size_t type_size(int t) {
  int s;
  MPI_Type_size(dtypes[t], &s);
  return (size_t)s;
}

/* ---- Counters: device buffers must go through the shim. ---- */

static unsigned long long shim_touches(void) {
  gpulmt_mpi_counters c;
  gpulmt_mpi_staging_counters s;
  if (gpulmt_mpi_get_counters(&c) != 0 || gpulmt_mpi_get_staging_counters(&s) != 0) FAIL("counters");
  return c.lmt_sends + c.lmt_recvs + c.staged_sends + c.staged_recvs + s.staged_calls;
}

/* ---- Completion, by turns. ---- */

static void complete(MPI_Request *q, MPI_Status *st) {
  static int turn;
  int flag = 0, idx = -1, out = 0, ids[1];
  switch (turn++ % 6) {
    case 0: MPI_OK(MPI_Wait(q, st)); break;
    case 1:
      while (!flag) MPI_OK(MPI_Test(q, &flag, st));
      break;
    case 2: MPI_OK(MPI_Waitall(1, q, st)); break;
    case 3: MPI_OK(MPI_Waitany(1, q, &idx, st)); break;
    case 4:
      while (!flag) MPI_OK(MPI_Testany(1, q, &idx, &flag, st));
      break;
    default:
      while (!out) MPI_OK(MPI_Testsome(1, q, &out, ids, st));
  }
}

/* ---- One exchange. ---- */

enum { S_SEND, S_ISEND, S_BSEND, S_IBSEND, S_RSEND, S_IRSEND, S_SEND_INIT, S_SSEND_INIT, S_BSEND_INIT, S_RSEND_INIT, SKINDS };
static const char *const sname[SKINDS] = {"MPI_Send",      "MPI_Isend",      "MPI_Bsend",      "MPI_Ibsend",
                                          "MPI_Rsend",     "MPI_Irsend",     "MPI_Send_init",  "MPI_Ssend_init",
                                          "MPI_Bsend_init", "MPI_Rsend_init"};
enum { R_IRECV_FIRST, R_RECV, R_RECV_INIT, R_MPROBE, R_IMPROBE, R_IPROBE_MPROBE, RKINDS };
static const char *const rname[RKINDS] = {"MPI_Irecv", "MPI_Recv", "MPI_Recv_init", "MPI_Mprobe+MPI_Mrecv",
                                          "MPI_Improbe+MPI_Imrecv", "MPI_Iprobe+MPI_Mprobe+MPI_Mrecv"};

#define ROUNDS 3

typedef struct {
  int skind, rkind;
  int stype, scount, rtype, rcount;
} xcase;

static int pair_peer(void) { return (rank == size - 1 && size % 2) ? -1 : rank ^ 1; }

/* What a host receive of the message gives: the receive buffer `marked` (rn bytes) with
 * the sent elements (packed with the send type) unpacked with the receive type. */
static void expected(const xcase *x, const unsigned char *sent, unsigned char *out, size_t rn) {
  int psize = 0, pos = 0;
  MPI_Pack_size(x->scount, dtypes[x->stype], MPI_COMM_WORLD, &psize);
  unsigned char *packed = malloc((size_t)psize + 1);
  MPI_Pack(sent, x->scount, dtypes[x->stype], packed, psize, &pos, MPI_COMM_WORLD);
  memset(out, 0xEE, rn);
  int used = pos, at = 0;
  MPI_Unpack(packed, used, &at, out, x->rcount, dtypes[x->rtype], MPI_COMM_WORLD);
  free(packed);
}

static void exchange(const xcase *x, int sp, int rp, unsigned seed) {
  int peer = pair_peer();
  int tag = 100 + x->skind * 10 + x->rkind;
  size_t sn = span(x->stype, x->scount), rn = span(x->rtype, x->rcount) + GUARD;
  snprintf(current, sizeof current, "%s(%d %s) %s -> %s(%d %s) %s", sname[x->skind], x->scount, tname[x->stype], pname(sp),
           rname[x->rkind], x->rcount, tname[x->rtype], pname(rp));
  int sending = peer >= 0 && rank % 2 == 0, receiving = peer >= 0 && rank % 2 == 1;
  buf_t b = balloc(sending ? sp : rp, sending ? sn : rn);
  MPI_Request q = MPI_REQUEST_NULL;
  MPI_Status st;
  if (receiving && x->rkind == R_RECV_INIT) MPI_OK(MPI_Recv_init(b.p, x->rcount, dtypes[x->rtype], peer, tag, MPI_COMM_WORLD, &q));
  if (sending && x->skind >= S_SEND_INIT) {
    int (*init)(const void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *) =
        x->skind == S_SEND_INIT ? MPI_Send_init : x->skind == S_SSEND_INIT ? MPI_Ssend_init
                                              : x->skind == S_BSEND_INIT ? MPI_Bsend_init : MPI_Rsend_init;
    MPI_OK(init(b.p, x->scount, dtypes[x->stype], peer, tag, MPI_COMM_WORLD, &q));
  }
  for (int round = 0; round < ROUNDS; round++) {
    unsigned s = seed * 7 + (unsigned)round;
    unsigned long long touched = shim_touches();
    unsigned char *sent = NULL;
    if (sending) {
      bfill(&b, s);
      sent = bget(&b);
    }
    if (receiving) {
      bmark(&b, 0xEE);
      if (x->rkind == R_IRECV_FIRST) MPI_OK(MPI_Irecv(b.p, x->rcount, dtypes[x->rtype], peer, tag, MPI_COMM_WORLD, &q));
      if (x->rkind == R_RECV_INIT) {
        if (round == 1) {
          /* An inactive persistent request counts as a null one. */
          int flag = 0;
          MPI_OK(MPI_Request_get_status(q, &flag, MPI_STATUS_IGNORE));
          CHECK(flag, "an inactive persistent request is not complete");
          MPI_OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
          CHECK(q != MPI_REQUEST_NULL, "waiting for an inactive persistent request freed it");
        }
        MPI_OK(round == 2 ? MPI_Startall(1, &q) : MPI_Start(&q));
      }
    }
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    if (sending) {
      MPI_Datatype t = dtypes[x->stype];
      switch (x->skind) {
        case S_SEND: MPI_OK(MPI_Send(b.p, x->scount, t, peer, tag, MPI_COMM_WORLD)); break;
        case S_BSEND: MPI_OK(MPI_Bsend(b.p, x->scount, t, peer, tag, MPI_COMM_WORLD)); break;
        case S_RSEND: MPI_OK(MPI_Rsend(b.p, x->scount, t, peer, tag, MPI_COMM_WORLD)); break;
        case S_ISEND: MPI_OK(MPI_Isend(b.p, x->scount, t, peer, tag, MPI_COMM_WORLD, &q)); break;
        case S_IBSEND: MPI_OK(MPI_Ibsend(b.p, x->scount, t, peer, tag, MPI_COMM_WORLD, &q)); break;
        case S_IRSEND: MPI_OK(MPI_Irsend(b.p, x->scount, t, peer, tag, MPI_COMM_WORLD, &q)); break;
        default: MPI_OK(round == 1 ? MPI_Startall(1, &q) : MPI_Start(&q));
      }
      if (x->skind != S_SEND && x->skind != S_BSEND && x->skind != S_RSEND) complete(&q, &st);
      if (x->skind >= S_SEND_INIT) CHECK(q != MPI_REQUEST_NULL, "completing a persistent request freed it");
      bmark(&b, 0x5A); /* the send is complete: the buffer is the program's again */
      if (sp == DEV) CHECK(shim_touches() > touched, "the device send buffer did not go through the shim");
    }
    if (receiving) {
      MPI_Datatype t = dtypes[x->rtype];
      MPI_Message m;
      int flag = 0, src = (round % 2) ? MPI_ANY_SOURCE : peer;
      switch (x->rkind) {
        case R_RECV: MPI_OK(MPI_Recv(b.p, x->rcount, t, src, tag, MPI_COMM_WORLD, &st)); break;
        case R_MPROBE:
          MPI_OK(MPI_Mprobe(src, tag, MPI_COMM_WORLD, &m, &st));
          MPI_OK(MPI_Mrecv(b.p, x->rcount, t, &m, &st));
          CHECK(m == MPI_MESSAGE_NULL, "MPI_Mrecv left the message handle");
          break;
        case R_IPROBE_MPROBE:
          while (!flag) MPI_OK(MPI_Iprobe(src, tag, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE));
          MPI_OK(MPI_Mprobe(src, tag, MPI_COMM_WORLD, &m, &st));
          MPI_OK(MPI_Mrecv(b.p, x->rcount, t, &m, &st));
          break;
        case R_IMPROBE: {
          MPI_Status pst;
          while (!flag) MPI_OK(MPI_Improbe(src, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &m, &pst));
          int bytes = -1;
          MPI_Get_count(&pst, MPI_BYTE, &bytes);
          CHECK(pst.MPI_SOURCE == peer && pst.MPI_TAG == tag && bytes == (int)(type_size(x->stype) * (size_t)x->scount),
                "probed source %d tag %d bytes %d", pst.MPI_SOURCE, pst.MPI_TAG, bytes);
          MPI_OK(MPI_Imrecv(b.p, x->rcount, t, &m, &q));
          complete(&q, &st);
          break;
        }
        default: complete(&q, &st);
      }
      int count = -1;
      MPI_Get_count(&st, t, &count);
      CHECK(st.MPI_SOURCE == peer && st.MPI_TAG == tag && count == x->rcount, "status source %d tag %d count %d (want %d)",
            st.MPI_SOURCE, st.MPI_TAG, count, x->rcount);
      if (rp == DEV) CHECK(shim_touches() > touched, "the device receive buffer did not go through the shim");
    }
    /* The receiver checks against the sender's data (sent over afterwards). */
    if (sending) {
      MPI_OK(MPI_Send(sent, (int)sn, MPI_BYTE, peer, 9999, MPI_COMM_WORLD));
      free(sent);
    }
    if (receiving) {
      unsigned char *their = malloc(sn ? sn : 1), *want = malloc(rn), *got;
      MPI_OK(MPI_Recv(their, (int)sn, MPI_BYTE, peer, 9999, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      expected(x, their, want, rn);
      got = bget(&b);
      size_t bad = rn;
      for (size_t i = 0; i < rn && bad == rn; i++)
        if (got[i] != want[i]) bad = i;
      CHECK(bad == rn, "round %d: byte %zu of %zu is %#x, want %#x", round, bad, rn, bad < rn ? got[bad] : 0,
            bad < rn ? want[bad] : 0);
      free(their);
      free(want);
      free(got);
    }
  }
  if (q != MPI_REQUEST_NULL) MPI_OK(MPI_Request_free(&q));
  bfree(&b);
}

static void all_placements(const xcase *x, unsigned seed) {
  for (int sp = 0; sp < 2; sp++)
    for (int rp = 0; rp < 2; rp++) exchange(x, sp, rp, seed);
}

/* ---- Parts. ---- */

static const int byte_counts[] = {1, 176 /* an envelope's size */, 4097, 1 << 20};
#define NBYTES (int)(sizeof byte_counts / sizeof byte_counts[0])

/* Every send mode and persistent send, into a receive posted before the sender starts
 * (as ready sends need): MPI_Irecv or a started MPI_Recv_init, by turns. */
static void send_modes(void) {
  for (int s = 0; s < SKINDS; s++)
    for (int k = 0; k < NBYTES; k++) {
      xcase x = {s, (s % 2) ? R_RECV_INIT : R_IRECV_FIRST, T_BYTE, byte_counts[k], T_BYTE, byte_counts[k]};
      all_placements(&x, (unsigned)(s * 10 + k));
    }
}

/* Every receive form: persistent, matched probes (after a plain probe too). */
static void receive_forms(void) {
  for (int r = R_RECV; r < RKINDS; r++)
    for (int k = 0; k < NBYTES; k++) {
      xcase x = {r % 2 ? S_ISEND : S_SEND, r, T_BYTE, byte_counts[k], T_BYTE, byte_counts[k]};
      all_placements(&x, (unsigned)(r * 10 + k));
    }
}

/* Derived datatypes on either side: with gaps on both, or on one side only. */
static void datatypes(void) {
  static const int counts[] = {1, 7, 5000};
  for (int t = T_VEC; t <= T_STRUCT; t++)
    for (int c = 0; c < 3; c++) {
      int n = counts[c];
      /* (MPICH 4.0.2 itself truncates a buffered send of 2000 or more elements received
       * into a struct type, with or without gaps: the struct skips the buffered send.) */
      xcase forms[5] = {{S_SEND, R_RECV, t, n, t, n},
                        {S_ISEND, R_IRECV_FIRST, t, n, FLAT(t), n},
                        {S_SEND, R_MPROBE, FLAT(t), n, t, n},
                        {S_BSEND, R_IMPROBE, t, n, FLAT(t), n},
                        {S_SEND_INIT, R_RECV_INIT, t, n, t, n}};
      for (int f = 0; f < 5; f++)
        if (!(forms[f].skind == S_BSEND && t == T_STRUCT)) all_placements(&forms[f], (unsigned)(t * 100 + c * 10 + f));
    }
}

/* MPI_Sendrecv_replace around a ring, each rank's buffer host or device by turns. */
static void sendrecv_replace(void) {
  static const struct {
    int t, count;
  } cases[] = {{T_BYTE, 176}, {T_BYTE, 4097}, {T_BYTE, 1 << 20}, {T_VEC, 7}, {T_STRUCT, 300}};
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int pl = 0; pl < 3; pl++) {
      int t = cases[k].t, n = cases[k].count, dev = pl == 2 ? rank % 2 : pl;
      snprintf(current, sizeof current, "MPI_Sendrecv_replace %d %s %s", n, tname[t], pname(dev));
      size_t sn = span(t, n) + GUARD;
      buf_t b = balloc(dev, sn);
      bfill(&b, (unsigned)(rank * 3 + k));
      unsigned char *mine = bget(&b), *theirs = malloc(sn), *want = malloc(sn);
      unsigned long long touched = shim_touches();
      MPI_Status st;
      MPI_OK(MPI_Sendrecv_replace(b.p, n, dtypes[t], right, 7, left, 7, MPI_COMM_WORLD, &st));
      int count = -1;
      MPI_Get_count(&st, dtypes[t], &count);
      CHECK(st.MPI_SOURCE == left && count == n, "status source %d count %d", st.MPI_SOURCE, count);
      if (dev) CHECK(shim_touches() > touched, "the device buffer did not go through the shim");
      /* What arrived is the left rank's data laid into this rank's buffer (the gaps and the
       * guard keep this rank's own bytes). */
      MPI_OK(MPI_Sendrecv(mine, (int)sn, MPI_BYTE, right, 8, theirs, (int)sn, MPI_BYTE, left, 8, MPI_COMM_WORLD,
                          MPI_STATUS_IGNORE));
      int psize = 0, pos = 0, at = 0;
      MPI_Pack_size(n, dtypes[t], MPI_COMM_WORLD, &psize);
      unsigned char *packed = malloc((size_t)psize);
      MPI_Pack(theirs, n, dtypes[t], packed, psize, &pos, MPI_COMM_WORLD);
      memcpy(want, mine, sn);
      MPI_Unpack(packed, pos, &at, want, n, dtypes[t], MPI_COMM_WORLD);
      unsigned char *got = bget(&b);
      size_t bad = sn;
      for (size_t i = 0; i < sn && bad == sn; i++)
        if (got[i] != want[i]) bad = i;
      CHECK(bad == sn, "byte %zu of %zu is %#x, want %#x", bad, sn, bad < sn ? got[bad] : 0, bad < sn ? want[bad] : 0);
      free(packed);
      free(got);
      free(mine);
      free(theirs);
      free(want);
      bfree(&b);
    }
}

/* The rules around the forms above. */
static void edge_cases(void) {
  int peer = pair_peer();
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  buf_t d = balloc(DEV, 4097 + GUARD), h = balloc(HOST, 4097 + GUARD);
  if (peer >= 0 && rank % 2 == 0) {
    /* 1: a device message for a receive posted before a matched probe of the same
     * pattern: the receive gets it, the probe the next one. */
    bfill(&d, 1);
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_OK(MPI_Send(d.p, 4097, MPI_BYTE, peer, 1, c));
    bfill(&d, 2);
    MPI_OK(MPI_Send(d.p, 2000, MPI_BYTE, peer, 1, c));
    /* 2: host data of exactly an envelope's size through a matched probe. */
    bfill(&h, 3);
    MPI_OK(MPI_Send(h.p, 176, MPI_BYTE, peer, 2, c));
    /* 3: a device message into a matched receive too small for it. */
    MPI_OK(MPI_Send(d.p, 4097, MPI_BYTE, peer, 3, c));
    /* 4: the message a cancelled persistent receive did not get. */
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    bfill(&d, 4);
    MPI_OK(MPI_Send(d.p, 4097, MPI_BYTE, peer, 4, c));
  } else if (peer >= 0) {
    MPI_Request q;
    MPI_Status st;
    MPI_Message m;
    int count = -1;
    snprintf(current, sizeof current, "a receive posted before a matched probe");
    bmark(&h, 0xEE);
    MPI_OK(MPI_Irecv(h.p, 4097, MPI_BYTE, peer, 1, c, &q));
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_OK(MPI_Mprobe(peer, 1, c, &m, &st));
    MPI_Get_count(&st, MPI_BYTE, &count);
    CHECK(count == 2000, "the probe found %d bytes, want the second message (2000)", count);
    MPI_OK(MPI_Mrecv(d.p, 2000, MPI_BYTE, &m, &st));
    MPI_OK(MPI_Wait(&q, &st));
    MPI_Get_count(&st, MPI_BYTE, &count);
    CHECK(count == 4097, "the receive got %d bytes, want the first message", count);

    snprintf(current, sizeof current, "176 bytes of host data through a matched probe");
    MPI_OK(MPI_Mprobe(MPI_ANY_SOURCE, 2, c, &m, &st));
    MPI_Get_count(&st, MPI_BYTE, &count);
    CHECK(count == 176 && st.MPI_SOURCE == peer, "probed %d bytes from %d", count, st.MPI_SOURCE);
    bmark(&d, 0xEE);
    MPI_OK(MPI_Mrecv(d.p, 176, MPI_BYTE, &m, &st));
    unsigned char *got = bget(&d), *sent = NULL;
    buf_t ref = balloc(HOST, 4097 + GUARD);
    bfill(&ref, 3);
    sent = ref.p;
    CHECK(memcmp(got, sent, 176) == 0 && got[176] == 0xEE, "176 bytes of data differ");
    free(got);
    bfree(&ref);

    snprintf(current, sizeof current, "a matched receive too small");
    MPI_OK(MPI_Mprobe(peer, 3, c, &m, &st));
    char s[MPI_MAX_ERROR_STRING];
    int rc = MPI_Mrecv(d.p, 100, MPI_BYTE, &m, &st);
    CHECK(shim_error(rc, MPI_ERR_TRUNCATE, NULL, NULL, s) || rc == MPI_ERR_TRUNCATE, "error %d \"%s\"", rc, s);

    snprintf(current, sizeof current, "a cancelled persistent receive");
    MPI_Request p;
    int flag = 0;
    MPI_OK(MPI_Recv_init(d.p, 4097, MPI_BYTE, peer, 4, c, &p));
    MPI_OK(MPI_Start(&p));
    rc = MPI_Start(&p);
    CHECK(shim_error(rc, MPI_ERR_REQUEST, "MPI_Start", "active", s), "starting an active request: error %d \"%s\"", rc, s);
    MPI_OK(MPI_Cancel(&p));
    MPI_OK(MPI_Wait(&p, &st));
    MPI_Test_cancelled(&st, &flag);
    CHECK(flag && p != MPI_REQUEST_NULL, "the persistent receive was not cancelled (%d)", flag);
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    bmark(&d, 0xEE);
    MPI_OK(MPI_Start(&p)); /* restarted after the cancel: gets the message */
    MPI_OK(MPI_Wait(&p, &st));
    MPI_Get_count(&st, MPI_BYTE, &count);
    CHECK(count == 4097, "the restarted receive got %d bytes", count);
    MPI_OK(MPI_Request_free(&p));
    CHECK(p == MPI_REQUEST_NULL, "MPI_Request_free left the handle");
  } else {
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
  }
  /* 5: an active persistent receive freed: its message still arrives in order. */
  snprintf(current, sizeof current, "an active persistent receive freed");
  if (peer >= 0 && rank % 2 == 1) {
    MPI_Request p;
    MPI_OK(MPI_Recv_init(d.p, 4097, MPI_BYTE, peer, 5, c, &p));
    MPI_OK(MPI_Start(&p));
    MPI_OK(MPI_Request_free(&p));
    MPI_OK(MPI_Recv(h.p, 4097, MPI_BYTE, peer, 5, c, MPI_STATUS_IGNORE));
  } else if (peer >= 0) {
    bfill(&d, 5);
    MPI_OK(MPI_Send(d.p, 4097, MPI_BYTE, peer, 5, c));
    MPI_OK(MPI_Send(d.p, 4097, MPI_BYTE, peer, 5, c));
  }
  MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
  bfree(&d);
  bfree(&h);
  MPI_Comm_free(&c);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (!shim_test_begin(2, 0, 1)) return 3;
  make_types();
  /* Room for every buffered send in flight at once (one at a time here). */
  int battach = (int)(2 * MiB) + 8 * MPI_BSEND_OVERHEAD;
  void *bbuf = malloc((size_t)battach);
  MPI_Buffer_attach(bbuf, battach);
  static const struct {
    const char *name;
    void (*run)(void);
  } parts[] = {{"send_modes", send_modes},
               {"receive_forms", receive_forms},
               {"datatypes", datatypes},
               {"sendrecv_replace", sendrecv_replace},
               {"edge_cases", edge_cases}};
  const char *only = getenv("CALLS_PARTS");
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    if (only && !strstr(only, parts[i].name)) continue;
    int before = failures;
    parts[i].run();
    shim_test_part_done(parts[i].name, before);
  }
  int bsize = 0;
  MPI_Buffer_detach(&bbuf, &bsize);
  free(bbuf);
  for (int t = 1; t < NTYPES; t++) MPI_Type_free(&dtypes[t]);
  return shim_test_end();
}
