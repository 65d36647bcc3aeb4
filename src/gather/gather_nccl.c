/*
 * NCCL gather: the receiving TP group rebuilds a device tensor with one
 * in-place collective (ncclAllGather when the shards are equal, else one
 * ncclBroadcast per shard in a group) on the communicator's gather stream.
 *
 * NCCL pairs collectives by the order ranks issue them, and a host's own
 * NCCL calls (Megatron's TP all-reduce) must not interleave with ours
 * differently on different ranks.  So the collective is issued at the
 * host's post of the receive, in its program order, on the gather stream,
 * behind the work queued on the host's stream before the post and behind
 * a flag in pinned memory that the shard's arrival sets (a stream memory
 * wait): the host's program fixes when, the network only when it runs.
 * A failed shard still sets the flag (NCCL cannot skip a rank), and a
 * one-byte status to each TP peer over UCX tells them, so no rank reports
 * success for a tensor with a hole.  When the host completes the request,
 * its stream waits for the collective's event: later work on it sees the
 * whole tensor, and the host thread never waits for the GPU.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"

#include "nccl_api.h"
#include "sl_bootstrap.h"
#include "sl_log.h"
#include "sl_time.h"
#include "sl_topo.h"

#include <stdlib.h>
#include <string.h>

typedef struct sl_gather_nccl {
    sl_comm_t           *comm;
    const sl_nccl_api_t *api;
    ncclComm_t           nccl;    /**< non-blocking; NULL once aborted */
    void                *stream;  /**< the gather stream */
    uint32_t            *flags;   /**< per request slot: its shard's arrival */
    uint32_t            *gen;     /**< per slot: the value its gather waits for */
    void               **running; /**< events of collectives the GPU may still run */
    int                  nrunning, running_cap;
    double               next_look; /**< of the progress hook at them */
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
} sl_nccl_card_t;

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

/* The gather stream and the arrival flags, one per request slot. */
static sl_status_t sl_gather_nccl_streams(sl_gather_nccl_t *g)
{
    sl_comm_t *comm = g->comm;

    g->gen = calloc((size_t)comm->pool.capacity, sizeof(*g->gen));
    if (g->gen == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d gather generations",
                        comm->pool.capacity);
    }
    SL_CHECK(comm->gpu->flags_alloc((size_t)comm->pool.capacity, &g->flags,
                                    &comm->err));
    return comm->gpu->stream_create(&g->stream, &comm->err);
}

/* Until `event` completes, NCCL's asynchronous errors polled meanwhile. */
static sl_status_t sl_gather_nccl_drain(sl_gather_nccl_t *g, void *event,
                                        double deadline, const char *what)
{
    sl_comm_t  *comm   = g->comm;
    sl_status_t status = STAGELINK_SUCCESS;
    long        nap    = 0;

    while (!comm->gpu->event_query(event, &status, &comm->err)) {
        SL_CHECK(sl_nccl_async_error(g->api, g->nccl, &comm->err));
        if (sl_deadline_passed(deadline)) {
            return sl_error(&comm->err, STAGELINK_ERR_TIMEOUT, "%s did not "
                            "finish within STAGELINK_TIMEOUT (%.0f s): a TP "
                            "peer is not in it", what, comm->timeout);
        }
        sl_time_nap(&nap);
    }
    return status;
}

/*
 * One all-gather of a byte a rank at init: NCCL connects the group's
 * channels on a communicator's first collective, which would otherwise
 * happen inside the host's first receive, holding the communicator for as
 * long as the slowest TP peer takes to get there.
 */
