/*
 * stagelink_perftest: boundary transfer timing in the manner of
 * ucx_perftest and nccl-tests, on two pipeline stages of t TP ranks.  Like
 * ucx_perftest's tag_lat it is a ping-pong: stage 0 sends the tensor
 * forward, stage 1 sends it back as soon as it is whole (shard received and
 * gathered), and half the round trip is the boundary time.  The returned
 * tensor is checked byte by byte.  Launch under stagelink_run, torchrun or
 * mpirun with 2t ranks.
 *
 *   stagelink_perftest -t TP [-k boundary|shard|gather|stream|duplex|pipeline|init] [-M MODE]
 *                      [-m host|cuda] [-b MIN -e MAX -f FACTOR | -s LIST]
 *                      [-n ITERS] [-w WARMUP] [-c 0|1] [--csv] [--corrupt]
 *
 * Tests: boundary (default: the mode's whole path), shard (the inter-node
 * shard alone: sharded mode), gather (the intra-node rebuild alone: the
 * scatter_gather time minus the shard time, both measured in this run),
 * stream (bandwidth, as ucx_perftest's tag_bw: stage 0 streams ITERS
 * tensors forward with 4 in flight, stage 1 answers once at the end; the
 * time is the total over ITERS, and the link carries one direction only),
 * duplex (the same stream both ways at once: stage 1 streams ITERS
 * tensors back meanwhile; the time is per tensor and direction),
 * pipeline (one training step of Megatron's 1F1B schedule: -B microbatches
 * of -V virtual chunks, activations forward and gradients back, posted in
 * batches as send_forward_recv_backward; the time is the step's; with
 * -P US each batch is followed by US of compute, a sleep that leaves the
 * CPU to the transport as a GPU kernel does, before its waits, and the
 * last column, blocked, is the time per step spent in them: the exposed
 * communication), init
 * (comm_init itself, its bootstrap included, ITERS times after WARMUP, each
 * ended by comm_finalize; rank 0 reports the median and spread of its
 * init, which completes once every rank's has).
 * --corrupt flips one byte on the way back: the check must fail (exit 1).
 *
 * -m is the memory type, as in ucx_perftest: cuda puts both tensors in
 * device memory (cudaMalloc on device LOCAL_RANK % count); the pattern is
 * written and checked through copies.  -M (--mode) is the boundary mode.
 *
 * SPDX-License-Identifier: MIT
 */
#include "host.h"
#include "pattern.h"
#include "schedule.h"
#include "tool_opts.h"

#ifdef STAGELINK_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum perf_kind {
    PERF_BOUNDARY, PERF_SHARD, PERF_GATHER, PERF_STREAM, PERF_PIPELINE,
    PERF_DUPLEX, PERF_INIT
} perf_kind_t;

#define PERF_WINDOW 4

typedef struct perf_opts {
    int              tp, iters, warmup, check, csv, cuda, corrupt;
    int              microbatches, chunks;  /* pipeline */
    int              compute_us;            /* pipeline: per schedule step */
    perf_kind_t      kind;
    stagelink_mode_t mode;
    size_t           sizes[64];
    int              nsizes;
} perf_opts_t;

/* Per-size figures of one rank. */
typedef struct perf_result {
    double   p50_us, avg_us, max_us; /* one-way boundary time: round trip / 2 */
    double   stage_per_rank;         /* bytes this rank sent to the other stage */
    double   inter_node_per_rank;    /* of which to another node */
    double   gather_per_rank;        /* bytes it sent inside its TP group */
    double   blocked_us;             /* pipeline: per step, in waits */
    uint64_t wrong;
} perf_result_t;

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stagelink_perftest -t TP [-k boundary|shard|gather|stream|duplex|pipeline|init]\n"
            "         [-B MICROBATCHES] [-V CHUNKS] [-P COMPUTE_US] (pipeline;\n"
            "         default 16, 1, 0)\n"
            "         [-M scatter_gather|full|sharded] [-m host|cuda] [--corrupt]\n"
            "         [-b MIN -e MAX -f FACTOR | -s SIZE,SIZE,...] [-n ITERS]\n"
            "         [-w WARMUP] [-c 0|1] [--csv]\n"
            "  Runs on 2 stages of TP ranks (2*TP ranks).  Sizes take K/M/G\n"
            "  suffixes (powers of 2).  Exits 1 on a data mismatch.\n");
}

