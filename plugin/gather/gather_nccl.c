/*
 * NCCL gather: the receiving TP group rebuilds a device tensor with one
 * in-place collective on the caller's stream (ncclAllGather when the
 * shards are equal, else one ncclBroadcast per shard in a group).
 *
 * NCCL needs every rank of a communicator to issue collectives in the same
 * order, while own shards arrive in any order: collectives are enqueued in
 * the order the receives were posted (the same on every TP rank of an SPMD
 * schedule), each when its shard and all earlier ones are in.  A failed
 * shard still takes part (NCCL cannot skip a rank), and a one-byte status
 * to each TP peer over UCX tells them, so no rank reports success for a
 * tensor with a hole.  The request completes once the collective is
 * enqueued and the statuses are in: later work on the stream sees the
 * whole tensor, and the host thread never waits for the GPU.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"

#include "nccl_api.h"
#include "sl_bootstrap.h"
#include "sl_log.h"
#include "sl_topo.h"

#include <stdlib.h>
#include <string.h>

typedef struct sl_gather_nccl {
    sl_comm_t           *comm;
    const sl_nccl_api_t *api;
    ncclComm_t           nccl;
    sl_req_t            *head, *tail; /**< posted, collective not yet enqueued */
} sl_gather_nccl_t;

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
static int sl_nccl_shared_gpu(const sl_comm_t *comm, const sl_nccl_card_t *cards,
                              int *a, int *b)
{
    int i, j;

    for (i = 0; i < comm->layout.tp_size; ++i) {
        for (j = 0; j < i; ++j) {
            *a = comm->layout.tp_ranks[j];
            *b = comm->layout.tp_ranks[i];
            if (cards[*a].gpu[0] != '\0' &&
                strcmp(cards[*a].gpu, cards[*b].gpu) == 0 &&
                strcmp(comm->node_ids[*a], comm->node_ids[*b]) == 0) {
                return 1;
            }
        }
    }
    return 0;
}

