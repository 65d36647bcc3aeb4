/*
 * Bad input through the public API: every case must give its specific
 * status and a sentence, never a crash or hang.  Run on p = 2 stages with
 * any t (stagelink_run -n 2t).  Prints one row per case.
 * SPDX-License-Identifier: MIT
 */
#include "../unit/check.h"
#include "host.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const stagelink_plugin_v1_t *P;
static stagelink_comm_t            *C;

static void expect(stagelink_status_t got, stagelink_status_t want,
                   const char *what)
{
    const char *msg = (got == STAGELINK_SUCCESS) ? "" : P->last_error(C);

    CHECK(got == want && (want == STAGELINK_SUCCESS || strlen(msg) > 10),
          "%s: got %s, want %s (%s)", what, stagelink_status_string(got),
          stagelink_status_string(want), msg);
    if (getenv("RANK") != NULL && atoi(getenv("RANK")) == 0) {
        printf("| %-44s | %-30s | %s\n", what, stagelink_status_string(got),
               msg);
    }
}

static stagelink_status_t init_with(stagelink_config_t *cfg)
{
    stagelink_comm_t  *comm = NULL;
    stagelink_status_t st   = P->comm_init(cfg, &comm);

    if (st == STAGELINK_SUCCESS) {
        P->comm_finalize(comm);
    }
    return st;
}

static stagelink_status_t init_env(const char *name, const char *value,
                                   int tp)
{
    stagelink_config_t cfg;
    stagelink_status_t st;
    const char        *old = getenv(name);
    char               saved[256];

    snprintf(saved, sizeof(saved), "%s", old ? old : "");
    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size = sizeof(cfg);
    cfg.tp_size     = tp;
    setenv(name, value, 1);
    st = init_with(&cfg);
    if (old != NULL) {
        setenv(name, saved, 1);
    } else {
        unsetenv(name);
    }
    return st;
}

/*
 * Large tensors whose sizes disagree (at t = 2 their shards go in chunks:
 * framed against framed, plain against framed, framed against plain, and
 * with STAGELINK_CHUNK=auto framed against framed in chunks of another
 * size: 640 KiB against 384 KiB); each is followed by a right-sized
 * transfer with the same tag, which must arrive intact: nothing of the
 * mismatch may be left on the wire.
 */
static void chunked_mismatch_cases(int stage)
{
    static const size_t sender[]   = {5 << 20, 3 << 20, 2 << 20, 20 << 20};
    static const size_t receiver[] = {3 << 20, 2 << 20, 3 << 20, 12 << 20};
    static const char  *what[]     = {"chunked shards of 5 MiB into 3 MiB",
                                      "chunked 3 MiB into one-message 2 MiB",
                                      "one-message 2 MiB into chunked 3 MiB",
                                      "chunked 20 MiB into 12 MiB, other chunks"};
    stagelink_request_t *r;
    stagelink_xfer_t     x;
    unsigned char       *buf = malloc(20 << 20);
    size_t               i, j, n = 4 << 20; /* framed: chunks left over would match */
    stagelink_status_t   st;
    int                  intact;

    CHECK(buf != NULL, "cannot allocate 20 MiB");
    if (buf == NULL) {
        return;
    }

    for (i = 0; i < sizeof(sender) / sizeof(sender[0]); ++i) {
        uint32_t mb = 400 + (uint32_t)i;

        x = sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                         buf, stage == 0 ? sender[i] : receiver[i], 1, mb, 0);
        if (stage == 0) {
            memset(buf, 0x11, sender[i]);
            expect(P->isend(C, &x, &r), STAGELINK_SUCCESS, what[i]);
            /* The receiver reports the mismatch; this side must not hang
             * on chunks the receiver failed to drain. */
            st = P->wait(C, r);
            CHECK(st == STAGELINK_SUCCESS || st == STAGELINK_ERR_SIZE_MISMATCH,
                  "sender of '%s': %s (%s)", what[i],
                  stagelink_status_string(st), P->last_error(C));
        } else {
            expect(P->irecv(C, &x, &r), STAGELINK_SUCCESS, what[i]);
            expect(P->wait(C, r), STAGELINK_ERR_SIZE_MISMATCH, what[i]);
        }
        /* Same tag again, same size on both sides: must arrive whole. */
        x.nbytes = n;
        if (stage == 0) {
            memset(buf, 0x5a, n);
            expect(P->isend(C, &x, &r), STAGELINK_SUCCESS, "the same tag after it");
            expect(P->wait(C, r), STAGELINK_SUCCESS, "the same tag after it");
        } else {
            memset(buf, 0, n);
            expect(P->irecv(C, &x, &r), STAGELINK_SUCCESS, "the same tag after it");
            expect(P->wait(C, r), STAGELINK_SUCCESS, "the same tag after it");
            for (j = 0, intact = 1; j < n; ++j) {
                intact &= (buf[j] == 0x5a);
            }
            CHECK(intact, "after '%s' the next transfer with the same tag "
                  "arrived wrong", what[i]);
        }
    }
    free(buf);
}

