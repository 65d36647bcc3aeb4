/*
 * Peers that die: real ranks (forked processes, the plugin loaded through
 * the public loader) where one rank is SIGKILLed before, during (a 64 MiB
 * message mid-rendezvous, either side) or after a transfer, the moment its
 * init returns while its peer posts at once (no UCX endpoint may still be
 * connecting then), or as its last small send completes (which must still
 * arrive), or where a watchdog thread aborts a communicator blocked in
 * wait.  Each survivor
 * must get an error (PEER_FAILED naming the dead rank where it talked to
 * it) within the deadline, then finalize within the deadline with the
 * descriptors it had before init.  Each error must come within 100 ms of
 * the death (or of the abort), the communicator-abort rule.
 *
 * Every scenario runs with both placements: all ranks on one node (the
 * dead process is seen through its pidfd) and each stage on its own node
 * by STAGELINK_NODE_ID (network transports, seen by UCX's PEER mode).
 * With PEER_KILL_NETNS="NS0 NS1" (and PEER_KILL_ADDR, node 0's address)
 * each stage's ranks run in their own network namespace instead: two
 * simulated nodes (test/netns/peer_kill.sh).
 *
 * Nothing here waits by sleeping: a survivor that must meet a dead peer
 * waits on the victim's pidfd, the watchdog on an eventfd its receiver
 * writes once the receive is posted, and the t = 2 victim on a pipe its
 * receivers write the moment its bytes start to land (seen through a
 * userfaultfd write-protecting the first page of their buffers).
 *   peer_kill [SCENARIO]   (all when none)
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "loopback.h"
#include "resources.h"
#include "sl_time.h"

#include <stagelink/loader.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEADLINE  2.0             /* STAGELINK_TIMEOUT of every rank */
#define FAIL_FAST 0.1             /* from a death (or abort) to each error */
#define BIG       (64u << 20)     /* rendezvous on every transport */
#define MAX_RANKS 4
#define LAST_WORDS_BYTES 4096     /* eager on every transport */

typedef enum when {
    BEFORE,        /* the victim dies right after init (survivors post
                      once it is dead, or at once: at-init) */
    DURING_SEND,   /* the sender dies after starting the rendezvous of
                      64 MiB (its request to send is out, no data moved) */
    DURING_RECV,   /* the receiver dies with 64 MiB posted, before it
                      answers the sender's request to send */
    AFTER,         /* one transfer completes, then the victim dies */
    LAST_WORDS,    /* the victim sends a small message to a posted
                      receive and dies as its send completes */
    ABORT,         /* nobody dies: a watchdog aborts a blocked wait */
    TP_DURING_SEND /* t = 2: a sender dies, its TP group must hear of it */
} when_t;

typedef struct rank_ctx rank_ctx_t;

typedef struct scenario {
    const char *name;
    when_t      when;
    int         world, tp, victim;
    /* What a rank does before the transfer that must fail (NULL: nothing);
     * nonzero: this rank makes no such transfer. */
    int       (*setup)(rank_ctx_t *c);
    int         await_death; /* survivors post once the death is seen */
} scenario_t;

/* What each rank reports, in memory shared with the parent. */
typedef struct rank_report {
    int    reached;      /* got past init */
    int    op_status;    /* the transfer that had to fail (or succeed) */
    double op_secs;      /* from its post to its error */
    double op_end;       /* when its error came (sl_time_now) */
    int    err_status;   /* comm_get_error afterwards */
    int    failed_rank;
    int    fin_status;
    double fin_secs;
    int    fds_before, fds_after;
    char   msg[1024];
} rank_report_t;

typedef struct shared {
    rank_report_t r[MAX_RANKS];
    pid_t         pid[MAX_RANKS]; /* each rank stores its own, first thing */
    atomic_int    posted;  /* survivors about to post their transfer */
    double        fault_at; /* when the victim's death could be seen (its
                               pidfd fired), or when the abort was made */
} shared_t;

