/*
 * The pipeline schedules, checked without a network: for every rank of p
 * stages, each send meets exactly one receive with the same direction, tag
 * and neighbour, and executing the steps (a step completes once every
 * operation of it has met its partner, posted in a step the partner has
 * reached) finishes on every rank: no deadlock.  1F1B (v = 1) and
 * Megatron's interleaved schedule (v = 2, 3, with the ring's wrap).
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "schedule.h"

#include <stdlib.h>
#include <string.h>

#define MAXP 8

typedef struct rank_sched {
    sl_sched_step_t *steps;
    int              n, at; /* steps, the step being executed */
} rank_sched_t;

/* The rank an operation talks to: forward sends and backward receives go
 * to the next rank (a ring when interleaved). */
static int peer_of(int r, int p, const sl_sched_op_t *op)
{
    int to_next = op->send ? !op->backward : op->backward;

    return (r + (to_next ? 1 : p - 1)) % p;
}

/* Step index of rank q holding the partner of `op` (posted by rank r). */
static int partner_step(const rank_sched_t *rs, int r, int p,
                        const sl_sched_op_t *op, int *count)
{
    int q = peer_of(r, p, op), s, i, found = -1;

    *count = 0;
    for (s = 0; s < rs[q].n; ++s) {
        for (i = 0; i < rs[q].steps[s].nops; ++i) {
            const sl_sched_op_t *o = &rs[q].steps[s].ops[i];

            if (o->send != op->send && o->backward == op->backward &&
                o->microbatch == op->microbatch && o->chunk == op->chunk &&
                peer_of(q, p, o) == r) {
                ++*count;
                found = s;
            }
        }
    }
    return found;
}

static void check(int p, int m, int v)
{
    rank_sched_t rs[MAXP];
    int          r, s, i, progress, done, sends = 0, count;

    for (r = 0; r < p; ++r) {
        rs[r].steps = calloc(SL_SCHED_MAX_STEPS(m, v) * 2, sizeof(sl_sched_step_t));
        rs[r].n     = (v == 1) ? sl_schedule_1f1b(r, p, m, 1, rs[r].steps)
                               : sl_schedule_interleaved(r, p, m, v, rs[r].steps);
        rs[r].at    = 0;
    }
    for (r = 0; r < p; ++r) {
        for (s = 0; s < rs[r].n; ++s) {
            for (i = 0; i < rs[r].steps[s].nops; ++i) {
                const sl_sched_op_t *op = &rs[r].steps[s].ops[i];

                partner_step(rs, r, p, op, &count);
                CHECK(count == 1, "p=%d m=%d v=%d: rank %d step %d %s %s mb %u "
                      "chunk %u has %d partners", p, m, v, r, s,
                      op->send ? "send" : "recv", op->backward ? "bwd" : "fwd",
                      op->microbatch, op->chunk, count);
                sends += op->send;
            }
        }
    }
    /* Each microbatch crosses p*v - 1 virtual boundaries, both ways. */
    CHECK(sends == 2 * m * (p * v - 1),
          "p=%d m=%d v=%d: %d sends, want %d", p, m, v, sends,
          2 * m * (p * v - 1));
    do {
        progress = 0;
        done     = 1;
        for (r = 0; r < p; ++r) {
            int ok = 1;

            if (rs[r].at == rs[r].n) {
                continue;
            }
            done = 0;
            for (i = 0; i < rs[r].steps[rs[r].at].nops; ++i) {
                const sl_sched_op_t *op = &rs[r].steps[rs[r].at].ops[i];
                int q = peer_of(r, p, op), ps = partner_step(rs, r, p, op, &count);

                /* The partner must have posted it: reached that step. */
                ok &= (ps >= 0 && rs[q].at >= ps);
            }
            if (ok) {
                ++rs[r].at;
                progress = 1;
            }
        }
    } while (progress && !done);
    for (r = 0; r < p; ++r) {
        CHECK(rs[r].at == rs[r].n, "p=%d m=%d v=%d: rank %d stuck at step "
              "%d of %d", p, m, v, r, rs[r].at, rs[r].n);
        free(rs[r].steps);
    }
}

int main(void)
{
    int p, m, v;

    for (p = 2; p <= 4; ++p) {
        for (v = 1; v <= 3; ++v) {
            for (m = p; m <= 4 * p; m += p) {
                check(p, m, v);
            }
        }
    }
    return check_summary();
}
