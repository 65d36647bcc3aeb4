/*
 * One sub-operation of a request: a message to or from one peer.  This file
 * owns its state (sl_sub_state_t) and makes every transition: posting (one
 * UCX operation, or a chunked transfer handed to ucx_chunked.c), UCX's
 * callbacks, cancel, detach after a peer's failure, and the end, which it
 * reports upward once through the request's sub_done callback (the way
 * uct_completion_t reports a UCT operation).  Nothing else writes a sub.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_time.h"

#include <stdio.h>
#include <string.h>

/* How long after a send to another node completes UCX may still hold its
 * bytes (see sl_ucx_tx_pending), in seconds. */
#define SL_NET_QUIET 0.05

const char *sl_sub_name(sl_sub_kind_t kind)
{
    switch (kind) {
    case SL_SUB_STAGE_SEND:  return "stage send";
    case SL_SUB_STAGE_RECV:  return "stage receive";
    case SL_SUB_GATHER_SEND: return "gather send";
    case SL_SUB_GATHER_RECV: return "gather receive";
    case SL_SUB_STATUS_SEND: return "status send";
    case SL_SUB_STATUS_RECV: return "status receive";
    }
    return "operation";
}

/* A send whose bytes cross to another node (waits watch them). */
static int sl_sub_on_net(const sl_sub_t *sub)
{
    return sub->peer->inter_node && !sl_sub_is_recv(sub);
}

int sl_sub_in_flight(const sl_sub_t *sub)
{
    return sub->state == SL_SUB_PLAIN || sub->state == SL_SUB_CHUNKED;
}

static void sl_sub_finish(sl_sub_t *sub, sl_status_t status, size_t length,
                   const char *why)
{
    sl_req_t  *req  = sub->req;
    sl_comm_t *comm = req->comm;

    if (sub->state == SL_SUB_DONE || sub->state == SL_SUB_DETACHED) {
        return; /* reported once: a second end would count twice */
    }
    sub->state   = SL_SUB_DONE;
    sub->ucx_req = NULL;
    sub->staged  = NULL;
    --req->subs.pending;
    if (sl_sub_on_net(sub)) {
        --comm->net_sends;
        comm->net_quiet_at = sl_time_now() + SL_NET_QUIET;
    }
    req->sub_done(sub, status, length, why);
}

/* A receive whose peer gave up and sent `notice`, its status. */
static void sl_sub_finish_notice(sl_sub_t *sub, sl_status_t notice)
{
    sub->notice = notice;
    sl_sub_finish(sub, STAGELINK_SUCCESS, sub->expected, "");
}

/* The end of a sub's chunked transfer (sl_chunked_end_t). */
static void sl_sub_chunked_end(sl_sub_t *sub, sl_status_t status,
                               sl_status_t notice, size_t length,
                               const char *why)
{
    if (notice != STAGELINK_SUCCESS) {
        sl_sub_finish_notice(sub, notice);
        return;
    }
    if (status == STAGELINK_SUCCESS && sub->req->device &&
        sl_sub_is_recv(sub) && sl_device_path_direct(sub->req->comm, sub->peer)) {
        status = sl_device_rdma_landed(sub->req->comm, sub->peer);
        why    = (status != STAGELINK_SUCCESS) ? sub->req->comm->err.msg : why;
    }
    sl_sub_finish(sub, status, length, why);
}

/* UCX's outcome of one operation, in stagelink's terms. */
static void sl_sub_complete(sl_sub_t *sub, ucs_status_t ucs, size_t length)
{
    sl_status_t status = sl_wire_status(sub->peer, ucs, "a transfer");
    char        why[SL_ERRBUF_LEN] = "";

    switch (status) {
    case STAGELINK_SUCCESS:
        break;
    case STAGELINK_ERR_SIZE_MISMATCH:
        snprintf(why, sizeof(why), "the sender sent more than the %zu bytes "
                 "expected; both sides must pass the same nbytes and "
                 "elem_size", sub->expected);
        break;
    case STAGELINK_ERR_PEER_FAILED:
        sl_peer_describe(sub->peer, why, sizeof(why));
        break;
    case STAGELINK_ERR_TRANSPORT:
        snprintf(why, sizeof(why), "UCX: %s", ucs_status_string(ucs));
        break;
    default:
        break;
    }
    sl_sub_finish(sub, status, (status == STAGELINK_SUCCESS) ? length : 0, why);
}

