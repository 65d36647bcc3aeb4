/*
 * The intra-node gather alone, to compare with MPI_Allgather at the same
 * process count and sizes: one pipeline stage of t = WORLD_SIZE TP ranks,
 * each holding its shard, rebuild the tensor through the plugin's gather
 * backend (its internals are linked in; no shard crosses a stage).  Rank 0
 * prints CSV: size,ranks,avg_us,algbw_GBps (the max over ranks of the
 * average; algbw = size / time).  Every rebuilt byte is checked.
 *   stagelink_run -n T -- gather_only [-n ITERS] SIZE...
 * SPDX-License-Identifier: MIT
 */
#include "gather.h"
#include "host.h"
#include "pattern.h"
#include "sl_bootstrap.h"
#include "sl_time.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int gather_locked(sl_comm_t *comm, unsigned char *buf, size_t n,
                         uint32_t mb)
{
    stagelink_xfer_t x = sl_host_xfer(STAGELINK_PEER_PREV, buf, n, 1, mb, 0);
    sl_req_t        *req;

    if (sl_req_get(comm, STAGELINK_OP_RECV, &x, 0, &req) != STAGELINK_SUCCESS) {
        return -1;
    }
    req->peer         = &comm->tp_peers[comm->layout.tp_index];
    req->shard        = sl_shard_get(n, 1, comm->layout.tp_size,
                                     comm->layout.tp_index);
    req->needs_gather = 1;
    req->gather       = comm->gather;
    req->gather_state = comm->gather_state;
    /* Our shard is in place already: only the gather runs. */
    if (sl_req_start_gather(req) != STAGELINK_SUCCESS ||
        sl_req_wait(comm, req) != STAGELINK_SUCCESS) {
        return -1;
    }
    return (sl_req_finish(comm, req) == STAGELINK_SUCCESS) ? 0 : -1;
}

/* The internals are called as the vtable would: holding the communicator. */
static int gather_once(sl_comm_t *comm, unsigned char *buf, size_t n,
                       uint32_t mb)
{
    int rc;

    sl_progress_enter(comm);
    rc = gather_locked(comm, buf, n, mb);
    sl_progress_leave(comm);
    return rc;
}

int main(int argc, char **argv)
{
    const stagelink_plugin_v1_t *p = &stagelink_plugin_v1;
    stagelink_config_t           cfg;
    stagelink_comm_t            *comm;
    sl_errbuf_t                  eb;
    int                          opt, iters = 20, it, i, t, bad = 0;
    size_t                       n, k;
    double                       t0 = 0, sum, *all;
    unsigned char               *buf;

    while ((opt = getopt(argc, argv, "n:")) != -1) {
        iters = atoi(optarg);
    }
    t = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size = sizeof(cfg);
    cfg.tp_size     = t;
    cfg.pp_size     = 1;
    cfg.mode        = STAGELINK_MODE_SCATTER_GATHER;
    if (p->comm_init(&cfg, &comm) != STAGELINK_SUCCESS) {
        fprintf(stderr, "init: %s\n", p->last_error(NULL));
        return 1;
    }
    all = calloc((size_t)t, sizeof(double));
    if (comm->layout.rank == 0) {
        printf("size,ranks,avg_us,algbw_GBps\n");
    }
    for (i = optind; i < argc; ++i) {
        if (sl_host_parse_size(argv[i], &n) != 0 || (buf = malloc(n)) == NULL) {
            return 2;
        }
        /* Timed back to back after one barrier, as mpi_allgather_bench
         * times MPI_Allgather: a barrier per round would add its skew and
         * the wake-up of every rank that slept in it. */
        sl_shard_t own = sl_shard_get(n, 1, t, comm->layout.tp_index);

        memset(buf, 0, n);
        sl_pattern_fill(buf, own.offset, own.length, 42);
        for (it = -3; it < iters; ++it) { /* 3 warm-up rounds */
            if (it == 0) {
                sl_progress_enter(comm); /* its waits progress the worker */
                sl_bootstrap_barrier(comm->bootstrap, comm->peer_ranks,
                                     comm->npeers, &eb);
                sl_progress_leave(comm);
                t0 = sl_time_now();
            }
            if (gather_once(comm, buf, n, (uint32_t)(it + 3)) != 0) {
                fprintf(stderr, "gather: %s\n", comm->err.msg);
                return 1;
            }
        }
        sum = sl_time_now() - t0;
        bad |= (sl_pattern_check(buf, 0, n, 42) != SIZE_MAX);
        sum = sum / iters * 1e6;
        sl_progress_enter(comm);
        sl_bootstrap_exchange_fixed(comm->bootstrap, "times", &sum,
                                    sizeof(sum), comm->layout.tp_ranks, t,
                                    all, &eb);
        sl_progress_leave(comm);
        for (k = 1; k < (size_t)t; ++k) {
            all[0] = (all[k] > all[0]) ? all[k] : all[0];
        }
        if (comm->layout.rank == 0) {
            printf("%zu,%d,%.2f,%.3f\n", n, t, all[0], (double)n / (all[0] * 1e3));
        }
        free(buf);
    }
    free(all);
    p->comm_finalize(comm);
    if (bad) {
        fprintf(stderr, "rank: the rebuilt tensor is wrong\n");
    }
    return bad ? 1 : 0;
}
