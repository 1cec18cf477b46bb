/*
 * Collectives on device buffers under libgpulmt_mpi.so: every collective the shim
 * stages (blocking and non-blocking), on buffers from gpulmt_mpi_alloc, checked byte for
 * byte against the same call on host buffers, with buffers of several placements in one
 * call (send and receive buffers each host or device, and differing between ranks).
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim ./coll [small]
 *
 * Covered: every predefined reduction op on every predefined C type it applies to
 * (MAXLOC/MINLOC on their pair types), a user-defined non-commutative op on a derived
 * type, odd counts, MPI_IN_PLACE wherever MPI allows it, displacements with gaps, a
 * vector datatype (gaps inside elements, which must stay untouched), Alltoallw with
 * per-peer datatypes, and that a device buffer in a collective on an intercommunicator
 * fails with an error naming the call.
 *
 * With "small" (run with GPULMT_MPI_STAGING_MAX=1M): reductions larger than a piece
 * (a quarter of the cap) are split on every rank and give the same results on any
 * placement, and collectives that would stage more than the cap fail with
 * MPI_ERR_NO_MEM and a message naming the call.
 *
 * Since sim device memory is host-addressable, the MPI library could read it directly:
 * the staging counters show that the shim staged every call with a device buffer in
 * use on the rank, and no call without one.
 *
 * Prints "rank R ok checks=C" (or FAIL lines, and then exits 1).
 */
#include <complex.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

static int rank, size, failures, checks;

/* The case being run, for messages. */
static char current[200];
#define CHECK_CONTEXT current
#include "check.h"

/* ---- Buffers: one send and one receive area in host and in device memory. ---- */

#define AREA ((size_t)4 << 20)
#define GUARD 256 /* checked bytes past what a call describes */
#define WORK ((size_t)1 << 18) /* host bytes the data-movement cases lay out */
static unsigned char *area[2][2]; /* [device][0 send, 1 receive] */

static void put(int dev, void *dst, const void *src, size_t n) {
  if (!n) return;
  if (dev) {
    if (gpulmt_mpi_memcpy(dst, src, n) != 0) FAIL("memcpy to device");
  } else {
    memcpy(dst, src, n);
  }
}

static void get(void *dst, int dev, const void *src, size_t n) {
  if (!n) return;
  if (dev) {
    if (gpulmt_mpi_memcpy(dst, src, n) != 0) FAIL("memcpy from device");
  } else {
    memcpy(dst, src, n);
  }
}

/* Fills n bytes of an area with a marker byte. */
static void mark(int dev, unsigned char *p, size_t n, unsigned char b) {
  unsigned char *h = malloc(n);
  memset(h, b, n);
  put(dev, p, h, n);
  free(h);
}

/* ---- Placements. ---- */

enum { M_HOST, M_DEV, M_HOST_DEV, M_DEV_HOST, M_MIXED, MODES };
static const char *const mode_name[MODES] = {"H/H", "D/D", "H->D", "D->H", "mixed"};
static int send_dev(int m) { return m == M_DEV || m == M_DEV_HOST || (m == M_MIXED && rank % 2 == 0); }
static int recv_dev(int m) { return m == M_DEV || m == M_HOST_DEV || (m == M_MIXED && rank % 3 != 1); }

static gpulmt_mpi_staging_counters staging(void) {
  gpulmt_mpi_staging_counters c;
  if (gpulmt_mpi_get_staging_counters(&c) != 0) FAIL("gpulmt_mpi_get_staging_counters");
  return c;
}

/* A collective under test: runs it in placement `mode` (blocking, or non-blocking and
 * waited for), writes what the receive area then holds to `out` (its length to `*n`),
 * and returns how many device buffers this rank used in it (what the shim must stage:
 * a buffer the call does not use on this rank, such as the receive buffer of
 * MPI_Reduce on a rank other than the root, is not). */
typedef int (*coll_fn)(int mode, int nb, unsigned char *out, size_t *n);

/* Waits for a non-blocking collective, with MPI_Wait or the MPI_Test family by turns. */
static void finish(MPI_Request *q) {
  static int turn;
  int flag = 0, out = 0, ids[1];
  switch (turn++ % 4) {
    case 0: MPI_OK(MPI_Wait(q, MPI_STATUS_IGNORE)); break;
    case 1: while (!flag) MPI_OK(MPI_Test(q, &flag, MPI_STATUS_IGNORE)); break;
    case 2: MPI_OK(MPI_Waitall(1, q, MPI_STATUSES_IGNORE)); break;
    default:
      while (!out) {
        MPI_OK(MPI_Testsome(1, q, &out, ids, MPI_STATUSES_IGNORE));
        if (out == MPI_UNDEFINED) break;
      }
  }
  CHECK(*q == MPI_REQUEST_NULL, "request not freed");
}

static unsigned char *ref, *got;

/* Runs `f` in every placement, blocking and not (when `nb_too`), and compares with the
 * host run of the same form. */
static void compare(const char *what, coll_fn f, int nb_too) {
  for (int nb = 0; nb <= nb_too; nb++) {
    size_t rn = 0;
    snprintf(current, sizeof current, "%s %s %s", what, nb ? "non-blocking" : "blocking", mode_name[M_HOST]);
    gpulmt_mpi_staging_counters before = staging(), after;
    f(M_HOST, nb, ref, &rn);
    after = staging();
    CHECK(after.staged_calls == before.staged_calls, "host buffers were staged");
    for (int m = 1; m < MODES; m++) {
      size_t n = 0;
      snprintf(current, sizeof current, "%s %s %s", what, nb ? "non-blocking" : "blocking", mode_name[m]);
      before = staging();
      int dev = f(m, nb, got, &n);
      after = staging();
      unsigned long long calls = after.staged_calls - before.staged_calls, bufs = after.staged_buffers - before.staged_buffers;
      CHECK(calls == (dev ? 1u : 0u) && bufs == (unsigned long long)dev, "%llu calls staged %llu buffers, want %d buffers", calls,
            bufs, dev);
      size_t bad = n;
      for (size_t i = 0; i < n && bad == n; i++)
        if (got[i] != ref[i]) bad = i;
      CHECK(n == rn && bad == n, "%zu bytes (want %zu), byte %zu is %#x, want %#x", n, rn, bad,
            bad < n ? got[bad] : 0, bad < n ? ref[bad] : 0);
    }
  }
}

