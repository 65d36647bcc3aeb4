/*
 * stagelink: pipeline-stage boundary transfers with tensor-parallel
 * scatter/gather (Megatron-LM PTD-P), as a dlopen-able plugin.
 *
 * This header is the whole contract between a host (a training runtime) and
 * a plugin.  A plugin exports one data symbol per ABI version it implements,
 * `stagelink_plugin_v1` for this version.  A later ABI adds
 * `stagelink_plugin_v2` next to it; hosts built against v1 keep working.
 *
 * Copyright (c) 2026 The stagelink developers. SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_STAGELINK_H
#define STAGELINK_STAGELINK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Marks the functions of libstagelink (a plugin exports only its vtable). */
#if defined(__GNUC__)
#define STAGELINK_EXPORT __attribute__((visibility("default")))
#else
#define STAGELINK_EXPORT
#endif

/** ABI version implemented by `stagelink_plugin_v1`. */
#define STAGELINK_ABI_VERSION_1 1u

/** Name of the data symbol a v1 plugin exports. */
#define STAGELINK_PLUGIN_SYMBOL_V1 "stagelink_plugin_v1"

/**
 * Status of every call.  Values are stable; new ones are only appended.
 * `stagelink_status_string()` gives a short name; the communicator's
 * last-error string gives the full sentence.
 */
typedef enum stagelink_status {
    STAGELINK_SUCCESS              = 0,
    STAGELINK_ERR_INVALID_ARG      = 1,       /**< NULL or out-of-range argument */
    STAGELINK_ERR_INVALID_STATE    = 2,       /**< call not allowed now (finalized handle, ...) */
    STAGELINK_ERR_NO_MEMORY        = 3,       /**< allocation failed or too many requests in flight */
    STAGELINK_ERR_NOT_FOUND        = 4,       /**< plugin library not found */
    STAGELINK_ERR_SYMBOL_MISSING   = 5,       /**< plugin lacks stagelink_plugin_vN */
    STAGELINK_ERR_VERSION_MISMATCH = 6,       /**< plugin and host ABI differ */
    STAGELINK_ERR_BOOTSTRAP        = 7,       /**< rendezvous or out-of-band exchange failed */
    STAGELINK_ERR_TRANSPORT        = 8,       /**< UCX (or other transport) error */
    STAGELINK_ERR_SIZE_MISMATCH    = 9,       /**< sender and receiver sizes differ */
    STAGELINK_ERR_TAG_IN_USE       = 10,      /**< same tag already in flight */
    STAGELINK_ERR_NO_PEER          = 11,      /**< no neighbour stage in that direction */
    STAGELINK_ERR_CANCELED         = 12,
    STAGELINK_ERR_TIMEOUT          = 13,      /**< deadline (STAGELINK_TIMEOUT) passed */
    STAGELINK_ERR_UNSUPPORTED      = 14,      /**< valid request this build cannot serve */
    STAGELINK_ERR_CONFIG           = 15,      /**< bad environment variable or config value */
    STAGELINK_ERR_INIT             = 16,      /**< plugin init failed (see the error sentence) */
    STAGELINK_ERR_INTERNAL         = 17,
    STAGELINK_ERR_PEER_FAILED      = 18,      /**< a peer process or its link died (see comm_get_error) */
    STAGELINK_ERR_ABORTED          = 19,      /**< comm_abort was called on this communicator */
    /** Not an error: `wait_for`'s slice ended first; the request is still in flight. */
    STAGELINK_IN_PROGRESS          = 20,
    /** comm_finalize met requests still in flight: receives canceled, sends
     *  not done within STAGELINK_FINALIZE_GRACE abandoned (the sentence
     *  names how many and their tags). */
    STAGELINK_ERR_ABANDONED        = 21,
    /** A struct the plugin cannot take: a struct_size below the smallest
     *  published, above 4096 (uninitialised?) or not a whole number of
     *  fields, or a tail past what the plugin knows that is not zero, or
     *  config flags it does not know (see "Growing the ABI" below). */
    STAGELINK_ERR_ABI              = 22
} stagelink_status_t;

