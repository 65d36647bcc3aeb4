/*
 * Device memory through a UCX without CUDA, proven with a fake GPU: its
 * "device memory" is a mapping with no access rights (as device memory is
 * to the host), reachable only through the fake copy engine via a second
 * mapping of the same pages.  Had a device pointer reached UCX, UCX would
 * fault and the rank die; instead every tensor must arrive whole through
 * the staging buffers.  Also: memory type given or classified, gather of
 * device shards, odd sizes around the chunk size, and a device sender
 * with a receiver in host memory (scatter_gather chunks host shards too),
 * and a declared memory type that contradicts the buffer, refused; and
 * with UCX claiming cuda_ipc, memory cuda_ipc cannot share (as PyTorch's
 * expandable_segments) still staged.
 * Run with stagelink_run -n 4 (t = 2, p = 2), STAGELINK_CHUNK=4096 or auto.
 * SPDX-License-Identifier: MIT
 */
#include "../unit/check.h"
#include "host.h"
#include "pattern.h"
#include "ucx_comm.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define DEV_BYTES ((size_t)8 << 20)

static char  *dev;   /* what the host is given: no access */
static char  *alias; /* the same pages, for the fake copy engine */
static size_t copied;

static int f_on_device(const void *p)
{
    return (const char *)p >= dev && (const char *)p < dev + DEV_BYTES;
}

static stagelink_mem_type_t f_classify(const void *p, int *device)
{
    *device = f_on_device(p) ? 0 : -1;
    return f_on_device(p) ? STAGELINK_MEM_CUDA : STAGELINK_MEM_HOST;
}

static void *f_reach(const void *p)
{
    return f_on_device(p)
               ? alias + ((const char *)p - dev) : (void *)p;
}

static int   f_probe(char *why, size_t len) { snprintf(why, len, "fake GPU"); return 1; }
static void *f_host_alloc(size_t len, void *ctx) { (void)ctx; return malloc(len); }
static void  f_host_free(void *p, void *ctx) { (void)ctx; free(p); }
static sl_status_t f_create(void **obj, sl_errbuf_t *eb) { (void)eb; *obj = malloc(1); return 0; }
static void  f_destroy(void *obj) { free(obj); }
static sl_status_t f_record(void *ev, void *stream, sl_errbuf_t *eb) { (void)ev, (void)stream, (void)eb; return 0; }
static int   f_query(void *ev, sl_status_t *st, sl_errbuf_t *eb) { (void)ev, (void)eb; *st = 0; return 1; }
static sl_status_t f_wait(void *stream, void *ev, sl_errbuf_t *eb) { (void)stream, (void)ev, (void)eb; return 0; }

static sl_status_t f_copy(void *dst, const void *src, size_t len, void *stream,
                          sl_errbuf_t *eb)
{
    (void)stream, (void)eb;
    memcpy(f_reach(dst), f_reach(src), len);
    copied += len;
    return STAGELINK_SUCCESS;
}

/* A fake device has no PCI address: rail affinity falls back to the bus. */
static int f_pci_bus_ids(char (*ids)[16], int max, int *current)
{
    (void)ids;
    (void)max;
    *current = 0;
    return 0;
}

/* Like PyTorch's expandable_segments memory: not for CUDA's legacy IPC. */
static int f_ipc_capable(const void *p) { return !f_on_device(p); }

static const sl_gpu_ops_t fake_gpu = {
    .name              = "fake",
    .ipc_capable       = f_ipc_capable,
    .probe             = f_probe,
    .pci_bus_ids       = f_pci_bus_ids,
    .classify          = f_classify,
    .host_alloc        = f_host_alloc,
    .host_free         = f_host_free,
    .stream_create     = f_create,
    .stream_destroy    = f_destroy,
    .event_create      = f_create,
    .event_destroy     = f_destroy,
    .event_record      = f_record,
    .event_query       = f_query,
    .stream_wait_event = f_wait,
    .copy_async        = f_copy,
};

/* One post of `buf` declared `type`, which must be refused with `says`. */
static void refused_type(const stagelink_plugin_v1_t *p, stagelink_comm_t *comm,
                         int stage, void *buf, stagelink_mem_type_t type,
                         const char *says)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x = sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT
                                                     : STAGELINK_PEER_PREV,
                                          buf, 4096, 1, 100, 0);
    stagelink_status_t   st;

    x.mem_type = type;
    st = (stage == 0) ? p->isend(comm, &x, &req) : p->irecv(comm, &x, &req);
    CHECK(st == STAGELINK_ERR_INVALID_ARG && strstr(p->last_error(comm), says),
          "%p declared %d: %s: %s", buf, (int)type, stagelink_status_string(st),
          p->last_error(comm));
}

/* A receive of `small` bytes meets a sender of 6 chunks a shard and more,
 * then both pass that size on the same tag (microbatch mb). */
