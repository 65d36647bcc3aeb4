/*
 * A message cut in chunks (large, or in device memory through bounce
 * buffers), or the drain of a mismatched sender: its state machine and
 * its calls (ucx_chunked.c, which alone writes it).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_CHUNKED_H
#define SL_UCX_CHUNKED_H

#include "staging.h"
#include "ucx_leftover.h"
#include "ucx_sub.h"
#include "ucx_wire.h"

typedef struct stagelink_comm    sl_comm_t;
typedef struct stagelink_request sl_req_t;

struct sl_staged;
struct sl_sub;

/** How a chunked transfer reports its end to the owner of its sub
 *  (ucx_sub.c): once, maybe inside a UCX callback.  `notice`: the sender's
 *  failure notice (status then SUCCESS). */
typedef void (*sl_chunked_end_t)(struct sl_sub *sub, sl_status_t status,
                                 sl_status_t notice, size_t length,
                                 const char *why);

/**
 * A chunked transfer's state; ucx_chunked.c makes every transition
 * (sl_chunked_to):
 *   AWAITING -> MOVING    the sender's length header matches
 *   AWAITING -> DRAINING  it does not, or the header failed
 *   MOVING   -> DRAINING  a plain receive met a framed sender, or a failure
 *   any      -> DETACHED  given up with operations in flight
 */
typedef enum sl_chunked_state {
    SL_CHUNKED_MOVING,   /**< chunks move (sender, or a receiver that knows) */
    SL_CHUNKED_AWAITING, /**< receiver: chunks wait for the length header */
    SL_CHUNKED_DRAINING, /**< sizes differ: the sender's chunks are discarded */
    SL_CHUNKED_DETACHED  /**< kept, inert, until the worker is destroyed */
} sl_chunked_state_t;

/** A transfer in chunks (staged, or in place), or the drain of a mismatch. */
typedef struct sl_staged {
    sl_staging_xfer_t  x;
    sl_staging_slot_t *slots;
    sl_sub_t          *sub;
    sl_chunked_end_t   end;        /**< reports the end to the sub's owner */
    struct sl_staged  *next;       /**< active list or free list */
    sl_chunked_state_t state;
    int                framed;     /**< a length header precedes the chunks */
    sl_ctl_msg_t       hdr;        /**< on the wire: SL_HEADER_MAGIC, length */
    void              *hdr_req;
    int                ctl_busy;   /**< the header or a drain receive is in flight
                                        (cleared by its callback, which UCX may
                                        run inside the posting call) */
    uint64_t           drain_left; /**< chunks of the sender still to discard */
    uint64_t           drain_index; /**< the chunk drain_req receives */
    void              *drain_req;
    sl_status_t        notice;     /**< receiver: the sender's failure notice */
    sl_leftover_t     *leftover;   /**< receiver canceled mid-message: the
                                        drain of the chunks it leaves */
    uint64_t           notice_msg[3]; /**< sender: the notice it sends in
                                           place of each chunk not sent
                                           (room for 17 bytes) */
} sl_staged_t;

/* ucx_chunked.c: messages cut in chunks */
/** Chunked transfer of one sub (large, or in device memory), made but not
 *  posted; sl_chunked_sub_kick posts it.  Its end is reported through
 *  `end`. */
sl_status_t sl_chunked_sub_prepare(sl_sub_t *sub, void *buf, size_t len,
                                   int recv, sl_chunked_end_t end,
                                   sl_staged_t **out);
void        sl_chunked_sub_kick(sl_staged_t *st);
/** A relaying send's source grew (gather.h's landed): it sends what is in
 *  place now. */
void        sl_chunked_relay(sl_sub_t *sub);
void        sl_chunked_cancel(sl_comm_t *comm, sl_staged_t *st,
                              sl_cancel_reach_t reach);
/** Gives up a chunked transfer whose peer died with operations in flight
 *  that UCX will not complete; the caller finishes the sub. */
void        sl_chunked_detach(sl_comm_t *comm, sl_staged_t *st);
/** A plain receive met a framed sender of `len` bytes: drain its chunks,
 *  then fail the sub with a size mismatch. */
sl_status_t sl_chunked_drain(sl_sub_t *sub, uint64_t len, sl_chunked_end_t end,
                             sl_staged_t **out);
/** A relay's own shard failed with `status`: the chunks not yet sent go
 *  as notices of it. */
void        sl_chunked_give_up(sl_sub_t *sub, sl_status_t status);
/** Registers the chunk engine's progress with the worker. */
void        sl_chunked_init(sl_comm_t *comm);
/** STAGELINK_CHUNK=auto: the chunk range every rank derives alike, once
 *  the endpoints exist (all_direct known). */
void        sl_chunked_size_agree(sl_comm_t *comm);
/** The chunk of a message of `len` bytes: both ends derive it from the
 *  length alone, so a receiver also knows a mismatched sender's. */
size_t      sl_chunked_size(const sl_comm_t *comm, size_t len);
/** Whether a message of `len` bytes goes framed (more than one chunk). */
int         sl_chunked_framed(const sl_comm_t *comm, size_t len);
/** Whether every message is a shard that its receiver relays, or such a
 *  relay (scatter_gather, t > 1); both ends know it. */
int         sl_chunked_relayed(const sl_comm_t *comm);
void        sl_chunked_cleanup(sl_comm_t *comm);

#endif
