/*
 * The NCCL gather issues collectives in the host's program order, whatever
 * order shards arrive in.  Two stages of t = 2 (stagelink_run -n 4), a
 * fake GPU whose streams run on threads of their own (they can be held)
 * and the fake NCCL (test/plugins/fake_nccl.c, FAKE_NCCL_COLLECTIVES=1),
 * which moves the data between processes and fails loudly (exit 86) when
 * ranks issue collectives in different orders.  Stage 1 receives, stage 0
 * sends; every gathered tensor is checked.
 *
 *   held     stage 1's TP rank 0 holds its stream while it posts two
 *            receives of different sizes; TP rank 1 lets the first start
 *            before it posts the second;
 *   skew     six rounds of two receives whose shards land in a different
 *            order on each TP rank (stage 0's TP ranks send in opposite
 *            orders, alternating), and on one TP rank, alternating, a
 *            20 ms kernel on the stream between the two posts;
 *   between  a host collective on a second NCCL communicator between the
 *            post and the wait, with TP rank 0's shard there before the
 *            post and TP rank 1's only after the host collective;
 *   consumer a slow collective (1 s, FAKE_NCCL_DELAY_MS), and a consumer
 *            on a second stream of the host's, queued as the wait returns:
 *            ordered by order_stream it reads the whole tensor; without,
 *            it runs before the gather (which shows the order is needed);
 *   refused  stage 1's NCCL refuses the collective its receive issues at
 *            the wait: the wait fails at once with that sentence, and the
 *            communicator with it (a TP peer may be in the collective);
 *   device   the communicator works on device 1 of a fake GPU of two (the
 *            config's, named while the host is on device 0),
 *            whose every call checks the current device: a tensor of
 *            device 0 is refused naming both, calls from a host thread on
 *            device 0 and from a thread without a context move device 1's
 *            tensors and leave the caller's device (or none) current;
 *   context  stage 1's host, in a context of its own on device 0, calls
 *            test while the progress thread sleeps: UCX progresses in
 *            that call with the communicator's context, never the
 *            caller's (every ucp_worker_progress is checked);
 *   nccl-init-timeout  NCCL's init never completes (FAKE_NCCL_INIT=hang):
 *            comm_init fails with TIMEOUT at STAGELINK_TIMEOUT;
 *   nccl-async-error   a gather's collective never ends and NCCL reports
 *            an asynchronous error: the host's stream runs on (the
 *            communicator aborted NCCL) and later posts fail with it;
 *   nccl-peer-death    a TP peer dies while the collective waits for it;
 *   nccl-abort         comm_abort while the collective waits for a peer:
 *            each time the host's stream is released;
 *   unwaited a TP rank never waits for a gathered receive (test, which
 *            issues nothing, leaves it not done): its peer's collective
 *            is ended at STAGELINK_TIMEOUT (5 s), the communicator failed
 *            and the stream released, and finalize tells the rank that
 *            never waited;
 *   host-group  stage 1's host waits inside its own ncclGroupStart/End:
 *            the gather's collective stays out of that group, so the
 *            tensor is whole before the host's ncclGroupEnd;
 *   random   drawn from SEED (stagelink_stress -G runs it): rounds of 2-6
 *            receives in flight of drawn sizes, posted in one order on
 *            both TP ranks (the header's rule) with a kernel or a held
 *            stream at a drawn point of each TP rank's posts; each sender
 *            completes in an order of its own (wait, or test polling),
 *            each receiver in the posts' order (test polling, which must
 *            complete none, then wait), and may go idle outside stagelink
 *            after a round; the seed also draws the one-queue GPU.
 *
 * With FAKE_GPU_ONE_QUEUE=1 every stream of a rank feeds one FIFO, as
 * CUDA_DEVICE_MAX_CONNECTIONS=1 makes a GPU's hardware queue: a stream
 * wait at its head holds back the copies queued behind it.  Every GPU call
 * must come from a thread whose current context is the communicator's.
 *
 *   gather_order FAKE_NCCL.so SCENARIO | random SEED
 * SPDX-License-Identifier: MIT
 */
#include "../plugins/fake_gpu.h"
#include "../unit/check.h"
#include "gather.h"
#include "host.h"
#include "pattern.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <ucp/api/ucp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ARENA    FAKE_GPU_ARENA
#define DEV_SPAN FAKE_GPU_SPAN
#define WAIT_S   FAKE_GPU_WAIT_S

/*
 * UCX's progress must run with the communicator's context: its callbacks
 * queue the staging copies, and its cuda_ipc transport copies with the
 * context current.  This definition stands in for libucp's (the plugin is
 * linked into this program) and checks the calling thread first.  Until
 * comm_init has a device, f_comm_device is -1 and any context passes.
 */
static int f_comm_device = -1;

unsigned ucp_worker_progress(ucp_worker_h worker)
{
    static unsigned (*real)(ucp_worker_h);

    if (real == NULL) {
        void *fn = dlsym(RTLD_NEXT, "ucp_worker_progress");

        CHECK(fn != NULL, "no libucp ucp_worker_progress: %s", dlerror());
        memcpy(&real, &fn, sizeof(fn));
    }
    if (f_comm_device >= 0 && f_dev() != f_comm_device &&
        atomic_fetch_add(&f_wrong, 1) == 0) {
        fprintf(stderr, "fake GPU: UCX progressed on a thread whose current "
                "device is %d, the communicator's is %d\n", f_dev(),
                f_comm_device);
    }
    return real(worker);
}

/* ---- the job ---- */

typedef struct job {
    sl_host_t  h;
    int        stage, tp_index;
    fstream_t *stream; /* the host's stream */
    char       dir[256];
    char      *next;   /* free f_arena */
    const char *nccl;  /* the fake NCCL's path */
    int        finalized; /* the scenario finalized the communicator */
} job_t;

