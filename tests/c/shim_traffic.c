/*
 * shim_traffic.c: the fault-injection suite's rank program for the PMPI shim
 * (tests/tests/faults.rs): an unmodified MPI program, not linked against gpulmt, whose
 * device buffers move through libgpulmt_mpi.so preloaded.
 *
 * mpirun -np 2 [--allow-run-as-root --oversubscribe] -x LD_PRELOAD=libgpulmt_mpi.so \
 *        -x GPULMT_DEVICE=sim ./shim_traffic MILLIS SEED BYTES [abort|exit]
 *
 * Ranks 0 and 1 ping-pong a device buffer (gpulmt_mpi_alloc) of BYTES bytes for MILLIS
 * ms (rank 0 decides each round, by a host message, whether another follows), every
 * byte checked; further ranks only finalize. Errors return (MPI_ERRORS_RETURN), so that
 * a rank whose peer died says so itself if mpirun has not taken it down first. With
 * `abort` or `exit`, rank 1 ends itself in its third round, its device send posted (a
 * transfer under way): MPI_Abort(MPI_COMM_WORLD, 7), or _exit(7) (no MPI call, no
 * atexit handler).
 *
 * Prints on stdout, flushed line by line (the suite acts on them while the job runs):
 *   rank=R ready pid=P             after the first round: transfers are under way
 *   rank=R rounds=N lmt_sends=S    after the last round (S: sends gpulmt moved)
 *   rank=R ok traffic              finalized clean
 *   rank=R peer-failed ms=T err=E  a call failed T ms into its round (exit 3, no
 *                                  MPI_Finalize: the peer is gone)
 * and "FAIL rank=R: ..." on stderr (exit 1) on corrupt data or a broken setup.
 */
#define _POSIX_C_SOURCE 200809L
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Not linked against the shim: its functions come from the preloaded library. */
#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

static int rank;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void fail(const char *what) {
  fprintf(stderr, "FAIL rank=%d: %s\n", rank, what);
  exit(1);
}

/* The start of the round in progress: how long a failed call took to fail. */
static double round_start;

/* A call that failed: its peer died (or the job is being taken down). */
static void check_call(int rc, const char *call) {
  if (rc == MPI_SUCCESS) return;
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = 0;
  for (int i = 0; i < len; i++)
    if (s[i] == '\n') s[i] = ' ';
  printf("rank=%d peer-failed ms=%.0f err=%s: %s\n", rank, now_ms() - round_start, call, s);
  fflush(stdout);
  exit(3);
}

static unsigned char pat(size_t i, uint64_t seed, uint64_t round) {
  return (unsigned char)((i * 131u + seed * 7u + round * 13u + 1u) & 0xffu);
}

static void fill(unsigned char *dev, unsigned char *host, size_t n, uint64_t seed, uint64_t round) {
  for (size_t i = 0; i < n; i++) host[i] = pat(i, seed, round);
  if (gpulmt_mpi_memcpy(dev, host, n) != 0) fail("copy to device memory");
}

static void expect(const unsigned char *dev, unsigned char *host, size_t n, uint64_t seed, uint64_t round) {
  if (gpulmt_mpi_memcpy(host, dev, n) != 0) fail("copy from device memory");
  for (size_t i = 0; i < n; i++)
    if (host[i] != pat(i, seed, round)) {
      char what[160];
      snprintf(what, sizeof what, "round %llu: byte %zu of the %zu-byte device message is corrupt",
               (unsigned long long)round, i, n);
      fail(what);
    }
}

int main(int argc, char **argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: %s MILLIS SEED BYTES [abort|exit]\n", argv[0]);
    return 2;
  }
  const char *end_self = argc == 5 ? argv[4] : "";
  double millis = atof(argv[1]);
  uint64_t seed = strtoull(argv[2], NULL, 10);
  size_t n = (size_t)strtoull(argv[3], NULL, 10);
  int size;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (!gpulmt_mpi_alloc || !gpulmt_mpi_active()) fail("the gpulmt shim is not active (LD_PRELOAD=libgpulmt_mpi.so)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (rank >= 2 || size < 2) {
    MPI_Finalize();
    printf("rank=%d ok traffic\n", rank);
    return 0;
  }
  int peer = 1 - rank;
  unsigned char *dev = gpulmt_mpi_alloc(n), *host = malloc(n);
  if (!dev || !host) fail("allocating the buffers");
  double start = now_ms();
  uint64_t round = 0;
  for (;; round++) {
    round_start = now_ms();
    MPI_Request req;
    int go = 0;
    if (rank == 0) {
      go = round == 0 || now_ms() - start < millis;
      check_call(MPI_Send(&go, 1, MPI_INT, 1, 1, MPI_COMM_WORLD), "MPI_Send");
    } else {
      check_call(MPI_Recv(&go, 1, MPI_INT, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE), "MPI_Recv");
    }
    if (!go) break;
    if (rank == 0) {
      fill(dev, host, n, seed, round);
      check_call(MPI_Isend(dev, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req), "MPI_Isend");
      check_call(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (send)");
      check_call(MPI_Irecv(dev, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &req), "MPI_Irecv");
      check_call(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (receive)");
      expect(dev, host, n, seed ^ 1, round);
    } else {
      check_call(MPI_Irecv(dev, (int)n, MPI_BYTE, peer, 2, MPI_COMM_WORLD, &req), "MPI_Irecv");
      check_call(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (receive)");
      expect(dev, host, n, seed, round);
      fill(dev, host, n, seed ^ 1, round);
      check_call(MPI_Isend(dev, (int)n, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &req), "MPI_Isend");
      if (round == 2 && !strcmp(end_self, "abort")) {
        printf("rank=1 aborting\n");
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, 7);
      }
      if (round == 2 && !strcmp(end_self, "exit")) {
        printf("rank=1 exiting\n");
        fflush(stdout);
        _exit(7);
      }
      check_call(MPI_Wait(&req, MPI_STATUS_IGNORE), "MPI_Wait (send)");
    }
    if (round == 0) {
      printf("rank=%d ready pid=%ld\n", rank, (long)getpid());
      fflush(stdout);
    }
  }
  gpulmt_mpi_counters c;
  if (gpulmt_mpi_get_counters(&c) != 0) fail("gpulmt_mpi_get_counters");
  printf("rank=%d rounds=%llu lmt_sends=%llu staged_sends=%llu\n", rank, (unsigned long long)round,
         (unsigned long long)c.lmt_sends, (unsigned long long)c.staged_sends);
  fflush(stdout);
  gpulmt_mpi_free(dev);
  free(host);
  round_start = now_ms();
  check_call(MPI_Finalize(), "MPI_Finalize");
  printf("rank=%d ok traffic\n", rank);
  return 0;
}
