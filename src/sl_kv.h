/*
 * A key-value store the bootstrap exchanges through: the host's store
 * callbacks, torchrun's agent store (sl_torch_store.c) or PMIx
 * (sl_pmix.c).  A get waits for its key until the deadline, so each rank
 * reads only the keys of the ranks it talks to.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_KV_H
#define SL_KV_H

#include "sl_error.h"
#include "sl_sock.h"

#include <stddef.h>

typedef struct sl_kv_ops {
    const char *name; /**< in errors and stagelink_info: "torch-store" ... */
    sl_status_t (*set)(void *ctx, const char *key, const void *buf,
                       size_t len, double deadline, sl_errbuf_t *eb);
    /** Waits for `key` until `deadline` (0: none), calling `progress`
     *  while it waits where the store allows; *size is the value's
     *  length, of which at most `capacity` bytes are copied. */
    sl_status_t (*get)(void *ctx, const char *key, void *buf,
                       size_t capacity, size_t *size, double deadline,
                       const sl_sock_progress_t *progress, sl_errbuf_t *eb);
    /** Returns once every rank of the job reached it (PMIx's fence, where a
     *  peer's keys may leave with the peer); NULL: the bootstrap meets
     *  through keys. */
    sl_status_t (*barrier)(void *ctx, double deadline, sl_errbuf_t *eb);
    void (*close)(void *ctx);
} sl_kv_ops_t;

typedef struct sl_kv {
    const sl_kv_ops_t *ops; /**< NULL: no store */
    void              *ctx;
} sl_kv_t;

/** The host's store callbacks as a store (ctx is `host`, kept by the caller). */
typedef struct sl_kv_host {
    stagelink_store_set_fn_t set;
    stagelink_store_get_fn_t get;
    void                    *ctx;
} sl_kv_host_t;

void sl_kv_host_open(sl_kv_t *kv, sl_kv_host_t *host);

void sl_kv_close(sl_kv_t *kv);

#endif