static void *dev_alloc(job_t *j, size_t n)
{
    char *p = j->next;

    j->next += (n + 4095) & ~(size_t)4095;
    CHECK(j->next <= f_arena + ARENA, "the fake device f_arena is full");
    return p;
}

/* Marker files: a rank says where it is; another waits for it. */
static void say(const job_t *j, const char *what)
{
    char path[400];
    int  fd;

    snprintf(path, sizeof(path), "%s/%s", j->dir, what);
    fd = open(path, O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) {
        close(fd);
    }
}

static void await(const job_t *j, const char *what)
{
    char   path[400];
    double end = now_s() + WAIT_S;

    snprintf(path, sizeof(path), "%s/%s", j->dir, what);
    while (access(path, F_OK) != 0) {
        if (now_s() > end) {
            fprintf(stderr, "rank %d: no marker %s after %d s\n",
                    j->h.info.rank, what, WAIT_S);
            _exit(1);
        }
        nap();
    }
}

static stagelink_xfer_t xfer_of(const job_t *j, void *buf, size_t n, uint32_t mb)
{
    stagelink_xfer_t x = sl_host_xfer(j->stage == 0 ? STAGELINK_PEER_NEXT
                                                    : STAGELINK_PEER_PREV,
                                      buf, n, 4, mb, 0);

    x.mem_type = STAGELINK_MEM_CUDA;
    x.stream   = j->stream;
    return x;
}

static stagelink_request_t *post(job_t *j, void *buf, size_t n, uint32_t mb)
{
    stagelink_xfer_t     x = xfer_of(j, buf, n, mb);
    stagelink_request_t *req = NULL;
    stagelink_status_t   st;

    if (j->stage == 0) {
        sl_pattern_fill(buf, 0, n, sl_pattern_seed(0, mb, 0, 0));
        st = j->h.plugin->isend(j->h.comm, &x, &req);
    } else {
        memset(buf, 0xee, n);
        st = j->h.plugin->irecv(j->h.comm, &x, &req);
    }
    CHECK(st == STAGELINK_SUCCESS, "rank %d: post of mb %u: %s: %s",
          j->h.info.rank, mb, stagelink_status_string(st),
          j->h.plugin->last_error(j->h.comm));
    return req;
}

/* On stage 1 the whole tensor must be there once its stream ran. */
static void check_done(job_t *j, stagelink_status_t st, void *buf, size_t n,
                       uint32_t mb)
{
    size_t bad;

    CHECK(st == STAGELINK_SUCCESS, "rank %d: completion of mb %u: %s: %s",
          j->h.info.rank, mb, stagelink_status_string(st),
          j->h.plugin->last_error(j->h.comm));
    if (j->stage == 1) {
        fstream_sync(j->stream); /* the host's stream waits for the gather */
        bad = sl_pattern_check(buf, 0, n, sl_pattern_seed(0, mb, 0, 0));
        CHECK(bad == SIZE_MAX, "rank %d: mb %u (%zu bytes): byte %zu is "
              "wrong after the gather (0x%02x; 0xee: never written)",
              j->h.info.rank, mb, n, bad,
              bad == SIZE_MAX ? 0 : ((unsigned char *)buf)[bad]);
    }
}

static void finish(job_t *j, stagelink_request_t *req, void *buf, size_t n,
                   uint32_t mb)
{
    check_done(j, j->h.plugin->wait(j->h.comm, req), buf, n, mb);
}

/*
 * By polling test, napping between calls.  A gathered receive's collective
 * is issued in wait (where the host's program puts it on every TP rank),
 * so test must never complete one: stage 1 polls a while, then waits.
 */
static void finish_test(job_t *j, stagelink_request_t *req, void *buf,
                        size_t n, uint32_t mb)
{
    stagelink_status_t st;
    double             end = now_s() + WAIT_S;
    int                done = 0, polls = 0;

    do {
        st = j->h.plugin->test(j->h.comm, req, &done);
        CHECK(j->stage == 0 || st != STAGELINK_SUCCESS || !done, "rank %d: "
              "test completed mb %u, whose collective only wait may issue",
              j->h.info.rank, mb);
        if (st == STAGELINK_SUCCESS && !done) {
            CHECK(now_s() < end, "rank %d: mb %u not done after %d s of test",
                  j->h.info.rank, mb, WAIT_S);
            nap();
        }
    } while (st == STAGELINK_SUCCESS && !done && (j->stage == 0 || ++polls < 200));
    if (st == STAGELINK_SUCCESS && !done) {
        st = j->h.plugin->wait(j->h.comm, req);
    }
    check_done(j, st, buf, n, mb);
}

static void scenario_held(job_t *j)
{
    size_t               na = 64 << 10, nb = 96 << 10;
    char                *a = dev_alloc(j, na), *b = dev_alloc(j, nb);
    stagelink_request_t *ra, *rb;

    if (j->stage == 1 && j->tp_index == 0) {
        fstream_hold(j->stream, 1);
    }
    ra = post(j, a, na, 10);
    if (j->stage == 1 && j->tp_index == 1) {
        int done = 0;

        fstream_sync(j->stream); /* its stream event is done: it may start */
        CHECK(j->h.plugin->test(j->h.comm, ra, &done) == STAGELINK_SUCCESS,
              "test");
        CHECK(!done, "a receive completed before its peers sent");
    }
    rb = post(j, b, nb, 11);
    if (j->stage == 1 && j->tp_index == 0) {
        fstream_hold(j->stream, 0);
    }
    finish(j, ra, a, na, 10);
    finish(j, rb, b, nb, 11);
}