/* ---- Types and values for reductions. ---- */

typedef struct { float v; int k; } float_int;
typedef struct { double v; int k; } double_int;
typedef struct { long v; int k; } long_int;
typedef struct { int v; int k; } int_int;
typedef struct { short v; int k; } short_int;
typedef struct { long double v; int k; } ldouble_int;

enum kind { K_INT, K_UINT, K_FLT, K_DBL, K_LDBL, K_CF, K_CD, K_CLD, K_BOOL, K_BYTE, K_FI, K_DI, K_LI, K_II, K_SI, K_LDI, K_USER };
enum { G_INT = 1, G_FLT = 2, G_CPLX = 4, G_LOGIC = 8, G_BYTE = 16, G_PAIR = 32 };

typedef struct {
  MPI_Datatype t;
  const char *name;
  enum kind kind;
  int group;
  size_t size; /* of one C element (MPI's extent) */
} tinfo;

static tinfo types[] = {
    {MPI_INT, "MPI_INT", K_INT, G_INT, sizeof(int)},
    {MPI_LONG, "MPI_LONG", K_INT, G_INT, sizeof(long)},
    {MPI_SHORT, "MPI_SHORT", K_INT, G_INT, sizeof(short)},
    {MPI_UNSIGNED_SHORT, "MPI_UNSIGNED_SHORT", K_UINT, G_INT, sizeof(unsigned short)},
    {MPI_UNSIGNED, "MPI_UNSIGNED", K_UINT, G_INT, sizeof(unsigned)},
    {MPI_UNSIGNED_LONG, "MPI_UNSIGNED_LONG", K_UINT, G_INT, sizeof(unsigned long)},
    {MPI_LONG_LONG, "MPI_LONG_LONG", K_INT, G_INT, sizeof(long long)},
    {MPI_UNSIGNED_LONG_LONG, "MPI_UNSIGNED_LONG_LONG", K_UINT, G_INT, sizeof(unsigned long long)},
    {MPI_SIGNED_CHAR, "MPI_SIGNED_CHAR", K_INT, G_INT, 1},
    {MPI_UNSIGNED_CHAR, "MPI_UNSIGNED_CHAR", K_UINT, G_INT, 1},
    {MPI_INT8_T, "MPI_INT8_T", K_INT, G_INT, 1},
    {MPI_INT16_T, "MPI_INT16_T", K_INT, G_INT, 2},
    {MPI_INT32_T, "MPI_INT32_T", K_INT, G_INT, 4},
    {MPI_INT64_T, "MPI_INT64_T", K_INT, G_INT, 8},
    {MPI_UINT8_T, "MPI_UINT8_T", K_UINT, G_INT, 1},
    {MPI_UINT16_T, "MPI_UINT16_T", K_UINT, G_INT, 2},
    {MPI_UINT32_T, "MPI_UINT32_T", K_UINT, G_INT, 4},
    {MPI_UINT64_T, "MPI_UINT64_T", K_UINT, G_INT, 8},
    {MPI_FLOAT, "MPI_FLOAT", K_FLT, G_FLT, sizeof(float)},
    {MPI_DOUBLE, "MPI_DOUBLE", K_DBL, G_FLT, sizeof(double)},
    {MPI_LONG_DOUBLE, "MPI_LONG_DOUBLE", K_LDBL, G_FLT, sizeof(long double)},
    {MPI_C_FLOAT_COMPLEX, "MPI_C_FLOAT_COMPLEX", K_CF, G_CPLX, sizeof(float complex)},
    {MPI_C_DOUBLE_COMPLEX, "MPI_C_DOUBLE_COMPLEX", K_CD, G_CPLX, sizeof(double complex)},
    {MPI_C_LONG_DOUBLE_COMPLEX, "MPI_C_LONG_DOUBLE_COMPLEX", K_CLD, G_CPLX, sizeof(long double complex)},
    {MPI_C_BOOL, "MPI_C_BOOL", K_BOOL, G_LOGIC, sizeof(bool)},
    {MPI_BYTE, "MPI_BYTE", K_BYTE, G_BYTE, 1},
    {MPI_FLOAT_INT, "MPI_FLOAT_INT", K_FI, G_PAIR, sizeof(float_int)},
    {MPI_DOUBLE_INT, "MPI_DOUBLE_INT", K_DI, G_PAIR, sizeof(double_int)},
    {MPI_LONG_INT, "MPI_LONG_INT", K_LI, G_PAIR, sizeof(long_int)},
    {MPI_2INT, "MPI_2INT", K_II, G_PAIR, sizeof(int_int)},
    {MPI_SHORT_INT, "MPI_SHORT_INT", K_SI, G_PAIR, sizeof(short_int)},
    {MPI_LONG_DOUBLE_INT, "MPI_LONG_DOUBLE_INT", K_LDI, G_PAIR, sizeof(ldouble_int)},
};
#define NTYPES (sizeof types / sizeof types[0])

typedef struct {
  MPI_Op op;
  const char *name;
  int groups; /* the type groups it applies to */
} opinfo;

