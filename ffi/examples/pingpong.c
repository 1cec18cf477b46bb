/*
 * pingpong.c -- the plain endpoint API of gpulmt from C: a ping-pong between two
 * ranks started by the launcher, with data checked and round trips timed.
 *
 * usage: gpulmt-run -n 2 pingpong host|device ITERS SIZE...
 *   host:   buffers are malloc'ed host memory;
 *   device: buffers are device memory from gpulmt_mem_alloc (sim or CUDA).
 * For each SIZE, rank 0 sends ITERS messages to rank 1, which checks each one and
 * sends it back; rank 0 checks what comes back. Rank 1 receives with wildcards and
 * checks the status. Then a truncated receive must fail with GPULMT_ERR_TRUNCATED.
 *
 * Output (the Rust test parses it):
 *   job=<id>                                                  (rank 0)
 *   rank=R pid=P
 *   pingpong size=S iters=N usec_per_roundtrip=T              (rank 0)
 *   rank=R protocols get=.. put=.. coop=.. shm=.. self=..
 *   rank=R ok pingpong
 * Failures print "FAIL ..." on stderr and the rank exits non-zero (the launcher then
 * ends the job).
 */
#define _POSIX_C_SOURCE 200809L

#include <gpulmt.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int g_rank = -1;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL pingpong rank=%d: ", g_rank);
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

/* Where the message buffers live. */
struct buffers {
    gpulmt_ctx *ctx;
    int device;
    void *msg;             /* the buffer that is sent and received */
    unsigned char *expect; /* host copy of what must arrive */
    unsigned char *check;  /* host buffer to read the message back into */
};

static void *alloc(struct buffers *b, size_t len) {
    void *p = NULL;
    if (b->device)
        CHECK(gpulmt_mem_alloc(b->ctx, len ? len : 1, &p));
    else if (!(p = malloc(len ? len : 1)))
        fail("out of memory");
    return p;
}

static void release(struct buffers *b, void *p) {
    if (b->device)
        CHECK(gpulmt_mem_free(b->ctx, p));
    else
        free(p);
}

static void fill(size_t len, unsigned char *host, unsigned seed) {
    for (size_t i = 0; i < len; i++)
        host[i] = (unsigned char)(i * 29 + seed * 7 + 1);
}

/* Reads the message buffer back and compares it with what must have arrived. */
static void verify(struct buffers *b, size_t len, const char *what) {
    if (len == 0)
        return;
    memset(b->check, 0, len);
    CHECK(gpulmt_copy(b->ctx, b->check, b->msg, len));
    for (size_t i = 0; i < len; i++)
        if (b->check[i] != b->expect[i])
            fail("%s, %zu bytes: byte %zu is %u, expected %u", what, len, i, b->check[i], b->expect[i]);
}

