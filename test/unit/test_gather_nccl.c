/*
 * The NCCL gather's setup exchange without a GPU: two ranks of one TP group
 * (t = 2, p = 1) are two threads, each with a communicator put together by
 * hand ("a GPU is usable"), meeting through a host store whose reads give
 * up after a few seconds, over a fake libnccl.so.2
 * (test/plugins/fake_nccl.c) whose ncclGetUniqueId can be made to fail.
 * When it fails on TP index 0 (rank 0), every rank must still take part in
 * the exchange and end the same way, in time, naming rank 0:
 * both fail (STAGELINK_ERR_UNSUPPORTED, STAGELINK_GATHER=nccl being asked
 * for), none by waiting out the exchange.  And when it works, both set up
 * the NCCL gather with rank 0's id; when both drive one GPU (NCCL refuses
 * that), both fail naming the GPU, without asking NCCL.
 *   test_gather_nccl FAKE_NCCL.so
 * SPDX-License-Identifier: MIT
 */
#include "check.h"

#include "gather.h"
#include "sl_bootstrap.h"
#include "sl_layout.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WORLD 2
#define EXCHANGE_WAIT_S 3 /* a rank left alone in the exchange gives up */

/* A store among the threads (each scenario has its own). */
#define STORE_KEYS 8
typedef struct exchange {
    pthread_mutex_t lock;
    pthread_cond_t  cv;
    int             nkeys;
    char            keys[STORE_KEYS][64];
    char            vals[STORE_KEYS][4096];
    size_t          lens[STORE_KEYS];
} exchange_t;

static __thread int thread_rank;

/* The GPU each rank drives: its own (0000:0r:00.0, device r), or one for
 * both (device 0). */
static int shared_gpu;

static int fake_pci_bus_ids(char (*ids)[16], int max, int *current)
{
    int n = (max < WORLD) ? max : WORLD, i;

    for (i = 0; i < n; ++i) {
        snprintf(ids[i], 16, "0000:%02x:00.0", i + 1);
    }
    *current = shared_gpu ? 0 : thread_rank;
    return n;
}

/* The gather stream is made, never used here. */
static sl_status_t fake_stream_create(void **s, sl_errbuf_t *eb)
{
    (void)eb;
    *s = malloc(1);
    return STAGELINK_SUCCESS;
}

static void fake_stream_destroy(void *s) { free(s); }

/* Init's warm-up collective: device memory and an event that is done at
 * once (the fake NCCL's setup communicators move no data). */
static sl_status_t fake_dev_alloc(size_t len, void **p, sl_errbuf_t *eb)
{
    (void)eb;
    *p = malloc(len);
    return STAGELINK_SUCCESS;
}

static sl_status_t fake_event_record(void *ev, void *s, sl_errbuf_t *eb)
{
    (void)ev, (void)s, (void)eb;
    return STAGELINK_SUCCESS;
}

static int fake_event_query(void *ev, sl_status_t *st, sl_errbuf_t *eb)
{
    (void)ev, (void)eb;
    *st = STAGELINK_SUCCESS;
    return 1;
}

static sl_gpu_ops_t fake_gpu = {
    .name             = "fake",
    .pci_bus_ids      = fake_pci_bus_ids,
    .stream_create    = fake_stream_create,
    .stream_destroy   = fake_stream_destroy,
    .event_create     = fake_stream_create,
    .event_destroy    = fake_stream_destroy,
    .event_record     = fake_event_record,
    .event_query      = fake_event_query,
    .dev_alloc        = fake_dev_alloc,
    .dev_free         = free,
};

static int thread_set(void *ctx, const char *key, const void *buf, size_t size)
{
    exchange_t *x = ctx;
    int         rc = -2;

    pthread_mutex_lock(&x->lock);
    if (x->nkeys < STORE_KEYS && size <= sizeof(x->vals[0])) {
        snprintf(x->keys[x->nkeys], sizeof(x->keys[0]), "%s", key);
        memcpy(x->vals[x->nkeys], buf, size);
        x->lens[x->nkeys++] = size;
        pthread_cond_broadcast(&x->cv);
        rc = 0;
    }
    pthread_mutex_unlock(&x->lock);
    return rc;
}

