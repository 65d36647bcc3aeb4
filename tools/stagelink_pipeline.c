/*
 * stagelink_pipeline: a training runtime's pipeline loop over the public
 * loader (STAGELINK_PLUGIN), as Megatron-LM drives it: p stages x t TP
 * ranks x d data-parallel replicas, the 1F1B schedule (v = 1) or the
 * interleaved 1F1B schedule (v model chunks per rank, the ranks wired in a
 * ring), m microbatches forward and backward.  Compute is stood in by a
 * sleep of -c us per forward (twice that per backward) and a deterministic
 * transform: every virtual stage sends the pattern of (its virtual stage,
 * microbatch, direction), and every tensor received is checked against the
 * sender's.  With -S each tensor is preceded by its size (Megatron's
 * communicate_shapes) and sequence lengths change every microbatch.
 *
 * Per mode it reports each rank's step time, bubble fraction, wait time,
 * and cross-node bytes per step; for scatter_gather the wait splits into
 * link (the same schedule in `sharded` mode: shards only) and gather (the
 * rest).  Exit 1 on any wrong byte or error.
 *   stagelink_run -n 8 -- stagelink_pipeline -t 2 -p 4 -m 8 -s 4M -c 500
 *   mpirun -np 8 stagelink_pipeline -t 2 -v 2 -m 8
 * SPDX-License-Identifier: MIT
 */
#include "host.h"
#include "pattern.h"
#include "schedule.h"

#include "tool_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Tags of size messages: the chunk field's upper half. */
#define SHAPE_TAG_BIT 0x400u

typedef struct pipe_opts {
    int    tp, pp, dp, v, m, iters, shapes;
    size_t size;
    double compute_us;
} pipe_opts_t;

typedef struct pipe_stats {
    double step, wait, compute;  /* seconds per step, means */
    double inter_bytes;          /* sent to other nodes, per step */
} pipe_stats_t;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Size of microbatch mb's tensor: fixed, or (-S) a sequence length that
 * changes every microbatch, in whole t*8-byte rows. */
static size_t tensor_size(const pipe_opts_t *o, uint32_t mb)
{
    size_t row = (size_t)o->tp * 8, rows = o->size / row;

    if (!o->shapes) {
        return o->size;
    }
    return row * (rows / 2 + (rows / 2) * ((mb * 7u) % 5u) / 4u);
}

static int virtual_stage(const pipe_opts_t *o, int rank_in_pipe, int chunk)
{
    return chunk * o->pp + rank_in_pipe;
}

typedef struct pipe_run {
    const pipe_opts_t *o;
    sl_host_t         *h;
    unsigned char     *bufs[4];
    size_t             sizes[4];
    uint64_t           shape[4][64]; /* one size per TP rank: in sharded
                                        mode each rank gets only its own */
    double             wait;
    int                stage; /* place in the pipeline (the ring's has no
                                 pp_index from the plugin: placement is
                                 explicit) */
} pipe_run_t;

static stagelink_xfer_t op_xfer(const sl_sched_op_t *op, void *buf,
                                size_t nbytes, int shape)
{
    int to_next = op->send ? !op->backward : op->backward;

    return sl_host_xfer(to_next ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                        buf, nbytes, 8, op->microbatch,
                        (uint16_t)(op->chunk | (shape ? SHAPE_TAG_BIT : 0)));
}

/* Posts the step's operations as one batch (receives first) and waits. */
static int post_wait(pipe_run_t *r, stagelink_op_t *ops, int n)
{
    stagelink_request_t *reqs[4];
    double               t0 = now();
    int                  i;

    if (sl_host_report(r->h, r->h->plugin->post_batch(r->h->comm, ops,
                                                      (size_t)n, reqs),
                       "post_batch")) {
        return -1;
    }
    for (i = 0; i < n; ++i) {
        if (sl_host_report(r->h, r->h->plugin->wait(r->h->comm, reqs[i]),
                           "wait")) {
            return -1;
        }
    }
    r->wait += now() - t0;
    return 0;
}

