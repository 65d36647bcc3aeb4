/*
 * The one table of environment variables stagelink reads.  Every getenv of
 * the project goes through sl_env_get(); the same table feeds docs/configuration.md,
 * stagelink_info and the loader's public listing.  SPDX-License-Identifier: MIT
 */
#ifndef SL_ENV_H
#define SL_ENV_H

#include "sl_error.h"

#include <stagelink/loader.h>

#include <stdint.h>

typedef enum sl_env_id {
    SL_ENV_PLUGIN,
    SL_ENV_PLUGIN_PATH,
    SL_ENV_MODE,
    SL_ENV_GATHER,
    SL_ENV_DEBUG,
    SL_ENV_DEBUG_SUBSYS,
    SL_ENV_NODE_ID,
    SL_ENV_TIMEOUT,
    SL_ENV_SPIN_US,
    SL_ENV_MAX_REQUESTS,
    SL_ENV_PROGRESS_THREAD,
    SL_ENV_FINALIZE_GRACE,
    SL_ENV_NET_DEVICES,
    SL_ENV_IB_HCA,
    SL_ENV_NIC_MIN_GBPS,
    SL_ENV_CHUNK,
    SL_ENV_STAGING_BUFFERS,
    SL_ENV_GPU_DIRECT,
    SL_ENV_NCCL_LIBRARY,
    SL_ENV_SYSFS_ROOT,
    SL_ENV_BOOTSTRAP,
    SL_ENV_BOOTSTRAP_ADDR,
    SL_ENV_BOOTSTRAP_PORT,
    SL_ENV_BOOTSTRAP_BIND,
    SL_ENV_JOB_KEY,
    SL_ENV_JOB_SECRET,
    SL_ENV_JOB_SECRET_FILE,
    SL_ENV_LIBRARY,
    SL_ENV_UCX,
    SL_ENV_CHECK,
    SL_ENV_UCX_NET_DEVICES,
    SL_ENV_NCCL_IB_HCA,
    /* Read from launchers, in the order tried. */
    SL_ENV_RANK,
    SL_ENV_WORLD_SIZE,
    SL_ENV_LOCAL_RANK,
    SL_ENV_LOCAL_WORLD_SIZE,
    SL_ENV_MASTER_ADDR,
    SL_ENV_MASTER_PORT,
    SL_ENV_OMPI_RANK,
    SL_ENV_OMPI_SIZE,
    SL_ENV_OMPI_LOCAL_RANK,
    SL_ENV_OMPI_LOCAL_SIZE,
    SL_ENV_SLURM_PROCID,
    SL_ENV_SLURM_NTASKS,
    SL_ENV_SLURM_LOCALID,
    SL_ENV_SLURM_STEP_TASKS_PER_NODE,
    SL_ENV_SLURM_NODEID,
    SL_ENV_TORCHELASTIC_RUN_ID,
    SL_ENV_TORCHELASTIC_USE_AGENT_STORE,
    SL_ENV_TORCHELASTIC_RESTART_COUNT,
    SL_ENV_PMIX_RANK,
    SL_ENV_PMIX_NAMESPACE,
    SL_ENV_SLURM_JOB_ID,
    SL_ENV_OMPI_JOBID,
    SL_ENV_COUNT
} sl_env_id_t;

/* The public listing hands out the table itself. */
typedef stagelink_env_var_t sl_env_entry_t;

extern const sl_env_entry_t sl_env_table[SL_ENV_COUNT];

/** The variables whose value is a secret: never printed. */
int sl_env_is_secret(sl_env_id_t id);

/** Value in the environment; NULL when unset or empty. */
const char *sl_env_raw(sl_env_id_t id);

/** Value in the environment, else the table's default. */
const char *sl_env_get(sl_env_id_t id);

/**
 * Case-insensitive choice among `names` (NULL-terminated); *index is the
 * position.  Unknown values fail with a sentence listing the choices.
 */
sl_status_t sl_env_parse_choice(sl_env_id_t id, const char *const *names,
                                int *index, sl_errbuf_t *eb);

/** Unsigned integer in [min, max]; unset gives the default. */
sl_status_t sl_env_parse_u64(sl_env_id_t id, uint64_t min, uint64_t max,
                             uint64_t *value, sl_errbuf_t *eb);

/** Non-negative seconds (fractions allowed); unset gives the default. */
sl_status_t sl_env_parse_seconds(sl_env_id_t id, double *seconds,
                                 sl_errbuf_t *eb);

/** Parses a decimal integer in [min, max] from `text`; named `what` in errors. */
sl_status_t sl_parse_long(const char *text, long min, long max, long *value,
                          const char *what, sl_errbuf_t *eb);

#endif
