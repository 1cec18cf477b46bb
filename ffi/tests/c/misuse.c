/* misuse.c: the C ABI called wrongly, as a careless or hostile program would. Every
 * wrong call must return its error code: never crash, never succeed, never break the
 * context for the right calls that follow.
 *
 *   gpulmt-run -n 2 misuse [SEED]        all the misuse, then a message each way
 *   GPULMT_CHUNK_SIZE=6 misuse config    a configuration out of range fails gpulmt_init
 *
 * The misuse includes a second gpulmt_init while the first context lives.
 *
 * SEED varies the garbage handles and lengths. Prints "rank=R checks=N failures=F",
 * then "rank=R ok misuse" when every check held (exit 0); a FAIL line per broken check
 * otherwise (exit 1). */
#include <gpulmt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = -1;
static int g_checks, g_failures;

#define EXPECT(call, code)                                                                   \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        g_checks++;                                                                          \
        if (rc_ != (code)) {                                                                 \
            g_failures++;                                                                    \
            fprintf(stderr, "FAIL rank=%d: misuse.c:%d: %s returned %d (%s), expected %d\n", \
                    g_rank, __LINE__, #call, rc_, gpulmt_last_error(), (code));              \
        }                                                                                    \
    } while (0)

static uint64_t g_rng;