static int parse_opts(int argc, char **argv, perf_opts_t *o)
{
    static const struct option longopts[] = {{"csv", no_argument, NULL, 'C'},
                                             {"mode", required_argument, NULL, 'M'},
                                             {"corrupt", no_argument, NULL, 'X'},
                                             {"help", no_argument, NULL, 'h'},
                                             {"version", no_argument, NULL, 256},
                                             {NULL, 0, NULL, 0}};
    size_t min = 1 << 20, max = 1 << 20, v;
    int    factor = 2, opt, have_list = 0;
    char  *save = NULL, *item;

    memset(o, 0, sizeof(*o));
    o->tp = 1, o->iters = 20, o->warmup = 5, o->check = 1;
    o->microbatches = 16, o->chunks = 1;
    while ((opt = getopt_long(argc, argv, "t:k:m:M:b:e:f:s:n:w:c:B:V:P:h", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 't': o->tp = atoi(optarg); break;
        case 'n': o->iters = atoi(optarg); break;
        case 'w': o->warmup = atoi(optarg); break;
        case 'c': o->check = atoi(optarg); break;
        case 'f': factor = atoi(optarg); break;
        case 'C': o->csv = 1; break;
        case 'B': o->microbatches = atoi(optarg); break;
        case 'V': o->chunks = atoi(optarg); break;
        case 'P': o->compute_us = atoi(optarg); break;
        case 'X': o->corrupt = 1; break;
        case 'k':
            if (strcmp(optarg, "boundary") == 0) {
                o->kind = PERF_BOUNDARY;
            } else if (strcmp(optarg, "shard") == 0) {
                o->kind = PERF_SHARD;
            } else if (strcmp(optarg, "gather") == 0) {
                o->kind = PERF_GATHER;
            } else if (strcmp(optarg, "stream") == 0) {
                o->kind = PERF_STREAM;
            } else if (strcmp(optarg, "duplex") == 0) {
                o->kind = PERF_DUPLEX;
            } else if (strcmp(optarg, "pipeline") == 0) {
                o->kind = PERF_PIPELINE;
            } else if (strcmp(optarg, "init") == 0) {
                o->kind = PERF_INIT;
            } else {
                fprintf(stderr, "-k takes boundary, shard, gather, stream, "
                        "duplex, pipeline or init, not %s\n", optarg);
                return -1;
            }
            break;
        case 'm':
            if (strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, "-m takes host or cuda, not %s\n", optarg);
                return -1;
            }
            o->cuda = (strcmp(optarg, "cuda") == 0);
            break;
        case 'M':
            if (sl_host_parse_mode(optarg, &o->mode) != 0) {
                fprintf(stderr, "unknown mode %s\n", optarg);
                return -1;
            }
            break;
        case 'b':
        case 'e':
            if (sl_host_parse_size(optarg, &v) != 0) {
                fprintf(stderr, "bad size %s\n", optarg);
                return -1;
            }
            *(opt == 'b' ? &min : &max) = v;
            break;
        case 's':
            have_list = 1;
            for (item = strtok_r(optarg, ",", &save); item != NULL;
                 item = strtok_r(NULL, ",", &save)) {
                if (o->nsizes == 64 ||
                    sl_host_parse_size(item, &o->sizes[o->nsizes++]) != 0) {
                    fprintf(stderr, "bad size list entry %s\n", item);
                    return -1;
                }
            }
            break;
        case 'h': usage(stdout); exit(0);
        case 256: exit(sl_tool_version("stagelink_perftest"));
        default: return -1;
        }
    }
    if (optind != argc || o->tp < 1 || o->iters < 1 || o->warmup < 0 ||
        factor < 2 || min > max || o->microbatches < 1 || o->chunks < 1 ||
        o->chunks > (int)STAGELINK_TAG_MAX_CHUNK + 1) {
        return -1;
    }
    if (!have_list) {
        for (v = min; v <= max && o->nsizes < 64; v *= (size_t)factor) {
            o->sizes[o->nsizes++] = v;
            if (v == 0) {
                break;
            }
        }
    }
    return 0;
}

/* Where the tensors live (-m); declared, as a framework that knows its
 * tensors does, rather than classified per transfer. */
static stagelink_mem_type_t perf_mem = STAGELINK_MEM_HOST;

