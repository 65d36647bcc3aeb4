/*
 * NCCL gather: the receiving TP group rebuilds a device tensor with one
 * in-place collective (ncclAllGather when the shards are equal, else one
 * ncclBroadcast per shard in a group) on the communicator's gather stream.
 *
 * NCCL pairs collectives by the order ranks issue them, and a host's own
 * NCCL calls (Megatron's TP all-reduce) must not interleave with ours
 * differently on different ranks.  So the collective is issued where the
 * host waits for the receive (from the communicator's NCCL thread, while
 * the wait blocks: in no NCCL group of the host's), once its shard and
 * every TP peer's status are in: the host's program fixes when, and the
 * GPU never holds a wait for work queued after it (docs/design.md,
 * "Gather").  `test` completes no receive whose collective is due.  Where
 * a shard failed anywhere in the group, every rank knows it from the same
 * statuses and none issues the collective.  The host's stream then waits
 * for the collective's event, and the host thread never waits for the GPU.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"

#include "nccl_api.h"
#include "sl_bootstrap.h"
#include "sl_env.h"
#include "sl_log.h"
#include "sl_time.h"
#include "sl_topo.h"

#include <stdlib.h>
#include <string.h>

/* A collective issued: the event behind it, and when. */
typedef struct sl_nccl_run {
    void  *event;
    double issued;
} sl_nccl_run_t;

typedef struct sl_gather_nccl {
    sl_comm_t           *comm;
    const sl_nccl_api_t *api;
    ncclComm_t           nccl;    /**< non-blocking; NULL once aborted */
    void                *stream;  /**< the gather stream */
    sl_nccl_run_t       *running; /**< collectives the GPU may still run */
    int                  nrunning, running_cap;
    double               next_look; /**< of the progress hook at them */
    sl_nccl_thread_t    *caller;  /**< makes the collectives' calls */
} sl_gather_nccl_t;

/* How often collectives in flight are looked at for NCCL's asynchronous
 * error: a sleeping progress thread wakes for it (as torch's NCCL watchdog
 * does), and no wait polls in between. */
#define SL_NCCL_LOOK_S 0.05

static const sl_progress_hook_t sl_gather_nccl_hook;
/* The one NCCL gather of each communicator, for its progress hook. */
static sl_gather_nccl_t *sl_gather_nccl_of(const sl_comm_t *comm)
{
    return (comm->gather_dev == &sl_gather_nccl_ops) ? comm->gather_dev_state
                                                    : NULL;
}

/* One rank's part of the setup exchange. */
typedef struct sl_nccl_card {
    ncclUniqueId id;     /**< valid on TP index 0 */
    int32_t      use;    /**< this rank will use NCCL */
    int32_t      failed; /**< TP index 0: NCCL usable, but no id (ncclGetUniqueId failed) */
    char         gpu[16]; /**< PCI address of this rank's current device */
    int32_t      shares;  /**< NCCL >= 2.30.3 with NCCL_MULTI_RANK_GPU_ENABLE
                               here: several ranks may share a GPU */
} sl_nccl_card_t;

/* NCCL_MULTI_RANK_GPU_ENABLE's first release. */
#define SL_NCCL_MULTI_RANK_VERSION 23003

/*
 * Two TP ranks on one GPU (several processes sharing a device, as on a
 * one-GPU test machine): NCCL refuses such a communicator ("invalid
 * usage"), so the group must know before it asks.  The same answer on
 * every rank of the group, from the same cards.
 */
static const char *sl_nccl_node(const sl_comm_t *comm, int k)
{
    return (k == comm->layout.tp_index) ? comm->node_id
                                        : comm->tp_peers[k].node_id;
}