static uint64_t next(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int config_only(void) {
    gpulmt_ctx *ctx = (gpulmt_ctx *)&g_rng; /* must be set to NULL on failure */
    int rc = gpulmt_init(&ctx);
    if (rc != GPULMT_ERR_CONFIG || ctx != NULL || !strstr(gpulmt_last_error(), "GPULMT_CHUNK_SIZE")) {
        fprintf(stderr, "FAIL: gpulmt_init with a bad GPULMT_CHUNK_SIZE returned %d (%s), ctx %p\n", rc,
                gpulmt_last_error(), (void *)ctx);
        return 1;
    }
    printf("rank=0 refused: %s\nrank=0 ok config\n", gpulmt_last_error());
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "config") == 0)
        return config_only();
    g_rng = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    gpulmt_ctx *ctx = NULL;
    if (gpulmt_init(&ctx) != GPULMT_SUCCESS) {
        fprintf(stderr, "FAIL: gpulmt_init: %s\n", gpulmt_last_error());
        return 1;
    }
    int size = 0, r = 0, flag = 0;
    gpulmt_rank(ctx, &g_rank);
    gpulmt_size(ctx, &size);
    unsigned char small[64];
    memset(small, 1, sizeof small);
    gpulmt_request req = 77;

    /* A second init while this context lives is refused (issue 31 item 6), its handle set
     * to NULL; the first context goes on (the barrier and messages below use it). */
    gpulmt_ctx *second = (gpulmt_ctx *)&g_rng;
    int second_rc = gpulmt_init(&second);
    g_checks++;
    if (second_rc == GPULMT_SUCCESS || second != NULL || !strstr(gpulmt_last_error(), "init")) {
        g_failures++;
        fprintf(stderr, "FAIL rank=%d: a second gpulmt_init returned %d (%s), handle %p\n", g_rank, second_rc,
                gpulmt_last_error(), (void *)second);
    }

    /* NULL, garbage and made-up contexts are refused, never dereferenced. */
    EXPECT(gpulmt_rank(NULL, &r), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_finalize(NULL), GPULMT_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 64; i++) {
        gpulmt_ctx *junk = (gpulmt_ctx *)(uintptr_t)(i < 8 ? (uint64_t)i * 8 + 1 : next());
        EXPECT(gpulmt_barrier(junk), GPULMT_ERR_INVALID_ARGUMENT);
        EXPECT(gpulmt_isend(junk, small, sizeof small, 0, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
        EXPECT(gpulmt_mem_free_commit(junk), GPULMT_ERR_INVALID_ARGUMENT);
    }

    /* Lengths no buffer can have: beyond the address space, beyond PTRDIFF_MAX. */
    EXPECT(gpulmt_isend(ctx, small, SIZE_MAX, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    if (req != GPULMT_REQUEST_NULL) {
        g_failures++;
        fprintf(stderr, "FAIL rank=%d: a refused isend left a request\n", g_rank);
    }
    EXPECT(gpulmt_irecv(ctx, small, SIZE_MAX, GPULMT_ANY_SOURCE, GPULMT_ANY_TAG, &req),
           GPULMT_ERR_INVALID_ARGUMENT);
    for (int i = 0; i < 32; i++) {
        size_t len = (size_t)(next() | (1ull << 63));
        EXPECT(gpulmt_isend(ctx, small, len, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
        EXPECT(gpulmt_irecv(ctx, small, len, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    }
    /* Lengths within PTRDIFF_MAX that still pass the end of any user address space (2^57),
       and a device buffer's length past its allocation (issue 46: left pending). */
    EXPECT(gpulmt_isend(ctx, small, (size_t)1 << 62, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_irecv(ctx, small, (size_t)1 << 58, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    void *short_dev = NULL;
    EXPECT(gpulmt_mem_alloc(ctx, 4096, &short_dev), GPULMT_SUCCESS);
    EXPECT(gpulmt_isend(ctx, short_dev, (size_t)1 << 40, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_irecv(ctx, (char *)short_dev + 4000, 97, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_mem_free(ctx, short_dev), GPULMT_SUCCESS);
    EXPECT(gpulmt_isend(ctx, NULL, 8, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_copy(ctx, small, NULL, 8), GPULMT_ERR_INVALID_ARGUMENT);

    /* Ranks, tags, out-parameters, requests. */
    EXPECT(gpulmt_isend(ctx, small, 8, size, 1, &req), GPULMT_ERR_BAD_RANK);
    EXPECT(gpulmt_isend(ctx, small, 8, -5, 1, &req), GPULMT_ERR_BAD_RANK);
    EXPECT(gpulmt_isend(ctx, small, 8, g_rank, -3, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_isend(ctx, small, 8, g_rank, GPULMT_TAG_UB, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_isend(ctx, small, 8, g_rank, 1, NULL), GPULMT_ERR_INVALID_ARGUMENT);
    gpulmt_request bogus = 0xdeadbeef;
    EXPECT(gpulmt_test(ctx, &bogus, &flag, NULL), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_wait(ctx, &bogus, NULL), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_test(ctx, NULL, &flag, NULL), GPULMT_ERR_INVALID_ARGUMENT);

    /* Two-phase free misused, then device memory used after its release. */
    void *dev = NULL;
    EXPECT(gpulmt_mem_free(ctx, small), GPULMT_ERR_FREE);
    EXPECT(gpulmt_mem_alloc(ctx, 1 << 20, &dev), GPULMT_SUCCESS);
    EXPECT(gpulmt_mem_free(ctx, dev), GPULMT_SUCCESS);
    EXPECT(gpulmt_mem_free(ctx, dev), GPULMT_ERR_FREE);
    EXPECT(gpulmt_mem_free_commit(ctx), GPULMT_SUCCESS);
    EXPECT(gpulmt_isend(ctx, dev, 64, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_isend(ctx, dev, 1 << 20, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_irecv(ctx, dev, 1 << 20, g_rank, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_copy(ctx, small, dev, 64), GPULMT_ERR_INVALID_ARGUMENT);

    /* The context still works: a message to the next rank and one from the previous. */
    unsigned char out[4] = {'p', 'i', 'n', 'g'}, in[4] = {0};
    gpulmt_request s = GPULMT_REQUEST_NULL, q = GPULMT_REQUEST_NULL;
    EXPECT(gpulmt_irecv(ctx, in, sizeof in, (g_rank + size - 1) % size, 9, &q), GPULMT_SUCCESS);
    EXPECT(gpulmt_isend(ctx, out, sizeof out, (g_rank + 1) % size, 9, &s), GPULMT_SUCCESS);
    EXPECT(gpulmt_wait(ctx, &s, NULL), GPULMT_SUCCESS);
    EXPECT(gpulmt_wait(ctx, &q, NULL), GPULMT_SUCCESS);
    if (memcmp(in, out, sizeof in) != 0) {
        g_failures++;
        fprintf(stderr, "FAIL rank=%d: the message after the misuse is wrong\n", g_rank);
    }

    /* Finalized: the handle is stale, every call on it is refused. */
    EXPECT(gpulmt_finalize(ctx), GPULMT_SUCCESS);
    EXPECT(gpulmt_rank(ctx, &r), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_isend(ctx, small, 8, 0, 1, &req), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_wait(ctx, &bogus, NULL), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_barrier(ctx), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_mem_alloc(ctx, 64, &dev), GPULMT_ERR_INVALID_ARGUMENT);
    EXPECT(gpulmt_finalize(ctx), GPULMT_ERR_INVALID_ARGUMENT);
    printf("rank=%d checks=%d failures=%d\n", g_rank, g_checks, g_failures);
    if (g_failures == 0)
        printf("rank=%d ok misuse\n", g_rank);
    return g_failures ? 1 : 0;
}
