/* SPDX-License-Identifier: MIT */
#include "sl_bootstrap.h"
#include "sl_log.h"
#include "sl_time.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A client gets this long to send its hello: a silent or byte-a-second
 * connection (a port scanner, a stale rank of an earlier job) is dropped
 * instead of holding the rendezvous until its deadline. */
#define SL_BOOT_HELLO_S 2.0
/* Connections read concurrently; a flood beyond this evicts the oldest. */
#define SL_BOOT_PENDING 16

typedef struct sl_boot_client {
    int           fd; /**< -1: slot free */
    size_t        got;
    double        deadline;
    sl_boot_hdr_t hdr;
} sl_boot_client_t;

/* How long one poll sleeps between progress calls. */
#define SL_BOOT_PROGRESS_MS 1

static sl_status_t sl_sock_io(const sl_bootstrap_t *bs, int fd, void *buf,
                              size_t len, int writing, double deadline,
                              sl_errbuf_t *eb)
{
    char         *p = buf;
    struct pollfd pfd;
    ssize_t       n;
    int           rc, ms;

    while (len > 0) {
        pfd.fd     = fd;
        pfd.events = writing ? POLLOUT : POLLIN;
        ms         = sl_deadline_ms(deadline);
        if (bs != NULL && bs->progress != NULL) {
            bs->progress(bs->progress_arg);
            ms = (ms < 0 || ms > SL_BOOT_PROGRESS_MS) ? SL_BOOT_PROGRESS_MS : ms;
        }
        rc = poll(&pfd, 1, ms);
        if (rc == 0 && !sl_deadline_passed(deadline)) {
            continue;
        }
        if (rc == 0) {
            return sl_error(eb, STAGELINK_ERR_TIMEOUT,
                            "bootstrap %s of %zu bytes timed out; raise "
                            "STAGELINK_TIMEOUT or check that every rank runs",
                            writing ? "send" : "receive", len);
        }
        if (rc < 0) {
            if (errno == EINTR) {
                continue;
            }
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "bootstrap poll: %s",
                            strerror(errno));
        }
        n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            continue;
        }
        if (n <= 0) {
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                            "bootstrap peer closed the connection with %zu "
                            "bytes left to %s (%s); a rank exited or failed",
                            len, writing ? "send" : "receive",
                            (n < 0) ? strerror(errno) : "EOF");
        }
        p   += n;
        len -= (size_t)n;
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_boot_resolve(const sl_launcher_t *l, int passive,
                                   struct addrinfo **res, sl_errbuf_t *eb)
{
    const char     *host = passive ? l->bind : l->addr;
    struct addrinfo hints;
    char            port[16];
    int             rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family   = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags    = passive ? AI_PASSIVE : 0;
    snprintf(port, sizeof(port), "%d", l->port);
    rc = getaddrinfo(host, port, &hints, res);
    if (rc != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "cannot resolve rendezvous address %s:%d: %s",
                        host, l->port, gai_strerror(rc));
    }
    return STAGELINK_SUCCESS;
}

static void sl_sock_tune(int fd)
{
    int one = 1;

    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

static sl_status_t sl_boot_listen(const sl_launcher_t *l, int *fd_out,
                                  sl_errbuf_t *eb)
{
    struct addrinfo *res;
    sl_status_t      status;
    int              one = 1;
    int              fd;

    SL_CHECK(sl_boot_resolve(l, 1, &res, eb));
    fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "socket(): %s",
                          strerror(errno));
        goto out_free;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "rank 0 cannot listen on %s:%d: %s; pick a free "
                          "MASTER_PORT or an address of this host "
                          "(STAGELINK_BOOTSTRAP_BIND)",
                          l->bind, l->port, strerror(errno));
        close(fd);
        goto out_free;
    }
    *fd_out = fd;
    status  = STAGELINK_SUCCESS;
out_free:
    freeaddrinfo(res);
    return status;
}