static void expect_status(const gpulmt_status *st, int source, int tag, size_t count, const char *what) {
    if (st->source != source || st->tag != tag || st->count != count || st->error != GPULMT_SUCCESS)
        fail("%s: status source=%d tag=%d count=%zu error=%d, expected %d %d %zu 0", what, st->source, st->tag,
             st->count, st->error, source, tag, count);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pingpong(struct buffers *b, int rank, size_t len, int tag, int iters) {
    b->msg = alloc(b, len);
    fill(len, b->expect, (unsigned)len);
    if (len)
        CHECK(gpulmt_copy(b->ctx, b->msg, b->expect, len));
    gpulmt_request req;
    gpulmt_status st;
    double t0 = now_us();
    for (int i = 0; i < iters; i++) {
        if (rank == 0) {
            gpulmt_request back;
            /* The reply goes into the same buffer; it holds the same bytes. */
            CHECK(gpulmt_isend(b->ctx, b->msg, len, 1, tag, &req));
            CHECK(gpulmt_wait(b->ctx, &req, &st));
            expect_status(&st, 1, tag, len, "send 0->1");
            CHECK(gpulmt_irecv(b->ctx, b->msg, len, 1, tag, &back));
            CHECK(gpulmt_wait(b->ctx, &back, &st));
            expect_status(&st, 1, tag, len, "receive 1->0");
        } else {
            int done = 0;
            CHECK(gpulmt_irecv(b->ctx, b->msg, len, GPULMT_ANY_SOURCE, GPULMT_ANY_TAG, &req));
            while (!done)
                CHECK(gpulmt_test(b->ctx, &req, &done, &st));
            if (req != GPULMT_REQUEST_NULL)
                fail("a completed request was not reset to GPULMT_REQUEST_NULL");
            expect_status(&st, 0, tag, len, "receive 0->1 (wildcards)");
            if (i == 0)
                verify(b, len, "message at rank 1");
            CHECK(gpulmt_isend(b->ctx, b->msg, len, 0, tag, &req));
            CHECK(gpulmt_wait(b->ctx, &req, &st));
        }
    }
    double us = (now_us() - t0) / iters;
    verify(b, len, rank == 0 ? "message back at rank 0" : "message at rank 1 after the reply");
    if (rank == 0) {
        printf("pingpong size=%zu iters=%d usec_per_roundtrip=%.2f\n", len, iters, us);
        fflush(stdout);
    }
    release(b, b->msg);
}

/* A receive smaller than the message fails with GPULMT_ERR_TRUNCATED, in the status
 * too; the send succeeds. */
static void truncation(gpulmt_ctx *ctx, int rank) {
    unsigned char big[100], small[10];
    gpulmt_request req;
    gpulmt_status st;
    memset(big, 7, sizeof big);
    if (rank == 0) {
        CHECK(gpulmt_isend(ctx, big, sizeof big, 1, 999, &req));
        CHECK(gpulmt_wait(ctx, &req, &st));
        return;
    }
    CHECK(gpulmt_irecv(ctx, small, sizeof small, 0, 999, &req));
    int rc = gpulmt_wait(ctx, &req, &st);
    if (rc != GPULMT_ERR_TRUNCATED || st.error != GPULMT_ERR_TRUNCATED || req != GPULMT_REQUEST_NULL)
        fail("truncated receive: rc=%d status.error=%d (%s)", rc, st.error, gpulmt_last_error());
}

int main(int argc, char **argv) {
    if (argc < 4 || (strcmp(argv[1], "host") != 0 && strcmp(argv[1], "device") != 0)) {
        fprintf(stderr, "usage: gpulmt-run -n 2 %s host|device ITERS SIZE...\n", argv[0]);
        return 2;
    }
    int iters = atoi(argv[2]);
    if (iters < 1) {
        fprintf(stderr, "ITERS must be at least 1\n");
        return 2;
    }
    struct buffers b;
    memset(&b, 0, sizeof b);
    b.device = strcmp(argv[1], "device") == 0;
    CHECK(gpulmt_init(&b.ctx));
    int rank, size;
    CHECK(gpulmt_rank(b.ctx, &rank));
    CHECK(gpulmt_size(b.ctx, &size));
    g_rank = rank;
    if (size != 2)
        fail("needs 2 ranks, got %d: gpulmt-run -n 2", size);
    if (rank == 0) {
        const char *job = getenv("GPULMT_JOB");
        printf("job=%s\n", job ? job : "");
    }
    printf("rank=%d pid=%ld\n", rank, (long)getpid());
    fflush(stdout);

    size_t max = 1;
    for (int i = 3; i < argc; i++) {
        size_t len = strtoull(argv[i], NULL, 10);
        max = len > max ? len : max;
    }
    b.expect = malloc(max);
    b.check = malloc(max);
    if (!b.expect || !b.check)
        fail("out of memory");
    for (int i = 3; i < argc; i++)
        pingpong(&b, rank, strtoull(argv[i], NULL, 10), i, iters);
    truncation(b.ctx, rank);

    /* Collective: releases the device buffers every rank marked with gpulmt_mem_free. */
    CHECK(gpulmt_mem_free_commit(b.ctx));
    gpulmt_stats s;
    CHECK(gpulmt_get_stats(b.ctx, &s));
    printf("rank=%d protocols get=%llu put=%llu coop=%llu shm=%llu self=%llu\n", rank,
           (unsigned long long)s.protocols[GPULMT_PROTOCOL_GET], (unsigned long long)s.protocols[GPULMT_PROTOCOL_PUT],
           (unsigned long long)s.protocols[GPULMT_PROTOCOL_COOP], (unsigned long long)s.protocols[GPULMT_PROTOCOL_SHM],
           (unsigned long long)s.protocols[GPULMT_PROTOCOL_SELF]);
    CHECK(gpulmt_barrier(b.ctx));
    CHECK(gpulmt_finalize(b.ctx));
    printf("rank=%d ok pingpong\n", rank);
    free(b.expect);
    free(b.check);
    return 0;
}
