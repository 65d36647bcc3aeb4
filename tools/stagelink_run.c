/*
 * stagelink_run: starts the ranks of one node the way torchrun does (RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits
 * for them, and ends all of them when one fails, as srun and torchrun do
 * (SIGTERM, then SIGKILL after a grace), so a test never hangs.  Several
 * invocations (one per simulated node) make one job with -o/-w.  Starting the whole job, it gives the ranks a fresh job
 * secret unless one is set (STAGELINK_JOB_SECRET or _FILE); part of a job
 * cannot, as every node must hold the same.  SPDX-License-Identifier: MIT
 */
#include <errno.h>
#include <fcntl.h>
#include "tool_opts.h"

#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SL_RUN_SKIP      77
#define SL_RUN_MAX_RANKS 1024 /* one node's ranks */

static void usage(FILE *to)
{
    fprintf(to,
            "usage: stagelink_run -n LOCAL_RANKS [-o FIRST_RANK] [-w WORLD] "
            "[-T SECONDS] [-G SECONDS] [-l] [-U] -- PROGRAM [ARGS...]\n"
            "       stagelink_run -P\n"
            "  Starts LOCAL_RANKS processes with ranks FIRST_RANK.. of WORLD\n"
            "  (default: this node is the whole job). For a whole job on this\n"
            "  node MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT to a\n"
            "  free port; a part of one (-w past -n) needs both set alike on\n"
            "  every node. When a rank fails,\n"
            "  the job passes -T SECONDS (default 0: no deadline of its own)\n"
            "  or stagelink_run gets SIGINT, SIGTERM, SIGHUP or SIGQUIT, the\n"
            "  other ranks get SIGTERM (a signal received is forwarded as it\n"
            "  is), then SIGKILL after -G SECONDS (default 10); it exits with\n"
            "  the first failing rank's code (128 + N for signal N; 124 at\n"
            "  the deadline). No rank, nor a process a rank started, outlives\n"
            "  it. -l prefixes each line of a rank's output with\n"
            "  \"RANK: \", as srun --label does. Without\n"
            "  STAGELINK_JOB_SECRET(_FILE), the whole job on one node gets a\n"
            "  fresh random secret (-U: none made: unauthenticated); for several\n"
            "  nodes set one on all. -P prints the port it would choose (for\n"
            "  a job started otherwise) and exits.\n");
}

/* Binds `port` on every address and lets go: 0 when it is free now. */
static int sl_run_port_free(int port)
{
    struct sockaddr_in addr;
    int                fd = socket(AF_INET, SOCK_STREAM, 0);
    int                rc;

    if (fd < 0) {
        return -1;
    }
    memset(&addr, 0, sizeof(addr));
    addr.sin_family      = AF_INET;
    addr.sin_port        = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    rc = bind(fd, (struct sockaddr *)&addr, sizeof(addr));
    close(fd);
    return rc;
}

/* A port for rank 0's listener, free now and below the kernel's ephemeral
 * range: one from that range (bind to 0) may go to any process's next
 * outgoing connection (gloo opens hundreds) before rank 0 binds it.  Only
 * another launcher drawing the same port can still race. */
static int sl_run_free_port(void)
{
    enum { SL_RUN_PORT_MIN = 10000, SL_RUN_PORT_TRIES = 64 };
    unsigned int draw[SL_RUN_PORT_TRIES];
    int          lo = 32768, i;
    FILE        *range = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");

    if (range != NULL) {
        if (fscanf(range, "%d", &lo) != 1) {
            lo = 32768;
        }
        fclose(range);
    }
    if (lo - 1 <= SL_RUN_PORT_MIN) {
        fprintf(stderr, "stagelink_run: the ephemeral range starts at %d "
                "(/proc/sys/net/ipv4/ip_local_port_range), leaving no port "
                "from %d below it; set MASTER_PORT\n", lo, SL_RUN_PORT_MIN);
        return -1;
    }
    if (getrandom(draw, sizeof(draw), 0) != (ssize_t)sizeof(draw)) {
        fprintf(stderr, "stagelink_run: getrandom for a port: %s\n",
                strerror(errno));
        return -1;
    }
    for (i = 0; i < SL_RUN_PORT_TRIES; ++i) {
        int port = SL_RUN_PORT_MIN +
                   (int)(draw[i] % (unsigned int)(lo - SL_RUN_PORT_MIN));

        if (sl_run_port_free(port) == 0) {
            return port;
        }
    }
    fprintf(stderr, "stagelink_run: no free port in %d..%d, below the "
            "ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), in "
            "%d tries; set MASTER_PORT\n", SL_RUN_PORT_MIN, lo - 1,
            SL_RUN_PORT_TRIES);
    return -1;
}

