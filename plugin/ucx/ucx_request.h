/*
 * A request: its life (sl_req_state_t), its parts and their owners (its
 * subs: ucx_sub.c; its start behind the host's stream: ucx_device.c; its
 * gather part: the gather backend), the pool it comes from, and the
 * calls of ucx_request.c, which alone writes its core.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_REQUEST_H
#define SL_UCX_REQUEST_H

#include "sl_shard.h"
#include "ucx_sub.h"

typedef struct stagelink_comm    sl_comm_t;
typedef struct stagelink_request sl_req_t;
struct sl_gather_ops;

#define SL_REQ_MAGIC  0x534c5251u /* "SLRQ" */

/**
 * A request's life.  ucx_request.c makes every transition; the layers
 * below report to it through the callbacks in the request.
 *   FREE -> POSTING (sl_req_get) -> DEFERRED (a device buffer: behind the
 *   host's stream event) -> ACTIVE (its subs posted) -> ENDED (nothing in
 *   flight, the own shard passed on) -> FREE (sl_req_put), or RETIRED when
 *   UCX may still call back into a sub (never reused).
 * A failure or a cancel records the first error and lets the request end
 * as usual: what was posted still ends (or is detached) first.
 */
typedef enum sl_req_state {
    SL_REQ_FREE,
    SL_REQ_POSTING,
    SL_REQ_DEFERRED,
    SL_REQ_ACTIVE,
    SL_REQ_ENDED,
    SL_REQ_RETIRED
} sl_req_state_t;

/** A request's subs: ucx_sub.c writes them. */
typedef struct sl_req_subs {
    sl_sub_t *slot;     /**< 2 * tp_size slots */
    int       n;        /**< posted */
    int       pending;  /**< in flight */
    int       detached; /**< UCX may still call back */
} sl_req_subs_t;

/** A device request's start behind the host's stream: ucx_device.c
 *  writes it. */
typedef struct sl_req_stream {
    void                     *event; /**< recorded on xfer.stream at post */
    struct stagelink_request *deferred_next;
} sl_req_stream_t;

/** The gather backend's part of a gathered receive: src/gather writes it. */
typedef struct sl_req_gather {
    int            shard_state;  /**< 0 pending, 1 arrived, -1 failed */
    sl_status_t    shard_status; /**< why the own shard failed */
    unsigned char *flags;        /**< tp_size status bytes */
    int            forwarding;   /**< gather sends relay chunks as they land */
    int            relay_first;  /**< its relaying sends, posted in a row from
                                      subs.slot[relay_first] (a chunk may
                                      land while they are posted) */
    size_t         stage_landed; /**< bytes of the own shard in place */
} sl_req_gather_t;

struct stagelink_request {
    uint32_t                  magic;
    sl_req_state_t            state;
    struct stagelink_comm    *comm;
    struct stagelink_request *next, *prev; /**< active list or free list */
    stagelink_op_kind_t       kind;
    stagelink_xfer_t          xfer;
    int                       backward;
    sl_ucx_peer_t            *peer;
    sl_shard_t                shard;        /**< bytes of buf on the stage path */
    int                       needs_gather;
    int                       shard_passed; /**< own shard handed to the gather */
    int                       nesting;      /**< events in progress (ucx_request.c) */
    int                       cancels;      /**< cancel calls so far */
    sl_status_t               status;       /**< first error */
    int                       peer_failed;  /**< status only echoes a peer's */
    int                       device;       /**< buffer in device memory */
    double                    wait_deadline;/**< of wait_for's slices; 0: none started */
    /** Called once as each sub ends (from ucx_sub.c, maybe inside a UCX
     *  callback). */
    void (*sub_done)(sl_sub_t *sub, sl_status_t status, size_t length,
                     const char *why);
    /** Called once the host's stream is past the post (ucx_device.c):
     *  SUCCESS, or the stream's failure (its sentence in comm->err). */
    void (*stream_ready)(struct stagelink_request *req, sl_status_t status);
    sl_req_stream_t           stream;
    /* the gather backend and its state, chosen at post */
    const struct sl_gather_ops *gather;
    void                     *gather_state;
    sl_req_gather_t           gather_part;
    void                     *order_stream; /**< the host's other stream to order at completion */
    char                      error[SL_ERRBUF_LEN];
    sl_req_subs_t             subs;
};

typedef struct sl_req_pool {
    struct stagelink_request *slots;
    sl_sub_t                 *subs;
    unsigned char            *flags;
    struct stagelink_request *free_list;
    struct stagelink_request *active; /**< doubly linked */
    int                       capacity;
    int                       nfree; /**< on free_list: a retired one is not */
} sl_req_pool_t;

