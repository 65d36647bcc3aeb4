/*
 * comm_finalize with requests the host never completed: it returns within
 * STAGELINK_FINALIZE_GRACE (plus 1 s) of the holder's call on every rank,
 * and the rank that held them gets STAGELINK_ERR_ABANDONED with a
 * sentence naming each tag; valgrind finds nothing lost.
 *
 *   finalize_inflight sends|recvs   (two ranks, t = 1; the variable set)
 *
 * sends: rank 0 posts 8 sends of 4 MiB that rank 1 never receives;
 * recvs: rank 1 posts 8 receives that rank 0 never sends (canceled at once,
 * so both return well within the grace).  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "host.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define COUNT 8
#define BYTES (4u << 20)

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    sl_host_t           host;
    stagelink_request_t *req[COUNT];
    const char          *grace_env = getenv("STAGELINK_FINALIZE_GRACE");
    double               grace = grace_env ? atof(grace_env) : 5.0, t0, took;
    /* The teardown's second, stretched under valgrind (its test setup). */
    const char          *slow_env = getenv("TEST_SLOWDOWN");
    double               slack = slow_env ? atof(slow_env) : 1.0;
    double               t_holder = 0.0;
    FILE                *f;
    char                 mark[96];
    stagelink_status_t   st;
    unsigned char       *bufs[COUNT];
    int                  sends, holder, rank, i;
    char                 sentence[4096], want[64];

    if (argc != 2 || (strcmp(argv[1], "sends") && strcmp(argv[1], "recvs"))) {
        fprintf(stderr, "usage: finalize_inflight sends|recvs\n");
        return 2;
    }
    sends = strcmp(argv[1], "sends") == 0;
    if (sl_host_open(&host, 1, 2, STAGELINK_MODE_FULL) != 0) {
        return 1;
    }
    rank   = host.info.rank;
    holder = (host.info.pp_index == (sends ? 0 : 1));
    for (i = 0; holder && i < COUNT; ++i) {
        stagelink_xfer_t x;

        bufs[i] = calloc(1, BYTES);
        x = sl_host_xfer(sends ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                         bufs[i], BYTES, 1, (uint32_t)i, 0);
        st = sends ? host.plugin->isend(host.comm, &x, &req[i])
                   : host.plugin->irecv(host.comm, &x, &req[i]);
        if (sl_host_report(&host, st, sends ? "isend" : "irecv")) {
            return 1;
        }
    }
    /* The holder's grace starts when it calls finalize, and the other
     * rank's finalize waits for it there (the closing barrier): each rank
     * is timed from the later of its own call and the holder's, which a
     * loaded machine can hold back by seconds (CLOCK_MONOTONIC is one
     * clock for every process here). */
    snprintf(mark, sizeof(mark), "/tmp/sl-finalize-inflight-%s.t0",
             getenv("MASTER_PORT") ? getenv("MASTER_PORT") : "0");
    t0 = now_s();
    if (holder && (f = fopen(mark, "w")) != NULL) {
        fprintf(f, "%.9f\n", t0);
        fclose(f);
    }
    st   = host.plugin->comm_finalize(host.comm);
    took = now_s() - t0;
    if (!holder && (f = fopen(mark, "r")) != NULL) {
        if (fscanf(f, "%lf", &t_holder) == 1 && t_holder > t0) {
            took -= t_holder - t0;
        }
        fclose(f);
        unlink(mark);
    }
    snprintf(sentence, sizeof(sentence), "%s", host.plugin->last_error(host.comm));
    host.comm = NULL;
    printf("rank %d: finalize took %.3f s (grace %.1f s): %s%s%s\n", rank, took,
           grace, stagelink_status_string(st), holder ? ": " : "",
           holder ? sentence : "");
    CHECK(took <= (sends ? grace : 0.0) + slack, "rank %d: finalize took "
          "%.3f s, more than %s%.0f s", rank, took,
          sends ? "the grace plus " : "", slack);
    if (holder) {
        CHECK(st == STAGELINK_ERR_ABANDONED, "rank %d: finalize returned %s "
              "with %d %s in flight, expected STAGELINK_ERR_ABANDONED", rank,
              stagelink_status_string(st), COUNT, argv[1]);
        for (i = 0; i < COUNT; ++i) {
            snprintf(want, sizeof(want), "microbatch %d chunk 0", i);
            CHECK(strstr(sentence, want) != NULL, "rank %d: the sentence does "
                  "not name \"%s\"", rank, want);
        }
        snprintf(want, sizeof(want), "%d %s", COUNT,
                 sends ? "sends not done" : "receives canceled");
        CHECK(strstr(sentence, want) != NULL, "rank %d: the sentence does not "
              "say \"%s\"", rank, want);
    } else {
        CHECK(st == STAGELINK_SUCCESS, "rank %d: finalize returned %s with "
              "nothing in flight", rank, stagelink_status_string(st));
    }
    sl_host_close(&host);
    for (i = 0; holder && i < COUNT; ++i) {
        free(bufs[i]); /* the transport is done with them after finalize */
    }
    return check_summary();
}
