/*
 * A rank that has finished must not stall its peers.  Every rank posts
 * all its receives in a random order, meets the others in a host barrier,
 * posts all its sends in another random order, completes them in a third
 * (by wait, by polling test, or both), and then blocks outside stagelink
 * in a host collective until every rank has completed.  A peer whose
 * completion needs this rank's progress (a rendezvous acknowledgement, a
 * relay, a gather send) completes only if something progresses the
 * worker while the host is away: without that the job hangs here, and
 * the bounded barrier names the ranks that never completed.
 *
 *   idle_peers -t TP [-p PP] [-n PER_DIRECTION] [-S MAX_BYTES]
 *              [-c wait|test|mixed] [-x SEED] [-r ROUNDS] [-B SECONDS]
 *
 * Each round draws its sizes and orders from SEED + round.
 *
 * The host collective is MPI_Allreduce when built with MPI (launched by
 * mpirun), else a barrier over marker files (launched by stagelink_run):
 * each rank writes "done" after its last completion and "resumed" when it
 * leaves the collective; rank 0 checks that every "done" came before the
 * first "resumed".  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"
#include "pattern.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef IDLE_WITH_MPI
#include <mpi.h>
#endif

#define SENTINEL 0xee

typedef struct slot {
    unsigned char       *buf;
    size_t               nbytes;
    int                  recv, backward, src_stage;
    uint32_t             mb;
    stagelink_request_t *req;
} slot_t;

typedef struct idle {
    sl_host_t host;
    int       tp, pp, per_dir;
    size_t    max_bytes;
    uint64_t  seed;
    char      complete[8];
    double    barrier_s;
    int       round, rounds;
    char      dir[256];
} idle_t;

static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Log-uniform in [1, max]: both ends draw the same size for a tag. */
static size_t draw_size(const idle_t *c, int backward, uint32_t mb)
{
    uint64_t r   = mix(c->seed ^ ((uint64_t)mb << 1) ^ (uint64_t)backward);
    double   u   = (double)(r >> 11) / (double)(1ull << 53);
    double   lim = (double)c->max_bytes;
    size_t   n   = (size_t)exp(u * log(lim));

    return (n < 1) ? 1 : (n > c->max_bytes ? c->max_bytes : n);
}

static void shuffle(slot_t **v, int n, uint64_t *state)
{
    int i;

    for (i = n - 1; i > 0; --i) {
        int     j = (int)((*state = mix(*state)) % (uint64_t)(i + 1));
        slot_t *t = v[i];

        v[i] = v[j];
        v[j] = t;
    }
}

/* The host collective after the last completion (and the barrier before
 * the sends): stagelink is not called while a rank is in here. */
#ifdef IDLE_WITH_MPI
static int host_collective(idle_t *c, const char *what)
{
    int one = 1, sum = 0;

    (void)what;
    MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return sum == c->host.info.world_size ? 0 : -1;
}
#else
static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void marker(const idle_t *c, const char *what)
{
    char path[320];
    int  fd;

    snprintf(path, sizeof(path), "%s/%s.%d.%d", c->dir, what, c->round,
             c->host.info.rank);
    fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0600);
    if (fd >= 0) {
        close(fd);
    }
}

/* Blocks (1 ms naps, no spinning) until every rank wrote marker `what`,
 * for at most barrier_s; names the ranks missing then. */