static void sl_run_setenv_int(const char *name, int value)
{
    char text[16];

    snprintf(text, sizeof(text), "%d", value);
    setenv(name, text, 1);
}

/* 32 random bytes as hex for the ranks' rendezvous, unless a secret is
 * set; part of a job is told it runs unauthenticated. */
static int sl_run_secret(int nlocal, int world, int unauthenticated)
{
    unsigned char raw[32];
    char          text[2 * sizeof(raw) + 1];
    size_t        i;

    if (getenv("STAGELINK_JOB_SECRET") != NULL ||
        getenv("STAGELINK_JOB_SECRET_FILE") != NULL || unauthenticated) {
        return 0;
    }
    if (nlocal < world) {
        fprintf(stderr, "stagelink_run: %d of %d ranks here and no "
                "STAGELINK_JOB_SECRET: the rendezvous is unauthenticated; "
                "export the same secret on every node\n", nlocal, world);
        return 0;
    }
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        fprintf(stderr, "stagelink_run: getrandom for the job secret: %s\n",
                strerror(errno));
        return -1;
    }
    for (i = 0; i < sizeof(raw); ++i) {
        snprintf(text + 2 * i, 3, "%02x", raw[i]);
    }
    setenv("STAGELINK_JOB_SECRET", text, 1);
    return 0;
}

/* The ranks of this node, and what the supervisor knows of them. */
typedef struct sl_run {
    int    nlocal, first;
    pid_t *pids;       /**< 0 once reaped */
    pid_t *pgids;      /**< each rank's process group, kept after its end */
    int    left;       /**< ranks not reaped */
    int    children;   /**< 0 once no process of the job is left to reap */
    int    code;       /**< exit code of the first failure, 0 while none */
    int    skipped;    /**< ranks that exited 77 */
    int    label;      /**< -l: each output line prefixed with its rank */
    int   *out;        /**< with -l: 2 pipes a rank (stdout, stderr), -1 at EOF */
    char **line;       /**< with -l: a partial line per pipe */
    size_t *line_len;
} sl_run_t;

/* A signal to every rank's process group (each rank leads its own, and
 * the group lives on in a rank's children after the rank), so a rank's own
 * children go with it.  SIGKILL also goes to every process reparented to
 * the launcher (a subreaper), such as one that left its rank's group. */
static void sl_run_signal_all(const sl_run_t *run, int sig)
{
    char  path[64];
    FILE *f;
    long  pid;
    int   i;

    for (i = 0; i < run->nlocal; ++i) {
        if (run->pgids[i] > 0) {
            kill(-run->pgids[i], sig);
        }
    }
    if (sig != SIGKILL) {
        return;
    }
    snprintf(path, sizeof(path), "/proc/self/task/%ld/children", (long)getpid());
    f = fopen(path, "r");
    while (f != NULL && fscanf(f, "%ld", &pid) == 1) {
        kill((pid_t)pid, SIGKILL);
    }
    if (f != NULL) {
        fclose(f);
    }
}

static int sl_run_parse_int(const char *text, int min, const char *what,
                            int *value)
{
    char *end;
    long  v;

    errno = 0;
    v     = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > INT_MAX) {
        fprintf(stderr, "stagelink_run: %s \"%s\" is not an integer of at "
                "least %d\n", what, text, min);
        return -1;
    }
    *value = (int)v;
    return 0;
}

static int sl_run_parse_seconds(const char *text, const char *what,
                                double *value)
{
    char  *end;
    double v;

    errno = 0;
    v     = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(v >= 0) || isinf(v)) {
        fprintf(stderr, "stagelink_run: %s \"%s\" is not a number of seconds "
                "(0: none)\n", what, text);
        return -1;
    }
    *value = v;
    return 0;
}

