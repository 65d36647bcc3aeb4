/*
 * Device memory end to end on a real GPU: every rank's tensor lives in
 * cudaMalloc'd memory, and each transfer is ordered on the rank's stream.
 * Before each send the stream is held back (a 20 ms host function) and
 * then writes the tensor (an async copy standing in for a kernel), so a
 * send that did not wait for the stream would read stale bytes; after each
 * receive the tensor is read back on the same stream.  Every byte checked.
 * Exits 77 with the runtime's reason where no CUDA device is usable.
 *   gpu_transfer -t TP -s SIZES   (under stagelink_run -n 2t)
 * SPDX-License-Identifier: MIT
 */
#include "host.h"
#include "pattern.h"

#include <cuda_runtime.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CUDA_OK(_call) \
    do { \
        cudaError_t _e = (_call); \
        if (_e != cudaSuccess) { \
            fprintf(stderr, "%s: %s\n", #_call, cudaGetErrorString(_e)); \
            exit(1); \
        } \
    } while (0)

static void CUDART_CB hold_stream(void *arg)
{
    (void)arg;
    usleep(20000);
}

int main(int argc, char **argv)
{
    const char    *size_list = "1,4097,1048579,16M";
    int            tp = 1, ndev = 0, opt, failures = 0, i, n = 0, backward;
    size_t         sizes[16], bad;
    char          *save = NULL, *item, list[256];
    cudaError_t    err;
    cudaStream_t   stream;
    sl_host_t      h;
    unsigned char *host, *dev;

    while ((opt = getopt(argc, argv, "t:s:")) != -1) {
        if (opt == 't') { tp = atoi(optarg); }
        if (opt == 's') { size_list = optarg; }
    }
    err = cudaGetDeviceCount(&ndev);
    if (err != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device: %s\n", (err != cudaSuccess)
               ? cudaGetErrorString(err) : "the runtime sees 0 devices");
        return 77;
    }
    snprintf(list, sizeof(list), "%s", size_list);
    for (item = strtok_r(list, ",", &save); item && n < 16;
         item = strtok_r(NULL, ",", &save)) {
        if (sl_host_parse_size(item, &sizes[n++]) != 0) {
            return 2;
        }
    }
    CUDA_OK(cudaSetDevice(atoi(getenv("LOCAL_RANK") ? getenv("LOCAL_RANK") : "0") % ndev));
    CUDA_OK(cudaStreamCreate(&stream));
    if (sl_host_open(&h, tp, 2, STAGELINK_MODE_DEFAULT) != 0) {
        return 1;
    }
    for (i = 0; i < n; ++i) {
        for (backward = 0; backward < 2; ++backward) {
            size_t           len    = sizes[i];
            int              sender = (h.info.pp_index == (backward ? 1 : 0));
            uint64_t         seed   = sl_pattern_seed(backward, (uint32_t)i, 0, backward);
            stagelink_xfer_t x;
            stagelink_request_t *req;

            host = malloc(len);
            CUDA_OK(cudaMalloc((void **)&dev, len));
            CUDA_OK(cudaMemset(dev, 0, len));
            CUDA_OK(cudaDeviceSynchronize());
            x = sl_host_xfer(h.info.pp_index == 0 ? STAGELINK_PEER_NEXT
                                                  : STAGELINK_PEER_PREV,
                             dev, len, 1, (uint32_t)(2 * i + backward), 0);
            x.mem_type = STAGELINK_MEM_AUTO;
            x.stream   = stream;
            if (sender) {
                sl_pattern_fill(host, 0, len, seed);
                CUDA_OK(cudaLaunchHostFunc(stream, hold_stream, NULL));
                CUDA_OK(cudaMemcpyAsync(dev, host, len, cudaMemcpyHostToDevice, stream));
                failures += sl_host_report(&h, h.plugin->isend(h.comm, &x, &req), "isend") != 0;
            } else {
                failures += sl_host_report(&h, h.plugin->irecv(h.comm, &x, &req), "irecv") != 0;
            }
            failures += sl_host_report(&h, h.plugin->wait(h.comm, req), "wait") != 0;
            if (!sender) {
                memset(host, 0, len);
                CUDA_OK(cudaMemcpyAsync(host, dev, len, cudaMemcpyDeviceToHost, stream));
                CUDA_OK(cudaStreamSynchronize(stream));
                if ((bad = sl_pattern_check(host, 0, len, seed)) != SIZE_MAX) {
                    fprintf(stderr, "rank %d: %zu-byte device tensor differs at "
                            "byte %zu\n", h.info.rank, len, bad);
                    ++failures;
                }
            }
            CUDA_OK(cudaStreamSynchronize(stream));
            CUDA_OK(cudaFree(dev));
            free(host);
        }
    }
    if (h.info.rank == 0) {
        printf("device memory, t=%d, sizes %s, stream-ordered: %s\n", tp,
               size_list, failures ? "FAILED" : "ok");
    }
    sl_host_close(&h);
    cudaStreamDestroy(stream);
    return failures ? 1 : 0;
}
