/*
 * Gather backends: how the receiving TP group rebuilds the full tensor from
 * its shards.  One ops table per backend (UCX now, NCCL for GPU buffers).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_GATHER_H
#define SL_GATHER_H

#include "ucx_comm.h"

typedef struct sl_gather_ops {
    const char *name;
    sl_status_t (*init)(sl_comm_t *comm, void **state);
    void        (*cleanup)(void *state);
    /**
     * A receive was posted: prepare to take the peers' shards (they may
     * arrive before our own).  Adds subs to `req`.
     */
    sl_status_t (*post)(void *state, sl_req_t *req);
    /**
     * Our own shard is in place (ok) or its receive failed (!ok): pass it
     * to the peers; a failed one is passed as an empty message so that the
     * peers fail at once instead of waiting for their deadline.
     */
    sl_status_t (*shard_ready)(void *state, sl_req_t *req, int ok);
} sl_gather_ops_t;

extern const sl_gather_ops_t sl_gather_ucx_ops;

/** Picks the backend from STAGELINK_GATHER and the build. */
sl_status_t sl_gather_select(sl_comm_t *comm, const sl_gather_ops_t **ops);

#endif