/** Short, static name of a status ("STAGELINK_ERR_TIMEOUT"). */
STAGELINK_EXPORT const char *stagelink_status_string(stagelink_status_t status);

/** How a boundary tensor crosses between stages. */
typedef enum stagelink_mode {
    /** STAGELINK_MODE, else scatter_gather.  Any other mode here and a
     *  STAGELINK_MODE that names a different one fail comm_init with
     *  STAGELINK_ERR_INVALID_ARG: the variable only chooses for a host that
     *  left the choice to it. */
    STAGELINK_MODE_DEFAULT        = 0,
    /** Each TP rank sends its 1/t shard of a tensor all TP ranks hold
     *  alike; receivers all-gather the full tensor. */
    STAGELINK_MODE_SCATTER_GATHER = 1,
    /** Every TP rank sends its whole buffer; no gather.  The baseline, and
     *  the sequence-parallel boundary, where each TP rank's tensor
     *  ([s/t, b, h]) is its own slice. */
    STAGELINK_MODE_FULL           = 2,
    /**
     * Each TP rank sends only its 1/t shard of a tensor all TP ranks hold
     * alike, and the receiver fills only its own shard; no gather.  Bytes
     * of the buffer outside the rank's shard are neither read nor written:
     * only for a consumer that reads nothing but its own shard.  Not the
     * sequence-parallel boundary (FULL is).
     */
    STAGELINK_MODE_SHARDED        = 3
} stagelink_mode_t;

/** Where a buffer lives. */
typedef enum stagelink_mem_type {
    STAGELINK_MEM_AUTO         = 0, /**< detect (host when no GPU runtime) */
    STAGELINK_MEM_HOST         = 1,
    STAGELINK_MEM_CUDA         = 2,
    STAGELINK_MEM_CUDA_MANAGED = 3  /**< refused (as host memory it keeps no
                                         stream order): declare it _CUDA */
} stagelink_mem_type_t;

/** Which neighbour stage a transfer goes to or comes from. */
typedef enum stagelink_peer {
    STAGELINK_PEER_NEXT = 0, /**< stage i+1: forward activations go there */
    STAGELINK_PEER_PREV = 1  /**< stage i-1: backward gradients go there */
} stagelink_peer_t;

/** Direction in the schedule; implied by the peer and the operation. */
typedef enum stagelink_dir {
    STAGELINK_DIR_AUTO     = 0, /**< derive from peer: send NEXT/recv PREV = forward */
    STAGELINK_DIR_FORWARD  = 1, /**< activations, stage i -> i+1 */
    STAGELINK_DIR_BACKWARD = 2  /**< gradients, stage i+1 -> i */
} stagelink_dir_t;

/** Largest microbatch id and virtual chunk id a tag can carry. */
#define STAGELINK_TAG_MAX_MICROBATCH 0xffffffffu
#define STAGELINK_TAG_MAX_CHUNK      0x7ffu

/*
 * Growing the ABI (docs/c-api.md, "ABI v1").  A struct the host passes in
 * and that may grow (config, topology, xfer) carries `uint32_t
 * struct_size`: the config first, the others in what was padding, so the
 * layout of every host built before it is unchanged and its zeroed
 * struct reads as struct_size 0.
 *  - struct_size is the host's sizeof, or 0 for the v1 baseline layout, so
 *    a zeroed struct needs nothing more; a struct filled field by field
 *    without zeroing it first has garbage there (refused with
 *    STAGELINK_ERR_ABI): zero it, or set struct_size.  Fields a smaller struct lacks
 *    read as 0.  A struct larger than the plugin knows is taken when every
 *    byte past what it knows is 0 and refused with STAGELINK_ERR_ABI
 *    otherwise (the rule of Linux's copy_struct_from_user): a field the
 *    plugin would ignore is never set.
 *  - An array's element size is an argument (post_batch_sized);
 *    post_batch takes the baseline's.
 *  - A struct the plugin fills in the host's memory (comm_info, counters)
 *    is written whole and never read, so it may be uninitialised; it grows
 *    only with an appended entry that takes the host's size.  gather_args,
 *    which the plugin hands to the host's callback, says in struct_size
 *    how much of it the plugin filled (0, from a plugin built before it
 *    had one: all of the v1 struct).
 */

