// Whether a tiny payload reaches device memory sooner by the GPU front end's write ops
// (cuStreamWriteValue64 / cuStreamBatchMemOp) than by the copy engine, under MPS: the
// latency of putting N bytes (a multiple of 8) of pinned host data into device memory,
// issued and waited for (a stream query loop), in these ways:
//   copy      cuMemcpyAsync from pinned host memory (gpulmt's copy-in of an eager payload)
//   wv        cuStreamWriteValue64 per 8 bytes (one driver call each)
//   batch     one cuStreamBatchMemOp of N/8 WRITE_VALUE_64 ops
//   memset    cuMemsetD32Async of N/4 words (for reference: what a fill costs)
//   kernel    an empty kernel's launch (for reference)
// Each way checks its result once, before timing. CSV `way,bytes,median_us,p10_us,issue_us`.
// Build: nvcc -O2 -arch=sm_90 write_value.cu -lcuda -o write_value; run: ./write_value [iters]
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, (int)e_); exit(1); } } while (0)

__global__ void empty() {}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 3000;
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  const size_t maxb = 4096;
  void *dev, *host;
  CK(cudaMalloc(&dev, maxb));
  CK(cudaHostAlloc(&host, maxb, cudaHostAllocMapped | cudaHostAllocPortable));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const char* ways[] = {"copy", "wv", "batch", "memset", "kernel"};
  std::vector<CUstreamBatchMemOpParams> ops(maxb / 8);
  std::vector<unsigned char> back(maxb);
  for (size_t bytes : {8, 64, 256, 1024, 4096}) {
    for (int w = 0; w < 5; w++) {
      if ((w == 1 && bytes > 256) || (w == 4 && bytes != 8)) continue;
      std::vector<double> lat, issue;
      for (int i = 0; i < iters + 200; i++) {
        // A new payload each time, as a new message would bring.
        unsigned long long* h = (unsigned long long*)host;
        for (size_t k = 0; k < bytes / 8; k++) h[k] = (unsigned long long)i * 1000003ull + k;
        double t0 = now_us();
        switch (w) {
          case 0:
            CK(cuMemcpyAsync((CUdeviceptr)dev, (CUdeviceptr)host, bytes, s));
            break;
          case 1:
            for (size_t k = 0; k < bytes / 8; k++)
              CK(cuStreamWriteValue64(s, (CUdeviceptr)dev + 8 * k, h[k], CU_STREAM_WRITE_VALUE_DEFAULT));
            break;
          case 2:
            for (size_t k = 0; k < bytes / 8; k++) {
              memset(&ops[k], 0, sizeof(ops[k]));
              ops[k].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
              ops[k].writeValue.address = (CUdeviceptr)dev + 8 * k;
              ops[k].writeValue.value64 = h[k];
              ops[k].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
            }
            CK(cuStreamBatchMemOp(s, (unsigned)(bytes / 8), ops.data(), 0));
            break;
          case 3:
            CK(cuMemsetD32Async((CUdeviceptr)dev, (unsigned)i, bytes / 4, s));
            break;
          default:
            empty<<<1, 1, 0, (cudaStream_t)s>>>();
            CK(cudaGetLastError());
            break;
        }
        double t1 = now_us();
        while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) {}
        double t2 = now_us();
        if (i == 0 && w <= 2) {
          CK(cudaMemcpy(back.data(), dev, bytes, cudaMemcpyDeviceToHost));
          if (memcmp(back.data(), host, bytes) != 0) { fprintf(stderr, "%s %zu: wrong bytes\n", ways[w], bytes); exit(2); }
        }
        if (i >= 200) { lat.push_back(t2 - t0); issue.push_back(t1 - t0); }
      }
      std::sort(lat.begin(), lat.end());
      std::sort(issue.begin(), issue.end());
      printf("%s,%zu,%.2f,%.2f,%.2f\n", ways[w], bytes, lat[lat.size() / 2], lat[lat.size() / 10], issue[issue.size() / 2]);
      fflush(stdout);
    }
  }
  return 0;
}
