/*
 * The statuses of a gathered receive's shards, round the TP group: for
 * backends whose collective moves the bytes (NCCL, the host's), each rank
 * tells the others that its shard arrived, or sends a notice of why not,
 * so that a failure anywhere fails the whole group's receive with the root
 * cause and nobody waits in the collective alone.  And the gather's tags,
 * which every backend's messages carry.
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"


uint64_t sl_gather_tag(const sl_req_t *req, int source)
{
    sl_tag_fields_t f = {
        .cls        = SL_TAG_CLASS_GATHER,
        .backward   = req->backward,
        .chunk      = req->xfer.tag.chunk,
        .source     = (uint32_t)source,
        .microbatch = req->xfer.tag.microbatch,
    };

    return sl_tag_encode(&f);
}


sl_status_t sl_gather_status_post(sl_comm_t *comm, sl_req_t *req)
{
    int k;

    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k != comm->layout.tp_index) {
            SL_CHECK(sl_sub_post_host(req, &comm->tp_peers[k],
                                      SL_SUB_STATUS_RECV, sl_gather_tag(req, k),
                                      &req->gather_part.flags[k], 1, 1));
        }
    }
    return STAGELINK_SUCCESS;
}

/* May run inside a UCX callback, on any thread. */
sl_status_t sl_gather_status_send(sl_comm_t *comm, sl_req_t *req,
                                  sl_status_t own)
{
    static const unsigned char arrived = SL_STATUS_ARRIVED;
    sl_status_t status = STAGELINK_SUCCESS, s;
    uint64_t    tag    = sl_gather_tag(req, comm->layout.tp_index);
    int         k, good = (own == STAGELINK_SUCCESS);

    req->gather_part.shard_state  = good ? 1 : -1;
    req->gather_part.shard_status = own;
    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k == comm->layout.tp_index) {
            continue;
        }
        s = good ? sl_sub_post_host(req, &comm->tp_peers[k], SL_SUB_STATUS_SEND,
                                    tag, (void *)&arrived, 1, 0)
                 : sl_sub_post_notice(req, &comm->tp_peers[k],
                                      SL_SUB_STATUS_SEND, tag, own);
        if (s != STAGELINK_SUCCESS) {
            status = s;
        }
    }
    return status;
}

int sl_gather_status_all_arrived(const sl_comm_t *comm, const sl_req_t *req)
{
    int k;

    if (req->gather_part.shard_state != 1) {
        return 0;
    }
    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k != comm->layout.tp_index && req->gather_part.flags[k] != SL_STATUS_ARRIVED) {
            return 0;
        }
    }
    return 1;
}

void sl_gather_count(sl_comm_t *comm, const sl_req_t *req)
{
    comm->counters.gather_bytes_sent += req->shard.length *
                                        (size_t)(comm->layout.tp_size - 1);
    comm->counters.gather_bytes_recv += req->xfer.nbytes - req->shard.length;
}
