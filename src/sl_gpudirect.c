/* SPDX-License-Identifier: MIT */
#include "sl_gpudirect.h"
#include "sl_sysfs.h"

#include <stdio.h>
#include <string.h>

/* A module's version file: present means loaded. */
static int sl_read_version(const char *root, const char *path, char *out,
                           size_t len)
{
    if (!sl_sysfs_read(root, path, out, len)) {
        return 0;
    }
    if (out[0] == '\0') {
        snprintf(out, len, "unknown");
    }
    return 1;
}

void sl_gpudirect_detect(const char *root, sl_gpudirect_t *gd)
{
    memset(gd, 0, sizeof(*gd));
    gd->nv_mem  = sl_read_version(root, "/sys/kernel/mm/memory_peers/nv_mem/version",
                                  gd->nv_mem_version, sizeof(gd->nv_mem_version));
    gd->peermem = sl_read_version(root, "/sys/module/nvidia_peermem/version",
                                  gd->peermem_version, sizeof(gd->peermem_version));
}

void sl_gpudirect_describe(const sl_gpudirect_t *gd, char *buf, size_t len)
{
    if (gd->nv_mem) {
        snprintf(buf, len, "GPU-direct RDMA: nv_peer_mem %s loaded%s%s%s; UCX "
                 "1.13 detects it", gd->nv_mem_version,
                 gd->peermem ? " (and nvidia_peermem " : "",
                 gd->peermem ? gd->peermem_version : "",
                 gd->peermem ? ")" : "");
    } else if (gd->peermem) {
        snprintf(buf, len, "GPU-direct RDMA: nvidia_peermem %s loaded, but "
                 "UCX 1.13 only looks for /sys/kernel/mm/memory_peers/nv_mem/"
                 "version and will report no GPU-direct; newer UCX also "
                 "checks /sys/module/nvidia_peermem", gd->peermem_version);
    } else {
        snprintf(buf, len, "GPU-direct RDMA: no peer-memory module loaded "
                 "(neither nv_peer_mem nor nvidia_peermem): device buffers "
                 "cross the network through host memory");
    }
}