typedef enum placement {
    ONE_NODE,  /* same node: pidfds */
    NODE_ID,   /* one node per stage by STAGELINK_NODE_ID: UCX PEER mode */
    NETNS      /* one network namespace per stage: a real link between */
} placement_t;

static const char *const placement_names[] = {"one node", "two nodes",
                                              "two netns"};

static shared_t *shm;

static int       flow_pipe[2]; /* receivers -> victim: its bytes landed */
static char      netns[2][64]; /* PEER_KILL_NETNS */
static char      netns_addr[64];

typedef struct watchdog {
    const stagelink_plugin_v1_t *sl;
    stagelink_comm_t            *comm;
    int                          posted; /* eventfd: the receive is posted */
} watchdog_t;

/* Aborts as soon as the receive is posted: its owner is then in wait, or
 * on its way there, and either way its wait must end ABORTED. */
static void *watchdog_main(void *arg)
{
    watchdog_t   *w = arg;
    struct pollfd p = {.fd = w->posted, .events = POLLIN};

    poll(&p, 1, (int)(DEADLINE * 1e3));
    shm->fault_at = sl_time_now();
    w->sl->comm_abort(w->comm);
    return NULL;
}

/* The victim's thread: dies the moment a survivor says its bytes landed
 * (or its main thread kills it at its deadline). */
static void *kill_when_flowing(void *arg)
{
    struct pollfd p = {.fd = flow_pipe[0], .events = POLLIN};

    (void)arg;
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    raise(SIGKILL);
    return NULL;
}

/*
 * A receiver's watch for the victim's first bytes, seen while the main
 * thread may be inside one long progress call: the first page of its
 * buffer (where the victim's shard lands, or its TP peer forwards it) is
 * write-protected through a userfaultfd.  The first write into it, by UCX
 * in this process or by the kernel on its behalf, stops on the fault; the
 * watching thread, blocked reading the userfaultfd, tells the victim (the
 * flow pipe) and lifts the protection, and the write goes on.
 */
typedef struct flow_watch {
    int       uffd, stop; /* stop: an eventfd, written once wait returned */
    uintptr_t page;
    size_t    len;
    pthread_t thread;
} flow_watch_t;

static void *watch_flow(void *arg)
{
    flow_watch_t              *w    = arg;
    struct pollfd              p[2] = {{.fd = w->uffd, .events = POLLIN},
                                       {.fd = w->stop, .events = POLLIN}};
    struct uffd_msg            msg;
    struct uffdio_writeprotect wp = {.range = {w->page, w->len}, .mode = 0};

    while (poll(p, 2, -1) < 0 && errno == EINTR) {
    }
    if ((p[0].revents & POLLIN) &&
        read(w->uffd, &msg, sizeof(msg)) == (ssize_t)sizeof(msg) &&
        msg.event == UFFD_EVENT_PAGEFAULT) {
        (void)!write(flow_pipe[1], "F", 1);
    }
    ioctl(w->uffd, UFFDIO_WRITEPROTECT, &wp); /* unprotects and wakes */
    return NULL;
}

static int flow_watch_start(flow_watch_t *w, void *buf, rank_report_t *me)
{
    struct uffdio_api          api = {.api      = UFFD_API,
                                      .features = UFFD_FEATURE_PAGEFAULT_FLAG_WP};
    struct uffdio_register     reg;
    struct uffdio_writeprotect wp;

    w->len  = (size_t)sysconf(_SC_PAGESIZE);
    w->page = (uintptr_t)buf & ~(uintptr_t)(w->len - 1);
    w->stop = eventfd(0, EFD_CLOEXEC);
    w->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    reg     = (struct uffdio_register){.range = {w->page, w->len},
                                       .mode  = UFFDIO_REGISTER_MODE_WP};
    wp      = (struct uffdio_writeprotect){.range = {w->page, w->len},
                                           .mode  = UFFDIO_WRITEPROTECT_MODE_WP};
    if (w->stop < 0 || w->uffd < 0 || ioctl(w->uffd, UFFDIO_API, &api) != 0 ||
        ioctl(w->uffd, UFFDIO_REGISTER, &reg) != 0 ||
        ioctl(w->uffd, UFFDIO_WRITEPROTECT, &wp) != 0) {
        snprintf(me->msg, sizeof(me->msg), "cannot watch for the victim's "
                 "bytes: userfaultfd write-protect: %s (needs Linux >= 5.7 "
                 "and root or CAP_SYS_PTRACE)", strerror(errno));
        return -1;
    }
    return pthread_create(&w->thread, NULL, watch_flow, w);
}

