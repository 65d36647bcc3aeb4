/*
 * The checks every plugin makes of a transfer before anything is posted,
 * with one set of sentences: arguments, the direction the peer implies,
 * and a tag used twice.  SPDX-License-Identifier: MIT
 */
#ifndef SL_XFER_CHECK_H
#define SL_XFER_CHECK_H

#include "sl_error.h"
#include "sl_layout.h"

/** Sends to the previous stage and receives from the next run backward. */
static inline int sl_xfer_backward(stagelink_op_kind_t kind,
                                   const stagelink_xfer_t *xfer)
{
    return (kind == STAGELINK_OP_SEND) != (xfer->peer == STAGELINK_PEER_NEXT);
}

/** Same kind, direction, microbatch and virtual chunk: one in flight at once. */
static inline int sl_xfer_same_tag(stagelink_op_kind_t kind_a, int backward_a,
                                   stagelink_tag_t a, stagelink_op_kind_t kind_b,
                                   int backward_b, stagelink_tag_t b)
{
    return kind_a == kind_b && backward_a == backward_b &&
           a.microbatch == b.microbatch && a.chunk == b.chunk;
}

/** One transfer against the layout: *backward says its direction. */
sl_status_t sl_xfer_check(const sl_layout_t *layout, stagelink_op_kind_t kind,
                          const stagelink_xfer_t *xfer, int *backward,
                          sl_errbuf_t *eb);

/** No two operations of a batch with the same tag. */
sl_status_t sl_xfer_check_batch(const stagelink_op_t *ops, size_t count,
                                sl_errbuf_t *eb);

/** The sentence of a tag already in flight (STAGELINK_ERR_TAG_IN_USE). */
sl_status_t sl_xfer_tag_in_use(stagelink_op_kind_t kind, int backward,
                               stagelink_tag_t tag, sl_errbuf_t *eb);

#endif
