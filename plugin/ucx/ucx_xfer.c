/*
 * The byte path of a transfer: which bytes of the tensor go to the
 * neighbour stage (shard or full tensor), posted as UCX tagged operations,
 * and how their completions add up to the request's.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "gather.h"

#include "sl_log.h"
#include "sl_tag.h"
#include "sl_time.h"

#include <stdio.h>
#include <string.h>

static const char *sl_sub_name(sl_sub_kind_t kind)
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

void sl_req_describe_pending(const sl_req_t *req, char *out, size_t len)
{
    size_t used = 0;
    int    i;

    out[0] = '\0';
    for (i = 0; i < req->nsubs && used < len; ++i) {
        const sl_sub_t    *sub = &req->subs[i];
        const sl_staged_t *st  = sub->staged;
        char               state[192] = "", relay[64] = "";

        if (sub->ucx_req == NULL && st == NULL) {
            continue;
        }
        if (st != NULL) {
            /* Enough to tell a stalled wire from a stalled relay. */
            if (st->x.avail != NULL) {
                snprintf(relay, sizeof(relay), ", %zu bytes of the own "
                         "shard landed", *st->x.avail);
            }
            snprintf(state, sizeof(state), " (%s, %zu of %zu chunks done, "
                     "%zu posted%s%s%s)",
                     st->waiting ? "awaiting the length header"
                     : st->draining ? "draining a mismatched sender"
                                    : "in chunks",
                     (size_t)st->x.done, (size_t)st->x.nchunks,
                     (size_t)st->x.next_post, relay,
                     (st->x.status != STAGELINK_SUCCESS) ? ", failed: " : "",
                     (st->x.status != STAGELINK_SUCCESS)
                         ? stagelink_status_string(st->x.status) : "");
        }
        used += (size_t)snprintf(out + used, len - used, "%s%s %s rank %d%s",
                                 used ? ", " : "", sl_sub_name(sub->kind),
                                 (sub->kind == SL_SUB_STAGE_SEND ||
                                  sub->kind == SL_SUB_GATHER_SEND ||
                                  sub->kind == SL_SUB_STATUS_SEND)
                                     ? "to" : "from",
                                 sub->peer->rank, state);
        used = (used < len) ? used : len - 1;
    }
    if (out[0] == '\0') {
        snprintf(out, len, "the own shard to be passed to the TP group");
    }
}

static void sl_sub_count(sl_comm_t *comm, const sl_sub_t *sub, size_t bytes)
{
    stagelink_counters_t *c    = &comm->counters;
    int                   send = (sub->kind == SL_SUB_STAGE_SEND ||
                                  sub->kind == SL_SUB_GATHER_SEND);

    if (sub->kind == SL_SUB_STATUS_SEND || sub->kind == SL_SUB_STATUS_RECV) {
        return; /* bookkeeping, not tensor bytes */
    }
    if (sub->kind == SL_SUB_STAGE_SEND || sub->kind == SL_SUB_STAGE_RECV) {
        *(send ? &c->stage_bytes_sent : &c->stage_bytes_recv) += bytes;
    } else {
        *(send ? &c->gather_bytes_sent : &c->gather_bytes_recv) += bytes;
    }
    if (sub->peer->inter_node) {
        *(send ? &c->inter_node_bytes_sent : &c->inter_node_bytes_recv) += bytes;
    } else {
        *(send ? &c->intra_node_bytes_sent : &c->intra_node_bytes_recv) += bytes;
    }
}

/* How long after a send to another node completes UCX may still hold its
 * bytes (see sl_ucx_tx_pending), in seconds. */
#define SL_NET_QUIET 0.05

/* A send whose bytes cross to another node (waits watch them). */
static int sl_sub_on_net(const sl_sub_t *sub)
{
    return sub->peer->inter_node && (sub->kind == SL_SUB_STAGE_SEND ||
                                     sub->kind == SL_SUB_GATHER_SEND ||
                                     sub->kind == SL_SUB_STATUS_SEND);
}

static int sl_sub_is_recv(const sl_sub_t *sub)
{
    return sub->kind == SL_SUB_STAGE_RECV || sub->kind == SL_SUB_GATHER_RECV ||
           sub->kind == SL_SUB_STATUS_RECV;
}

/* A peer gave up its part and sent its status (a failure notice): this
 * rank fails with the same status, the root cause, naming the peer. */
