/*
 * MPI-4's persistent collectives under libgpulmt_mpi.so (issue 30): each call's request is
 * made once with MPI_*_init on device buffers (gpulmt_mpi_alloc), started three times with
 * new data each time (MPI_Start, MPI_Wait), and every byte of its receive buffer checked
 * against the same blocking call on host buffers with the same data. Placements: device
 * buffers on every rank, and on even ranks only (odd ranks host buffers: every rank must
 * still issue the same library call). Each start on device buffers must have been staged
 * by the shim (its staging counters), so that an MPI library reading device memory itself
 * (which works on sim, not on a GPU) cannot pass for the shim. Also MPI_Startall of two
 * requests, MPI_IN_PLACE, MPI_Request_free of an active request refused with an error, and a
 * persistent neighborhood collective refusing device buffers at init.
 *
 * mpiexec -n N -genv LD_PRELOAD libgpulmt_mpi.so -genv GPULMT_DEVICE sim ./pcoll
 *
 * Needs an MPI whose mpi.h declares them (MPI_VERSION >= 4: MPICH 4); with an older one it
 * prints "skip: ..." and exits 77. Prints "rank R ok checks=C" (or FAIL lines, and then
 * exits 1).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

static int rank, size, failures, checks;
static char current[160];
#define CHECK_CONTEXT current
#include "check.h"

#if MPI_VERSION >= 4

#define B 1001 /* ints per rank's block: odd */
#define ROUNDS 3

enum {
  ALLREDUCE,
  ALLREDUCE_IN_PLACE,
  BCAST,
  REDUCE,
  SCAN,
  EXSCAN,
  REDUCE_SCATTER_BLOCK,
  REDUCE_SCATTER,
  GATHER,
  GATHERV,
  ALLGATHER,
  ALLGATHERV,
  SCATTER,
  SCATTERV,
  ALLTOALL,
  ALLTOALLV,
  ALLTOALLW,
  CASES
};
static const char *names[CASES] = {"Allreduce", "Allreduce(IN_PLACE)", "Bcast",    "Reduce",     "Scan",     "Exscan",
                                   "Reduce_scatter_block", "Reduce_scatter", "Gather", "Gatherv", "Allgather",
                                   "Allgatherv", "Scatter", "Scatterv", "Alltoall", "Alltoallv", "Alltoallw"};

static int *counts, *displs;
static MPI_Datatype *types;
static size_t bytes; /* of each buffer: size blocks */

/* Case `c` on send buffer s and receive buffer r: its init call when `req` is given,
 * else the blocking call. */
static int call(int c, void *s, void *r, MPI_Request *req) {
  MPI_Comm w = MPI_COMM_WORLD;
  MPI_Info i = MPI_INFO_NULL;
  int last = size - 1;
  switch (c) {
  case ALLREDUCE: return req ? MPI_Allreduce_init(s, r, B, MPI_INT, MPI_SUM, w, i, req) : MPI_Allreduce(s, r, B, MPI_INT, MPI_SUM, w);
  case ALLREDUCE_IN_PLACE:
    return req ? MPI_Allreduce_init(MPI_IN_PLACE, r, B, MPI_INT, MPI_MAX, w, i, req)
               : MPI_Allreduce(MPI_IN_PLACE, r, B, MPI_INT, MPI_MAX, w);
  case BCAST: return req ? MPI_Bcast_init(r, B, MPI_INT, last, w, i, req) : MPI_Bcast(r, B, MPI_INT, last, w);
  case REDUCE: return req ? MPI_Reduce_init(s, r, B, MPI_INT, MPI_SUM, 0, w, i, req) : MPI_Reduce(s, r, B, MPI_INT, MPI_SUM, 0, w);
  case SCAN: return req ? MPI_Scan_init(s, r, B, MPI_INT, MPI_SUM, w, i, req) : MPI_Scan(s, r, B, MPI_INT, MPI_SUM, w);
  case EXSCAN: return req ? MPI_Exscan_init(s, r, B, MPI_INT, MPI_SUM, w, i, req) : MPI_Exscan(s, r, B, MPI_INT, MPI_SUM, w);
  case REDUCE_SCATTER_BLOCK:
    return req ? MPI_Reduce_scatter_block_init(s, r, B, MPI_INT, MPI_SUM, w, i, req)
               : MPI_Reduce_scatter_block(s, r, B, MPI_INT, MPI_SUM, w);
  case REDUCE_SCATTER:
    return req ? MPI_Reduce_scatter_init(s, r, counts, MPI_INT, MPI_SUM, w, i, req)
               : MPI_Reduce_scatter(s, r, counts, MPI_INT, MPI_SUM, w);
  case GATHER:
    return req ? MPI_Gather_init(s, B, MPI_INT, r, B, MPI_INT, last, w, i, req) : MPI_Gather(s, B, MPI_INT, r, B, MPI_INT, last, w);
  case GATHERV:
    return req ? MPI_Gatherv_init(s, B, MPI_INT, r, counts, displs, MPI_INT, 0, w, i, req)
               : MPI_Gatherv(s, B, MPI_INT, r, counts, displs, MPI_INT, 0, w);
  case ALLGATHER:
    return req ? MPI_Allgather_init(s, B, MPI_INT, r, B, MPI_INT, w, i, req) : MPI_Allgather(s, B, MPI_INT, r, B, MPI_INT, w);
  case ALLGATHERV:
    return req ? MPI_Allgatherv_init(s, B, MPI_INT, r, counts, displs, MPI_INT, w, i, req)
               : MPI_Allgatherv(s, B, MPI_INT, r, counts, displs, MPI_INT, w);
  case SCATTER:
    return req ? MPI_Scatter_init(s, B, MPI_INT, r, B, MPI_INT, 0, w, i, req) : MPI_Scatter(s, B, MPI_INT, r, B, MPI_INT, 0, w);
  case SCATTERV:
    return req ? MPI_Scatterv_init(s, counts, displs, MPI_INT, r, B, MPI_INT, last, w, i, req)
               : MPI_Scatterv(s, counts, displs, MPI_INT, r, B, MPI_INT, last, w);
  case ALLTOALL:
    return req ? MPI_Alltoall_init(s, B, MPI_INT, r, B, MPI_INT, w, i, req) : MPI_Alltoall(s, B, MPI_INT, r, B, MPI_INT, w);
  case ALLTOALLV:
    return req ? MPI_Alltoallv_init(s, counts, displs, MPI_INT, r, counts, displs, MPI_INT, w, i, req)
               : MPI_Alltoallv(s, counts, displs, MPI_INT, r, counts, displs, MPI_INT, w);
  case ALLTOALLW: {
    /* Displacements in bytes here. */
    int bd[64];
    for (int k = 0; k < size && k < 64; k++) bd[k] = displs[k] * (int)sizeof(int);
    static int wd[64];
    memcpy(wd, bd, sizeof bd);
    return req ? MPI_Alltoallw_init(s, counts, wd, types, r, counts, wd, types, w, i, req)
               : MPI_Alltoallw(s, counts, bd, types, r, counts, bd, types, w);
  }
  }
  return MPI_ERR_OTHER;
}