/* Collective steps need both stages: a barrier-free sequence where each
 * stage only waits on what the other stage posts in the same step. */
static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* wait_for: a slice that ends first leaves the request in flight with
 * IN_PROGRESS, after sleeping that long; the data still arrives.  Stage 0
 * sends only once stage 1 has seen its slices end. */
static void wait_for_cases(int stage, char *buf)
{
    stagelink_request_t *r = NULL, *go = NULL;
    stagelink_xfer_t     x, m;
    stagelink_status_t   st = STAGELINK_IN_PROGRESS;
    double               t0;
    int                  slices;

    if (stage == 1) {
        x = sl_host_xfer(STAGELINK_PEER_PREV, buf, 256, 1, 400, 0);
        m = sl_host_xfer(STAGELINK_PEER_PREV, buf + 512, 1, 1, 401, 0);
        expect(P->irecv(C, &x, &r), STAGELINK_SUCCESS, "receive for wait_for");
        expect(P->wait_for(C, r, 0), STAGELINK_IN_PROGRESS,
               "wait_for 0 ms before the send");
        t0 = now();
        expect(P->wait_for(C, r, 30), STAGELINK_IN_PROGRESS,
               "wait_for 30 ms before the send");
        CHECK(now() - t0 >= 0.025 && now() - t0 < 5,
              "a 30 ms slice of wait_for took %.3f s", now() - t0);
        expect(P->isend(C, &m, &go), STAGELINK_SUCCESS, "tell the sender");
        for (slices = 0; slices < 100000 && st == STAGELINK_IN_PROGRESS;
             ++slices) {
            st = P->wait_for(C, r, 20);
        }
        expect(st, STAGELINK_SUCCESS, "wait_for until the data arrives");
        expect(P->wait_for(C, r, 20), STAGELINK_ERR_INVALID_ARG,
               "wait_for on a completed request");
        expect(P->wait(C, go), STAGELINK_SUCCESS, "the go-ahead was sent");
    } else {
        x = sl_host_xfer(STAGELINK_PEER_NEXT, buf, 256, 1, 400, 0);
        m = sl_host_xfer(STAGELINK_PEER_NEXT, buf + 512, 1, 1, 401, 0);
        expect(P->irecv(C, &m, &go), STAGELINK_SUCCESS, "receive the go-ahead");
        expect(P->wait(C, go), STAGELINK_SUCCESS, "the go-ahead arrived");
        expect(P->isend(C, &x, &r), STAGELINK_SUCCESS, "send for wait_for");
        expect(P->wait(C, r), STAGELINK_SUCCESS, "send for wait_for completes");
    }
}

/* Every rank past comm_init before this one aborts: an aborted
 * communicator skips finalize's barrier, so a peer still creating its
 * endpoint to this rank's worker would find it gone (UCX's shared memory:
 * "shmat ... Invalid argument").  A boundary transfer each way proves that
 * every rank of both stages got there. */
