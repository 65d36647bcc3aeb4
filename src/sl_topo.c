/*
 * Who shares a node, and rail affinity: the NIC nearest each rank's GPU.
 * Nearness is read from the PCI paths the kernel gives (a device's
 * resolved /sys/devices path lists every bridge above it), so two devices
 * below one PCIe switch share the path down to the switch's upstream port.
 * SPDX-License-Identifier: MIT
 */
#include "sl_topo.h"
#include "sl_env.h"

#include <stdarg.h>
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

/* Leading path components two PCI paths share. */
static int sl_common_components(const char *a, const char *b)
{
    int n = 0;

    for (;;) {
        size_t la = strcspn(a, "/"), lb = strcspn(b, "/");

        if (la == 0 || la != lb || strncmp(a, b, la) != 0) {
            return n;
        }
        ++n;
        if (a[la] == '\0' || b[lb] == '\0') {
            return n;
        }
        a += la + 1;
        b += lb + 1;
    }
}

sl_topo_dist_t sl_topo_distance(const sl_topo_gpu_t *gpu,
                                const sl_topo_nic_t *nic)
{
    int common = 0;

    if (gpu->pci_path[0] != '\0' && nic->pci_path[0] != '\0') {
        common = sl_common_components(gpu->pci_path, nic->pci_path);
    }
    /* host bridge / root port / switch upstream port / ... */
    if (common >= 3) {
        return SL_TOPO_SAME_SWITCH;
    }
    if (common >= 1) {
        return SL_TOPO_SAME_ROOT;
    }
    if (gpu->numa >= 0 && gpu->numa == nic->numa) {
        return SL_TOPO_SAME_NUMA;
    }
    return SL_TOPO_CROSS_NUMA;
}

const char *sl_topo_distance_name(sl_topo_dist_t d)
{
    static const char *const names[] = {"same PCIe switch",
                                        "same PCIe root", "same NUMA node",
                                        "other NUMA node"};

    return names[d];
}

/* NICs worth using, in PCI order: the ones the filter kept with an active
 * port, else all it kept. */
static int sl_topo_usable(const sl_topo_t *t, int *idx)
{
    int i, j, n = 0, active = 0;

    for (i = 0; i < t->nnics; ++i) {
        active |= t->nics[i].active && t->nics[i].skip[0] == '\0';
    }
    for (i = 0; i < t->nnics; ++i) {
        if (t->nics[i].skip[0] == '\0' && (t->nics[i].active || !active)) {
            for (j = n; j > 0 && strcmp(t->nics[idx[j - 1]].pci_path,
                                        t->nics[i].pci_path) > 0; --j) {
                idx[j] = idx[j - 1];
            }
            idx[j] = i;
            ++n;
        }
    }
    return n;
}

/* The NICs nearest `gpu`, in PCI order; their distance. */
static int sl_topo_nearest(const sl_topo_t *t, const int *usable, int nusable,
                           int gpu, int *near, sl_topo_dist_t *best)
{
    int i, n = 0;

    *best = SL_TOPO_CROSS_NUMA;
    for (i = 0; i < nusable; ++i) {
        sl_topo_dist_t d = sl_topo_distance(&t->gpus[gpu], &t->nics[usable[i]]);

        if (n == 0 || d < *best) {
            *best = d;
            n     = 0;
        }
        if (d == *best) {
            near[n++] = usable[i]; /* usable is in PCI order already */
        }
    }
    return n;
}

void sl_topo_select(const sl_topo_t *t, int gpu, int local_rank,
                    sl_topo_choice_t *c)
{
    int            usable[SL_TOPO_MAX_NICS], near[SL_TOPO_MAX_NICS];
    int            other[SL_TOPO_MAX_NICS];
    int            nusable = sl_topo_usable(t, usable), nnear, nother, g, k = 0;
    int            group = 0;
    sl_topo_dist_t best, d;

    memset(c, 0, sizeof(*c));
    c->gpu  = (gpu >= 0 && gpu < t->ngpus) ? gpu : -1;
    c->nic  = -1;
    c->rail = -1;
    if (nusable == 0) {
        snprintf(c->why, sizeof(c->why), "%s%s: UCX chooses", t->nic_source,
                 t->nnics ? ", none usable" : "");
        return;
    }
    if (c->gpu < 0) {
        c->nic = usable[local_rank % nusable];
        snprintf(c->why, sizeof(c->why), "no GPU known for local rank %d: "
                 "NIC %d of %d by local rank", local_rank,
                 local_rank % nusable, nusable);
    } else {
        nnear = sl_topo_nearest(t, usable, nusable, gpu, near, &best);
        /* GPUs with the same nearest NICs share them in PCI order: GPU k
         * of a switch takes NIC k of that switch, on every node alike. */
        for (g = 0; g < t->ngpus; ++g) {
            nother = sl_topo_nearest(t, usable, nusable, g, other, &d);
            if (d == best && nother == nnear &&
                memcmp(other, near, sizeof(int) * (size_t)nnear) == 0) {
                k += (g < gpu);
                ++group;
            }
        }
        c->nic = near[k % nnear];
        snprintf(c->why, sizeof(c->why), "GPU %d (%s): %d NIC%s on the %s, "
                 "NIC %d of them (%d GPU%s have the same nearest NICs)",
                 gpu, t->gpus[gpu].bdf, nnear, nnear == 1 ? "" : "s",
                 sl_topo_distance_name(best), k % nnear, group,
                 group == 1 ? "" : "s");
    }
    for (g = 0; g < nusable; ++g) {
        c->rail = (usable[g] == c->nic) ? g : c->rail;
    }
    snprintf(c->devices, sizeof(c->devices), "%s:%d", t->nics[c->nic].name,
             t->nics[c->nic].port);
}

