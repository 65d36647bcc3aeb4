/* SPDX-License-Identifier: MIT */
#include "sl_layout.h"

#include "sl_abi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sl_status_t sl_layout_alloc_group(sl_layout_t *layout, sl_errbuf_t *eb)
{
    layout->tp_ranks = calloc((size_t)layout->tp_size, sizeof(int));
    if (layout->tp_ranks == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate the TP group of %d ranks",
                        layout->tp_size);
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_layout_check_sizes(int rank, int world_size, int tp_size,
                                         sl_errbuf_t *eb)
{
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "rank %d is outside world size %d; check the "
                        "launcher's rank variables", rank, world_size);
    }
    /* A TP index is the 8-bit source field of a tag (plugin/ucx/ucx_wire.h). */
    if (tp_size < 1 || tp_size > world_size || tp_size > 256) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "tensor-parallel size %d must be in [1, world size %d] "
                        "and at most 256", tp_size, world_size);
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_layout_from_order(int rank, int world_size, int tp_size,
                                 int pp_size, sl_layout_t *layout,
                                 sl_errbuf_t *eb)
{
    int stride, i;

    memset(layout, 0, sizeof(*layout));
    SL_CHECK(sl_layout_check_sizes(rank, world_size, tp_size, eb));
    if (pp_size == 0) {
        pp_size = world_size / tp_size;
    }
    /* pp_size past world_size / tp_size cannot divide it, and checked
     * first keeps tp_size * pp_size in range. */
    if (pp_size < 1 || pp_size > world_size / tp_size ||
        world_size % (tp_size * pp_size) != 0) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "world size %d is not a multiple of tp_size %d x "
                        "pp_size %d; fix the parallel sizes", world_size,
                        tp_size, pp_size);
    }
    layout->rank       = rank;
    layout->world_size = world_size;
    layout->tp_size    = tp_size;
    layout->pp_size    = pp_size;
    layout->dp_size    = world_size / (tp_size * pp_size);
    stride             = tp_size * layout->dp_size;
    layout->tp_index   = rank % tp_size;
    layout->dp_index   = (rank / tp_size) % layout->dp_size;
    layout->pp_index   = rank / stride;
    layout->prev_rank  = (layout->pp_index > 0) ? rank - stride : -1;
    layout->next_rank  = (layout->pp_index < pp_size - 1) ? rank + stride : -1;
    SL_CHECK(sl_layout_alloc_group(layout, eb));
    for (i = 0; i < tp_size; ++i) {
        layout->tp_ranks[i] = rank - layout->tp_index + i;
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_layout_from_topology(int rank, int world_size, int tp_size,
                                    int pp_size,
                                    const stagelink_topology_t *host,
                                    sl_layout_t *layout, sl_errbuf_t *eb)
{
    stagelink_topology_t        own;
    const stagelink_topology_t *topo = &own;
    int                         i;

    memset(layout, 0, sizeof(*layout));
    SL_CHECK(sl_abi_copy_in(&sl_abi_topology, host, host->struct_size, &own,
                            eb));
    SL_CHECK(sl_layout_check_sizes(rank, world_size, tp_size, eb));
    if (pp_size < 0 || pp_size > world_size) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "pp_size %d is outside [0, world size %d]; with an "
                        "explicit topology it is only reported (0: unknown)",
                        pp_size, world_size);
    }
    if (topo->tp_ranks == NULL || topo->tp_index < 0 ||
        topo->tp_index >= tp_size) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "explicit topology needs tp_ranks (%p) and tp_index "
                        "%d in [0, %d)", (const void *)topo->tp_ranks,
                        topo->tp_index, tp_size);
    }
    if (topo->tp_ranks[topo->tp_index] != rank) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "explicit topology: tp_ranks[%d] = %d but this rank "
                        "is %d", topo->tp_index,
                        topo->tp_ranks[topo->tp_index], rank);
    }
    for (i = -2; i < tp_size; ++i) {
        int r = (i == -2) ? topo->prev_rank
              : (i == -1) ? topo->next_rank : topo->tp_ranks[i];
        if (r < -1 || r >= world_size || (i >= 0 && r < 0) ||
            (i < 0 && r == rank)) {
            return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                            "explicit topology names rank %d (%s), not valid "
                            "in world size %d for rank %d", r,
                            (i == -2) ? "prev_rank"
                            : (i == -1) ? "next_rank" : "tp_ranks",
                            world_size, rank);
        }
    }
    for (i = 0; i < tp_size; ++i) {
        int k;

        for (k = 0; k < i; ++k) {
            if (topo->tp_ranks[k] == topo->tp_ranks[i]) {
                return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                                "explicit topology: tp_ranks[%d] and "
                                "tp_ranks[%d] are both rank %d; a TP group "
                                "names each of its ranks once", k, i,
                                topo->tp_ranks[i]);
            }
        }
        if (topo->tp_ranks[i] == topo->prev_rank ||
            topo->tp_ranks[i] == topo->next_rank) {
            return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                            "explicit topology: rank %d is in this rank's TP "
                            "group and is its %s stage; a neighbour stage is "
                            "outside the TP group", topo->tp_ranks[i],
                            topo->tp_ranks[i] == topo->prev_rank ? "previous"
                                                                 : "next");
        }
    }
    layout->rank       = rank;
    layout->world_size = world_size;
    layout->tp_size    = tp_size;
    layout->pp_size    = pp_size;
    layout->dp_size    = -1;
    layout->tp_index   = topo->tp_index;
    layout->dp_index   = -1;
    layout->pp_index   = -1;
    layout->prev_rank  = topo->prev_rank;
    layout->next_rank  = topo->next_rank;
    SL_CHECK(sl_layout_alloc_group(layout, eb));
    memcpy(layout->tp_ranks, topo->tp_ranks, (size_t)tp_size * sizeof(int));
    return STAGELINK_SUCCESS;
}

