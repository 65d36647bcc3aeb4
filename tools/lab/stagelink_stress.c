/*
 * stagelink_stress: randomized correctness harness over the public loader.
 *
 * Each seed draws a whole job: the layout (p 1-4, t 1-4, d 1-2, at most 8
 * ranks), the mode, the wire's chunk size, the number of microbatches in
 * flight per direction (up to 256), tensor and element sizes (0 B, tiny,
 * primes, up to several MiB so that some go in chunks), how each rank posts
 * (isend/irecv mixed with post_batch; receives first or all shuffled) and
 * how it completes (wait, test polling, cancel of orphan receives, in a
 * random order), whether every rank then goes idle outside stagelink, and
 * deliberate misuse (a tag reused while in flight must
 * give TAG_IN_USE; a receiver passing another nbytes must give
 * SIZE_MISMATCH on every rank that can see it, then the same tag works in
 * the next round).  Every received byte is checked.
 *
 *   stagelink_stress [-s SEED,...] [-r RANDOM_SEEDS] [-b BUDGET_S]
 *                    [-N NS0,NS1] [-L p,t,d,mode,depth] [-M] [-F]
 *                    [-G GATHER_ORDER,FAKE_NCCL] [-q]
 *
 * With -G, one seed in four on one node is instead a job of device
 * receives on a fake GPU whose streams lag by drawn amounts, gathered
 * through the fake NCCL, which fails when TP ranks issue collectives in
 * different orders (test/multiproc/gather_order.c, scenario random).
 *
 * The driver starts each seed's job with stagelink_run (found next to this
 * program, one directory up, or on PATH), on this node or split over two network namespaces (-N, node 0
 * at 198.18.0.1), and prints the seed, the layout and a replay command for
 * every failure.  -L forces the layout of every seed (a replay keeps it).
 * SPDX-License-Identifier: MIT
 */
#include "host.h"
#include "pattern.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include "tool_opts.h"

#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORLD     8
#define MAX_DEPTH     256
#define ORPHAN_MB     0x80000000u /* tags of receives nobody sends to */
#define ROUND_BYTES   (40u << 20) /* tensor bytes one rank moves per round */
#define CANARY        0xc5
#define JOB_TIMEOUT_S 120         /* stagelink_run's backstop per job */
#define WAIT_TIMEOUT  "30"        /* STAGELINK_TIMEOUT: a hang becomes TIMEOUT */
#define IDLE_WAIT_S   40          /* the idle barrier, past WAIT_TIMEOUT */

typedef struct plan {
    uint64_t         seed;
    int              p, t, d, world;
    stagelink_mode_t mode;
    size_t           chunk;      /* STAGELINK_CHUNK; auto: 1 MiB, above which messages go in chunks */
    int              chunk_auto; /* STAGELINK_CHUNK=auto: a chunk per size */
    int              rounds, depth;
    size_t           max_bytes;  /* largest tensor */
    int              pct_batch, pct_test, pct_orphan, pct_reuse, pct_mismatch;
    int              recvs_first;
    int              idle;       /* ranks idle in a host barrier after each round */
} plan_t;

typedef struct layout_override {
    int              no_misuse; /* -M: no tag reuse, size mismatch, orphans */
    int              fixed_chunk; /* -F: never STAGELINK_CHUNK=auto */
    int              set, p, t, d, depth;
    stagelink_mode_t mode;
    const char      *gather_job; /* -G: "GATHER_ORDER,FAKE_NCCL" */
} layout_override_t;

/* ---- deterministic draws ------------------------------------------------ */

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x  = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x  = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t rng_next(uint64_t *state)
{
    *state += 0x9e3779b97f4a7c15ull;
    return mix64(*state);
}

static uint64_t rng_below(uint64_t *state, uint64_t n)
{
    return (n == 0) ? 0 : rng_next(state) % n;
}

/* A draw both ends of one transfer make alike. */
static uint64_t hash5(uint64_t a, uint64_t b, uint64_t c, uint64_t d,
                      uint64_t e)
{
    return mix64(mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ d) ^ e);
}

static const char *const mode_names[] = {"default", "scatter_gather", "full",
                                         "sharded"};