static sl_status_t sl_boot_connect(const sl_launcher_t *l, double deadline,
                                   int *fd_out, sl_errbuf_t *eb)
{
    struct addrinfo *res;
    sl_status_t      status;
    int              fd, err;

    SL_CHECK(sl_boot_resolve(l, 0, &res, eb));
    /* Rank 0 may not listen yet: retry until the deadline. */
    for (;;) {
        fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "socket(): %s",
                              strerror(errno));
            goto out_free;
        }
        if (connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
            break;
        }
        err = errno;
        close(fd);
        if (sl_deadline_passed(deadline)) {
            status = sl_error(eb, STAGELINK_ERR_TIMEOUT,
                              "cannot reach rank 0 at %s:%d: %s; check "
                              "MASTER_ADDR/MASTER_PORT and that rank 0 runs",
                              l->addr, l->port, strerror(err));
            goto out_free;
        }
        usleep(20000);
    }
    sl_sock_tune(fd);
    *fd_out = fd;
    status  = STAGELINK_SUCCESS;
out_free:
    freeaddrinfo(res);
    return status;
}

static sl_boot_hdr_t sl_boot_hdr(const sl_bootstrap_t *bs, uint64_t size)
{
    return (sl_boot_hdr_t){SL_BOOT_MAGIC, SL_BOOT_VERSION, (uint32_t)bs->rank,
                           (uint32_t)bs->world_size, bs->job_key, size};
}

static sl_status_t sl_boot_check_hdr(const sl_boot_hdr_t *h,
                                     const sl_bootstrap_t *bs,
                                     sl_errbuf_t *eb)
{
    if (h->magic != SL_BOOT_MAGIC || h->version != SL_BOOT_VERSION) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "bootstrap message with magic 0x%x version %u, "
                        "expected 0x%x version %u: a client of another "
                        "program or stagelink version", h->magic, h->version,
                        SL_BOOT_MAGIC, SL_BOOT_VERSION);
    }
    if (h->job_key != bs->job_key) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u has job key %016llx, this job %016llx: a "
                        "process of another job (or STAGELINK_JOB_KEY differs "
                        "between ranks)", h->rank,
                        (unsigned long long)h->job_key,
                        (unsigned long long)bs->job_key);
    }
    if (h->world_size != (uint32_t)bs->world_size) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u says world size %u, rank %d says %d; all "
                        "ranks must be started with the same world size",
                        h->rank, h->world_size, bs->rank, bs->world_size);
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_bootstrap_check_hello(const sl_bootstrap_t *bs,
                                     const void *buf, size_t len,
                                     uint32_t *rank, sl_errbuf_t *eb)
{
    sl_boot_hdr_t h;

    if (len != sizeof(h)) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "hello of %zu bytes, expected %zu", len, sizeof(h));
    }
    memcpy(&h, buf, sizeof(h));
    SL_CHECK(sl_boot_check_hdr(&h, bs, eb));
    if (h.size != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "hello announces %llu bytes of payload, expected 0",
                        (unsigned long long)h.size);
    }
    if (h.rank == 0 || h.rank >= (uint32_t)bs->world_size) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "hello from rank %u, outside 1..%d", h.rank,
                        bs->world_size - 1);
    }
    if (bs->peer_fds[h.rank] >= 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u arrived twice: two processes were started "
                        "with the same rank", h.rank);
    }
    *rank = h.rank;
    return STAGELINK_SUCCESS;
}

static void sl_boot_drop(sl_boot_client_t *c, const char *why)
{
    SL_WARN(SL_SUBSYS_BOOT, "dropped a rendezvous client: %s", why);
    close(c->fd);
    c->fd = -1;
}

/* Reads what a pending client has sent; a complete, valid hello makes it
 * the socket of its rank. */
