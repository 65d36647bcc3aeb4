/*
 * The NCCL side on a real GPU: the dlopen'd table and the in-place
 * all-gather helper on a one-rank communicator (NCCL refuses two ranks of
 * one communicator on the same GPU, so one GPU allows no more), for equal
 * and unequal shards, on a stream, every byte checked.  Exits 77 with the
 * reason where no device or no NCCL is usable.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "nccl_api.h"
#include "pattern.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void)
{
    static const size_t  sizes[] = {1, 4097, (1 << 20) + 3, 64 << 20};
    const sl_nccl_api_t *api;
    sl_errbuf_t          eb;
    ncclUniqueId         id;
    ncclComm_t           comm;
    cudaStream_t         stream;
    unsigned char       *dev, *host;
    size_t               i, bad;
    int                  ndev = 0, version = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    if (sl_nccl_api_get(&api, &eb) != STAGELINK_SUCCESS) {
        printf("SKIP: %s\n", eb.msg);
        return 77;
    }
    api->GetVersion(&version);
    if (sl_nccl_check(api, api->GetUniqueId(&id), NULL, "ncclGetUniqueId", &eb) ||
        sl_nccl_check(api, api->CommInitRank(&comm, 1, id, 0), NULL,
                      "ncclCommInitRank", &eb)) {
        fprintf(stderr, "%s\n", eb.msg);
        return 1;
    }
    cudaStreamCreate(&stream);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        size_t n = sizes[i];

        host = malloc(n);
        cudaMalloc((void **)&dev, n);
        sl_pattern_fill(host, 0, n, sl_pattern_seed(0, (uint32_t)i, 0, 0));
        cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream);
        CHECK(sl_nccl_allgather_inplace(api, comm, dev, n, 1, 1, 0, stream,
                                        &eb) == 0, "%s", eb.msg);
        memset(host, 0, n);
        cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream);
        cudaStreamSynchronize(stream);
        bad = sl_pattern_check(host, 0, n, sl_pattern_seed(0, (uint32_t)i, 0, 0));
        CHECK(bad == SIZE_MAX, "%zu bytes: byte %zu wrong after the "
              "all-gather", n, bad);
        cudaFree(dev);
        free(host);
    }
    api->CommDestroy(comm);
    printf("NCCL %d (%s), one-rank in-place all-gather helper: %s\n", version,
           api->path, check_failed ? "FAILED" : "ok");
    return check_summary();
}
