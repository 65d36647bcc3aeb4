/* The one logger.  SPDX-License-Identifier: MIT */
#include "sl_log.h"
#include "sl_env.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static pthread_once_t sl_log_once = PTHREAD_ONCE_INIT;
static sl_log_level_t sl_log_current_level;
static unsigned       sl_log_subsys_mask;
/* Per thread: a process may drive several communicators, one a thread. */
static _Thread_local int sl_log_rank = -1;
static char           sl_log_host[64];

static const char *const sl_log_levels[] = {"NONE", "WARN", "INFO", "TRACE",
                                            NULL};
static const struct {
    const char *name;
    unsigned    bit;
} sl_log_subsys_names[] = {
    {"INIT", SL_SUBSYS_INIT},     {"BOOT", SL_SUBSYS_BOOT},
    {"NET", SL_SUBSYS_NET},       {"GATHER", SL_SUBSYS_GATHER},
    {"ENV", SL_SUBSYS_ENV},       {"ALL", SL_SUBSYS_ALL},
};

sl_status_t sl_log_parse_env(sl_log_level_t *level, unsigned *mask,
                             sl_errbuf_t *eb)
{
    char   list[256];
    char  *save = NULL, *item;
    size_t i;
    int    choice;

    SL_CHECK(sl_env_parse_choice(SL_ENV_DEBUG, sl_log_levels, &choice, eb));
    *level = (sl_log_level_t)choice;
    *mask  = 0;
    snprintf(list, sizeof(list), "%s", sl_env_get(SL_ENV_DEBUG_SUBSYS));
    for (item = strtok_r(list, ",", &save); item != NULL;
         item = strtok_r(NULL, ",", &save)) {
        for (i = 0; i < SL_ARRAY_SIZE(sl_log_subsys_names); ++i) {
            if (strcasecmp(item, sl_log_subsys_names[i].name) == 0) {
                break;
            }
        }
        if (i == SL_ARRAY_SIZE(sl_log_subsys_names)) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_DEBUG_SUBSYS names \"%s\"; use a comma "
                            "list of INIT, BOOT, NET, GATHER, ENV or ALL", item);
        }
        *mask |= sl_log_subsys_names[i].bit;
    }
    if (*mask == 0) {
        *mask = SL_SUBSYS_ALL;
    }
    return STAGELINK_SUCCESS;
}

static void sl_log_init(void)
{
    sl_errbuf_t ignored;

    /* Bad values fall back to the defaults here (errors must still show);
     * comm_init refuses them with sl_log_parse_env. */
    if (sl_log_parse_env(&sl_log_current_level, &sl_log_subsys_mask,
                         &ignored) != STAGELINK_SUCCESS) {
        sl_log_current_level = SL_LOG_WARN;
        sl_log_subsys_mask   = SL_SUBSYS_ALL;
    }
    if (gethostname(sl_log_host, sizeof(sl_log_host)) != 0) {
        snprintf(sl_log_host, sizeof(sl_log_host), "unknown");
    }
    sl_log_host[sizeof(sl_log_host) - 1] = '\0';
}

sl_log_level_t sl_log_level(void)
{
    pthread_once(&sl_log_once, sl_log_init);
    return sl_log_current_level;
}

void sl_log_set_rank(int rank)
{
    __atomic_store_n(&sl_log_rank, rank, __ATOMIC_RELAXED);
}

void sl_log_write(sl_log_level_t level, unsigned subsys, const char *fmt, ...)
{
    static const char *const names[] = {"NONE", "WARN", "INFO", "TRACE"};
    char                     line[1024];
    int                      used;
    va_list                  ap;

    if ((level != SL_LOG_WARN) && !(subsys & sl_log_subsys_mask)) {
        return;
    }
    used = snprintf(line, sizeof(line), "%s:%d [%d] STAGELINK %s ",
                    sl_log_host, (int)getpid(),
                    __atomic_load_n(&sl_log_rank, __ATOMIC_RELAXED),
                    names[level]);
    va_start(ap, fmt);
    vsnprintf(line + used, sizeof(line) - (size_t)used, fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines of different ranks apart. */
    fprintf(stderr, "%s\n", line);
}