static void sl_boot_client_read(sl_bootstrap_t *bs, sl_boot_client_t *c,
                                int *arrived)
{
    sl_errbuf_t drop = {{0}};
    uint32_t    rank;
    ssize_t     n;

    n = recv(c->fd, (char *)&c->hdr + c->got, sizeof(c->hdr) - c->got,
             MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        return;
    }
    if (n <= 0) {
        sl_boot_drop(c, "closed before its hello");
        return;
    }
    c->got += (size_t)n;
    if (c->got < sizeof(c->hdr)) {
        return;
    }
    if (sl_bootstrap_check_hello(bs, &c->hdr, sizeof(c->hdr), &rank, &drop) !=
        STAGELINK_SUCCESS) {
        sl_boot_drop(c, drop.msg);
        return;
    }
    bs->peer_fds[rank] = c->fd;
    c->fd              = -1;
    ++*arrived;
    SL_TRACE(SL_SUBSYS_BOOT, "rank %u arrived (%d/%d)", rank, *arrived,
             bs->world_size);
}

static sl_status_t sl_boot_missing(const sl_bootstrap_t *bs, int arrived,
                                   sl_errbuf_t *eb)
{
    char   list[160] = "";
    size_t len       = 0;
    int    r;

    for (r = 1; r < bs->world_size && len + 16 < sizeof(list); ++r) {
        if (bs->peer_fds[r] < 0) {
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d",
                                    len ? ", " : "", r);
        }
    }
    return sl_error(eb, STAGELINK_ERR_TIMEOUT,
                    "only %d of %d ranks reached the rendezvous in %.1f s; "
                    "missing: %s%s; check that every rank was started with "
                    "the same MASTER_ADDR/MASTER_PORT and job key",
                    arrived, bs->world_size, bs->timeout, list,
                    (len + 16 >= sizeof(list)) ? ", ..." : "");
}

static sl_status_t sl_boot_accept_all(sl_bootstrap_t *bs, int lfd,
                                      double deadline, sl_errbuf_t *eb)
{
    sl_boot_client_t pend[SL_BOOT_PENDING];
    struct pollfd    pfd[SL_BOOT_PENDING + 1];
    sl_status_t      status = STAGELINK_SUCCESS;
    int              arrived = 1, slot[SL_BOOT_PENDING + 1];
    int              i, n, fd, rc, ms, oldest;
    double           now;

    for (i = 0; i < SL_BOOT_PENDING; ++i) {
        pend[i].fd = -1;
    }
    while (arrived < bs->world_size) {
        now = sl_time_now();
        ms  = sl_deadline_ms(deadline);
        n   = 0;
        pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (i = 0; i < SL_BOOT_PENDING; ++i) {
            if (pend[i].fd < 0) {
                continue;
            }
            if (now >= pend[i].deadline) {
                sl_boot_drop(&pend[i], "no complete hello in time");
                continue;
            }
            slot[n]  = i;
            pfd[n++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
            if (ms < 0 || (pend[i].deadline - now) * 1e3 < ms) {
                ms = (int)((pend[i].deadline - now) * 1e3) + 1;
            }
        }
        if (sl_deadline_passed(deadline)) {
            status = sl_boot_missing(bs, arrived, eb);
            break;
        }
        rc = poll(pfd, (nfds_t)n, ms);
        if (rc < 0 && errno != EINTR) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "poll on the rendezvous sockets: %s",
                              strerror(errno));
            break;
        }
        for (i = 1; rc > 0 && i < n; ++i) {
            if (pfd[i].revents != 0) {
                sl_boot_client_read(bs, &pend[slot[i]], &arrived);
            }
        }
        if (rc <= 0 || !(pfd[0].revents & POLLIN)) {
            continue;
        }
        fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            continue;
        }
        sl_sock_tune(fd);
        for (i = 0, oldest = 0; i < SL_BOOT_PENDING && pend[i].fd >= 0; ++i) {
            oldest = (pend[i].deadline < pend[oldest].deadline) ? i : oldest;
        }
        if (i == SL_BOOT_PENDING) {
            sl_boot_drop(&pend[oldest], "evicted by newer connections");
            i = oldest;
        }
        pend[i] = (sl_boot_client_t){fd, 0, sl_time_now() + SL_BOOT_HELLO_S,
                                     {0}};
    }
    for (i = 0; i < SL_BOOT_PENDING; ++i) {
        if (pend[i].fd >= 0) {
            close(pend[i].fd);
        }
    }
    return status;
}