static void plan_draw(uint64_t seed, int nodes, const layout_override_t *ov,
                      plan_t *pl)
{
    static const size_t chunks[] = {1u << 20, 256u << 10, 64u << 10,
                                    16u << 10};
    static const int    depths[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    uint64_t            st = seed;
    size_t              cap;

    memset(pl, 0, sizeof(*pl));
    pl->seed = seed;
    do {
        pl->p = (rng_below(&st, 20) == 0) ? 1 : 2 + (int)rng_below(&st, 3);
        pl->t = 1 + (int)rng_below(&st, 4);
        pl->d = 1 + (int)rng_below(&st, 2);
        if (ov->set) {
            pl->p = ov->p;
            pl->t = ov->t;
            pl->d = ov->d;
        }
        pl->world = pl->p * pl->t * pl->d;
    } while (!ov->set &&
             (pl->world > MAX_WORLD || (nodes == 2 && pl->world % 2 != 0)));
    /* -L replaces draws but consumes them, so the rest stays the seed's. */
    pl->mode  = (stagelink_mode_t)(1 + rng_below(&st, 3));
    pl->chunk = chunks[rng_below(&st, 4)];
    pl->depth = depths[rng_below(&st, 9)];
    /* Drawn aside, so that the rest of a seed's draws are what they were;
     * -F replays seeds found before auto was drawn.  Auto's messages go in
     * chunks above 1 MiB, so sizes are drawn near there (and near where
     * the chunk grows past 256 KiB, see draw_size). */
    pl->chunk_auto = !ov->fixed_chunk &&
                     hash5(seed ^ 0x6175746f63686e6bull, 0, 0, 0, 0) % 3 == 0;
    if (pl->chunk_auto) {
        pl->chunk = 1u << 20;
    }
    if (ov->set) {
        pl->mode  = ov->mode;
        pl->depth = ov->depth;
    }
    /* Fewer, larger tensors when fewer are in flight: every round moves
     * about ROUND_BYTES per rank, some of them in chunks. */
    pl->max_bytes = ROUND_BYTES / (2u * (unsigned)pl->depth);
    cap           = pl->chunk_auto ? (20u << 20) : (6u << 20);
    if (pl->max_bytes > cap) {
        pl->max_bytes = cap;
    }
    pl->rounds       = 2 + (int)rng_below(&st, 3);
    pl->pct_batch    = (int)rng_below(&st, 60);
    pl->pct_test     = (int)rng_below(&st, 50);
    pl->pct_orphan   = (int)rng_below(&st, 4);
    pl->pct_reuse    = (int)rng_below(&st, 6);
    pl->pct_mismatch = (int)rng_below(&st, 4);
    pl->recvs_first  = (int)rng_below(&st, 2);
    /* Aside too, so that seeds found before keep their jobs. */
    pl->idle         = hash5(seed ^ 0x69646c6562617272ull, 0, 0, 0, 0) % 2 == 0;
    if (ov->no_misuse) {
        pl->pct_orphan = pl->pct_reuse = pl->pct_mismatch = 0;
    }
}

/* The seed's STAGELINK_CHUNK, as set for its ranks. */
static void plan_chunk_text(const plan_t *pl, char *out, size_t len)
{
    if (pl->chunk_auto) {
        snprintf(out, len, "auto");
    } else {
        snprintf(out, len, "%zu", pl->chunk);
    }
}

static void plan_print(FILE *f, const plan_t *pl)
{
    char chunk[32];

    plan_chunk_text(pl, chunk, sizeof(chunk));
    fprintf(f, "p=%d t=%d d=%d (%d ranks) mode=%s chunk=%s depth=%d "
            "rounds=%d max=%zu%s", pl->p, pl->t, pl->d, pl->world,
            mode_names[pl->mode], chunk, pl->depth, pl->rounds,
            pl->max_bytes, pl->idle ? " idle" : "");
}

/* ---- one rank ------------------------------------------------------------ */

typedef enum outcome {
    EXPECT_DATA,     /* SUCCESS and every byte of the pattern */
    EXPECT_CANCELED, /* an orphan receive, canceled */
    EXPECT_MISMATCH, /* SIZE_MISMATCH */
    EXPECT_SUCCESS   /* SUCCESS, contents not defined (a mismatch it cannot see) */
} outcome_t;

typedef struct op {
    stagelink_op_kind_t  kind;
    stagelink_xfer_t     xfer;
    unsigned char       *buf;
    int                  src_stage, backward, round;
    outcome_t            expect;
    outcome_t            alt;   /* also accepted (a sender of a mismatch) */
    stagelink_request_t *req;
    int                  done;
    int                  canceled; /* an orphan, canceled at its post */
} op_t;

typedef struct rank_ctx {
    plan_t    pl;
    sl_host_t host;
    int       stage, tp_index;
    uint64_t  rng;
    uint64_t  ops, bytes_checked, misuse_checks, failures;
} rank_ctx_t;

static void shard_of(size_t nbytes, size_t esize, int parts, int index,
                     size_t *off, size_t *len)
{
    size_t nelem = nbytes / esize, q = nelem / (size_t)parts;
    size_t r = nelem % (size_t)parts, i = (size_t)index;

    *off = (i * q + ((i < r) ? i : r)) * esize;
    *len = (q + ((i < r) ? 1 : 0)) * esize;
}

static int is_prime(size_t n)
{
    size_t d;

    if (n < 2) {
        return 0;
    }
    for (d = 2; d * d <= n; ++d) {
        if (n % d == 0) {
            return 0;
        }
    }
    return 1;
}

/* Size and element size of one transfer, the same on both ends. */
static void draw_size(const plan_t *pl, int round, int backward, int boundary,
                      uint32_t mb, size_t *nbytes, size_t *esize)
{
    static const size_t esizes[] = {1, 2, 4, 8};
    uint64_t h     = hash5(pl->seed, (uint64_t)round, (uint64_t)backward,
                           (uint64_t)boundary, mb);
    size_t   es    = esizes[h % 4];
    size_t   limit = pl->max_bytes, n;
    uint64_t cls   = (h >> 8) % 100, v = h >> 16;

    if (cls < 8) {
        n = 0;
    } else if (cls < 35) {
        n = 1 + v % 64;
    } else if (cls < 60) {
        n = 1 + v % ((limit < (300u << 10)) ? limit : (300u << 10));
    } else if (cls < 80) {
        /* A prime next to a chunk boundary: odd shards, framed or not;
         * auto's chunk also grows past 256 KiB at shards of 4 MiB. */
        n = pl->chunk * (1 + v % 3) * (size_t)pl->t;
        if (pl->chunk_auto && (v >> 32) % 2) {
            n = ((size_t)4 << 20) * (size_t)pl->t;
        }
        n = (n > limit) ? limit : n;
        n = n - 1 + (v >> 40) % 3;
        while (!is_prime(n) && n < SIZE_MAX / 2) {
            ++n;
        }
        es = 1;
    } else {
        n = 1 + v % limit;
    }
    *esize  = es;
    *nbytes = (n / es) * es;
}

/* 1 if the receiver of (round, backward, boundary, mb) takes another size. */
static size_t draw_mismatch(const plan_t *pl, int round, int backward,
                            int boundary, uint32_t mb, size_t nbytes,
                            size_t esize)
{
    uint64_t h = hash5(pl->seed ^ 0x6d69736d61746368ull, (uint64_t)round,
                       (uint64_t)backward, (uint64_t)boundary, mb);
    size_t   delta;

    if ((int)(h % 100) >= pl->pct_mismatch) {
        return nbytes;
    }
    delta = esize * (1 + (h >> 8) % 3);
    if ((h >> 20) % 4 == 0) {
        delta = esize * (1 + (h >> 24) % (pl->chunk / esize + 1));
    }
    return ((h >> 16) % 2 == 0 || nbytes < delta) ? nbytes + delta
                                                  : nbytes - delta;
}

static int draw_orphan(const plan_t *pl, int round, int backward, int boundary,
                       uint32_t k)
{
    uint64_t h = hash5(pl->seed ^ 0x6f727068616e0000ull, (uint64_t)round,
                       (uint64_t)backward, (uint64_t)boundary, k);

    return (int)(h % 100) < pl->pct_orphan;
}

static uint64_t op_pattern(int src_stage, uint32_t mb, uint16_t chunk,
                           int backward, int round)
{
    return sl_pattern_seed(src_stage, mb, chunk, backward) +
           (uint64_t)round * 0x632be59bd9b4e019ull;
}

static void shuffle(rank_ctx_t *c, op_t **v, size_t n)
{
    size_t i, j;
    op_t  *tmp;

    for (i = n; i > 1; --i) {
        j        = (size_t)rng_below(&c->rng, i);
        tmp      = v[i - 1];
        v[i - 1] = v[j];
        v[j]     = tmp;
    }
}

static void fail(rank_ctx_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void fail(rank_ctx_t *c, const char *fmt, ...)
{
    va_list ap;
    char    line[1024];

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "stress seed %" PRIu64 " rank %d (stage %d tp %d): %s\n",
            c->pl.seed, c->host.info.rank, c->stage, c->tp_index, line);
    ++c->failures;
}

static const char *op_name(const op_t *o)
{
    static const char *const n[2][2] = {{"fwd send", "fwd recv"},
                                        {"bwd send", "bwd recv"}};

    return n[o->backward][o->kind == STAGELINK_OP_RECV];
}

/* What the receiving rank with TP index `k` can see of a size mismatch. */
static outcome_t mismatch_outcome(const plan_t *pl, int k, size_t sent,
                                  size_t want, size_t esize)
{
    size_t so, sl, ro, rl;

    if (pl->mode != STAGELINK_MODE_SHARDED) {
        return EXPECT_MISMATCH; /* the whole tensor, or every shard, is seen */
    }
    shard_of(sent, esize, pl->t, k, &so, &sl);
    shard_of(want, esize, pl->t, k, &ro, &rl);
    return (sl != rl) ? EXPECT_MISMATCH : EXPECT_SUCCESS;
}

/* The ops of one round: this rank's sends and receives, both directions. */
static size_t build_round(rank_ctx_t *c, int round, op_t *ops)
{
    const plan_t *pl = &c->pl;
    size_t        n  = 0;
    int           dir, k;

    for (dir = 0; dir < 2; ++dir) {
        /* Forward: send to next (boundary = my stage), receive from prev.
         * Backward: send to prev (boundary = stage - 1), receive from next. */
        int has[2] = {c->stage < pl->p - 1, c->stage > 0};
        int kind;

        for (kind = 0; kind < 2; ++kind) {
            int send     = (kind == 0);
            int to_next  = (dir == 0) ? send : !send;
            int boundary = to_next ? c->stage : c->stage - 1;
            int src      = (dir == 0) ? boundary : boundary + 1;

            if (!has[to_next ? 0 : 1]) {
                continue;
            }
            for (k = 0; k < pl->depth + 2; ++k) {
                op_t    *o = &ops[n];
                uint32_t mb;
                size_t   nbytes, esize, want;

                if (k >= pl->depth) {
                    /* Orphans: receives nobody sends to, canceled. */
                    if (send || !draw_orphan(pl, round, dir, boundary,
                                             (uint32_t)k)) {
                        continue;
                    }
                    mb = ORPHAN_MB + (uint32_t)round * 4u + (uint32_t)k;
                } else {
                    mb = (uint32_t)k;
                }
                draw_size(pl, round, dir, boundary, mb, &nbytes, &esize);
                want = (k < pl->depth)
                           ? draw_mismatch(pl, round, dir, boundary, mb,
                                           nbytes, esize)
                           : nbytes;
                memset(o, 0, sizeof(*o));
                o->kind      = send ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;
                o->backward  = dir;
                o->round     = round;
                o->src_stage = src;
                o->expect    = EXPECT_DATA;
                o->alt       = EXPECT_DATA;
                if (k >= pl->depth) {
                    o->expect = o->alt = EXPECT_CANCELED;
                } else if (want != nbytes) {
                    /* The sender hears of it only where the wire tells
                     * (a framed message the receiver drains). */
                    o->expect = send ? EXPECT_SUCCESS
                                     : mismatch_outcome(pl, c->tp_index,
                                                        nbytes, want, esize);
                    o->alt    = send ? EXPECT_MISMATCH : o->expect;
                    if (!send) {
                        nbytes = want;
                    }
                }
                o->buf = malloc(nbytes ? nbytes : 1);
                if (o->buf == NULL) {
                    fprintf(stderr, "out of memory (%zu bytes)\n", nbytes);
                    exit(1);
                }
                o->xfer = sl_host_xfer(to_next ? STAGELINK_PEER_NEXT
                                               : STAGELINK_PEER_PREV,
                                       o->buf, nbytes, esize, mb,
                                       (uint16_t)((mb * 7u + 3u) & 0x7ffu));
                if (send) {
                    sl_pattern_fill(o->buf, 0, nbytes,
                                    op_pattern(src, mb, o->xfer.tag.chunk,
                                               dir, round));
                } else {
                    memset(o->buf, CANARY, nbytes);
                }
                ++n;
            }
        }
    }
    return n;
}

/* A second post of an in-flight tag must be refused and change nothing. */
static void try_reuse(rank_ctx_t *c, const op_t *o)
{
    stagelink_request_t *req = NULL;
    stagelink_status_t   s;
    unsigned char        dummy[8];
    stagelink_xfer_t     x = o->xfer;

    x.buf    = dummy;
    x.nbytes = 0;
    s = (o->kind == STAGELINK_OP_SEND)
            ? c->host.plugin->isend(c->host.comm, &x, &req)
            : c->host.plugin->irecv(c->host.comm, &x, &req);
    ++c->misuse_checks;
    if (s != STAGELINK_ERR_TAG_IN_USE || req != NULL) {
        fail(c, "%s mb %u chunk %u posted twice: got %s (request %p), "
             "expected STAGELINK_ERR_TAG_IN_USE", op_name(o),
             o->xfer.tag.microbatch, o->xfer.tag.chunk,
             stagelink_status_string(s), (void *)req);
    }
}

static void post_ops(rank_ctx_t *c, op_t **order, size_t n)
{
    const stagelink_plugin_v1_t *pl = c->host.plugin;
    stagelink_op_t               batch[9];
    stagelink_request_t         *reqs[9];
    size_t                       i = 0, k, m;
    stagelink_status_t           s;

    while (i < n) {
        m = 1;
        if ((int)rng_below(&c->rng, 100) < c->pl.pct_batch) {
            m = 1 + (size_t)rng_below(&c->rng, 8);
            m = (m > n - i) ? n - i : m;
        }
        if (m == 1 && rng_below(&c->rng, 2) == 0) {
            op_t *o = order[i];

            s = (o->kind == STAGELINK_OP_SEND)
                    ? pl->isend(c->host.comm, &o->xfer, &o->req)
                    : pl->irecv(c->host.comm, &o->xfer, &o->req);
        } else {
            for (k = 0; k < m; ++k) {
                batch[k].kind = order[i + k]->kind;
                batch[k].xfer = order[i + k]->xfer;
            }
            /* A duplicate element: the whole batch is refused. */
            if ((int)rng_below(&c->rng, 100) < c->pl.pct_reuse) {
                batch[m] = batch[rng_below(&c->rng, m)];
                s = pl->post_batch(c->host.comm, batch, m + 1, reqs);
                ++c->misuse_checks;
                if (s != STAGELINK_ERR_TAG_IN_USE) {
                    fail(c, "a batch of %zu with a duplicate element: got %s, "
                         "expected STAGELINK_ERR_TAG_IN_USE", m + 1,
                         stagelink_status_string(s));
                    if (s == STAGELINK_SUCCESS) {
                        exit(1); /* requests of unknown fate are in flight */
                    }
                }
            }
            s = pl->post_batch(c->host.comm, batch, m, reqs);
            for (k = 0; k < m; ++k) {
                order[i + k]->req = (s == STAGELINK_SUCCESS) ? reqs[k] : NULL;
            }
        }
        if (s != STAGELINK_SUCCESS) {
            fail(c, "posting %zu operation(s) from %s mb %u: %s: %s", m,
                 op_name(order[i]), order[i]->xfer.tag.microbatch,
                 stagelink_status_string(s), pl->last_error(c->host.comm));
            exit(1);
        }
        for (k = 0; k < m; ++k) {
            ++c->ops;
            if (order[i + k]->expect == EXPECT_CANCELED &&
                rng_below(&c->rng, 2) == 0) {
                pl->cancel(c->host.comm, order[i + k]->req);
                order[i + k]->canceled = 1;
            }
            if ((int)rng_below(&c->rng, 100) < c->pl.pct_reuse) {
                try_reuse(c, order[i + k]);
            }
        }
        i += m;
    }
}

static int outcome_ok(outcome_t want, stagelink_status_t s)
{
    switch (want) {
    case EXPECT_DATA:
    case EXPECT_SUCCESS:  return s == STAGELINK_SUCCESS;
    case EXPECT_CANCELED: return s == STAGELINK_ERR_CANCELED;
    case EXPECT_MISMATCH: return s == STAGELINK_ERR_SIZE_MISMATCH;
    }
    return 0;
}

/* Where the wrong bytes at `bad` belong, when they are the transfer's own
 * bytes from elsewhere (a chunk landed at the wrong place). */
static const char *misplaced(const op_t *o, size_t bad)
{
    static char text[96];
    uint64_t    seed = op_pattern(o->src_stage, o->xfer.tag.microbatch,
                                  o->xfer.tag.chunk, o->backward, o->round);
    size_t      n    = o->xfer.nbytes - bad, from;
    unsigned char *probe;

    n     = (n > 64) ? 64 : n;
    probe = malloc(o->xfer.nbytes);
    text[0] = '\0';
    if (probe == NULL) {
        return text;
    }
    for (from = 0; from + n <= o->xfer.nbytes; from += 1024) {
        sl_pattern_fill(probe, from, n, seed);
        if (from != bad && memcmp(probe + from, o->buf + bad, n) == 0) {
            snprintf(text, sizeof(text), "; the bytes of offset %zu", from);
            break;
        }
    }
    free(probe);
    return text;
}

static void check_op(rank_ctx_t *c, op_t *o, stagelink_status_t s)
{
    size_t off = 0, len = o->xfer.nbytes, bad, i;

    if (!outcome_ok(o->expect, s) && !outcome_ok(o->alt, s)) {
        fail(c, "%s mb %u chunk %u round %d of %zu bytes: %s (%s), "
             "expected %s", op_name(o), o->xfer.tag.microbatch,
             o->xfer.tag.chunk, o->round, o->xfer.nbytes,
             stagelink_status_string(s), c->host.plugin->last_error(c->host.comm),
             o->expect == EXPECT_CANCELED   ? "CANCELED"
             : o->expect == EXPECT_MISMATCH ? "SIZE_MISMATCH"
                                            : "SUCCESS");
        return;
    }
    if (o->kind != STAGELINK_OP_RECV || o->expect != EXPECT_DATA) {
        return;
    }
    if (c->pl.mode == STAGELINK_MODE_SHARDED) {
        shard_of(o->xfer.nbytes, o->xfer.elem_size, c->pl.t, c->tp_index,
                 &off, &len);
        for (i = 0; i < o->xfer.nbytes; ++i) {
            if ((i < off || i >= off + len) && o->buf[i] != CANARY) {
                fail(c, "%s mb %u: sharded mode wrote byte %zu outside its "
                     "shard [%zu, %zu) of %zu", op_name(o),
                     o->xfer.tag.microbatch, i, off, off + len,
                     o->xfer.nbytes);
                return;
            }
        }
    }
    bad = sl_pattern_check(o->buf, off, len,
                           op_pattern(o->src_stage, o->xfer.tag.microbatch,
                                      o->xfer.tag.chunk, o->backward,
                                      o->round));
    if (bad != SIZE_MAX) {
        fail(c, "%s mb %u chunk %u round %d of %zu bytes (element %zu): "
             "wrong byte at offset %zu (0x%02x)%s", op_name(o),
             o->xfer.tag.microbatch, o->xfer.tag.chunk, o->round,
             o->xfer.nbytes, o->xfer.elem_size, bad, o->buf[bad],
             misplaced(o, bad));
        return;
    }
    c->bytes_checked += len;
}

static void complete_ops(rank_ctx_t *c, op_t **order, size_t n)
{
    const stagelink_plugin_v1_t *pl = c->host.plugin;
    time_t                       start = time(NULL);
    size_t                       i;

    /* Every orphan is canceled before any wait: a canceled gathered
     * receive ends once each TP peer's part is in, which for an orphan is
     * that peer's own cancel, so a rank waiting on one before canceling
     * another the peers wait on would hold them all. */
    for (i = 0; i < n; ++i) {
        if (order[i]->expect == EXPECT_CANCELED && !order[i]->canceled) {
            pl->cancel(c->host.comm, order[i]->req);
        }
    }
    for (i = 0; i < n; ++i) {
        op_t              *o = order[i];
        stagelink_status_t s;
        int                done = 0;
        unsigned           spins = 0;

        if ((int)rng_below(&c->rng, 100) < c->pl.pct_test) {
            /* A host polling test() must get there without wait(). */
            do {
                s = pl->test(c->host.comm, o->req, &done);
                if (++spins % 64 == 0) {
                    sched_yield();
                    if (difftime(time(NULL), start) > atof(WAIT_TIMEOUT)) {
                        fail(c, "%s mb %u: test() never reported it done "
                             "in %s s", op_name(o), o->xfer.tag.microbatch,
                             WAIT_TIMEOUT);
                        exit(1);
                    }
                }
            } while (s == STAGELINK_SUCCESS && !done);
            if (s != STAGELINK_SUCCESS && !done) {
                /* An error from test() itself: the request is released
                 * only once done, so this must be its outcome. */
                done = 1;
            }
        } else {
            s = pl->wait(c->host.comm, o->req);
        }
        if (s == STAGELINK_ERR_TIMEOUT) {
            fail(c, "%s mb %u chunk %u round %d (%zu bytes) hangs: %s",
                 op_name(o), o->xfer.tag.microbatch, o->xfer.tag.chunk,
                 o->round, o->xfer.nbytes, pl->last_error(c->host.comm));
            exit(1);
        }
        check_op(c, o, s);
        o->req = NULL;
    }
}

/* The first port the kernel hands out by itself (32768 by default). */
static int ephemeral_low(void)
{
    FILE *f  = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    int   lo = 32768;

    if (f != NULL) {
        if (fscanf(f, "%d", &lo) != 1 || lo <= 11000) {
            lo = 32768;
        }
        fclose(f);
    }
    /* This namespace's range; a new one starts at the kernel's default. */
    return (lo < 32768) ? lo : 32768;
}

/* After its last completion of `round` the rank blocks outside stagelink
 * until every rank has completed the round (marker files, 1 ms naps),
 * for at most IDLE_WAIT_S: a hang here is a peer that needed this rank. */
static void idle_barrier(rank_ctx_t *c, int round)
{
    const char *dir = getenv("STAGELINK_STRESS_DIR");
    char        path[PATH_MAX];
    time_t      end = time(NULL) + IDLE_WAIT_S;
    int         r, fd, missing;

    if (dir == NULL) {
        return;
    }
    snprintf(path, sizeof(path), "%s/r%d.%d", dir, round, c->host.info.rank);
    fd = open(path, O_CREAT | O_WRONLY, 0600);
    if (fd >= 0) {
        close(fd);
    }
    for (;;) {
        missing = -1;
        for (r = 0; r < c->host.info.world_size && missing < 0; ++r) {
            snprintf(path, sizeof(path), "%s/r%d.%d", dir, round, r);
            missing = (access(path, F_OK) != 0) ? r : -1;
        }
        if (missing < 0) {
            return;
        }
        if (time(NULL) > end) {
            fail(c, "round %d: rank %d did not complete in %d s while this "
                 "rank was idle outside stagelink", round, missing,
                 IDLE_WAIT_S);
            return;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

static int rank_main(uint64_t seed, int nodes, const layout_override_t *ov)
{
    rank_ctx_t c;
    op_t      *ops;
    op_t     **order;
    size_t     n, i, nr, ns;
    int        round, fd;
    char       line[256];

    memset(&c, 0, sizeof(c));
    plan_draw(seed, nodes, ov, &c.pl);
    if (sl_host_open(&c.host, c.pl.t, c.pl.p, c.pl.mode) != 0) {
        return 1;
    }
    c.stage    = c.host.info.pp_index;
    c.tp_index = c.host.info.tp_index;
    c.rng      = mix64(seed ^ ((uint64_t)c.host.info.rank << 48));
    ops   = calloc((size_t)4 * (MAX_DEPTH + 2), sizeof(*ops));
    order = calloc((size_t)4 * (MAX_DEPTH + 2), sizeof(*order));
    if (ops == NULL || order == NULL) {
        return 1;
    }
    if (c.pl.p == 1) {
        /* No neighbour stage: every post is refused with NO_PEER. */
        stagelink_request_t *req = NULL;
        unsigned char        b   = 0;
        stagelink_xfer_t     x   = sl_host_xfer(STAGELINK_PEER_NEXT, &b, 1, 1,
                                                0, 0);

        ++c.misuse_checks;
        if (c.host.plugin->isend(c.host.comm, &x, &req) !=
            STAGELINK_ERR_NO_PEER) {
            fail(&c, "isend with one stage did not give NO_PEER");
        }
    }
    for (round = 0; round < c.pl.rounds && c.pl.p > 1; ++round) {
        n = build_round(&c, round, ops);
        /* Receives first (then sends), or everything in one shuffle. */
        nr = 0;
        for (i = 0; i < n; ++i) {
            if (!c.pl.recvs_first || ops[i].kind == STAGELINK_OP_RECV) {
                order[nr++] = &ops[i];
            }
        }
        shuffle(&c, order, nr);
        ns = nr;
        for (i = 0; i < n && c.pl.recvs_first; ++i) {
            if (ops[i].kind == STAGELINK_OP_SEND) {
                order[ns++] = &ops[i];
            }
        }
        shuffle(&c, order + nr, ns - nr);
        post_ops(&c, order, n);
        shuffle(&c, order, n);
        complete_ops(&c, order, n);
        if (c.pl.idle) {
            idle_barrier(&c, round);
        }
        for (i = 0; i < n; ++i) {
            free(ops[i].buf);
        }
    }
    sl_host_close(&c.host);
    fd = getenv("STAGELINK_STRESS_FD") ? atoi(getenv("STAGELINK_STRESS_FD"))
                                       : -1;
    snprintf(line, sizeof(line), "%" PRIu64 " %" PRIu64 " %" PRIu64 " %"
             PRIu64 "\n", c.ops, c.bytes_checked, c.misuse_checks, c.failures);
    if (fd >= 0 && write(fd, line, strlen(line)) < 0) {
        perror("stagelink_stress: result pipe");
    }
    free(ops);
    free(order);
    return c.failures ? 1 : 0;
}

/* ---- driver -------------------------------------------------------------- */

/* stagelink_run: beside this program, one directory up (a build tree's
 * tools/ above tools/lab/), else by name on PATH (the lab installed in
 * LIBEXECDIR/stagelink, the tools in bin/). */
static void find_run(const char *dir, char *run, size_t len)
{
    static const char *const rel[] = {"%s/stagelink_run", "%s/../stagelink_run"};
    size_t                   i;

    for (i = 0; i < sizeof(rel) / sizeof(rel[0]); ++i) {
        snprintf(run, len, rel[i], dir);
        if (access(run, X_OK) == 0) {
            return;
        }
    }
    snprintf(run, len, "stagelink_run");
}

typedef struct totals {
    uint64_t seeds, failed, ops, bytes, misuse;
} totals_t;

static void self_dir(char *dir, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", dir, len - 1);

    if (n <= 0) {
        snprintf(dir, len, ".");
        return;
    }
    dir[n] = '\0';
    if (strrchr(dir, '/') != NULL) {
        *strrchr(dir, '/') = '\0';
    }
}

static void replay_line(char *out, size_t len, uint64_t seed,
                        const char *netns, const layout_override_t *ov)
{
    int n = snprintf(out, len, "stagelink_stress -s %" PRIu64, seed);

    if (netns != NULL) {
        n += snprintf(out + n, len - (size_t)n, " -N %s", netns);
    }
    if (ov->set) {
        n += snprintf(out + n, len - (size_t)n, " -L %d,%d,%d,%s,%d", ov->p,
                      ov->t, ov->d, mode_names[ov->mode], ov->depth);
    }
    if (ov->no_misuse) {
        n += snprintf(out + n, len - (size_t)n, " -M");
    }
    if (ov->fixed_chunk) {
        n += snprintf(out + n, len - (size_t)n, " -F");
    }
    if (ov->gather_job != NULL) {
        snprintf(out + n, len - (size_t)n, " -G %s", ov->gather_job);
    }
}

/* Whether -G makes this seed a gather-order job (drawn aside). */
static int gather_drawn(uint64_t seed, const char *netns,
                        const layout_override_t *ov)
{
    return ov->gather_job != NULL && netns == NULL &&
           hash5(seed ^ 0x6761746865726f72ull, 0, 0, 0, 0) % 4 == 0;
}

/* Runs the seed's gather-order job (-G): 4 ranks, t = 2, p = 2, device
 * receives on the fake GPU; 0 when every rank passed. */
static int run_gather_seed(uint64_t seed, const layout_override_t *ov,
                           const char *run, int quiet, totals_t *tot)
{
    char   prog[PATH_MAX], fake[PATH_MAX], seedarg[32], t_arg[16];
    char   replay[PATH_MAX * 2 + 64];
    int    status, rc;
    pid_t  pid;
    time_t t0 = time(NULL);

    if (sscanf(ov->gather_job, "%4095[^,],%4095s", prog, fake) != 2) {
        fprintf(stderr, "-G wants GATHER_ORDER,FAKE_NCCL\n");
        return 1;
    }
    snprintf(seedarg, sizeof(seedarg), "%" PRIu64, seed);
    snprintf(t_arg, sizeof(t_arg), "%d", JOB_TIMEOUT_S);
    pid = fork();
    if (pid == 0) {
        setenv("STAGELINK_NCCL_LIBRARY", fake, 1);
        setenv("FAKE_NCCL_COLLECTIVES", "1", 1);
        setenv("STAGELINK_TIMEOUT", WAIT_TIMEOUT, 1);
        if (freopen("/dev/null", "w", stdout) == NULL) {
            _exit(127);
        }
        execl(run, run, "-n", "4", "-T", t_arg, "--", prog, fake, "random",
              seedarg, (char *)NULL);
        perror(run);
        _exit(127);
    }
    rc = (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0);
    ++tot->seeds;
    replay_line(replay, sizeof(replay), seed, NULL, ov);
    if (rc != 0) {
        ++tot->failed;
        printf("FAIL seed %" PRIu64 ": gather order on the fake GPU (p=2 t=2)"
               "\n  replay: %s\n", seed, replay);
    } else if (!quiet) {
        printf("ok   seed %" PRIu64 ": gather order on the fake GPU (p=2 t=2)"
               " (%.0f s)\n", seed, difftime(time(NULL), t0));
    }
    fflush(stdout);
    return rc;
}

/* The idle barrier's markers of one job, and their directory. */
static void remove_markers(const char *dir)
{
    char           path[PATH_MAX];
    DIR           *d = opendir(dir);
    struct dirent *e;

    while (d != NULL && (e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    rmdir(dir);
}

/* Runs one seed's job; 0 when every rank passed. */
static int run_seed(uint64_t seed, const char *netns,
                    const layout_override_t *ov, int quiet, totals_t *tot)
{
    char        dir[PATH_MAX], run[PATH_MAX + 32], self[PATH_MAX + 32];
    char        seedarg[32], ovarg[64] = "", fdtext[16], chunk[32];
    char        ns[2][64] = {"", ""}, replay[256], rbuf[4096];
    char        idle_dir[64];
    int         nodes = (netns != NULL) ? 2 : 1, pfd[2], node, rc = 0;
    int         per, status, got = 0;
    pid_t       pids[2];
    plan_t      pl;
    ssize_t     r;
    size_t      used = 0;
    const char *p;
    time_t      t0 = time(NULL);

    self_dir(dir, sizeof(dir));
    find_run(dir, run, sizeof(run));
    if (gather_drawn(seed, netns, ov)) {
        return run_gather_seed(seed, ov, run, quiet, tot);
    }
    plan_draw(seed, nodes, ov, &pl);
    snprintf(self, sizeof(self), "%s/stagelink_stress", dir);
    snprintf(seedarg, sizeof(seedarg), "%" PRIu64, seed);
    if (ov->set) {
        snprintf(ovarg, sizeof(ovarg), "%d,%d,%d,%s,%d", ov->p, ov->t, ov->d,
                 mode_names[ov->mode], ov->depth);
    }
    if (netns != NULL && sscanf(netns, "%63[^,],%63s", ns[0], ns[1]) != 2) {
        fprintf(stderr, "-N wants two namespaces: NS0,NS1\n");
        return 1;
    }
    if (pipe(pfd) != 0) {
        perror("pipe");
        return 1;
    }
    snprintf(fdtext, sizeof(fdtext), "%d", pfd[1]);
    snprintf(idle_dir, sizeof(idle_dir), "/tmp/stagelink-stress-XXXXXX");
    if (mkdtemp(idle_dir) == NULL) {
        perror("mkdtemp");
        close(pfd[0]);
        close(pfd[1]);
        return 1;
    }
    setenv("STAGELINK_STRESS_DIR", idle_dir, 1);
    plan_chunk_text(&pl, chunk, sizeof(chunk));
    setenv("STAGELINK_STRESS_FD", fdtext, 1);
    setenv("STAGELINK_CHUNK", chunk, 1);
    setenv("STAGELINK_TIMEOUT", WAIT_TIMEOUT, 1);
    /* A middle stage has four kinds of transfer in flight, and orphans. */
    setenv("STAGELINK_MAX_REQUESTS", "1040", 1);
    if (netns != NULL) {
        char port[16];
        int  lo = ephemeral_low();

        /* Below the kernel's ephemeral ports, where UCX's TCP sockets of the
         * jobs before may still hold the port (seen: "Address already in
         * use" on a port of that range, a seed lost without a report). */
        snprintf(port, sizeof(port), "%d", 10000 + (int)(mix64(seed ^
                 (uint64_t)getpid() ^ (uint64_t)time(NULL)) %
                 (uint64_t)(lo - 10000)));
        setenv("MASTER_ADDR", "198.18.0.1", 1);
        setenv("MASTER_PORT", port, 1);
    }
    per = pl.world / nodes;
    for (node = 0; node < nodes; ++node) {
        pids[node] = fork();
        if (pids[node] == 0) {
            char n_arg[16], o_arg[16], w_arg[16], t_arg[16], nodes_arg[4];
            char *argv[24];
            int   a = 0;

            close(pfd[0]);
            snprintf(n_arg, sizeof(n_arg), "%d", per);
            snprintf(o_arg, sizeof(o_arg), "%d", node * per);
            snprintf(w_arg, sizeof(w_arg), "%d", pl.world);
            snprintf(t_arg, sizeof(t_arg), "%d", JOB_TIMEOUT_S);
            snprintf(nodes_arg, sizeof(nodes_arg), "%d", nodes);
            if (netns != NULL) {
                argv[a++] = "ip";
                argv[a++] = "netns";
                argv[a++] = "exec";
                argv[a++] = ns[node];
            }
            argv[a++] = run;
            argv[a++] = "-n";
            argv[a++] = n_arg;
            argv[a++] = "-o";
            argv[a++] = o_arg;
            argv[a++] = "-w";
            argv[a++] = w_arg;
            argv[a++] = "-T";
            argv[a++] = t_arg;
            argv[a++] = "--";
            argv[a++] = self;
            argv[a++] = "--rank";
            argv[a++] = seedarg;
            argv[a++] = "--nodes";
            argv[a++] = nodes_arg;
            if (ov->set) {
                argv[a++] = "-L";
                argv[a++] = ovarg;
            }
            if (ov->no_misuse) {
                argv[a++] = "-M";
            }
            if (ov->fixed_chunk) {
                argv[a++] = "-F";
            }
            argv[a] = NULL;
            execvp(argv[0], argv);
            perror(argv[0]);
            _exit(127);
        }
    }
    close(pfd[1]);
    /* Every rank writes one line; the pipe ends when all have exited. */
    while ((r = read(pfd[0], rbuf + used, sizeof(rbuf) - 1 - used)) > 0) {
        used += (size_t)r;
        if (used == sizeof(rbuf) - 1) {
            break;
        }
    }
    rbuf[used] = '\0';
    close(pfd[0]);
    for (node = 0; node < nodes; ++node) {
        if (waitpid(pids[node], &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0) {
            rc = 1;
        }
    }
    remove_markers(idle_dir);
    for (p = rbuf; *p != '\0'; p = strchr(p, '\n') + 1) {
        unsigned long long o, b, m, f;

        if (sscanf(p, "%llu %llu %llu %llu", &o, &b, &m, &f) == 4) {
            tot->ops += o;
            tot->bytes += b;
            tot->misuse += m;
            rc |= (f != 0);
            ++got;
        }
        if (strchr(p, '\n') == NULL) {
            break;
        }
    }
    if (got != pl.world) {
        rc = 1;
    }
    ++tot->seeds;
    replay_line(replay, sizeof(replay), seed, netns, ov);
    if (rc != 0) {
        ++tot->failed;
        printf("FAIL seed %" PRIu64 ": ", seed);
        plan_print(stdout, &pl);
        printf(" (%d of %d ranks reported)\n  replay: %s\n", got, pl.world,
               replay);
    } else if (!quiet) {
        printf("ok   seed %" PRIu64 ": ", seed);
        plan_print(stdout, &pl);
        printf(" (%.0f s)\n", difftime(time(NULL), t0));
    }
    fflush(stdout);
    return rc;
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stagelink_stress [-s SEED[,SEED...]] [-r N] [-b SECONDS] "
            "[-N NS0,NS1] [-L p,t,d,mode,depth] [-M] [-F] "
            "[-G GATHER_ORDER,FAKE_NCCL] [-q]\n"
            "  -s  seeds to run (the regression list), in order\n"
            "  -r  N random seeds after them (printed)\n"
            "  -b  start no new seed after SECONDS (default: no limit)\n"
            "  -N  split each job over two network namespaces (node 0 has\n"
            "      198.18.0.1); each layout then has an even number of ranks\n"
            "  -L  force the layout and depth of every seed\n"
            "  -M  no deliberate misuse (tag reuse, size mismatch, orphans)\n"
            "  -F  fixed chunks only, never STAGELINK_CHUNK=auto (seeds found\n"
            "      before auto was drawn replay with it)\n"
            "  -G  one seed in four on one node: the gather-order job of\n"
            "      test/multiproc/gather_order.c (random) over the fake NCCL\n"
            "  -q  print failures and the summary only\n"
            "Each failure prints the seed, its layout and a replay command.\n");
}

static int parse_override(const char *text, layout_override_t *ov)
{
    char mode[32];

    if (sscanf(text, "%d,%d,%d,%31[^,],%d", &ov->p, &ov->t, &ov->d, mode,
               &ov->depth) != 5 ||
        sl_host_parse_mode(mode, &ov->mode) != 0 || ov->p < 1 || ov->t < 1 ||
        ov->d < 1 || ov->p * ov->t * ov->d > 64 || ov->depth < 1 ||
        ov->depth > MAX_DEPTH) {
        return -1;
    }
    ov->set = 1;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"rank", required_argument, NULL, 'R'},
        {"nodes", required_argument, NULL, 'n'},
        SL_TOOL_LONGOPTS,
        {NULL, 0, NULL, 0}};
    layout_override_t ov = {0};
    const char       *seeds = NULL, *netns = NULL;
    uint64_t          rank_seed = 0;
    long              nrandom = 0;
    double            budget = 0;
    int               opt, rank_mode = 0, nodes = 1, quiet = 0, rc = 0;
    totals_t          tot = {0};
    time_t            start = time(NULL);
    uint64_t          rstate;
    long              i;

    while ((opt = getopt_long(argc, argv, "s:r:b:N:L:G:MFqh", longopts, NULL)) !=
           -1) {
        switch (opt) {
        case 'R': rank_mode = 1; rank_seed = strtoull(optarg, NULL, 10); break;
        case 'n': nodes = atoi(optarg); break;
        case 's': seeds = optarg; break;
        case 'r': nrandom = atol(optarg); break;
        case 'b': budget = atof(optarg); break;
        case 'N': netns = optarg; break;
        case 'q': quiet = 1; break;
        case 'M': ov.no_misuse = 1; break;
        case 'F': ov.fixed_chunk = 1; break;
        case 'G': ov.gather_job = optarg; break;
        case 'L':
            if (parse_override(optarg, &ov) != 0) {
                fprintf(stderr, "-L wants p,t,d,mode,depth (depth 1-%d)\n",
                        MAX_DEPTH);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': return sl_tool_version("stagelink_stress");
        default: usage(stderr); return 2;
        }
    }
    if (rank_mode) {
        return rank_main(rank_seed, nodes, &ov);
    }
    if (seeds == NULL && nrandom <= 0) {
        usage(stderr);
        return 2;
    }
    for (const char *p = seeds; p != NULL && *p != '\0';) {
        char    *end;
        uint64_t s = strtoull(p, &end, 10);

        if (end == p) {
            fprintf(stderr, "bad seed list \"%s\"\n", seeds);
            return 2;
        }
        if (budget > 0 && difftime(time(NULL), start) > budget) {
            break;
        }
        rc |= run_seed(s, netns, &ov, quiet, &tot);
        p = (*end == ',') ? end + 1 : end;
    }
    rstate = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    for (i = 0; i < nrandom; ++i) {
        uint64_t s = rng_next(&rstate) % 1000000000000ull;

        if (budget > 0 && difftime(time(NULL), start) > budget) {
            break;
        }
        rc |= run_seed(s, netns, &ov, quiet, &tot);
    }
    printf("stress: %" PRIu64 " seeds, %" PRIu64 " failed; %" PRIu64
           " operations, %" PRIu64 " bytes checked, %" PRIu64
           " misuse checks; %.0f s\n", tot.seeds, tot.failed, tot.ops,
           tot.bytes, tot.misuse, difftime(time(NULL), start));
    return (rc != 0 || tot.seeds == 0) ? 1 : 0;
}