static double sl_run_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Writes complete lines of pipe k with the rank's label; at EOF the rest. */
static void sl_run_label(sl_run_t *run, int k, const char *buf, size_t n)
{
    FILE  *to   = (k % 2 == 0) ? stdout : stderr;
    char **line = &run->line[k];
    size_t i, start = 0;

    for (i = 0; i <= n; ++i) {
        int eof = (n == 0 && i == 0);

        if (i < n && buf[i] != '\n') {
            continue;
        }
        if (i == n && !eof) {
            /* keep the partial line for the next read */
            char *grown = realloc(*line, run->line_len[k] + (n - start) + 1);

            if (grown != NULL) {
                memcpy(grown + run->line_len[k], buf + start, n - start);
                *line = grown;
                run->line_len[k] += n - start;
            }
            break;
        }
        if (eof && run->line_len[k] == 0) {
            break;
        }
        fprintf(to, "%d: %.*s%.*s\n", run->first + k / 2,
                (int)run->line_len[k], *line ? *line : "",
                (int)(i - start), buf + start);
        run->line_len[k] = 0;
        start            = i + 1;
        if (eof) {
            break;
        }
    }
    fflush(to);
}

static void sl_run_read(sl_run_t *run, int k)
{
    char    buf[4096];
    ssize_t n = read(run->out[k], buf, sizeof(buf));

    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        return;
    }
    if (n <= 0) {
        sl_run_label(run, k, buf, 0);
        close(run->out[k]);
        run->out[k] = -1;
        return;
    }
    sl_run_label(run, k, buf, (size_t)n);
}

/* Records a rank's end; the first failure's code becomes the exit code
 * (128 + the signal for a rank killed by one, as a shell reports it). */
static void sl_run_reaped(sl_run_t *run, pid_t pid, int status, int ending)
{
    int i;

    for (i = 0; i < run->nlocal; ++i) {
        if (run->pids[i] != pid) {
            continue;
        }
        run->pids[i] = 0;
        --run->left;
        if (WIFEXITED(status) && WEXITSTATUS(status) == SL_RUN_SKIP) {
            ++run->skipped;
        } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (run->code == 0 && !ending) {
                fprintf(stderr, "stagelink_run: rank %d %s %d; ending the "
                        "others\n", run->first + i,
                        WIFEXITED(status) ? "exited with" : "killed by signal",
                        WIFEXITED(status) ? WEXITSTATUS(status)
                                          : WTERMSIG(status));
                run->code = WIFEXITED(status) ? WEXITSTATUS(status)
                                              : 128 + WTERMSIG(status);
            }
        }
    }
}

