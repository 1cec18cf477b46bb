/*
 * mpi_nodes.c -- the C endpoint API across nodes: a job over an MPI communicator
 * (gpulmt_init_mpi), started by mpirun, with every byte checked.
 *
 * usage: mpirun -np N -x GPULMT_DEVICE=sim -x GPULMT_PSEUDO_NODES=K mpi_nodes world|split|funneled
 *   world: the job is MPI_COMM_WORLD;
 *   split: the job is a communicator of its own whose ranks run in the reverse order of
 *          MPI_COMM_WORLD's (ranks in gpulmt are the communicator's, and the program
 *          keeps using and frees its communicator after gpulmt_finalize);
 *   funneled: MPI runs at MPI_THREAD_FUNNELED, and gpulmt_init_mpi across nodes must
 *          fail on every rank with GPULMT_ERR_BOOTSTRAP and a message that names
 *          MPI_THREAD_MULTIPLE (prints "rank R refused ok" instead of the checks).
 * Needs libgpulmt built with MPI (cargo build -p gpulmt-ffi --features mpi), compiled
 * with the same MPI's mpicc, and MPI_THREAD_MULTIPLE (the internode path's proxy).
 *
 * Checks, every rank with every other (on its node and on others): every placement
 * (host or device buffer at the sender, host or device at the receiver) at sizes 0, 1,
 * 4095, 65537 and 4 MiB, at an odd offset into the buffers, with guard bytes after the
 * message that must stay untouched; receives from MPI_ANY_SOURCE and GPULMT_ANY_TAG
 * over every sender, statuses included; a truncated receive across nodes; and
 * gpulmt_init_mpi called wrongly (NULL, the wrong handle size, MPI_COMM_NULL).
 *
 * Output: "rank R of N ok checks=C" per rank; failures print "FAIL ..." on stderr and
 * abort the job.
 */
#include <mpi.h>

#include <gpulmt.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank = -1;
static long g_checks;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL mpi_nodes rank=%d: ", g_rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

#define CHECK(call)                                                                     \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != GPULMT_SUCCESS)                                                      \
            fail("%s:%d: %s: %s (%d): %s", __FILE__, __LINE__, #call,                   \
                 gpulmt_strerror(rc_), rc_, gpulmt_last_error());                       \
    } while (0)

#define EXPECT(cond, ...)                                                               \
    do {                                                                                \
        g_checks++;                                                                     \
        if (!(cond))                                                                    \
            fail(__VA_ARGS__);                                                          \
    } while (0)

enum { OFFSET = 3, GUARD = 64, GUARD_BYTE = 0xEE };

static const size_t SIZES[] = {0, 1, 4095, 65537, 4u << 20};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define MAX_LEN (4u << 20)
#define BUF_LEN (OFFSET + MAX_LEN + GUARD)

static unsigned char pat(size_t i, int src, int dst, size_t len) {
    return (unsigned char)(i * 131u + (unsigned)src * 17u + (unsigned)dst * 5u + (unsigned)len + (i >> 11) + 1u);
}

/* A buffer of BUF_LEN bytes in host or device memory. */
typedef struct {
    unsigned char *p;
    int dev;
} buf_t;

static gpulmt_ctx *g_ctx;
static unsigned char *g_host; /* host scratch of BUF_LEN bytes */

static buf_t balloc(int dev) {
    buf_t b = {NULL, dev};
    void *p = NULL;
    if (dev)
        CHECK(gpulmt_mem_alloc(g_ctx, BUF_LEN, &p));
    else if (!(p = malloc(BUF_LEN)))
        fail("out of memory");
    b.p = p;
    return b;
}

static void bfree(buf_t *b) {
    if (b->dev)
        CHECK(gpulmt_mem_free(g_ctx, b->p));
    else
        free(b->p);
    b->p = NULL;
}

/* The message (src -> dst, len bytes) at OFFSET, GUARD_BYTE everywhere else. */
static void fill(buf_t *b, int src, int dst, size_t len) {
    memset(g_host, GUARD_BYTE, BUF_LEN);
    for (size_t i = 0; i < len; i++)
        g_host[OFFSET + i] = pat(i, src, dst, len);
    CHECK(gpulmt_copy(g_ctx, b->p, g_host, BUF_LEN));
}

/* The receive buffer holds message src -> dst of len bytes at OFFSET, and GUARD_BYTE
 * before it and for GUARD bytes after it. */
static void verify(const buf_t *b, int src, int dst, size_t len, const char *what) {
    CHECK(gpulmt_copy(g_ctx, g_host, b->p, BUF_LEN));
    for (size_t i = 0; i < OFFSET + len + GUARD; i++) {
        unsigned char want = i >= OFFSET && i < OFFSET + len ? pat(i - OFFSET, src, dst, len) : GUARD_BYTE;
        if (g_host[i] != want)
            fail("%s: %zu bytes %d -> %d (%s): byte %zu of the buffer is 0x%02x, expected 0x%02x", what, len, src,
                 dst, b->dev ? "device" : "host", i, g_host[i], want);
    }
    g_checks++;
}

