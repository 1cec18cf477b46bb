/*
 * The device path of MPI_Bcast, MPI_Allgather, MPI_Allreduce and MPI_Reduce_scatter_block
 * under libgpulmt_mpi.so
 * (issue 30): with device buffers on every rank and at least GPULMT_MPI_COLL_DEVICE_MIN
 * bytes, the data moves over gpulmt's point-to-point path and MPI_Allreduce reduces on
 * the device (on sim: the same algorithm, the reduction on the host).
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim \
 *     -x GPULMT_MPI_COLL_DEVICE_MIN=64K ./devcoll [off]
 *
 * Every result is checked byte for byte against the same call on host buffers: MPI_Bcast
 * from the first and the last rank, MPI_Allgather with and without MPI_IN_PLACE, and
 * MPI_Allreduce of every op the device path reduces (MPI_SUM, MPI_PROD, MPI_MIN,
 * MPI_MAX) on every type it handles, with and without MPI_IN_PLACE, on odd counts
 * (so that the ranks' chunks differ), MPI_Reduce_scatter_block of every type (sums, in
 * place and not) and a maximum, the values small integers so that floating-point
 * sums are exact in any order. gpulmt_mpi_device_collectives() must count exactly the
 * calls that qualify: all device buffers, at least 64K (the setting the test runs with;
 * a count below it and a count smaller than the number of ranks do not), and none of
 * these fall-backs to the staged path: a host receive buffer on one rank, an op the
 * device path has no kernel for (MPI_BAND, a user-defined op). With
 * "off" (run with GPULMT_MPI_COLL_DEVICE_MIN=off) no call may take the path.
 *
 * Prints "rank R devcoll device_collectives=D" and "rank R ok checks=C" (or FAIL lines,
 * and then exits 1).
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

#define AREA ((size_t)4 << 20)
#define BIG 100003 /* elements: odd, above 64K bytes for every type */
#define SMALL 1001 /* elements: below 64K bytes for every type */

static unsigned char *dsend, *drecv, *hsend, *hrecv, *got;
static int off; /* the path is off: no call may take it */

static void to_dev(void *dst, const void *src, size_t n) {
  if (n && gpulmt_mpi_memcpy(dst, src, n) != 0) FAIL("memcpy to device");
}
static void from_dev(void *dst, const void *src, size_t n) {
  if (n && gpulmt_mpi_memcpy(dst, src, n) != 0) FAIL("memcpy from device");
}

/* Fills n bytes at p with a pattern of rank r and case k, written as elements of
 * `esize` bytes of class `cls` (0 signed integer, 1 unsigned, 2 floating) holding small
 * integers (exact in any type), negative on odd ranks for signed types. */
static void fill(unsigned char *p, size_t n, int esize, int cls, int r, int k) {
  for (size_t i = 0; i * esize < n; i++) {
    long v = (long)((i * 7 + (size_t)r * 3 + (size_t)k) % 5) + 1; /* 1..5 */
    if (cls == 2) {
      if (esize == 4) {
        float f = (float)v;
        memcpy(p + i * esize, &f, 4);
      } else {
        double d = (double)v;
        memcpy(p + i * esize, &d, 8);
      }
    } else if (esize == 4) {
      int32_t x = (int32_t)v * (r % 2 && cls == 0 ? -1 : 1);
      memcpy(p + i * esize, &x, 4);
    } else {
      int64_t x = (int64_t)v * (r % 2 && cls == 0 ? -1 : 1);
      memcpy(p + i * esize, &x, 8);
    }
  }
}

/* Compares n bytes of `got` (copied from drecv) with hrecv, and the device path count. */
static void compare(size_t n, unsigned long long before, int want_path) {
  from_dev(got, drecv, n);
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++)
    if (got[i] != hrecv[i]) bad = i;
  CHECK(bad == n, "byte %zu of %zu is %#x, the host call gives %#x", bad, n, bad < n ? got[bad] : 0,
        bad < n ? hrecv[bad] : 0);
  unsigned long long d = gpulmt_mpi_device_collectives() - before;
  CHECK(d == (unsigned long long)(want_path && !off), "%llu calls took the device path, want %d", d, want_path && !off);
}

