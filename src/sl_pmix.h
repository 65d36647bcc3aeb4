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
 * for the `seq`-th communicator on a launcher's store of this process.
 */
sl_status_t sl_pmix_open(sl_kv_t *kv, int pmix_rank, unsigned seq,
                         double deadline, sl_errbuf_t *eb);

#endif
