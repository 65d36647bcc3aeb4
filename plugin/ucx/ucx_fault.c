/*
 * Faults: how a dead peer or an abort becomes an error on every request it
 * touches, promptly instead of at the deadline.
 *
 * A peer on another node is watched by UCX itself (PEER error mode: its
 * endpoint's error callback).  A peer on this node cannot be: UCX 1.13's
 * shared-memory transports do not report peer failure, and PEER mode would
 * move same-node traffic onto TCP (see ucx_worker.c).  Its process is
 * watched instead through a pidfd, which becomes readable when the process
 * exits and sits in the same poll() as the UCX event fd.
 *
 * Failures are seen inside UCX callbacks and applied after progress
 * returns: canceling requests and closing endpoints from inside an
 * endpoint's own error callback is not allowed.
 *
 * Once a communicator knows that any rank died, every request in flight
 * fails with PEER_FAILED at once and later posts are refused (NCCL's
 * communicator-abort rule): after a death a path that does not involve
 * the dead rank can still be stuck (seen: a survivor's shared-memory FIFO
 * blocked behind a message the dead rank never finished writing).  The
 * ranks that see the death first tell every neighbour rank (a report on
 * the FAULT tag class, listened for from init), which fail and pass it
 * on, so the whole job hears of it within milliseconds.
 *
 * A UCX error on a link is weaker evidence than a death seen: a live peer
 * that failed for another rank's death and closed its endpoints causes
 * the same error, sometimes before its report arrives (seen: over TCP
 * between TP peers).  Such a fault is held back for SL_FAULT_GRACE, during
 * which a pidfd or a report names the rank that really died.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"
#include "ucx_comm.h"

#include "sl_log.h"
#include "sl_time.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* How often a caller that never sleeps (a host looping on `test`) has the
 * same-node peers' pidfds looked at. */
#define SL_FAULT_LIVENESS_PERIOD 1e-3



/* At most this many UCX progress calls take in what a dead peer had sent
 * before its death is applied. */
#define SL_FAULT_DRAIN_ROUNDS 64

/* How long finalize lets fault reports still queued go out (seconds). */
#define SL_FAULT_REPORT_DRAIN 0.2

/* How long finalize whose barrier failed looks for a same-node peer's
 * death (seconds): the dead process's sockets close, failing the barrier,
 * a moment before its pidfd fires. */
#define SL_FAULT_SETTLE 0.1

/* How long after sending its reports a rank keeps its endpoints open in
 * finalize (seconds): an eager send is complete for us while the bytes
 * may still be on the way, and the forced close that follows a fault can
 * reach a live peer first (seen over TCP: the peer then named this live
 * rank as the failed one, instead of the rank whose death it reported). */
#define SL_FAULT_REPORT_LINGER 0.05

/* The receive listening for one neighbour rank's report. */
typedef struct sl_fault_report {
    sl_comm_t     *comm;
    sl_ucx_peer_t *peer;   /**< an endpoint to the neighbour rank */
    int            done;
    void          *req;
    sl_ctl_msg_t   msg; /**< SL_FAULT_MAGIC, the failed rank */
} sl_fault_report_t;

static uint64_t sl_fault_tag(int sender)
{
    sl_tag_fields_t f = {.cls = SL_TAG_CLASS_FAULT,
                         .microbatch = (uint32_t)sender};

    return sl_tag_encode(&f);
}


/* A neighbour rank reports that rank `failed` died. */
static void sl_fault_reported(sl_comm_t *comm, int failed, int from)
{
    int i;

    /* A neighbour of ours: its endpoint must be closed by force too. */
    for (i = 0; i < sl_peer_count(comm); ++i) {
        sl_ucx_peer_t *peer = sl_peer_at(comm, i);

        if (peer->rank == failed && peer->ep != NULL) {
            sl_peer_down(peer, 1, "rank %d saw it die", from);
        }
    }
    if (comm->fault != STAGELINK_SUCCESS && !sl_peer_unsure(comm)) {
        return;
    }
    comm->fault          = STAGELINK_ERR_PEER_FAILED;
    comm->fault_pending  = 1;
    comm->fault_indirect = 0;
    if (failed == comm->layout.rank) {
        /* A slow link made a peer give this live rank up: the job is
         * broken all the same, and the reporter is the one we know of. */
        comm->failed_rank = from;
        snprintf(comm->fault_err.msg, sizeof(comm->fault_err.msg),
                 "rank %d reports that this rank failed (its link to it "
                 "timed out?); transfers cannot complete: finalize the "
                 "communicator and restart the job (from a checkpoint)",
                 from);
        return;
    }
    comm->failed_rank = failed;
    snprintf(comm->fault_err.msg, sizeof(comm->fault_err.msg),
             "rank %d failed (reported by rank %d, which saw it die); "
             "transfers cannot complete: finalize the communicator and "
             "restart the job (from a checkpoint)", failed, from);
    sl_log(comm->closing ? SL_LOG_INFO : SL_LOG_WARN, SL_SUBSYS_NET,
           "rank %d reports that rank %d is gone", from, failed);
}

