/*
 * Who progresses a communicator's worker, and how a thread sleeps until it
 * has something to do.  A peer's transfer can need this rank's progress
 * after this rank's own requests are done (a rendezvous acknowledgement, a
 * relay, a gather send in UCX's pending queue), so a progress thread keeps
 * the worker moving while the host is away from stagelink.  One mutex owns
 * the communicator: the host holds it for the length of each call (and
 * progresses inline inside wait and test, so small messages pay no
 * hand-off), the thread between its sleeps; neither holds it while it
 * blocks, and the thread stays off while a host call is inside.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"
#include "sl_time.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long a sleep lasts while sends to another node are in flight: from
 * 1 ms, doubled while nothing wakes it (a rendezvous send waiting for its
 * receiver is in flight too), reset by any event. */
#define SL_TX_POLL_MIN_MS 1
#define SL_TX_POLL_MAX_MS 4

/* How long a host's wait polls GPU work (copies, stream events) that wakes
 * no fd, yielding, before it looks only every 50 us: a chunk's copy takes
 * microseconds to a few hundred; a kernel the stream holds a send behind
 * may take milliseconds, where the 50 us naps cost nothing that matters. */
#define SL_BUSY_POLL_S 1e-3
#define SL_BUSY_NAP_NS 50000

/* The thread takes over once the host has been away this long: a host that
 * calls again within it progresses inline, and the thread, off the event
 * fd, is not woken by every message (design.md has the cost of a thread
 * woken so).  A peer that needs this rank waits at most this. */
#define SL_PT_IDLE_S 1e-3

/*
 * UCX 1.13's TCP transport does not wake the worker's event fd when a full
 * socket becomes writable again: what it buffered then waits for the next
 * progress call (a rank asleep in poll() with chunks for a peer still
 * queued).  So while sends to another node are in flight, and for a moment
 * after the last one (an eager send is complete for us while UCX still
 * holds its bytes), a sleep is short.
 */
static int sl_progress_tx_pending(const sl_comm_t *comm)
{
    return comm->net_sends > 0 || sl_time_now() < comm->net_quiet_at;
}

/* Whether a subsystem waits for something that does not wake the fd. */
static int sl_progress_hooks_busy(const sl_comm_t *comm)
{
    int i;

    for (i = 0; i < comm->nhooks; ++i) {
        if (comm->hooks[i]->busy != NULL && comm->hooks[i]->busy(comm)) {
            return 1;
        }
    }
    return 0;
}

/* The earliest time a hook needs a round at (0: none). */
static double sl_progress_hooks_wake_at(const sl_comm_t *comm)
{
    double wake = 0.0;
    int    i;

    for (i = 0; i < comm->nhooks; ++i) {
        if (comm->hooks[i]->wake_at != NULL) {
            wake = sl_deadline_earlier(wake, comm->hooks[i]->wake_at(comm));
        }
    }
    return wake;
}

/* Whether an abort or a fault waits to be applied by a progress call. */
static int sl_progress_fault_waits(const sl_comm_t *comm)
{
    return (atomic_load_explicit(&comm->aborting, memory_order_acquire) &&
            !comm->aborted) || comm->fault_pending;
}

void sl_progress_sleep_init(sl_sleep_t *s, struct pollfd *own_pfds)
{
    s->busy_until = -1.0;
    s->polled     = SL_SLEEP_NO_POLL;
    s->tx_ms      = SL_TX_POLL_MIN_MS;
    s->pfds       = own_pfds;
    s->locked     = 1;
    s->context    = NULL;
}

static void sl_progress_nap(long ns)
{
    struct timespec ts = {0, ns};

    nanosleep(&ts, NULL);
}

/* The thread takes the communicator only when no host call holds it (a
 * blocked thread would make every unlock of the host a futex wake-up),
 * and keeps the host's error sentence aside meanwhile: what last_error
 * says is the host's last call's, whatever the thread met. */
static int sl_progress_take(sl_comm_t *comm, sl_sleep_t *s)
{
    if (atomic_load(&comm->host_inside) != 0 ||
        pthread_mutex_trylock(&comm->lock) != 0) {
        return 0;
    }
    /* A host call that entered meanwhile may hold no lock only because it
     * blocks in poll: the communicator is still its own. */
    if (atomic_load(&comm->host_inside) != 0) {
        pthread_mutex_unlock(&comm->lock);
        return 0;
    }
    s->host_err = comm->err;
    /* The communicator's context (taken at its first device post when
     * none was current at init). */
    if (comm->context != NULL && s->context != comm->context &&
        comm->gpu->context_set != NULL &&
        comm->gpu->context_set(comm->context, &comm->err) == STAGELINK_SUCCESS) {
        s->context = comm->context;
    }
    return 1;
}

static void sl_progress_give(sl_comm_t *comm, sl_sleep_t *s)
{
    comm->err = s->host_err;
    pthread_mutex_unlock(&comm->lock);
}

