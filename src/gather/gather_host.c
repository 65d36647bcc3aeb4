/*
 * Host gather: the host rebuilds the tensor with its own collective, the
 * config's gather callback (torch's all_gather_into_tensor on Megatron's TP
 * group, say), so no second communicator stands beside the host's and the
 * collective keeps the host's program order.  It is called on the host's
 * thread where the host completes the receive; until then only the shards'
 * statuses go round the TP group (gather_status.c).
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"

#include <stdlib.h>

typedef struct sl_gather_host {
    sl_comm_t *comm;
    size_t    *offsets, *lengths; /**< tp_size each, for the callback */
} sl_gather_host_t;

static void sl_gather_host_cleanup(void *state)
{
    sl_gather_host_t *g = state;

    if (g != NULL) {
        free(g->offsets);
        free(g->lengths);
        free(g);
    }
}

static sl_status_t sl_gather_host_init(sl_comm_t *comm, void **state)
{
    sl_gather_host_t *g = calloc(1, sizeof(*g));
    size_t            t = (size_t)comm->layout.tp_size;

    if (g != NULL) {
        g->comm    = comm;
        g->offsets = calloc(t, sizeof(size_t));
        g->lengths = calloc(t, sizeof(size_t));
    }
    if (g == NULL || g->offsets == NULL || g->lengths == NULL) {
        sl_gather_host_cleanup(g);
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate the host gather of %zu ranks", t);
    }
    *state = g;
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_gather_host_post(void *state, sl_req_t *req)
{
    return sl_gather_status_post(((sl_gather_host_t *)state)->comm, req);
}

static sl_status_t sl_gather_host_shard_ready(void *state, sl_req_t *req,
                                              sl_status_t own)
{
    return sl_gather_status_send(((sl_gather_host_t *)state)->comm, req, own);
}

/*
 * Where the host completes the receive: the host's collective, once the
 * whole TP group has its shard.  It runs with the communicator let go, so
 * the progress thread keeps this rank's part of other transfers moving
 * while the host waits in it for its TP peers.  A receive whose shard
 * failed anywhere in the group ends without it on every rank; one that
 * failed here after every shard arrived (canceled, say) still enters it,
 * as its peers do, and keeps its failure.  One that finalize ends was
 * never the host's to gather.
 */
static sl_status_t sl_gather_host_complete(void *state, sl_req_t *req)
{
    sl_gather_host_t       *g    = state;
    sl_comm_t              *comm = g->comm;
    stagelink_gather_args_t args;
    sl_shard_t              s;
    int                     k, rc;

    if (comm->closing || req->xfer.nbytes == 0 ||
        !sl_gather_status_all_arrived(comm, req)) {
        return STAGELINK_SUCCESS;
    }
    for (k = 0; k < comm->layout.tp_size; ++k) {
        s             = sl_shard_get(req->xfer.nbytes, req->xfer.elem_size,
                                     comm->layout.tp_size, k);
        g->offsets[k] = s.offset;
        g->lengths[k] = s.length;
    }
    args = (stagelink_gather_args_t){
        .struct_size = sizeof(args),
        .buf       = req->xfer.buf,
        .nbytes    = req->xfer.nbytes,
        .elem_size = req->xfer.elem_size ? req->xfer.elem_size : 1,
        .mem_type  = (req->xfer.mem_type != STAGELINK_MEM_AUTO)
                         ? req->xfer.mem_type
                         : req->device ? STAGELINK_MEM_CUDA : STAGELINK_MEM_HOST,
        .stream    = req->device ? req->xfer.stream : NULL,
        .tag       = req->xfer.tag,
        .tp_size   = comm->layout.tp_size,
        .tp_index  = comm->layout.tp_index,
        .offsets   = g->offsets,
        .lengths   = g->lengths,
    };
    /* The request is ENDED: nothing of it is in flight for the thread. */
    sl_progress_leave(comm);
    rc = comm->host_gather(comm->host_gather_ctx, &args);
    sl_progress_enter(comm);
    if (rc != 0) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "the host's gather callback returned %d for the "
                        "receive of microbatch %u chunk %u (%zu bytes, TP "
                        "index %d of %d)", rc, req->xfer.tag.microbatch,
                        req->xfer.tag.chunk, req->xfer.nbytes,
                        comm->layout.tp_index, comm->layout.tp_size);
    }
    if (req->status == STAGELINK_SUCCESS) {
        sl_gather_count(comm, req);
    }
    return STAGELINK_SUCCESS;
}

const sl_gather_ops_t sl_gather_host_ops = {
    .name        = "host",
    .init        = sl_gather_host_init,
    .cleanup     = sl_gather_host_cleanup,
    .post        = sl_gather_host_post,
    .shard_ready = sl_gather_host_shard_ready,
    .complete    = sl_gather_host_complete,
};