static void flow_watch_stop(flow_watch_t *w)
{
    struct uffdio_range range = {w->page, w->len};

    eventfd_write(w->stop, 1);
    pthread_join(w->thread, NULL);
    ioctl(w->uffd, UFFDIO_UNREGISTER, &range);
    close(w->uffd);
    close(w->stop);
}

/* One rank of a scenario, between its steps. */
struct rank_ctx {
    const scenario_t            *sc;
    placement_t                  where;
    int                          rank, sender;
    rank_report_t               *me;
    const stagelink_plugin_v1_t *sl;
    stagelink_comm_t            *comm;
    unsigned char               *buf;
    stagelink_xfer_t             x;        /* the transfer that must fail */
    watchdog_t                   dog;      /* ABORT's receiver */
    pthread_t                    dog_thread;
    int                          dog_on, watching;
    flow_watch_t                 watch;    /* TP_DURING_SEND's receivers */
};

/*
 * The victim's side of a transfer goes as far as the scenario says, then
 * it dies.  It never progresses after the survivors post, so whatever they
 * wait for really needs the dead process (a CMA read of a sender's memory
 * needs no progress of it: that sender dies before the receiver posts).
 */
static void die_mid_transfer(const scenario_t *sc, placement_t where,
                             const stagelink_plugin_v1_t *sl,
                             stagelink_comm_t *comm, stagelink_request_t *req)
{
    double until     = sl_time_now() + DEADLINE;
    int    survivors = sc->world - 1, done = 0, i;

    if (sc->when == DURING_SEND) {
        for (i = 0; i < 20 && !done; ++i) { /* the request to send goes out */
            sl->test(comm, req, &done);
        }
        raise(SIGKILL);
    }
    if (sc->when == TP_DURING_SEND && where == ONE_NODE) {
        /* It dies between its calls into UCX, never in the middle of
         * writing into a survivor's shared-memory FIFO (which would wedge
         * that FIFO: see docs/reliability.md). */
        struct pollfd   p    = {.fd = flow_pipe[0], .events = POLLIN};
        struct timespec step = {0, 50000}; /* between progress calls */

        while (sl_time_now() < until && !done) {
            sl->test(comm, req, &done);
            if (ppoll(&p, 1, &step, NULL) == 1) {
                break; /* a receiver saw its bytes */
            }
        }
        raise(SIGKILL);
    }
    if (sc->when == TP_DURING_SEND) {
        /* Over the network chunks move only while it progresses: it dies
         * the moment a receiver saw its first bytes, from a thread, since
         * one progress call may move many chunks. */
        pthread_t killer;

        pthread_create(&killer, NULL, kill_when_flowing, NULL);
    }
    /* DURING_RECV: dies before the sender's request to send is answered. */
    while (sl_time_now() < until && !done &&
           (sc->when != DURING_RECV || atomic_load(&shm->posted) < survivors)) {
        sl->test(comm, req, &done);
        usleep(50);
    }
    raise(SIGKILL);
}

/* A survivor posts once the victim is dead (BEFORE, AFTER: it died after
 * init or after the first transfer; DURING_SEND: after its request to send
 * went out): its pidfd fires, or it is gone already (reaped). */
