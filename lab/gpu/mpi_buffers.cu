// How Open MPI's bandwidth between two ranks of one host depends on how many distinct host
// buffers a window of messages cycles through (cache-hot versus cold), and on pinned versus
// pageable memory: the question behind the internode path's D D bandwidth, whose proxies
// stage every piece through a pool of pinned bounce buffers where osu_bw's H H reuses one
// buffer for the whole window.
// Usage: mpirun -np 2 mpi_buffers SIZE WINDOW BUFFERS {pinned|pageable}
// CSV on rank 0: size,window,buffers,memory,GBps (best of 5 rounds of 10 windows each).
#include <cuda_runtime.h>
#include <mpi.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 5) { if (!rank) fprintf(stderr, "usage: mpi_buffers SIZE WINDOW BUFFERS pinned|pageable\n"); MPI_Abort(MPI_COMM_WORLD, 2); }
  size_t sz = strtoull(argv[1], nullptr, 10);
  int win = atoi(argv[2]), nbuf = atoi(argv[3]);
  bool pinned = std::string(argv[4]) == "pinned";
  std::vector<char*> bufs(nbuf);
  for (auto& b : bufs) {
    if (pinned) { if (cudaHostAlloc((void**)&b, sz, 0) != cudaSuccess) MPI_Abort(MPI_COMM_WORLD, 3); }
    else b = (char*)malloc(sz);
    memset(b, rank + 1, sz);
  }
  std::vector<MPI_Request> reqs(win);
  double best = 0;
  for (int round = 0; round < 6; round++) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    int next = 0;
    for (int it = 0; it < 10; it++) {
      for (int w = 0; w < win; w++, next = (next + 1) % nbuf) {
        if (rank == 0) MPI_Isend(bufs[next], (int)sz, MPI_BYTE, 1, 2, MPI_COMM_WORLD, &reqs[w]);
        else MPI_Irecv(bufs[next], (int)sz, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &reqs[w]);
      }
      MPI_Waitall(win, reqs.data(), MPI_STATUSES_IGNORE);
      if (rank == 0) MPI_Recv(nullptr, 0, MPI_BYTE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      else MPI_Send(nullptr, 0, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
    }
    double gbps = double(sz) * win * 10 / (MPI_Wtime() - t0) / 1e9;
    if (round > 0 && gbps > best) best = gbps;  // round 0 warms up
  }
  if (rank == 0) printf("%zu,%d,%d,%s,%.2f\n", sz, win, nbuf, pinned ? "pinned" : "pageable", best);
  MPI_Finalize();
  return 0;
}
