/*
 * The wire format of the UCX plugin beside the tag (src/sl_tag.h): the
 * 16-byte control messages (a length header before a message's chunks, a
 * failure notice in place of data), how a receive tells them from data,
 * and what UCX's status of one operation means in stagelink's terms.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_tag.h"

#include <string.h>

void sl_notice_make(uint64_t msg[2], sl_status_t status)
{
    msg[0] = SL_NOTICE_MAGIC;
    msg[1] = (uint64_t)status;
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
    int      ctl = -1; /* unknown: a garbage sender_tag (see sl_tag.h) */
    uint64_t w[2];

    if ((info->sender_tag & SL_TAG_MASK_HEADER) == posted) {
        ctl = (info->sender_tag & SL_TAG_HEADER) != 0;
    }
    if (ctl == 0 || info->length != SL_CTL_LEN) {
        return (ctl == 1) ? SL_MSG_BAD : SL_MSG_DATA;
    }
    memcpy(w, msg, sizeof(w));
    *value = w[1];
    if (w[0] == SL_HEADER_MAGIC) {
        return SL_MSG_HEADER;
    }
    if (w[0] == SL_NOTICE_MAGIC) {
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
