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

/* The predefined datatypes the device reduction works on (src/device_reduce.rs), each
 * with its kind: (class << 8) | bytes, class 0 signed integer, 1 unsigned, 2 floating. */
const MPI_Datatype gpulmt_mpi_reduce_types[] = {
    MPI_INT,      MPI_UNSIGNED, MPI_LONG,     MPI_UNSIGNED_LONG, MPI_LONG_LONG, MPI_UNSIGNED_LONG_LONG,
    MPI_INT32_T,  MPI_UINT32_T, MPI_INT64_T,  MPI_UINT64_T,      MPI_FLOAT,     MPI_DOUBLE,
};
const int gpulmt_mpi_reduce_kinds[] = {
    (0 << 8) | (int)sizeof(int),  (1 << 8) | (int)sizeof(unsigned), (0 << 8) | (int)sizeof(long),
    (1 << 8) | (int)sizeof(unsigned long), (0 << 8) | (int)sizeof(long long), (1 << 8) | (int)sizeof(unsigned long long),
    (0 << 8) | 4, (1 << 8) | 4, (0 << 8) | 8, (1 << 8) | 8, (2 << 8) | (int)sizeof(float), (2 << 8) | (int)sizeof(double),
};
const int gpulmt_mpi_reduce_type_count = sizeof gpulmt_mpi_reduce_kinds / sizeof gpulmt_mpi_reduce_kinds[0];
