/*
 * Bootstrap: the collective exchanges of init (worker addresses, node
 * identities), over the host's allgather callback or, without one, a TCP
 * rendezvous at rank 0 (a star: every rank keeps one socket to rank 0).
 * All state lives in the object; every read has a deadline.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_BOOTSTRAP_H
#define SL_BOOTSTRAP_H

#include "sl_error.h"
#include "sl_launcher.h"

#include <stddef.h>
#include <stdint.h>

#define SL_BOOT_MAGIC   0x534c4e4bu /* "SLNK" */
#define SL_BOOT_VERSION 2u

/** Wire header of every bootstrap message; the hello is one with size 0. */
typedef struct sl_boot_hdr {
    uint32_t magic;
    uint32_t version;
    uint32_t rank;
    uint32_t world_size;
    uint64_t job_key;
    uint64_t size; /**< bytes following; 0 in the hello */
} sl_boot_hdr_t;

/** Largest block one rank may contribute to one allgather. */
#define SL_BOOTSTRAP_MAX_BLOCK (1u << 20)

typedef struct sl_bootstrap {
    stagelink_allgather_fn_t fn;
    void                    *fn_ctx;
    int                      rank, world_size;
    double                   timeout;  /**< seconds per exchange, 0 = none */
    uint64_t                 job_key;  /**< every message carries it */
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

/** Gathers `size` bytes from every rank into recvbuf (world * size). */
sl_status_t sl_bootstrap_allgather(sl_bootstrap_t *bs, const void *sendbuf,
                                   void *recvbuf, size_t size,
                                   sl_errbuf_t *eb);

sl_status_t sl_bootstrap_barrier(sl_bootstrap_t *bs, sl_errbuf_t *eb);

void sl_bootstrap_cleanup(sl_bootstrap_t *bs);

#endif
