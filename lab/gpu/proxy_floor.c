// What a proxy design costs by itself: an 8 B host ping-pong between two ranks over MPI,
// with the MPI calls made (a) by the thread that sends and waits, blocking, as the anchor
// does; (b) by that thread with MPI_Isend and MPI_Testsome over a pool of POOL pre-posted
// ANY_SOURCE receives, as gpulmt's proxy receives control messages; (c) as (b), but by a
// second thread (the "proxy"), the first handing each message over and being handed each
// arrival through one cache line each way. No GPU, no gpulmt: the floor under the internode
// path's 8 B H H latency, against which the proxy's own overhead is read.
//
// Build: mpicc -O2 -pthread lab/gpu/proxy_floor.c -o /tmp/proxy_floor
// Run:   mpirun -np 2 --bind-to none /tmp/proxy_floor [iters] [pool]
//        (THREAD=single|multiple picks MPI_Init_thread's level for modes a and b; c always
//        asks for MPI_THREAD_MULTIPLE, as gpulmt does)
// Prints: mode,level,pool,iters,half_round_trip_us (rank 0).
#define _GNU_SOURCE
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TAG 7
#define MSG 8

static int rank, peer, iters, pool, warm;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// The pool: POOL receives from any source, reposted as each completes; reqs[pool] is the
// one send in flight (MPI_REQUEST_NULL when none).
static MPI_Request *reqs;
static char (*bufs)[64];
static char sendbuf[64];

static void pool_post(int i) { MPI_Irecv(bufs[i], 64, MPI_BYTE, MPI_ANY_SOURCE, TAG, MPI_COMM_WORLD, &reqs[i]); }

// One Testsome over the pool and the send; returns whether an arrival came (reposted).
static int pool_test(int *send_done) {
  int out = 0, idx[pool + 1], got = 0;
  MPI_Status st[pool + 1];
  MPI_Testsome(pool + 1, reqs, &out, idx, st);
  if (out == MPI_UNDEFINED) return 0;
  for (int k = 0; k < out; k++) {
    if (idx[k] == pool) {
      *send_done = 1;
    } else {
      got = 1;
      pool_post(idx[k]);
    }
  }
  return got;
}

// (b): the waiting thread makes the MPI calls itself.
static double run_pool_inline(void) {
  for (int i = 0; i < pool; i++) pool_post(i);
  reqs[pool] = MPI_REQUEST_NULL;
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = 0;
  for (int i = -warm; i < iters; i++) {
    if (i == 0) t0 = now();
    int send_done = 0;
    if (rank == 0) {
      MPI_Isend(sendbuf, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[pool]);
      while (!pool_test(&send_done)) {}
    } else {
      while (!pool_test(&send_done)) {}
      MPI_Isend(sendbuf, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[pool]);
    }
    while (reqs[pool] != MPI_REQUEST_NULL) pool_test(&send_done);
  }
  double t = now() - t0;
  for (int i = 0; i < pool; i++) {
    MPI_Cancel(&reqs[i]);
    MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
  }
  return t;
}

// (c): the hand-offs. Each word on its own line; the app bumps `out`, the proxy bumps `in`.
static _Alignas(64) atomic_uint_fast64_t out_seq;
static _Alignas(64) atomic_uint_fast64_t in_seq;
static _Alignas(64) atomic_int stop;

static void *proxy_main(void *arg) {
  (void)arg;
  uint64_t taken = 0, arrived = 0;
  for (int i = 0; i < pool; i++) pool_post(i);
  reqs[pool] = MPI_REQUEST_NULL;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    // Acquire: the payload the app wrote before its release is visible.
    uint64_t want = atomic_load_explicit(&out_seq, memory_order_acquire);
    if (want > taken && reqs[pool] == MPI_REQUEST_NULL) {
      MPI_Isend(sendbuf, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[pool]);
      taken++;
    }
    int send_done = 0;
    if (pool_test(&send_done)) {
      arrived++;
      // Release: the arrival's bytes (here none copied) before the count.
      atomic_store_explicit(&in_seq, arrived, memory_order_release);
    }
  }
  for (int i = 0; i < pool; i++) {
    MPI_Cancel(&reqs[i]);
    MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
  }
  if (reqs[pool] != MPI_REQUEST_NULL) MPI_Wait(&reqs[pool], MPI_STATUS_IGNORE);
  return NULL;
}

static double run_proxy(void) {
  pthread_t p;
  MPI_Barrier(MPI_COMM_WORLD);
  pthread_create(&p, NULL, proxy_main, NULL);
  double t0 = 0;
  uint64_t seen = 0, sent = 0;
  for (int i = -warm; i < iters; i++) {
    if (i == 0) t0 = now();
    if (rank == 0) {
      atomic_store_explicit(&out_seq, ++sent, memory_order_release);
      while (atomic_load_explicit(&in_seq, memory_order_acquire) == seen) {}
      seen++;
    } else {
      while (atomic_load_explicit(&in_seq, memory_order_acquire) == seen) {}
      seen++;
      atomic_store_explicit(&out_seq, ++sent, memory_order_release);
    }
  }
  double t = now() - t0;
  // Both ranks' proxies stop only after the last message is through.
  usleep(10000);
  atomic_store(&stop, 1);
  pthread_join(p, NULL);
  return t;
}

static double run_blocking(void) {
  char b[64];
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = 0;
  for (int i = -warm; i < iters; i++) {
    if (i == 0) t0 = now();
    if (rank == 0) {
      MPI_Send(sendbuf, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD);
      MPI_Recv(b, 64, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(b, 64, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(sendbuf, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD);
    }
  }
  return now() - t0;
}

int main(int argc, char **argv) {
  iters = argc > 1 ? atoi(argv[1]) : 100000;
  pool = argc > 2 ? atoi(argv[2]) : 96;
  warm = iters / 10;
  const char *mode = getenv("MODE") ? getenv("MODE") : "all";
  const char *lv = getenv("THREAD") ? getenv("THREAD") : "multiple";
  int want = strcmp(lv, "single") == 0 ? MPI_THREAD_SINGLE : MPI_THREAD_MULTIPLE, got;
  if (strcmp(mode, "proxy") == 0) want = MPI_THREAD_MULTIPLE;
  MPI_Init_thread(&argc, &argv, want, &got);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  peer = 1 - rank;
  reqs = calloc(pool + 1, sizeof *reqs);
  bufs = calloc(pool, sizeof *bufs);
  double t;
  if (strcmp(mode, "blocking") == 0) {
    t = run_blocking();
  } else if (strcmp(mode, "pool") == 0) {
    t = run_pool_inline();
  } else if (strcmp(mode, "proxy") == 0) {
    t = run_proxy();
  } else {
    if (rank == 0) fprintf(stderr, "MODE=blocking|pool|proxy\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
    return 2;
  }
  if (rank == 0)
    printf("%s,%s,%d,%d,%.3f\n", mode, got == MPI_THREAD_MULTIPLE ? "multiple" : "single", pool, iters,
           t / iters / 2 * 1e6);
  MPI_Finalize();
  return 0;
}
