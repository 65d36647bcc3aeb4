/*
 * Device memory: what the GPU runtime and UCX can do, the pinned bounce
 * buffers, copy stream and events of staged chunks (ucx_chunked.c moves the
 * chunks), and ordering with the host's stream.  A device pointer never
 * reaches a UCX without CUDA: that UCX would take it for host memory and
 * crash.
 *
 * Ordering with the host's stream: at post, an event is recorded on the
 * transfer's stream and the request is deferred until it completes, so a
 * send reads the tensor only after the work queued before it, and a receive
 * writes only after it.  The host thread is never blocked for it: progress
 * polls the event.  SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_topo.h"

#include "sl_log.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const sl_gpu_ops_t *sl_device_runtime = &sl_gpu_default_ops;

sl_status_t sl_device_probe(sl_comm_t *comm, const stagelink_config_t *config)
{
    int saved;

    comm->gpu        = sl_device_runtime;
    comm->gpu_usable = comm->gpu->probe(comm->gpu_why, sizeof(comm->gpu_why));
    comm->device     = -1;
    if (config->flags & STAGELINK_CONFIG_DEVICE_SET) {
        if (!comm->gpu_usable || comm->gpu->device_set == NULL ||
            comm->gpu->device_current == NULL) {
            return sl_error(&comm->err, STAGELINK_ERR_CONFIG, "the config "
                            "names CUDA device %d (STAGELINK_CONFIG_DEVICE_SET), "
                            "but %s", config->device, comm->gpu_usable
                            ? "the GPU runtime cannot select a device"
                            : comm->gpu_why);
        }
        if (config->device < 0) {
            return sl_error(&comm->err, STAGELINK_ERR_CONFIG, "the config "
                            "names CUDA device %d (STAGELINK_CONFIG_DEVICE_SET): "
                            "give a device ordinal, 0 or more", config->device);
        }
        /* Checked here, made current by each call (the caller's stays). */
        saved = comm->gpu->device_current();
        SL_CHECK(comm->gpu->device_set(config->device, &comm->err));
        comm->gpu->device_set(saved, &comm->err);
        comm->device = config->device;
    } else if (comm->gpu_usable && comm->gpu->device_current != NULL) {
        /* The host chose it (torch.cuda.set_device before init). */
        comm->device = comm->gpu->device_current();
    }
    return STAGELINK_SUCCESS;
}

void sl_device_enter(sl_comm_t *comm, sl_device_entry_t *e)
{
    e->gpu   = comm->gpu;
    e->saved = -1;
    e->set   = comm->device;
    if (comm->gpu == NULL || comm->gpu->device_current == NULL ||
        comm->gpu->device_set == NULL || !comm->gpu_usable) {
        e->gpu = NULL;
        return;
    }
    e->saved = comm->gpu->device_current();
    if (comm->device >= 0 && e->saved != comm->device) {
        /* A failure shows in the call's own CUDA work, with its sentence. */
        comm->gpu->device_set(comm->device, &comm->err);
    }
}

void sl_device_leave(sl_comm_t *comm, sl_device_entry_t *e)
{
    sl_errbuf_t drop;
    int         set = (comm != NULL) ? comm->device : e->set;

    /* The caller's device (or none) again, as it was before the call. */
    if (e->gpu != NULL && set >= 0 && e->saved != set) {
        e->gpu->device_set(e->saved, &drop);
    }
}

sl_status_t sl_device_adopt(sl_comm_t *comm, int device)
{
    if (comm->gpu->device_set == NULL) {
        return STAGELINK_SUCCESS; /* a runtime with no device to choose */
    }
    SL_CHECK(comm->gpu->device_set(device, &comm->err));
    comm->device = device;
    SL_INFO(SL_SUBSYS_INIT, "CUDA device %d (of the first device tensor: no "
            "device was current at comm_init)", device);
    return STAGELINK_SUCCESS;
}

int sl_device_topo_gpus(sl_comm_t *comm, const char *root, sl_topo_t *t)
{
    char ids[SL_TOPO_MAX_GPUS][16];
    int  current = -1;

    /* CUDA names this rank's GPU by PCI address; the node's GPUs come from
     * the PCI tree, however few of them this process sees. */
    if (comm->gpu_usable &&
        comm->gpu->pci_bus_ids(ids, SL_TOPO_MAX_GPUS, &current) > current &&
        current >= 0) {
        return sl_topo_place_gpu(t, root, ids[current]);
    }
    /* No usable runtime: local rank i drives GPU i. */
    sl_topo_discover_gpus(root, t);
    return (t->ngpus > 0) ? comm->local_rank % t->ngpus : -1;
}

