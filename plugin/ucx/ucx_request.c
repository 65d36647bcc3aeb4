/*
 * A request's whole life, and the one writer of its state (sl_req_state_t):
 * a fixed pool made at init (no allocation per transfer), the list in
 * flight (to refuse a tag reused while in flight), the start (behind the
 * host's stream for a device buffer), the ends of its subs, the hand-off
 * of the own shard to the gather, waiting, completion, and comm_finalize's
 * end of what the host left in flight.  The layers below report through
 * the request's callbacks (sub_done, stream_ready).
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "gather.h"

#include "sl_log.h"
#include "sl_time.h"
#include "sl_xfer_check.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* Records the first error (its sentence kept with the request). */
static void sl_req_vfail(sl_req_t *req, sl_status_t status, const char *fmt,
                         va_list ap)
{
    if (req->status == STAGELINK_SUCCESS) {
        req->status = status;
        vsnprintf(req->error, sizeof(req->error), fmt, ap);
    }
}

static void sl_req_fail(sl_req_t *req, sl_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void sl_req_fail(sl_req_t *req, sl_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    sl_req_vfail(req, status, fmt, ap);
    va_end(ap);
}

const char *sl_req_what(const sl_req_t *req)
{
    static const char *const what[2][2] = {
        {"forward send", "forward receive"},
        {"backward send", "backward receive"}};

    return what[req->backward != 0][req->kind == STAGELINK_OP_RECV];
}

/*
 * Events of a request (a start, a sub's end, a cancel) nest: a sub posted
 * inside one can end inside its own post (UCX completes a send, or a
 * receive of a message already there, such as a peer's failure notice, at
 * once).  Only the outermost event settles, so a request never ends while
 * the rest of a start or a shard's hand-off is still to be posted.
 */
static void sl_req_begin(sl_req_t *req)
{
    ++req->nesting;
}

/* ACTIVE -> ENDED, once nothing is in flight and the own shard was passed
 * on (or the request failed: no shard may come). */
static void sl_req_end(sl_req_t *req)
{
    if (--req->nesting == 0 && req->state == SL_REQ_ACTIVE &&
        req->subs.pending == 0 &&
        (!req->needs_gather || req->shard_passed ||
         req->status != STAGELINK_SUCCESS)) {
        req->state = SL_REQ_ENDED;
    }
}

static void sl_req_count(sl_comm_t *comm, const sl_sub_t *sub, size_t bytes)
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
static void sl_req_peer_failed(sl_req_t *req, const sl_sub_t *sub)
{
    req->peer_failed = (req->status == STAGELINK_SUCCESS);
    sl_req_fail(req, sub->notice, "%s rank %d gave up its part of microbatch "
                "%u chunk %u with %s; its own error says why",
                (sub->kind == SL_SUB_STAGE_RECV) ? "the sending" : "TP peer",
                sub->peer->rank, req->xfer.tag.microbatch,
                req->xfer.tag.chunk, stagelink_status_string(sub->notice));
}

static void sl_req_shard_arrived(sl_req_t *req, sl_status_t own);

/* A sub ended (sub_done): its bytes counted, or its failure recorded. */
static void sl_req_sub_done(sl_sub_t *sub, sl_status_t status, size_t length,
                            const char *why)
{
    sl_req_t  *req  = sub->req;
    sl_comm_t *comm = req->comm;
    const stagelink_tag_t *tag = &req->xfer.tag;

    sl_status_t own;

    sl_req_begin(req);
    if (req->peer_failed && sub->kind == SL_SUB_STAGE_RECV &&
        (status != STAGELINK_SUCCESS || sub->notice != STAGELINK_SUCCESS ||
         length != sub->expected)) {
        /* Our own failure is the root cause; a peer's notice only echoes it. */
        req->status      = STAGELINK_SUCCESS;
        req->peer_failed = 0;
    }
    if (sub->notice != STAGELINK_SUCCESS) {
        if (sl_sub_is_recv(sub)) {
            sl_req_peer_failed(req, sub);
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
        sl_req_count(comm, sub, length);
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
            sl_req_shard_arrived(req, own);
        }
    }
    sl_req_end(req);
}

/* The own shard of a gathered receive is in place, or failed with `own`:
 * the gather passes it on (or a notice of `own`) to the TP peers. */
static void sl_req_shard_arrived(sl_req_t *req, sl_status_t own)
{
    sl_comm_t  *comm = req->comm;
    sl_status_t status;

    status = req->gather->shard_ready(req->gather_state, req, own);
    req->shard_passed = 1;
    if (status != STAGELINK_SUCCESS) {
        sl_req_fail(req, status, "%s", comm->err.msg);
    }
    /* Even when our own shard failed, the peers' shards (or their failure
     * notices) are received, not canceled: left unmatched, they would be
     * taken by the next transfer with the same tag. */
}

/* Posts the subs of a started request: the stage message, and for a
 * receive that a gather rebuilds, the gather's part first (the peers'
 * shards may arrive before our own). */
static sl_status_t sl_req_post_subs(sl_req_t *req)
{
    sl_tag_fields_t f   = {.cls        = SL_TAG_CLASS_STAGE,
                           .backward   = req->backward,
                           .chunk      = req->xfer.tag.chunk,
                           .source     = 0,
                           .microbatch = req->xfer.tag.microbatch};
    char           *buf = (char *)req->xfer.buf + req->shard.offset;

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

/* Whether the stage message's own sub was posted (its end passes the
 * shard, or its failure, to the gather). */
static int sl_req_stage_posted(const sl_req_t *req)
{
    int i;

    for (i = 0; i < req->subs.n; ++i) {
        if (req->subs.slot[i].kind == SL_SUB_STAGE_RECV) {
            return 1;
        }
    }
    return 0;
}

/* DEFERRED -> ACTIVE: the host's stream is past the post.  When the
 * request was canceled meanwhile or the stream failed, only a gathered
 * receive's part of the gather is posted, and its notice sent. */
static void sl_req_stream_ready(sl_req_t *req, sl_status_t status)
{
    sl_comm_t *comm = req->comm;

    sl_req_begin(req);
    req->state = SL_REQ_ACTIVE;
    if (req->status == STAGELINK_SUCCESS && status != STAGELINK_SUCCESS) {
        sl_req_fail(req, status, "the host's stream failed before the "
                    "transfer: %s", comm->err.msg);
    }
    if (req->status != STAGELINK_SUCCESS) {
        /* Canceled while it waited, or its stream failed: a gathered
         * receive still hears its TP peers' parts and tells them why its
         * own will not come, so nothing of theirs is left for a later
         * receive with this tag and none waits for it to its deadline. */
        if (req->needs_gather && req->cancels < 2 &&
            req->gather->post(req->gather_state, req) != STAGELINK_SUCCESS) {
            sl_req_abort(comm, req, SL_CANCEL_DRAIN, req->status, "%s",
                         req->error);
        }
        if (req->needs_gather) {
            sl_req_shard_arrived(req, req->status);
        }
    } else if ((status = sl_req_post_subs(req)) != STAGELINK_SUCCESS) {
        /* What was posted before the failure is canceled, not left to wait
         * for peers that may never send; the peers hear why. */
        sl_req_abort(comm, req, SL_CANCEL_DRAIN, status, "%s",
                     comm->err.msg);
        if (req->needs_gather && !req->shard_passed &&
            !sl_req_stage_posted(req)) {
            sl_req_shard_arrived(req, req->status);
        }
    }
    sl_req_end(req);
}

sl_status_t sl_req_start(sl_req_t *req)
{
    sl_status_t status;

    if (req->device) {
        status = sl_device_prepare(req);
        req->state = (status == STAGELINK_SUCCESS) ? SL_REQ_DEFERRED
                                                   : SL_REQ_ACTIVE;
        return status;
    }
    sl_req_begin(req);
    req->state = SL_REQ_ACTIVE;
    status     = sl_req_post_subs(req);
    sl_req_end(req);
    return status;
}

sl_status_t sl_req_start_gather(sl_req_t *req)
{
    sl_status_t status;

    sl_req_begin(req);
    req->state = SL_REQ_ACTIVE;
    status     = req->gather->post(req->gather_state, req);
    if (status == STAGELINK_SUCCESS) {
        if (req->gather->landed != NULL) {
            req->gather->landed(req->gather_state, req, req->shard.length);
        }
        sl_req_shard_arrived(req, STAGELINK_SUCCESS);
    }
    sl_req_end(req);
    return status;
}

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
    pool->nfree    = capacity;
    for (i = capacity - 1; i >= 0; --i) {
        /* Each part is set whole here; its owner writes its fields. */
        pool->slots[i].subs = (sl_req_subs_t){
            .slot = &pool->subs[(size_t)i * 2 * (size_t)tp_size]};
        pool->slots[i].gather_part = (sl_req_gather_t){
            .flags = &pool->flags[(size_t)i * (size_t)tp_size]};
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

sl_status_t sl_req_tag_free(sl_comm_t *comm, stagelink_op_kind_t kind,
                            const stagelink_xfer_t *xfer, int backward)
{
    sl_req_t *req;

    for (req = comm->pool.active; req != NULL; req = req->next) {
        if (sl_xfer_same_tag(req->kind, req->backward, req->xfer.tag, kind,
                             backward, xfer->tag)) {
            return sl_xfer_tag_in_use(kind, backward, xfer->tag, &comm->err);
        }
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_req_room(sl_comm_t *comm, size_t count)
{
    sl_req_pool_t *pool = &comm->pool;

    if (count > (size_t)pool->nfree) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "posting %zu would pass the limit of %d transfers "
                        "in flight (%d free); complete some or raise "
                        "STAGELINK_MAX_REQUESTS", count, pool->capacity,
                        pool->nfree);
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_req_memh_idle(sl_comm_t *comm, const stagelink_memh_t *memh)
{
    const sl_req_pool_t *pool = &comm->pool;
    const sl_req_t      *req;
    int                  i;

    /* Every slot, not only the active list: a retired request's UCX
     * operations may still read through memh. */
    for (i = 0; i < pool->capacity; ++i) {
        req = &pool->slots[i];
        if (req->state == SL_REQ_FREE || req->xfer.memh != memh) {
            continue;
        }
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_STATE,
                        "memory handle %p is in use by the %s of microbatch "
                        "%u chunk %u, %s", (const void *)memh,
                        (req->kind == STAGELINK_OP_SEND) ? "send" : "receive",
                        req->xfer.tag.microbatch, req->xfer.tag.chunk,
                        (req->state == SL_REQ_RETIRED)
                            ? "given up while UCX still holds it; it is "
                              "released at comm_finalize"
                            : "not yet waited for; wait for the transfers "
                              "posted with it before deregistering it");
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_req_get(sl_comm_t *comm, stagelink_op_kind_t kind,
                       const stagelink_xfer_t *xfer, int backward,
                       sl_req_t **req_out)
{
    sl_req_pool_t *pool = &comm->pool;
    sl_req_t      *req;

    SL_CHECK(sl_req_tag_free(comm, kind, xfer, backward));
    SL_CHECK(sl_req_room(comm, 1));
    req             = pool->free_list;
    pool->free_list = req->next;
    --pool->nfree;

    req->magic         = SL_REQ_MAGIC;
    req->state         = SL_REQ_POSTING;
    req->comm          = comm;
    req->kind          = kind;
    req->xfer          = *xfer;
    req->backward      = backward;
    req->subs          = (sl_req_subs_t){.slot = req->subs.slot};
    req->needs_gather  = 0;
    req->shard_passed  = 0;
    req->nesting       = 0;
    req->cancels       = 0;
    req->status        = STAGELINK_SUCCESS;
    req->peer_failed   = 0;
    req->device        = 0;
    req->sub_done      = sl_req_sub_done;
    req->stream_ready  = sl_req_stream_ready;
    req->stream        = (sl_req_stream_t){NULL, NULL};
    req->gather        = NULL;
    req->gather_state  = NULL;
    req->gather_part   = (sl_req_gather_t){.flags = req->gather_part.flags};
    memset(req->gather_part.flags, 0, (size_t)comm->layout.tp_size);
    req->order_stream  = NULL;
    req->wait_deadline = 0.0;
    req->error[0]      = '\0';

    req->prev = NULL;
    req->next = pool->active;
    if (pool->active != NULL) {
        pool->active->prev = req;
    }
    pool->active = req;
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
    if (req->subs.detached > 0) {
        req->state = SL_REQ_RETIRED; /* UCX may still call back its subs */
        return;
    }
    req->state      = SL_REQ_FREE;
    req->next       = pool->free_list;
    pool->free_list = req;
    ++pool->nfree;
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

void sl_req_route(sl_req_t *req, sl_ucx_peer_t *peer, sl_shard_t shard,
                  int device, const sl_gather_ops_t *gather,
                  void *gather_state)
{
    req->peer         = peer;
    req->shard        = shard;
    req->device       = device;
    req->needs_gather = (gather != NULL);
    req->gather       = gather;
    req->gather_state = gather_state;
}

int sl_req_done(const sl_req_t *req)
{
    return req->state == SL_REQ_ENDED;
}

int sl_req_wait_only(const sl_req_t *req)
{
    return req->needs_gather && req->gather != NULL &&
           req->gather->due != NULL &&
           req->gather->due(req->gather_state, req);
}

/* The gather backend's end of a request the host completes or finalize
 * ends: the host's stream waits for its collective. */
static void sl_req_gather_complete(sl_req_t *req)
{
    sl_status_t status;

    if (req->gather != NULL && req->gather->complete != NULL &&
        (status = req->gather->complete(req->gather_state, req)) !=
            STAGELINK_SUCCESS) {
        sl_req_fail(req, status, "%s", req->comm->err.msg);
    }
}

void sl_req_order_stream(sl_req_t *req, void *stream)
{
    req->order_stream = stream;
}

sl_status_t sl_req_finish(sl_comm_t *comm, sl_req_t *req)
{
    sl_status_t status;

    sl_req_gather_complete(req);
    if (req->status == STAGELINK_SUCCESS && req->device &&
        req->kind == STAGELINK_OP_RECV && req->order_stream != NULL &&
        sl_device_order(req, req->order_stream) != STAGELINK_SUCCESS) {
        sl_req_fail(req, STAGELINK_ERR_TRANSPORT, "%s", comm->err.msg);
    }
    status = req->status;

    if (status != STAGELINK_SUCCESS) {
        sl_error(&comm->err, status, "%s", req->error);
    } else {
        ++comm->counters.transfers_completed;
    }
    sl_req_put(comm, req);
    return status;
}

void sl_req_cancel(sl_comm_t *comm, sl_req_t *req, sl_cancel_reach_t reach)
{
    int i;

    sl_req_begin(req);
    ++req->cancels;
    if (req->state == SL_REQ_POSTING) {
        req->state = SL_REQ_ACTIVE; /* its poster gave up: it ends as posted */
    }
    if (req->state == SL_REQ_DEFERRED) {
        sl_req_fail(req, STAGELINK_ERR_CANCELED, "transfer of microbatch %u "
                    "chunk %u was canceled before it started",
                    req->xfer.tag.microbatch, req->xfer.tag.chunk);
    }
    for (i = 0; i < req->subs.n; ++i) {
        const sl_sub_t *sub = &req->subs.slot[i];

        /* A live TP peer sends its part of a gathered receive (its shard,
         * status or a notice) whatever this rank does: heard, not
         * canceled, it cannot land in a later receive with this tag, and
         * a collective the peers issue finds this rank in it.  A second
         * cancel gives up on them too. */
        if (!req->needs_gather || !sl_sub_is_recv(sub) ||
            sub->kind == SL_SUB_STAGE_RECV || req->cancels > 1) {
            sl_sub_cancel(comm, &req->subs.slot[i], reach);
        }
    }
    sl_req_end(req);
}

void sl_req_abort(sl_comm_t *comm, sl_req_t *req, sl_cancel_reach_t reach,
                  sl_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    sl_req_vfail(req, status, fmt, ap);
    va_end(ap);
    sl_req_cancel(comm, req, reach);
}

void sl_req_describe_pending(const sl_req_t *req, char *out, size_t len)
{
    size_t used = 0;
    char   one[256];
    int    i;

    out[0] = '\0';
    for (i = 0; i < req->subs.n && used + 1 < len; ++i) {
        if (sl_sub_describe(&req->subs.slot[i], one, sizeof(one))) {
            used += (size_t)snprintf(out + used, len - used, "%s%s",
                                     used ? ", " : "", one);
        }
    }
    if (out[0] == '\0') {
        snprintf(out, len, "the own shard to be passed to the TP group");
    }
}

/* The poll window, after Linux KVM's halt polling with shrink 2
 * (design.md): doubled when polling would have beaten the wake-up,
 * halved, to nothing, when it would not or the core had other work. */
#define SL_SPIN_FIRST 10e-6

static void sl_req_spin_adapt(sl_comm_t *comm, int grow)
{
    if (grow) {
        comm->spin_now = (comm->spin_now < SL_SPIN_FIRST) ? SL_SPIN_FIRST
                                                          : 2 * comm->spin_now;
        comm->spin_now = (comm->spin_now > comm->spin) ? comm->spin
                                                       : comm->spin_now;
    } else {
        comm->spin_now = (comm->spin_now / 2 < SL_SPIN_FIRST)
                             ? 0.0 : comm->spin_now / 2;
    }
}

/* The calling thread's involuntary context switches: the kernel took its
 * core for other runnable work. */
static long sl_req_preemptions(void)
{
    struct rusage ru;

    return (getrusage(RUSAGE_THREAD, &ru) == 0) ? ru.ru_nivcsw : 0;
}

/* Whether the kernel preempted the thread since *seen was read; reads it
 * again. */
static int sl_req_preempted_since(long *seen)
{
    long now = sl_req_preemptions();
    int  was = (now != *seen);

    *seen = now;
    return was;
}

sl_status_t sl_req_wait_until(sl_comm_t *comm, sl_req_t *req,
                              double deadline, double slice_end)
{
    double     now, asleep_at, spin_until = sl_time_now() + comm->spin_now;
    double     checked_at = 0.0; /* when `preempted` was read */
    long       preempted = -1; /* read once the request is not done at once */
    unsigned   events;
    int        calm;
    sl_sleep_t s;

    sl_progress_sleep_init(&s, NULL);
    for (;;) {
        events = sl_ucx_progress(comm);
        if (sl_req_done(req)) {
            return STAGELINK_SUCCESS;
        }
        if (sl_deadline_passed(slice_end) && !sl_deadline_passed(deadline)) {
            return STAGELINK_IN_PROGRESS;
        }
        if (sl_deadline_passed(deadline)) {
            char pending[512];

            sl_req_describe_pending(req, pending, sizeof(pending));
            return sl_error(&comm->err, STAGELINK_ERR_TIMEOUT,
                            "%s of microbatch %u chunk %u did not complete "
                            "in %.1f s, waiting for: %s; the request stays in "
                            "flight: wait again or cancel it",
                            sl_req_what(req), req->xfer.tag.microbatch,
                            req->xfer.tag.chunk, comm->timeout, pending);
        }
        asleep_at = sl_time_now();
        if (comm->spin > 0 && preempted < 0) {
            preempted  = sl_req_preemptions();
            checked_at = asleep_at;
        }
        if (events > 0 && comm->spin_now > 0) {
            /* The window is for idle time, as halt polling's: while the
             * workers have events (this transfer's bytes, or any other's)
             * the wait polls on, and it sleeps once they pause.  Polling
             * on, it still yields to a core's other work: a preemption in
             * the last window halves it, as after a sleep. */
            if (asleep_at - checked_at >= comm->spin_now) {
                if (sl_req_preempted_since(&preempted)) {
                    sl_req_spin_adapt(comm, 0);
                }
                checked_at = asleep_at;
            }
            spin_until = asleep_at + comm->spin_now;
        }
        if (asleep_at < spin_until) {
            continue;
        }
        SL_CHECK(sl_progress_sleep(comm, &s,
                                   sl_deadline_earlier(deadline, slice_end)));
        /* Only a sleep in poll() says what polling would have done; after
         * any other step no fresh window opens unless progress finds
         * events. */
        if (comm->spin > 0 && s.polled != SL_SLEEP_NO_POLL) {
            now  = sl_time_now();
            calm = !sl_req_preempted_since(&preempted);
            sl_req_spin_adapt(comm, calm && s.polled == SL_SLEEP_WOKEN &&
                                        now - asleep_at < comm->spin);
            checked_at = now;
            spin_until = now + comm->spin_now;
        }
    }
}

sl_status_t sl_req_wait_for(sl_comm_t *comm, sl_req_t *req, int timeout_ms)
{
    sl_status_t status;

    if (req->wait_deadline == 0.0) {
        req->wait_deadline = sl_deadline(comm->timeout);
    }
    status = sl_req_wait_until(comm, req, req->wait_deadline,
                               (timeout_ms < 0) ? 0.0
                                   : sl_time_now() + timeout_ms * 1e-3);
    if (status != STAGELINK_IN_PROGRESS) {
        req->wait_deadline = 0.0;
    }
    return status;
}

sl_status_t sl_req_wait(sl_comm_t *comm, sl_req_t *req)
{
    return sl_req_wait_until(comm, req, sl_deadline(comm->timeout), 0.0);
}

/* "forward send of microbatch 3 chunk 0 to rank 5" into the list. */
static void sl_req_name_into(const sl_req_t *req, char *out, size_t len,
                             size_t *used, int *listed, int *more)
{
    int n;

    if (*used + 64 >= len) {
        ++*more;
        return;
    }
    n = snprintf(out + *used, len - *used, "%s%s of microbatch %u chunk %u%s%d",
                 *listed ? ", " : "", sl_req_what(req),
                 req->xfer.tag.microbatch, req->xfer.tag.chunk,
                 req->kind == STAGELINK_OP_SEND ? " to rank " : " from rank ",
                 req->peer != NULL ? req->peer->rank : -1);
    if (n > 0 && (size_t)n < len - *used) {
        *used += (size_t)n;
        ++*listed;
    } else {
        out[*used] = '\0';
        ++*more;
    }
}

sl_status_t sl_req_abandon_all(sl_comm_t *comm, double deadline)
{
    sl_req_t  *req, *next;
    sl_sleep_t s;
    char       names[SL_ERRBUF_LEN - 256];
    size_t     used = 0;
    int        nrecv = 0, nsend = 0, listed = 0, more = 0, waiting, i;
    int        unwaited = 0;

    if (comm->pool.active == NULL && !sl_leftover_pending(comm)) {
        return STAGELINK_SUCCESS;
    }
    for (req = comm->pool.active; req != NULL; req = req->next) {
        if (req->kind == STAGELINK_OP_RECV && !sl_req_done(req)) {
            sl_req_abort(comm, req, SL_CANCEL_ALL, STAGELINK_ERR_ABANDONED,
                         "%s of microbatch %u chunk %u was still in flight "
                         "at comm_finalize, which canceled it",
                         sl_req_what(req), req->xfer.tag.microbatch,
                         req->xfer.tag.chunk);
        }
    }
    /* Sends get the grace: a peer that receives them late completes them.
     * So do the drains of canceled messages, whose senders wait for them
     * (a barrier that does not progress UCX would not serve them). */
    sl_progress_sleep_init(&s, NULL);
    for (;;) {
        sl_ucx_progress(comm);
        waiting = sl_leftover_pending(comm);
        for (req = comm->pool.active; req != NULL; req = req->next) {
            waiting += !sl_req_done(req);
        }
        if (waiting == 0 || sl_deadline_passed(deadline) ||
            sl_progress_sleep(comm, &s, deadline) != STAGELINK_SUCCESS) {
            break;
        }
    }
    /* Oldest first: the list holds the newest at its head. */
    for (req = comm->pool.active; req != NULL && req->next != NULL;
         req = req->next) {
    }
    for (; req != NULL; req = next) {
        next = req->prev;
        if (!sl_req_done(req)) {
            sl_req_fail(req, STAGELINK_ERR_ABANDONED, "%s of microbatch %u "
                        "chunk %u did not complete within the %.1f s grace "
                        "of comm_finalize (STAGELINK_FINALIZE_GRACE), which "
                        "abandoned it", sl_req_what(req),
                        req->xfer.tag.microbatch, req->xfer.tag.chunk,
                        comm->grace);
            for (i = 0; i < req->subs.n; ++i) {
                if (sl_sub_in_flight(&req->subs.slot[i])) {
                    sl_ucx_ep_force_close(req->subs.slot[i].peer);
                    sl_sub_detach(comm, &req->subs.slot[i], STAGELINK_ERR_ABANDONED,
                                  "abandoned by comm_finalize");
                }
            }
        }
        if (sl_req_done(req) && sl_req_wait_only(req)) {
            ++unwaited;
            sl_req_fail(req, STAGELINK_ERR_ABANDONED, "%s of microbatch %u "
                        "chunk %u ended but was never waited for",
                        sl_req_what(req), req->xfer.tag.microbatch,
                        req->xfer.tag.chunk);
        }
        sl_req_gather_complete(req);
        if (req->status == STAGELINK_SUCCESS && sl_req_done(req)) {
            sl_req_put(comm, req); /* completed within the grace */
            continue;
        }
        *(req->kind == STAGELINK_OP_RECV ? &nrecv : &nsend) += 1;
        sl_req_name_into(req, names, sizeof(names), &used, &listed, &more);
        if (req->state != SL_REQ_DEFERRED) {
            sl_req_put(comm, req);
        }
    }
    if (nrecv + nsend == 0) {
        return STAGELINK_SUCCESS;
    }
    comm->abandoned = nrecv + nsend;
    return sl_error(&comm->err, STAGELINK_ERR_ABANDONED,
                    "comm_finalize found %d requests that the host never "
                    "completed: %d receives canceled, %d sends not done "
                    "within the %.1f s grace (STAGELINK_FINALIZE_GRACE) "
                    "abandoned: %s%s; complete every request with wait or "
                    "test before comm_finalize%s", nrecv + nsend, nrecv, nsend,
                    comm->grace, names, more ? " and more" : "",
                    unwaited ? " (receives gathered by NCCL by wait alone: "
                               "their collective, due in wait, was never "
                               "issued here, and TP peers that waited ran "
                               "theirs without this rank)" : "");
}
