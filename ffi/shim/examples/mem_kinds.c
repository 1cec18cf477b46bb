/*
 * mem_kinds: a plain MPI program that sends device memory of every kind a CUDA application
 * can allocate (docs/memory-kinds.md), written as an application that knows nothing of
 * gpulmt. Under the PMPI shim a non-CUDA-aware MPI moves all of them; without it such an
 * MPI crashes or sends garbage.
 *
 *   mpicc -O2 -I$CUDA/include mem_kinds.c -L$CUDA/lib64 -lcudart -lcuda -o mem_kinds
 *   mpirun -np 2 -x LD_PRELOAD=/path/to/libgpulmt_mpi.so ./mem_kinds [cycles]   (or -np 4)
 *
 * Ranks pair up (0 with 1, 2 with 3, ...; an odd last rank idles); kinds below say "rank 0"
 * and "rank 1" for the even and the odd rank of a pair.
 *
 * Kinds: cudaMalloc, cudaMallocAsync (default pool), cudaMallocFromPoolAsync from a pool
 * with a POSIX-fd handle type, cuMemCreate + cuMemMap (one chunk, and three chunks behind
 * one range), cudaMallocManaged, cudaMallocHost. For every pair of kinds (rank 0's, rank
 * 1's) and sizes 8 B, 64 KiB + 1, 4 MiB, 64 MiB + 3: rank 0 sends a pattern, rank 1
 * checks it and sends it back with Isend/Irecv, rank 0 checks it. Then `cycles` (default
 * 10000) rounds of allocate / send / free of 1 MiB of the shareable pool, with the GPU's
 * free memory (cuMemGetInfo) before and after on both ranks.
 * Prints CSV rows `mem_kinds,what,kind0,kind1,bytes,value`; exits 1 on a wrong byte.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x)                                                                            \
  do {                                                                                   \
    cudaError_t e_ = (x);                                                                \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "CUDA %s at line %d: %s\n", #x, __LINE__, cudaGetErrorString(e_)); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                                      \
    }                                                                                    \
  } while (0)
#define CU(x)                                                               \
  do {                                                                      \
    CUresult r_ = (x);                                                      \
    if (r_ != CUDA_SUCCESS) {                                               \
      const char *s_ = "?";                                                 \
      cuGetErrorName(r_, &s_);                                              \
      fprintf(stderr, "CUDA %s at line %d: %s\n", #x, __LINE__, s_);        \
      MPI_Abort(MPI_COMM_WORLD, 2);                                         \
    }                                                                       \
  } while (0)

enum kind { LEGACY, POOL, POOL_IPC, VMM1, VMM3, MANAGED, PINNED, NKINDS };
static const char *names[NKINDS] = {"legacy", "pool", "pool-ipc", "vmm-ipc", "vmm-ipc:3", "managed", "pinned-host"};
static int rank, size, peer, lead, idle;
static cudaMemPool_t shared_pool;

struct buf {
  enum kind k;
  void *p;
  size_t len, total;
  CUmemGenericAllocationHandle h[3];
};

static void make(struct buf *b, enum kind k, size_t len) {
  b->k = k;
  b->len = len;
  b->total = len;
  switch (k) {
  case LEGACY: CK(cudaMalloc(&b->p, len)); break;
  case POOL: CK(cudaMallocAsync(&b->p, len, 0)); CK(cudaStreamSynchronize(0)); break;
  case POOL_IPC: CK(cudaMallocFromPoolAsync(&b->p, len, shared_pool, 0)); CK(cudaStreamSynchronize(0)); break;
  case MANAGED: CK(cudaMallocManaged(&b->p, len, cudaMemAttachGlobal)); break;
  case PINNED: CK(cudaMallocHost(&b->p, len)); break;
  case VMM1:
  case VMM3: {
    int chunks = k == VMM1 ? 1 : 3, dev = 0;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CK(cudaGetDevice(&dev));
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    size_t gran = 0;
    CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t per = ((len + chunks - 1) / chunks + gran - 1) / gran * gran;
    b->total = per * chunks;
    CUdeviceptr va;
    CU(cuMemAddressReserve(&va, b->total, 0, 0, 0));
    for (int c = 0; c < chunks; c++) {
      CU(cuMemCreate(&b->h[c], per, &prop, 0));
      CU(cuMemMap(va + c * per, per, 0, b->h[c], 0));
    }
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(va, b->total, &a, 1));
    b->p = (void *)va;
    break;
  }
  default: abort();
  }
}

static void unmake(struct buf *b) {
  switch (b->k) {
  case LEGACY: case MANAGED: CK(cudaFree(b->p)); break;
  case POOL: case POOL_IPC: CK(cudaFreeAsync(b->p, 0)); CK(cudaStreamSynchronize(0)); break;
  case PINNED: CK(cudaFreeHost(b->p)); break;
  case VMM1: case VMM3:
    CU(cuMemUnmap((CUdeviceptr)b->p, b->total));
    for (int c = 0; c < (b->k == VMM1 ? 1 : 3); c++) CU(cuMemRelease(b->h[c]));
    CU(cuMemAddressFree((CUdeviceptr)b->p, b->total));
    break;
  default: abort();
  }
}

static unsigned char at(size_t i, unsigned seed) { return (unsigned char)((i * 131 + seed * 7 + (i >> 13)) & 0xff); }

static void fill(struct buf *b, unsigned seed) {
  unsigned char *h = malloc(b->len);
  for (size_t i = 0; i < b->len; i++) h[i] = at(i, seed);
  CK(cudaMemcpy(b->p, h, b->len, cudaMemcpyDefault));
  free(h);
}

/* The index of the first wrong byte, or -1. */
static long check(struct buf *b, unsigned seed) {
  unsigned char *h = malloc(b->len);
  CK(cudaMemcpy(h, b->p, b->len, cudaMemcpyDefault));
  long bad = -1;
  for (size_t i = 0; i < b->len && bad < 0; i++)
    if (h[i] != at(i, seed)) bad = (long)i;
  free(h);
  return bad;
}