/*
 * A receive canceled while it waits behind its held stream (rank 2): once
 * the stream passes, it hears its TP peer's status and tells the peer why,
 * which then fails at once with CANCELED, not at its deadline; and the
 * next receive with the tag is whole on both, with no status of the
 * canceled one left over.  Rank 0 sends nothing for the canceled receive.
 */
static void scenario_cancel_held(job_t *j)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *req;
    stagelink_status_t   st;

    /* Round 0. */
    if (j->stage == 0 && j->tp_index == 1) {
        finish(j, post(j, a, n, 30), a, n, 30);
    } else if (j->stage == 1 && j->tp_index == 0) {
        fstream_hold(j->stream, 1);
        req = post(j, a, n, 30);
        CHECK(j->h.plugin->cancel(j->h.comm, req) == STAGELINK_SUCCESS,
              "rank %d: cancel behind the held stream: %s", j->h.info.rank,
              j->h.plugin->last_error(j->h.comm));
        fstream_hold(j->stream, 0);
        st = j->h.plugin->wait(j->h.comm, req);
        CHECK(st == STAGELINK_ERR_CANCELED, "rank %d: the canceled receive: "
              "%s", j->h.info.rank, stagelink_status_string(st));
        say(j, "canceled.done");
    } else if (j->stage == 1) {
        st = j->h.plugin->wait(j->h.comm, post(j, a, n, 30));
        CHECK(st == STAGELINK_ERR_CANCELED, "rank %d: the TP peer of the "
              "canceled receive: %s (its cancel should reach it as a notice)",
              j->h.info.rank, stagelink_status_string(st));
    }
    /* Round 1, the same tag: rank 0's send only after the cancel ended. */
    if (j->stage == 0 && j->tp_index == 0) {
        await(j, "canceled.done");
    }
    finish(j, post(j, a, n, 30), a, n, 30);
}

static void scenario_skew(job_t *j)
{
    int round;

    for (round = 0; round < 6; ++round) {
        size_t               na = (size_t)(8 + round) << 12, nb = na + 8192;
        char                *a = dev_alloc(j, na), *b = dev_alloc(j, nb);
        uint32_t             ma = 20 + 2 * (uint32_t)round, mb = ma + 1;
        stagelink_request_t *ra, *rb;
        int                  reverse = (j->tp_index == round % 2);

        if (j->stage == 1) {
            ra = post(j, a, na, ma);
            if (reverse) {
                fstream_kernel(j->stream, 20);
            }
            rb = post(j, b, nb, mb);
            finish(j, ra, a, na, ma);
            finish(j, rb, b, nb, mb);
        } else if (reverse) {
            rb = post(j, b, nb, mb);
            finish(j, rb, b, nb, mb);
            ra = post(j, a, na, ma);
            finish(j, ra, a, na, ma);
        } else {
            ra = post(j, a, na, ma);
            finish(j, ra, a, na, ma);
            rb = post(j, b, nb, mb);
            finish(j, rb, b, nb, mb);
        }
    }
}

static uint64_t draw(uint64_t seed, uint64_t a, uint64_t b)
{
    uint64_t x = seed ^ (a * 0x9e3779b97f4a7c15ull) ^ (b * 0xc2b2ae3d27d4eb4full);

    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A permutation of 0..k-1 drawn from (seed, a, b). */
static void draw_order(uint64_t seed, uint64_t a, uint64_t b, int *order, int k)
{
    int i, r, t;

    for (i = 0; i < k; ++i) {
        order[i] = i;
    }
    for (i = k - 1; i > 0; --i) {
        r        = (int)(draw(seed, a, b * 16 + (uint64_t)i) % (uint64_t)(i + 1));
        t        = order[i];
        order[i] = order[r];
        order[r] = t;
    }
}

#define RANDOM_MAX_K 6

static void scenario_random(job_t *j, uint64_t seed)
{
    /* What both stages share comes from the seed; the rest from the rank. */
    uint64_t mine   = draw(seed, 99, (uint64_t)j->h.info.rank + 1);
    int      rounds = 2 + (int)(draw(seed, 0, 0) % 3), round, i;

    for (round = 0; round < rounds; ++round) {
        int                  k = 2 + (int)(draw(seed, 1, (uint64_t)round) % 5);
        int                  order[RANDOM_MAX_K], at, action, ms, by_test;
        size_t               n[RANDOM_MAX_K];
        uint32_t             mb[RANDOM_MAX_K];
        char                *buf[RANDOM_MAX_K];
        stagelink_request_t *req[RANDOM_MAX_K];

        j->next = f_arena + DEV_SPAN;
        for (i = 0; i < k; ++i) {
            n[i]   = 4 * (1 + draw(seed, 2, (uint64_t)(round * 8 + i)) %
                              (128u << 10));
            mb[i]  = 1000 + (uint32_t)(round * 8 + i);
            buf[i] = dev_alloc(j, n[i]);
        }
        draw_order(mine, 3, (uint64_t)round, order, k);
        by_test = (int)(draw(mine, 4, (uint64_t)round) % 2);
        if (j->stage == 1) {
            at     = (int)(draw(mine, 5, (uint64_t)round) % (uint64_t)(k + 1));
            action = (int)(draw(mine, 6, (uint64_t)round) % 3);
            ms     = 1 + (int)(draw(mine, 7, (uint64_t)round) % 10);
            for (i = 0; i < k; ++i) {
                if (i == at && action == 1) {
                    fstream_kernel(j->stream, ms);
                } else if (i == at && action == 2) {
                    fstream_hold(j->stream, 1);
                }
                req[i] = post(j, buf[i], n[i], mb[i]);
                order[i] = i; /* waited in the posts' order */
            }
            fstream_hold(j->stream, 0);
        } else {
            for (i = 0; i < k; ++i) {
                req[order[i]] = post(j, buf[order[i]], n[order[i]],
                                     mb[order[i]]);
            }
            draw_order(mine, 8, (uint64_t)round, order, k);
        }
        for (i = 0; i < k; ++i) {
            (by_test ? finish_test : finish)(j, req[order[i]], buf[order[i]],
                                             n[order[i]], mb[order[i]]);
        }
        if (draw(mine, 9, (uint64_t)round) % 2) {
            struct timespec ts = {0, (long)(draw(mine, 10, (uint64_t)round) %
                                            20) * 1000000L};

            nanosleep(&ts, NULL); /* idle outside stagelink */
        }
    }
}

/* What a kernel on the consumer's stream read of the tensor, when it ran. */
typedef struct consumed {
    const char *src;
    char       *copy;
    size_t      n;
} consumed_t;

static void consume(void *arg)
{
    consumed_t *c = arg;

    memcpy(c->copy, c->src, c->n);
}

/* Receives `mb` and, as its wait returns, queues a read on `second`
 * (ordered after the data through order_stream, or not); returns the first
 * byte the read got wrong, SIZE_MAX if none. */
static size_t consume_after_wait(job_t *j, fstream_t *second, int ordered,
                                 uint32_t mb)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *ra = post(j, a, n, mb);
    consumed_t           c = {a, malloc(n), n};
    stagelink_status_t   st = STAGELINK_SUCCESS;
    size_t               bad;

    if (j->stage == 0) {
        finish(j, ra, a, n, mb);
        free(c.copy);
        return SIZE_MAX;
    }
    if (ordered) {
        st = j->h.plugin->order_stream(j->h.comm, ra, second);
    }
    CHECK(st == STAGELINK_SUCCESS, "rank %d: order_stream: %s", j->h.info.rank,
          j->h.plugin->last_error(j->h.comm));
    st = j->h.plugin->wait(j->h.comm, ra);
    fake_stream_enqueue(second, consume, &c);
    fstream_sync(second);
    CHECK(st == STAGELINK_SUCCESS, "rank %d: wait of mb %u: %s",
          j->h.info.rank, mb, j->h.plugin->last_error(j->h.comm));
    bad = sl_pattern_check(c.copy, 0, n, sl_pattern_seed(0, mb, 0, 0));
    fstream_sync(j->stream); /* the gather ends before its memory is reused */
    free(c.copy);
    return bad;
}

