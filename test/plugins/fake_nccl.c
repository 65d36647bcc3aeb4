/*
 * A stand-in for libnccl.so.2 (STAGELINK_NCCL_LIBRARY) with every function
 * stagelink resolves, for tests without a GPU.
 *
 * Setup: ncclGetUniqueId fills a known pattern (and a nonce, so that two
 * communicators differ), or fails with ncclSystemError while
 * FAKE_NCCL_UNIQUE_ID=fail; ncclCommInitRank succeeds only with an id of
 * that pattern, so a test sees that every rank got TP index 0's id.
 *
 * Collectives (ncclAllGather, ncclBroadcast) move host memory between the
 * processes of a communicator through shared memory, run on the caller's
 * fake stream (test/plugins/fake_stream.h) where the program has them.
 * Each is numbered when issued: once per communicator, and once per
 * process (its one fake device) across communicators.  Real NCCL pairs
 * collectives by that order and swaps data or hangs when ranks differ;
 * this one fails loudly instead, naming both ranks' numbers, when ranks
 * issue a communicator's collectives, or one device's collectives across
 * communicators, in different orders, or with different sizes.
 * ncclSend and ncclRecv, on a communicator of two ranks, are a broadcast
 * from the sender, numbered like the collectives: one direction at a time.
 * ncclGetVersion says 2.28.0, or FAKE_NCCL_VERSION (NCCL's number: 23003).
 * Groups are per thread, as NCCL's: a thread's collectives between
 * ncclGroupStart and the outermost ncclGroupEnd are issued at that end.
 * FAKE_NCCL_COLLECTIVE=fail makes a collective fail as it is issued
 * (ncclSystemError), numbering nothing; FAKE_NCCL_DELAY_MS=N makes each
 * issued from then on take N ms more on its stream (a slow collective).
 *
 * NCCL's rules for failures, as stagelink must follow them:
 *   - ncclCommInitRankConfig with blocking = 0 returns ncclInProgress, and
 *     ncclCommGetAsyncError says when the init is done;
 *     FAKE_NCCL_INIT=hang keeps every init in progress for ever (a TP peer
 *     that never joins), and makes the blocking ncclCommInitRank hang
 *     (60 s, then ncclSystemError);
 *   - FAKE_NCCL_ASYNC_ERROR=N: the communicator's collective number N
 *     (from 0) never ends on its stream, and ncclCommGetAsyncError then
 *     reports ncclRemoteError, as NCCL does when a peer's proxy fails;
 *   - a collective waits for every rank of its communicator, on its
 *     stream, until they come or ncclCommAbort ends it (then it moves
 *     nothing); after 60 s without either the process exits with 86,
 *     naming the collective: a dead peer's collectives hang the stream
 *     unless someone aborts.
 * SPDX-License-Identifier: MIT
 */
#include "fake_stream.h"

#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define FAKE_ID_BYTE  0x5a
#define FAKE_ID_CHECK 64         /* bytes of the pattern; a nonce follows */
#define FAKE_RANKS    8
#define FAKE_SLOTS    4          /* collectives of a communicator in flight */
#define FAKE_BYTES    (1u << 20) /* largest part of one rank */
#define FAKE_WAIT_S   60

/* One collective in a slot, as each rank issued it. */
typedef struct fake_issue {
    uint64_t seq, devseq;
    size_t   bytes;
    int      root; /* -1: all-gather */
} fake_issue_t;

typedef struct fake_slot {
    uint64_t     seq; /* the collective this slot serves now */
    int          arrived, left;
    fake_issue_t announced[FAKE_RANKS]; /* at issue, before it runs */
    fake_issue_t issued[FAKE_RANKS];
    char         data[FAKE_RANKS][FAKE_BYTES];
} fake_slot_t;

typedef struct fake_shm {
    atomic_int      ready; /* 0, 1 being made, 2 made */
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    fake_slot_t     slots[FAKE_SLOTS];
} fake_shm_t;

struct ncclComm {
    int         rank, nranks;
    uint64_t    seq;
    fake_shm_t *shm;
    char        name[64];
    int         init_hangs;  /* FAKE_NCCL_INIT=hang: in progress for ever */
    atomic_int  async_error; /* a collective failed on the stream */
    atomic_int  aborted;     /* ncclCommAbort: collectives end at once */
    atomic_int  running;     /* collectives inside fake_run */
};

