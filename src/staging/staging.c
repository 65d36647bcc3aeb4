/* The staging pipeline's decisions.  SPDX-License-Identifier: MIT */
#include "staging.h"

#include <stdlib.h>
#include <string.h>

sl_status_t sl_staging_pool_init(sl_staging_pool_t *pool, size_t chunk,
                                 int nbufs, void *(*alloc)(size_t, void *),
                                 void *alloc_ctx, sl_errbuf_t *eb)
{
    int d, i;

    memset(pool, 0, sizeof(*pool));
    pool->chunk = chunk;
    pool->nbufs = nbufs;
    for (d = 0; d < 2; ++d) {
        pool->bufs[d]     = calloc((size_t)nbufs, sizeof(void *));
        pool->free_idx[d] = calloc((size_t)nbufs, sizeof(int));
        if (pool->bufs[d] == NULL || pool->free_idx[d] == NULL) {
            return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                            "cannot allocate a staging pool of %d buffers",
                            nbufs);
        }
        for (i = 0; i < nbufs; ++i) {
            pool->bufs[d][i] = alloc(chunk, alloc_ctx);
            if (pool->bufs[d][i] == NULL) {
                return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                                "cannot allocate staging buffer %d of %zu "
                                "pinned bytes; lower STAGELINK_CHUNK "
                                "or STAGELINK_STAGING_BUFFERS", i, chunk);
            }
            pool->free_idx[d][pool->nfree[d]++] = i;
        }
    }
    return STAGELINK_SUCCESS;
}

void sl_staging_pool_cleanup(sl_staging_pool_t *pool,
                             void (*release)(void *, void *), void *ctx)
{
    int d, i;

    for (d = 0; d < 2; ++d) {
        for (i = 0; pool->bufs[d] != NULL && i < pool->nbufs; ++i) {
            if (pool->bufs[d][i] != NULL) {
                release(pool->bufs[d][i], ctx);
            }
        }
        free(pool->bufs[d]);
        free(pool->free_idx[d]);
    }
    memset(pool, 0, sizeof(*pool));
}

void sl_staging_xfer_init(sl_staging_xfer_t *x, const sl_staging_ops_t *ops,
                          void *ctx, sl_staging_pool_t *pool, int recv,
                          int direct, void *device, size_t len,
                          size_t chunk, sl_staging_slot_t *slots)
{
    int i;

    memset(x, 0, sizeof(*x));
    x->ops     = ops;
    x->ctx     = ctx;
    x->pool    = pool;
    x->recv    = recv;
    x->direct  = direct;
    x->device  = device;
    x->len     = len;
    x->chunk   = chunk;
    x->nchunks = (len + chunk - 1) / chunk;
    x->status  = STAGELINK_SUCCESS;
    x->slots   = slots;
    for (i = 0; i < pool->nbufs; ++i) {
        slots[i].x      = x;
        slots[i].in_use = 0;
    }
}

size_t sl_staging_chunk_len(const sl_staging_xfer_t *x, size_t index)
{
    size_t off = index * x->chunk;

    return (x->len - off < x->chunk) ? x->len - off : x->chunk;
}

/* Where the slot's chunk is on the wire side: in place when direct. */
static void *sl_slot_host(const sl_staging_slot_t *s)
{
    if (s->x->direct) {
        return s->x->device + s->index * s->x->chunk;
    }
    return (s->buf < 0) ? NULL : s->x->pool->bufs[s->x->recv][s->buf];
}

static void sl_staging_fail(sl_staging_xfer_t *x, sl_status_t status)
{
    if (x->status == STAGELINK_SUCCESS) {
        x->status = status;
    }
}

/* Every change of an in-use slot's state (take and release count their
 * own), so that x->nstate stays true. */
static void sl_slot_set(sl_staging_slot_t *s, sl_chunk_state_t state)
{
    --s->x->nstate[s->state];
    ++s->x->nstate[state];
    s->state = state;
}

