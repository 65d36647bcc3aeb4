/*
 * Peer health: what this rank knows of its peers' deaths and of an abort,
 * recorded from wherever it is seen (a UCX callback, a pidfd, a report)
 * and read by every layer before it posts.  ucx_fault.c applies it to the
 * requests; nothing here touches one.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"
#include "sl_time.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How long a fault known only from a UCX error waits for a direct
 * sighting of the death before it is applied (seconds). */
#define SL_FAULT_GRACE 0.02

/* The fault is a peer failure known only from a UCX error, not applied yet:
 * a direct sighting may still name another rank. */
int sl_peer_unsure(const sl_comm_t *comm)
{
    return comm->fault == STAGELINK_ERR_PEER_FAILED && comm->fault_indirect &&
           !comm->fault_applied;
}

int sl_peer_count(const sl_comm_t *comm)
{
    return 2 + ((comm->tp_peers != NULL) ? comm->layout.tp_size : 0);
}

sl_ucx_peer_t *sl_peer_at(sl_comm_t *comm, int i)
{
    return (i == 0) ? &comm->prev
         : (i == 1) ? &comm->next
                    : &comm->tp_peers[i - 2];
}

void sl_peer_place(sl_comm_t *comm)
{
    int k;

    for (k = 0; k < comm->layout.tp_size; ++k) {
        comm->tp_peers[k].rank = comm->layout.tp_ranks[k];
    }
    comm->prev.rank = comm->layout.prev_rank;
    comm->next.rank = comm->layout.next_rank;
}

void sl_peer_learn(sl_comm_t *comm, int rank, const char *node_id,
                   const sl_peer_process_t *proc)
{
    int k;

    for (k = 0; k < sl_peer_count(comm); ++k) {
        sl_ucx_peer_t *slot = sl_peer_at(comm, k);

        if (slot->rank == rank) {
            memcpy(slot->node_id, node_id, SL_NODE_ID_LEN);
            slot->proc = *proc;
        }
    }
}

void sl_peer_init(sl_comm_t *comm)
{
    comm->prev.rank      = -1;
    comm->next.rank      = -1;
    comm->failed_rank    = -1;
    comm->fault          = STAGELINK_SUCCESS;
    comm->fault_indirect = 0;
    comm->reported_at    = 0.0;
    atomic_init(&comm->aborting, 0);
}

void sl_peer_describe(const sl_ucx_peer_t *peer, char *buf, size_t len)
{
    snprintf(buf, len, "rank %d (%s) failed: %s; transfers with it cannot "
             "complete: finalize the communicator and restart the job (from "
             "a checkpoint)", peer->rank,
             peer->inter_node ? "on another node" : "on this node",
             peer->why);
}

void sl_peer_down(sl_ucx_peer_t *peer, int direct, const char *fmt,
                        ...)
{
    sl_comm_t *comm = peer->comm;
    va_list    ap;

    /* Seen again directly (its pidfd after a UCX error, say): that
     * settles the fault at once. */
    if (peer->failed && !(direct && sl_peer_unsure(comm))) {
        return;
    }
    peer->failed = 1;
    va_start(ap, fmt);
    vsnprintf(peer->why, sizeof(peer->why), fmt, ap);
    va_end(ap);
    comm->fault_pending = 1;
    if (comm->fault == STAGELINK_SUCCESS) {
        comm->fault_apply_at = sl_time_now() + SL_FAULT_GRACE;
    } else if (!(direct && sl_peer_unsure(comm))) {
        goto log;
    }
    comm->fault          = STAGELINK_ERR_PEER_FAILED;
    comm->failed_rank    = peer->rank;
    comm->fault_indirect = !direct;
    sl_peer_describe(peer, comm->fault_err.msg, sizeof(comm->fault_err.msg));
log:
    /* In finalize the peers close and exit too; that is no failure. */
    sl_log(comm->closing ? SL_LOG_INFO : SL_LOG_WARN, SL_SUBSYS_NET,
           "rank %d is gone: %s", peer->rank, peer->why);
}

