/*
 * check.h: how the shim's C test programs report. Each program defines
 * `static int rank, failures, checks;` before including it; FAIL prints a line with the
 * rank, file and line to stderr and counts a failure, CHECK counts a check and fails it
 * when its condition is false, MPI_OK fails a call that does not return MPI_SUCCESS,
 * with the library's error string. A program that defines CHECK_CONTEXT (a string
 * expression) gets it at the start of each FAIL line: the case it was running.
 * shim_error(rc, class, a, b) checks an error the shim raised itself.
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

#endif /* GPULMT_SHIM_TEST_CHECK_H */
