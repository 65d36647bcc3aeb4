/*
 * One rank of a multi-process transfer test.  Started by stagelink_run (or
 * mpirun), it loads the plugin through the loader and runs a scenario over
 * a list of sizes; every received byte is checked against the pattern of
 * the sending stage, microbatch, chunk, direction and offset.
 *
 *   xfer_check -t TP [-p PP] [-m MODE] [-s SIZES] [-n MICROBATCHES]
 *              [-v CHUNKS] [-r] SCENARIO
 *   scenarios: sweep (also checks the byte counters), inflight, 1f1b
 *   -r: register every buffer with mem_register first
 *
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"
#include "pattern.h"
#include "schedule.h"

#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL 0xee

#define MAX_REGS 4

typedef struct check {
    sl_host_t         host;
    stagelink_mode_t  mode;
    int               stage, nstages, tp, tp_index;
    int               register_buffers;
    int               nregs;
    struct {
        unsigned char    *base;
        size_t            len;
        stagelink_memh_t *memh;
    } regs[MAX_REGS];
} check_t;

typedef struct xfer_slot {
    unsigned char       *buf;
    size_t               nbytes;
    int                  recv, backward, src_stage;
    uint32_t             mb, chunk;
    stagelink_request_t *req;
} xfer_slot_t;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);

    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* A plugin call's status checked: sl_host_report printed why it failed. */
static int failed_call(check_t *c, stagelink_status_t st, const char *what)
{
    int failed = sl_host_report(&c->host, st, what);

    CHECK(!failed, "rank %d: %s failed (above)", c->host.info.rank, what);
    return failed;
}

/* Allocates a buffer, registered with the plugin when -r was given. */
static unsigned char *buf_alloc(check_t *c, size_t n)
{
    unsigned char *p = xmalloc(n);

    if (c->register_buffers && n > 0 && c->nregs < MAX_REGS) {
        if (failed_call(c, c->host.plugin->mem_register(
                                         c->host.comm, p, n, STAGELINK_MEM_HOST,
                                         &c->regs[c->nregs].memh),
                           "mem_register") == 0) {
            c->regs[c->nregs].base  = p;
            c->regs[c->nregs++].len = n;
        }
    }
    return p;
}

static void buf_free(check_t *c, unsigned char *p)
{
    int i;

    for (i = 0; i < c->nregs; ++i) {
        if (c->regs[i].base == p) {
            failed_call(c, c->host.plugin->mem_deregister(c->host.comm,
                                                          c->regs[i].memh),
                        "mem_deregister");
            c->regs[i] = c->regs[--c->nregs];
            break;
        }
    }
    free(p);
}

static stagelink_memh_t *memh_of(const check_t *c, const unsigned char *p)
{
    int i;

    for (i = 0; i < c->nregs; ++i) {
        if (p >= c->regs[i].base && p < c->regs[i].base + c->regs[i].len) {
            return c->regs[i].memh;
        }
    }
    return NULL;
}

/* An independent statement of the shard rule, not the library's code. */
static void expected_shard(const check_t *c, size_t nbytes, size_t esize,
                           size_t *off, size_t *len)
{
    size_t n = nbytes / esize, q = n / (size_t)c->tp, r = n % (size_t)c->tp;
    size_t i = (size_t)c->tp_index;

    *off = (i * q + (i < r ? i : r)) * esize;
    *len = (q + (i < r ? 1 : 0)) * esize;
}

static void slot_prepare(check_t *c, xfer_slot_t *s)
{
    if (s->recv) {
        memset(s->buf, SENTINEL, s->nbytes);
    } else {
        sl_pattern_fill(s->buf, 0, s->nbytes,
                        sl_pattern_seed(c->stage, s->mb, s->chunk, s->backward));
    }
}

static stagelink_xfer_t slot_xfer(const check_t *c, const xfer_slot_t *s)
{
    int              to_next = s->recv ? s->backward : !s->backward;
    stagelink_xfer_t x = sl_host_xfer(to_next ? STAGELINK_PEER_NEXT
                                              : STAGELINK_PEER_PREV,
                                      s->buf, s->nbytes,
                                      (s->nbytes % 2 == 0) ? 2 : 1, s->mb,
                                      (uint16_t)s->chunk);

    x.memh = memh_of(c, s->buf);
    return x;
}

