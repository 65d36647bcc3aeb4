/*
 * The NCCL baseline plugin (libstagelink-nccl.so) by NCCL's rules, against
 * the fake NCCL (test/plugins/fake_nccl.c, FAKE_NCCL_COLLECTIVES=1) and the
 * fake GPU (test/plugins/fake_gpu.h), whose streams run on threads: the
 * plugin's source is built into this program with the fake GPU as its
 * runtime.  Two stages of t = 1 (stagelink_run -n 2), no context current
 * at comm_init, STAGELINK_TIMEOUT=30:
 *   transfer     a tensor crosses whole, and each rank's communicator
 *                took its LOCAL_RANK's GPU (rank 1: device 1), not 0;
 *   deadline     NCCL's init never completes (FAKE_NCCL_INIT=hang, and
 *                STAGELINK_TIMEOUT=5): comm_init fails with TIMEOUT
 *                naming the init, within 15 s, instead of hanging;
 *   abort        stage 1 receives from a sender that never sends, and
 *                another thread calls comm_abort: the wait returns ABORTED
 *                and the receive's stream runs on (NCCL's abort ended it);
 *   async-error  the boundary's first operation never ends and NCCL
 *                reports an asynchronous error: both transfers fail (in
 *                the post or the wait) with NCCL's sentence within 10 s
 *                (not STAGELINK_TIMEOUT's 30), and their streams run on.
 *
 *   nccl_faults transfer|deadline|abort|async-error
 * SPDX-License-Identifier: MIT
 */
#include "../unit/check.h"
#include "fake_gpu.h"
#include "host.h"
#include "pattern.h"

#include "nccl_plugin.c"

#define NBYTES ((size_t)256 << 10)

typedef struct job {
    const stagelink_plugin_v1_t *p;
    stagelink_comm_t            *comm;
    int                          stage;
    fstream_t                   *stream;
    char                        *buf;
} job_t;

static stagelink_request_t *post(job_t *j, uint32_t mb)
{
    stagelink_xfer_t     x = sl_host_xfer(j->stage == 0 ? STAGELINK_PEER_NEXT
                                                        : STAGELINK_PEER_PREV,
                                          j->buf, NBYTES, 4, mb, 0);
    stagelink_request_t *req = NULL;
    stagelink_status_t   st;

    x.mem_type = STAGELINK_MEM_CUDA;
    x.stream   = j->stream;
    if (j->stage == 0) {
        sl_pattern_fill(j->buf, 0, NBYTES, sl_pattern_seed(0, mb, 0, 0));
        st = j->p->isend(j->comm, &x, &req);
    } else {
        memset(j->buf, 0xee, NBYTES);
        st = j->p->irecv(j->comm, &x, &req);
    }
    CHECK(st == STAGELINK_SUCCESS, "stage %d: post of mb %u: %s: %s",
          j->stage, mb, stagelink_status_string(st), j->p->last_error(j->comm));
    return req;
}

/* The stream runs dry within a bound: nothing on it waits for a peer. */
static void stream_released(job_t *j, const char *after)
{
    double start = now_s();

    fstream_sync(j->stream);
    CHECK(now_s() - start < 10, "stage %d: the stream ran on only %.1f s "
          "after %s", j->stage, now_s() - start, after);
}

static void scenario_transfer(job_t *j)
{
    stagelink_request_t *req = post(j, 1);
    stagelink_status_t   st  = j->p->wait(j->comm, req);
    size_t               bad;

    CHECK(st == STAGELINK_SUCCESS, "stage %d: wait: %s: %s", j->stage,
          stagelink_status_string(st), j->p->last_error(j->comm));
    fstream_sync(j->stream);
    bad = sl_pattern_check(j->buf, 0, NBYTES, sl_pattern_seed(0, 1, 0, 0));
    CHECK(bad == SIZE_MAX, "stage %d: byte %zu of the tensor is wrong",
          j->stage, bad);
}

static void *abort_later(void *arg)
{
    job_t          *j  = arg;
    struct timespec ts = {0, 200000000};

    nanosleep(&ts, NULL);
    CHECK(j->p->comm_abort(j->comm) == STAGELINK_SUCCESS, "comm_abort");
    return NULL;
}

static void scenario_abort(job_t *j)
{
    stagelink_request_t *req;
    stagelink_status_t   st;
    pthread_t            t;

    if (j->stage == 0) {
        CHECK(j->p->comm_abort(j->comm) == STAGELINK_SUCCESS, "comm_abort");
        return; /* never sends */
    }
    req = post(j, 2);
    CHECK(pthread_create(&t, NULL, abort_later, j) == 0, "pthread_create");
    st = j->p->wait(j->comm, req);
    pthread_join(t, NULL);
    CHECK(st == STAGELINK_ERR_ABORTED, "stage 1: the receive of an aborted "
          "communicator: %s: %s", stagelink_status_string(st),
          j->p->last_error(j->comm));
    stream_released(j, "comm_abort");
}