static void settle_peers(int stage, char *buf)
{
    stagelink_request_t *r = NULL;
    stagelink_xfer_t     x;
    int                  dir;

    for (dir = 0; dir < 2; ++dir) { /* forward, then backward */
        int sending = (stage == dir);

        x = sl_host_xfer((stage == 0) ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                         buf, 64, 1, 900 + dir, 0);
        expect(sending ? P->isend(C, &x, &r) : P->irecv(C, &x, &r),
               STAGELINK_SUCCESS, "post of the transfer before the abort");
        expect(P->wait(C, r), STAGELINK_SUCCESS,
               "the transfer before the abort completes");
    }
}

static void cross_stage_cases(int stage, char *buf)
{
    stagelink_request_t *r1 = NULL, *r2 = NULL;
    stagelink_xfer_t     x;
    stagelink_status_t   st;


    if (stage == 1) {
        x = sl_host_xfer(STAGELINK_PEER_PREV, buf, 64, 1, 100, 0);
        expect(P->irecv(C, &x, &r1), STAGELINK_SUCCESS, "first receive of mb 100");
        expect(P->irecv(C, &x, &r2), STAGELINK_ERR_TAG_IN_USE,
               "same tag again while in flight");
        expect(P->wait(C, r1), STAGELINK_SUCCESS, "the first one completes");

        x = sl_host_xfer(STAGELINK_PEER_PREV, buf, 64, 1, 200, 0);
        expect(P->irecv(C, &x, &r1), STAGELINK_SUCCESS, "receive 64 B (mb 200)");
        expect(P->wait(C, r1), STAGELINK_ERR_SIZE_MISMATCH,
               "sender sent 128 B into 64 B");
        x = sl_host_xfer(STAGELINK_PEER_PREV, buf, 128, 1, 201, 0);
        expect(P->irecv(C, &x, &r1), STAGELINK_SUCCESS, "receive 128 B (mb 201)");
        expect(P->wait(C, r1), STAGELINK_ERR_SIZE_MISMATCH,
               "sender sent 64 B into 128 B");

        x = sl_host_xfer(STAGELINK_PEER_PREV, buf, 64, 1, 300, 0);
        expect(P->irecv(C, &x, &r1), STAGELINK_SUCCESS, "receive to cancel");
        expect(P->cancel(C, r1), STAGELINK_SUCCESS, "cancel it");
        st = P->wait(C, r1);
        /* A TP peer's cancel may reach us first, as its missing shard. */
        expect((st == STAGELINK_ERR_TRANSPORT) ? STAGELINK_ERR_CANCELED : st,
               STAGELINK_ERR_CANCELED, "wait on the canceled receive");
        expect(P->wait(C, r1), STAGELINK_ERR_INVALID_ARG,
               "wait on a completed request");
        wait_for_cases(stage, buf);
    } else {
        x = sl_host_xfer(STAGELINK_PEER_NEXT, buf, 64, 1, 100, 0);
        expect(P->isend(C, &x, &r1), STAGELINK_SUCCESS, "send mb 100");
        expect(P->wait(C, r1), STAGELINK_SUCCESS, "send mb 100 completes");
        x = sl_host_xfer(STAGELINK_PEER_NEXT, buf, 128, 1, 200, 0);
        expect(P->isend(C, &x, &r1), STAGELINK_SUCCESS, "send 128 B (mb 200)");
        P->wait(C, r1); /* truncation is the receiver's to report */
        x = sl_host_xfer(STAGELINK_PEER_NEXT, buf, 64, 1, 201, 0);
        expect(P->isend(C, &x, &r1), STAGELINK_SUCCESS, "send 64 B (mb 201)");
        P->wait(C, r1);
        wait_for_cases(stage, buf);
    }
}

/* Transfer descriptors, each wrong in one field, sent to a real neighbour
 * so that each fails for its own reason. */
typedef struct xfer_case {
    const char          *what;
    int                  peer;      /* 1: peer value 5 */
    int                  null_buf;
    size_t               nbytes, elem_size;
    uint16_t             chunk;
    uint8_t              reserved;
    int                  against_peer; /* direction contradicting the peer */
    stagelink_mem_type_t mem_type;
    stagelink_status_t   want;
} xfer_case_t;

