/*
 * Cancels of receives whose message is half-way in (t = 2, p = 2, one
 * stage a simulated node, the link slowed by tbf so that a shard in chunks
 * takes a visible time; host memory, the UCX gather).  Rank 2 (stage 1, TP
 * index 0) watches its own shard land in its buffer and cancels once the
 * first chunk is there and the last is not:
 *   round 1: one cancel (its stage receive, and its relays to rank 3);
 *   round 2: two (also the part rank 3 relays to it, itself mid-way);
 *   round 3: the same tag again, nothing canceled.
 * A canceled receive ends canceled, or whole; every send completes (no
 * chunk waits for a later receive); and in every round each receiver holds
 * that round's tensor exactly: a chunk taken back mid-message would be
 * left for the next receive with the tag, which would hold it.
 * Started by stagelink_two_node.sh run.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_FLOATS (1u << 20) /* 4 MiB: 2 MiB shards, cut in 256 KiB chunks */
#define CHUNK_FLOATS ((256u << 10) / sizeof(float))
#define MB       7u
#define ROUNDS   3u

static float value(unsigned round, size_t i)
{
    return (float)(round * 1000003u + i % 999983u) + 0.5f;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static stagelink_status_t post(sl_host_t *h, int send, float *buf,
                               stagelink_request_t **req)
{
    stagelink_xfer_t x = sl_host_xfer(send ? STAGELINK_PEER_NEXT
                                           : STAGELINK_PEER_PREV,
                                      buf, N_FLOATS * sizeof(float),
                                      sizeof(float), MB, 0);

    return send ? h->plugin->isend(h->comm, &x, req)
                : h->plugin->irecv(h->comm, &x, req);
}

static size_t wrong(const float *buf, unsigned round)
{
    size_t i, bad = 0;

    for (i = 0; i < N_FLOATS; ++i) {
        bad += buf[i] != value(round, i);
    }
    return bad;
}

/* Whether chunk 0 of the part at `first` is in `buf` (chunks land in
 * place, in order: the buffer is the marker), and the part's last not. */
static int begun(volatile const float *buf, size_t first, unsigned round,
                 int *ended)
{
    size_t last = first + N_FLOATS / 2 - 1;

    *ended = *ended || buf[last] == value(round, last);
    return buf[first + CHUNK_FLOATS - 1] == value(round, first + CHUNK_FLOATS - 1);
}

/* Rank 2: cancels `times` times once its own shard's first chunk is in,
 * and for a second cancel (which also asks for the part rank 3 relays)
 * that part's first chunk too; says whether both were mid-way. */
static stagelink_status_t cancel_midway(sl_host_t *h, float *buf,
                                        unsigned round, int times,
                                        int *midway)
{
    stagelink_request_t *req;
    stagelink_status_t   st;
    const struct timespec nap = {0, 100000};
    double               deadline = now_s() + 60;
    int                  ended = 0, in;

    st = post(h, 0, buf, &req);
    if (st != STAGELINK_SUCCESS) {
        return st;
    }
    for (;;) {
        in = begun(buf, 0, round, &ended) &&
             (times < 2 || begun(buf, N_FLOATS / 2, round, &ended));
        if (in || now_s() > deadline) {
            break;
        }
        nanosleep(&nap, NULL);
    }
    *midway = in && !ended;
    while (times-- > 0) {
        CHECK(h->plugin->cancel(h->comm, req) == STAGELINK_SUCCESS,
              "cancel: %s", h->plugin->last_error(h->comm));
    }
    return h->plugin->wait(h->comm, req);
}

int main(void)
{
    static float         buf[N_FLOATS];
    sl_host_t            h;
    stagelink_request_t *req;
    stagelink_status_t   st;
    unsigned             round;
    size_t               i;
    int                  rank, send, midway = 0;

    if (sl_host_open(&h, 2, 2, STAGELINK_MODE_SCATTER_GATHER) != 0) {
        return 1;
    }
    if (h.info.world_size != 4 || strcmp(h.info.gather_backend, "ucx") != 0) {
        fprintf(stderr, "needs 4 ranks and the UCX gather (got %d, %s)\n",
                h.info.world_size, h.info.gather_backend);
        return 1;
    }
    rank = h.info.rank;
    send = h.info.pp_index == 0;
    for (round = 1; round <= ROUNDS; ++round) {
        if (send) {
            for (i = 0; i < N_FLOATS; ++i) {
                buf[i] = value(round, i);
            }
            st = post(&h, 1, buf, &req);
            if (st == STAGELINK_SUCCESS) {
                st = h.plugin->wait(h.comm, req);
            }
            CHECK(st == STAGELINK_SUCCESS, "rank %d round %u send: %s", rank,
                  round, h.plugin->last_error(h.comm));
            continue;
        }
        memset(buf, 0, sizeof(buf));
        if (round < ROUNDS && h.info.tp_index == 0) {
            st = cancel_midway(&h, buf, round, (int)round, &midway);
            printf("# round %u: rank %d canceled %s: %s\n", round, rank,
                   midway ? "mid-way (first chunk in, last not)"
                          : "after its shard was in",
                   stagelink_status_string(st));
        } else {
            st = post(&h, 0, buf, &req);
            if (st == STAGELINK_SUCCESS) {
                st = h.plugin->wait(h.comm, req);
            }
        }
        if (round < ROUNDS) {
            /* Rank 3 fails with rank 2's cancel, or completed before it. */
            CHECK(st == STAGELINK_ERR_CANCELED ||
                      (st == STAGELINK_SUCCESS && wrong(buf, round) == 0),
                  "rank %d round %u: %s, %zu of %u values wrong (%s)", rank,
                  round, stagelink_status_string(st), wrong(buf, round),
                  N_FLOATS, h.plugin->last_error(h.comm));
        } else {
            CHECK(st == STAGELINK_SUCCESS && wrong(buf, round) == 0,
                  "rank %d round %u: %s, %zu of %u values wrong (%s)", rank,
                  round, stagelink_status_string(st), wrong(buf, round),
                  N_FLOATS, h.plugin->last_error(h.comm));
        }
    }
    sl_host_close(&h);
    return check_summary();
}
