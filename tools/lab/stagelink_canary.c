/*
 * stagelink_canary: how fast this machine moves bytes right now.  A
 * benchmark on shared cores needs to know whether the host slowed them:
 * a run whose ranks use a tenth more CPU per byte for the same job is
 * the host's, not the code's.  The canary is that job's main work without
 * stagelink, timed from a common start to the last finish:
 *   - memcpy: one thread a CPU, each copying between two buffers larger
 *     than a core's cache;
 *   - tcp: one stream over loopback, a sender and a receiver thread (the
 *     kernel's copies, TCP, the wake-ups: most of a simulated node's CPU);
 *   - wake: a byte bounced between two threads on two CPUs over a socket
 *     pair, each blocked in read until the other writes (a wake-up across
 *     CPUs: on a virtual machine, an interrupt to a halted CPU through the
 *     host);
 *   - chase: a random walk through 8 MiB, one load waiting for the last
 *     (the caches and memory latency that other tenants share);
 *   - timer: a 20 us sleep, what it takes with Linux's default 50 us of
 *     timer slack (a timer interrupt through the host on a virtual
 *     machine: tbf paces the simulated link by timer).
 *
 *   stagelink_canary [-t THREADS] [-s BUFFER] [-b BYTES]
 *
 * Defaults: one memcpy thread per CPU this process may run on, 16 MiB
 * buffers (faulted in before the clock starts), 1 GiB copied by each
 * thread and sent over TCP, 2000 round trips, 4 million steps, 2000
 * sleeps.  Prints one line:
 *   canary: memcpy GB/s, tcp GB/s, wake us, chase ns, timer us (1e9 B/s;
 *   us a round trip; ns a step; us a sleep) ...
 * SPDX-License-Identifier: MIT
 */
#include "host.h"
#include "tool_opts.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SL_CANARY_ROUNDS 2000
#define SL_CANARY_STEPS  4000000

typedef struct canary {
    pthread_barrier_t *start;
    size_t             buffer, bytes;
    int                fd;     /* tcp: this thread's end */
    int                sender; /* tcp: sends, else receives; wake: starts */
    int                cpu;    /* wake: the CPU it runs on (-1: any) */
    const char        *failed; /* what stopped the thread short, or NULL */
} canary_t;

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Two buffers faulted in, then the copies; returns the bytes copied. */
static void *copier(void *arg)
{
    canary_t *c = arg;
    char     *a = malloc(c->buffer), *b = malloc(c->buffer);
    size_t    done;
    int       flip = 0;

    if (a != NULL && b != NULL) {
        memset(a, 1, c->buffer);
        memset(b, 2, c->buffer);
    } else {
        c->failed = "out of memory for its two buffers";
    }
    pthread_barrier_wait(c->start);
    for (done = 0; c->failed == NULL && done < c->bytes;) {
        size_t len = c->bytes - done < c->buffer ? c->bytes - done : c->buffer;

        memcpy(flip ? a : b, flip ? b : a, len);
        flip = !flip;
        done += len;
    }
    /* The copies must not be optimized away: their result leaves. */
    done = (a != NULL && b != NULL) ? done + (size_t)(a[c->buffer / 2] != 1) : 0;
    free(a);
    free(b);
    return (void *)(uintptr_t)done;
}

/* A thread that stops short says why, and ends the connection, so that
 * its peer is not left blocked waiting for it. */
static void stop_short(canary_t *c, const char *why)
{
    c->failed = why;
    shutdown(c->fd, SHUT_RDWR);
}

/* One end of the tcp stream; returns the bytes moved. */
static void *streamer(void *arg)
{
    canary_t *c = arg;
    char     *buf = malloc(c->buffer);
    size_t    done = 0;
    ssize_t   n;

    if (buf != NULL) {
        memset(buf, 3, c->buffer);
    } else {
        stop_short(c, "out of memory for its buffer");
    }
    pthread_barrier_wait(c->start);
    while (c->failed == NULL && done < c->bytes) {
        size_t len = c->bytes - done < c->buffer ? c->bytes - done : c->buffer;

        n = c->sender ? send(c->fd, buf, len, MSG_NOSIGNAL)
                      : recv(c->fd, buf, len, 0);
        if (n <= 0) {
            stop_short(c, c->sender ? "send failed" : "recv failed or the peer left");
        }
        done += (n > 0) ? (size_t)n : 0;
    }
    free(buf);
    return (void *)(uintptr_t)done;
}

