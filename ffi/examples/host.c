/*
 * host.c -- a minimal "MPI library" that uses gpulmt as its LMT plugin.
 *
 * Two rank processes of one job talk over the host's own control channel, a
 * socketpair; there is no MPI and no gpulmt-run. The parent forks both ranks of each
 * run and only supervises: it never initializes a device, because a process that has
 * initialized CUDA must not fork children that use it. The host owns matching and its
 * RTS/CTS messages, and piggybacks gpulmt's cookies on them:
 *
 *   sender                                     receiver
 *   gpulmt_lmt_initiate -> RTS cookie  --RTS-->  gpulmt_lmt_start_recv -> CTS cookie
 *   gpulmt_lmt_handle_cts(cookie)     <--CTS--   (no CTS when the cookie is empty: GET)
 *   gpulmt_lmt_done ... (progress loop)          gpulmt_lmt_done ... (progress loop)
 *
 * and carries every other gpulmt control blob (send_blob -> gpulmt_plugin_deliver).
 * With GPULMT_HOST_RINGS=1 the host gives gpulmt no send_blob: it carries only the RTS
 * cookie, gpulmt's own shared-memory rings carry the rest (no CTS cookie comes back,
 * no blob), and the host's progress loop calls gpulmt_progress.
 * Buffers are device memory from gpulmt_mem_alloc, so the same program runs on the
 * sim backend and on CUDA. Messages go both ways; every byte is checked.
 *
 * When the channel to the peer closes before the peer said goodbye, the host declares
 * the peer terminated (gpulmt_peer_terminated): transfers with it then fail with
 * GPULMT_ERR_PEER_FAILED instead of waiting forever.
 *
 * usage: host [PROTOCOL...]
 *        host --peer-dies
 *   Without arguments: one run with GPULMT_PROTOCOL as set in the environment (job id
 *   "host<pid>"). With arguments: one run per protocol (get, put, coop, shm, auto),
 *   each setting GPULMT_PROTOCOL (job id "host<pid>-<protocol>"). --peer-dies: rank 1
 *   leaves as soon as rank 0's RTS arrives; rank 0's send must fail with
 *   GPULMT_ERR_PEER_FAILED.
 *
 * Output, per rank R of each run (the Rust test parses it):
 *   job=<id>                                   (once per run, before the fork)
 *   sizes=S1,S2,...                            (once per run: each way, one message each)
 *   rank=R pid=P
 *   rank=R protocols get=.. put=.. coop=.. shm=.. self=..
 *   rank=R ok host <protocol>                   (or: rank=R ok host peer-dies)
 * Failures print "FAIL ..." on stderr and the program exits non-zero.
 */
#define _POSIX_C_SOURCE 200809L

#include <gpulmt.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

/* Sizes moved in each direction; each is sent from an offset inside its allocation. */
static const size_t SIZES[] = {65536 + 5, 1 << 20, (3 << 20) + 7};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])
#define OFFSET 64
/* A run that takes longer than this has hung: SIGALRM ends it. */
#define RUN_SECONDS 60

/* ---- the host's control channel --------------------------------------------- */

/* What the host's channel carries (one SOCK_SEQPACKET record each). */
enum kind { MSG_RTS = 1, MSG_CTS = 2, MSG_BLOB = 3, MSG_BYE = 4 };

struct frame {
    uint32_t kind;
    uint32_t len;     /* bytes of payload that follow (cookie or blob) */
    uint64_t msg_len; /* MSG_RTS: the host's envelope, the message length */
};

/* Largest record: a frame and a control blob (small packets; 64 KiB is ample). */
#define RECORD_MAX (sizeof(struct frame) + 65536)

struct host {
    int fd;
    int rank;
    int peer;
    gpulmt_ctx *ctx;
    /* The RTS the peer sent that no receive has matched yet (one at a time here). */
    int have_rts;
    uint64_t rts_msg_len;
    unsigned char rts_cookie[GPULMT_COOKIE_MAX];
    size_t rts_cookie_len;
    int peer_bye;
    int closed; /* the peer closed the channel */
    int rings;  /* no send_blob: gpulmt's rings carry its control packets */
};

static int g_rank = -1;
/* This rank's context, released on failure: a host that gives up should release gpulmt
 * (local for a plugin context), so that the peer sees it gone at once and its device
 * memory is freed. */
static gpulmt_ctx *g_ctx;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL host rank=%d: ", g_rank);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    gpulmt_ctx *ctx = g_ctx;
    g_ctx = NULL; /* a failure inside gpulmt_finalize must not come back here */
    if (ctx)
        gpulmt_finalize(ctx);
    exit(1);
}

