/*
 * Staging: moves a device buffer through pinned host bounce buffers in
 * chunks, pipelined (on the sender, chunk k+1 is copied device-to-host
 * while chunk k is on the wire; on the receiver, chunk k is copied
 * host-to-device while chunk k+1 arrives), for transports that cannot read
 * device memory (a UCX built without CUDA).
 *
 * The engine only decides what happens next; copying and the network are
 * the caller's, through sl_staging_ops_t, so the same code runs with CUDA
 * copies and UCX in the plugin and with memcpy and a fake wire in tests.
 * Chunks go on the wire in order on one tag: tag matching is ordered
 * between two endpoints, so chunk k of the sender lands in receive k.
 *
 * A transport that can read device memory uses the same chunks "direct"
 * (no bounce buffers, no copies): the wire format depends only on the
 * chunk size, so each side picks its own path.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_STAGING_H
#define SL_STAGING_H

#include "sl_error.h"

#include <stddef.h>
#include <stdint.h>

/** Bounce buffers, split in two so receives never wait behind sends
 *  (a rendezvous send waits for the peer's receive: a shared pool could
 *  fill with sends on both sides and deadlock). */
typedef struct sl_staging_pool {
    size_t  chunk;       /**< bytes per bounce buffer */
    int     nbufs;       /**< per direction */
    void  **bufs[2];     /**< [0] sends, [1] receives */
    int    *free_idx[2]; /**< stack of free buffer indices */
    int     nfree[2];
} sl_staging_pool_t;

typedef enum sl_chunk_state {
    SL_CHUNK_COPYING,    /**< sender: device to host; receiver: host to device */
    SL_CHUNK_COPIED,     /**< sender: waits for the chunks before it to go out */
    SL_CHUNK_ON_WIRE,
    SL_CHUNK_DONE
} sl_chunk_state_t;

/** One chunk in flight; it holds a bounce buffer until done.  Slots do not
 *  move, so a transport may keep a pointer to one as its completion context. */
typedef struct sl_staging_slot {
    struct sl_staging_xfer *x;
    int              in_use;
    size_t           index;  /**< chunk number */
    int              buf;    /**< bounce buffer index; -1 for an empty chunk */
    sl_chunk_state_t state;
    void            *copy;   /**< the copy's token while COPYING */
    void            *net;    /**< the transport's handle while ON_WIRE */
} sl_staging_slot_t;

struct sl_staging_xfer;

typedef struct sl_staging_ops {
    /** Starts an asynchronous copy; *token is polled with copy_test. */
    sl_status_t (*copy_start)(void *ctx, struct sl_staging_xfer *x, void *dst,
                              const void *src, size_t len, int to_device,
                              void **token);
    /** 1 when the copy is complete (token released), 0 while running. */
    int         (*copy_test)(void *ctx, void *token, sl_status_t *status);
    /** Posts the slot's chunk (len bytes at host) on the wire; completion is
     *  reported with sl_staging_net_done(slot, status). */
    sl_status_t (*net_post)(void *ctx, sl_staging_slot_t *slot, void *host,
                            size_t len);
    /**
     * Receiver: 1 when the next chunk of `x` is arriving (a tag probe).  A
     * receive takes a bounce buffer only then, so buffers are held only by
     * data in flight; otherwise receives pre-posted for a later transfer
     * could hold every buffer while the earlier transfer's sender waits for
     * them (a rendezvous send completes only when received).
     */
    int         (*net_ready)(void *ctx, struct sl_staging_xfer *x);
} sl_staging_ops_t;

typedef struct sl_staging_xfer {
    const sl_staging_ops_t *ops;
    void                   *ctx;
    sl_staging_pool_t      *pool;
    int                     recv;       /**< 0: device -> wire, 1: wire -> device */
    int                     direct;     /**< the wire reads/writes `device` itself */
    /** Sender: bytes of `device` ready to go (NULL: all).  A relay points
     *  it at the prefix another transfer has landed, so each chunk moves on
     *  as soon as it arrives. */
    const size_t           *avail;
    char                   *device;     /**< the device bytes */
    size_t                  len;
    size_t                  chunk;      /**< bytes per chunk, <= pool->chunk */
    size_t                  nchunks;
    size_t                  next_copy;  /**< sender: next chunk to copy out */
    size_t                  next_post;  /**< next chunk to put on / take off the wire */
    size_t                  done;       /**< chunks finished */
    sl_status_t             status;     /**< first error */
    int                     in_progress;/**< guards a nested progress call */
    /** Slots in use, by state: a progress call skips the scans that would
     *  find nothing (it runs at every progress of the worker). */
    int                     nstate[SL_CHUNK_DONE + 1];
    sl_staging_slot_t      *slots;      /**< pool->nbufs entries */
    void                   *user;       /**< the caller's */
} sl_staging_xfer_t;

sl_status_t sl_staging_pool_init(sl_staging_pool_t *pool, size_t chunk,
                                 int nbufs, void *(*alloc)(size_t, void *),
                                 void *alloc_ctx, sl_errbuf_t *eb);
void sl_staging_pool_cleanup(sl_staging_pool_t *pool,
                             void (*release)(void *, void *), void *ctx);

/** Prepares a transfer of len (> 0) bytes in chunks of `chunk` bytes (at
 *  most pool->chunk, the bounce buffers' size); slots must hold
 *  pool->nbufs entries (also the number of chunks in flight when direct). */
void sl_staging_xfer_init(sl_staging_xfer_t *x, const sl_staging_ops_t *ops,
                          void *ctx, sl_staging_pool_t *pool, int recv,
                          int direct, void *device, size_t len, size_t chunk,
                          sl_staging_slot_t *slots);

/**
 * Does every step that can be done now: start copies into free buffers,
 * post copied chunks, copy received chunks, release finished buffers.
 * Returns 1 when the transfer is complete (see x->status), else 0.
 *
 * After an error both sides still run to the last chunk, so neither waits
 * for the other: a failed sender sends the rest as empty chunks (the
 * receiver sees them short and fails too), a failed receiver still takes
 * every chunk off the wire but copies nothing.
 */
int sl_staging_progress(sl_staging_xfer_t *x);

/**
 * The peer is gone: nothing more goes on or comes off the wire.  Chunks
 * never posted count as done; those in flight finish when their network
 * operations are canceled (receives) or purged (sends).
 */
void   sl_staging_abandon(sl_staging_xfer_t *x, sl_status_t status);
/** Receiver: bytes of the leading chunks that are complete (in place). */
size_t sl_staging_landed(const sl_staging_xfer_t *x);
/** 1 while a copy of one of its chunks is running (the copy engine's
 *  completion wakes nothing, so a waiter must look). */
int    sl_staging_copying(const sl_staging_xfer_t *x);

/** Bytes in chunk `index`. */
size_t sl_staging_chunk_len(const sl_staging_xfer_t *x, size_t index);

/** The wire finished the slot's chunk (status from the transport). */
void sl_staging_net_done(sl_staging_slot_t *slot, sl_status_t status);

#endif
