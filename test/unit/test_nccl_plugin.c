/*
 * libstagelink-nccl.so loads through the loader (RTLD_NOW: every symbol
 * resolves), and where no GPU is usable its init refuses with the runtime's
 * reason before any rendezvous.  With a GPU the gpu suite covers it (77).
 * SPDX-License-Identifier: MIT
 */
#include "check.h"

#include <stagelink/loader.h>

#include <cuda_runtime.h>
#include <string.h>

int main(void)
{
    stagelink_loader_t *loader;
    stagelink_comm_t   *comm = NULL;
    stagelink_config_t  cfg;
    char                err[1024];
    int                 ndev = 0;

    CHECK(stagelink_loader_open("nccl", &loader, err, sizeof(err)) == 0,
          "%s", err);
    if (loader == NULL) {
        return check_summary();
    }
    CHECK(strcmp(stagelink_loader_plugin(loader)->name, "nccl") == 0,
          "plugin name %s", stagelink_loader_plugin(loader)->name);
    if (cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0) {
        printf("SKIP: a CUDA device is present; the gpu suite runs the NCCL plugin\n");
        stagelink_loader_close(loader);
        return 77;
    }
    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size = sizeof(cfg);
    cfg.flags       = STAGELINK_CONFIG_RANK_SET;
    cfg.rank        = 0;
    cfg.world_size  = 2; /* no peer exists: it must refuse before waiting */
    CHECK(stagelink_loader_comm_init(loader, &cfg, &comm, err, sizeof(err)) ==
              STAGELINK_ERR_UNSUPPORTED &&
              (strstr(err, "no CUDA device") || strstr(err, "no CUDA driver")) &&
              strstr(err, "STAGELINK_PLUGIN=ucx"),
          "init without a GPU: %s", err);
    stagelink_loader_close(loader);
    return check_summary();
}