/* One end of the wake ping-pong; returns the round trips, as "bytes". */
static void *bouncer(void *arg)
{
    canary_t *c = arg;
    size_t    i;
    char      b = 'w';
    cpu_set_t one;

    /* On one CPU the bounce would be a switch, not a wake-up. */
    if (c->cpu >= 0) {
        CPU_ZERO(&one);
        CPU_SET(c->cpu, &one);
        if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0) {
            stop_short(c, "cannot run on its CPU (pthread_setaffinity_np)");
        }
    }
    pthread_barrier_wait(c->start);
    for (i = 0; c->failed == NULL && i < c->bytes; ++i) {
        if ((c->sender && write(c->fd, &b, 1) != 1) || read(c->fd, &b, 1) != 1 ||
            (!c->sender && write(c->fd, &b, 1) != 1)) {
            stop_short(c, "a write or read failed, or the peer left");
        }
    }
    return (void *)(uintptr_t)(c->failed == NULL ? i : 0);
}

/* Nanoseconds a step of a random cycle through `bytes`, or -1. */
static double chase_ns(size_t bytes, size_t steps)
{
    size_t  n = bytes / sizeof(size_t), i, j, at = 0, t;
    size_t *next = malloc(n * sizeof(*next));
    double  t0;

    if (next == NULL) {
        return -1;
    }
    /* Sattolo's shuffle: one cycle through every slot. */
    for (i = 0; i < n; ++i) {
        next[i] = i;
    }
    srand(1);
    for (i = n - 1; i > 0; --i) {
        j       = (size_t)rand() % i;
        t       = next[i];
        next[i] = next[j];
        next[j] = t;
    }
    t0 = now_s();
    for (i = 0; i < steps; ++i) {
        at = next[at];
    }
    t0 = now_s() - t0;
    free(next);
    /* The walk's end is used, so the loads cannot be left out. */
    return (at < n) ? t0 / (double)steps * 1e9 : -1;
}

/* Microseconds a 20 us nanosleep takes. */
static double timer_us(int sleeps)
{
    struct timespec ts = {0, 20000};
    double          t0 = now_s();
    int             i;

    for (i = 0; i < sleeps; ++i) {
        nanosleep(&ts, NULL);
    }
    return (now_s() - t0) / sleeps * 1e6;
}

/* Runs n threads of fn over c (args[i] each) from one start; the seconds
 * from the start to the last finish, or -1 when one fell short. */
static double timed(void *(*fn)(void *), canary_t *args, int n, size_t want)
{
    pthread_barrier_t start;
    pthread_t         th[1024];
    double            t0;
    int               i, ok = 1;

    if (pthread_barrier_init(&start, NULL, (unsigned)n + 1) != 0) {
        return -1;
    }
    for (i = 0; i < n; ++i) {
        args[i].start = &start;
    }
    for (i = 0; i < n; ++i) {
        if (pthread_create(&th[i], NULL, fn, &args[i]) != 0) {
            fprintf(stderr, "stagelink_canary: cannot start thread %d of %d\n", i, n);
            exit(1);
        }
    }
    pthread_barrier_wait(&start);
    t0 = now_s();
    for (i = 0; i < n; ++i) {
        void *got;

        pthread_join(th[i], &got);
        ok = ok && (size_t)(uintptr_t)got >= want;
    }
    t0 = now_s() - t0;
    pthread_barrier_destroy(&start);
    return ok ? t0 : -1;
}

/* Says which measurement fell short, and why (its threads' reasons). */
static int fell_short(const canary_t *args, int n, const char *what)
{
    int i;

    for (i = 0; i < n && args[i].failed == NULL; ++i) {
    }
    fprintf(stderr, "stagelink_canary: the %s stopped short: %s\n", what,
            i < n ? args[i].failed : "a thread could not be started or joined");
    return 1;
}

