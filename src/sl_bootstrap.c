/* SPDX-License-Identifier: MIT */
#include "sl_bootstrap.h"
#include "sl_env.h"
#include "sl_log.h"
#include "sl_pmix.h"
#include "sl_sock.h"
#include "sl_time.h"
#include "sl_torch_store.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sl_boot_hdr_t sl_boot_hdr(const sl_bootstrap_t *bs, uint64_t size)
{
    return (sl_boot_hdr_t){SL_BOOT_MAGIC, SL_BOOT_VERSION, (uint32_t)bs->rank,
                           (uint32_t)bs->world_size, bs->job_key, size};
}

/* Communicators on one launcher's store, numbered in creation order, which
 * is the same on every rank (as torch numbers its process groups).  The
 * plugins stay loaded (-z nodelete), so a host that closes and reopens one
 * never reuses a number, and keys of one communicator never meet
 * another's stale ones. */
static atomic_uint sl_boot_store_seq;
/* The unused job secret is said once a process, not once a communicator. */
static atomic_int sl_boot_secret_said;

/* The next communicator's name on a launcher's store: this copy of the
 * core (the plugin's file name: each plugin counts its own) and its
 * number. */
static void sl_boot_comm_id(char *id, size_t size)
{
    const char *owner = "stagelink";
    Dl_info     info;

    if (dladdr(&sl_boot_store_seq, &info) != 0 && info.dli_fname != NULL &&
        info.dli_fname[0] != '\0') {
        const char *slash = strrchr(info.dli_fname, '/');

        owner = slash != NULL ? slash + 1 : info.dli_fname;
    }
    snprintf(id, size, "%.48s.%u", owner,
             atomic_fetch_add(&sl_boot_store_seq, 1u));
}

/* torchrun's agent store: keys under stagelink's own prefix, apart from
 * other jobs' (the run id), restarts and communicators. */
static sl_status_t sl_boot_torch_store(sl_bootstrap_t *bs,
                                       const sl_launcher_t *launcher,
                                       const char *comm_id, sl_errbuf_t *eb)
{
    char prefix[192];

    snprintf(prefix, sizeof(prefix), "/stagelink/%.64s/attempt_%.16s/%s/",
             sl_env_get(SL_ENV_TORCHELASTIC_RUN_ID),
             sl_env_get(SL_ENV_TORCHELASTIC_RESTART_COUNT), comm_id);
    return sl_torch_store_open(&bs->kv, launcher->addr, launcher->port,
                               prefix, sl_deadline(bs->timeout), eb);
}