static int sl_run_start(sl_run_t *run, char **argv, const sigset_t *mask)
{
    int i, fds[2][2];

    for (i = 0; i < run->nlocal; ++i) {
        if (run->label && (pipe2(fds[0], O_CLOEXEC) != 0 ||
                           pipe2(fds[1], O_CLOEXEC) != 0)) {
            perror("stagelink_run: pipe");
            return -1;
        }
        run->pids[i] = fork();
        if (run->pids[i] < 0) {
            perror("stagelink_run: fork");
            return -1;
        }
        if (run->pids[i] == 0) {
            setpgid(0, 0);
            /* No rank outlives a launcher killed outright. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            sigprocmask(SIG_SETMASK, mask, NULL);
            if (run->label) {
                dup2(fds[0][1], STDOUT_FILENO);
                dup2(fds[1][1], STDERR_FILENO);
            }
            sl_run_setenv_int("RANK", run->first + i);
            sl_run_setenv_int("LOCAL_RANK", i);
            execvp(argv[0], argv);
            fprintf(stderr, "stagelink_run: cannot run %s: %s\n", argv[0],
                    strerror(errno));
            _exit(127);
        }
        setpgid(run->pids[i], run->pids[i]);
        run->pgids[i] = run->pids[i];
        ++run->left;
        run->children = 1;
        if (run->label) {
            close(fds[0][1]);
            close(fds[1][1]);
            run->out[2 * i]     = fds[0][0];
            run->out[2 * i + 1] = fds[1][0];
        }
    }
    return 0;
}

/*
 * Waits for the ranks, blocked in poll on a signalfd (SIGCHLD, and the
 * signals it forwards) and the ranks' output pipes.  A failing rank, the
 * deadline or a signal to the launcher ends the others: SIGTERM (the
 * signal received is forwarded as it is), then SIGKILL after the grace,
 * repeated each second while a process is left.  Processes the ranks leave
 * behind when they end go the same way, and the launcher returns only once
 * it has reaped every one (it is their subreaper).
 */
static void sl_run_supervise(sl_run_t *run, int sfd, double timeout,
                             double grace)
{
    double deadline = timeout > 0 ? sl_run_now() + timeout : 0;
    double kill_at  = 0;
    int    ending   = 0, done, i, n, rc, status;
    pid_t  pid;

    for (;;) {
        struct pollfd pfd[1 + 2 * SL_RUN_MAX_RANKS];
        double        now = sl_run_now(), until = 0;
        int           ms;

        if (!ending && (run->code != 0 || (run->left == 0 && run->children) ||
                        (deadline > 0 && now >= deadline))) {
            if (run->left == 0) {
                fprintf(stderr, "stagelink_run: every rank ended, but "
                        "processes they started did not; ending them\n");
            } else if (run->code == 0) {
                fprintf(stderr, "stagelink_run: ranks still running after "
                        "%.0f s (-T); ending them\n", timeout);
                run->code = 124;
            }
            sl_run_signal_all(run, SIGTERM);
            ending  = 1;
            kill_at = now + grace;
        }
        if (ending && now >= kill_at) {
            sl_run_signal_all(run, SIGKILL);
            kill_at = now + 1;
        }
        until = ending ? kill_at : deadline;
        ms    = until > 0 ? (int)((until - now) * 1e3) + 1 : -1;
        pfd[0] = (struct pollfd){.fd = sfd, .events = POLLIN};
        for (i = 0, n = 1; run->label && i < 2 * run->nlocal; ++i) {
            if (run->out[i] >= 0) {
                pfd[n++] = (struct pollfd){.fd = run->out[i], .events = POLLIN};
            }
        }
        /* With no process left, what the pipes still hold is read, and a
         * pipe held open elsewhere is not waited for. */
        done = run->left == 0 && !run->children;
        rc   = poll(pfd, (nfds_t)n, done ? 0 : ms);
        if ((rc < 0 && errno != EINTR) || (rc == 0 && done)) {
            break;
        }
        for (i = 1; i < n; ++i) {
            if (pfd[i].revents != 0) {
                int k;

                for (k = 0; run->out[k] != pfd[i].fd; ++k) {
                }
                sl_run_read(run, k);
            }
        }
        if (pfd[0].revents & POLLIN) {
            struct signalfd_siginfo si;

            if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si) &&
                si.ssi_signo != SIGCHLD) {
                if (!ending) {
                    fprintf(stderr, "stagelink_run: %s: forwarding it to the "
                            "ranks\n", strsignal((int)si.ssi_signo));
                    run->code = 128 + (int)si.ssi_signo;
                    ending    = 1;
                    kill_at   = sl_run_now() + grace;
                }
                sl_run_signal_all(run, (int)si.ssi_signo);
            }
        }
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
            sl_run_reaped(run, pid, status, ending);
        }
        if (pid < 0 && errno == ECHILD) {
            run->children = 0;
        }
    }
}

