/*
 * Requests: a fixed pool made at init (no allocation per transfer), the
 * list of requests in flight (to refuse a tag reused while in flight), and
 * completion.  SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

sl_status_t sl_req_pool_init(sl_req_pool_t *pool, int capacity, int tp_size,
                             sl_errbuf_t *eb)
{
    int i;

    memset(pool, 0, sizeof(*pool));
    pool->slots = calloc((size_t)capacity, sizeof(*pool->slots));
    pool->subs  = calloc((size_t)capacity * 2 * (size_t)tp_size,
                         sizeof(*pool->subs));
    pool->flags = calloc((size_t)capacity, (size_t)tp_size);
    if (pool->slots == NULL || pool->subs == NULL || pool->flags == NULL) {
        sl_req_pool_cleanup(pool);
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d requests for TP size %d; lower "
                        "STAGELINK_MAX_REQUESTS", capacity, tp_size);
    }
    pool->capacity = capacity;
    for (i = capacity - 1; i >= 0; --i) {
        pool->slots[i].subs  = &pool->subs[(size_t)i * 2 * (size_t)tp_size];
        pool->slots[i].flags = &pool->flags[(size_t)i * (size_t)tp_size];
        pool->slots[i].next = pool->free_list;
        pool->free_list     = &pool->slots[i];
    }
    return STAGELINK_SUCCESS;
}

void sl_req_pool_cleanup(sl_req_pool_t *pool)
{
    free(pool->slots);
    free(pool->subs);
    free(pool->flags);
    memset(pool, 0, sizeof(*pool));
}

static int sl_req_same_tag(const sl_req_t *a, stagelink_op_kind_t kind,
                           const stagelink_xfer_t *xfer, int backward)
{
    return a->kind == kind && a->backward == backward &&
           a->xfer.tag.microbatch == xfer->tag.microbatch &&
           a->xfer.tag.chunk == xfer->tag.chunk;
}

sl_status_t sl_req_get(sl_comm_t *comm, stagelink_op_kind_t kind,
                       const stagelink_xfer_t *xfer, int backward,
                       sl_req_t **req_out)
{
    sl_req_pool_t *pool = &comm->pool;
    sl_req_t      *req;

    for (req = pool->active; req != NULL; req = req->next) {
        if (sl_req_same_tag(req, kind, xfer, backward)) {
            return sl_error(&comm->err, STAGELINK_ERR_TAG_IN_USE,
                            "a %s %s with microbatch %u chunk %u is already "
                            "in flight; complete it before reusing the tag",
                            backward ? "backward" : "forward",
                            (kind == STAGELINK_OP_SEND) ? "send" : "receive",
                            xfer->tag.microbatch, xfer->tag.chunk);
        }
    }
    req = pool->free_list;
    if (req == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "%d transfers already in flight, the limit; "
                        "complete some or raise STAGELINK_MAX_REQUESTS",
                        pool->capacity);
    }
    pool->free_list = req->next;

    req->magic         = SL_REQ_MAGIC;
    req->comm          = comm;
    req->kind          = kind;
    req->xfer          = *xfer;
    req->backward      = backward;
    req->pending       = 0;
    req->nsubs         = 0;
    req->stage_done    = 0;
    req->gather_posted = 0;
    req->needs_gather  = 0;
    req->status        = STAGELINK_SUCCESS;
    req->peer_failed   = 0;
    req->device        = 0;
    req->deferred      = 0;
    req->stream_event  = NULL;
    req->gather        = NULL;
    req->shard_state   = 0;
    req->shard_status  = STAGELINK_SUCCESS;
    req->gather_next   = NULL;
    req->forwarding    = 0;
    req->stage_landed  = 0;
    req->detached_subs = 0;
    req->wait_deadline = 0.0;
    req->sub_done      = sl_xfer_sub_done;
    req->error[0]      = '\0';

    req->prev = NULL;
    req->next = pool->active;
    if (pool->active != NULL) {
        pool->active->prev = req;
    }
    pool->active = req;
    ++pool->in_use;
    *req_out = req;
    return STAGELINK_SUCCESS;
}

void sl_req_put(sl_comm_t *comm, sl_req_t *req)
{
    sl_req_pool_t *pool = &comm->pool;

    if (req->prev != NULL) {
        req->prev->next = req->next;
    } else {
        pool->active = req->next;
    }
    if (req->next != NULL) {
        req->next->prev = req->prev;
    }
    req->magic = 0;
    --pool->in_use;
    if (req->detached_subs > 0) {
        return; /* its subs may still be called back: never reused */
    }
    req->next       = pool->free_list;
    pool->free_list = req;
}

sl_status_t sl_req_check(sl_comm_t *comm, sl_req_t *req)
{
    const sl_req_pool_t *pool = &comm->pool;
    uintptr_t            base = (uintptr_t)pool->slots;
    uintptr_t            p    = (uintptr_t)req;

    if (req == NULL || p < base ||
        p >= base + (uintptr_t)pool->capacity * sizeof(*req) ||
        (p - base) % sizeof(*req) != 0 || req->magic != SL_REQ_MAGIC) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "request %p is not in flight on this communicator "
                        "(already completed, or from another one)",
                        (void *)req);
    }
    return STAGELINK_SUCCESS;
}

void sl_req_fail(sl_req_t *req, sl_status_t status, const char *fmt, ...)
{
    va_list ap;

    if (req->status != STAGELINK_SUCCESS) {
        return;
    }
    req->status = status;
    va_start(ap, fmt);
    vsnprintf(req->error, sizeof(req->error), fmt, ap);
    va_end(ap);
}

const char *sl_req_what(const sl_req_t *req)
{
    static const char *const what[2][2] = {
        {"forward send", "forward receive"},
        {"backward send", "backward receive"}};

    return what[req->backward != 0][req->kind == STAGELINK_OP_RECV];
}

int sl_req_done(const sl_req_t *req)
{
    if (req->pending > 0 || req->deferred) {
        return 0;
    }
    /* A gather that has not passed the own shard on is not finished. */
    return !req->needs_gather || req->gather_posted ||
           req->status != STAGELINK_SUCCESS;
}

sl_status_t sl_req_finish(sl_comm_t *comm, sl_req_t *req)
{
    sl_status_t status = req->status;

    if (status != STAGELINK_SUCCESS) {
        sl_error(&comm->err, status, "%s", req->error);
    } else {
        ++comm->counters.transfers_completed;
    }
    sl_req_put(comm, req);
    return status;
}

void sl_req_cancel_subs(sl_comm_t *comm, sl_req_t *req)
{
    int i;

    if (req->deferred) {
        sl_req_fail(req, STAGELINK_ERR_CANCELED, "transfer of microbatch %u "
                    "chunk %u was canceled before it started",
                    req->xfer.tag.microbatch, req->xfer.tag.chunk);
    }
    for (i = 0; i < req->nsubs; ++i) {
        sl_sub_cancel(comm, &req->subs[i]);
    }
}
