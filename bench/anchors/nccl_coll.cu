// NCCL's collectives, the ceiling of the PMPI shim's collective benchmark (issue 30;
// bench/gpu/run.sh coll): one process drives NP ranks on GPUs 0..NP-1 (ncclCommInitAll,
// grouped calls), float sum all-reduce, broadcast from rank 0, all-gather and all-to-all
// (grouped ncclSend/ncclRecv), sizes as OSU's (each rank's block), 8 B to MAX bytes.
// Prints CSV rows `nccl,COLL,NP,BYTES,us` (the mean time per call of 20 to 200 calls
// after warm-up, all ranks' streams synchronized).
// NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): with fewer GPUs than
// NP this says so on stderr and exits 3, and the harness reports the anchor as missing.
// Build: nvcc -O2 -std=c++17 -arch=sm_90 -I$NCCL/include nccl_coll.cu -L$NCCL/lib -l:libnccl.so.2
// Usage: nccl_coll NP [MAX_BYTES]
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                                            \
  do {                                                                                                   \
    cudaError_t e_ = (x);                                                                                \
    if (e_ != cudaSuccess) {                                                                             \
      fprintf(stderr, "nccl_coll: CUDA %s at line %d\n", cudaGetErrorString(e_), __LINE__);              \
      exit(1);                                                                                           \
    }                                                                                                    \
  } while (0)
#define NK(x)                                                                                            \
  do {                                                                                                   \
    ncclResult_t e_ = (x);                                                                               \
    if (e_ != ncclSuccess) {                                                                             \
      fprintf(stderr, "nccl_coll: NCCL %s at line %d\n", ncclGetErrorString(e_), __LINE__);              \
      exit(1);                                                                                           \
    }                                                                                                    \
  } while (0)

int main(int argc, char **argv) {
  int np = argc > 1 ? atoi(argv[1]) : 2;
  size_t max = argc > 2 ? strtoull(argv[2], nullptr, 10) : (size_t)64 << 20;
  int gpus = 0;
  CK(cudaGetDeviceCount(&gpus));
  if (gpus < np) {
    fprintf(stderr, "nccl_coll: %d GPU(s) for %d ranks: NCCL refuses two ranks on one GPU\n", gpus, np);
    return 3;
  }
  std::vector<int> devs(np);
  for (int r = 0; r < np; r++) devs[r] = r;
  std::vector<ncclComm_t> comms(np);
  NK(ncclCommInitAll(comms.data(), np, devs.data()));
  std::vector<cudaStream_t> streams(np);
  std::vector<char *> send(np), recv(np);
  for (int r = 0; r < np; r++) {
    CK(cudaSetDevice(r));
    CK(cudaStreamCreate(&streams[r]));
    CK(cudaMalloc(&send[r], max * np));
    CK(cudaMalloc(&recv[r], max * np));
    CK(cudaMemset(send[r], 1, max * np));
  }
  const char *names[] = {"allreduce", "bcast", "allgather", "alltoall"};
  for (int c = 0; c < 4; c++) {
    for (size_t b = c == 0 ? 4 : 8; b <= max; b *= 2) {
      auto one = [&]() {
        NK(ncclGroupStart());
        for (int r = 0; r < np; r++) {
          switch (c) {
            case 0: NK(ncclAllReduce(send[r], recv[r], b / 4, ncclFloat, ncclSum, comms[r], streams[r])); break;
            case 1: NK(ncclBroadcast(send[r], recv[r], b, ncclChar, 0, comms[r], streams[r])); break;
            case 2: NK(ncclAllGather(send[r], recv[r], b, ncclChar, comms[r], streams[r])); break;
            default:
              for (int p = 0; p < np; p++) {
                NK(ncclSend(send[r] + p * b, b, ncclChar, p, comms[r], streams[r]));
                NK(ncclRecv(recv[r] + p * b, b, ncclChar, p, comms[r], streams[r]));
              }
          }
        }
        NK(ncclGroupEnd());
      };
      auto sync = [&]() {
        for (int r = 0; r < np; r++) {
          CK(cudaSetDevice(r));
          CK(cudaStreamSynchronize(streams[r]));
        }
      };
      int iters = b <= 8192 ? 200 : b <= ((size_t)1 << 20) ? 100 : 20;
      for (int i = 0; i < iters / 10 + 1; i++) one();
      sync();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; i++) one();
      sync();
      double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
      printf("nccl,%s,%d,%zu,%.2f\n", names[c], np, b, us);
      fflush(stdout);
    }
  }
  for (int r = 0; r < np; r++) ncclCommDestroy(comms[r]);
  return 0;
}
