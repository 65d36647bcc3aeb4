/*
 * Rank 0's TCP rendezvous against what a shared cluster throws at it: real
 * ranks run as forked processes on loopback while strangers connect (silent,
 * garbage, a byte a second, another job's key, another world size, a rank
 * out of range, a flood), and jobs that cannot meet (a missing rank, a
 * duplicate rank, a rank of another job, the port taken).  Every process
 * must end within its deadline, the real job must complete when it can, and
 * each failure must say what happened.
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "loopback.h"
#include "sl_bootstrap.h"
#include "sl_time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PROCS 8
#define TIMEOUT_S 3.0 /* the rendezvous deadline every rank runs with */

typedef struct {
    int  status[MAX_PROCS];
    char msg[MAX_PROCS][SL_ERRBUF_LEN];
} results_t;

typedef struct {
    int      rank, world;
    uint64_t key;
} rank_spec_t;

static results_t *res;
static int        port;

/* One rank: rendezvous, then an allgather of the ranks' numbers. */
static void run_rank(int slot, rank_spec_t spec)
{
    sl_launcher_t      l = {.source = "test", .rank = spec.rank,
                            .world_size = spec.world, .local_rank = -1,
                            .local_size = -1, .port = port,
                            .job_key = spec.key};
    stagelink_config_t cfg;
    sl_bootstrap_t     bs;
    sl_errbuf_t        eb = {{0}};
    int                all[MAX_PROCS], r, st;

    alarm(30); /* a hang shows as a signal, never as a stuck test */
    memset(&cfg, 0, sizeof(cfg));
    strcpy(l.addr, "127.0.0.1");
    strcpy(l.bind, "127.0.0.1");
    st = sl_bootstrap_init(&bs, &cfg, &l, TIMEOUT_S, &eb);
    if (st == STAGELINK_SUCCESS) {
        st = sl_bootstrap_allgather(&bs, &spec.rank, all, sizeof(int), &eb);
        for (r = 0; st == STAGELINK_SUCCESS && r < spec.world; ++r) {
            if (all[r] != r) {
                st = STAGELINK_ERR_INTERNAL;
                snprintf(eb.msg, sizeof(eb.msg), "slot %d holds %d", r, all[r]);
            }
        }
        sl_bootstrap_cleanup(&bs);
    }
    res->status[slot] = st;
    snprintf(res->msg[slot], sizeof(res->msg[slot]), "%s", eb.msg);
    _exit(0);
}

/* Starts the specs, runs `strangers` (may be NULL) from the parent, waits
 * for all; returns the seconds the slowest took. */
