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

#include "sl_env.h"
#include "sl_gpudirect.h"
#include "sl_log.h"
#include "sl_settings.h"
#include "sl_topo.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const sl_gpu_ops_t *sl_device_runtime = &sl_gpu_default_ops;

/* A usable runtime that can say and set the calling thread's context. */
static int sl_device_contexts(const sl_comm_t *comm)
{
    return comm->gpu_usable && sl_gpu_has_contexts(comm->gpu);
}

sl_status_t sl_device_probe(sl_comm_t *comm, const stagelink_config_t *config)
{
    comm->gpu        = sl_device_runtime;
    comm->gpu_usable = comm->gpu->probe(comm->gpu_why, sizeof(comm->gpu_why));
    comm->device     = -1;
    comm->context    = NULL;
    if (config->flags & STAGELINK_CONFIG_DEVICE_SET) {
        if (!sl_device_contexts(comm)) {
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
        /* Its primary context, made current by each call (the caller's
         * stays). */
        SL_CHECK(sl_gpu_context_of(comm->gpu, config->device, &comm->context,
                                   &comm->err));
        comm->device = config->device;
    } else if (sl_device_contexts(comm) &&
               (comm->context = comm->gpu->context_current()) != NULL) {
        /* The host chose it (torch.cuda.set_device before init), and the
         * context it runs, its own or the device's primary. */
        comm->device = comm->gpu->device_current();
    }
    return STAGELINK_SUCCESS;
}

void sl_device_enter(sl_comm_t *comm, sl_gpu_entry_t *e)
{
    sl_gpu_enter(sl_device_contexts(comm) ? comm->gpu : NULL, comm->context, e,
                 &comm->err);
}

/* Where the communicator's GPU sits, once its device is known: its NUMA
 * node (the bounce buffers go there) and whether RDMA writes into it need
 * a flush. */
static void sl_device_place(sl_comm_t *comm)
{
    sl_topo_t *t = calloc(1, sizeof(*t));
    int        gpu;

    comm->gpu_numa = -1;
    if (t != NULL) {
        gpu = sl_device_topo_gpus(comm, sl_env_get(SL_ENV_SYSFS_ROOT), t);
        comm->gpu_numa = (gpu >= 0) ? t->gpus[gpu].numa : -1;
        free(t);
    }
    comm->gdr_flush = comm->ucx_gdr && comm->gpu_usable && comm->device >= 0 &&
                      comm->gpu->rdma_flush_needed != NULL &&
                      comm->gpu->rdma_flush_needed(comm->device);
}

sl_status_t sl_device_adopt(sl_comm_t *comm, int device)
{
    if (!sl_device_contexts(comm)) {
        return STAGELINK_SUCCESS; /* a runtime with no device to choose */
    }
    SL_CHECK(comm->gpu->device_set(device, &comm->err));
    comm->context = comm->gpu->context_current();
    comm->device  = device;
    sl_device_place(comm);
    SL_INFO(SL_SUBSYS_INIT, "CUDA device %d (of the first device tensor: no "
            "device was current at comm_init), NUMA node %d%s", device,
            comm->gpu_numa, comm->gdr_flush ? ", RDMA writes flushed" : "");
    return STAGELINK_SUCCESS;
}

int sl_device_topo_gpus(sl_comm_t *comm, const char *root, sl_topo_t *t)
{
    char ids[SL_TOPO_MAX_GPUS][16];
    int  current = -1, n;

    /* CUDA names the communicator's GPU by PCI address; the node's GPUs
     * come from the PCI tree, however few of them this process sees.  A
     * fake tree's GPUs are not this machine's. */
    if (comm->gpu_usable && comm->device >= 0 && root[0] == '\0') {
        n = comm->gpu->pci_bus_ids(ids, SL_TOPO_MAX_GPUS, &current);
        if (comm->device < n) {
            return sl_topo_place_gpu(t, root, ids[comm->device]);
        }
    }
    /* No device known yet, or a fake tree: local rank i drives GPU i. */
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
    const char *env_dir = sl_env_raw(SL_ENV_UCX_MODULE_DIR);
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

static int sl_device_remote(const sl_comm_t *comm, const sl_ucx_peer_t *peer)
{
    return strcmp(peer->node_id, comm->node_id) != 0;
}

int sl_device_path_direct(const sl_comm_t *comm, const sl_ucx_peer_t *peer)
{
    return comm->ucx_cuda &&
           (sl_device_remote(comm, peer) ? comm->ucx_gdr : comm->ucx_ipc);
}

sl_status_t sl_device_buffer_path(sl_comm_t *comm, const sl_ucx_peer_t *peer,
                                  const void *buf, int *direct)
{
    *direct = sl_device_path_direct(comm, peer) &&
              (sl_device_remote(comm, peer) || comm->gpu->ipc_capable == NULL ||
               comm->gpu->ipc_capable(buf));
    if (*direct || !sl_device_path_direct(comm, peer)) {
        return STAGELINK_SUCCESS;
    }
    /* UCX's cuda_ipc takes only legacy-IPC memory (1.13 calls
     * cuIpcGetMemHandle on it, and its cache aborts the process on some
     * failures; later ones export only a VMM region's first chunk). */
    if (comm->gpu_direct == SL_GPU_DIRECT_REQUIRE) {
        return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                        "STAGELINK_GPU_DIRECT=require, but device memory at "
                        "%p is not shareable through CUDA's legacy IPC (the "
                        "virtual memory API, as PyTorch's expandable_segments, "
                        "or cudaMallocAsync's pools), so to rank %d on this "
                        "node it would be staged; allocate it with cudaMalloc "
                        "(PyTorch: leave expandable_segments off), or set "
                        "STAGELINK_GPU_DIRECT=auto", buf, peer->rank);
    }
    if (!comm->vmm_logged) {
        comm->vmm_logged = 1;
        SL_INFO(SL_SUBSYS_NET, "device memory at %p is not shareable through "
                "CUDA's legacy IPC (expandable_segments, cudaMallocAsync): "
                "to same-node peers it is staged, not handed to cuda_ipc",
                buf);
    }
    return STAGELINK_SUCCESS;
}

int sl_device_all_direct(const sl_comm_t *comm)
{
    /* Of the rank's means, not of its peers' places, so that alike nodes
     * agree: a rank next to a stage on another node and one among its own
     * node's ranks answer the same. */
    return comm->gpu_usable && comm->ucx_cuda && comm->ucx_ipc &&
           (comm->ucx_gdr || comm->local_size == comm->layout.world_size);
}

/* STAGELINK_GPU_DIRECT=require: every path the rank could have direct (by
 * its means, as sl_device_all_direct, so alike nodes agree), or why not. */
static sl_status_t sl_device_require(sl_comm_t *comm, const char *build)
{
    sl_gpudirect_t gd;
    char           peers[400];

    if (!comm->gpu_usable) {
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG, "STAGELINK_GPU_DIRECT="
                        "require, but this rank has no usable GPU (%s)",
                        comm->gpu_why);
    }
    if (!comm->ucx_cuda) {
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG, "STAGELINK_GPU_DIRECT="
                        "require, but UCX %s (%s) reports no CUDA memory type: "
                        "use a UCX built with CUDA, and keep cuda in UCX_TLS",
                        ucp_get_version_string(), build);
    }
    if (comm->local_size > 1 && !comm->ucx_ipc) {
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG, "STAGELINK_GPU_DIRECT="
                        "require, but UCX %s has no cuda_ipc transport for the "
                        "peers on this node (UCX_TLS, or a UCX without it)",
                        ucp_get_version_string());
    }
    if (comm->local_size < comm->layout.world_size && !comm->ucx_gdr) {
        sl_gpudirect_detect(sl_env_get(SL_ENV_SYSFS_ROOT), &gd);
        sl_gpudirect_describe(&gd, peers, sizeof(peers));
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG, "STAGELINK_GPU_DIRECT="
                        "require, but no InfiniBand memory domain of UCX %s%s%s "
                        "registers device memory, so device memory to other "
                        "nodes would go through host memory.  %s.  Either "
                        "route gives it: DMA-BUF (UCX 1.14 or newer, Linux "
                        "5.12 or newer, NVIDIA's open kernel modules; no "
                        "module to load), or a peer-memory module "
                        "(nvidia_peermem, which UCX 1.13 sees only as "
                        "nv_peer_mem); STAGELINK_GPU_DIRECT=auto stages "
                        "instead",
                        ucp_get_version_string(),
                        comm->rail_nic[0] ? " on the rail " : "",
                        comm->rail_nic, peers);
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_device_init(sl_comm_t *comm)
{
    ucp_context_attr_t attr;
    char               build[PATH_MAX + 64];
    int                mode = comm->gpu_direct, gdr;

    sl_ucx_progress_register(comm, &sl_device_hook);
    /* An explicit UCX_TLS without cuda hides CUDA from this bitmap too. */
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    if (ucp_context_query(comm->ucp_ctx, &attr) == UCS_OK) {
        comm->ucx_cuda = !!(attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));
    }
    sl_gdr_domains(comm);
    gdr = comm->ucx_gdr;
    comm->ucx_gdr   = comm->ucx_gdr && mode != SL_GPU_DIRECT_OFF;
    sl_device_place(comm);
    sl_device_ucx_build(build, sizeof(build));
    SL_INFO(SL_SUBSYS_INIT, "GPU runtime %s: %s; UCX %s (%s), memory types "
            "0x%llx: device memory on this node %s, to other nodes %s%s%s%s%s",
            comm->gpu->name, comm->gpu_why, ucp_get_version_string(), build,
            (unsigned long long)attr.memory_types,
            (comm->ucx_cuda && comm->ucx_ipc) ? "over cuda_ipc" : "staged",
            comm->ucx_gdr ? "GPU-direct RDMA through " : "staged",
            comm->ucx_gdr ? comm->gdr_domain : "",
            comm->ucx_gdr ? (comm->gdr_route == SL_GDR_DMABUF ? " (DMA-BUF)"
                                                               : " (peer memory)")
                          : "",
            (gdr && !comm->ucx_gdr) ? " (STAGELINK_GPU_DIRECT=off)" : "",
            comm->gdr_flush ? ", flushed after each receive (compute "
                              "capability below 9.0)" : "");
    return (mode == SL_GPU_DIRECT_REQUIRE) ? sl_device_require(comm, build)
                                    : STAGELINK_SUCCESS;
}

