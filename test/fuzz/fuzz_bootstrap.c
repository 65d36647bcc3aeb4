/*
 * libFuzzer target for the bytes that reach rank 0's rendezvous from the
 * network.  The first input byte chooses the message, the second the job
 * (world size 2..17, with or without a secret), the next two which ranks
 * have joined; the rest is the message, of any length:
 *   0  a hello: accepted only for a free rank in range, with this job's
 *      key, world size, mode and secret fingerprint;
 *   1  a proof for a fixed connection: accepted only when it is the one
 *      HMAC-SHA256 gives;
 *   2  an exchange message the harness seals correctly (so the decoding
 *      behind the seal is reached), 3 one with the input's own seal (never
 *      accepted unless it is the right one), 4 one on an unsealed link:
 *      an accepted part names ranks in range and lies within the message.
 * Anything refused must say why.
 * SPDX-License-Identifier: MIT
 */
#include "sl_bootstrap.h"
#include "sl_rendezvous.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define JOB_KEY 0x5354414745ull

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_hello(sl_rendezvous_t *rv, const uint8_t *msg, size_t len)
{
    sl_boot_verdict_t verdict = SL_BOOT_ADMIT;
    sl_boot_hello_t   hello;
    sl_boot_hdr_t     h;
    sl_errbuf_t       eb   = {{0}};
    uint32_t          rank = UINT32_MAX;

    if (sl_rendezvous_check_hello(rv, msg, len, &rank, &verdict, &eb) ==
        STAGELINK_SUCCESS) {
        memcpy(&h, msg, sizeof(h));
        memcpy(&hello, msg + sizeof(h), sizeof(hello));
        if (len != sizeof(h) + sizeof(hello) || rank != h.rank || rank == 0 ||
            rank >= (uint32_t)rv->world_size || rv->peer_fds[rank] >= 0 ||
            h.job_key != JOB_KEY || hello.mode != (uint32_t)rv->auth.mode ||
            (rv->auth.mode == SL_AUTH_HMAC &&
             memcmp(hello.fingerprint, rv->auth.fingerprint, SL_AUTH_FP_LEN)) ||
            verdict != SL_BOOT_ADMIT) {
            abort(); /* admitted a hello it must refuse */
        }
    } else if (eb.msg[0] == '\0' || rank != UINT32_MAX ||
               verdict == SL_BOOT_ADMIT) {
        abort(); /* refused without saying why, or half-accepted */
    }
}

static void check_proof(sl_rendezvous_t *rv, const uint8_t *msg, size_t len)
{
    sl_auth_bind_t bind = {.rank = 1, .world_size = (uint32_t)rv->world_size,
                           .job_key = JOB_KEY};
    uint8_t        want[SL_AUTH_MAC_LEN];
    sl_errbuf_t    eb = {{0}};

    if (rv->auth.mode != SL_AUTH_HMAC) {
        return;
    }
    memset(bind.client_nonce, 0xc1, sizeof(bind.client_nonce));
    memset(bind.root_nonce, 0x70, sizeof(bind.root_nonce));
    if (sl_rendezvous_check_proof(rv, &bind, msg, len, &eb) ==
        STAGELINK_SUCCESS) {
        sl_auth_compute(&rv->auth, SL_AUTH_CLIENT_PROOF, &bind, want, NULL);
        if (len != sizeof(want) || memcmp(msg, want, sizeof(want)) != 0) {
            abort(); /* accepted a wrong proof */
        }
    } else if (eb.msg[0] == '\0') {
        abort();
    }
}

static void check_part(int world, int kind, const uint8_t *msg, size_t len)
{
    sl_bootstrap_t bs   = {.rank = 0, .world_size = world, .job_key = JOB_KEY};
    sl_auth_link_t link = {.sealed = (kind != 4)}, tx;
    sl_auth_seal_t seal = {0};
    sl_boot_part_t part;
    sl_boot_hdr_t  hdr;
    sl_errbuf_t    eb = {{0}};
    char          *body;
    size_t         n;
    uint32_t       i;

    if (len < sizeof(hdr) + (kind == 3 ? sizeof(seal) : 0)) {
        return;
    }
    memcpy(&hdr, msg, sizeof(hdr));
    n = len - sizeof(hdr) - (kind == 3 ? sizeof(seal) : 0);
    hdr.size = n; /* the reader frames the body by the header's size */
    body     = malloc(n + 1);
    if (body == NULL) {
        return;
    }
    memcpy(body, msg + sizeof(hdr), n);
    memset(link.key, 0x5e, sizeof(link.key));
    tx = link;
    if (kind == 2) {
        sl_auth_part_t parts[] = {{&hdr, sizeof(hdr)}, {body, n}};

        sl_auth_seal(&tx, SL_AUTH_TO_ROOT, parts, 2, &seal, NULL);
    } else if (kind == 3) {
        memcpy(&seal, msg + len - sizeof(seal), sizeof(seal));
    }
    if (sl_bootstrap_parse_part(&bs, 1, "addr", &hdr, body, &seal, &link,
                                &part, &eb) == STAGELINK_SUCCESS) {
        if (kind == 3 || hdr.rank != 1 || part.npeers > (uint32_t)world ||
            (char *)part.peers + 4ull * part.npeers > body + n ||
            part.blob.data + part.blob.len != body + n) {
            abort(); /* accepted a forged seal, or a part outside its bytes */
        }
        for (i = 0; i < part.npeers; ++i) {
            if (part.peers[i] >= (uint32_t)world) {
                abort();
            }
        }
    } else if (eb.msg[0] == '\0') {
        abort();
    }
    free(body);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char secret[] = "fuzz-job-secret";
    sl_rendezvous_t   rv;
    int               fds[17], r;
    unsigned          taken;

    if (size < 4) {
        return 0;
    }
    memset(&rv, 0, sizeof(rv));
    rv.world_size = 2 + (data[1] & 15);
    rv.job_key    = JOB_KEY;
    rv.peer_fds   = fds;
    if (data[1] & 16) {
        sl_auth_set(&rv.auth, secret, sizeof(secret) - 1, "fuzz", JOB_KEY,
                    NULL);
    }
    taken = (unsigned)data[2] | ((unsigned)data[3] << 8);
    for (r = 0; r < rv.world_size; ++r) {
        fds[r] = (taken >> r) & 1 ? 100 + r : -1;
    }
    switch (data[0] % 5) {
    case 0: check_hello(&rv, data + 4, size - 4); break;
    case 1: check_proof(&rv, data + 4, size - 4); break;
    default:
        check_part(rv.world_size, data[0] % 5, data + 4, size - 4);
        break;
    }
    return 0;
}
