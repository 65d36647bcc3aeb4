/*
 * Cancels of receives whose message is half-way in (t = 2, p = 2, one
 * stage a simulated node, the link slowed by tbf so that a shard in chunks
 * takes a visible time; host memory, the UCX gather).  Rank 2 (stage 1, TP
 * index 0) watches its buffer fill and cancels once the first chunk of its
 * own shard is there:
 *   round 1: one cancel (its stage receive, and its relays to rank 3);
 *   round 2: two, once the part rank 3 relays has begun to land too (the
 *            second cancel reaches that part);
 *   round 3: the same, with rank 1 (whose shard rank 3 relays) stopped
 *            (SIGSTOP) before the cancels: rank 2's wait must end without
 *            it, and rank 1 goes on (SIGCONT) only after;
 *   round 4: the same tag again, nothing canceled.
 * A canceled receive ends canceled, or whole; every send completes (no
 * chunk waits for a later receive); and in every round each receiver holds
 * that round's tensor exactly: a chunk of a canceled message left on the
 * wire would be matched by the next receive with the tag.
 * Started by stagelink_two_node.sh run.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define N_FLOATS (1u << 20) /* 4 MiB: 2 MiB shards, cut in 256 KiB chunks */
#define CHUNK_FLOATS ((256u << 10) / sizeof(float))
#define MB       7u
#define ROUNDS   4u
#define STOPPED  3u /* the round rank 1 is stopped in */

static char dir[256];

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
    return sl_host_post(h, send, buf, N_FLOATS * sizeof(float),
                        sizeof(float), MB, req);
}

static size_t wrong(const float *buf, unsigned round)
{
    size_t i, bad = 0;

    for (i = 0; i < N_FLOATS; ++i) {
        bad += buf[i] != value(round, i);
    }
    return bad;
}

/* Rank 1 tells rank 2 its pid through a file (written whole, then renamed). */
static void tell_pid(void)
{
    char  path[320], tmp[330];
    FILE *f;

    snprintf(path, sizeof(path), "%s/pid1", dir);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if ((f = fopen(tmp, "w")) != NULL) {
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
        rename(tmp, path);
    }
}

/* Reads a line of `path` into buf, or "" (at most 60 s of 1 ms naps
 * until it exists). */
static void read_line(const char *path, char *buf, size_t len)
{
    const struct timespec nap = {0, 1000000};
    double                deadline = now_s() + 60;
    FILE                 *f = NULL;

    buf[0] = '\0';
    while ((f = fopen(path, "r")) == NULL && now_s() < deadline) {
        nanosleep(&nap, NULL);
    }
    if (f != NULL) {
        if (fgets(buf, (int)len, f) == NULL) {
            buf[0] = '\0';
        }
        fclose(f);
    }
}

/* Stops rank 1 and returns its pid once the kernel says it is stopped
 * (state T), or -1. */
static pid_t stop_rank1(void)
{
    const struct timespec nap = {0, 1000000};
    double                deadline = now_s() + 60;
    char                  path[320], line[512], *state;
    pid_t                 pid;

    snprintf(path, sizeof(path), "%s/pid1", dir);
    read_line(path, line, sizeof(line));
    pid = (pid_t)atol(line);
    if (pid <= 0 || kill(pid, SIGSTOP) != 0) {
        return -1;
    }
    snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
    do {
        read_line(path, line, sizeof(line));
        state = strrchr(line, ')'); /* "pid (comm) S ..." */
        if (state != NULL && state[1] == ' ' && state[2] == 'T') {
            return pid;
        }
        nanosleep(&nap, NULL);
    } while (now_s() < deadline);
    kill(pid, SIGCONT);
    return -1;
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
 * that part's first chunk too, having stopped rank 1 first in round
 * STOPPED; says whether both were mid-way. */
static stagelink_status_t cancel_midway(sl_host_t *h, float *buf,
                                        unsigned round, int times,
                                        int *midway)
{
    pid_t stopped = -1;
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
    CHECK(in, "round %u: nothing of the message in rank 2's buffer in 60 s",
          round);
    if (round == STOPPED) {
        stopped = stop_rank1();
        CHECK(stopped > 0, "rank 1 could not be stopped");
    }
    begun(buf, 0, round, &ended);
    begun(buf, N_FLOATS / 2, round, &ended);
    *midway = in && !ended;
    while (times-- > 0) {
        CHECK(h->plugin->cancel(h->comm, req) == STAGELINK_SUCCESS,
              "cancel: %s", h->plugin->last_error(h->comm));
    }
    st = h->plugin->wait(h->comm, req);
    if (stopped > 0) {
        kill(stopped, SIGCONT);
    }
    return st;
}

int main(void)
{
    static float         buf[N_FLOATS];
    sl_host_t            h;
    stagelink_status_t   st;
    unsigned             round;
    size_t               i;
    int                  rank, send, midway = 0;
    const char          *port = getenv("MASTER_PORT");

    /* The job's (every node's ranks share its port): no earlier job's pid. */
    snprintf(dir, sizeof(dir), "/tmp/stagelink-cancel-midway-%s",
             port ? port : "0");
    if ((mkdir(dir, 0700) != 0 && errno != EEXIST) ||
        sl_host_open(&h, 2, 2, STAGELINK_MODE_SCATTER_GATHER) != 0) {
        return 1;
    }
    if (h.info.world_size != 4 || strcmp(h.info.gather_backend, "ucx") != 0) {
        fprintf(stderr, "needs 4 ranks and the UCX gather (got %d, %s)\n",
                h.info.world_size, h.info.gather_backend);
        return 1;
    }
    rank = h.info.rank;
    send = h.info.pp_index == 0;
    if (rank == 1) {
        tell_pid();
    }
    for (round = 1; round <= ROUNDS; ++round) {
        if (send) {
            for (i = 0; i < N_FLOATS; ++i) {
                buf[i] = value(round, i);
            }
            st = sl_host_transfer(&h, 1, buf, sizeof(buf), sizeof(float), MB);
            CHECK(st == STAGELINK_SUCCESS, "rank %d round %u send: %s", rank,
                  round, h.plugin->last_error(h.comm));
            continue;
        }
        memset(buf, 0, sizeof(buf));
        if (round < ROUNDS && h.info.tp_index == 0) {
            st = cancel_midway(&h, buf, round, (round == 1) ? 1 : 2,
                               &midway);
            printf("# round %u: rank %d canceled %s%s: %s\n", round, rank,
                   midway ? "mid-way (first chunk in, last not)"
                          : "after its parts were in",
                   (round == STOPPED) ? ", rank 1 stopped" : "",
                   stagelink_status_string(st));
        } else {
            st = sl_host_transfer(&h, 0, buf, sizeof(buf), sizeof(float), MB);
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
    if (rank == 1) {
        char path[320];

        snprintf(path, sizeof(path), "%s/pid1", dir);
        unlink(path);
        rmdir(dir);
    }
    return check_summary();
}
