/*
 * memory_kinds: what the driver says of each kind of memory a CUDA application can hand to
 * MPI, and which of them another process can map (issue 45).
 *   1. For every kind (cudaMalloc, cudaMallocAsync from the default pool, from a pool made
 *      with a POSIX-fd handle type and from one without, cuMemCreate + cuMemMap of one
 *      chunk and of three chunks behind one range, cudaMallocManaged, cudaMallocHost,
 *      cudaHostRegister): the pointer attributes at an offset into the buffer, and whether
 *      cuIpcGetMemHandle, cuMemPoolExportToShareableHandle + cuMemPoolExportPointer and
 *      cuMemRetainAllocationHandle + cuMemExportToShareableHandle take it.
 *   2. Address reuse: a pool allocation freed and made again (same size): same address?
 *      same buffer id? A VMM range unmapped and mapped to a new chunk: same buffer id?
 *   3. Across processes (fork before CUDA starts; fds over a socketpair with SCM_RIGHTS):
 *      the child imports the pool and the pointer, the VMM chunks (reserve, map, access),
 *      and the legacy handle, copies each to its own memory and checks the bytes; with
 *      the import times. Run it once without and once under MPS.
 *   4. Pool reuse while imported (what an MPI library meets: the application frees and
 *      reallocates a pool buffer the peer still has imported): the exporter frees its
 *      previous allocation and makes the next one (sizes 64 KiB + 1 .. 64 MiB + 3) from the
 *      same pool; the importer imports each, either holding every earlier import ("hold")
 *      or freeing it before the next ("release"), and reports the new import's address,
 *      cuMemGetAddressRange and its bytes.
 * Build: nvcc -O2 memory_kinds.cu -lcuda -o memory_kinds
 * Prints CSV rows `memory_kinds,what,value`.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BYTES (4u << 20)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static const char *err(CUresult r) {
  const char *s = 0;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}

static void attrs(const char *kind, void *p) {
  CUpointer_attribute a[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_IS_MANAGED,        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE,        CU_POINTER_ATTRIBUTE_BUFFER_ID,
      CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, CU_POINTER_ATTRIBUTE_MAPPED,
      CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
      CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
  };
  unsigned mt = 0, managed = 0, legacy = 0, mapped = 0;
  int ord = -1;
  CUdeviceptr start = 0, mbase = 0;
  size_t size = 0, msize = 0;
  unsigned long long id = 0, block = 0, handles = 0;
  CUmemoryPool pool = 0;
  void *d[] = {&mt, &ord, &managed, &start, &size, &id, &pool, &handles, &legacy, &mapped, &mbase, &msize, &block};
  CUresult r = cuPointerGetAttributes(13, a, d, (CUdeviceptr)p);
  printf("memory_kinds,attrs_%s,rc=%s type=%u ord=%d managed=%u start_off=%lld size=%zu buffer_id=%llu pool=%s "
         "handle_types=%#llx legacy_ipc=%u mapped=%u mapping_off=%lld mapping_size=%zu block_id=%llu\n",
         kind, err(r), mt, ord, managed, start ? (long long)((CUdeviceptr)p - start) : -1LL, size, id,
         pool ? "yes" : "no", handles, legacy, mapped, mbase ? (long long)((CUdeviceptr)p - mbase) : -1LL, msize, block);
  CUdeviceptr gs = 0;
  size_t gz = 0;
  r = cuMemGetAddressRange(&gs, &gz, (CUdeviceptr)p);
  printf("memory_kinds,range_%s,rc=%s off=%lld size=%zu\n", kind, err(r), gs ? (long long)((CUdeviceptr)p - gs) : -1LL, gz);
}

static void try_exports(const char *kind, void *base) {
  CUipcMemHandle h;
  CUresult r = cuIpcGetMemHandle(&h, (CUdeviceptr)base);
  printf("memory_kinds,legacy_export_%s,%s\n", kind, err(r));
  CUmemoryPool pool = 0;
  r = cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)base);
  if (r == CUDA_SUCCESS && pool) {
    int fd = -1;
    r = cuMemPoolExportToShareableHandle(&fd, pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    printf("memory_kinds,pool_export_fd_%s,%s\n", kind, err(r));
    if (fd >= 0) close(fd);
    CUmemPoolPtrExportData data;
    r = cuMemPoolExportPointer(&data, (CUdeviceptr)base);
    printf("memory_kinds,pool_export_ptr_%s,%s\n", kind, err(r));
  }
  CUmemGenericAllocationHandle g;
  r = cuMemRetainAllocationHandle(&g, base);
  printf("memory_kinds,vmm_retain_%s,%s\n", kind, err(r));
  if (r == CUDA_SUCCESS) {
    int fd = -1;
    r = cuMemExportToShareableHandle(&fd, g, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    printf("memory_kinds,vmm_export_fd_%s,%s\n", kind, err(r));
    if (fd >= 0) close(fd);
    CUmemFabricHandle fh;
    r = cuMemExportToShareableHandle(&fh, g, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    printf("memory_kinds,vmm_export_fabric_%s,%s\n", kind, err(r));
    cuMemRelease(g);
  }
}

static void fill(void *p, size_t n, unsigned char seed) {
  unsigned char *h = (unsigned char *)malloc(n);
  for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 7 + seed);
  cudaMemcpy(p, h, n, cudaMemcpyDefault);
  free(h);
}

static int check(const void *dev, size_t n, unsigned char seed) {
  unsigned char *h = (unsigned char *)malloc(n);
  cudaError_t e = cudaMemcpy(h, dev, n, cudaMemcpyDefault);
  int bad = e != cudaSuccess;
  for (size_t i = 0; !bad && i < n; i++) bad = h[i] != (unsigned char)(i * 7 + seed);
  free(h);
  return !bad;
}

/* The VMM granularity and a range of `chunks` chunks of it, each its own physical allocation. */
static size_t gran;
static CUdeviceptr vmm_range(int chunks, CUmemGenericAllocationHandle *hs) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  CUdeviceptr va = 0;
  CUresult r = cuMemAddressReserve(&va, gran * chunks, 0, 0, 0);
  if (r) { printf("memory_kinds,vmm_reserve,%s\n", err(r)); return 0; }
  for (int c = 0; c < chunks; c++) {
    r = cuMemCreate(&hs[c], gran, &prop, 0);
    if (r) { printf("memory_kinds,vmm_create,%s\n", err(r)); return 0; }
    r = cuMemMap(va + c * gran, gran, 0, hs[c], 0);
    if (r) { printf("memory_kinds,vmm_map,%s\n", err(r)); return 0; }
  }
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = cuMemSetAccess(va, gran * chunks, &acc, 1);
  if (r) printf("memory_kinds,vmm_access,%s\n", err(r));
  return va;
}

