/*
 * Internals of the UCX plugin: the communicator, and the calls of the
 * files that own no object of their own (progress, peers, faults, posts,
 * device memory, registration).  Each object has its header beside this
 * one, with its owner's calls: ucx_worker.h (the worker's endpoints),
 * ucx_request.h, ucx_sub.h, ucx_chunked.h; ucx_wire.h holds the wire
 * format.  Shared by the files of plugin/ucx and the gather backends.
 * SPDX-License-Identifier: MIT
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

#include "ucx_chunked.h"
#include "ucx_request.h"
#include "ucx_wire.h"
#include "ucx_worker.h"

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




struct stagelink_memh {
    struct stagelink_memh *next; /**< the communicator's live handles */
    void     *addr;
    size_t    length;
    ucp_mem_h ucp_memh;
    ucp_mem_h ucp_memh_local; /**< the same in the same-node context */
    stagelink_mem_type_t mem_type;
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
    double                      spin;     /**< seconds of polling before sleep, at most */
    double                      spin_now; /**< the poll window wait() adapts (ucx_request.c) */
    int                         closing;  /**< in finalize: peers leave too */
    ucp_context_h               ucp_ctx;
    ucp_worker_h                worker;
    /** Same-node transports only (ucx_worker.c), NULL where UCX_TLS is the
     *  user's or none works: same-node peers then use `worker`. */
    ucp_context_h               local_ctx;
    ucp_worker_h                local_worker;
    /** A dropped message's buffer that UCX may still write into until the
     *  worker is gone (finalize's drain timed out): freed after it. */
    void                       *drain_left;
    int                         efd;          /**< wakes for either worker: with a
                                                   same-node worker, an epoll
                                                   set of both (ours to close) */
    int                         lanes_warned; /**< same-node bytes over a
                                                   network transport, told */
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
    sl_leftover_t              *leftovers; /**< drains of canceled messages (ucx_leftover.c) */
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
    sl_ctl_msg_t                hello_msg; /**< the hello it sends at init */
    int                         reports_inflight; /**< its sends not yet done */
    double                      reported_at;  /**< when it sent them, 0: never */
    struct pollfd              *pfds;        /**< UCX event fd, then peers' pidfds */
    sl_ucx_peer_t             **pfd_peer;    /**< owner of each pidfd entry */
    int                         npfds;
    double                      liveness_next; /**< next pidfd check of progress */
};


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

/** Counts the communicator's UCX callbacks (any change will do): a
 *  callback can run where UCX reports no progress (a deferred completion,
 *  or one inside the post of an operation), and its follow-up (the next
 *  chunk to post) is the hooks' to do before a wait sleeps.  Callbacks run
 *  inside progress calls, which hold the communicator. */
static inline void sl_ucx_callback_ran(sl_comm_t *comm)
{
    ++comm->callbacks;
}

/** The plugin's vtable (exported from the shared module, reachable here by
 *  tests that link the plugin's internals). */
extern const stagelink_plugin_v1_t stagelink_plugin_v1;


/* ucx_progress.c: who progresses the worker, and how a thread sleeps */
/** How the last sl_progress_sleep ended. */
typedef enum {
    SL_SLEEP_NO_POLL, /**< it returned without poll(): work was there, or GPU work's nap */
    SL_SLEEP_WOKEN,   /**< an event ended its poll() */
    SL_SLEEP_TIMED    /**< its poll() timed out */
} sl_sleep_end_t;

typedef struct sl_sleep {
    double         busy_until; /**< polling GPU work until then, -1: not */
    sl_sleep_end_t polled;     /**< how the last step ended */
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

/** This process as its peers compare it (init's facts carry it). */
void        sl_peer_process_self(sl_peer_process_t *me);
/** Whether `peer` is on this node in this process's pid and IPC
 *  namespaces: where UCX's shared memory and CMA reach it. */
int         sl_peer_shares_memory(const sl_ucx_peer_t *peer);

/* ucx_fault.c: a peer's death or an abort applied to every request */
/** Watches the same-node peers' processes (after the endpoints exist);
 *  from then on pfds holds the UCX event fd and the pidfds. */
sl_status_t sl_fault_watch(sl_comm_t *comm);
void        sl_fault_cleanup(sl_comm_t *comm);
/** Finalize's barrier failed: a same-node peer seen dead (within a short
 *  wait for its pidfd) is reported to the neighbours before the endpoints
 *  close, so that none takes this rank's departure for the failure. */
void        sl_fault_barrier_failed(sl_comm_t *comm);

/* ucx_hello.c: every endpoint wired up before init returns */
/** A hello each way over every endpoint, waited for (blocking) until each
 *  came, its peer died, or STAGELINK_TIMEOUT; after sl_fault_watch. */
sl_status_t sl_hello_exchange(sl_comm_t *comm);

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
