/*
 * The rendezvous keeps its deadline and stays quiet under attack; one case
 * a run, named by argv[1]:
 *   accept-queue   rank 0's accept queue is full: a joining rank ends by its
 *                  deadline (2 s) with a sentence naming the address;
 *   hello-flood    strangers holding the job key keep every handshake slot
 *                  at the proof and one more comes right behind a real
 *                  rank: the real rank's hello, read in one step, is never
 *                  the cheapest slot to evict;
 *   forged-refusal a listener posing as rank 0 refuses a rank that holds the
 *                  secret: the rank tries again until the real rank 0 comes;
 *   secret-file    a FIFO or another user's file as the secret file is
 *                  refused at once;
 *   drop-warnings  thousands of dropped strangers make a few warnings with
 *                  a count, not one line each;
 *   unauth-warning a rendezvous without a secret on an address that is not
 *                  loopback warns, once a rank; on loopback it does not;
 *   fd-limit       joined ranks and a flood of silent connections together
 *                  never push rank 0 into EMFILE.
 * SPDX-License-Identifier: MIT
 */
#include "rendezvous_job.h"

#include <ifaddrs.h>
#include <sys/stat.h>

#define SECRET "job-secret-A-0123456789abcdef"
#define KEY    11

static char log_path[2][64];

static size_t read_log(int i, char *buf, size_t cap)
{
    FILE  *f = fopen(log_path[i], "r");
    size_t n = (f != NULL) ? fread(buf, 1, cap - 1, f) : 0;

    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    return n;
}

static int count_of(const char *hay, const char *needle)
{
    int n = 0;

    for (; (hay = strstr(hay, needle)) != NULL; hay += strlen(needle)) {
        ++n;
    }
    return n;
}

/* Up to len bytes within `ms` of quiet; *closed at EOF or a reset. */
static int read_some(int fd, void *buf, size_t len, int ms, int *closed)
{
    struct pollfd p   = {.fd = fd, .events = POLLIN};
    size_t        got = 0;
    ssize_t       n;

    *closed = 0;
    while (got < len && poll(&p, 1, ms) == 1) {
        n = read(fd, (char *)buf + got, len - got);
        if (n <= 0) {
            *closed = n == 0 || errno == ECONNRESET;
            break;
        }
        got += (size_t)n;
    }
    return (int)got;
}