static void scenario_consumer(job_t *j)
{
    fstream_t *second;
    size_t     bad;

    f_stream_create((void **)&second, NULL);
    setenv("FAKE_NCCL_DELAY_MS", "1000", 1);
    bad = consume_after_wait(j, second, 1, 50);
    CHECK(bad == SIZE_MAX, "rank %d: the consumer ordered by order_stream "
          "read byte %zu before the gather wrote it", j->h.info.rank, bad);
    bad = consume_after_wait(j, second, 0, 51);
    /* One queue orders every stream's work: there it cannot read early. */
    CHECK(j->stage == 0 || f_one_queue_mode() || bad != SIZE_MAX, "rank %d: "
          "a consumer not ordered after a 1 s gather read the whole tensor: "
          "the test cannot tell order_stream's effect", j->h.info.rank);
    unsetenv("FAKE_NCCL_DELAY_MS");
    f_stream_destroy(second);
}

static void scenario_refused(job_t *j)
{
    size_t               n = 8 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *ra;
    stagelink_xfer_t     x;
    stagelink_status_t   st;
    double               t0;

    if (j->stage == 1) {
        ra = post(j, a, n, 40);
        setenv("FAKE_NCCL_COLLECTIVE", "fail", 1);
        t0 = now_s();
        st = j->h.plugin->wait(j->h.comm, ra);
        unsetenv("FAKE_NCCL_COLLECTIVE");
        CHECK(st != STAGELINK_SUCCESS,
              "rank %d: the wait whose collective failed returned %s",
              j->h.info.rank, stagelink_status_string(st));
        CHECK(now_s() - t0 < 5.0, "rank %d: the refused wait took %.1f s",
              j->h.info.rank, now_s() - t0);
        CHECK(strstr(j->h.plugin->last_error(j->h.comm), "NCCL") != NULL,
              "rank %d: the sentence does not name NCCL: %s", j->h.info.rank,
              j->h.plugin->last_error(j->h.comm));
        /* Its TP peer may have issued the collective: the communicator
         * failed with NCCL's sentence, as NCCL's rule has it. */
        x  = xfer_of(j, a, n, 41);
        st = j->h.plugin->irecv(j->h.comm, &x, &ra);
        CHECK(st == STAGELINK_ERR_TRANSPORT &&
              strstr(j->h.plugin->last_error(j->h.comm), "NCCL") != NULL,
              "rank %d: a post after the refused collective: %s: %s",
              j->h.info.rank, stagelink_status_string(st),
              j->h.plugin->last_error(j->h.comm));
    } else {
        finish(j, post(j, a, n, 40), a, n, 40);
    }
}

typedef ncclResult_t (*id_fn_t)(ncclUniqueId *);
typedef ncclResult_t (*init_fn_t)(ncclComm_t *, int, ncclUniqueId, int);
typedef ncclResult_t (*gather_fn_t)(const void *, void *, size_t,
                                    ncclDataType_t, ncclComm_t, cudaStream_t);
typedef ncclResult_t (*destroy_fn_t)(ncclComm_t);
typedef ncclResult_t (*group_fn_t)(void);

static void *sym(void *lib, const char *name)
{
    void *p = dlsym(lib, name);

    CHECK(p != NULL, "the fake NCCL has no %s", name);
    return p;
}

