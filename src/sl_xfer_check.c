/* SPDX-License-Identifier: MIT */
#include "sl_xfer_check.h"

#include "sl_shard.h"

static const char *sl_xfer_op(stagelink_op_kind_t kind)
{
    return (kind == STAGELINK_OP_SEND) ? "send" : "receive";
}

sl_status_t sl_xfer_check(const sl_layout_t *layout, stagelink_op_kind_t kind,
                          const stagelink_xfer_t *xfer, int *backward,
                          sl_errbuf_t *eb)
{
    const char *op = sl_xfer_op(kind);
    int         to_next;

    if (xfer == NULL) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "%s: the transfer descriptor is NULL", op);
    }
    if (kind != STAGELINK_OP_SEND && kind != STAGELINK_OP_RECV) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "operation kind %d is neither STAGELINK_OP_SEND nor "
                        "STAGELINK_OP_RECV", (int)kind);
    }
    if (xfer->peer != STAGELINK_PEER_NEXT && xfer->peer != STAGELINK_PEER_PREV) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "%s: peer %d is neither STAGELINK_PEER_NEXT nor "
                        "STAGELINK_PEER_PREV", op, (int)xfer->peer);
    }
    to_next = (xfer->peer == STAGELINK_PEER_NEXT);
    if ((to_next ? layout->next_rank : layout->prev_rank) < 0) {
        return sl_error(eb, STAGELINK_ERR_NO_PEER,
                        "%s %s stage: rank %d is the %s pipeline stage", op,
                        to_next ? "to/from the next" : "to/from the previous",
                        layout->rank, to_next ? "last" : "first");
    }
    if (xfer->buf == NULL && xfer->nbytes > 0) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "%s of %zu bytes with a NULL buffer", op, xfer->nbytes);
    }
    SL_CHECK(sl_shard_check(xfer->nbytes, xfer->elem_size, eb));
    if (xfer->tag.chunk > STAGELINK_TAG_MAX_CHUNK || xfer->tag.reserved != 0) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "%s: tag chunk %u exceeds %u or reserved field is %u "
                        "(must be 0)", op, xfer->tag.chunk,
                        STAGELINK_TAG_MAX_CHUNK, xfer->tag.reserved);
    }
    *backward = sl_xfer_backward(kind, xfer);
    if (xfer->tag.direction > STAGELINK_DIR_BACKWARD ||
        (xfer->tag.direction != STAGELINK_DIR_AUTO &&
         (xfer->tag.direction == STAGELINK_DIR_BACKWARD) != *backward)) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG,
                        "%s to %s stage: tag direction %u contradicts the "
                        "peer (a %s transfer); use STAGELINK_DIR_AUTO", op,
                        to_next ? "next" : "previous", xfer->tag.direction,
                        *backward ? "backward" : "forward");
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_xfer_check_batch(const stagelink_op_t *ops, size_t count,
                                sl_errbuf_t *eb)
{
    size_t i, j;

    for (i = 0; i < count; ++i) {
        for (j = 0; j < i; ++j) {
            if (sl_xfer_same_tag(ops[j].kind,
                                 sl_xfer_backward(ops[j].kind, &ops[j].xfer),
                                 ops[j].xfer.tag, ops[i].kind,
                                 sl_xfer_backward(ops[i].kind, &ops[i].xfer),
                                 ops[i].xfer.tag)) {
                return sl_error(eb, STAGELINK_ERR_TAG_IN_USE,
                                "operations %zu and %zu of the batch are both "
                                "a %s %s with microbatch %u chunk %u; a tag "
                                "can be in flight only once; nothing of the "
                                "batch was posted", j, i,
                                sl_xfer_backward(ops[i].kind, &ops[i].xfer)
                                    ? "backward" : "forward",
                                sl_xfer_op(ops[i].kind),
                                ops[i].xfer.tag.microbatch,
                                ops[i].xfer.tag.chunk);
            }
        }
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_xfer_tag_in_use(stagelink_op_kind_t kind, int backward,
                               stagelink_tag_t tag, sl_errbuf_t *eb)
{
    return sl_error(eb, STAGELINK_ERR_TAG_IN_USE,
                    "a %s %s with microbatch %u chunk %u is already in "
                    "flight; complete it before reusing the tag",
                    backward ? "backward" : "forward", sl_xfer_op(kind),
                    tag.microbatch, tag.chunk);
}
