/*
 * The staging pipeline with host memory standing in for device memory:
 * copies are memcpy that finish a few polls later, the wire is an in-process
 * queue with rendezvous semantics (a send completes only when received).
 * Covers chunk boundaries, odd sizes, a pool of one buffer, several
 * transfers sharing a pool in opposite posting orders, overlap of copy and
 * wire, sends that complete inside their post, a failing copy, and a
 * failing post followed by the peer's loss.
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "staging.h"

#include <stdlib.h>
#include <string.h>

#define MAX_MSGS 4096

typedef struct fake_copy {
    void       *dst;
    const void *src;
    size_t      len;
    int         polls_left;
    int         fail;
} fake_copy_t;

/* One message on the fake wire: chunk `index` of transfer `stream`. */
typedef struct msg {
    int                stream;
    size_t             index;
    const void        *data;
    size_t             len;
    sl_staging_slot_t *sender;
    int                matched;
} msg_t;

typedef struct world {
    msg_t  msgs[MAX_MSGS];
    int    nmsgs;
    int    copies_running, wire_running, overlap_seen;
    int    fail_copy_at; /* fail the n-th copy (0: never) */
    int    copies_started;
    int    fail_post_at; /* fail the n-th post (0: never) */
    int    posts;
    /* posted receives waiting for their message */
    struct { sl_staging_slot_t *slot; size_t index; void *host; size_t len; int stream; } posted[MAX_MSGS];
    int    nposted;
} world_t;

static world_t W;

static int stream_of(const sl_staging_xfer_t *x)
{
    return (int)(intptr_t)x->user;
}

static sl_status_t f_copy_start(void *ctx, sl_staging_xfer_t *x, void *dst,
                                const void *src, size_t len, int to_device,
                                void **token)
{
    fake_copy_t *c = malloc(sizeof(*c));

    (void)ctx, (void)x, (void)to_device;
    c->dst = dst, c->src = src, c->len = len;
    c->polls_left = 2;
    c->fail = (++W.copies_started == W.fail_copy_at);
    *token = c;
    ++W.copies_running;
    W.overlap_seen |= (W.wire_running > 0);
    return STAGELINK_SUCCESS;
}

static int f_copy_test(void *ctx, void *token, sl_status_t *status)
{
    fake_copy_t *c = token;

    (void)ctx;
    if (--c->polls_left > 0) {
        return 0;
    }
    memcpy(c->dst, c->src, c->len);
    *status = c->fail ? STAGELINK_ERR_INTERNAL : STAGELINK_SUCCESS;
    free(c);
    --W.copies_running;
    return 1;
}

static void match(void)
{
    int i, j;

    for (i = 0; i < W.nposted; ++i) {
        for (j = 0; j < W.nmsgs; ++j) {
            msg_t *m = &W.msgs[j];

            if (!m->matched && m->stream == W.posted[i].stream &&
                m->index == W.posted[i].index) {
                /* A short chunk is what a failed sender sends. */
                int short_chunk = (m->len != W.posted[i].len);

                if (!short_chunk) {
                    memcpy(W.posted[i].host, m->data, m->len);
                }
                m->matched = 1;
                W.wire_running -= 2;
                sl_staging_net_done(m->sender, STAGELINK_SUCCESS);
                sl_staging_net_done(W.posted[i].slot,
                                    short_chunk ? STAGELINK_ERR_SIZE_MISMATCH
                                                : STAGELINK_SUCCESS);
                W.posted[i] = W.posted[--W.nposted];
                --i;
                break;
            }
        }
    }
}

