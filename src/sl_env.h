/*
 * The one table of environment variables stagelink reads, each with its
 * type, and the one parser of them.  Every getenv of the project goes
 * through it; the same table feeds docs/configuration.md, stagelink_info
 * and the loader's public listing.  The logger reads none of it (it is
 * configured from above), so logging a refusal cannot call back here.  SPDX-License-Identifier: MIT
 */
#ifndef SL_ENV_H
#define SL_ENV_H

#include "sl_error.h"

#include <stagelink/loader.h>

#include <stddef.h>
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
    SL_ENV_WARN_UNKNOWN_ENV,
    /* Read by the tools and tests. */
    SL_ENV_TEST_DEVICE,
    SL_ENV_RANKS_PER_NODE,
    SL_ENV_UCX_CUDA,
    SL_ENV_PYTHON,
    SL_ENV_NO_VENV,
    SL_ENV_IN_CLEAN_ROOT,
    SL_ENV_STRESS_DIR,
    SL_ENV_STRESS_FD,
    SL_ENV_UCX_NET_DEVICES,
    SL_ENV_UCX_TLS,
    SL_ENV_UCX_MODULE_DIR,
    SL_ENV_NCCL_IB_HCA,
    SL_ENV_CUDA_DEVICE_MAX_CONNECTIONS,
    SL_ENV_NCCL_MULTI_RANK_GPU_ENABLE,
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
    SL_ENV_SLURM_STEP_NUM_TASKS,
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

/* How a variable's text is read: one parser for every kind. */
typedef enum sl_env_type {
    SL_ENV_T_STRING,  /**< any text (names, addresses, keys) */
    SL_ENV_T_BOOL,    /**< 1/0, yes/no, on/off, true/false, any case */
    SL_ENV_T_INT,     /**< decimal integer in [min, max] */
    SL_ENV_T_SIZE,    /**< bytes: 4096, 64K, 1M, 1MiB, 2GB (powers of 1024) */
    SL_ENV_T_SECONDS, /**< non-negative: 2.5, 2.5s, 500ms, 100us, 1m */
    SL_ENV_T_NUMBER,  /**< non-negative real (a rate) */
    SL_ENV_T_ENUM,    /**< one of `choices`, any case */
    SL_ENV_T_LIST,    /**< comma list of `choices`, any case */
    SL_ENV_T_DIRS,    /**< colon list of existing directories */
    SL_ENV_T_NICS,    /**< NCCL_IB_HCA's syntax: [^][=]name[:port],... */
} sl_env_type_t;

/* What else the table says of a variable. */
enum {
    SL_ENV_F_AUTO    = 1u << 0, /**< "auto" is accepted besides the type */
    SL_ENV_F_SECRET  = 1u << 1, /**< never printed */
    SL_ENV_F_TOOLS    = 1u << 2, /**< read by the tools and tests, not the library */
    SL_ENV_F_LAUNCHER = 1u << 3, /**< a launcher's: read for the launcher found */
};

typedef struct sl_env_entry {
    stagelink_env_var_t pub; /**< name, default, meaning: the public listing */
    sl_env_type_t       type;
    unsigned            flags;
    uint64_t            min, max; /**< SL_ENV_T_INT, SL_ENV_T_SIZE */
    const char *const  *choices;  /**< SL_ENV_T_ENUM, SL_ENV_T_LIST; NULL-ended */
} sl_env_entry_t;

extern const sl_env_entry_t sl_env_table[SL_ENV_COUNT];

/* A parsed value; which field holds it follows the type. */
typedef struct sl_env_value {
    int         set;     /**< the environment gave it (else the default did) */
    int         is_auto; /**< "auto" */
    int         flag;    /**< SL_ENV_T_BOOL */
    int         choice;  /**< SL_ENV_T_ENUM: index in choices */
    unsigned    mask;    /**< SL_ENV_T_LIST: bit i for choices[i] */
    uint64_t    u64;     /**< SL_ENV_T_INT, SL_ENV_T_SIZE */
    double      real;    /**< SL_ENV_T_SECONDS, SL_ENV_T_NUMBER */
    const char *text;    /**< the text read; NULL when unset without default */
} sl_env_value_t;

/** Value in the environment; NULL when unset or empty. */
const char *sl_env_raw(sl_env_id_t id);

/** Value in the environment, else the table's default. */
const char *sl_env_get(sl_env_id_t id);

/** Reads `text` as variable `id`'s type.  A refusal names the variable,
 *  the value and the accepted forms. */
sl_status_t sl_env_parse_text(sl_env_id_t id, const char *text,
                              sl_env_value_t *value, sl_errbuf_t *eb);

/** The values variable `id` accepts, in words ("an integer from 1 to 64,
 *  or auto"): its refusals say them, and the docs. */
void sl_env_forms(sl_env_id_t id, char *buf, size_t len);

/** Variable `id` from the environment, else its default (unset with no
 *  default: value->set = 0 and value->text = NULL). */
sl_status_t sl_env_parse(sl_env_id_t id, sl_env_value_t *value,
                         sl_errbuf_t *eb);

/** Every variable of the table the library reads whatever the launcher
 *  (not the launchers' own, parsed for the one found, nor the tools'):
 *  the first refusal. */
sl_status_t sl_env_check_all(sl_errbuf_t *eb);

/** Index of `name` in the table, or SL_ENV_COUNT. */
sl_env_id_t sl_env_find(const char *name);

/**
 * The STAGELINK_ variables of the environment the table does not hold, one
 * line each naming the nearest known name; returns how many.
 */
int sl_env_unknown(char *buf, size_t len);

/** Logs sl_env_unknown's lines once per process at WARN, unless
 *  STAGELINK_WARN_UNKNOWN_ENV is off. */
void sl_env_warn_unknown(void);

#endif
