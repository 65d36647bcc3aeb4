/*
 * Init's last word with each peer: a 16-byte synchronous hello each way
 * over every endpoint, so that init returns with UCX's wireup done.  UCX
 * wires an endpoint lazily: the first send that needs the peer's endpoint
 * (a rendezvous, a synchronous send) starts a wireup request, which waits
 * in a proxy endpoint's queue until the transport connects and the peer
 * answers.  A peer that dies while one waits there makes UCX 1.13 fail an
 * assertion (wireup_ep.c:241, ucp_ep_set_failed from inside that queue's
 * dispatch), aborting the survivor; and the first transfer would pay those
 * round trips.  A synchronous send waits for that wireup and for the peer
 * to match it, and the peer's data leaves only once its own wireup is
 * answered: with this rank's hello done and the peer's come, no wireup
 * message is left in either queue.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"
#include "sl_time.h"

#include <stdlib.h>
#include <string.h>

/* The longest sleep between looks: UCX 1.13's TCP transport can miss a
 * wake-up (ucx_progress.c), and hellos take milliseconds. */
#define SL_HELLO_NAP_S 5e-3

/** One endpoint's hello. */
typedef enum sl_hello_state {
    SL_HELLO_NONE,   /**< no endpoint in the slot (this rank's own) */
    SL_HELLO_POSTED, /**< its send and its receive are out */
    SL_HELLO_DONE,   /**< both completed: the endpoint is wired both ways */
    SL_HELLO_DOWN    /**< the peer died meanwhile: its first transfer
                          reports it, as for a death seen by sl_fault_watch */
} sl_hello_state_t;

typedef struct sl_hello {
    sl_hello_state_t state;
    sl_ucx_peer_t   *peer;
    void            *send; /**< request, NULL once complete */
    void            *recv; /**< request, NULL once complete */
    sl_ctl_msg_t     msg;  /**< what came: SL_HELLO_MAGIC, the sender */
} sl_hello_t;

/* A rank's hellos share one tag: prev and next may be one rank, with two
 * endpoints whose hellos either receive may take. */
static uint64_t sl_hello_tag(int sender)
{
    sl_tag_fields_t f = {.cls = SL_TAG_CLASS_HELLO,
                         .microbatch = (uint32_t)sender};

    return sl_tag_encode(&f) | SL_TAG_HEADER;
}

/* An operation that ended in an error: a dead peer is left to its first
 * transfer; anything else fails init. */
static sl_status_t sl_hello_failed(sl_comm_t *comm, sl_hello_t *h,
                                   ucs_status_t ucs, int sending)
{
    if (sl_wire_status(h->peer, ucs, "its hello at init") ==
        STAGELINK_ERR_PEER_FAILED) {
        h->state = SL_HELLO_DOWN;
        return STAGELINK_SUCCESS;
    }
    return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                    "%s rank %d at init failed in UCX: %s; check UCX_TLS and "
                    "UCX_NET_DEVICES on both ranks",
                    sending ? "this rank's hello to" : "the hello from",
                    h->peer->rank, ucs_status_string(ucs));
}

static sl_status_t sl_hello_post(sl_comm_t *comm, sl_hello_t *h)
{
    sl_ucx_peer_t      *peer = h->peer;
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    ptr = ucp_tag_recv_nbx(peer->worker, &h->msg, sizeof(h->msg),
                           sl_hello_tag(peer->rank), SL_TAG_MASK_ALL, &param);
    if (UCS_PTR_IS_ERR(ptr)) {
        return sl_hello_failed(comm, h, UCS_PTR_STATUS(ptr), 0);
    }
    h->recv  = ptr;
    h->state = SL_HELLO_POSTED;
    ptr = ucp_tag_send_sync_nbx(peer->ep, &comm->hello_msg,
                                sizeof(comm->hello_msg),
                                sl_hello_tag(comm->layout.rank), &param);
    if (UCS_PTR_IS_ERR(ptr)) {
        return sl_hello_failed(comm, h, UCS_PTR_STATUS(ptr), 1);
    }
    h->send = ptr;
    return STAGELINK_SUCCESS;
}

