/*
 * A build without CUDA: every pointer is host memory and no device is
 * usable.  Only probe and classify are ever called (the staging path is
 * never taken without a device, nor are GPUs asked for their address).  SPDX-License-Identifier: MIT
 */
#include "gpu.h"

#include <stdio.h>

static int sl_none_probe(char *why, size_t len)
{
    snprintf(why, len, "no CUDA device: stagelink was built without CUDA "
             "(configure with -Dcuda=enabled and CUDA in -Dcudadir)");
    return 0;
}

static stagelink_mem_type_t sl_none_classify(const void *ptr, int *device)
{
    (void)ptr;
    *device = -1;
    return STAGELINK_MEM_HOST;
}

const sl_gpu_ops_t sl_gpu_default_ops = {
    .name     = "none",
    .probe    = sl_none_probe,
    .classify = sl_none_classify,
};