static sl_status_t sl_gather_nccl_init(sl_comm_t *comm, void **state)
{
    int               world = comm->layout.world_size, k, root, a, b;
    const sl_nccl_api_t *api = NULL;
    sl_gather_nccl_t *g     = NULL;
    sl_nccl_card_t    mine, *cards;
    sl_errbuf_t       why;
    sl_status_t       status;

    *state = NULL;
    memset(&mine, 0, sizeof(mine));
    why.msg[0] = '\0';
    if (!comm->gpu_usable) {
        snprintf(why.msg, sizeof(why.msg), "%s", comm->gpu_why);
    } else if (sl_nccl_api_get(&api, &why) == STAGELINK_SUCCESS) {
        char ids[SL_TOPO_MAX_GPUS][16];
        int  current = -1;

        mine.use = 1;
        if (comm->gpu->pci_bus_ids(ids, SL_TOPO_MAX_GPUS, &current) > current &&
            current >= 0) {
            memcpy(mine.gpu, ids[current], sizeof(mine.gpu));
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
    cards = calloc((size_t)world, sizeof(*cards));
    if (cards == NULL) {
        /* Cannot happen in practice (a few hundred bytes a rank); the
         * others then fail in the exchange, at their deadline. */
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d NCCL setup cards", world);
    }
    SL_CHECK_GOTO(sl_bootstrap_allgather(comm->bootstrap, &mine, cards,
                                         sizeof(mine), &comm->err), out);
    /* TP index 0 makes the group's id: without it nobody in the group can
     * use NCCL, and every rank of the group knows it from the same card. */
    root = comm->layout.tp_ranks[0];
    if (cards[root].failed) {
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
        if (cards[comm->layout.tp_ranks[k]].use != mine.use) {
            status = sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                              "TP peers disagree on the NCCL gather: rank %d "
                              "%s it, this rank %s (%s); give every rank the "
                              "same GPU setup or STAGELINK_GATHER",
                              comm->layout.tp_ranks[k],
                              cards[comm->layout.tp_ranks[k]].use ? "uses"
                                                                  : "cannot use",
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
                              a, b, cards[a].gpu);
            goto out;
        }
        SL_INFO(SL_SUBSYS_GATHER, "NCCL gather not used: ranks %d and %d of "
                "this TP group share GPU %s (NCCL allows one rank per GPU); "
                "device buffers gather over UCX", a, b, cards[a].gpu);
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
    SL_CHECK_GOTO(sl_nccl_check(api, api->CommInitRank(
                                         &g->nccl, comm->layout.tp_size,
                                         cards[comm->layout.tp_ranks[0]].id,
                                         comm->layout.tp_index),
                                NULL, "ncclCommInitRank of the TP group",
                                &comm->err), out);
    SL_INFO(SL_SUBSYS_GATHER, "NCCL gather over the TP group of %d ranks",
            comm->layout.tp_size);
    *state = g;
    g      = NULL;
    status = STAGELINK_SUCCESS;
out:
    free(g);
    free(cards);
    return status;
}

static void sl_gather_nccl_cleanup(void *state)
{
    sl_gather_nccl_t *g = state;

    if (g != NULL) {
        /* After a fault a peer may never join a queued collective:
         * destroying would wait for it. */
        if (g->comm->fault != STAGELINK_SUCCESS) {
            g->api->CommAbort(g->nccl);
        } else {
            g->api->CommDestroy(g->nccl);
        }
        free(g);
    }
}

/* The statuses of the peers are awaited from the start. */
static sl_status_t sl_gather_nccl_post(void *state, sl_req_t *req)
{
    sl_gather_nccl_t *g    = state;
    sl_comm_t        *comm = g->comm;
    int               k;

    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k != comm->layout.tp_index) {
            SL_CHECK(sl_sub_post_host(req, &comm->tp_peers[k],
                                      SL_SUB_STATUS_RECV, sl_gather_tag(req, k),
                                      &req->flags[k], 1, 1));
        }
    }
    req->gather_next = NULL;
    if (g->tail != NULL) {
        g->tail->gather_next = req;
    } else {
        g->head = req;
    }
    g->tail = req;
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_gather_nccl_enqueue(sl_gather_nccl_t *g, sl_req_t *req)
{
    return sl_nccl_allgather_inplace(g->api, g->nccl, req->xfer.buf,
                                     req->xfer.nbytes, req->xfer.elem_size,
                                     g->comm->layout.tp_size,
                                     g->comm->layout.tp_index,
                                     (cudaStream_t)req->xfer.stream,
                                     &g->comm->err);
}

static sl_status_t sl_gather_nccl_shard_ready(void *state, sl_req_t *req,
                                              sl_status_t own)
{
    static const unsigned char arrived = 1;
    sl_gather_nccl_t *g    = state;
    sl_comm_t        *comm = g->comm;
    sl_status_t       status = STAGELINK_SUCCESS, s;
    uint64_t          tag;
    int               k, good;

    req->shard_state  = (own == STAGELINK_SUCCESS) ? 1 : -1;
    req->shard_status = own;
    /* Collectives in posting order: the head first, as far as shards are in. */
    while ((req = g->head) != NULL && req->shard_state != 0) {
        g->head = req->gather_next;
        if (g->head == NULL) {
            g->tail = NULL;
        }
        good = (req->shard_state > 0 &&
                sl_gather_nccl_enqueue(g, req) == STAGELINK_SUCCESS);
        if (req->shard_state > 0 && !good) {
            req->shard_status = STAGELINK_ERR_TRANSPORT;
            sl_req_fail(req, STAGELINK_ERR_TRANSPORT, "%s", comm->err.msg);
        } else if (!good) {
            /* Take part anyway, or the peers' streams would wait forever. */
            sl_gather_nccl_enqueue(g, req);
        }
        /* The peers hear a plain byte, or a notice of the root cause. */
        tag = sl_gather_tag(req, comm->layout.tp_index);
        for (k = 0; k < comm->layout.tp_size; ++k) {
            if (k == comm->layout.tp_index) {
                continue;
            }
            s = good ? sl_sub_post_host(req, &comm->tp_peers[k],
                                        SL_SUB_STATUS_SEND, tag,
                                        (void *)&arrived, 1, 0)
                     : sl_sub_post_notice(req, &comm->tp_peers[k],
                                          SL_SUB_STATUS_SEND, tag,
                                          req->shard_status);
            if (s != STAGELINK_SUCCESS) {
                status = s;
            }
        }
        req->gather_posted = 1;
        comm->counters.gather_bytes_sent += good ? req->shard.length *
                                                   (size_t)(comm->layout.tp_size - 1)
                                                 : 0;
        comm->counters.gather_bytes_recv += good ? req->xfer.nbytes - req->shard.length
                                                 : 0;
    }
    return status;
}

const sl_gather_ops_t sl_gather_nccl_ops = {
    .name        = "nccl",
    .init        = sl_gather_nccl_init,
    .cleanup     = sl_gather_nccl_cleanup,
    .post        = sl_gather_nccl_post,
    .shard_ready = sl_gather_nccl_shard_ready,
};
