/*
 * Internals of the UCX plugin: the communicator, its requests and the UCX
 * sub-operations a request is made of.  Shared by the files of plugin/ucx
 * and the gather backends.  SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_COMM_H
#define SL_UCX_COMM_H

#include "gpu.h"
#include "sl_error.h"
#include "sl_layout.h"
#include "sl_node.h"
#include "sl_shard.h"
#include "sl_topo.h"
#include "staging.h"

#include <stagelink/stagelink.h>
#include <ucp/api/ucp.h>
#include <uct/api/uct_def.h>

#include "ucx_wire.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

struct sl_gather_ops;
struct sl_topo;

/** How an InfiniBand memory domain registers device memory (ucx_gdr.c). */
typedef enum sl_gdr_route {
    SL_GDR_NONE = 0,
    SL_GDR_PEERMEM, /**< a peer-memory module: the CUDA bit of reg_mem_types */
    SL_GDR_DMABUF   /**< UCT_MD_FLAG_REG_DMABUF, and a driver that exports */
} sl_gdr_route_t;

/** UCT_MD_FLAG_REG_DMABUF of UCX 1.14 and later; 1.13's headers lack it
 *  and its domains leave the bit clear. */
#define SL_MD_FLAG_REG_DMABUF (UINT64_C(1) << 10)

/**
 * The route from a domain's attributes (uct_md_attr_t's cap.flags and
 * cap.reg_mem_types) and the driver's DMA-BUF support of the device
 * (1, 0, or -1 where it cannot say: UCX's own attempt then decides).
 */
sl_gdr_route_t sl_gdr_route(uint64_t md_flags, uint64_t reg_mem_types,
                            int gpu_dmabuf);
const char    *sl_gdr_route_name(sl_gdr_route_t route);

#define SL_COMM_MAGIC 0x534c434du /* "SLCM" */
#define SL_REQ_MAGIC  0x534c5251u /* "SLRQ" */

/** What every rank tells its peers of its process, to watch same-node ones. */
typedef struct sl_peer_process {
    int64_t  pid;
    uint64_t pid_ns; /**< inode of /proc/self/ns/pid: pids compare only within one */
} sl_peer_process_t;

typedef struct sl_ucx_peer {
    struct stagelink_comm *comm;
    int      rank;       /**< world rank, -1 when none */
    int      inter_node; /**< on another node: its bytes cross the link */
    char     node_id[SL_NODE_ID_LEN]; /**< as it told at init */
    sl_peer_process_t proc;           /**< as it told at init */
    ucp_ep_h ep;         /**< NULL once closed (after a failure: by force) */
    int      failed;     /**< its process or link died (ucx_fault.c) */
    char     why[160];   /**< how its failure was seen */
    void    *close_req;  /**< forced close still in flight */
} sl_ucx_peer_t;

typedef enum sl_sub_kind {
    SL_SUB_STAGE_SEND,
    SL_SUB_STAGE_RECV,
    SL_SUB_GATHER_SEND,
    SL_SUB_GATHER_RECV,
    SL_SUB_STATUS_SEND,  /**< 1 byte to a TP peer: my shard arrived (or not) */
    SL_SUB_STATUS_RECV
} sl_sub_kind_t;

struct sl_staged;
struct sl_sub;

/** How a chunked transfer reports its end to the owner of its sub
 *  (ucx_sub.c): once, maybe inside a UCX callback.  `notice`: the sender's
 *  failure notice (status then SUCCESS). */
typedef void (*sl_chunked_end_t)(struct sl_sub *sub, sl_status_t status,
                                 sl_status_t notice, size_t length,
                                 const char *why);

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
    void              *drain_req;
    sl_status_t        notice;     /**< receiver: the sender's failure notice */
    uint64_t           notice_msg[3]; /**< sender: the notice it sends in
                                           place of each chunk not sent
                                           (room for 17 bytes) */
} sl_staged_t;

