/*
 * The fake GPU of the multi-process tests of the device path (see
 * fake_gpu.h).  SPDX-License-Identifier: MIT
 */
#include "fake_gpu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Device d's memory is f_arena[d * FAKE_GPU_SPAN, (d + 1) * FAKE_GPU_SPAN). */
char *f_arena;

/*
 * The calling thread's current context, NULL while it has none: a device's
 * primary one, or one the host made itself on device 0 (cuCtxCreate).  What
 * the plugin must never make (counted, the first said): a GPU call from a
 * thread without a current context (the runtime would make device 0's
 * primary current there, UCX's cuda_ipc would fail), or on a stream or
 * memory of another device than the current one.  A pointer query needs
 * none and makes none (the driver's answers from the address space).
 */
fctx_t            f_primary[FAKE_GPU_NDEV] = {{0}, {1}};
fctx_t            f_own           = {0};
__thread fctx_t  *f_ctx;
atomic_int        f_wrong;

int  f_dev(void) { return f_ctx ? f_ctx->device : -1; }
void f_use(int device) { f_ctx = (device < 0) ? NULL : &f_primary[device]; }

static int f_dev_of(const void *p)
{
    return ((const char *)p >= f_arena && (const char *)p < f_arena + FAKE_GPU_ARENA)
               ? (int)(((const char *)p - f_arena) / FAKE_GPU_SPAN) : -1;
}

void f_on(const char *what, int device)
{
    if (f_ctx == NULL) {
        if (atomic_fetch_add(&f_wrong, 1) == 0) {
            fprintf(stderr, "fake GPU: %s from a thread with no current "
                    "context\n", what);
        }
        f_use(0); /* the runtime's implicit context */
        return;
    }
    if (device >= 0 && device != f_dev() &&
        atomic_fetch_add(&f_wrong, 1) == 0) {
        fprintf(stderr, "fake GPU: %s of device %d from a thread whose "
                "current device is %d\n", what, device, f_dev());
    }
}

typedef struct item {
    fake_stream_fn_t fn;
    void            *arg;
    struct item     *next;
} item_t;

struct fstream {
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    item_t         *head, *tail;
    int             held, stop, busy;
    int             device;
    pthread_t       thread;
    struct fstream *queue; /* where its work runs: itself, or the one queue */
};

/*
 * FAKE_GPU_ONE_QUEUE=1: every stream feeds one FIFO, as
 * CUDA_DEVICE_MAX_CONNECTIONS=1 puts every stream on one hardware queue,
 * so a wait at its head holds back all work queued after it, on any stream.
 */
static fstream_t *f_one_queue;

int f_one_queue_mode(void)
{
    const char *one = getenv("FAKE_GPU_ONE_QUEUE");

    return one != NULL && strcmp(one, "1") == 0;
}

/* One record of an event: a wait holds the record it saw, as CUDA's does,
 * so that the event recorded again meanwhile (the plugin reuses events)
 * neither releases nor holds it. */
typedef struct fmark {
    atomic_int refs, done;
} fmark_t;

typedef struct fevent {
    fmark_t *last; /* NULL: never recorded, complete */
} fevent_t;

double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void nap(void)
{
    struct timespec ts = {0, 20000};

    nanosleep(&ts, NULL);
}

static void *fstream_main(void *arg)
{
    fstream_t *s = arg;
    item_t    *it;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && (s->held || s->head == NULL)) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->head == NULL) {
            break; /* stopped and drained */
        }
        it      = s->head;
        s->head = it->next;
        if (s->head == NULL) {
            s->tail = NULL;
        }
        s->busy = 1;
        pthread_mutex_unlock(&s->mu);
        it->fn(it->arg);
        free(it);
        pthread_mutex_lock(&s->mu);
        s->busy = 0;
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

