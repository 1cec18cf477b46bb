/*
 * check.h: how the shim's C test programs report. Each program defines
 * `static int rank, failures, checks;` before including it; FAIL prints a line with the
 * rank, file and line to stderr and counts a failure, CHECK counts a check and fails it
 * when its condition is false, MPI_OK fails a call that does not return MPI_SUCCESS,
 * with the library's error string. A program that defines CHECK_CONTEXT (a string
 * expression) gets it at the start of each FAIL line: the case it was running.
 */
#ifndef GPULMT_SHIM_TEST_CHECK_H
#define GPULMT_SHIM_TEST_CHECK_H

#include <mpi.h>
#include <stdio.h>

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

#endif /* GPULMT_SHIM_TEST_CHECK_H */
