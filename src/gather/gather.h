/*
 * Gather backends: how the receiving TP group rebuilds the full tensor from
 * its shards.  One ops table per backend: UCX, NCCL for GPU buffers, and
 * the host's own collective (the config's gather callback).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_GATHER_H
#define SL_GATHER_H

#include "ucx_comm.h"

/**
 * STAGELINK_GATHER as sl_gather_select parses it into comm->gather_choice:
 * the index into its list of names, so the order is that list's.
 */
typedef enum sl_gather_choice {
    SL_GATHER_AUTO = 0, /**< the host's callback where given, else UCX */
    SL_GATHER_UCX  = 1,
    SL_GATHER_NCCL = 2,
    SL_GATHER_HOST = 3  /**< the config's gather callback (auto picks it when given) */
} sl_gather_choice_t;

typedef struct sl_gather_ops {
    const char *name;
    sl_status_t (*init)(sl_comm_t *comm, void **state);
    void        (*cleanup)(void *state);
    /**
     * Whether the ended receive has its collective due where the host
     * waits for it (NULL: never, the backend issues none there): `test`
     * then leaves it not done, since whether `test` finds a shard landed
     * depends on the network, and the collective's place among the host's
     * own must not (docs/design.md, "Gather").
     */
    int         (*due)(void *state, const sl_req_t *req);
    /**
     * The receive starts (after its stream event): prepare to take the
     * peers' shards (they may arrive before our own).  Adds subs to `req`.
     */
    sl_status_t (*post)(void *state, sl_req_t *req);
    /**
     * Our own shard is in place (SUCCESS) or its receive failed with
     * `status`: pass it on to the peers, or send them a notice of
     * `status`, so that they fail at once with the root cause instead of
     * at their deadline.  Called once; the request then counts its shard
     * as passed on, whatever this returns.
     */
    sl_status_t (*shard_ready)(void *state, sl_req_t *req, sl_status_t status);
    /**
     * `bytes` of the own shard are in place, counted from its start (a
     * shard in chunks lands chunk by chunk; maybe inside a UCX callback):
     * a backend that relays chunks sends what is there (NULL: none).
     */
    void        (*landed)(void *state, sl_req_t *req, size_t bytes);
    /**
     * The host completes the request (wait, or test where nothing is due),
     * or finalize ends it, on the host's thread: a collective backend
     * issues its collective here and orders the host's stream after it
     * (NULL: nothing to do).  A failure becomes the request's (its
     * sentence in comm->err).
     */
    sl_status_t (*complete)(void *state, sl_req_t *req);
    /**
     * The communicator failed (a peer's death, comm_abort, the backend's
     * own asynchronous error), once, with comm->fault_err saying why:
     * release whatever waits for a peer (NULL: nothing does).
     */
    void        (*fault)(void *state);
} sl_gather_ops_t;

extern const sl_gather_ops_t sl_gather_ucx_ops;
extern const sl_gather_ops_t sl_gather_host_ops;
#ifdef STAGELINK_HAVE_NCCL
extern const sl_gather_ops_t sl_gather_nccl_ops;
#endif

/* gather_status.c: for backends whose collective moves the bytes */
/** At the post: the TP peers' statuses of their shards are awaited. */
sl_status_t sl_gather_status_post(sl_comm_t *comm, sl_req_t *req);
/** The own shard arrived (SUCCESS) or failed: the TP peers hear it. */
sl_status_t sl_gather_status_send(sl_comm_t *comm, sl_req_t *req,
                                  sl_status_t own);
/**
 * Whether every rank of the TP group told every other that its shard
 * arrived (the request has ended): each then enters the collective, and
 * where one did not, none does, so no rank is left in it alone.
 */
int         sl_gather_status_all_arrived(const sl_comm_t *comm,
                                         const sl_req_t *req);
/** The gather's bytes in the counters, once the collective has them. */
void        sl_gather_count(sl_comm_t *comm, const sl_req_t *req);

/** The tag of TP rank `source`'s gather message for `req`. */
uint64_t sl_gather_tag(const sl_req_t *req, int source);

/** Checks STAGELINK_GATHER (before any exchange, so bad values fail alike). */
sl_status_t sl_gather_select(sl_comm_t *comm);

/**
 * Sets up the backends once UCX is connected: the host's callback for all
 * buffers (STAGELINK_GATHER=host, or auto with a callback); else UCX for
 * host buffers and for device buffers NCCL (STAGELINK_GATHER=nccl, which
 * only a host that completes its device receives by wait may ask for) or
 * UCX.  NCCL's setup is an exchange with the TP group.
 */
sl_status_t sl_gather_init(sl_comm_t *comm);
void        sl_gather_cleanup(sl_comm_t *comm);
/** The communicator failed: each backend releases what waits for peers. */
void        sl_gather_fault(sl_comm_t *comm);

#endif
