/* SPDX-License-Identifier: MIT */
#include "sl_shard.h"

sl_status_t sl_shard_check(size_t nbytes, size_t elem_size, sl_errbuf_t *eb)
{
    if (elem_size != 0 && nbytes % elem_size != 0) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "nbytes %zu is not a multiple of elem_size %zu; pass "
                        "the tensor's element size and a whole number of "
                        "elements", nbytes, elem_size);
    }
    return STAGELINK_SUCCESS;
}

sl_shard_t sl_shard_get(size_t nbytes, size_t elem_size, int parts, int index)
{
    size_t     esize = (elem_size == 0) ? 1 : elem_size;
    size_t     nelem = nbytes / esize;
    size_t     q     = nelem / (size_t)parts;
    size_t     r     = nelem % (size_t)parts;
    size_t     i     = (size_t)index;
    sl_shard_t shard;

    shard.offset = (i * q + ((i < r) ? i : r)) * esize;
    shard.length = (q + ((i < r) ? 1 : 0)) * esize;
    return shard;
}