static sl_status_t sl_gather_nccl_warm_up(sl_gather_nccl_t *g, double deadline)
{
    sl_comm_t  *comm = g->comm;
    void       *buf = NULL, *event = NULL;
    sl_status_t status;
    int         tp = comm->layout.tp_size;

    SL_CHECK(comm->gpu->dev_alloc((size_t)tp, &buf, &comm->err));
    SL_CHECK_GOTO(sl_nccl_allgather_inplace(g->api, g->nccl, buf, (size_t)tp,
                                            1, tp, comm->layout.tp_index,
                                            (cudaStream_t)g->stream,
                                            &comm->err), out);
    SL_CHECK_GOTO(sl_nccl_settle(g->api, g->nccl, deadline, "the NCCL "
                                 "gather's warm-up all-gather", &comm->err),
                  out);
    SL_CHECK_GOTO(sl_device_event_get(comm, &event), out);
    SL_CHECK_GOTO(comm->gpu->event_record(event, g->stream, &comm->err), out);
    status = sl_gather_nccl_drain(g, event, deadline, "the NCCL gather's "
                                  "warm-up all-gather");
out:
    if (event != NULL) {
        sl_device_event_put(comm, event);
    }
    /* After a failure the stream may still hold it: NCCL's abort ends it
     * first (cleanup), and the few bytes stay. */
    if (status == STAGELINK_SUCCESS) {
        comm->gpu->dev_free(buf);
    }
    return status;
}