static opinfo ops[] = {
    {MPI_MAX, "MPI_MAX", G_INT | G_FLT},
    {MPI_MIN, "MPI_MIN", G_INT | G_FLT},
    {MPI_SUM, "MPI_SUM", G_INT | G_FLT | G_CPLX},
    {MPI_PROD, "MPI_PROD", G_INT | G_FLT | G_CPLX},
    {MPI_LAND, "MPI_LAND", G_INT | G_LOGIC},
    {MPI_LOR, "MPI_LOR", G_INT | G_LOGIC},
    {MPI_LXOR, "MPI_LXOR", G_INT | G_LOGIC},
    {MPI_BAND, "MPI_BAND", G_INT | G_BYTE},
    {MPI_BOR, "MPI_BOR", G_INT | G_BYTE},
    {MPI_BXOR, "MPI_BXOR", G_INT | G_BYTE},
    {MPI_MAXLOC, "MPI_MAXLOC", G_PAIR},
    {MPI_MINLOC, "MPI_MINLOC", G_PAIR},
};
#define NOPS (sizeof ops / sizeof ops[0])

/* The reduction case in force. */
static const tinfo *T;
static MPI_Op OP;
static int COUNT;

/* Writes value v (small) as an element of `t` at p, field by field: padding bytes keep
 * what the buffer holds (a struct assignment may copy garbage into them). */
static void set_elem(const tinfo *t, unsigned char *p, long v, int loc) {
  switch (t->kind) {
    case K_INT:
    case K_UINT: {
      unsigned long long u = (unsigned long long)v;
      memcpy(p, &u, t->size); /* little-endian: the low bytes */
      break;
    }
    case K_FLT: *(float *)p = (float)v; break;
    case K_DBL: *(double *)p = (double)v; break;
    case K_LDBL: *(long double *)p = (long double)v; break;
    case K_CF: *(float complex *)p = (float)v + (float)(v % 2) * I; break;
    case K_CD: *(double complex *)p = (double)v + (double)(v % 2) * I; break;
    case K_CLD: *(long double complex *)p = (long double)v + (long double)(v % 2) * I; break;
    case K_BOOL: *(bool *)p = v & 1; break;
    case K_BYTE: *p = (unsigned char)(v * 37 + 1); break;
    case K_FI: (((float_int *)p)->v = (float)v, ((float_int *)p)->k = loc); break;
    case K_DI: (((double_int *)p)->v = (double)v, ((double_int *)p)->k = loc); break;
    case K_LI: (((long_int *)p)->v = v, ((long_int *)p)->k = loc); break;
    case K_II: (((int_int *)p)->v = (int)v, ((int_int *)p)->k = loc); break;
    case K_SI: (((short_int *)p)->v = (short)v, ((short_int *)p)->k = loc); break;
    case K_LDI: (((ldouble_int *)p)->v = (long double)v, ((ldouble_int *)p)->k = loc); break;
    case K_USER: {
      unsigned *m = (unsigned *)p;
      m[0] = (unsigned)v + 1;
      m[1] = (unsigned)loc;
      m[2] = 3u * (unsigned)v;
      m[3] = 1u;
      break;
    }
  }
}

/* Long double is 10 bytes of data in 16 (x86): the padding is not data, and a
 * reduction leaves it as it finds it. Rewrites the elements with zero padding. */
static void normalize(const tinfo *t, unsigned char *p, size_t count) {
  if (t->kind != K_LDBL && t->kind != K_CLD && t->kind != K_LDI) return;
  for (size_t i = 0; i < count; i++) {
    unsigned char *e = p + i * t->size;
    if (t->kind == K_LDBL) {
      long double x;
      memcpy(&x, e, sizeof x);
      memset(e, 0, sizeof x);
      memcpy(e, &x, 10);
    } else if (t->kind == K_CLD) {
      long double x[2];
      memcpy(x, e, sizeof x);
      memset(e, 0, sizeof x);
      memcpy(e, &x[0], 10);
      memcpy(e + sizeof(long double), &x[1], 10);
    } else {
      ldouble_int x;
      memcpy(&x, e, sizeof x);
      memset(e, 0, sizeof(long double));
      memcpy(e, &x.v, 10);
    }
  }
}

/* This rank's input: `count` elements from element `first` on (values 0..3, so that
 * products stay small and logical ops see zeros). */
static void input(const tinfo *t, unsigned char *h, size_t count, int r) {
  for (size_t i = 0; i < count; i++) set_elem(t, h + i * t->size, (long)((r * 7 + (int)i * 3) % 4), r * 10 + (int)(i % 10));
}

/* A user op on 2x2 matrices of unsigned ints (mod 2^32): associative, not commutative. */
static void matmul(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  unsigned *a = in, *b = inout;
  for (int i = 0; i < *len; i++, a += 4, b += 4) {
    unsigned c[4] = {a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3], a[2] * b[0] + a[3] * b[2],
                     a[2] * b[1] + a[3] * b[3]};
    memcpy(b, c, sizeof c);
  }
}

/* ---- Reductions. ---- */

enum { R_ALLREDUCE, R_REDUCE, R_SCAN, R_EXSCAN, R_RSB, R_RS, R_LOCAL, RCOLLS };
static const char *const rname[RCOLLS] = {"Allreduce", "Reduce", "Scan", "Exscan", "Reduce_scatter_block", "Reduce_scatter",
                                          "Reduce_local"};
static int RCOLL, IN_PLACE;

/* Reduce_scatter's counts: COUNT + rank, odd and even. */
static int rs_count(int r) { return COUNT + r; }