static void say(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* Runs a gpulmt call; on failure prints its code and message and exits. */
#define CHECK(call)                                                                     \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ != GPULMT_SUCCESS)                                                      \
            fail("%s:%d: %s: %s (%d): %s", __FILE__, __LINE__, #call,                   \
                 gpulmt_strerror(rc_), rc_, gpulmt_last_error());                       \
    } while (0)

static int send_frame(int fd, uint32_t kind, uint64_t msg_len, const void *bytes, size_t len) {
    struct frame f = {kind, (uint32_t)len, msg_len};
    struct iovec iov[2] = {{&f, sizeof f}, {(void *)bytes, len}};
    struct msghdr m;
    memset(&m, 0, sizeof m);
    m.msg_iov = iov;
    m.msg_iovlen = len ? 2 : 1;
    ssize_t n;
    do {
        n = sendmsg(fd, &m, 0);
    } while (n < 0 && errno == EINTR);
    return n == (ssize_t)(sizeof f + len) ? 0 : -1;
}

/* gpulmt's send_blob: a control blob for the peer, through the host's channel. */
static int send_blob(void *user, int to_local_rank, const void *bytes, size_t len) {
    struct host *h = user;
    if (to_local_rank != h->peer)
        return -1; /* this host only knows its one peer */
    return send_frame(h->fd, MSG_BLOB, 0, bytes, len);
}

/* Handles one record from the peer. */
static void dispatch(struct host *h, const unsigned char *rec, size_t n) {
    struct frame f;
    if (n < sizeof f)
        fail("short record (%zu bytes)", n);
    memcpy(&f, rec, sizeof f);
    const unsigned char *payload = rec + sizeof f;
    if (f.len != n - sizeof f)
        fail("record of %zu bytes announces %u", n, f.len);
    switch (f.kind) {
    case MSG_RTS:
        if (h->have_rts || f.len > sizeof h->rts_cookie)
            fail("unexpected RTS (pending: %d, cookie %u bytes)", h->have_rts, f.len);
        h->have_rts = 1;
        h->rts_msg_len = f.msg_len;
        memcpy(h->rts_cookie, payload, f.len);
        h->rts_cookie_len = f.len;
        break;
    case MSG_CTS:
        if (h->rings)
            fail("a CTS cookie came through the host's channel although gpulmt's rings carry it");
        CHECK(gpulmt_lmt_handle_cts(h->ctx, h->peer, payload, f.len));
        break;
    case MSG_BLOB:
        if (h->rings)
            fail("a control blob came through the host's channel although gpulmt's rings carry it");
        CHECK(gpulmt_plugin_deliver(h->ctx, h->peer, payload, f.len));
        break;
    case MSG_BYE:
        h->peer_bye = 1;
        break;
    default:
        fail("unknown record kind %u", f.kind);
    }
}

/* The host's progress: handles every record waiting on the channel, without blocking,
 * and with the rings lets gpulmt read and send its packets (a packet this rank owes a
 * peer may still wait for room in its ring, even with no request of ours in flight). */
