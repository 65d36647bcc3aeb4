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
    st->ops[st->nops].local      = st->ops[st->nops].chunk;
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

/* Interleaved: which model chunk virtual microbatch k runs on (Megatron's
 * get_model_chunk_id), and which microbatch it is. */
typedef struct sl_ileave {
    sl_sched_step_t *steps;
    int              n, rank, p, v;
    uint32_t         fwd_recvs[64], bwd_recvs[64]; /* per model chunk */
} sl_ileave_t;

static int sl_il_chunk(const sl_ileave_t *s, int k, int forward)
{
    int n = s->p * s->v;
    int c = ((k % n + n) % n) / s->p; /* k may be negative: Python's modulo */

    return forward ? c : s->v - c - 1;
}

static uint32_t sl_il_mb(const sl_ileave_t *s, int k)
{
    return (uint32_t)((k / (s->p * s->v)) * s->p + k % s->p);
}

/* Virtual stage of model chunk c here: the first and last of the ring. */
static int sl_il_first(const sl_ileave_t *s, int c)
{
    return s->rank == 0 && c == 0;
}

static int sl_il_last(const sl_ileave_t *s, int c)
{
    return s->rank == s->p - 1 && c == s->v - 1;
}

static void sl_il_send(sl_ileave_t *s, int backward, int k)
{
    sl_sched_step_t *st = &s->steps[s->n];
    int              c  = sl_il_chunk(s, k, !backward);
    sl_sched_op_t   *op;

    if (backward ? sl_il_first(s, c) : sl_il_last(s, c)) {
        return; /* the ends of the virtual pipeline send nothing on */
    }
    op             = &st->ops[st->nops++];
    op->send       = 1;
    op->backward   = backward;
    op->microbatch = sl_il_mb(s, k);
    op->local      = (uint16_t)c;
    /* Over the wrap the receiving chunk is one further along. */
    op->chunk      = (uint16_t)(backward ? c - (s->rank == 0)
                                         : c + (s->rank == s->p - 1));
}

static void sl_il_recv(sl_ileave_t *s, int backward, int c)
{
    sl_sched_step_t *st = &s->steps[s->n];
    sl_sched_op_t   *op = &st->ops[st->nops++];

    op->send       = 0;
    op->backward   = backward;
    op->microbatch = backward ? s->bwd_recvs[c]++ : s->fwd_recvs[c]++;
    op->chunk      = (uint16_t)c;
    op->local      = (uint16_t)c;
}

static void sl_il_end_step(sl_ileave_t *s)
{
    if (s->steps[s->n].nops > 0) {
        ++s->n;
    }
    s->steps[s->n].nops = 0;
}

int sl_schedule_interleaved(int rank, int p, int microbatches, int v,
                            sl_sched_step_t *steps)
{
    sl_ileave_t s = {.steps = steps, .rank = rank, .p = p, .v = v};
    int         total = microbatches * v, first = (rank == 0);
    int         last  = (rank == p - 1);
    int         warmup = (p - rank - 1) * 2 + (v - 1) * p, remaining;
    int         all_warmup = 0, k, c, next, fk, bk;

    if (microbatches == p) {
        warmup     = total;
        all_warmup = 1;
    }
    warmup        = (warmup < total) ? warmup : total;
    remaining     = total - warmup;
    steps[0].nops = 0;
    if (!first) { /* recv_forward of the first input (chunk 0) */
        sl_il_recv(&s, 0, 0);
        sl_il_end_step(&s);
    }
    for (k = 0; k < warmup; ++k) {
        int recv_prev = !(first && sl_il_chunk(&s, k + 1, 1) == 0) &&
                        k != total - 1;

        sl_il_send(&s, 0, k);
        if (recv_prev) {
            sl_il_recv(&s, 0, sl_il_chunk(&s, k + 1, 1));
        }
        if (k == warmup - 1 && !all_warmup && !last) {
            sl_il_recv(&s, 1, v - 1); /* send_forward_backward_recv_... */
        }
        sl_il_end_step(&s);
    }
    for (k = 0; k < remaining; ++k) {
        int recv_prev = 1, recv_next = 1;

        fk = k + warmup;
        bk = k;
        sl_il_send(&s, 0, fk);
        sl_il_send(&s, 1, bk);
        if (first) {
            next = sl_il_chunk(&s, fk - (p - 1), 1);
            recv_prev = (next != v - 1);
            ++next;
        } else {
            next = sl_il_chunk(&s, fk + 1, 1);
        }
        if (k == remaining - 1) {
            recv_prev = 0;
        }
        if (recv_prev) {
            sl_il_recv(&s, 0, next);
        }
        if (last) {
            c         = sl_il_chunk(&s, bk - (p - 1), 0);
            recv_next = (c != 0);
            --c;
        } else {
            c = sl_il_chunk(&s, bk + 1, 0);
        }
        if (recv_next) {
            sl_il_recv(&s, 1, c);
        }
        sl_il_end_step(&s);
    }
    if (all_warmup && !last) {
        sl_il_recv(&s, 1, v - 1);
        sl_il_end_step(&s);
    }
    for (k = remaining; k < total; ++k) {
        int recv_next = !(last && sl_il_chunk(&s, k + 1, 0) == v - 1) &&
                        k != total - 1;

        sl_il_send(&s, 1, k);
        if (recv_next) {
            sl_il_recv(&s, 1, sl_il_chunk(&s, k + 1, 0));
        }
        sl_il_end_step(&s);
    }
    return s.n;
}
