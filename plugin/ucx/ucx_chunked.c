/*
 * Chunked transfers: every message above STAGELINK_CHUNK bytes, and every
 * device message, goes on the wire as ordered chunks of that size on one
 * tag (plugin/staging decides what happens next).  Each side moves its
 * chunks its own way: in place (host memory, or device memory when UCX has
 * CUDA), or through pinned bounce buffers (device memory, UCX without
 * CUDA); the wire format depends only on the chunk size.  A TP rank also
 * forwards each chunk of its shard to its peers as soon as it has landed,
 * so the gather overlaps the shard's transfer.  SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include <stdlib.h>
#include <string.h>

static void sl_staged_free_list(sl_staged_t *s)
{
    sl_staged_t *next;

    for (; s != NULL; s = next) {
        next = s->next;
        free(s->slots);
        free(s);
    }
}

static sl_status_t sl_chunk_status(ucs_status_t ucs)
{
    return (ucs == UCS_OK) ? STAGELINK_SUCCESS
         : (ucs == UCS_ERR_CANCELED) ? STAGELINK_ERR_CANCELED
         : (ucs == UCS_ERR_MESSAGE_TRUNCATED) ? STAGELINK_ERR_SIZE_MISMATCH
         : STAGELINK_ERR_TRANSPORT;
}

static void sl_chunk_send_cb(void *request, ucs_status_t status, void *user)
{
    sl_staging_slot_t *slot = user;

    ucp_request_free(request);
    slot->net = NULL;
    sl_staging_net_done(slot, sl_chunk_status(status));
}

/*
 * The own shard landed further: relay what is now in place at once, from
 * this callback (posting is allowed there), not after progress returns.
 */
static void sl_chunk_relay(sl_req_t *req, const sl_staging_xfer_t *shard)
{
    int i;

    if (shard->status != STAGELINK_SUCCESS) {
        return;
    }
    req->stage_landed = sl_staging_landed(shard);
    for (i = 0; i < req->nsubs; ++i) {
        if (req->subs[i].kind == SL_SUB_GATHER_SEND &&
            req->subs[i].staged != NULL) {
            sl_staging_progress(&req->subs[i].staged->x);
        }
    }
}

static void sl_chunk_recv_cb(void *request, ucs_status_t status,
                             const ucp_tag_recv_info_t *info, void *user)
{
    sl_staging_slot_t *slot = user;
    sl_staged_t       *st   = slot->x->user;
    sl_status_t        s    = sl_chunk_status(status);

    ucp_request_free(request);
    slot->net = NULL;
    /* A short chunk: the sender failed or passed a different nbytes. */
    if (s == STAGELINK_SUCCESS &&
        info->length != sl_staging_chunk_len(slot->x, slot->index)) {
        s = STAGELINK_ERR_SIZE_MISMATCH;
    }
    sl_staging_net_done(slot, s);
    if (st->sub->kind == SL_SUB_STAGE_RECV && st->sub->req->forwarding) {
        sl_chunk_relay(st->sub->req, slot->x);
    }
}

static sl_status_t sl_dev_net_post(void *ctx, sl_staging_slot_t *slot,
                                   void *host, size_t len)
{
    sl_comm_t          *comm = ctx;
    sl_staged_t        *st   = slot->x->user;
    sl_sub_t           *sub  = st->sub;
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param.user_data    = slot;
    param.memory_type  = (slot->x->direct && sub->req->device)
                             ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
    if (slot->x->direct && sub->req->xfer.memh != NULL &&
        sub->req->xfer.memh->ucp_memh != NULL) {
        /* A chunk moved in place lies inside the host's registration. */
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param.memh          = sub->req->xfer.memh->ucp_memh;
    }
    if (slot->x->recv) {
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.cb.recv       = sl_chunk_recv_cb;
        ptr = ucp_tag_recv_nbx(comm->worker, host, len, sub->tag,
                               UINT64_MAX, &param);
    } else {
        param.cb.send = sl_chunk_send_cb;
        ptr = ucp_tag_send_nbx(sub->peer->ep, host, len, sub->tag, &param);
    }
    if (UCS_PTR_IS_ERR(ptr)) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX refused chunk %zu of a device transfer with rank "
                        "%d: %s", slot->index, sub->peer->rank,
                        ucs_status_string(UCS_PTR_STATUS(ptr)));
    }
    if (ptr == NULL) {
        sl_staging_net_done(slot, STAGELINK_SUCCESS);
    } else {
        slot->net = ptr;
    }
    return STAGELINK_SUCCESS;
}