static const xfer_case_t xfer_cases[] = {
    {"NULL buffer, 8 bytes", 0, 1, 8, 1, 0, 0, 0, STAGELINK_MEM_HOST,
     STAGELINK_ERR_INVALID_ARG},
    {"7 bytes of 2-byte elements", 0, 0, 7, 2, 0, 0, 0, STAGELINK_MEM_HOST,
     STAGELINK_ERR_INVALID_ARG},
    {"element size larger than the tensor", 0, 0, 8, 16, 0, 0, 0,
     STAGELINK_MEM_HOST, STAGELINK_ERR_INVALID_ARG},
    {"peer 5", 1, 0, 8, 1, 0, 0, 0, STAGELINK_MEM_HOST,
     STAGELINK_ERR_INVALID_ARG},
    {"chunk 2048", 0, 0, 8, 1, STAGELINK_TAG_MAX_CHUNK + 1, 0, 0,
     STAGELINK_MEM_HOST, STAGELINK_ERR_INVALID_ARG},
    {"reserved tag field", 0, 0, 8, 1, 0, 1, 0, STAGELINK_MEM_HOST,
     STAGELINK_ERR_INVALID_ARG},
    {"direction contradicting the peer", 0, 0, 8, 1, 0, 0, 1,
     STAGELINK_MEM_HOST, STAGELINK_ERR_INVALID_ARG},
    {"CUDA memory in a host-only build", 0, 0, 8, 1, 0, 0, 0,
     STAGELINK_MEM_CUDA, STAGELINK_ERR_UNSUPPORTED},
    {"memory type 42", 0, 0, 8, 1, 0, 0, 0, (stagelink_mem_type_t)42,
     STAGELINK_ERR_INVALID_ARG},
};

/* Each variable with a value comm_init must refuse, and the status. */
static const struct {
    const char        *name, *value;
    stagelink_status_t want;
} env_cases[] = {
    {"STAGELINK_MODE", "fastest", STAGELINK_ERR_CONFIG},
    {"STAGELINK_GATHER", "mpi", STAGELINK_ERR_CONFIG},
    {"STAGELINK_GATHER", "nccl", STAGELINK_ERR_UNSUPPORTED},
    {"STAGELINK_TIMEOUT", "soon", STAGELINK_ERR_CONFIG},
    {"STAGELINK_SPIN_US", "-1", STAGELINK_ERR_CONFIG},
    {"STAGELINK_MAX_REQUESTS", "0", STAGELINK_ERR_CONFIG},
    {"STAGELINK_NODE_ID", "a-node-name-longer-than-sixty-three-characters-is-"
                          "refused-by-stagelink", STAGELINK_ERR_CONFIG},
    {"STAGELINK_DEBUG", "LOUD", STAGELINK_ERR_CONFIG},
    {"STAGELINK_DEBUG_SUBSYS", "INIT,DISK", STAGELINK_ERR_CONFIG},
    {"STAGELINK_BOOTSTRAP_PORT", "0", STAGELINK_ERR_CONFIG},
    {"STAGELINK_BOOTSTRAP_ADDR", "no-such-host.invalid", STAGELINK_ERR_BOOTSTRAP},
    {"MASTER_PORT", "http", STAGELINK_ERR_CONFIG},
    {"WORLD_SIZE", "zero", STAGELINK_ERR_CONFIG},
    {"LOCAL_RANK", "-1", STAGELINK_ERR_CONFIG},
    {"STAGELINK_GPU_DIRECT", "sometimes", STAGELINK_ERR_CONFIG},
    {"STAGELINK_GPU_DIRECT", "require", STAGELINK_ERR_CONFIG}, /* no GPU */
    {"STAGELINK_NIC_MIN_GBPS", "fast", STAGELINK_ERR_CONFIG},
};

/* What every phase sees: the working communicator is the global C. */
typedef struct {
    stagelink_config_t cfg;
    int                tp, stage;
    stagelink_peer_t   peer; /* a neighbour: each case fails for its own reason */
    char              *buf;
} phase_ctx_t;

