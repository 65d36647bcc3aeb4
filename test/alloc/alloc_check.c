/*
 * Heap allocations per transfer in steady state: after a warm-up, 500
 * boundary transfers (forward and back) of a small, an eager-sized and a
 * chunked tensor must not allocate in stagelink (its own mallocs are
 * asserted zero); UCX's are reported.  Needs alloc_count.so preloaded.
 * SPDX-License-Identifier: MIT
 */
#include "../unit/check.h"
#include "host.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef void (*counts_fn)(unsigned long *, unsigned long *);

static void transfer(sl_host_t *h, unsigned char *buf, size_t n, uint32_t mb)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x;
    int                  backward;

    for (backward = 0; backward < 2; ++backward) {
        int sender = (h->info.pp_index == backward);

        x = sl_host_xfer(h->info.pp_index == 0 ? STAGELINK_PEER_NEXT
                                               : STAGELINK_PEER_PREV,
                         buf, n, 1, mb, (uint16_t)backward);
        if (sl_host_report(h, sender ? h->plugin->isend(h->comm, &x, &req)
                                     : h->plugin->irecv(h->comm, &x, &req),
                           "post") ||
            sl_host_report(h, h->plugin->wait(h->comm, req), "wait")) {
            exit(1);
        }
    }
}

int main(void)
{
    static const size_t sizes[] = {64, 65536, (4 << 20) + 3};
    counts_fn           counts = (counts_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "sl_alloc_counts");
    unsigned long       t0, o0, t1, o1;
    unsigned char      *buf;
    sl_host_t           h;
    size_t              i;
    uint32_t            mb = 0;
    int                 it;

    if (counts == NULL) {
        printf("SKIP: alloc_count.so is not preloaded\n");
        return 77;
    }
    /* The instrument works: init allocates in stagelink, malloc counts. */
    counts(&t0, &o0);
    if (sl_host_open(&h, atoi(getenv("WORLD_SIZE")) / 2, 2,
                     STAGELINK_MODE_DEFAULT) != 0) {
        return 1;
    }
    counts(&t1, &o1);
    CHECK(o1 > o0, "init made no allocation from stagelink: the counter is blind");
    {
        void *volatile probe = malloc(32);
        unsigned long  t2, o2;

        counts(&t2, &o2);
        CHECK(t2 > t1, "a malloc was not counted");
        free(probe);
    }
    buf = malloc(sizes[2]);
    memset(buf, 1, sizes[2]);
    for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
        for (it = 0; it < 50; ++it) {
            transfer(&h, buf, sizes[i], mb++);
        }
        counts(&t0, &o0);
        for (it = 0; it < 500; ++it) {
            transfer(&h, buf, sizes[i], mb++);
        }
        counts(&t1, &o1);
        CHECK(o1 == o0, "%zu bytes: stagelink allocated %lu times in 1000 "
              "steady-state transfers", sizes[i], o1 - o0);
        if (h.info.rank == 0) {
            printf("%zu bytes, t=%d: %.3f allocations per transfer by "
                   "stagelink, %.3f in all (UCX)\n", sizes[i], h.info.tp_size,
                   (double)(o1 - o0) / 1000, (double)(t1 - t0) / 1000);
        }
    }
    free(buf);
    sl_host_close(&h);
    return check_summary();
}