/**
 * Identifies one transfer between two neighbour stages.  Any number of
 * transfers may be in flight; each receive matches the send with the same
 * (direction, microbatch, chunk), whatever the posting order.  A tag must
 * not be reused while a transfer with it is in flight on the same side.
 */
typedef struct stagelink_tag {
    uint32_t microbatch; /**< microbatch id, 0..STAGELINK_TAG_MAX_MICROBATCH */
    uint16_t chunk;      /**< virtual chunk id (interleaved 1F1B), 0..STAGELINK_TAG_MAX_CHUNK */
    uint8_t  direction;  /**< stagelink_dir_t; AUTO or consistent with the peer */
    uint8_t  reserved;   /**< must be 0 */
} stagelink_tag_t;

/** Opaque handles. */
typedef struct stagelink_comm    stagelink_comm_t;
typedef struct stagelink_request stagelink_request_t;
typedef struct stagelink_memh    stagelink_memh_t;

/**
 * Out-of-band allgather a host may provide instead of the built-in TCP
 * rendezvous (the way a runtime passes its own store): gather `size` bytes
 * from every rank into `recvbuf` (world_size * size bytes, rank order).
 * Returns 0 on success.  Called collectively during init and by
 * comm_finalize's closing barrier: it must stay callable until then.
 */
typedef int (*stagelink_allgather_fn_t)(void *ctx, const void *sendbuf,
                                        void *recvbuf, size_t size);

/**
 * A key-value store a host may provide instead (torch.distributed's Store,
 * PMIx, etcd): each rank then reads only the ranks it talks to, its TP
 * group and its two pipeline neighbours, so init costs O(t) reads per rank
 * whatever the world size.  Keys are short NUL-terminated strings, unique
 * within one communicator; give each communicator its own namespace
 * (a prefix) when several share a store.
 *  - `set` publishes `size` bytes under `key`;
 *  - `get` waits until `key` exists (the host's store decides how long;
 *    bound it by STAGELINK_TIMEOUT, as the Python package does, so that a
 *    peer that failed before writing its key is reported in time),
 *    copies at most `capacity` bytes of it into `buf` and sets `*size` to
 *    its full length.
 * Both return 0 on success.  Called during init and by comm_finalize's
 * closing barrier: they must stay callable until then.
 */
typedef int (*stagelink_store_set_fn_t)(void *ctx, const char *key,
                                        const void *buf, size_t size);
typedef int (*stagelink_store_get_fn_t)(void *ctx, const char *key,
                                        void *buf, size_t capacity,
                                        size_t *size);

/** One gathered receive, as a host gather callback sees it. */
typedef struct stagelink_gather_args {
    void                *buf;       /**< the full tensor; this rank's shard is in place */
    size_t               nbytes;
    size_t               elem_size; /**< at least 1 (an xfer's 0 reads 1) */
    stagelink_mem_type_t mem_type;  /**< never AUTO */
    uint32_t             struct_size; /**< bytes the plugin filled (0: the v1 baseline, all
                                       *   of this struct); read no field past it */
    void                *stream;    /**< the receive's stream (device memory), else NULL */
    stagelink_tag_t      tag;
    int                  tp_size, tp_index;
    const size_t        *offsets;   /**< tp_size shards: byte offset of each in buf */
    const size_t        *lengths;   /**< ... and its length (they differ by at most one element) */
} stagelink_gather_args_t;

/**
 * A host's own rebuild of a gathered receive inside its TP group, e.g.
 * torch's all_gather_into_tensor on Megatron's TP process group, so that no
 * second communicator exists beside the host's.  Called on the host's
 * thread, inside the wait (or the test that returns done) completing a
 * receive whose own shard and those of the whole TP group arrived; it fills
 * the other shards of args->buf (for device memory: enqueued on
 * args->stream) and returns 0.  It is a collective of the TP group: every
 * rank of a TP group completes its gathered receives in the same order
 * (Megatron's schedules do), as with any collective.  A receive whose
 * shard failed on any rank of the group fails on all, without a call;
 * once every shard arrived every rank calls it, also one whose receive
 * failed after that (canceled, say), which keeps its failure.  Not called
 * for 0 bytes, nor by comm_finalize.
 */
