/*
 * MPI_Barrier while some ranks have shim work in flight and others do not (issue 31,
 * item 1): one rank of each pair posts an MPI_Irecv (host or device buffer) or an
 * MPI_Isend from device memory, then every rank calls MPI_Barrier, and only then does
 * the partner send or receive. A legal MPI program: the barrier must complete whatever
 * each rank has in flight. (The shim once called PMPI_Barrier on idle ranks and
 * PMPI_Ibarrier on busy ones, which MPI never matches: every run hung.)
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim ./barrier
 *
 * Pairs (even, even+1); with an odd N the last rank only takes part in the barriers.
 * A watchdog turns a hang into a failure: a case that has not finished after
 * BARRIER_WATCHDOG seconds (default 30) prints which one and exits 1. Prints
 * "rank R ok checks=C" (or FAIL lines, and then exits 1).
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

static int rank, size, failures, checks;

#include "check.h"

/* What the watchdog prints: the case in progress (written before each case, read
 * only by the signal handler, which uses write(2) alone). */
static char current[160];
static volatile sig_atomic_t current_len;

static void watchdog(int sig) {
  (void)sig;
  static const char head[] = "FAIL: watchdog: no progress in ";
  if (write(2, head, sizeof head - 1) < 0 || write(2, current, (size_t)current_len) < 0) _exit(1);
  _exit(1);
}

static unsigned watchdog_seconds(void) {
  const char *s = getenv("BARRIER_WATCHDOG");
  int v = s ? atoi(s) : 0;
  return v > 0 ? (unsigned)v : 30u;
}

static void begin_case(const char *what) {
  current_len = 0;
  int n = snprintf(current, sizeof current, "rank %d: %s\n", rank, what);
  current_len = n < 0 ? 0 : (n < (int)sizeof current ? n : (int)sizeof current - 1);
  alarm(watchdog_seconds());
}

static unsigned char pat(size_t i, unsigned seed) { return (unsigned char)((i * 131u + seed * 7u + 1u) & 0xffu); }

static unsigned char *alloc_buf(int dev, size_t n) {
  unsigned char *p = dev ? gpulmt_mpi_alloc(n) : malloc(n);
  if (!p) {
    fprintf(stderr, "rank %d: allocating %zu bytes failed\n", rank, n);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}

static void free_buf(int dev, unsigned char *p) {
  if (dev)
    gpulmt_mpi_free(p);
  else
    free(p);
}

/* Fills (or checks) a buffer of either kind with the pattern of `seed`. */
static void fill(int dev, unsigned char *p, size_t n, unsigned seed) {
  unsigned char *h = dev ? malloc(n) : p;
  for (size_t i = 0; i < n; i++) h[i] = pat(i, seed);
  if (dev) {
    if (gpulmt_mpi_memcpy(p, h, n) != 0) FAIL("memcpy to device");
    free(h);
  }
}

static void verify(int dev, const unsigned char *p, size_t n, unsigned seed, const char *what) {
  unsigned char *h = dev ? malloc(n) : (unsigned char *)p;
  if (dev && gpulmt_mpi_memcpy(h, p, n) != 0) FAIL("memcpy from device");
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++)
    if (h[i] != pat(i, seed)) bad = i;
  CHECK(bad == n, "%s: byte %zu of %zu differs", what, bad, n);
  if (dev) free(h);
}

enum { HOST_IRECV, DEVICE_IRECV, DEVICE_ISEND, KINDS };
static const char *const kind_name[KINDS] = {"host irecv", "device irecv", "device isend"};

static const size_t sizes[] = {1, 176, 4097, 65536, 1024 * 1024, 4 * 1024 * 1024};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* One case: the even rank of each pair starts an operation, every rank enters the
 * barrier, then the odd rank does its half and both check the data. */
static void one_case(int kind, size_t n, unsigned seed) {
  char what[96];
  snprintf(what, sizeof what, "%s of %zu bytes, then MPI_Barrier", kind_name[kind], n);
  begin_case(what);
  int peer = (rank == size - 1 && size % 2) ? -1 : rank ^ 1;
  int tag = 7;
  if (peer < 0) {
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
  } else if (rank % 2 == 0) {
    int dev = kind != HOST_IRECV;
    unsigned char *b = alloc_buf(dev, n);
    MPI_Request r;
    MPI_Status st;
    if (kind == DEVICE_ISEND) {
      fill(dev, b, n, seed);
      MPI_OK(MPI_Isend(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
    } else {
      MPI_OK(MPI_Irecv(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
    }
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_OK(MPI_Wait(&r, &st));
    if (kind != DEVICE_ISEND) {
      int count = -1;
      MPI_Get_count(&st, MPI_BYTE, &count);
      CHECK(count == (int)n && st.MPI_SOURCE == peer, "%s: count %d source %d", what, count, st.MPI_SOURCE);
      verify(dev, b, n, seed, what);
    }
    free_buf(dev, b);
  } else {
    /* The partner of a device Irecv sends from device memory too, so that the
     * message goes through gpulmt; a host Irecv gets a host message. */
    int dev = kind != HOST_IRECV;
    unsigned char *b = alloc_buf(dev, n);
    MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
    if (kind == DEVICE_ISEND) {
      MPI_OK(MPI_Recv(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
      verify(dev, b, n, seed, what);
    } else {
      fill(dev, b, n, seed);
      MPI_OK(MPI_Send(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD));
    }
    free_buf(dev, b);
  }
  alarm(0);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (!shim_test_begin(2, 0, 1)) return 3;
  signal(SIGALRM, watchdog);
  unsigned seed = 1;
  for (int kind = 0; kind < KINDS; kind++)
    for (size_t k = 0; k < NSIZES; k++) one_case(kind, sizes[k], seed++);
  /* Ends with a barrier every rank reaches idle, then the counters. */
  begin_case("final barrier");
  MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
  alarm(0);
  return shim_test_end();
}