static void sl_fault_report_cb(void *request, ucs_status_t status,
                               const ucp_tag_recv_info_t *info, void *user)
{
    sl_fault_report_t *r = user;

    sl_ucx_callback_ran(r->comm);
    ucp_request_free(request);
    r->req  = NULL;
    r->done = 1;
    if (status == UCS_OK && info->length == sizeof(r->msg) &&
        r->msg.magic == SL_FAULT_MAGIC) {
        sl_fault_reported(r->comm, (int)r->msg.value, r->peer->rank);
    }
}

static void sl_fault_report_sent(void *request, ucs_status_t status,
                                 void *user)
{
    (void)status;
    sl_ucx_callback_ran(user);
    ucp_request_free(request);
    --((sl_comm_t *)user)->reports_inflight;
}

/* Listens for every neighbour rank's report, from init on: one receive per
 * distinct rank this rank has an endpoint to (prev and next may be one). */
static sl_status_t sl_fault_listen(sl_comm_t *comm)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;
    int                 i, j;

    comm->reports = calloc((size_t)sl_peer_count(comm),
                           sizeof(*comm->reports));
    if (comm->reports == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d fault reports",
                        sl_peer_count(comm));
    }
    for (i = 0; i < sl_peer_count(comm); ++i) {
        sl_ucx_peer_t     *peer = sl_peer_at(comm, i);
        sl_fault_report_t *r    = &comm->reports[comm->nreports];

        for (j = 0; j < comm->nreports &&
                    comm->reports[j].peer->rank != peer->rank; ++j) {
        }
        if (peer->ep == NULL || j < comm->nreports) {
            continue;
        }
        ++comm->nreports;
        r->comm = comm;
        r->peer = peer;
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                             UCP_OP_ATTR_FIELD_USER_DATA |
                             UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.user_data    = r;
        param.cb.recv      = sl_fault_report_cb;
        ptr = ucp_tag_recv_nbx(peer->worker, &r->msg, sizeof(r->msg),
                               sl_fault_tag(peer->rank), SL_TAG_MASK_ALL,
                               &param);
        if (UCS_PTR_IS_ERR(ptr)) {
            r->done = 1;
            return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                            "cannot listen for rank %d's fault reports: %s",
                            peer->rank,
                            ucs_status_string(UCS_PTR_STATUS(ptr)));
        }
        if (!r->done) {
            r->req = ptr; /* not completed inside the call */
        }
    }
    return STAGELINK_SUCCESS;
}

/* Tells every live neighbour rank (those listened to) which rank failed. */
static void sl_fault_report(sl_comm_t *comm)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;
    int                 i;

    comm->fault_msg.magic = SL_FAULT_MAGIC;
    comm->fault_msg.value = (uint64_t)comm->failed_rank;
    for (i = 0; i < comm->nreports; ++i) {
        sl_ucx_peer_t *peer = comm->reports[i].peer;

        if (peer->failed || peer->ep == NULL ||
            peer->rank == comm->failed_rank) {
            continue;
        }
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                             UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send      = sl_fault_report_sent;
        param.user_data    = comm;
        ptr = ucp_tag_send_nbx(peer->ep, &comm->fault_msg,
                               sizeof(comm->fault_msg),
                               sl_fault_tag(comm->layout.rank), &param);
        /* Its callback releases it; an error is no news. */
        comm->reports_inflight += UCS_PTR_IS_PTR(ptr);
        comm->reported_at       = sl_time_now();
    }
}


static void sl_fault_progress(sl_comm_t *comm);

/* After every UCX round (a progress call runs one, and again while the
 * hooks' own posts run callbacks): while data from live peers keeps
 * flowing, waits run round after round, and a failure must end every
 * request within 100 ms (a clock read per round; the pidfds are polled
 * once a millisecond). */
/* A fault held back for a direct sighting is applied when its grace ends. */
static const sl_progress_hook_t sl_fault_hook = {.round   = sl_fault_progress,
                                                 .wake_at = sl_peer_wake_at};

