/* What a 1 us sleep costs a thread with Linux's default timer slack (50 us) and with a
 * slack of 1 us, as the internode proxy's idle back-off sleeps (transport/src/net/proxy,
 * tight_timer_slack). Build: cc -O2 lab/gpu/sleep_cost.c -o sleep_cost */
#include <stdio.h>
#include <sys/prctl.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void run(const char *what) {
    const int n = 2000;
    struct timespec req = {0, 1000};
    double best = 1e9, sum = 0;
    for (int i = 0; i < n; i++) {
        double a = now_us();
        nanosleep(&req, 0);
        double d = now_us() - a;
        sum += d;
        if (d < best) best = d;
    }
    printf("%s: a 1 us sleep took %.1f us on average, %.1f at least (%d sleeps)\n", what, sum / n, best, n);
}

int main(void) {
    run("default timer slack");
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    run("timer slack 1 us");
    return 0;
}
