/*
 * The live handles of one plugin: a finalized or foreign handle gets a
 * clear status instead of a use-after-free, and so does a handle a forked
 * child inherited (its worker, sockets and progress thread stay the
 * parent's).  Entries are compared, never dereferenced.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_REGISTRY_H
#define SL_REGISTRY_H

#include "sl_error.h"

#include <pthread.h>
#include <sys/types.h>

#define SL_REGISTRY_MAX 256

typedef struct sl_registry {
    pthread_mutex_t     lock;
    const void         *live[SL_REGISTRY_MAX];
    pid_t               owner[SL_REGISTRY_MAX];     /**< the process that made it */
    unsigned char       inherited[SL_REGISTRY_MAX]; /**< made before a fork */
    int                 count;
    struct sl_registry *next_known; /**< the fork handlers' list */
    int                 known;
} sl_registry_t;

#define SL_REGISTRY_INITIALIZER \
    {PTHREAD_MUTEX_INITIALIZER, {0}, {0}, {0}, 0, NULL, 0}

sl_status_t sl_registry_add(sl_registry_t *r, const void *handle,
                            sl_errbuf_t *eb);
int         sl_registry_remove(sl_registry_t *r, const void *handle);
/** Whether `handle` is live and this process made it. */
int         sl_registry_find(sl_registry_t *r, const void *handle);
/** INVALID_STATE with a sentence naming `call` when `handle` is not live,
 *  or was made by the process this one was forked from. */
sl_status_t sl_registry_check(sl_registry_t *r, const void *handle,
                              const char *call, sl_errbuf_t *eb);

#endif
