/* SPDX-License-Identifier: MIT */
#include "sl_node.h"
#include "sl_env.h"
#include "sl_hash.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>

/* The kernel's boot id tells apart hosts that share a hostname (cloned
 * images, containers that name themselves alike); empty where unreadable. */
static void sl_node_boot(char boot[9])
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

    boot[0] = '\0';
    if (f != NULL) {
        if (fscanf(f, "%8[0-9a-f]", boot) != 1) {
            boot[0] = '\0';
        }
        fclose(f);
    }
}

sl_status_t sl_node_id(char id[SL_NODE_ID_LEN], sl_errbuf_t *eb)
{
    const char    *override = sl_env_raw(SL_ENV_NODE_ID);
    struct utsname uts;
    struct stat    st;
    char           boot[9], host[SL_NODE_ID_LEN], rest[SL_NODE_ID_LEN];
    size_t         room;

    if (override != NULL) {
        if (strlen(override) >= SL_NODE_ID_LEN) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_NODE_ID=\"%.40s...\" is longer than %d "
                            "characters", override, SL_NODE_ID_LEN - 1);
        }
        snprintf(id, SL_NODE_ID_LEN, "%s", override);
        return STAGELINK_SUCCESS;
    }
    if (uname(&uts) != 0) {
        snprintf(uts.nodename, sizeof(uts.nodename), "unknown");
    }
    sl_node_boot(boot);
    rest[0] = '\0';
    if (boot[0] != '\0') {
        snprintf(rest, sizeof(rest), "/%s", boot);
    }
    if (stat("/proc/self/ns/net", &st) == 0) {
        /* Namespaces on one host are how nodes are simulated. */
        snprintf(rest + strlen(rest), sizeof(rest) - strlen(rest), "/net:%lu",
                 (unsigned long)st.st_ino);
    }
    room = SL_NODE_ID_LEN - 1 - strlen(rest);
    if (strlen(uts.nodename) <= room) {
        snprintf(host, sizeof(host), "%s", uts.nodename);
    } else {
        /* A long FQDN: its head for people, a hash of all of it to tell
         * apart names that differ only past the head. */
        snprintf(host, sizeof(host), "%.*s~%016llx", (int)(room - 17),
                 uts.nodename,
                 (unsigned long long)sl_hash_string(uts.nodename));
    }
    snprintf(id, SL_NODE_ID_LEN, "%s%s", host, rest);
    return STAGELINK_SUCCESS;
}