/* Init-time refusals: each rank fails before the rendezvous. */
static void init_phase(phase_ctx_t *c)
{
    stagelink_config_t cfg;
    size_t             i;

    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size = offsetof(stagelink_config_t, flags);
    expect(init_with(&cfg), STAGELINK_ERR_ABI,
           "config shorter than the original v1");
    expect(P->comm_init(NULL, &C), STAGELINK_ERR_INVALID_ARG, "NULL config");
    cfg      = c->cfg;
    cfg.mode = (stagelink_mode_t)99;
    expect(init_with(&cfg), STAGELINK_ERR_INVALID_ARG, "config mode 99");
    cfg         = c->cfg;
    cfg.tp_size = 3 * c->tp;
    expect(init_with(&cfg), STAGELINK_ERR_INVALID_ARG,
           "tp_size not dividing the world");
    for (i = 0; i < sizeof(env_cases) / sizeof(env_cases[0]); ++i) {
        char what[96];

        snprintf(what, sizeof(what), "%s=%.40s", env_cases[i].name,
                 env_cases[i].value);
        expect(init_env(env_cases[i].name, env_cases[i].value, c->tp),
               env_cases[i].want, what);
    }
}

static void descriptor_phase(phase_ctx_t *c)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    size_t               i;

    expect(P->isend(C, NULL, &req), STAGELINK_ERR_INVALID_ARG, "NULL transfer");
    for (i = 0; i < sizeof(xfer_cases) / sizeof(xfer_cases[0]); ++i) {
        const xfer_case_t *xc = &xfer_cases[i];

        x = sl_host_xfer(xc->peer == 1 ? (stagelink_peer_t)5 : c->peer,
                         xc->null_buf ? NULL : c->buf, xc->nbytes, 1, 1, 0);
        x.elem_size     = xc->elem_size;
        x.tag.chunk     = xc->chunk;
        x.tag.reserved  = xc->reserved;
        x.tag.direction = (uint8_t)(xc->against_peer
                                        ? ((c->stage == 0) ? STAGELINK_DIR_BACKWARD
                                                           : STAGELINK_DIR_FORWARD)
                                        : STAGELINK_DIR_AUTO);
        x.mem_type      = xc->mem_type;
        expect(P->isend(C, &x, &req), xc->want, xc->what);
    }
    x = sl_host_xfer(c->peer, c->buf, 8, 1, 1, 0);
    expect(P->isend(C, &x, NULL), STAGELINK_ERR_INVALID_ARG, "NULL request pointer");
    x = sl_host_xfer(c->stage == 0 ? STAGELINK_PEER_PREV : STAGELINK_PEER_NEXT,
                     c->buf, 8, 1, 1, 0);
    expect(c->stage == 0 ? P->irecv(C, &x, &req) : P->isend(C, &x, &req),
           STAGELINK_ERR_NO_PEER,
           c->stage == 0 ? "receive from before the first stage"
                         : "send forward from the last stage");
}

/* NULL and foreign pointers to the calls that only look. */
static void query_phase(phase_ctx_t *c)
{
    int done, failed = 0;

    expect(P->test(C, (stagelink_request_t *)c->buf, &done),
           STAGELINK_ERR_INVALID_ARG, "test on a foreign pointer");
    expect(P->test(C, NULL, NULL), STAGELINK_ERR_INVALID_ARG, "test with NULL done");
    expect(P->wait(C, NULL), STAGELINK_ERR_INVALID_ARG, "wait on NULL request");
    expect(P->get_counters(C, NULL), STAGELINK_ERR_INVALID_ARG, "NULL counters");
    expect(P->comm_info(C, NULL), STAGELINK_ERR_INVALID_ARG, "NULL info");
    expect(P->comm_get_error(C, NULL), STAGELINK_ERR_INVALID_ARG,
           "comm_get_error with NULL rank");
    expect(P->comm_get_error(C, &failed), STAGELINK_SUCCESS,
           "comm_get_error of a healthy communicator");
    CHECK(failed == -1, "healthy communicator names failed rank %d", failed);
}

