/*
 * The limits a device shard transfer is measured against, per size (GB/s =
 * 1e9 B/s, each the mean of 10 copies after a warm-up, timed with events):
 * cudaMemcpyAsync device to pinned host and back (what staging costs per
 * hop), device to device (the copy engine's ceiling), and, where NCCL is
 * built in, NCCL's own send/recv (what Megatron's p2p uses) as a one-rank
 * send to self: NCCL refuses two ranks of one communicator on one GPU.
 * Then the latency floor of a small device transfer (see latency()).
 *   copy_bench SIZE...     SPDX-License-Identifier: MIT
 */
#include "host.h"
#ifdef STAGELINK_HAVE_NCCL
#include "nccl_api.h"
#endif

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define COPY_REPS 10
#define LAT_REPS  200

static double now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/*
 * What one small device transfer cannot go below: the host-observed time of
 * a 1-byte async copy completed through an event polled with
 * cudaEventQuery (how the plugin's staging and stream ordering see the GPU),
 * and of an event alone on the legacy stream.  Mean of LAT_REPS, in us.
 */
static double latency(void *dst, const void *src, cudaStream_t s, cudaEvent_t ev)
{
    double t0 = now_us();
    int    i;

    for (i = 0; i < LAT_REPS; ++i) {
        if (dst != NULL) {
            cudaMemcpyAsync(dst, src, 1, cudaMemcpyDefault, s);
        }
        cudaEventRecord(ev, s);
        while (cudaEventQuery(ev) == cudaErrorNotReady) {
        }
    }
    return (now_us() - t0) / LAT_REPS;
}

static double gbps(size_t n, cudaEvent_t a, cudaEvent_t b)
{
    float ms = 0;

    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    return (ms > 0) ? (double)n * COPY_REPS / (ms * 1e6) : 0;
}

static double bench(void *dst, const void *src, size_t n, cudaStream_t s)
{
    cudaEvent_t a, b;
    double      r;
    int         i;

    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s); /* warm-up */
    cudaEventRecord(a, s);
    for (i = 0; i < COPY_REPS; ++i) {
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, s);
    }
    cudaEventRecord(b, s);
    r = gbps(n, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return r;
}

#ifdef STAGELINK_HAVE_NCCL
static ncclComm_t           nccl_comm;
static const sl_nccl_api_t *nccl;

static int nccl_setup(void)
{
    ncclUniqueId id;
    sl_errbuf_t  eb;

    if (sl_nccl_api_get(&nccl, &eb) != STAGELINK_SUCCESS ||
        sl_nccl_check(nccl, nccl->GetUniqueId(&id), NULL, "ncclGetUniqueId", &eb) ||
        sl_nccl_check(nccl, nccl->CommInitRank(&nccl_comm, 1, id, 0), NULL,
                      "ncclCommInitRank", &eb)) {
        fprintf(stderr, "NCCL column left out: %s\n", eb.msg);
        return 0;
    }
    return 1;
}

static int nccl_sendrecv(void *dst, const void *src, size_t n, cudaStream_t s)
{
    return nccl->GroupStart() != ncclSuccess ||
           nccl->Send(src, n, ncclChar, 0, nccl_comm, s) != ncclSuccess ||
           nccl->Recv(dst, n, ncclChar, 0, nccl_comm, s) != ncclSuccess ||
           nccl->GroupEnd() != ncclSuccess;
}

static double bench_nccl(void *dst, const void *src, size_t n, cudaStream_t s)
{
    cudaEvent_t a, b;
    double      r = 0;
    int         i, bad = nccl_sendrecv(dst, src, n, s);

    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, s);
    for (i = 0; i < COPY_REPS && !bad; ++i) {
        bad = nccl_sendrecv(dst, src, n, s);
    }
    cudaEventRecord(b, s);
    r = bad ? -1 : gbps(n, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return r;
}
#endif

int main(int argc, char **argv)
{
    cudaStream_t s;
    void        *dev, *dev2, *pinned;
    size_t       n;
    int          i, ndev = 0, with_nccl = 0;

    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device\n");
        return 77;
    }
    cudaStreamCreate(&s);
#ifdef STAGELINK_HAVE_NCCL
    with_nccl = nccl_setup();
#endif
    printf("%12s %12s %12s %12s %12s\n", "size(B)", "D2H GB/s", "H2D GB/s",
           "D2D GB/s", with_nccl ? "NCCL GB/s" : "");
    for (i = 1; i < argc; ++i) {
        if (sl_host_parse_size(argv[i], &n) != 0 ||
            cudaMalloc(&dev, n) != cudaSuccess ||
            cudaMalloc(&dev2, n) != cudaSuccess ||
            cudaHostAlloc(&pinned, n, cudaHostAllocDefault) != cudaSuccess) {
            fprintf(stderr, "cannot set up %s bytes\n", argv[i]);
            return 1;
        }
        printf("%12zu %12.2f %12.2f %12.2f", n, bench(pinned, dev, n, s),
               bench(dev, pinned, n, s), bench(dev2, dev, n, s));
#ifdef STAGELINK_HAVE_NCCL
        if (with_nccl) {
            double r = bench_nccl(dev2, dev, n, s);

            if (r < 0) {
                printf(" %12s", "failed");
            } else {
                printf(" %12.2f", r);
            }
        }
#endif
        printf("\n");
        cudaFree(dev);
        cudaFree(dev2);
        cudaFreeHost(pinned);
    }
    if (cudaMalloc(&dev, 1) == cudaSuccess &&
        cudaHostAlloc(&pinned, 1, cudaHostAllocDefault) == cudaSuccess) {
        cudaEvent_t ev;

        cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
        latency(pinned, dev, s, ev); /* warm-up */
        printf("latency, us (1 B, event polled): D2H %.1f, H2D %.1f, "
               "event alone %.1f, event alone on the legacy stream %.1f\n",
               latency(pinned, dev, s, ev), latency(dev, pinned, s, ev),
               latency(NULL, NULL, s, ev), latency(NULL, NULL, NULL, ev));
        cudaEventDestroy(ev);
        cudaFree(dev);
        cudaFreeHost(pinned);
    }
#ifdef STAGELINK_HAVE_NCCL
    if (with_nccl) {
        nccl->CommDestroy(nccl_comm);
    }
#endif
    return 0;
}
