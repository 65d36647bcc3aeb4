/*
 * GPU-direct RDMA: which peer-memory kernel module is loaded, read under a
 * configurable sysfs root (STAGELINK_SYSFS_ROOT) so tests use fake trees.
 * UCX 1.13 only looks for nv_peer_mem's file; with only nvidia_peermem
 * loaded it reports no GPU-direct although the kernel supports it.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_GPUDIRECT_H
#define SL_GPUDIRECT_H

#include <stddef.h>

typedef struct sl_gpudirect {
    int  nv_mem;              /**< /sys/kernel/mm/memory_peers/nv_mem/version */
    int  peermem;             /**< /sys/module/nvidia_peermem/version */
    char nv_mem_version[32];
    char peermem_version[32];
} sl_gpudirect_t;

void sl_gpudirect_detect(const char *root, sl_gpudirect_t *gd);

/** One sentence for humans: what is loaded and what UCX 1.13 will see. */
void sl_gpudirect_describe(const sl_gpudirect_t *gd, char *buf, size_t len);

#endif
