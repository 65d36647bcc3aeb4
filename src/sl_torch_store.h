/*
 * A client of torch's TCPStore (torch >= 2.0's wire protocol): under
 * torchrun the agent hosts the job's store on MASTER_ADDR:MASTER_PORT, so
 * the bootstrap joins it instead of listening on that port itself.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TORCH_STORE_H
#define SL_TORCH_STORE_H

#include "sl_kv.h"

/** TCPStoreBackend.hpp's QueryType (torch 2.x; torch 1.13 numbers otherwise). */
typedef enum sl_torch_query {
    SL_TORCH_VALIDATE   = 0,
    SL_TORCH_SET        = 1,
    SL_TORCH_GET        = 3,
    SL_TORCH_WAIT       = 6,
    SL_TORCH_DELETE_KEY = 8,
    SL_TORCH_PING       = 13
} sl_torch_query_t;

#define SL_TORCH_MAGIC        0x3C85F7CEu /* validationMagicNumber */
#define SL_TORCH_STOP_WAITING 0u          /* WaitResponseType */

/**
 * Connects to the store at host:port and checks it speaks torch 2.x's
 * protocol (a PING answered) before `deadline`; every key this store
 * sets or gets is then `prefix` + key.
 */
sl_status_t sl_torch_store_open(sl_kv_t *kv, const char *host, int port,
                                const char *prefix, double deadline,
                                sl_errbuf_t *eb);

#endif