static void sl_sub_peer_failed(sl_req_t *req, const sl_sub_t *sub)
{
    req->peer_failed = (req->status == STAGELINK_SUCCESS);
    sl_req_fail(req, sub->notice, "%s rank %d gave up its part of microbatch "
                "%u chunk %u with %s; its own error says why",
                (sub->kind == SL_SUB_STAGE_RECV) ? "the sending" : "TP peer",
                sub->peer->rank, req->xfer.tag.microbatch,
                req->xfer.tag.chunk, stagelink_status_string(sub->notice));
}

void sl_notice_make(uint64_t msg[2], sl_status_t status)
{
    msg[0] = SL_NOTICE_MAGIC;
    msg[1] = (uint64_t)status;
}

sl_status_t sl_notice_status(uint64_t value)
{
    /* SUCCESS or an unknown value would hide the failure. */
    return (value == 0 || value > STAGELINK_ERR_ABORTED)
               ? STAGELINK_ERR_TRANSPORT : (sl_status_t)value;
}

sl_msg_kind_t sl_msg_classify(uint64_t posted, const ucp_tag_recv_info_t *info,
                              const void *msg, uint64_t *value)
{
    int      ctl = -1; /* unknown: a garbage sender_tag (see sl_tag.h) */
    uint64_t w[2];

    if ((info->sender_tag & SL_TAG_MASK_HEADER) == posted) {
        ctl = (info->sender_tag & SL_TAG_HEADER) != 0;
    }
    if (ctl == 0 || info->length != SL_CTL_LEN) {
        return (ctl == 1) ? SL_MSG_BAD : SL_MSG_DATA;
    }
    memcpy(w, msg, sizeof(w));
    *value = w[1];
    if (w[0] == SL_HEADER_MAGIC) {
        return SL_MSG_HEADER;
    }
    if (w[0] == SL_NOTICE_MAGIC) {
        return SL_MSG_NOTICE;
    }
    return (ctl == 1) ? SL_MSG_BAD : SL_MSG_DATA;
}

void sl_sub_finish(sl_sub_t *sub, sl_status_t status, size_t length,
                   const char *why)
{
    sl_req_t  *req  = sub->req;
    sl_comm_t *comm = req->comm;
    const stagelink_tag_t *tag = &req->xfer.tag;

    sl_status_t own;

    sub->ucx_req  = NULL;
    sub->staged   = NULL;
    sub->finished = 1;
    --req->pending;
    if (sl_sub_on_net(sub)) {
        --comm->net_sends;
        comm->net_quiet_at = sl_time_now() + SL_NET_QUIET;
    }
    if (req->peer_failed && sub->kind == SL_SUB_STAGE_RECV &&
        (status != STAGELINK_SUCCESS || sub->notice != STAGELINK_SUCCESS ||
         length != sub->expected)) {
        /* Our own failure is the root cause; a peer's notice only echoes it. */
        req->status      = STAGELINK_SUCCESS;
        req->peer_failed = 0;
    }
    if (sub->notice != STAGELINK_SUCCESS) {
        if (sl_sub_is_recv(sub)) {
            sl_sub_peer_failed(req, sub);
        }
        /* A notice sent is no tensor byte either. */
    } else if (status == STAGELINK_ERR_CANCELED) {
        sl_req_fail(req, STAGELINK_ERR_CANCELED,
                    "transfer of microbatch %u chunk %u was canceled",
                    tag->microbatch, tag->chunk);
    } else if (status != STAGELINK_SUCCESS) {
        sl_req_fail(req, status, "%s of microbatch %u chunk %u with rank %d "
                    "(receiver nbytes %zu): %s", sl_sub_name(sub->kind),
                    tag->microbatch, tag->chunk, sub->peer->rank,
                    req->xfer.nbytes, why);
    } else if (length != sub->expected) {
        sl_req_fail(req, STAGELINK_ERR_SIZE_MISMATCH,
                    "%s of microbatch %u chunk %u from rank %d got %zu "
                    "bytes, expected %zu (receiver nbytes %zu); both "
                    "sides must pass the same nbytes",
                    sl_sub_name(sub->kind), tag->microbatch, tag->chunk,
                    sub->peer->rank, length, sub->expected,
                    req->xfer.nbytes);
    } else {
        sl_sub_count(comm, sub, length);
    }

    if (sub->kind == SL_SUB_STAGE_RECV) {
        req->stage_done = 1;
        own = (status != STAGELINK_SUCCESS)          ? status
            : (sub->notice != STAGELINK_SUCCESS)     ? sub->notice
            : (length != sub->expected)              ? STAGELINK_ERR_SIZE_MISMATCH
                                                     : STAGELINK_SUCCESS;
        /* At once, even inside a UCX callback (posting is allowed there):
         * deferred until progress returns, the peers' rendezvous copies
         * served in the same progress call would delay it (measured: 2.4 ms
         * at 8 MiB, the two halves of a gather then run one after another). */
        if (req->needs_gather) {
            sl_xfer_shard_arrived(req, own);
        }
    }
}

