/*
 * The threading model: one thread per communicator, any number of
 * communicators in a process.  Here every rank of a job is a thread of one
 * process, each with its own communicator, all driving transfers at once
 * (forward and back, every byte checked); one more thread calls comm_abort
 * on a communicator whose owner is blocked in wait.
 *   threads WORLD TP ITERATIONS
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "loopback.h"
#include "pattern.h"

#include <stagelink/loader.h>

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define MAX_THREADS 8

static const stagelink_plugin_v1_t *sl;
static stagelink_loader_t          *loader;
static int                          world, tp, iterations;

typedef struct rank_thread {
    pthread_t          thread;
    int                rank;
    stagelink_status_t status;
    char               msg[1100];
    unsigned long long verified;
} rank_thread_t;

static stagelink_status_t fail(rank_thread_t *t, stagelink_comm_t *comm,
                               stagelink_status_t st, const char *what)
{
    snprintf(t->msg, sizeof(t->msg), "%s: %s: %.1000s", what,
             stagelink_status_string(st), sl->last_error(comm));
    return st;
}

static stagelink_status_t exchange(rank_thread_t *t, stagelink_comm_t *comm,
                                   const stagelink_comm_info_t *in,
                                   unsigned char *buf, size_t n, uint32_t mb,
                                   int backward)
{
    int                  sender = (in->pp_index == backward);
    stagelink_request_t *req;
    stagelink_xfer_t     x = {.peer = (in->pp_index == 0) ? STAGELINK_PEER_NEXT
                                                          : STAGELINK_PEER_PREV,
                              .buf = buf, .nbytes = n, .elem_size = 1,
                              .tag = {.microbatch = mb}};
    uint64_t             seed = sl_pattern_seed(backward ? 1 : 0, mb, 0, backward);
    stagelink_status_t   st;

    if (sender) {
        sl_pattern_fill(buf, 0, n, seed);
    } else {
        memset(buf, 0, n);
    }
    st = sender ? sl->isend(comm, &x, &req) : sl->irecv(comm, &x, &req);
    if (st != STAGELINK_SUCCESS) {
        return fail(t, comm, st, "post");
    }
    if ((st = sl->wait(comm, req)) != STAGELINK_SUCCESS) {
        return fail(t, comm, st, "wait");
    }
    if (!sender) {
        size_t bad = sl_pattern_check(buf, 0, n, seed);

        if (bad != SIZE_MAX) {
            snprintf(t->msg, sizeof(t->msg), "microbatch %u: byte %zu of %zu "
                     "differs", mb, bad, n);
            return STAGELINK_ERR_INTERNAL;
        }
        t->verified += n;
    }
    return STAGELINK_SUCCESS;
}

static void *rank_main(void *arg)
{
    static const size_t   sizes[] = {1, 4096, 65536 + 3, (2u << 20) + 5};
    rank_thread_t        *t   = arg;
    stagelink_config_t    cfg = {.struct_size = sizeof(cfg)};
    stagelink_comm_t     *comm;
    stagelink_comm_info_t in;
    unsigned char        *buf = malloc(sizes[3]);
    char                  err[1024];
    int                   i;

    cfg.rank       = t->rank;
    cfg.world_size = world;
    cfg.tp_size    = tp;
    cfg.flags      = STAGELINK_CONFIG_RANK_SET;
    if (stagelink_loader_comm_init(loader, &cfg, &comm, err, sizeof(err)) !=
        STAGELINK_SUCCESS) {
        snprintf(t->msg, sizeof(t->msg), "%s", err);
        t->status = STAGELINK_ERR_INIT;
        free(buf);
        return NULL;
    }
    sl->comm_info(comm, &in);
    for (i = 0; i < iterations && t->status == STAGELINK_SUCCESS; ++i) {
        size_t n = sizes[i % 4];

        t->status = exchange(t, comm, &in, buf, n, (uint32_t)i, 0);
        if (t->status == STAGELINK_SUCCESS) {
            t->status = exchange(t, comm, &in, buf, n, (uint32_t)i, 1);
        }
    }
    sl->comm_finalize(comm);
    free(buf);
    return NULL;
}

/* A receive nobody sends, and a second thread that aborts it as soon as
 * it is posted (its owner is then in wait or on its way there: either way
 * the wait must end ABORTED). */
typedef struct abort_case {
    stagelink_comm_t *comm;
    int               posted; /* eventfd the owner writes after irecv */
} abort_case_t;

