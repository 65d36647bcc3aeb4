/*
 * Topology: which ranks share a node, and which network devices a rank's
 * inter-node traffic should use.  The device choice is the hook where NIC
 * affinity (the NIC nearest the rank's GPU) plugs in.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TOPO_H
#define SL_TOPO_H

#include "sl_error.h"
#include "sl_node.h"

#define SL_TOPO_DEVICES_LEN 256

typedef struct sl_locality {
    int local_rank;  /**< index among the ranks of this node */
    int local_size;  /**< ranks on this node */
} sl_locality_t;

/** Local rank and size from every rank's node id (world entries). */
void sl_topo_locality(const char (*node_ids)[SL_NODE_ID_LEN], int world_size,
                      int rank, sl_locality_t *loc);

/**
 * UCX device list for this rank's inter-node traffic, or "" to leave the
 * choice to UCX.  UCX_NET_DEVICES set by the user always wins; then
 * STAGELINK_NET_DEVICES.  `why` says which rule decided.
 */
sl_status_t sl_topo_net_devices(const sl_locality_t *loc,
                                char devices[SL_TOPO_DEVICES_LEN],
                                const char **why, sl_errbuf_t *eb);

#endif
