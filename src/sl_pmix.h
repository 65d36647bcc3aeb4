/*
 * The bootstrap's store through the launcher's PMIx server (srun
 * --mpi=pmix, Open MPI's mpirun): put and commit this rank's part, get
 * only the named ranks' (a get waits for that rank's commit).  libpmix.so.2
 * is opened at run time, so neither the library nor the wheel links it.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_PMIX_H
#define SL_PMIX_H

#include "sl_kv.h"

/**
 * Joins PMIx as `pmix_rank` (PMIX_RANK, checked against what PMIx says)
 * for the communicator named `comm_id`, the same on every rank and apart
 * from every other communicator of the job: its keys are
 * stagelink.<comm_id>.<key>.
 */
sl_status_t sl_pmix_open(sl_kv_t *kv, int pmix_rank, const char *comm_id,
                         double deadline, sl_errbuf_t *eb);

#endif
