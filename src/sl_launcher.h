/*
 * Rank, world size and rendezvous address from the launcher that started
 * this process: torchrun, Open MPI's mpirun or Slurm's srun.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_LAUNCHER_H
#define SL_LAUNCHER_H

#include "sl_error.h"

#include <stdint.h>

typedef struct sl_launcher {
    const char *source;     /**< "config", "torchrun", "mpirun", "slurm" */
    int         rank, world_size;
    int         local_rank, local_size; /**< -1 when the launcher says nothing */
    char        addr[256];  /**< rendezvous host */
    char        bind[256];  /**< where rank 0 listens: addr unless set apart */
    int         port;
    uint64_t    job_key;    /**< hash of the job key; 0 when none is set */
} sl_launcher_t;

#define SL_BOOTSTRAP_DEFAULT_PORT 29517

/** The job key of this environment (STAGELINK_JOB_KEY, else the
 *  launcher's job id), hashed; 0 when none is set. */
uint64_t sl_launcher_job_key(void);

/**
 * Fills `out` from the config (when it sets the rank) or the environment.
 * The rendezvous address is needed only without an allgather or a store.
 */
sl_status_t sl_launcher_detect(const stagelink_config_t *config,
                               sl_launcher_t *out, sl_errbuf_t *eb);

#endif
