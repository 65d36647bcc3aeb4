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
#include "rendezvous_job.h"

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
        send_hello(fd, 1, 4, 999, sizeof(sl_boot_hello_t), NULL);
    }
    if ((fd = stranger("another world size")) >= 0) {
        send_hello(fd, 1, 5, 7, sizeof(sl_boot_hello_t), NULL);
    }
    if ((fd = stranger("rank out of range")) >= 0) {
        send_hello(fd, 9, 4, 7, sizeof(sl_boot_hello_t), NULL);
    }
    if ((fd = stranger("a hello announcing 1 GiB")) >= 0) {
        send_hello(fd, 2, 4, 7, 1u << 30, NULL);
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
    rank_spec_t job[4] = {{.rank = 0, .world = 4, .key = 7},
                          {.rank = 1, .world = 4, .key = 7},
                          {.rank = 2, .world = 4, .key = 7},
                          {.rank = 3, .world = 4, .key = 7}};
    rank_spec_t spec[4];
    double      took;
    int         i, ok;

    if (job_setup() != 0) {
        return 2;
    }

    /* The real job completes while strangers connect. */
    took = run_job(job, 4, strangers);
    close_strangers();
    for (i = 0; i < 4; ++i) {
        CHECK(res->status[i] == STAGELINK_SUCCESS,
              "with strangers, rank %d failed: %s", i, res->msg[i]);
    }
    CHECK(took < TIMEOUT_S, "the job took %.2f s among strangers", took);

    /* A rank never arrives: every survivor fails in time, rank 0 names it. */
    took = run_job(job, 3, NULL);
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
        took = run_job(spec, 4, NULL);
        CHECK(res->status[3] != STAGELINK_SUCCESS, "case %d: rank 3 succeeded", i);
        CHECK(strstr(res->msg[3], i == 0 ? "job key differs"
                                         : "world size differs") != NULL,
              "case %d: the refused rank 3 said: %s", i, res->msg[3]);
        CHECK(strstr(res->msg[0], "missing: 3") != NULL, "case %d: rank 0 said: %s",
              i, res->msg[0]);
        CHECK(took < 2 * TIMEOUT_S + 1, "case %d: %.2f s", i, took);
    }

    /* Two processes with rank 2: one joins, the other is refused. */
    memcpy(spec, job, sizeof(spec));
    spec[3].rank = 2;
    took = run_job(spec, 4, NULL);
    ok   = (res->status[2] == STAGELINK_SUCCESS) + (res->status[3] == STAGELINK_SUCCESS);
    CHECK(ok <= 1, "both rank-2 processes succeeded");
    CHECK(res->status[0] != STAGELINK_SUCCESS && strstr(res->msg[0], "missing: 3"),
          "duplicate rank: rank 0 said: %s", res->msg[0]);
    CHECK(took < 2 * TIMEOUT_S + 1, "duplicate rank: %.2f s", took);

    /* The port is taken by another listener (the held socket listening):
     * rank 0 says so at once. */
    port_taken = 1;
    took       = run_job(job, 2, NULL);
    port_taken = 0;
    CHECK(res->status[0] != STAGELINK_SUCCESS &&
          strstr(res->msg[0], "cannot listen") != NULL, "port taken: rank 0 said: %s",
          res->msg[0]);
    CHECK(res->status[1] != STAGELINK_SUCCESS,
          "port taken: rank 1 met a stranger's listener and succeeded");
    return check_summary();
}