static stagelink_xfer_t perf_xfer(stagelink_peer_t peer, void *buf, size_t n,
                                  uint32_t mb, uint16_t chunk)
{
    stagelink_xfer_t x = sl_host_xfer(peer, buf, n, 1, mb, chunk);

    x.mem_type = perf_mem;
    return x;
}

/* One transfer, posted and waited for; `x` says where and what. */
static int post_wait(sl_host_t *h, stagelink_op_kind_t kind, stagelink_xfer_t x)
{
    stagelink_request_t *req;

    if (sl_host_report(h, (kind == STAGELINK_OP_SEND)
                              ? h->plugin->isend(h->comm, &x, &req)
                              : h->plugin->irecv(h->comm, &x, &req),
                       (kind == STAGELINK_OP_SEND) ? "isend" : "irecv") ||
        sl_host_report(h, h->plugin->wait(h->comm, req), "wait")) {
        return -1;
    }
    return 0;
}

/*
 * One round trip.  Stage 0 posts the return receive with the send (one
 * batch); stage 1 receives, then sends the same buffer back, so what stage
 * 0 gets is what stage 1 rebuilt.
 */
static int round_trip(const perf_opts_t *o, sl_host_t *h, unsigned char *send,
                      unsigned char *recv, size_t n, uint32_t mb)
{
    stagelink_op_t       ops[2];
    stagelink_request_t *reqs[2];
    int                  i, rc = 0;

    if (h->info.pp_index == 1) {
        if (post_wait(h, STAGELINK_OP_RECV, perf_xfer(STAGELINK_PEER_PREV, recv, n, mb, 0))) {
            return -1;
        }
        if (o->corrupt && n > 0 && !o->cuda) {
            recv[n / 2] ^= 0x40; /* the self-test: the check must catch it */
        }
        return post_wait(h, STAGELINK_OP_SEND, perf_xfer(STAGELINK_PEER_PREV, recv, n, mb, 0));
    }
    ops[0].kind = STAGELINK_OP_RECV;
    ops[0].xfer = perf_xfer(STAGELINK_PEER_NEXT, recv, n, mb, 0);
    ops[1].kind = STAGELINK_OP_SEND;
    ops[1].xfer = perf_xfer(STAGELINK_PEER_NEXT, send, n, mb, 0);
    if (sl_host_report(h, h->plugin->post_batch(h->comm, ops, 2, reqs),
                       "post_batch")) {
        return -1;
    }
    for (i = 1; i >= 0; --i) {
        if (sl_host_report(h, h->plugin->wait(h->comm, reqs[i]), "wait")) {
            rc = -1;
        }
    }
    return rc;
}

/*
 * `count` tensors forward, PERF_WINDOW in flight, then one answer back;
 * stage 0 times the whole.  Every tensor carries its own microbatch tag.
 */
static int stream(sl_host_t *h, unsigned char *send, unsigned char *recv,
                  size_t n, uint32_t first, int count, int duplex, double *us)
{
    stagelink_request_t *reqs[2][PERF_WINDOW];
    stagelink_xfer_t     x;
    int                  i, d, rc = 0, s0 = (h->info.pp_index == 0);
    unsigned char        ack = 1;
    double               t0 = now_us();

    /* Direction 0 forward (stage 0 sends), 1 backward (duplex only). */
    for (i = 0; i < count + PERF_WINDOW && rc == 0; ++i) {
        for (d = 0; d <= duplex && rc == 0; ++d) {
            int sends = (s0 == (d == 0));

            if (i >= PERF_WINDOW) {
                rc = sl_host_report(h, h->plugin->wait(h->comm,
                                                       reqs[d][i % PERF_WINDOW]),
                                    "wait") ? -1 : 0;
            }
            if (i < count && rc == 0) {
                x = perf_xfer(s0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                              sends ? send : recv, n, first + (uint32_t)i, 0);
                rc = sl_host_report(h, sends
                                           ? h->plugin->isend(h->comm, &x, &reqs[d][i % PERF_WINDOW])
                                           : h->plugin->irecv(h->comm, &x, &reqs[d][i % PERF_WINDOW]),
                                    sends ? "isend" : "irecv") ? -1 : 0;
            }
        }
    }
    if (rc == 0) {
        /* The answer is one host byte, whatever the tensors are. */
        rc = post_wait(h, s0 ? STAGELINK_OP_RECV : STAGELINK_OP_SEND,
                       sl_host_xfer(s0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                                    &ack, 1, 1, first + (uint32_t)count, 0));
    }
    *us = now_us() - t0;
    return rc;
}

