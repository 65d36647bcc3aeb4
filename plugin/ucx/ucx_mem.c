/*
 * Memory: registration of buffers reused across iterations, and the memory
 * type of each transfer (given by the host, or classified by the GPU
 * runtime).
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include <stdlib.h>
#include <string.h>

/* The link that points at `memh` in the live list, or NULL. */
static stagelink_memh_t **sl_mem_find(sl_comm_t *comm,
                                      const stagelink_memh_t *memh)
{
    stagelink_memh_t **link;

    for (link = &comm->memhs; *link != NULL; link = &(*link)->next) {
        if (*link == memh) {
            return link;
        }
    }
    return NULL;
}

static const char *sl_mem_name(stagelink_mem_type_t t)
{
    switch (t) {
    case STAGELINK_MEM_AUTO:         return "auto";
    case STAGELINK_MEM_HOST:         return "host";
    case STAGELINK_MEM_CUDA:         return "cuda";
    case STAGELINK_MEM_CUDA_MANAGED: return "cuda-managed";
    }
    return "unknown";
}

/*
 * A declared type the runtime contradicts.  A device pointer declared host
 * (or managed) would reach UCX as host memory, whose shared-memory copy
 * then fails in the peer (UCX reports it as the peer's connection reset);
 * a host pointer declared device would be handed to the CUDA transports.
 * Managed memory is reachable from both sides: any declaration of it
 * stands (declared device, it keeps the stream ordering).
 */
static sl_status_t sl_mem_contradiction(sl_comm_t *comm, const void *buf,
                                        stagelink_mem_type_t requested,
                                        stagelink_mem_type_t actual)
{
    if (actual == STAGELINK_MEM_CUDA && requested != STAGELINK_MEM_CUDA) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "buffer %p is cuda memory, but the transfer says %s: "
                        "UCX would read it as host memory; pass "
                        "STAGELINK_MEM_CUDA or STAGELINK_MEM_AUTO", buf,
                        sl_mem_name(requested));
    }
    if (actual == STAGELINK_MEM_HOST && requested == STAGELINK_MEM_CUDA) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "buffer %p is host memory, but the transfer says cuda; "
                        "pass STAGELINK_MEM_HOST or STAGELINK_MEM_AUTO", buf);
    }
    return STAGELINK_SUCCESS;
}

/*
 * Device memory of the communicator's device only: the copy engine, UCX's
 * CUDA transports and NCCL all work on that one.  A communicator that has
 * none yet (no device current at init) takes the first tensor's.
 */
static sl_status_t sl_mem_check_device(sl_comm_t *comm, const void *buf,
                                       stagelink_mem_type_t actual, int device)
{
    if (actual != STAGELINK_MEM_CUDA || device < 0) {
        return STAGELINK_SUCCESS;
    }
    if (comm->device < 0) {
        return sl_device_adopt(comm, device);
    }
    if (device != comm->device) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "buffer %p is memory of CUDA device %d, but this "
                        "communicator works on device %d (%s); pass tensors "
                        "of device %d, or make one communicator per device",
                        buf, device, comm->device,
                        "the config's, the current one at comm_init, or its "
                        "first device tensor's", comm->device);
    }
    return STAGELINK_SUCCESS;
}

/*
 * Managed memory moved as host memory would not wait for the work queued
 * on its stream (a kernel still writing it), so only a declaration of
 * device memory, which keeps the stream's order, takes it.
 */
static sl_status_t sl_mem_managed(sl_comm_t *comm, const void *buf,
                                  stagelink_mem_type_t requested,
                                  stagelink_mem_type_t *resolved)
{
    if (*resolved != STAGELINK_MEM_CUDA_MANAGED) {
        return STAGELINK_SUCCESS;
    }
    return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                    "buffer %p is CUDA managed memory (the transfer says %s): "
                    "moved as host memory it would not wait for the work "
                    "queued on its stream; declare it STAGELINK_MEM_CUDA, "
                    "which keeps the stream's order, or synchronize and "
                    "declare STAGELINK_MEM_HOST", buf, sl_mem_name(requested));
}

/*
 * What the buffer is; device memory needs a usable device.  `known` is the
 * type a registration already established (else AUTO).  Declared types are
 * checked against the runtime where a GPU is usable, but a host
 * declaration only from a thread already on the GPU: asking the runtime
 * from any other thread could create a context on device 0, and a host-only
 * job on a GPU node must not pay for that.  `may_ask` 0: the caller checked
 * this transfer already (a batch), ask only what AUTO needs.
 */
static sl_status_t sl_mem_check_type(sl_comm_t *comm, const void *buf,
                                     size_t nbytes,
                                     stagelink_mem_type_t requested,
                                     stagelink_mem_type_t known, int may_ask,
                                     stagelink_mem_type_t *resolved)
{
    stagelink_mem_type_t actual = known;
    int                  device = -1;

    switch (requested) {
    case STAGELINK_MEM_AUTO:
        if (nbytes > 0 && actual == STAGELINK_MEM_AUTO) {
            actual = comm->gpu->classify(buf, &device);
        }
        /* Nothing the runtime knows (or can say): host memory. */
        *resolved = (nbytes == 0 || actual == STAGELINK_MEM_AUTO)
                        ? STAGELINK_MEM_HOST : actual;
        SL_CHECK(sl_mem_managed(comm, buf, requested, resolved));
        return sl_mem_check_device(comm, buf, actual, device);
    case STAGELINK_MEM_CUDA:
        if (!comm->gpu_usable) {
            return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                            "memory type %s given, but %s",
                            sl_mem_name(requested), comm->gpu_why);
        }
        /* fall through */
    case STAGELINK_MEM_HOST:
    case STAGELINK_MEM_CUDA_MANAGED:
        *resolved = requested;
        SL_CHECK(sl_mem_managed(comm, buf, requested, resolved));
        if (!comm->gpu_usable || nbytes == 0) {
            return STAGELINK_SUCCESS;
        }
        if (actual == STAGELINK_MEM_AUTO && may_ask &&
            (requested == STAGELINK_MEM_CUDA || comm->gpu->thread_on_gpu == NULL ||
             comm->gpu->thread_on_gpu())) {
            actual = comm->gpu->classify(buf, &device);
        }
        SL_CHECK(sl_mem_contradiction(comm, buf, requested, actual));
        return sl_mem_check_device(comm, buf, actual, device);
    }
    return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                    "memory type %d is not a stagelink_mem_type_t",
                    (int)requested);
}