/* The root of MPI_Reduce: the last rank, so that the root is not rank 0. Under MPICH
 * before 4.1.2, rank 0 for MPI_IN_PLACE: its MPI_Reduce(MPI_IN_PLACE) at a root other
 * than 0 on one node reads a bad address beyond 2 KiB (pmodels/mpich#6540, fixed by
 * pmodels/mpich#6543), with or without the shim. */
static int reduce_root(void) {
#if defined(MPICH_NUMVERSION) && MPICH_NUMVERSION < 40102300
  if (IN_PLACE) return 0;
#endif
  return size - 1;
}

static int run_reduction(int mode, int nb, unsigned char *out, size_t *n) {
  int sd = send_dev(mode), rd = recv_dev(mode), root = reduce_root();
  int in_place = IN_PLACE && !(RCOLL == R_REDUCE && rank != root);
  size_t incount = (size_t)COUNT, outcount = (size_t)COUNT;
  int counts[64];
  if (RCOLL == R_RSB) incount = (size_t)COUNT * (size_t)size;
  if (RCOLL == R_RS) {
    incount = 0;
    for (int r = 0; r < size; r++) incount += (size_t)(counts[r] = rs_count(r));
    outcount = (size_t)rs_count(rank);
  }
  size_t inbytes = incount * T->size, outbytes = (in_place ? incount : outcount) * T->size;
  unsigned char *s = area[sd][0], *r = area[rd][1];
  unsigned char *h = calloc(inbytes + 1, 1);
  input(T, h, incount, rank);
  mark(rd, r, outbytes + GUARD, 0xEE);
  if (in_place)
    put(rd, r, h, inbytes);
  else
    put(sd, s, h, inbytes);
  free(h);
  const void *sb = in_place ? MPI_IN_PLACE : (const void *)s;
  MPI_Request q = MPI_REQUEST_NULL;
  MPI_Comm c = MPI_COMM_WORLD;
  switch (RCOLL) {
    case R_ALLREDUCE: MPI_OK(nb ? MPI_Iallreduce(sb, r, COUNT, T->t, OP, c, &q) : MPI_Allreduce(sb, r, COUNT, T->t, OP, c)); break;
    case R_REDUCE: MPI_OK(nb ? MPI_Ireduce(sb, r, COUNT, T->t, OP, root, c, &q) : MPI_Reduce(sb, r, COUNT, T->t, OP, root, c)); break;
    case R_SCAN: MPI_OK(nb ? MPI_Iscan(sb, r, COUNT, T->t, OP, c, &q) : MPI_Scan(sb, r, COUNT, T->t, OP, c)); break;
    case R_EXSCAN: MPI_OK(nb ? MPI_Iexscan(sb, r, COUNT, T->t, OP, c, &q) : MPI_Exscan(sb, r, COUNT, T->t, OP, c)); break;
    case R_RSB:
      MPI_OK(nb ? MPI_Ireduce_scatter_block(sb, r, COUNT, T->t, OP, c, &q) : MPI_Reduce_scatter_block(sb, r, COUNT, T->t, OP, c));
      break;
    case R_RS: MPI_OK(nb ? MPI_Ireduce_scatter(sb, r, counts, T->t, OP, c, &q) : MPI_Reduce_scatter(sb, r, counts, T->t, OP, c)); break;
    case R_LOCAL: {
      /* inoutbuf = the receive area, holding rank+1's input; inbuf this rank's. */
      unsigned char *h2 = calloc(inbytes + 1, 1);
      input(T, h2, incount, rank + 1);
      put(rd, r, h2, inbytes);
      free(h2);
      MPI_OK(MPI_Reduce_local(s, r, COUNT, T->t, OP));
      break;
    }
  }
  if (q != MPI_REQUEST_NULL) finish(&q);
  *n = outbytes + GUARD;
  get(out, rd, r, *n);
  normalize(T, out, outbytes / T->size);
  /* A device buffer this rank uses: the receive buffer where it is written (all but a
   * non-root of Reduce), the send buffer unless in place. */
  int uses_recv = !(RCOLL == R_REDUCE && rank != root);
  return (uses_recv && rd) + (!in_place && sd);
}

/* Every op on every type it applies to: Allreduce (blocking and not) and Reduce. */
static void ops_and_types(void) {
  COUNT = 7;
  for (size_t o = 0; o < NOPS; o++)
    for (size_t t = 0; t < NTYPES; t++) {
      if (!(ops[o].groups & types[t].group)) continue;
      T = &types[t];
      OP = ops[o].op;
      char what[96];
      RCOLL = R_ALLREDUCE;
      snprintf(what, sizeof what, "Allreduce %s %s x%d", ops[o].name, T->name, COUNT);
      compare(what, run_reduction, 1);
      RCOLL = R_REDUCE;
      snprintf(what, sizeof what, "Reduce %s %s x%d", ops[o].name, T->name, COUNT);
      compare(what, run_reduction, 0);
    }
}

/* Every reduction collective: counts, in place, a user op on a derived type. */
static void reductions(void) {
  static tinfo user = {MPI_DATATYPE_NULL, "2x2 unsigned matrix (contiguous type)", K_USER, 0, 4 * sizeof(unsigned)};
  MPI_Op matop;
  MPI_Type_contiguous(4, MPI_UNSIGNED, &user.t);
  MPI_Type_commit(&user.t);
  MPI_Op_create(matmul, 0, &matop);
  const tinfo *cases_t[4] = {&types[0], &types[19], &types[27], &user}; /* MPI_INT, MPI_DOUBLE, MPI_DOUBLE_INT, user */
  const MPI_Op cases_op[4] = {MPI_SUM, MPI_MAX, MPI_MINLOC, matop};
  const int counts[3] = {1, 7, 1001};
  for (RCOLL = 0; RCOLL < RCOLLS; RCOLL++)
    for (int k = 0; k < 4; k++)
      for (int c = 0; c < 3; c++)
        for (IN_PLACE = 0; IN_PLACE <= 1; IN_PLACE++) {
          if (IN_PLACE && RCOLL == R_LOCAL) continue;
          T = cases_t[k];
          OP = cases_op[k];
          COUNT = counts[c];
          char what[128];
          snprintf(what, sizeof what, "%s %s x%d%s", rname[RCOLL], T->name, COUNT, IN_PLACE ? " in place" : "");
          compare(what, run_reduction, RCOLL != R_LOCAL);
        }
  IN_PLACE = 0;
  MPI_Op_free(&matop);
  MPI_Type_free(&user.t);
}