struct stagelink_memh {
    struct stagelink_memh *next; /**< the communicator's live handles */
    void     *addr;
    size_t    length;
    ucp_mem_h ucp_memh;
    stagelink_mem_type_t mem_type;
};

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

/**
 * A subsystem's part in the worker's progress (the worker calls no
 * subsystem by name; each registers itself at init, in call order).
 */
typedef struct sl_progress_hook {
    /** After each UCX progress round (NULL: none). */
    void (*round)(struct stagelink_comm *comm);
    /** Once per progress call, after the rounds (NULL: none). */
    void (*after)(struct stagelink_comm *comm);
    /** 1 while it has work whose completion does not wake the UCX event
     *  fd, so a wait polls instead of sleeping (NULL: never). */
    int  (*busy)(const struct stagelink_comm *comm);
    /** When a sleep must end for its next round (0: no such time; NULL:
     *  never): a periodic look at something no fd reports. */
    double (*wake_at)(const struct stagelink_comm *comm);
} sl_progress_hook_t;

#define SL_MAX_PROGRESS_HOOKS 8

typedef struct sl_req_pool {
    struct stagelink_request *slots;
    sl_sub_t                 *subs;
    unsigned char            *flags;
    struct stagelink_request *free_list;
    struct stagelink_request *active; /**< doubly linked */
    int                       capacity, in_use;
} sl_req_pool_t;