static void send_fds(int sock, const void *msg, size_t len, const int *fds, int nfd) {
  struct msghdr m = {};
  struct iovec io = {(void *)msg, len};
  char ctl[CMSG_SPACE(sizeof(int) * 8)] = {};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  if (nfd) {
    m.msg_control = ctl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfd);
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfd);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * nfd);
  }
  if (sendmsg(sock, &m, 0) < 0) perror("sendmsg");
}

static int recv_fds(int sock, void *msg, size_t len, int *fds) {
  struct msghdr m = {};
  struct iovec io = {msg, len};
  char ctl[CMSG_SPACE(sizeof(int) * 8)] = {};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  if (recvmsg(sock, &m, 0) < 0) { perror("recvmsg"); return 0; }
  int n = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_type == SCM_RIGHTS) {
      n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      memcpy(fds, CMSG_DATA(c), sizeof(int) * n);
    }
  }
  return n;
}

/* Section 4's messages: the importer asks for the next allocation, the exporter answers. */
struct reuse_ask {
  char tag[8];
  size_t n;
  unsigned char seed;
};
struct reuse_answer {
  CUmemPoolPtrExportData d;
  unsigned long long addr;
  int ok;
};
static const size_t reuse_sizes[] = {65537, 4u << 20, (64u << 20) + 3, 8, 65537, 4u << 20};
#define REUSE_N (sizeof reuse_sizes / sizeof reuse_sizes[0])

struct offer {
  CUipcMemHandle legacy;
  CUmemPoolPtrExportData pool_ptr;
  size_t gran;
  int vmm_chunks;
  int pid;
};

