/*
 * stagelink_perftest: boundary transfer timing in the manner of
 * ucx_perftest and nccl-tests, on two pipeline stages of TP ranks.
 *
 *   stagelink_perftest [options]          a server: waits on -p PORT
 *   stagelink_perftest [options] SERVER   a client: connects to SERVER:PORT
 *
 * Two processes, t = 1, no launcher, as ucx_perftest runs; the client's
 * options rule, as ucx_perftest's do, and the client prints.  Under a
 * launcher's variables (stagelink_run, torchrun, mpirun, srun) the job's
 * 2t ranks run it instead, any t, and rank 0 prints.
 *
 * Tests (-t): boundary (default; ucx_perftest's tag_lat: a ping-pong, the
 * tensor forward, rebuilt, and back; half the round trip), shard (the
 * inter-node shard alone: sharded mode), gather (the intra-node rebuild
 * alone: scatter_gather's time less the shard's median, both measured in
 * this run), stream (tag_bw: ITERS tensors forward, 4 in flight, one
 * answer back; the time per tensor), duplex (the same stream both ways at
 * once; per tensor and direction), pipeline (one 1F1B training step of
 * --microbatches, --chunks virtual chunks, activations forward and
 * gradients back; with --compute-us each batch is followed by that much
 * compute, a sleep, before its waits; blocked is the time per step in
 * them), init (comm_init, bootstrap included, each round ended by
 * comm_finalize).
 *
 * Every time is the stage's: each rank times every iteration, the ranks'
 * records are gathered at the end, and an iteration takes as long as its
 * slowest rank's (the initiators' round trips, every rank's step; in a
 * stream, the gap between a tensor's last arrival on the stage and the
 * one before's); percentiles come from those per-iteration times.
 * Each row carries the CPU time (user + system, the kernel's accounting)
 * that every rank of the job spent in its measured iterations.
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
#include <sys/resource.h>

#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum perf_kind {
    PERF_BOUNDARY, PERF_SHARD, PERF_GATHER, PERF_STREAM, PERF_DUPLEX,
    PERF_PIPELINE, PERF_INIT, PERF_KINDS
} perf_kind_t;

static const char *const perf_kind_names[PERF_KINDS] = {
    "boundary", "shard", "gather", "stream", "duplex", "pipeline", "init"};

#define PERF_WINDOW      4
#define PERF_MAX_SIZES   64
#define PERF_MAX_ITERS   100000
#define PERF_DEFAULT_PORT 13337 /* ucx_perftest's */

/* What both ends of a run must agree on: in two-process mode the client
 * sends its own to the server. */
#define PERF_PARAMS_MAGIC 0x534c5031u /* "SLP1": this layout */

typedef struct perf_params {
    uint32_t magic;
    int32_t  kind, tp, iters, warmup, check, cuda, corrupt;
    int32_t  microbatches, chunks, compute_us, mode, nsizes;
    uint64_t sizes[PERF_MAX_SIZES];
} perf_params_t;

typedef struct perf_opts {
    perf_params_t p;
    int           csv, json, port;
    const char   *server;    /* the client's SERVER argument */
    int           two_proc;  /* no launcher: server and client */
} perf_opts_t;

/* One rank's figures for one size of one run, then its iterations' times. */
typedef struct perf_slot {
    double   cpu_s;       /* user + system over the measured iterations */
    double   stage_B, xnode_B, gather_B; /* sent, per iteration */
    double   blocked_us;  /* pipeline: per step, in waits */
    uint64_t wrong;
    uint64_t timed;       /* this rank's times count toward the stage's */
    double   start_us;    /* a stream's start on the wall clock (CLOCK_REALTIME) */
} perf_slot_t;

/* The stage's figures for one size, as printed. */
typedef struct perf_row {
    size_t   size;
    double   p50, p99, avg, min, max; /* us (ms for init) */
    double   stage_B, xnode_B, gather_B; /* the busiest rank's, per iteration */
    double   xnode_job_B;  /* every rank's inter-node bytes, per iteration */
    double   blocked_us;   /* the most blocked rank's */
    double   cpu_s;        /* every rank's */
    double   moved_B;      /* tensor bytes delivered, all iterations */
    uint64_t wrong;
} perf_row_t;

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* The wall clock, the one origin the ranks of a job share (the nodes'
 * clocks kept in step, as NTP or PTP keep a cluster's). */
static double wall_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static double cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted values. */
static double percentile(const double *sorted, int n, double q)
{
    int k = (int)ceil(q * n) - 1;

    return sorted[k < 0 ? 0 : (k >= n ? n - 1 : k)];
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stagelink_perftest [options]          (server: waits on -p PORT)\n"
            "       stagelink_perftest [options] SERVER   (client: connects to SERVER:PORT)\n"
            "       a launcher (stagelink_run -n 2T, torchrun, mpirun, srun) -- stagelink_perftest [options]\n"
            "  -t TEST   boundary (or tag_lat; default), shard, gather, stream (or tag_bw),\n"
            "            duplex, pipeline, init\n"
            "  -s SIZES  comma list, K/M/G suffixes (powers of 2); default 1M\n"
            "  --minbytes MIN --maxbytes MAX [--stepfactor F]  a range instead (F default 2)\n"
            "  -n ITERS  measured iterations (default 20); -w WARMUP (default 5)\n"
            "  -m MEM    host or cuda (device LOCAL_RANK %% count)\n"
            "  -p PORT   the two-process rendezvous (default %d)\n"
            "  -g TP     tensor-parallel size: ranks a stage (under a launcher; default 1)\n"
            "  --mode M  scatter_gather, full or sharded (default: STAGELINK_MODE, else scatter_gather)\n"
            "  --microbatches N --chunks V --compute-us US   pipeline (default 16, 1, 0)\n"
            "  --no-check  skip the data check; --corrupt  flip a byte on the way back\n"
            "  -v, --csv   CSV; --json  one JSON object\n"
            "  -h, --help; --version\n"
            "  Exits 1 on a data mismatch, 2 on a usage error.\n",
            PERF_DEFAULT_PORT);
}

