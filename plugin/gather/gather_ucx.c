/*
 * UCX gather: each TP rank sends its shard straight to the t-1 others over
 * the intra-node endpoints (UCX shared-memory transports on one node).
 * Direct rather than ring: for t <= 8 on shared memory every pair has its
 * own path, and the receives are pre-posted, so nothing waits on a relay.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"

#include "sl_tag.h"

uint64_t sl_gather_tag(const sl_req_t *req, int source)
{
    sl_tag_fields_t f = {
        .cls        = SL_TAG_CLASS_GATHER,
        .backward   = req->backward,
        .chunk      = req->xfer.tag.chunk,
        .source     = (uint32_t)source,
        .microbatch = req->xfer.tag.microbatch,
    };

    return sl_tag_encode(&f);
}

static sl_status_t sl_gather_ucx_init(sl_comm_t *comm, void **state)
{
    *state = comm;
    return STAGELINK_SUCCESS;
}

static void sl_gather_ucx_cleanup(void *state)
{
    (void)state;
}

static sl_status_t sl_gather_ucx_post(void *state, sl_req_t *req)
{
    sl_comm_t *comm = state;
    int        t    = comm->layout.tp_size;
    sl_shard_t shard;
    int        k;

    for (k = 0; k < t; ++k) {
        if (k == comm->layout.tp_index) {
            continue;
        }
        shard = sl_shard_get(req->xfer.nbytes, req->xfer.elem_size, t, k);
        SL_CHECK(sl_sub_post_recv(req, &comm->tp_peers[k], SL_SUB_GATHER_RECV,
                                  sl_gather_tag(req, k),
                                  (char *)req->xfer.buf + shard.offset,
                                  shard.length));
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_gather_ucx_shard_ready(void *state, sl_req_t *req,
                                             int ok)
{
    sl_comm_t *comm = state;
    int        me   = comm->layout.tp_index;
    const char *src = ok ? (const char *)req->xfer.buf + req->shard.offset
                         : NULL;
    size_t     len  = ok ? req->shard.length : 0;
    int        k;

    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k == me) {
            continue;
        }
        SL_CHECK(sl_sub_post_send(req, &comm->tp_peers[k], SL_SUB_GATHER_SEND,
                                  sl_gather_tag(req, me), src, len));
    }
    req->gather_posted = 1;
    return STAGELINK_SUCCESS;
}

const sl_gather_ops_t sl_gather_ucx_ops = {
    .name        = "ucx",
    .init        = sl_gather_ucx_init,
    .cleanup     = sl_gather_ucx_cleanup,
    .post        = sl_gather_ucx_post,
    .shard_ready = sl_gather_ucx_shard_ready,
};