typedef int (*stagelink_gather_fn_t)(void *ctx,
                                     const struct stagelink_gather_args *args);

/** Rank placement given explicitly instead of Megatron's rank order. */
typedef struct stagelink_topology {
    int        prev_rank;     /**< rank of the matching TP rank in stage i-1, or -1 */
    int        next_rank;     /**< rank of the matching TP rank in stage i+1, or -1 */
    int        tp_index;      /**< this rank's index in its TP group */
    uint32_t   struct_size;   /**< sizeof(stagelink_topology_t), or 0: v1 baseline */
    const int *tp_ranks;      /**< tp_size world ranks of the TP group, by index */
} stagelink_topology_t;

/**
 * Communicator configuration.  Zero-initialise it and set what you need;
 * zero means "take it from the launcher environment or the default".
 */
typedef struct stagelink_config {
    uint32_t struct_size;     /**< sizeof(stagelink_config_t), or 0: v1 baseline */
    int      rank;            /**< -1 or 0: see `flags` */
    int      world_size;      /**< 0: from RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_* */
    int      tp_size;         /**< t; 0: 1 */
    int      pp_size;         /**< p; 0: world_size / tp_size (no data parallelism) */
    stagelink_mode_t mode;    /**< 0: STAGELINK_MODE or scatter_gather */
    /** If non-NULL, placement is taken from here, not from the rank order. */
    const stagelink_topology_t *topology;
    /** If non-NULL, used for every bootstrap exchange instead of TCP. */
    stagelink_allgather_fn_t allgather;
    void    *allgather_ctx;
    uint32_t flags;           /**< STAGELINK_CONFIG_* */
    /**
     * Appended later (a host built before passes a smaller struct_size):
     * if both are non-NULL, every bootstrap exchange goes through this
     * store instead of TCP; not together with `allgather`.
     */
    stagelink_store_set_fn_t store_set;
    stagelink_store_get_fn_t store_get;
    void    *store_ctx;
    /** If non-NULL, gathered receives are rebuilt by the host (see
     *  stagelink_gather_fn_t), unless STAGELINK_GATHER names another way. */
    stagelink_gather_fn_t gather;
    void    *gather_ctx;
    /** With STAGELINK_CONFIG_DEVICE_SET: the CUDA device (an ordinal as
     *  the process sees them) the communicator works on; else the calling
     *  thread's current device at comm_init, or, without one, the device
     *  of the first device tensor posted. */
    int      device;
} stagelink_config_t;

/** `rank` and `world_size` in the config are meaningful (rank may be 0). */
#define STAGELINK_CONFIG_RANK_SET   0x1u
/** `device` in the config is meaningful (device 0 is a device). */
#define STAGELINK_CONFIG_DEVICE_SET 0x2u

/** What a communicator resolved at init. */
typedef struct stagelink_comm_info {
    int              rank, world_size;
    /** With an explicit topology (`config.topology`) only tp_size and
     *  tp_index are known: pp_size is the config's (0: unknown) and
     *  dp_size, pp_index and dp_index read -1. */
    int              tp_size, pp_size, dp_size;
    int              tp_index, pp_index, dp_index;
    int              prev_rank, next_rank;  /**< -1 where none */
    int              local_rank, local_size; /**< on this node */
    stagelink_mode_t mode;
    /** Who rebuilds scatter_gather's device tensors: "nccl", "ucx",
     *  "host" (the config's gather callback); "none" where nothing is
     *  gathered (t = 1, or another mode). */
    char             gather_backend[16];
    char             node_id[64];            /**< how this node was told apart */
} stagelink_comm_info_t;

/**
 * Byte counters of one communicator since init.  "Stage" bytes crossed a
 * pipeline boundary, "gather" bytes rebuilt a tensor inside the TP group.
 * "Inter-node" bytes went to or came from a peer on another node (by the
 * node identity, see STAGELINK_NODE_ID), whichever path carried them.
 */
typedef struct stagelink_counters {
    uint64_t stage_bytes_sent, stage_bytes_recv;
    uint64_t gather_bytes_sent, gather_bytes_recv;
    uint64_t inter_node_bytes_sent, inter_node_bytes_recv;
    uint64_t intra_node_bytes_sent, intra_node_bytes_recv;
    uint64_t transfers_completed;
} stagelink_counters_t;