static sl_status_t sl_gather_nccl_init(sl_comm_t *comm, void **state)
{
    int               tp = comm->layout.tp_size, k, root, a, b;
    const sl_nccl_api_t *api = NULL;
    sl_gather_nccl_t *g     = NULL;
    sl_nccl_card_t    mine, *cards;
    sl_errbuf_t       why;
    sl_status_t       status;
    double            deadline;

    *state = NULL;
    memset(&mine, 0, sizeof(mine));
    why.msg[0] = '\0';
    if (!comm->gpu_usable) {
        snprintf(why.msg, sizeof(why.msg), "%s", comm->gpu_why);
    } else if (comm->device < 0) {
        /* NCCL would take whatever device the runtime falls back to. */
        snprintf(why.msg, sizeof(why.msg), "no CUDA device was current at "
                 "comm_init and the config names none (make the rank's "
                 "device current first, or set STAGELINK_CONFIG_DEVICE_SET)");
    } else if (comm->gpu->flags_alloc == NULL ||
               comm->gpu->stream_wait_flag == NULL ||
               comm->gpu->dev_alloc == NULL) {
        snprintf(why.msg, sizeof(why.msg), "the %s GPU runtime cannot gate a "
                 "stream on a flag or allocate device memory, which the NCCL "
                 "gather needs", comm->gpu->name);
    } else if (sl_nccl_api_get(&api, &why) == STAGELINK_SUCCESS) {
        char ids[SL_TOPO_MAX_GPUS][16];
        int  current = -1, n;

        mine.use = 1;
        n = comm->gpu->pci_bus_ids(ids, SL_TOPO_MAX_GPUS, &current);
        if (comm->device < n) { /* comm->device >= 0: checked above */
            memcpy(mine.gpu, ids[comm->device], sizeof(mine.gpu));
        }
        if (comm->layout.tp_index == 0 &&
            sl_nccl_check(api, api->GetUniqueId(&mine.id), NULL,
                          "ncclGetUniqueId", &why) != STAGELINK_SUCCESS) {
            mine.failed = 1; /* the whole TP group decides, below */
        }
    }
    /*
     * No return before the exchange, whatever this rank found: the others
     * are in it already and would wait out their deadline.  What went
     * wrong here travels in the card, so every rank ends alike.
     */
    cards = calloc((size_t)tp, sizeof(*cards));
    if (cards == NULL) {
        /* Cannot happen in practice (a few hundred bytes a rank); the
         * others then fail in the exchange, at their deadline. */
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d NCCL setup cards", tp);
    }
    /* By TP index: the TP group is all that shares a communicator. */
    SL_CHECK_GOTO(sl_bootstrap_exchange_fixed(comm->bootstrap, "nccl", &mine,
                                              sizeof(mine),
                                              comm->layout.tp_ranks, tp, cards,
                                              &comm->err), out);
    /* TP index 0 makes the group's id: without it nobody in the group can
     * use NCCL, and every rank of the group knows it from the same card. */
    root = comm->layout.tp_ranks[0];
    if (cards[0].failed) {
        /* The rank that failed has NCCL's reason; the others point there. */
        const char *reason = (root == comm->layout.rank)
                                 ? why.msg
                                 : "ncclGetUniqueId failed there (that "
                                   "rank says why)";

        if (comm->gather_choice == SL_GATHER_NCCL) {
            status = sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                              "STAGELINK_GATHER=nccl but NCCL cannot be used: "
                              "rank %d (TP index 0, which makes the TP "
                              "group's NCCL id) could not make it: %s",
                              root, reason);
            goto out;
        }
        SL_WARN(SL_SUBSYS_GATHER, "NCCL gather not used: rank %d (TP index "
                "0) could not make the TP group's NCCL id: %s; this TP group "
                "gathers device buffers over UCX", root, reason);
        status = STAGELINK_SUCCESS;
        goto out;
    }
    if (!mine.use && comm->gather_choice == SL_GATHER_NCCL) {
        /* sl_gather_select refuses this before any exchange; kept so that
         * such a rank still ends after the exchange, not before it. */
        status = sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                          "STAGELINK_GATHER=nccl but NCCL cannot be used: %s",
                          why.msg);
        goto out;
    }
    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (cards[k].use != mine.use) {
            status = sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                              "TP peers disagree on the NCCL gather: rank %d "
                              "%s it, this rank %s (%s); give every rank the "
                              "same GPU setup or STAGELINK_GATHER",
                              comm->layout.tp_ranks[k],
                              cards[k].use ? "uses" : "cannot use",
                              mine.use ? "does" : "does not",
                              mine.use ? "NCCL found" : why.msg);
            goto out;
        }
    }
    if (!mine.use || comm->layout.tp_size == 1) {
        SL_INFO(SL_SUBSYS_GATHER, "NCCL gather not used: %s",
                mine.use ? "TP size 1" : why.msg);
        status = STAGELINK_SUCCESS;
        goto out;
    }
    if (sl_nccl_shared_gpu(comm, cards, &a, &b)) {
        if (comm->gather_choice == SL_GATHER_NCCL) {
            status = sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                              "STAGELINK_GATHER=nccl but ranks %d and %d of "
                              "this TP group share GPU %s, and NCCL allows one "
                              "rank per GPU in a communicator; give each TP "
                              "rank its own GPU, or use STAGELINK_GATHER=ucx",
                              comm->layout.tp_ranks[a],
                              comm->layout.tp_ranks[b], cards[a].gpu);
            goto out;
        }
        SL_INFO(SL_SUBSYS_GATHER, "NCCL gather not used: ranks %d and %d of "
                "this TP group share GPU %s (NCCL allows one rank per GPU); "
                "device buffers gather over UCX", comm->layout.tp_ranks[a],
                comm->layout.tp_ranks[b], cards[a].gpu);
        status = STAGELINK_SUCCESS;
        goto out;
    }
    g = calloc(1, sizeof(*g));
    if (g == NULL) {
        status = sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate the NCCL gather");
        goto out;
    }
    g->comm = comm;
    g->api  = api;
    deadline = sl_deadline(comm->timeout);
    SL_CHECK_GOTO(sl_nccl_comm_open(api, &g->nccl, comm->layout.tp_size,
                                    cards[0].id, comm->layout.tp_index,
                                    deadline, "ncclCommInitRankConfig of the "
                                    "TP group (non-blocking)", &comm->err),
                  out);
    SL_CHECK_GOTO(sl_gather_nccl_streams(g), out);
    SL_CHECK_GOTO(sl_gather_nccl_warm_up(g, deadline), out);
    sl_ucx_progress_register(comm, &sl_gather_nccl_hook);
    SL_INFO(SL_SUBSYS_GATHER, "NCCL gather over the TP group of %d ranks "
            "(non-blocking communicator, warmed up)", comm->layout.tp_size);
    *state = g;
    g      = NULL;
    status = STAGELINK_SUCCESS;