static int parse_kind(const char *name, int32_t *kind)
{
    int i;

    for (i = 0; i < PERF_KINDS; ++i) {
        if (strcmp(name, perf_kind_names[i]) == 0) {
            *kind = i;
            return 0;
        }
    }
    if (strcmp(name, "tag_lat") == 0 || strcmp(name, "tag_bw") == 0) {
        *kind = (name[4] == 'l') ? PERF_BOUNDARY : PERF_STREAM;
        return 0;
    }
    fprintf(stderr, "-t takes boundary, shard, gather, stream, duplex, "
            "pipeline or init (tag_lat, tag_bw), not %s\n", name);
    return -1;
}

/* A whole positive number within [lo, hi], else a sentence and -1. */
static int parse_int(const char *text, int lo, int hi, const char *what,
                     int32_t *out)
{
    char *end;
    long  v = strtol(text, &end, 10);

    if (end == text || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "%s takes an integer from %d to %d, not \"%s\"\n",
                what, lo, hi, text);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int parse_opts(int argc, char **argv, perf_opts_t *o)
{
    enum { OPT_CSV = 256, OPT_JSON, OPT_MODE, OPT_CORRUPT, OPT_NOCHECK,
           OPT_MIN, OPT_MAX, OPT_FACTOR, OPT_MB, OPT_CHUNKS, OPT_COMPUTE,
           OPT_VERSION };
    static const struct option longopts[] = {
        {"csv", no_argument, NULL, OPT_CSV},
        {"json", no_argument, NULL, OPT_JSON},
        {"mode", required_argument, NULL, OPT_MODE},
        {"corrupt", no_argument, NULL, OPT_CORRUPT},
        {"no-check", no_argument, NULL, OPT_NOCHECK},
        {"minbytes", required_argument, NULL, OPT_MIN},
        {"maxbytes", required_argument, NULL, OPT_MAX},
        {"stepfactor", required_argument, NULL, OPT_FACTOR},
        {"microbatches", required_argument, NULL, OPT_MB},
        {"chunks", required_argument, NULL, OPT_CHUNKS},
        {"compute-us", required_argument, NULL, OPT_COMPUTE},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0}};
    perf_params_t *p   = &o->p;
    size_t         min = 0, max = 0, v;
    int32_t        factor = 2, port = PERF_DEFAULT_PORT;
    int            opt, have_list = 0, have_range = 0;
    char          *save = NULL, *item;
    stagelink_mode_t mode;

    memset(o, 0, sizeof(*o));
    p->magic = PERF_PARAMS_MAGIC;
    p->tp = 1, p->iters = 20, p->warmup = 5, p->check = 1;
    p->microbatches = 16, p->chunks = 1;
    while ((opt = getopt_long(argc, argv, "t:s:n:w:m:p:g:vh", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 't': if (parse_kind(optarg, &p->kind)) return -1; break;
        case 'n':
            if (parse_int(optarg, 1, PERF_MAX_ITERS, "-n", &p->iters)) return -1;
            break;
        case 'w':
            if (parse_int(optarg, 0, PERF_MAX_ITERS, "-w", &p->warmup)) return -1;
            break;
        case 'g': if (parse_int(optarg, 1, 4096, "-g", &p->tp)) return -1; break;
        case 'p': if (parse_int(optarg, 1, 65535, "-p", &port)) return -1; break;
        case 'v':
        case OPT_CSV: o->csv = 1; break;
        case OPT_JSON: o->json = 1; break;
        case OPT_CORRUPT: p->corrupt = 1; break;
        case OPT_NOCHECK: p->check = 0; break;
        case OPT_MB:
            if (parse_int(optarg, 1, 100000, "--microbatches", &p->microbatches))
                return -1;
            break;
        case OPT_CHUNKS:
            if (parse_int(optarg, 1, (int)STAGELINK_TAG_MAX_CHUNK + 1,
                          "--chunks", &p->chunks))
                return -1;
            break;
        case OPT_COMPUTE:
            if (parse_int(optarg, 0, 60000000, "--compute-us", &p->compute_us))
                return -1;
            break;
        case OPT_FACTOR:
            if (parse_int(optarg, 2, 1024, "--stepfactor", &factor)) return -1;
            break;
        case 'm':
            if (strcmp(optarg, "host") != 0 && strcmp(optarg, "cuda") != 0) {
                fprintf(stderr, "-m takes host or cuda, not %s\n", optarg);
                return -1;
            }
            p->cuda = (strcmp(optarg, "cuda") == 0);
            break;
        case OPT_MODE:
            if (sl_host_parse_mode(optarg, &mode) != 0) {
                fprintf(stderr, "--mode takes scatter_gather, full or sharded, "
                        "not %s\n", optarg);
                return -1;
            }
            p->mode = (int32_t)mode;
            break;
        case OPT_MIN:
        case OPT_MAX:
            if (sl_host_parse_size(optarg, &v) != 0) {
                fprintf(stderr, "bad size %s\n", optarg);
                return -1;
            }
            *(opt == OPT_MIN ? &min : &max) = v;
            have_range = 1;
            break;
        case 's':
            have_list = 1;
            for (item = strtok_r(optarg, ",", &save); item != NULL;
                 item = strtok_r(NULL, ",", &save)) {
                if (p->nsizes == PERF_MAX_SIZES ||
                    sl_host_parse_size(item, &v) != 0) {
                    fprintf(stderr, "bad size list entry %s\n", item);
                    return -1;
                }
                p->sizes[p->nsizes++] = v;
            }
            break;
        case 'h': usage(stdout); exit(0);
        case OPT_VERSION: exit(sl_tool_version("stagelink_perftest"));
        default: return -1;
        }
    }
    o->port = port;
    if (optind + 1 < argc) {
        fprintf(stderr, "one SERVER at most, not \"%s\" too\n", argv[optind + 1]);
        return -1;
    }
    o->server = (optind < argc) ? argv[optind] : NULL;
    if (have_list && have_range) {
        fprintf(stderr, "-s and --minbytes/--maxbytes: give one\n");
        return -1;
    }
    if (have_range) {
        if (max == 0) {
            max = min; /* --minbytes alone: that one size */
        } else if (min == 0 && max > 0) {
            min = max; /* --maxbytes alone: that one size */
        }
        if (max < min) {
            max = min;
        }
        for (v = min; v <= max && p->nsizes < PERF_MAX_SIZES; v *= (size_t)factor) {
            p->sizes[p->nsizes++] = v;
            if (v == 0) {
                break;
            }
        }
    }
    if (p->nsizes == 0) {
        p->sizes[p->nsizes++] = 1u << 20;
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
static int round_trip(const perf_params_t *p, sl_host_t *h, unsigned char *send,
                      unsigned char *recv, size_t n, uint32_t mb)
{
    stagelink_op_t       ops[2];
    stagelink_request_t *reqs[2];
    int                  i, rc = 0;

    if (h->info.pp_index == 1) {
        if (post_wait(h, STAGELINK_OP_RECV,
                      perf_xfer(STAGELINK_PEER_PREV, recv, n, mb, 0))) {
            return -1;
        }
        if (p->corrupt && n > 0 && !p->cuda) {
            recv[n / 2] ^= 0x40; /* the self-test: the check must catch it */
        }
        return post_wait(h, STAGELINK_OP_SEND,
                         perf_xfer(STAGELINK_PEER_PREV, recv, n, mb, 0));
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
 * `count` tensors forward (and back at once with `duplex`), PERF_WINDOW in
 * flight, then one answer back.  times[i] (when given) is when the i-th
 * arrived on this rank, from the stream's start, which *start_us gives on
 * the wall clock.
 */
static int stream(sl_host_t *h, unsigned char *send, unsigned char *recv,
                  size_t n, uint32_t first, int count, int duplex,
                  double *times, double *start_us)
{
    stagelink_request_t *reqs[2][PERF_WINDOW];
    stagelink_xfer_t     x;
    int                  i, d, rc = 0, s0 = (h->info.pp_index == 0);
    unsigned char        ack = 1;
    double               start = now_us();

    if (start_us != NULL) {
        *start_us = wall_us();
    }

    /* Direction 0 forward (stage 0 sends), 1 backward (duplex only). */
    for (i = 0; i < count + PERF_WINDOW && rc == 0; ++i) {
        for (d = 0; d <= duplex && rc == 0; ++d) {
            int sends = (s0 == (d == 0));
            int k     = i - PERF_WINDOW;

            if (k >= 0) {
                rc = sl_host_report(h, h->plugin->wait(h->comm,
                                                       reqs[d][k % PERF_WINDOW]),
                                    "wait") ? -1 : 0;
                if (rc == 0 && !sends && times != NULL) {
                    times[k] = now_us() - start;
                }
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
    return rc;
}

/* One 1F1B training step: every batch of the schedule posted, then the
 * step's compute (independent of the transfers in flight, as with
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
static void *buf_alloc(const perf_params_t *p, size_t n)
{
#ifdef STAGELINK_HAVE_CUDA
    void *d = NULL;

    if (p->cuda) {
        return (cudaMalloc(&d, n ? n : 1) == cudaSuccess) ? d : NULL;
    }
#endif
    (void)p;
    return malloc(n ? n : 1);
}

static void buf_free(const perf_params_t *p, void *b)
{
#ifdef STAGELINK_HAVE_CUDA
    if (p->cuda) {
        cudaFree(b);
        return;
    }
#endif
    (void)p;
    free(b);
}

/* Copies between a buffer and host memory (a plain memcpy for host buffers). */
static void buf_copy(const perf_params_t *p, void *dst, const void *src, size_t n)
{
#ifdef STAGELINK_HAVE_CUDA
    if (p->cuda) {
        cudaMemcpy(dst, src, n, cudaMemcpyDefault);
        return;
    }
#endif
    (void)p;
    memcpy(dst, src, n);
}

static int check_tensor(const sl_host_t *h, const unsigned char *stage,
                        size_t n, uint64_t seed)
{
    size_t off, len, bad;

    own_range(h, n, &off, &len);
    if ((bad = sl_pattern_check(stage, off, len, seed)) != SIZE_MAX) {
        fprintf(stderr, "rank %d: %zu-byte tensor differs at byte %zu\n",
                h->info.rank, n, bad);
        return 1;
    }
    return 0;
}

/* Size `n` on communicator `h`: this rank's slot and per-iteration times.
 * With times == NULL a warm-up pass, nothing recorded. */
static int run_size(sl_host_t *h, const perf_params_t *p, size_t n,
                    perf_slot_t *slot, double *times)
{
    unsigned char       *send  = buf_alloc(p, n), *recv = buf_alloc(p, n);
    unsigned char       *stage = malloc(n ? n : 1);
    double              *scratch = calloc((size_t)p->iters, sizeof(double));
    uint64_t             seed  = sl_pattern_seed(0, 0, 0, 0);
    stagelink_counters_t c0, c1;
    sl_sched_step_t     *steps = NULL;
    double               t0, cpu0 = 0, blocked = 0;
    int                  it, rc = 0, nsteps = 0, iters = p->iters;
    int                  s0 = (h->info.pp_index == 0);

    memset(slot, 0, sizeof(*slot));
    if (times == NULL) {
        times = scratch;
    }
    if (send == NULL || recv == NULL || stage == NULL || scratch == NULL) {
        fprintf(stderr, "out of memory for %zu-byte buffers\n", n);
        rc = -1;
        goto out;
    }
    sl_pattern_fill(stage, 0, n, seed);
    buf_copy(p, send, stage, n);
    switch (p->kind) {
    case PERF_PIPELINE:
        steps = malloc(sizeof(*steps) *
                       (size_t)SL_SCHED_MAX_STEPS(p->microbatches, p->chunks));
        if (steps == NULL) {
            rc = -1;
            goto out;
        }
        nsteps = sl_schedule_1f1b(h->info.pp_index, 2, p->microbatches,
                                  p->chunks, steps);
        for (it = 0; it < p->warmup && rc == 0; ++it) {
            rc = pipeline(h, steps, nsteps, send, recv, n, p->compute_us,
                          &blocked);
        }
        blocked = 0;
        h->plugin->get_counters(h->comm, &c0);
        cpu0 = cpu_seconds();
        for (it = 0; it < iters && rc == 0; ++it) {
            t0        = now_us();
            rc        = pipeline(h, steps, nsteps, send, recv, n,
                                 p->compute_us, &blocked);
            times[it] = now_us() - t0;
        }
        slot->timed      = 1;
        slot->blocked_us = blocked / iters;
        break;
    case PERF_STREAM:
    case PERF_DUPLEX: {
        int duplex = (p->kind == PERF_DUPLEX);

        /* Warm-up, then the measured stream; the receivers check the
         * last tensor. */
        rc = stream(h, send, recv, n, 0, p->warmup + 1, duplex, NULL, NULL);
        h->plugin->get_counters(h->comm, &c0);
        cpu0 = cpu_seconds();
        if (rc == 0) {
            /* The warm-up's answer took microbatch warmup + 1 backward. */
            rc = stream(h, send, recv, n, (uint32_t)p->warmup + 2, iters,
                        duplex, times, &slot->start_us);
        }
        slot->timed = duplex || !s0; /* who receives times the arrivals */
        if (rc == 0 && p->check && slot->timed) {
            buf_copy(p, stage, recv, n);
            slot->wrong += (uint64_t)check_tensor(h, stage, n, seed);
        }
        break;
    }
    default:
        for (it = 0; it < p->warmup && rc == 0; ++it) {
            rc = round_trip(p, h, send, recv, n, (uint32_t)it);
        }
        h->plugin->get_counters(h->comm, &c0);
        cpu0 = cpu_seconds();
        /* The initiators time and check: they see the whole round trip of
         * their pair, and work on stage 1 between round trips would land
         * in their timing. */
        slot->timed = s0;
        for (it = 0; it < iters && rc == 0; ++it) {
            if (s0 && p->check) {
                memset(stage, 0, n);
                buf_copy(p, recv, stage, n);
            }
            t0 = now_us();
            rc = round_trip(p, h, send, recv, n, (uint32_t)(p->warmup + it));
            times[it] = (now_us() - t0) / 2;
            if (rc == 0 && s0 && p->check) {
                buf_copy(p, stage, recv, n);
                slot->wrong += (uint64_t)check_tensor(h, stage, n, seed);
            }
        }
        break;
    }
    if (rc == 0) {
        slot->cpu_s = cpu_seconds() - cpu0;
        h->plugin->get_counters(h->comm, &c1);
        slot->stage_B  = (double)(c1.stage_bytes_sent - c0.stage_bytes_sent) / iters;
        slot->xnode_B  = (double)(c1.inter_node_bytes_sent - c0.inter_node_bytes_sent) / iters;
        slot->gather_B = (double)(c1.gather_bytes_sent - c0.gather_bytes_sent) / iters;
    }
out:
    if (send) buf_free(p, send);
    if (recv) buf_free(p, recv);
    free(stage);
    free(scratch);
    free(steps);
    return rc;
}

/*
 * A communicator in scatter_gather mode whatever STAGELINK_MODE says, for
 * the tool's own exchanges (the client's parameters, the ranks' records):
 * a gathered receive is the concatenation of the senders' shards.
 */
static int open_aux(sl_host_t *h, int tp)
{
    char *mode = getenv("STAGELINK_MODE");
    char  saved[64] = "";
    int   rc;

    if (mode != NULL) {
        snprintf(saved, sizeof(saved), "%s", mode);
        unsetenv("STAGELINK_MODE");
    }
    rc = sl_host_open(h, tp, 2, STAGELINK_MODE_SCATTER_GATHER);
    if (saved[0] != '\0') {
        setenv("STAGELINK_MODE", saved, 1);
    }
    return rc;
}

/*
 * Every rank's record (`len` bytes at `mine`) into `all` (2t records, by
 * rank, pp * t + tp) on every rank of stage 0, and on stage 1 where t = 1:
 * forward, stage 0's records as the shards of one tensor; back, each
 * stage 1 rank's shard holding its peer's record and its own.
 */
static int gather_records(int tp, const void *mine, size_t len,
                          unsigned char *all)
{
    unsigned char *fwd = calloc((size_t)tp, len);
    unsigned char *back = calloc(2 * (size_t)tp, len);
    sl_host_t      h;
    int            rc = -1, i, s0;
    size_t         me;

    if (fwd == NULL || back == NULL || open_aux(&h, tp) != 0) {
        free(fwd);
        free(back);
        return -1;
    }
    s0 = (h.info.pp_index == 0);
    me = (size_t)h.info.tp_index;
    if (s0) {
        stagelink_op_t       ops[2];
        stagelink_request_t *reqs[2];

        memcpy(fwd + me * len, mine, len);
        ops[0].kind = STAGELINK_OP_RECV;
        ops[0].xfer = sl_host_xfer(STAGELINK_PEER_NEXT, back, 2 * tp * len,
                                   2 * len, 0, 0);
        ops[1].kind = STAGELINK_OP_SEND;
        ops[1].xfer = sl_host_xfer(STAGELINK_PEER_NEXT, fwd, tp * len, len, 0, 0);
        rc = sl_host_report(&h, h.plugin->post_batch(h.comm, ops, 2, reqs),
                            "post_batch") ? -1 : 0;
        for (i = 1; i >= 0 && rc == 0; --i) {
            rc = sl_host_report(&h, h.plugin->wait(h.comm, reqs[i]), "wait") ? -1 : 0;
        }
    } else {
        rc = post_wait(&h, STAGELINK_OP_RECV,
                       sl_host_xfer(STAGELINK_PEER_PREV, fwd, tp * len, len, 0, 0));
        if (rc == 0) {
            memcpy(back + 2 * me * len, fwd + me * len, len);
            memcpy(back + (2 * me + 1) * len, mine, len);
            rc = post_wait(&h, STAGELINK_OP_SEND,
                           sl_host_xfer(STAGELINK_PEER_PREV, back, 2 * tp * len,
                                        2 * len, 0, 0));
        }
    }
    /* Stage 1 holds every record only where t = 1: its peer's and its own. */
    for (i = 0; rc == 0 && (s0 || tp == 1) && i < tp; ++i) {
        memcpy(all + (size_t)i * len,
               s0 ? back + 2 * (size_t)i * len : fwd + (size_t)i * len, len);
        memcpy(all + (size_t)(tp + i) * len,
               s0 ? back + (2 * (size_t)i + 1) * len : mine, len);
    }
    sl_host_close(&h);
    free(fwd);
    free(back);
    return rc;
}

/*
 * The stage's row from the ranks' slots and times (record stride `len`,
 * slot at `offset`), for tensor size n.  An iteration lasts as long as its
 * slowest timed rank's; a stream's tensor is whole at the stage when its
 * last receiver has it, so there the ranks' arrival times, on the wall
 * clock from the first rank's start, are taken at their latest and the
 * stage's times are the gaps between those.
 */
static void make_row(const perf_params_t *p, const unsigned char *all,
                     size_t len, size_t offset, size_t n, double shift,
                     perf_row_t *row)
{
    int     ranks = 2 * p->tp, r, it, timed = 0;
    int     streams = (p->kind == PERF_STREAM || p->kind == PERF_DUPLEX);
    double *stage = calloc((size_t)p->iters, sizeof(double));
    double  sum   = 0, origin = INFINITY;

    memset(row, 0, sizeof(*row));
    row->size = n;
    /* A stream's times count from the first rank's start: pairs that start
     * apart (full mode's are independent) share the link for less than
     * their own streams, so each pair's own clock would read too fast. */
    for (r = 0; streams && r < ranks; ++r) {
        origin = fmin(origin, ((const perf_slot_t *)(all + (size_t)r * len +
                                                     offset))->start_us);
    }
    for (r = 0; r < ranks; ++r) {
        const perf_slot_t *s = (const perf_slot_t *)(all + (size_t)r * len + offset);
        const double      *t = (const double *)(s + 1);

        row->cpu_s += s->cpu_s;
        row->wrong += s->wrong;
        row->xnode_job_B += s->xnode_B;
        row->stage_B  = fmax(row->stage_B, s->stage_B);
        row->xnode_B  = fmax(row->xnode_B, s->xnode_B);
        row->gather_B = fmax(row->gather_B, s->gather_B);
        row->blocked_us = fmax(row->blocked_us, s->blocked_us);
        for (it = 0; s->timed && stage != NULL && it < p->iters; ++it) {
            stage[it] = fmax(stage[it], t[it] + (streams ? s->start_us - origin : 0));
        }
        timed += (s->timed != 0);
    }
    if (stage == NULL || timed == 0) {
        free(stage);
        return;
    }
    if (streams) {
        for (it = p->iters - 1; it > 0; --it) {
            stage[it] -= stage[it - 1];
        }
    }
    for (it = 0; it < p->iters; ++it) {
        stage[it] -= shift;
        sum       += stage[it];
    }
    qsort(stage, (size_t)p->iters, sizeof(double), cmp_double);
    row->p50 = percentile(stage, p->iters, 0.50);
    row->p99 = percentile(stage, p->iters, 0.99);
    row->min = stage[0];
    row->max = stage[p->iters - 1];
    row->avg = sum / p->iters;
    row->moved_B = (double)n * p->iters *
                   ((p->kind == PERF_STREAM) ? 1
                    : (p->kind == PERF_PIPELINE) ? 2.0 * p->microbatches * p->chunks
                    : (p->kind == PERF_INIT) ? 0 : 2);
    free(stage);
}

/* The bootstrap this job's init uses (torch-store, pmix, tcp), and
 * whether a job secret seals it (tcp only). */
typedef struct perf_boot {
    char kind[16];
    int  sealed;
    char text[64]; /* "tcp, with a job secret" */
} perf_boot_t;

static void bootstrap_of(perf_boot_t *b)
{
    stagelink_job_info_t job = {.struct_size = sizeof(job)};
    char                 err[256];
    int                  tcp;

    if (stagelink_job_query(&job, err, sizeof(err)) != STAGELINK_SUCCESS) {
        snprintf(job.bootstrap, sizeof(job.bootstrap), "?");
    }
    tcp       = strcmp(job.bootstrap, "tcp") == 0;
    b->sealed = tcp && (getenv("STAGELINK_JOB_SECRET") != NULL ||
                        getenv("STAGELINK_JOB_SECRET_FILE") != NULL);
    snprintf(b->kind, sizeof(b->kind), "%s", job.bootstrap);
    snprintf(b->text, sizeof(b->text), "%s%s", job.bootstrap,
             !tcp ? "" : b->sealed ? ", with a job secret" : ", unauthenticated");
}

static const char *mode_label(const perf_params_t *p, stagelink_mode_t used)
{
    return (p->kind == PERF_GATHER) ? "gather" : sl_host_mode_name(used);
}

static void print_header(const perf_opts_t *o, stagelink_mode_t mode,
                         const perf_boot_t *boot)
{
    const perf_params_t *p = &o->p;

    if (o->json) {
        printf("{\"tool\": \"stagelink_perftest\", \"version\": \"%s\", "
               "\"test\": \"%s\", \"mode\": \"%s\", \"t\": %d, \"ranks\": %d, "
               "\"memory\": \"%s\", \"iterations\": %d, \"warmup\": %d, "
               "\"bootstrap\": \"%s\", \"sealed\": %s, \"rows\": [",
               stagelink_version(), perf_kind_names[p->kind],
               mode_label(p, mode), p->tp, 2 * p->tp, p->cuda ? "cuda" : "host",
               p->iters, p->warmup, boot->kind, boot->sealed ? "true" : "false");
        return;
    }
    if (p->kind == PERF_INIT) {
        if (o->csv) {
            printf("test,t,ranks,bootstrap,sealed,rounds,p50_ms,p99_ms,avg_ms,"
                   "min_ms,max_ms,cpu_s\n");
        } else {
            printf("# comm_init of %d ranks (bootstrap %s), %d rounds after %d "
                   "warm-up; each round as long as its slowest rank's\n",
                   2 * p->tp, boot->text, p->iters, p->warmup);
            printf("%10s %10s %10s %10s %10s %10s\n", "p50 ms", "p99 ms",
                   "avg ms", "min ms", "max ms", "cpu s");
        }
        return;
    }
    if (o->csv) {
        printf("size,test,mode,t,p50_us,p99_us,avg_us,max_us,algbw_GBps,"
               "stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,"
               "xnode_B_job,cpu_s,cpu_s_per_GB,wrong%s\n",
               p->kind == PERF_PIPELINE ? ",blocked_us" : "");
        return;
    }
    printf("# stagelink_perftest %s: 2 stages x %d TP ranks, %s memory, %d "
           "iterations (+%d warm-up), data check %s, bootstrap %s\n"
           "# time: the stage's (per iteration its slowest rank's): %s%s\n"
           "# algbw = size / avg; per rank (the busiest): stage = bytes sent to "
           "the other stage, xnode = of which to another node, gather = inside "
           "the TP group; cpu = user + system of every rank, per GB of tensors "
           "delivered\n", perf_kind_names[p->kind], p->tp,
           p->cuda ? "cuda" : "host", p->iters, p->warmup,
           p->check ? "on" : "off", boot->text,
           (p->kind == PERF_STREAM)
               ? "per tensor of a one-way stream (4 in flight): from one tensor's "
                 "last arrival on the stage to the next's"
           : (p->kind == PERF_DUPLEX)
               ? "per tensor and direction of a stream both ways at once (4 in flight each)"
           : (p->kind == PERF_PIPELINE)
               ? "one 1F1B training step (all microbatches, forward and back); "
                 "blocked = per step in waits"
               : "one-way boundary time = round trip / 2 (tensor forward, "
                 "rebuilt, and back)",
           (p->kind == PERF_GATHER) ? "; gather = scatter_gather - the shard's median" : "");
    printf("%12s %15s %3s %9s %9s %9s %9s %8s %11s %11s %11s %8s %6s%s\n",
           "size(B)", "mode", "t", "p50(us)", "p99(us)", "avg(us)", "max(us)",
           "algbw", "stage B", "xnode B", "gather B", "cpu s/GB", "wrong",
           p->kind == PERF_PIPELINE ? " blocked(us)" : "");
}

static void print_row(const perf_opts_t *o, stagelink_mode_t mode,
                      const perf_row_t *r, int first)
{
    const perf_params_t *p      = &o->p;
    double               algbw  = (r->avg > 0) ? (double)r->size / (r->avg * 1e3) : 0;
    double               per_gb = (r->moved_B > 0) ? r->cpu_s / (r->moved_B * 1e-9) : 0;

    if (o->json) {
        printf("%s\n  {\"size\": %zu, \"p50_us\": %.3f, \"p99_us\": %.3f, "
               "\"avg_us\": %.3f, \"min_us\": %.3f, \"max_us\": %.3f, "
               "\"algbw_GBps\": %.6f, \"stage_B_per_rank\": %.0f, "
               "\"xnode_B_per_rank\": %.0f, \"gather_B_per_rank\": %.0f, "
               "\"xnode_B_job\": %.0f, \"cpu_s\": %.6f, \"cpu_s_per_GB\": %.6f, "
               "\"wrong\": %llu", first ? "" : ",", r->size, r->p50, r->p99,
               r->avg, r->min, r->max, algbw, r->stage_B, r->xnode_B,
               r->gather_B, r->xnode_job_B, r->cpu_s, per_gb,
               (unsigned long long)r->wrong);
        if (p->kind == PERF_PIPELINE) {
            printf(", \"blocked_us\": %.3f", r->blocked_us);
        }
        printf("}");
    } else if (o->csv) {
        printf("%zu,%s,%s,%d,%.3f,%.3f,%.3f,%.3f,%.6f,%.0f,%.0f,%.0f,%.0f,%.6f,"
               "%.6f,%llu", r->size, perf_kind_names[p->kind], mode_label(p, mode),
               p->tp, r->p50, r->p99, r->avg, r->max, algbw, r->stage_B,
               r->xnode_B, r->gather_B, r->xnode_job_B, r->cpu_s, per_gb,
               (unsigned long long)r->wrong);
        if (p->kind == PERF_PIPELINE) {
            printf(",%.3f", r->blocked_us);
        }
        printf("\n");
    } else {
        printf("%12zu %15s %3d %9.1f %9.1f %9.1f %9.1f %8.3f %11.0f %11.0f "
               "%11.0f %8.3f %6llu", r->size, mode_label(p, mode), p->tp,
               r->p50, r->p99, r->avg, r->max, algbw, r->stage_B, r->xnode_B,
               r->gather_B, per_gb, (unsigned long long)r->wrong);
        if (p->kind == PERF_PIPELINE) {
            printf(" %11.1f", r->blocked_us);
        }
        printf("\n");
    }
    fflush(stdout);
}

static void print_init_row(const perf_opts_t *o, const perf_row_t *r,
                           const perf_boot_t *boot)
{
    const perf_params_t *p = &o->p;

    if (o->json) {
        printf("\n  {\"rounds\": %d, \"p50_ms\": %.3f, \"p99_ms\": %.3f, "
               "\"avg_ms\": %.3f, \"min_ms\": %.3f, \"max_ms\": %.3f, "
               "\"cpu_s\": %.6f}", p->iters, r->p50, r->p99, r->avg, r->min,
               r->max, r->cpu_s);
    } else if (o->csv) {
        printf("init,%d,%d,%s,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.6f\n", p->tp,
               2 * p->tp, boot->kind, boot->sealed, p->iters, r->p50, r->p99,
               r->avg, r->min, r->max, r->cpu_s);
    } else {
        printf("%10.2f %10.2f %10.2f %10.2f %10.2f %10.3f\n", r->p50, r->p99,
               r->avg, r->min, r->max, r->cpu_s);
    }
}

/* Whether a launcher started this process (its rank variables; a Slurm
 * batch script's SLURM_PROCID is no srun task). */
static int launched(void)
{
    static const char *const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK",
                                       "SLURM_STEP_NUM_TASKS", "PMIX_RANK"};
    size_t                   i;

    for (i = 0; i < sizeof(vars) / sizeof(vars[0]); ++i) {
        if (getenv(vars[i]) != NULL) {
            return 1;
        }
    }
    return 0;
}

/* Parameters a client sent: this layout and every field in its range, or
 * a sentence.  The server trusts nothing from the wire. */
static int params_valid(const perf_params_t *p, char *why, size_t len)
{
    int i;

    if (p->magic != PERF_PARAMS_MAGIC) {
        snprintf(why, len, "not a stagelink_perftest %s client (magic %#x)",
                 STAGELINK_VERSION_STRING, (unsigned)p->magic);
        return 0;
    }
    if (p->kind < 0 || p->kind >= PERF_KINDS || p->tp != 1 || p->iters < 1 ||
        p->iters > PERF_MAX_ITERS || p->warmup < 0 || p->warmup > PERF_MAX_ITERS ||
        p->nsizes < 1 || p->nsizes > PERF_MAX_SIZES || p->microbatches < 1 ||
        p->microbatches > 100000 || p->chunks < 1 ||
        p->chunks > (int)STAGELINK_TAG_MAX_CHUNK + 1 || p->compute_us < 0 ||
        p->compute_us > 60000000 || p->mode < 0 || p->mode > STAGELINK_MODE_SHARDED ||
        (unsigned)p->check > 1 || (unsigned)p->cuda > 1 || (unsigned)p->corrupt > 1) {
        snprintf(why, len, "parameters out of range (test %d, t %d, %d "
                 "iterations, %d sizes)", p->kind, p->tp, p->iters, p->nsizes);
        return 0;
    }
    for (i = 0; i < p->nsizes; ++i) {
        if (p->sizes[i] > ((uint64_t)1 << 36)) {
            snprintf(why, len, "size %llu is above 64 GiB",
                     (unsigned long long)p->sizes[i]);
            return 0;
        }
    }
#ifndef STAGELINK_HAVE_CUDA
    if (p->cuda) {
        snprintf(why, len, "-m cuda, but this server was built without CUDA");
        return 0;
    }
#else
    if (p->cuda) {
        int count = 0;

        if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
            cudaGetLastError();
            snprintf(why, len, "-m cuda, but this server has no CUDA device");
            return 0;
        }
    }
#endif
    return 1;
}

/*
 * ucx_perftest's two processes: the server is rank 0 (stage 0), whose
 * rendezvous listens on PORT on every interface; the client is rank 1,
 * connecting to SERVER:PORT, and sends the server its parameters.
 */
static int two_process_setup(perf_opts_t *o)
{
    char       port[16], why[256] = "";
    sl_host_t  h;
    int        client = (o->server != NULL), rc;

    if (o->p.tp != 1) {
        fprintf(stderr, "two processes run t = 1; -g %d needs a launcher of "
                "%d ranks (stagelink_run -n %d)\n", o->p.tp, 2 * o->p.tp,
                2 * o->p.tp);
        return -1;
    }
    snprintf(port, sizeof(port), "%d", o->port);
    setenv("RANK", client ? "1" : "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_PORT", port, 1);
    setenv("MASTER_ADDR", client ? o->server : "127.0.0.1", 1);
    if (!client) {
        setenv("STAGELINK_BOOTSTRAP_BIND", "0.0.0.0", 0);
        fprintf(stderr, "stagelink_perftest: waiting for a client on port %d\n",
                o->port);
    }
    if (open_aux(&h, 1) != 0) {
        return -1;
    }
    /* The client's parameters, then the server's answer: "" to go, or why
     * it cannot, so that neither waits for the other to give up. */
    rc = post_wait(&h, client ? STAGELINK_OP_SEND : STAGELINK_OP_RECV,
                   sl_host_xfer(client ? STAGELINK_PEER_PREV : STAGELINK_PEER_NEXT,
                                &o->p, sizeof(o->p), 1, 0, 0));
    if (rc == 0 && !client && !params_valid(&o->p, why, sizeof(why))) {
        fprintf(stderr, "stagelink_perftest: refusing the client: %s\n", why);
    }
    if (rc == 0) {
        rc = post_wait(&h, client ? STAGELINK_OP_RECV : STAGELINK_OP_SEND,
                       sl_host_xfer(client ? STAGELINK_PEER_PREV : STAGELINK_PEER_NEXT,
                                    why, sizeof(why), 1, 1, 0));
    }
    sl_host_close(&h);
    why[sizeof(why) - 1] = '\0';
    if (rc == 0 && why[0] != '\0') {
        if (client) {
            fprintf(stderr, "stagelink_perftest: the server refused: %s\n", why);
        }
        return -1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    perf_opts_t      o;
    perf_params_t   *p = &o.p;
    sl_host_t        h;
    stagelink_mode_t modes[2], used = STAGELINK_MODE_DEFAULT;
    perf_row_t       row;
    unsigned char   *mine = NULL, *all = NULL;
    double           shard_median[PERF_MAX_SIZES] = {0};
    size_t           slot_len, rec_len;
    perf_boot_t      boot;
    int              nruns = 1, m, i, rc = 0, wrong = 0, rank = -1, reporter;

    if (parse_opts(argc, argv, &o) != 0) {
        usage(stderr);
        return 2;
    }
    o.two_proc = !launched();
    if (!o.two_proc && o.server != NULL) {
        fprintf(stderr, "SERVER \"%s\" names a two-process run, but a "
                "launcher's variables are set: drop it (the launcher's "
                "rendezvous is used)\n", o.server);
        return 2;
    }
    if (o.two_proc && two_process_setup(&o) != 0) {
        return 1;
    }
#ifdef STAGELINK_HAVE_CUDA
    if (p->cuda) {
        int         ndev = 0;
        cudaError_t err  = cudaGetDeviceCount(&ndev);
        char        why[512];
        int         lr   = sl_host_job(why, sizeof(why)).local_rank;

        if (err != cudaSuccess || ndev == 0) {
            printf("SKIP: -m cuda: no CUDA device: %s\n",
                   (err != cudaSuccess) ? cudaGetErrorString(err)
                                        : "the runtime sees 0 devices");
            return 77;
        }
        cudaSetDevice((lr > 0 ? lr : 0) % ndev);
        perf_mem = STAGELINK_MEM_CUDA;
    }
#else
    if (p->cuda) {
        printf("SKIP: -m cuda: stagelink_perftest was built without CUDA\n");
        return 77;
    }
#endif
    bootstrap_of(&boot);
    /* gather = scatter_gather - shard: two communicators, one per mode. */
    modes[0] = (p->kind == PERF_SHARD || p->kind == PERF_GATHER)
                   ? STAGELINK_MODE_SHARDED : (stagelink_mode_t)p->mode;
    if (p->kind == PERF_GATHER) {
        modes[1] = STAGELINK_MODE_SCATTER_GATHER;
        nruns    = 2;
    }
    if (p->kind == PERF_INIT) {
        p->nsizes = 1;
    }
    slot_len = sizeof(perf_slot_t) + (size_t)p->iters * sizeof(double);
    rec_len  = (size_t)nruns * (size_t)p->nsizes * slot_len;
    mine     = calloc(1, rec_len);
    all      = calloc(2 * (size_t)p->tp, rec_len);
    if (mine == NULL || all == NULL) {
        fprintf(stderr, "out of memory for %zu-byte records\n", rec_len);
        return 1;
    }
    if (p->kind == PERF_INIT) {
        perf_slot_t *s = (perf_slot_t *)mine;
        double      *t = (double *)(s + 1), t0, cpu0 = 0;

        for (i = 0; i < p->warmup + p->iters && rc == 0; ++i) {
            if (i == p->warmup) {
                cpu0 = cpu_seconds();
            }
            t0 = now_us();
            if (sl_host_open(&h, p->tp, 2, (stagelink_mode_t)p->mode) != 0) {
                return 1;
            }
            if (i >= p->warmup) {
                t[i - p->warmup] = (now_us() - t0) * 1e-3;
            }
            rank = h.info.rank;
            sl_host_close(&h);
        }
        s->cpu_s = cpu_seconds() - cpu0;
        s->timed = 1;
    }
    for (m = 0; m < nruns && p->kind != PERF_INIT && rc == 0; ++m) {
        perf_slot_t warm;
        size_t      top = 0;

        if (sl_host_open(&h, p->tp, 2, modes[m]) != 0) {
            return 1;
        }
        if (h.info.world_size != 2 * p->tp) {
            fprintf(stderr, "rank %d: %d ranks, but -g %d needs %d (two stages "
                    "of %d)\n", h.info.rank, h.info.world_size, p->tp,
                    2 * p->tp, p->tp);
            sl_host_close(&h);
            return 2;
        }
        rank = h.info.rank;
        used = h.info.mode;
        if (p->kind != PERF_PIPELINE) {
            /* The connections' first megabytes run slow (TCP's window
             * opening, UCX's lanes): one round at the largest size first,
             * as nccl-tests warm up, so the first size measured is not the
             * one that pays. */
            perf_params_t once = *p;

            for (i = 0; i < p->nsizes; ++i) {
                top = (p->sizes[i] > top) ? p->sizes[i] : top;
            }
            once.iters = 1;
            rc     = run_size(&h, &once, top, &warm, NULL);
            wrong |= (warm.wrong != 0);
        }
        for (i = 0; i < p->nsizes && rc == 0; ++i) {
            perf_slot_t *s = (perf_slot_t *)(mine + ((size_t)m * p->nsizes + i) * slot_len);

            rc     = run_size(&h, p, p->sizes[i], s, (double *)(s + 1));
            wrong |= (s->wrong != 0);
        }
        sl_host_close(&h);
    }
    if (rc != 0) {
        return 1;
    }
    if (gather_records(p->tp, mine, rec_len, all) != 0) {
        return 1;
    }
    /* Rank 0 prints; in two processes the client, as ucx_perftest's does. */
    reporter = o.two_proc ? 1 : 0;
    if (rank == reporter) {
        print_header(&o, used, &boot);
        for (i = 0; i < p->nsizes; ++i) {
            size_t k = (size_t)(nruns - 1) * p->nsizes + i;

            if (p->kind == PERF_GATHER) {
                make_row(p, all, rec_len, (size_t)i * slot_len,
                         p->sizes[i], 0, &row);
                shard_median[i] = row.p50;
            }
            make_row(p, all, rec_len, k * slot_len, p->sizes[i],
                     shard_median[i], &row);
            if (p->kind == PERF_INIT) {
                print_init_row(&o, &row, &boot);
            } else {
                print_row(&o, used, &row, i == 0);
            }
            wrong |= (row.wrong != 0);
        }
        if (o.json) {
            printf("\n]}\n");
        }
        fflush(stdout);
    }
    free(mine);
    free(all);
    return wrong ? 1 : 0;
}
