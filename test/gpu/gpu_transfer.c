/*
 * Device memory end to end on a real GPU: every rank's tensor lives in
 * cudaMalloc'd memory, and each transfer is ordered on the rank's stream.
 * Before each send the stream is held back (a 20 ms host function) and
 * then writes the tensor (an async copy standing in for a kernel), so a
 * send that did not wait for the stream would read stale bytes; after each
 * receive the tensor is read back on the same stream.  Every byte checked.
 * Exits 77 with the runtime's reason where no CUDA device is usable.
 *   gpu_transfer -t TP -s SIZES [-T] [-o ROUNDS]   (under stagelink_run -n 2t)
 * -T: every post and wait from a thread that never touched CUDA (no
 *     context of its own: the plugin must bring the communicator's and
 *     leave the thread without one).
 * -o ROUNDS: then, gather order under stream skew: each round stage 1
 *     posts two receives of different sizes with a 20 ms host function on
 *     one TP rank's stream between them (alternating), while stage 0's TP
 *     ranks send the two in opposite orders; both tensors checked.
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"
#include "pattern.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <getopt.h>
#include <pthread.h>
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

/* A post and its wait, on the calling thread or on one without a context. */
typedef struct call {
    sl_host_t           *h;
    int                  send;
    stagelink_xfer_t     x;
    int                  ctx_after; /* the thread had a context afterwards */
} call_t;

static CUresult (*ctx_get_current)(CUcontext *);

static int thread_has_context(void)
{
    CUcontext ctx = NULL;
    void     *fn  = NULL;
    enum cudaDriverEntryPointQueryResult found;

    if (ctx_get_current == NULL &&
        cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 4000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess) {
        memcpy(&ctx_get_current, &fn, sizeof(fn));
    }
    return ctx_get_current != NULL && ctx_get_current(&ctx) == CUDA_SUCCESS &&
           ctx != NULL;
}

static void *call_run(void *arg)
{
    call_t              *c = arg;
    stagelink_request_t *req;

    int                  ok;

    ok = sl_host_report(c->h, c->send
                                  ? c->h->plugin->isend(c->h->comm, &c->x, &req)
                                  : c->h->plugin->irecv(c->h->comm, &c->x, &req),
                        c->send ? "isend" : "irecv") == 0;
    CHECK(ok, "rank %d: the %s's post failed (above)", c->h->info.rank,
          c->send ? "send" : "receive");
    if (ok) {
        CHECK(sl_host_report(c->h, c->h->plugin->wait(c->h->comm, req),
                             "wait") == 0,
              "rank %d: the %s's wait failed (above)", c->h->info.rank,
              c->send ? "send" : "receive");
    }
    c->ctx_after = thread_has_context();
    return NULL;
}

/* The post and wait of `x`; on a thread of its own, joined before this
 * returns (CHECK's counts are the main thread's again). */
static void call(sl_host_t *h, int send, stagelink_xfer_t x, int fresh_thread)
{
    call_t    c = {h, send, x, 0};
    pthread_t t;

    if (!fresh_thread) {
        call_run(&c);
        return;
    }
    if (pthread_create(&t, NULL, call_run, &c) != 0) {
        CHECK(0, "rank %d: cannot start a thread", h->info.rank);
        return;
    }
    pthread_join(t, NULL);
    CHECK(!c.ctx_after, "rank %d: a thread without a CUDA context had one "
          "after the %s", h->info.rank, send ? "send" : "receive");
}

/* Two receives a round, skewed by a host function on one TP rank's stream
 * between their posts; stage 0's TP ranks send them in opposite orders. */