static int thread_get(void *ctx, const char *key, void *buf, size_t cap,
                      size_t *size)
{
    exchange_t     *x = ctx;
    struct timespec until;
    int             rc = 0, i = -1;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += EXCHANGE_WAIT_S;
    pthread_mutex_lock(&x->lock);
    while (rc == 0) {
        for (i = x->nkeys - 1; i >= 0 && strcmp(x->keys[i], key) != 0; --i) {
        }
        if (i >= 0) {
            break;
        }
        rc = pthread_cond_timedwait(&x->cv, &x->lock, &until);
    }
    if (i >= 0) {
        *size = x->lens[i];
        memcpy(buf, x->vals[i], (x->lens[i] < cap) ? x->lens[i] : cap);
        rc = 0;
    } else {
        rc = -1; /* alone: the peer never came */
    }
    pthread_mutex_unlock(&x->lock);
    return rc;
}

typedef struct rank_run {
    int            rank;
    int            choice;
    exchange_t    *x;
    sl_status_t    status;
    int            has_state;
    double         seconds;
    char           msg[SL_ERRBUF_LEN];
} rank_run_t;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run_rank(void *arg)
{
    rank_run_t     *run = arg;
    sl_comm_t      *comm = calloc(1, sizeof(*comm));
    sl_bootstrap_t  bs;
    void           *state = NULL;
    double          t0;

    thread_rank = run->rank;
    memset(&bs, 0, sizeof(bs));
    bs.kind       = SL_BOOT_CALLBACKS;
    bs.host       = (sl_kv_host_t){thread_set, thread_get, run->x};
    sl_kv_host_open(&bs.kv, &bs.host);
    bs.rank       = run->rank;
    bs.world_size = WORLD;
    comm->bootstrap     = &bs;
    comm->gpu           = &fake_gpu;
    comm->gpu_usable    = 1;
    comm->device        = shared_gpu ? 0 : thread_rank; /* its CUDA ordinal */
    comm->tp_peers      = calloc(WORLD, sizeof(*comm->tp_peers)); /* one node */
    comm->gather_choice = run->choice;
    if (sl_layout_from_order(run->rank, WORLD, WORLD, 1, &comm->layout,
                             &comm->err) != STAGELINK_SUCCESS) {
        run->status = STAGELINK_ERR_INTERNAL;
        snprintf(run->msg, sizeof(run->msg), "%s", comm->err.msg);
        free(comm->tp_peers);
        free(comm);
        return NULL;
    }
    t0             = now();
    run->status    = sl_gather_nccl_ops.init(comm, &state);
    run->seconds   = now() - t0;
    run->has_state = (state != NULL);
    snprintf(run->msg, sizeof(run->msg), "%s", comm->err.msg);
    sl_gather_nccl_ops.cleanup(state);
    sl_device_cleanup(comm); /* the warm-up's event, kept for reuse */
    sl_layout_cleanup(&comm->layout);
    free(comm->tp_peers);
    free(comm);
    return NULL;
}

/* Both ranks through the NCCL gather's init at once. */
static void run_both(int choice, rank_run_t runs[WORLD])
{
    exchange_t x;
    pthread_t  th[WORLD];
    int        r;

    memset(&x, 0, sizeof(x));
    pthread_mutex_init(&x.lock, NULL);
    pthread_cond_init(&x.cv, NULL);
    for (r = 0; r < WORLD; ++r) {
        memset(&runs[r], 0, sizeof(runs[r]));
        runs[r].rank   = r;
        runs[r].choice = choice;
        runs[r].x      = &x;
        pthread_create(&th[r], NULL, run_rank, &runs[r]);
    }
    for (r = 0; r < WORLD; ++r) {
        pthread_join(th[r], NULL);
    }
    pthread_cond_destroy(&x.cv);
    pthread_mutex_destroy(&x.lock);
}

/* What STAGELINK_GATHER picks, before any exchange: NCCL only when asked,
 * and not under CUDA_DEVICE_MAX_CONNECTIONS=1 (one hardware queue). */
static void select_checks(void)
{
    static const struct {
        const char *gather, *connections;
        sl_status_t status;
        int         choice;
        const char *says;
    } cases[] = {
        {"auto", NULL, STAGELINK_SUCCESS, SL_GATHER_AUTO, NULL},
        {"nccl", NULL, STAGELINK_SUCCESS, SL_GATHER_NCCL, NULL},
        {"nccl", "8", STAGELINK_SUCCESS, SL_GATHER_NCCL, NULL},
        {"nccl", "1", STAGELINK_ERR_UNSUPPORTED, SL_GATHER_NCCL,
         "CUDA_DEVICE_MAX_CONNECTIONS=1"},
        {"auto", "1", STAGELINK_SUCCESS, SL_GATHER_AUTO, NULL},
        {"ucx", "1", STAGELINK_SUCCESS, SL_GATHER_UCX, NULL},
    };
    size_t k;

    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); ++k) {
        sl_comm_t  *comm = calloc(1, sizeof(*comm));
        sl_status_t st;

        comm->gpu        = &fake_gpu;
        comm->gpu_usable = 1;
        setenv("STAGELINK_GATHER", cases[k].gather, 1);
        if (cases[k].connections != NULL) {
            setenv("CUDA_DEVICE_MAX_CONNECTIONS", cases[k].connections, 1);
        } else {
            unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
        }
        st = sl_gather_select(comm);
        CHECK(st == cases[k].status && comm->gather_choice == cases[k].choice &&
              (cases[k].says == NULL || strstr(comm->err.msg, cases[k].says)),
              "STAGELINK_GATHER=%s, CUDA_DEVICE_MAX_CONNECTIONS=%s: %s, "
              "choice %d: %s", cases[k].gather,
              cases[k].connections ? cases[k].connections : "(unset)",
              stagelink_status_string(st), comm->gather_choice, comm->err.msg);
        free(comm);
    }
    unsetenv("STAGELINK_GATHER");
    unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
}