static void sl_sub_send_cb(void *request, ucs_status_t status, void *user_data)
{
    sl_sub_t *sub = user_data;

    sl_ucx_callback_ran(sub->req->comm);
    ucp_request_free(request);
    if (sub->state == SL_SUB_DETACHED) {
        return;
    }
    sl_sub_complete(sub, status, sub->expected);
}

/* Where a plain receive lands: a receive shorter than a control message
 * takes the sub's own buffer, so no header or notice is ever truncated. */
static void *sl_sub_landing(sl_sub_t *sub)
{
    return (sub->expected < SL_CTL_LEN) ? (void *)sub->ctl : sub->buf;
}

/* A plain receive met a framed sender: its chunks are drained (in order,
 * so none is left for a later transfer), then the sub fails. */
static void sl_sub_drain(sl_sub_t *sub, uint64_t len)
{
    sl_staged_t *st;

    if (sl_chunked_drain(sub, len, sl_sub_chunked_end, &st) != STAGELINK_SUCCESS) {
        sl_sub_finish(sub, STAGELINK_ERR_SIZE_MISMATCH, 0,
                      sub->req->comm->err.msg);
        return;
    }
    sub->state  = SL_SUB_CHUNKED;
    sub->staged = st;
}

static void sl_sub_recv_cb(void *request, ucs_status_t status,
                           const ucp_tag_recv_info_t *info, void *user_data)
{
    sl_sub_t *sub = user_data;
    void     *msg;
    uint64_t  value = 0;

    sl_ucx_callback_ran(sub->req->comm);
    ucp_request_free(request);
    if (sub->state == SL_SUB_DETACHED) {
        return;
    }
    sub->ucx_req = NULL;
    msg          = sl_sub_landing(sub);
    if (status == UCS_OK) {
        switch (sl_msg_classify(sub->tag, info, msg, &value)) {
        case SL_MSG_NOTICE:
            sl_sub_finish_notice(sub, sl_notice_status(value));
            return;
        case SL_MSG_HEADER:
            /* A framed sender: its part is larger than one chunk. */
            sl_sub_drain(sub, value);
            return;
        case SL_MSG_BAD:
            sl_sub_finish(sub, STAGELINK_ERR_INTERNAL, 0, "a control message "
                          "of unknown form arrived (another stagelink "
                          "version on the peer?)");
            return;
        case SL_MSG_DATA:
            break;
        }
    }
    if (status == UCS_OK && msg != sub->buf && info->length == sub->expected &&
        info->length > 0) {
        memcpy(sub->buf, msg, info->length);
    }
    sl_sub_complete(sub, status, (status == UCS_OK) ? info->length : 0);
}

static sl_sub_t *sl_sub_new(sl_req_t *req, sl_ucx_peer_t *peer,
                            sl_sub_kind_t kind, uint64_t tag, size_t len)
{
    sl_sub_t *sub = &req->subs.slot[req->subs.n++];

    sub->req      = req;
    sub->state    = SL_SUB_POSTING;
    sub->ucx_req  = NULL;
    sub->staged   = NULL;
    sub->peer     = peer;
    sub->kind     = kind;
    sub->tag      = tag;
    sub->buf      = NULL;
    sub->expected = len;
    sub->notice   = STAGELINK_SUCCESS;
    ++req->subs.pending;
    req->comm->net_sends += sl_sub_on_net(sub);
    return sub;
}

/* What UCX returned for the sub's one operation.  Its callback may have
 * run inside the call (NO_IMM_CMPL with the message already there): it
 * ended the sub, or made it the drain of a framed sender, and freed the
 * request UCX still returns. */
