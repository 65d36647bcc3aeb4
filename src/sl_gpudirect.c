/* SPDX-License-Identifier: MIT */
#include "sl_gpudirect.h"

#include <stdio.h>
#include <string.h>

static int sl_read_version(const char *root, const char *path, char *out,
                           size_t len)
{
    char  full[512];
    FILE *f;
    int   ok;

    snprintf(full, sizeof(full), "%s%s", root, path);
    f = fopen(full, "r");
    if (f == NULL) {
        return 0;
    }
    ok = (fgets(out, (int)len, f) != NULL);
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
    if (!ok) {
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