/* The libucp the dynamic linker chose (-Ducx_prefix's run path, or
 * LD_LIBRARY_PATH, decides which) and whether that UCX was built with CUDA:
 * its libuct_cuda module sits in the module directory (under the name UCX
 * loads, or the runtime package's versioned one).  A UCX built with CUDA
 * that reports no CUDA memory type found no driver, was told UCX_TLS
 * without cuda, or could not load its CUDA runtime. */
int sl_device_ucx_build(char *out, size_t len)
{
    static const char *const names[] = {"libuct_cuda.so", "libuct_cuda.so.0"};
    const char *env_dir = getenv("UCX_MODULE_DIR");
    const char *(*in_libucp)(void) = ucp_get_version_string;
    char        lib[PATH_MAX] = "", dir[PATH_MAX] = "", module[PATH_MAX + 32];
    char       *slash;
    void       *addr;
    Dl_info     info;
    size_t      i;
    int         with_cuda = 0;

    /* ISO C has no cast from a function pointer to void *: copy it. */
    memcpy(&addr, &in_libucp, sizeof(addr));
    if (dladdr(addr, &info) && info.dli_fname != NULL &&
        realpath(info.dli_fname, lib) == NULL) {
        snprintf(lib, sizeof(lib), "%s", info.dli_fname);
    }
    if (env_dir != NULL && env_dir[0] != '\0') {
        snprintf(dir, sizeof(dir), "%s", env_dir);
    } else if ((slash = strrchr(lib, '/')) != NULL) {
        /* UCX linked into the executable, or no dladdr: no directory. */
        snprintf(dir, sizeof(dir), "%.*s/ucx", (int)(slash - lib), lib);
    }
    for (i = 0; dir[0] != '\0' && i < sizeof(names) / sizeof(names[0]); ++i) {
        snprintf(module, sizeof(module), "%s/%s", dir, names[i]);
        with_cuda = with_cuda || access(module, F_OK) == 0;
    }
    snprintf(out, len, "%s, built %s CUDA", lib[0] ? lib : "libucp (path unknown)",
             with_cuda ? "with" : "without");
    return with_cuda;
}

static const sl_progress_hook_t sl_device_hook;

sl_status_t sl_device_init(sl_comm_t *comm)
{
    ucp_context_attr_t attr;
    char               build[PATH_MAX + 64];

    sl_ucx_progress_register(comm, &sl_device_hook);
    /* An explicit UCX_TLS without cuda hides CUDA from this bitmap too. */
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(comm->ucp_ctx, &attr) == UCS_OK) {
        comm->ucx_cuda = !!(attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    }
    sl_device_ucx_build(build, sizeof(build));
    SL_INFO(SL_SUBSYS_INIT, "GPU runtime %s: %s; UCX %s (%s), memory types "
            "0x%llx (CUDA %s)", comm->gpu->name, comm->gpu_why,
            ucp_get_version_string(), build,
            (unsigned long long)attr.memory_types,
            comm->ucx_cuda ? "yes: GPU-direct" : "no: device buffers are staged");
    return STAGELINK_SUCCESS;
}

void sl_device_cleanup(sl_comm_t *comm)
{
    int i;

    for (i = 0; i < comm->nevents; ++i) {
        comm->gpu->event_destroy(comm->events[i]);
    }
    free(comm->events);
    comm->events  = NULL;
    comm->nevents = comm->events_cap = 0;
    if (comm->copy_stream != NULL) {
        comm->gpu->stream_destroy(comm->copy_stream);
        comm->copy_stream = NULL;
    }
    if (comm->staging.bufs[0] != NULL) {
        sl_staging_pool_cleanup(&comm->staging, comm->gpu->host_free, NULL);
    }
}

/* Events are reused: none is created per transfer in steady state. */
sl_status_t sl_device_event_get(sl_comm_t *comm, void **event)
{
    if (comm->nevents > 0) {
        *event = comm->events[--comm->nevents];
        return STAGELINK_SUCCESS;
    }
    return comm->gpu->event_create(event, &comm->err);
}

void sl_device_event_put(sl_comm_t *comm, void *event)
{
    void **grown;

    if (comm->nevents == comm->events_cap) {
        grown = realloc(comm->events,
                        (size_t)(comm->events_cap * 2 + 8) * sizeof(void *));
        if (grown == NULL) {
            comm->gpu->event_destroy(event);
            return;
        }
        comm->events     = grown;
        comm->events_cap = comm->events_cap * 2 + 8;
    }
    comm->events[comm->nevents++] = event;
}