static void slot_post(check_t *c, xfer_slot_t *s)
{
    stagelink_xfer_t   x = slot_xfer(c, s);
    stagelink_status_t st;

    slot_prepare(c, s);
    st = s->recv ? c->host.plugin->irecv(c->host.comm, &x, &s->req)
                 : c->host.plugin->isend(c->host.comm, &x, &s->req);
    if (failed_call(c, st, s->recv ? "irecv" : "isend")) {
        s->req = NULL;
    }
}

static void slot_verify(check_t *c, const xfer_slot_t *s)
{
    uint64_t seed = sl_pattern_seed(s->src_stage, s->mb, s->chunk, s->backward);
    size_t   off = 0, len = s->nbytes, bad, i;
    size_t   esize = (s->nbytes % 2 == 0) ? 2 : 1;

    if (c->mode == STAGELINK_MODE_SHARDED) {
        expected_shard(c, s->nbytes, esize, &off, &len);
        for (i = 0; i < s->nbytes; ++i) {
            if ((i < off || i >= off + len) && s->buf[i] != SENTINEL) {
                CHECK(0, "rank %d: sharded mode wrote byte %zu outside its "
                      "shard [%zu, %zu) of mb %u (%zu bytes)",
                      c->host.info.rank, i, off, off + len, s->mb, s->nbytes);
                return;
            }
        }
    }
    bad = sl_pattern_check(s->buf, off, len, seed);
    CHECK(bad == SIZE_MAX, "rank %d: %s mb %u chunk %u (%zu bytes, mode %s, "
          "t=%d): byte %zu is 0x%02x, expected the pattern of stage %d",
          c->host.info.rank, s->backward ? "backward" : "forward", s->mb,
          s->chunk, s->nbytes, sl_host_mode_name(c->mode), c->tp, bad,
          (bad != SIZE_MAX) ? s->buf[bad] : 0, s->src_stage);
}

static void slot_wait(check_t *c, xfer_slot_t *s)
{
    if (s->req == NULL) {
        return;
    }
    if (!failed_call(c, c->host.plugin->wait(c->host.comm, s->req),
                     "wait") && s->recv) {
        slot_verify(c, s);
    }
    s->req = NULL;
}

/* Fills a slot for this stage: a send or receive in one direction. */
static int slot_make(check_t *c, xfer_slot_t *s, unsigned char *buf,
                     size_t nbytes, int recv, int backward, uint32_t mb,
                     uint32_t chunk)
{
    int peer_stage = (recv != backward) ? c->stage - 1 : c->stage + 1;

    if (peer_stage < 0 || peer_stage >= c->nstages) {
        return 0;
    }
    memset(s, 0, sizeof(*s));
    s->buf       = buf;
    s->nbytes    = nbytes;
    s->recv      = recv;
    s->backward  = backward;
    s->mb        = mb;
    s->chunk     = chunk;
    s->src_stage = recv ? peer_stage : c->stage;
    return 1;
}

static void check_counter(check_t *c, const char *name, uint64_t got,
                          uint64_t want, size_t nbytes)
{
    CHECK(got == want, "rank %d: counter %s grew by %llu, expected %llu "
          "(%zu bytes, mode %s, t=%d)", c->host.info.rank, name,
          (unsigned long long)got, (unsigned long long)want, nbytes,
          sl_host_mode_name(c->mode), c->tp);
}

/*
 * Forward then backward across every boundary, one transfer at a time;
 * the counters must have grown by exactly the bytes each mode moves.
 */