static void mismatch_then_reuse(const stagelink_plugin_v1_t *p,
                                stagelink_comm_t *comm, int stage,
                                size_t small, uint32_t mb)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    stagelink_status_t   st;
    size_t               big = 6 * comm->chunk + 10, n, bad;
    int                  i;

    for (i = 0; i < 2; ++i) {
        n = (stage == 0 || i == 1) ? big : small;
        if (stage == 0) {
            sl_pattern_fill(alias, 0, n, mb * 2 + (uint32_t)i);
        } else {
            memset(alias, 0xee, n);
        }
        x = sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                         dev, n, 1, mb, 0);
        x.mem_type = STAGELINK_MEM_CUDA;
        st = (stage == 0) ? p->isend(comm, &x, &req) : p->irecv(comm, &x, &req);
        if (st == STAGELINK_SUCCESS) {
            st = p->wait(comm, req);
        }
        if (i == 0 && stage == 1) {
            CHECK(st == STAGELINK_ERR_SIZE_MISMATCH,
                  "a one-chunk device receive of %zu bytes met a sender of "
                  "%zu: %s (%s), expected a size mismatch", n, big,
                  stagelink_status_string(st), p->last_error(comm));
        } else {
            CHECK(st == STAGELINK_SUCCESS || (i == 0 && st == STAGELINK_ERR_SIZE_MISMATCH),
                  "%s %zu bytes (%s%zu-byte receive): %s: %s",
                  stage == 0 ? "sent" : "received", n,
                  i == 0 ? "against a " : "after the mismatch with a ", small,
                  stagelink_status_string(st), p->last_error(comm));
        }
        if (stage == 1 && i == 1 && st == STAGELINK_SUCCESS) {
            bad = sl_pattern_check(alias, 0, n, mb * 2 + 1);
            CHECK(bad == SIZE_MAX, "the transfer after a mismatch with a "
                  "%zu-byte receive: device byte %zu wrong (a chunk of the "
                  "mismatched sender left on the wire?)", small, bad);
        }
    }
}

