/*
 * Megatron-LM's 1F1B pipeline schedule as the boundary operations of one
 * stage: a list of steps, each the sends and receives posted together (as
 * send_forward_recv_backward).  With v > 1 each microbatch crosses every
 * boundary v times (virtual chunks of the interleaved schedule, tagged
 * 0..v-1), without the last-to-first wrap.  SPDX-License-Identifier: MIT
 */
#ifndef SL_TOOLS_SCHEDULE_H
#define SL_TOOLS_SCHEDULE_H

#include <stdint.h>

typedef struct sl_sched_op {
    int      send;       /**< 1 send, 0 receive */
    int      backward;   /**< 0 activations forward, 1 gradients back */
    uint32_t microbatch;
    uint16_t chunk;      /**< the tag's chunk: the receiving model chunk */
    uint16_t local;      /**< this rank's model chunk the tensor belongs to */
} sl_sched_op_t;

typedef struct sl_sched_step {
    sl_sched_op_t ops[4]; /**< the interleaved steady state sends and receives both ways */
    int           nops;
} sl_sched_step_t;

/** Steps needed at most for m microbatches of v chunks. */
#define SL_SCHED_MAX_STEPS(_m, _v) (4 * (_m) * (_v) + 4)

/** Fills `steps` for `stage` of `nstages`; returns how many. */
int sl_schedule_1f1b(int stage, int nstages, int microbatches, int chunks,
                     sl_sched_step_t *steps);

/**
 * Megatron-LM's interleaved 1F1B schedule for pipeline rank `rank` of `p`,
 * each rank holding `v` model chunks: p * v virtual stages in a ring, the
 * last rank's chunk c feeding the first rank's chunk c + 1 (so every rank
 * has both neighbours; the host wires rank p - 1 to rank 0).  Steps follow
 * forward_backward_pipelining_with_interleaving: warm-up, steady 1F1B,
 * cool-down, each p2p call one step.  Needs microbatches % p == 0.
 * A tag's chunk is the receiving model chunk; receives of one model chunk
 * arrive in microbatch order.
 */
int sl_schedule_interleaved(int rank, int p, int microbatches, int v,
                            sl_sched_step_t *steps);

#endif
