/* SPDX-License-Identifier: MIT */
#include "sl_abi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `bytes` rounded up to `_type`'s alignment. */
#define SL_ABI_ROUND(_type, _bytes) \
    (((_bytes) + _Alignof(_type) - 1) / _Alignof(_type) * _Alignof(_type))

/* The end of a struct whose last field is `last`, trailing padding in. */
#define SL_ABI_END(_type, _last) \
    SL_ABI_ROUND(_type, offsetof(_type, _last) + sizeof(((_type *)0)->_last))

/* Above this a struct_size is garbage (an uninitialised struct), and its
 * tail is not read. */
#define SL_ABI_MAX_SIZE 4096

/* The v1 baseline of each struct ends at the field named here, whatever is
 * appended later; its smallest published size is `_min`. */
#define SL_ABI_STRUCT(_type, _baseline, _min, _size_at) \
    {#_type, sizeof(_type), (_baseline), (_min), _Alignof(_type), (_size_at)}

#define SL_ABI_XFER_BASELINE SL_ABI_END(stagelink_xfer_t, tag)

/* The original v1 config ended with `flags`; the rest was appended before
 * the baseline, so a host of then still passes a smaller struct_size. */
const sl_abi_struct_t sl_abi_config = SL_ABI_STRUCT(
    stagelink_config_t, SL_ABI_END(stagelink_config_t, device),
    offsetof(stagelink_config_t, store_set), 0);
const sl_abi_struct_t sl_abi_topology = SL_ABI_STRUCT(
    stagelink_topology_t, SL_ABI_END(stagelink_topology_t, tp_ranks),
    SL_ABI_END(stagelink_topology_t, tp_ranks),
    offsetof(stagelink_topology_t, struct_size));
const sl_abi_struct_t sl_abi_xfer = SL_ABI_STRUCT(
    stagelink_xfer_t, SL_ABI_XFER_BASELINE, SL_ABI_XFER_BASELINE,
    offsetof(stagelink_xfer_t, struct_size));
/* An op of the baseline holds a baseline xfer, however the xfer grows. */
const sl_abi_struct_t sl_abi_op = SL_ABI_STRUCT(
    stagelink_op_t,
    SL_ABI_ROUND(stagelink_op_t, offsetof(stagelink_op_t, xfer) + SL_ABI_XFER_BASELINE),
    SL_ABI_ROUND(stagelink_op_t, offsetof(stagelink_op_t, xfer) + SL_ABI_XFER_BASELINE),
    -1);

/* A struct the plugin fills in the host's memory is written whole by the
 * entries of today: it grows only with an entry that takes the host's
 * size.  The tag is part of the xfer's baseline. */
_Static_assert(SL_ABI_END(stagelink_comm_info_t, node_id) ==
                   sizeof(stagelink_comm_info_t),
               "comm_info grew: add an entry that takes the host's size");
_Static_assert(SL_ABI_END(stagelink_counters_t, transfers_completed) ==
                   sizeof(stagelink_counters_t),
               "counters grew: add an entry that takes the host's size");
_Static_assert(sizeof(stagelink_tag_t) == 8, "the tag is fixed at 8 bytes");

/* A host's size for `desc`, 0 read as the baseline, checked before any
 * byte of the struct is. */
static sl_status_t sl_abi_size(const sl_abi_struct_t *desc, size_t *size,
                               sl_errbuf_t *eb)
{
    if (*size == 0) {
        *size = desc->baseline;
    }
    if (*size > SL_ABI_MAX_SIZE) {
        return sl_error(eb, STAGELINK_ERR_ABI,
                        "%s of %zu bytes, more than any struct of the ABI: "
                        "was its size (struct_size, or post_batch_sized's "
                        "op_size) left uninitialised?  Zero the struct and "
                        "give sizeof(%s), or 0", desc->name, *size,
                        desc->name);
    }
    if (*size < desc->min || *size % desc->align != 0) {
        return sl_error(eb, STAGELINK_ERR_ABI,
                        "%s of %zu bytes: the smallest is %zu, in steps of "
                        "%zu; its size (struct_size, or post_batch_sized's "
                        "op_size) is sizeof(%s), or 0 for the v1 baseline",
                        desc->name, *size, desc->min, desc->align,
                        desc->name);
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_abi_copy_in(const sl_abi_struct_t *desc, const void *src,
                           size_t size, void *dst, sl_errbuf_t *eb)
{
    const unsigned char *tail = src;
    size_t               i;
    uint32_t             known = (uint32_t)desc->known;

    SL_CHECK(sl_abi_size(desc, &size, eb));
    for (i = desc->known; i < size; ++i) {
        if (tail[i] != 0) {
            return sl_error(eb, STAGELINK_ERR_ABI,
                            "%s of %zu bytes has byte %zu set, past the %zu "
                            "this plugin knows: a field it would ignore; "
                            "update the plugin, or leave that field zero",
                            desc->name, size, i, desc->known);
        }
    }
    memset(dst, 0, desc->known);
    memcpy(dst, src, (size < desc->known) ? size : desc->known);
    if (desc->size_at >= 0) {
        memcpy((unsigned char *)dst + desc->size_at, &known, sizeof(known));
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_abi_xfer_in(const stagelink_xfer_t *host,
                           stagelink_xfer_t *out, sl_errbuf_t *eb)
{
    return sl_abi_copy_in(&sl_abi_xfer, host, host->struct_size, out, eb);
}

/* One host op: its own size, then its xfer's within it. */
static sl_status_t sl_abi_op_in(const unsigned char *host, size_t op_size,
                                size_t index, stagelink_op_t *out,
                                sl_errbuf_t *eb)
{
    const stagelink_xfer_t *xfer  = (const void *)(host +
                                                   offsetof(stagelink_op_t, xfer));
    size_t                  room  = op_size - offsetof(stagelink_op_t, xfer);
    size_t                  xsize = xfer->struct_size;
    sl_status_t             status;
    char                    why[SL_ERRBUF_LEN];

    if ((xsize != 0 ? xsize : sl_abi_xfer.baseline) > room) {
        return sl_error(eb, STAGELINK_ERR_ABI,
                        "operation %zu of the batch: its xfer's struct_size "
                        "%zu runs past the end of the %zu-byte op (room for "
                        "%zu); pass sizeof(stagelink_op_t) as op_size", index,
                        xsize, op_size, room);
    }
    SL_CHECK_GOTO(sl_abi_copy_in(&sl_abi_op, host, op_size, out, eb), err);
    SL_CHECK_GOTO(sl_abi_copy_in(&sl_abi_xfer, xfer, xsize, &out->xfer, eb),
                  err);
    return STAGELINK_SUCCESS;

err:
    snprintf(why, sizeof(why), "%s", (eb != NULL) ? eb->msg : "");
    return sl_error(eb, status, "operation %zu of the batch: %s", index, why);
}

sl_status_t sl_abi_ops_in(const stagelink_op_t *ops, size_t count,
                          size_t op_size, stagelink_request_t **requests,
                          const stagelink_op_t **ops_out,
                          stagelink_op_t **owned, sl_errbuf_t *eb)
{
    const unsigned char *base = (const void *)ops;
    stagelink_op_t      *copy;
    sl_status_t          status;
    size_t               i;

    *ops_out = ops;
    *owned   = NULL;
    for (i = 0; requests != NULL && i < count; ++i) {
        requests[i] = NULL;
    }
    SL_CHECK(sl_abi_size(&sl_abi_op, &op_size, eb));
    if (count == 0 || ops == NULL) {
        return STAGELINK_SUCCESS;
    }
    /* This build's layout, as a host built with it passes: used in place. */
    for (i = 0; op_size == sizeof(*ops) && i < count &&
                (ops[i].xfer.struct_size == 0 ||
                 ops[i].xfer.struct_size == sizeof(ops[i].xfer));
         ++i) {
    }
    if (i == count) {
        return STAGELINK_SUCCESS;
    }
    copy = calloc(count, sizeof(*copy));
    if (copy == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "post_batch: no memory for %zu operations", count);
    }
    for (i = 0; i < count; ++i) {
        SL_CHECK_GOTO(sl_abi_op_in(base + i * op_size, op_size, i, &copy[i], eb),
                      err_free);
    }
    *ops_out = copy;
    *owned   = copy;
    return STAGELINK_SUCCESS;

err_free:
    free(copy);
    return status;
}
