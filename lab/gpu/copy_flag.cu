// How a small copy between device memory and pinned host memory is best seen finished, under
// MPS: the latency of one 8 B (or N B) copy, issued and waited for, in four ways:
//   sync     cudaMemcpy (the host-staged anchor's way)
//   query    cuMemcpyAsync on a non-blocking stream, then cuStreamQuery until idle (gpulmt's
//            copy engine path: a driver call per poll)
//   flag     cuMemcpyAsync, then cuStreamWriteValue64 of a sequence number into pinned host
//            memory behind it on the same stream, then spin on that word (a load per poll)
//   event    cuMemcpyAsync, cuEventRecord, then cuEventQuery until done
// for D2H and H2D; prints CSV `way,dir,bytes,median_us,p10_us,issue_us` (issue_us: the
// median CPU time of the calls that queue the copy, before the wait).
// Build: nvcc -O2 -arch=sm_90 copy_flag.cu -lcuda -o copy_flag; run: ./copy_flag [bytes] [iters]
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, (int)e_); exit(1); } } while (0)

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
  size_t bytes = argc > 1 ? strtoull(argv[1], 0, 0) : 8;
  int iters = argc > 2 ? atoi(argv[2]) : 5000;
  CK(cudaSetDevice(0));
  CK(cudaFree(0));
  void *dev, *host;
  CK(cudaMalloc(&dev, bytes));
  CK(cudaHostAlloc(&host, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  volatile unsigned long long* flag;
  CK(cudaHostAlloc((void**)&flag, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  *flag = 0;
  CUdeviceptr flag_dev;
  CK(cuMemHostGetDevicePointer(&flag_dev, (void*)flag, 0));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  unsigned long long seq = 0;
  const char* ways[] = {"sync", "query", "flag", "event"};
  for (int dir = 0; dir < 2; dir++) {
    CUdeviceptr dst = dir == 0 ? (CUdeviceptr)host : (CUdeviceptr)dev;
    CUdeviceptr src = dir == 0 ? (CUdeviceptr)dev : (CUdeviceptr)host;
    for (int w = 0; w < 4; w++) {
      std::vector<double> lat, issue;
      for (int i = 0; i < iters + 200; i++) {
        double t0 = now_us(), t1;
        switch (w) {
          case 0:
            CK(cudaMemcpy((void*)dst, (void*)src, bytes, cudaMemcpyDefault));
            t1 = now_us();
            break;
          case 1:
            CK(cuMemcpyAsync(dst, src, bytes, s));
            t1 = now_us();
            while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) {}
            break;
          case 2:
            CK(cuMemcpyAsync(dst, src, bytes, s));
            CK(cuStreamWriteValue64(s, flag_dev, ++seq, CU_STREAM_WRITE_VALUE_DEFAULT));
            t1 = now_us();
            while (*flag != seq) {}
            break;
          default:
            CK(cuMemcpyAsync(dst, src, bytes, s));
            CK(cuEventRecord(ev, s));
            t1 = now_us();
            while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY) {}
            break;
        }
        double t2 = now_us();
        if (i >= 200) { lat.push_back(t2 - t0); issue.push_back(t1 - t0); }
      }
      std::sort(lat.begin(), lat.end());
      std::sort(issue.begin(), issue.end());
      printf("%s,%s,%zu,%.2f,%.2f,%.2f\n", ways[w], dir == 0 ? "d2h" : "h2d", bytes, lat[lat.size() / 2],
             lat[lat.size() / 10], issue[issue.size() / 2]);
      fflush(stdout);
    }
  }
  return 0;
}
