/*
 * The smallest test harness that says what failed: CHECK records and goes
 * on; check_summary() prints "N passed, N failed" and gives the exit code,
 * which is a failure too when nothing was checked (a test that checked
 * nothing has shown nothing).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TEST_CHECK_H
#define SL_TEST_CHECK_H

#include <stdio.h>

static int check_passed, check_failed;

#define CHECK(_cond, ...) \
    do { \
        if (_cond) { \
            ++check_passed; \
        } else { \
            ++check_failed; \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, \
                    #_cond); \
            fprintf(stderr, __VA_ARGS__); \
            fputc('\n', stderr); \
        } \
    } while (0)

static inline int check_summary(void)
{
    printf("%d passed, %d failed\n", check_passed, check_failed);
    if (check_passed + check_failed == 0) {
        fprintf(stderr, "no CHECK ran: this test checked nothing\n");
        return 1;
    }
    return check_failed ? 1 : 0;
}

#endif