/* Send data of rank r, case c, round k (small values: sums stay exact). */
static void fill(int *p, int r, int c, int k) {
  for (size_t j = 0; j < bytes / sizeof(int); j++) p[j] = (int)((j * 7 + (size_t)r * 13 + (size_t)c * 3 + (size_t)k) % 101) - 50;
}

static uint64_t staged(void) {
  gpulmt_mpi_staging_counters c;
  if (gpulmt_mpi_get_staging_counters(&c) != 0) FAIL("gpulmt_mpi_get_staging_counters");
  return c.staged_calls;
}

static void to_dev(void *dst, const void *src) {
  if (gpulmt_mpi_memcpy(dst, src, bytes) != 0) FAIL("memcpy to device");
}

/* One case with buffers on the device where `dev`, else on the host. */
static void run_case(int c, int dev) {
  unsigned char *ds = dev ? gpulmt_mpi_alloc(bytes) : malloc(bytes), *dr = dev ? gpulmt_mpi_alloc(bytes) : malloc(bytes);
  int *hs = malloc(bytes), *hr = malloc(bytes), *got = malloc(bytes);
  if (!ds || !dr || !hs || !hr || !got) {
    fprintf(stderr, "rank %d: allocating %zu bytes failed\n", rank, bytes);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_OK(call(c, ds, dr, &req));
  for (int k = 0; k < ROUNDS; k++) {
    snprintf(current, sizeof current, "%s, %s buffers, start %d", names[c], dev ? "device" : "host", k);
    fill(hs, rank, c, k);
    /* The receive buffer holds data too: the input of IN_PLACE and Bcast's root, and the
     * bytes a call leaves alone must stay. */
    fill(hr, rank + 100, c, k);
    to_dev(ds, hs);
    to_dev(dr, hr);
    uint64_t before = staged();
    MPI_OK(MPI_Start(&req));
    MPI_OK(MPI_Wait(&req, MPI_STATUS_IGNORE));
    CHECK(req != MPI_REQUEST_NULL, "the persistent request was freed by MPI_Wait");
    if (dev) CHECK(staged() > before, "the start on device buffers was not staged by the shim");
    MPI_OK(call(c, hs, hr, NULL));
    if (gpulmt_mpi_memcpy(got, dr, bytes) != 0) FAIL("memcpy from device");
    if (c == EXSCAN && rank == 0) continue; /* its receive buffer is undefined */
    size_t bad = bytes / sizeof(int);
    for (size_t j = 0; j < bytes / sizeof(int); j++)
      if (got[j] != hr[j]) {
        bad = j;
        break;
      }
    CHECK(bad == bytes / sizeof(int), "int %zu of %zu is %d, the host call gave %d", bad, bytes / sizeof(int),
          bad < bytes / sizeof(int) ? got[bad] : 0, bad < bytes / sizeof(int) ? hr[bad] : 0);
  }
  MPI_OK(MPI_Request_free(&req));
  CHECK(req == MPI_REQUEST_NULL, "MPI_Request_free left the handle");
  if (dev) {
    gpulmt_mpi_free(ds);
    gpulmt_mpi_free(dr);
  } else {
    free(ds);
    free(dr);
  }
  free(hs);
  free(hr);
  free(got);
}

/* MPI_Startall of an Allreduce and a Bcast on device buffers, then an active request's
 * MPI_Request_free refused (MPI-4 makes it erroneous; the request stays usable). */
static void startall_and_free(void) {
  snprintf(current, sizeof current, "Startall");
  int *a = gpulmt_mpi_alloc(bytes), *b = gpulmt_mpi_alloc(bytes), *h = malloc(bytes), *g = malloc(bytes);
  MPI_Request r[2];
  MPI_OK(MPI_Allreduce_init(MPI_IN_PLACE, a, B, MPI_INT, MPI_SUM, MPI_COMM_WORLD, MPI_INFO_NULL, &r[0]));
  MPI_OK(MPI_Bcast_init(b, B, MPI_INT, 0, MPI_COMM_WORLD, MPI_INFO_NULL, &r[1]));
  for (int k = 0; k < 2; k++) {
    fill(h, rank, 50, k);
    to_dev(a, h);
    to_dev(b, h);
    MPI_OK(MPI_Startall(2, r));
    MPI_OK(MPI_Waitall(2, r, MPI_STATUSES_IGNORE));
    gpulmt_mpi_memcpy(g, a, bytes);
    int ok = 1;
    for (int j = 0; j < B; j++) {
      int want = 0;
      for (int q = 0; q < size; q++) want += (int)((j * 7 + (size_t)q * 13 + 150 + (size_t)k) % 101) - 50;
      ok &= g[j] == want;
    }
    CHECK(ok, "Startall: the in-place sum differs from the sum of every rank's data (round %d)", k);
    gpulmt_mpi_memcpy(g, b, bytes);
    fill(h, 0, 50, k);
    CHECK(memcmp(g, h, (size_t)B * sizeof(int)) == 0, "Startall: the broadcast differs from rank 0's data (round %d)", k);
  }
  snprintf(current, sizeof current, "Request_free of an active request");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_OK(MPI_Start(&r[0]));
  MPI_Request keep = r[0];
  CHECK(MPI_Request_free(&r[0]) != MPI_SUCCESS, "freeing an active persistent collective succeeded");
  CHECK(r[0] == keep, "the refused MPI_Request_free changed the handle");
  MPI_OK(MPI_Wait(&r[0], MPI_STATUS_IGNORE));
  MPI_OK(MPI_Request_free(&r[0]));
  MPI_OK(MPI_Request_free(&r[1]));
  gpulmt_mpi_free(a);
  gpulmt_mpi_free(b);
  free(h);
  free(g);
}

/* A persistent neighborhood collective on device buffers: refused at init with an error
 * naming the call, no request made. (Host buffers are the library's own call: MPICH 4.0's
 * persistent neighborhood allgather on a periodic ring of 2 ranks never completed here,
 * shim or not, so it is not run.) */
static void neighborhood(void) {
  snprintf(current, sizeof current, "Neighbor_allgather_init");
  MPI_Comm ring;
  int dims[1] = {size}, periods[1] = {1};
  MPI_OK(MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &ring));
  MPI_Comm_set_errhandler(ring, MPI_ERRORS_RETURN);
  int *dev = gpulmt_mpi_alloc(4 * sizeof(int));
  MPI_Request r = MPI_REQUEST_NULL;
  char s[MPI_MAX_ERROR_STRING];
  int rc = MPI_Neighbor_allgather_init(dev, 1, MPI_INT, dev + 2, 1, MPI_INT, ring, MPI_INFO_NULL, &r);
  CHECK(shim_error(rc, MPI_ERR_UNSUPPORTED_OPERATION, "MPI_Neighbor_allgather_init", "neighborhood", s),
        "device MPI_Neighbor_allgather_init: error %d, \"%s\"", rc, s);
  CHECK(r == MPI_REQUEST_NULL, "a request was made");
  gpulmt_mpi_free(dev);
  MPI_Comm_free(&ring);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (!shim_test_begin(1, 64, gpulmt_mpi_get_staging_counters != NULL)) return 3;
  bytes = (size_t)size * B * sizeof(int);
  counts = malloc(sizeof(int) * (size_t)size);
  displs = malloc(sizeof(int) * (size_t)size);
  types = malloc(sizeof(MPI_Datatype) * (size_t)size);
  for (int k = 0; k < size; k++) {
    counts[k] = B;
    displs[k] = k * B;
    types[k] = MPI_INT;
  }
  for (int c = 0; c < CASES; c++) {
    run_case(c, 1);
    run_case(c, rank % 2 == 0);
  }
  startall_and_free();
  neighborhood();
  free(counts);
  free(displs);
  free(types);
  return shim_test_end();
}

#else

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  (void)current;
  if (rank == 0) printf("skip: this MPI (MPI_VERSION %d) has no persistent collectives (MPI-4)\n", MPI_VERSION);
  MPI_Finalize();
  return 77;
}

#endif