static void skewed_rounds(sl_host_t *h, cudaStream_t stream, int rounds)
{
    static const size_t sizes[2] = {(1 << 20) + 3, 4097};
    unsigned char      *dev[2], *host[2];
    int                 r, k;
    size_t              bad;

    for (k = 0; k < 2; ++k) {
        CUDA_OK(cudaMalloc((void **)&dev[k], sizes[k]));
        host[k] = malloc(sizes[k]);
    }
    for (r = 0; r < rounds && check_failed == 0; ++r) {
        stagelink_request_t *req[2];

        for (k = 0; k < 2; ++k) {
            int      which = (h->info.pp_index == 0 && (h->info.tp_index + r) % 2) ? 1 - k : k;
            uint32_t mb    = (uint32_t)(1000 + 2 * r + which);
            uint64_t seed  = sl_pattern_seed(0, mb, 0, 0);
            stagelink_xfer_t x = sl_host_xfer(h->info.pp_index == 0
                                                  ? STAGELINK_PEER_NEXT
                                                  : STAGELINK_PEER_PREV,
                                              dev[which], sizes[which], 1, mb, 0);

            x.mem_type = STAGELINK_MEM_AUTO;
            x.stream   = stream;
            if (h->info.pp_index == 0) {
                sl_pattern_fill(host[which], 0, sizes[which], seed);
                CUDA_OK(cudaMemcpyAsync(dev[which], host[which], sizes[which],
                                        cudaMemcpyHostToDevice, stream));
                CHECK(sl_host_report(h, h->plugin->isend(h->comm, &x, &req[k]),
                                     "isend") == 0,
                      "rank %d: round %d: isend (above)", h->info.rank, r);
            } else {
                if (k == 1 && h->info.tp_index == r % 2) {
                    CUDA_OK(cudaLaunchHostFunc(stream, hold_stream, NULL));
                }
                CHECK(sl_host_report(h, h->plugin->irecv(h->comm, &x, &req[k]),
                                     "irecv") == 0,
                      "rank %d: round %d: irecv (above)", h->info.rank, r);
            }
        }
        for (k = 0; k < 2 && check_failed == 0; ++k) {
            CHECK(sl_host_report(h, h->plugin->wait(h->comm, req[k]),
                                 "wait") == 0,
                  "rank %d: round %d: wait (above)", h->info.rank, r);
        }
        for (k = 0; k < 2 && check_failed == 0 && h->info.pp_index == 1; ++k) {
            CUDA_OK(cudaMemcpyAsync(host[k], dev[k], sizes[k], cudaMemcpyDeviceToHost, stream));
            CUDA_OK(cudaStreamSynchronize(stream));
            bad = sl_pattern_check(host[k], 0, sizes[k],
                                   sl_pattern_seed(0, (uint32_t)(1000 + 2 * r + k), 0, 0));
            CHECK(bad == SIZE_MAX, "rank %d: round %d, tensor %d (%zu B) "
                  "differs at byte %zu", h->info.rank, r, k, sizes[k], bad);
        }
        CUDA_OK(cudaStreamSynchronize(stream));
    }
    for (k = 0; k < 2; ++k) {
        CUDA_OK(cudaFree(dev[k]));
        free(host[k]);
    }
    if (h->info.rank == 0) {
        printf("gather order under stream skew, t=%d, %d rounds: %s\n",
               h->info.tp_size, rounds, check_failed ? "FAILED" : "ok");
    }
}

int main(int argc, char **argv)
{
    const char    *size_list = "1,4097,1048579,16M";
    int            tp = 1, ndev = 0, opt, i, n = 0, backward;
    int            fresh = 0, rounds = 0;
    size_t         sizes[16], bad;
    char          *save = NULL, *item, list[256];
    cudaError_t    err;
    cudaStream_t   stream;
    sl_host_t      h;
    unsigned char *host, *dev;

    while ((opt = getopt(argc, argv, "t:s:To:")) != -1) {
        if (opt == 't') { tp = atoi(optarg); }
        if (opt == 's') { size_list = optarg; }
        if (opt == 'T') { fresh = 1; }
        if (opt == 'o') { rounds = atoi(optarg); }
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
            }
            call(&h, sender, x, fresh);
            if (!sender) {
                memset(host, 0, len);
                CUDA_OK(cudaMemcpyAsync(host, dev, len, cudaMemcpyDeviceToHost, stream));
                CUDA_OK(cudaStreamSynchronize(stream));
                bad = sl_pattern_check(host, 0, len, seed);
                CHECK(bad == SIZE_MAX, "rank %d: %zu-byte device tensor "
                      "differs at byte %zu", h.info.rank, len, bad);
            }
            CUDA_OK(cudaStreamSynchronize(stream));
            CUDA_OK(cudaFree(dev));
            free(host);
        }
    }
    if (h.info.rank == 0) {
        printf("device memory, t=%d, sizes %s, stream-ordered%s: %s\n", tp,
               size_list, fresh ? ", from threads without a CUDA context" : "",
               check_failed ? "FAILED" : "ok");
    }
    if (rounds > 0 && check_failed == 0) {
        skewed_rounds(&h, stream, rounds);
    }
    sl_host_close(&h);
    cudaStreamDestroy(stream);
    return check_summary();
}