/* `cards` by TP index; *a and *b are TP indices. */
static int sl_nccl_shared_gpu(const sl_comm_t *comm, const sl_nccl_card_t *cards,
                              int *a, int *b)
{
    for (*b = 0; *b < comm->layout.tp_size; ++*b) {
        for (*a = 0; *a < *b; ++*a) {
            if (cards[*a].gpu[0] != '\0' &&
                strcmp(cards[*a].gpu, cards[*b].gpu) == 0 &&
                strcmp(sl_nccl_node(comm, *a), sl_nccl_node(comm, *b)) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

static void sl_gather_nccl_cleanup(void *state);
static void sl_gather_nccl_fault(void *state);

/* Until `event` completes, NCCL's asynchronous errors polled meanwhile,
 * and UCX progressed, so that a TP peer's death is seen (the collective
 * waits for it alone; a neighbour stage's rank that has finished and left
 * is none of its business) and what the peers' UCX operations need of
 * this rank goes on. */
static sl_status_t sl_gather_nccl_drain(sl_gather_nccl_t *g, void *event,
                                        double deadline, const char *what)
{
    sl_comm_t  *comm   = g->comm;
    sl_status_t status = STAGELINK_SUCCESS;
    long        nap    = 0;
    char        why[256];
    int         k, busy;

    while (!comm->gpu->event_query(event, &status, &comm->err)) {
        SL_CHECK(sl_nccl_async_error(g->api, g->nccl, "the TP group's communicator",
                                     &comm->err));
        busy = (sl_ucx_progress(comm) != 0);
        for (k = 0; k < comm->layout.tp_size; ++k) {
            if (comm->tp_peers[k].failed) {
                sl_peer_describe(&comm->tp_peers[k], why, sizeof(why));
                return sl_error(&comm->err, STAGELINK_ERR_PEER_FAILED,
                                "%s did not finish: %s", what, why);
            }
        }
        if (sl_deadline_passed(deadline)) {
            return sl_error(&comm->err, STAGELINK_ERR_TIMEOUT, "%s did not "
                            "finish within STAGELINK_TIMEOUT (%.0f s): a TP "
                            "peer is not in it", what, comm->timeout);
        }
        if (busy) {
            nap = 0; /* UCX has work: look again at once, naps from 50 us */
        } else {
            sl_time_nap(&nap);
        }
    }
    return status;
}

/*
 * All-gathers at init of a byte, 64 KiB and 1 MiB a rank: NCCL (2.22 and
 * later) connects an algorithm's channels at its first use, and picks the
 * algorithm and protocol by size, so a single small warm-up would leave the
 * first large gather to connect inside the host's wait.  Each is drained
 * with UCX progressing and faults seen (sl_gather_nccl_drain); no lock is
 * held at init.
 */
/* One collective for the NCCL calls' thread: `buf` rebuilt in place on
 * the gather stream, with the communicator's context current there. */
typedef struct sl_gather_nccl_job {
    sl_gather_nccl_t *g;
    void             *buf, *context;
    size_t            nbytes, elem_size;
} sl_gather_nccl_job_t;

static sl_status_t sl_gather_nccl_job(void *arg, sl_errbuf_t *eb)
{
    sl_gather_nccl_job_t *job  = arg;
    sl_gather_nccl_t     *g    = job->g;
    sl_comm_t            *comm = g->comm;

    /* Set once: the thread keeps it for the communicator's life. */
    if (job->context != NULL && comm->gpu->context_set != NULL &&
        comm->gpu->context_current() != job->context) {
        SL_CHECK(comm->gpu->context_set(job->context, eb));
    }
    return sl_nccl_allgather_inplace(g->api, g->nccl, job->buf, job->nbytes,
                                     job->elem_size, comm->layout.tp_size,
                                     comm->layout.tp_index,
                                     (cudaStream_t)g->stream, eb);
}

/*
 * Issues the collective from the NCCL calls' thread and waits for the
 * enqueue: on the host's thread, inside the host's own ncclGroupStart/End,
 * it would join that group and launch only at its end, after the wait
 * had recorded its event and returned.
 */
static sl_status_t sl_gather_nccl_issue(sl_gather_nccl_t *g, void *buf,
                                        size_t nbytes, size_t elem_size)
{
    sl_comm_t           *comm = g->comm;
    sl_gather_nccl_job_t job  = {g, buf, comm->context, nbytes, elem_size};

    if (job.context == NULL && comm->gpu->context_current != NULL) {
        job.context = comm->gpu->context_current();
    }

    return sl_nccl_thread_run(g->caller, sl_gather_nccl_job, &job, &comm->err);
}

static sl_status_t sl_gather_nccl_warm_up(sl_gather_nccl_t *g, double deadline)
{
    static const size_t sizes[] = {1, (size_t)64 << 10, (size_t)1 << 20};
    sl_comm_t  *comm = g->comm;
    void       *buf = NULL, *event = NULL;
    sl_status_t status = STAGELINK_SUCCESS;
    size_t      i, n;
    int         tp = comm->layout.tp_size;

    SL_CHECK(comm->gpu->dev_alloc(sizes[SL_ARRAY_SIZE(sizes) - 1] * (size_t)tp,
                                  &buf, &comm->err));
    SL_CHECK_GOTO(sl_device_event_get(comm, &event), out);
    for (i = 0; i < SL_ARRAY_SIZE(sizes) && status == STAGELINK_SUCCESS; ++i) {
        n = sizes[i] * (size_t)tp;
        SL_CHECK_GOTO(sl_gather_nccl_issue(g, buf, n, 1), out);
        SL_CHECK_GOTO(sl_nccl_settle(g->api, g->nccl, deadline, NULL, NULL,
                                     "the NCCL gather's warm-up all-gather",
                                     &comm->err), out);
        SL_CHECK_GOTO(comm->gpu->event_record(event, g->stream, &comm->err),
                      out);
        status = sl_gather_nccl_drain(g, event, deadline, "the NCCL gather's "
                                      "warm-up all-gather");
    }
out:
    if (event != NULL) {
        sl_device_event_put(comm, event);
    }
    /* After a failure the stream may still hold it: NCCL's abort ends it
     * first (cleanup), and the buffer stays. */
    if (status == STAGELINK_SUCCESS) {
        comm->gpu->dev_free(buf);
    }
    return status;
}

/* This rank's card: its GPU and, on TP index 0, the group's id; what is
 * missing for NCCL here goes into `why`. */
static void sl_gather_nccl_probe(sl_comm_t *comm, const sl_nccl_api_t **api,
                                 sl_nccl_card_t *mine, sl_errbuf_t *why)
{
    char           ids[SL_TOPO_MAX_GPUS][16];
    int            current = -1, n, version = 0;
    sl_env_value_t multi;

    memset(mine, 0, sizeof(*mine));
    why->msg[0] = '\0';
    *api        = NULL;
    if (!comm->gpu_usable) {
        snprintf(why->msg, sizeof(why->msg), "%s", comm->gpu_why);
        return;
    }
    if (comm->device < 0) {
        /* NCCL would take whatever device the runtime falls back to. */
        snprintf(why->msg, sizeof(why->msg), "no CUDA device was current at "
                 "comm_init and the config names none (make the rank's "
                 "device current first, or set STAGELINK_CONFIG_DEVICE_SET)");
        return;
    }
    if (comm->gpu->dev_alloc == NULL) {
        snprintf(why->msg, sizeof(why->msg), "the %s GPU runtime cannot "
                 "allocate device memory, which the NCCL gather needs",
                 comm->gpu->name);
        return;
    }
    if (sl_nccl_api_get(api, why) != STAGELINK_SUCCESS) {
        return;
    }
    mine->use = 1;
    if ((*api)->GetVersion(&version) == ncclSuccess &&
        version >= SL_NCCL_MULTI_RANK_VERSION &&
        sl_env_parse(SL_ENV_NCCL_MULTI_RANK_GPU_ENABLE, &multi, why) ==
            STAGELINK_SUCCESS && multi.flag) {
        mine->shares = 1;
    }
    n = comm->gpu->pci_bus_ids(ids, SL_TOPO_MAX_GPUS, &current);
    if (comm->device < n) {
        memcpy(mine->gpu, ids[comm->device], sizeof(mine->gpu));
    }
    if (comm->layout.tp_index == 0 &&
        sl_nccl_check(*api, (*api)->GetUniqueId(&mine->id), NULL,
                      "ncclGetUniqueId", why) != STAGELINK_SUCCESS) {
        mine->failed = 1; /* the whole TP group decides, below */
    }
}

/*
 * The group's verdict from the same cards on every rank: SUCCESS when the
 * TP group can open its communicator, else the sentence for this rank
 * (STAGELINK_GATHER=nccl was asked, so each reason is a failure).
 */
static sl_status_t sl_gather_nccl_verdict(sl_comm_t *comm,
                                          const sl_nccl_card_t *cards,
                                          const sl_nccl_card_t *mine,
                                          const sl_errbuf_t *why)
{
    int root = comm->layout.tp_ranks[0], k, a, b, shares;

    if (cards[0].failed) {
        /* The rank that failed has NCCL's reason; the others point there. */
        return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                        "STAGELINK_GATHER=nccl but NCCL cannot be used: rank "
                        "%d (TP index 0, which makes the TP group's NCCL id) "
                        "could not make it: %s", root,
                        (root == comm->layout.rank)
                            ? why->msg
                            : "ncclGetUniqueId failed there (that rank says "
                              "why)");
    }
    if (!mine->use) {
        return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                        "STAGELINK_GATHER=nccl but NCCL cannot be used: %s",
                        why->msg);
    }
    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (!cards[k].use) {
            return sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                            "STAGELINK_GATHER=nccl but TP peer rank %d cannot "
                            "use NCCL (that rank says why), while this rank "
                            "can; give every rank the same GPU setup",
                            comm->layout.tp_ranks[k]);
        }
    }
    for (k = 0, shares = 1; k < comm->layout.tp_size; ++k) {
        shares = shares && cards[k].shares;
    }
    if (!shares && sl_nccl_shared_gpu(comm, cards, &a, &b)) {
        return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                        "STAGELINK_GATHER=nccl but ranks %d and %d of this TP "
                        "group share GPU %s, and NCCL allows one rank per GPU "
                        "in a communicator (before 2.30.3, or without "
                        "NCCL_MULTI_RANK_GPU_ENABLE=1 on every rank); give "
                        "each TP rank its own GPU, or use STAGELINK_GATHER=ucx",
                        comm->layout.tp_ranks[a],
                        comm->layout.tp_ranks[b], cards[a].gpu);
    }
    return STAGELINK_SUCCESS;
}