static sl_status_t sl_sub_started(sl_sub_t *sub, ucs_status_ptr_t ptr)
{
    if (ptr == NULL) {
        /* Only sends complete immediately (receives never do, see below). */
        sl_sub_complete(sub, UCS_OK, sub->expected);
    } else if (UCS_PTR_IS_ERR(ptr)) {
        sl_sub_complete(sub, UCS_PTR_STATUS(ptr), 0);
        return sl_error(&sub->req->comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX refused a %s with rank %d: %s",
                        sl_sub_name(sub->kind), sub->peer->rank,
                        ucs_status_string(UCS_PTR_STATUS(ptr)));
    } else if (sub->state == SL_SUB_POSTING) {
        sub->state   = SL_SUB_PLAIN;
        sub->ucx_req = ptr;
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_sub_send_plain(sl_sub_t *sub, const void *buf,
                                     size_t len, uint64_t tag,
                                     const stagelink_memh_t *memh)
{
    ucp_request_param_t param;

    sl_ucx_param_init(&param, sub, UCS_MEMORY_TYPE_HOST, memh, sub->peer);
    param.cb.send = sl_sub_send_cb;
    return sl_sub_started(sub, ucp_tag_send_nbx(sub->peer->ep, buf, len, tag,
                                                &param));
}

/*
 * Whether a message goes in chunks; both ends must decide alike from what
 * both know (mode, t, size; the chunk size and mode are checked equal at
 * init).  Device memory always does (bounded bounce buffers).  Host memory
 * only where a receiver relays it as it lands: the shard of a
 * scatter_gather boundary and the relays themselves.  Elsewhere one message
 * is faster (docs/performance.md).  A host sender facing a device receiver outside
 * scatter_gather therefore fails with a size mismatch.
 */
static int sl_sub_in_chunks(const sl_comm_t *comm, sl_sub_kind_t kind,
                            size_t len, int device)
{
    if (device) {
        return len > 0;
    }
    if (!sl_chunked_framed(comm, len)) {
        return 0;
    }
    return kind == SL_SUB_GATHER_SEND || kind == SL_SUB_GATHER_RECV ||
           sl_chunked_relayed(comm);
}

/* Large and device buffers go in chunks (ucx_chunked.c).  This is the one
 * place where a buffer is handed to UCX, so no device pointer reaches a UCX
 * without CUDA. */
static sl_status_t sl_sub_chunked(sl_sub_t *sub, void *buf, size_t len,
                                  int recv)
{
    sl_staged_t *st;
    sl_status_t  status = sl_chunked_sub_prepare(sub, buf, len, recv,
                                                 sl_sub_chunked_end, &st);

    if (status != STAGELINK_SUCCESS) {
        sl_sub_finish(sub, status, 0, sub->req->comm->err.msg);
        return status;
    }
    /* In flight before its first post: a relay, a give-up or a detach
     * that runs from there finds it. */
    sub->state  = SL_SUB_CHUNKED;
    sub->staged = st;
    sl_chunked_sub_kick(st);
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_sub_post(sl_req_t *req, sl_ucx_peer_t *peer,
                               sl_sub_kind_t kind, uint64_t tag, void *buf,
                               size_t len, int recv, int device)
{
    ucp_request_param_t param;
    sl_sub_t           *sub = sl_sub_new(req, peer, kind, tag, len);
    sl_status_t         status;
    unsigned char      *land;

    sub->buf = buf;
    status   = sl_peer_check(req->comm, peer);
    if (status != STAGELINK_SUCCESS) {
        sl_sub_finish(sub, status, 0, req->comm->err.msg);
        return status;
    }
    if (sl_sub_in_chunks(req->comm, kind, len, device)) {
        return sl_sub_chunked(sub, buf, len, recv);
    }
    if (!recv) {
        return sl_sub_send_plain(sub, buf, len, tag,
                                 (len > 0) ? req->xfer.memh : NULL);
    }
    /* Seen with UCX 1.13: a receive completed inside ucp_tag_recv_nbx
     * (message already unexpected) sometimes reported length 0 through
     * recv_info, which would pass for a short message.  The callback
     * always has the real length, so receives complete there. */
    land = sl_sub_landing(sub);
    sl_ucx_param_init(&param, sub, UCS_MEMORY_TYPE_HOST,
                      (land == buf && len > 0) ? req->xfer.memh : NULL, peer);
    param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv       = sl_sub_recv_cb;
    return sl_sub_started(sub, ucp_tag_recv_nbx(peer->worker, land,
                                                (land == buf) ? len
                                                              : SL_CTL_LEN,
                                                tag, SL_TAG_MASK_HEADER,
                                                &param));
}

sl_status_t sl_sub_post_notice(sl_req_t *req, sl_ucx_peer_t *peer,
                               sl_sub_kind_t kind, uint64_t tag,
                               sl_status_t status)
{
    /* A device peer takes a shard of up to 16 bytes as one chunk straight
     * into device memory, where a notice of its length could pass for data
     * (ucx_chunked.c): one byte more makes it a truncation there. */
    size_t      len = (req->device && kind == SL_SUB_GATHER_SEND &&
                       req->shard.length <= SL_CTL_LEN)
                          ? req->shard.length + 1 : SL_CTL_LEN;
    sl_sub_t   *sub = sl_sub_new(req, peer, kind, tag, len);
    sl_status_t s   = sl_peer_check(req->comm, peer);

    sub->notice = status;
    if (s != STAGELINK_SUCCESS) {
        sl_sub_finish(sub, s, 0, req->comm->err.msg);
        return s;
    }
    sl_notice_make(sub->ctl, status);
    return sl_sub_send_plain(sub, sub->ctl, len, tag | SL_TAG_HEADER, NULL);
}

sl_status_t sl_sub_post_send(sl_req_t *req, sl_ucx_peer_t *peer,
                             sl_sub_kind_t kind, uint64_t tag,
                             const void *buf, size_t len)
{
    return sl_sub_post(req, peer, kind, tag, (void *)buf, len, 0, req->device);
}

sl_status_t sl_sub_post_recv(sl_req_t *req, sl_ucx_peer_t *peer,
                             sl_sub_kind_t kind, uint64_t tag, void *buf,
                             size_t len)
{
    return sl_sub_post(req, peer, kind, tag, buf, len, 1, req->device);
}

sl_status_t sl_sub_post_host(sl_req_t *req, sl_ucx_peer_t *peer,
                             sl_sub_kind_t kind, uint64_t tag, void *buf,
                             size_t len, int recv)
{
    return sl_sub_post(req, peer, kind, tag, buf, len, recv, 0);
}

void sl_sub_cancel(sl_comm_t *comm, sl_sub_t *sub, sl_cancel_reach_t reach)
{
    if (sub->state == SL_SUB_PLAIN) {
        ucp_request_cancel(sub->peer->worker, sub->ucx_req);
    } else if (sub->state == SL_SUB_CHUNKED) {
        sl_chunked_cancel(comm, sub->staged, reach);
    }
}

void sl_sub_detach(sl_comm_t *comm, sl_sub_t *sub, sl_status_t status,
                   const char *why)
{
    sl_sub_state_t was = sub->state;

    if (was == SL_SUB_CHUNKED) {
        /* Its late callbacks find the transfer detached instead. */
        sl_chunked_detach(comm, sub->staged);
    } else if (was != SL_SUB_PLAIN) {
        return;
    }
    sl_sub_finish(sub, status, 0, why);
    if (was == SL_SUB_PLAIN) {
        /* Its UCX operation stays, pointing at this sub: the request is
         * never reused, so a late callback finds it detached. */
        sub->state = SL_SUB_DETACHED;
        ++sub->req->subs.detached;
    }
}

int sl_sub_describe(const sl_sub_t *sub, char *out, size_t len)
{
    const sl_staged_t *st = sub->staged;
    char               state[256] = "", relay[96] = "";

    if (!sl_sub_in_flight(sub)) {
        return 0;
    }
    if (st != NULL) {
        /* Enough to tell a stalled wire from a stalled relay. */
        if (st->x.avail != NULL) {
            snprintf(relay, sizeof(relay), ", %zu bytes of the own shard "
                     "landed", *st->x.avail);
        } else if (st->state == SL_CHUNKED_DRAINING) {
            snprintf(relay, sizeof(relay), ", %zu of the sender's chunks "
                     "left to drain%s", (size_t)st->drain_left,
                     (st->drain_req != NULL) ? ", one posted" : "");
        }
        snprintf(state, sizeof(state), " (%s, %zu of %zu chunks done, %zu "
                 "posted%s%s%s)",
                 st->state == SL_CHUNKED_AWAITING ? "awaiting the length header"
                 : st->state == SL_CHUNKED_DRAINING ? "draining a mismatched sender"
                                                    : "in chunks",
                 (size_t)st->x.done, (size_t)st->x.nchunks,
                 (size_t)st->x.next_post, relay,
                 (st->x.status != STAGELINK_SUCCESS) ? ", failed: " : "",
                 (st->x.status != STAGELINK_SUCCESS)
                     ? stagelink_status_string(st->x.status) : "");
    }
    snprintf(out, len, "%s %s rank %d%s", sl_sub_name(sub->kind),
             sl_sub_is_recv(sub) ? "from" : "to", sub->peer->rank, state);
    return 1;
}