static void child(int sock) {
  cuInit(0);
  CUdevice dev;
  CUcontext ctx;
  cuDeviceGet(&dev, 0);
  cuDevicePrimaryCtxRetain(&ctx, dev);
  cuCtxSetCurrent(ctx);
  struct offer o;
  int fds[8];
  int n = recv_fds(sock, &o, sizeof o, fds);
  printf("memory_kinds,child_fds_received,%d\n", n);
  void *mine;
  cudaMalloc(&mine, BYTES);
  char result[256] = "";
  /* legacy */
  CUdeviceptr p = 0;
  double t0 = now_us();
  CUresult r = cuIpcOpenMemHandle(&p, o.legacy, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  printf("memory_kinds,import_legacy,%s %.1f us\n", err(r), now_us() - t0);
  if (!r) {
    cudaMemcpy(mine, (void *)p, BYTES, cudaMemcpyDefault);
    printf("memory_kinds,bytes_legacy,%s\n", check(mine, BYTES, 1) ? "ok" : "WRONG");
    cuIpcCloseMemHandle(p);
  }
  /* pool */
  CUmemoryPool pool = 0;
  t0 = now_us();
  r = cuMemPoolImportFromShareableHandle(&pool, (void *)(long)fds[0], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  printf("memory_kinds,import_pool,%s %.1f us\n", err(r), now_us() - t0);
  close(fds[0]);
  if (!r) {
    t0 = now_us();
    r = cuMemPoolImportPointer(&p, pool, &o.pool_ptr);
    printf("memory_kinds,import_pool_ptr,%s %.1f us\n", err(r), now_us() - t0);
    if (!r) {
      attrs("imported_pool_ptr", (void *)p);
      cudaError_t e = cudaMemcpy(mine, (void *)p, BYTES, cudaMemcpyDefault);
      printf("memory_kinds,bytes_pool,%s %s\n", cudaGetErrorName(e), check(mine, BYTES, 2) ? "ok" : "WRONG");
      /* The exporter frees its allocation and trims its pool while this import is held:
         what does a read through the import see? (CUDA asks importers to free first.) */
      send(sock, "free", 5, 0);
      char ack[16];
      recv(sock, ack, sizeof ack, 0);
      e = cudaMemcpy(mine, (void *)p, BYTES, cudaMemcpyDefault);
      printf("memory_kinds,read_after_exporter_free_and_trim,%s %s\n", cudaGetErrorName(e),
             check(mine, BYTES, 2) ? "old bytes" : "other bytes");
      cudaGetLastError();
      /* The pointer of an imported pool is freed by the importer too (cuMemFree / cudaFree). */
      r = cuMemFree(p);
      printf("memory_kinds,import_pool_ptr_free,%s\n", err(r));
      /* a second import of the same export data after that free */
      r = cuMemPoolImportPointer(&p, pool, &o.pool_ptr);
      printf("memory_kinds,import_pool_ptr_again,%s\n", err(r));
      if (!r) cuMemFree(p);
      /* 4. pool reuse while imported */
      for (int mode = 0; mode < 2; mode++) {
        const char *how = mode ? "release" : "hold";
        CUdeviceptr held[REUSE_N];
        int nheld = 0;
        for (unsigned i = 0; i < REUSE_N; i++) {
          struct reuse_ask q = {"next", reuse_sizes[i], (unsigned char)(20 + i + 10 * mode)};
          send(sock, &q, sizeof q, 0);
          struct reuse_answer a;
          recv(sock, &a, sizeof a, 0);
          if (!a.ok) { printf("memory_kinds,reuse_%s_%u,exporter failed\n", how, i); continue; }
          CUdeviceptr ip = 0, base = 0;
          size_t size = 0;
          r = cuMemPoolImportPointer(&ip, pool, &a.d);
          CUresult rr = r ? r : cuMemGetAddressRange(&base, &size, ip);
          int ok = !r && !rr && check((void *)ip, q.n, q.seed);
          printf("memory_kinds,reuse_%s_%u,n=%zu exporter_addr=%#llx import=%s addr=%#llx range=%s base=%#llx size=%zu "
                 "bytes=%s held=%d\n",
                 how, i, q.n, a.addr, err(r), (unsigned long long)ip, err(rr), (unsigned long long)base, size,
                 ok ? "ok" : "WRONG", nheld);
          cudaGetLastError();
          if (r) continue;
          if (mode) {
            CUresult f = cuMemFree(ip);
            if (f) printf("memory_kinds,reuse_%s_%u_free,%s\n", how, i, err(f));
          } else {
            held[nheld++] = ip;
          }
        }
        for (int i = 0; i < nheld; i++) {
          CUresult f = cuMemFree(held[i]);
          printf("memory_kinds,reuse_%s_free_held_%d,%s\n", how, i, err(f));
        }
      }
      struct reuse_ask end = {"end", 0, 0};
      send(sock, &end, sizeof end, 0);
    }
    r = cuMemPoolDestroy(pool);
    printf("memory_kinds,import_pool_destroy,%s\n", err(r));
  }
  /* VMM: chunks behind one reserved range */
  CUdeviceptr va = 0;
  size_t total = o.gran * o.vmm_chunks;
  t0 = now_us();
  r = cuMemAddressReserve(&va, total, 0, 0, 0);
  CUmemGenericAllocationHandle hs[8];
  for (int c = 0; c < o.vmm_chunks && !r; c++) {
    r = cuMemImportFromShareableHandle(&hs[c], (void *)(long)fds[1 + c], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (!r) r = cuMemMap(va + c * o.gran, o.gran, 0, hs[c], 0);
    close(fds[1 + c]);
  }
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (!r) r = cuMemSetAccess(va, total, &acc, 1);
  printf("memory_kinds,import_vmm,%s %.1f us for %d chunks\n", err(r), now_us() - t0, o.vmm_chunks);
  if (!r) {
    attrs("imported_vmm", (void *)(va + o.gran / 2));
    cudaError_t e = cudaMemcpy(mine, (void *)va, total < BYTES ? total : BYTES, cudaMemcpyDefault);
    printf("memory_kinds,bytes_vmm,%s %s\n", cudaGetErrorName(e), check(mine, total < BYTES ? total : BYTES, 3) ? "ok" : "WRONG");
    cuMemUnmap(va, total);
    for (int c = 0; c < o.vmm_chunks; c++) cuMemRelease(hs[c]);
  }
  if (va) cuMemAddressFree(va, total);
  /* pidfd_getfd: can a process take another's fd without being handed it? */
#ifdef SYS_pidfd_open
  int pfd = syscall(SYS_pidfd_open, o.pid, 0);
  int got = pfd >= 0 ? syscall(438 /* pidfd_getfd */, pfd, 0, 0) : -1;
  printf("memory_kinds,pidfd_getfd,%s\n", got >= 0 ? "works" : "refused");
  if (got >= 0) close(got);
  if (pfd >= 0) close(pfd);
#endif
  snprintf(result, sizeof result, "done");
  send(sock, result, strlen(result) + 1, 0);
  cudaFree(mine);
}

int main(int argc, char **argv) {
  int sv[2];
  socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv);
  pid_t pid = fork();
  if (pid == 0) {
    close(sv[0]);
    child(sv[1]);
    fflush(stdout);
    _exit(0);
  }
  close(sv[1]);
  cudaSetDevice(0);
  cudaFree(0);
  cuInit(0);
  void *legacy, *async_default, *async_fd, *async_none, *managed, *pinned, *registered;
  cudaMalloc(&legacy, BYTES);
  cudaMallocAsync(&async_default, BYTES, 0);
  cudaMemPoolProps pp = {};
  pp.allocType = cudaMemAllocationTypePinned;
  pp.handleTypes = cudaMemHandleTypePosixFileDescriptor;
  pp.location.type = cudaMemLocationTypeDevice;
  pp.location.id = 0;
  cudaMemPool_t pool_fd, pool_none;
  cudaError_t e = cudaMemPoolCreate(&pool_fd, &pp);
  printf("memory_kinds,pool_create_fd,%s\n", cudaGetErrorName(e));
  pp.handleTypes = cudaMemHandleTypeNone;
  cudaMemPoolCreate(&pool_none, &pp);
  cudaMallocFromPoolAsync(&async_fd, BYTES, pool_fd, 0);
  cudaMallocFromPoolAsync(&async_none, BYTES, pool_none, 0);
  cudaStreamSynchronize(0);
  CUmemGenericAllocationHandle h1[1], h3[3];
  CUdeviceptr vmm1 = vmm_range(1, h1), vmm3 = vmm_range(3, h3);
  printf("memory_kinds,vmm_granularity,%zu\n", gran);
  cudaMallocManaged(&managed, BYTES, cudaMemAttachGlobal);
  cudaMallocHost(&pinned, BYTES);
  registered = malloc(BYTES);
  cudaHostRegister(registered, BYTES, cudaHostRegisterDefault);
  struct { const char *name; void *p; } kinds[] = {
      {"cudaMalloc", legacy},       {"async_default_pool", async_default}, {"async_pool_fd", async_fd},
      {"async_pool_none", async_none}, {"vmm_1chunk", (void *)vmm1},     {"vmm_3chunk", (void *)vmm3},
      {"managed", managed},         {"cudaMallocHost", pinned},           {"cudaHostRegister", registered},
  };
  for (unsigned k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    attrs(kinds[k].name, (char *)kinds[k].p + 4096);
    try_exports(kinds[k].name, kinds[k].p);
  }
  attrs("vmm_3chunk_second_chunk", (char *)vmm3 + gran + 4096);
  /* Does a pointer export need its pool exported first? A fresh pool: pointer, pool, pointer. */
  {
    cudaMemPool_t fresh_pool;
    pp.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    cudaMemPoolCreate(&fresh_pool, &pp);
    void *q;
    cudaMallocFromPoolAsync(&q, BYTES, fresh_pool, 0);
    cudaStreamSynchronize(0);
    CUmemPoolPtrExportData d1, d2;
    CUresult before = cuMemPoolExportPointer(&d1, (CUdeviceptr)q);
    int fd = -1;
    CUresult pool = cuMemPoolExportToShareableHandle(&fd, (CUmemoryPool)fresh_pool, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (fd >= 0) close(fd);
    CUresult after = cuMemPoolExportPointer(&d2, (CUdeviceptr)q);
    printf("memory_kinds,pointer_export_order,before_pool_export=%s pool_export=%s after=%s\n", err(before), err(pool), err(after));
    cudaFreeAsync(q, 0);
    cudaStreamSynchronize(0);
  }
  /* Address reuse in a pool: the buffer id and the export data of the old allocation,
     read before its free, against those of the new one at the same address. */
  for (int round = 0; round < 3; round++) {
    void *a, *b;
    unsigned long long ida = 0, idb = 0;
    CUmemPoolPtrExportData ea, eb;
    cudaMallocFromPoolAsync(&a, BYTES, pool_fd, 0);
    cudaStreamSynchronize(0);
    cuPointerGetAttribute(&ida, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)a);
    cuMemPoolExportPointer(&ea, (CUdeviceptr)a);
    cudaFreeAsync(a, 0);
    cudaMallocFromPoolAsync(&b, BYTES, pool_fd, 0);
    cudaStreamSynchronize(0);
    cuPointerGetAttribute(&idb, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)b);
    cuMemPoolExportPointer(&eb, (CUdeviceptr)b);
    printf("memory_kinds,pool_realloc_%d,same_address=%s old_id=%llu new_id=%llu same_export_data=%s\n", round,
           a == b ? "yes" : "no", ida, idb, memcmp(&ea, &eb, sizeof ea) ? "no" : "yes");
    cudaFreeAsync(b, 0);
    cudaStreamSynchronize(0);
  }
  /* VMM remap: a new chunk at the same address. */
  unsigned long long v0 = 0, v1 = 0, b0 = 0, b1 = 0;
  cuPointerGetAttribute(&v0, CU_POINTER_ATTRIBUTE_BUFFER_ID, vmm1);
  cuPointerGetAttribute(&b0, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, vmm1);
  cuMemUnmap(vmm1, gran);
  CUmemGenericAllocationHandle fresh;
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  cuMemCreate(&fresh, gran, &prop, 0);
  cuMemMap(vmm1, gran, 0, fresh, 0);
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  cuMemSetAccess(vmm1, gran, &acc, 1);
  cuPointerGetAttribute(&v1, CU_POINTER_ATTRIBUTE_BUFFER_ID, vmm1);
  cuPointerGetAttribute(&b1, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID, vmm1);
  printf("memory_kinds,vmm_remap,old_id=%llu new_id=%llu old_block=%llu new_block=%llu\n", v0, v1, b0, b1);
  /* Managed memory through the copy engine on a non-blocking stream. */
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  fill(managed, BYTES, 9);
  e = cudaMemcpyAsync(pinned, managed, BYTES, cudaMemcpyDefault, s);
  cudaStreamSynchronize(s);
  printf("memory_kinds,managed_to_pinned_async,%s %s\n", cudaGetErrorName(e), check(pinned, BYTES, 9) ? "ok" : "WRONG");
  /* Offer the child the pool, the 3-chunk range and the legacy buffer. */
  fill(legacy, BYTES, 1);
  fill(async_fd, BYTES, 2);
  fill((void *)vmm3, gran * 3 < BYTES ? gran * 3 : BYTES, 3);
  struct offer o = {};
  o.pid = getpid();
  cuIpcGetMemHandle(&o.legacy, (CUdeviceptr)legacy);
  cuMemPoolExportPointer(&o.pool_ptr, (CUdeviceptr)async_fd);
  o.gran = gran;
  o.vmm_chunks = 3;
  int fds[4];
  cuMemPoolExportToShareableHandle(&fds[0], (CUmemoryPool)pool_fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  for (int c = 0; c < 3; c++) cuMemExportToShareableHandle(&fds[1 + c], h3[c], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  send_fds(sv[0], &o, sizeof o, fds, 4);
  for (int i = 0; i < 4; i++) close(fds[i]);
  char done[256] = "";
  void *reuse = NULL;
  for (;;) {
    recv(sv[0], done, sizeof done, 0);
    if (!strcmp(done, "next") || !strcmp(done, "end")) {
      /* Section 4: free the previous allocation as an application does (the importer may
         still hold it), then make and export the next one. */
      struct reuse_ask q;
      memcpy(&q, done, sizeof q);
      if (reuse) cudaFreeAsync(reuse, 0);
      cudaStreamSynchronize(0);
      reuse = NULL;
      if (!strcmp(done, "end")) continue;
      struct reuse_answer a = {};
      a.ok = cudaMallocFromPoolAsync(&reuse, q.n, pool_fd, 0) == cudaSuccess &&
             cudaStreamSynchronize(0) == cudaSuccess;
      if (a.ok) {
        fill(reuse, q.n, q.seed);
        a.addr = (unsigned long long)reuse;
        a.ok = cuMemPoolExportPointer(&a.d, (CUdeviceptr)reuse) == CUDA_SUCCESS;
      }
      send(sv[0], &a, sizeof a, 0);
      continue;
    }
    if (strcmp(done, "free")) break;
    cudaFreeAsync(async_fd, 0);
    cudaStreamSynchronize(0);
    e = cudaMemPoolTrimTo(pool_fd, 0);
    printf("memory_kinds,exporter_free_and_trim,%s\n", cudaGetErrorName(e));
    send(sv[0], "freed", 6, 0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  printf("memory_kinds,child,%s exit=%d\n", done, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  /* Classification cost: the five attributes gpulmt asks today against thirteen. */
  CUpointer_attribute a[13] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,       CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,  CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_BUFFER_ID,         CU_POINTER_ATTRIBUTE_IS_MANAGED,
      CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,    CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, CU_POINTER_ATTRIBUTE_MAPPED,
      CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
      CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID,
  };
  unsigned long long sink[13][2];
  void *d[13];
  for (int i = 0; i < 13; i++) d[i] = sink[i];
  for (int n = 5; n <= 13; n += 8) {
    double t = now_us();
    for (int i = 0; i < 10000; i++) cuPointerGetAttributes(n, a, d, (CUdeviceptr)async_fd);
    printf("memory_kinds,query_ns_%d_attrs,%.0f\n", n, (now_us() - t) * 1e3 / 10000);
  }
  return 0;
}
