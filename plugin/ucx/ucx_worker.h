/*
 * The UCX worker and its endpoints (ucx_worker.c): one sl_ucx_peer_t a
 * peer rank, written by ucx_worker.c and ucx_peer.c (docs/design.md's
 * owners), and the calls that make, progress and close them.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_WORKER_H
#define SL_UCX_WORKER_H

#include "sl_error.h"
#include "sl_node.h"

#include <stagelink/stagelink.h>
#include <ucp/api/ucp.h>

#include <stdint.h>

typedef struct stagelink_comm    sl_comm_t;
typedef struct stagelink_request sl_req_t;
struct sl_bootstrap;

/** What every rank tells its peers of its process, to watch same-node ones. */
typedef struct sl_peer_process {
    int64_t  pid;
    uint64_t pid_ns; /**< inode of /proc/self/ns/pid: pids compare only within one */
    uint64_t ipc_ns; /**< inode of /proc/self/ns/ipc: shared memory reaches within one */
} sl_peer_process_t;

typedef struct sl_ucx_peer {
    struct stagelink_comm *comm;
    int      rank;       /**< world rank, -1 when none */
    int      inter_node; /**< on another node: its bytes cross the link */
    char     node_id[SL_NODE_ID_LEN]; /**< as it told at init */
    sl_peer_process_t proc;           /**< as it told at init */
    ucp_ep_h ep;         /**< NULL once closed (after a failure: by force) */
    ucp_worker_h worker; /**< where its messages arrive: receives go there */
    int      local;      /**< its endpoint is on the same-node worker */
    int      failed;     /**< its process or link died (ucx_fault.c) */
    char     why[160];   /**< how its failure was seen */
    void    *close_req;  /**< forced close still in flight */
} sl_ucx_peer_t;

/* ucx_worker.c: context, worker, endpoints, progress */
sl_status_t sl_ucx_worker_create(sl_comm_t *comm);
sl_status_t sl_ucx_connect(sl_comm_t *comm, struct sl_bootstrap *bs);
void        sl_ucx_worker_destroy(sl_comm_t *comm);
/** Closes `peer`'s endpoint by force: UCX cannot cancel a send, and this
 *  ends every operation on it without waiting for the peer (the close's
 *  own request is finished when the worker is destroyed). */
void        sl_ucx_ep_force_close(sl_ucx_peer_t *peer);
/** One round: UCX, then each registered subsystem (again while their own
 *  posts ran callbacks); the events UCX had.  Callers that wait check
 *  their condition between rounds. */
unsigned    sl_ucx_progress(sl_comm_t *comm);
/** One ucp_worker_progress of each worker: the events they had. */
unsigned    sl_ucx_worker_progress(sl_comm_t *comm);
/** ucp_worker_arm of each worker: UCS_OK once both sleep on `efd`. */
ucs_status_t sl_ucx_worker_arm(sl_comm_t *comm);
/** Rounds until UCX is quiet and no callback ran, or `deadline` (0: none):
 *  for callers that wait on something else and nap between looks. */
void        sl_ucx_progress_drain(sl_comm_t *comm, double deadline);
/** sl_ucx_progress_drain for callers that hold a void pointer (the
 *  bootstrap, between its socket polls). */
void        sl_ucx_progress_cb(void *comm);
/** Completes every operation the worker has outstanding, until `deadline`. */
void        sl_ucx_flush(sl_comm_t *comm, double deadline);
/**
 * After the finalize barrier nothing real is in flight: messages still
 * unexpected belong to canceled or failed transfers.  Drops them.
 */
void        sl_ucx_discard_unexpected(sl_comm_t *comm, double deadline);

/**
 * Parameters of one tagged operation: the caller's callback (set after),
 * user_data, the buffer's memory type and, when the host registered the
 * buffer, its UCX memory handle (UCX then skips its own registration).
 */
void        sl_ucx_param_init(ucp_request_param_t *param, void *user_data,
                              ucs_memory_type_t mem_type,
                              const stagelink_memh_t *memh,
                              const sl_ucx_peer_t *peer);

/* ucx_lanes.c: the transports UCX offers and those an endpoint took */
typedef void (*sl_ucx_tl_cb_t)(void *arg, const char *tl, size_t tl_len,
                               const char *dev);
/** Whether transport `tl` (`len` bytes) stays inside the node. */
int         sl_ucx_tl_local(const char *tl, size_t len);
/** Calls `cb` for each transport resource of `ctx`; returns how many. */
int         sl_ucx_context_tls(ucp_context_h ctx, sl_ucx_tl_cb_t cb, void *arg);
/** Logs the lanes of `peer`'s endpoint; warns (once a communicator) of a
 *  same-node one over a network transport. */
void        sl_ucx_ep_lanes(sl_ucx_peer_t *peer);

#endif