sl_status_t sl_bootstrap_init(sl_bootstrap_t *bs,
                              const stagelink_config_t *config,
                              const sl_launcher_t *launcher, double timeout,
                              sl_errbuf_t *eb)
{
    char comm_id[64];

    memset(bs, 0, sizeof(*bs));
    bs->rank       = launcher->rank;
    bs->world_size = launcher->world_size;
    bs->timeout    = timeout;
    bs->job_key    = launcher->job_key;
    bs->rv.root_fd = -1;
    bs->kind       = launcher->boot;
    if (bs->world_size == 1 && bs->kind != SL_BOOT_CALLBACKS) {
        return STAGELINK_SUCCESS; /* nothing to exchange */
    }
    if (bs->kind != SL_BOOT_TCP && sl_auth_configured() &&
        !atomic_exchange(&sl_boot_secret_said, 1)) {
        SL_WARN(SL_SUBSYS_BOOT, "a job secret is set, but init exchanges "
                "through %s, whose trust is the launcher's or the host's: "
                "the secret is not used (STAGELINK_BOOTSTRAP=tcp uses it, on "
                "STAGELINK_BOOTSTRAP_PORT)",
                launcher->boot_why);
    }
    switch (bs->kind) {
    case SL_BOOT_CALLBACKS:
        if (config->allgather == NULL && config->store_set == NULL) {
            return sl_error(eb, STAGELINK_ERR_INTERNAL, "the callbacks "
                            "bootstrap without the host's callbacks");
        }
        bs->fn     = config->allgather;
        bs->fn_ctx = config->allgather_ctx;
        if (config->store_set != NULL) {
            bs->host = (sl_kv_host_t){config->store_set, config->store_get,
                                      config->store_ctx};
            sl_kv_host_open(&bs->kv, &bs->host);
        }
        return STAGELINK_SUCCESS;
    case SL_BOOT_TORCH_STORE:
        sl_boot_comm_id(comm_id, sizeof(comm_id));
        return sl_boot_torch_store(bs, launcher, comm_id, eb);
    case SL_BOOT_PMIX:
        sl_boot_comm_id(comm_id, sizeof(comm_id));
        return sl_pmix_open(&bs->kv, launcher->pmix_rank, comm_id,
                            sl_deadline(timeout), eb);
    default:
        bs->tcp = 1;
        return sl_rendezvous_open(&bs->rv, launcher, timeout, eb);
    }
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

/* Through a store: one key per rank and exchange, and one read for each
 * named rank. */
static sl_status_t sl_boot_store_exchange(sl_bootstrap_t *bs, const char *name,
                                          const void *mine, size_t len,
                                          const int *peers, int npeers,
                                          sl_boot_blob_t *out, sl_errbuf_t *eb)
{
    const sl_kv_ops_t *ops      = bs->kv.ops;
    double             deadline = sl_deadline(bs->timeout);
    char               key[64], *buf;
    size_t             size;
    sl_status_t        status = STAGELINK_SUCCESS;
    unsigned           use = 0;
    int                i;

    SL_CHECK(sl_boot_name_use(bs, name, &use, eb));
    snprintf(key, sizeof(key), "%s.%u/%d", name, use, bs->rank);
    SL_CHECK(ops->set(bs->kv.ctx, key, mine, len, deadline, eb));
    /* Pages of the scratch buffer are touched only as far as a blob goes. */
    buf = malloc(SL_BOOTSTRAP_MAX_BLOCK);
    if (buf == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a %u-byte bootstrap buffer",
                        SL_BOOTSTRAP_MAX_BLOCK);
    }
    for (i = 0; i < npeers && status == STAGELINK_SUCCESS; ++i) {
        snprintf(key, sizeof(key), "%s.%u/%d", name, use, peers[i]);
        size   = 0;
        status = ops->get(bs->kv.ctx, key, buf, SL_BOOTSTRAP_MAX_BLOCK, &size,
                          deadline, &bs->progress, eb);
        if (status != STAGELINK_SUCCESS) {
            char cause[SL_ERRBUF_LEN];

            snprintf(cause, sizeof(cause), "%s", eb->msg);
            status = sl_error(eb, status, "%s: rank %d's part of exchange "
                              "%s through %s; did that rank start, with the "
                              "same store, and get this far (see its own "
                              "error)?", cause, peers[i], name, ops->name);
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

sl_status_t sl_bootstrap_parse_part(const sl_bootstrap_t *bs, int r,
                                    const char *name,
                                    const sl_boot_hdr_t *hdr, void *body,
                                    const sl_auth_seal_t *seal,
                                    sl_auth_link_t *link,
                                    sl_boot_part_t *part, sl_errbuf_t *eb)
{
    sl_auth_part_t parts[] = {{hdr, sizeof(*hdr)}, {body, hdr->size}};
    sl_boot_req_t  req;
    uint32_t       i;

    if (link->sealed) {
        char what[96];

        snprintf(what, sizeof(what), "rank %d's part of bootstrap exchange "
                 "\"%s\"", r, name);
        SL_CHECK(sl_auth_check(link, SL_AUTH_TO_ROOT, parts, 2, seal, what,
                               eb));
    }
    if (hdr->size < sizeof(req)) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d's exchange message has %llu bytes, less "
                        "than its %zu-byte request", r,
                        (unsigned long long)hdr->size, sizeof(req));
    }
    memcpy(&req, body, sizeof(req));
    req.name[SL_BOOT_NAME_LEN - 1] = '\0';
    if (hdr->rank != (uint32_t)r || strcmp(req.name, name) != 0) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d sent exchange \"%s\" as rank %u while rank 0 "
                        "is in \"%s\": ranks disagree on the exchanges (a "
                        "different stagelink version or setup?)", r, req.name,
                        hdr->rank, name);
    }
    if (req.npeers > (uint32_t)bs->world_size ||
        req.len > SL_BOOTSTRAP_MAX_BLOCK ||
        hdr->size != sizeof(req) + 4ull * req.npeers + req.len) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d's exchange \"%s\" names %u ranks with a "
                        "%u-byte blob in %llu bytes (world %d, blob limit "
                        "%u): a corrupt or foreign message", r, name,
                        req.npeers, req.len, (unsigned long long)hdr->size,
                        bs->world_size, SL_BOOTSTRAP_MAX_BLOCK);
    }
    part->npeers    = req.npeers;
    part->peers     = (uint32_t *)((char *)body + sizeof(req));
    part->blob.data = (char *)body + sizeof(req) + 4ull * req.npeers;
    part->blob.len  = req.len;
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

/* Reads rank r's part of one exchange: the header, checked before the
 * body's size is trusted, then the body and its seal. */
