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
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
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
static int        listen_note = -1; /* rank 0: a pipe to say it listens */

/* Linked with -Wl,--wrap=listen: the bootstrap's listen() comes here, and
 * rank 0 tells the parent the moment its listener is up. */
int __real_listen(int fd, int backlog);
int __wrap_listen(int fd, int backlog);
int __wrap_listen(int fd, int backlog)
{
    int rc = __real_listen(fd, backlog);

    if (rc == 0 && listen_note >= 0) {
        (void)!write(listen_note, "L", 1);
    }
    return rc;
}

/* One rank: rendezvous, an exchange of the ranks' numbers with every
 * rank, then one with only its two neighbours (as init names its peers). */
static void run_rank(int slot, rank_spec_t spec)
{
    sl_launcher_t      l = {.source = "test", .rank = spec.rank,
                            .world_size = spec.world, .local_rank = -1,
                            .local_size = -1, .port = port,
                            .job_key = spec.key};
    stagelink_config_t cfg;
    sl_bootstrap_t     bs;
    sl_errbuf_t        eb = {{0}};
    int                all[MAX_PROCS], everyone[MAX_PROCS], r, st;
    int                near[2] = {(spec.rank + spec.world - 1) % spec.world,
                                  (spec.rank + 1) % spec.world};

    alarm(30); /* a hang shows as a signal, never as a stuck test */
    memset(&cfg, 0, sizeof(cfg));
    strcpy(l.addr, "127.0.0.1");
    strcpy(l.bind, "127.0.0.1");
    st = sl_bootstrap_init(&bs, &cfg, &l, TIMEOUT_S, &eb);
    if (st == STAGELINK_SUCCESS) {
        for (r = 0; r < spec.world && r < MAX_PROCS; ++r) {
            everyone[r] = r;
        }
        st = sl_bootstrap_exchange_fixed(&bs, "ranks", &spec.rank, sizeof(int),
                                         everyone, spec.world, all, &eb);
        for (r = 0; st == STAGELINK_SUCCESS && r < spec.world; ++r) {
            if (all[r] != r) {
                st = STAGELINK_ERR_INTERNAL;
                snprintf(eb.msg, sizeof(eb.msg), "slot %d holds %d", r, all[r]);
            }
        }
        if (st == STAGELINK_SUCCESS) {
            st = sl_bootstrap_exchange_fixed(&bs, "near", &spec.rank,
                                             sizeof(int), near, 2, all, &eb);
        }
        for (r = 0; st == STAGELINK_SUCCESS && r < 2; ++r) {
            if (all[r] != near[r]) {
                st = STAGELINK_ERR_INTERNAL;
                snprintf(eb.msg, sizeof(eb.msg), "neighbour %d holds %d, "
                         "not %d", r, all[r], near[r]);
            }
        }
        sl_bootstrap_cleanup(&bs);
    }
    res->status[slot] = st;
    snprintf(res->msg[slot], sizeof(res->msg[slot]), "%s", eb.msg);
    _exit(0);
}

/* Blocks until rank 0 listens (1) or has ended without (0), at most the
 * rendezvous deadline (-1). */
static int await_listener(int note)
{
    struct pollfd p = {.fd = note, .events = POLLIN};
    char          c;

    if (poll(&p, 1, (int)(TIMEOUT_S * 1e3)) != 1) {
        return -1;
    }
    return read(note, &c, 1) == 1;
}

/* Starts the specs, runs `strangers` (may be NULL) from the parent once
 * rank 0 listens, waits for all; returns the seconds the slowest took. */
static double run_job(const rank_spec_t *specs, int n, void (*strangers)(void))
{
    pid_t  pid[MAX_PROCS];
    double t0 = sl_time_now();
    int    i, wst, note[2], up;

    for (i = 0; i < n; ++i) {
        res->status[i] = -1;
        res->msg[i][0] = '\0';
    }
    if (pipe2(note, O_CLOEXEC) != 0) {
        CHECK(0, "pipe: %s", strerror(errno));
        return 0;
    }
    for (i = 0; i < n; ++i) {
        if ((pid[i] = fork()) == 0) {
            if (i == 0) {
                listen_note = note[1];
            }
            run_rank(i, specs[i]);
        }
        if (i == 0) {
            /* Only rank 0 holds the write end: it says "listening", or
             * its end closes when it exits without. */
            close(note[1]);
            up = await_listener(note[0]);
            close(note[0]);
            CHECK(up >= 0, "rank 0 neither listened nor ended in %.0f s",
                  TIMEOUT_S);
            if (strangers != NULL) {
                CHECK(up == 1, "rank 0 never listened: no stranger can come");
                if (up == 1) {
                    strangers();
                }
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

static int   open_fds[64];
static int   nopen;
static pid_t slow = -1;

/* A stranger's connection to rank 0, kept open; one that cannot connect
 * fails the test (a stranger that never came has tested nothing). */
static int stranger(const char *what)
{
    int fd = connect_local();

    CHECK(fd >= 0, "stranger (%s) could not connect to rank 0 on port %d: %s",
          what, port, strerror(errno));
    if (fd >= 0) {
        open_fds[nopen++] = fd;
    }
    return fd;
}

static void strangers(void)
{
    static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n..........";
    int               i, fd;

    for (i = 0; i < 40; ++i) { /* a flood of silent connections */
        stranger("silent");
    }
    if ((fd = stranger("garbage")) >= 0) {
        (void)!write(fd, garbage, sizeof(garbage));
    }
    if ((fd = stranger("another job's key")) >= 0) {
        send_hello(fd, 1, 4, 999, 0);
    }
    if ((fd = stranger("another world size")) >= 0) {
        send_hello(fd, 1, 5, 7, 0);
    }
    if ((fd = stranger("rank out of range")) >= 0) {
        send_hello(fd, 9, 4, 7, 0);
    }
    if ((fd = stranger("a hello announcing 1 GiB")) >= 0) {
        send_hello(fd, 2, 4, 7, 1u << 30);
    }
    /* A byte a second for four seconds, connected now (later the job may
     * be over and the listener closed). */
    if ((fd = stranger("a byte a second")) >= 0 && (slow = fork()) == 0) {
        alarm(10);
        for (i = 0; i < 4; ++i) {
            (void)!write(fd, "S", 1);
            sleep(1);
        }
        _exit(0);
    }
    CHECK(nopen == 46, "%d of 46 strangers connected", nopen);
}

static void close_strangers(void)
{
    int wst;

    while (nopen > 0) {
        close(open_fds[--nopen]);
    }
    if (slow > 0) {
        CHECK(waitpid(slow, &wst, 0) == slow && WIFEXITED(wst) &&
                  WEXITSTATUS(wst) == 0, "the slow stranger ended with %#x", wst);
        slow = -1;
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