sl_status_t sl_bootstrap_init(sl_bootstrap_t *bs,
                              const stagelink_config_t *config,
                              const sl_launcher_t *launcher, double timeout,
                              sl_errbuf_t *eb)
{
    double        deadline = sl_deadline(timeout);
    sl_boot_hdr_t hello;
    sl_status_t   status;
    int           lfd = -1, i;

    memset(bs, 0, sizeof(*bs));
    bs->fn         = config->allgather;
    bs->fn_ctx     = config->allgather_ctx;
    bs->store_set  = config->store_set;
    bs->store_get  = config->store_get;
    bs->store_ctx  = config->store_ctx;
    bs->rank       = launcher->rank;
    bs->world_size = launcher->world_size;
    bs->timeout    = timeout;
    bs->job_key    = launcher->job_key;
    bs->root_fd    = -1;
    if (bs->fn != NULL || bs->store_set != NULL || bs->world_size == 1) {
        return STAGELINK_SUCCESS;
    }

    if (bs->rank != 0) {
        SL_CHECK(sl_boot_connect(launcher, deadline, &bs->root_fd, eb));
        hello = sl_boot_hdr(bs, 0);
        SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, &hello, sizeof(hello), 1,
                                 deadline, eb), err_close);
        SL_INFO(SL_SUBSYS_BOOT, "connected to rendezvous %s:%d",
                launcher->addr, launcher->port);
        return STAGELINK_SUCCESS;
    }

    bs->peer_fds = malloc((size_t)bs->world_size * sizeof(int));
    if (bs->peer_fds == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d rendezvous sockets",
                        bs->world_size);
    }
    for (i = 0; i < bs->world_size; ++i) {
        bs->peer_fds[i] = -1;
    }
    SL_CHECK_GOTO(sl_boot_listen(launcher, &lfd, eb), err_close);
    status = sl_boot_accept_all(bs, lfd, deadline, eb);
    /* Later clients must find nobody listening rather than hang. */
    close(lfd);
    if (status != STAGELINK_SUCCESS) {
        goto err_close;
    }
    SL_INFO(SL_SUBSYS_BOOT, "rendezvous on %s:%d complete, %d ranks",
            launcher->addr, launcher->port, bs->world_size);
    return STAGELINK_SUCCESS;

err_close:
    sl_bootstrap_cleanup(bs);
    return status;
}

void sl_bootstrap_blobs_free(sl_boot_blob_t *blobs, int n)
{
    int i;

    for (i = 0; blobs != NULL && i < n; ++i) {
        free(blobs[i].data);
        blobs[i] = (sl_boot_blob_t){NULL, 0};
    }
}

static sl_status_t sl_boot_blob_set(sl_boot_blob_t *b, const void *data,
                                    size_t len, sl_errbuf_t *eb)
{
    b->data = malloc(len ? len : 1);
    if (b->data == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a bootstrap blob of %zu bytes", len);
    }
    memcpy(b->data, data, len);
    b->len = len;
    return STAGELINK_SUCCESS;
}

/* How often `name` was exchanged before: the store key's count. */
static sl_status_t sl_boot_name_use(sl_bootstrap_t *bs, const char *name,
                                    unsigned *use, sl_errbuf_t *eb)
{
    int i;

    for (i = 0; i < bs->nnames && strcmp(bs->names[i], name) != 0; ++i) {
    }
    if (i == bs->nnames) {
        if (bs->nnames == SL_BOOT_NAMES) {
            return sl_error(eb, STAGELINK_ERR_INTERNAL,
                            "more than %d bootstrap exchange names",
                            SL_BOOT_NAMES);
        }
        snprintf(bs->names[bs->nnames++], SL_BOOT_NAME_LEN, "%s", name);
    }
    *use = bs->uses[i]++;
    return STAGELINK_SUCCESS;
}

