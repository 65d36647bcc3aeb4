/*
 * stagelink_soak: boundary transfers forward and back, over and over, every
 * byte checked against the pattern of the stage, microbatch and direction
 * that sent it, with the process's descriptors and resident memory watched
 * for growth.  Minutes or hours by hand, a fixed count in CI; every rank
 * runs the same count (a time limit would end ranks at different
 * iterations), with a progress line every -p seconds.
 *
 *   stagelink_run -n 4 -- stagelink_soak -t 2 -s 1M -n 200000 -p 30
 *
 * With -r, a wait that passes STAGELINK_TIMEOUT is reported and waited on
 * again (the request stays in flight): a link that goes down and comes
 * back shows as timeouts, then as transfers that complete intact.
 * Exit: 0 when every byte matched and nothing grew; 1 otherwise.
 * SPDX-License-Identifier: MIT
 */
#include "host.h"
#include "pattern.h"
#include "resources.h"

#include <dlfcn.h>
#include "tool_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef void (*alloc_counts_fn)(unsigned long *total, unsigned long *ours);

typedef struct soak {
    sl_host_t      h;
    size_t         size;
    int            retries;
    unsigned char *send_buf[2], *recv_buf[2]; /* by direction */
    unsigned long  iterations, timeouts, mismatches;
    unsigned long long verified; /* bytes compared with the pattern */
    double         longest_wait;
} soak_t;

static double now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stagelink_soak [-t TP] [-s SIZE] [-n ITERATIONS] [-p SECONDS]\n"
            "                      [-r RETRIES] [-g MAX_RSS_GROWTH]\n"
            "  -t  tensor-parallel size (default 1)\n"
            "  -s  tensor size, e.g. 64K, 16M (default 1M)\n"
            "  -n  iterations, forward and back (default 1000)\n"
            "  -p  a progress line every this many seconds (default: none)\n"
            "  -r  waits that time out are retried this many times (default 0)\n"
            "  -g  allowed RSS growth after warm-up, bytes (default 4M)\n");
}

/* Waits, retrying a timeout up to -r times; the longest wait is kept. */
static stagelink_status_t soak_wait(soak_t *s, stagelink_request_t *req)
{
    stagelink_status_t st;
    double             t0;
    int                tries = 0;

    for (;;) {
        t0 = now();
        st = s->h.plugin->wait(s->h.comm, req);
        if (now() - t0 > s->longest_wait) {
            s->longest_wait = now() - t0;
        }
        if (st != STAGELINK_ERR_TIMEOUT || tries++ >= s->retries) {
            return st;
        }
        ++s->timeouts;
        printf("rank %d: iteration %lu: wait timed out after %.2f s; waiting "
               "again (%d of %d)\n", s->h.info.rank, s->iterations,
               now() - t0, tries, s->retries);
        fflush(stdout);
    }
}

/* A failure, at post or at wait (a peer's death the progress thread saw
 * first refuses the next post): when it was seen, and the sentence. */
static int soak_failed(soak_t *s, stagelink_status_t st, const char *what)
{
    struct timespec wall;

    clock_gettime(CLOCK_REALTIME, &wall);
    printf("rank %d: iteration %lu: error at %ld.%06ld\n", s->h.info.rank,
           s->iterations, (long)wall.tv_sec, wall.tv_nsec / 1000);
    sl_host_report(&s->h, st, what);
    return -1;
}

/* One direction: every rank posts what it has (receive, send) as one
 * batch, waits, and checks what it received. */
