/*
 * Rank, world size and rendezvous address from the launcher that started
 * this process: torchrun, Open MPI's mpirun or Slurm's srun.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_LAUNCHER_H
#define SL_LAUNCHER_H

#include "sl_error.h"

#include <stdint.h>

/** Where init's exchanges meet, in the order auto tries them. */
typedef enum sl_boot_kind {
    SL_BOOT_CALLBACKS,   /**< the host's store or allgather */
    SL_BOOT_TORCH_STORE, /**< torchrun's agent store */
    SL_BOOT_PMIX,        /**< the launcher's PMIx server */
    SL_BOOT_TCP,         /**< stagelink's own rendezvous at rank 0 */
    SL_BOOT_KINDS
} sl_boot_kind_t;

/** STAGELINK_BOOTSTRAP's words, by kind. */
extern const char *const sl_boot_kind_names[SL_BOOT_KINDS + 1];

typedef struct sl_launcher {
    const char *source;     /**< "config", "torchrun", "mpirun", "slurm" */
    sl_boot_kind_t boot;
    char        boot_why[160]; /**< the reason for `boot`, for logs and info */
    int         rank, world_size;
    int         local_rank, local_size; /**< -1 when the launcher says nothing */
    char        addr[256];  /**< rendezvous host */
    char        bind[256];  /**< where rank 0 listens: addr unless set apart */
    int         port;
    uint64_t    job_key;    /**< hash of the job key; 0 when none is set */
    int         pmix_rank;  /**< PMIX_RANK, -1 when unset */
    int         launcher_rank, launcher_size; /**< the launcher's own; -1 without */
} sl_launcher_t;

#define SL_BOOTSTRAP_DEFAULT_PORT 29517

/** The job key of this environment (STAGELINK_JOB_KEY, else the
 *  launcher's job id), hashed; 0 when none is set. */
uint64_t sl_launcher_job_key(void);

/**
 * Fills `out` from the config (when it sets the rank) or the environment,
 * and chooses the bootstrap (STAGELINK_BOOTSTRAP).  An address is needed
 * only for torch-store (the store's) and tcp (the rendezvous's).
 */
sl_status_t sl_launcher_detect(const stagelink_config_t *config,
                               sl_launcher_t *out, sl_errbuf_t *eb);

#endif
