/*
 * libstagelink-ucx.so: the v1 vtable, argument checks at the boundary, the
 * registry of live communicators (so a finalized or foreign handle gets a
 * clear status instead of a crash), and communicator init/finalize.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "gather.h"

#include "sl_bootstrap.h"
#include "sl_env.h"
#include "sl_launcher.h"
#include "sl_log.h"
#include "sl_topo.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t sl_live_lock = PTHREAD_MUTEX_INITIALIZER;
static sl_comm_t      *sl_live_head;

/* Errors of calls without a live communicator (init, bad handles). */
static __thread sl_errbuf_t sl_thread_err;

static void sl_live_add(sl_comm_t *comm)
{
    pthread_mutex_lock(&sl_live_lock);
    comm->live_next = sl_live_head;
    sl_live_head    = comm;
    pthread_mutex_unlock(&sl_live_lock);
}

static int sl_live_remove(sl_comm_t *comm)
{
    sl_comm_t **p;
    int         found = 0;

    pthread_mutex_lock(&sl_live_lock);
    for (p = &sl_live_head; *p != NULL; p = &(*p)->live_next) {
        if (*p == comm) {
            *p    = comm->live_next;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&sl_live_lock);
    return found;
}

static int sl_live_find(const sl_comm_t *comm)
{
    const sl_comm_t *c;

    pthread_mutex_lock(&sl_live_lock);
    for (c = sl_live_head; c != NULL && c != comm; c = c->live_next) {
    }
    pthread_mutex_unlock(&sl_live_lock);
    return comm != NULL && c != NULL;
}

static sl_status_t sl_live_check(const sl_comm_t *comm, const char *call)
{
    if (!sl_live_find(comm)) {
        return sl_error(&sl_thread_err, STAGELINK_ERR_INVALID_STATE,
                        "%s: communicator %p is not live (NULL, finalized "
                        "already, or never initialized)", call,
                        (const void *)comm);
    }
    return STAGELINK_SUCCESS;
}

#define SL_LIVE(_comm, _call) SL_CHECK(sl_live_check((_comm), (_call)))

static sl_status_t sl_config_mode(const stagelink_config_t *config,
                                  stagelink_mode_t *mode, sl_errbuf_t *eb)
{
    static const char *const names[] = {"scatter_gather", "full", "sharded",
                                        NULL};
    int                      choice;

    /* The variable wins, so that the same job can be A/B-tested. */
    if (sl_env_raw(SL_ENV_MODE) != NULL || config->mode == 0) {
        SL_CHECK(sl_env_parse_choice(SL_ENV_MODE, names, &choice, eb));
        *mode = (stagelink_mode_t)(STAGELINK_MODE_SCATTER_GATHER + choice);
        return STAGELINK_SUCCESS;
    }
    if (config->mode < STAGELINK_MODE_SCATTER_GATHER ||
        config->mode > STAGELINK_MODE_SHARDED) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "config mode %d is not a stagelink_mode_t",
                        (int)config->mode);
    }
    *mode = config->mode;
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_comm_settings(sl_comm_t *comm,
                                    const stagelink_config_t *config)
{
    uint64_t       spin_us, max_requests, chunk, nbufs;
    sl_log_level_t level;
    unsigned       subsys;

    SL_CHECK(sl_log_parse_env(&level, &subsys, &comm->err));
    SL_CHECK(sl_config_mode(config, &comm->mode, &comm->err));
    SL_CHECK(sl_env_parse_seconds(SL_ENV_TIMEOUT, &comm->timeout, &comm->err));
    SL_CHECK(sl_env_parse_u64(SL_ENV_SPIN_US, 0, 10000000, &spin_us,
                              &comm->err));
    SL_CHECK(sl_env_parse_u64(SL_ENV_MAX_REQUESTS, 1, 1 << 20, &max_requests,
                              &comm->err));
    SL_CHECK(sl_env_parse_u64(SL_ENV_STAGING_CHUNK, 4096, 1ull << 30, &chunk,
                              &comm->err));
    SL_CHECK(sl_env_parse_u64(SL_ENV_STAGING_BUFFERS, 1, 64, &nbufs,
                              &comm->err));
    comm->spin           = (double)spin_us * 1e-6;
    comm->pool.capacity  = (int)max_requests;
    comm->chunk          = (size_t)chunk;
    comm->nbufs          = (int)nbufs;
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_comm_layout(sl_comm_t *comm,
                                  const stagelink_config_t *config,
                                  const sl_launcher_t *launcher)
{
    int tp = (config->tp_size == 0) ? 1 : config->tp_size;

    if (config->topology != NULL) {
        return sl_layout_from_topology(launcher->rank, launcher->world_size,
                                       tp, config->pp_size, config->topology,
                                       &comm->layout, &comm->err);
    }
    return sl_layout_from_order(launcher->rank, launcher->world_size, tp,
                                config->pp_size, &comm->layout, &comm->err);
}

/* What every rank must know of every other before the UCX context exists. */
typedef struct sl_rank_facts {
    char     node_id[SL_NODE_ID_LEN];
    uint64_t chunk; /**< the device transfers' wire format */
} sl_rank_facts_t;

/* Who shares our node decides local ranks and network devices, so it is
 * known before the UCX context exists. */
static sl_status_t sl_comm_locality(sl_comm_t *comm)
{
    int              world = comm->layout.world_size, r;
    sl_rank_facts_t  mine, *all;
    sl_locality_t    loc;
    sl_status_t      status;

    comm->node_ids = calloc((size_t)world, SL_NODE_ID_LEN);
    all            = calloc((size_t)world, sizeof(*all));
    if (comm->node_ids == NULL || all == NULL) {
        free(all);
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate the facts of %d ranks", world);
    }
    memset(&mine, 0, sizeof(mine));
    memcpy(mine.node_id, comm->node_id, SL_NODE_ID_LEN);
    mine.chunk = comm->chunk;
    SL_CHECK_GOTO(sl_bootstrap_allgather(comm->bootstrap, &mine, all,
                                         sizeof(mine), &comm->err), out);
    for (r = 0; r < world; ++r) {
        memcpy(comm->node_ids[r], all[r].node_id, SL_NODE_ID_LEN);
        if (all[r].chunk != mine.chunk) {
            status = sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                              "STAGELINK_STAGING_CHUNK is %llu on rank %d but "
                              "%llu here: device transfers are cut in these "
                              "chunks, so set it alike on every rank",
                              (unsigned long long)all[r].chunk, r,
                              (unsigned long long)mine.chunk);
            goto out;
        }
    }
    sl_topo_locality((const char (*)[SL_NODE_ID_LEN])comm->node_ids, world,
                     comm->layout.rank, &loc);
    comm->local_rank = loc.local_rank;
    comm->local_size = loc.local_size;
    status           = STAGELINK_SUCCESS;
out:
    free(all);
    return status;
}