typedef struct fake_op {
    struct ncclComm *comm;
    fake_issue_t     is;
    const void      *send;
    void            *recv;
    int              delay_ms; /**< FAKE_NCCL_DELAY_MS when issued */
    int              fails;    /**< FAKE_NCCL_ASYNC_ERROR names it */
} fake_op_t;

static struct ncclComm fake_setup_comm; /* without shared memory */
static atomic_ullong   fake_devseq;      /* this process's one device */

static double fake_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Every rank of a communicator maps one region named after its id. */
static fake_shm_t *fake_shm_open(const char *name)
{
    pthread_mutexattr_t ma;
    pthread_condattr_t  ca;
    fake_shm_t         *shm;
    int                 fd = shm_open(name, O_CREAT | O_RDWR, 0600), zero = 0, i;

    if (fd < 0 || ftruncate(fd, sizeof(*shm)) != 0) {
        fprintf(stderr, "fake NCCL: cannot map %s: %s\n", name, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return NULL;
    }
    shm = mmap(NULL, sizeof(*shm), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (shm == MAP_FAILED) {
        return NULL;
    }
    if (atomic_compare_exchange_strong(&shm->ready, &zero, 1)) {
        pthread_mutexattr_init(&ma);
        pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
        pthread_mutex_init(&shm->mu, &ma);
        pthread_condattr_init(&ca);
        pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&shm->cv, &ca);
        for (i = 0; i < FAKE_SLOTS; ++i) {
            shm->slots[i].seq = (uint64_t)i;
        }
        atomic_store(&shm->ready, 2);
    }
    while (atomic_load(&shm->ready) != 2) {
        struct timespec ts = {0, 100000};

        nanosleep(&ts, NULL);
    }
    return shm;
}

static size_t fake_type_size(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

/* One wait on the region's condition (50 ms); past `end` the process
 * fails, naming what it waited for. */
static void fake_wait(fake_shm_t *shm, const fake_op_t *op, double end,
                      const char *what)
{
    struct timespec until;
    double          t = fake_now() + 0.05;

    until.tv_sec  = (time_t)t;
    until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
    pthread_cond_timedwait(&shm->cv, &shm->mu, &until);
    if (atomic_load(&op->comm->aborted)) {
        return;
    }
    if (fake_now() > end) {
        fprintf(stderr, "fake NCCL: rank %d waited %d s for the other ranks "
                "of %s to %s its collective %llu (device collective %llu): "
                "a rank never issued it\n", op->comm->rank, FAKE_WAIT_S,
                op->comm->name, what, (unsigned long long)op->is.seq,
                (unsigned long long)op->is.devseq);
        _exit(86);
    }
}

/* Rank r's collective of the same number must be the same one. */
static void fake_compare(const struct ncclComm *c, const fake_issue_t *mine,
                         int r, const fake_issue_t *o)
{
    if (o->bytes != mine->bytes || o->root != mine->root ||
        o->devseq != mine->devseq) {
        fprintf(stderr, "fake NCCL: collective %llu of %s: rank %d issued "
                "it as its device's collective %llu (%s of %zu bytes), rank "
                "%d as %llu (%s of %zu bytes): the ranks issue collectives in "
                "different orders (real NCCL would swap data or hang)\n",
                (unsigned long long)mine->seq, c->name, c->rank,
                (unsigned long long)mine->devseq,
                mine->root < 0 ? "all-gather" : "broadcast", mine->bytes, r,
                (unsigned long long)o->devseq,
                o->root < 0 ? "all-gather" : "broadcast", o->bytes);
        _exit(86);
    }
}

/* At issue: compared with what the others issued under the same number
 * already, so that a mismatch fails at once instead of in a hang. */
static void fake_announce(struct ncclComm *c, const fake_issue_t *is)
{
    fake_slot_t *slot = &c->shm->slots[is->seq % FAKE_SLOTS];
    int          r;

    pthread_mutex_lock(&c->shm->mu);
    if (slot->seq == is->seq) {
        for (r = 0; r < c->nranks; ++r) {
            if (r != c->rank && slot->announced[r].bytes != 0 &&
                slot->announced[r].seq == is->seq) {
                fake_compare(c, is, r, &slot->announced[r]);
            }
        }
        slot->announced[c->rank] = *is;
    }
    pthread_mutex_unlock(&c->shm->mu);
}

/* What a stream runs: the collective, once every rank is in it. */
static void fake_run(void *arg)
{
    fake_op_t       *op   = arg;
    struct ncclComm *c    = op->comm;
    fake_shm_t      *shm  = c->shm;
    fake_slot_t     *slot = &shm->slots[op->is.seq % FAKE_SLOTS];
    const size_t     n    = op->is.bytes;
    double           end  = fake_now() + FAKE_WAIT_S;
    int              r;

    if (op->delay_ms > 0) {
        struct timespec ts = {op->delay_ms / 1000, (op->delay_ms % 1000) * 1000000L};

        nanosleep(&ts, NULL);
    }
    pthread_mutex_lock(&shm->mu);
    if (op->fails) {
        /* Never ends by itself; NCCL's proxy has seen the failure. */
        atomic_store(&c->async_error, 1);
        while (!atomic_load(&c->aborted)) {
            fake_wait(shm, op, end, "abort after the failure of");
        }
    }
    while (slot->seq != op->is.seq && !atomic_load(&c->aborted)) {
        fake_wait(shm, op, end, "free the slot of");
    }
    if (atomic_load(&c->aborted)) {
        goto out;
    }
    slot->issued[c->rank] = op->is;
    if (op->is.root < 0 || op->is.root == c->rank) {
        memcpy(slot->data[c->rank], op->send, n);
    }
    ++slot->arrived;
    pthread_cond_broadcast(&shm->cv);
    while (slot->arrived < c->nranks && !atomic_load(&c->aborted)) {
        fake_wait(shm, op, end, "reach");
    }
    if (atomic_load(&c->aborted)) {
        goto out;
    }
    for (r = 0; r < c->nranks; ++r) {
        fake_compare(c, &op->is, r, &slot->issued[r]);
    }
    for (r = 0; r < c->nranks; ++r) {
        if (op->is.root < 0) {
            memcpy((char *)op->recv + (size_t)r * n, slot->data[r], n);
        } else if (r == op->is.root && op->recv != NULL) {
            memcpy(op->recv, slot->data[r], n);
        }
    }
    if (++slot->left == c->nranks) {
        slot->arrived = slot->left = 0;
        slot->seq += FAKE_SLOTS;
        pthread_cond_broadcast(&shm->cv);
    }
out:
    pthread_mutex_unlock(&shm->mu);
    atomic_fetch_sub(&c->running, 1);
    free(op);
}

/* Numbered now, in the order the caller issues it; run on its stream. */
/*
 * NCCL's groups, per thread as NCCL's are: between ncclGroupStart and the
 * outermost ncclGroupEnd a thread's collectives are only recorded, and
 * they are issued (numbered, queued on their streams) at that end.
 */
#define FAKE_GROUP_OPS 64
typedef struct fake_deferred {
    struct ncclComm *comm;
    const void      *send;
    void            *recv;
    size_t           bytes;
    int              root;
    cudaStream_t     stream;
} fake_deferred_t;
static __thread int             fake_group_depth;
static __thread int             fake_group_n;
static __thread fake_deferred_t fake_group_ops[FAKE_GROUP_OPS];

static ncclResult_t fake_issue_now(struct ncclComm *c, const void *send,
                                   void *recv, size_t bytes, int root,
                                   cudaStream_t stream);

static ncclResult_t fake_issue(struct ncclComm *c, const void *send,
                               void *recv, size_t bytes, int root,
                               cudaStream_t stream)
{
    if (fake_group_depth == 0) {
        return fake_issue_now(c, send, recv, bytes, root, stream);
    }
    if (fake_group_n == FAKE_GROUP_OPS) {
        return ncclInvalidUsage;
    }
    fake_group_ops[fake_group_n++] = (fake_deferred_t){c, send, recv, bytes,
                                                       root, stream};
    return ncclSuccess;
}

static ncclResult_t fake_issue_now(struct ncclComm *c, const void *send,
                                   void *recv, size_t bytes, int root,
                                   cudaStream_t stream)
{
    static fake_stream_enqueue_t enqueue;
    fake_op_t                   *op;
    void                        *fn;

    const char                  *fail = getenv("FAKE_NCCL_COLLECTIVE");
    const char                  *delay = getenv("FAKE_NCCL_DELAY_MS");
    const char                  *async = getenv("FAKE_NCCL_ASYNC_ERROR");

    if (c == &fake_setup_comm) {
        return ncclSuccess; /* setup tests: no data moves */
    }
    if (c == NULL || bytes > FAKE_BYTES || root >= c->nranks ||
        atomic_load(&c->aborted)) {
        return ncclInvalidUsage;
    }
    if (fail != NULL && strcmp(fail, "fail") == 0) {
        return ncclSystemError;
    }
    op = calloc(1, sizeof(*op));
    if (op == NULL) {
        return ncclSystemError;
    }
    op->comm      = c;
    op->send      = send;
    op->recv      = recv;
    op->is.seq    = c->seq++;
    op->is.devseq = atomic_fetch_add(&fake_devseq, 1ull);
    op->is.bytes  = bytes;
    op->is.root   = root;
    op->delay_ms  = (delay != NULL) ? atoi(delay) : 0;
    op->fails     = (async != NULL && strtoull(async, NULL, 10) == op->is.seq);
    atomic_fetch_add(&c->running, 1);
    fake_announce(c, &op->is);
    if (enqueue == NULL && (fn = dlsym(RTLD_DEFAULT, FAKE_STREAM_ENQUEUE)) != NULL) {
        memcpy(&enqueue, &fn, sizeof(fn));
    }
    if (enqueue != NULL && stream != NULL) {
        enqueue(stream, fake_run, op);
    } else {
        fake_run(op);
    }
    return ncclSuccess;
}

#pragma GCC visibility push(default)

ncclResult_t ncclGetVersion(int *version)
{
    const char *v = getenv("FAKE_NCCL_VERSION");

    *version = (v != NULL) ? atoi(v) : 22800;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_uint n;
    const char        *mode = getenv("FAKE_NCCL_UNIQUE_ID");
    struct timespec    ts;

    if (mode != NULL && strcmp(mode, "fail") == 0) {
        return ncclSystemError;
    }
    clock_gettime(CLOCK_REALTIME, &ts);
    memset(id->internal, FAKE_ID_BYTE, sizeof(id->internal));
    snprintf(id->internal + FAKE_ID_CHECK, 48, "%d-%ld-%u", (int)getpid(),
             (long)ts.tv_nsec, atomic_fetch_add(&n, 1u));
    return ncclSuccess;
}

static int fake_init_hangs(void)
{
    const char *mode = getenv("FAKE_NCCL_INIT");

    return mode != NULL && strcmp(mode, "hang") == 0;
}

static ncclResult_t fake_init(ncclComm_t *comm, int nranks, ncclUniqueId id,
                              int rank)
{
    size_t i;

    struct ncclComm *c;

    for (i = 0; i < FAKE_ID_CHECK; ++i) {
        if ((unsigned char)id.internal[i] != FAKE_ID_BYTE) {
            return ncclInvalidArgument;
        }
    }
    if (nranks < 1 || rank < 0 || rank >= nranks || nranks > FAKE_RANKS) {
        return ncclInvalidArgument;
    }
    if (getenv("FAKE_NCCL_COLLECTIVES") == NULL) {
        *comm = &fake_setup_comm; /* setup tests: no data moves */
        return ncclSuccess;
    }
    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return ncclSystemError;
    }
    c->rank   = rank;
    c->nranks = nranks;
    snprintf(c->name, sizeof(c->name), "/fake-nccl-%.40s",
             id.internal + FAKE_ID_CHECK);
    c->shm = fake_shm_open(c->name);
    if (c->shm == NULL) {
        free(c);
        return ncclSystemError;
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id,
                              int rank)
{
    if (fake_init_hangs()) {
        struct timespec ts = {FAKE_WAIT_S, 0};

        nanosleep(&ts, NULL); /* a peer that never joins */
        return ncclSystemError;
    }
    return fake_init(comm, nranks, id, rank);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                    ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    static struct ncclComm hanging;
    ncclResult_t           r;

    if (config == NULL || config->blocking != 0) {
        return ncclCommInitRank(comm, nranks, id, rank);
    }
    if (fake_init_hangs()) {
        hanging.init_hangs = 1;
        *comm              = &hanging;
        return ncclInProgress;
    }
    r = fake_init(comm, nranks, id, rank);
    return (r == ncclSuccess) ? ncclInProgress : r;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    if (comm == NULL || state == NULL) {
        return ncclInvalidArgument;
    }
    *state = comm->init_hangs ? ncclInProgress
           : atomic_load(&comm->async_error) ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    double end = fake_now() + FAKE_WAIT_S;

    if (comm == NULL) {
        return ncclInvalidArgument;
    }
    /* As NCCL's: after the work queued on the communicator has run. */
    while (comm != &fake_setup_comm && atomic_load(&comm->running) > 0) {
        struct timespec ts = {0, 1000000};

        if (fake_now() > end) {
            fprintf(stderr, "fake NCCL: ncclCommDestroy of %s waited %d s "
                    "for its collectives (a peer never joined: abort it)\n",
                    comm->name, FAKE_WAIT_S);
            _exit(86);
        }
        nanosleep(&ts, NULL);
    }
    if (comm != &fake_setup_comm) {
        munmap(comm->shm, sizeof(*comm->shm));
        if (comm->rank == 0) {
            shm_unlink(comm->name);
        }
        free(comm);
    }
    return ncclSuccess;
}

/* Ends the collectives in flight (their streams run on), then frees. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    double end = fake_now() + FAKE_WAIT_S;

    if (comm == NULL) {
        return ncclInvalidArgument;
    }
    if (comm->init_hangs) {
        return ncclSuccess;
    }
    atomic_store(&comm->aborted, 1);
    while (comm != &fake_setup_comm && atomic_load(&comm->running) > 0 &&
           fake_now() < end) {
        struct timespec ts = {0, 1000000};

        nanosleep(&ts, NULL);
    }
    if (atomic_load(&comm->running) > 0) {
        return ncclSuccess; /* a stream is stuck inside: leave it mapped */
    }
    return ncclCommDestroy(comm);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count,
                           ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream)
{
    return fake_issue(comm, send, recv, count * fake_type_size(type), -1,
                      stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count,
                           ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    return fake_issue(comm, send, recv, count * fake_type_size(type), root,
                      stream);
}

/* A send and its receive on a communicator of two: a broadcast from the
 * sender, numbered as the collectives are (so one direction at a time). */
ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type,
                      int peer, ncclComm_t comm, cudaStream_t stream)
{
    if (comm == NULL || comm == &fake_setup_comm || comm->nranks != 2 ||
        peer != 1 - comm->rank) {
        return ncclInvalidUsage;
    }
    return fake_issue(comm, buf, NULL, count * fake_type_size(type), comm->rank,
                      stream);
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    if (comm == NULL || comm == &fake_setup_comm || comm->nranks != 2 ||
        peer != 1 - comm->rank) {
        return ncclInvalidUsage;
    }
    return fake_issue(comm, NULL, buf, count * fake_type_size(type), peer,
                      stream);
}

ncclResult_t ncclGroupStart(void)
{
    ++fake_group_depth;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    ncclResult_t r = ncclSuccess, one;
    int          i;

    if (fake_group_depth == 0) {
        return ncclInvalidUsage; /* as NCCL: not in a group */
    }
    if (--fake_group_depth > 0) {
        return ncclSuccess;
    }
    for (i = 0; i < fake_group_n; ++i) {
        fake_deferred_t *d = &fake_group_ops[i];

        one = fake_issue_now(d->comm, d->send, d->recv, d->bytes, d->root,
                             d->stream);
        r   = (r == ncclSuccess) ? one : r;
    }
    fake_group_n = 0;
    return r;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error (fake NCCL)";
    case ncclSystemError: return "unhandled system error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument (fake NCCL)";
    case ncclRemoteError: return "remote process exited or there was a network error (fake NCCL)";
    default: return "not implemented by the fake NCCL";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "fake NCCL";
}

#pragma GCC visibility pop
