/*
 * RDMA devices (NICs) and their ports.  On the real system libibverbs
 * lists them and tells port state, link layer, speed and width; sysfs
 * tells where each sits in the PCI tree.  Under STAGELINK_SYSFS_ROOT the
 * same facts come from the fake tree's /sys/class/infiniband, where
 * rdma-core's kernel side publishes them, since libibverbs cannot be
 * pointed at a fake tree.  SPDX-License-Identifier: MIT
 */
#include "sl_topo.h"
#include "sl_sysfs.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if SL_HAVE_VERBS
#include <endian.h>
#include <infiniband/verbs.h>
#endif

/* Where a device sits, whichever source listed it. */
static void sl_nic_place(const char *root, sl_topo_nic_t *nic)
{
    char link[160];
    long numa;

    snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", nic->name);
    if (!sl_sysfs_pci_path(root, link, nic->pci_path, sizeof(nic->pci_path))) {
        nic->pci_path[0] = '\0';
    }
    snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device/numa_node",
             nic->name);
    nic->numa = sl_sysfs_read_long(root, link, &numa) ? (int)numa : -1;
}

static int sl_name_cmp(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* Sorted names of a directory's entries (not . and ..); their count. */
static int sl_dir_names(const char *path, char (*names)[64], int max)
{
    DIR           *d = opendir(path);
    struct dirent *e;
    int            n = 0;

    while (d != NULL && n < max && (e = readdir(d)) != NULL) {
        if (e->d_name[0] != '.') {
            snprintf(names[n++], 64, "%.63s", e->d_name);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    qsort(names, (size_t)n, sizeof(*names), sl_name_cmp);
    return n;
}

static void sl_nics_from_sysfs(const char *root, sl_topo_t *t)
{
    char names[SL_TOPO_MAX_NICS][64], ports[16][64], dir[512], path[512];
    char state[32];
    int  n, i, np, p;

    snprintf(dir, sizeof(dir), "%s/sys/class/infiniband", root);
    n = sl_dir_names(dir, names, SL_TOPO_MAX_NICS);
    for (i = 0; i < n; ++i) {
        sl_topo_nic_t *nic = &t->nics[t->nnics];

        memset(nic, 0, sizeof(*nic));
        snprintf(nic->name, sizeof(nic->name), "%.63s", names[i]);
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/node_guid",
                 nic->name);
        sl_sysfs_read(root, path, nic->guid, sizeof(nic->guid));
        snprintf(dir, sizeof(dir), "%s/sys/class/infiniband/%s/ports", root,
                 nic->name);
        np = sl_dir_names(dir, ports, 16);
        for (p = 0; p < np; ++p) {
            snprintf(path, sizeof(path),
                     "/sys/class/infiniband/%.63s/ports/%.63s/state",
                     nic->name, ports[p]);
            /* "4: ACTIVE": the first active port, else the first one. */
            if (sl_sysfs_read(root, path, state, sizeof(state)) &&
                strstr(state, "ACTIVE") != NULL) {
                nic->active = 1;
                break;
            }
        }
        if (np == 0) {
            continue; /* a device without ports carries nothing */
        }
        p          = (p < np) ? p : 0;
        nic->port  = atoi(ports[p]);
        snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/rate",
                 nic->name, nic->port);
        sl_sysfs_read(root, path, nic->rate, sizeof(nic->rate));
        nic->gbps = atof(nic->rate); /* "400 Gb/sec (4X NDR)" */
        snprintf(path, sizeof(path),
                 "/sys/class/infiniband/%s/ports/%d/link_layer", nic->name,
                 nic->port);
        sl_sysfs_read(root, path, nic->link_layer, sizeof(nic->link_layer));
        sl_nic_place(root, nic);
        ++t->nnics;
    }
    snprintf(t->nic_source, sizeof(t->nic_source),
             n ? "sysfs tree %s" : "no RDMA devices in the sysfs tree %s",
             root);
}

#if SL_HAVE_VERBS
/* Gb/s of one lane at an IBV speed, and lanes of an IBV width. */
static double sl_ibv_lane_gbps(unsigned speed, const char **name)
{
    switch (speed) {
    case 1:   *name = "SDR";   return 2.5;
    case 2:   *name = "DDR";   return 5.0;
    case 4:   *name = "QDR";   return 10.0;
    case 8:   *name = "FDR10"; return 10.3125;
    case 16:  *name = "FDR";   return 14.0625;
    case 32:  *name = "EDR";   return 25.78125;
    case 64:  *name = "HDR";   return 50.0;
    case 128: *name = "NDR";   return 100.0;
    default:  *name = "?";     return 0.0;
    }
}

static int sl_ibv_lanes(uint8_t width)
{
    switch (width) {
    case 1:  return 1;
    case 2:  return 4;
    case 4:  return 8;
    case 8:  return 12;
    case 16: return 2;
    default: return 0;
    }
}

static void sl_nic_from_verbs(struct ibv_device *dev, sl_topo_nic_t *nic)
{
    struct ibv_context    *ctx = ibv_open_device(dev);
    struct ibv_device_attr attr;
    struct ibv_port_attr   port;
    uint64_t               guid = be64toh(ibv_get_device_guid(dev));
    const char            *speed;
    int                    p, found = 0;

    snprintf(nic->guid, sizeof(nic->guid), "%04x:%04x:%04x:%04x",
             (unsigned)(guid >> 48) & 0xffff, (unsigned)(guid >> 32) & 0xffff,
             (unsigned)(guid >> 16) & 0xffff, (unsigned)guid & 0xffff);
    if (ctx == NULL || ibv_query_device(ctx, &attr) != 0) {
        snprintf(nic->rate, sizeof(nic->rate), "cannot open: %s",
                 strerror(errno));
        if (ctx != NULL) {
            ibv_close_device(ctx);
        }
        return;
    }
    for (p = 1; p <= attr.phys_port_cnt && !found; ++p) {
        if (ibv_query_port(ctx, (uint8_t)p, &port) != 0) {
            continue;
        }
        /* The first active port, else port 1. */
        if (port.state == IBV_PORT_ACTIVE || p == 1) {
            double lane = sl_ibv_lane_gbps(port.active_speed, &speed);
            int    lanes = sl_ibv_lanes(port.active_width);

            nic->port   = p;
            nic->active = (port.state == IBV_PORT_ACTIVE);
            nic->gbps   = lane * lanes;
            snprintf(nic->rate, sizeof(nic->rate), "%.0f Gb/sec (%dX %s)",
                     nic->gbps, lanes, speed);
            snprintf(nic->link_layer, sizeof(nic->link_layer), "%s",
                     (port.link_layer == IBV_LINK_LAYER_ETHERNET)
                         ? "Ethernet" : "InfiniBand");
            found = nic->active;
        }
    }
    ibv_close_device(ctx);
}

static void sl_nics_from_verbs(sl_topo_t *t)
{
    struct ibv_device **list;
    int                 n = 0, i;

    errno = 0;
    list  = ibv_get_device_list(&n);
    if (list == NULL || n == 0) {
        /* ENOSYS: no RDMA support in this kernel (or container). */
        snprintf(t->nic_source, sizeof(t->nic_source),
                 "no RDMA devices (libibverbs: %s)",
                 list == NULL ? strerror(errno) : "none listed");
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        return;
    }
    for (i = 0; i < n && t->nnics < SL_TOPO_MAX_NICS; ++i) {
        sl_topo_nic_t *nic = &t->nics[t->nnics++];

        memset(nic, 0, sizeof(*nic));
        snprintf(nic->name, sizeof(nic->name), "%s",
                 ibv_get_device_name(list[i]));
        sl_nic_from_verbs(list[i], nic);
        sl_nic_place("", nic);
    }
    ibv_free_device_list(list);
    snprintf(t->nic_source, sizeof(t->nic_source), "libibverbs, %d device%s",
             n, n == 1 ? "" : "s");
}
#endif

void sl_topo_discover_nics(const char *root, sl_topo_t *t)
{
    t->nnics = 0;
    if (root[0] != '\0') {
        sl_nics_from_sysfs(root, t);
        return;
    }
#if SL_HAVE_VERBS
    sl_nics_from_verbs(t);
#else
    sl_nics_from_sysfs(root, t);
    snprintf(t->nic_source, sizeof(t->nic_source), "%s (built without "
             "libibverbs: read from /sys/class/infiniband)",
             t->nnics ? "sysfs" : "no RDMA devices");
#endif
}
