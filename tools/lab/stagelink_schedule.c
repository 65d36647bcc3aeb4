/*
 * stagelink_schedule: the pipeline schedules of tools/common/schedule.c
 * (the ones stagelink_pipeline and stagelink_perftest run), printed for
 * every pipeline rank, so that other tools (tools/lab/stagelink_model) execute
 * the very same steps rather than a copy of them.
 *
 *   stagelink_schedule -p STAGES -m MICROBATCHES [-v CHUNKS]
 *
 * One line per operation: rank, step, send|recv, fwd|bwd, microbatch, tag
 * chunk (the receiving model chunk), local model chunk, and the virtual
 * stage of that local chunk (chunk * p + rank).  v > 1 is the interleaved
 * schedule (ring: rank p-1's chunk c feeds rank 0's chunk c+1; needs m a
 * multiple of p).  SPDX-License-Identifier: MIT
 */
#include "schedule.h"

#include "tool_opts.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

static void usage(FILE *to)
{
    fprintf(to, "usage: stagelink_schedule -p STAGES -m MICROBATCHES [-v CHUNKS]\n"
                    "  prints every rank's steps of the 1F1B (v = 1) or interleaved\n"
                    "  1F1B (v > 1) schedule, one operation a line\n");
}

int main(int argc, char **argv)
{
    sl_sched_step_t *steps;
    int              p = 0, m = 0, v = 1, opt, r, s, k, n;

    while ((opt = getopt_long(argc, argv, "p:m:v:h", sl_tool_longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'p': p = atoi(optarg); break;
        case 'm': m = atoi(optarg); break;
        case 'v': v = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        case 'V': return sl_tool_version("stagelink_schedule");
        default: usage(stderr); return 2;
        }
    }
    if (p < 2 || m < 1 || v < 1 || m > 100000 || v > 64 ||
        (v > 1 && m % p != 0)) {
        fprintf(stderr, "stagelink_schedule: need p >= 2, m >= 1, v >= 1 (m a "
                "multiple of p when v > 1); got p=%d m=%d v=%d\n", p, m, v);
        usage(stderr);
        return 2;
    }
    steps = calloc((size_t)SL_SCHED_MAX_STEPS(m, v) * 2, sizeof(*steps));
    if (steps == NULL) {
        fprintf(stderr, "stagelink_schedule: out of memory\n");
        return 1;
    }
    printf("# %s schedule p=%d m=%d v=%d\n"
           "# rank step op dir microbatch chunk local virtual_stage\n",
           v > 1 ? "interleaved" : "1F1B", p, m, v);
    for (r = 0; r < p; ++r) {
        n = (v > 1) ? sl_schedule_interleaved(r, p, m, v, steps)
                    : sl_schedule_1f1b(r, p, m, 1, steps);
        for (s = 0; s < n; ++s) {
            for (k = 0; k < steps[s].nops; ++k) {
                const sl_sched_op_t *op = &steps[s].ops[k];

                printf("%d %d %s %s %u %u %u %d\n", r, s, op->send ? "send" : "recv",
                       op->backward ? "bwd" : "fwd", op->microbatch, op->chunk,
                       op->local, op->local * p + r);
            }
        }
    }
    free(steps);
    return 0;
}