sl_status_t sl_device_prepare(sl_req_t *req)
{
    sl_comm_t *comm = req->comm;

    if (!comm->path_logged) {
        comm->path_logged = 1;
        SL_INFO(SL_SUBSYS_NET, "device buffers: %s", comm->ucx_cuda
                ? "GPU-direct, UCX reports CUDA memory"
                : "staged through pinned host buffers, UCX reports no CUDA "
                  "memory type (built without CUDA, or UCX_TLS leaves out "
                  "cuda)");
    }
    SL_CHECK(sl_device_event_get(comm, &req->stream_event));
    if (comm->gpu->event_record(req->stream_event, req->xfer.stream,
                                &comm->err) != STAGELINK_SUCCESS) {
        sl_device_event_put(comm, req->stream_event);
        req->stream_event = NULL;
        return STAGELINK_ERR_TRANSPORT;
    }
    req->deferred_next = comm->deferred;
    comm->deferred     = req;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_device_order(sl_req_t *req, void *stream)
{
    sl_comm_t  *comm = req->comm;
    void       *event;
    sl_status_t status;

    SL_CHECK(sl_device_event_get(comm, &event));
    status = comm->gpu->event_record(event, req->xfer.stream, &comm->err);
    if (status == STAGELINK_SUCCESS) {
        status = comm->gpu->stream_wait_event(stream, event, &comm->err);
    }
    /* The stream holds what it waits for: the event can be reused. */
    sl_device_event_put(comm, event);
    return status;
}

/* --- staging copies on the plugin's own stream ------------------------- */

sl_status_t sl_device_copy_start(void *ctx, sl_staging_xfer_t *x,
                                     void *dst, const void *src, size_t len,
                                     int to_device, void **token)
{
    sl_comm_t  *comm = ctx;
    sl_status_t status;

    (void)x, (void)to_device;
    SL_CHECK(sl_device_event_get(comm, token));
    status = comm->gpu->copy_async(dst, src, len, comm->copy_stream, &comm->err);
    if (status == STAGELINK_SUCCESS) {
        status = comm->gpu->event_record(*token, comm->copy_stream, &comm->err);
    }
    if (status != STAGELINK_SUCCESS) {
        sl_device_event_put(comm, *token);
        *token = NULL;
        return status;
    }
    ++comm->staged_chunks;
    return STAGELINK_SUCCESS;
}

int sl_device_copy_test(void *ctx, void *token, sl_status_t *status)
{
    sl_comm_t *comm = ctx;

    if (!comm->gpu->event_query(token, status, &comm->err)) {
        return 0;
    }
    sl_device_event_put(comm, token);
    return 1;
}

/* Bounce buffers and the copy stream exist only once a transfer needs them. */
sl_status_t sl_device_staging_ready(sl_comm_t *comm)
{
    if (comm->staging.bufs[0] != NULL) {
        return STAGELINK_SUCCESS;
    }
    sl_status_t status;

    SL_CHECK(comm->gpu->stream_create(&comm->copy_stream, &comm->err));
    status = sl_staging_pool_init(&comm->staging, comm->chunk, comm->nbufs,
                                  comm->gpu->host_alloc, NULL, &comm->err);
    if (status != STAGELINK_SUCCESS) {
        /* Half a pool must not pass for a ready one (bufs[0] is the test). */
        sl_staging_pool_cleanup(&comm->staging, comm->gpu->host_free, NULL);
        comm->gpu->stream_destroy(comm->copy_stream);
        comm->copy_stream = NULL;
        /* Chunks moved in place still size their window by the pool. */
        comm->staging.chunk = comm->chunk;
        comm->staging.nbufs = comm->nbufs;
        return status;
    }
    SL_INFO(SL_SUBSYS_NET, "staging pool: 2 x %d pinned buffers of %zu bytes",
            comm->nbufs, comm->chunk);
    return STAGELINK_SUCCESS;
}

static void sl_device_progress_deferred(sl_comm_t *comm)
{
    sl_req_t  **link = &comm->deferred, *req;
    sl_status_t status;

    while ((req = *link) != NULL) {
        status = req->status;
        if (!comm->gpu->event_query(req->stream_event, &status, &comm->err)) {
            link = &req->deferred_next;
            continue;
        }
        *link = req->deferred_next;
        sl_device_event_put(comm, req->stream_event);
        req->stream_event = NULL;
        req->stream_ready(req, status); /* its owner starts it, or fails it */
    }
}

static int sl_device_busy(const sl_comm_t *comm)
{
    return comm->deferred != NULL; /* stream events wake no fd */
}

static const sl_progress_hook_t sl_device_hook = {
    .round = sl_device_progress_deferred,
    .busy  = sl_device_busy,
};