static sl_status_t sl_boot_root_read(sl_bootstrap_t *bs, int r,
                                     const char *name, sl_boot_part_t *part,
                                     double deadline, sl_errbuf_t *eb)
{
    sl_auth_link_t *link = &bs->rv.links[r];
    sl_auth_seal_t  seal;
    sl_boot_hdr_t   hdr;
    int             fd = bs->rv.peer_fds[r];

    SL_CHECK(sl_sock_io(fd, &hdr, sizeof(hdr), 0, deadline, &bs->progress,
                        eb));
    SL_CHECK(sl_rendezvous_check_hdr(&hdr, bs->job_key, bs->world_size, NULL,
                                     eb));
    if (hdr.size > sizeof(sl_boot_req_t) + 4ull * (size_t)bs->world_size +
                       SL_BOOTSTRAP_MAX_BLOCK) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d announces a %llu-byte exchange message, "
                        "above the limit for %d ranks: a corrupt or foreign "
                        "message", r, (unsigned long long)hdr.size,
                        bs->world_size);
    }
    part->body = malloc(hdr.size + 1);
    if (part->body == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot hold rank %d's %llu-byte part of exchange "
                        "\"%s\"", r, (unsigned long long)hdr.size, name);
    }
    SL_CHECK(sl_sock_io(fd, part->body, hdr.size, 0, deadline, &bs->progress,
                        eb));
    if (link->sealed) {
        SL_CHECK(sl_sock_io(fd, &seal, sizeof(seal), 0, deadline,
                            &bs->progress, eb));
    }
    return sl_bootstrap_parse_part(bs, r, name, &hdr, part->body, &seal, link,
                                   part, eb);
}

/* Rank 0 answers rank r with the blob of each rank it named, sealed. */
static sl_status_t sl_boot_root_answer(sl_bootstrap_t *bs, int r,
                                       const sl_boot_part_t *parts,
                                       double deadline, sl_errbuf_t *eb)
{
    const sl_boot_part_t *want = &parts[r];
    sl_auth_link_t       *link = &bs->rv.links[r];
    sl_auth_part_t       *sealed;
    sl_auth_seal_t        seal;
    sl_status_t           status = STAGELINK_SUCCESS;
    uint64_t             *lens;
    uint32_t              i;
    int                   fd = bs->rv.peer_fds[r];

    lens   = malloc(sizeof(*lens) * want->npeers + 1);
    sealed = malloc(sizeof(*sealed) * 2 * want->npeers + 1);
    if (lens == NULL || sealed == NULL) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate the answer to rank %d (%u blobs)",
                          r, want->npeers);
        goto out;
    }
    for (i = 0; i < want->npeers && status == STAGELINK_SUCCESS; ++i) {
        const sl_boot_blob_t *b = &parts[want->peers[i]].blob;

        lens[i]           = b->len;
        sealed[2 * i]     = (sl_auth_part_t){&lens[i], sizeof(lens[i])};
        sealed[2 * i + 1] = (sl_auth_part_t){b->data, b->len};
        status = sl_sock_io(fd, &lens[i], sizeof(lens[i]), 1, deadline,
                            &bs->progress, eb);
        if (status == STAGELINK_SUCCESS) {
            status = sl_sock_io(fd, b->data, b->len, 1, deadline,
                                &bs->progress, eb);
        }
    }
    if (status == STAGELINK_SUCCESS && link->sealed) {
        status = sl_auth_seal(link, SL_AUTH_FROM_ROOT, sealed,
                              2 * (int)want->npeers, &seal, eb);
        if (status == STAGELINK_SUCCESS) {
            status = sl_sock_io(fd, &seal, sizeof(seal), 1, deadline,
                                &bs->progress, eb);
        }
    }
out:
    free(sealed);
    free(lens);
    return status;
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
        SL_CHECK_GOTO(sl_boot_root_answer(bs, r, parts, deadline, eb), out);
    }
    for (r = 0; r < npeers; ++r) {
        SL_CHECK_GOTO(sl_boot_blob_set(&out[r], parts[peers[r]].blob.data,
                                       parts[peers[r]].blob.len, eb), out);
    }
    status = STAGELINK_SUCCESS;
out:
    for (r = 1; r < bs->world_size; ++r) {
        free(parts[r].body);
    }
    free(parts);
    return status;
}