__attribute__((visibility("default")))
void fake_stream_enqueue(void *stream, fake_stream_fn_t fn, void *arg)
{
    fstream_t *s  = ((fstream_t *)stream)->queue;
    item_t    *it = calloc(1, sizeof(*it));

    if (it == NULL) {
        abort();
    }
    it->fn  = fn;
    it->arg = arg;
    pthread_mutex_lock(&s->mu);
    if (s->tail != NULL) {
        s->tail->next = it;
    } else {
        s->head = it;
    }
    s->tail = it;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* A kernel of `ms` milliseconds on the stream. */
static void kernel_run(void *arg)
{
    struct timespec ts = {0, (long)(intptr_t)arg * 1000000L};

    nanosleep(&ts, NULL);
}

void fstream_kernel(fstream_t *s, int ms)
{
    fake_stream_enqueue(s, kernel_run, (void *)(intptr_t)ms);
}

void fstream_hold(fstream_t *stream, int held)
{
    fstream_t *s = stream->queue;

    pthread_mutex_lock(&s->mu);
    s->held = held;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Until everything queued so far has run. */
void fstream_sync(fstream_t *stream)
{
    fstream_t *s = stream->queue;

    pthread_mutex_lock(&s->mu);
    while (s->head != NULL || s->busy) {
        pthread_cond_wait(&s->cv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

static fstream_t *fstream_start(int device)
{
    fstream_t *s = calloc(1, sizeof(*s));

    if (s == NULL) {
        abort();
    }
    s->device = device;
    s->queue  = s;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_create(&s->thread, NULL, fstream_main, s);
    return s;
}

sl_status_t f_stream_create(void **out, sl_errbuf_t *eb)
{
    fstream_t *s;

    (void)eb;
    f_on("stream create", -1);
    if (!f_one_queue_mode()) {
        *out = fstream_start(f_dev());
        return STAGELINK_SUCCESS;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        abort();
    }
    if (f_one_queue == NULL) {
        f_one_queue = fstream_start(-1); /* the plugin creates streams under its lock */
    }
    s->device = f_dev();
    s->queue  = f_one_queue;
    *out      = s;
    return STAGELINK_SUCCESS;
}

void f_stream_destroy(void *stream)
{
    fstream_t *s = stream;

    if (s->queue != s) {
        fstream_sync(s);
        free(s);
        return;
    }
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    s->held = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    free(s);
}

static void fmark_unref(fmark_t *m)
{
    if (m != NULL && atomic_fetch_sub(&m->refs, 1) == 1) {
        free(m);
    }
}

static sl_status_t f_event_create(void **out, sl_errbuf_t *eb)
{
    (void)eb;
    *out = calloc(1, sizeof(fevent_t));
    return STAGELINK_SUCCESS;
}

static void f_event_destroy(void *event)
{
    fevent_t *ev = event;

    fmark_unref(ev->last);
    free(ev);
}

static void mark_done(void *arg)
{
    fmark_t *m = arg;

    atomic_store(&m->done, 1);
    fmark_unref(m);
}

/* The plugin records, queries and waits on an event under its own lock;
 * only the streams' threads run concurrently with it. */
static sl_status_t f_event_record(void *event, void *stream, sl_errbuf_t *eb)
{
    fevent_t *ev = event;
    fmark_t  *m  = calloc(1, sizeof(*m));

    (void)eb;
    f_on("event record on a stream", stream ? ((fstream_t *)stream)->device : -1);
    if (m == NULL) {
        abort();
    }
    atomic_store(&m->refs, 2); /* the event's, and the stream's */
    fmark_unref(ev->last);
    ev->last = m;
    if (stream == NULL) {
        mark_done(m);
    } else {
        fake_stream_enqueue(stream, mark_done, m);
    }
    return STAGELINK_SUCCESS;
}

static int f_event_query(void *event, sl_status_t *st, sl_errbuf_t *eb)
{
    fevent_t *ev = event;

    (void)eb;
    f_on("event query", -1);
    *st = STAGELINK_SUCCESS;
    return ev->last == NULL || atomic_load(&ev->last->done);
}

static void wait_mark(void *arg)
{
    fmark_t *m   = arg;
    double   end = now_s() + FAKE_GPU_WAIT_S;

    while (!atomic_load(&m->done)) {
        if (now_s() > end) {
            fprintf(stderr, "fake GPU: a stream waited %d s for an event\n", FAKE_GPU_WAIT_S);
            _exit(87);
        }
        nap();
    }
    fmark_unref(m);
}

static sl_status_t f_stream_wait_event(void *stream, void *event, sl_errbuf_t *eb)
{
    fevent_t *ev = event;

    (void)eb;
    f_on("stream wait", ((fstream_t *)stream)->device);
    if (ev->last != NULL) {
        atomic_fetch_add(&ev->last->refs, 1);
        fake_stream_enqueue(stream, wait_mark, ev->last);
    }
    return STAGELINK_SUCCESS;
}

typedef struct fcopy {
    void       *dst;
    const void *src;
    size_t      len;
} fcopy_t;

static void copy_run(void *arg)
{
    fcopy_t *c = arg;

    memcpy(c->dst, c->src, c->len);
    free(c);
}

/* Ordered on the stream, as cudaMemcpyAsync is: it runs when the stream
 * (or the one queue) reaches it. */
static sl_status_t f_copy(void *dst, const void *src, size_t len, void *stream,
                          sl_errbuf_t *eb)
{
    fcopy_t *c = malloc(sizeof(*c));

    (void)eb;
    if (c == NULL) {
        abort();
    }
    f_on("copy on a stream", ((fstream_t *)stream)->device);
    f_on("copy of memory", f_dev_of(dst) >= 0 ? f_dev_of(dst) : f_dev_of(src));
    *c = (fcopy_t){dst, src, len};
    fake_stream_enqueue(stream, copy_run, c);
    return STAGELINK_SUCCESS;
}

static stagelink_mem_type_t f_classify(const void *p, int *device)
{
    *device = f_dev_of(p);
    return (*device >= 0) ? STAGELINK_MEM_CUDA : STAGELINK_MEM_HOST;
}

static int   f_device_current(void) { return f_dev(); }
static int   f_thread_on_gpu(void) { return f_ctx != NULL; }
static void *f_context_current(void) { return f_ctx; }

static sl_status_t f_context_set(void *ctx, sl_errbuf_t *eb)
{
    (void)eb;
    f_ctx = ctx;
    return STAGELINK_SUCCESS;
}

static sl_status_t f_device_set(int device, sl_errbuf_t *eb)
{
    if (device >= FAKE_GPU_NDEV) {
        return sl_error(eb, STAGELINK_ERR_TRANSPORT, "fake GPU: no device %d",
                        device);
    }
    f_use(device);
    return STAGELINK_SUCCESS;
}

static sl_status_t f_dev_alloc(size_t len, void **ptr, sl_errbuf_t *eb)
{
    f_on("device allocation", -1);
    *ptr = malloc(len); /* the fake NCCL only copies it */
    return (*ptr != NULL) ? STAGELINK_SUCCESS
                          : sl_error(eb, STAGELINK_ERR_NO_MEMORY, "fake GPU: no memory");
}

static void f_dev_free(void *ptr) { free(ptr); }

static int f_probe(char *why, size_t len) { snprintf(why, len, "fake GPU"); return 1; }
static void *f_host_alloc(size_t len, void *ctx) { (void)ctx; return malloc(len); }
static void f_host_free(void *p, void *ctx) { (void)ctx; free(p); }

/* GPUs of their own per rank, so that NCCL's one-rank-per-GPU rule holds. */
static int f_pci_bus_ids(char (*ids)[16], int max, int *current)
{
    const char *rank = getenv("RANK");
    int         d;

    for (d = 0; d < FAKE_GPU_NDEV && d < max; ++d) {
        snprintf(ids[d], 16, "0000:%02x:00.0",
                 1 + FAKE_GPU_NDEV * (rank ? atoi(rank) : 0) + d);
    }
    *current = f_dev();
    return d;
}

const sl_gpu_ops_t fake_gpu = {
    .name              = "fake-streams",
    .probe             = f_probe,
    .pci_bus_ids       = f_pci_bus_ids,
    .classify          = f_classify,
    .host_alloc        = f_host_alloc,
    .host_free         = f_host_free,
    .stream_create     = f_stream_create,
    .stream_destroy    = f_stream_destroy,
    .event_create      = f_event_create,
    .event_destroy     = f_event_destroy,
    .event_record      = f_event_record,
    .event_query       = f_event_query,
    .stream_wait_event = f_stream_wait_event,
    .copy_async        = f_copy,
    .thread_on_gpu     = f_thread_on_gpu,
    .device_current    = f_device_current,
    .device_set        = f_device_set,
    .context_current   = f_context_current,
    .context_set       = f_context_set,
    .dev_alloc         = f_dev_alloc,
    .dev_free          = f_dev_free,
};
