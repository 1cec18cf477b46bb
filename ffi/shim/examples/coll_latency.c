/*
 * The time of a small host MPI_Allreduce, as an unmodified program under the shim sees
 * it: what README.md's "Progress" measured to choose how blocking collectives keep the
 * shim's transfers moving (a helper thread, against every collective as its
 * non-blocking form waited for with progress).
 *
 *   mpicc -O2 ffi/shim/examples/coll_latency.c -o coll_latency
 *   mpirun -np 2 [--allow-run-as-root --oversubscribe] [-x LD_PRELOAD=libgpulmt_mpi.so -x GPULMT_DEVICE=sim] \
 *       ./coll_latency [iterations [repetitions [bytes [form]]]]
 *
 * form: "blocking" (MPI_Allreduce, the default), "nonblocking" (MPI_Iallreduce +
 * MPI_Wait), or "busy" (MPI_Allreduce while every rank has a device MPI_Isend to the
 * next rank in flight, received only at the end: gpulmt has a transfer in flight, which
 * engages the shim's helper thread; needs the shim). Each repetition
 * runs `iterations` calls (default 500) after 50 warm-up calls between barriers; rank 0
 * prints one line per repetition (mean microseconds per call), then the median and the
 * minimum of the repetitions (default 20). Bytes default to 8 (MPI_DOUBLE elements).
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int iters = argc > 1 ? atoi(argv[1]) : 500;
  int reps = argc > 2 ? atoi(argv[2]) : 20;
  int bytes = argc > 3 ? atoi(argv[3]) : 8;
  const char *form = argc > 4 ? argv[4] : "blocking";
  int nb = strcmp(form, "nonblocking") == 0, busy = strcmp(form, "busy") == 0;
  if (iters < 1 || reps < 1 || reps > 1000 || bytes < 8 || (!nb && !busy && strcmp(form, "blocking") != 0)) {
    if (rank == 0) fprintf(stderr, "usage: coll_latency [iterations [repetitions [bytes [blocking|nonblocking|busy]]]]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  int n = bytes / 8;
  double *in = calloc((size_t)n, sizeof *in), *out = calloc((size_t)n, sizeof *out);
  double *times = calloc((size_t)reps, sizeof *times);
  MPI_Request pending = MPI_REQUEST_NULL;
  void *dev = NULL;
  if (busy) {
    if (!gpulmt_mpi_active || !gpulmt_mpi_active()) {
      if (rank == 0) fprintf(stderr, "coll_latency: \"busy\" needs the shim (LD_PRELOAD=libgpulmt_mpi.so)\n");
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    dev = gpulmt_mpi_alloc(128);
    MPI_Isend(dev, 64, MPI_BYTE, (rank + 1) % size, 999, MPI_COMM_WORLD, &pending);
  }
  for (int r = 0; r < reps; r++) {
    for (int i = 0; i < 50 + iters; i++) {
      if (i == 50) {
        MPI_Barrier(MPI_COMM_WORLD);
        times[r] = MPI_Wtime();
      }
      in[0] = i;
      if (nb) {
        MPI_Request q;
        MPI_Iallreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &q);
        MPI_Wait(&q, MPI_STATUS_IGNORE);
      } else {
        MPI_Allreduce(in, out, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      }
      if (out[0] != (double)i * size) {
        fprintf(stderr, "rank %d: allreduce gave %g, want %g\n", rank, out[0], (double)i * size);
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
    }
    times[r] = (MPI_Wtime() - times[r]) * 1e6 / iters;
    if (rank == 0) printf("rep %d %.3f us\n", r, times[r]);
  }
  if (busy) {
    MPI_Recv((char *)dev + 64, 64, MPI_BYTE, (rank + size - 1) % size, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Wait(&pending, MPI_STATUS_IGNORE);
    gpulmt_mpi_free(dev);
  }
  qsort(times, (size_t)reps, sizeof *times, cmp);
  if (rank == 0)
    printf("# %s MPI_Allreduce %d B np %d: median %.3f us, min %.3f us over %d x %d calls\n", form, bytes, size,
           times[reps / 2], times[0], reps, iters);
  free(in);
  free(out);
  free(times);
  MPI_Finalize();
  return 0;
}
