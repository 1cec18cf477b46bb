/* What one read of CLOCK_MONOTONIC costs on this host (the proxy reads it several times a
 * round, and Rust's Instant::now is this call), and which clock source the kernel uses.
 * Usage: cc -O2 clock_cost.c -o clock_cost && ./clock_cost   -> "clock_ns_per_read,<ns>" */
#include <stdio.h>
#include <time.h>
int main(void) {
  struct timespec a, b, t;
  const int n = 1000000;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < n; i++) clock_gettime(CLOCK_MONOTONIC, &t);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
  printf("clock_ns_per_read,%.1f\n", ns);
  return 0;
}
