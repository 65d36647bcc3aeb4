/*
 * What every standalone program does first: load the plugin through the
 * public loader and make a communicator.  SPDX-License-Identifier: MIT
 */
#ifndef SL_TOOLS_HOST_H
#define SL_TOOLS_HOST_H

#include <stagelink/loader.h>

typedef struct sl_host {
    stagelink_loader_t          *loader;
    const stagelink_plugin_v1_t *plugin;
    stagelink_comm_t            *comm;
    stagelink_comm_info_t        info;
} sl_host_t;

/** Returns 0, or prints the loader's or plugin's sentence and returns -1. */
int sl_host_open(sl_host_t *host, int tp_size, int pp_size,
                 stagelink_mode_t mode);

/** The same with a whole config (explicit placement, ...). */
int sl_host_open_config(sl_host_t *host, const stagelink_config_t *config);

void sl_host_close(sl_host_t *host);

/** Prints "what: STATUS: sentence" when status is not success; returns it. */
stagelink_status_t sl_host_report(const sl_host_t *host,
                                  stagelink_status_t status, const char *what);

/** A host-memory transfer descriptor with the given tag (direction AUTO). */
stagelink_xfer_t sl_host_xfer(stagelink_peer_t peer, void *buf, size_t nbytes,
                              size_t elem_size, uint32_t microbatch,
                              uint16_t chunk);

/** Posts a host-memory send to the next stage (`send` nonzero) or a
 *  receive from the previous one, tagged (microbatch, chunk 0). */
stagelink_status_t sl_host_post(const sl_host_t *host, int send, void *buf,
                                size_t nbytes, size_t elem_size,
                                uint32_t microbatch,
                                stagelink_request_t **req);

/** The same, waited for. */
stagelink_status_t sl_host_transfer(const sl_host_t *host, int send,
                                    void *buf, size_t nbytes,
                                    size_t elem_size, uint32_t microbatch);

/** This process's place in its job as the library reads the launcher's
 *  environment (stagelink_job_query); without a usable launcher, rank 0
 *  of 1 and local rank -1, and the library's sentence in `why` (else ""). */
stagelink_job_info_t sl_host_job(char *why, size_t len);

/** Parses "full", "scatter_gather" or "sharded"; -1 if none. */
int sl_host_parse_mode(const char *name, stagelink_mode_t *mode);

const char *sl_host_mode_name(stagelink_mode_t mode);

/** Stands in for a compute unit of `us`: a sleep, which leaves the CPU to
 *  the transport as a GPU kernel does. */
void sl_host_compute(double us);

/** Parses "4096", "64K", "1M", "2G"; returns -1 on junk. */
int sl_host_parse_size(const char *text, size_t *size);

#endif