static void await_victim_death(int victim, rank_report_t *me)
{
    int           fd = (int)syscall(SYS_pidfd_open, shm->pid[victim], 0);
    struct pollfd p  = {.fd = fd, .events = POLLIN};

    if (fd < 0 && errno == ESRCH) {
        return;
    }
    if (fd < 0 || poll(&p, 1, (int)(DEADLINE * 1e3)) != 1) {
        snprintf(me->msg, sizeof(me->msg), "the victim (rank %d, pid %d) did "
                 "not die within %.1f s: %s", victim, (int)shm->pid[victim],
                 DEADLINE, fd < 0 ? strerror(errno) : "pidfd never fired");
        _exit(1);
    }
    close(fd);
}

/* Moves this rank into its stage's namespace ("node"), as `ip netns exec`
 * does: UCX lists interfaces from /sys/class/net, which shows the
 * namespace's own only once sysfs is mounted again from inside it. */
static void enter_netns(const char *name, rank_report_t *me)
{
    char path[128];
    int  fd;

    snprintf(path, sizeof(path), "/var/run/netns/%s", name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0 || unshare(CLONE_NEWNS) != 0 ||
        mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) != 0 ||
        umount2("/sys", MNT_DETACH) != 0 ||
        mount(name, "/sys", "sysfs", 0, NULL) != 0) {
        snprintf(me->msg, sizeof(me->msg), "cannot enter %s: %s", path,
                 strerror(errno));
        _exit(1);
    }
    close(fd);
}

/*
 * LAST_WORDS: a message the victim's send completed before it died reaches
 * the survivor's receive, posted before, though the survivor waits for it
 * only once the death can be seen.  The victim's buffer holds 1s.
 */
static int last_words(rank_ctx_t *c)
{
    const scenario_t            *sc   = c->sc;
    const stagelink_plugin_v1_t *sl   = c->sl;
    stagelink_comm_t            *comm = c->comm;
    unsigned char               *buf  = c->buf;
    rank_report_t               *me   = c->me;
    int                          rank = c->rank;
    stagelink_xfer_t     x   = {.peer = (rank == sc->victim)
                                            ? STAGELINK_PEER_NEXT
                                            : STAGELINK_PEER_PREV,
                                .buf = buf, .nbytes = LAST_WORDS_BYTES,
                                .elem_size = 1, .tag = {.microbatch = 3}};
    stagelink_request_t *req = NULL;
    struct pollfd        p   = {.fd = flow_pipe[0], .events = POLLIN};
    char                 one = 1;
    size_t               i;
    int                  st;

    if (rank == sc->victim) {
        if (poll(&p, 1, (int)(DEADLINE * 1e3)) != 1) {
            snprintf(me->msg, sizeof(me->msg), "the survivor never posted");
            _exit(1);
        }
        st = sl->isend(comm, &x, &req);
        if (st == STAGELINK_SUCCESS) {
            st = sl->wait(comm, req);
        }
        if (st != STAGELINK_SUCCESS) {
            snprintf(me->msg, sizeof(me->msg), "last send: %s: %s",
                     stagelink_status_string(st), sl->last_error(comm));
            _exit(1);
        }
        raise(SIGKILL);
    }
    st = sl->irecv(comm, &x, &req);
    if (st == STAGELINK_SUCCESS && write(flow_pipe[1], &one, 1) != 1) {
        snprintf(me->msg, sizeof(me->msg), "cannot wake the victim");
        _exit(1);
    }
    await_victim_death(sc->victim, me);
    if (st == STAGELINK_SUCCESS) {
        st = sl->wait(comm, req);
    }
    for (i = 0; st == STAGELINK_SUCCESS && i < LAST_WORDS_BYTES; ++i) {
        if (buf[i] != sc->victim + 1) {
            snprintf(me->msg, sizeof(me->msg), "the victim's last message "
                     "holds %u at byte %zu, not %d", buf[i], i, sc->victim + 1);
            _exit(1);
        }
    }
    if (st != STAGELINK_SUCCESS) {
        snprintf(me->msg, sizeof(me->msg), "the victim's last message, sent "
                 "before it died: %s: %s", stagelink_status_string(st),
                 sl->last_error(comm));
        me->op_status = st;
        _exit(1);
    }
    return 0;
}