/* Through the host's store: one key per rank and exchange, and one read
 * for each named rank. */
static sl_status_t sl_boot_store_exchange(sl_bootstrap_t *bs, const char *name,
                                          const void *mine, size_t len,
                                          const int *peers, int npeers,
                                          sl_boot_blob_t *out, sl_errbuf_t *eb)
{
    char        key[64], *buf;
    size_t      size;
    sl_status_t status = STAGELINK_SUCCESS;
    unsigned    use = 0;
    int         i, rc;

    SL_CHECK(sl_boot_name_use(bs, name, &use, eb));
    snprintf(key, sizeof(key), "%s.%u/%d", name, use, bs->rank);
    rc = bs->store_set(bs->store_ctx, key, mine, len);
    if (rc != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "the host's store_set returned %d for key %s (%zu "
                        "bytes)", rc, key, len);
    }
    /* Pages of the scratch buffer are touched only as far as a blob goes. */
    buf = malloc(SL_BOOTSTRAP_MAX_BLOCK);
    if (buf == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a %u-byte bootstrap buffer",
                        SL_BOOTSTRAP_MAX_BLOCK);
    }
    for (i = 0; i < npeers && status == STAGELINK_SUCCESS; ++i) {
        snprintf(key, sizeof(key), "%s.%u/%d", name, use, peers[i]);
        size = 0;
        rc   = bs->store_get(bs->store_ctx, key, buf, SL_BOOTSTRAP_MAX_BLOCK,
                             &size);
        if (rc != 0) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "the host's store_get returned %d for key %s "
                              "(rank %d's part of exchange %s); did that rank "
                              "start, with the same store?", rc, key, peers[i],
                              name);
        } else if (size > SL_BOOTSTRAP_MAX_BLOCK) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "key %s holds %zu bytes, above the bootstrap "
                              "limit of %u: another program's key in this "
                              "store namespace?", key, size,
                              SL_BOOTSTRAP_MAX_BLOCK);
        } else {
            status = sl_boot_blob_set(&out[i], buf, size, eb);
        }
    }
    free(buf);
    return status;
}

/* Through the host's allgather: the lengths, then every blob padded to the
 * longest; only the named ranks' are kept. */
static sl_status_t sl_boot_fn_exchange(sl_bootstrap_t *bs, const void *mine,
                                       size_t len, const int *peers,
                                       int npeers, sl_boot_blob_t *out,
                                       sl_errbuf_t *eb)
{
    uint64_t   *lens, own = len;
    size_t      max = 1;
    char       *pad = NULL, *all = NULL;
    sl_status_t status;
    int         r, rc;

    lens = calloc((size_t)bs->world_size, sizeof(*lens));
    if (lens == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d bootstrap lengths", bs->world_size);
    }
    rc = bs->fn(bs->fn_ctx, &own, lens, sizeof(own));
    if (rc != 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "the host's allgather callback returned %d for %zu "
                          "bytes per rank", rc, sizeof(own));
        goto out;
    }
    for (r = 0; r < bs->world_size; ++r) {
        if (lens[r] > SL_BOOTSTRAP_MAX_BLOCK) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "rank %d announces a %llu-byte bootstrap blob, "
                              "above the limit of %u: does the host's "
                              "allgather gather rank by rank?", r,
                              (unsigned long long)lens[r],
                              SL_BOOTSTRAP_MAX_BLOCK);
            goto out;
        }
        max = (lens[r] > max) ? (size_t)lens[r] : max;
    }
    pad = calloc(1, max);
    all = malloc((size_t)bs->world_size * max);
    if (pad == NULL || all == NULL) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d bootstrap blobs of %zu bytes",
                          bs->world_size, max);
        goto out;
    }
    memcpy(pad, mine, len);
    rc = bs->fn(bs->fn_ctx, pad, all, max);
    if (rc != 0) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "the host's allgather callback returned %d for %zu "
                          "bytes per rank", rc, max);
        goto out;
    }
    status = STAGELINK_SUCCESS;
    for (r = 0; r < npeers && status == STAGELINK_SUCCESS; ++r) {
        status = sl_boot_blob_set(&out[r], all + (size_t)peers[r] * max,
                                  (size_t)lens[peers[r]], eb);
    }