/* UCX's outcome of one operation, in stagelink's terms. */
static void sl_sub_complete(sl_sub_t *sub, ucs_status_t ucs, size_t length)
{
    char why[SL_ERRBUF_LEN];

    switch (ucs) {
    case UCS_OK:
        sl_sub_finish(sub, STAGELINK_SUCCESS, length, "");
        return;
    case UCS_ERR_CANCELED:
        sl_sub_finish(sub, STAGELINK_ERR_CANCELED, 0, "");
        return;
    case UCS_ERR_MESSAGE_TRUNCATED:
        snprintf(why, sizeof(why), "the sender sent more than the %zu bytes "
                 "expected; both sides must pass the same nbytes",
                 sub->expected);
        sl_sub_finish(sub, STAGELINK_ERR_SIZE_MISMATCH, 0, why);
        return;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
        /* Seen on the operation before (or instead of) the endpoint's
         * error callback. */
        sl_fault_peer_down(sub->peer, "UCX reported \"%s\" on a transfer",
                           ucs_status_string(ucs));
        break;
    default:
        break;
    }
    if (sub->peer->failed) {
        sl_fault_describe(sub->peer, why, sizeof(why));
        sl_sub_finish(sub, STAGELINK_ERR_PEER_FAILED, 0, why);
        return;
    }
    snprintf(why, sizeof(why), "UCX: %s", ucs_status_string(ucs));
    sl_sub_finish(sub, STAGELINK_ERR_TRANSPORT, 0, why);
}

static void sl_sub_send_cb(void *request, ucs_status_t status, void *user_data)
{
    sl_sub_t *sub = user_data;

    ucp_request_free(request);
    ++sub->callbacks;
    if (sub->detached) {
        return;
    }
    sub->ucx_req = NULL;
    sl_sub_complete(sub, status, sub->expected);
}

/* Where a plain receive lands: a receive shorter than a control message
 * takes the sub's own buffer, so no header or notice is ever truncated. */
static void *sl_sub_landing(sl_sub_t *sub)
{
    return (sub->expected < SL_CTL_LEN) ? (void *)sub->ctl : sub->buf;
}

