/*
 * Logging in NCCL's manner: STAGELINK_DEBUG picks the level,
 * STAGELINK_DEBUG_SUBSYS the subsystems; every line carries host, pid and
 * rank.  The bottom of the stack: it reads no variable and calls nothing
 * of stagelink's.  SPDX-License-Identifier: MIT
 */
#ifndef SL_LOG_H
#define SL_LOG_H

typedef enum sl_log_level {
    SL_LOG_NONE  = 0,
    SL_LOG_WARN  = 1,
    SL_LOG_INFO  = 2,
    SL_LOG_TRACE = 3
} sl_log_level_t;

typedef enum sl_subsys {
    SL_SUBSYS_INIT   = 1u << 0,
    SL_SUBSYS_BOOT   = 1u << 1,
    SL_SUBSYS_NET    = 1u << 2,
    SL_SUBSYS_GATHER = 1u << 3,
    SL_SUBSYS_ENV    = 1u << 4,
    SL_SUBSYS_ALL    = 0xffffu
} sl_subsys_t;


/** Sets the level and subsystems in force (sl_settings_log reads them
 *  from STAGELINK_DEBUG and STAGELINK_DEBUG_SUBSYS). */
void sl_log_configure(sl_log_level_t level, unsigned mask);

/** Level in force: WARN until configured. */
sl_log_level_t sl_log_level(void);

/** Rank shown in the prefix of this process's lines; -1 before init. */
void sl_log_set_rank(int rank);

void sl_log_write(sl_log_level_t level, unsigned subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define sl_log(_level, _subsys, ...) \
    do { \
        if ((_level) <= sl_log_level()) { \
            sl_log_write((_level), (_subsys), __VA_ARGS__); \
        } \
    } while (0)

#define SL_WARN(_subsys, ...)  sl_log(SL_LOG_WARN, _subsys, __VA_ARGS__)
#define SL_INFO(_subsys, ...)  sl_log(SL_LOG_INFO, _subsys, __VA_ARGS__)
#define SL_TRACE(_subsys, ...) sl_log(SL_LOG_TRACE, _subsys, __VA_ARGS__)

#endif
