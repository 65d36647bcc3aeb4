/*
 * Test data every tool and test checks against: each byte is a function of
 * the sending stage, the microbatch, the chunk, the direction and the
 * offset, so a byte delivered to the wrong place or the wrong transfer
 * shows.  SPDX-License-Identifier: MIT
 */
#ifndef SL_TOOLS_PATTERN_H
#define SL_TOOLS_PATTERN_H

#include <stddef.h>
#include <stdint.h>

uint64_t sl_pattern_seed(int stage, uint32_t microbatch, uint32_t chunk,
                         int backward);

void sl_pattern_fill(void *buf, size_t offset, size_t len, uint64_t seed);

/**
 * Returns the offset of the first byte in [offset, offset+len) that differs
 * from the pattern, or SIZE_MAX when all match.
 */
size_t sl_pattern_check(const void *buf, size_t offset, size_t len,
                        uint64_t seed);

#endif
