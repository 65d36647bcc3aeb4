/*
 * stagelink_run: starts the ranks of one node the way torchrun does (RANK,
 * WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), waits
 * for them with a deadline, and ends all of them when one fails, so a test
 * never hangs.  Several invocations (one per simulated node) make one job
 * with -o/-w.  Starting the whole job, it gives the ranks a fresh job
 * secret unless one is set (STAGELINK_JOB_SECRET or _FILE); part of a job
 * cannot, as every node must hold the same.  SPDX-License-Identifier: MIT
 */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SL_RUN_SKIP 77

static void usage(void)
{
    fprintf(stderr,
            "usage: stagelink_run -n LOCAL_RANKS [-o FIRST_RANK] [-w WORLD] "
            "[-T SECONDS] [-U] -- PROGRAM [ARGS...]\n"
            "       stagelink_run -P\n"
            "  Starts LOCAL_RANKS processes with ranks FIRST_RANK.. of WORLD\n"
            "  (default: this node is the whole job). MASTER_ADDR defaults to\n"
            "  127.0.0.1 and MASTER_PORT to a free port; -T (default 300)\n"
            "  kills every rank when the job runs longer. Without\n"
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

static void sl_run_kill_all(const pid_t *pids, int n)
{
    int i;

    for (i = 0; i < n; ++i) {
        if (pids[i] > 0) {
            kill(pids[i], SIGKILL);
        }
    }
}

int main(int argc, char **argv)
{
    int    nlocal = 0, first = 0, world = -1, opt, i, left, failed = 0;
    int    skipped = 0, unauthenticated = 0, print_port = 0;
    double timeout = 300;
    pid_t *pids;
    time_t start;

    while ((opt = getopt(argc, argv, "n:o:w:T:UPh")) != -1) {
        switch (opt) {
        case 'n': nlocal  = atoi(optarg); break;
        case 'o': first   = atoi(optarg); break;
        case 'w': world   = atoi(optarg); break;
        case 'T': timeout = atof(optarg); break;
        case 'U': unauthenticated = 1; break;
        case 'P': print_port = 1; break;
        default: usage(); return (opt == 'h') ? 0 : 2;
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
    if (nlocal < 1 || optind >= argc || first < 0 || first + nlocal > world) {
        usage();
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

    pids = calloc((size_t)nlocal, sizeof(*pids));
    if (pids == NULL) {
        return 1;
    }
    for (i = 0; i < nlocal; ++i) {
        pids[i] = fork();
        if (pids[i] < 0) {
            perror("stagelink_run: fork");
            sl_run_kill_all(pids, i);
            return 1;
        }
        if (pids[i] == 0) {
            sl_run_setenv_int("RANK", first + i);
            sl_run_setenv_int("LOCAL_RANK", i);
            execvp(argv[optind], &argv[optind]);
            fprintf(stderr, "stagelink_run: cannot run %s: %s\n",
                    argv[optind], strerror(errno));
            _exit(127);
        }
    }

    start = time(NULL);
    left  = nlocal;
    while (left > 0) {
        int   status;
        pid_t pid = waitpid(-1, &status, WNOHANG);

        if (pid < 0) {
            break;
        }
        if (pid == 0) {
            if (difftime(time(NULL), start) > timeout) {
                fprintf(stderr, "stagelink_run: ranks still running after "
                        "%.0f s; killing them\n", timeout);
                sl_run_kill_all(pids, nlocal);
                failed = 1;
            }
            usleep(20000);
            continue;
        }
        for (i = 0; i < nlocal; ++i) {
            if (pids[i] == pid) {
                pids[i] = 0;
                --left;
                if (WIFEXITED(status) && WEXITSTATUS(status) == SL_RUN_SKIP) {
                    ++skipped;
                } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                    if (!failed) {
                        fprintf(stderr, "stagelink_run: rank %d %s %d; "
                                "ending the others\n", first + i,
                                WIFEXITED(status) ? "exited with" : "killed by signal",
                                WIFEXITED(status) ? WEXITSTATUS(status)
                                                  : WTERMSIG(status));
                    }
                    failed = 1;
                    sl_run_kill_all(pids, nlocal);
                }
            }
        }
    }
    free(pids);
    if (failed) {
        return 1;
    }
    return (skipped == nlocal) ? SL_RUN_SKIP : 0;
}
