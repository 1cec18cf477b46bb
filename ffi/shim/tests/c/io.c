/*
 * MPI-IO and neighbourhood collectives with device buffers under libgpulmt_mpi.so
 * (issue 30: every call that takes a buffer either works on device memory or fails with
 * an error naming the call).
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim ./io DIR
 *
 * MPI-IO (files in DIR): every blocking and non-blocking read and write (explicit
 * offsets, individual file pointers, collective forms, ordered forms on a shared file,
 * shared file pointers on a file of each rank's own) writes from a device buffer and
 * reads into one. Each write is checked through a plain host read of the file (what
 * the same call on a host buffer writes), each read against the data written, with a
 * guard past the buffer that must stay untouched; a read with a vector datatype into a
 * device buffer must leave the gaps between its blocks untouched. The staging counters
 * show that every device call was staged (sim device memory is host-addressable, so a
 * library reading it directly would pass too) and no host call was. The split
 * collectives (MPI_File_write_all_begin ...) refuse device buffers with
 * MPI_ERR_UNSUPPORTED_OPERATION naming the call, and run on host buffers.
 *
 * Neighbourhood collectives on a periodic ring (MPI_Cart_create): on host buffers they
 * give each rank its neighbours' data; with device buffers (on every rank, so that no
 * rank enters the collective) MPI_Neighbor_allgather and MPI_Ineighbor_alltoall fail
 * with MPI_ERR_UNSUPPORTED_OPERATION naming the call, and make no request.
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

#define N 1037 /* ints per rank and case: odd */
#define GUARD 64
#define BYTES ((size_t)N * 4)

static unsigned char *dev, *host, *want;

static gpulmt_mpi_staging_counters staging(void) {
  gpulmt_mpi_staging_counters c;
  if (gpulmt_mpi_get_staging_counters(&c) != 0) FAIL("gpulmt_mpi_get_staging_counters");
  return c;
}

/* The ints case `k` writes on rank `r`. */
static void pattern(unsigned char *out, int k, int r) {
  for (int i = 0; i < N; i++) {
    int v = r * 1000003 + k * 7919 + i;
    memcpy(out + 4 * (size_t)i, &v, 4);
  }
}

static void to_dev(void *dst, const void *src, size_t n) {
  if (gpulmt_mpi_memcpy(dst, src, n) != 0) FAIL("memcpy to device");
}

/* Fills the device buffer and its guard with the marker byte `b`. */
static void mark_dev(unsigned char b) {
  memset(host, b, BYTES + GUARD);
  to_dev(dev, host, BYTES + GUARD);
}

/* Copies the device buffer and its guard to `host`. */
static void from_dev(void) {
  if (gpulmt_mpi_memcpy(host, dev, BYTES + GUARD) != 0) FAIL("memcpy from device");
}

/* Whether `got` holds `want` (n bytes) and then GUARD bytes of `b`. */
static void check_data(const unsigned char *got, size_t n, unsigned char b, const char *what) {
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++)
    if (got[i] != want[i]) bad = i;
  CHECK(bad == n, "%s: byte %zu is %#x, want %#x", what, bad, bad < n ? got[bad] : 0, bad < n ? want[bad] : 0);
  size_t g = GUARD;
  for (size_t i = 0; i < GUARD && g == GUARD; i++)
    if (got[n + i] != b) g = i;
  CHECK(g == GUARD, "%s: guard byte %zu overwritten", what, g);
}

enum { W_AT, W_AT_ALL, W_IAT, W_IAT_ALL, W_SEEK, W_SEEK_ALL, W_ISEEK, W_ISEEK_ALL, W_ORDERED, W_SHARED, W_ISHARED, FORMS };
static const char *const wname[FORMS] = {"write_at",  "write_at_all", "iwrite_at",     "iwrite_at_all",
                                         "write",     "write_all",    "iwrite",        "iwrite_all",
                                         "write_ordered", "write_shared", "iwrite_shared"};
static const char *const rname[FORMS] = {"read_at",  "read_at_all", "iread_at",     "iread_at_all", "read",
                                         "read_all", "iread",       "iread_all",    "read_ordered", "read_shared",
                                         "iread_shared"};

/* Whether form `f` runs on the file of this rank's own (shared file pointers, which
 * ranks of one file would share in an order of the library's). */
static int own_file(int f) { return f == W_SHARED || f == W_ISHARED; }