static void *abort_later(void *arg)
{
    abort_case_t *a = arg;
    struct pollfd p = {.fd = a->posted, .events = POLLIN};

    poll(&p, 1, 10000); /* at most 10 s: a post that never comes */
    sl->comm_abort(a->comm);
    return NULL;
}

static void *abort_rank(void *arg)
{
    rank_thread_t        *t   = arg;
    stagelink_config_t    cfg = {.struct_size = sizeof(cfg), .rank = t->rank,
                                 .world_size = 2, .tp_size = 1,
                                 .flags = STAGELINK_CONFIG_RANK_SET};
    stagelink_comm_t     *comm;
    stagelink_request_t  *req;
    char                  err[1024], byte;
    stagelink_xfer_t      x = {.peer = STAGELINK_PEER_PREV, .buf = &byte,
                               .nbytes = 1};
    pthread_t             aborter;
    abort_case_t          a;
    int                   failed_rank;

    if (stagelink_loader_comm_init(loader, &cfg, &comm, err, sizeof(err)) !=
        STAGELINK_SUCCESS) {
        snprintf(t->msg, sizeof(t->msg), "%s", err);
        t->status = STAGELINK_ERR_INIT;
        return NULL;
    }
    if (t->rank == 1) {
        a.comm   = comm;
        a.posted = eventfd(0, EFD_CLOEXEC);
        pthread_create(&aborter, NULL, abort_later, &a);
        t->status = sl->irecv(comm, &x, &req);
        eventfd_write(a.posted, 1);
        if (t->status == STAGELINK_SUCCESS) {
            t->status = sl->wait(comm, req);
        }
        pthread_join(aborter, NULL);
        close(a.posted);
        snprintf(t->msg, sizeof(t->msg), "%s", sl->last_error(comm));
        CHECK(sl->comm_get_error(comm, &failed_rank) == STAGELINK_ERR_ABORTED &&
              failed_rank == -1, "comm_get_error after the abort");
        CHECK(sl->irecv(comm, &x, &req) == STAGELINK_ERR_ABORTED,
              "a post after the abort");
    }
    sl->comm_finalize(comm);
    return NULL;
}

/* The job's rendezvous port, held until close(returned socket). */
static int set_port(void)
{
    char text[16];
    int  port = 0, held = hold_port(&port);

    snprintf(text, sizeof(text), "%d", port);
    setenv("STAGELINK_BOOTSTRAP_PORT", text, 1);
    return held;
}

int main(int argc, char **argv)
{
    rank_thread_t t[MAX_THREADS];
    char          err[1024];
    int           r, held;

    if (argc != 4 || (world = atoi(argv[1])) < 2 || world > MAX_THREADS ||
        (tp = atoi(argv[2])) < 1 || world != 2 * tp ||
        (iterations = atoi(argv[3])) < 1) {
        fprintf(stderr, "usage: threads WORLD TP ITERATIONS (two stages: "
                "WORLD = 2 TP)\n");
        return 2;
    }
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) !=
        STAGELINK_SUCCESS) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    sl = stagelink_loader_plugin(loader);
    setenv("STAGELINK_BOOTSTRAP_ADDR", "127.0.0.1", 1);

    if ((held = set_port()) < 0) {
        return 1;
    }
    memset(t, 0, sizeof(t));
    for (r = 0; r < world; ++r) {
        t[r].rank = r;
        pthread_create(&t[r].thread, NULL, rank_main, &t[r]);
    }
    for (r = 0; r < world; ++r) {
        pthread_join(t[r].thread, NULL);
        CHECK(t[r].status == STAGELINK_SUCCESS, "thread of rank %d: %s", r,
              t[r].msg);
        printf("rank %d (thread %d): %llu bytes received and checked\n", r, r,
               t[r].verified);
    }
    close(held);

    if ((held = set_port()) < 0) {
        return 1;
    }
    memset(t, 0, sizeof(t));
    for (r = 0; r < 2; ++r) {
        t[r].rank = r;
        pthread_create(&t[r].thread, NULL, abort_rank, &t[r]);
    }
    for (r = 0; r < 2; ++r) {
        pthread_join(t[r].thread, NULL);
    }
    close(held);
    CHECK(t[1].status == STAGELINK_ERR_ABORTED, "the wait aborted from "
          "another thread gave %s: %s", stagelink_status_string(t[1].status),
          t[1].msg);
    stagelink_loader_close(loader);
    return check_summary();
}