static sl_status_t f_net_post(void *ctx, sl_staging_slot_t *slot, void *host,
                              size_t len)
{
    sl_staging_xfer_t *x     = slot->x;
    size_t             index = slot->index;

    (void)ctx;
    if (++W.posts == W.fail_post_at) {
        return STAGELINK_ERR_TRANSPORT;
    }
    ++W.wire_running;
    W.overlap_seen |= (W.copies_running > 0);
    if (x->recv) {
        W.posted[W.nposted].slot   = slot;
        W.posted[W.nposted].index  = index;
        W.posted[W.nposted].host   = host;
        W.posted[W.nposted].len    = len;
        W.posted[W.nposted].stream = stream_of(x);
        ++W.nposted;
    } else {
        CHECK(W.nmsgs < MAX_MSGS, "fake wire full");
        W.msgs[W.nmsgs++] = (msg_t){stream_of(x), index, host, len, slot, 0};
    }
    return STAGELINK_SUCCESS;
}

static int f_net_ready(void *ctx, sl_staging_xfer_t *x)
{
    int j;

    (void)ctx;
    for (j = 0; j < W.nmsgs; ++j) {
        if (!W.msgs[j].matched && W.msgs[j].stream == stream_of(x) &&
            W.msgs[j].index == x->next_post) {
            return 1;
        }
    }
    return 0;
}

static const sl_staging_ops_t ops = {f_copy_start, f_copy_test, f_net_post,
                                     f_net_ready};

static void *a_alloc(size_t n, void *ctx)
{
    (void)ctx;
    return malloc(n);
}

static void a_free(void *p, void *ctx)
{
    (void)ctx;
    free(p);
}

/* The counts that let progress skip its scans match the slots. */
static void counts_true(const sl_staging_xfer_t *x)
{
    int n[SL_CHUNK_DONE + 1] = {0}, i, st;

    for (i = 0; i < x->pool->nbufs; ++i) {
        if (x->slots[i].in_use) {
            ++n[x->slots[i].state];
        }
    }
    for (st = 0; st <= SL_CHUNK_DONE; ++st) {
        CHECK(n[st] == x->nstate[st], "%s: %d slots in state %d, counted %d",
              x->recv ? "receive" : "send", n[st], st, x->nstate[st]);
    }
    CHECK(sl_staging_copying(x) == (n[SL_CHUNK_COPYING] > 0),
          "sl_staging_copying says %d with %d slots copying",
          sl_staging_copying(x), n[SL_CHUNK_COPYING]);
}

/*
 * n transfers of `len` bytes from a sender pool to a receiver pool, the
 * receiver's in reverse order; returns the first status.  The bounce
 * buffers are larger than the chunk, as a pool serves messages of every
 * chunk size, so any offset taken from the pool's size shows as wrong bytes.
 */
static sl_status_t run_modes(size_t len, size_t chunk, int nbufs, int n,
                             int fail_copy_at, int send_direct, int recv_direct)
{
    sl_staging_pool_t  sp, rp;
    sl_staging_xfer_t  sx[4], rx[4];
    sl_staging_slot_t  sslots[4][8], rslots[4][8];
    unsigned char     *src[4], *dst[4];
    sl_errbuf_t        eb;
    sl_status_t        status = STAGELINK_SUCCESS;
    int                i, rounds = 0, done;
    size_t             b;

    memset(&W, 0, sizeof(W));
    W.fail_copy_at = fail_copy_at;
    CHECK(sl_staging_pool_init(&sp, chunk + 64, nbufs, a_alloc, NULL, &eb) == 0, "%s", eb.msg);
    CHECK(sl_staging_pool_init(&rp, chunk + 64, nbufs, a_alloc, NULL, &eb) == 0, "%s", eb.msg);
    for (i = 0; i < n; ++i) {
        src[i] = malloc(len);
        dst[i] = calloc(1, len);
        for (b = 0; b < len; ++b) {
            src[i][b] = (unsigned char)(b * 31 + (size_t)i * 7 + 1);
        }
        sl_staging_xfer_init(&sx[i], &ops, NULL, &sp, 0, send_direct, src[i],
                             len, chunk, sslots[i]);
        sl_staging_xfer_init(&rx[n - 1 - i], &ops, NULL, &rp, 1, recv_direct,
                             dst[i], len, chunk, rslots[n - 1 - i]);
        sx[i].user         = (void *)(intptr_t)i;
        rx[n - 1 - i].user = (void *)(intptr_t)i;
    }
    do {
        done = 1;
        for (i = 0; i < n; ++i) {
            done &= sl_staging_progress(&rx[i]);
            done &= sl_staging_progress(&sx[i]);
        }
        match();
        for (i = 0; i < n; ++i) {
            counts_true(&rx[i]);
            counts_true(&sx[i]);
        }
    } while (!done && ++rounds < 100000);
    CHECK(done, "len %zu chunk %zu bufs %d n %d: not done after %d rounds "
          "(deadlock)", len, chunk, nbufs, n, rounds);
    for (i = 0; i < n; ++i) {
        if (sx[i].status != STAGELINK_SUCCESS) status = sx[i].status;
        if (rx[n - 1 - i].status != STAGELINK_SUCCESS) status = rx[n - 1 - i].status;
        if (fail_copy_at == 0) {
            CHECK(memcmp(src[i], dst[i], len) == 0, "len %zu chunk %zu bufs %d: "
                  "transfer %d arrived wrong", len, chunk, nbufs, i);
        }
        free(src[i]);
        free(dst[i]);
    }
    CHECK(sp.nfree[0] == nbufs && rp.nfree[1] == nbufs,
          "buffers leaked: %d/%d send, %d/%d receive free", sp.nfree[0], nbufs,
          rp.nfree[1], nbufs);
    sl_staging_pool_cleanup(&sp, a_free, NULL);
    sl_staging_pool_cleanup(&rp, a_free, NULL);
    return status;
}