/* One 1F1B training step: every batch of the schedule posted, then the
 * step's compute (-P, independent of the transfers in flight, as with
 * Megatron's overlapped p2p), then its completion; *blocked_us adds the
 * time the waits took: the communication the compute did not hide. */
static int pipeline(sl_host_t *h, const sl_sched_step_t *steps, int nsteps,
                    unsigned char *send, unsigned char *recv, size_t n,
                    int compute_us, double *blocked_us)
{
    stagelink_op_t       ops[2];
    stagelink_request_t *reqs[2];
    double               t0;
    int                  i, k;

    for (i = 0; i < nsteps; ++i) {
        for (k = 0; k < steps[i].nops; ++k) {
            const sl_sched_op_t *op = &steps[i].ops[k];
            int to_next = op->send ? !op->backward : op->backward;

            ops[k].kind = op->send ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;
            ops[k].xfer = perf_xfer(to_next ? STAGELINK_PEER_NEXT
                                            : STAGELINK_PEER_PREV,
                                    op->send ? send : recv, n,
                                    op->microbatch, op->chunk);
        }
        if (sl_host_report(h, h->plugin->post_batch(h->comm, ops,
                                                     (size_t)steps[i].nops, reqs),
                           "post_batch")) {
            return -1;
        }
        sl_host_compute(compute_us);
        t0 = now_us();
        for (k = 0; k < steps[i].nops; ++k) {
            if (sl_host_report(h, h->plugin->wait(h->comm, reqs[k]), "wait")) {
                return -1;
            }
        }
        *blocked_us += now_us() - t0;
    }
    return 0;
}

/* In sharded mode each TP rank only ever holds its own shard. */
static void own_range(const sl_host_t *h, size_t n, size_t *off, size_t *len)
{
    size_t t = (size_t)h->info.tp_size, i = (size_t)h->info.tp_index;
    size_t q = n / t, r = n % t;

    *off = 0;
    *len = n;
    if (h->info.mode == STAGELINK_MODE_SHARDED) {
        *off = i * q + (i < r ? i : r);
        *len = q + (i < r ? 1 : 0);
    }
}

/* Buffers in host or device memory; `stage` is a host copy for checks. */
static void *buf_alloc(const perf_opts_t *o, size_t n)
{
#ifdef STAGELINK_HAVE_CUDA
    void *p = NULL;

    if (o->cuda) {
        return (cudaMalloc(&p, n ? n : 1) == cudaSuccess) ? p : NULL;
    }
#endif
    (void)o;
    return malloc(n ? n : 1);
}

static void buf_free(const perf_opts_t *o, void *p)
{
#ifdef STAGELINK_HAVE_CUDA
    if (o->cuda) {
        cudaFree(p);
        return;
    }
#endif
    (void)o;
    free(p);
}

/* Copies between a buffer and host memory (a plain memcpy for host buffers). */
static void buf_copy(const perf_opts_t *o, void *dst, const void *src, size_t n)
{
#ifdef STAGELINK_HAVE_CUDA
    if (o->cuda) {
        cudaMemcpy(dst, src, n, cudaMemcpyDefault);
        return;
    }
#endif
    (void)o;
    memcpy(dst, src, n);
}

