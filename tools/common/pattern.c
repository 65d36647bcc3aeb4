/* SPDX-License-Identifier: MIT */
#include "pattern.h"

#include <string.h>

static uint64_t sl_mix(uint64_t x)
{
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 29;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 32;
    return x;
}

uint64_t sl_pattern_seed(int stage, uint32_t microbatch, uint32_t chunk,
                         int backward)
{
    return sl_mix(((uint64_t)(uint32_t)stage << 40) ^
                  ((uint64_t)microbatch << 8) ^ ((uint64_t)chunk << 52) ^
                  (uint64_t)(backward ? 0x5a : 0xa5));
}

/* The word holding byte `off`: bytes are positioned by absolute offset. */
static uint64_t sl_pattern_word(uint64_t seed, size_t word)
{
    return sl_mix(seed + (uint64_t)word * 0x9e3779b97f4a7c15ull);
}

void sl_pattern_fill(void *buf, size_t offset, size_t len, uint64_t seed)
{
    unsigned char *p   = (unsigned char *)buf + offset;
    size_t         off = offset, end = offset + len;
    uint64_t       w;

    while (off < end && (off & 7) != 0) {
        w        = sl_pattern_word(seed, off >> 3);
        *p++     = (unsigned char)(w >> ((off & 7) * 8));
        ++off;
    }
    for (; off + 8 <= end; off += 8, p += 8) {
        w = sl_pattern_word(seed, off >> 3);
        memcpy(p, &w, 8); /* little-endian: byte k of the word at off + k */
    }
    for (; off < end; ++off) {
        w    = sl_pattern_word(seed, off >> 3);
        *p++ = (unsigned char)(w >> ((off & 7) * 8));
    }
}

size_t sl_pattern_check(const void *buf, size_t offset, size_t len,
                        uint64_t seed)
{
    const unsigned char *p   = (const unsigned char *)buf + offset;
    size_t               off = offset, end = offset + len;
    uint64_t             w;

    for (; off < end; ++off, ++p) {
        if ((off & 7) == 0 && off + 8 <= end) {
            w = sl_pattern_word(seed, off >> 3);
            if (memcmp(p, &w, 8) == 0) {
                off += 7;
                p   += 7;
                continue;
            }
        }
        w = sl_pattern_word(seed, off >> 3);
        if (*p != (unsigned char)(w >> ((off & 7) * 8))) {
            return off;
        }
    }
    return SIZE_MAX;
}
