/* SPDX-License-Identifier: MIT */
#include "sl_settings.h"
#include "sl_env.h"
#include "sl_log.h"
#include "sl_topo.h"

#include <sched.h>
#include <stddef.h>
#include <string.h>
#include <strings.h>

static sl_status_t sl_settings_mode(const stagelink_config_t *config,
                                    stagelink_mode_t *mode, sl_errbuf_t *eb)
{
    static const char *const names[] = {"scatter_gather", "full", "sharded",
                                        NULL};
    stagelink_mode_t         from_env;
    int                      choice;

    if (config->mode < STAGELINK_MODE_DEFAULT ||
        config->mode > STAGELINK_MODE_SHARDED) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "config mode %d is not a stagelink_mode_t",
                        (int)config->mode);
    }
    SL_CHECK(sl_env_parse_choice(SL_ENV_MODE, names, &choice, eb));
    from_env = (stagelink_mode_t)(STAGELINK_MODE_SCATTER_GATHER + choice);
    /* The variable chooses only where the code left the choice to it: a
     * mode the code asked for is a statement about its tensors (sharded
     * where each rank reads its own shard only), which no variable may
     * silently overturn. */
    if (config->mode != STAGELINK_MODE_DEFAULT &&
        sl_env_raw(SL_ENV_MODE) != NULL && from_env != config->mode) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "STAGELINK_MODE=%s disagrees with the mode the "
                        "host's code asked for (%s); unset STAGELINK_MODE or "
                        "set it to %s (the variable chooses only where the "
                        "code leaves the mode at its default)", names[choice],
                        names[config->mode - STAGELINK_MODE_SCATTER_GATHER],
                        names[config->mode - STAGELINK_MODE_SCATTER_GATHER]);
    }
    *mode = (config->mode == STAGELINK_MODE_DEFAULT) ? from_env : config->mode;
    return STAGELINK_SUCCESS;
}

/* The original v1 config ended with `flags`; later fields are appended. */
#define SL_CONFIG_V1_MIN_SIZE offsetof(stagelink_config_t, store_set)

sl_status_t sl_config_copy(const stagelink_config_t *config,
                           stagelink_config_t *out, sl_errbuf_t *eb)
{
    if (config->struct_size < SL_CONFIG_V1_MIN_SIZE ||
        config->struct_size % _Alignof(stagelink_config_t) != 0) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "config struct_size is %u, expected at least %zu "
                        "and a whole number of fields: zero the struct and "
                        "set struct_size = sizeof(stagelink_config_t)",
                        config->struct_size, SL_CONFIG_V1_MIN_SIZE);
    }
    memset(out, 0, sizeof(*out));
    memcpy(out, config, (config->struct_size < sizeof(*out))
                            ? config->struct_size : sizeof(*out));
    out->struct_size = sizeof(*out);
    if ((out->store_set == NULL) != (out->store_get == NULL)) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "config has store_%s but no store_%s: a store "
                        "bootstrap needs both", out->store_set ? "set" : "get",
                        out->store_set ? "get" : "set");
    }
    if (out->store_set != NULL && out->allgather != NULL) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "config has both an allgather callback and a store: "
                        "give one bootstrap (the store scales, reading only "
                        "the ranks each rank talks to)");
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_settings_parse(const stagelink_config_t *config,
                              sl_settings_t *s, sl_errbuf_t *eb)
{
    static const char *const gpu_direct_names[] = {"auto", "require", "off",
                                                   NULL};
    uint64_t       spin_us, max_requests, chunk, nbufs, thread;
    double         floor_gbps;
    sl_log_level_t level;
    unsigned       subsys;

    SL_CHECK(sl_log_parse_env(&level, &subsys, eb));
    SL_CHECK(sl_settings_mode(config, &s->mode, eb));
    SL_CHECK(sl_env_parse_seconds(SL_ENV_TIMEOUT, &s->timeout, eb));
    if (strcmp(sl_env_get(SL_ENV_SPIN_US), "auto") == 0) {
        spin_us = UINT64_MAX;
    } else {
        SL_CHECK(sl_env_parse_u64(SL_ENV_SPIN_US, 0, 10000000, &spin_us, eb));
    }
    SL_CHECK(sl_env_parse_u64(SL_ENV_MAX_REQUESTS, 1, 1 << 20, &max_requests,
                              eb));
    if (strcasecmp(sl_env_get(SL_ENV_CHUNK), "auto") == 0) {
        chunk = 0; /* decided with the peers, once UCX is up (ucx_chunked.c) */
    } else {
        SL_CHECK(sl_env_parse_u64(SL_ENV_CHUNK, 4096, 1ull << 30, &chunk, eb));
    }
    if (strcasecmp(sl_env_get(SL_ENV_STAGING_BUFFERS), "auto") == 0) {
        nbufs = 0; /* sized once the ranks of the node are known */
    } else {
        SL_CHECK(sl_env_parse_u64(SL_ENV_STAGING_BUFFERS, 1, 64, &nbufs, eb));
    }
    SL_CHECK(sl_env_parse_u64(SL_ENV_PROGRESS_THREAD, 0, 1, &thread, eb));
    /* Read before any exchange: a rank refusing one alone would leave its
     * peers waiting in the bootstrap. */
    SL_CHECK(sl_env_parse_choice(SL_ENV_GPU_DIRECT, gpu_direct_names,
                                 &s->gpu_direct, eb));
    SL_CHECK(sl_nic_floor(&floor_gbps, eb));
    SL_CHECK(sl_env_parse_seconds(SL_ENV_FINALIZE_GRACE, &s->grace, eb));
    if (s->timeout > 0 && s->grace > s->timeout) {
        s->grace = s->timeout;
    }
    s->progress_thread = (int)thread;
    s->spin         = (spin_us == UINT64_MAX) ? -1.0 : (double)spin_us * 1e-6;
    s->max_requests = (int)max_requests;
    s->chunk        = (size_t)chunk;
    s->nbufs        = (int)nbufs;
    return STAGELINK_SUCCESS;
}

const char *sl_mode_name(stagelink_mode_t mode)
{
    switch (mode) {
    case STAGELINK_MODE_SCATTER_GATHER: return "scatter_gather";
    case STAGELINK_MODE_FULL:           return "full";
    case STAGELINK_MODE_SHARDED:        return "sharded";
    case STAGELINK_MODE_DEFAULT:        break;
    }
    return "default";
}

int sl_settings_auto_buffers(int local_ranks, size_t chunk)
{
    size_t per = (size_t)(local_ranks > 0 ? local_ranks : 1) *
                 (chunk > 0 ? chunk : 1);
    size_t n   = SL_STAGING_NODE_BYTES / per;

    return (n < 4) ? 4 : (n > 16) ? 16 : (int)n;
}

double sl_settings_auto_spin(int local_ranks)
{
    cpu_set_t set;
    int       cpus = 1;

    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        cpus = CPU_COUNT(&set);
    }
    return (local_ranks > cpus) ? 0.0 : 50e-6;
}