sl_status_t sl_fault_watch(sl_comm_t *comm)
{
    sl_peer_process_t me;
    int               max = 1 + sl_peer_count(comm), i, n = 0;

    sl_peer_process_self(&me);
    comm->pfds     = calloc((size_t)max, sizeof(*comm->pfds));
    comm->pfd_peer = calloc((size_t)max, sizeof(*comm->pfd_peer));
    if (comm->pfds == NULL || comm->pfd_peer == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d poll entries", max);
    }
    comm->pfds[n].fd     = comm->efd;
    comm->pfds[n].events = POLLIN;
    ++n;
    for (i = 0; i < sl_peer_count(comm); ++i) {
        sl_ucx_peer_t           *peer = sl_peer_at(comm, i);
        const sl_peer_process_t *p;
        int                      fd;

        if (peer->ep == NULL || peer->inter_node) {
            continue;
        }
        p = &peer->proc;
        if (p->pid_ns != me.pid_ns) {
            /* Another container of this node: its pid means nothing here. */
            SL_INFO(SL_SUBSYS_NET, "rank %d is on this node in another pid "
                    "namespace: its death is seen at the deadline only",
                    peer->rank);
            continue;
        }
        fd = (int)syscall(SYS_pidfd_open, (pid_t)p->pid, 0);
        if (fd < 0) {
            /* ESRCH: it died during init, which the first transfer reports. */
            if (errno == ESRCH) {
                sl_peer_down(peer, 1, "its process (pid %d) exited during "
                                   "init", (int)p->pid);
                continue;
            }
            SL_INFO(SL_SUBSYS_NET, "cannot watch rank %d (pid %d): %s; its "
                    "death is seen at the deadline only", peer->rank,
                    (int)p->pid, strerror(errno));
            continue;
        }
        comm->pfds[n].fd     = fd;
        comm->pfds[n].events = POLLIN;
        comm->pfd_peer[n]    = peer;
        ++n;
    }
    comm->npfds = n;
    sl_ucx_progress_register(comm, &sl_fault_hook);
    return sl_fault_listen(comm);
}

void sl_fault_barrier_failed(sl_comm_t *comm)
{
    double until = sl_time_now() + SL_FAULT_SETTLE, left;

    /* A link's error already held (from the flush) may be settled too. */
    while ((comm->fault == STAGELINK_SUCCESS || sl_peer_unsure(comm)) &&
           comm->npfds > 1 && (left = until - sl_time_now()) > 0) {
        if (poll(comm->pfds + 1, (nfds_t)(comm->npfds - 1),
                 (int)(left * 1e3) + 1) > 0) {
            sl_peer_polled(comm);
        }
    }
    /* Only a death seen: in finalize, a link's error is a peer closing. */
    if (comm->fault == STAGELINK_ERR_PEER_FAILED && !comm->fault_indirect) {
        sl_fault_report(comm);
    }
}

void sl_fault_cleanup(sl_comm_t *comm)
{
    double deadline = sl_time_now() + SL_FAULT_REPORT_DRAIN;
    int    i, pending = 0;

    /* Finalize closes every endpoint by force after a fault, which would
     * drop reports still queued (behind detached chunks, say), or reach
     * the peer before them. */
    while ((comm->reports_inflight > 0 ||
            (comm->reported_at > 0 &&
             sl_time_now() < comm->reported_at + SL_FAULT_REPORT_LINGER)) &&
           sl_time_now() < deadline) {
        struct timespec nap = {0, 100000};

        if (sl_ucx_worker_progress(comm) == 0) {
            nanosleep(&nap, NULL); /* ranks may share cores: no spinning */
        }
    }

    /* UCX completes a canceled receive that never matched at once. */
    for (i = 0; i < comm->nreports; ++i) {
        if (comm->reports[i].req != NULL) {
            ucp_request_cancel(comm->reports[i].peer->worker,
                               comm->reports[i].req);
        }
        pending |= !comm->reports[i].done;
    }
    if (!pending) {
        free(comm->reports); /* else UCX may still call back into it */
    }
    comm->reports  = NULL;
    comm->nreports = 0;

    for (i = 1; i < comm->npfds; ++i) {
        int fd = comm->pfds[i].fd;

        close(fd >= 0 ? fd : -fd - 1); /* negative once seen (polled) */
    }
    free(comm->pfds);
    free(comm->pfd_peer);
    comm->pfds     = NULL;
    comm->pfd_peer = NULL;
    comm->npfds    = 0;
}



/*
 * What UCX will not complete after the forced close: sends to a same-node
 * peer (UCX 1.13 purges an endpoint's operations only in PEER mode) and
 * whatever else is still in flight with `peer` (NULL: with anyone).  The
 * subs finish now; their UCX operations stay, pointing at memory that is
 * never reused, so a late callback finds it and returns.
 */
static void sl_fault_detach(sl_comm_t *comm, const sl_ucx_peer_t *peer,
                            sl_status_t status, const char *why)
{
    sl_req_t *req;
    int       i;

    for (req = comm->pool.active; req != NULL; req = req->next) {
        for (i = 0; i < req->subs.n; ++i) {
            if (peer == NULL || req->subs.slot[i].peer == peer) {
                sl_sub_detach(comm, &req->subs.slot[i], status, why);
            }
        }
    }
}

