/*
 * A sub-operation: one message of a request to or from one peer, its
 * states and every transition (ucx_sub.c, which alone writes it).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_SUB_H
#define SL_UCX_SUB_H

#include "ucx_worker.h"

typedef struct stagelink_comm    sl_comm_t;
typedef struct stagelink_request sl_req_t;
struct sl_staged;

typedef enum sl_sub_kind {
    SL_SUB_STAGE_SEND,
    SL_SUB_STAGE_RECV,
    SL_SUB_GATHER_SEND,
    SL_SUB_GATHER_RECV,
    SL_SUB_STATUS_SEND,  /**< 1 byte to a TP peer: my shard arrived (or not) */
    SL_SUB_STATUS_RECV
} sl_sub_kind_t;


/** Where a sub-operation stands; ucx_sub.c makes every transition. */
typedef enum sl_sub_state {
    SL_SUB_POSTING,  /**< being handed to UCX: it may end inside the call */
    SL_SUB_PLAIN,    /**< one UCX operation in flight (ucx_req) */
    SL_SUB_CHUNKED,  /**< a chunked transfer or drain in flight (staged) */
    SL_SUB_DONE,     /**< ended and reported upward */
    SL_SUB_DETACHED  /**< a plain sub ended after a failure or an abort
                          with its UCX operation still in flight: a late
                          callback finds it here and returns (a chunked
                          one's transfer is marked detached instead) */
} sl_sub_state_t;

/** One message of a request to or from one peer (ucx_sub.c). */
typedef struct sl_sub {
    struct stagelink_request *req;
    sl_sub_state_t            state;
    void                     *ucx_req;  /**< SL_SUB_PLAIN: its UCX request */
    struct sl_staged         *staged;   /**< SL_SUB_CHUNKED: its transfer */
    sl_ucx_peer_t            *peer;
    sl_sub_kind_t             kind;
    uint64_t                  tag;
    void                     *buf;
    size_t                    expected; /**< bytes it must carry */
    sl_status_t               notice;   /**< receive: the peer's failure
                                             notice; send: the one it sends */
    /** A receive shorter than a control message lands here (so that none
     *  is ever truncated); a notice is sent from here (up to 17 bytes). */
    uint64_t                  ctl[3];
} sl_sub_t;

static inline int sl_sub_is_recv(const sl_sub_t *sub)
{
    return sub->kind == SL_SUB_STAGE_RECV || sub->kind == SL_SUB_GATHER_RECV ||
           sub->kind == SL_SUB_STATUS_RECV;
}

/* ucx_sub.c: one sub-operation, its state and its transitions */
sl_status_t sl_sub_post_send(sl_req_t *req, sl_ucx_peer_t *peer,
                             sl_sub_kind_t kind, uint64_t tag,
                             const void *buf, size_t len);
sl_status_t sl_sub_post_recv(sl_req_t *req, sl_ucx_peer_t *peer,
                             sl_sub_kind_t kind, uint64_t tag, void *buf,
                             size_t len);
/** Posts a host-memory sub whatever the request's memory (status bytes). */
sl_status_t sl_sub_post_host(sl_req_t *req, sl_ucx_peer_t *peer,
                             sl_sub_kind_t kind, uint64_t tag, void *buf,
                             size_t len, int recv);
/** Tells `peer` that this rank gave up its part of `req` (a failure notice
 *  on the tag's control bit): the peer fails with `status`, naming us. */
sl_status_t sl_sub_post_notice(sl_req_t *req, sl_ucx_peer_t *peer,
                               sl_sub_kind_t kind, uint64_t tag,
                               sl_status_t status);
/** What a cancel leaves behind.  While the communicator goes on, the rest
 *  of a message in chunks that has begun to land is drained (its chunks,
 *  left on the wire, would land in the next receive with the tag); once
 *  the peer failed or the communicator ends, nothing more is taken. */
typedef enum sl_cancel_reach {
    SL_CANCEL_DRAIN,
    SL_CANCEL_ALL
} sl_cancel_reach_t;

/** Asks UCX to cancel what is in flight (the end comes through UCX). */
void        sl_sub_cancel(sl_comm_t *comm, sl_sub_t *sub,
                          sl_cancel_reach_t reach);
/** Ends a sub in flight at once after a failure or an abort, leaving what
 *  UCX will not complete to call back into a detached sub. */
void        sl_sub_detach(sl_comm_t *comm, sl_sub_t *sub, sl_status_t status,
                          const char *why);
int         sl_sub_in_flight(const sl_sub_t *sub);
/** "gather send to rank 3 (in chunks, ...)"; 0 when not in flight. */
int         sl_sub_describe(const sl_sub_t *sub, char *out, size_t len);
const char *sl_sub_name(sl_sub_kind_t kind);

#endif
