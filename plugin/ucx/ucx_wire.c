/*
 * The UCX plugin's wire format at work (ucx_wire.h lays it out): the tag's
 * fields, the 16-byte control messages (a length header before a message's chunks, a
 * failure notice in place of data), how a receive tells them from data,
 * and what UCX's status of one operation means in stagelink's terms.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"


#include <string.h>

uint64_t sl_tag_encode(const sl_tag_fields_t *f)
{
    return ((uint64_t)(f->cls & SL_TAG_CLASS_MASK) << SL_TAG_CLASS_SHIFT) |
           ((uint64_t)(f->backward & 1) << SL_TAG_DIR_SHIFT) |
           ((uint64_t)(f->chunk & STAGELINK_TAG_MAX_CHUNK) << SL_TAG_CHUNK_SHIFT) |
           ((uint64_t)(f->source & SL_TAG_MAX_SOURCE) << SL_TAG_SRC_SHIFT) |
           (uint64_t)f->microbatch;
}

void sl_tag_decode(uint64_t tag, sl_tag_fields_t *f)
{
    f->cls        = (sl_tag_class_t)((tag >> SL_TAG_CLASS_SHIFT) &
                                     SL_TAG_CLASS_MASK);
    f->backward   = (int)((tag >> SL_TAG_DIR_SHIFT) & 1);
    f->chunk      = (uint32_t)((tag >> SL_TAG_CHUNK_SHIFT) &
                               STAGELINK_TAG_MAX_CHUNK);
    f->source     = (uint32_t)((tag >> SL_TAG_SRC_SHIFT) & SL_TAG_MAX_SOURCE);
    f->microbatch = (uint32_t)tag;
}

void sl_notice_make(void *msg, sl_status_t status)
{
    const sl_ctl_msg_t notice = {SL_NOTICE_MAGIC, (uint64_t)status};

    memcpy(msg, &notice, sizeof(notice));
}

sl_status_t sl_notice_status(uint64_t value)
{
    /* SUCCESS or an unknown value would hide the failure. */
    return (value == 0 || value == STAGELINK_IN_PROGRESS ||
            value > STAGELINK_ERR_ABANDONED)
               ? STAGELINK_ERR_TRANSPORT : (sl_status_t)value;
}

sl_msg_kind_t sl_msg_classify(uint64_t posted, const ucp_tag_recv_info_t *info,
                              const void *msg, uint64_t *value)
{
    int          ctl = -1; /* unknown: a garbage sender_tag (see ucx_wire.h) */
    sl_ctl_msg_t w;

    if ((info->sender_tag & SL_TAG_MASK_HEADER) == posted) {
        ctl = (info->sender_tag & SL_TAG_HEADER) != 0;
    }
    if (ctl == 0 || info->length != SL_CTL_LEN) {
        return (ctl == 1) ? SL_MSG_BAD : SL_MSG_DATA;
    }
    memcpy(&w, msg, sizeof(w));
    *value = w.value;
    if (w.magic == SL_HEADER_MAGIC) {
        return SL_MSG_HEADER;
    }
    if (w.magic == SL_NOTICE_MAGIC) {
        return SL_MSG_NOTICE;
    }
    return (ctl == 1) ? SL_MSG_BAD : SL_MSG_DATA;
}

sl_status_t sl_wire_status(sl_ucx_peer_t *peer, ucs_status_t ucs,
                           const char *what)
{
    switch (ucs) {
    case UCS_OK:                    return STAGELINK_SUCCESS;
    case UCS_ERR_CANCELED:          return STAGELINK_ERR_CANCELED;
    case UCS_ERR_MESSAGE_TRUNCATED: return STAGELINK_ERR_SIZE_MISMATCH;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_SHMEM_SEGMENT: /* a same-node peer's segment went with it */
        /* Seen on an operation before (or instead of) the endpoint's error
         * callback: the peer is down for every transfer. */
        sl_peer_down(peer, 0, "UCX reported \"%s\" on %s",
                           ucs_status_string(ucs), what);
        return STAGELINK_ERR_PEER_FAILED;
    default:
        return peer->failed ? STAGELINK_ERR_PEER_FAILED
                            : STAGELINK_ERR_TRANSPORT;
    }
}