static void pump(struct host *h) {
    static unsigned char rec[RECORD_MAX];
    if (h->rings)
        CHECK(gpulmt_progress(h->ctx, NULL));
    while (!h->closed) {
        struct pollfd p = {h->fd, POLLIN, 0};
        int r = poll(&p, 1, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            fail("poll: %s", strerror(errno));
        if (r == 0)
            return;
        ssize_t n = recv(h->fd, rec, sizeof rec, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail("recv: %s", strerror(errno));
        if (n == 0) {
            /* The peer exited. After its goodbye that is the normal end; before it,
             * the peer is gone mid-job: its transfers must fail, not wait. */
            h->closed = 1;
            if (!h->peer_bye)
                CHECK(gpulmt_peer_terminated(h->ctx, h->peer));
            return;
        }
        dispatch(h, rec, (size_t)n);
    }
}

/* Polls an LMT request from the host's progress loop until it completes; returns the
 * request's result (also in st->error). */
static int complete(struct host *h, gpulmt_request *req, gpulmt_status *st) {
    int done = 0;
    while (!done) {
        pump(h);
        int rc = gpulmt_lmt_done(h->ctx, req, &done, st);
        if (rc != GPULMT_SUCCESS && !done)
            fail("gpulmt_lmt_done: %s (%d): %s", gpulmt_strerror(rc), rc, gpulmt_last_error());
        if (done)
            return rc;
    }
    return GPULMT_SUCCESS;
}

/* ---- one rank ----------------------------------------------------------------- */

static unsigned char pattern(size_t i, size_t len, int from) {
    return (unsigned char)(i * 131 + len * 7 + (size_t)from * 17 + 3);
}

/* Starts sending `len` bytes of the pattern from device memory and sends the host's RTS. */
static gpulmt_request start_send(struct host *h, unsigned char *dev, unsigned char *host_buf, size_t len) {
    for (size_t i = 0; i < len; i++)
        host_buf[i] = pattern(i, len, h->rank);
    CHECK(gpulmt_copy(h->ctx, dev + OFFSET, host_buf, len));
    gpulmt_request req;
    unsigned char cookie[GPULMT_COOKIE_MAX];
    size_t cookie_len = sizeof cookie;
    CHECK(gpulmt_lmt_initiate(h->ctx, dev + OFFSET, len, h->peer, &req, cookie, &cookie_len));
    if (send_frame(h->fd, MSG_RTS, len, cookie, cookie_len) != 0)
        fail("sending the RTS: %s", strerror(errno));
    return req;
}

static void send_message(struct host *h, unsigned char *dev, unsigned char *host_buf, size_t len) {
    gpulmt_request req = start_send(h, dev, host_buf, len);
    gpulmt_status st;
    CHECK(complete(h, &req, &st));
    if (st.count != len || st.source != h->peer)
        fail("send of %zu bytes: status source=%d count=%zu", len, st.source, st.count);
}

/* The host's matching: waits for the peer's RTS, which must announce `len` bytes. */
static void wait_rts(struct host *h, size_t len) {
    while (!h->have_rts) {
        if (h->closed)
            fail("the peer left before sending its RTS");
        pump(h);
    }
    h->have_rts = 0;
    if (h->rts_msg_len != len)
        fail("RTS announces %llu bytes, expected %zu", (unsigned long long)h->rts_msg_len, len);
}

static void receive_message(struct host *h, unsigned char *dev, unsigned char *host_buf, size_t len) {
    wait_rts(h, len);
    gpulmt_request req;
    unsigned char cts[GPULMT_COOKIE_MAX];
    size_t cts_len = sizeof cts;
    CHECK(gpulmt_lmt_start_recv(h->ctx, h->peer, h->rts_cookie, h->rts_cookie_len, dev + OFFSET, len, &req, cts,
                                &cts_len));
    if (h->rings && cts_len > 0)
        fail("gpulmt_lmt_start_recv returned a CTS cookie although gpulmt's rings carry the CTS");
    if (cts_len > 0 && send_frame(h->fd, MSG_CTS, 0, cts, cts_len) != 0)
        fail("sending the CTS: %s", strerror(errno));
    gpulmt_status st;
    CHECK(complete(h, &req, &st));
    if (st.count != len || st.source != h->peer)
        fail("receive of %zu bytes: status source=%d count=%zu", len, st.source, st.count);
    memset(host_buf, 0, len);
    CHECK(gpulmt_copy(h->ctx, host_buf, dev + OFFSET, len));
    for (size_t i = 0; i < len; i++)
        if (host_buf[i] != pattern(i, len, h->peer))
            fail("received %zu bytes: byte %zu is %u, expected %u", len, i, host_buf[i], pattern(i, len, h->peer));
}

/* --peer-dies: rank 1 leaves as soon as the RTS arrives, without starting the receive
 * or saying goodbye; rank 0's send must fail with GPULMT_ERR_PEER_FAILED (its host
 * sees the channel close and declares the peer terminated, or gpulmt's own liveness
 * check notices first). */
static void peer_dies(struct host *h, unsigned char *dev, unsigned char *host_buf) {
    size_t len = SIZES[0];
    if (h->rank == 1) {
        wait_rts(h, len);
        return;
    }
    gpulmt_request req = start_send(h, dev, host_buf, len);
    gpulmt_status st;
    int rc = complete(h, &req, &st);
    if (rc != GPULMT_ERR_PEER_FAILED || st.error != GPULMT_ERR_PEER_FAILED)
        fail("the send to a departed peer ended with %s (%d), status error %d: %s", gpulmt_strerror(rc), rc,
             st.error, gpulmt_last_error());
}

/* Moves every size both ways, then the host's shutdown handshake. */
static void exchange(struct host *h, unsigned char *dev, unsigned char *host_buf) {
    /* Message i goes from rank i % 2 to the other: both ranks send and receive. */
    for (size_t i = 0; i < 2 * NSIZES; i++) {
        size_t len = SIZES[i / 2];
        if ((int)(i % 2) == h->rank)
            send_message(h, dev, host_buf, len);
        else
            receive_message(h, dev, host_buf, len);
    }

    gpulmt_stats s;
    CHECK(gpulmt_get_stats(h->ctx, &s));
    say("rank=%d protocols get=%llu put=%llu coop=%llu shm=%llu self=%llu\n", h->rank,
        (unsigned long long)s.protocols[GPULMT_PROTOCOL_GET], (unsigned long long)s.protocols[GPULMT_PROTOCOL_PUT],
        (unsigned long long)s.protocols[GPULMT_PROTOCOL_COOP], (unsigned long long)s.protocols[GPULMT_PROTOCOL_SHM],
        (unsigned long long)s.protocols[GPULMT_PROTOCOL_SELF]);

    /* Once both said bye, no transfer is in flight on either rank and finalizing (local
     * for a plugin context) is safe. */
    if (send_frame(h->fd, MSG_BYE, 0, NULL, 0) != 0)
        fail("sending bye: %s", strerror(errno));
    while (!h->peer_bye) {
        if (h->closed)
            fail("the peer left without saying bye");
        pump(h);
    }
}

static void run_rank(int fd, int rank, const char *job, const char *name, int scenario_peer_dies) {
    g_rank = rank;
    alarm(RUN_SECONDS);
    say("rank=%d pid=%ld\n", rank, (long)getpid());
    struct host h;
    memset(&h, 0, sizeof h);
    h.fd = fd;
    h.rank = rank;
    h.peer = 1 - rank;
    const char *rings = getenv("GPULMT_HOST_RINGS");
    h.rings = rings && strcmp(rings, "1") == 0;
    gpulmt_plugin_ops ops = {&h, h.rings ? NULL : send_blob};
    CHECK(gpulmt_plugin_init(&ops, job, rank, 2, &h.ctx));
    g_ctx = h.ctx;

    size_t max = 0;
    for (size_t i = 0; i < NSIZES; i++)
        max = SIZES[i] > max ? SIZES[i] : max;
    void *dev;
    CHECK(gpulmt_mem_alloc(h.ctx, max + OFFSET, &dev));
    unsigned char *host_buf = malloc(max);
    if (!host_buf)
        fail("out of memory");

    if (scenario_peer_dies)
        peer_dies(&h, dev, host_buf);
    else
        exchange(&h, dev, host_buf);
    g_ctx = NULL;
    CHECK(gpulmt_finalize(h.ctx));
    free(host_buf);
    say("rank=%d ok host %s\n", rank, name);
}

/* One run: forks both ranks and waits for them; returns 0 if both succeeded. */
static int run(const char *job, const char *name, int scenario_peer_dies) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    /* Flushed before forking: children must not inherit buffered output. */
    say("job=%s\nsizes=", job);
    for (size_t i = 0; i < NSIZES; i++)
        say(i ? ",%zu" : "%zu", SIZES[i]);
    say("\n");
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        close(sv[0]);
        run_rank(sv[1], 1, job, name, scenario_peer_dies);
        exit(0);
    }
    close(sv[1]);
    int status = 0;
    pid_t rank0 = fork();
    if (rank0 == 0) {
        run_rank(sv[0], 0, job, name, scenario_peer_dies);
        exit(0);
    }
    close(sv[0]);
    int ok = rank0 > 0;
    for (int i = 0; i < 2; i++) {
        pid_t p = wait(&status);
        if (p < 0)
            break;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "FAIL host: rank %d (pid %ld) %s %d\n", p == child ? 1 : 0, (long)p,
                    WIFEXITED(status) ? "exited with" : "was killed by signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            ok = 0;
        }
    }
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    /* A write to a departed peer must fail with EPIPE (send_blob then reports the
     * broken channel to gpulmt), not kill the process. */
    signal(SIGPIPE, SIG_IGN);
    int major, minor, patch;
    CHECK(gpulmt_version(&major, &minor, &patch));
    if (major != GPULMT_VERSION_MAJOR || minor != GPULMT_VERSION_MINOR)
        fail("library %d.%d.%d does not match header %d.%d.%d", major, minor, patch, GPULMT_VERSION_MAJOR,
             GPULMT_VERSION_MINOR, GPULMT_VERSION_PATCH);
    char job[64];
    snprintf(job, sizeof job, "host%ld", (long)getpid());
    if (argc == 2 && strcmp(argv[1], "--peer-dies") == 0)
        return run(job, "peer-dies", 1);
    if (argc < 2) {
        const char *p = getenv("GPULMT_PROTOCOL");
        return run(job, p && *p ? p : "auto", 0);
    }
    for (int i = 1; i < argc; i++) {
        if (setenv("GPULMT_PROTOCOL", argv[i], 1) != 0) {
            perror("setenv");
            return 1;
        }
        snprintf(job, sizeof job, "host%ld-%s", (long)getpid(), argv[i]);
        if (run(job, argv[i], 0) != 0)
            return 1;
    }
    return 0;
}
