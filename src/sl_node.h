/*
 * Node identity: which ranks share a node (and so shared memory and the
 * fast intra-node link).  Hostname alone cannot tell apart network
 * namespaces on one host, which is how nodes are simulated, so the
 * namespace is part of it, and the kernel's boot id tells apart hosts
 * that share a name.  SPDX-License-Identifier: MIT
 */
#ifndef SL_NODE_H
#define SL_NODE_H

#include "sl_error.h"

#define SL_NODE_ID_LEN 64

/** STAGELINK_NODE_ID, else "hostname/boot id/net:[inode]" of this
 *  process (a hostname too long to fit: its head and a hash of it). */
sl_status_t sl_node_id(char id[SL_NODE_ID_LEN], sl_errbuf_t *eb);

#endif