out:
    free(all);
    free(pad);
    free(lens);
    return status;
}

/* What rank 0 holds of one TCP exchange: each rank's blob and wants. */
typedef struct sl_boot_part {
    sl_boot_blob_t blob;
    uint32_t      *peers;
    uint32_t       npeers;
} sl_boot_part_t;

static sl_status_t sl_boot_root_read(sl_bootstrap_t *bs, int r,
                                     const char *name, sl_boot_part_t *part,
                                     double deadline, sl_errbuf_t *eb)
{
    sl_boot_hdr_t hdr;
    sl_boot_req_t req;
    uint32_t      i;
    int           fd = bs->peer_fds[r];

    SL_CHECK(sl_sock_io(bs, fd, &hdr, sizeof(hdr), 0, deadline, eb));
    SL_CHECK(sl_boot_check_hdr(&hdr, bs, eb));
    SL_CHECK(sl_sock_io(bs, fd, &req, sizeof(req), 0, deadline, eb));
    req.name[SL_BOOT_NAME_LEN - 1] = '\0';
    if (hdr.rank != (uint32_t)r || strcmp(req.name, name) != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d sent exchange \"%s\" as rank %u while rank 0 "
                        "is in \"%s\": ranks disagree on the exchanges (a "
                        "different stagelink version or setup?)", r, req.name,
                        hdr.rank, name);
    }
    if (req.npeers > (uint32_t)bs->world_size ||
        req.len > SL_BOOTSTRAP_MAX_BLOCK ||
        hdr.size != sizeof(req) + 4ull * req.npeers + req.len) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d's exchange \"%s\" names %u ranks with a "
                        "%u-byte blob in %llu bytes (world %d, blob limit "
                        "%u): a corrupt or foreign message", r, name,
                        req.npeers, req.len, (unsigned long long)hdr.size,
                        bs->world_size, SL_BOOTSTRAP_MAX_BLOCK);
    }
    part->npeers    = req.npeers;
    part->peers     = malloc(4ull * req.npeers + 1);
    part->blob.data = malloc(req.len + 1ull);
    if (part->peers == NULL || part->blob.data == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot hold rank %d's part of exchange \"%s\"", r,
                        name);
    }
    part->blob.len = req.len;
    SL_CHECK(sl_sock_io(bs, fd, part->peers, 4ull * req.npeers, 0, deadline,
                        eb));
    SL_CHECK(sl_sock_io(bs, fd, part->blob.data, req.len, 0, deadline, eb));
    for (i = 0; i < req.npeers; ++i) {
        if (part->peers[i] >= (uint32_t)bs->world_size) {
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                            "rank %d asks for rank %u in exchange \"%s\", "
                            "outside the world of %d", r, part->peers[i],
                            name, bs->world_size);
        }
    }
    return STAGELINK_SUCCESS;
}