static int sl_dev_net_ready(void *ctx, sl_staging_xfer_t *x)
{
    sl_comm_t          *comm = ctx;
    sl_staged_t        *st   = x->user;
    ucp_tag_recv_info_t info;

    return ucp_tag_probe_nb(comm->worker, st->sub->tag, UINT64_MAX, 0,
                            &info) != NULL;
}

static const sl_staging_ops_t sl_dev_staging_ops = {
    .copy_start = sl_device_copy_start,
    .copy_test  = sl_device_copy_test,
    .net_post   = sl_dev_net_post,
    .net_ready  = sl_dev_net_ready,
};

sl_status_t sl_chunked_sub_start(sl_sub_t *sub, void *buf, size_t len,
                                 int recv)
{
    sl_req_t    *req    = sub->req;
    sl_comm_t   *comm   = req->comm;
    int          direct = !req->device || comm->ucx_cuda;
    sl_staged_t *st;

    if (!direct) {
        SL_CHECK(sl_device_staging_ready(comm));
    } else if (comm->staging.nbufs == 0) {
        /* Chunks moved in place take no buffers; the pool sizes the window. */
        comm->staging.chunk = comm->chunk;
        comm->staging.nbufs = comm->nbufs;
    }
    st = comm->staged_free;
    if (st != NULL) {
        comm->staged_free = st->next;
    } else {
        st = calloc(1, sizeof(*st));
        if (st == NULL || (st->slots = calloc((size_t)comm->nbufs,
                                              sizeof(*st->slots))) == NULL) {
            free(st);
            return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                            "cannot allocate a chunked transfer of %d slots",
                            comm->nbufs);
        }
    }
    sl_staging_xfer_init(&st->x, &sl_dev_staging_ops, comm, &comm->staging,
                         recv, direct, buf, len, st->slots);
    st->x.user          = st;
    if (!recv && sub->kind == SL_SUB_GATHER_SEND && req->forwarding) {
        st->x.avail = &req->stage_landed; /* relay: each chunk as it lands */
    }
    st->sub             = sub;
    sub->staged         = st;
    st->next            = comm->staged_active;
    comm->staged_active = st;
    sl_staging_progress(&st->x);
    return STAGELINK_SUCCESS;
}

void sl_chunked_cancel(sl_comm_t *comm, sl_sub_t *sub)
{
    sl_staged_t *st = sub->staged;
    int          i;

    if (st->x.status == STAGELINK_SUCCESS) {
        st->x.status = STAGELINK_ERR_CANCELED;
    }
    for (i = 0; i < comm->nbufs; ++i) {
        if (st->slots[i].in_use && st->slots[i].net != NULL) {
            ucp_request_cancel(comm->worker, st->slots[i].net);
        }
    }
}

int sl_chunked_progress(sl_comm_t *comm)
{
    sl_staged_t **link, *st;
    sl_sub_t     *sub;

    link = &comm->staged_active;
    while ((st = *link) != NULL) {
        int done = sl_staging_progress(&st->x);

        if (st->sub->kind == SL_SUB_STAGE_RECV && st->sub->req->forwarding) {
            sl_chunk_relay(st->sub->req, &st->x); /* staged chunks land here */
        }
        if (!done) {
            link = &st->next;
            continue;
        }
        *link             = st->next;
        sub               = st->sub;
        st->next          = comm->staged_free;
        comm->staged_free = st;
        if (sub->kind == SL_SUB_GATHER_RECV &&
            st->x.status == STAGELINK_ERR_SIZE_MISMATCH) {
            /* A TP peer that lost its shard relays the rest empty. */
            sl_sub_finish(sub, STAGELINK_SUCCESS, 0, "");
            continue;
        }
        sl_sub_finish(sub, st->x.status,
                      (st->x.status == STAGELINK_SUCCESS) ? st->x.len : 0,
                      (st->x.status == STAGELINK_ERR_SIZE_MISMATCH)
                          ? "a chunk arrived short: the sender failed or "
                            "passed a different nbytes"
                          : comm->err.msg);
    }
    return comm->staged_active != NULL || comm->deferred != NULL;
}

void sl_chunked_cleanup(sl_comm_t *comm)
{
    sl_staged_free_list(comm->staged_active);
    sl_staged_free_list(comm->staged_free);
    comm->staged_active = comm->staged_free = NULL;
}
