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
#include "sl_kv.h"
#include "sl_launcher.h"
#include "sl_rendezvous.h"
#include "sl_sock.h"

#include <stddef.h>
#include <stdint.h>

#define SL_BOOT_NAME_LEN 16
#define SL_BOOT_NAMES    16 /**< distinct exchange names per bootstrap */

/**
 * What a rank sends rank 0 in a TCP exchange, after the header: then
 * `npeers` uint32 ranks and its `len`-byte blob.  Rank 0 answers with a
 * uint64 length and the blob of each named rank, in the order named.
 * With a job secret, each message ends with its seal (sl_auth_seal_t).
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
    sl_kv_t                  kv;       /**< the store, where one serves */
    sl_kv_host_t             host;     /**< the host's store callbacks */
    sl_boot_kind_t           kind;
    int                      rank, world_size;
    double                   timeout;  /**< seconds per exchange, 0 = none */
    uint64_t                 job_key;  /**< every message carries it */
    /** Names used so far and how often: a store key is "<name>.<k>/<rank>"
     *  for the k-th exchange of that name, so an exchange some ranks skip
     *  (with their own peers) shifts no other key. */
    char                     names[SL_BOOT_NAMES][SL_BOOT_NAME_LEN];
    unsigned                 uses[SL_BOOT_NAMES];
    int                      nnames;
    int                      tcp;      /**< through the rendezvous */
    sl_rendezvous_t          rv;       /**< its connections and links */
    /**
     * Called while a TCP exchange waits, once the transport exists: a peer
     * may need our progress (a rendezvous acknowledgement, say) to reach
     * the same exchange.
     */
    sl_sock_progress_t       progress;
    /** What this rank's exchanges moved, blobs only (a store's keys and
     *  framing apart), for init's log line and docs/performance.md. */
    unsigned                 nexchanges, nread;
    uint64_t                 bytes_published, bytes_read;
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

/** What rank 0 holds of one TCP exchange: each rank's blob and wants. */
typedef struct sl_boot_part {
    void          *body;  /**< the message after its header (owns the rest) */
    uint32_t      *peers; /**< the ranks it names, in body */
    uint32_t       npeers;
    sl_boot_blob_t blob;  /**< its blob, in body (rank 0: its own) */
} sl_boot_part_t;

/**
 * Decodes rank r's message of exchange `name` at rank 0 (the bytes a
 * joined rank controls): the seal first where the link has one, then the
 * request, the ranks named and the blob, which `part` points into `body`.
 */
sl_status_t sl_bootstrap_parse_part(const sl_bootstrap_t *bs, int r,
                                    const char *name,
                                    const sl_boot_hdr_t *hdr, void *body,
                                    const sl_auth_seal_t *seal,
                                    sl_auth_link_t *link,
                                    sl_boot_part_t *part, sl_errbuf_t *eb);

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

/** Returns once each of `peers` has reached it too (through TCP, and a
 *  store with a barrier of its own, PMIx: all ranks). */
sl_status_t sl_bootstrap_barrier(sl_bootstrap_t *bs, const int *peers,
                                 int npeers, sl_errbuf_t *eb);

void sl_bootstrap_cleanup(sl_bootstrap_t *bs);

#endif
