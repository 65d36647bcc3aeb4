/* Shard arithmetic over many (nbytes, t, element size).  SPDX-License-Identifier: MIT */
#include "check.h"
#include "sl_shard.h"

int main(void)
{
    static const size_t sizes[] = {0, 1, 2, 3, 5, 7, 8, 63, 64, 65, 4095, 4096,
                                   4097, 65535, 1 << 20, (1 << 20) + 6,
                                   ((size_t)48 << 20), ((size_t)48 << 20) + 12};
    static const size_t esizes[] = {0, 1, 2, 4, 8, 12};
    sl_errbuf_t         eb;
    size_t              si, ei;
    int                 t, i;

    for (si = 0; si < sizeof(sizes) / sizeof(sizes[0]); ++si) {
        for (ei = 0; ei < sizeof(esizes) / sizeof(esizes[0]); ++ei) {
            size_t n = sizes[si], e = esizes[ei], es = e ? e : 1;

            if (n % es != 0) {
                CHECK(sl_shard_check(n, e, &eb) == STAGELINK_ERR_INVALID_ARG,
                      "nbytes %zu elem %zu must be refused", n, e);
                continue;
            }
            CHECK(sl_shard_check(n, e, &eb) == STAGELINK_SUCCESS,
                  "nbytes %zu elem %zu refused: %s", n, e, eb.msg);
            for (t = 1; t <= 9; ++t) {
                size_t next = 0, minl = (size_t)-1, maxl = 0;

                for (i = 0; i < t; ++i) {
                    sl_shard_t s = sl_shard_get(n, e, t, i);

                    CHECK(s.offset == next, "n %zu e %zu t %d shard %d at %zu,"
                          " expected %zu", n, e, t, i, s.offset, next);
                    CHECK(s.offset % es == 0 && s.length % es == 0,
                          "n %zu e %zu t %d shard %d [%zu,+%zu) splits an "
                          "element", n, e, t, i, s.offset, s.length);
                    next = s.offset + s.length;
                    minl = (s.length < minl) ? s.length : minl;
                    maxl = (s.length > maxl) ? s.length : maxl;
                }
                CHECK(next == n, "n %zu e %zu t %d: shards cover %zu", n, e, t,
                      next);
                CHECK(maxl - minl <= es, "n %zu e %zu t %d: shard sizes %zu..%zu"
                      " differ by more than one element", n, e, t, minl, maxl);
            }
        }
    }
    /* Megatron's example: 48 MiB over t = 8 is 6 MiB each. */
    CHECK(sl_shard_get((size_t)48 << 20, 2, 8, 7).length == ((size_t)6 << 20),
          "48 MiB / 8 is not 6 MiB");
    CHECK(sl_shard_get((size_t)48 << 20, 2, 8, 7).offset == ((size_t)42 << 20),
          "shard 7 of 48 MiB does not start at 42 MiB");
    return check_summary();
}
