/* SPDX-License-Identifier: MIT */
#include "sl_registry.h"

#include <string.h>
#include <unistd.h>

/* This process's id, which the fork handler renews in a child; and every
 * registry, locked across fork so that no child inherits a held lock. */
static pthread_once_t  sl_registry_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t sl_known_lock    = PTHREAD_MUTEX_INITIALIZER;
static sl_registry_t  *sl_known;
static pid_t           sl_self;
static int             sl_atfork_rc;

static void sl_registry_prepare(void)
{
    sl_registry_t *r;

    pthread_mutex_lock(&sl_known_lock);
    for (r = sl_known; r != NULL; r = r->next_known) {
        pthread_mutex_lock(&r->lock);
    }
}

static void sl_registry_parent(void)
{
    sl_registry_t *r;

    for (r = sl_known; r != NULL; r = r->next_known) {
        pthread_mutex_unlock(&r->lock);
    }
    pthread_mutex_unlock(&sl_known_lock);
}

static void sl_registry_child(void)
{
    sl_self = getpid();
    sl_registry_parent();
}

static void sl_registry_start(void)
{
    sl_self      = getpid();
    sl_atfork_rc = pthread_atfork(sl_registry_prepare, sl_registry_parent,
                                  sl_registry_child);
}

sl_status_t sl_registry_add(sl_registry_t *r, const void *handle,
                            sl_errbuf_t *eb)
{
    sl_status_t status = STAGELINK_SUCCESS;

    pthread_once(&sl_registry_once, sl_registry_start);
    if (sl_atfork_rc != 0) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot install the fork handler that keeps a "
                        "forked child off this process's communicators "
                        "(pthread_atfork: %s)", strerror(sl_atfork_rc));
    }
    pthread_mutex_lock(&sl_known_lock);
    if (!r->known) {
        r->known      = 1;
        r->next_known = sl_known;
        sl_known      = r;
    }
    pthread_mutex_unlock(&sl_known_lock);

    pthread_mutex_lock(&r->lock);
    if (r->count == SL_REGISTRY_MAX) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "%d communicators are alive in this process, the "
                          "limit; finalize some first", SL_REGISTRY_MAX);
    } else {
        r->owner[r->count]  = sl_self;
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
            --r->count;
            r->live[i]  = r->live[r->count];
            r->owner[i] = r->owner[r->count];
            found       = 1;
            break;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

/* The process that made `handle`, or 0 when it is not live. */
static pid_t sl_registry_owner(sl_registry_t *r, const void *handle)
{
    pid_t owner = 0;
    int   i;

    pthread_mutex_lock(&r->lock);
    for (i = 0; i < r->count && owner == 0; ++i) {
        if (r->live[i] == handle) {
            owner = r->owner[i];
        }
    }
    pthread_mutex_unlock(&r->lock);
    return owner;
}

int sl_registry_find(sl_registry_t *r, const void *handle)
{
    pid_t owner = (handle != NULL) ? sl_registry_owner(r, handle) : 0;

    return owner != 0 && owner == sl_self;
}

sl_status_t sl_registry_check(sl_registry_t *r, const void *handle,
                              const char *call, sl_errbuf_t *eb)
{
    pid_t owner = (handle != NULL) ? sl_registry_owner(r, handle) : 0;

    if (owner == 0) {
        return sl_error(eb, STAGELINK_ERR_INVALID_STATE,
                        "%s: communicator %p is not live (NULL, finalized "
                        "already, or never initialized)", call, handle);
    }
    if (owner != sl_self) {
        return sl_error(eb, STAGELINK_ERR_INVALID_STATE,
                        "%s: communicator %p belongs to process %d, and this "
                        "process (%d) was forked from it: a child cannot use "
                        "its parent's communicator (the transport, its "
                        "connections and progress thread stay the "
                        "parent's); initialize one in the child", call,
                        handle, (int)owner, (int)getpid());
    }
    return STAGELINK_SUCCESS;
}