static void sl_comm_destroy(sl_comm_t *comm)
{
    sl_gather_cleanup(comm);
    if (comm->gpu != NULL) {
        sl_device_cleanup(comm);
    }
    sl_ucx_worker_destroy(comm);
    if (comm->bootstrap != NULL) {
        sl_bootstrap_cleanup(comm->bootstrap);
        free(comm->bootstrap);
    }
    sl_req_pool_cleanup(&comm->pool);
    free(comm->node_ids);
    free(comm->tp_peers);
    sl_layout_cleanup(&comm->layout);
    comm->magic = 0;
    free(comm);
}

static const char *sl_mode_name(stagelink_mode_t mode)
{
    switch (mode) {
    case STAGELINK_MODE_SCATTER_GATHER: return "scatter_gather";
    case STAGELINK_MODE_FULL:           return "full";
    case STAGELINK_MODE_SHARDED:        return "sharded";
    case STAGELINK_MODE_DEFAULT:        break;
    }
    return "default";
}

static stagelink_status_t sl_ucx_comm_init(const stagelink_config_t *config,
                                           stagelink_comm_t **comm_out)
{
    sl_launcher_t launcher;
    sl_comm_t    *comm;
    sl_status_t   status;
    int           k;

    if (config == NULL || comm_out == NULL) {
        return sl_error(&sl_thread_err, STAGELINK_ERR_INVALID_ARG,
                        "comm_init needs a config (%p) and an output "
                        "pointer (%p)", (const void *)config,
                        (void *)comm_out);
    }
    *comm_out = NULL;
    if (config->struct_size < sizeof(stagelink_config_t)) {
        return sl_error(&sl_thread_err, STAGELINK_ERR_INVALID_ARG,
                        "config struct_size is %u, expected at least %zu: "
                        "zero the struct and set struct_size = "
                        "sizeof(stagelink_config_t)", config->struct_size,
                        sizeof(stagelink_config_t));
    }
    comm = calloc(1, sizeof(*comm));
    if (comm == NULL) {
        return sl_error(&sl_thread_err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a communicator");
    }
    comm->magic     = SL_COMM_MAGIC;
    comm->prev.rank = comm->next.rank = -1;
    comm->bootstrap = calloc(1, sizeof(*comm->bootstrap));
    if (comm->bootstrap == NULL) {
        status = sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate the bootstrap");
        goto err_destroy;
    }
    comm->bootstrap->root_fd = -1;

    SL_CHECK_GOTO(sl_comm_settings(comm, config), err_destroy);
    SL_CHECK_GOTO(sl_launcher_detect(config, &launcher, &comm->err),
                  err_destroy);
    sl_log_set_rank(launcher.rank);
    SL_CHECK_GOTO(sl_comm_layout(comm, config, &launcher), err_destroy);
    SL_CHECK_GOTO(sl_node_id(comm->node_id, &comm->err), err_destroy);
    comm->tp_peers = calloc((size_t)comm->layout.tp_size,
                            sizeof(*comm->tp_peers));
    if (comm->tp_peers == NULL) {
        status = sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d TP peers", comm->layout.tp_size);
        goto err_destroy;
    }
    for (k = 0; k < comm->layout.tp_size; ++k) {
        comm->tp_peers[k].rank = comm->layout.tp_ranks[k];
    }
    sl_device_probe(comm);
    SL_CHECK_GOTO(sl_gather_select(comm), err_destroy);
    SL_CHECK_GOTO(sl_req_pool_init(&comm->pool, comm->pool.capacity,
                                   comm->layout.tp_size, &comm->err),
                  err_destroy);
    SL_CHECK_GOTO(sl_bootstrap_init(comm->bootstrap, config, &launcher,
                                    comm->timeout, &comm->err), err_destroy);
    SL_CHECK_GOTO(sl_comm_locality(comm), err_destroy);
    SL_CHECK_GOTO(sl_ucx_worker_create(comm), err_destroy);
    SL_CHECK_GOTO(sl_device_init(comm), err_destroy);
    SL_CHECK_GOTO(sl_ucx_connect(comm, comm->bootstrap), err_destroy);
    comm->bootstrap->progress     = sl_ucx_progress_cb;
    comm->bootstrap->progress_arg = comm;
    SL_CHECK_GOTO(sl_gather_init(comm), err_destroy);

    SL_INFO(SL_SUBSYS_INIT, "rank %d/%d: tp %d/%d pp %d/%d dp %d, prev %d "
            "next %d, mode %s, gather %s, node %s (local %d/%d)",
            comm->layout.rank, comm->layout.world_size, comm->layout.tp_index,
            comm->layout.tp_size, comm->layout.pp_index, comm->layout.pp_size,
            comm->layout.dp_size, comm->layout.prev_rank,
            comm->layout.next_rank, sl_mode_name(comm->mode),
            comm->gather->name, comm->node_id, comm->local_rank,
            comm->local_size);
    sl_live_add(comm);
    *comm_out = comm;
    return STAGELINK_SUCCESS;

err_destroy:
    sl_thread_err = comm->err;
    sl_comm_destroy(comm);
    return status;
}

static stagelink_status_t sl_ucx_comm_finalize(stagelink_comm_t *comm)
{
    sl_errbuf_t drop;
    sl_req_t   *req;
    int         inflight = 0;

    SL_LIVE(comm, "comm_finalize");
    sl_live_remove(comm);
    comm->closing = 1;
    while ((req = comm->pool.active) != NULL) {
        ++inflight;
        sl_req_cancel_subs(comm, req);
        if (sl_ucx_wait(comm, req) != STAGELINK_SUCCESS) {
            break;
        }
        sl_req_put(comm, req);
    }
    if (inflight > 0) {
        SL_WARN(SL_SUBSYS_INIT, "finalize canceled %d transfers still in "
                "flight", inflight);
    }
    /* A peer's rendezvous send completes only when our acknowledgement
     * leaves: flush, and keep progressing while the others arrive. */
    sl_ucx_flush(comm);
    if (sl_bootstrap_barrier(comm->bootstrap, &drop) != STAGELINK_SUCCESS) {
        SL_WARN(SL_SUBSYS_INIT, "finalize barrier failed (%s); closing "
                "anyway", drop.msg);
    }
    sl_ucx_discard_unexpected(comm);
    sl_comm_destroy(comm);
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_ucx_comm_info(stagelink_comm_t *comm,
                                           stagelink_comm_info_t *info)
{
    SL_LIVE(comm, "comm_info");
    if (info == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "comm_info: info is NULL");
    }
    memset(info, 0, sizeof(*info));
    info->rank       = comm->layout.rank;
    info->world_size = comm->layout.world_size;
    info->tp_size    = comm->layout.tp_size;
    info->pp_size    = comm->layout.pp_size;
    info->dp_size    = comm->layout.dp_size;
    info->tp_index   = comm->layout.tp_index;
    info->pp_index   = comm->layout.pp_index;
    info->dp_index   = comm->layout.dp_index;
    info->prev_rank  = comm->layout.prev_rank;
    info->next_rank  = comm->layout.next_rank;
    info->local_rank = comm->local_rank;
    info->local_size = comm->local_size;
    info->mode       = comm->mode;
    snprintf(info->gather_backend, sizeof(info->gather_backend), "%s",
             (comm->layout.tp_size == 1) ? "none" : comm->gather_dev->name);
    snprintf(info->node_id, sizeof(info->node_id), "%s", comm->node_id);
    return STAGELINK_SUCCESS;
}

static const char *sl_ucx_last_error(stagelink_comm_t *comm)
{
    /* Only looks: the sentence asked for must not be overwritten. */
    if (!sl_live_find(comm)) {
        return sl_thread_err.msg;
    }
    return comm->err.msg;
}

static stagelink_status_t sl_ucx_mem_register(stagelink_comm_t *comm,
                                              void *buf, size_t nbytes,
                                              stagelink_mem_type_t mem_type,
                                              stagelink_memh_t **memh)
{
    SL_LIVE(comm, "mem_register");
    return sl_mem_register(comm, buf, nbytes, mem_type, memh);
}

static stagelink_status_t sl_ucx_mem_deregister(stagelink_comm_t *comm,
                                                stagelink_memh_t *memh)
{
    SL_LIVE(comm, "mem_deregister");
    return sl_mem_deregister(comm, memh);
}

static stagelink_status_t sl_ucx_post(stagelink_comm_t *comm,
                                      stagelink_op_kind_t kind,
                                      const stagelink_xfer_t *xfer,
                                      stagelink_request_t **request)
{
    SL_LIVE(comm, (kind == STAGELINK_OP_SEND) ? "isend" : "irecv");
    if (request == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "the request output pointer is NULL");
    }
    *request = NULL;
    return sl_xfer_post(comm, kind, xfer, request);
}