static sl_status_t sl_boot_tcp_exchange(sl_bootstrap_t *bs, const char *name,
                                        const void *mine, size_t len,
                                        const int *peers, int npeers,
                                        sl_boot_blob_t *out, sl_errbuf_t *eb)
{
    double          deadline = sl_deadline(bs->timeout);
    sl_auth_link_t *link     = &bs->rv.links[0];
    int             fd       = bs->rv.root_fd;
    sl_auth_part_t *sealed   = NULL;
    sl_auth_seal_t  seal;
    sl_boot_req_t   req;
    sl_boot_hdr_t   hdr;
    uint32_t       *wants;
    uint64_t       *lens;
    sl_status_t     status;
    int             i;

    if (bs->rank == 0) {
        return sl_boot_root_exchange(bs, name, mine, len, peers, npeers, out,
                                     deadline, eb);
    }
    memset(&req, 0, sizeof(req));
    snprintf(req.name, sizeof(req.name), "%s", name);
    req.npeers = (uint32_t)npeers;
    req.len    = (uint32_t)len;
    wants      = malloc(4ull * (size_t)npeers + 1);
    lens       = malloc(sizeof(*lens) * (size_t)npeers + 1);
    sealed     = malloc(sizeof(*sealed) * (2 * (size_t)npeers + 4));
    if (wants == NULL || lens == NULL || sealed == NULL) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate an exchange with %d ranks", npeers);
        goto out;
    }
    for (i = 0; i < npeers; ++i) {
        wants[i] = (uint32_t)peers[i];
    }
    hdr       = sl_boot_hdr(bs, sizeof(req) + 4ull * (size_t)npeers + len);
    sealed[0] = (sl_auth_part_t){&hdr, sizeof(hdr)};
    sealed[1] = (sl_auth_part_t){&req, sizeof(req)};
    sealed[2] = (sl_auth_part_t){wants, 4ull * (size_t)npeers};
    sealed[3] = (sl_auth_part_t){mine, len};
    for (i = 0; i < 4; ++i) {
        SL_CHECK_GOTO(sl_sock_io(fd, (void *)sealed[i].buf, sealed[i].len, 1,
                                 deadline, &bs->progress, eb), out);
    }
    if (link->sealed) {
        SL_CHECK_GOTO(sl_auth_seal(link, SL_AUTH_TO_ROOT, sealed, 4, &seal,
                                   eb), out);
        SL_CHECK_GOTO(sl_sock_io(fd, &seal, sizeof(seal), 1, deadline,
                                 &bs->progress, eb), out);
    }
    for (i = 0; i < npeers; ++i) {
        SL_CHECK_GOTO(sl_sock_io(fd, &lens[i], sizeof(lens[i]), 0, deadline,
                                 &bs->progress, eb), out);
        if (lens[i] > SL_BOOTSTRAP_MAX_BLOCK) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "rank 0 sends a %llu-byte blob of rank %d, "
                              "above the limit of %u",
                              (unsigned long long)lens[i], peers[i],
                              SL_BOOTSTRAP_MAX_BLOCK);
            goto out;
        }
        out[i].data = malloc(lens[i] + 1);
        out[i].len  = lens[i];
        if (out[i].data == NULL) {
            status = sl_error(eb, STAGELINK_ERR_NO_MEMORY, "cannot allocate a "
                              "bootstrap blob of %llu bytes",
                              (unsigned long long)lens[i]);
            goto out;
        }
        SL_CHECK_GOTO(sl_sock_io(fd, out[i].data, lens[i], 0, deadline,
                                 &bs->progress, eb), out);
        sealed[2 * i]     = (sl_auth_part_t){&lens[i], sizeof(lens[i])};
        sealed[2 * i + 1] = (sl_auth_part_t){out[i].data, lens[i]};
    }
    status = STAGELINK_SUCCESS;
    if (link->sealed) {
        char what[96];

        SL_CHECK_GOTO(sl_sock_io(fd, &seal, sizeof(seal), 0, deadline,
                                 &bs->progress, eb), out);
        snprintf(what, sizeof(what), "rank 0's answer to exchange \"%s\"",
                 name);
        status = sl_auth_check(link, SL_AUTH_FROM_ROOT, sealed, 2 * npeers,
                               &seal, what, eb);
    }
out:
    free(sealed);
    free(lens);
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
    if (bs->kv.ops != NULL) {
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
        return status;
    }
    bs->nexchanges++;
    bs->bytes_published += len;
    for (i = 0; i < npeers; ++i) {
        bs->nread++;
        bs->bytes_read += out[i].len;
    }
    return STAGELINK_SUCCESS;
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

    if (bs->kv.ops != NULL && bs->kv.ops->barrier != NULL) {
        return bs->kv.ops->barrier(bs->kv.ctx, sl_deadline(bs->timeout), eb);
    }
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
    sl_kv_close(&bs->kv);
    if (bs->tcp) {
        sl_rendezvous_close(&bs->rv);
        bs->tcp = 0;
    }
}