static int run_step(pipe_run_t *r, const sl_sched_step_t *st)
{
    const pipe_opts_t *o  = r->o;
    int                pr = r->stage, i;
    stagelink_op_t     ops[4];

    /* Every forward unit costs c and every backward unit 2c: after its
     * input arrives, or, at the two ends of the virtual pipeline (data in,
     * loss), before what it sends. */
    for (i = 0; i < st->nops; ++i) {
        int vs = virtual_stage(o, pr, st->ops[i].local);

        if (st->ops[i].send &&
            (st->ops[i].backward ? vs == o->pp * o->v - 1 : vs == 0)) {
            sl_host_compute(o->compute_us * (st->ops[i].backward ? 2 : 1));
        }
    }
    for (i = 0; i < st->nops; ++i) {
        const sl_sched_op_t *op = &st->ops[i];
        int                  k;

        ops[i].kind = op->send ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;
        r->sizes[i] = tensor_size(o, op->microbatch);
        for (k = 0; k < o->tp; ++k) {
            r->shape[i][k] = op->send ? r->sizes[i] : 0;
        }
        ops[i].xfer = op_xfer(op, r->shape[i], 8 * (size_t)o->tp, 1);
    }
    if (o->shapes && post_wait(r, ops, st->nops) != 0) {
        return -1;
    }
    for (i = 0; i < st->nops; ++i) {
        const sl_sched_op_t *op = &st->ops[i];
        int vs = virtual_stage(o, pr, op->local);

        if (op->send) {
            sl_pattern_fill(r->bufs[i], 0, r->sizes[i],
                            sl_pattern_seed(vs, op->microbatch, 0,
                                            op->backward));
        } else if (o->shapes &&
                   r->shape[i][r->h->info.tp_index] != r->sizes[i]) {
            fprintf(stderr, "rank %d: microbatch %u chunk %u announced %llu "
                    "bytes, expected %zu\n", r->h->info.rank, op->microbatch,
                    op->chunk,
                    (unsigned long long)r->shape[i][r->h->info.tp_index],
                    r->sizes[i]);
            return -1;
        }
        ops[i].kind = op->send ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;
        ops[i].xfer = op_xfer(op, r->bufs[i], r->sizes[i], 0);
    }
    if (post_wait(r, ops, st->nops) != 0) {
        return -1;
    }
    for (i = 0; i < st->nops; ++i) {
        const sl_sched_op_t *op = &st->ops[i];
        /* The sender's virtual stage: the one before (forward) or after. */
        int    from = virtual_stage(o, pr, op->chunk) + (op->backward ? 1 : -1);
        size_t len = r->sizes[i], off = 0, at;

        if (op->send) {
            continue;
        }
        if (r->h->info.mode == STAGELINK_MODE_SHARDED) {
            /* Sizes are whole t-row multiples: shards are equal. */
            len /= (size_t)o->tp;
            off  = len * (size_t)r->h->info.tp_index;
        }
        at = sl_pattern_check(r->bufs[i], off, len,
                              sl_pattern_seed(from, op->microbatch, 0,
                                              op->backward));
        if (at != SIZE_MAX) {
            fprintf(stderr, "rank %d: %s microbatch %u chunk %u: byte %zu of "
                    "%zu differs from what virtual stage %d sent\n",
                    r->h->info.rank, op->backward ? "backward" : "forward",
                    op->microbatch, op->chunk, at, r->sizes[i], from);
            return -1;
        }
        sl_host_compute(o->compute_us * (op->backward ? 2 : 1));
    }
    return 0;
}

/* The interleaved schedule's ring: each rank's next is the same TP and DP
 * position one stage on, the last stage's next the first stage. */