/* Every transition of a hello past POSTED. */
static sl_status_t sl_hello_step(sl_comm_t *comm, sl_hello_t *h)
{
    ucp_tag_recv_info_t info;
    ucs_status_t        ucs;

    if (h->state != SL_HELLO_POSTED) {
        return STAGELINK_SUCCESS;
    }
    if (h->peer->failed) {
        h->state = SL_HELLO_DOWN;
        return STAGELINK_SUCCESS;
    }
    if (h->send != NULL &&
        (ucs = ucp_request_check_status(h->send)) != UCS_INPROGRESS) {
        ucp_request_free(h->send);
        h->send = NULL;
        if (ucs != UCS_OK) {
            return sl_hello_failed(comm, h, ucs, 1);
        }
    }
    if (h->recv != NULL &&
        (ucs = ucp_tag_recv_request_test(h->recv, &info)) != UCS_INPROGRESS) {
        ucp_request_free(h->recv);
        h->recv = NULL;
        if (ucs != UCS_OK) {
            return sl_hello_failed(comm, h, ucs, 0);
        }
        if (info.length != sizeof(h->msg) || h->msg.magic != SL_HELLO_MAGIC ||
            h->msg.value != (uint64_t)h->peer->rank) {
            return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                            "rank %d's hello at init holds %zu bytes (magic "
                            "%#llx, rank %llu), not its %u-byte hello: ranks "
                            "run different stagelink versions?",
                            h->peer->rank, info.length,
                            (unsigned long long)h->msg.magic,
                            (unsigned long long)h->msg.value, SL_CTL_LEN);
        }
    }
    if (h->send == NULL && h->recv == NULL) {
        h->state = SL_HELLO_DONE;
    }
    return STAGELINK_SUCCESS;
}

/* A receive still out is canceled, a send is UCX's to release once done
 * (its buffer is the communicator's).  1: UCX may still write into `h`
 * (a receive that matched a message still arriving). */
static int sl_hello_release(sl_hello_t *h)
{
    int busy = 0;

    if (h->recv != NULL) {
        ucp_request_cancel(h->peer->worker, h->recv);
        busy = ucp_request_check_status(h->recv) == UCS_INPROGRESS;
        ucp_request_free(h->recv);
    }
    if (h->send != NULL) {
        ucp_request_free(h->send);
    }
    return busy;
}

static sl_status_t sl_hello_late(sl_comm_t *comm, const sl_hello_t *h)
{
    return sl_error(&comm->err, STAGELINK_ERR_TIMEOUT,
                    "rank %d (%s node %s) and this rank exchanged no hello "
                    "over UCX within STAGELINK_TIMEOUT (%.1f s) of init: %s; "
                    "check that UCX_TLS and UCX_NET_DEVICES give both ranks a "
                    "transport that reaches the other, and that no firewall "
                    "drops UCX's ports", h->peer->rank,
                    h->peer->inter_node ? "other" : "same", h->peer->node_id,
                    comm->timeout,
                    (h->send != NULL)
                        ? "this rank's endpoint to it never connected"
                        : "this rank's hello left, but none came from it");
}

sl_status_t sl_hello_exchange(sl_comm_t *comm)
{
    int         n        = sl_peer_count(comm), i, left, eps = 0, down = 0;
    int         busy     = 0;
    double      t0       = sl_time_now();
    double      deadline = sl_deadline(comm->timeout);
    sl_status_t status   = STAGELINK_SUCCESS;
    sl_hello_t *h        = calloc((size_t)n, sizeof(*h));
    sl_sleep_t  s;

    if (h == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d hellos", n);
    }
    comm->hello_msg = (sl_ctl_msg_t){SL_HELLO_MAGIC,
                                     (uint64_t)comm->layout.rank};
    for (i = 0; i < n; ++i) {
        h[i].peer = sl_peer_at(comm, i);
        if (h[i].peer->ep != NULL && !h[i].peer->failed) {
            ++eps;
            SL_CHECK_GOTO(sl_hello_post(comm, &h[i]), out);
        }
    }
    sl_progress_sleep_init(&s, NULL);
    pthread_mutex_lock(&comm->lock); /* sl_progress_sleep releases it */
    for (;;) {
        sl_ucx_progress(comm);
        for (i = 0, left = -1; i < n; ++i) {
            SL_CHECK_GOTO(sl_hello_step(comm, &h[i]), unlock);
            left = (h[i].state == SL_HELLO_POSTED && left < 0) ? i : left;
        }
        if (left < 0) {
            break;
        }
        if (sl_deadline_passed(deadline)) {
            status = sl_hello_late(comm, &h[left]);
            goto unlock;
        }
        SL_CHECK_GOTO(sl_progress_sleep(comm, &s, sl_deadline_earlier(
                          deadline, sl_time_now() + SL_HELLO_NAP_S)),
                      unlock);
    }
unlock:
    pthread_mutex_unlock(&comm->lock);
out:
    for (i = 0; i < n; ++i) {
        down += (h[i].state == SL_HELLO_DOWN);
        busy |= sl_hello_release(&h[i]);
        /* A flushing close in sl_ucx_worker_destroy would wait for this
         * peer a whole STAGELINK_TIMEOUT more, endpoint by endpoint. */
        if (status != STAGELINK_SUCCESS && h[i].state == SL_HELLO_POSTED) {
            sl_ucx_ep_force_close(h[i].peer);
        }
    }
    if (!busy) {
        free(h); /* else UCX may still write into it */
    }
    if (status == STAGELINK_SUCCESS) {
        SL_INFO(SL_SUBSYS_INIT, "rank %d: hellos over %d endpoints in %.1f "
                "ms%s", comm->layout.rank, eps, (sl_time_now() - t0) * 1e3,
                down ? " (a peer died meanwhile)" : "");
    }
    return status;
}