/* BEFORE: the victim dies right after init. */
static int victim_dies(rank_ctx_t *c)
{
    if (c->rank == c->sc->victim) {
        raise(SIGKILL);
    }
    return 0;
}

/* AFTER: one transfer completes, then the victim dies; the transfer that
 * must fail is the next microbatch. */
static int first_transfer(rank_ctx_t *c)
{
    const stagelink_plugin_v1_t *sl  = c->sl;
    stagelink_xfer_t             ack = c->x;
    stagelink_request_t         *req = NULL;
    int                          st;

    st = c->sender ? sl->isend(c->comm, &c->x, &req)
                   : sl->irecv(c->comm, &c->x, &req);
    if (st == STAGELINK_SUCCESS) {
        st = sl->wait(c->comm, req);
    }
    /* A rendezvous send completes only once the receiver's
     * acknowledgement has left, which a receiver killed right after its
     * own completion may never send: the sender posts a second, small
     * message only after its send completed, and the victim dies once
     * that arrived. */
    ack.nbytes         = 1;
    ack.tag.microbatch = 2;
    if (st == STAGELINK_SUCCESS) {
        st = c->sender ? sl->isend(c->comm, &ack, &req)
                       : sl->irecv(c->comm, &ack, &req);
    }
    if (st == STAGELINK_SUCCESS) {
        st = sl->wait(c->comm, req);
    }
    if (st != STAGELINK_SUCCESS) {
        snprintf(c->me->msg, sizeof(c->me->msg), "first transfer: %s: %s",
                 stagelink_status_string(st), sl->last_error(c->comm));
        c->me->op_status = st;
        _exit(1);
    }
    victim_dies(c);
    c->x.tag.microbatch = 1;
    return 0;
}

/* ABORT: the sender never sends, so its receiver stays blocked until a
 * watchdog thread aborts. */
static int start_watchdog(rank_ctx_t *c)
{
    if (c->sender) {
        return 1;
    }
    c->dog    = (watchdog_t){c->sl, c->comm, eventfd(0, EFD_CLOEXEC)};
    c->dog_on = 1;
    pthread_create(&c->dog_thread, NULL, watchdog_main, &c->dog);
    return 0;
}

/* TP_DURING_SEND: receivers tell the victim when its bytes land. */
static int watch_for_bytes(rank_ctx_t *c)
{
    if (!c->sender) {
        if (flow_watch_start(&c->watch, c->buf, c->me) != 0) {
            _exit(1);
        }
        c->watching = 1;
    }
    return 0;
}

static const scenario_t scenarios[] = {
    /* name, when, world, tp, victim, setup, survivors await the death */
    {"before",         BEFORE,         2, 1, 0,  victim_dies,     1},
    {"at-init",        BEFORE,         2, 1, 1,  victim_dies,     0},
    {"during-send",    DURING_SEND,    2, 1, 0,  NULL,            1},
    {"during-recv",    DURING_RECV,    2, 1, 1,  NULL,            0},
    {"after",          AFTER,          2, 1, 1,  first_transfer,  1},
    {"last-words",     LAST_WORDS,     2, 1, 0,  last_words,      1},
    {"abort",          ABORT,          2, 1, -1, start_watchdog,  0},
    {"tp-during-send", TP_DURING_SEND, 4, 2, 0,  watch_for_bytes, 0},
};

/* A rank's placement, its communicator and the transfer that must fail;
 * every failure here ends the rank (its report says why). */
