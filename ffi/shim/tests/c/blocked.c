/*
 * A rank blocked in a blocking collective keeps its device transfers moving (issue 30,
 * item 1). MPI's progress rule: once a send and its matching receive have both been
 * started, they complete whatever else the two ranks do. Here one rank of each pair
 * starts a device MPI_Isend and then enters a blocking collective, while its partner
 * first receives the message with MPI_Recv and only then enters the collective: the
 * receive must complete while the sender waits in the collective. With a protocol in
 * which the sender copies (GPULMT_PROTOCOL=put, coop or shm), it needs the sender's
 * gpulmt progress during the collective; before the shim drove it from a helper
 * thread, every such case hung.
 *
 * mpirun -np N [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim ./blocked [multiple]
 *
 * With "multiple" (MPI_Init_thread(MPI_THREAD_MULTIPLE)) the other direction runs too:
 * a rank posts a device MPI_Irecv and enters the collective, its partner sends with a
 * blocking MPI_Send first. That send completes only if the receiver matches the
 * envelope while it waits in the collective: MPI calls from the shim's helper thread,
 * which only MPI_THREAD_MULTIPLE allows (see the README's "Progress").
 *
 * Collectives: MPI_Allreduce, MPI_Bcast, MPI_Alltoall and MPI_Gather on host buffers,
 * MPI_Allreduce on device buffers (staged), MPI_Comm_dup. Pairs (even, even+1); with an
 * odd N the last rank only takes part in the collectives. A watchdog turns a hang into
 * a failure: a case that has not finished after BLOCKED_WATCHDOG seconds (default 30)
 * prints which one and exits 1. Prints "rank R ok checks=C" (or FAIL lines, and then
 * exits 1).
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

static char current[160];
static volatile sig_atomic_t current_len;

static void watchdog(int sig) {
  (void)sig;
  static const char head[] = "FAIL: watchdog: no progress in ";
  if (write(2, head, sizeof head - 1) < 0 || write(2, current, (size_t)current_len) < 0) _exit(1);
  _exit(1);
}

static unsigned watchdog_seconds(void) {
  const char *s = getenv("BLOCKED_WATCHDOG");
  int v = s ? atoi(s) : 0;
  return v > 0 ? (unsigned)v : 30u;
}

static void begin_case(const char *what) {
  int n = snprintf(current, sizeof current, "rank %d: %s\n", rank, what);
  current_len = n < 0 ? 0 : (n < (int)sizeof current ? n : (int)sizeof current - 1);
  alarm(watchdog_seconds());
}

static unsigned char pat(size_t i, unsigned seed) { return (unsigned char)((i * 151u + seed * 13u + 5u) & 0xffu); }

static void fill(unsigned char *dev, size_t n, unsigned seed) {
  unsigned char *h = malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = pat(i, seed);
  if (gpulmt_mpi_memcpy(dev, h, n) != 0) FAIL("memcpy to device");
  free(h);
}

static void verify(const unsigned char *dev, size_t n, unsigned seed, const char *what) {
  unsigned char *h = malloc(n);
  if (gpulmt_mpi_memcpy(h, dev, n) != 0) FAIL("memcpy from device");
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; i++)
    if (h[i] != pat(i, seed)) bad = i;
  CHECK(bad == n, "%s: byte %zu of %zu differs", what, bad, n);
  free(h);
}

enum { C_ALLREDUCE, C_BCAST, C_ALLTOALL, C_GATHER, C_ALLREDUCE_DEVICE, C_COMM_DUP, NCOLL };
static const char *const coll_name[NCOLL] = {"MPI_Allreduce",  "MPI_Bcast",
                                             "MPI_Alltoall",   "MPI_Gather",
                                             "MPI_Allreduce (device buffers)", "MPI_Comm_dup"};

static int *dev_ints; /* 2 ints of device memory for C_ALLREDUCE_DEVICE */

