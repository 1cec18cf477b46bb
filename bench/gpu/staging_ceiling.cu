// The ceiling of a staging pipeline over a non-CUDA-aware MPI: the best D D bandwidth that
// copying device data through pinned host buffers around MPI reaches on this host, written by
// hand without gpulmt, beside which the internode path's D D bandwidth is read (its target is
// 0.9 of Open MPI's own H H on the same transport; bench/gpu/run.sh internode). Two ranks;
// each of THREADS threads drives MPI on its own duplicate of MPI_COMM_WORLD
// (MPI_THREAD_MULTIPLE) and moves WINDOW/THREADS of each window's messages.
// - hh: osu_bw's way: each thread sends from (receives into) one host buffer of SIZE bytes.
// - dd: device buffers of SIZE bytes staged through NBUF pinned bounce buffers of CHUNK bytes
//   per thread: a sending piece is copied device-to-host on the thread's stream, then sent; a
//   receiving piece is received, then copied host-to-device; pieces go to MPI in order, and a
//   freed buffer is the next one used (LIFO: the warmest in the CPU's caches).
// The sweep in lab/gpu/staging_ceiling.sh asks two more things: whether fewer buffers help
// (gpulmt's bounce pool holds up to ~92 under osu_bw's window of 64), and whether vader's
// copies, which run inside MPI's progress on the calling thread, go faster when two threads
// drive MPI at once.
// Usage: mpirun -np 2 staging_ceiling {hh|dd} SIZE WINDOW CHUNK NBUF THREADS
// CSV on rank 0: mode,size,window,chunk,nbuf,threads,GBps (best of 5 timed rounds of 10
// windows; round 0 warms up). Rank 1 checks the bytes of its last dd window and aborts on a
// mismatch.
#include <cuda_runtime.h>
#include <mpi.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
  fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
  MPI_Abort(MPI_COMM_WORLD, 3); } } while (0)

struct Setup { bool dd; size_t size, chunk; int window, nbuf, threads, rank; };

// One thread's share of the job: its communicator, stream, buffers.
struct Lane {
  MPI_Comm comm;
  cudaStream_t stream;
  char* host = nullptr;          // hh: the one host buffer
  char* dev = nullptr;           // dd: the device buffer
  std::vector<char*> bounce;     // dd: pinned bounce buffers
  std::vector<cudaEvent_t> ev;   // dd: a copy's end, per bounce buffer
};

static void hh_window(const Setup& s, Lane& l, int msgs) {
  std::vector<MPI_Request> r(msgs);
  for (int m = 0; m < msgs; m++) {
    if (s.rank == 0) MPI_Isend(l.host, (int)s.size, MPI_BYTE, 1, 2, l.comm, &r[m]);
    else MPI_Irecv(l.host, (int)s.size, MPI_BYTE, 0, 2, l.comm, &r[m]);
  }
  MPI_Waitall(msgs, r.data(), MPI_STATUSES_IGNORE);
}

// The staging pipeline of one window: `msgs` messages of `size` bytes cut into pieces.
static void dd_window(const Setup& s, Lane& l, int msgs) {
  const size_t per_msg = (s.size + s.chunk - 1) / s.chunk;
  const size_t pieces = per_msg * msgs;
  std::vector<size_t> piece_of(s.nbuf);
  std::vector<MPI_Request> req(s.nbuf, MPI_REQUEST_NULL);
  std::vector<int> free_stack(s.nbuf), copying;  // copying: buffer indices in issue order
  for (int i = 0; i < s.nbuf; i++) free_stack[i] = s.nbuf - 1 - i;
  std::vector<int> idx(s.nbuf);
  size_t next = 0, done = 0;
  auto span = [&](size_t p, size_t* off) {
    size_t c = p % per_msg;
    *off = c * s.chunk;
    return std::min(s.chunk, s.size - *off);
  };
  while (done < pieces) {
    if (s.rank == 0) {
      // Start copies out while buffers are free.
      while (next < pieces && !free_stack.empty()) {
        int b = free_stack.back(); free_stack.pop_back();
        size_t off, len = span(next, &off);
        CK(cudaMemcpyAsync(l.bounce[b], l.dev + off, len, cudaMemcpyDeviceToHost, l.stream));
        CK(cudaEventRecord(l.ev[b], l.stream));
        piece_of[b] = next++; copying.push_back(b);
      }
      // Copies end in issue order (one stream): send the finished ones in that order.
      while (!copying.empty() && cudaEventQuery(l.ev[copying.front()]) == cudaSuccess) {
        int b = copying.front(); copying.erase(copying.begin());
        size_t off, len = span(piece_of[b], &off);
        MPI_Isend(l.bounce[b], (int)len, MPI_BYTE, 1, 2, l.comm, &req[b]);
      }
      int n = 0;
      MPI_Testsome(s.nbuf, req.data(), &n, idx.data(), MPI_STATUSES_IGNORE);
      for (int k = 0; k < n && n != MPI_UNDEFINED; k++) {
        free_stack.push_back(idx[k]); done++;
      }
    } else {
      // Post receives in piece order while buffers are free: MPI matches them in that order.
      while (next < pieces && !free_stack.empty()) {
        int b = free_stack.back(); free_stack.pop_back();
        size_t off, len = span(next, &off);
        MPI_Irecv(l.bounce[b], (int)len, MPI_BYTE, 0, 2, l.comm, &req[b]);
        piece_of[b] = next++;
      }
      int n = 0;
      MPI_Testsome(s.nbuf, req.data(), &n, idx.data(), MPI_STATUSES_IGNORE);
      for (int k = 0; k < n && n != MPI_UNDEFINED; k++) {
        int b = idx[k];
        size_t off, len = span(piece_of[b], &off);
        CK(cudaMemcpyAsync(l.dev + off, l.bounce[b], len, cudaMemcpyHostToDevice, l.stream));
        CK(cudaEventRecord(l.ev[b], l.stream));
        copying.push_back(b);
      }
      while (!copying.empty() && cudaEventQuery(l.ev[copying.front()]) == cudaSuccess) {
        int b = copying.front(); copying.erase(copying.begin());
        free_stack.push_back(b); done++;
      }
    }
  }
}