/** One tensor transfer. */
typedef struct stagelink_xfer {
    stagelink_peer_t     peer;
    uint32_t             struct_size; /**< sizeof(stagelink_xfer_t), or 0: v1 baseline */
    void                *buf;       /**< the full tensor (see stagelink_mode_t) */
    size_t               nbytes;    /**< size of the full tensor, any value */
    size_t               elem_size; /**< shard boundaries fall on elements; 0 = 1 */
    stagelink_mem_type_t mem_type;
    void                *stream;    /**< cudaStream_t for device memory, else NULL */
    stagelink_memh_t    *memh;      /**< optional registration covering buf */
    stagelink_tag_t      tag;
} stagelink_xfer_t;

typedef enum stagelink_op_kind {
    STAGELINK_OP_SEND = 0,
    STAGELINK_OP_RECV = 1
} stagelink_op_kind_t;

/** One element of a batched post; post_batch_sized takes its size. */
typedef struct stagelink_op {
    stagelink_op_kind_t kind;
    stagelink_xfer_t    xfer;
} stagelink_op_t;

/**
 * Version 1 of the plugin vtable.  `abi_version` and `struct_size` come
 * first so a host can check them before touching anything else.
 *
 * The v1 vtable only ever grows by appending: no entry is removed,
 * reordered or changes its type, so a plugin built against an older v1
 * header is a prefix of this struct with a smaller `struct_size`.  The
 * original v1 ended with `get_counters`; `comm_abort`, `comm_get_error`,
 * `describe`, `wait_for`, `order_stream` and `post_batch_sized` were
 * appended later.  A host checks `struct_size`
 * through the loader (stagelink/loader.h), not by reading the plugin's
 * symbol itself: the loader refuses a vtable shorter than that original
 * prefix (or not a whole number of pointers) and hands out a full-size
 * copy in which every entry the plugin predates is a loader stub
 * answering STAGELINK_ERR_UNSUPPORTED (`describe`: a one-line sentence
 * saying so); the copy keeps the plugin's `struct_size`.  So an appended
 * entry must be optional: a host has to cope with that answer from an old
 * plugin.  A change every plugin must implement, or any other change to
 * existing entries, needs a new ABI (`stagelink_plugin_v2`).
 *
 * Requests: every post returns a request that must be completed by `test`
 * (until it reports done) or `wait`; completion releases it.  A receive
 * whose gather NCCL runs (STAGELINK_GATHER=nccl, below) is completed only
 * by `wait` or a `wait_for` of a timeout other than 0.  Every call
 * returning an error leaves a sentence in `last_error(comm)`.
 *
 * Threads: a host calls a communicator from one thread at a time (any
 * thread, any number of communicators per process); only `comm_abort` may
 * be called from another thread meanwhile.  A communicator belongs to the
 * process that initialized it: in a child forked from it, every call on
 * it, `comm_finalize` too, fails with STAGELINK_ERR_INVALID_STATE and
 * touches nothing of the parent's.  Transfers move on while the
 * host is away from stagelink (computing, inside another library's
 * collective, asleep): a plugin may progress them from a thread of its
 * own (the UCX plugin does, unless STAGELINK_PROGRESS_THREAD=0), so a
 * peer's request never waits for this rank's next call.  Such a thread
 * makes the CUDA device that was current on the thread calling
 * `comm_init` current on itself, and never changes the host's.
 *
 * Device tensors in scatter_gather are rebuilt over UCX, or by the
 * config's gather callback, unless STAGELINK_GATHER=nccl asks for NCCL's
 * collectives, which every TP rank must issue in one order.  stagelink
 * then issues each in `wait`, on the calling thread, once every TP rank's
 * shard has landed: wait for a stage's device receives in the same order
 * on every TP rank (an SPMD schedule does), outside the host's own
 * ncclGroupStart/End.  `test` leaves such a receive not done, since
 * whether it finds a shard landed depends on the network; one that failed
 * anywhere in the TP group completes by either.  The transfer's stream
 * then waits for the collective; the GPU never waits for the network.
 */
