/*
 * ga.c -- global arrays from C: create a distributed 2-D array, put a section from
 * every rank, sync, get the whole array, accumulate from every rank into one section
 * (exact total, blocking and not), a non-blocking get, the distribution queries, a
 * registered buffer, short messages around a ring, refused bad input, destroy.
 *
 * usage: gpulmt-run -n N ga     (N >= 2)
 *
 * Output (the Rust test parses it):
 *   rank=R gac total=T owned=E refused=K
 *   rank=R ok ga
 * Failures print "FAIL ..." on stderr and the rank exits non-zero.
 */
#include <gpulmt.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 10
#define COLS 7
#define TIMES 20

static int g_rank = -1;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL ga rank=%d: ", g_rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

#define CHECK(call)                                                                     \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != GPULMT_SUCCESS)                                                      \
            fail("%s:%d: %s: %s (%d): %s", __FILE__, __LINE__, #call,                   \
                 gpulmt_strerror(rc_), rc_, gpulmt_last_error());                       \
    } while (0)

#define EXPECT(call, code)                                                              \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != (code))                                                              \
            fail("%s:%d: %s returned %d, expected %d (%s)", __FILE__, __LINE__, #call,  \
                 rc_, (code), gpulmt_last_error());                                     \
        refused++;                                                                      \
    } while (0)