static stagelink_status_t sl_ucx_isend(stagelink_comm_t *comm,
                                       const stagelink_xfer_t *xfer,
                                       stagelink_request_t **request)
{
    return sl_ucx_post(comm, STAGELINK_OP_SEND, xfer, request);
}

static stagelink_status_t sl_ucx_irecv(stagelink_comm_t *comm,
                                       const stagelink_xfer_t *xfer,
                                       stagelink_request_t **request)
{
    return sl_ucx_post(comm, STAGELINK_OP_RECV, xfer, request);
}

static stagelink_status_t sl_ucx_post_batch(stagelink_comm_t *comm,
                                            const stagelink_op_t *ops,
                                            size_t count,
                                            stagelink_request_t **requests)
{
    SL_LIVE(comm, "post_batch");
    if (count > 0 && (ops == NULL || requests == NULL)) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "post_batch of %zu operations needs ops (%p) and "
                        "requests (%p)", count, (const void *)ops,
                        (void *)requests);
    }
    return sl_xfer_post_batch(comm, ops, count, requests);
}

static stagelink_status_t sl_ucx_test(stagelink_comm_t *comm,
                                      stagelink_request_t *request, int *done)
{
    SL_LIVE(comm, "test");
    if (done == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "test: done is NULL");
    }
    *done = 0;
    SL_CHECK(sl_req_check(comm, request));
    sl_ucx_progress(comm);
    if (!sl_req_done(request)) {
        return STAGELINK_SUCCESS;
    }
    *done = 1;
    return sl_req_finish(comm, request);
}

