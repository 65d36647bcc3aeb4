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

/* What every phase sees. */
typedef struct {
    const stagelink_plugin_v1_t *p;
    stagelink_comm_t            *comm;
    int                          stage;
    stagelink_peer_t             peer; /* the other stage */
} case_ctx_t;

/* Posts `x` (stage 0 sends unless `sender` says otherwise) and waits. */
static stagelink_status_t post_wait(const case_ctx_t *c, int sender,
                                    stagelink_xfer_t *x)
{
    stagelink_request_t *req;
    stagelink_status_t   st = sender ? c->p->isend(c->comm, x, &req)
                                     : c->p->irecv(c->comm, x, &req);

    return (st == STAGELINK_SUCCESS) ? c->p->wait(c->comm, req) : st;
}

/* One post of `buf` declared `type`, which must be refused with `says`. */
static void refused_type(const case_ctx_t *c, void *buf,
                         stagelink_mem_type_t type, const char *says)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x = sl_host_xfer(c->peer, buf, 4096, 1, 100, 0);
    stagelink_status_t   st;

    x.mem_type = type;
    st = (c->stage == 0) ? c->p->isend(c->comm, &x, &req)
                         : c->p->irecv(c->comm, &x, &req);
    CHECK(st == STAGELINK_ERR_INVALID_ARG && strstr(c->p->last_error(c->comm), says),
          "%p declared %d: %s: %s", buf, (int)type, stagelink_status_string(st),
          c->p->last_error(c->comm));
}

/* A receive of `small` bytes meets a sender of 6 chunks a shard and more,
 * then both pass that size on the same tag (microbatch mb). */
static void mismatch_then_reuse(const case_ctx_t *c, size_t small, uint32_t mb)
{
    const stagelink_plugin_v1_t *p     = c->p;
    stagelink_comm_t            *comm  = c->comm;
    int                          stage = c->stage;
    stagelink_xfer_t             x;
    stagelink_status_t           st;
    size_t                       big = 6 * comm->chunk + 10, n, bad;
    int                          i;

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
        st         = post_wait(c, stage == 0, &x);
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

/* GPU-direct demanded of a rank with a GPU but a UCX without CUDA: every
 * rank refuses at init, naming what is missing. */
static void require_gpu_direct_case(const stagelink_config_t *cfg)
{
    const stagelink_plugin_v1_t *p = &stagelink_plugin_v1;
    stagelink_comm_t            *comm;
    stagelink_status_t           st;

    sl_device_runtime = &fake_gpu;
    setenv("STAGELINK_GPU_DIRECT", "require", 1);
    st = p->comm_init(cfg, &comm);
    CHECK(st == STAGELINK_ERR_CONFIG &&
          strstr(p->last_error(NULL), "STAGELINK_GPU_DIRECT=require, but UCX") &&
          strstr(p->last_error(NULL), "reports no CUDA memory type"),
          "STAGELINK_GPU_DIRECT=require without CUDA in UCX: %s: %s",
          stagelink_status_string(st), p->last_error(NULL));
    unsetenv("STAGELINK_GPU_DIRECT");
    sl_device_runtime = &sl_gpu_default_ops;
}

/* Odd sizes around the chunk, both ways, the memory type given or found. */
static void odd_sizes_case(const case_ctx_t *c)
{
    static const size_t sizes[] = {1, 4095, 4096, 4097, 5 * 4096 + 3, 300001,
                                   (2 << 20) + 5};
    stagelink_xfer_t    x;
    stagelink_status_t  st;
    uint64_t            chunks_before, seed;
    size_t              i, n, bad;
    int                 backward, sender;

    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        for (backward = 0; backward < 2; ++backward) {
            n      = sizes[i];
            seed   = sl_pattern_seed(backward ? 1 : 0, (uint32_t)i, 0, backward);
            sender = (c->stage == (backward ? 1 : 0));
            if (sender) {
                sl_pattern_fill(alias, 0, n, seed);
            } else {
                memset(alias, 0xee, n);
            }
            x = sl_host_xfer(c->peer, dev, n, 1, (uint32_t)i, 0);
            /* Half the transfers say what the memory is, half let it be found. */
            x.mem_type    = (i % 2) ? STAGELINK_MEM_CUDA : STAGELINK_MEM_AUTO;
            x.stream      = (void *)0x5a;
            chunks_before = c->comm->staged_chunks;
            st            = post_wait(c, sender, &x);
            CHECK(st == STAGELINK_SUCCESS, "%zu bytes %s: %s: %s", n,
                  sender ? "sent" : "received", stagelink_status_string(st),
                  c->p->last_error(c->comm));
            /* Below 2 bytes one TP rank's shard is empty and moves nothing. */
            CHECK(n < 2 || c->comm->staged_chunks > chunks_before,
                  "%zu bytes: no chunk went through the staging buffers", n);
            if (!sender && st == STAGELINK_SUCCESS) {
                bad = sl_pattern_check(alias, 0, n, seed);
                CHECK(bad == SIZE_MAX, "%zu bytes: device byte %zu wrong", n, bad);
            }
        }
    }
    CHECK(copied > 0, "the copy engine was never used");
}

/* UCX claims cuda_ipc now, but the tensors are memory cuda_ipc cannot
 * share: still staged (handed to UCX, the no-access mapping would kill
 * the rank), and whole. */