void sl_peer_group_failed(sl_comm_t *comm, const char *fmt, ...)
{
    va_list ap;

    if (comm->fault != STAGELINK_SUCCESS) {
        return; /* the first fault says why */
    }
    comm->fault          = STAGELINK_ERR_TRANSPORT;
    comm->fault_pending  = 1;
    comm->fault_indirect = 0;
    va_start(ap, fmt);
    vsnprintf(comm->fault_err.msg, sizeof(comm->fault_err.msg), fmt, ap);
    va_end(ap);
    SL_WARN(SL_SUBSYS_GATHER, "the TP group failed: %s; finalize the "
            "communicator and restart the job", comm->fault_err.msg);
}

void sl_peer_polled(sl_comm_t *comm)
{
    int i;

    for (i = 1; i < comm->npfds; ++i) {
        if (comm->pfds[i].fd >= 0 && comm->pfds[i].revents != 0) {
            /* Seen once: a negative fd takes it out of later polls, which
             * would otherwise return at once for as long as we wait. */
            comm->pfds[i].fd = -comm->pfds[i].fd - 1;
            sl_peer_down(comm->pfd_peer[i], 1, "its process exited "
                               "(seen through its pidfd)");
        }
    }
}

double sl_peer_wake_at(const sl_comm_t *comm)
{
    return (comm->fault_pending && comm->fault_indirect && !comm->aborted)
               ? comm->fault_apply_at : 0.0;
}

sl_status_t sl_peer_check(sl_comm_t *comm, sl_ucx_peer_t *peer)
{
    if (comm->aborted ||
        atomic_load_explicit(&comm->aborting, memory_order_relaxed)) {
        return sl_error(&comm->err, STAGELINK_ERR_ABORTED, "the "
                        "communicator was aborted (comm_abort): nothing can "
                        "be posted on it; finalize it");
    }
    if (peer != NULL && peer->failed) {
        return sl_error(&comm->err, STAGELINK_ERR_PEER_FAILED,
                        "rank %d cannot be reached: %s", peer->rank,
                        peer->why);
    }
    if (peer != NULL && peer->ep == NULL) {
        /* Closed by force (finalize abandoned sends to it). */
        return sl_error(&comm->err, STAGELINK_ERR_ABANDONED,
                        "rank %d's endpoint was closed by comm_finalize: "
                        "nothing more goes to it", peer->rank);
    }
    if (comm->fault == STAGELINK_ERR_PEER_FAILED ||
        comm->fault == STAGELINK_ERR_TRANSPORT) {
        return sl_error(&comm->err, comm->fault,
                        "nothing can be posted after a failure: %s",
                        comm->fault_err.msg);
    }
    return STAGELINK_SUCCESS;
}

void sl_peer_abort(sl_comm_t *comm)
{
    atomic_store_explicit(&comm->aborting, 1, memory_order_release);
    /* Wakes the owning thread if it sleeps in poll() on the event fd. */
    ucp_worker_signal(comm->worker);
}

static uint64_t sl_peer_ns(const char *path)
{
    struct stat ns;

    return (stat(path, &ns) == 0) ? (uint64_t)ns.st_ino : 0;
}

void sl_peer_process_self(sl_peer_process_t *me)
{
    me->pid    = (int64_t)getpid();
    me->pid_ns = sl_peer_ns("/proc/self/ns/pid");
    me->ipc_ns = sl_peer_ns("/proc/self/ns/ipc");
}

int sl_peer_shares_memory(const sl_ucx_peer_t *peer)
{
    sl_peer_process_t me;

    sl_peer_process_self(&me);
    return !peer->inter_node && peer->proc.pid_ns == me.pid_ns &&
           peer->proc.ipc_ns == me.ipc_ns;
}