static void run_sweep(check_t *c, size_t nbytes)
{
    unsigned char       *sbuf = buf_alloc(c, nbytes), *rbuf = buf_alloc(c, nbytes);
    size_t               off, own, stage_bytes;
    uint64_t             sends = 0, recvs = 0;
    stagelink_counters_t before, after;
    xfer_slot_t          s, r;
    int                  backward, hs, hr, gathers;

    expected_shard(c, nbytes, (nbytes % 2 == 0) ? 2 : 1, &off, &own);
    stage_bytes = (c->mode == STAGELINK_MODE_FULL) ? nbytes : own;
    gathers     = (c->mode == STAGELINK_MODE_SCATTER_GATHER && c->tp > 1);
    c->host.plugin->get_counters(c->host.comm, &before);
    for (backward = 0; backward < 2; ++backward) {
        hs = slot_make(c, &s, sbuf, nbytes, 0, backward, 7, 1);
        hr = slot_make(c, &r, rbuf, nbytes, 1, backward, 7, 1);
        sends += (uint64_t)hs;
        recvs += (uint64_t)hr;
        if (hr) slot_post(c, &r);
        if (hs) slot_post(c, &s);
        if (hs) slot_wait(c, &s);
        if (hr) slot_wait(c, &r);
    }
    c->host.plugin->get_counters(c->host.comm, &after);
    check_counter(c, "stage_bytes_sent",
                  after.stage_bytes_sent - before.stage_bytes_sent,
                  sends * stage_bytes, nbytes);
    check_counter(c, "stage_bytes_recv",
                  after.stage_bytes_recv - before.stage_bytes_recv,
                  recvs * stage_bytes, nbytes);
    check_counter(c, "gather_bytes_sent",
                  after.gather_bytes_sent - before.gather_bytes_sent,
                  gathers ? recvs * own * (uint64_t)(c->tp - 1) : 0, nbytes);
    check_counter(c, "gather_bytes_recv",
                  after.gather_bytes_recv - before.gather_bytes_recv,
                  gathers ? recvs * (nbytes - own) : 0, nbytes);
    check_counter(c, "transfers_completed",
                  after.transfers_completed - before.transfers_completed,
                  sends + recvs, nbytes);
    check_counter(c, "inter+intra = stage+gather (sent)",
                  (after.inter_node_bytes_sent + after.intra_node_bytes_sent) -
                      (before.inter_node_bytes_sent + before.intra_node_bytes_sent),
                  (after.stage_bytes_sent + after.gather_bytes_sent) -
                      (before.stage_bytes_sent + before.gather_bytes_sent),
                  nbytes);
    buf_free(c, sbuf);
    buf_free(c, rbuf);
}

static int gcd(int a, int b)
{
    return (b == 0) ? a : gcd(b, a % b);
}

/*
 * n microbatches in flight in both directions: receives posted in reverse
 * order, directions interleaved, chunks varied, completion in yet another
 * order.
 */
static void run_inflight(check_t *c, size_t nbytes, int n)
{
    xfer_slot_t   *slots = xmalloc(sizeof(*slots) * (size_t)n * 4);
    unsigned char *mem   = buf_alloc(c, nbytes * (size_t)n * 4);
    int            count = 0, i, backward, recv, stride = 7;

    for (recv = 1; recv >= 0; --recv) {
        for (i = 0; i < n; ++i) {
            for (backward = 0; backward < 2; ++backward) {
                uint32_t mb = (uint32_t)(recv ? n - 1 - i : i);
                if (slot_make(c, &slots[count], mem + nbytes * (size_t)count,
                              nbytes, recv, backward, mb, mb % 3)) {
                    slot_post(c, &slots[count++]);
                }
            }
        }
    }
    /* Complete in a permuted order: a stride coprime with the count. */
    while (count > 0 && gcd(stride, count) != 1) {
        ++stride;
    }
    for (i = 0; i < count; ++i) {
        slot_wait(c, &slots[(i * stride) % count]);
    }
    buf_free(c, mem);
    free(slots);
}

static void batch_run(check_t *c, xfer_slot_t *slots, int n)
{
    stagelink_op_t       ops[2] = {0};
    stagelink_request_t *reqs[2];
    int                  i;

    if (n == 0) {
        return;
    }
    for (i = 0; i < n; ++i) {
        slot_prepare(c, &slots[i]);
        ops[i].kind = slots[i].recv ? STAGELINK_OP_RECV : STAGELINK_OP_SEND;
        ops[i].xfer = slot_xfer(c, &slots[i]);
    }
    if (failed_call(c, c->host.plugin->post_batch(
                                     c->host.comm, ops, (size_t)n, reqs),
                       "post_batch")) {
        return;
    }
    for (i = 0; i < n; ++i) {
        slots[i].req = reqs[i];
    }
    for (i = n - 1; i >= 0; --i) {
        slot_wait(c, &slots[i]);
    }
}