sl_status_t sl_mem_resolve(sl_comm_t *comm, const stagelink_xfer_t *xfer,
                           int may_ask, stagelink_mem_type_t *mem_type)
{
    const stagelink_memh_t *memh = xfer->memh;

    if (memh != NULL) {
        if (sl_mem_find(comm, memh) == NULL) {
            return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                            "memory handle %p is not registered (deregistered "
                            "already?)", (const void *)memh);
        }
        if ((const char *)xfer->buf < (const char *)memh->addr ||
            (const char *)xfer->buf + xfer->nbytes >
                (const char *)memh->addr + memh->length) {
            return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                            "buffer %p + %zu bytes lies outside its registration "
                            "%p + %zu bytes", xfer->buf, xfer->nbytes,
                            memh->addr, memh->length);
        }
    }
    /* A registration's type was found (or checked) when it was made. */
    return sl_mem_check_type(comm, xfer->buf, xfer->nbytes, xfer->mem_type,
                             memh != NULL ? memh->mem_type : STAGELINK_MEM_AUTO,
                             may_ask, mem_type);
}

sl_status_t sl_mem_register(sl_comm_t *comm, void *buf, size_t nbytes,
                            stagelink_mem_type_t mem_type,
                            stagelink_memh_t **memh_out)
{
    ucp_mem_map_params_t params;
    stagelink_memh_t    *memh;
    stagelink_mem_type_t resolved = STAGELINK_MEM_HOST;
    ucs_status_t         ucs;

    if (buf == NULL || nbytes == 0 || memh_out == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "mem_register needs a buffer (%p), a size (%zu) and "
                        "a handle pointer (%p)", buf, nbytes,
                        (void *)memh_out);
    }
    SL_CHECK(sl_mem_check_type(comm, buf, nbytes, mem_type, STAGELINK_MEM_AUTO,
                               1, &resolved));
    memh = calloc(1, sizeof(*memh));
    if (memh == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a memory handle");
    }
    memh->addr     = buf;
    memh->length   = nbytes;
    memh->mem_type = resolved;
    if (resolved == STAGELINK_MEM_CUDA && !comm->ucx_cuda) {
        /* Staged transfers use the plugin's own pinned buffers: nothing for
         * this UCX to register, and it must never see the device pointer. */
        memh->next  = comm->memhs;
        comm->memhs = memh;
        *memh_out   = memh;
        return STAGELINK_SUCCESS;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask  = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                         UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                         UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
    params.address     = buf;
    params.length      = nbytes;
    params.memory_type = (resolved == STAGELINK_MEM_CUDA) ? UCS_MEMORY_TYPE_CUDA
                                                          : UCS_MEMORY_TYPE_HOST;
    ucs = ucp_mem_map(comm->ucp_ctx, &params, &memh->ucp_memh);
    if (ucs == UCS_OK && comm->local_ctx != NULL) {
        /* Same-node peers' operations run in the same-node context. */
        ucs = ucp_mem_map(comm->local_ctx, &params, &memh->ucp_memh_local);
        if (ucs != UCS_OK) {
            ucp_mem_unmap(comm->ucp_ctx, memh->ucp_memh);
        }
    }
    if (ucs != UCS_OK) {
        free(memh);
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX cannot register %zu bytes at %p: %s", nbytes,
                        buf, ucs_status_string(ucs));
    }
    memh->next  = comm->memhs;
    comm->memhs = memh;
    *memh_out   = memh;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_mem_deregister(sl_comm_t *comm, stagelink_memh_t *memh)
{
    stagelink_memh_t **link = (memh != NULL) ? sl_mem_find(comm, memh) : NULL;
    ucs_status_t       ucs;

    if (link == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_INVALID_ARG,
                        "memory handle %p is not registered on this "
                        "communicator (deregistered already?)", (void *)memh);
    }
    *link = memh->next;
    ucs = (memh->ucp_memh != NULL) ? ucp_mem_unmap(comm->ucp_ctx, memh->ucp_memh)
                                   : UCS_OK;
    if (memh->ucp_memh_local != NULL) {
        ucs_status_t local = ucp_mem_unmap(comm->local_ctx,
                                           memh->ucp_memh_local);

        ucs = (ucs == UCS_OK) ? local : ucs;
    }
    free(memh);
    if (ucs != UCS_OK) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX cannot deregister memory: %s",
                        ucs_status_string(ucs));
    }
    return STAGELINK_SUCCESS;
}

void sl_mem_cleanup(sl_comm_t *comm)
{
    while (comm->memhs != NULL) {
        sl_mem_deregister(comm, comm->memhs);
    }
}