/* The host's own collective on a communicator of its own (Megatron's TP
 * group), through the same NCCL library the plugin loaded. */
static void scenario_between(job_t *j)
{
    const char          *nccl_path = j->nccl;
    size_t               n = 8 << 10; /* eager shards: sent before a post */
    char                *a = dev_alloc(j, n), *own = dev_alloc(j, 8192);
    stagelink_request_t *ra;
    void                *lib = dlopen(nccl_path, RTLD_NOW);
    ncclUniqueId         id;
    ncclComm_t           host_comm;
    char                 path[400];
    FILE                *f;
    int                  done = 0, i;
    stagelink_counters_t before, after;
    double               end = now_s() + WAIT_S;
    id_fn_t              get_id;
    init_fn_t            init;
    gather_fn_t          allgather;
    destroy_fn_t         destroy;

    CHECK(lib != NULL, "dlopen %s: %s", nccl_path, dlerror());
    memcpy(&get_id, (void *[]){sym(lib, "ncclGetUniqueId")}, sizeof(get_id));
    memcpy(&init, (void *[]){sym(lib, "ncclCommInitRank")}, sizeof(init));
    memcpy(&allgather, (void *[]){sym(lib, "ncclAllGather")}, sizeof(allgather));
    memcpy(&destroy, (void *[]){sym(lib, "ncclCommDestroy")}, sizeof(destroy));
    if (j->stage == 0) {
        if (j->tp_index == 1) {
            await(j, "host-collective-issued.1");
        }
        ra = post(j, a, n, 30);
        finish(j, ra, a, n, 30);
        say(j, j->tp_index == 0 ? "sent.0" : "sent.1");
        return;
    }
    snprintf(path, sizeof(path), "%s/host-nccl-id", j->dir);
    if (j->tp_index == 0) {
        CHECK(get_id(&id) == ncclSuccess, "ncclGetUniqueId");
        f = fopen(path, "wb");
        CHECK(f != NULL && fwrite(&id, sizeof(id), 1, f) == 1, "write the id");
        fclose(f);
        say(j, "host-nccl-id-written");
    } else {
        await(j, "host-nccl-id-written");
        f = fopen(path, "rb");
        CHECK(f != NULL && fread(&id, sizeof(id), 1, f) == 1, "read the id");
        fclose(f);
    }
    CHECK(init(&host_comm, 2, id, j->tp_index) == ncclSuccess, "host comm");
    if (j->tp_index == 0) {
        await(j, "sent.0"); /* the shard is here before the post */
    }
    j->h.plugin->get_counters(j->h.comm, &before);
    ra = post(j, a, n, 30);
    fstream_sync(j->stream); /* the receive may start at the next call */
    /* TP rank 0: calls until its shard has landed (the counter says so). */
    do {
        CHECK(j->h.plugin->test(j->h.comm, ra, &done) == STAGELINK_SUCCESS,
              "test");
        j->h.plugin->get_counters(j->h.comm, &after);
    } while (j->tp_index == 0 && !done &&
             after.stage_bytes_recv == before.stage_bytes_recv &&
             now_s() < end);
    for (i = 0; i < 8192; ++i) {
        own[i] = (i / 4096 == j->tp_index) ? (char)(j->tp_index + 1) : 0;
    }
    CHECK(allgather(own + (size_t)j->tp_index * 4096, own, 4096, ncclInt8,
                    host_comm, (cudaStream_t)j->stream) == ncclSuccess,
          "the host's all-gather");
    if (j->tp_index == 1) {
        say(j, "host-collective-issued.1");
    }
    if (!done) {
        finish(j, ra, a, n, 30);
    }
    fstream_sync(j->stream);
    CHECK(own[0] == 1 && own[4096] == 2, "the host's all-gather moved the "
          "wrong bytes (%d, %d)", own[0], own[4096]);
    destroy(host_comm);
}

/* The host waits for a gathered receive inside its own ncclGroupStart/End
 * (an NCCL group of its own open on its thread): the gather's collective
 * stays out of that group, so the tensor is whole once the host's stream
 * ran, before the host's ncclGroupEnd. */
static void scenario_host_group(job_t *j)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *ra;
    void                *lib = dlopen(j->nccl, RTLD_NOW);
    group_fn_t           start, end;

    CHECK(lib != NULL, "dlopen %s: %s", j->nccl, dlerror());
    memcpy(&start, (void *[]){sym(lib, "ncclGroupStart")}, sizeof(start));
    memcpy(&end, (void *[]){sym(lib, "ncclGroupEnd")}, sizeof(end));
    ra = post(j, a, n, 40);
    if (j->stage == 0) {
        finish(j, ra, a, n, 40);
        return;
    }
    CHECK(start() == ncclSuccess, "the host's ncclGroupStart");
    finish(j, ra, a, n, 40);
    CHECK(end() == ncclSuccess, "the host's ncclGroupEnd");
}

/* ---- device and context: the communicator works on device 1 ---- */

typedef struct device_job {
    job_t   *j;
    char    *buf;
    size_t   n;
    uint32_t mb;
    fctx_t  *before, *after; /* the thread's current context around the calls */
} device_job_t;

/* One transfer of device 1's memory, from a thread whose current device
 * is whatever it is: after each call it is that device again. */
static void device_transfer(device_job_t *d)
{
    stagelink_request_t *req;

    d->before = f_ctx;
    req       = post(d->j, d->buf, d->n, d->mb);
    CHECK(f_ctx == d->before, "rank %d: the post left device %d's context "
          "%s current, the caller's was another", d->j->h.info.rank, f_dev(),
          f_ctx == &f_own ? "(the host's own)" : "(a primary one)");
    finish(d->j, req, d->buf, d->n, d->mb);
    d->after = f_ctx;
}