/* The TP group's communicator, its gather stream and its warm-up. */
static sl_status_t sl_gather_nccl_open(sl_comm_t *comm,
                                       const sl_nccl_api_t *api,
                                       ncclUniqueId id, sl_gather_nccl_t **out)
{
    sl_gather_nccl_t *g = calloc(1, sizeof(*g));
    sl_nccl_open_t    open;
    sl_status_t       status;
    double            deadline = sl_deadline(comm->timeout);

    if (g == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate the NCCL gather");
    }
    g->comm = comm;
    g->api  = api;
    open    = (sl_nccl_open_t){&g->nccl, comm->layout.tp_size,
                               comm->layout.tp_index, id,
                               "ncclCommInitRankConfig of the TP group "
                               "(non-blocking)"};
    SL_CHECK_GOTO(sl_nccl_comms_open(api, &open, 1, deadline, &comm->err),
                  err);
    SL_CHECK_GOTO(comm->gpu->stream_create(&g->stream, &comm->err), err);
    SL_CHECK_GOTO(sl_nccl_thread_start(&g->caller, &comm->err), err);
    SL_CHECK_GOTO(sl_gather_nccl_warm_up(g, deadline), err);
    *out = g;
    return STAGELINK_SUCCESS;

err:
    /* A failed init may leave the warm-up queued for a peer that never
     * comes: destroying would wait for it, an abort ends it. */
    sl_gather_nccl_fault(g);
    sl_gather_nccl_cleanup(g);
    return status;
}

