/*
 * A wait on a peer that is computing sleeps, whatever its poll window grew
 * to.  Stage 0 streams tensors that stage 1 waits for one by one (bytes
 * arriving faster than a wake-up: the window grows towards
 * STAGELINK_SPIN_US), then computes (a sleep) before its last send.  Stage
 * 1's wait for that send must really wait (half the compute at least, or
 * the check proves nothing) and spend under a tenth of it on the CPU.
 *
 *   wait_sleeps [-n TENSORS] [-s BYTES] [-c COMPUTE_MS]
 *
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double clock_s(clockid_t id)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int one(sl_host_t *h, int send, void *buf, size_t n, uint32_t mb)
{
    stagelink_request_t *req;
    stagelink_xfer_t     x = sl_host_xfer(send ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                                          buf, n, 1, mb, 0);
    stagelink_status_t   st = send ? h->plugin->isend(h->comm, &x, &req)
                                   : h->plugin->irecv(h->comm, &x, &req);

    if (sl_host_report(h, st, send ? "isend" : "irecv") != STAGELINK_SUCCESS ||
        sl_host_report(h, h->plugin->wait(h->comm, req), "wait") != STAGELINK_SUCCESS) {
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    sl_host_t h;
    int       count = 200, opt, i, rc = 0, send;
    size_t    n = 256 << 10;
    double    compute_ms = 300, wall, cpu;
    void     *buf;

    while ((opt = getopt(argc, argv, "n:s:c:")) != -1) {
        switch (opt) {
        case 'n': count = atoi(optarg); break;
        case 's': n = strtoul(optarg, NULL, 0); break;
        case 'c': compute_ms = atof(optarg); break;
        default:
            fprintf(stderr, "usage: wait_sleeps [-n TENSORS] [-s BYTES] [-c COMPUTE_MS]\n");
            return 2;
        }
    }
    if ((buf = calloc(1, n)) == NULL ||
        sl_host_open(&h, 1, 2, STAGELINK_MODE_FULL) != 0) {
        return 1;
    }
    send = (h.info.pp_index == 0);
    for (i = 0; i < count && rc == 0; ++i) {
        rc = one(&h, send, buf, n, (uint32_t)i);
    }
    if (rc == 0 && send) {
        sl_host_compute(compute_ms * 1e3);
        rc = one(&h, 1, buf, n, (uint32_t)count);
    } else if (rc == 0) {
        wall = clock_s(CLOCK_MONOTONIC);
        cpu  = clock_s(CLOCK_THREAD_CPUTIME_ID);
        rc   = one(&h, 0, buf, n, (uint32_t)count);
        wall = clock_s(CLOCK_MONOTONIC) - wall;
        cpu  = clock_s(CLOCK_THREAD_CPUTIME_ID) - cpu;
        printf("waited %.1f ms for a peer computing %.0f ms, on the CPU %.2f ms\n",
               wall * 1e3, compute_ms, cpu * 1e3);
        CHECK(rc != 0 || wall >= compute_ms * 0.5e-3, "the wait took %.1f "
              "ms, under half the peer's %.0f ms of compute: it did not wait "
              "on it", wall * 1e3, compute_ms);
        CHECK(rc != 0 || cpu <= wall / 10, "the wait spent %.1f of its %.1f "
              "ms on the CPU: it polled instead of sleeping", cpu * 1e3,
              wall * 1e3);
    }
    CHECK(rc == 0, "a transfer failed (the log says which)");
    sl_host_close(&h);
    free(buf);
    return check_summary();
}
