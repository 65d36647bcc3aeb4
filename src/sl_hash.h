/*
 * FNV-1a over a string: tells apart names (jobs, hosts); not a secret and
 * not authentication.  SPDX-License-Identifier: MIT
 */
#ifndef SL_HASH_H
#define SL_HASH_H

#include <stdint.h>

static inline uint64_t sl_hash_string(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    uint64_t             h = 0xcbf29ce484222325ull;

    for (; *p != '\0'; ++p) {
        h = (h ^ *p) * 0x100000001b3ull;
    }
    return h;
}

#endif