static int run_size(sl_host_t *h, const perf_opts_t *o, size_t n,
                    perf_result_t *res)
{
    unsigned char       *send  = buf_alloc(o, n), *recv = buf_alloc(o, n);
    unsigned char       *stage = malloc(n ? n : 1);
    double              *times = calloc((size_t)o->iters, sizeof(double));
    uint64_t             seed  = sl_pattern_seed(0, 0, 0, 0);
    stagelink_counters_t c0, c1;
    size_t               off, len, bad;
    double               t0, sum = 0;
    int                  it, rc = 0, checker;

    memset(res, 0, sizeof(*res));
    if (send == NULL || recv == NULL || stage == NULL || times == NULL) {
        fprintf(stderr, "out of memory for %zu-byte buffers\n", n);
        rc = -1;
        goto out;
    }
    own_range(h, n, &off, &len);
    sl_pattern_fill(stage, 0, n, seed);
    buf_copy(o, send, stage, n);
    if (o->kind == PERF_PIPELINE) {
        sl_sched_step_t *steps = malloc(sizeof(*steps) *
                                        (size_t)SL_SCHED_MAX_STEPS(o->microbatches,
                                                                   o->chunks));
        int              nsteps;

        if (steps == NULL) {
            rc = -1;
            goto out;
        }
        nsteps = sl_schedule_1f1b(h->info.pp_index, 2, o->microbatches,
                                  o->chunks, steps);
        double blocked = 0;

        for (it = 0; it < o->warmup && rc == 0; ++it) {
            rc = pipeline(h, steps, nsteps, send, recv, n, o->compute_us,
                          &blocked);
        }
        blocked = 0;
        h->plugin->get_counters(h->comm, &c0);
        for (it = 0; it < o->iters && rc == 0; ++it) {
            t0        = now_us();
            rc        = pipeline(h, steps, nsteps, send, recv, n,
                                 o->compute_us, &blocked);
            times[it] = now_us() - t0;
            sum      += times[it];
        }
        res->blocked_us = blocked / (o->iters > 0 ? o->iters : 1);
        h->plugin->get_counters(h->comm, &c1);
        free(steps);
        goto stats;
    }
    if (o->kind == PERF_STREAM || o->kind == PERF_DUPLEX) {
        int    duplex = (o->kind == PERF_DUPLEX);
        double total  = 0;

        /* Warm-up, then the measured stream; stage 1 checks the last tensor. */
        rc = stream(h, send, recv, n, 0, o->warmup + 1, duplex, &total);
        h->plugin->get_counters(h->comm, &c0);
        if (rc == 0) {
            /* The warm-up's answer took microbatch warmup + 1 backward. */
            rc = stream(h, send, recv, n, (uint32_t)o->warmup + 2, o->iters,
                        duplex, &total);
        }
        h->plugin->get_counters(h->comm, &c1);
        res->p50_us = res->avg_us = res->max_us = total / o->iters;
        res->stage_per_rank = (double)(c1.stage_bytes_sent - c0.stage_bytes_sent) / o->iters;
        res->inter_node_per_rank =
            (double)(c1.inter_node_bytes_sent - c0.inter_node_bytes_sent) / o->iters;
        res->gather_per_rank =
            (double)(c1.gather_bytes_sent - c0.gather_bytes_sent) / o->iters;
        if (rc == 0 && o->check && h->info.pp_index == 1) {
            buf_copy(o, stage, recv, n);
            if ((bad = sl_pattern_check(stage, off, len, seed)) != SIZE_MAX) {
                fprintf(stderr, "rank %d: %zu-byte tensor differs at byte %zu\n",
                        h->info.rank, n, bad);
                ++res->wrong;
            }
        }
        goto out;
    }
    for (it = 0; it < o->warmup && rc == 0; ++it) {
        rc = round_trip(o, h, send, recv, n, (uint32_t)it);
    }
    h->plugin->get_counters(h->comm, &c0);
    /* Only stage 0 resets and checks: it sees what stage 1 rebuilt, and
     * work on stage 1 between round trips would land in stage 0's timing. */
    checker = o->check && h->info.pp_index == 0;
    for (it = 0; it < o->iters && rc == 0; ++it) {
        if (checker) {
            memset(stage, 0, n);
            buf_copy(o, recv, stage, n);
        }
        t0 = now_us();
        rc = round_trip(o, h, send, recv, n, (uint32_t)(o->warmup + it));
        times[it] = (now_us() - t0) / 2;
        sum      += times[it];
        if (rc == 0 && checker) {
            buf_copy(o, stage, recv, n);
        }
        if (rc == 0 && checker &&
            (bad = sl_pattern_check(stage, off, len, seed)) != SIZE_MAX) {
            fprintf(stderr, "rank %d: %zu-byte tensor differs at byte %zu\n",
                    h->info.rank, n, bad);
            ++res->wrong;
        }
    }
    h->plugin->get_counters(h->comm, &c1);
stats:
    if (rc == 0) {
        qsort(times, (size_t)o->iters, sizeof(double), cmp_double);
        res->p50_us = times[o->iters / 2];
        res->avg_us = sum / o->iters;
        res->max_us = times[o->iters - 1];
        res->stage_per_rank =
            (double)(c1.stage_bytes_sent - c0.stage_bytes_sent) / o->iters;
        res->inter_node_per_rank =
            (double)(c1.inter_node_bytes_sent - c0.inter_node_bytes_sent) /
            o->iters;
        res->gather_per_rank =
            (double)(c1.gather_bytes_sent - c0.gather_bytes_sent) / o->iters;
    }
out:
    if (send) buf_free(o, send);
    if (recv) buf_free(o, recv);
    free(stage);
    free(times);
    return rc;
}