static void ring_topology(const pipe_opts_t *o, int rank,
                          stagelink_topology_t *topo, int *tp_ranks)
{
    int per_stage = o->tp * o->dp, stage = rank / per_stage;
    int in_stage  = rank % per_stage, k;

    topo->prev_rank = ((stage + o->pp - 1) % o->pp) * per_stage + in_stage;
    topo->next_rank = ((stage + 1) % o->pp) * per_stage + in_stage;
    topo->tp_index  = in_stage % o->tp;
    for (k = 0; k < o->tp; ++k) {
        tp_ranks[k] = stage * per_stage + (in_stage / o->tp) * o->tp + k;
    }
    topo->tp_ranks = tp_ranks;
}

static int run_mode(const pipe_opts_t *o, stagelink_mode_t mode,
                    pipe_stats_t *st)
{
    stagelink_config_t   cfg = {.struct_size = sizeof(cfg)};
    stagelink_topology_t topo = {.struct_size = sizeof(topo)};
    stagelink_counters_t c0, c1;
    sl_sched_step_t     *steps;
    sl_host_t            h;
    pipe_run_t           r;
    double              *times, t0, compute_sum = 0;
    int                  tp_ranks[64], nsteps, it, s, i, rc = 0;

    char                 why[512];
    int                  rank = sl_host_job(why, sizeof(why)).rank;

    cfg.tp_size = o->tp;
    cfg.pp_size = o->pp;
    cfg.mode    = mode;
    if (o->v > 1) {
        ring_topology(o, rank, &topo, tp_ranks);
        cfg.topology = &topo;
    }
    if (sl_host_open_config(&h, &cfg) != 0) {
        return -1;
    }
    steps  = calloc((size_t)SL_SCHED_MAX_STEPS(o->m, o->v) * 2, sizeof(*steps));
    times  = calloc((size_t)o->iters, sizeof(*times));
    memset(&r, 0, sizeof(r));
    r.o     = o;
    r.h     = &h;
    r.stage = (o->v > 1) ? rank / (o->tp * o->dp) : h.info.pp_index;
    for (i = 0; i < 4; ++i) {
        r.bufs[i] = malloc(o->size ? o->size : 1);
    }
    nsteps = (o->v > 1) ? sl_schedule_interleaved(r.stage, o->pp, o->m,
                                                  o->v, steps)
                        : sl_schedule_1f1b(r.stage, o->pp, o->m, 1, steps);
    compute_sum = o->compute_us * 1e-6 * 3 * o->m * o->v;
    h.plugin->get_counters(h.comm, &c0);
    for (it = 0; it <= o->iters && rc == 0; ++it) {
        if (it == 1) { /* the first step warms up and is not counted */
            r.wait = 0;
            h.plugin->get_counters(h.comm, &c0);
        }
        t0 = now();
        for (s = 0; s < nsteps && rc == 0; ++s) {
            rc = run_step(&r, &steps[s]);
        }
        if (it > 0) {
            times[it - 1] = now() - t0;
        }
    }
    h.plugin->get_counters(h.comm, &c1);
    if (rc == 0) {
        for (st->step = 0, it = 0; it < o->iters; ++it) {
            st->step += times[it] / o->iters;
        }
        st->wait        = r.wait / o->iters;
        st->compute     = compute_sum;
        st->inter_bytes = (double)(c1.inter_node_bytes_sent -
                                   c0.inter_node_bytes_sent) / o->iters;
    }
    for (i = 0; i < 4; ++i) {
        free(r.bufs[i]);
    }
    free(times);
    free(steps);
    sl_host_close(&h);
    return rc;
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stagelink_pipeline [-t TP] [-p PP] [-v CHUNKS] [-m MICROBATCHES]\n"
            "         [-s SIZE] [-c COMPUTE_US] [-i STEPS] [-M MODES] [-S]\n"
            "  -t  tensor-parallel size (default 1); -p stages (default: world / t,\n"
            "      the rest data-parallel replicas)\n"
            "  -v  model chunks per stage: > 1 runs the interleaved schedule (default 1)\n"
            "  -m  microbatches per step (default 2p; a multiple of p when -v > 1)\n"
            "  -s  activation tensor size, e.g. 1M, in whole 8t-byte rows (default 1M)\n"
            "  -c  compute per microbatch forward, us (backward twice; default 0)\n"
            "  -i  measured steps after one warm-up step (default 3)\n"
            "  -M  modes, comma-separated (default full,scatter_gather)\n"
            "  -S  variable shapes: a size message before each tensor\n"
            "  --csv  one CSV row a rank and mode; --json  one JSON object a line\n");
}