static void bcasts(void) {
  for (int k = 0; k < 4; k++) {
    int root = k % 2 ? size - 1 : 0, count = k < 2 ? BIG : SMALL;
    snprintf(current, sizeof current, "MPI_Bcast of %d doubles from %d", count, root);
    size_t n = (size_t)count * 8;
    fill(hrecv, n, 8, 2, rank == root ? 0 : 9, k);
    to_dev(drecv, hrecv, n);
    MPI_OK(MPI_Bcast(hrecv, count, MPI_DOUBLE, root, MPI_COMM_WORLD));
    unsigned long long before = gpulmt_mpi_device_collectives();
    MPI_OK(MPI_Bcast(drecv, count, MPI_DOUBLE, root, MPI_COMM_WORLD));
    compare(n, before, count == BIG);
  }
}

static void allgathers(void) {
  for (int k = 0; k < 4; k++) {
    int in_place = k % 2, count = k < 2 ? BIG / size + 1 : SMALL / size;
    size_t block = (size_t)count * 4, n = block * (size_t)size;
    snprintf(current, sizeof current, "MPI_Allgather of %d ints%s", count, in_place ? " in place" : "");
    fill(hsend, block, 4, 0, rank, k);
    memset(hrecv, 0xEE, n);
    if (in_place) memcpy(hrecv + block * (size_t)rank, hsend, block);
    to_dev(dsend, hsend, block);
    to_dev(drecv, hrecv, n);
    MPI_OK(MPI_Allgather(in_place ? MPI_IN_PLACE : hsend, count, MPI_INT, hrecv, count, MPI_INT, MPI_COMM_WORLD));
    unsigned long long before = gpulmt_mpi_device_collectives();
    MPI_OK(MPI_Allgather(in_place ? MPI_IN_PLACE : dsend, count, MPI_INT, drecv, count, MPI_INT, MPI_COMM_WORLD));
    compare(n, before, n >= (64 << 10));
  }
}

/* One MPI_Allreduce on device and on host buffers, compared. */
static void allreduce(const char *tname, MPI_Datatype t, int esize, int cls, const char *oname, MPI_Op op,
                      int count, int in_place, int host_recv_rank, int want_path) {
  size_t n = (size_t)count * (size_t)esize;
  snprintf(current, sizeof current, "MPI_Allreduce %s %s x%d%s%s", oname, tname, count, in_place ? " in place" : "",
           host_recv_rank >= 0 ? " host receive buffer on one rank" : "");
  fill(hsend, n, esize, cls, rank, count);
  memcpy(hrecv, hsend, n);
  to_dev(in_place ? drecv : dsend, hsend, n);
  unsigned char *dst = rank == host_recv_rank ? got : drecv;
  MPI_OK(MPI_Allreduce(in_place ? MPI_IN_PLACE : hsend, hrecv, count, t, op, MPI_COMM_WORLD));
  unsigned long long before = gpulmt_mpi_device_collectives();
  if (rank == host_recv_rank) memcpy(got, hsend, n);
  MPI_OK(MPI_Allreduce(in_place ? MPI_IN_PLACE : dsend, dst, count, t, op, MPI_COMM_WORLD));
  if (rank == host_recv_rank) to_dev(drecv, got, n);
  compare(n, before, want_path);
}

/* One MPI_Reduce_scatter_block of `count` elements per rank on device and on host
 * buffers, compared (in place: the input in the receive buffer, the result at its start). */
