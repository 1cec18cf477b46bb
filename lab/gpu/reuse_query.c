/*
 * reuse_query: what the driver says of a cudaMalloc buffer made where pinned host memory was
 * just freed (the PMPI shim took such a buffer for host memory under bench/gpu/kinds.sh).
 * Frees a cudaMallocHost buffer of 64 MiB + 3, cudaMallocs 8 bytes, and asks the eleven
 * attributes gpulmt asks (cuPointerGetAttributes), then each alone.
 * Build: gcc -O2 -I$CUDA/include reuse_query.c -L$CUDA/lib64 -lcuda -lcudart -o rq
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>

int main(void) {
  cudaSetDevice(0);
  cudaFree(0);
  CUpointer_attribute a[11] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_BUFFER_ID,         CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
      CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
  };
  for (int round = 0; round < 3; round++) {
    void *h, *d;
    cudaMallocHost(&h, (64u << 20) + 3);
    cudaFreeHost(h);
    cudaMalloc(&d, 8);
    unsigned long long v[11][2] = {{0}};
    void *data[11];
    for (int i = 0; i < 11; i++) data[i] = v[i];
    CUresult r = cuPointerGetAttributes(11, a, data, (CUdeviceptr)d);
    const char *s = "?";
    cuGetErrorName(r, &s);
    printf("reuse_query,round=%d,pinned=%p device=%p inside=%d,all11=%s type=%llu ordinal=%lld\n", round, h, d,
           (char *)d >= (char *)h && (char *)d < (char *)h + (64u << 20), s, v[0][0], (long long)(int)v[1][0]);
    for (int i = 0; i < 11; i++) {
      unsigned long long one[2] = {0};
      void *p1 = one;
      r = cuPointerGetAttributes(1, &a[i], &p1, (CUdeviceptr)d);
      cuGetErrorName(r, &s);
      if (r) printf("reuse_query,round=%d,attribute %d alone: %s\n", round, (int)a[i], s);
    }
  }
  return 0;
}
