// What a proxy's way of driving MPI costs one data message (a staging piece), against the
// blocking calls of the host-staged anchor: a host ping-pong of SIZE bytes between two ranks,
// the MPI calls made
//   block      MPI_Send / MPI_Recv (the anchor's way)
//   spin       the next receive posted before the send, MPI_Isend, then MPI_Test on both
//              requests in a tight loop (a proxy that does nothing but this transfer)
//   pool       as spin, but each poll is one MPI_Testsome over POOL pre-posted ANY_SOURCE
//              receives of another tag (never matched) and the two requests, as gpulmt's
//              proxy tests its receive pools and its ops in flight together
//   pool_work  as pool, and each poll also busy-waits WORK_NS (the rest of a proxy round:
//              queues, pipelines, completions)
// In gpulmt's D D trace at 64 KiB a piece took 11.4 us from its MPI_Isend to both sides
// seeing it done, where Open MPI's own 64 KiB H H ping-pong takes 4 us a leg.
// No GPU. MPI_THREAD_MULTIPLE unless THREAD=single.
// Build: mpicc -O2 lab/gpu/piece_cost.c -o /tmp/piece_cost
// Run:   mpirun -np 2 --bind-to none /tmp/piece_cost [iters] [pool] [work_ns]
// Prints CSV (rank 0): mode,level,bytes,half_round_trip_us
#define _GNU_SOURCE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int rank, peer, pool, work_ns;
static MPI_Request *reqs; /* [0, pool): the pool; pool: the receive; pool + 1: the send */
static char *pool_bufs;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void busy(int ns) {
  if (ns <= 0) return;
  double end = now() + ns * 1e-9;
  while (now() < end) {
  }
}

/* Waits for both requests (receive at pool, send at pool + 1) the mode's way. */
static void wait_both(const char *mode) {
  if (!strcmp(mode, "spin")) {
    int a = 0, b = 0;
    while (!a || !b) {
      if (!a) MPI_Test(&reqs[pool], &a, MPI_STATUS_IGNORE);
      if (!b) MPI_Test(&reqs[pool + 1], &b, MPI_STATUS_IGNORE);
    }
    return;
  }
  int left = (reqs[pool] != MPI_REQUEST_NULL) + (reqs[pool + 1] != MPI_REQUEST_NULL);
  int *idx = malloc(sizeof(int) * (pool + 2));
  while (left > 0) {
    int out = 0;
    MPI_Testsome(pool + 2, reqs, &out, idx, MPI_STATUSES_IGNORE);
    if (out != MPI_UNDEFINED) left -= out;
    if (!strcmp(mode, "pool_work")) busy(work_ns);
  }
  free(idx);
}

static double run(const char *mode, char *buf, int n, int iters) {
  double t0 = 0;
  for (int it = -iters / 10; it < iters; it++) {
    if (it == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now();
    }
    if (!strcmp(mode, "block")) {
      if (rank == 0) {
        MPI_Send(buf, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        MPI_Recv(buf, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
      }
      continue;
    }
    /* Rank 0 sends then receives; rank 1 receives then sends; each receive is posted before
       the message can come (as a proxy posts a piece's receive when the RTS arrives). */
    if (rank == 0) {
      MPI_Irecv(buf + n, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[pool]);
      MPI_Isend(buf, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[pool + 1]);
      wait_both(mode);
    } else {
      MPI_Irecv(buf + n, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[pool]);
      reqs[pool + 1] = MPI_REQUEST_NULL;
      wait_both(mode);
      MPI_Isend(buf, n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[pool + 1]);
      reqs[pool] = MPI_REQUEST_NULL;
      wait_both(mode);
    }
  }
  return (now() - t0) * 1e6 / (2.0 * iters);
}

int main(int argc, char **argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 5000;
  pool = argc > 2 ? atoi(argv[2]) : 96;
  work_ns = argc > 3 ? atoi(argv[3]) : 1000;
  const char *tl = getenv("THREAD");
  int want = tl && !strcmp(tl, "single") ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE, got;
  MPI_Init_thread(&argc, &argv, want, &got);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  peer = 1 - rank;
  reqs = malloc(sizeof(MPI_Request) * (pool + 2));
  pool_bufs = malloc((size_t)pool * 64 + 64);
  for (int i = 0; i < pool; i++) MPI_Irecv(pool_bufs + 64 * i, 64, MPI_BYTE, MPI_ANY_SOURCE, 9, MPI_COMM_WORLD, &reqs[i]);
  const int sizes[] = {8, 4096, 65536, 524288};
  char *buf = malloc(2 * 524288);
  memset(buf, 1, 2 * 524288);
  const char *modes[] = {"block", "spin", "pool", "pool_work"};
  if (rank == 0) printf("mode,level,bytes,half_round_trip_us\n");
  for (int s = 0; s < 4; s++)
    for (int m = 0; m < 4; m++) {
      int n = sizes[s];
      double us = run(modes[m], buf, n, n >= 524288 ? iters / 5 : iters);
      if (rank == 0) printf("%s,%s,%d,%.2f\n", modes[m], got == MPI_THREAD_MULTIPLE ? "multiple" : "single", n, us);
      fflush(stdout);
    }
  for (int i = 0; i < pool; i++) {
    MPI_Cancel(&reqs[i]);
    MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
  }
  MPI_Finalize();
  return 0;
}
