/*
 * osu_coll: an OSU-style collective latency benchmark (osu_allreduce, osu_bcast,
 * osu_allgather, osu_alltoall in one program) for the PMPI shim (issue 30): the same
 * collective on device buffers through the shim, on device buffers staged by hand
 * (what a user of an MPI that is not CUDA-aware writes today), and on host buffers.
 *
 *   mpicc -O2 -Iffi/shim/include ffi/shim/examples/osu_coll.c -o osu_coll          (sim: gpulmt_mpi_alloc)
 *   mpicc -O2 -DOSU_COLL_CUDA -I$CUDA/include -Iffi/shim/include ffi/shim/examples/osu_coll.c \
 *       -L$CUDA/lib64 -lcudart -o osu_coll                                         (CUDA: cudaMalloc)
 *   mpirun -np N [-x LD_PRELOAD=libgpulmt_mpi.so] ./osu_coll COLL MODE [-m MIN:MAX] [-i ITERS] [-c] [--csv FILE]
 *
 * COLL: allreduce (MPI_FLOAT, MPI_SUM), bcast (root 0), allgather, alltoall (sizes are
 * each rank's block, as OSU's). MODE:
 *   device  the collective on device buffers (needs the shim, or a CUDA-aware MPI);
 *   staged  device buffers copied to pinned host buffers before each call and back after
 *           it (cudaMemcpy; the copies are timed with the call);
 *   host    host buffers.
 * Without OSU_COLL_CUDA device buffers come from gpulmt_mpi_alloc (sim devices: the shim
 * must be preloaded in every mode); with it each rank takes device (its rank on the host)
 * modulo the devices, as OSU does. Sizes are powers of two from MIN to MAX bytes
 * (default 8:64M); iterations 200 up to 8 KiB, 100 up to 1 MiB, 20 above (-i sets all),
 * after a tenth as many warm-up calls. With -c every size is checked once after timing.
 * Rank 0 prints "# Size Avg(us) Min(us) Max(us)" rows (the ranks' mean per-call times)
 * and, with --csv, appends "osu_coll,COLL,MODE,NP,BYTES,AVG,MIN,MAX,CHECK" lines (CHECK:
 * ok, FAIL or -). Exits 1 when a check failed.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef OSU_COLL_CUDA
#include <cuda_runtime.h>
#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      fprintf(stderr, "osu_coll: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                        \
    }                                                                                      \
  } while (0)
static void *dev_alloc(size_t n) {
  void *p = NULL;
  CK(cudaMalloc(&p, n));
  return p;
}
static void dev_free(void *p) { cudaFree(p); }
static void *pinned_alloc(size_t n) {
  void *p = NULL;
  CK(cudaMallocHost(&p, n));
  return p;
}
static void pinned_free(void *p) { cudaFreeHost(p); }
static void copy(void *dst, const void *src, size_t n) { CK(cudaMemcpy(dst, src, n, cudaMemcpyDefault)); }
// As OSU's -d cuda: the rank's device is its index on the host modulo the devices, so
// ranks spread over a host's GPUs as NCCL's anchor places them (and as gpulmt does).
static void select_device(int rank) {
  const char *local = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (!local) local = getenv("MPI_LOCALRANKID");
  int ndev = 0, r = local ? atoi(local) : rank;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev > 0) CK(cudaSetDevice(r % ndev));
}
#else
static void select_device(int rank) { (void)rank; }
#define GPULMT_MPI_WEAK
#include "gpulmt_mpi.h"
static void *dev_alloc(size_t n) {
  void *p = gpulmt_mpi_alloc ? gpulmt_mpi_alloc(n) : NULL;
  if (!p) {
    fprintf(stderr, "osu_coll: gpulmt_mpi_alloc(%zu) failed (preload libgpulmt_mpi.so, GPULMT_DEVICE=sim)\n", n);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return p;
}
static void dev_free(void *p) { gpulmt_mpi_free(p); }
static void *pinned_alloc(size_t n) { return malloc(n); }
static void pinned_free(void *p) { free(p); }
static void copy(void *dst, const void *src, size_t n) {
  if (gpulmt_mpi_memcpy(dst, src, n) != 0) {
    fprintf(stderr, "osu_coll: gpulmt_mpi_memcpy failed\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
}
#endif

enum { ALLREDUCE, BCAST, ALLGATHER, ALLTOALL };
enum { DEVICE, STAGED, HOST };
static int rank, size, coll, mode;

/* Bytes of the send and the receive buffer for a message of `b` bytes. */
static size_t send_bytes(size_t b) { return coll == ALLTOALL ? b * (size_t)size : b; }
static size_t recv_bytes(size_t b) { return coll == ALLGATHER || coll == ALLTOALL ? b * (size_t)size : b; }