static void registration_phase(phase_ctx_t *c)
{
    stagelink_memh_t    *memh = NULL;
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    stagelink_status_t   st;

    expect(P->mem_register(C, NULL, 8, STAGELINK_MEM_HOST, &memh),
           STAGELINK_ERR_INVALID_ARG, "register a NULL buffer");
    expect(P->mem_register(C, c->buf, 64, STAGELINK_MEM_HOST, &memh),
           STAGELINK_SUCCESS, "register 64 bytes");
    /* Nobody sends it: in flight until canceled. */
    x      = sl_host_xfer(c->peer, c->buf, 64, 1, 777, 0);
    x.memh = memh;
    expect(P->irecv(C, &x, &req), STAGELINK_SUCCESS,
           "receive posted with the registration");
    expect(P->mem_deregister(C, memh), STAGELINK_ERR_INVALID_STATE,
           "deregister while a receive uses it");
    expect(P->cancel(C, req), STAGELINK_SUCCESS, "cancel that receive");
    st = P->wait(C, req);
    /* A TP peer's cancel may reach us first, as its missing shard. */
    expect((st == STAGELINK_ERR_TRANSPORT) ? STAGELINK_ERR_CANCELED : st,
           STAGELINK_ERR_CANCELED, "wait on the canceled receive");
    x      = sl_host_xfer(c->peer, c->buf, 128, 1, 1, 0);
    x.memh = memh;
    expect(P->isend(C, &x, &req), STAGELINK_ERR_INVALID_ARG,
           "128 bytes under a 64-byte registration");
    expect(P->mem_deregister(C, memh), STAGELINK_SUCCESS, "deregister");
    /* The handle's memory is gone: it must be refused without being read
     * (the sanitizer pass reports a read of freed memory). */
    x.nbytes = 64;
    expect(P->isend(C, &x, &req), STAGELINK_ERR_INVALID_ARG,
           "send with a deregistered handle");
    expect(P->mem_deregister(C, memh), STAGELINK_ERR_INVALID_ARG,
           "deregister twice");
}

/* Two sends backward with one tag; only the last stage may send back. */
static void batch_ops(stagelink_op_t ops[2], char *buf)
{
    memset(ops, 0, 2 * sizeof(*ops));
    ops[0].kind = ops[1].kind = STAGELINK_OP_SEND;
    ops[0].xfer = ops[1].xfer = sl_host_xfer(STAGELINK_PEER_PREV, buf, 8, 1, 5, 0);
}

/* Stage 0 posts `count` 8-byte sends forward, which must be refused
 * whole (`want`), then sends 16 bytes with the first one's tag; stage 1
 * must receive those 16 bytes: a send of the refused batch left on the
 * wire would arrive first, with 8. */
static void refused_batch_case(phase_ctx_t *c, uint32_t mb, size_t count,
                               stagelink_status_t want, const char *what)
{
    stagelink_op_t       ops[4];
    stagelink_request_t *reqs[4], *r = NULL;
    stagelink_xfer_t     x;
    char                *data = c->buf + 2048;
    size_t               i;

    if (c->stage == 0) {
        memset(ops, 0, sizeof(ops));
        for (i = 0; i < count; ++i) {
            ops[i].kind = STAGELINK_OP_SEND;
            ops[i].xfer = sl_host_xfer(STAGELINK_PEER_NEXT, c->buf, 8, 1,
                                       mb + (uint32_t)i, 0);
        }
        expect(P->post_batch(C, ops, count, reqs), want, what);
        for (i = 0; i < 16; ++i) {
            data[i] = (char)(mb + i);
        }
        x = sl_host_xfer(STAGELINK_PEER_NEXT, data, 16, 1, mb, 0);
        expect(P->isend(C, &x, &r), STAGELINK_SUCCESS,
               "a send after the refused batch");
        expect(P->wait(C, r), STAGELINK_SUCCESS, "it completes");
    } else {
        memset(data, 0, 16);
        x = sl_host_xfer(STAGELINK_PEER_PREV, data, 16, 1, mb, 0);
        expect(P->irecv(C, &x, &r), STAGELINK_SUCCESS,
               "the receive after a refused batch");
        expect(P->wait(C, r), STAGELINK_SUCCESS,
               "it gets the send after the batch, none of the batch");
        for (i = 0; i < 16 && data[i] == (char)(mb + i); ++i) {
        }
        CHECK(i == 16, "%s: byte %zu of the send after it is wrong", what, i);
    }
}