static stagelink_loader_t *rank_start(rank_ctx_t *c, int port)
{
    const scenario_t            *sc  = c->sc;
    stagelink_config_t           cfg = {.struct_size = sizeof(cfg)};
    stagelink_comm_info_t        info;
    stagelink_loader_t          *loader;
    char                         env[32], err[1024];
    size_t                       nbytes = (size_t)BIG * (size_t)sc->tp;

    alarm(30); /* a hang shows as a signal, never as a stuck test */
    shm->pid[c->rank] = getpid(); /* before init: a survivor reads it after */
    snprintf(env, sizeof(env), "%d", port);
    setenv("STAGELINK_BOOTSTRAP_ADDR",
           (c->where == NETNS) ? netns_addr : "127.0.0.1", 1);
    setenv("STAGELINK_BOOTSTRAP_PORT", env, 1);
    setenv("STAGELINK_TIMEOUT", "2", 1);
    if (c->where == NETNS) {
        enter_netns(netns[c->rank / sc->tp], c->me);
    } else if (c->where == NODE_ID) {
        snprintf(env, sizeof(env), "node-%d", c->rank / sc->tp);
        setenv("STAGELINK_NODE_ID", env, 1);
    }
    if (sc->when == TP_DURING_SEND && c->where == ONE_NODE) {
        /* A receiver in the middle of a CMA read of the victim holds a
         * reference to its address space, so the kernel has that receiver
         * tear it down (15-115 ms measured here, and more the bigger the
         * victim: docs/reliability.md).  The rule is about what stagelink
         * does once it can run, so this case moves the data through shared
         * memory without CMA, and without TCP, which UCX would take for
         * the rendezvous instead (where UCX 1.13 once failed an assertion
         * as the victim died).  A UCX_TLS given by the caller stays. */
        setenv("UCX_TLS", "^cma,tcp", 0);
    }
    c->me->fds_before = open_fds();
    /* The whole tensor, of which each TP rank moves BIG bytes. */
    c->buf = malloc(nbytes);
    memset(c->buf, c->rank + 1, nbytes);
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) !=
        STAGELINK_SUCCESS) {
        snprintf(c->me->msg, sizeof(c->me->msg), "%.1000s", err);
        _exit(1);
    }
    c->sl          = stagelink_loader_plugin(loader);
    cfg.rank       = c->rank;
    cfg.world_size = sc->world;
    cfg.tp_size    = sc->tp;
    cfg.mode       = STAGELINK_MODE_SCATTER_GATHER;
    cfg.flags      = STAGELINK_CONFIG_RANK_SET;
    if (stagelink_loader_comm_init(loader, &cfg, &c->comm, err, sizeof(err)) !=
        STAGELINK_SUCCESS) {
        snprintf(c->me->msg, sizeof(c->me->msg), "%.1000s", err);
        _exit(1);
    }
    c->me->reached = 1;
    c->sl->comm_info(c->comm, &info);
    c->sender = info.next_rank >= 0;
    c->x = (stagelink_xfer_t){.peer = c->sender ? STAGELINK_PEER_NEXT
                                                : STAGELINK_PEER_PREV,
                              .buf = c->buf, .nbytes = nbytes,
                              .elem_size = 1};
    return loader;
}

/* The transfer that must fail: posted (the victim dies in it), waited,
 * and what came of it reported. */
static void rank_transfer(rank_ctx_t *c)
{
    const scenario_t    *sc  = c->sc;
    rank_report_t       *me  = c->me;
    stagelink_request_t *req = NULL;
    double               t0;
    int                  st;

    if (sc->await_death && c->rank != sc->victim) {
        await_victim_death(sc->victim, me);
    }
    atomic_fetch_add(&shm->posted, c->rank != sc->victim);
    t0 = sl_time_now();
    st = c->sender ? c->sl->isend(c->comm, &c->x, &req)
                   : c->sl->irecv(c->comm, &c->x, &req);
    if (c->rank == sc->victim) {
        die_mid_transfer(sc, c->where, c->sl, c->comm, req);
    }
    if (c->dog_on) {
        eventfd_write(c->dog.posted, 1);
    }
    if (st == STAGELINK_SUCCESS) {
        st = c->sl->wait(c->comm, req);
    }
    if (c->watching) {
        flow_watch_stop(&c->watch);
    }
    me->op_end    = sl_time_now();
    me->op_secs   = me->op_end - t0;
    me->op_status = st;
    snprintf(me->msg, sizeof(me->msg), "%s", c->sl->last_error(c->comm));
    if (c->dog_on) {
        pthread_join(c->dog_thread, NULL);
        close(c->dog.posted);
    }
    me->err_status = c->sl->comm_get_error(c->comm, &me->failed_rank);
}

