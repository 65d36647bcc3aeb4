/* SPDX-License-Identifier: MIT */
#include "host.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int sl_host_open(sl_host_t *host, int tp_size, int pp_size,
                 stagelink_mode_t mode)
{
    stagelink_config_t config;

    memset(&config, 0, sizeof(config));
    config.struct_size = sizeof(config);
    config.tp_size     = tp_size;
    config.pp_size     = pp_size;
    config.mode        = mode;
    return sl_host_open_config(host, &config);
}

int sl_host_open_config(sl_host_t *host, const stagelink_config_t *config)
{
    char err[1024];

    memset(host, 0, sizeof(*host));
    if (stagelink_loader_open(NULL, &host->loader, err, sizeof(err)) !=
        STAGELINK_SUCCESS) {
        fprintf(stderr, "cannot load the stagelink plugin: %s\n", err);
        return -1;
    }
    host->plugin = stagelink_loader_plugin(host->loader);
    if (stagelink_loader_comm_init(host->loader, config, &host->comm, err,
                                   sizeof(err)) != STAGELINK_SUCCESS) {
        fprintf(stderr, "%s\n", err);
        stagelink_loader_close(host->loader);
        return -1;
    }
    host->plugin->comm_info(host->comm, &host->info);
    return 0;
}

void sl_host_close(sl_host_t *host)
{
    if (host->comm != NULL) {
        sl_host_report(host, host->plugin->comm_finalize(host->comm),
                       "comm_finalize");
    }
    stagelink_loader_close(host->loader);
    memset(host, 0, sizeof(*host));
}

stagelink_status_t sl_host_report(const sl_host_t *host,
                                  stagelink_status_t status, const char *what)
{
    if (status != STAGELINK_SUCCESS) {
        fprintf(stderr, "rank %d: %s: %s: %s\n", host->info.rank, what,
                stagelink_status_string(status),
                host->plugin->last_error(host->comm));
    }
    return status;
}

stagelink_xfer_t sl_host_xfer(stagelink_peer_t peer, void *buf, size_t nbytes,
                              size_t elem_size, uint32_t microbatch,
                              uint16_t chunk)
{
    stagelink_xfer_t x;

    memset(&x, 0, sizeof(x));
    x.peer           = peer;
    x.buf            = buf;
    x.nbytes         = nbytes;
    x.elem_size      = elem_size;
    x.mem_type       = STAGELINK_MEM_HOST;
    x.tag.microbatch = microbatch;
    x.tag.chunk      = chunk;
    return x;
}

stagelink_status_t sl_host_post(const sl_host_t *host, int send, void *buf,
                                size_t nbytes, size_t elem_size,
                                uint32_t microbatch,
                                stagelink_request_t **req)
{
    stagelink_xfer_t x = sl_host_xfer(send ? STAGELINK_PEER_NEXT
                                           : STAGELINK_PEER_PREV,
                                      buf, nbytes, elem_size, microbatch, 0);

    return send ? host->plugin->isend(host->comm, &x, req)
                : host->plugin->irecv(host->comm, &x, req);
}

stagelink_status_t sl_host_transfer(const sl_host_t *host, int send,
                                    void *buf, size_t nbytes,
                                    size_t elem_size, uint32_t microbatch)
{
    stagelink_request_t *req;
    stagelink_status_t   st = sl_host_post(host, send, buf, nbytes, elem_size,
                                           microbatch, &req);

    return (st == STAGELINK_SUCCESS) ? host->plugin->wait(host->comm, req)
                                     : st;
}

stagelink_job_info_t sl_host_job(char *why, size_t len)
{
    stagelink_job_info_t job = {.struct_size = sizeof(job)};

    why[0] = '\0';
    if (stagelink_job_query(&job, why, len) != STAGELINK_SUCCESS) {
        job = (stagelink_job_info_t){.struct_size = sizeof(job), .rank = 0,
                                     .world_size = 1, .local_rank = -1,
                                     .local_size = -1};
    }
    return job;
}

static const char *const sl_mode_names[] = {"default", "scatter_gather",
                                            "full", "sharded"};

int sl_host_parse_mode(const char *name, stagelink_mode_t *mode)
{
    int i;

    for (i = 1; i < 4; ++i) {
        if (strcmp(name, sl_mode_names[i]) == 0) {
            *mode = (stagelink_mode_t)i;
            return 0;
        }
    }
    return -1;
}

const char *sl_host_mode_name(stagelink_mode_t mode)
{
    return ((int)mode >= 0 && (int)mode < 4) ? sl_mode_names[mode] : "?";
}

int sl_host_parse_size(const char *text, size_t *size)
{
    char              *end;
    unsigned long long v;
    unsigned           shift = 0;

    errno = 0;
    v     = strtoull(text, &end, 10);
    if (errno != 0 || end == text || text[0] == '-') {
        return -1;
    }
    switch (*end) {
    case 'K': case 'k': shift = 10; ++end; break;
    case 'M': case 'm': shift = 20; ++end; break;
    case 'G': case 'g': shift = 30; ++end; break;
    default: break;
    }
    if (*end != '\0' || v > (SIZE_MAX >> shift)) {
        return -1;
    }
    *size = (size_t)(v << shift);
    return 0;
}

void sl_host_compute(double us)
{
    struct timespec ts = {(time_t)(us / 1e6),
                          (long)((us - (double)(time_t)(us / 1e6) * 1e6) * 1e3)};

    while (us > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
