/*
 * sym.c -- the symmetric heap of gpulmt from C, on the host side: collective
 * allocation, a ring of put_signal, gets, exact totals of concurrent atomics, the
 * device context a kernel would get, and refused bad input.
 *
 * usage: gpulmt-run -n N sym     (N >= 2; sim devices: host atomics need them)
 *
 * It includes both headers, as a program that launches kernels does: gpulmt.h for the
 * host calls and gpulmt_device.cuh (compiled as C it declares only the shared layouts)
 * for gpulmt_device_ctx.
 *
 * Output (the Rust test parses it):
 *   rank=R symc offset=O ctx_pe=R ctx_pes=N total=T
 *   rank=R ok sym
 * Failures print "FAIL ..." on stderr and the rank exits non-zero.
 */
#include <gpulmt.h>
#include <gpulmt_device.cuh>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PIECE 1000
#define ADDS 500

static int g_rank = -1;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL sym rank=%d: ", g_rank);
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
    } while (0)

static unsigned char pattern(int rank, int i) { return (unsigned char)(i * 13 + rank * 5 + 1); }

int main(void) {
    gpulmt_ctx *ctx = NULL;
    int rank, size, i;
    CHECK(gpulmt_init(&ctx));
    CHECK(gpulmt_rank(ctx, &rank));
    CHECK(gpulmt_size(ctx, &size));
    g_rank = rank;

    unsigned char *data = NULL;
    uint64_t *words = NULL; /* [0, size): signals by sender; [size]: counter */
    CHECK(gpulmt_sym_malloc(ctx, PIECE, (void **)&data));
    CHECK(gpulmt_sym_malloc(ctx, 8 * ((size_t)size + 1), (void **)&words));
    uint64_t zeros[64] = {0};
    if (size + 1 > 64) fail("at most 63 ranks");
    CHECK(gpulmt_sym_put(ctx, words, zeros, 8 * ((size_t)size + 1), rank));
    CHECK(gpulmt_barrier(ctx));

    /* A ring of put_signal: our piece into the right neighbour, then its signal. */
    unsigned char piece[PIECE], got[PIECE];
    for (i = 0; i < PIECE; i++) piece[i] = pattern(rank, i);
    int right = (rank + 1) % size, left = (rank + size - 1) % size;
    CHECK(gpulmt_sym_put_signal(ctx, data, piece, PIECE, &words[rank], 1, GPULMT_SIGNAL_SET, right));
    uint64_t seen = 0;
    CHECK(gpulmt_sym_signal_wait_until(ctx, &words[left], GPULMT_CMP_EQ, 1, 20000000, &seen));
    if (seen != 1) fail("signal %llu", (unsigned long long)seen);
    CHECK(gpulmt_sym_get(ctx, got, data, PIECE, rank));
    for (i = 0; i < PIECE; i++)
        if (got[i] != pattern(left, i)) fail("byte %d from rank %d", i, left);

    /* Concurrent fetch-adds on rank 0's counter: exact totals. */
    for (i = 0; i < ADDS; i++) CHECK(gpulmt_sym_atomic_fetch_add(ctx, &words[size], 1, 0, NULL));
    CHECK(gpulmt_barrier(ctx));
    uint64_t total = 0;
    CHECK(gpulmt_sym_atomic_fetch(ctx, &words[size], 0, &total));
    if (total != (uint64_t)ADDS * (uint64_t)size) fail("total %llu", (unsigned long long)total);

    /* What a kernel of this rank would get, and its (empty) record of rejections. */
    gpulmt_device_ctx dctx;
    CHECK(gpulmt_sym_device_ctx(ctx, &dctx, sizeof dctx));
    if (dctx.version != GPULMT_DEVICE_CTX_VERSION || dctx.my_pe != rank || dctx.n_pes != size)
        fail("device ctx version %u pe %d pes %d", dctx.version, dctx.my_pe, dctx.n_pes);
    if ((uint64_t)(uintptr_t)data < dctx.heap_base + dctx.reserved) fail("data before the allocation area");
    uint64_t record[4];
    CHECK(gpulmt_sym_device_errors(ctx, record, 0));
    if (record[0] != 0) fail("%llu rejected device accesses", (unsigned long long)record[0]);
    void *mine = NULL;
    CHECK(gpulmt_sym_ptr(ctx, data, rank, &mine));
    if (mine != (void *)data) fail("gpulmt_sym_ptr of our own heap");

    /* Bad input: refused, never hangs. */
    EXPECT(gpulmt_sym_put(ctx, data + PIECE, piece, 1, right), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_sym_atomic_fetch_add(ctx, (uint64_t *)(void *)(data + 4), 1, 0, NULL), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_sym_device_ctx(ctx, &dctx, 40), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_sym_signal_wait_until(ctx, &words[0], 9, 0, 0, NULL), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_sym_signal_wait_until(ctx, &words[left], GPULMT_CMP_EQ, 7, 1000, NULL), GPULMT_ERR_CANCELLED);
    /* Collective: every rank names the same wrong address, every rank fails. */
    EXPECT(gpulmt_sym_free(ctx, data + 8), GPULMT_ERR_INVALID_ARGUMENT);
    CHECK(gpulmt_sym_free(ctx, data));
    CHECK(gpulmt_sym_free(ctx, words));
    EXPECT(gpulmt_sym_get(ctx, got, data, 1, rank), GPULMT_ERR_INVALID_ARGUMENT);

    printf("rank=%d symc offset=%llu ctx_pe=%d ctx_pes=%d total=%llu\n", rank,
           (unsigned long long)((uint64_t)(uintptr_t)data - dctx.heap_base), dctx.my_pe, dctx.n_pes,
           (unsigned long long)total);
    CHECK(gpulmt_finalize(ctx));
    printf("rank=%d ok sym\n", rank);
    return 0;
}