/* Writes (`rd` 0) or reads (`rd` 1) the rank's block of `fh` with form `f` on `buf`
 * (BYTES), at offset `off` (the rank's block: on the shared file, rank * BYTES). */
static int io(MPI_File fh, int f, int rd, void *buf, MPI_Offset off) {
  MPI_Request q = MPI_REQUEST_NULL;
  MPI_Status st;
  int rc;
  if (f >= W_SEEK && f <= W_ISEEK_ALL) MPI_OK(MPI_File_seek(fh, off, MPI_SEEK_SET));
  if (own_file(f) || f == W_ORDERED) MPI_OK(MPI_File_seek_shared(fh, 0, MPI_SEEK_SET));
  switch (f) {
    case W_AT: rc = rd ? MPI_File_read_at(fh, off, buf, N, MPI_INT, &st) : MPI_File_write_at(fh, off, buf, N, MPI_INT, &st); break;
    case W_AT_ALL:
      rc = rd ? MPI_File_read_at_all(fh, off, buf, N, MPI_INT, &st) : MPI_File_write_at_all(fh, off, buf, N, MPI_INT, &st);
      break;
    case W_IAT: rc = rd ? MPI_File_iread_at(fh, off, buf, N, MPI_INT, &q) : MPI_File_iwrite_at(fh, off, buf, N, MPI_INT, &q); break;
    case W_IAT_ALL:
      rc = rd ? MPI_File_iread_at_all(fh, off, buf, N, MPI_INT, &q) : MPI_File_iwrite_at_all(fh, off, buf, N, MPI_INT, &q);
      break;
    case W_SEEK: rc = rd ? MPI_File_read(fh, buf, N, MPI_INT, &st) : MPI_File_write(fh, buf, N, MPI_INT, &st); break;
    case W_SEEK_ALL: rc = rd ? MPI_File_read_all(fh, buf, N, MPI_INT, &st) : MPI_File_write_all(fh, buf, N, MPI_INT, &st); break;
    case W_ISEEK: rc = rd ? MPI_File_iread(fh, buf, N, MPI_INT, &q) : MPI_File_iwrite(fh, buf, N, MPI_INT, &q); break;
    case W_ISEEK_ALL: rc = rd ? MPI_File_iread_all(fh, buf, N, MPI_INT, &q) : MPI_File_iwrite_all(fh, buf, N, MPI_INT, &q); break;
    case W_ORDERED:
      rc = rd ? MPI_File_read_ordered(fh, buf, N, MPI_INT, &st) : MPI_File_write_ordered(fh, buf, N, MPI_INT, &st);
      break;
    case W_SHARED: rc = rd ? MPI_File_read_shared(fh, buf, N, MPI_INT, &st) : MPI_File_write_shared(fh, buf, N, MPI_INT, &st); break;
    default: rc = rd ? MPI_File_iread_shared(fh, buf, N, MPI_INT, &q) : MPI_File_iwrite_shared(fh, buf, N, MPI_INT, &q);
  }
  if (rc == MPI_SUCCESS && q != MPI_REQUEST_NULL) {
    rc = MPI_Wait(&q, MPI_STATUS_IGNORE);
    CHECK(q == MPI_REQUEST_NULL, "request not freed");
  }
  return rc;
}

/* Makes every rank's writes to `fh` visible to every rank's reads (MPI-IO's sync-barrier-sync). */
static void settle(MPI_File fh, MPI_Comm comm) {
  MPI_OK(MPI_File_sync(fh));
  MPI_Barrier(comm);
  MPI_OK(MPI_File_sync(fh));
}

