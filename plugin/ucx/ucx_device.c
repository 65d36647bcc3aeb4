/*
 * Device-memory transfers.  Above a chunk size a device buffer goes on the
 * wire as ordered chunks of STAGELINK_STAGING_CHUNK bytes; each side moves
 * them its own way: GPU-direct when UCX reports CUDA among its memory types,
 * else through pinned bounce buffers with pipelined copies
 * (plugin/staging).  A device pointer never reaches a UCX without CUDA: that
 * UCX would take it for host memory and crash.
 *
 * Ordering with the host's stream: at post, an event is recorded on the
 * transfer's stream and the request is deferred until it completes, so a
 * send reads the tensor only after the work queued before it, and a receive
 * writes only after it.  The host thread is never blocked for it: progress
 * polls the event.  SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"

#include <stdlib.h>
#include <string.h>

void sl_device_probe(sl_comm_t *comm)
{
    comm->gpu        = &sl_gpu_default_ops;
    comm->gpu_usable = comm->gpu->probe(comm->gpu_why, sizeof(comm->gpu_why));
}

sl_status_t sl_device_init(sl_comm_t *comm)
{
    ucp_context_attr_t attr;

    /* An explicit UCX_TLS without cuda hides CUDA from this bitmap too. */
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(comm->ucp_ctx, &attr) == UCS_OK) {
        comm->ucx_cuda = !!(attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    }
    SL_INFO(SL_SUBSYS_INIT, "GPU runtime %s: %s; UCX memory types 0x%llx "
            "(CUDA %s)", comm->gpu->name, comm->gpu_why,
            (unsigned long long)attr.memory_types,
            comm->ucx_cuda ? "yes: GPU-direct" : "no: device buffers are staged");
    return STAGELINK_SUCCESS;
}

static void sl_staged_free_list(sl_staged_t *s)
{
    sl_staged_t *next;

    for (; s != NULL; s = next) {
        next = s->next;
        free(s->slots);
        free(s);
    }
}

void sl_device_cleanup(sl_comm_t *comm)
{
    int i;

    sl_staged_free_list(comm->staged_active);
    sl_staged_free_list(comm->staged_free);
    comm->staged_active = comm->staged_free = NULL;
    for (i = 0; i < comm->nevents; ++i) {
        comm->gpu->event_destroy(comm->events[i]);
    }
    free(comm->events);
    comm->events = NULL;
    if (comm->copy_stream != NULL) {
        comm->gpu->stream_destroy(comm->copy_stream);
        comm->copy_stream = NULL;
    }
    if (comm->staging.bufs[0] != NULL) {
        sl_staging_pool_cleanup(&comm->staging, comm->gpu->host_free, NULL);
    }
}

/* Events are reused: none is created per transfer in steady state. */
static sl_status_t sl_event_get(sl_comm_t *comm, void **event)
{
    if (comm->nevents > 0) {
        *event = comm->events[--comm->nevents];
        return STAGELINK_SUCCESS;
    }
    return comm->gpu->event_create(event, &comm->err);
}

static void sl_event_put(sl_comm_t *comm, void *event)
{
    void **grown;

    if (comm->nevents == comm->events_cap) {
        grown = realloc(comm->events,
                        (size_t)(comm->events_cap * 2 + 8) * sizeof(void *));
        if (grown == NULL) {
            comm->gpu->event_destroy(event);
            return;
        }
        comm->events     = grown;
        comm->events_cap = comm->events_cap * 2 + 8;
    }
    comm->events[comm->nevents++] = event;
}

sl_status_t sl_device_prepare(sl_req_t *req)
{
    sl_comm_t *comm = req->comm;

    if (!comm->path_logged) {
        comm->path_logged = 1;
        SL_INFO(SL_SUBSYS_NET, "device buffers: %s", comm->ucx_cuda
                ? "GPU-direct, UCX reports CUDA memory"
                : "staged through pinned host buffers, UCX reports no CUDA "
                  "memory type (built without CUDA, or UCX_TLS leaves out "
                  "cuda)");
    }
    SL_CHECK(sl_event_get(comm, &req->stream_event));
    if (comm->gpu->event_record(req->stream_event, req->xfer.stream,
                                &comm->err) != STAGELINK_SUCCESS) {
        sl_event_put(comm, req->stream_event);
        req->stream_event = NULL;
        return STAGELINK_ERR_TRANSPORT;
    }
    req->deferred      = 1;
    req->deferred_next = comm->deferred;
    comm->deferred     = req;
    return STAGELINK_SUCCESS;
}

/* --- staging copies on the plugin's own stream ------------------------- */

static sl_status_t sl_dev_copy_start(void *ctx, sl_staging_xfer_t *x,
                                     void *dst, const void *src, size_t len,
                                     int to_device, void **token)
{
    sl_comm_t  *comm = ctx;
    sl_status_t status;

    (void)x, (void)to_device;
    SL_CHECK(sl_event_get(comm, token));
    status = comm->gpu->copy_async(dst, src, len, comm->copy_stream, &comm->err);
    if (status == STAGELINK_SUCCESS) {
        status = comm->gpu->event_record(*token, comm->copy_stream, &comm->err);
    }
    if (status != STAGELINK_SUCCESS) {
        sl_event_put(comm, *token);
        *token = NULL;
        return status;
    }
    ++comm->staged_chunks;
    return STAGELINK_SUCCESS;
}

