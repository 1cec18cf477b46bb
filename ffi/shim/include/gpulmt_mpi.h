/*
 * gpulmt_mpi.h: the extra C functions of libgpulmt_mpi.so, the PMPI shim that makes
 * an unmodified MPI program GPU-aware between the ranks of a node. The MPI functions
 * themselves keep their mpi.h declarations; these are for programs (and tests) that
 * want device memory of the shim's own gpulmt context, which runs on sim devices
 * (GPULMT_DEVICE=sim) as well as on CUDA. Memory from cudaMalloc works too.
 *
 * All functions may be called between MPI_Init and MPI_Finalize.
 *
 * A program that is run with the shim preloaded (LD_PRELOAD) and not linked against
 * it defines GPULMT_MPI_WEAK before including this header: the functions are then
 * weak symbols that resolve to the preloaded shim's, and are NULL without it
 * (test `gpulmt_mpi_active != NULL` before calling any).
 */
#ifndef GPULMT_MPI_H
#define GPULMT_MPI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What the shim did so far on this rank. */
typedef struct gpulmt_mpi_counters {
  uint64_t lmt_sends;    /* device sends moved by gpulmt (envelope + LMT) */
  uint64_t lmt_recvs;    /* receives whose payload gpulmt moved */
  uint64_t staged_sends; /* device sends staged through host memory (other node, or below GPULMT_MPI_LMT_MIN) */
  uint64_t staged_recvs; /* receives into device buffers of data the MPI library moved */
  uint64_t host_recvs;   /* receives into host buffers of data the MPI library moved */
} gpulmt_mpi_counters;

/* What staging did so far on this rank: device buffers of collectives the MPI library
 * runs on host copies (GPULMT_MPI_STAGING_MAX bounds the memory). */
typedef struct gpulmt_mpi_staging_counters {
  uint64_t staged_calls;   /* MPI calls that staged device buffers (a split call counts once) */
  uint64_t staged_buffers; /* device buffers they staged (a send and a receive buffer are two) */
  uint64_t staged_bytes;   /* bytes copied between device and host memory for them, both ways */
  uint64_t split_calls;    /* reductions split into pieces (host buffers too: every rank splits alike) */
  uint64_t pieces;         /* pieces those calls made */
} gpulmt_mpi_staging_counters;

/* 1 while the shim is active (MPI initialized, gpulmt joined on this node), else 0. */
int gpulmt_mpi_active(void);

/* Device memory on this rank's device (NULL on failure or when not active). */
void *gpulmt_mpi_alloc(size_t bytes);

/* Frees memory from gpulmt_mpi_alloc: 0 on success, -1 otherwise. */
int gpulmt_mpi_free(void *ptr);

/* Copies bytes between any two buffers, host or device, and waits: 0 on success. */
int gpulmt_mpi_memcpy(void *dst, const void *src, size_t bytes);

/* Copies the counters to *out: 0 on success, -1 when the shim is not active. */
int gpulmt_mpi_get_counters(gpulmt_mpi_counters *out);

/* Copies the staging counters to *out: 0 on success, -1 for a NULL out. */
int gpulmt_mpi_get_staging_counters(gpulmt_mpi_staging_counters *out);

/* How many blocking collectives took the device path so far (MPI_Bcast, MPI_Allgather,
 * MPI_Allreduce and MPI_Reduce_scatter_block of at least GPULMT_MPI_COLL_DEVICE_MIN bytes on device buffers of
 * every rank, moved over gpulmt with the reduction on the GPU). */
uint64_t gpulmt_mpi_device_collectives(void);

#if defined(GPULMT_MPI_WEAK) && (defined(__GNUC__) || defined(__clang__))
#pragma weak gpulmt_mpi_active
#pragma weak gpulmt_mpi_alloc
#pragma weak gpulmt_mpi_free
#pragma weak gpulmt_mpi_memcpy
#pragma weak gpulmt_mpi_get_counters
#pragma weak gpulmt_mpi_get_staging_counters
#pragma weak gpulmt_mpi_device_collectives
#endif

#ifdef __cplusplus
}
#endif

#endif /* GPULMT_MPI_H */