/* ---- Data movement: values are ints that say where they come from. ---- */

/* Element i of the block rank `from` sends to rank `to`. */
static int val(int from, int to, int i) { return 1 + from * 1000000 + to * 10000 + i; }

static int COUNTM; /* elements per block */
static MPI_Datatype VEC; /* 3 blocks of 2 ints, stride 3: 24 bytes of data in 32 */

/* Per-rank counts and displacements (in elements) with gaps of 3 between blocks. */
static int vcount(int r) { return COUNTM + 2 * r; }
static void vlayout(int *counts, int *displs, size_t *total) {
  int at = 0;
  for (int r = 0; r < size; r++) {
    counts[r] = vcount(r);
    displs[r] = at + 3;
    at = displs[r] + counts[r];
  }
  *total = (size_t)at;
}

enum { D_BCAST, D_BCAST_VEC, D_GATHER, D_GATHERV, D_ALLGATHER, D_ALLGATHER_VEC, D_ALLGATHERV, D_SCATTER, D_SCATTERV, D_ALLTOALL, D_ALLTOALLV, D_ALLTOALLW, DCOLLS };
static const char *const dname[DCOLLS] = {"Bcast", "Bcast vector", "Gather", "Gatherv", "Allgather", "Allgather vector", "Allgatherv",
                                          "Scatter", "Scatterv", "Alltoall", "Alltoallv", "Alltoallw"};
static int DCOLL;

/* Alltoallw: the pair (i, j) moves 1 + (i + 2j) % 3 elements of MPI_INT, or of MPI_SHORT
 * when i + j is odd, at byte displacements with gaps of 8. */
static MPI_Datatype wtype(int i, int j) { return (i + j) % 2 ? MPI_SHORT : MPI_INT; }
static int wsize(int i, int j) { return (i + j) % 2 ? 2 : 4; }
static int wcount(int i, int j) { return COUNTM + (i + 2 * j) % 3; }

/* Writes the ints (or shorts) of the block from -> to at h (as `wsize` wide). */
static void wblock(unsigned char *h, int from, int to, int n, int width) {
  for (int i = 0; i < n; i++) {
    int v = val(from, to, i);
    if (width == 2) {
      short s = (short)v;
      memcpy(h + 2 * i, &s, 2);
    } else {
      memcpy(h + 4 * i, &v, 4);
    }
  }
}