struct stagelink_comm {
    uint32_t                    magic;
    /* Who progresses the worker (plugin/ucx/ucx_progress.c). */
    pthread_mutex_t             lock;        /**< held by the host for a call, by the thread between sleeps */
    int                         lock_made;
    int                         progress_thread; /**< STAGELINK_PROGRESS_THREAD */
    int                         pt_running;
    atomic_int                  pt_stop;
    atomic_int                  pt_sleeping; /**< the thread is in poll(), lock released */
    int                         pt_timed;    /**< ... with a timeout */
    pthread_t                   pt;
    atomic_int                  host_inside; /**< a host call holds the lock */
    _Atomic double              host_left_at; /**< when the host's last call returned */
    struct pollfd              *pt_pfds;     /**< the thread's copy of pfds */
    int                         device;      /**< CUDA device it works on, -1: none yet (ucx_device.c) */
    void                       *context;     /**< and its context (the host's at init, else the
                                                  device's primary), NULL: none yet */
    double                      grace;       /**< STAGELINK_FINALIZE_GRACE */
    int                         abandoned;   /**< requests finalize ended unfinished */
    sl_errbuf_t                 err;
    sl_layout_t                 layout;
    stagelink_mode_t            mode;
    int                         local_rank, local_size;
    char                        node_id[SL_NODE_ID_LEN];
    int                        *peer_ranks; /**< sl_layout_peers: whom init exchanges with */
    int                         npeers;
    double                      timeout;  /**< seconds, 0 = none */
    double                      spin;     /**< seconds of polling before sleep */
    int                         closing;  /**< in finalize: peers leave too */
    ucp_context_h               ucp_ctx;
    ucp_worker_h                worker;
    /** A dropped message's buffer that UCX may still write into until the
     *  worker is gone (finalize's drain timed out): freed after it. */
    void                       *drain_left;
    int                         efd;
    int                         rail;         /**< the NIC's rail, -1 unknown (ucx_worker.c) */
    char                        rail_nic[SL_TOPO_DEVICES_LEN]; /**< its UCX device, "" UCX chose */
    int                         net_sends;    /**< send subs to other nodes in flight */
    double                      net_quiet_at; /**< until then UCX may still hold
                                                   bytes of a completed one */
    const sl_progress_hook_t   *hooks[SL_MAX_PROGRESS_HOOKS];
    unsigned                    callbacks;    /**< see sl_ucx_callback_ran */
    int                         nhooks;
    sl_ucx_peer_t               prev, next;
    sl_ucx_peer_t              *tp_peers; /**< by TP index; own entry has no ep */
    const struct sl_gather_ops *gather;       /**< host buffers */
    void                       *gather_state;
    const struct sl_gather_ops *gather_dev;   /**< device buffers */
    void                       *gather_dev_state;
    int                         gather_choice; /**< STAGELINK_GATHER: auto, ucx, nccl, host */
    stagelink_gather_fn_t       host_gather;   /**< the config's gather callback */
    void                       *host_gather_ctx;
    sl_req_pool_t               pool;
    int                         max_requests; /**< STAGELINK_MAX_REQUESTS: the pool's size */
    stagelink_counters_t        counters;
    /* Device memory (plugin/ucx/ucx_device.c). */
    const sl_gpu_ops_t         *gpu;
    int                         gpu_usable;   /**< a device answered the probe */
    char                        gpu_why[160];
    int                         ucx_cuda;     /**< UCX knows CUDA memory */
    int                         ucx_ipc;      /**< ...and moves it between a node's GPUs (cuda_ipc) */
    int                         ucx_gdr;      /**< ...and its InfiniBand domain registers it (GPU-direct RDMA) */
    sl_gdr_route_t              gdr_route;    /**< how that domain registers it */
    int                         gpu_direct;   /**< STAGELINK_GPU_DIRECT (sl_settings.h) */
    int                         gdr_flush;    /**< RDMA writes into device memory need a flush (cc < 9.0) */
    char                        gdr_domain[UCT_MD_NAME_MAX]; /**< that domain ("mlx5_0"), "" none */
    size_t                      chunk;        /**< STAGELINK_CHUNK: the wire's largest chunk (0: auto, until agreed) */
    size_t                      chunk_min;    /**< the smallest (= chunk unless auto picks per message) */
    int                         all_direct;   /**< this rank's UCX moves device memory itself,
                                                   and with STAGELINK_CHUNK=auto its peers' alike */
    int                         nbufs;        /**< STAGELINK_STAGING_BUFFERS */
    sl_staging_pool_t           staging;      /**< made at the first staged transfer */
    void                       *copy_streams[2]; /**< staging copies: [0] to host (sends), [1] to the device (receives) */
    int                         gpu_numa;     /**< NUMA node of the rank's GPU, -1 unknown */
    void                      **events;       /**< free copy events */
    int                         nevents, events_cap;
    sl_staged_t                *staged_active, *staged_free;
    sl_staged_t                *staged_detached; /**< see sl_staged_t.detached */
    struct stagelink_request   *deferred;
    int                         path_logged;
    int                         test_in_wait_said; /**< test met a receive only wait completes */
    int                         vmm_logged;   /**< a buffer cuda_ipc cannot share was logged */
    uint64_t                    staged_chunks; /**< chunks moved through bounce buffers */
    void                       *scratch;  /**< the largest chunk, where mismatched chunks are dropped */
    struct sl_bootstrap        *bootstrap;
    /** Registered handles: a handle is checked by finding it here, never by
     *  reading memory that deregistration may have freed. */
    struct stagelink_memh      *memhs;
    /* Faults (plugin/ucx/ucx_fault.c). */
    sl_status_t                 fault;       /**< PEER_FAILED or ABORTED once faulty */
    int                         failed_rank; /**< first failed peer, -1 */
    sl_errbuf_t                 fault_err;   /**< the fault's sentence */
    int                         fault_pending; /**< seen in a callback, not yet applied */
    /** The fault is known only from a UCX error on a live link, which a
     *  peer that left after its own fault also causes: until
     *  fault_apply_at a death seen directly (pidfd, a report) names the
     *  rank instead. */
    int                         fault_indirect;
    double                      fault_apply_at;
    atomic_int                  aborting;    /**< comm_abort, from any thread */
    int                         aborted;     /**< the abort was applied */
    int                         fault_applied; /**< every request failed */
    struct sl_fault_report     *reports;     /**< one listening receive per
                                                  neighbour rank */
    int                         nreports;
    sl_ctl_msg_t                fault_msg; /**< the report this rank sends */
    int                         reports_inflight; /**< its sends not yet done */
    double                      reported_at;  /**< when it sent them, 0: never */
    struct pollfd              *pfds;        /**< UCX event fd, then peers' pidfds */
    sl_ucx_peer_t             **pfd_peer;    /**< owner of each pidfd entry */
    int                         npfds;
    double                      liveness_next; /**< next pidfd check of progress */
};