/* The collective of a case, on every rank, checked. */
static void collective(int c, unsigned seed) {
  int in[2] = {rank + (int)seed, 1}, out[2] = {0, 0};
  int all[64], back[64];
  int want_sum = size * (int)seed + size * (size - 1) / 2;
  switch (c) {
    case C_ALLREDUCE:
      MPI_OK(MPI_Allreduce(in, out, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
      CHECK(out[0] == want_sum && out[1] == size, "allreduce gave %d %d", out[0], out[1]);
      break;
    case C_BCAST:
      out[0] = rank == 0 ? (int)seed : -1;
      MPI_OK(MPI_Bcast(out, 1, MPI_INT, 0, MPI_COMM_WORLD));
      CHECK(out[0] == (int)seed, "bcast gave %d", out[0]);
      break;
    case C_ALLTOALL:
      for (int i = 0; i < size; i++) all[i] = rank * 100 + i;
      MPI_OK(MPI_Alltoall(all, 1, MPI_INT, back, 1, MPI_INT, MPI_COMM_WORLD));
      for (int i = 0; i < size; i++) CHECK(back[i] == i * 100 + rank, "alltoall block %d is %d", i, back[i]);
      break;
    case C_GATHER:
      MPI_OK(MPI_Gather(in, 1, MPI_INT, back, 1, MPI_INT, size - 1, MPI_COMM_WORLD));
      if (rank == size - 1)
        for (int i = 0; i < size; i++) CHECK(back[i] == i + (int)seed, "gather block %d is %d", i, back[i]);
      break;
    case C_ALLREDUCE_DEVICE:
      if (gpulmt_mpi_memcpy(dev_ints, in, sizeof in) != 0) FAIL("memcpy to device");
      MPI_OK(MPI_Allreduce(MPI_IN_PLACE, dev_ints, 2, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
      if (gpulmt_mpi_memcpy(out, dev_ints, sizeof out) != 0) FAIL("memcpy from device");
      CHECK(out[0] == want_sum && out[1] == size, "device allreduce gave %d %d", out[0], out[1]);
      break;
    default: {
      MPI_Comm dup;
      MPI_OK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
      int r = -1;
      MPI_Comm_rank(dup, &r);
      CHECK(r == rank, "rank %d in the duplicate", r);
      MPI_Comm_free(&dup);
    }
  }
}

/* One case: the even rank of each pair starts its half and enters the collective; the
 * odd rank completes its half first. `recv_first`: the even rank receives (a device
 * MPI_Irecv), the odd one sends with MPI_Send; else the even rank sends (MPI_Isend),
 * the odd one receives with MPI_Recv. */
static void one_case(int c, int recv_first, size_t n, unsigned seed) {
  char what[160];
  snprintf(what, sizeof what, "%s %zu bytes, then %s", recv_first ? "device MPI_Irecv of" : "device MPI_Isend of", n,
           coll_name[c]);
  begin_case(what);
  int peer = (rank == size - 1 && size % 2) ? -1 : rank ^ 1;
  int tag = 40 + c;
  unsigned char *b = peer < 0 ? NULL : gpulmt_mpi_alloc(n);
  if (peer >= 0 && !b) {
    FAIL("gpulmt_mpi_alloc(%zu)", n);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (peer < 0) {
    collective(c, seed);
  } else if (rank % 2 == 0) {
    MPI_Request r;
    MPI_Status st;
    if (recv_first) {
      MPI_OK(MPI_Irecv(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
    } else {
      fill(b, n, seed);
      MPI_OK(MPI_Isend(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &r));
    }
    collective(c, seed);
    MPI_OK(MPI_Wait(&r, &st));
    if (recv_first) {
      int count = -1;
      MPI_Get_count(&st, MPI_BYTE, &count);
      CHECK(count == (int)n && st.MPI_SOURCE == peer, "%s: count %d source %d", what, count, st.MPI_SOURCE);
      verify(b, n, seed, what);
    }
  } else {
    if (recv_first) {
      fill(b, n, seed);
      MPI_OK(MPI_Send(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD));
    } else {
      MPI_Status st;
      MPI_OK(MPI_Recv(b, (int)n, MPI_BYTE, peer, tag, MPI_COMM_WORLD, &st));
      verify(b, n, seed, what);
    }
    collective(c, seed);
  }
  if (b) gpulmt_mpi_free(b);
  alarm(0);
}

int main(int argc, char **argv) {
  int multiple = argc > 1 && strcmp(argv[1], "multiple") == 0;
  if (multiple) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      fprintf(stderr, "rank ?: MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
  } else {
    MPI_Init(&argc, &argv);
  }
  if (!shim_test_begin(2, 64, 1)) return 3;
  signal(SIGALRM, watchdog);
  dev_ints = gpulmt_mpi_alloc(2 * sizeof(int));
  static const size_t sizes[] = {4097, 1 << 20};
  unsigned seed = 1;
  for (int dir = 0; dir <= multiple; dir++)
    for (int c = 0; c < NCOLL; c++)
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) one_case(c, dir, sizes[k], seed++);
  begin_case("final barrier");
  MPI_OK(MPI_Barrier(MPI_COMM_WORLD));
  alarm(0);
  gpulmt_mpi_free(dev_ints);
  return shim_test_end();
}