sl_status_t sl_topo_net_devices(const sl_topo_t *t, int gpu,
                                const sl_locality_t *loc,
                                sl_topo_choice_t *c, sl_errbuf_t *eb)
{
    const char *value = sl_env_raw(SL_ENV_NET_DEVICES);

    memset(c, 0, sizeof(*c));
    c->gpu = gpu;
    c->nic = c->rail = -1;
    if (sl_env_raw(SL_ENV_UCX_NET_DEVICES) != NULL) {
        snprintf(c->why, sizeof(c->why), "UCX_NET_DEVICES is set");
        return STAGELINK_SUCCESS;
    }
    if (value != NULL) {
        if (strlen(value) >= SL_TOPO_DEVICES_LEN) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_NET_DEVICES is longer than %d "
                            "characters", SL_TOPO_DEVICES_LEN - 1);
        }
        snprintf(c->devices, sizeof(c->devices), "%s", value);
        snprintf(c->why, sizeof(c->why), "STAGELINK_NET_DEVICES");
        return STAGELINK_SUCCESS;
    }
    sl_topo_select(t, gpu, loc->local_rank, c);
    return STAGELINK_SUCCESS;
}

/* snprintf at the end of what is written so far, never past `len`. */
static void sl_topo_put(char *buf, size_t len, size_t *used, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));

static void sl_topo_put(char *buf, size_t len, size_t *used, const char *fmt,
                        ...)
{
    va_list ap;
    int     n;

    va_start(ap, fmt);
    n = vsnprintf(buf + (*used < len ? *used : len),
                  *used < len ? len - *used : 0, fmt, ap);
    va_end(ap);
    *used += (n > 0) ? (size_t)n : 0;
}

size_t sl_topo_report(const sl_topo_t *t, char *buf, size_t len)
{
    sl_topo_choice_t c;
    size_t           used = 0;
    int              i, ranks;

    if (len > 0) {
        buf[0] = '\0';
    }
    sl_topo_put(buf, len, &used, "RDMA devices: %s\n", t->nic_source);
    for (i = 0; i < t->nnics; ++i) {
        const sl_topo_nic_t *n = &t->nics[i];

        sl_topo_put(buf, len, &used, "  %-8s port %d %-6s %-10s %-20s guid %s "
                    "NUMA %d PCI %s%s%s\n", n->name, n->port,
                    n->active ? "ACTIVE" : "down", n->link_layer, n->rate,
                    n->guid[0] ? n->guid : "?", n->numa,
                    n->pci_path[0] ? n->pci_path : "?",
                    n->skip[0] ? "; left out: " : "", n->skip);
    }
    sl_topo_put(buf, len, &used, "GPUs: %d (%s)\n", t->ngpus, t->gpu_source);
    for (i = 0; i < t->ngpus; ++i) {
        sl_topo_put(buf, len, &used, "  GPU %d %s NUMA %d PCI %s\n", i,
                    t->gpus[i].bdf, t->gpus[i].numa,
                    t->gpus[i].pci_path[0] ? t->gpus[i].pci_path : "?");
    }
    ranks = (t->ngpus > 0) ? t->ngpus : 1;
    sl_topo_put(buf, len, &used, "rail per local rank (local rank i on GPU i%s):\n",
                t->ngpus ? "" : "; no GPU");
    for (i = 0; i < ranks; ++i) {
        sl_topo_select(t, t->ngpus ? i : -1, i, &c);
        sl_topo_put(buf, len, &used, "  local rank %d: %s (%s)\n", i,
                    c.devices[0] ? c.devices : "UCX chooses", c.why);
    }
    return used;
}
