/* SPDX-License-Identifier: MIT */
#include "sl_topo.h"
#include "sl_env.h"

#include <stdio.h>
#include <string.h>

void sl_topo_locality(const char (*node_ids)[SL_NODE_ID_LEN], int world_size,
                      int rank, sl_locality_t *loc)
{
    int r;

    loc->local_rank = loc->local_size = 0;
    for (r = 0; r < world_size; ++r) {
        if (strcmp(node_ids[r], node_ids[rank]) == 0) {
            loc->local_rank += (r < rank);
            ++loc->local_size;
        }
    }
}

sl_status_t sl_topo_net_devices(const sl_locality_t *loc,
                                char devices[SL_TOPO_DEVICES_LEN],
                                const char **why, sl_errbuf_t *eb)
{
    const char *value = sl_env_raw(SL_ENV_NET_DEVICES);

    (void)loc;
    devices[0] = '\0';
    if (sl_env_raw(SL_ENV_UCX_NET_DEVICES) != NULL) {
        *why = "UCX_NET_DEVICES is set";
        return STAGELINK_SUCCESS;
    }
    if (value == NULL) {
        *why = "no device preference: UCX chooses";
        return STAGELINK_SUCCESS;
    }
    if (strlen(value) >= SL_TOPO_DEVICES_LEN) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "STAGELINK_NET_DEVICES is longer than %d characters",
                        SL_TOPO_DEVICES_LEN - 1);
    }
    snprintf(devices, SL_TOPO_DEVICES_LEN, "%s", value);
    *why = "STAGELINK_NET_DEVICES";
    return STAGELINK_SUCCESS;
}