static sl_status_t sl_gather_nccl_init(sl_comm_t *comm, void **state)
{
    int                  tp  = comm->layout.tp_size;
    const sl_nccl_api_t *api;
    sl_gather_nccl_t    *g   = NULL;
    sl_nccl_card_t       mine, *cards;
    sl_errbuf_t          why;
    sl_status_t          status;

    *state = NULL;
    if (tp == 1) {
        SL_INFO(SL_SUBSYS_GATHER, "NCCL gather not used: TP size 1");
        return STAGELINK_SUCCESS;
    }
    sl_gather_nccl_probe(comm, &api, &mine, &why);
    /*
     * No return before the exchange, whatever this rank found: the others
     * are in it already and would wait out their deadline.  What went
     * wrong here travels in the card, so every rank ends alike.
     */
    cards = calloc((size_t)tp, sizeof(*cards));
    if (cards == NULL) {
        /* A few hundred bytes a rank; the others then fail in the
         * exchange, at their deadline. */
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d NCCL setup cards", tp);
    }
    /* By TP index: the TP group is all that shares a communicator. */
    SL_CHECK_GOTO(sl_bootstrap_exchange_fixed(comm->bootstrap, "nccl", &mine,
                                              sizeof(mine),
                                              comm->layout.tp_ranks, tp, cards,
                                              &comm->err), out);
    SL_CHECK_GOTO(sl_gather_nccl_verdict(comm, cards, &mine, &why), out);
    SL_CHECK_GOTO(sl_gather_nccl_open(comm, api, cards[0].id, &g), out);
    sl_ucx_progress_register(comm, &sl_gather_nccl_hook);
    SL_INFO(SL_SUBSYS_GATHER, "gather nccl: NCCL over the TP group of %d "
            "ranks (non-blocking communicator, warmed up), issued in wait",
            tp);
    *state = g;
out:
    free(cards);
    return status;
}