static int sl_dev_copy_test(void *ctx, void *token, sl_status_t *status)
{
    sl_comm_t *comm = ctx;

    if (!comm->gpu->event_query(token, status, &comm->err)) {
        return 0;
    }
    sl_event_put(comm, token);
    return 1;
}

/* --- chunks on the wire --------------------------------------------------- */

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

static void sl_chunk_recv_cb(void *request, ucs_status_t status,
                             const ucp_tag_recv_info_t *info, void *user)
{
    sl_staging_slot_t *slot = user;
    sl_status_t        st   = sl_chunk_status(status);

    ucp_request_free(request);
    slot->net = NULL;
    /* A short chunk: the sender failed, or sent from host memory. */
    if (st == STAGELINK_SUCCESS &&
        info->length != sl_staging_chunk_len(slot->x, slot->index)) {
        st = STAGELINK_ERR_SIZE_MISMATCH;
    }
    sl_staging_net_done(slot, st);
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
    param.memory_type  = slot->x->direct ? UCS_MEMORY_TYPE_CUDA
                                         : UCS_MEMORY_TYPE_HOST;
    if (slot->x->direct && sub->req->xfer.memh != NULL &&
        sub->req->xfer.memh->ucp_memh != NULL) {
        /* A GPU-direct chunk lies inside the host's registration. */
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
    .copy_start = sl_dev_copy_start,
    .copy_test  = sl_dev_copy_test,
    .net_post   = sl_dev_net_post,
    .net_ready  = sl_dev_net_ready,
};

/* Bounce buffers and the copy stream exist only once a transfer needs them. */
static sl_status_t sl_device_staging_ready(sl_comm_t *comm)
{
    if (comm->staging.bufs[0] != NULL) {
        return STAGELINK_SUCCESS;
    }
    SL_CHECK(comm->gpu->stream_create(&comm->copy_stream, &comm->err));
    SL_CHECK(sl_staging_pool_init(&comm->staging, comm->chunk, comm->nbufs,
                                  comm->gpu->host_alloc, NULL, &comm->err));
    SL_INFO(SL_SUBSYS_NET, "staging pool: 2 x %d pinned buffers of %zu bytes",
            comm->nbufs, comm->chunk);
    return STAGELINK_SUCCESS;
}

sl_status_t sl_device_sub_start(sl_sub_t *sub, void *buf, size_t len,
                                int recv)
{
    sl_comm_t   *comm   = sub->req->comm;
    int          direct = comm->ucx_cuda;
    sl_staged_t *st;

    if (!direct) {
        SL_CHECK(sl_device_staging_ready(comm));
    } else if (comm->staging.nbufs == 0) {
        /* Direct chunks take no buffers; the pool only sizes the window. */
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
    st->sub             = sub;
    sub->staged         = st;
    st->next            = comm->staged_active;
    comm->staged_active = st;
    sl_staging_progress(&st->x);
    return STAGELINK_SUCCESS;
}

void sl_device_cancel(sl_comm_t *comm, sl_sub_t *sub)
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

static void sl_device_progress_deferred(sl_comm_t *comm)
{
    sl_req_t  **link = &comm->deferred, *req;
    sl_status_t status;

    while ((req = *link) != NULL) {
        status = req->status;
        if (!comm->gpu->event_query(req->stream_event, &status, &comm->err)) {
            link = &req->deferred_next;
            continue;
        }
        *link = req->deferred_next;
        sl_event_put(comm, req->stream_event);
        req->stream_event = NULL;
        req->deferred     = 0;
        if (req->status != STAGELINK_SUCCESS) {
            /* Canceled while it waited: nothing was posted. */
        } else if (status != STAGELINK_SUCCESS) {
            sl_req_fail(req, status, "the host's stream failed before the "
                        "transfer: %s", comm->err.msg);
        } else if (sl_xfer_start(req) != STAGELINK_SUCCESS) {
            sl_req_fail(req, STAGELINK_ERR_TRANSPORT, "%s", comm->err.msg);
        }
    }
}

int sl_device_progress(sl_comm_t *comm)
{
    sl_staged_t **link, *st;
    sl_sub_t     *sub;

    sl_device_progress_deferred(comm);
    link = &comm->staged_active;
    while ((st = *link) != NULL) {
        if (!sl_staging_progress(&st->x)) {
            link = &st->next;
            continue;
        }
        *link             = st->next;
        sub               = st->sub;
        st->next          = comm->staged_free;
        comm->staged_free = st;
        sl_sub_finish(sub, st->x.status,
                      (st->x.status == STAGELINK_SUCCESS) ? st->x.len : 0,
                      (st->x.status == STAGELINK_ERR_SIZE_MISMATCH)
                          ? "a chunk arrived short: the sender failed, or its "
                            "buffer was host memory while this one is on the "
                            "device (both sides of a boundary must use the "
                            "same memory type)"
                          : comm->err.msg);
    }
    return comm->staged_active != NULL || comm->deferred != NULL;
}