int main(int argc, char **argv)
{
    int      nlocal = 0, first = 0, world = -1, opt, label = 0, i, sfd;
    int      unauthenticated = 0, print_port = 0;
    double   timeout = 0, grace = 10;
    sigset_t forward, old;
    sl_run_t run;

    while ((opt = getopt_long(argc, argv, "+n:o:w:T:G:lUPh", sl_tool_longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'n':
            if (sl_run_parse_int(optarg, 1, "-n", &nlocal) != 0) {
                return 2;
            }
            break;
        case 'o':
            if (sl_run_parse_int(optarg, 0, "-o", &first) != 0) {
                return 2;
            }
            break;
        case 'w':
            if (sl_run_parse_int(optarg, 1, "-w", &world) != 0) {
                return 2;
            }
            break;
        case 'T':
            if (sl_run_parse_seconds(optarg, "-T", &timeout) != 0) {
                return 2;
            }
            break;
        case 'G':
            if (sl_run_parse_seconds(optarg, "-G", &grace) != 0) {
                return 2;
            }
            break;
        case 'l': label = 1; break;
        case 'U': unauthenticated = 1; break;
        case 'P': print_port = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V': return sl_tool_version("stagelink_run");
        default: usage(stderr); return 2;
        }
    }
    if (world < 0) {
        world = nlocal;
    }
    if (print_port) {
        int port = sl_run_free_port();
        if (port < 0) {
            return 1;
        }
        printf("%d\n", port);
        return 0;
    }
    if (nlocal < 1 || nlocal > SL_RUN_MAX_RANKS || optind >= argc ||
        first + nlocal > world) {
        usage(stderr);
        return 2;
    }
    /* Invocations on several nodes meet only at one address and port that
     * each was given: a loopback address or a port drawn here would be
     * this node's alone. */
    if (nlocal < world &&
        (getenv("MASTER_ADDR") == NULL || getenv("MASTER_PORT") == NULL)) {
        fprintf(stderr, "stagelink_run: this invocation starts %d of %d ranks, "
                "so the others start elsewhere; export MASTER_ADDR (rank 0's "
                "node) and MASTER_PORT (a free port there: stagelink_run -P on it) "
                "alike for every invocation\n",
                nlocal, world);
        return 2;
    }
    if (getenv("MASTER_ADDR") == NULL) {
        setenv("MASTER_ADDR", "127.0.0.1", 1);
    }
    if (getenv("MASTER_PORT") == NULL) {
        int port = sl_run_free_port();
        if (port < 0) {
            return 1;
        }
        sl_run_setenv_int("MASTER_PORT", port);
    }
    if (sl_run_secret(nlocal, world, unauthenticated) != 0) {
        return 1;
    }
    sl_run_setenv_int("WORLD_SIZE", world);
    sl_run_setenv_int("LOCAL_WORLD_SIZE", nlocal);

    /* Blocked before the first fork, so no rank's end or signal is missed;
     * each rank gets the mask it had. */
    sigemptyset(&forward);
    sigaddset(&forward, SIGCHLD);
    sigaddset(&forward, SIGINT);
    sigaddset(&forward, SIGTERM);
    sigaddset(&forward, SIGHUP);
    sigaddset(&forward, SIGQUIT);
    sigprocmask(SIG_BLOCK, &forward, &old);
    /* What a rank leaves behind is reparented here, to be ended and reaped. */
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    sfd = signalfd(-1, &forward, SFD_CLOEXEC);
    memset(&run, 0, sizeof(run));
    run.nlocal   = nlocal;
    run.first    = first;
    run.label    = label;
    run.pids     = calloc((size_t)nlocal, sizeof(*run.pids));
    run.pgids    = calloc((size_t)nlocal, sizeof(*run.pgids));
    run.out      = malloc(2 * (size_t)nlocal * sizeof(*run.out));
    run.line     = calloc(2 * (size_t)nlocal, sizeof(*run.line));
    run.line_len = calloc(2 * (size_t)nlocal, sizeof(*run.line_len));
    if (sfd < 0 || run.pids == NULL || run.pgids == NULL || run.out == NULL ||
        run.line == NULL ||
        run.line_len == NULL) {
        perror("stagelink_run: setup");
        return 1;
    }
    for (i = 0; i < 2 * nlocal; ++i) {
        run.out[i] = -1;
    }
    if (sl_run_start(&run, &argv[optind], &old) != 0) {
        run.code = 1;
    }
    sl_run_supervise(&run, sfd, timeout, grace);
    for (i = 0; i < 2 * nlocal; ++i) {
        free(run.line[i]);
    }
    free(run.line);
    free(run.line_len);
    free(run.out);
    free(run.pids);
    free(run.pgids);
    if (run.code != 0) {
        return run.code;
    }
    return (run.skipped == nlocal) ? SL_RUN_SKIP : 0;
}