/* Megatron's 1F1B schedule, with its batched pairs (tools/common/schedule). */
static void run_1f1b(check_t *c, size_t nbytes, int m, int v)
{
    unsigned char   *a = buf_alloc(c, nbytes), *b = buf_alloc(c, nbytes);
    sl_sched_step_t *steps = xmalloc(sizeof(*steps) * (size_t)SL_SCHED_MAX_STEPS(m, v));
    xfer_slot_t      slots[2];
    int              nsteps = sl_schedule_1f1b(c->stage, c->nstages, m, v, steps);
    int              i, k, n;

    for (i = 0; i < nsteps; ++i) {
        n = 0;
        for (k = 0; k < steps[i].nops; ++k) {
            const sl_sched_op_t *op = &steps[i].ops[k];

            n += slot_make(c, &slots[n], op->send ? b : a, nbytes, !op->send,
                           op->backward, op->microbatch, op->chunk);
        }
        batch_run(c, slots, n);
    }
    free(steps);
    buf_free(c, a);
    buf_free(c, b);
}

static int parse_sizes(const char *list, size_t *sizes, int max)
{
    char  copy[512], *save = NULL, *item;
    int   n = 0;

    snprintf(copy, sizeof(copy), "%s", list);
    for (item = strtok_r(copy, ",", &save); item && n < max;
         item = strtok_r(NULL, ",", &save)) {
        if (sl_host_parse_size(item, &sizes[n++]) != 0) {
            return -1;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    check_t     c;
    size_t      sizes[32];
    const char *size_list = "0,1,7,4099,65536,1048577";
    int         nsizes, i, opt, tp = 1, pp = 0, microbatches = 32, reg = 0;
    int         chunks = 1;
    stagelink_mode_t mode = STAGELINK_MODE_DEFAULT;
    const char *scenario;

    while ((opt = getopt(argc, argv, "t:p:m:s:n:v:r")) != -1) {
        switch (opt) {
        case 'v': chunks = atoi(optarg); break;
        case 'r': reg = 1; break;
        case 't': tp = atoi(optarg); break;
        case 'p': pp = atoi(optarg); break;
        case 'n': microbatches = atoi(optarg); break;
        case 's': size_list = optarg; break;
        case 'm':
            if (sl_host_parse_mode(optarg, &mode) != 0) {
                fprintf(stderr, "unknown mode %s\n", optarg);
                return 2;
            }
            break;
        default: return 2;
        }
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: xfer_check -t TP [-p PP] [-m MODE] [-s SIZES] "
                "[-n MICROBATCHES] sweep|inflight|1f1b\n");
        return 2;
    }
    scenario = argv[optind];
    nsizes   = parse_sizes(size_list, sizes, 32);
    if (nsizes < 0) {
        fprintf(stderr, "bad size list %s\n", size_list);
        return 2;
    }

    memset(&c, 0, sizeof(c));
    if (sl_host_open(&c.host, tp, pp, mode) != 0) {
        return 1;
    }
    c.mode     = c.host.info.mode;
    c.stage    = c.host.info.pp_index;
    c.nstages  = c.host.info.pp_size;
    c.tp       = c.host.info.tp_size;
    c.tp_index = c.host.info.tp_index;
    c.register_buffers = reg;

    for (i = 0; i < nsizes; ++i) {
        if (strcmp(scenario, "sweep") == 0) {
            run_sweep(&c, sizes[i]);
        } else if (strcmp(scenario, "inflight") == 0) {
            run_inflight(&c, sizes[i], microbatches);
        } else if (strcmp(scenario, "1f1b") == 0) {
            run_1f1b(&c, sizes[i], microbatches, chunks);
        } else {
            fprintf(stderr, "unknown scenario %s\n", scenario);
            return 2;
        }
    }
    if (c.host.info.rank == 0) {
        printf("%s t=%d p=%d mode=%s sizes=%s%s: %s\n", scenario, c.tp,
               c.nstages, sl_host_mode_name(c.mode), size_list,
               reg ? " registered" : "", check_failed ? "FAILED" : "ok");
    }
    sl_host_close(&c.host);
    return check_summary();
}
