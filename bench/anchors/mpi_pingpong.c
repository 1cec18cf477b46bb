/* Host-memory ping-pong over the system MPI (Open MPI's shared-memory path inside a
 * node): the anchor for gpulmt's H-H eager latency. Prints CSV rows
 * `mpi_sm,half_rtt_us,<bytes>,<value>`. Build: mpicc -O2 mpi_pingpong.c -o mpi_pingpong
 * MPI_PINGPONG_COMMS=1 first creates a communicator, as many as the PMPI shim holds (it
 * keeps a duplicate of its shared-memory split of MPI_COMM_WORLD); =2 creates two, as the
 * shim did before session 5 (the split and the duplicate): in Open MPI 4.1 every live
 * communicator beyond the built-in ones keeps libnbc's progress function in the
 * polling loop, a cost of having communicators, not of the shim's own code.
 * With one rank it sends to itself and receives: no peer to wait for, so the instructions
 * of a run (under callgrind: bench/shim_hostlat.sh) are the same every time. */
#define GPULMT_MPI_WEAK
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../ffi/shim/include/gpulmt_mpi.h"

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    int peer = size > 1 ? 1 - rank : rank;
    const char *comms = getenv("MPI_PINGPONG_COMMS");
    MPI_Comm made[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
    if (comms && atoi(comms) > 0) MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &made[0]);
    if (comms && atoi(comms) > 1) MPI_Comm_dup(made[0], &made[1]);
    size_t max = argc > 1 ? strtoull(argv[1], NULL, 10) : 8192;
    int iters = argc > 2 ? atoi(argv[2]) : 20000;
    /* MPI_PINGPONG_DEVICE=1 under the shim: the buffer is device memory of the shim's
     * gpulmt context (a sim device without a GPU), so the ping-pong is D D through it. */
    const char *device = getenv("MPI_PINGPONG_DEVICE");
    int on_device = device && atoi(device) > 0 && gpulmt_mpi_alloc && gpulmt_mpi_active && gpulmt_mpi_active();
    char *buf = on_device ? gpulmt_mpi_alloc(max ? max : 1) : malloc(max ? max : 1);
    if (!buf) {
        fprintf(stderr, "mpi_pingpong: no buffer\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) printf("anchor,metric,bytes,value\n");
    for (size_t n = 1; n <= max; n *= 8) {
        int warm = iters / 10;
        double t0 = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < iters + warm; i++) {
            if (i == warm) t0 = MPI_Wtime();
            if (on_device && peer == rank) {
                /* To itself: a device send completes only once the receive moved the
                 * data, so the receive is posted first. */
                MPI_Request r;
                MPI_Irecv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &r);
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Wait(&r, MPI_STATUS_IGNORE);
            } else if (rank == 0) {
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
                MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else if (rank == 1) {
                MPI_Recv(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
            }
        }
        double us = (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
        if (rank == 0) printf("mpi_sm,half_rtt_us,%zu,%.3f\n", n, us);
    }
    if (on_device) gpulmt_mpi_free(buf); else free(buf);
    MPI_Finalize();
    return 0;
}
