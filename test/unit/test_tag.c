/*
 * The tag of ucx_wire.h: a round trip of every class, no two fields
 * aliasing, the control and chunked bits left to framing, and a chunk's
 * sequence number off every field.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "ucx_wire.h"

int main(void)
{
    static const uint32_t mbs[]    = {0, 1, 31, 0xffff, 0x10000, 0xffffffffu};
    static const uint32_t chunks[] = {0, 1, 3, STAGELINK_TAG_MAX_CHUNK};
    static const uint32_t srcs[]   = {0, 1, 7, SL_TAG_MAX_SOURCE};
    uint64_t              seen[3 * 2 * 6 * 4 * 4];
    int                   n = 0, c, b, i, j, k, m;

    for (c = SL_TAG_CLASS_STAGE; c <= SL_TAG_CLASS_FAULT; ++c)
    for (b = 0; b < 2; ++b)
    for (i = 0; i < 6; ++i)
    for (j = 0; j < 4; ++j)
    for (k = 0; k < 4; ++k) {
        sl_tag_fields_t f = {(sl_tag_class_t)c, b, chunks[j], srcs[k], mbs[i]};
        sl_tag_fields_t d;
        uint64_t        tag = sl_tag_encode(&f);

        CHECK((tag & (SL_TAG_HEADER | SL_TAG_CHUNKED)) == 0, "tag 0x%llx sets "
              "a framing bit", (unsigned long long)tag);
        sl_tag_decode(sl_tag_chunk(tag, 0xff) & SL_TAG_MASK_HEADER, &d);
        CHECK(d.cls == f.cls && d.chunk == f.chunk && d.source == f.source,
              "a chunk's sequence number changes class %d chunk %u src %u",
              c, f.chunk, f.source);
        sl_tag_decode(tag, &d);
        CHECK(d.cls == f.cls && d.backward == f.backward &&
              d.chunk == f.chunk && d.source == f.source &&
              d.microbatch == f.microbatch,
              "round trip of class %d dir %d chunk %u src %u mb %u", c, b,
              f.chunk, f.source, f.microbatch);
        for (m = 0; m < n; ++m) {
            CHECK(seen[m] != tag, "tag 0x%llx produced twice",
                  (unsigned long long)tag);
        }
        seen[n++] = tag;
    }
    return check_summary();
}
