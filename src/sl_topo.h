/*
 * Topology: which ranks share a node, what the node holds (GPUs and RDMA
 * NICs with their places in the PCI tree), and which NIC a rank's
 * inter-node traffic should use: the one nearest its GPU, local rank i on
 * rail i on every node.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TOPO_H
#define SL_TOPO_H

#include "sl_error.h"
#include "sl_node.h"

#define SL_TOPO_DEVICES_LEN 256
#define SL_TOPO_MAX_GPUS    64
#define SL_TOPO_MAX_NICS    64
#define SL_TOPO_PATH_LEN    256

typedef struct sl_locality {
    int local_rank;  /**< index among the ranks of this node */
    int local_size;  /**< ranks on this node */
} sl_locality_t;

typedef struct sl_topo_gpu {
    char bdf[16];                    /**< "0000:1b:00.0" */
    char pci_path[SL_TOPO_PATH_LEN]; /**< below /sys/devices; "" unknown */
    int  numa;                       /**< -1 unknown */
} sl_topo_gpu_t;

typedef struct sl_topo_nic {
    char   name[64];                   /**< "mlx5_0" */
    int    port;                       /**< the port used: first active one */
    int    active;                     /**< that port is ACTIVE */
    char   link_layer[16];             /**< "InfiniBand", "Ethernet" */
    char   rate[48];                   /**< "400 Gb/s (4X NDR)" */
    double gbps;
    char   guid[24];                   /**< node GUID, xxxx:xxxx:xxxx:xxxx */
    char   pci_path[SL_TOPO_PATH_LEN];
    int    numa;
    char   skip[160];                  /**< why rails leave it out; "" used */
} sl_topo_nic_t;

typedef struct sl_topo {
    sl_topo_gpu_t gpus[SL_TOPO_MAX_GPUS];
    int           ngpus;
    char          gpu_source[96];  /**< where the GPU list came from */
    sl_topo_nic_t nics[SL_TOPO_MAX_NICS];
    int           nnics;
    char          nic_source[160]; /**< libibverbs, a sysfs tree, or why none */
} sl_topo_t;

/** How near a NIC is to a GPU, nearest first. */
typedef enum sl_topo_dist {
    SL_TOPO_SAME_SWITCH = 0, /**< below one PCIe switch */
    SL_TOPO_SAME_ROOT,       /**< one root port or host bridge */
    SL_TOPO_SAME_NUMA,       /**< one NUMA node (socket) */
    SL_TOPO_CROSS_NUMA,      /**< across sockets, or unknown */
} sl_topo_dist_t;

typedef struct sl_topo_choice {
    int  gpu;                          /**< index in gpus, -1 none */
    int  nic;                          /**< index in nics, -1: UCX chooses */
    int  rail;                         /**< nic's place among the usable
                                            NICs in PCI order, -1 none */
    char devices[SL_TOPO_DEVICES_LEN]; /**< UCX_NET_DEVICES value, "" none */
    char why[256];
} sl_topo_choice_t;

/** Local rank and size from every rank's node id (world entries). */
void sl_topo_locality(const char (*node_ids)[SL_NODE_ID_LEN], int world_size,
                      int rank, sl_locality_t *loc);

/**
 * RDMA devices and their ports: from libibverbs on the real system, from
 * the sysfs tree when STAGELINK_SYSFS_ROOT points at one.  No devices (or
 * ibv_get_device_list failing, ENOSYS without kernel support) is an empty
 * list with the reason in nic_source, never an error.  (sl_nic.c)
 */
void sl_topo_discover_nics(const char *root, sl_topo_t *t);

/** GPUs found in the PCI tree (NVIDIA display/3D controllers), by address.
 *  (sl_gpus.c) */
void sl_topo_discover_gpus(const char *root, sl_topo_t *t);

/** Adds a GPU known by its PCI address (from CUDA): its place from sysfs. */
void sl_topo_gpu_add(sl_topo_t *t, const char *root, const char *bdf);

/**
 * The index in t->gpus of the GPU this rank drives, which CUDA knows by
 * PCI address (`bdf`; NULL or "" none known).  Rails group every GPU of
 * the PCI tree, whatever CUDA_VISIBLE_DEVICES leaves visible, so the tree
 * is read first; a GPU the tree lacks (no /sys/bus/pci in a container) is
 * added by its address.  -1 when no GPU is known.  (sl_gpus.c)
 */
int sl_topo_place_gpu(sl_topo_t *t, const char *root, const char *bdf);

/**
 * Marks the NICs rails leave out (skip): STAGELINK_IB_HCA (default
 * NCCL_IB_HCA) and STAGELINK_NIC_MIN_GBPS.  Fails only on a malformed
 * rate.  (sl_nic_filter.c)
 */
sl_status_t sl_topo_filter_nics(sl_topo_t *t, sl_errbuf_t *eb);

/** STAGELINK_NIC_MIN_GBPS in Gb/s, -1 for auto; a malformed value fails. */
sl_status_t sl_nic_floor(double *gbps, sl_errbuf_t *eb);

sl_topo_dist_t sl_topo_distance(const sl_topo_gpu_t *gpu,
                                const sl_topo_nic_t *nic);
const char    *sl_topo_distance_name(sl_topo_dist_t d);

/**
 * The NIC for the rank that drives GPU `gpu` (-1: none known; then local
 * rank i takes NIC i mod n).  Among the NICs nearest the GPU, the GPUs that
 * share the same nearest set take them in PCI order, so GPU k of a PCIe
 * switch gets NIC k of that switch on every node (rails line up).
 */
void sl_topo_select(const sl_topo_t *t, int gpu, int local_rank,
                    sl_topo_choice_t *c);

/**
 * UCX device list for this rank's inter-node traffic (c->devices), or ""
 * to leave the choice to UCX.  UCX_NET_DEVICES set by the user always
 * wins; then STAGELINK_NET_DEVICES; then the NIC nearest the rank's GPU
 * (the only rule that knows a rail).  c->why says which rule decided.
 */
sl_status_t sl_topo_net_devices(const sl_topo_t *t, int gpu,
                                const sl_locality_t *loc,
                                sl_topo_choice_t *c, sl_errbuf_t *eb);

/**
 * For humans (stagelink_info): the RDMA devices and ports, the GPUs, and
 * the NIC each local rank would get (local rank i on GPU i).  Returns the
 * bytes needed, as snprintf.
 */
size_t sl_topo_report(const sl_topo_t *t, char *buf, size_t len);

#endif