/* A non-blocking connection to the job's port; -1 when none could start. */
static int connect_start(void)
{
    struct sockaddr_in a  = {.sin_family = AF_INET};
    int                fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port        = htons((uint16_t)port);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static int connected_within(int fd, int ms)
{
    struct pollfd p   = {.fd = fd, .events = POLLOUT};
    int           err = 0;
    socklen_t     len = sizeof(err);

    return poll(&p, 1, ms) == 1 &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
}

static void accept_queue(void)
{
    rank_spec_t one = {1, 2, KEY, NULL, 0, NULL, 0};
    int         lfd, fds[64], n = 0, full = 0, wst;
    double      t0, took;
    pid_t       pid;
    char        where[64];

    lfd = hold_port(&port);
    CHECK(lfd >= 0 && listen(lfd, 0) == 0, "no listener to fill");
    /* Connections nobody accepts, until one does not get through. */
    while (n < 64 && !full) {
        fds[n] = connect_start();
        full   = fds[n] >= 0 && !connected_within(fds[n], 200);
        n += fds[n] >= 0;
    }
    CHECK(full, "the accept queue never filled in %d connections", n);
    job_timeout    = 2.0;
    res->status[1] = -1;
    t0             = sl_time_now();
    if ((pid = fork()) == 0) {
        run_rank(1, one);
    }
    waitpid(pid, &wst, 0);
    took = sl_time_now() - t0;
    CHECK(WIFEXITED(wst), "the rank was killed by signal %d (still in connect "
          "at its alarm?)", WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
    snprintf(where, sizeof(where), "127.0.0.1:%d", port);
    CHECK(res->status[1] == STAGELINK_ERR_TIMEOUT ||
              res->status[1] == STAGELINK_ERR_BOOTSTRAP,
          "the rank ended with status %d: %s", res->status[1], res->msg[1]);
    CHECK(strstr(res->msg[1], where) != NULL, "its sentence does not name "
          "%s: %s", where, res->msg[1]);
    CHECK(took < 3.0, "the rank took %.2f s against a 2 s deadline", took);
    printf("accept queue full: the rank ended in %.2f s: %s\n", took,
           res->msg[1]);
    while (n-- > 0) {
        close(fds[n]);
    }
    close(lfd);
}

/*
 * Every handshake slot of a world of two (17) held at the proof by
 * strangers that know the job key and the fingerprint (both on the wire);
 * then, with rank 0 stopped, a real rank's hello arrives and another
 * stranger's right behind it.  Rank 0 goes on: it takes the real rank,
 * reads its hello, then takes the stranger and evicts the cheapest slot.
 * A hello read in two steps leaves the real rank half-read and so the
 * cheapest; read in one, it is challenged and an old stranger goes.
 */
static int hello_real, strangers_fds[17], behind;

static void hellos_then_real(void)
{
    sl_boot_hello_t hello;
    sl_auth_t       auth;
    int             i, challenged = 0;

    sl_auth_set(&auth, SECRET, strlen(SECRET), "test", KEY, NULL);
    memset(&hello, 0, sizeof(hello));
    hello.mode = SL_AUTH_HMAC;
    memcpy(hello.fingerprint, auth.fingerprint, SL_AUTH_FP_LEN);
    for (i = 0; i < 17; ++i) {
        sl_boot_challenge_t ch;

        if ((strangers_fds[i] = connect_local()) >= 0) {
            send_hello(strangers_fds[i], 1, 2, KEY, sizeof(hello), &hello);
            challenged += read(strangers_fds[i], &ch, sizeof(ch)) ==
                          (ssize_t)sizeof(ch);
        }
    }
    CHECK(challenged == 17, "%d of 17 strangers were challenged", challenged);
    kill(res->root_pid, SIGSTOP);
    sl_auth_random(hello.nonce, sizeof(hello.nonce), NULL);
    hello_real = connect_local();
    send_hello(hello_real, 1, 2, KEY, sizeof(hello), &hello);
    behind = connect_local();
    send_hello(behind, 1, 2, KEY, sizeof(hello), &hello);
    kill(res->root_pid, SIGCONT);
    {
        sl_boot_challenge_t ch;
        int                 closed;
        int                 n = read_some(hello_real, &ch, sizeof(ch), 2000,
                                          &closed);

        CHECK(n == (int)sizeof(ch) && ch.verdict == SL_BOOT_ADMIT,
              "the real rank's hello got %d bytes of a challenge%s: it was "
              "evicted as the cheapest slot", n, closed ? " and was closed" : "");
        printf("a real rank's hello among 17 strangers at the proof: %s\n",
               n == (int)sizeof(ch) ? "challenged" : "evicted");
    }
    close(hello_real);
}

static void hello_flood(void)
{
    rank_spec_t job[1] = {{0, 2, KEY, SECRET, 0, NULL, 0}};
    int         i;

    run_job(job, 1, hellos_then_real);
    for (i = 0; i < 17; ++i) {
        close(strangers_fds[i]);
    }
    close(behind);
}

/* Posing as rank 0 for `secs`: every hello gets a refusal ("the job
 * secrets differ", with a made-up fingerprint), as a proxy could forge. */
static int forge_refusals(int lfd, double secs)
{
    sl_boot_challenge_t ch = {.magic = SL_BOOT_MAGIC,
                              .verdict = SL_BOOT_WRONG_SECRET,
                              .mode = SL_AUTH_HMAC,
                              .version = SL_BOOT_VERSION};
    struct pollfd       p = {.fd = lfd, .events = POLLIN};
    double              end = sl_time_now() + secs;
    char                buf[sizeof(sl_boot_hdr_t) + sizeof(sl_boot_hello_t)];
    int                 fd, forged = 0;

    memset(ch.fingerprint, 0x5a, sizeof(ch.fingerprint));
    while (sl_time_now() < end && poll(&p, 1, 50) >= 0) {
        if (!(p.revents & POLLIN) || (fd = accept(lfd, NULL, NULL)) < 0) {
            continue;
        }
        if (read(fd, buf, sizeof(buf)) > 0 &&
            write(fd, &ch, sizeof(ch)) == (ssize_t)sizeof(ch)) {
            ++forged;
        }
        close(fd);
    }
    return forged;
}

static void forged_refusal(void)
{
    rank_spec_t job[2] = {{0, 2, KEY, SECRET, 0, NULL, 0},
                          {1, 2, KEY, SECRET, 0, log_path[1], 0}};
    pid_t       pid[2];
    int         lfd, forged, wst, i;
    char        log[8192];

    lfd = hold_port(&port);
    CHECK(lfd >= 0 && listen(lfd, 16) == 0, "no listener to pose as rank 0");
    res->status[0] = res->status[1] = -1;
    if ((pid[1] = fork()) == 0) {
        close(lfd); /* else the posing listener lives on in this rank */
        run_rank(1, job[1]);
    }
    forged = forge_refusals(lfd, 0.5);
    close(lfd); /* the real rank 0 takes the port */
    if ((pid[0] = fork()) == 0) {
        run_rank(0, job[0]);
    }
    for (i = 0; i < 2; ++i) {
        waitpid(pid[i], &wst, 0);
        CHECK(WIFEXITED(wst), "rank %d was killed by signal %d", i,
              WIFSIGNALED(wst) ? WTERMSIG(wst) : 0);
    }
    CHECK(forged > 0, "no refusal was forged: it tested nothing");
    CHECK(res->status[1] == STAGELINK_SUCCESS,
          "rank 1 gave up on %d forged refusals: %s", forged, res->msg[1]);
    CHECK(res->status[0] == STAGELINK_SUCCESS, "rank 0: %s", res->msg[0]);
    read_log(1, log, sizeof(log));
    CHECK(strstr(log, "the job secrets differ") != NULL &&
              strstr(log, "nothing proves that rank 0 sent this answer"),
          "rank 1 did not warn of the unproven refusal: %s", log);
    printf("forged refusals: %d, then rank 1 joined the real rank 0\n", forged);
}

/* sl_auth_load in a child with an alarm: a blocking open shows as a
 * signal.  Returns the child's status word; its sentence in res->msg[0]. */
static int load_secret(const char *path)
{
    pid_t pid;
    int   wst;

    res->msg[0][0] = '\0';
    if ((pid = fork()) == 0) {
        sl_auth_t   auth;
        sl_errbuf_t eb = {{0}};

        alarm(5);
        unsetenv("STAGELINK_JOB_SECRET");
        setenv("STAGELINK_JOB_SECRET_FILE", path, 1);
        res->status[0] = sl_auth_load(&auth, KEY, &eb);
        snprintf(res->msg[0], sizeof(res->msg[0]), "%s", eb.msg);
        _exit(0);
    }
    waitpid(pid, &wst, 0);
    return wst;
}

static void secret_file(void)
{
    char   dir[] = "/tmp/sl-secret-XXXXXX", path[96];
    double t0;
    int    fd, wst;

    CHECK(mkdtemp(dir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof(path), "%s/fifo", dir);
    CHECK(mkfifo(path, 0600) == 0, "mkfifo: %s", strerror(errno));
    t0  = sl_time_now();
    wst = load_secret(path);
    CHECK(WIFEXITED(wst) && sl_time_now() - t0 < 1.0,
          "a FIFO as the secret file blocked (status %#x after %.1f s)", wst,
          sl_time_now() - t0);
    CHECK(res->status[0] == STAGELINK_ERR_CONFIG &&
              strstr(res->msg[0], "is not a regular file"),
          "a FIFO: %s", res->msg[0]);
    unlink(path);

    snprintf(path, sizeof(path), "%s/theirs", dir);
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    CHECK(fd >= 0 && write(fd, SECRET, strlen(SECRET)) > 0, "cannot write %s",
          path);
    close(fd);
    if (geteuid() == 0 && chown(path, 65534, 65534) == 0) {
        wst = load_secret(path);
        CHECK(WIFEXITED(wst) && res->status[0] == STAGELINK_ERR_CONFIG &&
                  strstr(res->msg[0], "belongs to uid 65534"),
              "another user's file: %s", res->msg[0]);
        CHECK(chown(path, 0, 0) == 0, "chown back: %s", strerror(errno));
    } else {
        printf("not root: another user's file left unchecked\n");
    }
    wst = load_secret(path);
    CHECK(WIFEXITED(wst) && res->status[0] == STAGELINK_SUCCESS,
          "this user's own file: %s", res->msg[0]);
    unlink(path);
    rmdir(dir);
}

/* 4,000 connections that send a foreign header and close (with a reset:
 * no TIME_WAIT left behind to use up the ports of later runs). */
static void garbage(void)
{
    struct linger now = {1, 0};
    char          junk[sizeof(sl_boot_hdr_t)];
    int           i, fd;

    memset(junk, 0x7f, sizeof(junk));
    for (i = 0; i < 4000; ++i) {
        if ((fd = connect_local()) >= 0) {
            (void)!write(fd, junk, sizeof(junk));
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &now, sizeof(now));
            close(fd);
        }
    }
}

static void drop_warnings(void)
{
    rank_spec_t job[2] = {{0, 2, KEY, NULL, 0, log_path[0], 0},
                          {1, 2, KEY, NULL, 0, NULL, 0}};
    static char log[1 << 20];
    size_t      n;

    run_job(job, 2, garbage);
    CHECK(res->status[0] == STAGELINK_SUCCESS &&
              res->status[1] == STAGELINK_SUCCESS,
          "rank 0: %s; rank 1: %s", res->msg[0], res->msg[1]);
    n = read_log(0, log, sizeof(log));
    CHECK(count_of(log, "dropped rendezvous client") >= 1,
          "rank 0 said no drop at all");
    CHECK(n < 16384, "4,000 drops wrote %zu bytes to rank 0's stderr", n);
    printf("4000 dropped strangers: %zu bytes of warnings, %d lines with a "
           "count\n", n, count_of(log, "more rendezvous clients"));
}

/* A local address that is not loopback, or NULL. */
static const char *outside_address(void)
{
    static char     addr[INET_ADDRSTRLEN];
    struct ifaddrs *ifs, *i;

    if (getifaddrs(&ifs) != 0) {
        return NULL;
    }
    addr[0] = '\0';
    for (i = ifs; i != NULL && addr[0] == '\0'; i = i->ifa_next) {
        if (i->ifa_addr != NULL && i->ifa_addr->sa_family == AF_INET) {
            const struct sockaddr_in *a = (const void *)i->ifa_addr;

            if ((ntohl(a->sin_addr.s_addr) >> 24) != 127) {
                inet_ntop(AF_INET, &a->sin_addr, addr, sizeof(addr));
            }
        }
    }
    freeifaddrs(ifs);
    return addr[0] ? addr : NULL;
}

static void unauth_warning(void)
{
    rank_spec_t job[2] = {{0, 2, KEY, NULL, 0, log_path[0], 0},
                          {1, 2, KEY, NULL, 0, log_path[1], 0}};
    const char *outside = outside_address();
    const char *warn    = "runs unauthenticated across nodes";
    char        log[8192];
    int         i;

    run_job(job, 2, NULL);
    for (i = 0; i < 2; ++i) {
        read_log(i, log, sizeof(log));
        CHECK(res->status[i] == STAGELINK_SUCCESS && !strstr(log, warn),
              "on loopback, rank %d warned or failed (%s): %s", i,
              res->msg[i], log);
    }
    if (outside == NULL) {
        printf("no address but loopback here: the warning left unchecked\n");
        return;
    }
    job_addr = outside;
    run_job(job, 2, NULL);
    for (i = 0; i < 2; ++i) {
        read_log(i, log, sizeof(log));
        CHECK(res->status[i] == STAGELINK_SUCCESS &&
                  count_of(log, warn) == 1,
              "on %s, rank %d said \"%s\" %d times (%s): %s", outside, i, warn,
              count_of(log, warn), res->msg[i], log);
    }
    printf("unauthenticated on %s: one warning a rank\n", outside);
}

/* Ranks 1..WORLD-2 joined by hand (hellos without a secret, admitted and
 * held), then 400 silent connections held; the last real rank comes after. */
#define FD_WORLD 200
static int joined_fds[FD_WORLD], silent_fds[400];

static void join_and_flood(void)
{
    sl_boot_hello_t     hello;
    sl_boot_challenge_t ch;
    int                 r, i, admitted = 0;

    memset(&hello, 0, sizeof(hello));
    hello.mode = SL_AUTH_NONE;
    for (r = 1; r < FD_WORLD - 1; ++r) {
        joined_fds[r] = connect_local();
        if (joined_fds[r] >= 0) {
            send_hello(joined_fds[r], (uint32_t)r, FD_WORLD, KEY,
                       sizeof(hello), &hello);
            admitted += read(joined_fds[r], &ch, sizeof(ch)) ==
                            (ssize_t)sizeof(ch) && ch.verdict == SL_BOOT_ADMIT;
        }
    }
    CHECK(admitted == FD_WORLD - 2, "%d of %d hand-made ranks were admitted",
          admitted, FD_WORLD - 2);
    for (i = 0; i < 400; ++i) {
        silent_fds[i] = connect_start();
    }
}

static void fd_limit(void)
{
    rank_spec_t job[2] = {{0, FD_WORLD, KEY, NULL, 0, log_path[0], 0},
                          {FD_WORLD - 1, FD_WORLD, KEY, NULL, 0, NULL, 0}};
    char        log[65536];
    int         i;

    /* Room for the joined ranks and a reserve, not for every slot too. */
    job[0].nofile = 420;
    run_job(job, 2, join_and_flood);
    read_log(0, log, sizeof(log));
    CHECK(strstr(log, "Too many open files") == NULL,
          "rank 0 ran out of descriptors: %s", log);
    /* The hand-made ranks never exchange: rank 0 fails after the
     * rendezvous, never for a rank that did not get in. */
    CHECK(strstr(res->msg[0], "reached the rendezvous") == NULL,
          "rank 0 did not admit every rank: %s", res->msg[0]);
    printf("%d ranks and 400 silent connections under a 420-descriptor "
           "limit: rank 0 said: %s\n", FD_WORLD, res->msg[0]);
    for (i = 1; i < FD_WORLD - 1; ++i) {
        close(joined_fds[i]);
    }
    for (i = 0; i < 400; ++i) {
        close(silent_fds[i]);
    }
}

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"accept-queue", accept_queue},
                 {"hello-flood", hello_flood},
                 {"forged-refusal", forged_refusal},
                 {"secret-file", secret_file},
                 {"drop-warnings", drop_warnings},
                 {"unauth-warning", unauth_warning},
                 {"fd-limit", fd_limit}};
    size_t i;

    setenv("STAGELINK_DEBUG", "WARN", 1);
    if (argc != 2 || job_setup() != 0) {
        fprintf(stderr, "usage: test_rendezvous_hardening CASE\n");
        return 2;
    }
    for (i = 0; i < 2; ++i) {
        snprintf(log_path[i], sizeof(log_path[i]), "/tmp/sl-hard-%d-%zu.log",
                 (int)getpid(), i);
    }
    for (i = 0; i < SL_ARRAY_SIZE(cases); ++i) {
        if (strcmp(argv[1], cases[i].name) == 0) {
            cases[i].fn();
            break;
        }
    }
    if (i == SL_ARRAY_SIZE(cases)) {
        fprintf(stderr, "no case %s\n", argv[1]);
        return 2;
    }
    for (i = 0; i < 2 && getenv("KEEP_LOG") == NULL; ++i) {
        unlink(log_path[i]);
    }
    return check_summary();
}