out:
    if (g != NULL) {
        /* A failed init may leave the warm-up queued for a peer that never
         * comes: destroying would wait for it, an abort ends it. */
        sl_gather_nccl_fault(g);
        sl_gather_nccl_cleanup(g);
    }
    free(cards);
    return status;
}

/* A gather whose shard will never land (finalize, a request that ended
 * before it started) still lets the stream run it: the peers are in it. */
static void sl_gather_nccl_release(sl_gather_nccl_t *g, size_t slot)
{
    __atomic_store_n(&g->flags[slot], g->gen[slot], __ATOMIC_RELEASE);
}

static void sl_gather_nccl_cleanup(void *state)
{
    sl_gather_nccl_t *g = state;
    int               i;

    if (g == NULL) {
        return;
    }
    for (i = 0; g->flags != NULL && i < g->comm->pool.capacity; ++i) {
        sl_gather_nccl_release(g, (size_t)i);
    }
    for (i = 0; i < g->nrunning; ++i) {
        g->comm->gpu->event_destroy(g->running[i]);
    }
    free(g->running);
    if (g->nccl != NULL) {
        /* After a fault, or with requests finalize abandoned, a peer may
         * never join a queued collective: destroying would wait for it. */
        if (g->comm->fault != STAGELINK_SUCCESS || g->comm->abandoned) {
            g->api->CommAbort(g->nccl);
        } else {
            g->api->CommDestroy(g->nccl);
        }
    }
    if (g->stream != NULL) {
        g->comm->gpu->stream_destroy(g->stream);
    }
    if (g->flags != NULL) {
        g->comm->gpu->flags_free(g->flags);
    }
    free(g->gen);
    free(g);
}

static size_t sl_gather_nccl_slot(const sl_gather_nccl_t *g, const sl_req_t *req)
{
    return (size_t)(req - g->comm->pool.slots);
}

/* An event behind the collective just issued: while it is pending the
 * progress hook polls NCCL's asynchronous errors. */
static sl_status_t sl_gather_nccl_track(sl_gather_nccl_t *g)
{
    sl_comm_t *comm = g->comm;
    void     **grown, *event;

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
    SL_CHECK(sl_device_event_get(comm, &event));
    if (comm->gpu->event_record(event, g->stream, &comm->err) !=
        STAGELINK_SUCCESS) {
        sl_device_event_put(comm, event);
        return STAGELINK_ERR_TRANSPORT;
    }
    if (g->nrunning == 0) {
        g->next_look = sl_time_now() + SL_NCCL_LOOK_S;
    }
    g->running[g->nrunning++] = event;
    return STAGELINK_SUCCESS;
}

/*
 * At the post, in the host's order: the gather stream waits for the work
 * queued on the host's stream so far, then for the shard's flag, then
 * runs the collective and records its event.
 */