static sl_status_t run(size_t len, size_t chunk, int nbufs, int n,
                       int fail_copy_at)
{
    return run_modes(len, chunk, nbufs, n, fail_copy_at, 0, 0);
}

/*
 * A relay: A sends to B, and B forwards to C each chunk as it lands (its
 * send gated by what its receive has landed), the way a TP rank forwards
 * its shard to its peers.  C must get every byte, and B's forward must
 * have started before B's receive finished (overlap).
 */
static void run_relay(size_t len, size_t chunk, int nbufs, int staged)
{
    sl_staging_pool_t pa, pb, pc;
    sl_staging_xfer_t a, b_in, b_out, c;
    sl_staging_slot_t sa[8], sbi[8], sbo[8], sc[8];
    unsigned char    *src = malloc(len), *mid = calloc(1, len), *dst = calloc(1, len);
    size_t            landed = 0, i;
    sl_errbuf_t       eb;
    int               rounds = 0, done, overlap = 0, in_done = 0;

    memset(&W, 0, sizeof(W));
    for (i = 0; i < len; ++i) {
        src[i] = (unsigned char)(i * 7 + 3);
    }
    /* Bounce buffers above the chunk, as in run_modes. */
    sl_staging_pool_init(&pa, chunk + 64, nbufs, a_alloc, NULL, &eb);
    sl_staging_pool_init(&pb, chunk + 64, nbufs, a_alloc, NULL, &eb);
    sl_staging_pool_init(&pc, chunk + 64, nbufs, a_alloc, NULL, &eb);
    sl_staging_xfer_init(&a, &ops, NULL, &pa, 0, !staged, src, len, chunk, sa);
    sl_staging_xfer_init(&b_in, &ops, NULL, &pb, 1, !staged, mid, len, chunk, sbi);
    sl_staging_xfer_init(&b_out, &ops, NULL, &pb, 0, !staged, mid, len, chunk, sbo);
    sl_staging_xfer_init(&c, &ops, NULL, &pc, 1, !staged, dst, len, chunk, sc);
    a.user = b_in.user = (void *)(intptr_t)1;
    b_out.user = c.user = (void *)(intptr_t)2;
    b_out.avail = &landed;
    do {
        done = sl_staging_progress(&c);
        done &= sl_staging_progress(&a);
        in_done = sl_staging_progress(&b_in);
        done &= in_done;
        landed = sl_staging_landed(&b_in);
        done &= sl_staging_progress(&b_out);
        overlap |= (!in_done && b_out.next_post > 0);
        match();
        counts_true(&a), counts_true(&b_in), counts_true(&b_out), counts_true(&c);
    } while (!done && ++rounds < 100000);
    CHECK(done, "relay len %zu chunk %zu: not done (deadlock)", len, chunk);
    CHECK(memcmp(src, dst, len) == 0, "relay len %zu chunk %zu: wrong bytes",
          len, chunk);
    /* With more chunks than the window, the forward must start early. */
    CHECK((len + chunk - 1) / chunk <= (size_t)nbufs || overlap,
          "relay len %zu chunk %zu bufs %d: the forward did not start before "
          "the receive finished", len, chunk, nbufs);
    sl_staging_pool_cleanup(&pa, a_free, NULL);
    sl_staging_pool_cleanup(&pb, a_free, NULL);
    sl_staging_pool_cleanup(&pc, a_free, NULL);
    free(src);
    free(mid);
    free(dst);
}

