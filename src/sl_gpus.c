/*
 * GPUs in the PCI tree: the NVIDIA display and 3D controllers of the PCI
 * bus, in address order, all of them whatever CUDA_VISIBLE_DEVICES shows
 * (rails are shared out over the node's GPUs, not the process's).  CUDA
 * tells only which of them this rank drives, by PCI address.
 * SPDX-License-Identifier: MIT
 */
#include "sl_topo.h"
#include "sl_sysfs.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SL_PCI_VENDOR_NVIDIA 0x10de
#define SL_PCI_CLASS_DISPLAY 0x03 /* base class: VGA (0x0300) and 3D (0x0302) */

void sl_topo_gpu_add(sl_topo_t *t, const char *root, const char *bdf)
{
    sl_topo_gpu_t *g;
    char           path[160];
    long           numa;
    size_t         i;

    if (t->ngpus == SL_TOPO_MAX_GPUS) {
        return;
    }
    g = &t->gpus[t->ngpus++];
    memset(g, 0, sizeof(*g));
    /* CUDA spells the address in upper case, sysfs in lower case. */
    for (i = 0; bdf[i] != '\0' && i + 1 < sizeof(g->bdf); ++i) {
        g->bdf[i] = (char)tolower((unsigned char)bdf[i]);
    }
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s", g->bdf);
    if (!sl_sysfs_pci_path(root, path, g->pci_path, sizeof(g->pci_path))) {
        g->pci_path[0] = '\0';
    }
    snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/numa_node", g->bdf);
    g->numa = sl_sysfs_read_long(root, path, &numa) ? (int)numa : -1;
}

static int sl_bdf_cmp(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

void sl_topo_discover_gpus(const char *root, sl_topo_t *t)
{
    char           dir[512], path[160], found[SL_TOPO_MAX_GPUS][16];
    DIR           *d;
    struct dirent *e;
    long           vendor, cls;
    int            n = 0, i;

    t->ngpus = 0;
    snprintf(dir, sizeof(dir), "%s/sys/bus/pci/devices", root);
    d = opendir(dir);
    while (d != NULL && n < SL_TOPO_MAX_GPUS && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(found[0])) {
            continue;
        }
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/vendor", e->d_name);
        if (!sl_sysfs_read_long(root, path, &vendor) ||
            vendor != SL_PCI_VENDOR_NVIDIA) {
            continue;
        }
        snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/class", e->d_name);
        if (sl_sysfs_read_long(root, path, &cls) &&
            ((cls >> 16) & 0xff) == SL_PCI_CLASS_DISPLAY) {
            snprintf(found[n++], sizeof(found[0]), "%s", e->d_name);
        }
    }
    if (d != NULL) {
        closedir(d);
    }
    qsort(found, (size_t)n, sizeof(found[0]), sl_bdf_cmp);
    for (i = 0; i < n; ++i) {
        sl_topo_gpu_add(t, root, found[i]);
    }
    snprintf(t->gpu_source, sizeof(t->gpu_source), "%s%s",
             n ? "PCI bus (NVIDIA display/3D controllers)"
               : "no GPU on the PCI bus",
             root[0] ? " of the sysfs tree" : "");
}

int sl_topo_place_gpu(sl_topo_t *t, const char *root, const char *bdf)
{
    char want[16];
    int  i;

    sl_topo_discover_gpus(root, t);
    if (bdf == NULL || bdf[0] == '\0') {
        return -1;
    }
    for (i = 0; bdf[i] != '\0' && i + 1 < (int)sizeof(want); ++i) {
        want[i] = (char)tolower((unsigned char)bdf[i]);
    }
    want[i] = '\0';
    for (i = 0; i < t->ngpus; ++i) {
        if (strcmp(t->gpus[i].bdf, want) == 0) {
            return i;
        }
    }
    if (t->ngpus == SL_TOPO_MAX_GPUS) {
        return -1;
    }
    sl_topo_gpu_add(t, root, want);
    snprintf(t->gpu_source + strlen(t->gpu_source),
             sizeof(t->gpu_source) - strlen(t->gpu_source),
             "; %s from CUDA", want);
    return t->ngpus - 1;
}