static void file_forms(MPI_File shared, MPI_File own) {
  for (int f = 0; f < FORMS; f++) {
    MPI_File fh = own_file(f) ? own : shared;
    MPI_Comm comm = own_file(f) ? MPI_COMM_SELF : MPI_COMM_WORLD;
    MPI_Offset off = own_file(f) ? 0 : (MPI_Offset)rank * (MPI_Offset)BYTES;
    gpulmt_mpi_staging_counters a, b;

    /* Write from a device buffer; the file then holds what a host write puts there. */
    snprintf(current, sizeof current, "%s from device memory", wname[f]);
    pattern(want, f, rank);
    to_dev(dev, want, BYTES);
    a = staging();
    MPI_OK(io(fh, f, 0, dev, off));
    b = staging();
    CHECK(b.staged_calls - a.staged_calls == 1 && b.staged_buffers - a.staged_buffers == 1, "staged %llu calls",
          (unsigned long long)(b.staged_calls - a.staged_calls));
    settle(fh, comm);
    memset(host, 0xA5, BYTES + GUARD);
    MPI_Status st;
    a = staging();
    MPI_OK(MPI_File_read_at(fh, off, host, N, MPI_INT, &st));
    b = staging();
    CHECK(b.staged_calls == a.staged_calls, "a host read was staged");
    int count = -1;
    MPI_Get_count(&st, MPI_INT, &count);
    CHECK(count == N, "host read of the written block: %d ints, want %d", count, N);
    check_data(host, BYTES, 0xA5, "the file after the device write");
    settle(fh, comm);

    /* Read into a device buffer: the data, and nothing past it. */
    snprintf(current, sizeof current, "%s into device memory", rname[f]);
    mark_dev(0x5A);
    a = staging();
    MPI_OK(io(fh, f, 1, dev, off));
    b = staging();
    CHECK(b.staged_calls - a.staged_calls == 1 && b.staged_buffers - a.staged_buffers == 1, "staged %llu calls",
          (unsigned long long)(b.staged_calls - a.staged_calls));
    from_dev();
    check_data(host, BYTES, 0x5A, "the device buffer after the read");
    settle(fh, comm);
  }
}

/* A read with a vector datatype into device memory: the blocks get the file's data, the
 * gaps between them keep what they held. */
static void strided_read(MPI_File fh) {
  snprintf(current, sizeof current, "read_at of a vector type into device memory");
  MPI_Datatype vec;
  MPI_Type_vector(N / 3, 2, 3, MPI_INT, &vec); /* 2 ints of every 3 */
  MPI_Type_commit(&vec);
  pattern(want, 99, rank);
  MPI_Offset off = (MPI_Offset)rank * (MPI_Offset)BYTES;
  MPI_OK(MPI_File_write_at(fh, off, want, N, MPI_INT, MPI_STATUS_IGNORE));
  settle(fh, MPI_COMM_WORLD);
  mark_dev(0x3C);
  MPI_OK(MPI_File_read_at(fh, off, dev, 1, vec, MPI_STATUS_IGNORE));
  from_dev();
  /* What the same read gives on host memory. */
  unsigned char *ref = malloc(BYTES + GUARD);
  memset(ref, 0x3C, BYTES + GUARD);
  MPI_OK(MPI_File_read_at(fh, off, ref, 1, vec, MPI_STATUS_IGNORE));
  memcpy(want, ref, BYTES);
  check_data(host, BYTES, 0x3C, "strided read");
  int gap_kept = 1;
  for (int i = 2; i < N - 3; i += 3)
    if (host[4 * i] != 0x3C) gap_kept = 0;
  CHECK(gap_kept, "a gap of the vector type was written");
  free(ref);
  MPI_Type_free(&vec);
  settle(fh, MPI_COMM_WORLD);
}

/* Split collectives: device buffers refused with an error naming the call (on every
 * rank, so no rank enters the collective); host buffers work. */
static void split_collectives(MPI_File fh) {
  MPI_Offset off = (MPI_Offset)rank * (MPI_Offset)BYTES;
  char s[MPI_MAX_ERROR_STRING];
  snprintf(current, sizeof current, "split collectives on device memory");
  int rc = MPI_File_write_at_all_begin(fh, off, dev, N, MPI_INT);
  CHECK(shim_error(rc, MPI_ERR_UNSUPPORTED_OPERATION, "MPI_File_write_at_all_begin", "split collective", s),
        "device MPI_File_write_at_all_begin: error %d, \"%s\"", rc, s);
  rc = MPI_File_read_all_begin(fh, dev, N, MPI_INT);
  CHECK(shim_error(rc, MPI_ERR_UNSUPPORTED_OPERATION, "MPI_File_read_all_begin", "split collective", s),
        "device MPI_File_read_all_begin: error %d, \"%s\"", rc, s);

  snprintf(current, sizeof current, "split collectives on host memory");
  pattern(want, 77, rank);
  MPI_OK(MPI_File_write_at_all_begin(fh, off, want, N, MPI_INT));
  MPI_OK(MPI_File_write_at_all_end(fh, want, MPI_STATUS_IGNORE));
  settle(fh, MPI_COMM_WORLD);
  memset(host, 0x11, BYTES + GUARD);
  MPI_OK(MPI_File_read_at_all_begin(fh, off, host, N, MPI_INT));
  MPI_OK(MPI_File_read_at_all_end(fh, host, MPI_STATUS_IGNORE));
  check_data(host, BYTES, 0x11, "split read on host memory");
}