static void run_rank(const scenario_t *sc, int rank, int port,
                     placement_t where)
{
    rank_ctx_t          c = {.sc = sc, .where = where, .rank = rank,
                             .me = &shm->r[rank]};
    stagelink_loader_t *loader = rank_start(&c, port);
    double              t0;

    if (sc->setup == NULL || sc->setup(&c) == 0) {
        rank_transfer(&c);
    }
    t0               = sl_time_now();
    c.me->fin_status = c.sl->comm_finalize(c.comm);
    c.me->fin_secs   = sl_time_now() - t0;
    stagelink_loader_close(loader);
    free(c.buf);
    c.me->fds_after = open_fds();
    _exit(0);
}

static void run_scenario(const scenario_t *sc, placement_t placement)
{
    const char *where = placement_names[placement];
    pid_t       pid[MAX_RANKS];
    int         port, held = hold_port(&port), r, wst;
    double      latency;
    int         timed;

    memset(shm, 0, sizeof(*shm));
    if (held < 0 || pipe2(flow_pipe, O_CLOEXEC) != 0) {
        CHECK(0, "%s, %s: no port or no pipe", sc->name, where);
        return;
    }
    fflush(stdout); /* or the children inherit the lines still buffered */
    for (r = 0; r < sc->world; ++r) {
        shm->r[r].op_status = -1;
        if ((pid[r] = fork()) == 0) {
            run_rank(sc, r, port, placement);
        }
        shm->pid[r] = pid[r];
    }
    if (sc->when != ABORT) {
        /* Timed from when the death could be known, not from the kill: the
         * kernel takes a while to tear a process down (measured: 3-30 ms
         * from raise() to its pidfd). */
        int           fd = (int)syscall(SYS_pidfd_open, pid[sc->victim], 0);
        struct pollfd p  = {.fd = fd, .events = POLLIN};

        CHECK(fd >= 0 && poll(&p, 1, (int)(2 * DEADLINE * 1e3)) == 1,
              "%s, %s: the victim's death was not seen", sc->name, where);
        shm->fault_at = sl_time_now();
        if (fd >= 0) {
            close(fd);
        }
    }
    for (r = 0; r < sc->world; ++r) {
        rank_report_t *rr = &shm->r[r];

        waitpid(pid[r], &wst, 0);
        if (r == sc->victim) {
            CHECK(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL,
                  "%s, %s: the victim rank %d did not die as planned "
                  "(status %#x: %s)", sc->name, where, r, wst, rr->msg);
            continue;
        }
        CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0,
              "%s, %s: survivor rank %d ended with status %#x (%s)",
              sc->name, where, r, wst, rr->msg);
        /* From the fault, or from the post when that came after it. */
        latency = rr->op_end - ((shm->fault_at > rr->op_end - rr->op_secs)
                                    ? shm->fault_at
                                    : rr->op_end - rr->op_secs);
        timed = rr->op_status != STAGELINK_SUCCESS &&
                !(sc->when == ABORT && r == 0);
        printf("%-15s %-9s rank %d: %-26s in %.3f s (%.1f ms after the "
               "fault), finalize %.3f s: %s\n",
               sc->name, where, r,
               (sc->when == ABORT && r == 0)
                   ? "(never sent)"
                   : stagelink_status_string((stagelink_status_t)rr->op_status),
               rr->op_secs, timed ? latency * 1e3 : 0.0, rr->fin_secs,
               rr->msg);
        if (timed) {
            CHECK(latency < FAIL_FAST, "%s, %s: rank %d failed %.1f ms after "
                  "the fault (at most %.0f ms)", sc->name, where, r,
                  latency * 1e3, FAIL_FAST * 1e3);
        }
        CHECK(rr->fin_status == STAGELINK_SUCCESS && rr->fin_secs < DEADLINE,
              "%s, %s: rank %d finalize gave %d after %.3f s", sc->name,
              where, r, rr->fin_status, rr->fin_secs);
        CHECK(rr->fds_after == rr->fds_before,
              "%s, %s: rank %d holds %d descriptors after finalize, %d "
              "before init", sc->name, where, r, rr->fds_after,
              rr->fds_before);
        if (sc->when == ABORT) {
            if (r == 1) {
                CHECK(rr->op_status == STAGELINK_ERR_ABORTED &&
                      rr->err_status == STAGELINK_ERR_ABORTED &&
                      rr->op_secs < DEADLINE / 2,
                      "%s, %s: the aborted wait gave %d / %d after %.3f s",
                      sc->name, where, rr->op_status, rr->err_status,
                      rr->op_secs);
            }
            continue;
        }
        /* Rank 1 of the TP case sends to a live rank: it may succeed. */
        if (sc->when == TP_DURING_SEND && r == 1) {
            continue;
        }
        CHECK(rr->op_status != STAGELINK_SUCCESS && rr->op_secs < DEADLINE,
              "%s, %s: rank %d: transfer gave %d after %.3f s (must fail "
              "within %.1f s)", sc->name, where, r, rr->op_status,
              rr->op_secs, DEADLINE);
        /* Ranks that talked to the victim name it; in the TP case rank 3
         * hears of it from its TP peer (rank 2). */
        if (sc->when != TP_DURING_SEND || r == 2) {
            CHECK(rr->op_status == STAGELINK_ERR_PEER_FAILED &&
                  rr->err_status == STAGELINK_ERR_PEER_FAILED &&
                  rr->failed_rank == sc->victim,
                  "%s, %s: rank %d: status %d, comm_get_error %d with "
                  "failed rank %d (victim %d)", sc->name, where, r,
                  rr->op_status, rr->err_status, rr->failed_rank,
                  sc->victim);
        }
    }
    close(held);
    close(flow_pipe[0]);
    close(flow_pipe[1]);
}