static int run_data(int mode, int nb, unsigned char *out, size_t *n) {
  int sd = send_dev(mode), rd = recv_dev(mode), root = size - 1, me = rank == root;
  unsigned char *s = area[sd][0], *r = area[rd][1];
  int counts[64], displs[64], rcounts[64], rdispls[64];
  MPI_Datatype stypes[64], rtypes[64];
  size_t total = 0, rbytes = 0, sbytes = 0;
  static int hs[WORK / 4], hr[WORK / 4];
  memset(hs, 0, sizeof hs);
  memset(hr, 0xEE, sizeof hr);
  MPI_Comm c = MPI_COMM_WORLD;
  MPI_Request q = MPI_REQUEST_NULL;
  int in_place = IN_PLACE, uses_send = 1, uses_recv = 1;
  const void *sb = s;
  void *rb = r;
  switch (DCOLL) {
    case D_BCAST:
    case D_BCAST_VEC: {
      /* One buffer: the receive area. */
      int vec = DCOLL == D_BCAST_VEC;
      rbytes = vec ? (size_t)COUNTM * 32 : (size_t)COUNTM * 4;
      if (me)
        for (size_t i = 0; i < rbytes / 4; i++) hr[i] = val(root, 0, (int)i);
      uses_send = 0;
      put(rd, r, hr, rbytes + GUARD);
      if (vec)
        MPI_OK(nb ? MPI_Ibcast(r, COUNTM, VEC, root, c, &q) : MPI_Bcast(r, COUNTM, VEC, root, c));
      else
        MPI_OK(nb ? MPI_Ibcast(r, COUNTM, MPI_INT, root, c, &q) : MPI_Bcast(r, COUNTM, MPI_INT, root, c));
      break;
    }
    case D_GATHER:
    case D_ALLGATHER:
    case D_ALLGATHER_VEC: {
      int all = DCOLL != D_GATHER, vec = DCOLL == D_ALLGATHER_VEC;
      MPI_Datatype t = vec ? VEC : MPI_INT;
      size_t ext = vec ? 32 : 4, per = (size_t)COUNTM * ext;
      uses_recv = all || me;
      in_place = in_place && (all || me);
      for (size_t i = 0; i < per / 4; i++) hs[i] = val(rank, 0, (int)i);
      rbytes = per * (size_t)size;
      if (in_place) memcpy((unsigned char *)hr + per * (size_t)rank, hs, per);
      put(sd, s, hs, per);
      put(rd, r, hr, rbytes + GUARD);
      if (in_place) {
        sb = MPI_IN_PLACE;
        uses_send = 0;
      }
      if (all)
        MPI_OK(nb ? MPI_Iallgather(sb, COUNTM, t, r, COUNTM, t, c, &q) : MPI_Allgather(sb, COUNTM, t, r, COUNTM, t, c));
      else
        MPI_OK(nb ? MPI_Igather(sb, COUNTM, t, r, COUNTM, t, root, c, &q) : MPI_Gather(sb, COUNTM, t, r, COUNTM, t, root, c));
      break;
    }
    case D_GATHERV:
    case D_ALLGATHERV: {
      int all = DCOLL == D_ALLGATHERV;
      vlayout(counts, displs, &total);
      uses_recv = all || me;
      in_place = in_place && (all || me);
      for (int i = 0; i < vcount(rank); i++) hs[i] = val(rank, 0, i);
      rbytes = total * 4;
      if (in_place) memcpy(hr + displs[rank], hs, (size_t)vcount(rank) * 4);
      put(sd, s, hs, (size_t)vcount(rank) * 4);
      put(rd, r, hr, rbytes + GUARD);
      if (in_place) {
        sb = MPI_IN_PLACE;
        uses_send = 0;
      }
      if (all)
        MPI_OK(nb ? MPI_Iallgatherv(sb, vcount(rank), MPI_INT, r, counts, displs, MPI_INT, c, &q)
                  : MPI_Allgatherv(sb, vcount(rank), MPI_INT, r, counts, displs, MPI_INT, c));
      else
        MPI_OK(nb ? MPI_Igatherv(sb, vcount(rank), MPI_INT, r, counts, displs, MPI_INT, root, c, &q)
                  : MPI_Gatherv(sb, vcount(rank), MPI_INT, r, counts, displs, MPI_INT, root, c));
      break;
    }
    case D_SCATTER:
    case D_SCATTERV: {
      int v = DCOLL == D_SCATTERV;
      vlayout(counts, displs, &total);
      int mine = v ? vcount(rank) : COUNTM;
      uses_send = me;
      sbytes = v ? total * 4 : (size_t)COUNTM * (size_t)size * 4;
      if (me)
        for (int to = 0; to < size; to++)
          for (int i = 0; i < (v ? vcount(to) : COUNTM); i++) hs[(v ? displs[to] : to * COUNTM) + i] = val(root, to, i);
      put(sd, s, hs, sbytes);
      rbytes = (size_t)mine * 4;
      put(rd, r, hr, rbytes + GUARD);
      in_place = in_place && me;
      if (in_place) {
        rb = MPI_IN_PLACE;
        uses_recv = 0;
      }
      if (v)
        MPI_OK(nb ? MPI_Iscatterv(s, counts, displs, MPI_INT, rb, mine, MPI_INT, root, c, &q)
                  : MPI_Scatterv(s, counts, displs, MPI_INT, rb, mine, MPI_INT, root, c));
      else
        MPI_OK(nb ? MPI_Iscatter(s, COUNTM, MPI_INT, rb, COUNTM, MPI_INT, root, c, &q)
                  : MPI_Scatter(s, COUNTM, MPI_INT, rb, COUNTM, MPI_INT, root, c));
      if (in_place) {
        /* The root's block stays in the send buffer: report that. */
        rbytes = sbytes;
        get(out, sd, s, rbytes);
        *n = rbytes;
        if (q != MPI_REQUEST_NULL) finish(&q);
        return sd;
      }
      break;
    }
    case D_ALLTOALL: {
      size_t per = (size_t)COUNTM * 4;
      rbytes = per * (size_t)size;
      for (int to = 0; to < size; to++)
        for (int i = 0; i < COUNTM; i++) hs[to * COUNTM + i] = val(rank, to, i);
      if (in_place) {
        memcpy(hr, hs, rbytes);
        sb = MPI_IN_PLACE;
        uses_send = 0;
      }
      put(sd, s, hs, rbytes);
      put(rd, r, hr, rbytes + GUARD);
      MPI_OK(nb ? MPI_Ialltoall(sb, COUNTM, MPI_INT, r, COUNTM, MPI_INT, c, &q)
                : MPI_Alltoall(sb, COUNTM, MPI_INT, r, COUNTM, MPI_INT, c));
      break;
    }
    case D_ALLTOALLV: {
      /* To rank j: vcount(j) + rank elements (in place: COUNTM + (rank + j) % 3, the same
       * both ways, as the one layout describes what is sent and received); the layouts
       * have gaps. */
      int at = 0, rat = 0;
      for (int j = 0; j < size; j++) {
        counts[j] = vcount(j) + rank;
        displs[j] = at + 2;
        at = displs[j] + counts[j];
        rcounts[j] = in_place ? COUNTM + (rank + j) % 3 : vcount(rank) + j;
        rdispls[j] = rat + 1;
        rat = rdispls[j] + rcounts[j];
        for (int i = 0; i < counts[j]; i++) hs[displs[j] + i] = val(rank, j, i);
        if (in_place)
          for (int i = 0; i < rcounts[j]; i++) hr[rdispls[j] + i] = val(rank, j, i);
      }
      rbytes = (size_t)rat * 4;
      if (in_place) {
        sb = MPI_IN_PLACE;
        uses_send = 0;
      }
      put(sd, s, hs, (size_t)at * 4);
      put(rd, r, hr, rbytes + GUARD);
      MPI_OK(nb ? MPI_Ialltoallv(sb, counts, displs, MPI_INT, r, rcounts, rdispls, MPI_INT, c, &q)
                : MPI_Alltoallv(sb, counts, displs, MPI_INT, r, rcounts, rdispls, MPI_INT, c));
      break;
    }
    case D_ALLTOALLW: {
      int at = 0, rat = 0;
      for (int j = 0; j < size; j++) {
        counts[j] = wcount(rank, j);
        stypes[j] = wtype(rank, j);
        displs[j] = at + 8;
        wblock((unsigned char *)hs + displs[j], rank, j, counts[j], wsize(rank, j));
        at = displs[j] + counts[j] * wsize(rank, j);
        rcounts[j] = wcount(j, rank);
        rtypes[j] = wtype(j, rank);
        rdispls[j] = rat + 8;
        rat = rdispls[j] + rcounts[j] * wsize(j, rank);
      }
      rbytes = (size_t)rat;
      put(sd, s, hs, (size_t)at);
      put(rd, r, hr, rbytes + GUARD);
      MPI_OK(nb ? MPI_Ialltoallw(s, counts, displs, stypes, r, rcounts, rdispls, rtypes, c, &q)
                : MPI_Alltoallw(s, counts, displs, stypes, r, rcounts, rdispls, rtypes, c));
      break;
    }
  }
  if (q != MPI_REQUEST_NULL) finish(&q);
  *n = rbytes + GUARD;
  get(out, rd, r, *n);
  return (uses_recv && rd) + (uses_send && sd);
}