static void sl_sub_recv_cb(void *request, ucs_status_t status,
                           const ucp_tag_recv_info_t *info, void *user_data)
{
    sl_sub_t *sub = user_data;
    void     *msg;
    uint64_t  value = 0;

    ucp_request_free(request);
    ++sub->callbacks;
    if (sub->detached) {
        return;
    }
    sub->ucx_req = NULL;
    msg          = sl_sub_landing(sub);
    if (status == UCS_OK) {
        switch (sl_msg_classify(sub->tag, info, msg, &value)) {
        case SL_MSG_NOTICE:
            sub->notice = sl_notice_status(value);
            sl_sub_finish(sub, STAGELINK_SUCCESS, sub->expected, "");
            return;
        case SL_MSG_HEADER:
            /* A framed sender: its part is larger than one chunk. */
            sl_chunked_drain(sub, value);
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
    sl_sub_t *sub = &req->subs[req->nsubs++];

    sub->req      = req;
    sub->ucx_req  = NULL;
    sub->finished = 0;
    sub->staged   = NULL;
    sub->peer     = peer;
    sub->kind     = kind;
    sub->tag      = tag;
    sub->buf      = NULL;
    sub->expected = len;
    sub->detached = 0;
    sub->notice   = STAGELINK_SUCCESS;
    ++req->pending;
    req->comm->net_sends += sl_sub_on_net(sub);
    return sub;
}

/* `before`: the sub's callback count before the post. */
static sl_status_t sl_sub_started(sl_sub_t *sub, unsigned before,
                                  ucs_status_ptr_t ptr)
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
    } else if (sub->callbacks == before) {
        /* UCX 1.13 may run the callback inside the call (NO_IMM_CMPL with
         * the message already there) and still return the freed request. */
        sub->ucx_req = ptr;
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_sub_send_plain(sl_sub_t *sub, const void *buf,
                                     size_t len, uint64_t tag,
                                     const stagelink_memh_t *memh)
{
    ucp_request_param_t param;
    unsigned            before = sub->callbacks;

    sl_ucx_param_init(&param, sub, UCS_MEMORY_TYPE_HOST, memh);
    param.cb.send = sl_sub_send_cb;
    return sl_sub_started(sub, before,
                          ucp_tag_send_nbx(sub->peer->ep, buf, len, tag,
                                           &param));
}

/*
 * Whether a message goes in chunks; both ends must decide alike from what
 * both know (mode, t, size; the chunk size and mode are checked equal at
 * init).  Device memory always does (bounded bounce buffers).  Host memory
 * only where a receiver relays it as it lands: the shard of a
 * scatter_gather boundary and the relays themselves.  Elsewhere one message
 * is faster (measured: full, 64 MiB, 8 Gbit/s link, t = 2: 94 ms whole,
 * 128 ms in 1 MiB chunks).  A host sender facing a device receiver outside
 * scatter_gather therefore fails with a size mismatch.
 */
static int sl_sub_in_chunks(const sl_comm_t *comm, sl_sub_kind_t kind,
                            size_t len, int device)
{
    if (device) {
        return len > 0;
    }
    if (len <= comm->chunk) {
        return 0;
    }
    return kind == SL_SUB_GATHER_SEND || kind == SL_SUB_GATHER_RECV ||
           (comm->mode == STAGELINK_MODE_SCATTER_GATHER &&
            comm->layout.tp_size > 1);
}

/* Large and device buffers go in chunks (ucx_chunked.c).  This is the one
 * place where a buffer is handed to UCX, so no device pointer reaches a UCX
 * without CUDA. */
static sl_status_t sl_sub_chunked(sl_sub_t *sub, void *buf, size_t len,
                                  int recv)
{
    sl_status_t status = sl_chunked_sub_start(sub, buf, len, recv);

    if (status != STAGELINK_SUCCESS) {
        sl_sub_finish(sub, status, 0, sub->req->comm->err.msg);
    }
    return status;
}

static sl_status_t sl_sub_post(sl_req_t *req, sl_ucx_peer_t *peer,
                               sl_sub_kind_t kind, uint64_t tag, void *buf,
                               size_t len, int recv, int device)
{
    ucp_request_param_t param;
    sl_sub_t           *sub = sl_sub_new(req, peer, kind, tag, len);
    sl_status_t         status;
    unsigned char      *land;
    unsigned            before;

    sub->buf = buf;
    status   = sl_fault_check(req->comm, peer);
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
                      (land == buf && len > 0) ? req->xfer.memh : NULL);
    param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv       = sl_sub_recv_cb;
    before              = sub->callbacks;
    return sl_sub_started(sub, before,
                          ucp_tag_recv_nbx(req->comm->worker, land,
                                           (land == buf) ? len : SL_CTL_LEN,
                                           tag, SL_TAG_MASK_HEADER, &param));
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
    sl_status_t s   = sl_fault_check(req->comm, peer);

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

void sl_xfer_shard_arrived(sl_req_t *req, sl_status_t own)
{
    sl_comm_t  *comm = req->comm;
    sl_status_t status;

    status = req->gather->shard_ready((req->gather == comm->gather)
                                          ? comm->gather_state
                                          : comm->gather_dev_state,
                                      req, own);
    if (status != STAGELINK_SUCCESS) {
        req->gather_posted = 1;
        sl_req_fail(req, status, "%s", comm->err.msg);
    }
    /* Even when our own shard failed, the peers' shards (or their failure
     * notices) are received, not canceled: left unmatched, they would be
     * taken by the next transfer with the same tag. */
}

/** Checks one transfer before anything is posted. */
static sl_status_t sl_xfer_validate(sl_comm_t *comm, stagelink_op_kind_t kind,
                                    const stagelink_xfer_t *xfer,
                                    int *backward,
                                    stagelink_mem_type_t *mem_type)
{
    const char          *op = (kind == STAGELINK_OP_SEND) ? "send" : "receive";
    int                  to_next;

    if (xfer == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "%s: the transfer descriptor is NULL", op);
    }
    if (kind != STAGELINK_OP_SEND && kind != STAGELINK_OP_RECV) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "operation kind %d is neither STAGELINK_OP_SEND nor "
                        "STAGELINK_OP_RECV", (int)kind);
    }
    if (xfer->peer != STAGELINK_PEER_NEXT && xfer->peer != STAGELINK_PEER_PREV) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "%s: peer %d is neither STAGELINK_PEER_NEXT nor "
                        "STAGELINK_PEER_PREV", op, (int)xfer->peer);
    }
    to_next = (xfer->peer == STAGELINK_PEER_NEXT);
    if ((to_next ? comm->next.rank : comm->prev.rank) < 0) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_PEER,
                        "%s %s stage: rank %d is the %s pipeline stage", op,
                        to_next ? "to/from the next" : "to/from the previous",
                        comm->layout.rank, to_next ? "last" : "first");
    }
    if (xfer->buf == NULL && xfer->nbytes > 0) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "%s of %zu bytes with a NULL buffer", op,
                        xfer->nbytes);
    }
    SL_CHECK(sl_shard_check(xfer->nbytes, xfer->elem_size, &comm->err));
    if (xfer->tag.chunk > STAGELINK_TAG_MAX_CHUNK || xfer->tag.reserved != 0) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "%s: tag chunk %u exceeds %u or reserved field is %u "
                        "(must be 0)", op, xfer->tag.chunk,
                        STAGELINK_TAG_MAX_CHUNK, xfer->tag.reserved);
    }
    /* Sends to next and receives from prev carry activations forward. */
    *backward = ((kind == STAGELINK_OP_SEND) != to_next);
    if (xfer->tag.direction > STAGELINK_DIR_BACKWARD ||
        (xfer->tag.direction != STAGELINK_DIR_AUTO &&
         (xfer->tag.direction == STAGELINK_DIR_BACKWARD) != *backward)) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "%s to %s stage: tag direction %u contradicts the "
                        "peer (a %s transfer); use STAGELINK_DIR_AUTO", op,
                        to_next ? "next" : "previous", xfer->tag.direction,
                        *backward ? "backward" : "forward");
    }
    return sl_mem_resolve(comm, xfer, mem_type);
}