static void expect_status(const gpulmt_status *st, int source, int tag, size_t count, const char *what) {
    EXPECT(st->source == source && st->tag == tag && st->count == count && st->error == GPULMT_SUCCESS,
           "%s: status source=%d tag=%d count=%zu error=%d, expected %d %d %zu 0", what, st->source, st->tag,
           st->count, st->error, source, tag, count);
}

/* Every ordered pair of ranks, by rounds: in round k each rank sends to rank + k and
 * receives from rank - k, with the given placements. */
static void pairs(int rank, int size, int sdev, int rdev) {
    buf_t sb = balloc(sdev), rb = balloc(rdev);
    char what[64];
    snprintf(what, sizeof what, "%s -> %s", sdev ? "D" : "H", rdev ? "D" : "H");
    for (size_t s = 0; s < NSIZES; s++) {
        size_t len = SIZES[s];
        for (int k = 1; k < size; k++) {
            int to = (rank + k) % size, from = (rank - k + size) % size;
            int tag = 100 + (int)s;
            fill(&sb, rank, to, len);
            fill(&rb, -1, -1, 0);
            gpulmt_request rreq, sreq;
            gpulmt_status st;
            CHECK(gpulmt_irecv(g_ctx, rb.p + OFFSET, len, from, tag, &rreq));
            CHECK(gpulmt_isend(g_ctx, sb.p + OFFSET, len, to, tag, &sreq));
            CHECK(gpulmt_wait(g_ctx, &sreq, &st));
            expect_status(&st, to, tag, len, what);
            CHECK(gpulmt_wait(g_ctx, &rreq, &st));
            expect_status(&st, from, tag, len, what);
            verify(&rb, from, rank, len, what);
        }
    }
    bfree(&sb);
    bfree(&rb);
}

/* Every other rank sends this one a message; it receives them with wildcards, into a
 * device buffer, and tells them apart by the status. Then every rank's turn. */
static void any_source(int rank, int size) {
    const size_t len = 65537;
    buf_t sb = balloc(1), rb = balloc(1);
    for (int root = 0; root < size; root++) {
        if (rank != root) {
            gpulmt_request req;
            fill(&sb, rank, root, len);
            CHECK(gpulmt_isend(g_ctx, sb.p + OFFSET, len, root, 7000 + rank, &req));
            CHECK(gpulmt_wait(g_ctx, &req, NULL));
            continue;
        }
        unsigned long seen = 0;
        for (int n = 1; n < size; n++) {
            gpulmt_request req;
            gpulmt_status st;
            fill(&rb, -1, -1, 0);
            CHECK(gpulmt_irecv(g_ctx, rb.p + OFFSET, len, GPULMT_ANY_SOURCE, GPULMT_ANY_TAG, &req));
            CHECK(gpulmt_wait(g_ctx, &req, &st));
            EXPECT(st.source >= 0 && st.source < size && st.source != rank && !(seen >> st.source & 1),
                   "ANY_SOURCE receive %d: source %d (seen 0x%lx)", n, st.source, seen);
            seen |= 1ul << st.source;
            expect_status(&st, st.source, 7000 + st.source, len, "ANY_SOURCE");
            verify(&rb, st.source, rank, len, "ANY_SOURCE");
        }
    }
    bfree(&sb);
    bfree(&rb);
}

/* A receive smaller than the message fails with GPULMT_ERR_TRUNCATED, from the last
 * rank to rank 0 (another node whenever there are several). */
static void truncation(int rank, int size) {
    unsigned char big[100], small[10];
    gpulmt_request req;
    gpulmt_status st;
    memset(big, 7, sizeof big);
    if (rank == size - 1) {
        CHECK(gpulmt_isend(g_ctx, big, sizeof big, 0, 999, &req));
        CHECK(gpulmt_wait(g_ctx, &req, &st));
    } else if (rank == 0) {
        CHECK(gpulmt_irecv(g_ctx, small, sizeof small, size - 1, 999, &req));
        int rc = gpulmt_wait(g_ctx, &req, &st);
        EXPECT(rc == GPULMT_ERR_TRUNCATED && st.error == GPULMT_ERR_TRUNCATED && req == GPULMT_REQUEST_NULL,
               "truncated receive: rc=%d status.error=%d (%s)", rc, st.error, gpulmt_last_error());
    }
}

