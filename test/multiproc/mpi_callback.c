/*
 * The host passes its own out-of-band allgather (here MPI_Allgather, the
 * way a runtime passes its store) instead of stagelink's TCP rendezvous,
 * and its own placement: every rank checks a forward and a backward
 * transfer of every size byte by byte.  Then a second communicator whose
 * gathers the host does itself (the config's gather callback, here
 * MPI_Allgatherv on the TP group's communicator): every receive posted
 * before any send, the sends in reverse order, the receives completed in
 * post order; each must be gathered once (the empty one never), in that
 * order, and be whole.
 * Run under mpirun with 2t ranks.
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"
#include "pattern.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mpi_allgather(void *ctx, const void *sendbuf, void *recvbuf,
                         size_t size)
{
    return MPI_Allgather(sendbuf, (int)size, MPI_BYTE, recvbuf, (int)size,
                         MPI_BYTE, *(MPI_Comm *)ctx) != MPI_SUCCESS;
}

/* The TP group's own collective; counts its calls and checks their order. */
typedef struct host_gather {
    MPI_Comm tp;
    int      calls;
    int      out_of_order;
    int      last;         /* the microbatch of the last call */
} host_gather_t;

static int mpi_gather(void *ctx, const stagelink_gather_args_t *a)
{
    host_gather_t *g = ctx;
    int            counts[64], displs[64], k;

    /* It says how much it filled (stagelink.h, "Growing the ABI"). */
    if ((a->struct_size != 0 && a->struct_size < sizeof(*a)) || a->tp_size > 64 ||
        a->mem_type != STAGELINK_MEM_HOST) {
        return -1;
    }
    g->out_of_order += ((int)a->tag.microbatch <= g->last);
    g->last = (int)a->tag.microbatch;
    g->calls++;
    for (k = 0; k < a->tp_size; ++k) {
        counts[k] = (int)a->lengths[k];
        displs[k] = (int)a->offsets[k];
    }
    return MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, a->buf, counts, displs,
                          MPI_BYTE, g->tp) != MPI_SUCCESS;
}

#define NSIZES 5

/* Whether `buf` holds the pattern of (stage, microbatch), whole. */
static int pattern_ok(const unsigned char *buf, size_t n, int stage,
                      int microbatch)
{
    return sl_pattern_check(buf, 0, n, sl_pattern_seed(stage,
                                                       (uint32_t)microbatch,
                                                       0, 0)) == SIZE_MAX;
}