/* The collective on s/r (host or device, as the mode says). */
static int call(void *s, void *r, size_t b) {
  int n = (int)b;
  switch (coll) {
    case ALLREDUCE: return MPI_Allreduce(s, r, n / 4, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    case BCAST: return MPI_Bcast(r, n, MPI_BYTE, 0, MPI_COMM_WORLD);
    case ALLGATHER: return MPI_Allgather(s, n, MPI_BYTE, r, n, MPI_BYTE, MPI_COMM_WORLD);
    default: return MPI_Alltoall(s, n, MPI_BYTE, r, n, MPI_BYTE, MPI_COMM_WORLD);
  }
}

/* One timed call in the mode: `ds`/`dr` device buffers, `hs`/`hr` host ones. */
static int once(void *ds, void *dr, void *hs, void *hr, size_t b) {
  if (mode == DEVICE) return call(ds, dr, b);
  if (mode == HOST) return call(hs, hr, b);
  if (coll == BCAST) {
    if (rank == 0) copy(hr, dr, b);
  } else {
    copy(hs, ds, send_bytes(b));
  }
  int rc = call(hs, hr, b);
  copy(dr, hr, recv_bytes(b));
  return rc;
}

/* Fills the send side with this rank's pattern (for bcast: the receive buffer at the root). */
static void fill(unsigned char *tmp, void *ds, void *dr, void *hs, void *hr, size_t b) {
  size_t n = coll == BCAST ? b : send_bytes(b);
  if (coll == ALLREDUCE) {
    for (size_t i = 0; i < n / 4; i++) ((float *)tmp)[i] = (float)(rank + 1 + (int)(i % 3));
  } else {
    for (size_t i = 0; i < n; i++) tmp[i] = (unsigned char)(rank * 16 + (int)(i / (b ? b : 1)) + (int)(i % 7));
  }
  if (coll == BCAST && rank != 0) memset(tmp, 0xEE, n);
  void *dst = coll == BCAST ? (mode == HOST ? hr : dr) : (mode == HOST ? hs : ds);
  if (mode == HOST)
    memcpy(dst, tmp, n);
  else
    copy(dst, tmp, n);
}

/* Whether the receive side holds what the collective means. */
static int check(unsigned char *tmp, void *dr, void *hr, size_t b) {
  size_t n = recv_bytes(b);
  if (mode == HOST)
    memcpy(tmp, hr, n);
  else
    copy(tmp, dr, n);
  for (size_t i = 0; i < n; i++) {
    unsigned char want;
    if (coll == ALLREDUCE) {
      if (i % 4) continue;
      float w = 0;
      for (int r = 0; r < size; r++) w += (float)(r + 1 + (int)((i / 4) % 3));
      if (((float *)tmp)[i / 4] != w) return 0;
      continue;
    } else if (coll == BCAST) {
      want = (unsigned char)((int)(i % 7));
    } else if (coll == ALLGATHER) {
      size_t r = i / b, k = i % b;
      want = (unsigned char)((int)r * 16 + (int)(k % 7));
    } else { /* block r of mine came from rank r's block `rank` */
      size_t r = i / b, k = i % b, at = (size_t)rank * b + k;
      want = (unsigned char)((int)r * 16 + (int)(at / b) + (int)(at % 7));
    }
    if (tmp[i] != want) return 0;
  }
  return 1;
}

static size_t parse_size(const char *s) {
  char *end;
  size_t v = strtoull(s, &end, 10);
  if (*end == 'K') v <<= 10;
  if (*end == 'M') v <<= 20;
  if (*end == 'G') v <<= 30;
  return v;
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  select_device(rank);
  const char *colls[] = {"allreduce", "bcast", "allgather", "alltoall"}, *modes[] = {"device", "staged", "host"};
  coll = mode = -1;
  for (int i = 0; i < 4 && argc > 2; i++)
    if (strcmp(argv[1], colls[i]) == 0) coll = i;
  for (int i = 0; i < 3 && argc > 2; i++)
    if (strcmp(argv[2], modes[i]) == 0) mode = i;
  if (coll < 0 || mode < 0) {
    if (rank == 0) fprintf(stderr, "usage: osu_coll allreduce|bcast|allgather|alltoall device|staged|host [-m MIN:MAX] [-i N] [-c] [--csv FILE]\n");
    MPI_Finalize();
    return 2;
  }
  size_t lo = 8, hi = (size_t)64 << 20;
  int iters = 0, validate = 0, failed = 0;
  const char *csv = NULL;
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "-m") == 0 && i + 1 < argc) {
      char *colon = strchr(argv[++i], ':');
      lo = parse_size(argv[i]);
      if (colon) hi = parse_size(colon + 1);
    } else if (strcmp(argv[i], "-i") == 0 && i + 1 < argc) {
      iters = atoi(argv[++i]);
    } else if (strcmp(argv[i], "-c") == 0) {
      validate = 1;
    } else if (strcmp(argv[i], "--csv") == 0 && i + 1 < argc) {
      csv = argv[++i];
    }
  }
  if (coll == ALLREDUCE && lo < 4) lo = 4;
  size_t sb = send_bytes(hi), rb = recv_bytes(hi), big = sb > rb ? sb : rb;
  void *ds = NULL, *dr = NULL, *hs = NULL, *hr = NULL;
  if (mode != HOST) {
    ds = dev_alloc(sb);
    dr = dev_alloc(rb);
  }
  if (mode == STAGED) {
    hs = pinned_alloc(sb);
    hr = pinned_alloc(rb);
  } else if (mode == HOST) {
    hs = malloc(sb);
    hr = malloc(rb);
  }
  unsigned char *tmp = malloc(big);
  FILE *out = csv && rank == 0 ? fopen(csv, "a") : NULL;
  if (rank == 0) printf("# osu_coll %s %s, %d ranks\n# Size Avg(us) Min(us) Max(us)\n", colls[coll], modes[mode], size);
  for (size_t b = lo; b <= hi; b *= 2) {
    int n = iters ? iters : b <= 8192 ? 200 : b <= ((size_t)1 << 20) ? 100 : 20, warm = n / 10 + 1;
    fill(tmp, ds, dr, hs, hr, b);
    for (int i = 0; i < warm; i++) once(ds, dr, hs, hr, b);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < n; i++)
      if (once(ds, dr, hs, hr, b) != MPI_SUCCESS) failed = 1;
    double us = (MPI_Wtime() - t0) * 1e6 / n, sum = 0, mn = 0, mx = 0;
    MPI_Reduce(&us, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&us, &mn, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&us, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    const char *verdict = "-";
    if (validate) {
      fill(tmp, ds, dr, hs, hr, b);
      once(ds, dr, hs, hr, b);
      int ok = check(tmp, dr, hr, b), all = 0;
      MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      verdict = all ? "ok" : "FAIL";
      if (!all) failed = 1;
    }
    if (rank == 0) {
      printf("%-10zu %12.2f %12.2f %12.2f%s%s\n", b, sum / size, mn, mx, validate ? " " : "", validate ? verdict : "");
      if (out)
        fprintf(out, "osu_coll,%s,%s,%d,%zu,%.2f,%.2f,%.2f,%s\n", colls[coll], modes[mode], size, b, sum / size, mn, mx,
                verdict);
    }
  }
  if (out) fclose(out);
  if (mode != HOST) {
    dev_free(ds);
    dev_free(dr);
  }
  if (mode == STAGED) {
    pinned_free(hs);
    pinned_free(hr);
  } else if (mode == HOST) {
    free(hs);
    free(hr);
  }
  free(tmp);
  fflush(stdout);
  MPI_Finalize();
  return failed;
}