static const char *const perf_kind_names[] = {"boundary", "shard", "gather",
                                              "stream", "pipeline", "duplex",
                                              "init"};

static void print_header(const sl_host_t *h, const perf_opts_t *o)
{
    if (o->csv) {
        printf("size,mode,t,p50_us,avg_us,max_us,algbw_GBps,"
               "stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,wrong%s\n",
               o->kind == PERF_PIPELINE ? ",blocked_us" : "");
        return;
    }
    printf("# stagelink_perftest %s: 2 stages x %d TP ranks, %s memory, %d "
           "iterations (+%d warm-up), data check %s\n"
           "# time: %s%s; algbw = size / avg time, GB/s = 1e9 B/s\n"
           "# per rank and crossing: stage = bytes sent to the other stage, "
           "xnode = of which to another node, gather = bytes sent inside the "
           "TP group\n", perf_kind_names[o->kind], h->info.tp_size,
           o->cuda ? "cuda" : "host", o->iters, o->warmup,
           o->check ? "on" : "off",
           (o->kind == PERF_STREAM)
               ? "per tensor of a one-way stream (4 in flight)"
           : (o->kind == PERF_DUPLEX)
               ? "per tensor and direction of a stream both ways at once (4 in flight each)"
           : (o->kind == PERF_PIPELINE)
               ? "one 1F1B training step (all microbatches, forward and back); "
                 "blocked = per step in waits"
               : "one-way boundary time = round trip / 2 (tensor forward, "
                 "rebuilt, and back)",
           (o->kind == PERF_GATHER) ? "; gather = scatter_gather - shard" : "");
    printf("%12s %15s %3s %10s %10s %10s %8s %12s %12s %12s %6s%s\n",
           "size(B)", "mode", "t", "p50(us)", "avg(us)", "max(us)", "algbw",
           "stage B", "xnode B", "gather B", "wrong",
           o->kind == PERF_PIPELINE ? " blocked(us)" : "");
}

static void report(const sl_host_t *h, const perf_opts_t *o, size_t n,
                   const perf_result_t *r)
{
    double algbw = (r->avg_us > 0) ? (double)n / (r->avg_us * 1e3) : 0;

    if (o->csv) {
        printf("%zu,%s,%d,%.2f,%.2f,%.2f,%.3f,%.0f,%.0f,%.0f,%llu", n,
               sl_host_mode_name(h->info.mode), h->info.tp_size, r->p50_us,
               r->avg_us, r->max_us, algbw, r->stage_per_rank,
               r->inter_node_per_rank, r->gather_per_rank,
               (unsigned long long)r->wrong);
        if (o->kind == PERF_PIPELINE) {
            printf(",%.2f", r->blocked_us);
        }
    } else {
        printf("%12zu %15s %3d %10.1f %10.1f %10.1f %8.3f %12.0f %12.0f "
               "%12.0f %6llu", n, sl_host_mode_name(h->info.mode),
               h->info.tp_size, r->p50_us, r->avg_us, r->max_us, algbw,
               r->stage_per_rank, r->inter_node_per_rank, r->gather_per_rank,
               (unsigned long long)r->wrong);
        if (o->kind == PERF_PIPELINE) {
            printf(" %11.1f", r->blocked_us);
        }
    }
    printf("\n");
    fflush(stdout);
}

