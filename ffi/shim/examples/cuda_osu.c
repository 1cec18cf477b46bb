/*
 * cuda_osu: OSU-style bandwidth and latency of a plain MPI program on cudaMalloc'd
 * buffers, written as an application that knows nothing of gpulmt. Run it with the
 * shim preloaded to make a non-CUDA-aware MPI move device buffers between the GPUs
 * of a node:
 *
 *   mpicc -O2 -I$CUDA/include cuda_osu.c -L$CUDA/lib64 -lcudart -o cuda_osu
 *   mpirun -np 2 -x LD_PRELOAD=/path/to/libgpulmt_mpi.so ./cuda_osu [max_bytes]
 *   mpirun -np 2 ./cuda_osu host          # host buffers only: works without the shim
 *   mpirun -np 2 ... ./cuda_osu lat BYTES [ITERS]   # D D latency at one size only
 *
 * Prints CSV rows `cuda_osu,test,placement,bytes,metric,value`:
 *   bw     D D, window 64 (osu_bw's), sizes 1 MiB .. max_bytes (default 256 MiB), GB/s
 *   lat    H H 8 B, D D 8 B, 64 KiB, 1 MiB and 4 MiB (up to max_bytes), half round trip in us
 *          (average, as osu_latency)
 *   check  D D, D H, H D at several sizes, every byte compared: 1 = ok
 * Exits 1 if a check failed.
 */
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      fprintf(stderr, "CUDA %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                    \
    }                                                                                  \
  } while (0)

static int rank;

static void row(const char *test, const char *placement, size_t bytes, const char *metric, double v) {
  if (rank == 0) printf("cuda_osu,%s,%s,%zu,%s,%.4f\n", test, placement, bytes, metric, v);
  fflush(stdout);
}

static unsigned char pat(size_t i, unsigned seed) { return (unsigned char)(i * 151u + seed * 13u + (i >> 11)); }

/* Rank 0 sends n bytes from a (placement sd) to rank 1's b (placement rd); every byte checked. */
static int check(int sd, int rd, size_t n, unsigned seed) {
  unsigned char *h = malloc(n + 64), *buf;
  int ok = 1;
  int dev = rank == 0 ? sd : rd;
  if (dev) CK(cudaMalloc((void **)&buf, n + 64)); else buf = malloc(n + 64);
  for (size_t i = 0; i < n + 64; i++) h[i] = rank == 0 ? pat(i, seed) : 0xEE;
  if (dev) CK(cudaMemcpy(buf, h, n + 64, cudaMemcpyHostToDevice)); else memcpy(buf, h, n + 64);
  /* Offsets inside the allocation, as sub-allocating applications send. */
  if (rank == 0) {
    MPI_Send(buf + 7, (int)n, MPI_BYTE, 1, 5, MPI_COMM_WORLD);
  } else if (rank == 1) {
    MPI_Status st;
    int count = -1;
    MPI_Recv(buf + 3, (int)n, MPI_BYTE, 0, 5, MPI_COMM_WORLD, &st);
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (dev) CK(cudaMemcpy(h, buf, n + 64, cudaMemcpyDeviceToHost)); else memcpy(h, buf, n + 64);
    ok = count == (int)n && st.MPI_SOURCE == 0 && st.MPI_TAG == 5;
    for (size_t i = 0; i < n + 64 && ok; i++) {
      unsigned char want = i >= 3 && i < n + 3 ? pat(i - 3 + 7, seed) : 0xEE;
      if (h[i] != want) {
        fprintf(stderr, "check %zu bytes: byte %zu is %d, want %d\n", n, i, h[i], want);
        ok = 0;
      }
    }
  }
  MPI_Bcast(&ok, 1, MPI_INT, 1, MPI_COMM_WORLD);
  if (dev) CK(cudaFree(buf)); else free(buf);
  free(h);
  return ok;
}

static double bandwidth(void *buf, size_t n, int window, int iters) {
  MPI_Request req[64];
  char ack = 0;
  double t0 = 0;
  for (int it = -2; it < iters; it++) { /* two warm-up rounds */
    if (it == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    if (rank == 0) {
      for (int w = 0; w < window; w++) MPI_Isend(buf, (int)n, MPI_BYTE, 1, 100, MPI_COMM_WORLD, &req[w]);
      MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
      MPI_Recv(&ack, 1, MPI_BYTE, 1, 101, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      for (int w = 0; w < window; w++) MPI_Irecv(buf, (int)n, MPI_BYTE, 0, 100, MPI_COMM_WORLD, &req[w]);
      MPI_Waitall(window, req, MPI_STATUSES_IGNORE);
      MPI_Send(&ack, 1, MPI_BYTE, 0, 101, MPI_COMM_WORLD);
    }
  }
  double s = MPI_Wtime() - t0;
  return (double)n * window * iters / s / 1e9;
}

static double latency(void *buf, size_t n, int iters) {
  double t0 = 0;
  for (int it = -iters / 10; it < iters; it++) {
    if (it == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    if (rank == 0) {
      MPI_Send(buf, (int)n, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
      MPI_Recv(buf, (int)n, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank == 1) {
      MPI_Recv(buf, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
    }
  }
  return (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
}

int main(int argc, char **argv) {
  int size, local = 0, gpus = 0, host_only = argc > 1 && strcmp(argv[1], "host") == 0;
  /* "lat BYTES [ITERS]": one latency, nothing else (a trace of one size's legs). */
  int lat_only = argc > 2 && strcmp(argv[1], "lat") == 0;
  size_t max = lat_only ? strtoull(argv[2], NULL, 10)
               : argc > 1 && !host_only ? strtoull(argv[1], NULL, 10) : ((size_t)256 << 20);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) fprintf(stderr, "run with 2 ranks\n");
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  char hbuf[8] = {0};
  if (!lat_only) row("lat", "H H", 8, "us", latency(hbuf, 8, 100000));
  if (host_only) {
    MPI_Finalize();
    return 0;
  }
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Comm_free(&node);
  CK(cudaGetDeviceCount(&gpus));
  CK(cudaSetDevice(local % gpus));

  if (lat_only) {
    void *lbuf;
    CK(cudaMalloc(&lbuf, max ? max : 1));
    CK(cudaMemset(lbuf, 1, max ? max : 1));
    row("lat", "D D", max, "us", latency(lbuf, max, argc > 3 ? atoi(argv[3]) : 1000));
    CK(cudaFree(lbuf));
    MPI_Finalize();
    return 0;
  }
  int failed = 0;
  const size_t sizes[] = {1, 4097, ((size_t)1 << 20) + 3, (size_t)64 << 20};
  const int placements[3][2] = {{1, 1}, {1, 0}, {0, 1}};
  const char *names[3] = {"D D", "D H", "H D"};
  for (int p = 0; p < 3; p++)
    for (int s = 0; s < 4; s++) {
      int ok = check(placements[p][0], placements[p][1], sizes[s], (unsigned)(p * 4 + s));
      row("check", names[p], sizes[s], "ok", ok);
      failed |= !ok;
    }

  void *dbuf;
  CK(cudaMalloc(&dbuf, max));
  CK(cudaMemset(dbuf, 1, max));
  row("lat", "D D", 8, "us", latency(dbuf, 8, 20000));
  const size_t lat_sizes[] = {(size_t)64 << 10, (size_t)1 << 20, (size_t)4 << 20};
  for (int i = 0; i < 3 && lat_sizes[i] <= max; i++) {
    row("lat", "D D", lat_sizes[i], "us", latency(dbuf, lat_sizes[i], lat_sizes[i] > ((size_t)1 << 20) ? 500 : 2000));
  }
  for (size_t n = (size_t)1 << 20; n <= max; n *= 2) {
    row("bw", "D D", n, "GBps", bandwidth(dbuf, n, 64, n > ((size_t)16 << 20) ? 5 : 20));
  }
  CK(cudaFree(dbuf));
  MPI_Finalize();
  return failed;
}
