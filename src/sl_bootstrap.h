/*
 * Bootstrap: the exchanges of init (facts, worker addresses, NCCL ids)
 * and finalize's barrier.  Each rank publishes a blob and reads those of
 * the ranks it names, so through the host's store a rank reads O(t) blobs
 * whatever the world size.  Without a store: the host's allgather (every
 * blob reaches every rank; only the named ones are kept), or a TCP
 * rendezvous at rank 0 (a star: each rank sends its blob and the names it
 * wants, rank 0 answers with only those).
 * All state lives in the object; every TCP read has a deadline.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_BOOTSTRAP_H
#define SL_BOOTSTRAP_H

#include "sl_error.h"
#include "sl_launcher.h"

#include <stddef.h>
#include <stdint.h>

#define SL_BOOT_MAGIC   0x534c4e4bu /* "SLNK" */
#define SL_BOOT_VERSION 3u

/** Wire header of every bootstrap message; the hello is one with size 0. */
typedef struct sl_boot_hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t rank;
    uint32_t world_size;
    uint64_t job_key;
    uint64_t size; /**< bytes following; 0 in the hello */
} sl_boot_hdr_t;

#define SL_BOOT_NAME_LEN 16
#define SL_BOOT_NAMES    16 /**< distinct exchange names per bootstrap */

/**
 * What a rank sends rank 0 in a TCP exchange, after the header: then
 * `npeers` uint32 ranks and its `len`-byte blob.  Rank 0 answers with a
 * uint64 length and the blob of each named rank, in the order named.
 */
typedef struct sl_boot_req {
    char     name[SL_BOOT_NAME_LEN]; /**< which exchange: ranks must agree */
    uint32_t npeers;
    uint32_t len;
} sl_boot_req_t;

/** Largest blob one rank may publish in one exchange. */
#define SL_BOOTSTRAP_MAX_BLOCK (1u << 20)

typedef struct sl_bootstrap {
    stagelink_allgather_fn_t fn;
    void                    *fn_ctx;
    stagelink_store_set_fn_t store_set;
    stagelink_store_get_fn_t store_get;
    void                    *store_ctx;
    int                      rank, world_size;
    double                   timeout;  /**< seconds per exchange, 0 = none */
    uint64_t                 job_key;  /**< every message carries it */
    /** Names used so far and how often: a store key is "<name>.<k>/<rank>"
     *  for the k-th exchange of that name, so an exchange some ranks skip
     *  (with their own peers) shifts no other key. */
    char                     names[SL_BOOT_NAMES][SL_BOOT_NAME_LEN];
    unsigned                 uses[SL_BOOT_NAMES];
    int                      nnames;
    int                      root_fd;  /**< non-root: socket to rank 0 */
    int                     *peer_fds; /**< rank 0: socket of each rank */
    /**
     * Called while a TCP exchange waits, once the transport exists: a peer
     * may need our progress (a rendezvous acknowledgement, say) to reach
     * the same exchange.
     */
    void                   (*progress)(void *arg);
    void                    *progress_arg;
} sl_bootstrap_t;

/** A blob read in an exchange (malloc'd). */
typedef struct sl_boot_blob {
    char  *data;
    size_t len;
} sl_boot_blob_t;

sl_status_t sl_bootstrap_init(sl_bootstrap_t *bs,
                              const stagelink_config_t *config,
                              const sl_launcher_t *launcher, double timeout,
                              sl_errbuf_t *eb);

/**
 * Decodes a rank's hello at rank 0 (the bytes a stranger controls): magic,
 * version, job key, world size, rank in range and not taken.  *rank is
 * set on success.
 */
sl_status_t sl_bootstrap_check_hello(const sl_bootstrap_t *bs,
                                     const void *buf, size_t len,
                                     uint32_t *rank, sl_errbuf_t *eb);

/**
 * One exchange: publishes `len` bytes as `name` and reads what each of the
 * `npeers` ranks in `peers` (this one allowed) published under it into
 * out[i], which sl_bootstrap_blobs_free releases (also after an error).
 * Every rank makes the same exchanges, in the same order, each naming the
 * ranks it needs.
 */
sl_status_t sl_bootstrap_exchange(sl_bootstrap_t *bs, const char *name,
                                  const void *mine, size_t len,
                                  const int *peers, int npeers,
                                  sl_boot_blob_t *out, sl_errbuf_t *eb);

/** The same for a blob of one size on every rank: out holds npeers * size. */
sl_status_t sl_bootstrap_exchange_fixed(sl_bootstrap_t *bs, const char *name,
                                        const void *mine, size_t size,
                                        const int *peers, int npeers,
                                        void *out, sl_errbuf_t *eb);

void sl_bootstrap_blobs_free(sl_boot_blob_t *blobs, int n);

/** Returns once each of `peers` has reached it too (through TCP: all ranks). */
sl_status_t sl_bootstrap_barrier(sl_bootstrap_t *bs, const int *peers,
                                 int npeers, sl_errbuf_t *eb);

void sl_bootstrap_cleanup(sl_bootstrap_t *bs);

#endif
