/* Monotonic time and deadlines.  SPDX-License-Identifier: MIT */
#ifndef SL_TIME_H
#define SL_TIME_H

#include <time.h>

static inline double sl_time_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/** Deadline `seconds` from now; 0 seconds means none (infinite). */
static inline double sl_deadline(double seconds)
{
    return (seconds > 0) ? sl_time_now() + seconds : 0.0;
}

/** Milliseconds left before `deadline` for poll(): -1 without one. */
static inline int sl_deadline_ms(double deadline)
{
    double left;

    if (deadline == 0.0) {
        return -1;
    }
    left = deadline - sl_time_now();
    return (left <= 0) ? 0 : (int)(left * 1e3) + 1;
}

/** The earlier of two deadlines (0 = none). */
static inline double sl_deadline_earlier(double a, double b)
{
    return (a == 0.0 || (b != 0.0 && b < a)) ? b : a;
}

/** A blocking nap for a wait with nothing to sleep on (a GPU event, NCCL's
 *  state): *ns from 50 us, doubled each time up to 1 ms. */
static inline void sl_time_nap(long *ns)
{
    struct timespec ts = {0, (*ns > 0) ? *ns : 50000};

    nanosleep(&ts, NULL);
    *ns = (ts.tv_nsec < 1000000) ? ts.tv_nsec * 2 : 1000000;
}

static inline int sl_deadline_passed(double deadline)
{
    return deadline != 0.0 && sl_time_now() >= deadline;
}

#endif