/* The wire of an eager send: the chunk is complete inside its post. */
static sl_status_t f_net_post_inline(void *ctx, sl_staging_slot_t *slot,
                                     void *host, size_t len)
{
    (void)ctx, (void)host, (void)len;
    sl_staging_net_done(slot, STAGELINK_SUCCESS);
    return STAGELINK_SUCCESS;
}

static const sl_staging_ops_t inline_ops = {f_copy_start, f_copy_test,
                                            f_net_post_inline, f_net_ready};

/*
 * Sends that complete inside their post raise no event that would call
 * progress again, so one progress call must move every chunk, not one
 * window of them (a sender of failure notices stalled that way), whether
 * the sender is healthy or has failed and sends its chunks empty.
 */
static void run_inline(size_t nchunks, int nbufs, int failed)
{
    sl_staging_pool_t pool;
    sl_staging_xfer_t x;
    sl_staging_slot_t slots[8];
    size_t            len = nchunks * 64 - 5;
    unsigned char    *src = calloc(1, len);
    sl_errbuf_t       eb;

    CHECK(sl_staging_pool_init(&pool, 64, nbufs, a_alloc, NULL, &eb) == 0,
          "%s", eb.msg);
    sl_staging_xfer_init(&x, &inline_ops, NULL, &pool, 0, 1, src, len, 64,
                         slots);
    if (failed) {
        x.status = STAGELINK_ERR_SIZE_MISMATCH;
    }
    CHECK(sl_staging_progress(&x) == 1,
          "%zu chunks, %d slots%s: %zu of them done after one progress call "
          "with every send complete inside its post", nchunks, nbufs,
          failed ? ", failed sender" : "", (size_t)x.done);
    counts_true(&x);
    sl_staging_pool_cleanup(&pool, a_free, NULL);
    free(src);
}

/*
 * A post that fails (a transport error), then the peer gone: the wire
 * gives back what it holds (receives canceled, sends purged) and the
 * transfer still ends, its buffers free and its counts true at every step.
 */
