/*
 * UCX gather: each TP rank sends its shard straight to the t-1 others over
 * the intra-node endpoints (UCX shared-memory transports on one node).
 * Direct rather than ring: for t <= 8 on shared memory every pair has its
 * own path, and the receives are pre-posted.  A shard that goes in chunks
 * is forwarded chunk by chunk as it lands, so the gather overlaps the
 * shard's own transfer instead of following it.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"

static sl_status_t sl_gather_ucx_init(sl_comm_t *comm, void **state)
{
    *state = comm;
    return STAGELINK_SUCCESS;
}

static void sl_gather_ucx_cleanup(void *state)
{
    (void)state;
}

/* Sends the own shard to every peer (all of it, or gated chunk by chunk),
 * or, when it failed with `own`, a notice of that status. */
static sl_status_t sl_gather_ucx_send(sl_comm_t *comm, sl_req_t *req,
                                      sl_status_t own)
{
    int         me  = comm->layout.tp_index;
    const char *src = (const char *)req->xfer.buf + req->shard.offset;
    uint64_t    tag = sl_gather_tag(req, me);
    int         k;

    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k == me) {
            continue;
        }
        SL_CHECK((own == STAGELINK_SUCCESS)
                     ? sl_sub_post_send(req, &comm->tp_peers[k],
                                        SL_SUB_GATHER_SEND, tag, src,
                                        req->shard.length)
                     : sl_sub_post_notice(req, &comm->tp_peers[k],
                                          SL_SUB_GATHER_SEND, tag, own));
    }
    return STAGELINK_SUCCESS;
}

/* Whether sub i is one of the request's relays (posted in a row). */
static int sl_gather_ucx_relay(const sl_req_t *req, int i)
{
    return i < req->subs.n && req->subs.slot[i].kind == SL_SUB_GATHER_SEND;
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
    /* A shard in chunks is relayed as it lands: the sends start now. */
    if (sl_chunked_framed(comm, req->shard.length)) {
        req->gather_part.forwarding   = 1;
        req->gather_part.stage_landed = 0;
        req->gather_part.relay_first  = req->subs.n;
        SL_CHECK(sl_gather_ucx_send(comm, req, STAGELINK_SUCCESS));
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_gather_ucx_shard_ready(void *state, sl_req_t *req,
                                             sl_status_t own)
{
    sl_comm_t  *comm = state;
    sl_status_t status = STAGELINK_SUCCESS;
    int         i;

    if (!req->gather_part.forwarding) {
        status = sl_gather_ucx_send(comm, req, own);
    } else if (own != STAGELINK_SUCCESS) {
        /* The relays send notices of `own` for the chunks not yet gone:
         * the peers fail too, with the root cause. */
        for (i = req->gather_part.relay_first; sl_gather_ucx_relay(req, i);
             ++i) {
            sl_chunked_give_up(&req->subs.slot[i], own);
        }
    }
    return status;
}

/* More of the own shard is in place: the relays send it now. */
static void sl_gather_ucx_landed(void *state, sl_req_t *req, size_t bytes)
{
    int i;

    (void)state;
    if (!req->gather_part.forwarding) {
        return;
    }
    req->gather_part.stage_landed = bytes;
    for (i = req->gather_part.relay_first; sl_gather_ucx_relay(req, i); ++i) {
        sl_chunked_relay(&req->subs.slot[i]);
    }
}

const sl_gather_ops_t sl_gather_ucx_ops = {
    .name        = "ucx",
    .init        = sl_gather_ucx_init,
    .cleanup     = sl_gather_ucx_cleanup,
    .post        = sl_gather_ucx_post,
    .shard_ready = sl_gather_ucx_shard_ready,
    .landed      = sl_gather_ucx_landed,
};
