/* The host's store callbacks as a bootstrap store.  SPDX-License-Identifier: MIT */
#include "sl_kv.h"

/* The host's calls block by its own rules: no deadline or progress here. */
static sl_status_t sl_kv_host_set(void *ctx, const char *key, const void *buf,
                                  size_t len, double deadline, sl_errbuf_t *eb)
{
    sl_kv_host_t *host = ctx;
    int           rc   = host->set(host->ctx, key, buf, len);

    (void)deadline;
    if (rc != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "the host's store_set returned %d for key %s (%zu "
                        "bytes)", rc, key, len);
    }
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_kv_host_get(void *ctx, const char *key, void *buf,
                                  size_t capacity, size_t *size,
                                  double deadline,
                                  const sl_sock_progress_t *progress,
                                  sl_errbuf_t *eb)
{
    sl_kv_host_t *host = ctx;
    int           rc;

    (void)deadline;
    (void)progress;
    *size = 0;
    rc    = host->get(host->ctx, key, buf, capacity, size);
    if (rc != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "the host's store_get returned %d for key %s", rc,
                        key);
    }
    return STAGELINK_SUCCESS;
}

static void sl_kv_host_close(void *ctx)
{
    (void)ctx;
}

static const sl_kv_ops_t sl_kv_host_ops = {
    .name  = "callbacks",
    .set   = sl_kv_host_set,
    .get   = sl_kv_host_get,
    .close = sl_kv_host_close,
};

void sl_kv_host_open(sl_kv_t *kv, sl_kv_host_t *host)
{
    kv->ops = &sl_kv_host_ops;
    kv->ctx = host;
}

void sl_kv_close(sl_kv_t *kv)
{
    if (kv->ops != NULL) {
        kv->ops->close(kv->ctx);
    }
    *kv = (sl_kv_t){NULL, NULL};
}