/* No thread holds the communicator while it blocks (a poll, a nap).  The
 * host's host_inside stays raised meanwhile, so the thread stays off it. */
static void sl_progress_unlock(sl_comm_t *comm, sl_sleep_t *s, int thread)
{
    if (thread) {
        sl_progress_give(comm, s);
    } else {
        pthread_mutex_unlock(&comm->lock);
    }
}

static void sl_progress_relock(sl_comm_t *comm, sl_sleep_t *s, int thread)
{
    if (thread) {
        s->locked = sl_progress_take(comm, s);
    } else {
        pthread_mutex_lock(&comm->lock);
    }
}

sl_status_t sl_progress_sleep(sl_comm_t *comm, sl_sleep_t *s, double wake)
{
    int           thread = (s->pfds != NULL);
    struct pollfd *pfds  = thread ? s->pfds : comm->pfds;
    int           ready, timeout, tx, saved, i;
    unsigned      seen;
    ucs_status_t  ucs;

    s->polled = SL_SLEEP_NO_POLL;
    if (sl_progress_hooks_busy(comm)) {
        /* GPU copies and stream events do not wake the UCX event fd.  With
         * cores to spare (spin > 0) a host's wait polls them, yielding,
         * for up to SL_BUSY_POLL_S: a 50 us nanosleep overshoots on
         * virtual machines (gpu.md).  On an oversubscribed node the peers
         * need the core more. */
        double now = sl_time_now();

        s->busy_until = (s->busy_until < 0) ? now + SL_BUSY_POLL_S
                                            : s->busy_until;
        if (!thread && comm->spin > 0 && now < s->busy_until) {
            sched_yield();
        } else {
            sl_progress_unlock(comm, s, thread);
            sl_progress_nap(SL_BUSY_NAP_NS);
            sl_progress_relock(comm, s, thread);
        }
        return STAGELINK_SUCCESS;
    }
    s->busy_until = -1.0;
    /* UCX may be armed only right after a progress call that found nothing
     * to do (ucp_worker_arm's contract): the hooks ran after the last one
     * and may have posted operations whose next step waits in UCX's
     * progress queue, which no fd reports.  That call can also run a
     * completion UCX deferred without counting it: a callback of ours that
     * ran means the hooks have its follow-up to do before any sleep. */
    seen = comm->callbacks;
    if (sl_ucx_worker_progress(comm) != 0 || comm->callbacks != seen) {
        return STAGELINK_SUCCESS;
    }
    ucs = sl_ucx_worker_arm(comm);
    if (ucs == UCS_ERR_BUSY) {
        return STAGELINK_SUCCESS;
    }
    if (ucs != UCS_OK) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "ucp_worker_arm failed: %s", ucs_status_string(ucs));
    }
    /* Same-node peers' pidfds wake it too when one of them dies; a hook
     * when its next look is due. */
    wake    = sl_deadline_earlier(wake, sl_progress_hooks_wake_at(comm));
    tx      = sl_progress_tx_pending(comm);
    timeout = tx ? s->tx_ms : sl_deadline_ms(wake);
    if (thread) {
        memcpy(pfds, comm->pfds, (size_t)comm->npfds * sizeof(*pfds));
        comm->pt_timed = (timeout >= 0);
        atomic_store(&comm->pt_sleeping, 1);
    }
    sl_progress_unlock(comm, s, thread);
    ready = poll(pfds, (nfds_t)comm->npfds, timeout);
    saved = errno;
    /* A zero timeout or a signal slept for nothing: no lesson for wait(). */
    s->polled = (ready > 0) ? SL_SLEEP_WOKEN
              : (timeout == 0 || (ready < 0 && saved == EINTR)) ? SL_SLEEP_NO_POLL
                                                                 : SL_SLEEP_TIMED;
    if (thread) {
        atomic_store(&comm->pt_sleeping, 0);
    }
    sl_progress_relock(comm, s, thread);
    if (thread) {
        if (!s->locked) {
            return STAGELINK_SUCCESS; /* the host's call progresses now */
        }
        for (i = 0; i < comm->npfds; ++i) {
            comm->pfds[i].revents = pfds[i].revents;
        }
    }
    s->tx_ms = (ready == 0 && tx && s->tx_ms < SL_TX_POLL_MAX_MS)
                   ? 2 * s->tx_ms : (ready != 0 ? SL_TX_POLL_MIN_MS : s->tx_ms);
    if (ready < 0 && saved != EINTR) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "poll on the UCX event fd failed: %s",
                        strerror(saved));
    }
    if (ready > 0 && comm->npfds > 1) {
        sl_peer_polled(comm);
    }
    return STAGELINK_SUCCESS;
}