sl_status_t sl_device_rdma_landed(sl_comm_t *comm, const sl_ucx_peer_t *peer)
{
    if (!comm->gdr_flush || !sl_device_remote(comm, peer)) {
        return STAGELINK_SUCCESS;
    }
    return comm->gpu->rdma_flush(&comm->err);
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
    for (i = 0; i < 2; ++i) {
        if (comm->copy_streams[i] != NULL) {
            comm->gpu->stream_destroy(comm->copy_streams[i]);
            comm->copy_streams[i] = NULL;
        }
    }
    if (comm->staging.bufs[0] != NULL) {
        sl_staging_pool_cleanup(&comm->staging, comm->gpu->host_free,
                                &comm->gpu_numa);
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
                ? "to UCX as they are on direct paths (see the GPU runtime "
                  "line), else staged through pinned host buffers"
                : "staged through pinned host buffers, UCX reports no CUDA "
                  "memory type (built without CUDA, or UCX_TLS leaves out "
                  "cuda)");
    }
    SL_CHECK(sl_device_event_get(comm, &req->stream.event));
    if (comm->gpu->event_record(req->stream.event, req->xfer.stream,
                                &comm->err) != STAGELINK_SUCCESS) {
        sl_device_event_put(comm, req->stream.event);
        req->stream.event = NULL;
        return STAGELINK_ERR_TRANSPORT;
    }
    req->stream.deferred_next = comm->deferred;
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
    sl_comm_t  *comm   = ctx;
    void       *stream = comm->copy_streams[!!to_device];
    sl_status_t status;

    (void)x;
    /* One stream a direction: a receive's copy never queues behind a
     * send's, so both directions of 1F1B overlap. */
    SL_CHECK(sl_device_event_get(comm, token));
    status = comm->gpu->copy_async(dst, src, len, stream, &comm->err);
    if (status == STAGELINK_SUCCESS) {
        status = comm->gpu->event_record(*token, stream, &comm->err);
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
    int         i;

    status = comm->gpu->stream_create(&comm->copy_streams[0], &comm->err);
    if (status == STAGELINK_SUCCESS) {
        status = comm->gpu->stream_create(&comm->copy_streams[1], &comm->err);
    }
    if (status == STAGELINK_SUCCESS) {
        status = sl_staging_pool_init(&comm->staging, comm->chunk, comm->nbufs,
                                      comm->gpu->host_alloc, &comm->gpu_numa,
                                      &comm->err);
    }
    if (status != STAGELINK_SUCCESS) {
        /* Half a pool must not pass for a ready one (bufs[0] is the test). */
        sl_staging_pool_cleanup(&comm->staging, comm->gpu->host_free,
                                &comm->gpu_numa);
        for (i = 0; i < 2; ++i) {
            if (comm->copy_streams[i] != NULL) {
                comm->gpu->stream_destroy(comm->copy_streams[i]);
                comm->copy_streams[i] = NULL;
            }
        }
        /* Chunks moved in place still size their window by the pool. */
        comm->staging.chunk = comm->chunk;
        comm->staging.nbufs = comm->nbufs;
        return status;
    }
    SL_INFO(SL_SUBSYS_NET, "staging pool: 2 x %d pinned buffers of %zu bytes "
            "(NUMA node %d), a copy stream each way", comm->nbufs, comm->chunk,
            comm->gpu_numa);
    return STAGELINK_SUCCESS;
}

static void sl_device_progress_deferred(sl_comm_t *comm)
{
    sl_req_t  **link = &comm->deferred, *req;
    sl_status_t status;

    while ((req = *link) != NULL) {
        status = req->status;
        if (!comm->gpu->event_query(req->stream.event, &status, &comm->err)) {
            link = &req->stream.deferred_next;
            continue;
        }
        *link = req->stream.deferred_next;
        sl_device_event_put(comm, req->stream.event);
        req->stream.event = NULL;
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