int main(void)
{
    static const size_t sizes[] = {1, 4095, 4096, 4097, 5 * 4096 + 3, 300001,
                                   (2 << 20) + 5};
    const stagelink_plugin_v1_t *p = &stagelink_plugin_v1;
    stagelink_config_t           cfg;
    stagelink_comm_info_t        info;
    stagelink_comm_t            *comm;
    stagelink_request_t         *req;
    stagelink_xfer_t             x;
    stagelink_status_t           st;
    uint64_t                     chunks_before;
    size_t                       i, bad;
    int                          fd, stage, backward, sender;
    static char                  host_buf[64 * 1024];

    fd = memfd_create("stagelink-fake-device", 0);
    if (fd < 0 || ftruncate(fd, (off_t)DEV_BYTES) != 0) {
        perror("memfd");
        return 1;
    }
    dev   = mmap(NULL, DEV_BYTES, PROT_NONE, MAP_SHARED, fd, 0);
    alias = mmap(NULL, DEV_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (dev == MAP_FAILED || alias == MAP_FAILED) {
        perror("mmap");
        return 1;
    }

    memset(&cfg, 0, sizeof(cfg));
    cfg.struct_size = sizeof(cfg);
    cfg.tp_size     = 2;
    /* GPU-direct demanded of a rank with a GPU but a UCX without CUDA: every
     * rank refuses at init, naming what is missing. */
    sl_device_runtime = &fake_gpu;
    setenv("STAGELINK_GPU_DIRECT", "require", 1);
    st = p->comm_init(&cfg, &comm);
    CHECK(st == STAGELINK_ERR_CONFIG &&
          strstr(p->last_error(NULL), "STAGELINK_GPU_DIRECT=require, but UCX") &&
          strstr(p->last_error(NULL), "reports no CUDA memory type"),
          "STAGELINK_GPU_DIRECT=require without CUDA in UCX: %s: %s",
          stagelink_status_string(st), p->last_error(NULL));
    unsetenv("STAGELINK_GPU_DIRECT");
    sl_device_runtime = &sl_gpu_default_ops;
    if (p->comm_init(&cfg, &comm) != STAGELINK_SUCCESS) {
        fprintf(stderr, "init: %s\n", p->last_error(NULL));
        return 1;
    }
    sl_progress_enter(comm); /* the progress thread reads these */
    comm->gpu        = &fake_gpu;
    comm->gpu_usable = 1;
    sl_progress_leave(comm);
    CHECK(!comm->ucx_cuda, "this test needs a UCX without CUDA");
    p->comm_info(comm, &info);
    stage = info.pp_index;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        for (backward = 0; backward < 2; ++backward) {
            size_t   n    = sizes[i];
            uint64_t seed = sl_pattern_seed(backward ? 1 : 0, (uint32_t)i, 0,
                                            backward);

            sender = (stage == (backward ? 1 : 0));
            if (sender) {
                sl_pattern_fill(alias, 0, n, seed);
            } else {
                memset(alias, 0xee, n);
            }
            x = sl_host_xfer(backward == (stage == 0) ? STAGELINK_PEER_NEXT
                                                      : STAGELINK_PEER_PREV,
                             dev, n, 1, (uint32_t)i, 0);
            x.peer = (stage == 0) ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV;
            /* Half the transfers say what the memory is, half let it be found. */
            x.mem_type    = (i % 2) ? STAGELINK_MEM_CUDA : STAGELINK_MEM_AUTO;
            x.stream      = (void *)0x5a;
            chunks_before = comm->staged_chunks;
            st = sender ? p->isend(comm, &x, &req) : p->irecv(comm, &x, &req);
            if (st == STAGELINK_SUCCESS) {
                st = p->wait(comm, req);
            }
            CHECK(st == STAGELINK_SUCCESS, "%zu bytes %s: %s: %s", n,
                  sender ? "sent" : "received", stagelink_status_string(st),
                  p->last_error(comm));
            /* Below 2 bytes one TP rank's shard is empty and moves nothing. */
            CHECK(n < 2 || comm->staged_chunks > chunks_before,
                  "%zu bytes: no chunk went through the staging buffers", n);
            if (!sender && st == STAGELINK_SUCCESS) {
                bad = sl_pattern_check(alias, 0, n, seed);
                CHECK(bad == SIZE_MAX, "%zu bytes: device byte %zu wrong", n, bad);
            }
        }
    }
    CHECK(copied > 0, "the copy engine was never used");

    /* UCX claims cuda_ipc now, but the tensors are memory cuda_ipc cannot
     * share: still staged (handed to UCX, the no-access mapping would kill
     * the rank), and whole. */
    sl_progress_enter(comm);
    comm->ucx_cuda = comm->ucx_ipc = 1;
    sl_progress_leave(comm);
    for (i = 0; i < 2; ++i) {
        size_t   n    = (i == 0) ? 5 * 4096 + 3 : 300001;
        uint64_t seed = sl_pattern_seed(0, (uint32_t)(200 + i), 0, 0);

        if (stage == 0) {
            sl_pattern_fill(alias, 0, n, seed);
        } else {
            memset(alias, 0xee, n);
        }
        x = sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                         dev, n, 1, (uint32_t)(200 + i), 0);
        x.mem_type    = STAGELINK_MEM_CUDA;
        chunks_before = comm->staged_chunks;
        st = (stage == 0) ? p->isend(comm, &x, &req) : p->irecv(comm, &x, &req);
        if (st == STAGELINK_SUCCESS) {
            st = p->wait(comm, req);
        }
        CHECK(st == STAGELINK_SUCCESS && comm->staged_chunks > chunks_before,
              "%zu bytes not shareable by cuda_ipc: %s, %llu chunks staged: %s",
              n, stagelink_status_string(st),
              (unsigned long long)(comm->staged_chunks - chunks_before),
              p->last_error(comm));
        if (stage == 1 && st == STAGELINK_SUCCESS) {
            bad = sl_pattern_check(alias, 0, n, seed);
            CHECK(bad == SIZE_MAX, "%zu bytes not shareable by cuda_ipc: "
                  "device byte %zu wrong", n, bad);
        }
    }
    sl_progress_enter(comm);
    comm->ucx_cuda = comm->ucx_ipc = 0;
    sl_progress_leave(comm);

    /* A device sender and a receiver in host memory: the same chunks. */
    x = sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                     stage == 0 ? (void *)dev : (void *)host_buf,
                     3 * 4096 * 2 + 5, 1, 99, 0);
    if (stage == 0) {
        x.mem_type = STAGELINK_MEM_AUTO;
        sl_pattern_fill(alias, 0, x.nbytes, 99);
    } else {
        x.mem_type = STAGELINK_MEM_HOST;
        memset(host_buf, 0, sizeof(host_buf));
    }
    st = (stage == 0) ? p->isend(comm, &x, &req) : p->irecv(comm, &x, &req);
    if (st == STAGELINK_SUCCESS) {
        st = p->wait(comm, req);
    }
    CHECK(st == STAGELINK_SUCCESS, "device sender, host receiver: %s: %s",
          stagelink_status_string(st), p->last_error(comm));
    if (stage == 1 && st == STAGELINK_SUCCESS) {
        bad = sl_pattern_check(host_buf, 0, x.nbytes, 99);
        CHECK(bad == SIZE_MAX, "host receiver of a device sender: byte %zu", bad);
    }

    /* Receives of one chunk a shard in device memory meet a framed sender
     * (a shard of a whole chunk, and one under the 16 bytes of a length
     * header): each fails, and the sender's chunks are drained, so the next
     * transfer with the same tag gets its own bytes. */
    mismatch_then_reuse(p, comm, stage, 2 * comm->chunk, 98);
    mismatch_then_reuse(p, comm, stage, 16, 97);

    /* A declared type the runtime contradicts is refused at post, on this
     * rank alone: a device pointer declared host would reach UCX (and
     * fault), a host pointer declared device would be copied as device. */
    refused_type(p, comm, stage, dev, STAGELINK_MEM_HOST,
                 "is cuda memory, but the transfer says host");
    refused_type(p, comm, stage, host_buf, STAGELINK_MEM_CUDA,
                 "is host memory, but the transfer says cuda");
    p->comm_finalize(comm);
    return check_summary();
}
