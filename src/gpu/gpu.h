/*
 * What the plugin needs from a GPU runtime, as one ops table: pointer
 * classification, pinned host memory, streams, events, asynchronous
 * copies.  The CUDA implementation is built where CUDA is found; the host
 * one says "no device"; tests substitute their own (a fake device whose
 * memory the network must never touch).  SPDX-License-Identifier: MIT
 */
#ifndef SL_GPU_H
#define SL_GPU_H

#include "sl_error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct sl_gpu_ops {
    const char *name;
    /** 1 when a device is usable, else 0 with the runtime's reason in `why`. */
    int         (*probe)(char *why, size_t len);
    /** PCI addresses of the visible devices ("0000:1B:00.0"), at most
     *  `max`; their count, and in *current the calling thread's device. */
    int         (*pci_bus_ids)(char (*ids)[16], int max, int *current);
    /** Memory type of `ptr`; host for memory the runtime does not know,
     *  STAGELINK_MEM_AUTO when the runtime cannot say (a broken context).
     *  In *device the device that holds it (-1: none, or host memory). */
    stagelink_mem_type_t (*classify)(const void *ptr, int *device);
    /** 1 when the calling thread has a current GPU context, i.e. the
     *  application works on the GPU from it; asking creates none (NULL:
     *  cannot tell, taken as 1). */
    int         (*thread_on_gpu)(void);
    void       *(*host_alloc)(size_t len, void *ctx);  /**< pinned */
    void        (*host_free)(void *ptr, void *ctx);
    sl_status_t (*stream_create)(void **stream, sl_errbuf_t *eb);
    void        (*stream_destroy)(void *stream);
    sl_status_t (*event_create)(void **event, sl_errbuf_t *eb);
    void        (*event_destroy)(void *event);
    sl_status_t (*event_record)(void *event, void *stream, sl_errbuf_t *eb);
    /** 1 when the event completed, 0 while pending; errors in *status. */
    int         (*event_query)(void *event, sl_status_t *status,
                               sl_errbuf_t *eb);
    /** Work queued later on `stream` waits for `event`. */
    sl_status_t (*stream_wait_event)(void *stream, void *event,
                                     sl_errbuf_t *eb);
    /** Copies in any direction, ordered on `stream`. */
    sl_status_t (*copy_async)(void *dst, const void *src, size_t len,
                              void *stream, sl_errbuf_t *eb);
    /** The calling thread's device, -1 when it has no current context
     *  (NULL: no device). */
    int         (*device_current)(void);
    /** Makes `device` (its primary context) current on the calling thread;
     *  -1 leaves the thread without a current context. */
    sl_status_t (*device_set)(int device, sl_errbuf_t *eb);
    /** The calling thread's current context (CUcontext), NULL: none.  A
     *  host may run a context of its own (cuCtxCreate, green contexts), so
     *  contexts, not device numbers, are what a call saves and gives back. */
    void       *(*context_current)(void);
    /** Makes `ctx` current on the calling thread (NULL: none). */
    sl_status_t (*context_set)(void *ctx, sl_errbuf_t *eb);
    /** 1 when device memory at `ptr` can be shared through CUDA's legacy
     *  IPC (cudaMalloc), as UCX's cuda_ipc shares it; 0 for the virtual
     *  memory API and memory pools (NULL: always 1). */
    int         (*ipc_capable)(const void *ptr);
    /** 1 when RDMA writes into `device`'s memory must be flushed before
     *  its kernels read them (below compute capability 9.0, as NCCL does);
     *  NULL: never. */
    int         (*rdma_flush_needed)(int device);
    /** 1 when `device`'s driver exports its memory as DMA-BUF (UCX 1.14
     *  and later register that for GPU-direct RDMA), 0 when not, -1 when
     *  it cannot say (NULL: -1). */
    int         (*dmabuf_supported)(int device);
    /** Makes RDMA writes so far visible to the current device's work. */
    sl_status_t (*rdma_flush)(sl_errbuf_t *eb);
    /** Device memory on the current device (NCCL's warm-up buffer). */
    sl_status_t (*dev_alloc)(size_t len, void **ptr, sl_errbuf_t *eb);
    void        (*dev_free)(void *ptr);
} sl_gpu_ops_t;

/** CUDA where the build has it, else the host-only table. */
extern const sl_gpu_ops_t sl_gpu_default_ops;

/* gpu_context.c: a call's context, for either plugin. */

/** What a call found current, to give back on return. */
typedef struct sl_gpu_entry {
    const sl_gpu_ops_t *gpu;   /**< NULL: no context is touched */
    void               *saved; /**< the caller's context, NULL: none */
} sl_gpu_entry_t;

/** The runtime can say and set the calling thread's context. */
int         sl_gpu_has_contexts(const sl_gpu_ops_t *g);
/** `device`'s primary context; the caller's stays current. */
sl_status_t sl_gpu_context_of(const sl_gpu_ops_t *g, int device, void **ctx,
                              sl_errbuf_t *eb);
/** `ctx` (NULL: leave the thread's) becomes current on the calling thread ... */
void        sl_gpu_enter(const sl_gpu_ops_t *g, void *ctx, sl_gpu_entry_t *e,
                         sl_errbuf_t *eb);
/** ... and the caller's comes back. */
void        sl_gpu_leave(sl_gpu_entry_t *e);

#endif
