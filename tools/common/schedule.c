/* SPDX-License-Identifier: MIT */
#include "schedule.h"

typedef struct sl_sched {
    sl_sched_step_t *steps;
    int              n, stage, nstages, chunks;
} sl_sched_t;

/* Adds an operation to the current step when this stage has that peer. */
static void sl_sched_op(sl_sched_t *s, int send, int backward, int unit)
{
    int to_next = send ? !backward : backward;
    sl_sched_step_t *st = &s->steps[s->n];

    if ((to_next && s->stage == s->nstages - 1) || (!to_next && s->stage == 0)) {
        return;
    }
    st->ops[st->nops].send       = send;
    st->ops[st->nops].backward   = backward;
    st->ops[st->nops].microbatch = (uint32_t)(unit / s->chunks);
    st->ops[st->nops].chunk      = (uint16_t)(unit % s->chunks);
    ++st->nops;
}

static void sl_sched_end_step(sl_sched_t *s)
{
    if (s->steps[s->n].nops > 0) {
        ++s->n;
    }
    s->steps[s->n].nops = 0;
}

int sl_schedule_1f1b(int stage, int nstages, int microbatches, int chunks,
                     sl_sched_step_t *steps)
{
    sl_sched_t s = {steps, 0, stage, nstages, chunks};
    int        units = microbatches * chunks;
    int        warmup = nstages - stage - 1;
    int        remaining, f = 0, b = 0, i;

    warmup    = (warmup < units) ? warmup : units;
    remaining = units - warmup;
    steps[0].nops = 0;
    for (i = 0; i < warmup; ++i, ++f) {
        sl_sched_op(&s, 0, 0, f);              /* recv_forward */
        sl_sched_end_step(&s);
        sl_sched_op(&s, 1, 0, f);              /* send_forward */
        sl_sched_end_step(&s);
    }
    if (remaining > 0) {
        sl_sched_op(&s, 0, 0, f);              /* recv_forward */
        sl_sched_end_step(&s);
    }
    for (i = 0; i < remaining; ++i, ++b) {
        sl_sched_op(&s, 1, 0, f);              /* send_forward_recv_backward */
        sl_sched_op(&s, 0, 1, b);
        sl_sched_end_step(&s);
        ++f;
        sl_sched_op(&s, 1, 1, b);              /* send_backward (_recv_forward) */
        if (i < remaining - 1) {
            sl_sched_op(&s, 0, 0, f);
        }
        sl_sched_end_step(&s);
    }
    for (i = 0; i < warmup; ++i, ++b) {
        sl_sched_op(&s, 0, 1, b);              /* recv_backward */
        sl_sched_end_step(&s);
        sl_sched_op(&s, 1, 1, b);              /* send_backward */
        sl_sched_end_step(&s);
    }
    return s.n;
}
