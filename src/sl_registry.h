/*
 * The live handles of one plugin: a finalized or foreign handle gets a
 * clear status instead of a use-after-free.  Entries are compared, never
 * dereferenced.  SPDX-License-Identifier: MIT
 */
#ifndef SL_REGISTRY_H
#define SL_REGISTRY_H

#include "sl_error.h"

#include <pthread.h>

#define SL_REGISTRY_MAX 256

typedef struct sl_registry {
    pthread_mutex_t lock;
    const void     *live[SL_REGISTRY_MAX];
    int             count;
} sl_registry_t;

#define SL_REGISTRY_INITIALIZER {PTHREAD_MUTEX_INITIALIZER, {0}, 0}

sl_status_t sl_registry_add(sl_registry_t *r, const void *handle,
                            sl_errbuf_t *eb);
int         sl_registry_remove(sl_registry_t *r, const void *handle);
int         sl_registry_find(sl_registry_t *r, const void *handle);
/** INVALID_STATE with a sentence naming `call` when `handle` is not live. */
sl_status_t sl_registry_check(sl_registry_t *r, const void *handle,
                              const char *call, sl_errbuf_t *eb);

#endif
