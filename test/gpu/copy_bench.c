/*
 * The reference for staging: cudaMemcpyAsync between device memory and
 * pinned host memory, each direction, per size (GB/s = 1e9 B/s).
 *   copy_bench SIZE...     SPDX-License-Identifier: MIT
 */
#include "host.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

static double bench(void *dst, const void *src, size_t n, cudaStream_t s)
{
    cudaEvent_t a, b;
    float       ms = 0;
    int         i, reps = 10;

    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s); /* warm-up */
    cudaEventRecord(a, s);
    for (i = 0; i < reps; ++i) {
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
    }
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return (double)n * reps / (ms * 1e6);
}

int main(int argc, char **argv)
{
    cudaStream_t s;
    void        *dev, *pinned;
    size_t       n;
    int          i, ndev = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    cudaStreamCreate(&s);
    printf("%12s %12s %12s\n", "size(B)", "D2H GB/s", "H2D GB/s");
    for (i = 1; i < argc; ++i) {
        if (sl_host_parse_size(argv[i], &n) != 0 ||
            cudaMalloc(&dev, n) != cudaSuccess ||
            cudaHostAlloc(&pinned, n, cudaHostAllocDefault) != cudaSuccess) {
            fprintf(stderr, "cannot set up %s bytes\n", argv[i]);
            return 1;
        }
        printf("%12zu %12.2f %12.2f\n", n, bench(pinned, dev, n, s),
               bench(dev, pinned, n, s));
        cudaFree(dev);
        cudaFreeHost(pinned);
    }
    return 0;
}