typedef struct stagelink_comm    sl_comm_t;

/** Adds a subsystem's hooks to every progress call (at init, in call
 *  order; fixed at build time: every subsystem registers once).  Here, so
 *  that a layer below the worker registers without calling up into it. */
static inline void sl_ucx_progress_register(sl_comm_t *comm,
                                            const sl_progress_hook_t *hook)
{
    if (comm->nhooks < SL_MAX_PROGRESS_HOOKS) {
        comm->hooks[comm->nhooks++] = hook;
    }
}

/** The plugin's vtable (exported from the shared module, reachable here by
 *  tests that link the plugin's internals). */
extern const stagelink_plugin_v1_t stagelink_plugin_v1;
typedef struct stagelink_request sl_req_t;

/* ucx_worker.c: context, worker, endpoints, progress */
sl_status_t sl_ucx_worker_create(sl_comm_t *comm);
sl_status_t sl_ucx_connect(sl_comm_t *comm, struct sl_bootstrap *bs);
void        sl_ucx_worker_destroy(sl_comm_t *comm);
/** Closes `peer`'s endpoint by force: UCX cannot cancel a send, and this
 *  ends every operation on it without waiting for the peer (the close's
 *  own request is finished when the worker is destroyed). */
void        sl_ucx_ep_force_close(sl_ucx_peer_t *peer);
/** Progresses UCX, then each registered subsystem. */
void        sl_ucx_progress(sl_comm_t *comm);
/** sl_ucx_progress for callers that hold a void pointer (the bootstrap). */
void        sl_ucx_progress_cb(void *comm);
/** Completes every operation the worker has outstanding, until `deadline`. */
void        sl_ucx_flush(sl_comm_t *comm, double deadline);
/**
 * After the finalize barrier nothing real is in flight: messages still
 * unexpected belong to canceled or failed transfers.  Drops them.
 */
void        sl_ucx_discard_unexpected(sl_comm_t *comm, double deadline);
/** Counts the communicator's UCX callbacks (any change will do): a
 *  callback can run where UCX reports no progress (a deferred completion,
 *  or one inside the post of an operation), and its follow-up (the next
 *  chunk to post) is the hooks' to do before a wait sleeps.  Callbacks run
 *  inside progress calls, which hold the communicator. */
static inline void sl_ucx_callback_ran(sl_comm_t *comm)
{
    ++comm->callbacks;
}

/**
 * Parameters of one tagged operation: the caller's callback (set after),
 * user_data, the buffer's memory type and, when the host registered the
 * buffer, its UCX memory handle (UCX then skips its own registration).
 */
void        sl_ucx_param_init(ucp_request_param_t *param, void *user_data,
                              ucs_memory_type_t mem_type,
                              const stagelink_memh_t *memh);

/* ucx_progress.c: who progresses the worker, and how a thread sleeps */
typedef struct sl_sleep {
    double         busy_until; /**< polling GPU work until then, -1: not */
    int            tx_ms;      /**< the next short sleep while sends are out */
    struct pollfd *pfds;       /**< the progress thread's copy; NULL: the host */
    int            locked;     /**< the caller holds the lock after the step */
    void          *context;    /**< the thread's current CUDA context, NULL none */
    sl_errbuf_t    host_err;   /**< the host's sentence, while the thread holds */
} sl_sleep_t;
sl_status_t sl_progress_init(sl_comm_t *comm);
/** Records the device and starts the thread (when enabled), once the
 *  endpoints and the watched pidfds exist. */