/* Whether a collective issued is still on the device once the finalize
 * grace passed: a TP peer that never waited for its receive never joins
 * it, and ncclCommDestroy would wait for it forever. */
static int sl_gather_nccl_unfinished(sl_gather_nccl_t *g)
{
    double      deadline = sl_time_now() + g->comm->grace;
    long        nap      = 0;
    sl_status_t status;
    sl_errbuf_t why;
    int         i = 0;

    while (i < g->nrunning) {
        if (g->comm->gpu->event_query(g->running[i].event, &status, &why)) {
            ++i;
        } else if (sl_time_now() >= deadline) {
            return 1;
        } else {
            sl_time_nap(&nap);
        }
    }
    return 0;
}

static void sl_gather_nccl_cleanup(void *state)
{
    sl_gather_nccl_t *g = state;
    int               unfinished, i;

    if (g == NULL) {
        return;
    }
    /* Aborted anyway after a fault or abandoned requests: no grace. */
    unfinished = g->nccl != NULL && g->comm->fault == STAGELINK_SUCCESS &&
                 !g->comm->abandoned && sl_gather_nccl_unfinished(g);
    for (i = 0; i < g->nrunning; ++i) {
        g->comm->gpu->event_destroy(g->running[i].event);
    }
    free(g->running);
    sl_nccl_thread_stop(g->caller);
    if (g->nccl != NULL) {
        /* After a fault, with requests finalize abandoned, or with a
         * collective still unfinished, a peer may never join a queued
         * collective: destroying would wait for it. */
        if (g->comm->fault != STAGELINK_SUCCESS || g->comm->abandoned ||
            unfinished) {
            g->api->CommAbort(g->nccl);
        } else {
            g->api->CommDestroy(g->nccl);
        }
    }
    if (g->stream != NULL) {
        g->comm->gpu->stream_destroy(g->stream);
    }
    free(g);
}

