/*
 * A fake GPU for the multi-process tests of the device path (gather_order,
 * nccl_faults): FAKE_GPU_NDEV devices whose memory is one arena of host
 * memory (f_arena, FAKE_GPU_SPAN bytes a device; the test allocates it),
 * streams that run what is queued on them in order on threads of their own
 * (fake_stream.h: the fake NCCL queues its collectives there), events,
 * copies ordered on their stream, and each thread's current context.
 *
 * Two models of a real GPU's hazards:
 *   - contexts: every call checks the calling thread's current context; a
 *     call from a thread with none, or on a stream or memory of another
 *     device than the current one, is counted in f_wrong (the first said);
 *   - one queue: with FAKE_GPU_ONE_QUEUE=1 every stream of the process
 *     feeds one FIFO, as CUDA_DEVICE_MAX_CONNECTIONS=1 puts every stream
 *     on one hardware queue, so a wait at its head holds back all work
 *     queued after it, on any stream (past FAKE_GPU_WAIT_S the process
 *     exits with 87, naming the wait).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_FAKE_GPU_H
#define SL_FAKE_GPU_H

#include "fake_stream.h"
#include "gpu.h"

#include <stdatomic.h>

#define FAKE_GPU_NDEV   2
#define FAKE_GPU_ARENA  ((size_t)16 << 20)
#define FAKE_GPU_SPAN   (FAKE_GPU_ARENA / FAKE_GPU_NDEV)
#define FAKE_GPU_WAIT_S 60

/** A context: a device's primary one (f_primary), or one the host made on
 *  device 0 (f_own, as cuCtxCreate). */
typedef struct fctx {
    int device;
} fctx_t;

typedef struct fstream fstream_t;

extern const sl_gpu_ops_t fake_gpu;
extern char              *f_arena;
extern fctx_t             f_primary[FAKE_GPU_NDEV];
extern fctx_t             f_own;
extern __thread fctx_t   *f_ctx;   /**< the calling thread's; NULL: none */
extern atomic_int         f_wrong; /**< calls the context model refused */

/** The current device, -1 without a context; make device's primary current. */
int         f_dev(void);
void        f_use(int device);
/** Checks a call `what` on `device` (-1: any) against the thread's context. */
void        f_on(const char *what, int device);
int         f_one_queue_mode(void);
double      now_s(void);
void        nap(void);

sl_status_t f_stream_create(void **out, sl_errbuf_t *eb);
void        f_stream_destroy(void *stream);
/** A kernel of `ms` milliseconds; hold (1) or release (0) the stream;
 *  until everything queued on it so far has run. */
void        fstream_kernel(fstream_t *s, int ms);
void        fstream_hold(fstream_t *s, int held);
void        fstream_sync(fstream_t *s);
/** Runs fn(arg) on `stream` after what is queued there (exported for the
 *  fake NCCL, which finds it with dlsym: link with -rdynamic). */
void        fake_stream_enqueue(void *stream, fake_stream_fn_t fn, void *arg);

#endif