static stagelink_status_t sl_ucx_wait_req(stagelink_comm_t *comm,
                                          stagelink_request_t *request)
{
    SL_LIVE(comm, "wait");
    SL_CHECK(sl_req_check(comm, request));
    SL_CHECK(sl_ucx_wait(comm, request));
    return sl_req_finish(comm, request);
}

static stagelink_status_t sl_ucx_cancel(stagelink_comm_t *comm,
                                        stagelink_request_t *request)
{
    SL_LIVE(comm, "cancel");
    SL_CHECK(sl_req_check(comm, request));
    sl_req_cancel_subs(comm, request);
    return STAGELINK_SUCCESS;
}

static stagelink_status_t sl_ucx_get_counters(stagelink_comm_t *comm,
                                              stagelink_counters_t *counters)
{
    SL_LIVE(comm, "get_counters");
    if (counters == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "get_counters: counters is NULL");
    }
    *counters = comm->counters;
    return STAGELINK_SUCCESS;
}

__attribute__((visibility("default")))
const stagelink_plugin_v1_t stagelink_plugin_v1 = {
    .abi_version    = STAGELINK_ABI_VERSION_1,
    .struct_size    = sizeof(stagelink_plugin_v1_t),
    .name           = "ucx",
    .version        = STAGELINK_VERSION_STRING,
    .comm_init      = sl_ucx_comm_init,
    .comm_finalize  = sl_ucx_comm_finalize,
    .comm_info      = sl_ucx_comm_info,
    .last_error     = sl_ucx_last_error,
    .mem_register   = sl_ucx_mem_register,
    .mem_deregister = sl_ucx_mem_deregister,
    .isend          = sl_ucx_isend,
    .irecv          = sl_ucx_irecv,
    .post_batch     = sl_ucx_post_batch,
    .test           = sl_ucx_test,
    .wait           = sl_ucx_wait_req,
    .cancel         = sl_ucx_cancel,
    .get_counters   = sl_ucx_get_counters,
};
