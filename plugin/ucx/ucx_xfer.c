/*
 * The byte path of a transfer: which bytes of the tensor go to the
 * neighbour stage (shard or full tensor), the checks before anything is
 * posted, and how the ends of its messages (ucx_sub.c reports each through
 * sl_xfer_sub_done) add up to the request's outcome.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "gather.h"

#include "sl_log.h"
#include "sl_tag.h"
#include "sl_xfer_check.h"

#include <stdio.h>
#include <string.h>

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

void sl_xfer_sub_done(sl_sub_t *sub, sl_status_t status, size_t length,
                      const char *why)
{
    sl_req_t  *req  = sub->req;
    sl_comm_t *comm = req->comm;
    const stagelink_tag_t *tag = &req->xfer.tag;

    sl_status_t own;

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
                    "bytes, expected %zu (this rank's part of %zu bytes "
                    "cut on %zu-byte elements); both sides must pass the "
                    "same nbytes and elem_size (shards are cut on whole "
                    "elements, so another element size moves the cuts)",
                    sl_sub_name(sub->kind), tag->microbatch, tag->chunk,
                    sub->peer->rank, length, sub->expected,
                    req->xfer.nbytes,
                    req->xfer.elem_size ? req->xfer.elem_size : (size_t)1);
    } else {
        sl_sub_count(comm, sub, length);
    }

    if (sub->kind == SL_SUB_STAGE_RECV) {
        own = (status != STAGELINK_SUCCESS)          ? status
            : (sub->notice != STAGELINK_SUCCESS)     ? sub->notice
            : (length != sub->expected)              ? STAGELINK_ERR_SIZE_MISMATCH
                                                     : STAGELINK_SUCCESS;
        /* At once, even inside a UCX callback (posting is allowed there):
         * deferred until progress returns, the peers' rendezvous copies
         * served in the same progress call would delay it, and the two
         * halves of a gather would run one after another. */
        if (req->needs_gather) {
            sl_xfer_shard_arrived(req, own);
        }
    }
}

void sl_xfer_shard_arrived(sl_req_t *req, sl_status_t own)
{
    sl_comm_t  *comm = req->comm;
    sl_status_t status;

    status = req->gather->shard_ready(req->gather_state, req, own);
    if (status != STAGELINK_SUCCESS) {
        req->gather_posted = 1;
        sl_req_fail(req, status, "%s", comm->err.msg);
    }
    /* Even when our own shard failed, the peers' shards (or their failure
     * notices) are received, not canceled: left unmatched, they would be
     * taken by the next transfer with the same tag. */
}

/* Checks one transfer before anything is posted (may_ask: see
 * sl_mem_resolve). */
static sl_status_t sl_xfer_validate(sl_comm_t *comm, stagelink_op_kind_t kind,
                                    const stagelink_xfer_t *xfer, int may_ask,
                                    int *backward,
                                    stagelink_mem_type_t *mem_type)
{
    SL_CHECK(sl_xfer_check(&comm->layout, kind, xfer, backward, &comm->err));
    return sl_mem_resolve(comm, xfer, may_ask, mem_type);
}

/* Undoes a request whose posting failed part-way with comm->err's
 * sentence, which stays: the request fails with it, so that nothing waits
 * for a part never posted, and ends as a completed one does. */
static void sl_xfer_abort(sl_comm_t *comm, sl_req_t *req)
{
    sl_req_fail(req, STAGELINK_ERR_CANCELED, "%s", comm->err.msg);
    sl_req_cancel_subs(comm, req);
    if (sl_req_wait(comm, req) == STAGELINK_SUCCESS) {
        sl_req_finish(comm, req);
    }
}

static sl_status_t sl_xfer_start(sl_req_t *req)
{
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
        SL_CHECK(req->gather->post(req->gather_state, req));
    }
    return sl_sub_post_recv(req, req->peer, SL_SUB_STAGE_RECV,
                            sl_tag_encode(&f), buf, req->shard.length);
}

/* A device request's stream is past its post: start it, unless it was
 * canceled while it waited (nothing was posted) or the stream failed. */
static void sl_xfer_stream_ready(sl_req_t *req, sl_status_t status)
{
    sl_comm_t *comm = req->comm;

    if (req->status != STAGELINK_SUCCESS) {
        return;
    }
    if (status != STAGELINK_SUCCESS) {
        sl_req_fail(req, status, "the host's stream failed before the "
                    "transfer: %s", comm->err.msg);
    } else if ((status = sl_xfer_start(req)) != STAGELINK_SUCCESS) {
        sl_req_fail(req, status, "%s", comm->err.msg);
    }
}

static sl_status_t sl_xfer_post_one(sl_comm_t *comm, stagelink_op_kind_t kind,
                                    const stagelink_xfer_t *xfer, int may_ask,
                                    sl_req_t **req_out)
{
    stagelink_mem_type_t mem_type;
    sl_req_t            *req;
    sl_status_t          status;
    sl_errbuf_t          saved;
    int                  backward;

    SL_CHECK(sl_xfer_validate(comm, kind, xfer, may_ask, &backward, &mem_type));
    SL_CHECK(sl_req_get(comm, kind, xfer, backward, &req));

    req->device       = (mem_type == STAGELINK_MEM_CUDA);
    req->sub_done     = sl_xfer_sub_done;
    req->stream_ready = sl_xfer_stream_ready;
    if (req->device && comm->device < 0 && comm->gpu->device_current != NULL) {
        /* The host works on its GPU by now: the progress thread follows. */
        comm->device = comm->gpu->device_current();
    }
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
    if (req->needs_gather) {
        req->gather       = req->device ? comm->gather_dev : comm->gather;
        req->gather_state = req->device ? comm->gather_dev_state
                                        : comm->gather_state;
        if (req->gather->issue != NULL) {
            /* Here, in the host's program order: see gather_nccl.c. */
            SL_CHECK_GOTO(req->gather->issue(req->gather_state, req),
                          err_abort);
        }
    }
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

sl_status_t sl_xfer_post(sl_comm_t *comm, stagelink_op_kind_t kind,
                         const stagelink_xfer_t *xfer, sl_req_t **req_out)
{
    return sl_xfer_post_one(comm, kind, xfer, 1, req_out);
}

sl_status_t sl_xfer_post_batch(sl_comm_t *comm, const stagelink_op_t *ops,
                               size_t count, sl_req_t **reqs)
{
    int                  bwd_i;
    stagelink_mem_type_t mem_type;
    sl_errbuf_t          saved;
    sl_status_t status = STAGELINK_SUCCESS;
    size_t      i, posted = 0;
    int         pass;

    /* Everything is checked before anything is posted, so a bad element
     * never leaves half a batch on the wire. */
    for (i = 0; i < count; ++i) {
        SL_CHECK(sl_xfer_validate(comm, ops[i].kind, &ops[i].xfer, 1, &bwd_i,
                                  &mem_type));
    }
    SL_CHECK(sl_xfer_check_batch(ops, count, &comm->err));
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
            SL_CHECK_GOTO(sl_xfer_post_one(comm, kind, &ops[i].xfer, 0, &reqs[i]),
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
