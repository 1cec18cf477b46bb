/*
 * MPI constants that bindgen cannot carry over from mpi.h the same way for every MPI
 * library, compiled against the MPI library the shim is built for (build.rs): macros
 * that cast to a pointer (Open MPI's MPI_IN_PLACE is (void *)1, MPICH's (void *)-1),
 * and enumerators that MPICH declares in named enums (bindgen then prefixes their
 * names with the enum's) where Open MPI has plain ones.
 */
#include <mpi.h>

void *const gpulmt_mpi_in_place = MPI_IN_PLACE;
const int gpulmt_mpi_combiner_named = MPI_COMBINER_NAMED;
const int gpulmt_mpi_win_base = MPI_WIN_BASE;
const int gpulmt_mpi_win_model = MPI_WIN_MODEL;
const int gpulmt_mpi_win_separate = MPI_WIN_SEPARATE;