// Each round's rate (GB/s) of this lane; round 0 warms up.
static std::vector<double> run_lane(const Setup& s, Lane& l, int msgs) {
  std::vector<double> rates;
  for (int round = 0; round < 6; round++) {
    MPI_Barrier(l.comm);
    double t0 = MPI_Wtime();
    for (int it = 0; it < 10; it++) {
      if (s.dd) dd_window(s, l, msgs); else hh_window(s, l, msgs);
      // osu_bw's window end: the receiver says it has everything.
      if (s.rank == 0) MPI_Recv(nullptr, 0, MPI_BYTE, 1, 3, l.comm, MPI_STATUS_IGNORE);
      else MPI_Send(nullptr, 0, MPI_BYTE, 0, 3, l.comm);
    }
    rates.push_back(double(s.size) * msgs * 10 / (MPI_Wtime() - t0) / 1e9);
  }
  return rates;
}

int main(int argc, char** argv) {
  int prov;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &prov);
  Setup s;
  MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
  // Rank r on GPU r mod the GPU count, as the host-staged anchor (one GPU: both on it).
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  CK(cudaSetDevice(s.rank % ndev));
  if (argc < 7) {
    if (!s.rank) fprintf(stderr, "usage: staging_ceiling {hh|dd} SIZE WINDOW CHUNK NBUF THREADS\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  s.dd = std::string(argv[1]) == "dd";
  s.size = strtoull(argv[2], nullptr, 10);
  s.window = atoi(argv[3]);
  s.chunk = strtoull(argv[4], nullptr, 10);
  s.nbuf = atoi(argv[5]);
  s.threads = atoi(argv[6]);
  if (s.threads > 1 && prov < MPI_THREAD_MULTIPLE) {
    if (!s.rank) fprintf(stderr, "MPI_THREAD_MULTIPLE not provided\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::vector<Lane> lanes(s.threads);
  for (auto& l : lanes) {
    MPI_Comm_dup(MPI_COMM_WORLD, &l.comm);
    CK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    if (s.dd) {
      CK(cudaMalloc(&l.dev, s.size));
      CK(cudaMemset(l.dev, s.rank == 0 ? 0x5a : 0, s.size));
      l.bounce.resize(s.nbuf); l.ev.resize(s.nbuf);
      for (int i = 0; i < s.nbuf; i++) {
        CK(cudaHostAlloc((void**)&l.bounce[i], s.chunk, 0));
        memset(l.bounce[i], 0, s.chunk);
        CK(cudaEventCreateWithFlags(&l.ev[i], cudaEventDisableTiming));
      }
    } else {
      l.host = (char*)malloc(s.size);
      memset(l.host, s.rank + 1, s.size);
    }
  }
  CK(cudaDeviceSynchronize());
  std::vector<std::vector<double>> rates(s.threads);
  std::vector<std::thread> th;
  const int msgs = s.window / s.threads;
  for (int t = 0; t < s.threads; t++)
    th.emplace_back([&, t] { rates[t] = run_lane(s, lanes[t], msgs); });
  for (auto& t : th) t.join();
  // The lanes' rounds run side by side (each starts at a barrier of its own communicator):
  // a round's rate is the sum of its lanes'; the best round after the warm-up is reported.
  double total = 0;
  for (int r = 1; r < 6; r++) {
    double sum = 0;
    for (auto& lr : rates) sum += lr[r];
    total = std::max(total, sum);
  }
  if (s.dd && s.rank == 1) {
    std::vector<char> h(s.size);
    for (auto& l : lanes) {
      CK(cudaMemcpy(h.data(), l.dev, s.size, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < s.size; i++)
        if (h[i] != 0x5a) { fprintf(stderr, "byte %zu is %d\n", i, h[i]); MPI_Abort(MPI_COMM_WORLD, 4); }
    }
  }
  if (s.rank == 0)
    printf("%s,%zu,%d,%zu,%d,%d,%.2f\n", s.dd ? "dd" : "hh", s.size, s.window, s.chunk, s.nbuf,
           s.threads, total);
  MPI_Finalize();
  return 0;
}
