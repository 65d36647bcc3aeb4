/*
 * libstagelink-nccl.so: the same stagelink_plugin_v1 with the whole path on
 * NCCL, as Megatron-LM did it: the shard goes by ncclSend/ncclRecv over a
 * two-rank communicator per stage boundary, the TP group rebuilds it with
 * an in-place all-gather, everything ordered on the caller's stream.  It is
 * the baseline to A/B against with STAGELINK_PLUGIN=ucx|nccl.
 *
 * What NCCL imposes: device memory only; NCCL has no tags, so sends and
 * receives between two stages match in posting order (the tag is still
 * checked against reuse); an enqueued operation cannot be canceled; a size
 * mismatch is not detected.  A request is an event after its operations.
 * SPDX-License-Identifier: MIT
 */
#include "gpu.h"
#include "nccl_api.h"

#include "sl_abi.h"
#include "sl_bootstrap.h"
#include "sl_launcher.h"
#include "sl_layout.h"
#include "sl_log.h"
#include "sl_node.h"
#include "sl_registry.h"
#include "sl_settings.h"
#include "sl_shard.h"
#include "sl_time.h"
#include "sl_topo.h"
#include "sl_xfer_check.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SL_NREQ_MAGIC 0x534c4e52u /* "SLNR" */

struct stagelink_request {
    uint32_t         magic;
    int              in_use;
    stagelink_op_kind_t kind;
    int              backward;
    stagelink_tag_t  tag;
    void            *event;
    double           wait_deadline; /**< of wait_for's slices; 0: none started */
};

struct stagelink_memh {
    void  *addr;
    size_t length;
};

struct stagelink_comm {
    sl_errbuf_t          err;
    sl_settings_t        set;
    sl_layout_t          layout;
    char                 node_id[SL_NODE_ID_LEN];
    int                  prev_inter, next_inter; /**< neighbour on another node */
    sl_bootstrap_t       bootstrap;
    const sl_gpu_ops_t  *gpu;
    int                  device;   /**< the CUDA device it works on */
    void                *context;  /**< its context, current in every call */
    const sl_nccl_api_t *api;
    ncclComm_t           tp, prev, next;  /**< NULL where none */
    struct stagelink_request *reqs;
    int                 *peer_ranks; /**< sl_layout_peers */
    int                  npeers;
    stagelink_counters_t counters;
    atomic_int           aborted;  /**< comm_abort (any thread) or `fault` */
    /** Held across each NCCL call on tp, prev and next: comm_abort takes
     *  them away under it, so no call uses a handle its abort freed. */
    pthread_mutex_t      nccl_mu;
    sl_status_t          fault;    /**< NCCL's asynchronous error, if that was it */
    char                 fault_msg[SL_ERRBUF_LEN + 64];
};

typedef struct stagelink_comm    sl_ncomm_t;
typedef struct stagelink_request sl_nreq_t;

static sl_registry_t    sl_live = SL_REGISTRY_INITIALIZER;
/* The GPU runtime; a test built on this file gives a fake one. */
static const sl_gpu_ops_t *sl_nccl_runtime = &sl_gpu_default_ops;
static __thread sl_errbuf_t sl_thread_err;

#define SL_LIVE(_comm, _call) \
    SL_CHECK(sl_registry_check(&sl_live, (_comm), (_call), &sl_thread_err))

/* Every rank's part of the setup exchange. */
typedef struct sl_ncard {
    char         node_id[SL_NODE_ID_LEN];
    ncclUniqueId tp_id;   /**< from TP index 0 */
    ncclUniqueId next_id; /**< for the boundary to the next stage */
    sl_layout_claim_t place; /**< checked by each peer (sl_layout_agrees) */
} sl_ncard_t;

/* The card of `rank`: this rank's own, or the one its exchange brought. */
static const sl_ncard_t *sl_ncard_of(const sl_ncomm_t *c, const sl_ncard_t *mine,
                                     const sl_ncard_t *theirs, int rank)
{
    int i;

    for (i = 0; i < c->npeers && c->peer_ranks[i] != rank; ++i) {
    }
    return (rank == c->layout.rank) ? mine : &theirs[i];
}