sl_status_t sl_progress_start(sl_comm_t *comm);
/** Stops and joins the thread; the caller then owns the worker alone. */
void        sl_progress_stop(sl_comm_t *comm);
void        sl_progress_cleanup(sl_comm_t *comm);
/** Every host call into a live communicator runs between these two. */
void        sl_progress_enter(sl_comm_t *comm);
void        sl_progress_leave(sl_comm_t *comm);
/** sl_progress_leave for a call that only reads (comm_info, counters):
 *  the progress thread's idle clock goes on. */
void        sl_progress_leave_query(sl_comm_t *comm);
void        sl_progress_sleep_init(sl_sleep_t *s, struct pollfd *own_pfds);
/** One step of a blocking wait after a progress call left the caller's
 *  condition unmet: polls GPU work, or arms the worker and sleeps in
 *  poll() until UCX has events, a watched peer dies, or `wake` (0: none).
 *  The progress thread releases the lock while it sleeps, and returns
 *  without it (s->locked 0) when a host call holds it by then. */
sl_status_t sl_progress_sleep(sl_comm_t *comm, sl_sleep_t *s, double wake);

/* ucx_peer.c: peer health, recorded where it is seen */
/** No peer failed; before anything can fail. */
void        sl_peer_init(sl_comm_t *comm);
/** The endpoint slots, sl_peer_at(comm, 0 .. sl_peer_count - 1): prev, next,
 *  then the TP group by index (its own slot has no endpoint).  A rank may
 *  fill two (prev and next when p = 2 wraps around). */
int            sl_peer_count(const sl_comm_t *comm);
sl_ucx_peer_t *sl_peer_at(sl_comm_t *comm, int i);
/** Each slot's rank, from the layout (tp_peers allocated). */
void           sl_peer_place(sl_comm_t *comm);
/** What init's facts say of `rank`, in every slot of it: its node and
 *  its process (watched for its death). */
void           sl_peer_learn(sl_comm_t *comm, int rank, const char *node_id,
                             const sl_peer_process_t *proc);
/** Records that `peer` died (callable from UCX callbacks); ucx_fault.c
 *  applies it: its subs fail, its endpoint is closed by force.
 *  `direct`: its death was seen (pidfd, a report), not only a UCX error. */
