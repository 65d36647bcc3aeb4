/*
 * Where a rank sits in the 3-D grid: TP index, data-parallel index and
 * pipeline stage, its neighbour stages and its TP group.  Default is
 * Megatron-LM's order (TP fastest, then data parallel, then pipeline);
 * a host may give placement explicitly.  SPDX-License-Identifier: MIT
 */
#ifndef SL_LAYOUT_H
#define SL_LAYOUT_H

#include "sl_error.h"

#include <stdint.h>

typedef struct sl_layout {
    int  rank, world_size;
    int  tp_size, pp_size, dp_size;
    int  tp_index, pp_index, dp_index;
    int  prev_rank, next_rank; /**< -1 where none */
    int *tp_ranks;             /**< tp_size world ranks, by TP index */
} sl_layout_t;

/** Megatron order for (rank, world_size, t, p); p = 0 means world / t. */
sl_status_t sl_layout_from_order(int rank, int world_size, int tp_size,
                                 int pp_size, sl_layout_t *layout,
                                 sl_errbuf_t *eb);

/** Placement given by the host; pp/dp indices are not known then (-1). */
sl_status_t sl_layout_from_topology(int rank, int world_size, int tp_size,
                                    int pp_size,
                                    const stagelink_topology_t *topo,
                                    sl_layout_t *layout, sl_errbuf_t *eb);

/**
 * The ranks this one exchanges with, each once and ascending: its TP group
 * but itself, and its neighbour stages.  `peers` holds tp_size + 1; returns
 * how many it filled.
 */
int sl_layout_peers(const sl_layout_t *layout, int *peers);

/** What a rank says of its placement to the ranks it talks to, so that
 *  placements given rank by rank are found to disagree at init, not as a
 *  hang or a shard from the wrong rank later. */
typedef struct sl_layout_claim {
    int32_t  prev_rank, next_rank;
    int32_t  tp_size, tp_index;
    uint64_t tp_group; /**< hash of tp_ranks, by index */
} sl_layout_claim_t;

void sl_layout_claim(const sl_layout_t *layout, sl_layout_claim_t *claim);

/** Whether peer `rank`'s claim agrees with this rank's placement: it names
 *  this rank as its neighbour stage where this one names it, and the same
 *  TP group where it is in this one's. */
sl_status_t sl_layout_agrees(const sl_layout_t *layout, int rank,
                             const sl_layout_claim_t *theirs,
                             sl_errbuf_t *eb);

void sl_layout_cleanup(sl_layout_t *layout);

/** The placement part of stagelink_comm_info_t (the plugin adds the rest). */
void sl_layout_info(const sl_layout_t *layout, stagelink_comm_info_t *info);

#endif