/* Every receive in flight at once, gathered by the host, in post order. */
static void host_gather_run(stagelink_loader_t *loader, stagelink_config_t *cfg,
                           const size_t *sizes, int rank, int stage)
{
    const stagelink_plugin_v1_t *p = stagelink_loader_plugin(loader);
    stagelink_comm_t            *comm;
    stagelink_comm_info_t        info;
    stagelink_request_t         *req[NSIZES];
    stagelink_xfer_t             x;
    host_gather_t                g = {MPI_COMM_NULL, 0, 0, -1};
    unsigned char               *buf[NSIZES];
    char                         err[1024];
    int                          i;

    MPI_Comm_split(MPI_COMM_WORLD, stage, rank, &g.tp);
    cfg->gather     = mpi_gather;
    cfg->gather_ctx = &g;
    if (stagelink_loader_comm_init(loader, cfg, &comm, err, sizeof(err))) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    CHECK(p->comm_info(comm, &info) == 0 &&
          strcmp(info.gather_backend, "host") == 0,
          "rank %d: gathers with %s, not the host's callback", rank,
          info.gather_backend);
    for (i = 0; i < NSIZES; ++i) {
        buf[i] = malloc(sizes[i] + 1);
        if (stage == 1) {
            memset(buf[i], 0xee, sizes[i]);
            x = sl_host_xfer(STAGELINK_PEER_PREV, buf[i], sizes[i], 1,
                             (uint32_t)i, 0);
            CHECK(p->irecv(comm, &x, &req[i]) == 0, "rank %d: irecv %d: %s",
                  rank, i, p->last_error(comm));
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (i = NSIZES - 1; stage == 0 && i >= 0; --i) {
        sl_pattern_fill(buf[i], 0, sizes[i], sl_pattern_seed(1, (uint32_t)i, 0, 0));
        x = sl_host_xfer(STAGELINK_PEER_NEXT, buf[i], sizes[i], 1, (uint32_t)i, 0);
        CHECK(p->isend(comm, &x, &req[i]) == 0, "rank %d: isend %d: %s",
              rank, i, p->last_error(comm));
    }
    for (i = 0; i < NSIZES; ++i) {
        int ok = p->wait(comm, req[i]) == 0;

        CHECK(ok, "rank %d: %s", rank, p->last_error(comm));
        CHECK(!ok || stage != 1 || pattern_ok(buf[i], sizes[i], 1, i),
              "rank %d: host-gathered %zu bytes differ", rank, sizes[i]);
    }
    /* Every receive but the empty one (nothing to gather). */
    CHECK(stage != 1 || (g.calls == NSIZES - 1 && g.out_of_order == 0),
          "rank %d: %d host gathers (%d out of post order), want %d in order",
          rank, g.calls, g.out_of_order, NSIZES - 1);
    for (i = 0; i < NSIZES; ++i) {
        free(buf[i]);
    }
    p->comm_finalize(comm);
    MPI_Comm_free(&g.tp);
}

int main(int argc, char **argv)
{
    static const size_t  sizes[NSIZES] = {0, 1, 4097, 1 << 20, (4 << 20) + 3};
    const stagelink_plugin_v1_t *p;
    stagelink_loader_t  *loader;
    stagelink_comm_t    *comm;
    stagelink_config_t   cfg;
    stagelink_topology_t topo = {.struct_size = sizeof(topo)};
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    MPI_Comm             world = MPI_COMM_WORLD;
    char                 err[1024];
    int                  rank, size, t, stage, group[64], i, failed;
    size_t               s;
    unsigned char       *buf;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(world, &rank);
    MPI_Comm_size(world, &size);
    t     = size / 2;
    stage = rank / t;
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        MPI_Abort(world, 1);
    }
    p = stagelink_loader_plugin(loader);

    /* Explicit placement: the same grid as Megatron's order, given by hand. */
    for (i = 0; i < t; ++i) {
        group[i] = stage * t + i;
    }
    topo.prev_rank = (stage == 1) ? rank - t : -1;
    topo.next_rank = (stage == 0) ? rank + t : -1;
    topo.tp_index  = rank % t;
    topo.tp_ranks  = group;
    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size   = sizeof(cfg);
    cfg.flags         = STAGELINK_CONFIG_RANK_SET;
    cfg.rank          = rank;
    cfg.world_size    = size;
    cfg.tp_size       = t;
    cfg.pp_size       = 2;
    cfg.topology      = &topo;
    cfg.allgather     = mpi_allgather;
    cfg.allgather_ctx = &world;
    if (stagelink_loader_comm_init(loader, &cfg, &comm, err, sizeof(err))) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        MPI_Abort(world, 1);
    }
    for (s = 0; s < sizeof(sizes) / sizeof(sizes[0]); ++s) {
        buf = malloc(sizes[s] + 1);
        x = sl_host_xfer((stage == 0) ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                         buf, sizes[s], 1, (uint32_t)s, 0);
        if (stage == 0) {
            sl_pattern_fill(buf, 0, sizes[s], sl_pattern_seed(0, (uint32_t)s, 0, 0));
        }
        int ok = (stage == 0 ? p->isend(comm, &x, &req)
                             : p->irecv(comm, &x, &req)) == 0 &&
                 p->wait(comm, req) == 0;

        CHECK(ok, "rank %d: %s", rank, p->last_error(comm));
        CHECK(!ok || stage != 1 || pattern_ok(buf, sizes[s], 0, (int)s),
              "rank %d: %zu bytes differ", rank, sizes[s]);
        free(buf);
    }
    p->comm_finalize(comm);
    host_gather_run(loader, &cfg, sizes, rank, stage);
    stagelink_loader_close(loader);
    failed = check_summary();
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, world);
    if (rank == 0) {
        printf("host allgather and gather callbacks, explicit topology, "
               "t=%d: %s\n", t, failed ? "FAILED" : "ok");
    }
    MPI_Finalize();
    return failed;
}
