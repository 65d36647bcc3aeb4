/*
 * TCP for the bootstrap: resolve, listen, connect, and whole-buffer I/O
 * with a deadline, progressing the host's transport while it waits.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_SOCK_H
#define SL_SOCK_H

#include "sl_error.h"
#include "sl_launcher.h"

#include <stddef.h>

/** Called while a socket waits (once the transport exists); may be NULL. */
typedef struct sl_sock_progress {
    void (*fn)(void *arg);
    void  *arg;
} sl_sock_progress_t;

/** Sends or receives all `len` bytes before `deadline` (0: none). */
sl_status_t sl_sock_io(int fd, void *buf, size_t len, int writing,
                       double deadline, const sl_sock_progress_t *progress,
                       sl_errbuf_t *eb);

/** Rank 0's listener on the launcher's bind address and port. */
sl_status_t sl_sock_listen(const sl_launcher_t *l, int *fd, sl_errbuf_t *eb);

/**
 * Connects to `host`:`port` (`what` names the listener in errors), retrying
 * while it does not listen yet; each attempt is non-blocking and polled, so
 * nothing outlives `deadline` (0: none).  The socket stays non-blocking.
 */
sl_status_t sl_sock_connect(const char *host, int port, const char *what,
                            double deadline, int *fd, sl_errbuf_t *eb);

/** Accepts one connection (nonblocking listener) and names its peer
 *  ("addr:port", "[v6]:port"); -1 with errno when none is there or accept
 *  failed. */
int sl_sock_accept(int lfd, char *peer, size_t len);

/** 1 when every address `host` resolves to is a loopback one (the ranks
 *  meeting there are on this node), else 0. */
int sl_sock_is_loopback(const char *host);

/** Descriptors this process may still open: the soft RLIMIT_NOFILE less
 *  those open now; INT_MAX when unlimited. */
int sl_sock_fds_free(void);

#endif
