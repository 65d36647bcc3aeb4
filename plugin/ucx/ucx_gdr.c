/*
 * GPU-direct RDMA as UCX has it: which InfiniBand memory domains of the
 * communicator's UCX context register device memory, and by which route.
 * Two exist: a peer-memory module (nv_peer_mem, nvidia_peermem), which
 * UCX reports as the CUDA bit of the domain's reg_mem_types, and DMA-BUF
 * (UCX 1.14 and later, kernel 5.12 and later, no module), which UCX's
 * ib_md.c reports only as UCT_MD_FLAG_REG_DMABUF: UCX then registers the
 * fd the CUDA driver exports, where the driver supports it.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_log.h"

#include <uct/api/uct.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef STAGELINK_HAVE_UCT_DMABUF
_Static_assert(SL_MD_FLAG_REG_DMABUF == (uint64_t)UCT_MD_FLAG_REG_DMABUF,
               "UCT_MD_FLAG_REG_DMABUF is not the bit ucx_comm.h assumes");
#endif

sl_gdr_route_t sl_gdr_route(uint64_t md_flags, uint64_t reg_mem_types,
                            int gpu_dmabuf)
{
    if (reg_mem_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) {
        return SL_GDR_PEERMEM;
    }
    if ((md_flags & SL_MD_FLAG_REG_DMABUF) && gpu_dmabuf != 0) {
        return SL_GDR_DMABUF;
    }
    return SL_GDR_NONE;
}

const char *sl_gdr_route_name(sl_gdr_route_t route)
{
    switch (route) {
    case SL_GDR_PEERMEM: return "peer memory";
    case SL_GDR_DMABUF:  return "DMA-BUF";
    default:             return "none";
    }
}

/* How UCX's memory domain `name` of `component` registers device memory,
 * as UCX decided when it opened it (UCX_IB_GPU_DIRECT_RDMA applies). */
static sl_gdr_route_t sl_gdr_md_route(const sl_comm_t *comm,
                                      uct_component_h component,
                                      const char *name)
{
    uct_md_config_t *config;
    uct_md_attr_t    attr;
    uct_md_h         md;
    sl_gdr_route_t   route = SL_GDR_NONE;
    int              dmabuf = -1;

    if (uct_md_config_read(component, NULL, NULL, &config) != UCS_OK) {
        return SL_GDR_NONE;
    }
    if (comm->gpu->dmabuf_supported != NULL && comm->device >= 0) {
        dmabuf = comm->gpu->dmabuf_supported(comm->device);
    }
    if (uct_md_open(component, name, config, &md) == UCS_OK) {
        if (uct_md_query(md, &attr) == UCS_OK) {
            route = sl_gdr_route(attr.cap.flags, attr.cap.reg_mem_types,
                                 dmabuf);
        }
        uct_md_close(md);
    }
    uct_config_release(config);
    return route;
}

#define SL_GDR_MAX_IB_MDS 8

/* The InfiniBand domain of a transport resource ("rc_mlx5" on "mlx5_0:1"
 * is domain "mlx5_0"), or 0 for another transport. */
static int sl_gdr_ib_md(const char *tl, size_t tl_len, const char *dev,
                           char *md, size_t md_len)
{
    size_t n = strcspn(dev, ":\n ");

    if (tl_len < 3 || tl[2] != '_' ||
        (strncmp(tl, "rc", 2) != 0 && strncmp(tl, "dc", 2) != 0 &&
         strncmp(tl, "ud", 2) != 0) || n == 0 || n >= md_len) {
        return 0;
    }
    memcpy(md, dev, n);
    md[n] = '\0';
    return 1;
}

/* What sl_gdr_domains collects from the context's transports. */
typedef struct sl_gdr_tls {
    sl_comm_t *comm;
    char     (*mds)[UCT_MD_NAME_MAX];
    int        n, max;
} sl_gdr_tls_t;

/* One transport of this context ("rc_mlx5", "mlx5_0:1"): what UCX_TLS and
 * the rail's NET_DEVICES left it.  cuda_ipc found sets ucx_ipc; the
 * InfiniBand domains go to `mds`. */
static void sl_gdr_tl(void *arg, const char *tl, size_t tl_len,
                      const char *dev)
{
    sl_gdr_tls_t *t = arg;
    int           k, seen = 0;

    if (tl_len == 8 && strncmp(tl, "cuda_ipc", 8) == 0) {
        t->comm->ucx_ipc = 1;
    } else if (t->n < t->max &&
               sl_gdr_ib_md(tl, tl_len, dev, t->mds[t->n],
                            sizeof(t->mds[t->n]))) {
        for (k = 0; k < t->n; ++k) {
            seen |= strcmp(t->mds[k], t->mds[t->n]) == 0;
        }
        t->n += !seen;
    }
}

/*
 * What this context's transports do with device memory: cuda_ipc moves it
 * between the GPUs of a node, and an InfiniBand domain of the context that
 * registers it (peer memory or DMA-BUF) is GPU-direct RDMA.  UCX's CUDA memory type alone promises
 * neither: without them UCX pipelines through host memory of its own,
 * quietly.
 */
void sl_gdr_domains(sl_comm_t *comm)
{
    char                 mds[SL_GDR_MAX_IB_MDS][UCT_MD_NAME_MAX];
    uct_component_h     *components = NULL;
    uct_component_attr_t attr;
    unsigned             ncomp = 0, i;
    int                  nmds, m;
    sl_gdr_tls_t         tls = {comm, mds, 0, SL_GDR_MAX_IB_MDS};

    if (!comm->ucx_cuda) {
        return;
    }
    sl_ucx_context_tls(comm->ucp_ctx, sl_gdr_tl, &tls);
    nmds = tls.n;
    if (nmds == 0) {
        return;
    }
    if (uct_query_components(&components, &ncomp) != UCS_OK) {
        SL_INFO(SL_SUBSYS_INIT, "UCT lists no components: GPU-direct RDMA "
                "is taken as absent");
        return;
    }
    for (i = 0; i < ncomp; ++i) {
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
        if (uct_component_query(components[i], &attr) != UCS_OK ||
            strcmp(attr.name, "ib") != 0) {
            continue;
        }
        for (m = 0; m < nmds && !comm->ucx_gdr; ++m) {
            comm->gdr_route = sl_gdr_md_route(comm, components[i], mds[m]);
            if (comm->gdr_route != SL_GDR_NONE) {
                comm->ucx_gdr = 1;
                snprintf(comm->gdr_domain, sizeof(comm->gdr_domain), "%.*s",
                         (int)sizeof(comm->gdr_domain) - 1, mds[m]);
            }
        }
    }
    uct_release_component_list(components);
}