static void ipc_unshareable_case(const case_ctx_t *c)
{
    stagelink_xfer_t   x;
    stagelink_status_t st;
    uint64_t           chunks_before, seed;
    size_t             i, n, bad;

    sl_progress_enter(c->comm);
    c->comm->ucx_cuda = c->comm->ucx_ipc = 1;
    sl_progress_leave(c->comm);
    for (i = 0; i < 2; ++i) {
        n    = (i == 0) ? 5 * 4096 + 3 : 300001;
        seed = sl_pattern_seed(0, (uint32_t)(200 + i), 0, 0);
        if (c->stage == 0) {
            sl_pattern_fill(alias, 0, n, seed);
        } else {
            memset(alias, 0xee, n);
        }
        x             = sl_host_xfer(c->peer, dev, n, 1, (uint32_t)(200 + i), 0);
        x.mem_type    = STAGELINK_MEM_CUDA;
        chunks_before = c->comm->staged_chunks;
        st            = post_wait(c, c->stage == 0, &x);
        CHECK(st == STAGELINK_SUCCESS && c->comm->staged_chunks > chunks_before,
              "%zu bytes not shareable by cuda_ipc: %s, %llu chunks staged: %s",
              n, stagelink_status_string(st),
              (unsigned long long)(c->comm->staged_chunks - chunks_before),
              c->p->last_error(c->comm));
        if (c->stage == 1 && st == STAGELINK_SUCCESS) {
            bad = sl_pattern_check(alias, 0, n, seed);
            CHECK(bad == SIZE_MAX, "%zu bytes not shareable by cuda_ipc: "
                  "device byte %zu wrong", n, bad);
        }
    }
    sl_progress_enter(c->comm);
    c->comm->ucx_cuda = c->comm->ucx_ipc = 0;
    sl_progress_leave(c->comm);
}

/* A device sender and a receiver in host memory: the same chunks. */
static void device_to_host_case(const case_ctx_t *c)
{
    static char        host_buf[64 * 1024];
    stagelink_xfer_t   x;
    stagelink_status_t st;
    size_t             bad;

    x = sl_host_xfer(c->peer, c->stage == 0 ? (void *)dev : (void *)host_buf,
                     3 * 4096 * 2 + 5, 1, 99, 0);
    if (c->stage == 0) {
        x.mem_type = STAGELINK_MEM_AUTO;
        sl_pattern_fill(alias, 0, x.nbytes, 99);
    } else {
        x.mem_type = STAGELINK_MEM_HOST;
        memset(host_buf, 0, sizeof(host_buf));
    }
    st = post_wait(c, c->stage == 0, &x);
    CHECK(st == STAGELINK_SUCCESS, "device sender, host receiver: %s: %s",
          stagelink_status_string(st), c->p->last_error(c->comm));
    if (c->stage == 1 && st == STAGELINK_SUCCESS) {
        bad = sl_pattern_check(host_buf, 0, x.nbytes, 99);
        CHECK(bad == SIZE_MAX, "host receiver of a device sender: byte %zu", bad);
    }
}

/* Receives of one chunk a shard in device memory meet a framed sender (a
 * shard of a whole chunk, and one under the 16 bytes of a length header):
 * each fails, and the sender's chunks are drained, so the next transfer
 * with the same tag gets its own bytes. */
static void framed_mismatch_case(const case_ctx_t *c)
{
    mismatch_then_reuse(c, 2 * c->comm->chunk, 98);
    mismatch_then_reuse(c, 16, 97);
}

/* A declared type the runtime contradicts is refused at post, on this
 * rank alone: a device pointer declared host would reach UCX (and fault),
 * a host pointer declared device would be copied as device. */
static void contradicted_type_case(const case_ctx_t *c)
{
    static char host_buf[4096];

    refused_type(c, dev, STAGELINK_MEM_HOST,
                 "is cuda memory, but the transfer says host");
    refused_type(c, host_buf, STAGELINK_MEM_CUDA,
                 "is host memory, but the transfer says cuda");
}

static const struct {
    const char *name;
    void (*run)(const case_ctx_t *c);
} cases[] = {
    {"odd sizes", odd_sizes_case},
    {"memory cuda_ipc cannot share", ipc_unshareable_case},
    {"device sender, host receiver", device_to_host_case},
    {"framed sender, one-chunk receiver", framed_mismatch_case},
    {"declared type contradicted", contradicted_type_case},
};

int main(void)
{
    stagelink_config_t    cfg = {.struct_size = sizeof(cfg), .tp_size = 2};
    stagelink_comm_info_t info;
    case_ctx_t            c = {.p = &stagelink_plugin_v1};
    size_t                i;
    int                   fd;

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
    require_gpu_direct_case(&cfg);
    if (c.p->comm_init(&cfg, &c.comm) != STAGELINK_SUCCESS) {
        fprintf(stderr, "init: %s\n", c.p->last_error(NULL));
        return 1;
    }
    sl_progress_enter(c.comm); /* the progress thread reads these */
    c.comm->gpu        = &fake_gpu;
    c.comm->gpu_usable = 1;
    sl_progress_leave(c.comm);
    CHECK(!c.comm->ucx_cuda, "this test needs a UCX without CUDA");
    c.p->comm_info(c.comm, &info);
    c.stage = info.pp_index;
    c.peer  = (c.stage == 0) ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        int failed = check_failed;

        cases[i].run(&c);
        printf("%-36s %s\n", cases[i].name, check_failed == failed ? "ok" : "FAILED");
    }
    c.p->comm_finalize(c.comm);
    return check_summary();
}
