/*
 * How a plugin takes the structs a host passes in, by the growth rule of
 * stagelink.h ("Growing the ABI"): struct_size 0 is the v1 baseline, a
 * smaller struct reads as zeros past its end, a larger one is taken only
 * when its unknown tail is zero.  SPDX-License-Identifier: MIT
 */
#ifndef SL_ABI_H
#define SL_ABI_H

#include "sl_error.h"

#include <stddef.h>

/** What a plugin knows of one struct passed in. */
typedef struct sl_abi_struct {
    const char *name;     /* "stagelink_xfer_t", for the sentences */
    size_t      known;    /* sizeof in this build */
    size_t      baseline; /* the v1 layout: what struct_size 0 means */
    size_t      min;      /* the smallest host struct ever published */
    size_t      align;
    ptrdiff_t   size_at;  /* offset of its uint32_t struct_size; -1: none (an op) */
} sl_abi_struct_t;

extern const sl_abi_struct_t sl_abi_config, sl_abi_topology, sl_abi_xfer,
    sl_abi_op;

/**
 * Copies the host's struct at `src`, `size` bytes (0: the baseline), into
 * `dst` (desc->known bytes), zero past the host's end, and sets dst's
 * struct_size, where it has one, to desc->known.  STAGELINK_ERR_ABI for a
 * size below desc->min or not a whole number of fields, or a non-zero
 * byte past desc->known.
 */
sl_status_t sl_abi_copy_in(const sl_abi_struct_t *desc, const void *src,
                           size_t size, void *dst, sl_errbuf_t *eb);

/** A transfer descriptor (not NULL) by its own struct_size. */
sl_status_t sl_abi_xfer_in(const stagelink_xfer_t *host,
                           stagelink_xfer_t *out, sl_errbuf_t *eb);

/**
 * `count` ops `op_size` bytes apart (0: the baseline's), as this build's
 * stagelink_op_t array: *ops_out is the host's own array where its layout
 * is this build's, else a copy in *owned (free() it after the post).
 * Every request is NULL first, so a refused batch says so in them too.
 */
sl_status_t sl_abi_ops_in(const stagelink_op_t *ops, size_t count,
                          size_t op_size, stagelink_request_t **requests,
                          const stagelink_op_t **ops_out,
                          stagelink_op_t **owned, sl_errbuf_t *eb);

#endif
