/*
 * Cancels of gathered receives (t = 2, p = 2, host memory, the UCX
 * gather): the TP peer's shard, sent for that receive, must go to it and
 * not to the next receive with the same tag.
 *   round 0: rank 0 does not send (until round 1, once rank 2's receive
 *            ended: a marker file); rank 2 (stage 1, TP index 0) cancels
 *            at once; rank 3 gets rank 1's shard, relays it to rank 2,
 *            and fails with rank 2's cancel.
 *   round 1: rank 0 sends its shard of X1; rank 2
 *            sees it land, cancels, and only then (a marker file) rank 1
 *            sends its shard, which rank 3 relays to rank 2.  Rank 2's
 *            receive ends canceled or whole; rank 3's whole.
 *   round 2: the same tag again with X2, every shard sent at once: both
 *            receivers hold X2 exactly (a canceled peer receive left
 *            rank 3's X1 shard to this one: half of it X1).
 * Started by stagelink_run -n 4.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define N_FLOATS (16u << 10) /* 64 KiB: each rank's shard goes whole */
#define MB       5u

static char dir[256];

static float value(unsigned round, size_t i)
{
    return (float)(round * 1000003u + i);
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mark(const char *what)
{
    char  path[320];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, what);
    if ((f = fopen(path, "w")) != NULL) {
        fclose(f);
    }
}

/* Blocks (1 ms naps) until marker `what` exists, at most 60 s. */
static int await(const char *what)
{
    struct timespec nap = {0, 1000000};
    char            path[320];
    double          deadline = now_s() + 60;

    snprintf(path, sizeof(path), "%s/%s", dir, what);
    while (access(path, F_OK) != 0) {
        if (now_s() > deadline) {
            fprintf(stderr, "no marker %s after 60 s\n", path);
            return -1;
        }
        nanosleep(&nap, NULL);
    }
    return 0;
}

static stagelink_status_t post(sl_host_t *h, int send, float *buf,
                               stagelink_request_t **req)
{
    return sl_host_post(h, send, buf, N_FLOATS * sizeof(float),
                        sizeof(float), MB, req);
}

static void fill(float *buf, unsigned round)
{
    size_t i;

    for (i = 0; i < N_FLOATS; ++i) {
        buf[i] = value(round, i);
    }
}

static size_t wrong(const float *buf, unsigned round)
{
    size_t i, bad = 0;

    for (i = 0; i < N_FLOATS; ++i) {
        bad += buf[i] != value(round, i);
    }
    return bad;
}

/* Rank 2: its own shard lands, then it cancels. */
static stagelink_status_t cancel_after_own(sl_host_t *h, float *buf)
{
    stagelink_request_t *req;
    stagelink_counters_t c;
    stagelink_status_t   st;
    double               deadline = now_s() + 60;

    st = post(h, 0, buf, &req);
    if (st != STAGELINK_SUCCESS) {
        return st;
    }
    do {
        st = h->plugin->wait_for(h->comm, req, 10);
        h->plugin->get_counters(h->comm, &c);
    } while (st == STAGELINK_IN_PROGRESS && c.stage_bytes_recv == 0 &&
             now_s() < deadline);
    CHECK(st == STAGELINK_IN_PROGRESS && c.stage_bytes_recv > 0,
          "rank 2's own shard did not land alone: %s, %llu bytes",
          stagelink_status_string(st),
          (unsigned long long)c.stage_bytes_recv);
    CHECK(h->plugin->cancel(h->comm, req) == STAGELINK_SUCCESS, "cancel: %s",
          h->plugin->last_error(h->comm));
    mark("canceled");
    return h->plugin->wait(h->comm, req);
}

int main(void)
{
    const char          *port = getenv("MASTER_PORT");
    static float         buf[N_FLOATS];
    sl_host_t            h;
    stagelink_request_t *req;
    stagelink_status_t   st;
    unsigned             round;
    int                  rank, send;

    /* The job's: its port and its launcher, so no earlier job's marker. */
    snprintf(dir, sizeof(dir), "/tmp/stagelink-cancel-%s-%d",
             port ? port : "0", (int)getppid());
    if ((mkdir(dir, 0700) != 0 && errno != EEXIST) ||
        sl_host_open(&h, 2, 2, STAGELINK_MODE_SCATTER_GATHER) != 0) {
        return 1;
    }
    if (h.info.world_size != 4 ||
        strcmp(h.info.gather_backend, "ucx") != 0) {
        fprintf(stderr, "needs 4 ranks and the UCX gather (got %d, %s)\n",
                h.info.world_size, h.info.gather_backend);
        return 1;
    }
    rank = h.info.rank;
    send = h.info.pp_index == 0;
    for (round = 0; round <= 2; ++round) {
        if (send) {
            if (round == 0 && rank == 0) {
                continue; /* the sender rank 2 cancels for */
            }
            /* Its next message with the tag goes after that cancel. */
            if (round == 1 && rank == 0 && await("round0") != 0) {
                return 1;
            }
            fill(buf, round);
            if (round == 1 && rank == 1 && await("canceled") != 0) {
                return 1;
            }
            st = sl_host_transfer(&h, 1, buf, sizeof(buf), sizeof(float), MB);
            CHECK(st == STAGELINK_SUCCESS, "rank %d round %u send: %s", rank,
                  round, h.plugin->last_error(h.comm));
            continue;
        }
        memset(buf, 0, sizeof(buf));
        if (round == 0) {
            st = post(&h, 0, buf, &req);
            if (st == STAGELINK_SUCCESS && rank == 2) {
                st = h.plugin->cancel(h.comm, req);
            }
            if (st == STAGELINK_SUCCESS) {
                st = h.plugin->wait(h.comm, req);
            }
            CHECK(st == STAGELINK_ERR_CANCELED, "rank %d round 0: %s, not "
                  "canceled (%s)", rank, stagelink_status_string(st),
                  h.plugin->last_error(h.comm));
            if (rank == 2) {
                mark("round0");
            }
            continue;
        }
        if (round == 1 && rank == 2) {
            st = cancel_after_own(&h, buf);
            CHECK(st == STAGELINK_ERR_CANCELED ||
                      (st == STAGELINK_SUCCESS && wrong(buf, 1) == 0),
                  "the canceled receive: %s, %zu values wrong",
                  stagelink_status_string(st), wrong(buf, 1));
            continue;
        }
        st = sl_host_transfer(&h, 0, buf, sizeof(buf), sizeof(float), MB);
        CHECK(st == STAGELINK_SUCCESS && wrong(buf, round) == 0,
              "rank %d round %u receive: %s, %zu of %u values wrong (%s)",
              rank, round, stagelink_status_string(st), wrong(buf, round),
              N_FLOATS, st == STAGELINK_SUCCESS ? "-"
                                                : h.plugin->last_error(h.comm));
    }
    sl_host_close(&h);
    if (rank == 0) {
        char path[320];

        snprintf(path, sizeof(path), "%s/canceled", dir);
        unlink(path);
        snprintf(path, sizeof(path), "%s/round0", dir);
        unlink(path);
        rmdir(dir);
    }
    return check_summary();
}