static sl_status_t sl_ncomm_connect(sl_ncomm_t *c)
{
    const sl_nccl_api_t *api   = c->api;
    sl_ncard_t           mine, *theirs;
    const sl_ncard_t    *card;
    sl_nccl_open_t       open[3];
    sl_status_t          status;
    int                  i, n;

    memset(&mine, 0, sizeof(mine));
    memcpy(mine.node_id, c->node_id, SL_NODE_ID_LEN);
    sl_layout_claim(&c->layout, &mine.place);
    if (c->layout.tp_index == 0) {
        SL_CHECK(sl_nccl_check(api, api->GetUniqueId(&mine.tp_id), NULL,
                               "ncclGetUniqueId", &c->err));
    }
    if (c->layout.next_rank >= 0) {
        SL_CHECK(sl_nccl_check(api, api->GetUniqueId(&mine.next_id), NULL,
                               "ncclGetUniqueId", &c->err));
    }
    c->peer_ranks = calloc((size_t)c->layout.tp_size + 1, sizeof(int));
    theirs        = calloc((size_t)c->layout.tp_size + 1, sizeof(*theirs));
    if (c->peer_ranks == NULL || theirs == NULL) {
        free(theirs);
        return sl_error(&c->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d setup cards", c->layout.tp_size + 1);
    }
    c->npeers = sl_layout_peers(&c->layout, c->peer_ranks);
    SL_CHECK_GOTO(sl_bootstrap_exchange_fixed(&c->bootstrap, "ncards", &mine,
                                              sizeof(mine), c->peer_ranks,
                                              c->npeers, theirs, &c->err), out);
    for (i = 0; i < c->npeers; ++i) {
        SL_CHECK_GOTO(sl_layout_agrees(&c->layout, c->peer_ranks[i],
                                       &theirs[i].place, &c->err), out);
    }
    /* Non-blocking, in one group (a chain of stages cannot wait in a
     * cycle), bounded by STAGELINK_TIMEOUT: a peer that never joins fails
     * init with a sentence instead of hanging it. */
    n = 0;
    if (c->layout.tp_size > 1) {
        card      = sl_ncard_of(c, &mine, theirs, c->layout.tp_ranks[0]);
        open[n++] = (sl_nccl_open_t){&c->tp, c->layout.tp_size,
                                     c->layout.tp_index, card->tp_id,
                                     "ncclCommInitRankConfig (TP group)"};
    }
    if (c->layout.prev_rank >= 0) {
        card          = sl_ncard_of(c, &mine, theirs, c->layout.prev_rank);
        c->prev_inter = strcmp(card->node_id, c->node_id) != 0;
        open[n++]     = (sl_nccl_open_t){&c->prev, 2, 1, card->next_id,
                                         "ncclCommInitRankConfig (previous "
                                         "stage)"};
    }
    if (c->layout.next_rank >= 0) {
        card          = sl_ncard_of(c, &mine, theirs, c->layout.next_rank);
        c->next_inter = strcmp(card->node_id, c->node_id) != 0;
        open[n++]     = (sl_nccl_open_t){&c->next, 2, 0, mine.next_id,
                                         "ncclCommInitRankConfig (next stage)"};
    }
    status = sl_nccl_comms_open(api, open, n, sl_deadline(c->set.timeout),
                                &c->err);
out:
    free(theirs);
    return status;
}

/*
 * Ends every NCCL operation in flight, so the streams waiting on a dead
 * peer run on: comm_abort (from any thread: NCCL allows ncclCommAbort
 * there, as torch's watchdog calls it) or NCCL's asynchronous error.  The
 * handles are taken away under nccl_mu, after `aborted` is set, and
 * aborted outside it (an abort may wait for NCCL's proxy).
 */
static void sl_ncomm_fault(sl_ncomm_t *c)
{
    ncclComm_t taken[3];
    int        i;

    pthread_mutex_lock(&c->nccl_mu);
    atomic_store(&c->aborted, 1);
    taken[0] = c->tp;
    taken[1] = c->prev;
    taken[2] = c->next;
    c->tp = c->prev = c->next = NULL;
    pthread_mutex_unlock(&c->nccl_mu);
    for (i = 0; i < 3 && c->api != NULL; ++i) {
        if (taken[i] != NULL) {
            c->api->CommAbort(taken[i]);
        }
    }
}

/* A failure once work is enqueued (which NCCL cannot withdraw): the
 * communicator's fault, said once, and NCCL aborted. */
static void sl_ncomm_fail(sl_ncomm_t *c, sl_status_t status, const char *why)
{
    if (atomic_load(&c->aborted)) {
        return;
    }
    c->fault = status;
    snprintf(c->fault_msg, sizeof(c->fault_msg), "%s; the communicator was "
             "aborted: finalize it", why);
    SL_WARN(SL_SUBSYS_NET, "%s", c->fault_msg);
    sl_ncomm_fault(c);
}

/* The first asynchronous error of the communicators becomes the
 * communicator's fault (polled where the host waits, on its thread). */
static void sl_ncomm_poll_errors(sl_ncomm_t *c)
{
    static const char *const what[3] = {"the TP group's communicator",
                                        "the previous stage's communicator",
                                        "the next stage's communicator"};
    ncclComm_t *handles[3] = {&c->tp, &c->prev, &c->next};
    sl_errbuf_t why;
    sl_status_t status;
    int         i;

    for (i = 0; i < 3; ++i) {
        pthread_mutex_lock(&c->nccl_mu);
        status = (*handles[i] != NULL && !atomic_load(&c->aborted))
                     ? sl_nccl_async_error(c->api, *handles[i], what[i], &why)
                     : STAGELINK_SUCCESS;
        pthread_mutex_unlock(&c->nccl_mu);
        if (status != STAGELINK_SUCCESS) {
            sl_ncomm_fail(c, status, why.msg);
            return;
        }
    }
}

static void sl_ncomm_destroy(sl_ncomm_t *c)
{
    sl_gpu_entry_t entry;
    int            i;

    sl_gpu_enter(c->gpu, c->context, &entry, &c->err);
    if (c->api != NULL) {
        /* After an abort the peers may never answer: NCCL's abort does not
         * wait for them. */
        ncclResult_t (*close)(ncclComm_t) =
            atomic_load(&c->aborted) ? c->api->CommAbort : c->api->CommDestroy;

        pthread_mutex_lock(&c->nccl_mu);
        if (c->tp) close(c->tp);
        if (c->prev) close(c->prev);
        if (c->next) close(c->next);
        c->tp = c->prev = c->next = NULL;
        pthread_mutex_unlock(&c->nccl_mu);
    }
    pthread_mutex_destroy(&c->nccl_mu);
    for (i = 0; c->reqs != NULL && i < c->set.max_requests; ++i) {
        if (c->reqs[i].event != NULL) {
            c->gpu->event_destroy(c->reqs[i].event);
        }
    }
    sl_gpu_leave(&entry);
    free(c->reqs);
    free(c->peer_ranks);
    sl_bootstrap_cleanup(&c->bootstrap);
    sl_layout_cleanup(&c->layout);
    free(c);
}

/*
 * The device and context of every call, as the UCX plugin takes them: the
 * config's device (its primary context), else the host's current context
 * at init; where the host has none, the rank's GPU on its node, as NCCL's
 * users place it (local rank i on GPU i, modulo the GPUs seen): NCCL's
 * communicators are made at init, so the first tensor comes too late to
 * choose.  Calls make it current and give the caller's back.
 */
static sl_status_t sl_nccl_device(sl_ncomm_t *c, const stagelink_config_t *config,
                                  int local_rank)
{
    char ids[SL_TOPO_MAX_GPUS][16];
    int  current, ngpus;

    c->device = -1;
    if (!sl_gpu_has_contexts(c->gpu)) {
        return STAGELINK_SUCCESS;
    }
    if (config->flags & STAGELINK_CONFIG_DEVICE_SET) {
        if (config->device < 0) {
            return sl_error(&c->err, STAGELINK_ERR_CONFIG, "the config names "
                            "CUDA device %d (STAGELINK_CONFIG_DEVICE_SET): give "
                            "a device ordinal, 0 or more", config->device);
        }
        c->device = config->device;
        return sl_gpu_context_of(c->gpu, c->device, &c->context, &c->err);
    }
    c->context = c->gpu->context_current();
    if (c->context == NULL) {
        ngpus     = c->gpu->pci_bus_ids(ids, SL_TOPO_MAX_GPUS, &current);
        c->device = (local_rank > 0 && ngpus > 0) ? local_rank % ngpus : 0;
        SL_INFO(SL_SUBSYS_INIT, "no CUDA device was current at comm_init: "
                "device %d, of local rank %d and %d GPUs", c->device,
                local_rank, ngpus);
        return sl_gpu_context_of(c->gpu, c->device, &c->context, &c->err);
    }
    c->device = c->gpu->device_current();
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_nccl_comm_init(const stagelink_config_t *host_config,
                                            stagelink_comm_t **out)
{
    const stagelink_config_t *config = host_config;
    stagelink_config_t        copy;
    sl_launcher_t launcher;
    sl_gpu_entry_t entry;
    sl_ncomm_t   *c;
    sl_status_t   status;
    char          why[160];
    int           tp;

    if (config == NULL || out == NULL) {
        return sl_error(&sl_thread_err, STAGELINK_ERR_INVALID_ARG,
                        "comm_init needs a config (%p) and an output "
                        "pointer (%p)", (const void *)config, (void *)out);
    }
    *out = NULL;
    c    = calloc(1, sizeof(*c));
    if (c == NULL) {
        return sl_error(&sl_thread_err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a communicator");
    }
    pthread_mutex_init(&c->nccl_mu, NULL);
    c->gpu               = sl_nccl_runtime;
    SL_CHECK_GOTO(sl_config_copy(host_config, &copy, &c->err), err);
    config = &copy;
    SL_CHECK_GOTO(sl_settings_parse(config, &c->set, &c->err), err);
    /* Refused before any exchange, so no peer waits for this rank. */
    if (!c->gpu->probe(why, sizeof(why))) {
        status = sl_error(&c->err, STAGELINK_ERR_UNSUPPORTED,
                          "the NCCL plugin moves device memory only, but %s; "
                          "use STAGELINK_PLUGIN=ucx", why);
        goto err;
    }
    SL_CHECK_GOTO(sl_launcher_detect(config, &launcher, &c->err), err);
    SL_CHECK_GOTO(sl_nccl_device(c, config, launcher.local_rank), err);
    SL_CHECK_GOTO(sl_nccl_api_get(&c->api, &c->err), err);
    sl_log_set_rank(launcher.rank);
    tp = (config->tp_size == 0) ? 1 : config->tp_size;
    SL_CHECK_GOTO(config->topology
                      ? sl_layout_from_topology(launcher.rank, launcher.world_size,
                                                tp, config->pp_size,
                                                config->topology, &c->layout,
                                                &c->err)
                      : sl_layout_from_order(launcher.rank, launcher.world_size,
                                             tp, config->pp_size, &c->layout,
                                             &c->err), err);
    SL_CHECK_GOTO(sl_node_id(c->node_id, &c->err), err);
    c->reqs = calloc((size_t)c->set.max_requests, sizeof(*c->reqs));
    if (c->reqs == NULL) {
        status = sl_error(&c->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d requests", c->set.max_requests);
        goto err;
    }
    SL_CHECK_GOTO(sl_bootstrap_init(&c->bootstrap, config, &launcher,
                                    c->set.timeout, &c->err), err);
    sl_gpu_enter(c->gpu, c->context, &entry, &c->err);
    status = sl_ncomm_connect(c);
    sl_gpu_leave(&entry);
    if (status != STAGELINK_SUCCESS) {
        goto err;
    }
    SL_CHECK_GOTO(sl_registry_add(&sl_live, c, &c->err), err);
    SL_INFO(SL_SUBSYS_INIT, "NCCL plugin: rank %d/%d tp %d/%d, mode %s, "
            "CUDA device %d", c->layout.rank, c->layout.world_size,
            c->layout.tp_index, c->layout.tp_size, sl_mode_name(c->set.mode),
            c->device);
    *out = c;
    return STAGELINK_SUCCESS;

err:
    sl_thread_err = c->err;
    sl_ncomm_destroy(c);
    return status;
}

static stagelink_status_t sl_nccl_comm_finalize(stagelink_comm_t *c)
{
    sl_errbuf_t drop;

    SL_LIVE(c, "comm_finalize");
    sl_registry_remove(&sl_live, c);
    if (!atomic_load(&c->aborted) &&
        sl_bootstrap_barrier(&c->bootstrap, c->peer_ranks, c->npeers,
                             &drop) != STAGELINK_SUCCESS) {
        SL_WARN(SL_SUBSYS_INIT, "finalize barrier failed (%s)", drop.msg);
    }
    sl_ncomm_destroy(c);
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_nccl_comm_info(stagelink_comm_t *c,
                                            stagelink_comm_info_t *info)
{
    SL_LIVE(c, "comm_info");
    if (info == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "comm_info: info is NULL");
    }
    sl_layout_info(&c->layout, info);
    info->local_rank = -1;
    info->local_size = -1;
    info->mode       = c->set.mode;
    snprintf(info->gather_backend, sizeof(info->gather_backend), "%s",
             (c->layout.tp_size > 1 &&
              c->set.mode == STAGELINK_MODE_SCATTER_GATHER) ? "nccl" : "none");
    snprintf(info->node_id, sizeof(info->node_id), "%s", c->node_id);
    return STAGELINK_SUCCESS;
}

static const char *sl_nccl_last_error(stagelink_comm_t *c)
{
    return sl_registry_find(&sl_live, c) ? c->err.msg : sl_thread_err.msg;
}

static stagelink_status_t sl_nccl_mem_register(stagelink_comm_t *c, void *buf,
                                               size_t nbytes,
                                               stagelink_mem_type_t type,
                                               stagelink_memh_t **memh)
{
    SL_LIVE(c, "mem_register");
    (void)type;
    if (buf == NULL || nbytes == 0 || memh == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "mem_register needs a buffer (%p), a size (%zu) and "
                        "a handle pointer", buf, nbytes);
    }
    /* NCCL registers on its own; the handle keeps the API the same. */
    *memh = calloc(1, sizeof(**memh));
    if (*memh == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a memory handle");
    }
    (*memh)->addr   = buf;
    (*memh)->length = nbytes;
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_nccl_mem_deregister(stagelink_comm_t *c,
                                                 stagelink_memh_t *memh)
{
    SL_LIVE(c, "mem_deregister");
    free(memh);
    return STAGELINK_SUCCESS;
}

/* The two-rank communicator of a (checked) transfer and the peer's rank in it. */
static void sl_nccl_route(const sl_ncomm_t *c, const stagelink_xfer_t *x,
                          ncclComm_t *pair, int *peer)
{
    int to_next = (x->peer == STAGELINK_PEER_NEXT);

    *pair = to_next ? c->next : c->prev;
    *peer = to_next ? 1 : 0;
}

/*
 * Checks one transfer, before any request slot is claimed for it (so the
 * scan for a tag in flight cannot meet the transfer's own request).
 */
static sl_status_t sl_nccl_check_xfer(sl_ncomm_t *c, stagelink_op_kind_t kind,
                                      const stagelink_xfer_t *x)
{
    int backward, i, device = -1;

    stagelink_mem_type_t type;

    SL_CHECK(sl_xfer_check(&c->layout, kind, x, &backward, &c->err));
    type = (x->nbytes > 0) ? c->gpu->classify(x->buf, &device) : x->mem_type;
    /* Host memory declared CUDA would reach NCCL's kernels (pageable: an
     * illegal address, sticky for the whole context); the UCX plugin
     * refuses the contradiction too, pinned memory included. */
    if (x->nbytes > 0 &&
        (x->mem_type == STAGELINK_MEM_HOST || type == STAGELINK_MEM_HOST)) {
        return sl_error(&c->err, STAGELINK_ERR_UNSUPPORTED,
                        "%s: the buffer at %p is host memory%s, and the NCCL "
                        "plugin moves device memory only; use "
                        "STAGELINK_PLUGIN=ucx for host buffers",
                        (kind == STAGELINK_OP_SEND) ? "send" : "receive",
                        x->buf, (x->mem_type == STAGELINK_MEM_CUDA)
                                    ? " (declared STAGELINK_MEM_CUDA)" : "");
    }
    if (x->nbytes > 0 && device >= 0 && c->device >= 0 && device != c->device) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG, "%s: the tensor "
                        "at %p is on CUDA device %d, but the communicator "
                        "works on device %d; move it there first",
                        (kind == STAGELINK_OP_SEND) ? "send" : "receive",
                        x->buf, device, c->device);
    }
    for (i = 0; i < c->set.max_requests; ++i) {
        const sl_nreq_t *r = &c->reqs[i];

        if (r->in_use && sl_xfer_same_tag(r->kind, r->backward, r->tag, kind,
                                          backward, x->tag)) {
            return sl_xfer_tag_in_use(kind, backward, x->tag, &c->err);
        }
    }
    return STAGELINK_SUCCESS;
}

/* A whole batch before anything of it is claimed or enqueued. */
static sl_status_t sl_nccl_check_batch(sl_ncomm_t *c, const stagelink_op_t *ops,
                                       size_t n)
{
    size_t i;

    for (i = 0; i < n; ++i) {
        SL_CHECK(sl_nccl_check_xfer(c, ops[i].kind, &ops[i].xfer));
    }
    return sl_xfer_check_batch(ops, n, &c->err);
}

static sl_status_t sl_nccl_req_get(sl_ncomm_t *c, sl_nreq_t **out)
{
    int i;

    for (i = 0; i < c->set.max_requests; ++i) {
        if (!c->reqs[i].in_use) {
            if (c->reqs[i].event == NULL) {
                SL_CHECK(c->gpu->event_create(&c->reqs[i].event, &c->err));
            }
            c->reqs[i].in_use        = 1;
            c->reqs[i].magic         = SL_NREQ_MAGIC;
            c->reqs[i].wait_deadline = 0.0;
            *out              = &c->reqs[i];
            return STAGELINK_SUCCESS;
        }
    }
    return sl_error(&c->err, STAGELINK_ERR_NO_MEMORY,
                    "%d transfers already in flight; raise "
                    "STAGELINK_MAX_REQUESTS", c->set.max_requests);
}

/* Enqueues one transfer's NCCL operations (no event yet). */
static sl_status_t sl_nccl_enqueue(sl_ncomm_t *c, stagelink_op_kind_t kind,
                                   const stagelink_xfer_t *x, ncclComm_t pair,
                                   int peer, int gather)
{
    const sl_nccl_api_t *api = c->api;
    cudaStream_t         s   = (cudaStream_t)x->stream;
    int                  inter = (x->peer == STAGELINK_PEER_NEXT) ? c->next_inter
                                                                  : c->prev_inter;
    sl_shard_t           sh  = {0, x->nbytes};

    if (c->set.mode != STAGELINK_MODE_FULL) {
        sh = sl_shard_get(x->nbytes, x->elem_size, c->layout.tp_size,
                          c->layout.tp_index);
    }
    if (kind == STAGELINK_OP_SEND) {
        c->counters.stage_bytes_sent += sh.length;
        *(inter ? &c->counters.inter_node_bytes_sent
                : &c->counters.intra_node_bytes_sent) += sh.length;
        return sl_nccl_check(api, api->Send((char *)x->buf + sh.offset,
                                            sh.length, ncclInt8, peer, pair, s),
                             pair, "ncclSend", &c->err);
    }
    if (!gather) {
        c->counters.stage_bytes_recv += sh.length;
        *(inter ? &c->counters.inter_node_bytes_recv
                : &c->counters.intra_node_bytes_recv) += sh.length;
        return sl_nccl_check(api, api->Recv((char *)x->buf + sh.offset,
                                            sh.length, ncclInt8, peer, pair, s),
                             pair, "ncclRecv", &c->err);
    }
    c->counters.gather_bytes_sent += sh.length * (size_t)(c->layout.tp_size - 1);
    c->counters.gather_bytes_recv += x->nbytes - sh.length;
    c->counters.intra_node_bytes_sent += sh.length * (size_t)(c->layout.tp_size - 1);
    c->counters.intra_node_bytes_recv += x->nbytes - sh.length;
    return sl_nccl_allgather_inplace(api, c->tp, x->buf, x->nbytes,
                                     x->elem_size, c->layout.tp_size,
                                     c->layout.tp_index, s, &c->err);
}

static sl_status_t sl_nccl_aborted(sl_ncomm_t *c)
{
    if (!atomic_load(&c->aborted)) {
        return STAGELINK_SUCCESS;
    }
    if (c->fault != STAGELINK_SUCCESS) {
        return sl_error(&c->err, c->fault, "%s", c->fault_msg);
    }
    return sl_error(&c->err, STAGELINK_ERR_ABORTED, "the communicator was "
                    "aborted (comm_abort); finalize it");
}

/* NCCL's rule for non-blocking communicators: a call's ncclInProgress is
 * waited out before the next call. */
static sl_status_t sl_nccl_settle_all(sl_ncomm_t *c, const char *what)
{
    ncclComm_t comms[3];
    double     deadline = sl_deadline(c->set.timeout);
    int        i;

    pthread_mutex_lock(&c->nccl_mu);
    comms[0] = c->tp;
    comms[1] = c->prev;
    comms[2] = c->next;
    pthread_mutex_unlock(&c->nccl_mu);
    for (i = 0; i < 3; ++i) {
        if (comms[i] != NULL) {
            SL_CHECK(sl_nccl_settle(c->api, comms[i], deadline, &c->aborted,
                                    &c->nccl_mu, what, &c->err));
        }
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_nccl_post(sl_ncomm_t *c, const stagelink_op_t *ops,
                                size_t n, stagelink_request_t **reqs)
{
    const sl_nccl_api_t *api;
    ncclComm_t           pair;
    sl_status_t          status = STAGELINK_SUCCESS;
    int                  peer, sg, started = 0;
    size_t               i, j;

    SL_CHECK(sl_nccl_aborted(c));
    api = c->api;
    if (n > 0 && (ops == NULL || reqs == NULL)) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "post_batch of %zu operations with NULL arrays", n);
    }
    for (i = 0; i < n; ++i) {
        reqs[i] = NULL;
    }
    /* Everything is checked before the first slot is claimed. */
    SL_CHECK(sl_nccl_check_batch(c, ops, n));
    for (i = 0; i < n; ++i) {
        status = sl_nccl_req_get(c, &reqs[i]);
        if (status != STAGELINK_SUCCESS) {
            /* Out of slots, or a slot's event could not be made: give back
             * what the batch took, and leave the caller no pointer to it. */
            for (j = 0; j < i; ++j) {
                reqs[j]->in_use = 0;
                reqs[j]         = NULL;
            }
            return status;
        }
        reqs[i]->backward = sl_xfer_backward(ops[i].kind, &ops[i].xfer);
        reqs[i]->kind     = ops[i].kind;
        reqs[i]->tag      = ops[i].xfer.tag;
    }
    /* The point-to-point part in one group, as batch_isend_irecv does; if
     * the group cannot start, the slots are given back below. */
    pthread_mutex_lock(&c->nccl_mu);
    status = atomic_load(&c->aborted)
                 ? sl_nccl_aborted(c)
                 : sl_nccl_check(api, api->GroupStart(), NULL,
                                 "ncclGroupStart", &c->err);
    if (status == STAGELINK_SUCCESS) {
        started = 1;
        for (i = 0; i < n && status == STAGELINK_SUCCESS; ++i) {
            sl_nccl_route(c, &ops[i].xfer, &pair, &peer);
            status = sl_nccl_enqueue(c, ops[i].kind, &ops[i].xfer, pair, peer,
                                     0);
        }
        if (sl_nccl_check(api, api->GroupEnd(), NULL, "ncclGroupEnd",
                          &c->err) != STAGELINK_SUCCESS) {
            status = STAGELINK_ERR_TRANSPORT;
        }
    }
    pthread_mutex_unlock(&c->nccl_mu);
    if (status == STAGELINK_SUCCESS) {
        status = sl_nccl_settle_all(c, "the stage boundary's ncclSend/ncclRecv");
    }
    sg = (c->set.mode == STAGELINK_MODE_SCATTER_GATHER && c->layout.tp_size > 1);
    for (i = 0; i < n && status == STAGELINK_SUCCESS; ++i) {
        if (sg && ops[i].kind == STAGELINK_OP_RECV) {
            pthread_mutex_lock(&c->nccl_mu);
            status = atomic_load(&c->aborted)
                         ? sl_nccl_aborted(c)
                         : sl_nccl_enqueue(c, ops[i].kind, &ops[i].xfer, NULL,
                                           0, 1);
            pthread_mutex_unlock(&c->nccl_mu);
            if (status == STAGELINK_SUCCESS) {
                status = sl_nccl_settle_all(c, "the TP group's all-gather");
            }
        }
        if (status == STAGELINK_SUCCESS) {
            status = c->gpu->event_record(reqs[i]->event, ops[i].xfer.stream,
                                          &c->err);
        }
    }
    if (status != STAGELINK_SUCCESS) {
        /* Enqueued work cannot be withdrawn: the communicator is unusable,
         * and its streams are released. */
        if (started) {
            sl_ncomm_fail(c, status, c->err.msg);
        }
        for (i = 0; i < n; ++i) {
            reqs[i]->in_use = 0;
            reqs[i]         = NULL;
        }
    }
    return status;
}

/* Posts ops of this build's layout with the communicator's GPU current. */
static sl_status_t sl_nccl_post_ops(sl_ncomm_t *c, const stagelink_op_t *ops,
                                    size_t n, stagelink_request_t **reqs)
{
    sl_gpu_entry_t entry;
    sl_status_t    status;

    sl_gpu_enter(c->gpu, c->context, &entry, &c->err);
    status = sl_nccl_post(c, ops, n, reqs);
    sl_gpu_leave(&entry);
    return status;
}

static stagelink_status_t sl_nccl_post_batch_sized(stagelink_comm_t *c,
                                                   const stagelink_op_t *ops,
                                                   size_t n, size_t op_size,
                                                   stagelink_request_t **reqs)
{
    const stagelink_op_t *own;
    stagelink_op_t       *copy;
    sl_status_t           status;

    SL_LIVE(c, "post_batch");
    SL_CHECK(sl_abi_ops_in(ops, n, op_size, reqs, &own, &copy, &c->err));
    status = sl_nccl_post_ops(c, own, n, reqs);
    free(copy);
    return status;
}

static stagelink_status_t sl_nccl_post_batch(stagelink_comm_t *c,
                                             const stagelink_op_t *ops,
                                             size_t n,
                                             stagelink_request_t **reqs)
{
    return sl_nccl_post_batch_sized(c, ops, n, 0, reqs);
}

/* One send or receive, as a batch of one. */
static stagelink_status_t sl_nccl_post_one(stagelink_comm_t *c,
                                           stagelink_op_kind_t kind,
                                           const stagelink_xfer_t *x,
                                           stagelink_request_t **req)
{
    stagelink_op_t op = {.kind = kind};

    SL_LIVE(c, (kind == STAGELINK_OP_SEND) ? "isend" : "irecv");
    if (x == NULL || req == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "%s: NULL transfer or request pointer",
                        (kind == STAGELINK_OP_SEND) ? "isend" : "irecv");
    }
    *req = NULL;
    SL_CHECK(sl_abi_xfer_in(x, &op.xfer, &c->err));
    return sl_nccl_post_ops(c, &op, 1, req);
}

static stagelink_status_t sl_nccl_isend(stagelink_comm_t *c,
                                        const stagelink_xfer_t *x,
                                        stagelink_request_t **req)
{
    return sl_nccl_post_one(c, STAGELINK_OP_SEND, x, req);
}

static stagelink_status_t sl_nccl_irecv(stagelink_comm_t *c,
                                        const stagelink_xfer_t *x,
                                        stagelink_request_t **req)
{
    return sl_nccl_post_one(c, STAGELINK_OP_RECV, x, req);
}

static sl_status_t sl_nccl_req_check(sl_ncomm_t *c, sl_nreq_t *r)
{
    if (r == NULL || r < c->reqs || r >= c->reqs + c->set.max_requests ||
        !r->in_use || r->magic != SL_NREQ_MAGIC) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "request %p is not in flight on this communicator",
                        (void *)r);
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_nccl_poll(sl_ncomm_t *c, sl_nreq_t *r, int *done)
{
    sl_status_t status = STAGELINK_SUCCESS;

    if (done == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG, "test: done is NULL");
    }
    *done = 0;
    SL_CHECK(sl_nccl_req_check(c, r));
    if (atomic_load(&c->aborted)) {
        *done     = 1;
        r->in_use = 0;
        return sl_nccl_aborted(c);
    }
    if (!c->gpu->event_query(r->event, &status, &c->err)) {
        sl_ncomm_poll_errors(c);
        if (atomic_load(&c->aborted)) {
            *done     = 1;
            r->in_use = 0;
            return sl_nccl_aborted(c);
        }
        return STAGELINK_SUCCESS;
    }
    *done     = 1;
    r->in_use = 0;
    if (status == STAGELINK_SUCCESS) {
        ++c->counters.transfers_completed;
    }
    return status;
}

