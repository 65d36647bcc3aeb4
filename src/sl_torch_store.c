/* torch's TCPStore wire protocol, client side.  SPDX-License-Identifier: MIT */
#include "sl_torch_store.h"
#include "sl_log.h"
#include "sl_time.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct sl_torch_store {
    int  fd;
    int  port;
    char host[256];
    char prefix[192];
    char key[256]; /**< prefix + the key of the request being sent */
    double deadline; /**< of the call in progress */
} sl_torch_store_t;

static sl_status_t sl_ts_send(sl_torch_store_t *ts, const void *buf,
                              size_t len, sl_errbuf_t *eb)
{
    return sl_sock_io(ts->fd, (void *)buf, len, 1, ts->deadline, NULL, eb);
}

/* A query byte, then the prefixed key as torch's strings go: a uint64
 * length and the bytes. */
static sl_status_t sl_ts_query(sl_torch_store_t *ts, sl_torch_query_t q,
                               const char *key, sl_errbuf_t *eb)
{
    uint8_t  byte = (uint8_t)q;
    uint64_t len;
    int      n;

    n = snprintf(ts->key, sizeof(ts->key), "%s%s", ts->prefix, key);
    if (n < 0 || (size_t)n >= sizeof(ts->key)) {
        return sl_error(eb, STAGELINK_ERR_INTERNAL,
                        "store key %s%s is longer than %zu characters",
                        ts->prefix, key, sizeof(ts->key) - 1);
    }
    len = (uint64_t)n;
    SL_CHECK(sl_ts_send(ts, &byte, 1, eb));
    if (q == SL_TORCH_WAIT) {
        uint64_t nkeys = 1;

        SL_CHECK(sl_ts_send(ts, &nkeys, sizeof(nkeys), eb));
    }
    SL_CHECK(sl_ts_send(ts, &len, sizeof(len), eb));
    return sl_ts_send(ts, ts->key, len, eb);
}

static sl_status_t sl_ts_set(void *ctx, const char *key, const void *buf,
                             size_t len, double deadline, sl_errbuf_t *eb)
{
    sl_torch_store_t *ts   = ctx;
    uint64_t          size = len;

    ts->deadline = deadline;
    SL_CHECK(sl_ts_query(ts, SL_TORCH_SET, key, eb));
    SL_CHECK(sl_ts_send(ts, &size, sizeof(size), eb));
    return sl_ts_send(ts, buf, len, eb);
}

/* WAIT until the key exists (the store answers once it does), then GET. */
static sl_status_t sl_ts_get(void *ctx, const char *key, void *buf,
                             size_t capacity, size_t *size, double deadline,
                             const sl_sock_progress_t *progress,
                             sl_errbuf_t *eb)
{
    sl_torch_store_t *ts = ctx;
    char              drain[4096];
    uint64_t          len, left;
    uint8_t           answer;
    sl_status_t       status;

    ts->deadline = deadline;
    SL_CHECK(sl_ts_query(ts, SL_TORCH_WAIT, key, eb));
    status = sl_sock_io(ts->fd, &answer, 1, 0, deadline, progress, eb);
    if (status == STAGELINK_ERR_TIMEOUT) {
        return sl_error(eb, status, "key %s did not appear in torchrun's "
                        "store at %s:%d before the deadline (STAGELINK_TIMEOUT)",
                        ts->key, ts->host, ts->port);
    }
    SL_CHECK(status);
    if (answer != SL_TORCH_STOP_WAITING) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "the store at %s:%d answered a wait for %s with %u, "
                        "not torch's STOP_WAITING: another protocol?",
                        ts->host, ts->port, ts->key, answer);
    }
    SL_CHECK(sl_ts_query(ts, SL_TORCH_GET, key, eb));
    SL_CHECK(sl_sock_io(ts->fd, &len, sizeof(len), 0, deadline, progress,
                        eb));
    *size = (size_t)len;
    SL_CHECK(sl_sock_io(ts->fd, buf, len < capacity ? len : capacity, 0,
                        deadline, progress, eb));
    /* The rest of a value too large is read off, so the stream stays in
     * step; the caller refuses the size. */
    for (left = len > capacity ? len - capacity : 0; left > 0;) {
        size_t n = left < sizeof(drain) ? (size_t)left : sizeof(drain);

        SL_CHECK(sl_sock_io(ts->fd, drain, n, 0, deadline, progress, eb));
        left -= n;
    }
    return STAGELINK_SUCCESS;
}

static void sl_ts_close(void *ctx)
{
    sl_torch_store_t *ts = ctx;

    close(ts->fd);
    free(ts);
}

static const sl_kv_ops_t sl_torch_store_ops = {
    .name  = "torch-store",
    .set   = sl_ts_set,
    .get   = sl_ts_get,
    .close = sl_ts_close,
};

/* A store that does not answer PING in torch 2.x's numbering is not one
 * this client can speak to: torch 1.13's reads the bytes as a SET and
 * waits for more, so the answer's deadline is what tells. */
static sl_status_t sl_ts_ping(sl_torch_store_t *ts, double deadline,
                              sl_errbuf_t *eb)
{
    struct {
        uint8_t  query;
        uint32_t magic;
        uint8_t  ping;
        uint32_t nonce;
    } __attribute__((packed)) hello = {SL_TORCH_VALIDATE, SL_TORCH_MAGIC,
                                       SL_TORCH_PING, (uint32_t)getpid()};
    uint32_t    echo = 0;
    sl_status_t status;

    SL_CHECK(sl_ts_send(ts, &hello, sizeof(hello), eb));
    status = sl_sock_io(ts->fd, &echo, sizeof(echo), 0, deadline, NULL, eb);
    if (status == STAGELINK_SUCCESS && echo == hello.nonce) {
        return STAGELINK_SUCCESS;
    }
    return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                    "the store at %s:%d (torchrun's agent store, from "
                    "MASTER_ADDR/MASTER_PORT) %s torch 2.x's PING: it is not "
                    "a TCPStore of torch >= 2.0 (torch 1.13's numbers its "
                    "queries otherwise); set STAGELINK_BOOTSTRAP=tcp with a "
                    "free STAGELINK_BOOTSTRAP_PORT, or run torch >= 2.0's "
                    "torchrun", ts->host, ts->port,
                    status == STAGELINK_SUCCESS ? "answered with another nonce to"
                    : status == STAGELINK_ERR_TIMEOUT
                        ? "did not answer, before the deadline (STAGELINK_TIMEOUT),"
                        : "closed the connection at");
}

sl_status_t sl_torch_store_open(sl_kv_t *kv, const char *host, int port,
                                const char *prefix, double deadline,
                                sl_errbuf_t *eb)
{
    sl_torch_store_t *ts = calloc(1, sizeof(*ts));
    sl_status_t       status;

    if (ts == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a torch store client");
    }
    ts->fd       = -1;
    ts->port     = port;
    ts->deadline = deadline;
    snprintf(ts->host, sizeof(ts->host), "%s", host);
    snprintf(ts->prefix, sizeof(ts->prefix), "%s", prefix);
    SL_CHECK_GOTO(sl_sock_connect(host, port, "torchrun's agent store",
                                  deadline, &ts->fd, eb), err);
    SL_CHECK_GOTO(sl_ts_ping(ts, deadline, eb), err_close);
    SL_INFO(SL_SUBSYS_BOOT, "bootstrap through torchrun's store at %s:%d, "
            "keys under %s", host, port, prefix);
    kv->ops = &sl_torch_store_ops;
    kv->ctx = ts;
    return STAGELINK_SUCCESS;
err_close:
    close(ts->fd);
err:
    free(ts);
    return status;
}