/* The event recorded behind the collective just issued (the list takes
 * it): while it is pending the progress hook polls NCCL's asynchronous
 * errors, and bounds its wait for the TP peers. */
static sl_status_t sl_gather_nccl_track(sl_gather_nccl_t *g, void *event)
{
    sl_comm_t     *comm = g->comm;
    sl_nccl_run_t *grown;

    if (g->nrunning == g->running_cap) {
        grown = realloc(g->running, (size_t)(g->running_cap * 2 + 8) *
                                        sizeof(*grown));
        if (grown == NULL) {
            return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY, "cannot "
                            "track %d NCCL collectives", g->nrunning + 1);
        }
        g->running     = grown;
        g->running_cap = g->running_cap * 2 + 8;
    }
    if (g->nrunning == 0) {
        g->next_look = sl_time_now() + SL_NCCL_LOOK_S;
    }
    g->running[g->nrunning++] = (sl_nccl_run_t){event, sl_time_now()};
    return STAGELINK_SUCCESS;
}

/* The statuses of the peers are awaited from the start. */
static sl_status_t sl_gather_nccl_post(void *state, sl_req_t *req)
{
    sl_gather_nccl_t *g = state;

    return sl_gather_status_post(g->comm, req);
}

/* May run inside a UCX callback, on any thread: no GPU or NCCL call here. */
static sl_status_t sl_gather_nccl_shard_ready(void *state, sl_req_t *req,
                                              sl_status_t own)
{
    sl_gather_nccl_t *g = state;

    return sl_gather_status_send(g->comm, req, own);
}

/* Due where the host waits: the receive ended with every TP rank's shard
 * in, so every rank of the group issues the collective. */
static int sl_gather_nccl_due(void *state, const sl_req_t *req)
{
    const sl_gather_nccl_t *g = state;

    return g->nccl != NULL && req->xfer.nbytes > 0 &&
           sl_gather_status_all_arrived(g->comm, req);
}

/*
 * Where the host waits, on its thread, once the receive has ended: the
 * shard is in device memory (its copies done, or UCX's transfer complete)
 * and every TP peer's status is in, so the collective is queued after all
 * it reads and its place among the host's collectives is the wait's.  Then
 * the host's stream waits for its event (torch's Work.wait()).
 */
static sl_status_t sl_gather_nccl_complete(void *state, sl_req_t *req)
{
    sl_gather_nccl_t *g    = state;
    sl_comm_t        *comm = g->comm;
    void             *event = NULL;
    sl_status_t       status;

    if (comm->closing || !sl_gather_nccl_due(g, req)) {
        return STAGELINK_SUCCESS; /* no rank of the group issues it */
    }
    status = sl_gather_nccl_issue(g, req->xfer.buf, req->xfer.nbytes,
                                  req->xfer.elem_size);
    if (status == STAGELINK_SUCCESS) {
        status = sl_nccl_settle(g->api, g->nccl, sl_deadline(comm->timeout),
                                &comm->aborting, NULL, "the NCCL gather's "
                                "collective", &comm->err);
    }
    if (status != STAGELINK_SUCCESS) {
        /* The TP peers issued theirs, or NCCL is stuck for the group: the
         * fault path aborts the communicator, so none waits for this one. */
        sl_peer_group_failed(comm, "%s", comm->err.msg);
        return status;
    }
    SL_CHECK(sl_device_event_get(comm, &event));
    SL_CHECK_GOTO(comm->gpu->event_record(event, g->stream, &comm->err), err);
    SL_CHECK_GOTO(comm->gpu->stream_wait_event(req->xfer.stream, event,
                                               &comm->err), err);
    SL_CHECK_GOTO(sl_gather_nccl_track(g, event), err);
    sl_gather_count(comm, req);
    return STAGELINK_SUCCESS;
err:
    sl_device_event_put(comm, event);
    return status;
}

