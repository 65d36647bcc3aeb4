/*
 * Who joins: rank 0's listener and the admission of every connection
 * (hello, challenge, proof, welcome), and the other ranks' join.  With a
 * job secret both sides prove they hold it over fresh nonces before rank 0
 * counts a rank, and each accepted connection gets its own key, which
 * seals every later message (sl_auth.h).  Without one, a hello with the
 * job key is admitted, as the rendezvous has always done.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_RENDEZVOUS_H
#define SL_RENDEZVOUS_H

#include "sl_auth.h"
#include "sl_error.h"
#include "sl_launcher.h"

#include <stddef.h>
#include <stdint.h>

#define SL_BOOT_MAGIC   0x534c4e4bu /* "SLNK" */
#define SL_BOOT_VERSION 4u

/** Wire header of every bootstrap message from a rank to rank 0. */
typedef struct sl_boot_hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t rank;
    uint32_t world_size;
    uint64_t job_key;
    uint64_t size; /**< bytes following (before the seal, if any) */
} sl_boot_hdr_t;

/** The hello: a header with size sizeof(this), then this. */
typedef struct sl_boot_hello {
    uint32_t mode; /**< sl_auth_mode_t of the client */
    uint32_t reserved;
    uint8_t  fingerprint[SL_AUTH_FP_LEN];
    uint8_t  nonce[SL_AUTH_NONCE_LEN];
} sl_boot_hello_t;

/** Rank 0's answer to a hello that is ours. */
typedef enum sl_boot_verdict {
    SL_BOOT_ADMIT        = 0, /**< proof next (secret), else joined */
    SL_BOOT_WRONG_KEY    = 1,
    SL_BOOT_WRONG_WORLD  = 2,
    SL_BOOT_BAD_RANK     = 3,
    SL_BOOT_RANK_TAKEN   = 4,
    SL_BOOT_WRONG_MODE   = 5, /**< one side has a secret, the other none */
    SL_BOOT_WRONG_SECRET = 6, /**< the fingerprints differ */
    SL_BOOT_SILENT       = 7, /**< not a stagelink hello: no answer */
    SL_BOOT_WRONG_VERSION = 8 /**< a stagelink hello of another version */
} sl_boot_verdict_t;

/** Magic and verdict come first in every version, so a rank of another
 *  version can read why it was refused. */
typedef struct sl_boot_challenge {
    uint32_t magic;
    uint32_t verdict;
    uint32_t mode;
    uint32_t version; /**< rank 0's SL_BOOT_VERSION */
    uint8_t  fingerprint[SL_AUTH_FP_LEN]; /**< with WRONG_SECRET only */
    uint8_t  nonce[SL_AUTH_NONCE_LEN];
    uint8_t  proof[SL_AUTH_MAC_LEN]; /**< rank 0's, over both nonces */
} sl_boot_challenge_t;

/** The client's proof, once rank 0's checked out. */
typedef struct sl_boot_proof {
    uint8_t proof[SL_AUTH_MAC_LEN];
} sl_boot_proof_t;

/** Rank 0's word that the proof was accepted, sealed under the new key. */
typedef struct sl_boot_welcome {
    uint32_t       magic;
    uint32_t       rank;
    sl_auth_seal_t seal;
} sl_boot_welcome_t;

typedef struct sl_rendezvous {
    int             rank, world_size;
    uint64_t        job_key;
    sl_auth_t       auth;
    int             root_fd;  /**< non-root: socket to rank 0 */
    int            *peer_fds; /**< rank 0: socket of each rank */
    /** Rank 0: one per rank; others: [0], the link to rank 0. */
    sl_auth_link_t *links;
    char            refused[256]; /**< rank 0: the last refusal, for errors */
    unsigned        drops_unsaid; /**< rank 0: drops since the last warning */
    double          drop_said_at; /**< rank 0: when the last one was said */
} sl_rendezvous_t;

/**
 * Rank 0 admits every other rank before the deadline; the others join.
 * The secret is read here (sl_auth_load).  On failure everything is
 * closed.
 */
sl_status_t sl_rendezvous_open(sl_rendezvous_t *rv,
                               const sl_launcher_t *launcher, double timeout,
                               sl_errbuf_t *eb);

void sl_rendezvous_close(sl_rendezvous_t *rv);

/**
 * Checks a header from a rank against this job: magic and version, job
 * key, world size.  *verdict (may be NULL) says what rank 0 answers a
 * hello that fails (SL_BOOT_SILENT: nothing).
 */
sl_status_t sl_rendezvous_check_hdr(const sl_boot_hdr_t *h, uint64_t job_key,
                                    int world_size, sl_boot_verdict_t *verdict,
                                    sl_errbuf_t *eb);

/**
 * Decodes a hello at rank 0 (the bytes a stranger controls): magic,
 * version, job key, world size, rank in range and not taken, the mode
 * and the secret's fingerprint.  On success *rank is set; on failure
 * *verdict says what rank 0 answers (SL_BOOT_SILENT: nothing).
 */
sl_status_t sl_rendezvous_check_hello(const sl_rendezvous_t *rv,
                                      const void *buf, size_t len,
                                      uint32_t *rank,
                                      sl_boot_verdict_t *verdict,
                                      sl_errbuf_t *eb);

/** Checks a client's proof for the connection `bind` describes. */
sl_status_t sl_rendezvous_check_proof(const sl_rendezvous_t *rv,
                                      const sl_auth_bind_t *bind,
                                      const void *buf, size_t len,
                                      sl_errbuf_t *eb);

#endif