static void *device_thread(void *arg)
{
    device_transfer(arg); /* a thread that never touched the GPU */
    return NULL;
}

static void scenario_device(job_t *j)
{
    char                *other = f_arena + DEV_SPAN / 2; /* device 0's memory */
    stagelink_xfer_t     x = xfer_of(j, other, 8192, 40);
    stagelink_request_t *req = NULL;
    stagelink_status_t   st;
    device_job_t         d = {j, dev_alloc(j, 96 << 10), 96 << 10, 41, NULL, NULL};
    pthread_t            t;
    const char          *msg;
    int                  i;

    /* A tensor of another device: refused, naming both, before anything
     * moves (both stages, so nothing waits for it). */
    for (i = 0; i < 2; ++i) {
        x.mem_type = i ? STAGELINK_MEM_CUDA : STAGELINK_MEM_AUTO;
        st  = (j->stage == 0) ? j->h.plugin->isend(j->h.comm, &x, &req)
                              : j->h.plugin->irecv(j->h.comm, &x, &req);
        msg = j->h.plugin->last_error(j->h.comm);
        CHECK(st == STAGELINK_ERR_INVALID_ARG && strstr(msg, "device 0") &&
              strstr(msg, "device 1"), "rank %d: a tensor of device 0 "
              "(declared %s) on a communicator of device 1: %s: %s",
              j->h.info.rank, i ? "cuda" : "auto", stagelink_status_string(st),
              msg);
    }
    /* The host works on device 0 between its calls. */
    f_use(0);
    device_transfer(&d);
    CHECK(d.after == &f_primary[0], "rank %d: device %d current after the "
          "calls, the host's was 0", j->h.info.rank, f_dev());
    /* ... in a context of its own on device 0: that very context again,
     * not device 0's primary one. */
    f_ctx = &f_own;
    d.mb  = 43;
    device_transfer(&d);
    CHECK(d.after == &f_own, "rank %d: after the calls the host's own "
          "context was replaced by %s", j->h.info.rank,
          d.after ? "a primary one" : "none");
    f_use(1);
    /* A thread without a context. */
    d.mb = 42;
    CHECK(pthread_create(&t, NULL, device_thread, &d) == 0, "pthread_create");
    pthread_join(t, NULL);
    CHECK(d.before == NULL && d.after == NULL, "rank %d: a thread without a "
          "context had device %d current after the calls", j->h.info.rank,
          d.after ? d.after->device : -1);
}

/*
 * The host, on device 0 in a context of its own, calls while the progress
 * thread sleeps on UCX's event fd: the call's leave progresses UCX, which
 * must happen before the caller's context comes back.
 */
static void scenario_context(job_t *j)
{
    size_t               n = 96 << 10;
    char                *a = dev_alloc(j, n);
    sl_comm_t           *comm = (sl_comm_t *)j->h.comm;
    stagelink_request_t *ra;
    double               end = now_s() + WAIT_S;
    int                  done = 0;

    if (j->stage == 0) {
        await(j, "asleep.0");
        await(j, "asleep.1");
        finish(j, post(j, a, n, 80), a, n, 80);
        return;
    }
    f_ctx = &f_own;
    ra    = post(j, a, n, 80);
    while (!atomic_load(&comm->pt_sleeping)) {
        CHECK(now_s() < end, "rank %d: the progress thread never slept",
              j->h.info.rank);
        nap();
    }
    CHECK(j->h.plugin->test(j->h.comm, ra, &done) == STAGELINK_SUCCESS && !done,
          "rank %d: test before the send", j->h.info.rank);
    CHECK(f_ctx == &f_own, "rank %d: test left another context current",
          j->h.info.rank);
    say(j, j->tp_index == 0 ? "asleep.0" : "asleep.1");
    finish(j, ra, a, n, 80);
    f_use(1);
}

/* ---- NCCL's failures: nothing may leave a stream hanging ---- */

/* The host's stream runs dry within a bound: the gather it waits for was
 * ended (by NCCL's abort), not left waiting for a peer. */
static void stream_released(job_t *j, const char *after)
{
    double start = now_s();

    fstream_sync(j->stream);
    CHECK(now_s() - start < 20, "rank %d: the host's stream ran on only "
          "%.1f s after %s", j->h.info.rank, now_s() - start, after);
}

static void scenario_async_error(job_t *j)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n), *b = dev_alloc(j, n), *c;
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    stagelink_status_t   st;
    int                  failed = -2;

    /* Collectives 0-2 were init's warm-ups, 3 is a's gather, 4 (b's) fails. */
    finish(j, post(j, a, n, 50), a, n, 50);
    req = post(j, b, n, 51);
    st  = j->h.plugin->wait(j->h.comm, req);
    if (j->stage == 0) {
        CHECK(st == STAGELINK_SUCCESS, "rank %d: send: %s", j->h.info.rank,
              j->h.plugin->last_error(j->h.comm));
        return;
    }
    CHECK(st == STAGELINK_SUCCESS || st == STAGELINK_ERR_TRANSPORT,
          "rank %d: the receive whose gather fails: %s: %s", j->h.info.rank,
          stagelink_status_string(st), j->h.plugin->last_error(j->h.comm));
    stream_released(j, "NCCL's asynchronous error");
    /* The communicator failed with NCCL's sentence. */
    c = dev_alloc(j, n);
    x = xfer_of(j, c, n, 52);
    st = j->h.plugin->irecv(j->h.comm, &x, &req);
    CHECK(st == STAGELINK_ERR_TRANSPORT &&
          strstr(j->h.plugin->last_error(j->h.comm), "remote process exited"),
          "rank %d: a post after NCCL's asynchronous error: %s: %s",
          j->h.info.rank, stagelink_status_string(st),
          j->h.plugin->last_error(j->h.comm));
    CHECK(j->h.plugin->comm_get_error(j->h.comm, &failed) ==
              STAGELINK_ERR_TRANSPORT && failed == -1,
          "rank %d: comm_get_error after NCCL's asynchronous error: rank %d",
          j->h.info.rank, failed);
}

