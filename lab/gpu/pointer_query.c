/*
 * pointer_query: what a host-range cache of pointer types may assume on this host.
 *   1. Does cudaMalloc reuse the address range of host memory that was freed (munmap'd)?
 *      A large malloc (above glibc's mmap threshold) is freed, then device memory of the
 *      same size allocated, many times; prints how often the device buffer overlaps the
 *      freed host range.
 *   2. What the driver's pointer query costs (cuPointerGetAttributes with the five
 *      attributes gpulmt asks, and with the memory type alone) on heap, mmap'd and device
 *      pointers, and what a mincore() of one page costs, in ns per call.
 * Build: gcc -O2 -I$CUDA/include pointer_query.c -L$CUDA/lib64 -lcuda -lcudart -o pq
 * Prints CSV rows `pointer_query,what,value`.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static double query_ns(void *p, int nattr, int iters) {
  CUpointer_attribute attrs[5] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                  CU_POINTER_ATTRIBUTE_BUFFER_ID};
  unsigned mt = 0;
  int ord = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  unsigned long long id = 0;
  void *data[5] = {&mt, &ord, &start, &size, &id};
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) cuPointerGetAttributes(nattr, attrs, data, (CUdeviceptr)p);
  return (now_ns() - t0) / iters;
}

int main(void) {
  const size_t big = (size_t)64 << 20;
  cudaSetDevice(0);
  cudaFree(0);
  int overlaps = 0, tries = 20;
  for (int i = 0; i < tries; i++) {
    char *h = malloc(big + 64);
    memset(h, 1, 4096);
    uintptr_t hb = (uintptr_t)h, he = hb + big + 64;
    free(h);
    void *d;
    cudaMalloc(&d, big);
    uintptr_t db = (uintptr_t)d, de = db + big;
    if (db < he && hb < de) overlaps++;
    if (i < 3) printf("pointer_query,reuse_example,host %#lx-%#lx device %#lx-%#lx\n", hb, he, db, de);
    cudaFree(d);
  }
  printf("pointer_query,malloc_free_then_cudaMalloc_overlaps,%d of %d\n", overlaps, tries);
  overlaps = 0;
  for (int i = 0; i < tries; i++) {
    char *h = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uintptr_t hb = (uintptr_t)h, he = hb + big;
    munmap(h, big);
    void *d;
    cudaMalloc(&d, big);
    uintptr_t db = (uintptr_t)d, de = db + big;
    if (db < he && hb < de) overlaps++;
    cudaFree(d);
  }
  printf("pointer_query,mmap_munmap_then_cudaMalloc_overlaps,%d of %d\n", overlaps, tries);

  char *small = malloc(64);
  char *large = malloc(big);
  memset(small, 0, 64);
  memset(large, 0, big);
  void *dev;
  cudaMalloc(&dev, 1 << 20);
  const int iters = 200000;
  for (int round = 0; round < 2; round++) {
    printf("pointer_query,query5_heap_ns,%.1f\n", query_ns(small, 5, iters));
    printf("pointer_query,query5_mmap_ns,%.1f\n", query_ns(large, 5, iters));
    printf("pointer_query,query5_device_ns,%.1f\n", query_ns(dev, 5, iters));
    printf("pointer_query,query1_heap_ns,%.1f\n", query_ns(small, 1, iters));
    printf("pointer_query,query1_device_ns,%.1f\n", query_ns(dev, 1, iters));
    unsigned char vec;
    long page = sysconf(_SC_PAGESIZE);
    double t0 = now_ns();
    for (int i = 0; i < iters; i++) mincore((void *)((uintptr_t)large & ~(page - 1)), 1, &vec);
    printf("pointer_query,mincore_ns,%.1f\n", (now_ns() - t0) / iters);
  }
  return 0;
}
