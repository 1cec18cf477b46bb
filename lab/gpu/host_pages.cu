// Does the kind of pinned host memory change how long a copy-engine copy takes? gpulmt's
// staging buffers are cuMemHostAlloc memory; a 64 KiB copy into them took 7 us (D2H) and
// 10.5 us (H2D) in the shim trace, where 8 B took 5-6. If the IOMMU translates each 4 KiB
// host page, pages of 2 MiB would need fewer translations. Measures one copy, issued with
// cuMemcpyAsync on a non-blocking stream and polled with cuStreamQuery (gpulmt's way), for
// each size, direction and kind of host memory:
//   hostalloc   cuMemHostAlloc(PORTABLE | DEVICEMAP)           (gpulmt's bounce buffers)
//   register4k  malloc'ed 4 KiB pages + cuMemHostRegister      (madvise NOHUGEPAGE)
//   thp         2 MiB-aligned, madvise(HUGEPAGE), touched, + cuMemHostRegister
//   hugetlb     mmap(MAP_HUGETLB) + cuMemHostRegister           (where the host reserved pages)
// The buffer is 64 MiB and each copy uses the next offset (stride = size rounded up to 64 KiB),
// as a pipeline cycles through its bounce buffers, so the translations are not all warm.
// CSV on stdout: kind,dir,bytes,median_us,p10_us,p90_us
// Build: nvcc -O2 -arch=sm_90 host_pages.cu -lcuda -o host_pages; run: ./host_pages [iters]
#include <cuda.h>
#include <sys/mman.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x) do { auto e_ = (x); if (e_ != 0) { fprintf(stderr, "%s:%d: %s -> %d\n", __FILE__, __LINE__, #x, (int)e_); exit(1); } } while (0)

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static const size_t kBytes = 64 << 20;

static void* make(const char* kind) {
  void* p = nullptr;
  if (!strcmp(kind, "hostalloc")) {
    CK(cuMemHostAlloc(&p, kBytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP));
    memset(p, 1, kBytes);
    return p;
  }
  if (!strcmp(kind, "hugetlb")) {
    p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
    if (p == MAP_FAILED) return nullptr;
  } else {
    p = aligned_alloc(2 << 20, kBytes);
    madvise(p, kBytes, !strcmp(kind, "thp") ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  memset(p, 1, kBytes);
  CK(cuMemHostRegister(p, kBytes, CU_MEMHOSTREGISTER_PORTABLE));
  return p;
}

// AnonHugePages of this process, kB: whether THP took.
static long anon_huge_kb() {
  FILE* f = fopen("/proc/self/smaps_rollup", "r");
  if (!f) return -1;
  char line[256];
  long kb = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
  fclose(f);
  return kb;
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 2000;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUdeviceptr d;
  CK(cuMemAlloc(&d, kBytes));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const char* kinds[] = {"hostalloc", "register4k", "thp", "hugetlb"};
  const size_t sizes[] = {8, 4096, 65536, 262144, 1 << 20, 4 << 20};
  printf("kind,dir,bytes,median_us,p10_us,p90_us\n");
  for (const char* kind : kinds) {
    long before = anon_huge_kb();
    void* h = make(kind);
    if (!h) {
      fprintf(stderr, "%s: not available on this host\n", kind);
      continue;
    }
    fprintf(stderr, "%s: AnonHugePages %ld -> %ld kB\n", kind, before, anon_huge_kb());
    for (size_t n : sizes) {
      size_t stride = (n + 65535) / 65536 * 65536;
      for (int dir = 0; dir < 2; dir++) {
        std::vector<double> t;
        size_t off = 0;
        for (int i = -iters / 10; i < iters; i++) {
          char* hp = (char*)h + off;
          CUdeviceptr dp = d + off;
          off = off + 2 * stride <= kBytes ? off + stride : 0;
          double t0 = now_us();
          if (dir == 0) CK(cuMemcpyDtoHAsync(hp, dp, n, s));
          else CK(cuMemcpyHtoDAsync(dp, hp, n, s));
          CUresult r;
          while ((r = cuStreamQuery(s)) == CUDA_ERROR_NOT_READY) {}
          CK(r);
          if (i >= 0) t.push_back(now_us() - t0);
        }
        std::sort(t.begin(), t.end());
        printf("%s,%s,%zu,%.2f,%.2f,%.2f\n", kind, dir == 0 ? "D2H" : "H2D", n, t[t.size() / 2], t[t.size() / 10],
               t[t.size() * 9 / 10]);
        fflush(stdout);
      }
    }
    if (!strcmp(kind, "hostalloc")) CK(cuMemFreeHost(h));
    else {
      CK(cuMemHostUnregister(h));
      if (!strcmp(kind, "hugetlb")) munmap(h, kBytes);
      else free(h);
    }
  }
  return 0;
}
