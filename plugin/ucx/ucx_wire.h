/*
 * The UCX plugin's wire format, in one place: what ranks must share to
 * talk (SL_WIRE_VERSION, checked at connect), the card each rank
 * publishes there, the 64-bit tag of every message, and the messages that
 * are not tensor bytes.  A change to anything here changes
 * SL_WIRE_VERSION, so that ranks of two versions fail init naming both
 * instead of misreading each other.
 *
 * The tag:
 *
 *   63 control | 62 chunked | 61..60 class | 59 direction |
 *   58..48 virtual chunk | 47..40 chunk sequence | 39..32 source TP index |
 *   31..0 microbatch
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_WIRE_H
#define SL_UCX_WIRE_H

#include "sl_topo.h"

#include <stagelink/stagelink.h>

#include <stdint.h>

#define SL_WIRE_VERSION 4u

/* A rank's part of the address exchange: this card, then its worker
 * addresses (full_len bytes, net_len bytes, then local_len bytes). */
typedef struct sl_rank_card {
    uint32_t version;  /**< SL_WIRE_VERSION */
    uint32_t full_len; /**< worker address with every transport */
    uint32_t net_len;  /**< network-only worker address */
    uint32_t local_len; /**< same-node worker's address, 0 when none */
    uint32_t direct;   /**< sl_device_all_direct */
    int32_t  rail;     /**< its NIC's rail, -1 unknown */
    char     nic[SL_TOPO_DEVICES_LEN]; /**< that NIC, "" UCX chose */
} sl_rank_card_t;

_Static_assert(sizeof(sl_rank_card_t) == 6 * 4 + SL_TOPO_DEVICES_LEN,
               "the rank card has no padding: its bytes are the wire's");

typedef enum sl_tag_class {
    SL_TAG_CLASS_HELLO  = 0, /**< init's hello over each endpoint, control
                                  (microbatch field: the sender's rank) */
    SL_TAG_CLASS_STAGE  = 1, /**< shard or full tensor across a stage boundary */
    SL_TAG_CLASS_GATHER = 2, /**< shard or status exchanged inside the TP group */
    SL_TAG_CLASS_FAULT  = 3  /**< "rank F failed", to every neighbour rank
                                  (microbatch field: the sender's rank) */
} sl_tag_class_t;

#define SL_TAG_CLASS_SHIFT 60
#define SL_TAG_CLASS_MASK  0x3ull
#define SL_TAG_DIR_SHIFT   59
#define SL_TAG_CHUNK_SHIFT 48 /* STAGELINK_TAG_MAX_CHUNK: 11 bits */
#define SL_TAG_SRC_SHIFT   32
#define SL_TAG_MASK_ALL    UINT64_MAX
/** The sending TP index: a TP group has at most 256 ranks. */
#define SL_TAG_MAX_SOURCE  0xffu

/*
 * A message above the chunk size goes framed: a header carrying the
 * sender's length (tag | SL_TAG_HEADER), then chunks (tag | SL_TAG_CHUNKED).
 * SL_TAG_HEADER marks every control message: a length header, or a
 * failure notice, which a sender that gave up sends in place of its
 * message (or of each chunk it has not sent) so that the receiver fails at
 * once with the root cause.  Receives match with SL_TAG_MASK_HEADER so that
 * they meet either, and tell them from data by the sender's tag in the
 * completion.  UCX 1.13 sometimes reports a garbage sender_tag there (seen:
 * 0x7f6f81ff2dd0, on a receive matched during progress), recognisable
 * because its other bits differ from the posted tag; only then is a control
 * message recognised by its content.
 */
#define SL_TAG_CHUNKED     (1ull << 62)
#define SL_TAG_HEADER      (1ull << 63)
#define SL_TAG_MASK_HEADER (~SL_TAG_HEADER)

_Static_assert(((SL_TAG_CLASS_MASK << SL_TAG_CLASS_SHIFT) &
                (SL_TAG_CHUNKED | SL_TAG_HEADER)) == 0,
               "the class bits leave the chunked and control bits free");
_Static_assert(((uint64_t)STAGELINK_TAG_MAX_CHUNK << SL_TAG_CHUNK_SHIFT) >>
                   SL_TAG_DIR_SHIFT == 0,
               "the virtual chunk stays below the direction bit");

/*
 * Each chunk carries its number modulo 256, so that a receive takes exactly
 * its own chunk: UCX 1.13 over TCP matched the chunks of one message out of
 * order (seen: taken 0, 4, 1, 5, 6, 2, 7, 8, 3 with four receives posted,
 * stagelink_stress seed 667193401861 over two namespaces).  At most
 * STAGELINK_STAGING_BUFFERS (<= 64) chunks of a message are in flight, so
 * the numbers of those posted never repeat.
 */
#define SL_TAG_SEQ_SHIFT 40
#define SL_TAG_SEQ_MASK  0xffull

static inline uint64_t sl_tag_chunk(uint64_t tag, uint64_t index)
{
    return tag | SL_TAG_CHUNKED |
           ((index & SL_TAG_SEQ_MASK) << SL_TAG_SEQ_SHIFT);
}

typedef struct sl_tag_fields {
    sl_tag_class_t cls;
    int            backward; /**< 0 forward, 1 backward */
    uint32_t       chunk;
    uint32_t       source;
    uint32_t       microbatch;
} sl_tag_fields_t;

uint64_t sl_tag_encode(const sl_tag_fields_t *f);
void     sl_tag_decode(uint64_t tag, sl_tag_fields_t *f);

/* A control message: a magic, then the sender's length (header), its
 * stagelink_status_t (notice), the failed rank (fault report) or the
 * sender's rank (hello). */
typedef struct sl_ctl_msg {
    uint64_t magic;
    uint64_t value;
} sl_ctl_msg_t;

#define SL_HEADER_MAGIC 0x534c4844524c454eull /* "SLHDRLEN" */
#define SL_NOTICE_MAGIC 0x534c4e4f54494345ull /* "SLNOTICE" */
#define SL_FAULT_MAGIC  0x534c4641494c4544ull /* "SLFAILED" */
#define SL_HELLO_MAGIC  0x534c48454c4c4f21ull /* "SLHELLO!" */
#define SL_CTL_LEN      16u

_Static_assert(sizeof(sl_ctl_msg_t) == SL_CTL_LEN,
               "a control message is 16 bytes on the wire");

/* A TP peer's shard status (class GATHER, the tag of its shard): this
 * byte, or a notice in its place. */
#define SL_STATUS_ARRIVED 1u

#endif
