/*
 * A transfer as the host posts it: the checks before anything is posted,
 * which bytes of the tensor go to the neighbour stage (shard or full
 * tensor), which gather rebuilds a receive, and the undoing of a post that
 * failed part-way.  The request (ucx_request.c) runs it from there.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "gather.h"

#include "sl_log.h"
#include "sl_xfer_check.h"

#include <stdio.h>
#include <string.h>

/* Checks one transfer before anything is posted (may_ask: see
 * sl_mem_resolve). */
static sl_status_t sl_xfer_validate(sl_comm_t *comm, stagelink_op_kind_t kind,
                                    const stagelink_xfer_t *xfer, int may_ask,
                                    int *backward,
                                    stagelink_mem_type_t *mem_type)
{
    SL_CHECK(sl_xfer_check(&comm->layout, kind, xfer, backward, &comm->err));
    return sl_mem_resolve(comm, xfer, may_ask, mem_type);
}

/* Undoes a request whose posting failed part-way with comm->err's
 * sentence, which stays: the request fails with it, so that nothing waits
 * for a part never posted, and ends as a completed one does. */
static void sl_xfer_abort(sl_comm_t *comm, sl_req_t *req)
{
    sl_req_abort(comm, req, SL_CANCEL_DRAIN, STAGELINK_ERR_CANCELED, "%s",
                 comm->err.msg);
    if (sl_req_wait(comm, req) == STAGELINK_SUCCESS) {
        sl_req_finish(comm, req);
    }
}

static sl_status_t sl_xfer_post_one(sl_comm_t *comm, stagelink_op_kind_t kind,
                                    const stagelink_xfer_t *xfer, int may_ask,
                                    sl_req_t **req_out)
{
    stagelink_mem_type_t mem_type;
    sl_req_t            *req;
    sl_status_t          status;
    sl_errbuf_t          saved;
    sl_shard_t           shard;
    int                  backward, device, gathered;

    SL_CHECK(sl_xfer_validate(comm, kind, xfer, may_ask, &backward, &mem_type));
    SL_CHECK(sl_req_get(comm, kind, xfer, backward, &req));

    device = (mem_type == STAGELINK_MEM_CUDA);
    shard  = (comm->mode == STAGELINK_MODE_FULL)
                 ? (sl_shard_t){0, xfer->nbytes}
                 : sl_shard_get(xfer->nbytes, xfer->elem_size,
                                comm->layout.tp_size, comm->layout.tp_index);
    gathered = (kind == STAGELINK_OP_RECV &&
                comm->mode == STAGELINK_MODE_SCATTER_GATHER &&
                comm->layout.tp_size > 1);
    sl_req_route(req, (xfer->peer == STAGELINK_PEER_NEXT) ? &comm->next
                                                          : &comm->prev,
                 shard, device,
                 !gathered ? NULL : device ? comm->gather_dev : comm->gather,
                 !gathered ? NULL : device ? comm->gather_dev_state
                                           : comm->gather_state);
    SL_TRACE(SL_SUBSYS_NET, "%s %s mb %u chunk %u: %zu of %zu %s bytes at %zu "
             "with rank %d", (kind == STAGELINK_OP_SEND) ? "send" : "recv",
             backward ? "bwd" : "fwd", xfer->tag.microbatch, xfer->tag.chunk,
             req->shard.length, xfer->nbytes, req->device ? "device" : "host",
             req->shard.offset, req->peer->rank);
    SL_CHECK_GOTO(sl_req_start(req), err_abort);
    *req_out = req;
    return STAGELINK_SUCCESS;

err_abort:
    saved = comm->err;
    sl_xfer_abort(comm, req);
    comm->err = saved;
    return status;
}

sl_status_t sl_xfer_post(sl_comm_t *comm, stagelink_op_kind_t kind,
                         const stagelink_xfer_t *xfer, sl_req_t **req_out)
{
    return sl_xfer_post_one(comm, kind, xfer, 1, req_out);
}

sl_status_t sl_xfer_post_batch(sl_comm_t *comm, const stagelink_op_t *ops,
                               size_t count, sl_req_t **reqs)
{
    int                  bwd_i;
    stagelink_mem_type_t mem_type;
    sl_errbuf_t          saved;
    sl_status_t status = STAGELINK_SUCCESS;
    size_t      i, posted = 0;
    int         pass;

    /* Everything is checked before anything is posted, tags in flight and
     * the pool's room too, so a bad element never leaves half a batch on
     * the wire. */
    for (i = 0; i < count; ++i) {
        SL_CHECK(sl_xfer_validate(comm, ops[i].kind, &ops[i].xfer, 1, &bwd_i,
                                  &mem_type));
        SL_CHECK(sl_req_tag_free(comm, ops[i].kind, &ops[i].xfer, bwd_i));
    }
    SL_CHECK(sl_xfer_check_batch(ops, count, &comm->err));
    SL_CHECK(sl_req_room(comm, count));
    for (i = 0; i < count; ++i) {
        reqs[i] = NULL;
    }
    /* Receives first: the peers' sends then always find them posted. */
    for (pass = 0; pass < 2; ++pass) {
        stagelink_op_kind_t kind = pass ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;

        for (i = 0; i < count; ++i) {
            if (ops[i].kind != kind) {
                continue;
            }
            SL_CHECK_GOTO(sl_xfer_post_one(comm, kind, &ops[i].xfer, 0, &reqs[i]),
                          err_abort);
            ++posted;
        }
    }
    return STAGELINK_SUCCESS;

err_abort:
    saved = comm->err;
    for (pass = 0; pass < 2 && posted > 0; ++pass) {
        stagelink_op_kind_t kind = pass ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;

        for (i = 0; i < count && posted > 0; ++i) {
            if (ops[i].kind == kind && reqs[i] != NULL) {
                sl_xfer_abort(comm, reqs[i]);
                reqs[i] = NULL;
                --posted;
            }
        }
    }
    comm->err = saved;
    return status;
}
