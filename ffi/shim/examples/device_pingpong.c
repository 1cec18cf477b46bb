/*
 * device_pingpong: a plain MPI ping-pong between ranks 0 and 1 on device buffers, run
 * with the gpulmt shim preloaded. It needs no GPU: the buffers come from
 * gpulmt_mpi_alloc, device memory of the shim's gpulmt context, which is a sim device
 * under GPULMT_DEVICE=sim (shared memory in /dev/shm) and a CUDA device otherwise.
 *
 * Build (from the repository root; the shim is found at run time through LD_PRELOAD,
 * so the program does not link it):
 *
 *   cargo build --release -p gpulmt-shim
 *   mpicc -std=c11 -O2 -I ffi/shim/include ffi/shim/examples/device_pingpong.c -o device_pingpong
 *
 * Run on sim devices (Open MPI; --allow-run-as-root only where you are root, as in
 * containers; --oversubscribe where the machine has fewer cores than ranks):
 *
 *   mpirun -np 2 --allow-run-as-root --oversubscribe \
 *       -x LD_PRELOAD=$PWD/target/release/libgpulmt_mpi.so -x GPULMT_DEVICE=sim \
 *       ./device_pingpong [iterations]
 *
 * For each size, rank 0 fills its device buffer, sends it, and rank 1 receives it into
 * its device buffer and sends it back into a second device buffer of rank 0; both
 * ranks copy what they received to host memory and compare every byte, the status's
 * source, tag and count too, each round. Rank 0 prints the half round trip per size
 * (as osu_latency; on sim, copies are host memcpys: a check that the path works, not a
 * GPU measurement). Each rank ends with "rank R ok" and the shim's counters, or FAIL
 * lines and exit status 1. Ranks beyond 1 only take part in the barriers.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Not linked against the shim: its functions come from the preloaded library, and are
 * NULL without it. */
#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

enum { TAG_PING = 1, TAG_PONG = 2 };

static int rank, failures;

#define FAIL(...)                                                \
  do {                                                           \
    failures++;                                                  \
    fprintf(stderr, "rank %d FAIL: ", rank);                     \
    fprintf(stderr, __VA_ARGS__);                                \
    fputc('\n', stderr);                                         \
  } while (0)

/* The byte at i of the message of iteration `iter` of size n. */
static unsigned char pattern(size_t i, size_t n, int iter) { return (unsigned char)(i * 131u + n * 7u + iter * 29u + 1u); }

/* Copies n bytes of device memory to host memory and compares them with the iteration's
 * pattern; checks the receive's status. */
static void check(const void *dev, unsigned char *host, size_t n, int iter, const MPI_Status *st, int source, int tag) {
  int count = -1;
  MPI_Get_count(st, MPI_BYTE, &count);
  if (st->MPI_SOURCE != source || st->MPI_TAG != tag || count != (int)n)
    FAIL("%zu B iter %d: status source %d tag %d count %d, want %d %d %zu", n, iter, st->MPI_SOURCE, st->MPI_TAG,
         count, source, tag, n);
  if (gpulmt_mpi_memcpy(host, dev, n) != 0) {
    FAIL("%zu B iter %d: gpulmt_mpi_memcpy device -> host failed", n, iter);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    if (host[i] != pattern(i, n, iter)) {
      FAIL("%zu B iter %d: byte %zu is %d, want %d", n, iter, i, host[i], pattern(i, n, iter));
      return;
    }
  }
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!gpulmt_mpi_active || !gpulmt_mpi_active()) {
    fprintf(stderr, "rank %d: the gpulmt shim is not active: run with -x LD_PRELOAD=/path/to/libgpulmt_mpi.so "
                    "(and -x GPULMT_DEVICE=sim without a GPU)\n", rank);
    /* Every rank finds the same: a clean exit, whose message every launcher passes on
     * (Hydra may drop what ranks print before an MPI_Abort). */
    MPI_Finalize();
    return 3;
  }
  if (size < 2) {
    fprintf(stderr, "device_pingpong needs at least 2 ranks (mpirun -np 2)\n");
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  int iters = argc > 1 ? atoi(argv[1]) : 20;
  if (iters < 1) iters = 1;

  const size_t sizes[] = {1, 8, 4096, 65536, 1 << 20, 4 << 20};
  const size_t max = sizes[sizeof sizes / sizeof sizes[0] - 1];
  unsigned char *host = malloc(max);
  unsigned char *ping = gpulmt_mpi_alloc(max); /* rank 0 sends it; rank 1 receives into it, sends it back */
  unsigned char *pong = gpulmt_mpi_alloc(max); /* rank 0 receives the reply into it */
  if (!host || !ping || !pong) {
    fprintf(stderr, "rank %d: allocating %zu bytes failed\n", rank, max);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (rank == 0) printf("# device_pingpong: size_bytes half_round_trip_us\n");
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    double spent = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int iter = 0; iter < iters && rank < 2; iter++) {
      MPI_Status st;
      if (rank == 0) {
        for (size_t i = 0; i < n; i++) host[i] = pattern(i, n, iter);
        if (gpulmt_mpi_memcpy(ping, host, n) != 0) FAIL("%zu B: gpulmt_mpi_memcpy host -> device failed", n);
        memset(host, 0, n);
        if (gpulmt_mpi_memcpy(pong, host, n) != 0) FAIL("%zu B: clearing the reply buffer failed", n);
        double t0 = MPI_Wtime();
        MPI_Send(ping, (int)n, MPI_BYTE, 1, TAG_PING, MPI_COMM_WORLD);
        MPI_Recv(pong, (int)n, MPI_BYTE, 1, TAG_PONG, MPI_COMM_WORLD, &st);
        spent += MPI_Wtime() - t0;
        check(pong, host, n, iter, &st, 1, TAG_PONG);
      } else {
        MPI_Recv(ping, (int)n, MPI_BYTE, 0, TAG_PING, MPI_COMM_WORLD, &st);
        MPI_Send(ping, (int)n, MPI_BYTE, 0, TAG_PONG, MPI_COMM_WORLD);
        check(ping, host, n, iter, &st, 0, TAG_PING);
      }
    }
    if (rank == 0) {
      printf("%zu %.2f\n", n, spent / iters / 2 * 1e6);
      fflush(stdout);
    }
  }

  gpulmt_mpi_counters c;
  if (gpulmt_mpi_get_counters(&c) != 0) FAIL("gpulmt_mpi_get_counters");
  if (gpulmt_mpi_free(ping) != 0 || gpulmt_mpi_free(pong) != 0) FAIL("gpulmt_mpi_free");
  free(host);
  printf("rank %d %s lmt_sends=%llu lmt_recvs=%llu staged_sends=%llu staged_recvs=%llu\n", rank,
         failures ? "FAILED" : "ok", (unsigned long long)c.lmt_sends, (unsigned long long)c.lmt_recvs,
         (unsigned long long)c.staged_sends, (unsigned long long)c.staged_recvs);
  fflush(stdout);
  MPI_Finalize();
  return failures ? 1 : 0;
}