static void run_fail_post(int recv, int direct)
{
    sl_staging_pool_t pool;
    sl_staging_xfer_t x;
    sl_staging_slot_t slots[4];
    size_t            len = 10 * 64;
    unsigned char    *buf = calloc(1, len);
    sl_errbuf_t       eb;
    int               i, rounds = 0, done = 0;

    memset(&W, 0, sizeof(W));
    W.fail_post_at = 2;
    CHECK(sl_staging_pool_init(&pool, 64, 4, a_alloc, NULL, &eb) == 0,
          "%s", eb.msg);
    sl_staging_xfer_init(&x, &ops, NULL, &pool, recv, direct, buf, len, 64,
                         slots);
    while (x.status == STAGELINK_SUCCESS && ++rounds < 100) {
        sl_staging_progress(&x);
        counts_true(&x);
    }
    CHECK(x.status == STAGELINK_ERR_TRANSPORT, "%s %s: the failed post is "
          "not the transfer's status (%d)", direct ? "direct" : "staged",
          recv ? "receive" : "send", (int)x.status);
    sl_staging_abandon(&x, STAGELINK_ERR_PEER_FAILED);
    for (rounds = 0; !done && rounds < 100; ++rounds) {
        for (i = 0; i < W.nposted; ++i) {
            sl_staging_net_done(W.posted[i].slot, STAGELINK_ERR_CANCELED);
        }
        W.nposted = 0;
        for (i = 0; i < W.nmsgs; ++i) {
            if (!W.msgs[i].matched) {
                W.msgs[i].matched = 1;
                sl_staging_net_done(W.msgs[i].sender, STAGELINK_ERR_CANCELED);
            }
        }
        done = sl_staging_progress(&x);
        counts_true(&x);
    }
    CHECK(done, "%s %s: not done after its peer was lost",
          direct ? "direct" : "staged", recv ? "receive" : "send");
    CHECK(pool.nfree[recv] == 4, "%s %s: %d of 4 buffers free at the end",
          direct ? "direct" : "staged", recv ? "receive" : "send",
          pool.nfree[recv]);
    sl_staging_pool_cleanup(&pool, a_free, NULL);
    free(buf);
}

int main(void)
{
    static const size_t chunks[] = {1, 7, 4096};
    static const int    pools[]  = {1, 2, 4};
    size_t              ci, k, lens[6];
    int                 pi;

    for (ci = 0; ci < 3; ++ci) {
        size_t c = chunks[ci];

        lens[0] = 1, lens[1] = c > 1 ? c - 1 : 2, lens[2] = c, lens[3] = c + 1;
        lens[4] = 3 * c + 5, lens[5] = 10 * c;
        for (pi = 0; pi < 3; ++pi) {
            for (k = 0; k < 6; ++k) {
                CHECK(run(lens[k], c, pools[pi], 1, 0) == 0, "one transfer");
                CHECK(run(lens[k], c, pools[pi], 3, 0) == 0,
                      "three transfers sharing a pool");
                /* Same chunks on the wire whichever side is direct. */
                CHECK(run_modes(lens[k], c, pools[pi], 2, 0, 1, 0) == 0,
                      "direct sender, staged receiver");
                CHECK(run_modes(lens[k], c, pools[pi], 2, 0, 0, 1) == 0,
                      "staged sender, direct receiver");
                CHECK(run_modes(lens[k], c, pools[pi], 2, 0, 1, 1) == 0,
                      "both direct");
            }
        }
    }
    for (pi = 0; pi < 3; ++pi) {
        run_relay(1, 4096, pools[pi], 0);
        run_relay(10 * 4096 + 7, 4096, pools[pi], 0);
        run_relay(10 * 4096 + 7, 4096, pools[pi], 1);
        run_relay(3 * 7, 7, pools[pi], 1);
    }
    run_inline(20, 4, 0);
    run_inline(20, 4, 1);
    run_inline(3, 1, 1);
    /* With two buffers, copy of chunk k+1 overlaps chunk k on the wire. */
    run(64 * 1024, 4096, 2, 1, 0);
    CHECK(W.overlap_seen, "copy and wire never overlapped with two buffers");
    run(64 * 1024, 4096, 1, 1, 0);
    /* A failed copy ends both sides with an error, never a hang: the 3rd
     * copy is the sender's; with two transfers the 14th is a receiver's. */
    CHECK(run(10 * 4096, 4096, 4, 1, 3) != STAGELINK_SUCCESS,
          "a failed sender copy is not reported");
    CHECK(run(10 * 4096, 4096, 4, 2, 14) != STAGELINK_SUCCESS,
          "a failed receiver copy is not reported");
    CHECK(run(10 * 4096 + 3, 4096, 1, 3, 2) != STAGELINK_SUCCESS,
          "a failed copy with one buffer is not reported");
    /* (A staged receive posts only for a chunk on its way: none here.) */
    run_fail_post(0, 0);
    run_fail_post(0, 1);
    run_fail_post(1, 1);
    return check_summary();
}