static void reduce_scatter_block(const char *tname, MPI_Datatype t, int esize, int cls, const char *oname, MPI_Op op,
                                 int count, int in_place, int want_path) {
  size_t n = (size_t)count * (size_t)esize, total = n * (size_t)size;
  snprintf(current, sizeof current, "MPI_Reduce_scatter_block %s %s x%d%s", oname, tname, count,
           in_place ? " in place" : "");
  fill(hsend, total, esize, cls, rank, count);
  memcpy(hrecv, hsend, total);
  to_dev(in_place ? drecv : dsend, hsend, total);
  MPI_OK(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : hsend, hrecv, count, t, op, MPI_COMM_WORLD));
  unsigned long long before = gpulmt_mpi_device_collectives();
  MPI_OK(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : dsend, drecv, count, t, op, MPI_COMM_WORLD));
  compare(n, before, want_path);
}

static void band(void *in, void *inout, int *len, MPI_Datatype *t) {
  (void)t;
  for (int i = 0; i < *len; i++) ((int *)inout)[i] &= ((int *)in)[i];
}

static void allreduces(void) {
  struct {
    const char *name;
    MPI_Datatype t;
    int size, cls;
  } types[] = {{"MPI_INT", MPI_INT, 4, 0},
               {"MPI_UNSIGNED", MPI_UNSIGNED, 4, 1},
               {"MPI_LONG", MPI_LONG, (int)sizeof(long), 0},
               {"MPI_UNSIGNED_LONG", MPI_UNSIGNED_LONG, (int)sizeof(unsigned long), 1},
               {"MPI_LONG_LONG", MPI_LONG_LONG, 8, 0},
               {"MPI_UNSIGNED_LONG_LONG", MPI_UNSIGNED_LONG_LONG, 8, 1},
               {"MPI_INT32_T", MPI_INT32_T, 4, 0},
               {"MPI_UINT32_T", MPI_UINT32_T, 4, 1},
               {"MPI_INT64_T", MPI_INT64_T, 8, 0},
               {"MPI_UINT64_T", MPI_UINT64_T, 8, 1},
               {"MPI_FLOAT", MPI_FLOAT, 4, 2},
               {"MPI_DOUBLE", MPI_DOUBLE, 8, 2}};
  struct {
    const char *name;
    MPI_Op op;
  } ops[] = {{"MPI_SUM", MPI_SUM}, {"MPI_PROD", MPI_PROD}, {"MPI_MIN", MPI_MIN}, {"MPI_MAX", MPI_MAX}};
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++)
      allreduce(types[t].name, types[t].t, types[t].size, types[t].cls, ops[o].name, ops[o].op, BIG,
                (int)((t + o) % 2), -1, 1);
  /* Below the threshold. */
  allreduce("MPI_DOUBLE", MPI_DOUBLE, 8, 2, "MPI_SUM", MPI_SUM, SMALL, 0, -1, 0);
  /* The fall-backs: a host buffer on one rank, ops without a kernel. */
  allreduce("MPI_DOUBLE", MPI_DOUBLE, 8, 2, "MPI_SUM", MPI_SUM, BIG, 0, size - 1, 0);
  allreduce("MPI_INT", MPI_INT, 4, 0, "MPI_BAND", MPI_BAND, BIG, 0, -1, 0);
  MPI_Op user;
  MPI_Op_create(band, 1, &user);
  allreduce("MPI_INT", MPI_INT, 4, 0, "a user op", user, BIG, 1, -1, 0);
  MPI_Op_free(&user);
  /* MPI_Reduce_scatter_block: every type (sums), a maximum, below the threshold, MPI_BAND. */
  for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
    reduce_scatter_block(types[t].name, types[t].t, types[t].size, types[t].cls, "MPI_SUM", MPI_SUM, 30011, (int)(t % 2), 1);
  reduce_scatter_block("MPI_DOUBLE", MPI_DOUBLE, 8, 2, "MPI_MAX", MPI_MAX, 30011, 0, 1);
  reduce_scatter_block("MPI_DOUBLE", MPI_DOUBLE, 8, 2, "MPI_SUM", MPI_SUM, 101, 0, 0);
  reduce_scatter_block("MPI_INT", MPI_INT, 4, 0, "MPI_BAND", MPI_BAND, 30011, 1, 0);
}