/* Undoes a request whose posting failed part-way; its error stays. */
static void sl_xfer_abort(sl_comm_t *comm, sl_req_t *req)
{
    sl_req_cancel_subs(comm, req);
    if (sl_ucx_wait(comm, req) == STAGELINK_SUCCESS) {
        sl_req_put(comm, req);
    }
}

sl_status_t sl_xfer_start(sl_req_t *req)
{
    sl_comm_t      *comm = req->comm;
    sl_tag_fields_t f    = {.cls        = SL_TAG_CLASS_STAGE,
                            .backward   = req->backward,
                            .chunk      = req->xfer.tag.chunk,
                            .source     = 0,
                            .microbatch = req->xfer.tag.microbatch};
    char           *buf  = (char *)req->xfer.buf + req->shard.offset;

    if (req->kind == STAGELINK_OP_SEND) {
        return sl_sub_post_send(req, req->peer, SL_SUB_STAGE_SEND,
                                sl_tag_encode(&f), buf, req->shard.length);
    }
    if (req->needs_gather) {
        req->gather = req->device ? comm->gather_dev : comm->gather;
        SL_CHECK(req->gather->post(req->device ? comm->gather_dev_state
                                               : comm->gather_state, req));
    }
    return sl_sub_post_recv(req, req->peer, SL_SUB_STAGE_RECV,
                            sl_tag_encode(&f), buf, req->shard.length);
}

