/*
 * MPI constants that bindgen cannot carry over from mpi.h (macros that cast to a
 * pointer), compiled against the MPI library the shim is built for (build.rs):
 * Open MPI's MPI_IN_PLACE is (void *)1, MPICH's (void *)-1.
 */
#include <mpi.h>

void *const gpulmt_mpi_in_place = MPI_IN_PLACE;