static void scenario_peer_death(job_t *j)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *req;
    stagelink_status_t   st;

    if (j->stage == 1 && j->tp_index == 1) {
        /* Dies while its TP peer's collective waits for it, once its
         * sender has posted (which then may or may not complete). */
        await(j, "posted.0");
        await(j, "send-posted.1");
        _exit(0);
    }
    req = post(j, a, n, 60);
    if (j->stage == 1) {
        say(j, "posted.0");
    } else if (j->tp_index == 1) {
        say(j, "send-posted.1");
    }
    st = j->h.plugin->wait(j->h.comm, req);
    if (j->stage == 0) {
        CHECK(st == STAGELINK_SUCCESS || st == STAGELINK_ERR_PEER_FAILED,
              "rank %d: send: %s: %s", j->h.info.rank,
              stagelink_status_string(st), j->h.plugin->last_error(j->h.comm));
        return;
    }
    CHECK(st == STAGELINK_ERR_PEER_FAILED &&
          strstr(j->h.plugin->last_error(j->h.comm), "rank 3"),
          "rank %d: the receive whose TP peer died: %s: %s", j->h.info.rank,
          stagelink_status_string(st), j->h.plugin->last_error(j->h.comm));
    stream_released(j, "its TP peer's death");
}

static void scenario_abort(job_t *j)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *req;
    stagelink_status_t   st;

    if (j->stage == 0) {
        return; /* nothing is sent: the gather waits on */
    }
    if (j->tp_index == 1) {
        await(j, "aborted.0"); /* never joins the collective */
        return;
    }
    req = post(j, a, n, 70);
    CHECK(j->h.plugin->comm_abort(j->h.comm) == STAGELINK_SUCCESS, "abort");
    st = j->h.plugin->wait(j->h.comm, req);
    CHECK(st == STAGELINK_ERR_ABORTED, "rank %d: the receive of an aborted "
          "communicator: %s: %s", j->h.info.rank, stagelink_status_string(st),
          j->h.plugin->last_error(j->h.comm));
    stream_released(j, "comm_abort");
    say(j, "aborted.0");
}

/*
 * One TP rank never waits for a gathered receive: its TP peer's
 * collective, issued in its wait, is ended at STAGELINK_TIMEOUT (the
 * communicator fails, NCCL aborted, the stream released), and the rank
 * that never waited is told so at finalize.
 */
static void scenario_unwaited(job_t *j)
{
    size_t               n = 64 << 10;
    char                *a = dev_alloc(j, n);
    stagelink_request_t *req = post(j, a, n, 90);
    stagelink_status_t   st;
    double               end = now_s() + WAIT_S;
    int                  done = 0;

    j->finalized = 1;
    if (j->stage == 0) {
        finish(j, req, a, n, 90);
        await(j, "released.0"); /* not gone before the collective's bound */
        j->h.plugin->comm_finalize(j->h.comm);
        return;
    }
    if (j->tp_index == 0) {
        st = j->h.plugin->wait(j->h.comm, req);
        CHECK(st == STAGELINK_SUCCESS, "rank %d: the wait issuing the "
              "collective: %s", j->h.info.rank, stagelink_status_string(st));
        stream_released(j, "a TP peer that never issued its collective");
        CHECK(j->h.plugin->comm_get_error(j->h.comm, &done) ==
                  STAGELINK_ERR_TRANSPORT &&
              strstr(j->h.plugin->last_error(j->h.comm), "never issued"),
              "rank %d: the communicator after the unfinished collective: %s",
              j->h.info.rank, j->h.plugin->last_error(j->h.comm));
        say(j, "released.0");
        j->h.plugin->comm_finalize(j->h.comm);
        return;
    }
    /* Ended, by test's progress, but never waited: test completes none. */
    while (!sl_req_done((sl_req_t *)req)) {
        CHECK(now_s() < end, "rank %d: the receive never ended",
              j->h.info.rank);
        CHECK(j->h.plugin->test(j->h.comm, req, &done) == STAGELINK_SUCCESS &&
              !done, "rank %d: test completed a receive whose collective is "
              "due in wait", j->h.info.rank);
        nap();
    }
    await(j, "released.0");
    st = j->h.plugin->comm_finalize(j->h.comm);
    CHECK(st == STAGELINK_ERR_ABANDONED &&
          strstr(j->h.plugin->last_error(NULL), "never issued here"),
          "rank %d: finalize with a receive never waited: %s: %s",
          j->h.info.rank, stagelink_status_string(st),
          j->h.plugin->last_error(NULL));
}

