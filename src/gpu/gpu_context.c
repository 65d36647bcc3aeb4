/*
 * The calling thread's CUDA context around a plugin call: the
 * communicator's made current on entry, the caller's given back exactly on
 * return (its own context, a primary one, or none), for any GPU runtime
 * of the ops table.  SPDX-License-Identifier: MIT
 */
#include "gpu.h"

int sl_gpu_has_contexts(const sl_gpu_ops_t *g)
{
    return g != NULL && g->device_current != NULL && g->device_set != NULL &&
           g->context_current != NULL && g->context_set != NULL;
}

sl_status_t sl_gpu_context_of(const sl_gpu_ops_t *g, int device, void **ctx,
                              sl_errbuf_t *eb)
{
    void       *saved = g->context_current();
    sl_status_t status = g->device_set(device, eb);
    sl_errbuf_t drop;

    *ctx = (status == STAGELINK_SUCCESS) ? g->context_current() : NULL;
    g->context_set(saved, &drop); /* the set's own failure is the news */
    return status;
}

void sl_gpu_enter(const sl_gpu_ops_t *g, void *ctx, sl_gpu_entry_t *e,
                  sl_errbuf_t *eb)
{
    e->gpu   = sl_gpu_has_contexts(g) ? g : NULL;
    e->saved = (e->gpu != NULL) ? g->context_current() : NULL;
    if (e->gpu != NULL && ctx != NULL && e->saved != ctx) {
        /* A failure shows in the call's own CUDA work, with its sentence. */
        g->context_set(ctx, eb);
    }
}

void sl_gpu_leave(sl_gpu_entry_t *e)
{
    sl_errbuf_t drop;

    /* Whatever the call made current (an adopted device's, CUDA's
     * implicit one): the caller's again. */
    if (e->gpu != NULL && e->gpu->context_current() != e->saved) {
        e->gpu->context_set(e->saved, &drop);
    }
}