static double run_job(const rank_spec_t *specs, int n, void (*strangers)(void))
{
    pid_t  pid[MAX_PROCS];
    double t0 = sl_time_now();
    int    i, wst;

    for (i = 0; i < n; ++i) {
        res->status[i] = -1;
        res->msg[i][0] = '\0';
    }
    for (i = 0; i < n; ++i) {
        if ((pid[i] = fork()) == 0) {
            run_rank(i, specs[i]);
        }
        if (i == 0) {
            usleep(100000); /* rank 0 listens before the strangers come */
            if (strangers != NULL) {
                strangers();
            }
        }
    }
    for (i = 0; i < n; ++i) {
        waitpid(pid[i], &wst, 0);
        CHECK(WIFEXITED(wst), "process %d (rank %d) was killed by signal %d",
              i, specs[i].rank, WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
    }
    return sl_time_now() - t0;
}

static int connect_local(void)
{
    struct sockaddr_in a  = {.sin_family = AF_INET};
    int                fd = socket(AF_INET, SOCK_STREAM, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port        = htons((uint16_t)port);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A well-formed hello with chosen fields. */
static void send_hello(int fd, uint32_t rank, uint32_t world, uint64_t key,
                       uint64_t size)
{
    sl_boot_hdr_t h = {SL_BOOT_MAGIC, SL_BOOT_VERSION, rank, world, key, size};

    (void)!write(fd, &h, sizeof(h));
}

static int open_fds[64];
static int nopen;

static void strangers(void)
{
    static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n..........";
    pid_t             slow;
    int               i, fd;

    for (i = 0; i < 40; ++i) { /* a flood of silent connections */
        if ((fd = connect_local()) >= 0) {
            open_fds[nopen++] = fd;
        }
    }
    if ((fd = connect_local()) >= 0) {
        (void)!write(fd, garbage, sizeof(garbage));
        open_fds[nopen++] = fd;
    }
    if ((fd = connect_local()) >= 0) {
        send_hello(fd, 1, 4, 999, 0); /* another job's key */
        open_fds[nopen++] = fd;
    }
    if ((fd = connect_local()) >= 0) {
        send_hello(fd, 1, 5, 7, 0); /* another world size */
        open_fds[nopen++] = fd;
    }
    if ((fd = connect_local()) >= 0) {
        send_hello(fd, 9, 4, 7, 0); /* rank out of range */
        open_fds[nopen++] = fd;
    }
    if ((fd = connect_local()) >= 0) {
        send_hello(fd, 2, 4, 7, 1u << 30); /* a hello announcing 1 GiB */
        open_fds[nopen++] = fd;
    }
    if ((slow = fork()) == 0) { /* a byte a second, for four seconds */
        alarm(10);
        if ((fd = connect_local()) >= 0) {
            for (i = 0; i < 4; ++i) {
                (void)!write(fd, "S", 1);
                sleep(1);
            }
        }
        _exit(0);
    }
}

static void close_strangers(void)
{
    while (nopen > 0) {
        close(open_fds[--nopen]);
    }
    while (wait(NULL) > 0) {
    }
}

int main(void)
{
    rank_spec_t job[4] = {{0, 4, 7}, {1, 4, 7}, {2, 4, 7}, {3, 4, 7}};
    rank_spec_t spec[4];
    double      took;
    int         i, ok, held;

    signal(SIGPIPE, SIG_IGN);
    res = mmap(NULL, sizeof(*res), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) {
        return 2;
    }

    /* Each job's port is held (hold_port) until the job is over, so that no
     * other test running meanwhile can take it. */

    /* The real job completes while strangers connect. */
    if ((held = hold_port(&port)) < 0) {
        return 2;
    }
    took = run_job(job, 4, strangers);
    close_strangers();
    close(held);
    for (i = 0; i < 4; ++i) {
        CHECK(res->status[i] == STAGELINK_SUCCESS,
              "with strangers, rank %d failed: %s", i, res->msg[i]);
    }
    CHECK(took < TIMEOUT_S, "the job took %.2f s among strangers", took);

    /* A rank never arrives: every survivor fails in time, rank 0 names it. */
    if ((held = hold_port(&port)) < 0) {
        return 2;
    }
    took = run_job(job, 3, NULL);
    close(held);
    for (i = 0; i < 3; ++i) {
        CHECK(res->status[i] != STAGELINK_SUCCESS, "rank %d succeeded", i);
    }
    CHECK(strstr(res->msg[0], "missing: 3") != NULL, "rank 0 said: %s",
          res->msg[0]);
    CHECK(took < 2 * TIMEOUT_S + 1, "missing rank: %.2f s", took);

    /* A rank of another job (key), and one of another world size. */
    for (i = 0; i < 2; ++i) {
        memcpy(spec, job, sizeof(spec));
        if (i == 0) {
            spec[3].key = 8;
        } else {
            spec[3].world = 5;
        }
        if ((held = hold_port(&port)) < 0) {
            return 2;
        }
        took = run_job(spec, 4, NULL);
        close(held);
        CHECK(res->status[3] != STAGELINK_SUCCESS, "case %d: rank 3 succeeded", i);
        CHECK(strstr(res->msg[0], "missing: 3") != NULL, "case %d: rank 0 said: %s",
              i, res->msg[0]);
        CHECK(took < 2 * TIMEOUT_S + 1, "case %d: %.2f s", i, took);
    }

    /* Two processes with rank 2: one joins, the other is refused. */
    memcpy(spec, job, sizeof(spec));
    spec[3].rank = 2;
    if ((held = hold_port(&port)) < 0) {
        return 2;
    }
    took = run_job(spec, 4, NULL);
    close(held);
    ok   = (res->status[2] == STAGELINK_SUCCESS) + (res->status[3] == STAGELINK_SUCCESS);
    CHECK(ok <= 1, "both rank-2 processes succeeded");
    CHECK(res->status[0] != STAGELINK_SUCCESS && strstr(res->msg[0], "missing: 3"),
          "duplicate rank: rank 0 said: %s", res->msg[0]);
    CHECK(took < 2 * TIMEOUT_S + 1, "duplicate rank: %.2f s", took);

    /* The port is taken by another listener (the held socket listening):
     * rank 0 says so at once. */
    if ((held = hold_port(&port)) < 0) {
        return 2;
    }
    CHECK(listen(held, 4) == 0, "cannot listen on port %d", port);
    took = run_job(job, 2, NULL);
    close(held);
    CHECK(res->status[0] != STAGELINK_SUCCESS &&
          strstr(res->msg[0], "cannot listen") != NULL, "port taken: rank 0 said: %s",
          res->msg[0]);
    CHECK(res->status[1] != STAGELINK_SUCCESS,
          "port taken: rank 1 met a stranger's listener and succeeded");
    return check_summary();
}