static stagelink_status_t sl_nccl_test(stagelink_comm_t *c,
                                       stagelink_request_t *r, int *done)
{
    sl_gpu_entry_t entry;
    sl_status_t    status;

    SL_LIVE(c, "test");
    sl_gpu_enter(c->gpu, c->context, &entry, &c->err);
    status = sl_nccl_poll(c, r, done);
    sl_gpu_leave(&entry);
    return status;
}

/* Until done, `deadline` (TIMEOUT) or `slice_end` (IN_PROGRESS); 0 = none.
 * The device's event has no fd to sleep on: short naps. */
static sl_status_t sl_nccl_wait_until(sl_ncomm_t *c, sl_nreq_t *r,
                                      double deadline, double slice_end)
{
    struct timespec nap = {0, 50000};
    sl_gpu_entry_t  entry;
    sl_status_t     status;
    int             done = 0;

    sl_gpu_enter(c->gpu, c->context, &entry, &c->err);
    for (;;) {
        status = sl_nccl_poll(c, r, &done);
        if (done || status != STAGELINK_SUCCESS) {
            break;
        }
        if (sl_deadline_passed(slice_end) && !sl_deadline_passed(deadline)) {
            status = STAGELINK_IN_PROGRESS;
            break;
        }
        if (sl_deadline_passed(deadline)) {
            status = sl_error(&c->err, STAGELINK_ERR_TIMEOUT,
                              "transfer of microbatch %u chunk %u did not "
                              "complete in %.1f s (NCCL matches by posting "
                              "order: check that both stages post alike)",
                              r->tag.microbatch, r->tag.chunk, c->set.timeout);
            break;
        }
        nanosleep(&nap, NULL);
    }
    sl_gpu_leave(&entry);
    return status;
}