static int host_collective(idle_t *c, const char *what)
{
    double deadline = now_s() + c->barrier_s;
    int    world = c->host.info.world_size, r, missing;
    char   path[320], who[256];

    marker(c, what);
    for (;;) {
        size_t used = 0;

        missing = 0;
        who[0]  = '\0';
        for (r = 0; r < world; ++r) {
            snprintf(path, sizeof(path), "%s/%s.%d.%d", c->dir, what,
                     c->round, r);
            if (access(path, F_OK) != 0) {
                ++missing;
                if (used + 8 < sizeof(who)) {
                    used += (size_t)snprintf(who + used, sizeof(who) - used,
                                             " %d", r);
                }
            }
        }
        if (missing == 0) {
            return 0;
        }
        if (now_s() > deadline) {
            fprintf(stderr, "rank %d: after %.0f s in the host collective "
                    "\"%s\" of round %d (seed %llu), ranks%s have still not "
                    "reached it: their requests need a peer that is not "
                    "calling stagelink\n", c->host.info.rank, c->barrier_s,
                    what, c->round, (unsigned long long)c->seed, who);
            return -1;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}
#endif

static void slot_verify(idle_t *c, const slot_t *s)
{
    uint64_t seed = sl_pattern_seed(s->src_stage, s->mb, 0, s->backward);
    size_t   bad  = sl_pattern_check(s->buf, 0, s->nbytes, seed);

    CHECK(bad == SIZE_MAX, "rank %d: %s mb %u (%zu bytes): byte %zu is "
          "0x%02x, expected the pattern of stage %d", c->host.info.rank,
          s->backward ? "backward" : "forward", s->mb, s->nbytes, bad,
          (bad != SIZE_MAX) ? s->buf[bad] : 0, s->src_stage);
}

static void slot_post(idle_t *c, slot_t *s)
{
    int              to_next = s->recv ? s->backward : !s->backward;
    stagelink_xfer_t x = sl_host_xfer(to_next ? STAGELINK_PEER_NEXT
                                              : STAGELINK_PEER_PREV,
                                      s->buf, s->nbytes, 1, s->mb, 0);
    stagelink_status_t st;

    st = s->recv ? c->host.plugin->irecv(c->host.comm, &x, &s->req)
                 : c->host.plugin->isend(c->host.comm, &x, &s->req);
    if (sl_host_report(&c->host, st, s->recv ? "irecv" : "isend")) {
        s->req = NULL;
    }
    CHECK(s->req != NULL, "rank %d: %s of mb %u refused (above)",
          c->host.info.rank, s->recv ? "irecv" : "isend", s->mb);
}

/* By wait, or by test with 100 us naps in between (a host polling its
 * requests between other work). */
static void slot_complete(idle_t *c, slot_t *s, int by_test)
{
    stagelink_status_t st;
    int                done = 0, failed;

    if (s->req == NULL) {
        return;
    }
    if (by_test) {
        struct timespec ts = {0, 100000};

        while ((st = c->host.plugin->test(c->host.comm, s->req, &done)) ==
                   STAGELINK_SUCCESS && !done) {
            nanosleep(&ts, NULL);
        }
    } else {
        st = c->host.plugin->wait(c->host.comm, s->req);
    }
    s->req = NULL;
    failed = sl_host_report(&c->host, st, by_test ? "test" : "wait");
    CHECK(!failed, "rank %d: %s of mb %u failed (above)", c->host.info.rank,
          by_test ? "test" : "wait", s->mb);
    if (!failed && s->recv) {
        slot_verify(c, s);
    }
}

static int run(idle_t *c)
{
    int      stage = c->host.info.pp_index, n = 0, i, k;
    slot_t  *slots = calloc((size_t)4 * c->per_dir, sizeof(*slots));
    slot_t **order = calloc((size_t)4 * c->per_dir, sizeof(*order));
    uint64_t state = mix(c->seed + 1000003u * (uint64_t)c->host.info.rank);

    if (slots == NULL || order == NULL) {
        fprintf(stderr, "out of memory\n");
        return -1;
    }
    /* Forward: stage s sends to s+1; backward: s+1 sends to s. */
    for (k = 0; k < c->per_dir; ++k) {
        struct { int ok, recv, backward, src; } ops[4] = {
            {stage + 1 < c->pp, 0, 0, stage},     {stage > 0, 1, 0, stage - 1},
            {stage > 0, 0, 1, stage},             {stage + 1 < c->pp, 1, 1, stage + 1}};

        for (i = 0; i < 4; ++i) {
            slot_t *s;

            if (!ops[i].ok) {
                continue;
            }
            s            = &slots[n++];
            s->recv      = ops[i].recv;
            s->backward  = ops[i].backward;
            s->src_stage = ops[i].src;
            s->mb        = (uint32_t)k;
            s->nbytes    = draw_size(c, s->backward, s->mb);
            s->buf       = malloc(s->nbytes);
            if (s->buf == NULL) {
                fprintf(stderr, "out of memory (%zu bytes)\n", s->nbytes);
                return -1;
            }
            if (s->recv) {
                memset(s->buf, SENTINEL, s->nbytes);
            } else {
                sl_pattern_fill(s->buf, 0, s->nbytes,
                                sl_pattern_seed(stage, s->mb, 0, s->backward));
            }
        }
    }
    for (i = 0; i < n; ++i) {
        order[i] = &slots[i];
    }
    shuffle(order, n, &state);
    for (i = 0; i < n; ++i) {
        if (order[i]->recv) {
            slot_post(c, order[i]);
        }
    }
    if (host_collective(c, "posted") != 0) {
        return -1;
    }
    shuffle(order, n, &state);
    for (i = 0; i < n; ++i) {
        if (!order[i]->recv) {
            slot_post(c, order[i]);
        }
    }
    shuffle(order, n, &state);
    for (i = 0; i < n; ++i) {
        int by_test = strcmp(c->complete, "test") == 0 ||
                      (strcmp(c->complete, "mixed") == 0 &&
                       ((state = mix(state)) & 1));

        slot_complete(c, order[i], by_test);
    }
    /* Idle outside stagelink until every peer has completed too. */
    if (host_collective(c, "done") != 0) {
        return -1;
    }
#ifndef IDLE_WITH_MPI
    marker(c, "resumed");
#endif
    for (i = 0; i < n; ++i) {
        free(slots[i].buf);
    }
    free(slots);
    free(order);
    return 0;
}

#ifndef IDLE_WITH_MPI
/* Every "done" marker is older than every "resumed" one. */
static int check_order(idle_t *c)
{
    int         world = c->host.info.world_size, r;
    struct stat st;
    char        path[320];
    double      last_done = 0, first_resumed = 1e300;

    for (r = 0; r < world; ++r) {
        snprintf(path, sizeof(path), "%s/done.%d.%d", c->dir, c->round, r);
        if (stat(path, &st) == 0) {
            double t = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
            last_done = t > last_done ? t : last_done;
        }
        snprintf(path, sizeof(path), "%s/resumed.%d.%d", c->dir, c->round, r);
        if (stat(path, &st) == 0) {
            double t = (double)st.st_mtim.tv_sec + st.st_mtim.tv_nsec * 1e-9;
            first_resumed = t < first_resumed ? t : first_resumed;
        }
    }
    if (last_done > first_resumed) {
        fprintf(stderr, "round %d: a rank completed after another resumed "
                "from the host collective\n", c->round);
        return -1;
    }
    return 0;
}
#endif

int main(int argc, char **argv)
{
    idle_t   c;
    int      opt, rc, rank;
    uint64_t base;

    memset(&c, 0, sizeof(c));
    c.tp = 1, c.pp = 2, c.per_dir = 64, c.max_bytes = 3300000, c.seed = 1;
    c.barrier_s = 60;
    snprintf(c.complete, sizeof(c.complete), "wait");
    c.rounds = 1;
    while ((opt = getopt(argc, argv, "t:p:n:S:c:x:r:B:")) != -1) {
        switch (opt) {
        case 't': c.tp = atoi(optarg); break;
        case 'p': c.pp = atoi(optarg); break;
        case 'n': c.per_dir = atoi(optarg); break;
        case 'S': c.max_bytes = strtoull(optarg, NULL, 0); break;
        case 'c': snprintf(c.complete, sizeof(c.complete), "%s", optarg); break;
        case 'x': c.seed = strtoull(optarg, NULL, 0); break;
        case 'r': c.rounds = atoi(optarg); break;
        case 'B': c.barrier_s = atof(optarg); break;
        default:
            fprintf(stderr, "usage: idle_peers -t TP [-p PP] [-n N] [-S MAX] "
                    "[-c wait|test|mixed] [-x SEED] [-r ROUNDS] [-B SECONDS]\n");
            return 2;
        }
    }
    if (c.per_dir < 1 || c.rounds < 1 || c.max_bytes < 1 || c.tp < 1 || c.pp < 2 ||
        (strcmp(c.complete, "wait") && strcmp(c.complete, "test") &&
         strcmp(c.complete, "mixed"))) {
        fprintf(stderr, "idle_peers: bad arguments\n");
        return 2;
    }
#ifdef IDLE_WITH_MPI
    MPI_Init(&argc, &argv);
#else
    {
        const char *port = getenv("MASTER_PORT");

        /* The job's: its port and its launcher (stagelink_run, the ranks'
         * parent), so that no earlier job's markers are met. */
        snprintf(c.dir, sizeof(c.dir), "/tmp/stagelink-idle-%s-%d",
                 port ? port : "0", (int)getppid());
        if (mkdir(c.dir, 0700) != 0 && errno != EEXIST) {
            fprintf(stderr, "cannot make %s: %s\n", c.dir, strerror(errno));
            return 1;
        }
    }
#endif
    if (sl_host_open(&c.host, c.tp, c.pp, STAGELINK_MODE_SCATTER_GATHER) != 0) {
        return 1;
    }
    base = c.seed;
    for (rc = 0; rc == 0 && check_failed == 0 && c.round < c.rounds;
         ++c.round) {
        c.seed = base + (uint64_t)c.round;
        rc     = run(&c);
    }
    if (rc == 0 && check_failed == 0) {
        printf("rank %d: %d rounds of %d each way, completed by %s, then "
               "idle: ok\n", c.host.info.rank, c.rounds, c.per_dir,
               c.complete);
    }
    rank = c.host.info.rank;
#ifdef IDLE_WITH_MPI
    (void)rank;
    sl_host_close(&c.host);
    MPI_Finalize();
#else
    /* Finalize is collective: past it, every rank has resumed. */
    for (c.round = 0; rc == 0 && rank == 0 && c.round < c.rounds; ++c.round) {
        rc = check_order(&c);
    }
    sl_host_close(&c.host);
    if (rank == 0) {
        char cmd[300];

        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", c.dir);
        if (system(cmd) != 0) {
            fprintf(stderr, "cannot remove %s\n", c.dir);
        }
    }
#endif
    CHECK(rc == 0, "rank %d: a round or the order of completions failed "
          "(above)", rank);
    return check_summary();
}
