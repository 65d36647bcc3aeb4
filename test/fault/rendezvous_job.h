/*
 * A rendezvous job for the fault tests: real ranks run as forked processes
 * on a loopback port, each with its own job key, world size and job secret,
 * and the test's strangers come once rank 0 listens.  Each rank meets,
 * exchanges the ranks' numbers with everyone, then with its two
 * neighbours.  Linked with -Wl,--wrap=listen (rank 0 says when it
 * listens) and -Wl,--wrap=send (a capturing rank records what it sends).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TEST_RENDEZVOUS_JOB_H
#define SL_TEST_RENDEZVOUS_JOB_H

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
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PROCS   8
#define TIMEOUT_S   3.0 /* the rendezvous deadline every rank runs with */
#define CAPTURE_MAX 4096

typedef struct {
    int    status[MAX_PROCS];
    char   msg[MAX_PROCS][SL_ERRBUF_LEN];
    pid_t  root_pid; /**< rank 0's process, once it listens */
    size_t captured; /**< bytes a capturing rank sent */
    char   capture[CAPTURE_MAX];
} results_t;

typedef struct {
    int         rank, world;
    uint64_t    key;
    const char *secret;  /**< STAGELINK_JOB_SECRET, NULL: none */
    int         capture; /**< 1: record what this rank sends; 2: flip a
                              byte of its first exchange message */
    const char *log;     /**< file its stderr (the log) goes to */
    int         nofile;  /**< its open-file limit (0: the test's) */
} rank_spec_t;

static results_t *res;
static int        port;
static int        listen_note = -1; /* rank 0: a pipe to say it listens */
static int        capturing;
static int        port_taken; /* run_job: another listener has the port */
static double     job_timeout = TIMEOUT_S; /* every rank's deadline */
static const char *job_addr   = "127.0.0.1"; /* rank 0 listens there */

int __real_listen(int fd, int backlog);
int __wrap_listen(int fd, int backlog);
int __wrap_listen(int fd, int backlog)
{
    int rc = __real_listen(fd, backlog);

    if (rc == 0 && listen_note >= 0) {
        res->root_pid = getpid();
        (void)!write(listen_note, "L", 1);
    }
    return rc;
}

ssize_t __real_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags)
{
    static int calls;
    char       altered[64];
    ssize_t    n;

    /* Sends: the hello, the proof, then the first exchange's header and
     * request; the request's first byte (the exchange's name) is flipped,
     * as a man in the middle would. */
    if (capturing == 2 && ++calls == 4 && len <= sizeof(altered)) {
        memcpy(altered, buf, len);
        altered[0] ^= 1;
        buf = altered;
    }
    n = __real_send(fd, buf, len, flags);
    if (capturing == 1 && n > 0 && res->captured + (size_t)n <= CAPTURE_MAX) {
        memcpy(res->capture + res->captured, buf, (size_t)n);
        res->captured += (size_t)n;
    }
    return n;
}

/* Results shared with the forked ranks. */
static int job_setup(void)
{
    signal(SIGPIPE, SIG_IGN);
    res = mmap(NULL, sizeof(*res), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    return (res == MAP_FAILED) ? -1 : 0;
}

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
    if (spec.secret != NULL) {
        setenv("STAGELINK_JOB_SECRET", spec.secret, 1);
    } else {
        unsetenv("STAGELINK_JOB_SECRET");
    }
    unsetenv("STAGELINK_JOB_SECRET_FILE");
    capturing = spec.capture;
    if (spec.nofile > 0) {
        struct rlimit lim = {(rlim_t)spec.nofile, (rlim_t)spec.nofile};

        if (setrlimit(RLIMIT_NOFILE, &lim) != 0) {
            _exit(3);
        }
    }
    if (spec.log != NULL) {
        if (freopen(spec.log, "w", stderr) == NULL) {
            _exit(3);
        }
        setvbuf(stderr, NULL, _IONBF, 0); /* the rank ends with _exit */
    }
    memset(&cfg, 0, sizeof(cfg));
    snprintf(l.addr, sizeof(l.addr), "%s", job_addr);
    snprintf(l.bind, sizeof(l.bind), "%s", job_addr);
    l.boot = SL_BOOT_TCP;
    st = sl_bootstrap_init(&bs, &cfg, &l, job_timeout, &eb);
    if (st == STAGELINK_SUCCESS && spec.world > MAX_PROCS) {
        sl_bootstrap_cleanup(&bs); /* more ranks than processes: met only */
    } else if (st == STAGELINK_SUCCESS) {
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

/* Starts the specs on a port held for the job, runs `strangers` (may be
 * NULL) from the parent once rank 0 listens and before the other ranks
 * start, waits for all; returns the seconds the slowest took. */
static double run_job(const rank_spec_t *specs, int n, void (*strangers)(void))
{
    pid_t  pid[MAX_PROCS];
    double t0;
    int    i, wst, note[2], up, held;

    if ((held = hold_port(&port)) < 0) {
        CHECK(0, "no loopback port to hold");
        return 0;
    }
    /* Held until the job is over, so that no other test takes it. */
    CHECK(!port_taken || listen(held, 4) == 0, "cannot listen on port %d",
          port);
    t0 = sl_time_now();
    for (i = 0; i < n; ++i) {
        res->status[i] = -1;
        res->msg[i][0] = '\0';
    }
    if (pipe2(note, O_CLOEXEC) != 0) {
        CHECK(0, "pipe: %s", strerror(errno));
        close(held);
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
    close(held);
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

/* A well-formed hello with chosen fields; `size` other than the hello's
 * sends the header alone. */
static void send_hello(int fd, uint32_t rank, uint32_t world, uint64_t key,
                       uint64_t size, const sl_boot_hello_t *hello)
{
    struct {
        sl_boot_hdr_t   h;
        sl_boot_hello_t b;
    } m = {{SL_BOOT_MAGIC, SL_BOOT_VERSION, rank, world, key, size}, {0}};

    if (hello != NULL) {
        m.b = *hello;
    }
    (void)!write(fd, &m, size == sizeof(m.b) ? sizeof(m) : sizeof(m.h));
}

#endif