/* ucx_request.c: a request's whole life (sl_req_state_t) */
sl_status_t sl_req_pool_init(sl_req_pool_t *pool, int capacity, int tp_size,
                             sl_errbuf_t *eb);
void        sl_req_pool_cleanup(sl_req_pool_t *pool);
/** TAG_IN_USE when a request in flight has this transfer's tag. */
sl_status_t sl_req_tag_free(sl_comm_t *comm, stagelink_op_kind_t kind,
                            const stagelink_xfer_t *xfer, int backward);
/** NO_MEMORY when fewer than `count` requests are free. */
sl_status_t sl_req_room(sl_comm_t *comm, size_t count);
/** INVALID_STATE while a request posted with memh is not yet waited for,
 *  or was given up with UCX still holding it (retired). */
sl_status_t sl_req_memh_idle(sl_comm_t *comm, const stagelink_memh_t *memh);
sl_status_t sl_req_get(sl_comm_t *comm, stagelink_op_kind_t kind,
                       const stagelink_xfer_t *xfer, int backward,
                       sl_req_t **req_out);
/** Where a request being posted goes, as its post decided (ucx_xfer.c):
 *  its peer, its shard, whether the buffer is device memory, and the
 *  gather backend that rebuilds it (NULL: none). */
void        sl_req_route(sl_req_t *req, sl_ucx_peer_t *peer, sl_shard_t shard,
                         int device, const struct sl_gather_ops *gather,
                         void *gather_state);
/** wait_for: until done, the request's deadline (set at the first call,
 *  kept across slices), or `timeout_ms` (IN_PROGRESS; < 0: none). */
sl_status_t sl_req_wait_for(sl_comm_t *comm, sl_req_t *req, int timeout_ms);
void        sl_req_put(sl_comm_t *comm, sl_req_t *req);
sl_status_t sl_req_check(sl_comm_t *comm, sl_req_t *req);
/** Starts a request its poster filled in (POSTING): a device buffer's
 *  waits for the host's stream first.  Fails with the sentence in
 *  comm->err; what it posted before still ends. */
sl_status_t sl_req_start(sl_req_t *req);
/** Starts only the gather of a receive whose own shard is already in its
 *  buffer (test/perf/gather_only.c measures the gather alone so). */
sl_status_t sl_req_start_gather(sl_req_t *req);
/** ENDED: nothing in flight; the host may complete it. */
int         sl_req_done(const sl_req_t *req);
/** Its gather's collective is due in wait (gather.h's due): test
 *  does not complete it. */
int         sl_req_wait_only(const sl_req_t *req);
/** "forward send", "backward receive", ... for sentences. */
const char *sl_req_what(const sl_req_t *req);
/** Blocks until `req` completes (SUCCESS), `deadline` passes
 *  (STAGELINK_ERR_TIMEOUT, sentence set) or `slice_end` does
 *  (STAGELINK_IN_PROGRESS, no error set); 0 = none. */
sl_status_t sl_req_wait_until(sl_comm_t *comm, sl_req_t *req,
                              double deadline, double slice_end);
/** sl_req_wait_until with the communicator's deadline. */
sl_status_t sl_req_wait(sl_comm_t *comm, sl_req_t *req);
/** Lists the sub-operations of `req` still in flight, for error sentences. */
void        sl_req_describe_pending(const sl_req_t *req, char *out, size_t len);
/** Reports a completed request's outcome into comm->err and releases it;
 *  a device receive's data is ordered on its stream and the one of
 *  sl_req_order_stream. */
sl_status_t sl_req_finish(sl_comm_t *comm, sl_req_t *req);
/** `stream` waits for a device receive's data when it completes. */
void        sl_req_order_stream(sl_req_t *req, void *stream);
/** comm_finalize's end of every request in flight: receives canceled at
 *  once, sends given until `deadline`, then abandoned (their endpoints
 *  closed by force).  SUCCESS when none was in flight or all completed,
 *  else STAGELINK_ERR_ABANDONED with their count and tags in comm->err. */
sl_status_t sl_req_abandon_all(sl_comm_t *comm, double deadline);
/** Cancels what `req` has in flight that `reach` takes back (the ends
 *  come through UCX); a request still behind its stream fails with
 *  STAGELINK_ERR_CANCELED. */
void        sl_req_cancel(sl_comm_t *comm, sl_req_t *req,
                          sl_cancel_reach_t reach);
/** Fails `req` with `status` and the sentence (unless it failed before:
 *  the first error stays), and cancels what it has in flight. */
void        sl_req_abort(sl_comm_t *comm, sl_req_t *req,
                         sl_cancel_reach_t reach, sl_status_t status,
                         const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
