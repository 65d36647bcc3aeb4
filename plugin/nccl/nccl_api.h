/*
 * NCCL, opened at run time: the functions stagelink calls, resolved from
 * libnccl.so.2 (STAGELINK_NCCL_LIBRARY, else the dynamic loader's search,
 * else the directory NCCL was found in at build time).  A plugin that may
 * use NCCL therefore still loads where NCCL is absent, and says why when a
 * communicator needs it.  SPDX-License-Identifier: MIT
 */
#ifndef SL_NCCL_API_H
#define SL_NCCL_API_H

#include "sl_error.h"

#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>

typedef struct sl_nccl_api {
    ncclResult_t (*GetVersion)(int *version);
    ncclResult_t (*GetUniqueId)(ncclUniqueId *id);
    ncclResult_t (*CommInitRank)(ncclComm_t *comm, int nranks,
                                 ncclUniqueId id, int rank);
    ncclResult_t (*CommInitRankConfig)(ncclComm_t *comm, int nranks,
                                       ncclUniqueId id, int rank,
                                       ncclConfig_t *config);
    ncclResult_t (*CommGetAsyncError)(ncclComm_t comm, ncclResult_t *state);
    ncclResult_t (*CommDestroy)(ncclComm_t comm);
    ncclResult_t (*CommAbort)(ncclComm_t comm);
    ncclResult_t (*AllGather)(const void *send, void *recv, size_t count,
                              ncclDataType_t type, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*Broadcast)(const void *send, void *recv, size_t count,
                              ncclDataType_t type, int root, ncclComm_t comm,
                              cudaStream_t stream);
    ncclResult_t (*Send)(const void *buf, size_t count, ncclDataType_t type,
                         int peer, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*Recv)(void *buf, size_t count, ncclDataType_t type,
                         int peer, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    const char  *(*GetErrorString)(ncclResult_t result);
    const char  *(*GetLastError)(ncclComm_t comm);
    char          path[256]; /**< where it was loaded from */
} sl_nccl_api_t;

/** The process-wide table, loaded on first use. */
sl_status_t sl_nccl_api_get(const sl_nccl_api_t **api, sl_errbuf_t *eb);

/**
 * Rebuilds a tensor of `nbytes` split in `parts` shards (sl_shard rules) in
 * place on `stream`: ncclAllGather when the shards are equal, else one
 * ncclBroadcast per shard in a group.
 */
sl_status_t sl_nccl_allgather_inplace(const sl_nccl_api_t *api, ncclComm_t comm,
                                      void *buf, size_t nbytes,
                                      size_t elem_size, int parts, int index,
                                      cudaStream_t stream, sl_errbuf_t *eb);

/** One communicator for sl_nccl_comms_open: `rank` of `nranks` with `id`. */
typedef struct sl_nccl_open {
    ncclComm_t  *comm;
    int          nranks, rank;
    ncclUniqueId id;
    const char  *what; /**< its name in sentences */
} sl_nccl_open_t;

/**
 * Non-blocking communicators (NCCL's config blocking = 0), their inits
 * started in one group, so that a chain of them (stage boundaries, TP
 * groups) cannot wait in a cycle, and polled until done: past `deadline`
 * (0: none) or on any failure every one is aborted and set NULL, and the
 * call fails (TIMEOUT naming the one not done) instead of hanging on a
 * peer that never joins.
 */
sl_status_t sl_nccl_comms_open(const sl_nccl_api_t *api, sl_nccl_open_t *opens,
                               int n, double deadline, sl_errbuf_t *eb);

/** Waits out ncclInProgress after a call on a non-blocking communicator
 *  (NCCL's rule before the next call); its error, TIMEOUT, or ABORTED as
 *  soon as *stop (another thread's abort; NULL: none) is set.  Each look
 *  holds `mu` (NULL: none), under which an abort sets *stop before it
 *  takes the handle away, so a look never uses a handle NCCL freed. */
sl_status_t sl_nccl_settle(const sl_nccl_api_t *api, ncclComm_t comm,
                           double deadline, const atomic_int *stop,
                           pthread_mutex_t *mu, const char *what,
                           sl_errbuf_t *eb);

/** The asynchronous error of `comm` (named `what`: a peer died, a
 *  network failed) as a status with NCCL's sentence; SUCCESS while there
 *  is none. */
sl_status_t sl_nccl_async_error(const sl_nccl_api_t *api, ncclComm_t comm,
                                const char *what, sl_errbuf_t *eb);

/**
 * A thread of a communicator's own that makes its NCCL enqueue calls.
 * NCCL's groups are per thread: a collective called on the host's thread
 * inside the host's own ncclGroupStart/End joins that group and launches
 * only at its end, after the call that issued it returned.  The caller
 * blocks until the job returns, so the job's place among the caller's
 * calls is unchanged.
 */
typedef struct sl_nccl_thread sl_nccl_thread_t;
typedef sl_status_t (*sl_nccl_job_t)(void *arg, sl_errbuf_t *eb);
sl_status_t sl_nccl_thread_start(sl_nccl_thread_t **out, sl_errbuf_t *eb);
/** Runs `job(arg, eb)` on the thread and returns its status. */
sl_status_t sl_nccl_thread_run(sl_nccl_thread_t *t, sl_nccl_job_t job,
                               void *arg, sl_errbuf_t *eb);
void        sl_nccl_thread_stop(sl_nccl_thread_t *t);

/** Turns an NCCL result into a status with NCCL's own sentence. */
sl_status_t sl_nccl_check(const sl_nccl_api_t *api, ncclResult_t result,
                          ncclComm_t comm, const char *what, sl_errbuf_t *eb);

#endif