/* A duplicate communicator: its own duplicate for the device path, freed with it. */
static void duplicate(void) {
  snprintf(current, sizeof current, "MPI_Allreduce on a duplicate, freed after");
  for (int k = 0; k < 3; k++) {
    MPI_Comm c;
    MPI_Comm_dup(MPI_COMM_WORLD, &c);
    size_t n = (size_t)BIG * 8;
    fill(hsend, n, 8, 2, rank, k);
    to_dev(dsend, hsend, n);
    MPI_OK(MPI_Allreduce(hsend, hrecv, BIG, MPI_DOUBLE, MPI_MAX, c));
    unsigned long long before = gpulmt_mpi_device_collectives();
    MPI_OK(MPI_Allreduce(dsend, drecv, BIG, MPI_DOUBLE, MPI_MAX, c));
    compare(n, before, 1);
    MPI_Comm_free(&c);
  }
}

/* Issue 46: device collectives on communicators other than MPI_COMM_WORLD only, kept
   until MPI_Finalize (a dup and a split with the ranks reversed), and one freed: finalize
   must tear down only what the shim made. */
static void other_communicators_only(void) {
  MPI_Comm kept[2];
  MPI_Comm_dup(MPI_COMM_WORLD, &kept[0]);
  MPI_Comm_split(MPI_COMM_WORLD, 0, size - rank, &kept[1]);
  for (int k = 0; k < 2; k++) {
    snprintf(current, sizeof current, "MPI_Allreduce and MPI_Bcast on a %s kept to finalize", k ? "split" : "dup");
    size_t n = (size_t)BIG * 8;
    fill(hsend, n, 8, 2, rank, k);
    to_dev(dsend, hsend, n);
    MPI_OK(MPI_Allreduce(hsend, hrecv, BIG, MPI_DOUBLE, MPI_SUM, kept[k]));
    unsigned long long before = gpulmt_mpi_device_collectives();
    MPI_OK(MPI_Allreduce(dsend, drecv, BIG, MPI_DOUBLE, MPI_SUM, kept[k]));
    compare(n, before, 1);
    fill(hrecv, n, 8, 2, rank == 0 ? 0 : 9, k);
    to_dev(drecv, hrecv, n);
    MPI_OK(MPI_Bcast(hrecv, BIG, MPI_DOUBLE, 0, kept[k]));
    before = gpulmt_mpi_device_collectives();
    MPI_OK(MPI_Bcast(drecv, BIG, MPI_DOUBLE, 0, kept[k]));
    compare(n, before, 1);
  }
  duplicate();
  /* As in a program that never set one: an error in MPI_Finalize aborts the job. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (!shim_test_begin(1, 0, gpulmt_mpi_device_collectives != NULL)) return 3;
  off = argc > 1 && strcmp(argv[1], "off") == 0;
  int others_only = argc > 1 && strcmp(argv[1], "others-only") == 0;
  dsend = gpulmt_mpi_alloc(AREA);
  drecv = gpulmt_mpi_alloc(AREA);
  hsend = malloc(AREA);
  hrecv = malloc(AREA);
  got = malloc(AREA);
  if (!dsend || !drecv || !hsend || !hrecv || !got) {
    fprintf(stderr, "rank %d: allocating buffers failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (others_only) {
    other_communicators_only();
  } else {
    bcasts();
    allgathers();
    allreduces();
    duplicate();
  }
  printf("rank %d devcoll device_collectives=%llu\n", rank, (unsigned long long)gpulmt_mpi_device_collectives());
  gpulmt_mpi_free(dsend);
  gpulmt_mpi_free(drecv);
  free(hsend);
  free(hrecv);
  free(got);
  return shim_test_end();
}
