/*
 * GPU-direct RDMA's route from an InfiniBand memory domain's attributes,
 * as UCX 1.13 and 1.22 report them (synthetic: no InfiniBand here).  A
 * peer-memory module sets the CUDA bit of reg_mem_types in both; DMA-BUF
 * (1.14 and later) sets only UCT_MD_FLAG_REG_DMABUF (ib_md.c), which
 * counts where the driver exports DMA-BUF or cannot say.
 *   test_gdr
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "ucx_comm.h"

#include <string.h>

#define HOST ((uint64_t)1 << UCS_MEMORY_TYPE_HOST)
#define CUDA ((uint64_t)1 << UCS_MEMORY_TYPE_CUDA)
/* What both versions' ib_md.c sets besides DMA-BUF: REG, NEED_MEMH,
 * NEED_RKEY, ADVISE (bits 1-4), INVALIDATE (8). */
#define IB_FLAGS (((uint64_t)0xf << 1) | ((uint64_t)1 << 8))

int main(void)
{
    static const struct {
        const char    *what;
        uint64_t       flags, reg_mem_types;
        int            gpu_dmabuf;
        sl_gdr_route_t route;
    } cases[] = {
        {"1.13, nv_peer_mem", IB_FLAGS, HOST | CUDA, -1, SL_GDR_PEERMEM},
        {"1.13, no module", IB_FLAGS, HOST, -1, SL_GDR_NONE},
        {"1.13, no module, a driver with DMA-BUF", IB_FLAGS, HOST, 1, SL_GDR_NONE},
        {"1.22, DMA-BUF", IB_FLAGS | SL_MD_FLAG_REG_DMABUF, HOST, 1, SL_GDR_DMABUF},
        {"1.22, DMA-BUF, driver cannot say", IB_FLAGS | SL_MD_FLAG_REG_DMABUF,
         HOST, -1, SL_GDR_DMABUF},
        {"1.22, DMA-BUF, driver without it", IB_FLAGS | SL_MD_FLAG_REG_DMABUF,
         HOST, 0, SL_GDR_NONE},
        {"1.22, nvidia_peermem and DMA-BUF", IB_FLAGS | SL_MD_FLAG_REG_DMABUF,
         HOST | CUDA, 1, SL_GDR_PEERMEM},
        {"1.22, neither", IB_FLAGS, HOST, 1, SL_GDR_NONE},
    };
    size_t k;

    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); ++k) {
        sl_gdr_route_t r = sl_gdr_route(cases[k].flags, cases[k].reg_mem_types,
                                        cases[k].gpu_dmabuf);

        CHECK(r == cases[k].route, "%s: route %s, expected %s", cases[k].what,
              sl_gdr_route_name(r), sl_gdr_route_name(cases[k].route));
    }
    CHECK(strcmp(sl_gdr_route_name(SL_GDR_DMABUF), "DMA-BUF") == 0 &&
          strcmp(sl_gdr_route_name(SL_GDR_PEERMEM), "peer memory") == 0,
          "route names");
    return check_summary();
}
