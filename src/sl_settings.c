/* SPDX-License-Identifier: MIT */
#include "sl_settings.h"

#include "sl_abi.h"
#include "sl_env.h"
#include "sl_log.h"

#include <sched.h>
#include <stddef.h>
#include <string.h>

static sl_status_t sl_settings_mode(const stagelink_config_t *config,
                                    stagelink_mode_t *mode, sl_errbuf_t *eb)
{
    const char *const *names = sl_env_table[SL_ENV_MODE].choices;
    stagelink_mode_t   from_env;
    sl_env_value_t     v;

    if (config->mode < STAGELINK_MODE_DEFAULT ||
        config->mode > STAGELINK_MODE_SHARDED) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "config mode %d is not a stagelink_mode_t",
                        (int)config->mode);
    }
    SL_CHECK(sl_env_parse(SL_ENV_MODE, &v, eb));
    from_env = (stagelink_mode_t)(STAGELINK_MODE_SCATTER_GATHER + v.choice);
    /* A mode the code asked for is a statement about its tensors, which
     * no variable may silently overturn. */
    if (config->mode != STAGELINK_MODE_DEFAULT && v.set &&
        from_env != config->mode) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "STAGELINK_MODE=%s disagrees with the mode the "
                        "host's code asked for (%s); unset STAGELINK_MODE or "
                        "set it to %s (the variable chooses only where the "
                        "code leaves the mode at its default)", names[v.choice],
                        names[config->mode - STAGELINK_MODE_SCATTER_GATHER],
                        names[config->mode - STAGELINK_MODE_SCATTER_GATHER]);
    }
    /* The environment picks a transport, never what a receive holds:
     * sharded leaves each rank only its shard, which the host's code must
     * be written for, so only the code may ask for it. */
    if (v.set && from_env == STAGELINK_MODE_SHARDED &&
        config->mode != STAGELINK_MODE_SHARDED) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "STAGELINK_MODE=%s: sharded changes what a receive "
                        "holds (each rank gets only its shard), so only the "
                        "host's code may ask for it (config mode "
                        "STAGELINK_MODE_SHARDED); the variable chooses "
                        "between scatter_gather and full, which deliver the "
                        "same tensor", v.text);
    }
    *mode = (config->mode == STAGELINK_MODE_DEFAULT) ? from_env : config->mode;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_settings_log(sl_errbuf_t *eb)
{
    static const unsigned bits[] = {SL_SUBSYS_INIT, SL_SUBSYS_BOOT,
                                    SL_SUBSYS_NET, SL_SUBSYS_GATHER,
                                    SL_SUBSYS_ENV, SL_SUBSYS_ALL};
    sl_env_value_t        level, subsys;
    unsigned              mask = 0;
    size_t                i;

    SL_CHECK(sl_env_parse(SL_ENV_DEBUG, &level, eb));
    SL_CHECK(sl_env_parse(SL_ENV_DEBUG_SUBSYS, &subsys, eb));
    for (i = 0; i < SL_ARRAY_SIZE(bits); ++i) {
        if (subsys.mask & (1u << i)) {
            mask |= bits[i];
        }
    }
    sl_log_configure((sl_log_level_t)level.choice, mask);
    return STAGELINK_SUCCESS;
}

sl_status_t sl_config_copy(const stagelink_config_t *config,
                           stagelink_config_t *out, sl_errbuf_t *eb)
{
    const uint32_t known = STAGELINK_CONFIG_RANK_SET | STAGELINK_CONFIG_DEVICE_SET;

    SL_CHECK(sl_abi_copy_in(&sl_abi_config, config, config->struct_size, out,
                            eb));
    /* A flag this plugin does not know would be dropped without a word. */
    if (out->flags & ~known) {
        return sl_error(eb, STAGELINK_ERR_ABI,
                        "config flags 0x%x hold bits 0x%x this plugin does "
                        "not know (it knows STAGELINK_CONFIG_RANK_SET 0x%x and "
                        "_DEVICE_SET 0x%x): a newer header's flag, or a config "
                        "not zero-initialised", (unsigned)out->flags,
                        (unsigned)(out->flags & ~known),
                        STAGELINK_CONFIG_RANK_SET, STAGELINK_CONFIG_DEVICE_SET);
    }
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
    sl_env_value_t v;

    /* Every variable first, on every rank and before any exchange: a rank
     * refusing one alone would leave its peers waiting in the bootstrap. */
    SL_CHECK(sl_settings_log(eb));
    SL_CHECK(sl_env_check_all(eb));
    sl_env_warn_unknown();
    SL_CHECK(sl_settings_mode(config, &s->mode, eb));
    SL_CHECK(sl_env_parse(SL_ENV_TIMEOUT, &v, eb));
    s->timeout = v.real;
    SL_CHECK(sl_env_parse(SL_ENV_SPIN_US, &v, eb));
    s->spin = v.is_auto ? -1.0 : (double)v.u64 * 1e-6;
    SL_CHECK(sl_env_parse(SL_ENV_MAX_REQUESTS, &v, eb));
    s->max_requests = (int)v.u64;
    SL_CHECK(sl_env_parse(SL_ENV_CHUNK, &v, eb));
    s->chunk = (size_t)v.u64; /* auto: 0, decided with the peers once UCX is up */
    SL_CHECK(sl_env_parse(SL_ENV_STAGING_BUFFERS, &v, eb));
    s->nbufs = (int)v.u64; /* auto: 0, sized once the node's ranks are known */
    SL_CHECK(sl_env_parse(SL_ENV_PROGRESS_THREAD, &v, eb));
    s->progress_thread = v.flag;
    SL_CHECK(sl_env_parse(SL_ENV_GPU_DIRECT, &v, eb));
    s->gpu_direct = v.choice;
    SL_CHECK(sl_env_parse(SL_ENV_FINALIZE_GRACE, &v, eb));
    s->grace = v.real;
    if (s->timeout > 0 && s->grace > s->timeout) {
        s->grace = s->timeout;
    }
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
    return (local_ranks > cpus) ? 0.0 : 200e-6;
}
