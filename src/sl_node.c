/* SPDX-License-Identifier: MIT */
#include "sl_node.h"
#include "sl_env.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

sl_status_t sl_node_id(char id[SL_NODE_ID_LEN], sl_errbuf_t *eb)
{
    const char *override = sl_env_raw(SL_ENV_NODE_ID);
    char        host[48];
    struct stat st;

    if (override != NULL) {
        if (strlen(override) >= SL_NODE_ID_LEN) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_NODE_ID=\"%.40s...\" is longer than %d "
                            "characters", override, SL_NODE_ID_LEN - 1);
        }
        snprintf(id, SL_NODE_ID_LEN, "%s", override);
        return STAGELINK_SUCCESS;
    }
    if (gethostname(host, sizeof(host)) != 0) {
        snprintf(host, sizeof(host), "unknown");
    }
    host[sizeof(host) - 1] = '\0';
    if (stat("/proc/self/ns/net", &st) != 0) {
        /* No namespaces visible: the hostname is all we can tell. */
        snprintf(id, SL_NODE_ID_LEN, "%s", host);
        return STAGELINK_SUCCESS;
    }
    snprintf(id, SL_NODE_ID_LEN, "%s/net:%lu", host, (unsigned long)st.st_ino);
    return STAGELINK_SUCCESS;
}