/* Rank 0 reads every rank's part, then answers each with what it named. */
static sl_status_t sl_boot_root_exchange(sl_bootstrap_t *bs, const char *name,
                                         const void *mine, size_t len,
                                         const int *peers, int npeers,
                                         sl_boot_blob_t *out, double deadline,
                                         sl_errbuf_t *eb)
{
    sl_boot_part_t *parts;
    sl_status_t     status;
    uint64_t        n;
    uint32_t        i;
    int             r;

    parts = calloc((size_t)bs->world_size, sizeof(*parts));
    if (parts == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d exchange parts", bs->world_size);
    }
    parts[0].blob.data = (char *)mine;
    parts[0].blob.len  = len;
    for (r = 1; r < bs->world_size; ++r) {
        SL_CHECK_GOTO(sl_boot_root_read(bs, r, name, &parts[r], deadline, eb),
                      out);
    }
    for (r = 1; r < bs->world_size; ++r) {
        for (i = 0; i < parts[r].npeers; ++i) {
            const sl_boot_blob_t *b = &parts[parts[r].peers[i]].blob;

            n = b->len;
            SL_CHECK_GOTO(sl_sock_io(bs, bs->peer_fds[r], &n, sizeof(n), 1,
                                     deadline, eb), out);
            SL_CHECK_GOTO(sl_sock_io(bs, bs->peer_fds[r], b->data, b->len, 1,
                                     deadline, eb), out);
        }
    }
    for (r = 0; r < npeers; ++r) {
        SL_CHECK_GOTO(sl_boot_blob_set(&out[r], parts[peers[r]].blob.data,
                                       parts[peers[r]].blob.len, eb), out);
    }
    status = STAGELINK_SUCCESS;
out:
    for (r = 1; r < bs->world_size; ++r) {
        free(parts[r].blob.data);
        free(parts[r].peers);
    }
    free(parts);
    return status;
}

static sl_status_t sl_boot_tcp_exchange(sl_bootstrap_t *bs, const char *name,
                                        const void *mine, size_t len,
                                        const int *peers, int npeers,
                                        sl_boot_blob_t *out, sl_errbuf_t *eb)
{
    double        deadline = sl_deadline(bs->timeout);
    sl_boot_req_t req;
    sl_boot_hdr_t hdr;
    uint32_t     *wants;
    uint64_t      n;
    sl_status_t   status;
    int           i;

    if (bs->rank == 0) {
        return sl_boot_root_exchange(bs, name, mine, len, peers, npeers, out,
                                     deadline, eb);
    }
    memset(&req, 0, sizeof(req));
    snprintf(req.name, sizeof(req.name), "%s", name);
    req.npeers = (uint32_t)npeers;
    req.len    = (uint32_t)len;
    wants      = malloc(4ull * (size_t)npeers + 1);
    if (wants == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d rank numbers", npeers);
    }
    for (i = 0; i < npeers; ++i) {
        wants[i] = (uint32_t)peers[i];
    }
    hdr = sl_boot_hdr(bs, sizeof(req) + 4ull * (size_t)npeers + len);
    SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, &hdr, sizeof(hdr), 1, deadline,
                             eb), out);
    SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, &req, sizeof(req), 1, deadline,
                             eb), out);
    SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, wants, 4ull * (size_t)npeers, 1,
                             deadline, eb), out);
    SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, (void *)mine, len, 1, deadline,
                             eb), out);
    for (i = 0; i < npeers; ++i) {
        SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, &n, sizeof(n), 0, deadline,
                                 eb), out);
        if (n > SL_BOOTSTRAP_MAX_BLOCK) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "rank 0 sends a %llu-byte blob of rank %d, "
                              "above the limit of %u", (unsigned long long)n,
                              peers[i], SL_BOOTSTRAP_MAX_BLOCK);
            goto out;
        }
        out[i].data = malloc(n + 1);
        out[i].len  = n;
        if (out[i].data == NULL) {
            status = sl_error(eb, STAGELINK_ERR_NO_MEMORY, "cannot allocate a "
                              "bootstrap blob of %llu bytes",
                              (unsigned long long)n);
            goto out;
        }
        SL_CHECK_GOTO(sl_sock_io(bs, bs->root_fd, out[i].data, n, 0, deadline,
                                 eb), out);
    }
    status = STAGELINK_SUCCESS;
out:
    free(wants);
    return status;
}