/* The receive area of the host run must hold what the call means (so that the
 * comparison is not of two wrong answers): checked for the plain layouts. */
static void check_meaning(void) {
  size_t n;
  COUNTM = 5;
  IN_PLACE = 0;
  snprintf(current, sizeof current, "Allgather meaning");
  DCOLL = D_ALLGATHER;
  run_data(M_DEV, 0, got, &n);
  for (int from = 0; from < size; from++)
    for (int i = 0; i < COUNTM; i++) {
      int v;
      memcpy(&v, got + 4 * ((size_t)from * (size_t)COUNTM + (size_t)i), 4);
      CHECK(v == val(from, 0, i), "Allgather: element %d from %d is %d", i, from, v);
    }
  snprintf(current, sizeof current, "Alltoall meaning");
  DCOLL = D_ALLTOALL;
  run_data(M_DEV, 1, got, &n);
  for (int from = 0; from < size; from++)
    for (int i = 0; i < COUNTM; i++) {
      int v;
      memcpy(&v, got + 4 * ((size_t)from * (size_t)COUNTM + (size_t)i), 4);
      CHECK(v == val(from, rank, i), "Alltoall: element %d from %d is %d", i, from, v);
    }
  snprintf(current, sizeof current, "Allreduce meaning");
  T = &types[0];
  OP = MPI_SUM;
  COUNT = 9;
  RCOLL = R_ALLREDUCE;
  run_reduction(M_DEV, 0, got, &n);
  for (int i = 0; i < COUNT; i++) {
    int v, want = 0;
    for (int r = 0; r < size; r++) want += (r * 7 + i * 3) % 4;
    memcpy(&v, got + 4 * (size_t)i, 4);
    CHECK(v == want, "Allreduce sum: element %d is %d, want %d", i, v, want);
  }
}

static void data_movement(void) {
  const int counts[3] = {1, 7, 1001};
  for (DCOLL = 0; DCOLL < DCOLLS; DCOLL++)
    for (int k = 0; k < 3; k++)
      for (IN_PLACE = 0; IN_PLACE <= 1; IN_PLACE++) {
        int can = DCOLL == D_GATHER || DCOLL == D_GATHERV || DCOLL == D_ALLGATHER || DCOLL == D_ALLGATHER_VEC ||
                  DCOLL == D_ALLGATHERV || DCOLL == D_SCATTER || DCOLL == D_SCATTERV || DCOLL == D_ALLTOALL ||
                  DCOLL == D_ALLTOALLV;
        if (IN_PLACE && !can) continue;
        COUNTM = counts[k];
        char what[96];
        snprintf(what, sizeof what, "%s x%d%s", dname[DCOLL], COUNTM, IN_PLACE ? " in place" : "");
        compare(what, run_data, 1);
      }
  IN_PLACE = 0;
}

/* A device buffer in a collective on an intercommunicator: an error naming the call
 * (every rank's buffers are device memory, so no rank enters the collective); host
 * buffers there go to the MPI library as they are. */
static void intercomm(void) {
  MPI_Comm half, inter;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
  MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, rank % 2 ? 0 : 1, 77, &inter);
  MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
  snprintf(current, sizeof current, "intercommunicator");
  int rc = MPI_Allreduce(area[1][0], area[1][1], 4, MPI_INT, MPI_SUM, inter);
  char s[MPI_MAX_ERROR_STRING];
  CHECK(shim_error(rc, MPI_ERR_COMM, "MPI_Allreduce", "intercommunicator", s),
        "device Allreduce on an intercommunicator: error %d, \"%s\"", rc, s);
  int one = 1, sum = 0, remote = 0;
  MPI_Comm_remote_size(inter, &remote);
  MPI_OK(MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, inter));
  CHECK(sum == remote, "host Allreduce on an intercommunicator: %d, want %d", sum, remote);
  MPI_Comm_free(&inter);
  MPI_Comm_free(&half);
}

/* ---- With GPULMT_MPI_STAGING_MAX=1M. ---- */

/* Reductions larger than a piece (256K): split on every rank, the same results on any
 * placement, and the pieces counted. */