static stagelink_status_t sl_nccl_wait(stagelink_comm_t *c,
                                       stagelink_request_t *r)
{
    SL_LIVE(c, "wait");
    SL_CHECK(sl_nccl_req_check(c, r));
    return sl_nccl_wait_until(c, r, sl_deadline(c->set.timeout), 0.0);
}

static stagelink_status_t sl_nccl_wait_for(stagelink_comm_t *c,
                                           stagelink_request_t *r,
                                           int timeout_ms)
{
    sl_status_t status;

    SL_LIVE(c, "wait_for");
    SL_CHECK(sl_nccl_req_check(c, r));
    if (r->wait_deadline == 0.0) {
        r->wait_deadline = sl_deadline(c->set.timeout);
    }
    status = sl_nccl_wait_until(c, r, r->wait_deadline,
                                (timeout_ms < 0) ? 0.0
                                    : sl_time_now() + timeout_ms * 1e-3);
    if (status != STAGELINK_IN_PROGRESS) {
        r->wait_deadline = 0.0;
    }
    return status;
}

/* Completion is the event seen done from the host: the data is already
 * there for any stream the host queues work on afterwards. */
static stagelink_status_t sl_nccl_order_stream(stagelink_comm_t *c,
                                               stagelink_request_t *r,
                                               void *stream)
{
    (void)stream;
    SL_LIVE(c, "order_stream");
    return sl_nccl_req_check(c, r);
}

