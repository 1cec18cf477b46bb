/*
 * check.h: how the shim's C test programs start, report and end. Each program includes
 * gpulmt_mpi.h and defines `static int rank, size, failures, checks;` before including
 * it; FAIL prints a line with the
 * rank, file and line to stderr and counts a failure, CHECK counts a check and fails it
 * when its condition is false, MPI_OK fails a call that does not return MPI_SUCCESS,
 * with the library's error string. A program that defines CHECK_CONTEXT (a string
 * expression) gets it at the start of each FAIL line: the case it was running.
 * shim_error(rc, class, a, b) checks an error the shim raised itself.
 *
 * shim_test_begin (after MPI_Init), shim_test_part_done (after each part of a program
 * of parts) and shim_test_end (the last call of main) are what every program does
 * around its checks.
 */
#ifndef GPULMT_SHIM_TEST_CHECK_H
#define GPULMT_SHIM_TEST_CHECK_H

#include <mpi.h>
#include <stdio.h>
#include <string.h>

#ifndef CHECK_CONTEXT
#define CHECK_CONTEXT ""
#endif

#define FAIL(...)                                                                         \
  do {                                                                                    \
    failures++;                                                                           \
    fprintf(stderr, "rank %d FAIL %s:%d: %s%s", rank, __FILE__, __LINE__, CHECK_CONTEXT, \
            CHECK_CONTEXT[0] ? ": " : "");                                                \
    fprintf(stderr, __VA_ARGS__);                                                         \
    fputc('\n', stderr);                                                                  \
  } while (0)
#define CHECK(c, ...)            \
  do {                           \
    checks++;                    \
    if (!(c)) FAIL(__VA_ARGS__); \
  } while (0)
#define MPI_OK(call)                    \
  do {                                  \
    int rc_ = (call);                   \
    if (rc_ != MPI_SUCCESS) {           \
      char s_[MPI_MAX_ERROR_STRING];    \
      int l_ = 0;                       \
      MPI_Error_string(rc_, s_, &l_);   \
      FAIL("%s -> %s", #call, s_);      \
    }                                   \
  } while (0)

/* Whether the error `rc` is of class `cls` and its string names `a` and `b` (either
 * NULL: not looked for); the string goes to `s` (MPI_MAX_ERROR_STRING bytes). The
 * shim's own errors carry their message in the string of a code it adds to the class;
 * MPICH 4.0 keeps no such string, so there the shim returns the class itself and prints
 * the message on stderr (which tests/mpi.rs looks for), and only the class is checked. */
static inline int shim_error(int rc, int cls, const char *a, const char *b, char *s) {
  int got = -1, len = 0;
  s[0] = 0;
  MPI_Error_class(rc, &got);
  MPI_Error_string(rc, s, &len);
  if (got != cls) return 0;
#ifdef MPICH_NUMVERSION
  (void)a;
  (void)b;
  return 1;
#else
  return (!a || strstr(s, a)) && (!b || strstr(s, b));
#endif
}

/* After MPI_Init: sets rank and size, makes MPI_COMM_WORLD return errors, and checks
 * that the shim is active (and `have`: a function of the shim the program needs
 * resolved) and that there are `min` to `max` ranks (max 0: no upper bound). 1: go on;
 * 0: the shim is not active, MPI is finalized, and main returns 3 (every rank finds the
 * same: a clean exit, whose message every launcher passes on, where Hydra may drop what
 * ranks print before an MPI_Abort). Too few or too many ranks abort. */
static inline int shim_test_begin(int min, int max, int have) {
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (!gpulmt_mpi_active || !gpulmt_mpi_active() || !have) {
    fprintf(stderr, "rank %d: the gpulmt shim is not active%s (preload libgpulmt_mpi.so)\n", rank,
            have ? "" : ", or lacks a function this program needs");
    MPI_Finalize();
    return 0;
  }
  if (size < min || (max > 0 && size > max)) {
    if (max > 0)
      fprintf(stderr, "run with %d to %d ranks\n", min, max);
    else
      fprintf(stderr, "run with at least %d ranks\n", min);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  return 1;
}

/* After part `name` of a program of parts, which began with `before` failures: a
 * barrier, "part NAME done" from rank 0, and the part's failures on stderr. */
static inline void shim_test_part_done(const char *name, int before) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) printf("part %s done\n", name);
  if (failures != before) fprintf(stderr, "rank %d: %s had %d failures\n", rank, name, failures - before);
}

/* The end of main: "rank R ok checks=C" when nothing failed, MPI finalized; main's
 * exit code (1 after a failure). */
static inline int shim_test_end(void) {
  if (failures == 0) printf("rank %d ok checks=%d\n", rank, checks);
  fflush(stdout);
  MPI_Finalize();
  return failures ? 1 : 0;
}

#endif /* GPULMT_SHIM_TEST_CHECK_H */