static int sl_layout_add(int *peers, int n, int rank, int self)
{
    int i, j;

    if (rank < 0 || rank == self) {
        return n;
    }
    for (i = 0; i < n && peers[i] < rank; ++i) {
    }
    if (i < n && peers[i] == rank) {
        return n;
    }
    for (j = n; j > i; --j) {
        peers[j] = peers[j - 1];
    }
    peers[i] = rank;
    return n + 1;
}

int sl_layout_peers(const sl_layout_t *layout, int *peers)
{
    int n = 0, k;

    for (k = 0; k < layout->tp_size; ++k) {
        n = sl_layout_add(peers, n, layout->tp_ranks[k], layout->rank);
    }
    n = sl_layout_add(peers, n, layout->prev_rank, layout->rank);
    return sl_layout_add(peers, n, layout->next_rank, layout->rank);
}

static uint64_t sl_layout_group_hash(const sl_layout_t *layout)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the ranks' bytes */
    int      k;
    size_t   b;

    for (k = 0; k < layout->tp_size; ++k) {
        uint32_t r = (uint32_t)layout->tp_ranks[k];

        for (b = 0; b < sizeof(r); ++b) {
            h = (h ^ ((r >> (8 * b)) & 0xffu)) * 0x100000001b3ull;
        }
    }
    return h;
}

void sl_layout_claim(const sl_layout_t *layout, sl_layout_claim_t *claim)
{
    memset(claim, 0, sizeof(*claim));
    claim->prev_rank = layout->prev_rank;
    claim->next_rank = layout->next_rank;
    claim->tp_size   = layout->tp_size;
    claim->tp_index  = layout->tp_index;
    claim->tp_group  = sl_layout_group_hash(layout);
}

/* "{0,3}", or "{0,3,...}" where `len` cannot hold the whole group. */
static void sl_layout_group_text(const sl_layout_t *layout, char *buf,
                                 size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "{");
    int    k, n;

    for (k = 0; k < layout->tp_size; ++k) {
        n = snprintf(buf + used, len - used, "%s%d", k ? "," : "",
                     layout->tp_ranks[k]);
        if (used + (size_t)n + sizeof(",...}") > len) {
            snprintf(buf + used, len - used, ",...}");
            return;
        }
        used += (size_t)n;
    }
    snprintf(buf + used, len - used, "}");
}

static const char sl_layout_advice[] =
    "give every rank its placement from the same process groups";

sl_status_t sl_layout_agrees(const sl_layout_t *layout, int rank,
                             const sl_layout_claim_t *theirs,
                             sl_errbuf_t *eb)
{
    char group[128];
    int  k;

    if (rank == layout->next_rank && theirs->prev_rank != layout->rank) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "this rank (%d) sends to rank %d as its next stage, "
                        "but rank %d's previous stage is rank %d (-1: none); "
                        "%s", layout->rank, rank, rank, theirs->prev_rank,
                        sl_layout_advice);
    }
    if (rank == layout->prev_rank && theirs->next_rank != layout->rank) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "this rank (%d) receives from rank %d as its "
                        "previous stage, but rank %d's next stage is rank %d "
                        "(-1: none); %s", layout->rank, rank, rank,
                        theirs->next_rank, sl_layout_advice);
    }
    for (k = 0; k < layout->tp_size; ++k) {
        if (layout->tp_ranks[k] != rank) {
            continue;
        }
        if (theirs->tp_size != layout->tp_size || theirs->tp_index != k ||
            theirs->tp_group != sl_layout_group_hash(layout)) {
            sl_layout_group_text(layout, group, sizeof(group));
            return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                            "rank %d is TP index %d of this rank's (%d) TP "
                            "group %s, but it places itself at TP index %d "
                            "of %s group of %d ranks; %s", rank, k,
                            layout->rank, group, theirs->tp_index,
                            theirs->tp_group == sl_layout_group_hash(layout)
                                ? "the same" : "another",
                            theirs->tp_size, sl_layout_advice);
        }
    }
    return STAGELINK_SUCCESS;
}

void sl_layout_cleanup(sl_layout_t *layout)
{
    free(layout->tp_ranks);
    layout->tp_ranks = NULL;
}

void sl_layout_info(const sl_layout_t *layout, stagelink_comm_info_t *info)
{
    memset(info, 0, sizeof(*info));
    info->rank       = layout->rank;
    info->world_size = layout->world_size;
    info->tp_size    = layout->tp_size;
    info->pp_size    = layout->pp_size;
    info->dp_size    = layout->dp_size;
    info->tp_index   = layout->tp_index;
    info->pp_index   = layout->pp_index;
    info->dp_index   = layout->dp_index;
    info->prev_rank  = layout->prev_rank;
    info->next_rank  = layout->next_rank;
}
