/*
 * Leftover chunks: the part of a message in chunks that a canceled
 * receive did not take.  A cancel cannot give back a message that has
 * begun to land, and its other chunks, left on the wire, would be matched
 * by the next receive with the tag (their sequence numbers repeat).  So
 * the communicator takes them itself, into the scratch chunk, in the
 * background: the canceled receive ends without waiting for its sender.
 * Every receive is posted at once, ahead of any later receive with the
 * tag, so UCX matches the old chunks here first (a later receive can be
 * posted only once the canceled one ended, a tag in flight being refused,
 * by when each chunk receive it canceled was called back and added).
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "ucx_leftover.h"

#include "sl_log.h"

#include <stdlib.h>

/* One chunk receive; its callback's context. */
typedef struct sl_leftover_rx {
    struct sl_leftover *lo;
    void               *req;  /**< UCX's, until its callback ran */
    int                 done; /**< its callback ran (maybe inside the post) */
} sl_leftover_rx_t;

struct sl_leftover {
    sl_comm_t          *comm;
    sl_ucx_peer_t      *peer;
    uint64_t            tag;   /**< the message's tag (chunks add their number) */
    void               *scratch; /**< where every chunk lands, dropped */
    size_t              room;
    size_t              n, cap;
    size_t              left;  /**< receives not yet called back */
    int                 held;  /**< its transfer may still add chunks */
    sl_leftover_rx_t   *rx;
    struct sl_leftover *next;
};

static void sl_leftover_cb(void *request, ucs_status_t status,
                           const ucp_tag_recv_info_t *info, void *user)
{
    sl_leftover_rx_t *rx = user;

    (void)status;
    (void)info;
    sl_ucx_callback_ran(rx->lo->comm);
    ucp_request_free(request);
    rx->req  = NULL;
    rx->done = 1;
    --rx->lo->left;
}

/* Posts the receive of chunk `index` (a notice in its place matches too). */
static void sl_leftover_post(sl_leftover_t *lo, uint64_t index)
{
    sl_leftover_rx_t   *rx = &lo->rx[lo->n++];
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;

    rx->lo = lo;
    sl_ucx_param_init(&param, rx, UCS_MEMORY_TYPE_HOST, NULL, NULL);
    param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv       = sl_leftover_cb;
    ++lo->left;
    ptr = ucp_tag_recv_nbx(lo->peer->worker, lo->scratch, lo->room,
                           sl_tag_chunk(lo->tag, index), SL_TAG_MASK_HEADER,
                           &param);
    if (UCS_PTR_IS_PTR(ptr)) {
        rx->req = rx->done ? NULL : ptr;
    } else {
        --lo->left; /* refused: the worker is going (nothing more comes) */
    }
}

sl_status_t sl_leftover_start(sl_comm_t *comm, sl_ucx_peer_t *peer,
                              uint64_t tag, void *scratch, size_t room,
                              uint64_t first, uint64_t count, size_t more,
                              sl_leftover_t **out)
{
    sl_leftover_t *lo;
    uint64_t       i;

    if ((lo = calloc(1, sizeof(*lo))) == NULL ||
        (lo->rx = calloc((size_t)(count - first) + more + 1,
                         sizeof(*lo->rx))) == NULL) {
        /* Not the caller's error: its receive takes the chunks itself. */
        SL_WARN(SL_SUBSYS_NET, "no memory to drain %llu chunks of a canceled "
                "receive from rank %d in the background: the receive takes "
                "them before it ends", (unsigned long long)(count - first),
                peer->rank);
        free(lo);
        return STAGELINK_ERR_NO_MEMORY;
    }
    lo->comm        = comm;
    lo->peer        = peer;
    lo->tag         = tag;
    lo->scratch     = scratch;
    lo->room        = room;
    lo->cap         = (size_t)(count - first) + more;
    lo->held        = 1;
    lo->next        = comm->leftovers;
    comm->leftovers = lo;
    for (i = first; i < count; ++i) {
        sl_leftover_post(lo, i);
    }
    *out = lo;
    return STAGELINK_SUCCESS;
}

void sl_leftover_add(sl_leftover_t *lo, uint64_t index)
{
    if (lo->n < lo->cap && !lo->peer->failed) {
        sl_leftover_post(lo, index);
    }
}

void sl_leftover_release(sl_leftover_t *lo)
{
    lo->held = 0;
}

/* Cancels what `lo` still waits for (its peer is gone, or the worker). */
static void sl_leftover_cancel(sl_leftover_t *lo)
{
    size_t i;

    for (i = 0; i < lo->n; ++i) {
        if (lo->rx[i].req != NULL) {
            ucp_request_cancel(lo->peer->worker, lo->rx[i].req);
        }
    }
}

void sl_leftover_progress(sl_comm_t *comm)
{
    sl_leftover_t **link = &comm->leftovers, *lo;

    while ((lo = *link) != NULL) {
        if (lo->peer->failed) {
            sl_leftover_cancel(lo); /* its chunks will not come */
        }
        if (lo->left > 0 || lo->held) {
            link = &lo->next;
            continue;
        }
        *link = lo->next;
        free(lo->rx);
        free(lo);
    }
}

int sl_leftover_pending(const sl_comm_t *comm)
{
    const sl_leftover_t *lo;

    for (lo = comm->leftovers; lo != NULL; lo = lo->next) {
        if (lo->left > 0 && !lo->peer->failed) {
            return 1;
        }
    }
    return 0;
}

void sl_leftover_stop(sl_comm_t *comm)
{
    sl_leftover_t *lo;

    for (lo = comm->leftovers; lo != NULL; lo = lo->next) {
        sl_leftover_cancel(lo);
    }
}

void sl_leftover_cleanup(sl_comm_t *comm)
{
    sl_leftover_t *lo, *next;

    for (lo = comm->leftovers; lo != NULL; lo = next) {
        next = lo->next;
        free(lo->rx);
        free(lo);
    }
    comm->leftovers = NULL;
}