sl_status_t sl_bootstrap_exchange(sl_bootstrap_t *bs, const char *name,
                                  const void *mine, size_t len,
                                  const int *peers, int npeers,
                                  sl_boot_blob_t *out, sl_errbuf_t *eb)
{
    sl_status_t status;
    int         i;

    memset(out, 0, (size_t)npeers * sizeof(*out));
    if (len > SL_BOOTSTRAP_MAX_BLOCK || strlen(name) >= SL_BOOT_NAME_LEN) {
        return sl_error(eb, STAGELINK_ERR_INTERNAL,
                        "bootstrap exchange \"%s\" of %zu bytes exceeds %u "
                        "bytes or a %d-character name", name, len,
                        SL_BOOTSTRAP_MAX_BLOCK, SL_BOOT_NAME_LEN - 1);
    }
    for (i = 0; i < npeers; ++i) {
        if (peers[i] < 0 || peers[i] >= bs->world_size) {
            return sl_error(eb, STAGELINK_ERR_INTERNAL,
                            "exchange \"%s\" names rank %d, outside the "
                            "world of %d", name, peers[i], bs->world_size);
        }
    }
    if (bs->store_set != NULL) {
        status = sl_boot_store_exchange(bs, name, mine, len, peers, npeers,
                                        out, eb);
    } else if (bs->fn != NULL) {
        status = sl_boot_fn_exchange(bs, mine, len, peers, npeers, out, eb);
    } else if (bs->world_size == 1) {
        for (i = 0, status = STAGELINK_SUCCESS;
             i < npeers && status == STAGELINK_SUCCESS; ++i) {
            status = sl_boot_blob_set(&out[i], mine, len, eb);
        }
    } else {
        status = sl_boot_tcp_exchange(bs, name, mine, len, peers, npeers, out,
                                      eb);
    }
    if (status != STAGELINK_SUCCESS) {
        sl_bootstrap_blobs_free(out, npeers);
    }
    return status;
}

sl_status_t sl_bootstrap_exchange_fixed(sl_bootstrap_t *bs, const char *name,
                                        const void *mine, size_t size,
                                        const int *peers, int npeers,
                                        void *out, sl_errbuf_t *eb)
{
    sl_boot_blob_t *blobs;
    sl_status_t     status;
    int             i;

    blobs = calloc((size_t)npeers + 1, sizeof(*blobs));
    if (blobs == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate %d bootstrap blobs", npeers);
    }
    status = sl_bootstrap_exchange(bs, name, mine, size, peers, npeers, blobs,
                                   eb);
    for (i = 0; i < npeers && status == STAGELINK_SUCCESS; ++i) {
        if (blobs[i].len != size) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "rank %d published %zu bytes in exchange \"%s\", "
                              "this rank %zu: ranks run different stagelink "
                              "versions?", peers[i], blobs[i].len, name, size);
        } else {
            memcpy((char *)out + (size_t)i * size, blobs[i].data, size);
        }
    }
    sl_bootstrap_blobs_free(blobs, npeers);
    free(blobs);
    return status;
}

sl_status_t sl_bootstrap_barrier(sl_bootstrap_t *bs, const int *peers,
                                 int npeers, sl_errbuf_t *eb)
{
    char        one = 1, *got;
    sl_status_t status;

    got = malloc((size_t)npeers + 1);
    if (got == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a %d-byte barrier buffer", npeers);
    }
    status = sl_bootstrap_exchange_fixed(bs, "barrier", &one, 1, peers, npeers,
                                         got, eb);
    free(got);
    return status;
}

void sl_bootstrap_cleanup(sl_bootstrap_t *bs)
{
    int i;

    if (bs->root_fd >= 0) {
        close(bs->root_fd);
        bs->root_fd = -1;
    }
    if (bs->peer_fds != NULL) {
        for (i = 0; i < bs->world_size; ++i) {
            if (bs->peer_fds[i] >= 0) {
                close(bs->peer_fds[i]);
            }
        }
        free(bs->peer_fds);
        bs->peer_fds = NULL;
    }
}
