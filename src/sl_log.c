/* The one logger.  SPDX-License-Identifier: MIT */
#include "sl_log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* WARN and every subsystem until the settings configure it: the logger
 * reads no variable itself, so nothing it logs can call back into the
 * parser that reports through it. */
static sl_log_level_t sl_log_current_level = SL_LOG_WARN;
static unsigned       sl_log_subsys_mask   = SL_SUBSYS_ALL;
/* Per thread: a process may drive several communicators, one a thread. */
static _Thread_local int sl_log_rank = -1;

void sl_log_configure(sl_log_level_t level, unsigned mask)
{
    __atomic_store_n(&sl_log_subsys_mask, mask, __ATOMIC_RELAXED);
    __atomic_store_n(&sl_log_current_level, level, __ATOMIC_RELAXED);
}

sl_log_level_t sl_log_level(void)
{
    return __atomic_load_n(&sl_log_current_level, __ATOMIC_RELAXED);
}

void sl_log_set_rank(int rank)
{
    __atomic_store_n(&sl_log_rank, rank, __ATOMIC_RELAXED);
}

void sl_log_write(sl_log_level_t level, unsigned subsys, const char *fmt, ...)
{
    static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char                     line[1024], host[64];
    int                      used;
    va_list                  ap;

    if ((level != SL_LOG_WARN) &&
        !(subsys & __atomic_load_n(&sl_log_subsys_mask, __ATOMIC_RELAXED))) {
        return;
    }
    if (gethostname(host, sizeof(host)) != 0) {
        snprintf(host, sizeof(host), "unknown");
    }
    host[sizeof(host) - 1] = '\0';
    used = snprintf(line, sizeof(line), "%s:%d [%d] STAGELINK %s ",
                    host, (int)getpid(),
                    __atomic_load_n(&sl_log_rank, __ATOMIC_RELAXED),
                    names[level]);
    va_start(ap, fmt);
    vsnprintf(line + used, sizeof(line) - (size_t)used, fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines of different ranks apart. */
    fprintf(stderr, "%s\n", line);
}