void        sl_peer_down(sl_ucx_peer_t *peer, int direct, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/** A failure of the TP group that names no rank (NCCL's asynchronous
 *  error): the communicator's fault, TRANSPORT, applied as a death is. */
void        sl_peer_group_failed(sl_comm_t *comm, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/** The fault is a peer failure known only from a UCX error, not applied
 *  yet: a direct sighting may still name another rank. */
int         sl_peer_unsure(const sl_comm_t *comm);
/** When a wait must wake to apply a fault held back for a direct sighting
 *  (0: none). */
double      sl_peer_wake_at(const sl_comm_t *comm);
/** The sentence of a failed peer: who, where, how it was seen, what to do. */
void        sl_peer_describe(const sl_ucx_peer_t *peer, char *buf, size_t len);
/** Looks at the pidfds poll() returned on (entries 1..npfds-1). */
void        sl_peer_polled(sl_comm_t *comm);
/** Whether something may be posted to `peer` (NULL: any). */
sl_status_t sl_peer_check(sl_comm_t *comm, sl_ucx_peer_t *peer);
/** comm_abort: thread-safe; the owning thread applies it. */
void        sl_peer_abort(sl_comm_t *comm);

/* ucx_fault.c: a peer's death or an abort applied to every request */
/** Watches the same-node peers' processes (after the endpoints exist);
 *  from then on pfds holds the UCX event fd and the pidfds. */
sl_status_t sl_fault_watch(sl_comm_t *comm);
/** This process as sl_fault_watch compares it (init's facts carry it). */
void        sl_peer_process_self(sl_peer_process_t *me);
void        sl_fault_cleanup(sl_comm_t *comm);

/* ucx_request.c: a request's whole life (sl_req_state_t) */
sl_status_t sl_req_pool_init(sl_req_pool_t *pool, int capacity, int tp_size,
                             sl_errbuf_t *eb);
void        sl_req_pool_cleanup(sl_req_pool_t *pool);
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
/** Its gather's collective is due in wait (gather.h's in_wait): test
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
/** Cancels what `req` has in flight (the ends come through UCX); a
 *  request still behind its stream fails with STAGELINK_ERR_CANCELED. */
void        sl_req_cancel(sl_comm_t *comm, sl_req_t *req);
/** Fails `req` with `status` and the sentence (unless it failed before:
 *  the first error stays), and cancels what it has in flight. */
void        sl_req_abort(sl_comm_t *comm, sl_req_t *req, sl_status_t status,
                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

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
/** Asks UCX to cancel what is in flight (the end comes through UCX). */
void        sl_sub_cancel(sl_comm_t *comm, sl_sub_t *sub);
/** Ends a sub in flight at once after a failure or an abort, leaving what
 *  UCX will not complete to call back into a detached sub. */
void        sl_sub_detach(sl_comm_t *comm, sl_sub_t *sub, sl_status_t status,
                          const char *why);
int         sl_sub_in_flight(const sl_sub_t *sub);
/** "gather send to rank 3 (in chunks, ...)"; 0 when not in flight. */
int         sl_sub_describe(const sl_sub_t *sub, char *out, size_t len);
const char *sl_sub_name(sl_sub_kind_t kind);

/* ucx_xfer.c: a transfer's checks, its shard, and its post */
sl_status_t sl_xfer_post(sl_comm_t *comm, stagelink_op_kind_t kind,
                         const stagelink_xfer_t *xfer, sl_req_t **req_out);
sl_status_t sl_xfer_post_batch(sl_comm_t *comm, const stagelink_op_t *ops,
                               size_t count, sl_req_t **reqs);
/* ucx_wire.c: control messages and what UCX's statuses mean */
/** What a receive matched with SL_TAG_MASK_HEADER on `posted` got. */
typedef enum sl_msg_kind {
    SL_MSG_DATA,
    SL_MSG_HEADER, /**< a length header: *value is the sender's length */
    SL_MSG_NOTICE, /**< a failure notice: *value is the sender's status */
    SL_MSG_BAD     /**< a control message of no known form */
} sl_msg_kind_t;
sl_msg_kind_t sl_msg_classify(uint64_t posted, const ucp_tag_recv_info_t *info,
                              const void *msg, uint64_t *value);
/** Writes the notice of `status` (an sl_ctl_msg_t) at `msg`. */
void        sl_notice_make(void *msg, sl_status_t status);
/** The status a received notice stands for (never SUCCESS). */
sl_status_t sl_notice_status(uint64_t value);
/** The status of one UCX operation with `peer` ("a transfer", "a chunk"):
 *  a lost connection marks the peer down, so every path says PEER_FAILED. */
sl_status_t sl_wire_status(sl_ucx_peer_t *peer, ucs_status_t ucs,
                           const char *what);

/* ucx_device.c: device memory */
/** The GPU runtime comm_init uses (tests put a fake one here first). */
extern const sl_gpu_ops_t *sl_device_runtime;
/** Whether a GPU is usable, known before any exchange, and the device:
 *  the config's (made current), else the calling thread's, else -1. */
sl_status_t sl_device_probe(sl_comm_t *comm, const stagelink_config_t *config);
/** The communicator's context becomes current on the calling thread (the
 *  caller's comes back with sl_gpu_leave). */
void        sl_device_enter(sl_comm_t *comm, sl_gpu_entry_t *e);
/** A communicator without a device takes that of its first device tensor. */
sl_status_t sl_device_adopt(sl_comm_t *comm, int device);
/** Which libucp runs, and whether that UCX was built with CUDA (1). */
int         sl_device_ucx_build(char *out, size_t len);
/** The node's GPUs into `t` (all of the PCI tree's, whatever CUDA shows);
 *  the index of this rank's GPU (CUDA's current device, else local rank
 *  i on GPU i), -1 when none is known. */
int         sl_device_topo_gpus(sl_comm_t *comm, const char *root,
                                struct sl_topo *t);
/** Which InfiniBand domain of the UCX context registers device memory,
 *  and how (ucx_gdr.c): sets ucx_ipc, ucx_gdr, gdr_route, gdr_domain. */
void        sl_gdr_domains(sl_comm_t *comm);
/** What UCX can do with device memory (after the worker exists). */
sl_status_t sl_device_init(sl_comm_t *comm);
/** Whether device memory to or from `peer` goes to UCX as it is (else it
 *  is staged): cuda_ipc on the node, GPU-direct RDMA to other nodes. */
int         sl_device_path_direct(const sl_comm_t *comm, const sl_ucx_peer_t *peer);
/** The same for one device buffer (*direct): memory cuda_ipc cannot
 *  share (the virtual memory API, pools) is staged to same-node peers, or
 *  refused under STAGELINK_GPU_DIRECT=require. */
sl_status_t sl_device_buffer_path(sl_comm_t *comm, const sl_ucx_peer_t *peer,
                                  const void *buf, int *direct);
/** This rank has a GPU and UCX moves its device memory directly on every
 *  path it could have: cuda_ipc, and GPU-direct RDMA unless the job is on
 *  one node (alike on alike nodes: the chunk size follows it). */
int         sl_device_all_direct(const sl_comm_t *comm);
/** After RDMA wrote a device buffer, before the GPU reads it: the flush
 *  GPUs below compute capability 9.0 need (none elsewhere). */
sl_status_t sl_device_rdma_landed(sl_comm_t *comm, const sl_ucx_peer_t *peer);
void        sl_device_cleanup(sl_comm_t *comm);
/** Post-time work of a device request: stream event, and deferral until
 *  the work queued on the host's stream before it is done, reported
 *  through req->stream_ready. */
sl_status_t sl_device_prepare(sl_req_t *req);
/** `stream` waits for what is queued on the request's stream so far. */
sl_status_t sl_device_order(sl_req_t *req, void *stream);
sl_status_t sl_device_event_get(sl_comm_t *comm, void **event);
void        sl_device_event_put(sl_comm_t *comm, void *event);
/** Bounce buffers and copy stream, made at the first staged chunk. */
sl_status_t sl_device_staging_ready(sl_comm_t *comm);
/** The staging engine's copies, on the plugin's copy stream. */
sl_status_t sl_device_copy_start(void *ctx, sl_staging_xfer_t *x, void *dst,
                                 const void *src, size_t len, int to_device,
                                 void **token);
int         sl_device_copy_test(void *ctx, void *token, sl_status_t *status);

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
void        sl_chunked_cancel(sl_comm_t *comm, sl_staged_t *st);
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

/* ucx_mem.c: registration and memory types */
sl_status_t sl_mem_register(sl_comm_t *comm, void *buf, size_t nbytes,
                            stagelink_mem_type_t mem_type,
                            stagelink_memh_t **memh);
sl_status_t sl_mem_deregister(sl_comm_t *comm, stagelink_memh_t *memh);
/** Deregisters what the host left registered (at finalize). */
void        sl_mem_cleanup(sl_comm_t *comm);
/** Checks the memory type and registration; *mem_type is what the buffer
 *  really is (classified when the host said AUTO).  may_ask 0: the
 *  declared type was checked already, ask the runtime only for AUTO. */
sl_status_t sl_mem_resolve(sl_comm_t *comm, const stagelink_xfer_t *xfer,
                           int may_ask, stagelink_mem_type_t *mem_type);

#endif