static void row(const char *what, int k0, int k1, size_t bytes, const char *value) {
  if (rank == 0) printf("mem_kinds,%s,%s,%s,%zu,%s\n", what, k0 >= 0 ? names[k0] : "-", k1 >= 0 ? names[k1] : "-", bytes, value);
  fflush(stdout);
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  peer = rank ^ 1;
  lead = rank % 2 == 0;
  idle = peer >= size;
  int cycles = argc > 1 ? atoi(argv[1]) : 10000;
  CK(cudaSetDevice(0));
  struct cudaMemPoolProps pp;
  memset(&pp, 0, sizeof pp);
  pp.allocType = cudaMemAllocationTypePinned;
  pp.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = 0;
  CK(cudaMemPoolCreate(&shared_pool, &pp));
  const size_t sizes[] = {8, 65537, 4u << 20, (64u << 20) + 3};
  int failed = 0;
  unsigned seed = 1;
  for (int k0 = 0; k0 < NKINDS; k0++)
    for (int k1 = 0; k1 < NKINDS; k1++)
      for (unsigned s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        seed++;
        if (idle) continue;
        struct buf b;
        make(&b, lead ? k0 : k1, n);
        long bad = -1, bad_back = -1;
        if (lead) {
          fill(&b, seed);
          MPI_Send(b.p, (int)n, MPI_BYTE, peer, 7, MPI_COMM_WORLD);
          CK(cudaMemset(b.p, 0, n));
          MPI_Request r;
          MPI_Irecv(b.p, (int)n, MPI_BYTE, peer, 8, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
          bad_back = check(&b, seed);
          MPI_Recv(&bad, 1, MPI_LONG, peer, 9, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
          MPI_Recv(b.p, (int)n, MPI_BYTE, peer, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          bad = check(&b, seed);
          MPI_Request r;
          MPI_Isend(b.p, (int)n, MPI_BYTE, peer, 8, MPI_COMM_WORLD, &r);
          MPI_Wait(&r, MPI_STATUS_IGNORE);
          MPI_Send(&bad, 1, MPI_LONG, peer, 9, MPI_COMM_WORLD);
        }
        unmake(&b);
        if (lead && (bad >= 0 || bad_back >= 0)) {
          fprintf(stderr, "rank %d: %s -> %s, %zu bytes: wrong at byte %ld there, %ld back\n", rank, names[k0], names[k1],
                  n, bad, bad_back);
          failed = 1;
        }
        if (rank == 0) {
          char v[96];
          snprintf(v, sizeof v, "%s", bad < 0 && bad_back < 0 ? "ok" : "WRONG");
          if (bad >= 0 || bad_back >= 0) snprintf(v, sizeof v, "WRONG at byte %ld there, %ld back", bad, bad_back);
          row("check", k0, k1, n, v);
        }
      }
  /* Allocate / send / free of the shareable pool: the GPU's memory must stay flat. */
  size_t n = 1u << 20, free0 = 0, free1 = 0, total = 0;
  for (int c = 0; c < cycles + 100; c++) {
    if (c == 100) {
      CK(cudaDeviceSynchronize());
      CK(cudaMemGetInfo(&free0, &total));
    }
    if (idle) continue;
    struct buf b;
    make(&b, POOL_IPC, n);
    if (lead) {
      if (c % 1000 == 0) fill(&b, c);
      MPI_Send(b.p, (int)n, MPI_BYTE, peer, 10, MPI_COMM_WORLD);
    } else {
      MPI_Recv(b.p, (int)n, MPI_BYTE, peer, 10, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (c % 1000 == 0 && check(&b, c) >= 0) {
        fprintf(stderr, "cycle %d: wrong bytes\n", c);
        failed = 1;
      }
    }
    unmake(&b);
  }
  CK(cudaDeviceSynchronize());
  CK(cudaMemGetInfo(&free1, &total));
  long grew[2] = {(long)(free0 - free1) >> 20, 0};
  MPI_Reduce(&grew[0], &grew[1], 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
  char v[64];
  snprintf(v, sizeof v, "%ld", grew[1]);
  row("cycles_gpu_memory_growth_mib", POOL_IPC, POOL_IPC, (size_t)cycles, v);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  row("result", -1, -1, 0, any ? "FAIL" : "ok");
  MPI_Finalize();
  return any;
}
