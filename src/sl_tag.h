/*
 * The 64-bit UCX tag of every stagelink message.  It carries the message
 * class, the direction, the virtual chunk, the sending TP index and the
 * microbatch, so that each receive matches exactly its own send however
 * many transfers are in flight and in whatever order they were posted.
 *
 *   63..60 class | 59 dir | 58..48 chunk | 47..40 chunk sequence |
 *   39..32 source | 31..0 microbatch
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TAG_H
#define SL_TAG_H

#include <stagelink/stagelink.h>

#include <stdint.h>

typedef enum sl_tag_class {
    SL_TAG_CLASS_STAGE  = 1, /**< shard or full tensor across a stage boundary */
    SL_TAG_CLASS_GATHER = 2, /**< shard exchanged inside the TP group */
    SL_TAG_CLASS_FAULT  = 3  /**< "rank F failed", to every neighbour rank
                                  (microbatch field: the sender's rank) */
} sl_tag_class_t;

#define SL_TAG_MASK_ALL   UINT64_MAX
/** The sending TP index: a TP group has at most 256 ranks. */
#define SL_TAG_MAX_SOURCE 0xffu

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
 * message recognised by its content.  Class values (1, 2) leave these bits.
 */
#define SL_TAG_CHUNKED     (1ull << 62)
#define SL_TAG_HEADER      (1ull << 63)
#define SL_TAG_MASK_HEADER (~SL_TAG_HEADER)

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

/* A control message is 16 bytes: a magic, then the sender's length (header)
 * or its stagelink_status_t (notice). */
#define SL_HEADER_MAGIC 0x534c4844524c454eull /* "SLHDRLEN" */
#define SL_NOTICE_MAGIC 0x534c4e4f54494345ull /* "SLNOTICE" */
#define SL_CTL_LEN      16u

typedef struct sl_tag_fields {
    sl_tag_class_t cls;
    int            backward; /**< 0 forward, 1 backward */
    uint32_t       chunk;
    uint32_t       source;
    uint32_t       microbatch;
} sl_tag_fields_t;

uint64_t sl_tag_encode(const sl_tag_fields_t *f);
void     sl_tag_decode(uint64_t tag, sl_tag_fields_t *f);

#endif