static int soak_phase(soak_t *s, int backward)
{
    const stagelink_comm_info_t *in = &s->h.info;
    stagelink_op_t               ops[2];
    stagelink_request_t         *reqs[2];
    stagelink_peer_t             from = backward ? STAGELINK_PEER_NEXT
                                                 : STAGELINK_PEER_PREV;
    uint32_t                     mb   = (uint32_t)s->iterations;
    size_t                       n = 0, i, bad;
    int                          src_stage = in->pp_index + (backward ? 1 : -1);
    stagelink_status_t           st;

    if ((backward ? in->next_rank : in->prev_rank) >= 0) {
        ops[n].kind = STAGELINK_OP_RECV;
        ops[n].xfer = sl_host_xfer(from, s->recv_buf[backward], s->size, 1,
                                   mb, 0);
        ++n;
    }
    if ((backward ? in->prev_rank : in->next_rank) >= 0) {
        sl_pattern_fill(s->send_buf[backward], 0, s->size,
                        sl_pattern_seed(in->pp_index, mb, 0, backward));
        ops[n].kind = STAGELINK_OP_SEND;
        ops[n].xfer = sl_host_xfer(backward ? STAGELINK_PEER_PREV
                                            : STAGELINK_PEER_NEXT,
                                   s->send_buf[backward], s->size, 1, mb, 0);
        ++n;
    }
    st = s->h.plugin->post_batch(s->h.comm, ops, n, reqs);
    if (st != STAGELINK_SUCCESS) {
        return soak_failed(s, st, "post_batch");
    }
    for (i = 0; i < n; ++i) {
        st = soak_wait(s, reqs[i]);
        if (st != STAGELINK_SUCCESS) {
            return soak_failed(s, st, "wait");
        }
    }
    if (n > 0 && ops[0].kind == STAGELINK_OP_RECV) {
        bad = sl_pattern_check(s->recv_buf[backward], 0, s->size,
                               sl_pattern_seed(src_stage, mb, 0, backward));
        s->verified += s->size;
        if (bad != SIZE_MAX) {
            ++s->mismatches;
            fprintf(stderr, "rank %d: iteration %lu %s: byte %zu of %zu "
                    "differs from what stage %d sent\n", in->rank,
                    s->iterations, backward ? "backward" : "forward", bad,
                    s->size, src_stage);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    alloc_counts_fn counts = (alloc_counts_fn)(uintptr_t)dlsym(RTLD_DEFAULT,
                                                               "sl_alloc_counts");
    soak_t          s;
    int             tp = 1, opt, fds0 = 0, fds1, rc = 0, d;
    unsigned long   count = 1000, warmup, total0 = 0, ours0 = 0, total1, ours1;
    size_t          growth = 4u << 20;
    long            rss0 = 0, rss1;
    double          every = 0, t0, next_report;

    memset(&s, 0, sizeof(s));
    s.size = 1u << 20;
    while ((opt = getopt_long(argc, argv, "t:s:n:p:r:g:h", sl_tool_longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 't': tp = atoi(optarg); break;
        case 's':
            if (sl_host_parse_size(optarg, &s.size) != 0) {
                usage(stderr);
                return 2;
            }
            break;
        case 'n': count = strtoul(optarg, NULL, 10); break;
        case 'p': every = atof(optarg); break;
        case 'r': s.retries = atoi(optarg); break;
        case 'g':
            if (sl_host_parse_size(optarg, &growth) != 0) {
                usage(stderr);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 0;
        case 'V': return sl_tool_version("stagelink_soak");
        default: usage(stderr); return 2;
        }
    }
    if (tp < 1 || count == 0) {
        usage(stderr);
        return 2;
    }
    for (d = 0; d < 2; ++d) {
        s.send_buf[d] = malloc(s.size ? s.size : 1);
        s.recv_buf[d] = malloc(s.size ? s.size : 1);
        if (s.send_buf[d] == NULL || s.recv_buf[d] == NULL) {
            fprintf(stderr, "cannot allocate 4 buffers of %zu bytes\n", s.size);
            return 1;
        }
    }
    if (sl_host_open(&s.h, tp, 0, STAGELINK_MODE_DEFAULT) != 0) {
        return 1;
    }
    /* Descriptors and memory are taken after the caches have warmed up. */
    warmup      = (count < 1000) ? count / 10 : 100;
    t0          = now();
    next_report = t0 + every;
    while (s.iterations < count) {
        if (every > 0 && now() >= next_report) {
            next_report += every;
            printf("soak: rank %d: %.0f s, %lu iterations, %llu bytes "
                   "verified, RSS %ld KiB, %d descriptors\n", s.h.info.rank,
                   now() - t0, s.iterations, s.verified, rss_bytes() / 1024,
                   open_fds());
            fflush(stdout);
        }
        if (s.iterations == warmup) {
            fds0 = open_fds();
            rss0 = rss_bytes();
            if (counts != NULL) {
                counts(&total0, &ours0);
            }
        }
        if (soak_phase(&s, 0) != 0 || soak_phase(&s, 1) != 0) {
            rc = 1;
            break;
        }
        ++s.iterations;
    }
    fds1 = open_fds();
    rss1 = rss_bytes();
    printf("soak: rank %d: %lu iterations of %zu bytes forward and back in "
           "%.1f s, %llu bytes verified, %lu mismatches, %lu timeouts, "
           "longest wait %.3f s\n", s.h.info.rank, s.iterations, s.size,
           now() - t0, s.verified, s.mismatches, s.timeouts, s.longest_wait);
    if (rc == 0 && s.iterations > warmup) {
        printf("soak: rank %d: after warm-up (%lu iterations): descriptors "
               "%d -> %d, RSS %+ld KiB", s.h.info.rank, warmup, fds0, fds1,
               (rss1 - rss0) / 1024);
        if (counts != NULL) {
            counts(&total1, &ours1);
            printf(", heap allocations: %lu by stagelink, %lu by the rest "
                   "(UCX)", ours1 - ours0, (total1 - total0) - (ours1 - ours0));
            if (ours1 != ours0) {
                fprintf(stderr, "soak: stagelink allocated %lu times on the "
                        "transfer path\n", ours1 - ours0);
                rc = 1;
            }
        }
        printf("\n");
        if (fds1 != fds0) {
            fprintf(stderr, "soak: descriptors grew from %d to %d\n", fds0,
                    fds1);
            rc = 1;
        }
#ifndef __SANITIZE_ADDRESS__ /* its quarantine holds freed memory by design */
        if (rss1 - rss0 > (long)growth) {
            fprintf(stderr, "soak: RSS grew by %ld KiB, more than %zu KiB\n",
                    (rss1 - rss0) / 1024, growth / 1024);
            rc = 1;
        }
#endif
    }
    sl_host_close(&s.h);
    for (d = 0; d < 2; ++d) {
        free(s.send_buf[d]);
        free(s.recv_buf[d]);
    }
    return rc;
}
