/* SPDX-License-Identifier: MIT */
#include "sl_registry.h"

#include <string.h>
#include <unistd.h>

/* Every registry, locked across fork so that no child inherits a held
 * lock, and whose entries a child marks inherited (by a flag, not by pid:
 * a pid may be reused). */
static pthread_once_t  sl_registry_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t sl_known_lock    = PTHREAD_MUTEX_INITIALIZER;
static sl_registry_t  *sl_known;
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
    sl_registry_t *r;

    for (r = sl_known; r != NULL; r = r->next_known) {
        memset(r->inherited, 1, (size_t)r->count);
    }
    sl_registry_parent();
}

static void sl_registry_start(void)
{
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
        r->owner[r->count]     = getpid();
        r->inherited[r->count] = 0;
        r->live[r->count++]    = handle;
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
            r->live[i]      = r->live[r->count];
            r->owner[i]     = r->owner[r->count];
            r->inherited[i] = r->inherited[r->count];
            found           = 1;
            break;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

/* What `handle` is to this process; *owner: the process that made it. */
typedef enum {
    SL_ENTRY_NONE,
    SL_ENTRY_OWN,
    SL_ENTRY_INHERITED
} sl_entry_t;

static sl_entry_t sl_registry_state(sl_registry_t *r, const void *handle,
                                    pid_t *owner)
{
    sl_entry_t state = SL_ENTRY_NONE;
    int        i;

    pthread_mutex_lock(&r->lock);
    for (i = 0; i < r->count && state == SL_ENTRY_NONE && handle != NULL;
         ++i) {
        if (r->live[i] == handle) {
            state  = r->inherited[i] ? SL_ENTRY_INHERITED : SL_ENTRY_OWN;
            *owner = r->owner[i];
        }
    }
    pthread_mutex_unlock(&r->lock);
    return state;
}

int sl_registry_find(sl_registry_t *r, const void *handle)
{
    pid_t owner;

    return sl_registry_state(r, handle, &owner) == SL_ENTRY_OWN;
}

sl_status_t sl_registry_check(sl_registry_t *r, const void *handle,
                              const char *call, sl_errbuf_t *eb)
{
    pid_t      owner = 0;
    sl_entry_t state = sl_registry_state(r, handle, &owner);

    if (state == SL_ENTRY_NONE) {
        return sl_error(eb, STAGELINK_ERR_INVALID_STATE,
                        "%s: communicator %p is not live (NULL, finalized "
                        "already, or never initialized)", call, handle);
    }
    if (state == SL_ENTRY_INHERITED) {
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