/*
 * The communicator failed (a peer died, comm_abort, NCCL's own error):
 * NCCL's abort ends the collectives that wait for a peer, so the host's
 * streams run on instead of hanging.  It and the progress hook's
 * ncclCommGetAsyncError are the NCCL calls made off the host's thread
 * (NCCL allows both from any thread, as torch's watchdog makes them).
 */
static void sl_gather_nccl_fault(void *state)
{
    sl_gather_nccl_t *g = state;

    if (g->nccl == NULL) {
        return;
    }
    g->api->CommAbort(g->nccl);
    g->nccl = NULL;
    SL_INFO(SL_SUBSYS_GATHER, "NCCL communicator of the TP group aborted%s%s",
            g->comm->fault_err.msg[0] ? ": " : "", g->comm->fault_err.msg);
}

/* While collectives run, every SL_NCCL_LOOK_S: NCCL's asynchronous
 * errors become the communicator's fault (a TP peer died or its link
 * failed). */
static void sl_gather_nccl_round(sl_comm_t *comm)
{
    sl_gather_nccl_t *g = sl_gather_nccl_of(comm);
    sl_status_t       status = STAGELINK_SUCCESS;
    sl_errbuf_t       why;
    double            now;

    if (g == NULL || g->nccl == NULL || g->nrunning == 0 ||
        (now = sl_time_now()) < g->next_look) {
        return;
    }
    g->next_look = now + SL_NCCL_LOOK_S;
    while (g->nrunning > 0 &&
           comm->gpu->event_query(g->running[0].event, &status, &why)) {
        sl_device_event_put(comm, g->running[0].event);
        memmove(g->running, g->running + 1,
                (size_t)--g->nrunning * sizeof(*g->running));
    }
    if (g->nrunning > 0 &&
        sl_nccl_async_error(g->api, g->nccl, "the TP group's communicator",
                            &why) != STAGELINK_SUCCESS) {
        sl_peer_group_failed(comm, "%s", why.msg);
    } else if (g->nrunning > 0 && comm->timeout > 0 &&
               now - g->running[0].issued > comm->timeout) {
        /* A live TP peer that never issues raises no NCCL error: only a
         * bound ends the wait of this rank's GPU for it. */
        sl_peer_group_failed(comm, "the NCCL gather's collective issued "
                             "%.1f s ago has not finished (STAGELINK_TIMEOUT "
                             "%.1f s): a TP peer never issued it; every TP "
                             "rank must wait for its gathered receives, in "
                             "the same order", now - g->running[0].issued,
                             comm->timeout);
    }
}

static double sl_gather_nccl_wake_at(const sl_comm_t *comm)
{
    const sl_gather_nccl_t *g = sl_gather_nccl_of(comm);

    return (g != NULL && g->nccl != NULL && g->nrunning > 0) ? g->next_look
                                                             : 0.0;
}

static const sl_progress_hook_t sl_gather_nccl_hook = {
    .round   = sl_gather_nccl_round,
    .wake_at = sl_gather_nccl_wake_at,
};

const sl_gather_ops_t sl_gather_nccl_ops = {
    .name        = "nccl",
    .init        = sl_gather_nccl_init,
    .cleanup     = sl_gather_nccl_cleanup,
    .due         = sl_gather_nccl_due,
    .post        = sl_gather_nccl_post,
    .shard_ready = sl_gather_nccl_shard_ready,
    .complete    = sl_gather_nccl_complete,
    .fault       = sl_gather_nccl_fault,
};