/* A slot for chunk `index`, with a bounce buffer unless `empty`. */
static sl_staging_slot_t *sl_slot_take(sl_staging_xfer_t *x, size_t index,
                                       int empty, sl_chunk_state_t state)
{
    sl_staging_pool_t *pool = x->pool;
    int                i, used;

    for (i = 0, used = 0; i <= SL_CHUNK_DONE; ++i) {
        used += x->nstate[i];
    }
    /* A full window is the common case: no scan for a free slot then. */
    if ((!empty && pool->nfree[x->recv] == 0) || used == pool->nbufs) {
        return NULL;
    }
    for (i = 0; x->slots[i].in_use; ++i) {
    }
    x->slots[i].in_use = 1;
    x->slots[i].index  = index;
    x->slots[i].buf    = empty ? -1 : pool->free_idx[x->recv][--pool->nfree[x->recv]];
    x->slots[i].state  = state;
    x->slots[i].copy   = NULL;
    x->slots[i].net    = NULL;
    ++x->nstate[state];
    return &x->slots[i];
}

static void sl_slot_release(sl_staging_slot_t *s)
{
    sl_staging_pool_t *pool = s->x->pool;

    if (s->buf >= 0) {
        pool->free_idx[s->x->recv][pool->nfree[s->x->recv]++] = s->buf;
    }
    s->in_use = 0;
    --s->x->nstate[s->state];
    ++s->x->done;
}

static sl_staging_slot_t *sl_slot_of(sl_staging_xfer_t *x, size_t index)
{
    int i;

    for (i = 0; i < x->pool->nbufs; ++i) {
        if (x->slots[i].in_use && x->slots[i].index == index) {
            return &x->slots[i];
        }
    }
    return NULL;
}

static void sl_slot_post(sl_staging_slot_t *s, size_t len)
{
    sl_status_t st;

    sl_slot_set(s, SL_CHUNK_ON_WIRE);
    st = s->x->ops->net_post(s->x->ctx, s, sl_slot_host(s), len);
    if (st != STAGELINK_SUCCESS) {
        sl_staging_fail(s->x, st);
        sl_slot_set(s, SL_CHUNK_DONE);
    }
}

static void sl_slot_copy(sl_staging_slot_t *s, void *dst, const void *src,
                         size_t len)
{
    sl_status_t st = s->x->ops->copy_start(s->x->ctx, s->x, dst, src, len,
                                           s->x->recv, &s->copy);

    sl_slot_set(s, SL_CHUNK_COPYING);
    if (st != STAGELINK_SUCCESS) {
        sl_staging_fail(s->x, st);
        sl_slot_set(s, s->x->recv ? SL_CHUNK_DONE : SL_CHUNK_COPIED);
    }
}

static void sl_staging_start(sl_staging_xfer_t *x)
{
    sl_staging_slot_t *s;

    if (x->recv) {
        /* In chunk order, for chunks on their way (see net_ready); direct
         * receives hold no buffer and are posted ahead. */
        while (x->next_post < x->nchunks &&
               (x->direct || x->ops->net_ready(x->ctx, x)) &&
               (s = sl_slot_take(x, x->next_post, x->direct,
                                 SL_CHUNK_ON_WIRE)) != NULL) {
            ++x->next_post;
            sl_slot_post(s, sl_staging_chunk_len(x, s->index));
        }
        return;
    }
    while (x->next_copy < x->nchunks) {
        /* A relayed chunk waits until it has landed (failed: it goes empty). */
        if (x->status == STAGELINK_SUCCESS && x->avail != NULL &&
            *x->avail < x->next_copy * x->chunk +
                            sl_staging_chunk_len(x, x->next_copy)) {
            return;
        }
        if (x->status != STAGELINK_SUCCESS || x->direct) {
            /* Direct chunks need no copy; after a failure the rest go out
             * empty, so the receiver is not left waiting. */
            if ((s = sl_slot_take(x, x->next_copy, 1, SL_CHUNK_COPIED)) == NULL) {
                return;
            }
        } else {
            if ((s = sl_slot_take(x, x->next_copy, 0, SL_CHUNK_COPYING)) == NULL) {
                return;
            }
            sl_slot_copy(s, sl_slot_host(s),
                         x->device + s->index * x->chunk,
                         sl_staging_chunk_len(x, s->index));
        }
        ++x->next_copy;
    }
}