typedef struct stagelink_plugin_v1 {
    uint32_t    abi_version;  /**< STAGELINK_ABI_VERSION_1 */
    uint32_t    struct_size;  /**< sizeof(stagelink_plugin_v1_t) the plugin was built with */
    const char *name;         /**< "ucx", "nccl" */
    const char *version;      /**< plugin version string */

    stagelink_status_t (*comm_init)(const stagelink_config_t *config,
                                    stagelink_comm_t **comm);
    /**
     * Collective: every rank calls it.  Requests the host never completed
     * are ended first: receives are canceled at once (a gathered one hears
     * its TP peers' parts within the grace), sends get
     * STAGELINK_FINALIZE_GRACE seconds to complete and are then abandoned
     * (UCX cannot cancel a send: their endpoints are closed by force).  It
     * returns within that grace, the closing barrier and half a second
     * (a tenth more where the barrier failed), and returns STAGELINK_ERR_ABANDONED (the sentence, in
     * `last_error(comm)` even after the call, names how many and their
     * tags) when any was ended so; the communicator is finalized in every
     * case.
     */
    stagelink_status_t (*comm_finalize)(stagelink_comm_t *comm);
    stagelink_status_t (*comm_info)(stagelink_comm_t *comm,
                                    stagelink_comm_info_t *info);
    /** Last error sentence of `comm`; with NULL, of the last failed init in this thread. */
    const char *(*last_error)(stagelink_comm_t *comm);

    stagelink_status_t (*mem_register)(stagelink_comm_t *comm, void *buf,
                                       size_t nbytes,
                                       stagelink_mem_type_t mem_type,
                                       stagelink_memh_t **memh);
    /** Not while a request posted with `memh` is not yet completed by
     *  `test` or `wait`: the UCX plugin, whose transfers read through it,
     *  refuses it then with STAGELINK_ERR_INVALID_STATE. */
    stagelink_status_t (*mem_deregister)(stagelink_comm_t *comm,
                                         stagelink_memh_t *memh);

    stagelink_status_t (*isend)(stagelink_comm_t *comm,
                                const stagelink_xfer_t *xfer,
                                stagelink_request_t **request);
    stagelink_status_t (*irecv)(stagelink_comm_t *comm,
                                const stagelink_xfer_t *xfer,
                                stagelink_request_t **request);
    /**
     * Posts `count` sends and receives at once (send_forward_recv_backward).
     * Receives are posted before sends, and all posts are nonblocking, so
     * stages calling it in any order cannot deadlock.  On error no request
     * of the batch stays posted: what can be refused (a bad element, a tag
     * in flight, more requests than STAGELINK_MAX_REQUESTS leaves room for)
     * is refused before anything is posted.
     */
    stagelink_status_t (*post_batch)(stagelink_comm_t *comm,
                                     const stagelink_op_t *ops, size_t count,
                                     stagelink_request_t **requests);

    /** *done = 1 once complete; then the request is released. */
    stagelink_status_t (*test)(stagelink_comm_t *comm,
                               stagelink_request_t *request, int *done);
    /** Blocks (without spinning a core) until complete; releases it. */
    stagelink_status_t (*wait)(stagelink_comm_t *comm,
                               stagelink_request_t *request);
    /** Asks for cancellation; the request still has to be completed.  As
     *  in MPI, a message its sender did send for a canceled receive stays
     *  for the next receive with the tag; of one that has begun to land
     *  (a large or device message goes in chunks), the chunks not yet
     *  taken are dropped as they come, never left for a later receive, and
     *  the buffer holds part of it (out of memory, it lands whole).  A gathered receive goes on hearing
     *  its TP peers' parts (shards, statuses or notices, which a live peer
     *  sends whatever this rank does; its own cancel reaches them as a
     *  notice), so none lands in a later receive with the tag and a
     *  collective they issue finds this rank in it: it ends once they
     *  arrive.  For a receive nobody sends to, a peer's part is that
     *  peer's own cancel: cancel it on every TP rank before waiting on any
     *  such receive.  A second cancel gives up on them too. */
    stagelink_status_t (*cancel)(stagelink_comm_t *comm,
                                 stagelink_request_t *request);

    stagelink_status_t (*get_counters)(stagelink_comm_t *comm,
                                       stagelink_counters_t *counters);

    /* End of the original v1 vtable: the entries below were appended and
     * are stubs (STAGELINK_ERR_UNSUPPORTED) for plugins that predate them.
     * Append new entries after the last one, never in between. */

    /**
     * Gives up on the communicator without waiting for any peer: every
     * request in flight completes with STAGELINK_ERR_ABORTED and later posts
     * fail with it.  Callable from any thread (a host's watchdog) while the
     * owning thread is blocked in `wait`, which then returns promptly; the
     * owning thread still calls `comm_finalize`, which then skips the
     * closing barrier, so a peer still inside `comm_init` may fail it (its
     * endpoint to this rank cannot be made).  Must not race with
     * `comm_finalize` itself.
     *
     * After a request completes with STAGELINK_ERR_ABORTED or
     * STAGELINK_ERR_PEER_FAILED (once any rank is known dead, every request
     * in flight does, and later posts are refused), the transport may still
     * write into its buffer until `comm_finalize` returns: keep the buffers
     * of failed requests until then.
     */
    stagelink_status_t (*comm_abort)(stagelink_comm_t *comm);
    /**
     * Health of the communicator, without progressing it: STAGELINK_SUCCESS,
     * STAGELINK_ERR_PEER_FAILED (a peer process or link died; *failed_rank
     * is the first one seen) or STAGELINK_ERR_ABORTED.  *failed_rank is -1
     * where no peer failed.  The sentence is in `last_error`.
     */
    stagelink_status_t (*comm_get_error)(stagelink_comm_t *comm,
                                         int *failed_rank);
    /**
     * What the plugin sees on this machine, one fact a line, without a
     * communicator (for stagelink_info): its transport library and version,
     * the transports and memory types it would use, the GPU runtime's view.
     * Returns the bytes needed (as snprintf).
     */
    size_t (*describe)(char *buf, size_t len);
    /**
     * `wait` in slices: blocks (without spinning a core) until the request
     * completes, or at most `timeout_ms` milliseconds (< 0: no limit, as
     * `wait`; 0: one look, as `test`).  When the slice ends first it
     * returns STAGELINK_IN_PROGRESS, sets no error, and the request stays
     * in flight, so a host can look at its own events (a signal, a
     * watchdog, Python's KeyboardInterrupt) and call again.  The library's
     * deadline (STAGELINK_TIMEOUT) runs across the slices from the first
     * of them; when it passes: STAGELINK_ERR_TIMEOUT, the request still in
     * flight, and the next call starts a new deadline.  Completion
     * releases the request, as with `wait`.
     */
    stagelink_status_t (*wait_for)(stagelink_comm_t *comm,
                                   stagelink_request_t *request,
                                   int timeout_ms);
    /**
     * Another stream to order after a receive: when `request` completes
     * (the wait, or the test that returns done), `stream` (a cudaStream_t)
     * also waits for the received data, as the receive's own stream does,
     * so that a consumer on it reads the whole tensor (torch's
     * Work.wait() so orders the caller's current stream).  Call it while
     * the request is in flight, before that completion; a later call
     * replaces the stream, NULL drops it.  A send, or a receive into host
     * memory, needs nothing: STAGELINK_SUCCESS.
     */
    stagelink_status_t (*order_stream)(stagelink_comm_t *comm,
                                       stagelink_request_t *request,
                                       void *stream);
    /**
     * `post_batch` over an array whose elements are `op_size` bytes apart
     * (the host's sizeof(stagelink_op_t); 0: the v1 baseline's), so that
     * the op can grow: each element is taken by the rule of a struct passed
     * in (see "Growing the ABI").  `post_batch` is this with op_size 0.
     */
    stagelink_status_t (*post_batch_sized)(stagelink_comm_t *comm,
                                           const stagelink_op_t *ops,
                                           size_t count, size_t op_size,
                                           stagelink_request_t **requests);
} stagelink_plugin_v1_t;

#ifdef __cplusplus
}
#endif

#endif /* STAGELINK_STAGELINK_H */
