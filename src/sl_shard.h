/*
 * Shard arithmetic: which bytes of a tensor each of t TP ranks owns.
 * Shards are contiguous, on element boundaries, and differ in size by at
 * most one element (the first nelem % t shards get the extra one), so any
 * nbytes works, not only multiples of t.  SPDX-License-Identifier: MIT
 */
#ifndef SL_SHARD_H
#define SL_SHARD_H

#include "sl_error.h"

#include <stddef.h>

typedef struct sl_shard {
    size_t offset;
    size_t length;
} sl_shard_t;

/** Checks nbytes against elem_size (0 means 1); errors name both values. */
sl_status_t sl_shard_check(size_t nbytes, size_t elem_size, sl_errbuf_t *eb);

/** Shard `index` of `parts` of a valid (nbytes, elem_size). */
sl_shard_t sl_shard_get(size_t nbytes, size_t elem_size, int parts, int index);

#endif