static void sl_staging_copies(sl_staging_xfer_t *x)
{
    sl_status_t st;
    int         i;

    for (i = 0; i < x->pool->nbufs && x->nstate[SL_CHUNK_COPYING] > 0; ++i) {
        sl_staging_slot_t *s = &x->slots[i];

        st = STAGELINK_SUCCESS;
        if (s->in_use && s->state == SL_CHUNK_COPYING &&
            x->ops->copy_test(x->ctx, s->copy, &st)) {
            s->copy = NULL;
            if (st != STAGELINK_SUCCESS) {
                sl_staging_fail(x, st);
            }
            /* A received chunk is home once copied; a sent one goes out. */
            sl_slot_set(s, x->recv ? SL_CHUNK_DONE : SL_CHUNK_COPIED);
        }
    }
}

/* The sender posts strictly in chunk order: the receiver matches in order. */
static void sl_staging_post_copied(sl_staging_xfer_t *x)
{
    sl_staging_slot_t *s;

    while (!x->recv && x->next_post < x->next_copy &&
           (s = sl_slot_of(x, x->next_post)) != NULL &&
           s->state == SL_CHUNK_COPIED) {
        ++x->next_post;
        /* Once failed, chunks go out empty, also ones copied before. */
        sl_slot_post(s, (x->status == STAGELINK_SUCCESS &&
                         (s->buf >= 0 || x->direct))
                            ? sl_staging_chunk_len(x, s->index) : 0);
    }
}

void sl_staging_net_done(sl_staging_slot_t *s, sl_status_t status)
{
    sl_staging_xfer_t *x = s->x;

    if (status != STAGELINK_SUCCESS) {
        sl_staging_fail(x, status);
    }
    if (!x->recv || x->direct || x->status != STAGELINK_SUCCESS) {
        sl_slot_set(s, SL_CHUNK_DONE);
        return;
    }
    sl_slot_copy(s, x->device + s->index * x->chunk, sl_slot_host(s),
                 sl_staging_chunk_len(x, s->index));
}

void sl_staging_abandon(sl_staging_xfer_t *x, sl_status_t status)
{
    size_t *next = x->recv ? &x->next_post : &x->next_copy;

    sl_staging_fail(x, status);
    x->done += x->nchunks - *next;
    *next    = x->nchunks;
}

int sl_staging_copying(const sl_staging_xfer_t *x)
{
    return x->nstate[SL_CHUNK_COPYING] > 0;
}

size_t sl_staging_landed(const sl_staging_xfer_t *x)
{
    size_t first = x->next_post, bytes;
    int    i;

    /* The lowest chunk not yet home bounds the prefix. */
    for (i = 0; i < x->pool->nbufs; ++i) {
        if (x->slots[i].in_use && x->slots[i].state != SL_CHUNK_DONE &&
            x->slots[i].index < first) {
            first = x->slots[i].index;
        }
    }
    bytes = first * x->chunk;
    return (bytes < x->len) ? bytes : x->len;
}

int sl_staging_progress(sl_staging_xfer_t *x)
{
    int i;

    /* A transport may complete a chunk inside the post that the loop below
     * makes, and progress from there: the outer call finishes the work. */
    if (x->in_progress) {
        return 0;
    }
    x->in_progress = 1;
    do {
        sl_staging_copies(x);
        sl_staging_post_copied(x);
        for (i = 0; i < x->pool->nbufs && x->nstate[SL_CHUNK_DONE] > 0; ++i) {
            if (x->slots[i].in_use && x->slots[i].state == SL_CHUNK_DONE) {
                sl_slot_release(&x->slots[i]);
            }
        }
        sl_staging_start(x);
        sl_staging_post_copied(x);
        /* A chunk that completed inside its post (a short send, a failure
         * notice) reports no event to wake this side later: its slot
         * takes the next chunk now.  Each pass releases a slot, so this
         * ends within nchunks passes. */
    } while (x->nstate[SL_CHUNK_DONE] > 0);
    x->in_progress = 0;
    return x->done == x->nchunks;
}