static void scenario_async_error(job_t *j)
{
    stagelink_xfer_t     x = sl_host_xfer(j->stage == 0 ? STAGELINK_PEER_NEXT
                                                        : STAGELINK_PEER_PREV,
                                          j->buf, NBYTES, 4, 3, 0);
    stagelink_request_t *req = NULL;
    double               start = now_s();
    stagelink_status_t   st;

    /* The error may show as the post waits out NCCL's call, or after. */
    x.mem_type = STAGELINK_MEM_CUDA;
    x.stream   = j->stream;
    st = (j->stage == 0) ? j->p->isend(j->comm, &x, &req)
                         : j->p->irecv(j->comm, &x, &req);
    if (st == STAGELINK_SUCCESS) {
        st = j->p->wait(j->comm, req);
    }

    CHECK(st == STAGELINK_ERR_TRANSPORT &&
          strstr(j->p->last_error(j->comm), "remote process exited"),
          "stage %d: a transfer on a failed communicator: %s: %s", j->stage,
          stagelink_status_string(st), j->p->last_error(j->comm));
    CHECK(now_s() - start < 10, "stage %d: the failure took %.1f s to show",
          j->stage, now_s() - start);
    stream_released(j, "NCCL's asynchronous error");
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void      (*run)(job_t *j);
    } scenarios[] = {{"transfer", scenario_transfer}, {"deadline", NULL},
                     {"abort", scenario_abort},
                     {"async-error", scenario_async_error}};
    stagelink_config_t cfg = {.struct_size = sizeof(cfg), .tp_size = 1};
    stagelink_comm_info_t info;
    job_t              j;
    size_t             k;
    double             start;
    stagelink_status_t st;

    for (k = 0; argc == 2 && k < sizeof(scenarios) / sizeof(scenarios[0]) &&
                strcmp(argv[1], scenarios[k].name) != 0; ++k) {
    }
    if (argc != 2 || k == sizeof(scenarios) / sizeof(scenarios[0])) {
        fprintf(stderr, "usage: nccl_faults transfer|deadline|abort|async-error\n");
        return 2;
    }
    if (strcmp(argv[1], "deadline") == 0) {
        setenv("FAKE_NCCL_INIT", "hang", 1);
        setenv("STAGELINK_TIMEOUT", "5", 1);
    } else if (strcmp(argv[1], "async-error") == 0) {
        setenv("FAKE_NCCL_ASYNC_ERROR", "0", 1);
    }
    sl_nccl_runtime = &fake_gpu;
    f_arena         = aligned_alloc(4096, FAKE_GPU_ARENA);
    memset(&j, 0, sizeof(j));
    j.p   = &stagelink_plugin_v1;
    start = now_s();
    st    = j.p->comm_init(&cfg, &j.comm); /* no context current */
    if (scenarios[k].run == NULL) {
        CHECK(st == STAGELINK_ERR_TIMEOUT &&
              strstr(j.p->last_error(NULL), "ncclCommInitRankConfig"),
              "comm_init with NCCL's init in progress for ever: %s: %s",
              stagelink_status_string(st), j.p->last_error(NULL));
        CHECK(now_s() - start < 15, "comm_init returned after %.1f s, with "
              "STAGELINK_TIMEOUT=5", now_s() - start);
        free(f_arena);
        return check_summary();
    }
    CHECK(st == STAGELINK_SUCCESS, "comm_init: %s: %s",
          stagelink_status_string(st), j.p->last_error(NULL));
    if (st != STAGELINK_SUCCESS) {
        return check_summary();
    }
    j.p->comm_info(j.comm, &info);
    j.stage = info.pp_index;
    CHECK(j.comm->device == info.rank % FAKE_GPU_NDEV && f_ctx == NULL,
          "rank %d (LOCAL_RANK %s): the communicator works on device %d, and "
          "comm_init left %s current", info.rank, getenv("LOCAL_RANK"),
          j.comm->device, f_ctx ? "a context" : "none");
    /* The host's stream and tensor on the communicator's device. */
    f_use(j.comm->device);
    f_stream_create((void **)&j.stream, NULL);
    j.buf = f_arena + (size_t)j.comm->device * FAKE_GPU_SPAN;
    scenarios[k].run(&j);
    printf("rank %d: %s: done\n", info.rank, argv[1]);
    j.p->comm_finalize(j.comm);
    f_stream_destroy(j.stream);
    CHECK(atomic_load(&f_wrong) == 0, "rank %d: %d GPU calls without the "
          "communicator's context (the first is said above)", info.rank,
          atomic_load(&f_wrong));
    free(f_arena);
    return check_summary();
}