static stagelink_status_t sl_nccl_cancel(stagelink_comm_t *c,
                                         stagelink_request_t *r)
{
    SL_LIVE(c, "cancel");
    SL_CHECK(sl_nccl_req_check(c, r));
    return sl_error(&c->err, STAGELINK_ERR_UNSUPPORTED,
                    "NCCL cannot withdraw an enqueued operation; wait for it");
}

static stagelink_status_t sl_nccl_get_counters(stagelink_comm_t *c,
                                               stagelink_counters_t *out)
{
    SL_LIVE(c, "get_counters");
    if (out == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "get_counters: counters is NULL");
    }
    *out = c->counters;
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_nccl_comm_abort(stagelink_comm_t *c)
{
    SL_LIVE(c, "comm_abort");
    sl_ncomm_fault(c);
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_nccl_comm_get_error(stagelink_comm_t *c,
                                                 int *failed_rank)
{
    SL_LIVE(c, "comm_get_error");
    if (failed_rank == NULL) {
        return sl_error(&c->err, STAGELINK_ERR_INVALID_ARG,
                        "comm_get_error: failed_rank is NULL");
    }
    /* NCCL reports a dead peer as a transport error of the operation, not
     * by rank. */
    *failed_rank = -1;
    return sl_nccl_aborted(c);
}

static size_t sl_nccl_describe(char *buf, size_t len)
{
    const sl_nccl_api_t *api;
    sl_errbuf_t          eb;
    char                 gpu[160];
    int                  version = 0, n;

    sl_gpu_default_ops.probe(gpu, sizeof(gpu));
    if (sl_nccl_api_get(&api, &eb) != STAGELINK_SUCCESS) {
        n = snprintf(buf, len, "NCCL: %s\nGPU: %s\n", eb.msg, gpu);
    } else {
        api->GetVersion(&version);
        n = snprintf(buf, len, "NCCL %d.%d.%d from %s\nGPU: %s\n",
                     version / 10000, version / 100 % 100, version % 100,
                     api->path, gpu);
    }
    return (n < 0) ? 0 : (size_t)n;
}

__attribute__((visibility("default")))
const stagelink_plugin_v1_t stagelink_plugin_v1 = {
    .abi_version    = STAGELINK_ABI_VERSION_1,
    .struct_size    = sizeof(stagelink_plugin_v1_t),
    .name           = "nccl",
    .version        = STAGELINK_VERSION_STRING,
    .comm_init      = sl_nccl_comm_init,
    .comm_finalize  = sl_nccl_comm_finalize,
    .comm_info      = sl_nccl_comm_info,
    .last_error     = sl_nccl_last_error,
    .mem_register   = sl_nccl_mem_register,
    .mem_deregister = sl_nccl_mem_deregister,
    .isend          = sl_nccl_isend,
    .irecv          = sl_nccl_irecv,
    .post_batch     = sl_nccl_post_batch,
    .test           = sl_nccl_test,
    .wait           = sl_nccl_wait,
    .cancel         = sl_nccl_cancel,
    .get_counters   = sl_nccl_get_counters,
    .comm_abort     = sl_nccl_comm_abort,
    .comm_get_error = sl_nccl_comm_get_error,
    .describe       = sl_nccl_describe,
    .wait_for       = sl_nccl_wait_for,
    .order_stream   = sl_nccl_order_stream,
    .post_batch_sized = sl_nccl_post_batch_sized,
};