static void mpi_io(const char *dir) {
  char path[4096];
  MPI_File shared, own;
  snprintf(path, sizeof path, "%s/shared.dat", dir);
  snprintf(current, sizeof current, "opening the files");
  MPI_OK(MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &shared));
  snprintf(path, sizeof path, "%s/own%d.dat", dir, rank);
  MPI_OK(MPI_File_open(MPI_COMM_SELF, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &own));
  MPI_File_set_errhandler(shared, MPI_ERRORS_RETURN);
  MPI_File_set_errhandler(own, MPI_ERRORS_RETURN);
  file_forms(shared, own);
  strided_read(shared);
  split_collectives(shared);
  MPI_OK(MPI_File_close(&own));
  MPI_OK(MPI_File_close(&shared));
}

static void neighbours(void) {
  MPI_Comm ring;
  int dims[1] = {size}, periods[1] = {1};
  MPI_Cart_create(MPI_COMM_WORLD, 1, dims, periods, 0, &ring);
  MPI_Comm_set_errhandler(ring, MPI_ERRORS_RETURN);
  int me, left, right;
  MPI_Comm_rank(ring, &me);
  MPI_Cart_shift(ring, 0, 1, &left, &right);

  snprintf(current, sizeof current, "neighbourhood collectives on host memory");
  int mine[2] = {me * 10 + 1, me * 10 + 2}, from[2] = {-1, -1};
  MPI_OK(MPI_Neighbor_allgather(mine, 1, MPI_INT, from, 1, MPI_INT, ring));
  CHECK(from[0] == left * 10 + 1 && from[1] == right * 10 + 1, "allgather: %d %d", from[0], from[1]);
  MPI_Request q = MPI_REQUEST_NULL;
  MPI_OK(MPI_Ineighbor_alltoall(mine, 1, MPI_INT, from, 1, MPI_INT, ring, &q));
  MPI_OK(MPI_Wait(&q, MPI_STATUS_IGNORE));
  /* To the left neighbour goes mine[0], to the right mine[1]: from the left comes its
   * [1], from the right its [0]. On a ring of 2 the left and right neighbour are one
   * rank, whose two blocks arrive in an order of the library's. */
  if (size > 2)
    CHECK(from[0] == left * 10 + 2 && from[1] == right * 10 + 1, "alltoall: %d %d", from[0], from[1]);
  else
    CHECK(from[0] + from[1] == left * 20 + 3 && from[0] != from[1], "alltoall: %d %d", from[0], from[1]);

  snprintf(current, sizeof current, "neighbourhood collectives on device memory");
  char s[MPI_MAX_ERROR_STRING];
  int rc = MPI_Neighbor_allgather(dev, 1, MPI_INT, dev + 64, 1, MPI_INT, ring);
  CHECK(shim_error(rc, MPI_ERR_UNSUPPORTED_OPERATION, "MPI_Neighbor_allgather", "neighborhood", s),
        "device MPI_Neighbor_allgather: error %d, \"%s\"", rc, s);
  rc = MPI_Ineighbor_alltoall(mine, 1, MPI_INT, dev, 1, MPI_INT, ring, &q);
  CHECK(shim_error(rc, MPI_ERR_UNSUPPORTED_OPERATION, "MPI_Ineighbor_alltoall", "neighborhood", s),
        "device MPI_Ineighbor_alltoall: error %d, \"%s\"", rc, s);
  CHECK(q == MPI_REQUEST_NULL, "a request was made");
  MPI_Comm_free(&ring);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (!shim_test_begin(1, 0, gpulmt_mpi_get_staging_counters != NULL)) return 3;
  if (argc < 2) {
    fprintf(stderr, "usage: io DIR (a directory every rank can write)\n");
    MPI_Finalize();
    return 2;
  }
  dev = gpulmt_mpi_alloc(BYTES + GUARD);
  host = malloc(BYTES + GUARD);
  want = malloc(BYTES + GUARD);
  if (!dev || !host || !want) {
    fprintf(stderr, "rank %d: allocating buffers failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  mpi_io(argv[1]);
  MPI_Barrier(MPI_COMM_WORLD);
  neighbours();
  gpulmt_mpi_free(dev);
  free(host);
  free(want);
  return shim_test_end();
}