int main(int argc, char **argv)
{
    const char *names = getenv("PEER_KILL_NETNS");
    placement_t first = ONE_NODE, last = NODE_ID, p;
    size_t      i, ran = 0;

    shm = mmap(NULL, sizeof(*shm), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    setenv("STAGELINK_DEBUG", "NONE", 0);
    if (names != NULL) {
        if (sscanf(names, "%63s %63s", netns[0], netns[1]) != 2 ||
            getenv("PEER_KILL_ADDR") == NULL) {
            fprintf(stderr, "PEER_KILL_NETNS needs two names and "
                    "PEER_KILL_ADDR node 0's address\n");
            return 2;
        }
        snprintf(netns_addr, sizeof(netns_addr), "%s", getenv("PEER_KILL_ADDR"));
        first = last = NETNS;
    }
    for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); ++i) {
        if (argc > 1 && strcmp(argv[1], scenarios[i].name) != 0) {
            continue;
        }
        for (p = first; p <= last; ++p) {
            run_scenario(&scenarios[i], p);
        }
        ++ran;
    }
    if (ran == 0) {
        fprintf(stderr, "peer_kill: no scenario named \"%s\"; known:", argv[1]);
        for (i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); ++i) {
            fprintf(stderr, " %s", scenarios[i].name);
        }
        fputc('\n', stderr);
        return 2;
    }
    return check_summary();
}
