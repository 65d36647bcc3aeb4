/*
 * The job secret and what is computed from it: the rendezvous proofs of
 * both sides, the key of each accepted connection, and the MAC that seals
 * every later bootstrap message.  HMAC-SHA256 from libcrypto, nonces from
 * getrandom; nothing cryptographic is written here.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_AUTH_H
#define SL_AUTH_H

#include "sl_error.h"

#include <stddef.h>
#include <stdint.h>

#define SL_AUTH_NONCE_LEN  32
#define SL_AUTH_MAC_LEN    32
#define SL_AUTH_FP_LEN     8   /**< fingerprint bytes shown and sent */
#define SL_AUTH_SECRET_MAX 4096
#define SL_AUTH_SECRET_SHORT 16 /**< below: a warning */

typedef enum sl_auth_mode {
    SL_AUTH_NONE = 0, /**< no secret: the job key alone tells jobs apart */
    SL_AUTH_HMAC = 1  /**< mutual HMAC-SHA256 proof and sealed messages */
} sl_auth_mode_t;

typedef struct sl_auth {
    sl_auth_mode_t mode;
    char           source[160]; /**< where the secret came from, for logs */
    unsigned char  secret[SL_AUTH_SECRET_MAX];
    size_t         len;
    uint8_t        fingerprint[SL_AUTH_FP_LEN];
} sl_auth_t;

/** What binds a proof to one connection of one job. */
typedef struct sl_auth_bind {
    uint8_t  client_nonce[SL_AUTH_NONCE_LEN];
    uint8_t  root_nonce[SL_AUTH_NONCE_LEN];
    uint32_t rank, world_size;
    uint64_t job_key;
} sl_auth_bind_t;

typedef enum sl_auth_label {
    SL_AUTH_CLIENT_PROOF,
    SL_AUTH_ROOT_PROOF,
    SL_AUTH_SESSION_KEY
} sl_auth_label_t;

/** Direction of a sealed message on one connection. */
typedef enum sl_auth_dir {
    SL_AUTH_TO_ROOT   = 0,
    SL_AUTH_FROM_ROOT = 1
} sl_auth_dir_t;

/** One accepted connection: its key and the next sequence number each way. */
typedef struct sl_auth_link {
    int      sealed; /**< 0: mode none, messages go without a seal */
    uint8_t  key[SL_AUTH_MAC_LEN];
    uint64_t seq[2];
} sl_auth_link_t;

/** The seal after every message of a sealed link. */
typedef struct sl_auth_seal {
    uint64_t seq;
    uint8_t  mac[SL_AUTH_MAC_LEN];
} sl_auth_seal_t;

/**
 * Reads STAGELINK_JOB_SECRET or the file STAGELINK_JOB_SECRET_FILE names
 * (a regular file no group or other may read; one trailing newline is not
 * part of the secret).  Neither set: mode none.  Both set, either set but
 * empty, an unreadable or open file: STAGELINK_ERR_CONFIG (never a silent
 * fall back to none).  The fingerprint is of the secret and `job_key`, so
 * it names no secret across jobs.
 */
sl_status_t sl_auth_load(sl_auth_t *auth, uint64_t job_key, sl_errbuf_t *eb);

/** Uses `secret` as given (tests, tools). */
sl_status_t sl_auth_set(sl_auth_t *auth, const void *secret, size_t len,
                        const char *source, uint64_t job_key,
                        sl_errbuf_t *eb);

/** Whether either variable is set (even empty): a secret is meant. */
int sl_auth_configured(void);

/** Wipes the secret. */
void sl_auth_clear(sl_auth_t *auth);

/** Wipes the keys of `n` links. */
void sl_auth_clear_links(sl_auth_link_t *links, size_t n);

/** Hex of a fingerprint: 2 * SL_AUTH_FP_LEN characters and a NUL. */
void sl_auth_fingerprint_hex(const uint8_t *fp, char *out);

/** Fresh random bytes from getrandom. */
sl_status_t sl_auth_random(void *buf, size_t len, sl_errbuf_t *eb);

/** HMAC of the secret over a label and the binding. */
sl_status_t sl_auth_compute(const sl_auth_t *auth, sl_auth_label_t label,
                            const sl_auth_bind_t *bind,
                            uint8_t out[SL_AUTH_MAC_LEN], sl_errbuf_t *eb);

/** Constant-time comparison: 1 when equal. */
int sl_auth_equal(const void *a, const void *b, size_t len);

/**
 * Seal of one message in direction `dir` over `nparts` buffers, under the
 * link's key and its next sequence number that way (which it then
 * advances).  sl_auth_check recomputes it and compares in constant time.
 */
typedef struct sl_auth_part {
    const void *buf;
    size_t      len;
} sl_auth_part_t;

sl_status_t sl_auth_seal(sl_auth_link_t *link, sl_auth_dir_t dir,
                         const sl_auth_part_t *parts, int nparts,
                         sl_auth_seal_t *seal, sl_errbuf_t *eb);

/** STAGELINK_ERR_BOOTSTRAP when the seal is not the next one each way. */
sl_status_t sl_auth_check(sl_auth_link_t *link, sl_auth_dir_t dir,
                          const sl_auth_part_t *parts, int nparts,
                          const sl_auth_seal_t *seal, const char *what,
                          sl_errbuf_t *eb);

/** One line for stagelink_info: the mode in force, and from where (the
 *  fingerprint for this environment's job key). */
size_t sl_auth_describe(char *buf, size_t len);

#endif