/* gpulmt_init_mpi called wrongly: an error code and a NULL context, never a crash. */
static void misuse(MPI_Comm comm) {
    gpulmt_ctx *ctx = (gpulmt_ctx *)&ctx;
    int rc = gpulmt_init_mpi(NULL, sizeof(MPI_Comm), &ctx);
    EXPECT(rc == GPULMT_ERR_INVALID_ARGUMENT && ctx == NULL, "NULL comm: rc=%d", rc);
    ctx = (gpulmt_ctx *)&ctx;
    rc = gpulmt_init_mpi(&comm, sizeof(MPI_Comm) + 1, &ctx);
    EXPECT(rc == GPULMT_ERR_INVALID_ARGUMENT && ctx == NULL && strstr(gpulmt_last_error(), "another MPI"),
           "wrong comm_size: rc=%d (%s)", rc, gpulmt_last_error());
    MPI_Comm null = MPI_COMM_NULL;
    rc = gpulmt_init_mpi(&null, sizeof null, &ctx);
    EXPECT(rc == GPULMT_ERR_INVALID_ARGUMENT && ctx == NULL, "MPI_COMM_NULL: rc=%d (%s)", rc, gpulmt_last_error());
    rc = gpulmt_init_mpi(&comm, sizeof comm, NULL);
    EXPECT(rc == GPULMT_ERR_INVALID_ARGUMENT, "NULL out: rc=%d", rc);
}

int main(int argc, char **argv) {
    const char *mode = argc == 2 ? argv[1] : "";
    if (strcmp(mode, "world") != 0 && strcmp(mode, "split") != 0 && strcmp(mode, "funneled") != 0) {
        fprintf(stderr, "usage: mpirun -np N %s world|split|funneled\n", argv[0]);
        return 2;
    }
    int funneled = strcmp(mode, "funneled") == 0;
    int provided = 0;
    MPI_Init_thread(&argc, &argv, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE, &provided);
    int wrank, wsize;
    MPI_Comm_rank(MPI_COMM_WORLD, &wrank);
    MPI_Comm_size(MPI_COMM_WORLD, &wsize);
    g_rank = wrank;
    MPI_Comm comm = MPI_COMM_WORLD;
    if (funneled) {
        if (provided >= MPI_THREAD_MULTIPLE)
            fail("asked for MPI_THREAD_FUNNELED, MPI gave MPI_THREAD_MULTIPLE: nothing to refuse");
        gpulmt_ctx *ctx = NULL;
        int rc = gpulmt_init_mpi(&comm, sizeof comm, &ctx);
        EXPECT(rc == GPULMT_ERR_BOOTSTRAP && ctx == NULL, "below MPI_THREAD_MULTIPLE: rc=%d (%s)", rc,
               gpulmt_last_error());
        EXPECT(strstr(gpulmt_last_error(), "MPI_THREAD_MULTIPLE") != NULL,
               "the error does not say what to do: %s", gpulmt_last_error());
        printf("rank %d refused ok: %s\n", wrank, gpulmt_last_error());
        fflush(stdout);
        MPI_Finalize();
        return 0;
    }
    if (provided < MPI_THREAD_MULTIPLE)
        fail("MPI gave thread level %d, below MPI_THREAD_MULTIPLE", provided);
    int split = strcmp(mode, "split") == 0;
    if (split)
        MPI_Comm_split(MPI_COMM_WORLD, 0, wsize - 1 - wrank, &comm);
    misuse(comm);

    CHECK(gpulmt_init_mpi(&comm, sizeof comm, &g_ctx));
    int rank, size, crank;
    CHECK(gpulmt_rank(g_ctx, &rank));
    CHECK(gpulmt_size(g_ctx, &size));
    MPI_Comm_rank(comm, &crank);
    EXPECT(rank == crank && size == wsize, "gpulmt rank %d of %d, but the communicator's rank is %d of %d", rank,
           size, crank, wsize);
    g_rank = rank;
    if (size > (int)(8 * sizeof(unsigned long)))
        fail("at most %zu ranks", 8 * sizeof(unsigned long));
    if (!(g_host = malloc(BUF_LEN)))
        fail("out of memory");

    for (int sdev = 0; sdev < 2; sdev++)
        for (int rdev = 0; rdev < 2; rdev++)
            pairs(rank, size, sdev, rdev);
    any_source(rank, size);
    truncation(rank, size);
    CHECK(gpulmt_barrier(g_ctx));

    free(g_host);
    CHECK(gpulmt_finalize(g_ctx));
    /* The communicator is still the program's: gpulmt kept a duplicate, not this one. */
    int after = -1;
    if (MPI_Comm_rank(comm, &after) != MPI_SUCCESS || after != crank)
        fail("the communicator is unusable after gpulmt_finalize (rank %d)", after);
    if (split)
        MPI_Comm_free(&comm);
    printf("rank %d of %d ok checks=%ld\n", rank, size, g_checks);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
