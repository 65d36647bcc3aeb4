/* SPDX-License-Identifier: MIT */
#include "sl_registry.h"

sl_status_t sl_registry_add(sl_registry_t *r, const void *handle,
                            sl_errbuf_t *eb)
{
    sl_status_t status = STAGELINK_SUCCESS;

    pthread_mutex_lock(&r->lock);
    if (r->count == SL_REGISTRY_MAX) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "%d communicators are alive in this process, the "
                          "limit; finalize some first", SL_REGISTRY_MAX);
    } else {
        r->live[r->count++] = handle;
    }
    pthread_mutex_unlock(&r->lock);
    return status;
}

int sl_registry_remove(sl_registry_t *r, const void *handle)
{
    int i, found = 0;

    pthread_mutex_lock(&r->lock);
    for (i = 0; i < r->count; ++i) {
        if (r->live[i] == handle) {
            r->live[i] = r->live[--r->count];
            found      = 1;
            break;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

int sl_registry_find(sl_registry_t *r, const void *handle)
{
    int i, found = 0;

    pthread_mutex_lock(&r->lock);
    for (i = 0; i < r->count && !found; ++i) {
        found = (r->live[i] == handle);
    }
    pthread_mutex_unlock(&r->lock);
    return handle != NULL && found;
}

sl_status_t sl_registry_check(sl_registry_t *r, const void *handle,
                              const char *call, sl_errbuf_t *eb)
{
    if (!sl_registry_find(r, handle)) {
        return sl_error(eb, STAGELINK_ERR_INVALID_STATE,
                        "%s: communicator %p is not live (NULL, finalized "
                        "already, or never initialized)", call, handle);
    }
    return STAGELINK_SUCCESS;
}