static void batch_phase(phase_ctx_t *c)
{
    stagelink_op_t       ops[2];
    stagelink_request_t *reqs[2], *held = NULL;
    stagelink_xfer_t     x;

    batch_ops(ops, c->buf);
    if (c->stage == 1) {
        expect(P->post_batch(C, ops, 2, reqs), STAGELINK_ERR_TAG_IN_USE,
               "batch with one tag twice");
    }
    expect(P->post_batch(C, NULL, 2, reqs), STAGELINK_ERR_INVALID_ARG,
           "batch of 2 with NULL ops");
    /* The second send's tag is a transfer's not yet waited for. */
    x = sl_host_xfer(c->peer, c->buf + 1024, 64, 1, 611, 0);
    expect(c->stage == 0 ? P->isend(C, &x, &held) : P->irecv(C, &x, &held),
           STAGELINK_SUCCESS, "a transfer of mb 611 left in flight");
    refused_batch_case(c, 610, 2, STAGELINK_ERR_TAG_IN_USE,
                       "batch whose second tag is in flight");
    expect(P->wait(C, held), STAGELINK_SUCCESS, "the transfer of mb 611");
}

/* A pool of two requests: a batch of three posts none of them. */
static void small_pool_phase(phase_ctx_t *c)
{
    setenv("STAGELINK_MAX_REQUESTS", "2", 1);
    if (P->comm_init(&c->cfg, &C) != STAGELINK_SUCCESS) {
        CHECK(0, "init with STAGELINK_MAX_REQUESTS=2: %s", P->last_error(NULL));
        unsetenv("STAGELINK_MAX_REQUESTS");
        return;
    }
    unsetenv("STAGELINK_MAX_REQUESTS");
    refused_batch_case(c, 620, 3, STAGELINK_ERR_NO_MEMORY,
                       "batch of 3 with room for 2");
    expect(P->comm_finalize(C), STAGELINK_SUCCESS, "finalize the small pool");
    C = NULL;
}

/* A forked child: every call on the parent's communicator is refused,
 * saying why, finalize too; the parent's goes on, a transfer each way.
 * The child's verdict comes through a pipe and it ends by SIGKILL: no exit
 * handler or valgrind's leak check runs on what the parent's threads held. */
static void fork_phase(phase_ctx_t *c)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    int                  status = -1, before = check_failed, fds[2];
    char                 verdict = 0;
    pid_t                pid;

    fflush(stdout);
    if (pipe(fds) != 0) {
        CHECK(0, "pipe for the forked child failed");
        return;
    }
    pid = fork();
    if (pid == 0) {
        x = sl_host_xfer(c->peer, c->buf, 8, 1, 1, 0);
        expect(P->isend(C, &x, &req), STAGELINK_ERR_INVALID_STATE,
               "send in a forked child");
        CHECK(strstr(P->last_error(C), "forked") != NULL,
              "the child's refusal does not say it forked: %s",
              P->last_error(C));
        expect(P->comm_finalize(C), STAGELINK_ERR_INVALID_STATE,
               "finalize in a forked child");
        fflush(stdout);
        verdict = (check_failed == before) ? 'y' : 'n';
        if (write(fds[1], &verdict, 1) != 1) {
            verdict = 0;
        }
        kill(getpid(), SIGKILL);
    }
    close(fds[1]);
    CHECK(pid > 0 && read(fds[0], &verdict, 1) == 1 && verdict == 'y',
          "the forked child (pid %d) said %d: its checks failed (above) or "
          "it died before them", (int)pid, verdict);
    close(fds[0]);
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFSIGNALED(status),
          "the forked child (pid %d) ended with status %#x", (int)pid, status);
    settle_peers(c->stage, c->buf);
}