/* -k init: comm_init and comm_finalize, ITERS timed rounds after WARMUP. */
static int run_init(const perf_opts_t *o)
{
    double   t[1024], t0;
    sl_host_t h;
    int      i, n = 0, rank = -1;

    for (i = 0; i < o->warmup + o->iters; ++i) {
        t0 = now_us();
        if (sl_host_open(&h, o->tp, 2, o->mode) != 0) {
            return 1;
        }
        if (i >= o->warmup && n < (int)(sizeof(t) / sizeof(t[0]))) {
            t[n++] = (now_us() - t0) * 1e-3;
        }
        rank = h.info.rank;
        sl_host_close(&h);
    }
    if (rank == 0 && n > 0) {
        stagelink_job_info_t job = {.struct_size = sizeof(job)};
        char                 err[256];
        const int            secret = getenv("STAGELINK_JOB_SECRET") != NULL ||
                                      getenv("STAGELINK_JOB_SECRET_FILE") != NULL;

        if (stagelink_job_query(&job, err, sizeof(err)) != STAGELINK_SUCCESS) {
            snprintf(job.bootstrap, sizeof(job.bootstrap), "?");
        }
        qsort(t, (size_t)n, sizeof(t[0]), cmp_double);
        printf("# comm_init of %d ranks (bootstrap %s%s), %d rounds after %d "
               "warm-up\n", 2 * o->tp, job.bootstrap,
               strcmp(job.bootstrap, "tcp") != 0 ? ""
               : secret ? ", with a job secret" : ", unauthenticated",
               n, o->warmup);
        printf("%12s %12s %12s\n", "median ms", "min ms", "max ms");
        printf("%12.2f %12.2f %12.2f\n", t[n / 2], t[0], t[n - 1]);
    }
    return 0;
}

int main(int argc, char **argv)
{
    perf_opts_t   o;
    perf_result_t res;
    sl_host_t     h;
    int           i, rc = 0, wrong = 0;

    if (parse_opts(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
#ifdef STAGELINK_HAVE_CUDA
    if (o.cuda) {
        int         ndev = 0;
        cudaError_t err  = cudaGetDeviceCount(&ndev);
        const char *lr   = getenv("LOCAL_RANK");

        if (err != cudaSuccess || ndev == 0) {
            printf("SKIP: -m cuda: no CUDA device: %s\n",
                   (err != cudaSuccess) ? cudaGetErrorString(err)
                                        : "the runtime sees 0 devices");
            return 77;
        }
        cudaSetDevice((lr ? atoi(lr) : 0) % ndev);
        perf_mem = STAGELINK_MEM_CUDA;
    }
#else
    if (o.cuda) {
        printf("SKIP: -m cuda: stagelink_perftest was built without CUDA\n");
        return 77;
    }
#endif
    if (o.kind == PERF_INIT) {
        return run_init(&o);
    }
    /* gather = scatter_gather - shard: two communicators, one per mode. */
    {
        stagelink_mode_t modes[2];
        perf_result_t    shard[64];
        int              nmodes = 1, m;

        modes[0] = (o.kind == PERF_SHARD || o.kind == PERF_GATHER)
                       ? STAGELINK_MODE_SHARDED : o.mode;
        if (o.kind == PERF_GATHER) {
            modes[1] = STAGELINK_MODE_SCATTER_GATHER;
            nmodes   = 2;
        }
        for (m = 0; m < nmodes && rc == 0; ++m) {
            if (sl_host_open(&h, o.tp, 2, modes[m]) != 0) {
                return 1;
            }
            if (h.info.rank == 0 && m == 0) {
                print_header(&h, &o);
            }
            if (o.kind != PERF_PIPELINE) {
                /* The connections' first megabytes run slow (TCP's window
                 * opening, UCX's lanes): one round at the largest size
                 * first, as nccl-tests warm up, so the first size measured
                 * is not the one that pays. */
                perf_opts_t warm = o;
                size_t      top  = 0;

                for (i = 0; i < o.nsizes; ++i) {
                    top = (o.sizes[i] > top) ? o.sizes[i] : top;
                }
                warm.iters = 1;
                rc     = run_size(&h, &warm, top, &res);
                wrong |= (res.wrong != 0);
            }
            for (i = 0; i < o.nsizes && rc == 0; ++i) {
                rc = run_size(&h, &o, o.sizes[i], &res);
                wrong |= (res.wrong != 0);
                if (o.kind == PERF_GATHER && m == 0) {
                    shard[i] = res;
                    continue;
                }
                if (o.kind == PERF_GATHER) {
                    res.p50_us -= shard[i].p50_us;
                    res.avg_us -= shard[i].avg_us;
                    res.max_us -= shard[i].max_us;
                }
                if (rc == 0 && h.info.rank == 0) {
                    report(&h, &o, o.sizes[i], &res);
                }
            }
            if (m + 1 < nmodes) {
                sl_host_close(&h);
            }
        }
    }
    sl_host_close(&h);
    return (rc != 0 || wrong) ? 1 : 0;
}