/* A connected pair over loopback: fds[0] sends, fds[1] receives. */
static int tcp_pair(int fds[2])
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t          len = sizeof(a);
    int                lfd = socket(AF_INET, SOCK_STREAM, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    fds[1] = -1;
    if (lfd < 0 || fds[0] < 0 || bind(lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(lfd, 1) != 0 || getsockname(lfd, (struct sockaddr *)&a, &len) != 0 ||
        connect(fds[0], (struct sockaddr *)&a, sizeof(a)) != 0 ||
        (fds[1] = accept(lfd, NULL, NULL)) < 0) {
        perror("stagelink_canary: a TCP connection over 127.0.0.1");
        return -1;
    }
    close(lfd);
    return 0;
}

int main(int argc, char **argv)
{
    canary_t  c = {.buffer = 16u << 20, .bytes = 1u << 30}, *args;
    cpu_set_t set;
    double    mem_s, tcp_s, wake_s, step_ns;
    int       threads = 0, opt, i, n, ok = 1, fds[2];
    char     *end;

    while ((opt = getopt_long(argc, argv, "t:s:b:h", sl_tool_longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 't':
            threads = (int)strtol(optarg, &end, 10);
            ok      = (*end == '\0' && threads > 0);
            break;
        case 's': ok = sl_host_parse_size(optarg, &c.buffer) == 0; break;
        case 'b': ok = sl_host_parse_size(optarg, &c.bytes) == 0; break;
        case 'V': return sl_tool_version("stagelink_canary");
        default:
            fprintf(opt == 'h' ? stdout : stderr, "usage: stagelink_canary "
                    "[-t THREADS] [-s BUFFER] [-b BYTES]\n");
            return opt == 'h' ? 0 : 2;
        }
        if (!ok) {
            fprintf(stderr, "stagelink_canary: cannot read '%s' (-t: a count "
                    "of threads; -s, -b: a number with an optional K, M or G)\n",
                    optarg);
            return 2;
        }
    }
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof(set), &set);
    if (threads <= 0) {
        threads = CPU_COUNT(&set) > 0 ? CPU_COUNT(&set) : 1;
    }
    if (c.buffer == 0 || c.bytes < c.buffer || threads > 1024) {
        fprintf(stderr, "stagelink_canary: need 0 < BUFFER <= BYTES and at most "
                "1024 threads (got %zu, %zu, %d)\n", c.buffer, c.bytes, threads);
        return 2;
    }
    /* At least two: the tcp stream's ends. */
    if ((args = calloc((size_t)(threads < 2 ? 2 : threads), sizeof(*args))) == NULL) {
        fprintf(stderr, "stagelink_canary: out of memory for %d threads\n", threads);
        return 1;
    }
    for (i = 0; i < threads; ++i) {
        args[i] = c;
    }
    if ((mem_s = timed(copier, args, threads, c.bytes)) < 0) {
        return fell_short(args, threads, "memcpy");
    }
    if (tcp_pair(fds) != 0) {
        return 1;
    }
    args[0] = c, args[1] = c;
    args[0].fd = fds[0], args[0].sender = 1, args[1].fd = fds[1];
    if ((tcp_s = timed(streamer, args, 2, c.bytes)) < 0) {
        return fell_short(args, 2, "TCP stream over loopback");
    }
    close(fds[0]);
    close(fds[1]);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) {
        perror("stagelink_canary: socketpair");
        return 1;
    }
    args[0].fd = fds[0], args[0].sender = 1, args[1].fd = fds[1];
    args[0].bytes = args[1].bytes = SL_CANARY_ROUNDS;
    args[0].cpu = args[1].cpu = -1;
    for (i = 0, n = 0; i < CPU_SETSIZE && n < 2; ++i) {
        if (CPU_ISSET(i, &set)) {
            args[n++].cpu = i;
        }
    }
    if (n < 2) {
        args[0].cpu = -1;
    }
    if ((wake_s = timed(bouncer, args, 2, SL_CANARY_ROUNDS)) < 0) {
        return fell_short(args, 2, "wake-up ping-pong over a socket pair");
    }
    if ((step_ns = chase_ns(8u << 20, SL_CANARY_STEPS)) < 0) {
        fprintf(stderr, "stagelink_canary: out of memory for the 8 MiB walk\n");
        return 1;
    }
    printf("canary: memcpy %.2f GB/s, tcp %.2f GB/s, wake %.1f us, chase %.1f ns, "
           "timer %.1f us (memcpy threads: %d, %zu-byte buffers, %zu bytes a thread)\n",
           (double)c.bytes * threads / mem_s * 1e-9, (double)c.bytes / tcp_s * 1e-9,
           wake_s / SL_CANARY_ROUNDS * 1e6, step_ns, timer_us(SL_CANARY_ROUNDS),
           threads, c.buffer, c.bytes);
    close(fds[0]);
    close(fds[1]);
    free(args);
    return 0;
}
