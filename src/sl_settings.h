/*
 * A communicator's settings from the host's config and the environment,
 * parsed the same way by every plugin.  SPDX-License-Identifier: MIT
 */
#ifndef SL_SETTINGS_H
#define SL_SETTINGS_H

#include "sl_error.h"

#include <stddef.h>

typedef struct sl_settings {
    stagelink_mode_t mode;
    double           timeout;      /**< seconds, 0 = none */
    double           spin;         /**< seconds of polling before sleeping; <0: auto */
    int              max_requests;
    size_t           chunk;        /**< device transfers' chunk */
    int              nbufs;        /**< staging buffers per direction, 0 auto */
    int              progress_thread; /**< a thread progresses between calls */
    double           grace;        /**< seconds finalize lets sends finish */
    int              gpu_direct;   /**< STAGELINK_GPU_DIRECT: SL_GPU_DIRECT_* */
} sl_settings_t;

/** STAGELINK_GPU_DIRECT, in the order of its choices. */
enum {
    SL_GPU_DIRECT_AUTO,
    SL_GPU_DIRECT_REQUIRE,
    SL_GPU_DIRECT_OFF,
};

/**
 * The host's config as this build's struct: a host built against an older
 * header passes a shorter one (down to the original v1, which ended with
 * `flags`), whose missing fields read as zero.  Checks the bootstrap
 * callbacks: a whole store or none, not with an allgather.
 */
sl_status_t sl_config_copy(const stagelink_config_t *config,
                           stagelink_config_t *out, sl_errbuf_t *eb);

/** Configures the logger from STAGELINK_DEBUG and STAGELINK_DEBUG_SUBSYS:
 *  the entry points call it before they log. */
sl_status_t sl_settings_log(sl_errbuf_t *eb);

/** Checks every variable (and names unknown ones, once), then reads the
 *  settings against the (copied) config; errors name the value. */
sl_status_t sl_settings_parse(const stagelink_config_t *config,
                              sl_settings_t *s, sl_errbuf_t *eb);

const char *sl_mode_name(stagelink_mode_t mode);

/**
 * The polling window's cap for `auto`: 200 us, or none when `local_ranks`
 * exceed the CPUs this process may run on.
 */
double sl_settings_auto_spin(int local_ranks);

/** Pinned bounce-buffer bytes per direction, node-wide, for auto. */
#define SL_STAGING_NODE_BYTES ((size_t)64 << 20)

/**
 * Bounce buffers (chunks in flight) per direction for `auto`: the rank's
 * share of SL_STAGING_NODE_BYTES in chunks of `chunk`, at least 4 and at
 * most 16 (8 at 1 MiB with 8 ranks a node; 4 at 16 MiB).
 */
int sl_settings_auto_buffers(int local_ranks, size_t chunk);

#endif
