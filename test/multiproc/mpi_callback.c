/*
 * The host passes its own out-of-band allgather (here MPI_Allgather, the
 * way a runtime passes its store) instead of stagelink's TCP rendezvous,
 * and its own placement: every rank checks a forward and a backward
 * transfer of every size byte by byte.  Run under mpirun with 2t ranks.
 * SPDX-License-Identifier: MIT
 */
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

int main(int argc, char **argv)
{
    static const size_t  sizes[] = {0, 1, 4097, 1 << 20, (4 << 20) + 3};
    const stagelink_plugin_v1_t *p;
    stagelink_loader_t  *loader;
    stagelink_comm_t    *comm;
    stagelink_config_t   cfg;
    stagelink_topology_t topo;
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    MPI_Comm             world = MPI_COMM_WORLD;
    char                 err[1024];
    int                  rank, size, t, stage, group[64], i, failures = 0;
    size_t               s, bad;
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
        if ((stage == 0 ? p->isend(comm, &x, &req) : p->irecv(comm, &x, &req)) ||
            p->wait(comm, req)) {
            fprintf(stderr, "rank %d: %s\n", rank, p->last_error(comm));
            ++failures;
        } else if (stage == 1 &&
                   (bad = sl_pattern_check(buf, 0, sizes[s],
                                           sl_pattern_seed(0, (uint32_t)s, 0, 0))) != SIZE_MAX) {
            fprintf(stderr, "rank %d: %zu bytes differ at %zu\n", rank,
                    sizes[s], bad);
            ++failures;
        }
        free(buf);
    }
    p->comm_finalize(comm);
    stagelink_loader_close(loader);
    MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, world);
    if (rank == 0) {
        printf("host allgather callback, explicit topology, t=%d: %s\n", t,
               failures ? "FAILED" : "ok");
    }
    MPI_Finalize();
    return failures ? 1 : 0;
}