sl_status_t sl_xfer_post(sl_comm_t *comm, stagelink_op_kind_t kind,
                         const stagelink_xfer_t *xfer, sl_req_t **req_out)
{
    stagelink_mem_type_t mem_type;
    sl_req_t            *req;
    sl_status_t          status;
    sl_errbuf_t          saved;
    int                  backward;

    SL_CHECK(sl_xfer_validate(comm, kind, xfer, &backward, &mem_type));
    SL_CHECK(sl_req_get(comm, kind, xfer, backward, &req));

    req->mode   = comm->mode;
    req->device = (mem_type == STAGELINK_MEM_CUDA);
    req->peer   = (xfer->peer == STAGELINK_PEER_NEXT) ? &comm->next : &comm->prev;
    if (comm->mode == STAGELINK_MODE_FULL) {
        req->shard = (sl_shard_t){0, xfer->nbytes};
    } else {
        req->shard = sl_shard_get(xfer->nbytes, xfer->elem_size,
                                  comm->layout.tp_size, comm->layout.tp_index);
    }
    req->needs_gather = (kind == STAGELINK_OP_RECV &&
                         comm->mode == STAGELINK_MODE_SCATTER_GATHER &&
                         comm->layout.tp_size > 1);
    SL_TRACE(SL_SUBSYS_NET, "%s %s mb %u chunk %u: %zu of %zu %s bytes at %zu "
             "with rank %d", (kind == STAGELINK_OP_SEND) ? "send" : "recv",
             backward ? "bwd" : "fwd", xfer->tag.microbatch, xfer->tag.chunk,
             req->shard.length, xfer->nbytes, req->device ? "device" : "host",
             req->shard.offset, req->peer->rank);
    SL_CHECK_GOTO(req->device ? sl_device_prepare(req) : sl_xfer_start(req),
                  err_abort);
    *req_out = req;
    return STAGELINK_SUCCESS;

err_abort:
    saved = comm->err;
    sl_xfer_abort(comm, req);
    comm->err = saved;
    return status;
}

static int sl_op_same_tag(const stagelink_op_t *a, int a_bwd,
                          const stagelink_op_t *b, int b_bwd)
{
    return a->kind == b->kind && a_bwd == b_bwd &&
           a->xfer.tag.microbatch == b->xfer.tag.microbatch &&
           a->xfer.tag.chunk == b->xfer.tag.chunk;
}

sl_status_t sl_xfer_post_batch(sl_comm_t *comm, const stagelink_op_t *ops,
                               size_t count, sl_req_t **reqs)
{
    int                  bwd_i, bwd_j;
    stagelink_mem_type_t mem_type;
    sl_errbuf_t          saved;
    sl_status_t status = STAGELINK_SUCCESS;
    size_t      i, j, posted = 0;
    int         pass;

    /* Everything is checked before anything is posted, so a bad element
     * never leaves half a batch on the wire. */
    for (i = 0; i < count; ++i) {
        SL_CHECK(sl_xfer_validate(comm, ops[i].kind, &ops[i].xfer, &bwd_i,
                                  &mem_type));
        for (j = 0; j < i; ++j) {
            sl_xfer_validate(comm, ops[j].kind, &ops[j].xfer, &bwd_j,
                             &mem_type);
            if (sl_op_same_tag(&ops[i], bwd_i, &ops[j], bwd_j)) {
                return sl_error(&comm->err, STAGELINK_ERR_TAG_IN_USE,
                                "batch elements %zu and %zu have the same "
                                "direction, kind, microbatch %u and chunk %u",
                                j, i, ops[i].xfer.tag.microbatch,
                                ops[i].xfer.tag.chunk);
            }
        }
    }
    for (i = 0; i < count; ++i) {
        reqs[i] = NULL;
    }
    /* Receives first: the peers' sends then always find them posted. */
    for (pass = 0; pass < 2; ++pass) {
        stagelink_op_kind_t kind = pass ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;

        for (i = 0; i < count; ++i) {
            if (ops[i].kind != kind) {
                continue;
            }
            SL_CHECK_GOTO(sl_xfer_post(comm, kind, &ops[i].xfer, &reqs[i]),
                          err_abort);
            ++posted;
        }
    }
    return STAGELINK_SUCCESS;

err_abort:
    saved = comm->err;
    for (pass = 0; pass < 2 && posted > 0; ++pass) {
        stagelink_op_kind_t kind = pass ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;

        for (i = 0; i < count && posted > 0; ++i) {
            if (ops[i].kind == kind && reqs[i] != NULL) {
                sl_xfer_abort(comm, reqs[i]);
                reqs[i] = NULL;
                --posted;
            }
        }
    }
    comm->err = saved;
    return status;
}
