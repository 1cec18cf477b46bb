// The floor of the internode path's design for a small D D message, without gpulmt: an 8 B
// ping-pong between two ranks' device buffers over a non-CUDA-aware MPI, where
// - staged: the host-staged anchor's way (../shared/device/staged_mpi.cu): cudaMemcpy to a
//   pinned buffer, blocking MPI_Send / MPI_Recv, cudaMemcpy back;
// - proxy: the issue's way, as lean as it can be written: the posting thread copies the
//   payload out (cudaMemcpyAsync on a stream of its own, an event, polled), hands the
//   message to a proxy thread through one cache line, and the proxy sends it (MPI_Isend,
//   MPI_Testsome over POOL pre-posted ANY_SOURCE receives, as gpulmt's proxy receives
//   control messages); an arrival is handed back through one cache line, and the waiting
//   thread copies it in (cudaMemcpyAsync, event, polled). No queue, no engine, no matching.
// What `proxy` costs above `staged` is what any design that routes host-posted messages
// through a proxy thread pays at least, against which gpulmt's own D D latency is read.
// Usage: mpirun -np 2 --bind-to none proxy_floor_dd {staged|proxy} [iters] [pool]
// Prints on rank 0: mode,pool,iters,half_round_trip_us
#include <cuda_runtime.h>
#include <mpi.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
  MPI_Abort(MPI_COMM_WORLD, 3); } } while (0)

constexpr int TAG = 7, MSG = 8;
static int rank_, peer, iters, pool, warm;
static char* dev;                // the device buffer both ways
static char *out_host, *in_host;  // pinned: the payload out, the arrival in

// One word per line: the app bumps `out_seq` after the payload is in out_host; the proxy
// bumps `in_seq` after an arrival's bytes are in in_host.
alignas(64) static std::atomic<uint64_t> out_seq{0};
alignas(64) static std::atomic<uint64_t> in_seq{0};
alignas(64) static std::atomic<bool> stop{false};

static void copy_and_poll(void* dst, const void* src, cudaMemcpyKind kind, cudaStream_t s, cudaEvent_t e) {
  CK(cudaMemcpyAsync(dst, src, MSG, kind, s));
  CK(cudaEventRecord(e, s));
  cudaError_t r;
  while ((r = cudaEventQuery(e)) == cudaErrorNotReady) {}
  CK(r);
}

static void proxy_main() {
  std::vector<MPI_Request> reqs(pool + 1, MPI_REQUEST_NULL);  // reqs[pool]: the send
  std::vector<std::vector<char>> bufs(pool, std::vector<char>(64));
  auto post = [&](int i) { MPI_Irecv(bufs[i].data(), 64, MPI_BYTE, MPI_ANY_SOURCE, TAG, MPI_COMM_WORLD, &reqs[i]); };
  for (int i = 0; i < pool; i++) post(i);
  std::vector<int> idx(pool + 1);
  uint64_t taken = 0, arrived = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    // Acquire: the payload the app copied out before its release is visible.
    if (out_seq.load(std::memory_order_acquire) > taken && reqs[pool] == MPI_REQUEST_NULL) {
      MPI_Isend(out_host, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, &reqs[pool]);
      taken++;
    }
    int n = 0;
    MPI_Testsome(pool + 1, reqs.data(), &n, idx.data(), MPI_STATUSES_IGNORE);
    for (int k = 0; k < n && n != MPI_UNDEFINED; k++) {
      if (idx[k] == pool) continue;
      memcpy(in_host, bufs[idx[k]].data(), MSG);
      post(idx[k]);
      // Release: the arrival's bytes before the count.
      in_seq.store(++arrived, std::memory_order_release);
    }
  }
  for (int i = 0; i < pool; i++) { MPI_Cancel(&reqs[i]); MPI_Wait(&reqs[i], MPI_STATUS_IGNORE); }
  if (reqs[pool] != MPI_REQUEST_NULL) MPI_Wait(&reqs[pool], MPI_STATUS_IGNORE);
}

static double run_proxy() {
  cudaStream_t s; cudaEvent_t e;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  MPI_Barrier(MPI_COMM_WORLD);
  std::thread p(proxy_main);
  double t0 = 0;
  uint64_t seen = 0, sent = 0;
  auto send = [&] {
    copy_and_poll(out_host, dev, cudaMemcpyDeviceToHost, s, e);
    out_seq.store(++sent, std::memory_order_release);
  };
  auto recv = [&] {
    while (in_seq.load(std::memory_order_acquire) == seen) {}
    seen++;
    copy_and_poll(dev, in_host, cudaMemcpyHostToDevice, s, e);
  };
  for (int i = -warm; i < iters; i++) {
    if (i == 0) t0 = MPI_Wtime();
    if (rank_ == 0) { send(); recv(); } else { recv(); send(); }
  }
  double t = MPI_Wtime() - t0;
  // The last message is through both proxies before either stops (the peer's reply came).
  MPI_Barrier(MPI_COMM_WORLD);  // made while the proxies still run: MPI_THREAD_MULTIPLE
  stop.store(true);
  p.join();
  return t;
}

static double run_staged() {
  MPI_Barrier(MPI_COMM_WORLD);
  double t0 = 0;
  for (int i = -warm; i < iters; i++) {
    if (i == 0) t0 = MPI_Wtime();
    if (rank_ == 0) {
      CK(cudaMemcpy(out_host, dev, MSG, cudaMemcpyDeviceToHost));
      MPI_Send(out_host, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD);
      MPI_Recv(in_host, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      CK(cudaMemcpy(dev, in_host, MSG, cudaMemcpyHostToDevice));
    } else {
      MPI_Recv(in_host, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      CK(cudaMemcpy(dev, in_host, MSG, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(out_host, dev, MSG, cudaMemcpyDeviceToHost));
      MPI_Send(out_host, MSG, MPI_BYTE, peer, TAG, MPI_COMM_WORLD);
    }
  }
  return MPI_Wtime() - t0;
}

int main(int argc, char** argv) {
  int got;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &got);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  peer = 1 - rank_;
  std::string mode = argc > 1 ? argv[1] : "";
  iters = argc > 2 ? atoi(argv[2]) : 20000;
  pool = argc > 3 ? atoi(argv[3]) : 34;
  warm = iters / 10;
  if (mode != "staged" && mode != "proxy") {
    if (!rank_) fprintf(stderr, "usage: proxy_floor_dd {staged|proxy} [iters] [pool]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  CK(cudaMalloc(&dev, 64));
  CK(cudaMemset(dev, 0, 64));
  CK(cudaHostAlloc((void**)&out_host, 64, 0));
  CK(cudaHostAlloc((void**)&in_host, 64, 0));
  double t = mode == "staged" ? run_staged() : run_proxy();
  if (rank_ == 0) printf("%s,%d,%d,%.3f\n", mode.c_str(), pool, iters, t / iters / 2 * 1e6);
  MPI_Finalize();
  return 0;
}