/* Every request in flight fails with `status` and the sentence `why`.
 * After a failure one that ended keeps its result (its bytes are where
 * they belong), unless a collective it still needs is due in wait; after
 * comm_abort every one is ABORTED, as the header promises. */
static void sl_fault_fail_all(sl_comm_t *comm, sl_status_t status,
                              const char *why)
{
    sl_req_t *req;

    for (req = comm->pool.active; req != NULL; req = req->next) {
        if (status != STAGELINK_ERR_ABORTED && sl_req_done(req) &&
            !sl_req_wait_only(req)) {
            continue;
        }
        sl_req_abort(comm, req, SL_CANCEL_ALL, status,
                     "%s of microbatch %u chunk %u: %s",
                     sl_req_what(req), req->xfer.tag.microbatch,
                     req->xfer.tag.chunk, why);
    }
}

static void sl_fault_abort_all(sl_comm_t *comm)
{
    int i;

    sl_fault_fail_all(comm, STAGELINK_ERR_ABORTED, "the communicator was "
                      "aborted (comm_abort)");
    for (i = 0; i < sl_peer_count(comm); ++i) {
        sl_ucx_ep_force_close(sl_peer_at(comm, i));
    }
    sl_fault_detach(comm, NULL, STAGELINK_ERR_ABORTED, comm->fault_err.msg);
}

/* What a dead peer wrote before it died is delivered: its exit can be seen
 * (a pidfd polled after a round that found nothing) before a round that
 * would have found its last message in this worker's FIFO. */
static void sl_fault_drain(sl_comm_t *comm)
{
    int rounds = 0;

    while (sl_ucx_worker_progress(comm) != 0 &&
           ++rounds < SL_FAULT_DRAIN_ROUNDS) {
    }
}

static void sl_fault_apply(sl_comm_t *comm)
{
    int i;

    comm->fault_pending = 0;
    if (atomic_load_explicit(&comm->aborting, memory_order_acquire) &&
        !comm->aborted) {
        comm->aborted = 1;
        comm->fault   = STAGELINK_ERR_ABORTED;
        snprintf(comm->fault_err.msg, sizeof(comm->fault_err.msg),
                 "the communicator was aborted (comm_abort); finalize it");
        /* The caller asked for it and gets ABORTED on every request. */
        SL_INFO(SL_SUBSYS_NET, "aborted: failing every transfer in flight");
        sl_fault_abort_all(comm);
        sl_gather_fault(comm);
        return;
    }
    if (comm->fault == STAGELINK_ERR_PEER_FAILED && !comm->fault_applied) {
        comm->fault_applied = 1;
        sl_fault_drain(comm);
        if (!comm->closing) {
            sl_fault_report(comm);
        }
        sl_fault_fail_all(comm, STAGELINK_ERR_PEER_FAILED,
                          comm->fault_err.msg);
        sl_gather_fault(comm);
    }
    if (comm->fault == STAGELINK_ERR_TRANSPORT && !comm->fault_applied) {
        /* The TP group's own failure: its ranks see it themselves. */
        comm->fault_applied = 1;
        sl_fault_fail_all(comm, STAGELINK_ERR_TRANSPORT, comm->fault_err.msg);
        sl_gather_fault(comm);
    }
    /* A dead peer's endpoint is closed by force (also a second death). */
    for (i = 0; i < sl_peer_count(comm); ++i) {
        sl_ucx_peer_t *peer = sl_peer_at(comm, i);

        if (peer->failed && peer->ep != NULL) {
            sl_ucx_ep_force_close(peer);
        }
    }
    sl_fault_detach(comm, NULL, STAGELINK_ERR_PEER_FAILED, comm->fault_err.msg);
}


/* After each UCX round: liveness of same-node peers, pending failures and
 * an abort become request errors. */

static void sl_fault_progress(sl_comm_t *comm)
{
    double now = sl_time_now();
    int    aborting;

    if (comm->npfds > 1) {
        if (now >= comm->liveness_next) {
            comm->liveness_next = now + SL_FAULT_LIVENESS_PERIOD;
            if (poll(comm->pfds + 1, (nfds_t)(comm->npfds - 1), 0) > 0) {
                sl_peer_polled(comm);
            }
        }
    }
    aborting = atomic_load_explicit(&comm->aborting, memory_order_relaxed);
    if ((comm->fault_pending || aborting) && !comm->aborted &&
        (aborting || !comm->fault_indirect || comm->fault_applied ||
         now >= comm->fault_apply_at)) {
        sl_fault_apply(comm);
    }
}


