/*
 * Resources across many communicator lifetimes: each cycle creates a
 * communicator (rendezvous, UCX worker, endpoints), moves one tensor from
 * stage 0 to stage 1, checks it and finalizes.  After a warm-up the open
 * file descriptors must not change and the resident set must stay within
 * a small bound: a leaked socket, event fd, mapping or buffer per cycle
 * shows up as growth over CYCLES - WARMUP.  CYCLES must exceed WARMUP (20),
 * or there would be no cycle between the baseline and the end to compare.
 *   stagelink_run -n 2 -- cycles [CYCLES]
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "resources.h"

#include <stagelink/loader.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define WARMUP     20
#define RSS_SLACK  (4L << 20) /* allocator and UCX caches settle */
#ifdef __SANITIZE_ADDRESS__
/* ASan's quarantine holds freed memory by design; LeakSanitizer checks
 * the heap instead. */
#define MEASURE_RSS 0
#else
#define MEASURE_RSS 1
#endif
#define N_ELEMS    16384

static int cycle(const stagelink_plugin_v1_t *sl, stagelink_loader_t *loader,
                 int k, char *err, size_t errlen)
{
    stagelink_config_t    cfg = {.struct_size = sizeof(cfg), .tp_size = 1};
    static float          buf[N_ELEMS];
    stagelink_comm_t     *comm;
    stagelink_comm_info_t info;
    stagelink_request_t  *req;
    stagelink_xfer_t      x = {.buf = buf, .nbytes = sizeof(buf),
                               .elem_size = sizeof(float),
                               .tag = {.microbatch = (uint32_t)k}};
    int                   i, rc = 0;

    if (stagelink_loader_comm_init(loader, &cfg, &comm, err, errlen) != 0) {
        return -1;
    }
    sl->comm_info(comm, &info);
    for (i = 0; i < N_ELEMS; ++i) {
        buf[i] = (info.next_rank >= 0) ? (float)(i + k) : -1.0f;
    }
    x.peer = (info.next_rank >= 0) ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV;
    if (((info.next_rank >= 0) ? sl->isend(comm, &x, &req)
                               : sl->irecv(comm, &x, &req)) != STAGELINK_SUCCESS ||
        sl->wait(comm, req) != STAGELINK_SUCCESS) {
        snprintf(err, errlen, "cycle %d: %s", k, sl->last_error(comm));
        rc = -1;
    }
    for (i = 0; rc == 0 && info.prev_rank >= 0 && i < N_ELEMS; ++i) {
        if (buf[i] != (float)(i + k)) {
            snprintf(err, errlen, "cycle %d: element %d is %g", k, i, buf[i]);
            rc = -1;
        }
    }
    if (sl->comm_finalize(comm) != STAGELINK_SUCCESS && rc == 0) {
        snprintf(err, errlen, "cycle %d: finalize failed", k);
        rc = -1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    int                 cycles = (argc > 1) ? atoi(argv[1]) : 1000;
    stagelink_loader_t *loader;
    char                err[1024];
    int                 k, fds0 = 0, fds;
    long                rss0 = 0, rss;

    if (cycles <= WARMUP) {
        fprintf(stderr, "cycles: %s cycles: need more than %d (the first %d "
                "warm up, the rest are measured against them)\n",
                (argc > 1) ? argv[1] : "?", WARMUP, WARMUP);
        return 1;
    }
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    for (k = 0; k < cycles; ++k) {
        if (cycle(stagelink_loader_plugin(loader), loader, k, err,
                  sizeof(err)) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        if (k == WARMUP - 1) {
            fds0 = open_fds();
            rss0 = rss_bytes();
        }
    }
    fds = open_fds();
    rss = rss_bytes();
    stagelink_loader_close(loader);
    printf("rank %s: %d cycles; after %d: %d fds, %ld KiB; at the end: %d fds, "
           "%ld KiB\n", getenv("RANK") ? getenv("RANK") : "?", cycles, WARMUP,
           fds0, rss0 >> 10, fds, rss >> 10);
    /* /proc unreadable: nothing measured */
    CHECK(fds0 >= 3 && rss0 > 0, "cannot measure descriptors (%d) or RSS "
          "(%ld) from /proc/self", fds0, rss0);
    CHECK(fds == fds0, "descriptors grew over %d cycles: %d -> %d",
          cycles - WARMUP, fds0, fds);
    CHECK(!MEASURE_RSS || rss - rss0 <= RSS_SLACK, "RSS grew over %d cycles: "
          "%ld -> %ld KiB (slack %ld KiB)", cycles - WARMUP, rss0 >> 10,
          rss >> 10, RSS_SLACK >> 10);
    return check_summary();
}