static void split_reductions(void) {
  const tinfo *cases_t[2] = {&types[19], &types[27]}; /* MPI_DOUBLE, MPI_DOUBLE_INT */
  const MPI_Op cases_op[2] = {MPI_SUM, MPI_MAXLOC};
  const int cases_count[2] = {100003, 40001};         /* 800 KB, 640 KB */
  for (int k = 0; k < 2; k++)
    for (RCOLL = 0; RCOLL <= R_LOCAL; RCOLL++) {
      if (RCOLL == R_RSB || RCOLL == R_RS) continue; /* not split: staged whole */
      for (IN_PLACE = 0; IN_PLACE <= (RCOLL != R_LOCAL); IN_PLACE++) {
        T = cases_t[k];
        OP = cases_op[k];
        COUNT = cases_count[k];
        gpulmt_mpi_staging_counters a = staging(), b;
        char what[96];
        snprintf(what, sizeof what, "split %s %s x%d%s", rname[RCOLL], T->name, COUNT, IN_PLACE ? " in place" : "");
        compare(what, run_reduction, 0);
        b = staging();
        CHECK(b.split_calls - a.split_calls == MODES && b.pieces - a.pieces >= 3 * MODES, "%s: %llu split calls, %llu pieces", what,
              (unsigned long long)(b.split_calls - a.split_calls), (unsigned long long)(b.pieces - a.pieces));
      }
    }
  IN_PLACE = 0;
  /* The sum means what it should. */
  T = &types[0];
  OP = MPI_SUM;
  COUNT = 300007;
  RCOLL = R_ALLREDUCE;
  size_t n;
  snprintf(current, sizeof current, "split Allreduce meaning");
  run_reduction(M_DEV, 0, got, &n);
  int bad = -1;
  for (int i = 0; i < COUNT && bad < 0; i++) {
    int v, want = 0;
    for (int r = 0; r < size; r++) want += (r * 7 + i * 3) % 4;
    memcpy(&v, got + 4 * (size_t)i, 4);
    if (v != want) bad = i;
  }
  CHECK(bad < 0, "split Allreduce sum: element %d wrong", bad);
}

/* Collectives that would stage more than the cap fail with MPI_ERR_NO_MEM and a
 * message naming the call (on every rank: all buffers are device memory). */
static void over_the_cap(void) {
  MPI_Comm c;
  MPI_Comm_dup(MPI_COMM_WORLD, &c);
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  int n = (int)((2u << 20) / 4); /* 2 MiB of ints */
  MPI_Request q = MPI_REQUEST_NULL;
  for (int k = 0; k < 3; k++) {
    const char *name = k == 0 ? "MPI_Bcast" : k == 1 ? "MPI_Iallreduce" : "MPI_Allgather";
    snprintf(current, sizeof current, "%s over the cap", name);
    int rc = k == 0   ? MPI_Bcast(area[1][1], n, MPI_INT, 0, c)
             : k == 1 ? MPI_Iallreduce(area[1][0], area[1][1], n, MPI_INT, MPI_SUM, c, &q)
                      : MPI_Allgather(area[1][0], n / size, MPI_INT, area[1][1], n / size, MPI_INT, c);
    char s[MPI_MAX_ERROR_STRING];
    CHECK(shim_error(rc, MPI_ERR_NO_MEM, name, "GPULMT_MPI_STAGING_MAX", s), "error %d, \"%s\"", rc, s);
    CHECK(q == MPI_REQUEST_NULL, "a request was made");
  }
  /* Host buffers of that size are the MPI library's, as they are. */
  int *h = calloc((size_t)n, 4), *o = calloc((size_t)n, 4);
  snprintf(current, sizeof current, "host Allreduce over the cap");
  MPI_OK(MPI_Allreduce(h, o, n, MPI_INT, MPI_SUM, c));
  free(h);
  free(o);
  MPI_Comm_free(&c);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (!shim_test_begin(2, 64, gpulmt_mpi_get_staging_counters != NULL)) return 3;
  for (int dev = 0; dev < 2; dev++)
    for (int k = 0; k < 2; k++) {
      area[dev][k] = dev ? gpulmt_mpi_alloc(AREA + GUARD) : malloc(AREA + GUARD);
      if (!area[dev][k]) {
        fprintf(stderr, "rank %d: allocating buffers failed\n", rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
    }
  ref = malloc(AREA + GUARD);
  got = malloc(AREA + GUARD);
  MPI_Type_vector(3, 2, 3, MPI_INT, &VEC);
  MPI_Type_commit(&VEC);
  int small = argc > 1 && strcmp(argv[1], "small") == 0;
  struct {
    const char *name;
    void (*run)(void);
  } parts[] = {{"check_meaning", check_meaning}, {"ops_and_types", ops_and_types}, {"reductions", reductions},
               {"data_movement", data_movement}, {"intercomm", intercomm}},
    small_parts[] = {{"split_reductions", split_reductions}, {"over_the_cap", over_the_cap}};
  size_t nparts = small ? sizeof small_parts / sizeof small_parts[0] : sizeof parts / sizeof parts[0];
  /* COLL_PARTS=name,...: only those parts (for debugging one). */
  const char *only = getenv("COLL_PARTS");
  for (size_t i = 0; i < nparts; i++) {
    const char *name = small ? small_parts[i].name : parts[i].name;
    if (only && !strstr(only, name)) continue;
    int before = failures;
    (small ? small_parts[i].run : parts[i].run)();
    shim_test_part_done(name, before);
  }
  gpulmt_mpi_staging_counters c = staging();
  printf("rank %d staging staged_calls=%llu staged_buffers=%llu staged_bytes=%llu split_calls=%llu pieces=%llu\n", rank,
         (unsigned long long)c.staged_calls, (unsigned long long)c.staged_buffers, (unsigned long long)c.staged_bytes,
         (unsigned long long)c.split_calls, (unsigned long long)c.pieces);
  MPI_Type_free(&VEC);
  for (int dev = 0; dev < 2; dev++)
    for (int k = 0; k < 2; k++) {
      if (dev)
        gpulmt_mpi_free(area[dev][k]);
      else
        free(area[dev][k]);
    }
  free(ref);
  free(got);
  return shim_test_end();
}
