/*
 * libFuzzer target for the bytes a stranger controls at rank 0: the hello
 * a connecting client sends.  The first three input bytes choose the
 * receiving job (world size 2..17 and which ranks have already arrived);
 * the rest is the hello, of any length.  An accepted hello must name a
 * free rank in range of this job with its key; anything else must be
 * refused with a sentence.
 * SPDX-License-Identifier: MIT
 */
#include "sl_bootstrap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JOB_KEY 0x5354414745ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sl_bootstrap_t bs;
    sl_errbuf_t    eb = {{0}};
    int            fds[17], r;
    uint32_t       rank = UINT32_MAX;
    unsigned       taken;

    if (size < 3) {
        return 0;
    }
    memset(&bs, 0, sizeof(bs));
    bs.world_size = 2 + (data[0] & 15);
    bs.job_key    = JOB_KEY;
    bs.peer_fds   = fds;
    taken         = (unsigned)data[1] | ((unsigned)data[2] << 8);
    for (r = 0; r < bs.world_size; ++r) {
        fds[r] = (taken >> r) & 1 ? 100 + r : -1;
    }
    if (sl_bootstrap_check_hello(&bs, data + 3, size - 3, &rank, &eb) ==
        STAGELINK_SUCCESS) {
        if (rank == 0 || rank >= (uint32_t)bs.world_size || fds[rank] >= 0) {
            abort(); /* accepted a rank it must refuse */
        }
    } else if (eb.msg[0] == '\0' || rank != UINT32_MAX) {
        abort(); /* refused without saying why, or wrote the rank anyway */
    }
    return 0;
}