static sl_status_t sl_gather_nccl_issue(void *state, sl_req_t *req)
{
    sl_gather_nccl_t   *g    = state;
    sl_comm_t          *comm = g->comm;
    const sl_gpu_ops_t *gpu  = comm->gpu;
    size_t              slot = sl_gather_nccl_slot(g, req);
    void               *posted = NULL;
    sl_status_t         status;

    req->gather_event = NULL;
    req->gather_gen   = ++g->gen[slot];
    SL_CHECK(sl_device_event_get(comm, &posted));
    SL_CHECK_GOTO(gpu->event_record(posted, req->xfer.stream, &comm->err), out);
    SL_CHECK_GOTO(gpu->stream_wait_event(g->stream, posted, &comm->err), out);
    SL_CHECK_GOTO(gpu->stream_wait_flag(g->stream, &g->flags[slot],
                                        req->gather_gen, &comm->err), out);
    SL_CHECK_GOTO(sl_nccl_allgather_inplace(g->api, g->nccl, req->xfer.buf,
                                            req->xfer.nbytes,
                                            req->xfer.elem_size,
                                            comm->layout.tp_size,
                                            comm->layout.tp_index,
                                            (cudaStream_t)g->stream,
                                            &comm->err), out);
    status = sl_nccl_settle(g->api, g->nccl, sl_deadline(comm->timeout),
                            "the NCCL gather's collective", &comm->err);
    if (status != STAGELINK_SUCCESS) {
        /* The communicator is broken or stuck for the whole group: the
         * fault path aborts it, so no TP peer waits for this one. */
        sl_peer_group_failed(comm, "%s", comm->err.msg);
        goto out;
    }
    SL_CHECK_GOTO(sl_device_event_get(comm, &req->gather_event), out);
    SL_CHECK_GOTO(gpu->event_record(req->gather_event, g->stream, &comm->err),
                  out);
    status = sl_gather_nccl_track(g);
out:
    /* The stream holds what it waits for: the event can be reused. */
    sl_device_event_put(comm, posted);
    if (status != STAGELINK_SUCCESS) {
        sl_gather_nccl_release(g, slot);
    }
    return status;
}

/* The statuses of the peers are awaited from the start. */
static sl_status_t sl_gather_nccl_post(void *state, sl_req_t *req)
{
    sl_gather_nccl_t *g = state;

    return sl_gather_status_post(g->comm, req);
}

/* May run inside a UCX callback, on any thread: no GPU call here. */
static sl_status_t sl_gather_nccl_shard_ready(void *state, sl_req_t *req,
                                              sl_status_t own)
{
    sl_gather_nccl_t *g = state;

    /* The shard is in device memory: the collective may read it now. */
    sl_gather_nccl_release(g, sl_gather_nccl_slot(g, req));
    if (own == STAGELINK_SUCCESS) {
        sl_gather_count(g->comm, req);
    }
    return sl_gather_status_send(g->comm, req, own);
}

/* The host's stream waits for the collective (torch's Work.wait()). */
static sl_status_t sl_gather_nccl_complete(void *state, sl_req_t *req)
{
    sl_gather_nccl_t *g    = state;
    sl_comm_t        *comm = g->comm;
    sl_status_t       status;

    sl_gather_nccl_release(g, sl_gather_nccl_slot(g, req));
    if (req->gather_event == NULL) {
        return STAGELINK_SUCCESS;
    }
    status = comm->gpu->stream_wait_event(req->xfer.stream, req->gather_event,
                                          &comm->err);
    sl_device_event_put(comm, req->gather_event);
    req->gather_event = NULL;
    return status;
}

/*
 * The communicator failed (a peer died, comm_abort, NCCL's own error):
 * NCCL's abort ends the collectives that wait for a peer, and every gate
 * opens, so the host's streams run on instead of hanging.
 */
static void sl_gather_nccl_fault(void *state)
{
    sl_gather_nccl_t *g = state;
    int               i;

    if (g->nccl == NULL) {
        return;
    }
    /* Gates first: a collective still behind one must reach NCCL's abort
     * flag, not wait for a shard that will never land. */
    for (i = 0; g->flags != NULL && i < g->comm->pool.capacity; ++i) {
        sl_gather_nccl_release(g, (size_t)i);
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
           comm->gpu->event_query(g->running[0], &status, &why)) {
        sl_device_event_put(comm, g->running[0]);
        memmove(g->running, g->running + 1,
                (size_t)--g->nrunning * sizeof(*g->running));
    }
    if (g->nrunning > 0 &&
        sl_nccl_async_error(g->api, g->nccl, &why) != STAGELINK_SUCCESS) {
        sl_peer_group_failed(comm, "%s", why.msg);
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
    .issue       = sl_gather_nccl_issue,
    .post        = sl_gather_nccl_post,
    .shard_ready = sl_gather_nccl_shard_ready,
    .complete    = sl_gather_nccl_complete,
    .fault       = sl_gather_nccl_fault,
};