int main(void) {
    gpulmt_ctx *ctx = NULL;
    int rank, size, i, j, k, refused = 0;
    CHECK(gpulmt_init(&ctx));
    CHECK(gpulmt_rank(ctx, &rank));
    CHECK(gpulmt_size(ctx, &size));
    g_rank = rank;

    /* A 10x7 array of doubles in 3x2 tiles dealt round-robin over the ranks. */
    gpulmt_ga ga = 0;
    CHECK(gpulmt_ga_create(ctx, GPULMT_GA_F64, ROWS, COLS, 3, 2, &ga));

    /* Rank r puts the rows r, r + size, ... (one call per row: sections of one row). */
    double row[COLS];
    for (i = rank; i < ROWS; i += size) {
        gpulmt_ga_section s = {{(size_t)i, 0}, {(size_t)i + 1, COLS}};
        for (j = 0; j < COLS; j++) row[j] = i * 100 + j;
        CHECK(gpulmt_ga_put(ctx, ga, &s, GPULMT_GA_F64, row, COLS, COLS));
    }
    CHECK(gpulmt_ga_sync(ctx, ga));

    /* Every rank reads the whole array back, into a registered buffer. */
    double *whole = NULL;
    CHECK(gpulmt_ga_register(ctx, sizeof(double) * ROWS * COLS, (void **)&whole));
    gpulmt_ga_section all = {{0, 0}, {ROWS, COLS}};
    CHECK(gpulmt_ga_get(ctx, ga, &all, GPULMT_GA_F64, whole, ROWS * COLS, COLS));
    for (i = 0; i < ROWS; i++)
        for (j = 0; j < COLS; j++)
            if (whole[i * COLS + j] != i * 100 + j) fail("(%d,%d) is %g", i, j, whole[i * COLS + j]);
    CHECK(gpulmt_ga_sync(ctx, ga));

    /* Every rank accumulates 2 * ones into rows 2..5, columns 1..4, TIMES times. */
    gpulmt_ga_section box = {{2, 1}, {5, 4}};
    double ones[9], two = 2.0;
    for (k = 0; k < 9; k++) ones[k] = 1.0;
    gpulmt_ga_handle acc_h = 0;
    for (k = 0; k < TIMES; k++) {
        if (k % 2) {
            CHECK(gpulmt_ga_acc_nb(ctx, ga, &box, GPULMT_GA_F64, ones, 9, 3, &two, &acc_h));
            CHECK(gpulmt_ga_wait(ctx, &acc_h));
        } else {
            CHECK(gpulmt_ga_acc(ctx, ga, &box, GPULMT_GA_F64, ones, 9, 3, &two));
        }
    }
    CHECK(gpulmt_ga_sync(ctx, ga));
    double got[9], total = 0;
    gpulmt_ga_handle h = 0;
    CHECK(gpulmt_ga_get_nb(ctx, ga, &box, GPULMT_GA_F64, got, 9, 3, &h));
    gpulmt_ga_handle copy = h;
    CHECK(gpulmt_ga_wait(ctx, &h));
    /* The wait cleared h (waiting on 0 returns at once); its copy names a handle waited on. */
    CHECK(gpulmt_ga_wait(ctx, &h));
    EXPECT(gpulmt_ga_wait(ctx, &copy), GPULMT_ERR_INVALID_ARGUMENT);
    for (k = 0; k < 9; k++) {
        double want = (2 + k / 3) * 100 + 1 + k % 3 + 2.0 * TIMES * size;
        if (got[k] != want) fail("accumulated element %d is %g, not %g", k, got[k], want);
        total += got[k] - ((2 + k / 3) * 100 + 1 + k % 3);
    }

    /* The distribution covers the array once; locate splits a section per owner. */
    size_t owned = 0, n = 0, r;
    gpulmt_ga_section parts[64];
    int owners[64];
    for (r = 0; r < (size_t)size; r++) {
        CHECK(gpulmt_ga_distribution(ctx, ga, (int)r, parts, 64, &n));
        for (k = 0; k < (int)n && k < 64; k++)
            owned += (parts[k].hi[0] - parts[k].lo[0]) * (parts[k].hi[1] - parts[k].lo[1]);
    }
    CHECK(gpulmt_ga_locate(ctx, ga, &box, owners, parts, 64, &n));
    if (n < 2) fail("rows 2..5 x columns 1..4 span %zu tiles, expected several", n);

    /* Bad input: refused with its code, the array unchanged. */
    gpulmt_ga_section out_of_bounds = {{0, 0}, {ROWS + 1, 1}};
    float f[9] = {0};
    EXPECT(gpulmt_ga_put(ctx, ga, &out_of_bounds, GPULMT_GA_F64, ones, 9, 1), GPULMT_ERR_GA_BOUNDS);
    EXPECT(gpulmt_ga_put(ctx, ga, &box, GPULMT_GA_F32, f, 9, 3), GPULMT_ERR_GA_TYPE);
    EXPECT(gpulmt_ga_get(ctx, ga, &box, GPULMT_GA_F64, got, 8, 3), GPULMT_ERR_GA_BUFFER);
    EXPECT(gpulmt_ga_put(ctx, ga, &box, 42, ones, 9, 3), GPULMT_ERR_INVALID_ARGUMENT);
    CHECK(gpulmt_ga_sync(ctx, ga));
    CHECK(gpulmt_ga_get(ctx, ga, &all, GPULMT_GA_F64, whole, ROWS * COLS, COLS));
    if (whole[0] != 0 || whole[ROWS * COLS - 1] != (ROWS - 1) * 100 + COLS - 1) fail("a refused call wrote");

    /* Short messages around a ring. */
    int right = (rank + 1) % size, left = (rank + size - 1) % size, from = -1;
    char msg[32], in[32];
    size_t len = 0;
    snprintf(msg, sizeof msg, "hello from %d", rank);
    CHECK(gpulmt_ga_send_msg(ctx, right, msg, strlen(msg) + 1));
    CHECK(gpulmt_ga_recv_msg(ctx, GPULMT_ANY_SOURCE, in, sizeof in, &from, &len));
    snprintf(msg, sizeof msg, "hello from %d", left);
    if (from != left || strcmp(in, msg) != 0) fail("message \"%s\" from %d", in, from);

    CHECK(gpulmt_ga_unregister(ctx, whole));
    /* A put left pending at destroy: the destroy completes it, a later wait says so. */
    CHECK(gpulmt_ga_put_nb(ctx, ga, &box, GPULMT_GA_F64, got, 9, 3, &h));
    CHECK(gpulmt_ga_destroy(ctx, ga));
    EXPECT(gpulmt_ga_wait(ctx, &h), GPULMT_ERR_GA_DESTROYED);
    EXPECT(gpulmt_ga_get(ctx, ga, &box, GPULMT_GA_F64, got, 9, 3), GPULMT_ERR_GA_DESTROYED);
    EXPECT(gpulmt_ga_destroy(ctx, ga), GPULMT_ERR_GA_DESTROYED);

    printf("rank=%d gac total=%.0f owned=%zu refused=%d\n", rank, total, owned, refused);
    CHECK(gpulmt_finalize(ctx));
    printf("rank=%d ok ga\n", rank);
    return 0;
}