static void *sl_progress_main(void *arg)
{
    sl_comm_t *comm = arg;
    sl_sleep_t s;
    int        warned = 0;
    double     idle_at;

    sl_progress_sleep_init(&s, comm->pt_pfds);
    while (!atomic_load(&comm->pt_stop)) {
        /* Off the lock and the event fd while the host calls, and until
         * it has been away SL_PT_IDLE_S. */
        idle_at = atomic_load(&comm->host_left_at) + SL_PT_IDLE_S;
        if (atomic_load(&comm->host_inside) != 0 || sl_time_now() < idle_at ||
            !(s.locked = sl_progress_take(comm, &s))) {
            sl_progress_nap((long)(SL_PT_IDLE_S * 1e9));
            continue;
        }
        while (s.locked && !atomic_load(&comm->pt_stop) &&
               atomic_load(&comm->host_inside) == 0) {
            sl_ucx_progress(comm);
            if (sl_progress_sleep(comm, &s, 0.0) != STAGELINK_SUCCESS &&
                s.locked) {
                if (!warned) {
                    SL_WARN(SL_SUBSYS_NET, "progress thread: %s; it naps "
                            "and tries again", comm->err.msg);
                    warned = 1;
                }
                sl_progress_give(comm, &s);
                s.locked = 0;
                sl_progress_nap((long)(SL_PT_IDLE_S * 1e9));
            }
        }
        if (s.locked) {
            sl_progress_give(comm, &s); /* a host call waits for it */
            s.locked = 0;
        }
    }
    return NULL;
}

sl_status_t sl_progress_init(sl_comm_t *comm)
{
    int err = pthread_mutex_init(&comm->lock, NULL);

    if (err != 0) {
        return sl_error(&comm->err, STAGELINK_ERR_INIT,
                        "cannot create the communicator's mutex: %s",
                        strerror(err));
    }
    comm->lock_made = 1;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_progress_start(sl_comm_t *comm)
{
    sigset_t all, old;
    int      err;

    if (!comm->progress_thread) {
        SL_INFO(SL_SUBSYS_INIT, "no progress thread (STAGELINK_PROGRESS_THREAD"
                "=0): transfers move only inside stagelink calls");
        return STAGELINK_SUCCESS;
    }
    comm->pt_pfds = calloc((size_t)comm->npfds, sizeof(*comm->pt_pfds));
    if (comm->pt_pfds == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d poll entries for the progress "
                        "thread", comm->npfds);
    }
    /* Signals stay the host's: the thread takes none. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    err = pthread_create(&comm->pt, NULL, sl_progress_main, comm);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        return sl_error(&comm->err, STAGELINK_ERR_INIT,
                        "cannot start the progress thread: %s; set "
                        "STAGELINK_PROGRESS_THREAD=0 to run without one",
                        strerror(err));
    }
    comm->pt_running = 1;
    SL_INFO(SL_SUBSYS_INIT, "progress thread started (device %d)",
            comm->device);
    return STAGELINK_SUCCESS;
}

void sl_progress_stop(sl_comm_t *comm)
{
    if (comm->pt_running) {
        atomic_store(&comm->pt_stop, 1);
        ucp_worker_signal(comm->worker);
        pthread_join(comm->pt, NULL);
        comm->pt_running = 0;
    }
    free(comm->pt_pfds);
    comm->pt_pfds = NULL;
}

void sl_progress_cleanup(sl_comm_t *comm)
{
    sl_progress_stop(comm);
    if (comm->lock_made) {
        pthread_mutex_destroy(&comm->lock);
        comm->lock_made = 0;
    }
}

void sl_progress_enter(sl_comm_t *comm)
{
    atomic_fetch_add(&comm->host_inside, 1);
    pthread_mutex_lock(&comm->lock);
}

void sl_progress_leave_query(sl_comm_t *comm)
{
    /* A call that moved nothing: the thread's clock is not reset. */
    pthread_mutex_unlock(&comm->lock);
    atomic_fetch_sub(&comm->host_inside, 1);
}

void sl_progress_leave(sl_comm_t *comm)
{
    int      kick;
    unsigned seen;

    /* The thread sleeps on what it saw before this call: wake it unless
     * the worker is quiet and armed, so that what the call posted moves on
     * without the host. */
    if (atomic_load(&comm->pt_sleeping)) {
        seen = comm->callbacks;
        kick = sl_ucx_worker_progress(comm) != 0 ||
               comm->callbacks != seen ||
               sl_progress_hooks_busy(comm) ||
               (!comm->pt_timed && (sl_progress_tx_pending(comm) ||
                                    sl_progress_hooks_wake_at(comm) != 0.0)) ||
               sl_ucx_worker_arm(comm) != UCS_OK ||
               sl_progress_fault_waits(comm);
        if (kick) {
            ucp_worker_signal(comm->worker);
        }
    }
    atomic_store(&comm->host_left_at, sl_time_now());
    pthread_mutex_unlock(&comm->lock);
    atomic_fetch_sub(&comm->host_inside, 1);
}
