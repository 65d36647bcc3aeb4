/* SPDX-License-Identifier: MIT */
#include "sl_tag.h"

uint64_t sl_tag_encode(const sl_tag_fields_t *f)
{
    return ((uint64_t)(f->cls & 0xf) << 60) |
           ((uint64_t)(f->backward & 1) << 59) |
           ((uint64_t)(f->chunk & STAGELINK_TAG_MAX_CHUNK) << 48) |
           ((uint64_t)(f->source & SL_TAG_MAX_SOURCE) << 32) |
           (uint64_t)f->microbatch;
}

void sl_tag_decode(uint64_t tag, sl_tag_fields_t *f)
{
    f->cls        = (sl_tag_class_t)((tag >> 60) & 0xf);
    f->backward   = (int)((tag >> 59) & 1);
    f->chunk      = (uint32_t)((tag >> 48) & STAGELINK_TAG_MAX_CHUNK);
    f->source     = (uint32_t)((tag >> 32) & SL_TAG_MAX_SOURCE);
    f->microbatch = (uint32_t)tag;
}