static void cross_stage_phase(phase_ctx_t *c)
{
    cross_stage_cases(c->stage, c->buf);
}

static void chunked_phase(phase_ctx_t *c)
{
    chunked_mismatch_cases(c->stage);
}

/* Ends the working communicator: everything after is refused. */
static void finalize_phase(phase_ctx_t *c)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x;

    expect(P->comm_finalize(C), STAGELINK_SUCCESS, "finalize");
    x = sl_host_xfer(c->peer, c->buf, 8, 1, 1, 0);
    expect(P->isend(C, &x, &req), STAGELINK_ERR_INVALID_STATE, "send after finalize");
    expect(P->comm_finalize(C), STAGELINK_ERR_INVALID_STATE, "finalize twice");
    C = NULL;
    expect(P->comm_finalize(NULL), STAGELINK_ERR_INVALID_STATE, "finalize NULL");
    expect(P->comm_abort(NULL), STAGELINK_ERR_INVALID_STATE, "abort NULL");
}

/* An aborted communicator refuses posts and still finalizes. */
static void abort_phase(phase_ctx_t *c)
{
    stagelink_op_t       ops[2];
    stagelink_request_t *req, *reqs[2];
    stagelink_xfer_t     x;

    if (P->comm_init(&c->cfg, &C) != STAGELINK_SUCCESS) {
        CHECK(0, "init for the abort cases: %s", P->last_error(NULL));
        return;
    }
    settle_peers(c->stage, c->buf);
    expect(P->comm_abort(C), STAGELINK_SUCCESS, "abort");
    x = sl_host_xfer(c->peer, c->buf, 8, 1, 1, 0);
    expect(P->isend(C, &x, &req), STAGELINK_ERR_ABORTED, "send after abort");
    batch_ops(ops, c->buf);
    expect(P->post_batch(C, ops, 1, reqs), STAGELINK_ERR_ABORTED,
           "batch after abort");
    expect(P->comm_finalize(C), STAGELINK_SUCCESS, "finalize after abort");
    expect(P->comm_abort(C), STAGELINK_ERR_INVALID_STATE, "abort after finalize");
}

/* In order: the phases from descriptors to finalize use one communicator. */
static const struct {
    const char *name;
    void (*run)(phase_ctx_t *c);
    int         on_comm; /* needs the working communicator */
} phases[] = {
    {"init refusals", init_phase, 0},
    {"transfer descriptors", descriptor_phase, 1},
    {"queries", query_phase, 1},
    {"registrations", registration_phase, 1},
    {"batches", batch_phase, 1},
    {"across stages", cross_stage_phase, 1},
    {"chunked size mismatches", chunked_phase, 1},
    {"a forked child", fork_phase, 1},
    {"after finalize", finalize_phase, 1},
    {"a small pool", small_pool_phase, 0},
    {"after abort", abort_phase, 0},
};

int main(void)
{
    stagelink_loader_t   *loader;
    stagelink_comm_info_t info;
    static char           buf[4096];
    phase_ctx_t           c = {.buf = buf};
    char                  err[2048];
    size_t                i;

    setenv("STAGELINK_DEBUG", "NONE", 1);
    c.tp = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "2") / 2;
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    P                 = stagelink_loader_plugin(loader);
    c.cfg.struct_size = sizeof(c.cfg);
    c.cfg.tp_size     = c.tp;
    for (i = 0; i < sizeof(phases) / sizeof(phases[0]); ++i) {
        if (phases[i].on_comm && C == NULL) {
            if (P->comm_init(&c.cfg, &C) != STAGELINK_SUCCESS) {
                fprintf(stderr, "init before \"%s\": %s\n", phases[i].name,
                        P->last_error(NULL));
                return 1;
            }
            P->comm_info(C, &info);
            c.stage = info.pp_index;
            c.peer  = (c.stage == 0) ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV;
        }
        phases[i].run(&c);
    }
    stagelink_loader_close(loader);
    return check_summary();
}