int main(int argc, char **argv)
{
    const stagelink_plugin_v1_t *p = &stagelink_plugin_v1;
    stagelink_config_t           cfg;
    job_t                        j;
    sl_comm_t                   *comm;
    const char                  *port = getenv("MASTER_PORT");
    int                          seeded = (argc == 4 &&
                                           strcmp(argv[2], "random") == 0);

    /* nccl-init-timeout has no job: it is all in comm_init. */
    static const struct {
        const char *name;
        void      (*run)(job_t *j);
    } scenarios[] = {
        {"held", scenario_held}, {"skew", scenario_skew},
        {"between", scenario_between}, {"consumer", scenario_consumer},
        {"refused", scenario_refused}, {"device", scenario_device},
        {"context", scenario_context},
        {"nccl-init-timeout", NULL}, {"nccl-async-error", scenario_async_error},
        {"nccl-peer-death", scenario_peer_death}, {"nccl-abort", scenario_abort},
        {"unwaited", scenario_unwaited}, {"host-group", scenario_host_group},
        {"cancel-held", scenario_cancel_held}};
    const size_t                 nscenarios = sizeof(scenarios) / sizeof(scenarios[0]);
    size_t                       k;
    double                       start;

    for (k = 0; argc == 3 && k < nscenarios &&
                strcmp(argv[2], scenarios[k].name) != 0; ++k) {
    }
    if (!seeded && (argc != 3 || k == nscenarios)) {
        fprintf(stderr, "usage: gather_order FAKE_NCCL.so held|skew|between|"
                "consumer|refused|device|context|nccl-init-timeout|nccl-async-error|"
                "nccl-peer-death|nccl-abort|unwaited|host-group|random SEED\n");
        return 2;
    }
    /* The fake NCCL's failures (it reads them when called). */
    if (strcmp(argv[2], "nccl-init-timeout") == 0) {
        setenv("FAKE_NCCL_INIT", "hang", 1);
        setenv("STAGELINK_TIMEOUT", "10", 1); /* also the bootstrap's */
    } else if (strcmp(argv[2], "nccl-async-error") == 0) {
        setenv("FAKE_NCCL_ASYNC_ERROR", "4", 1);
    } else if (strcmp(argv[2], "unwaited") == 0) {
        setenv("STAGELINK_TIMEOUT", "5", 1); /* the collective's bound */
    }
    memset(&j, 0, sizeof(j));
    f_arena = aligned_alloc(4096, ARENA);
    j.next = f_arena + DEV_SPAN; /* device 1's */
    /* The job's (port and launcher): no earlier job's markers are met. */
    snprintf(j.dir, sizeof(j.dir), "/tmp/stagelink-order-%s-%d",
             port ? port : "0", (int)getppid());
    CHECK(mkdir(j.dir, 0700) == 0 || errno == EEXIST, "mkdir %s", j.dir);
    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size = sizeof(cfg);
    cfg.tp_size     = 2;
    /* The host has made device 1 current (torch.cuda.set_device(1)); the
     * communicator, its streams and the NCCL gather over the fake NCCL
     * come from comm_init as on a GPU node. */
    sl_device_runtime = &fake_gpu;
    setenv("STAGELINK_GATHER", "nccl", 1); /* opt-in: see docs/design.md */
    if (seeded && draw(strtoull(argv[3], NULL, 10), 11, 0) % 2) {
        setenv("FAKE_GPU_ONE_QUEUE", "1", 1);
    }
    f_use(1);
    if (strcmp(argv[2], "device") == 0) {
        /* Or the config names device 1 while the host is on device 0. */
        f_use(0);
        cfg.flags  = STAGELINK_CONFIG_DEVICE_SET;
        cfg.device = 1;
    }
    start = now_s();
    if (strcmp(argv[2], "nccl-init-timeout") == 0) {
        /* A TP peer that never joins NCCL's init: every rank's comm_init
         * fails at its deadline with a sentence, instead of hanging. */
        stagelink_status_t st = p->comm_init(&cfg, (stagelink_comm_t **)&comm);

        CHECK(st == STAGELINK_ERR_TIMEOUT &&
              strstr(p->last_error(NULL), "ncclCommInitRankConfig"),
              "comm_init with NCCL's init in progress for ever: %s: %s",
              stagelink_status_string(st), p->last_error(NULL));
        CHECK(now_s() - start < 40, "comm_init returned after %.1f s, with "
              "STAGELINK_TIMEOUT=10", now_s() - start);
        free(f_arena);
        return check_summary();
    }
    if (p->comm_init(&cfg, (stagelink_comm_t **)&comm) != STAGELINK_SUCCESS) {
        fprintf(stderr, "init: %s\n", p->last_error(NULL));
        return 1;
    }
    CHECK(comm->gather_dev == &sl_gather_nccl_ops, "comm_init chose the %s "
          "gather for device buffers, not NCCL's", comm->gather_dev->name);
    CHECK(f_dev() == ((cfg.flags & STAGELINK_CONFIG_DEVICE_SET) ? 0 : 1),
          "comm_init left device %d current", f_dev());
    CHECK(comm->device == 1, "the communicator works on device %d",
          comm->device);
    f_use(1);
    f_comm_device = comm->device;
    j.h.plugin = p;
    j.h.comm   = (stagelink_comm_t *)comm;
    p->comm_info(j.h.comm, &j.h.info);
    j.stage    = j.h.info.pp_index;
    j.tp_index = j.h.info.tp_index;
    j.nccl     = argv[1];
    f_stream_create((void **)&j.stream, NULL);

    if (seeded) {
        scenario_random(&j, strtoull(argv[3], NULL, 10));
    } else {
        scenarios[k].run(&j);
    }
    printf("rank %d: %s: done\n", j.h.info.rank, argv[2]);

    if (!j.finalized) {
        p->comm_finalize(j.h.comm);
    }
    CHECK(f_dev() == 1, "comm_finalize left device %d current", f_dev());
    f_stream_destroy(j.stream);
    CHECK(atomic_load(&f_wrong) == 0, "rank %d: %d GPU calls on another "
          "device than the current one (the first is said above)",
          j.h.info.rank, atomic_load(&f_wrong));

    if (j.h.info.rank == 0) {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", j.dir);
        CHECK(system(cmd) == 0, "rm %s", j.dir);
    }
    free(f_arena);
    return check_summary();
}