typedef enum pipe_out { OUT_TEXT, OUT_CSV, OUT_JSON } pipe_out_t;

/* One rank's line for one mode, written at once: ranks share the output. */
static void print_row(pipe_out_t out, const pipe_opts_t *o, int rank,
                      const char *mode, const pipe_stats_t *st)
{
    /* Bubble: the part of the step this rank did not compute (with no
     * compute time given there is nothing to compare: -1, "-"). */
    double pct = (st->compute > 0) ? 100.0 * (1.0 - st->compute / st->step) : -1;
    char   bubble[16] = "-";

    if (out == OUT_TEXT) {
        if (pct >= 0) {
            snprintf(bubble, sizeof(bubble), "%.1f%%", pct);
        }
        printf("  %-4d %-15s %10.3f %8s %10.3f %16.0f\n", rank, mode,
               st->step * 1e3, bubble, st->wait * 1e3, st->inter_bytes);
    } else if (out == OUT_CSV) {
        printf("%d,%s,%s,%d,%d,%d,%d,%d,%zu,%.1f,%d,%.3f,%.1f,%.3f,%.0f\n",
               rank, mode, o->v > 1 ? "interleaved" : "1f1b", o->pp, o->tp,
               o->dp, o->v, o->m, o->size, o->compute_us, o->iters,
               st->step * 1e3, pct, st->wait * 1e3, st->inter_bytes);
    } else {
        printf("{\"rank\": %d, \"mode\": \"%s\", \"schedule\": \"%s\", "
               "\"p\": %d, \"t\": %d, \"d\": %d, \"v\": %d, "
               "\"microbatches\": %d, \"size\": %zu, \"compute_us\": %.1f, "
               "\"steps\": %d, \"step_ms\": %.3f, \"bubble_pct\": %.1f, "
               "\"wait_ms\": %.3f, \"xnode_B_per_step\": %.0f}\n",
               rank, mode, o->v > 1 ? "interleaved" : "1f1b", o->pp, o->tp,
               o->dp, o->v, o->m, o->size, o->compute_us, o->iters,
               st->step * 1e3, pct, st->wait * 1e3, st->inter_bytes);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    pipe_opts_t  o = {.tp = 1, .v = 1, .iters = 3, .size = 1u << 20};
    char         modes[128] = "full,scatter_gather", *save = NULL, *name;
    char         why[512];
    stagelink_job_info_t job = sl_host_job(why, sizeof(why)); /* before init */
    int          opt, world = job.world_size;
    int          rank = job.rank, rc = 0;
    pipe_stats_t sg = {0}, sh = {0}, st;
    stagelink_mode_t mode;
    pipe_out_t   out = OUT_TEXT;
    static const struct option longopts[] = {
        SL_TOOL_LONGOPTS, {"csv", no_argument, NULL, 'C'},
        {"json", no_argument, NULL, 'J'}, {NULL, 0, NULL, 0}};

    while ((opt = getopt_long(argc, argv, "t:p:v:m:s:c:i:M:Sh", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 't': o.tp = atoi(optarg); break;
        case 'p': o.pp = atoi(optarg); break;
        case 'v': o.v = atoi(optarg); break;
        case 'm': o.m = atoi(optarg); break;
        case 's':
            if (sl_host_parse_size(optarg, &o.size) != 0) {
                usage(stderr);
                return 2;
            }
            break;
        case 'c': o.compute_us = atof(optarg); break;
        case 'i': o.iters = atoi(optarg); break;
        case 'M': snprintf(modes, sizeof(modes), "%s", optarg); break;
        case 'S': o.shapes = 1; break;
        case 'C': out = OUT_CSV; break;
        case 'J': out = OUT_JSON; break;
        case 'h': usage(stdout); return 0;
        case 'V': return sl_tool_version("stagelink_pipeline");
        default: usage(stderr); return 2;
        }
    }
    if (o.pp == 0) {
        o.pp = world / (o.tp > 0 ? o.tp : 1);
    }
    o.dp = (o.tp > 0 && o.pp > 0) ? world / (o.tp * o.pp) : 0;
    if (o.m == 0) {
        o.m = 2 * o.pp;
    }
    o.size -= o.size % (8 * (size_t)(o.tp > 0 ? o.tp : 1)); /* whole rows */
    if (o.tp < 1 || o.tp > 64 || o.pp < 2 || o.dp < 1 || o.tp * o.pp * o.dp != world ||
        o.v < 1 || o.m < 1 || o.iters < 1 || (o.v > 1 && o.m % o.pp != 0)) {
        if (why[0] != '\0') {
            fprintf(stderr, "stagelink_pipeline: %s\n", why); /* the cause */
        }
        fprintf(stderr, "stagelink_pipeline: world %d does not split into "
                "t=%d x p=%d x d=%d with v=%d, m=%d (p >= 2; m a multiple "
                "of p when v > 1)\n", world, o.tp, o.pp, o.dp, o.v, o.m);
        usage(stderr);
        return 2;
    }
    if (rank == 0 && out == OUT_CSV) {
        printf("rank,mode,schedule,p,t,d,v,microbatches,size,compute_us,steps,"
               "step_ms,bubble_pct,wait_ms,xnode_B_per_step\n");
    } else if (rank == 0 && out == OUT_TEXT) {
        printf("# %s 1F1B, p=%d t=%d d=%d v=%d, %d microbatches of %zu bytes%s, "
               "compute %.0f us forward / %.0f us backward, %d steps\n",
               o.v > 1 ? "interleaved" : "plain", o.pp, o.tp, o.dp, o.v, o.m,
               o.size, o.shapes ? " (variable shapes, sizes exchanged)" : "",
               o.compute_us, 2 * o.compute_us, o.iters);
        printf("# %-4s %-15s %10s %8s %10s %16s\n", "rank", "mode", "step ms",
               "bubble", "wait ms", "cross-node B/step");
    }
    fflush(stdout);
    for (name = strtok_r(modes, ",", &save); name != NULL && rc == 0;
         name = strtok_r(NULL, ",", &save)) {
        if (sl_host_parse_mode(name, &mode) != 0) {
            fprintf(stderr, "unknown mode %s\n", name);
            return 2;
        }
        rc = run_mode(&o, mode, &st);
        if (rc != 0) {
            break;
        }
        print_row(out, &o, rank, name, &st);
        if (mode == STAGELINK_MODE_SCATTER_GATHER) {
            sg = st;
            if (o.tp > 1) { /* the same schedule with shards only: the link */
                rc = run_mode(&o, STAGELINK_MODE_SHARDED, &sh);
                if (rc == 0 && out == OUT_TEXT) {
                    printf("  %-4d %-15s link %.3f ms + gather %.3f ms of "
                           "the %.3f ms wait\n", rank, "  split", sh.wait * 1e3,
                           (sg.wait > sh.wait ? sg.wait - sh.wait : 0) * 1e3,
                           sg.wait * 1e3);
                } else if (rc == 0) {
                    print_row(out, &o, rank, "sharded", &sh);
                }
                fflush(stdout);
            }
        }
    }
    if (rc == 0 && rank == 0 && out == OUT_TEXT) {
        printf("# every tensor received was checked against its sender's "
               "pattern\n");
    }
    return rc ? 1 : 0;
}