int main(int argc, char **argv)
{
    rank_run_t runs[WORLD];
    int        r;

    if (argc != 2) {
        fprintf(stderr, "usage: test_gather_nccl FAKE_NCCL.so\n");
        return 2;
    }
    setenv("STAGELINK_NCCL_LIBRARY", argv[1], 1);

    /* The fake works: both ranks set up NCCL with rank 0's id. */
    unsetenv("FAKE_NCCL_UNIQUE_ID");
    run_both(SL_GATHER_NCCL, runs);
    for (r = 0; r < WORLD; ++r) {
        CHECK(runs[r].status == STAGELINK_SUCCESS && runs[r].has_state,
              "rank %d, NCCL working: %s (%s)", r,
              stagelink_status_string(runs[r].status), runs[r].msg);
    }

    /* ncclGetUniqueId fails on rank 0 under STAGELINK_GATHER=nccl: both
     * fail at once, and both say which rank it was. */
    setenv("FAKE_NCCL_UNIQUE_ID", "fail", 1);
    run_both(SL_GATHER_NCCL, runs);
    for (r = 0; r < WORLD; ++r) {
        CHECK(runs[r].status == STAGELINK_ERR_UNSUPPORTED && !runs[r].has_state,
              "rank %d, GATHER=nccl, no id on rank 0: %s (%s)", r,
              stagelink_status_string(runs[r].status), runs[r].msg);
        CHECK(strstr(runs[r].msg, "rank 0") != NULL &&
                  strstr(runs[r].msg, "ncclGetUniqueId") != NULL,
              "rank %d's sentence does not name rank 0 and the call: %s", r,
              runs[r].msg);
        CHECK(runs[r].seconds < EXCHANGE_WAIT_S - 1,
              "rank %d took %.1f s (waited out the exchange)", r,
              runs[r].seconds);
    }
    CHECK(strstr(runs[0].msg, "unhandled system error (fake NCCL)") != NULL,
          "rank 0 does not give NCCL's reason: %s", runs[0].msg);

    unsetenv("FAKE_NCCL_UNIQUE_ID");

    /* Both ranks on one GPU: NCCL would refuse the communicator, so both
     * say why, before NCCL is asked. */
    shared_gpu = 1;
    run_both(SL_GATHER_NCCL, runs);
    for (r = 0; r < WORLD; ++r) {
        CHECK(runs[r].status == STAGELINK_ERR_UNSUPPORTED && !runs[r].has_state &&
                  strstr(runs[r].msg, "share GPU 0000:01:00.0") != NULL,
              "rank %d, GATHER=nccl, one GPU for both: %s (%s)", r,
              stagelink_status_string(runs[r].status), runs[r].msg);
    }
    /* ... unless NCCL 2.30.3+ and NCCL_MULTI_RANK_GPU_ENABLE=1 let them. */
    setenv("FAKE_NCCL_VERSION", "23003", 1);
    setenv("NCCL_MULTI_RANK_GPU_ENABLE", "1", 1);
    run_both(SL_GATHER_NCCL, runs);
    for (r = 0; r < WORLD; ++r) {
        CHECK(runs[r].status == STAGELINK_SUCCESS && runs[r].has_state,
              "rank %d, one GPU, NCCL 2.30.3 with NCCL_MULTI_RANK_GPU_ENABLE: "
              "%s (%s)", r, stagelink_status_string(runs[r].status),
              runs[r].msg);
    }
    unsetenv("FAKE_NCCL_VERSION");
    unsetenv("NCCL_MULTI_RANK_GPU_ENABLE");
    shared_gpu = 0;
    select_checks();
    return check_summary();
}
