/*
 * Rail affinity on fake sysfs trees (test/topo): NIC and GPU discovery,
 * PCI distance, the NIC each local rank gets, and who decides the device
 * list (UCX_NET_DEVICES, STAGELINK_NET_DEVICES, affinity).
 *   test_topo TOPO_DIR
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "sl_topo.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static char trees[512];

static void load(const char *name, sl_topo_t *t, char *root, size_t len)
{
    snprintf(root, len, "%s/%s", trees, name);
    memset(t, 0, sizeof(*t));
    sl_topo_discover_nics(root, t);
    sl_topo_discover_gpus(root, t);
}

/* Every local rank on its own GPU: the NIC it gets. */
static void expect_rails(const char *tree, const char *const *want,
                         const char *distance_of_last)
{
    static sl_topo_t t;
    sl_topo_choice_t c;
    char             root[600];
    int              g;

    load(tree, &t, root, sizeof(root));
    CHECK(t.ngpus == 8, "%s: %d GPUs found, want 8", tree, t.ngpus);
    for (g = 0; g < t.ngpus && g < 8; ++g) {
        sl_topo_select(&t, g, g, &c);
        CHECK(c.nic >= 0 && strcmp(t.nics[c.nic].name, want[g]) == 0,
              "%s: GPU %d (%s) got %s, want %s (%s)", tree, g, t.gpus[g].bdf,
              c.nic >= 0 ? t.nics[c.nic].name : "none", want[g], c.why);
        printf("%s: local rank %d: UCX_NET_DEVICES=%s: %s\n", tree, g,
               c.devices, c.why);
    }
    CHECK(strstr(c.why, distance_of_last) != NULL, "%s: last GPU: %s", tree,
          c.why);
}

static void test_dgx(void)
{
    static const char *const rails[] = {"mlx5_0", "mlx5_1", "mlx5_3",
                                        "mlx5_2", "mlx5_4", "mlx5_5",
                                        "mlx5_7", "mlx5_6"};
    static sl_topo_t t;
    sl_topo_choice_t c;
    char             root[600];
    int              i, active = 0;

    load("dgx-h100", &t, root, sizeof(root));
    CHECK(t.nnics == 9, "dgx: %d NICs, want 9 (%s)", t.nnics, t.nic_source);
    for (i = 0; i < t.nnics; ++i) {
        const sl_topo_nic_t *n = &t.nics[i];

        active += n->active;
        if (strcmp(n->name, "mlx5_8") == 0) {
            CHECK(!n->active && strcmp(n->link_layer, "Ethernet") == 0 &&
                  n->numa == 0, "mlx5_8: storage NIC, port down, Ethernet");
        } else {
            CHECK(n->port == 1 && n->gbps == 400.0 &&
                  strcmp(n->link_layer, "InfiniBand") == 0 &&
                  strlen(n->guid) == 19 && n->pci_path[0] == 'p' &&
                  (n->numa == 0 || n->numa == 1),
                  "%s: port %d, %.0f Gb/s, %s, guid %s, path %s, numa %d",
                  n->name, n->port, n->gbps, n->link_layer, n->guid,
                  n->pci_path, n->numa);
        }
    }
    CHECK(active == 8, "dgx: %d active NICs, want 8", active);
    CHECK(strcmp(t.gpus[0].bdf, "0000:03:00.0") == 0 && t.gpus[7].numa == 1,
          "dgx: GPU 0 %s, GPU 7 NUMA %d", t.gpus[0].bdf, t.gpus[7].numa);
    expect_rails("dgx-h100", rails, "same PCIe switch");

    /* Distances from GPU 0: its switch, the other switch of its socket,
     * the other socket. */
    for (i = 0; i < t.nnics; ++i) {
        sl_topo_dist_t d    = sl_topo_distance(&t.gpus[0], &t.nics[i]);
        const char    *name = t.nics[i].name;
        sl_topo_dist_t want = (!strcmp(name, "mlx5_0") || !strcmp(name, "mlx5_1"))
                                  ? SL_TOPO_SAME_SWITCH
                              : (!strcmp(name, "mlx5_2") || !strcmp(name, "mlx5_3") ||
                                 !strcmp(name, "mlx5_8"))
                                  ? SL_TOPO_SAME_NUMA
                                  : SL_TOPO_CROSS_NUMA;

        CHECK(d == want, "GPU 0 to %s: %s, want %s", name,
              sl_topo_distance_name(d), sl_topo_distance_name(want));
    }
    /* No GPU known: local rank i takes the i-th active NIC in PCI order. */
    sl_topo_select(&t, -1, 2, &c);
    CHECK(c.nic >= 0 && strcmp(t.nics[c.nic].name, "mlx5_3") == 0,
          "no GPU, local rank 2: %s (%s)", c.devices, c.why);
}

static void test_fewer_nics(void)
{
    static const char *const rails[] = {"mlx5_0", "mlx5_0", "mlx5_0",
                                        "mlx5_0", "mlx5_1", "mlx5_1",
                                        "mlx5_1", "mlx5_1"};

    expect_rails("fewer-nics", rails, "same NUMA node");
}

static void test_empty(void)
{
    static sl_topo_t t;
    sl_topo_choice_t c;
    char             root[600];

    load("empty", &t, root, sizeof(root));
    CHECK(t.nnics == 0 && t.ngpus == 0, "empty: %d NICs, %d GPUs", t.nnics,
          t.ngpus);
    sl_topo_select(&t, -1, 0, &c);
    CHECK(c.nic == -1 && c.devices[0] == '\0' &&
          strstr(c.why, "no RDMA devices") != NULL, "empty: %s / %s",
          c.devices, c.why);
}

/* The machine this runs on: no RDMA device here is a report, not an error. */
static void test_this_machine(void)
{
    static sl_topo_t t;

    sl_topo_discover_nics("", &t);
    sl_topo_discover_gpus("", &t);
    printf("this machine: %d RDMA devices (%s), %d GPUs (%s)\n", t.nnics,
           t.nic_source, t.ngpus, t.gpu_source);
    CHECK(t.nnics > 0 || strncmp(t.nic_source, "no RDMA devices", 15) == 0,
          "no NIC and no reason: %s", t.nic_source);
}

static void test_precedence(void)
{
    static sl_topo_t t;
    sl_locality_t    loc = {3, 8};
    sl_errbuf_t      eb;
    sl_topo_choice_t c;
    char             root[600];

    load("dgx-h100", &t, root, sizeof(root));
    unsetenv("UCX_NET_DEVICES");
    unsetenv("STAGELINK_NET_DEVICES");
    CHECK(sl_topo_net_devices(&t, 3, &loc, &c, &eb) == 0 &&
          strcmp(c.devices, "mlx5_2:1") == 0 && c.rail == 3,
          "affinity gave %s rail %d (%s)", c.devices, c.rail, c.why);
    setenv("STAGELINK_NET_DEVICES", "mlx5_1:1", 1);
    CHECK(sl_topo_net_devices(&t, 3, &loc, &c, &eb) == 0 &&
          strcmp(c.devices, "mlx5_1:1") == 0 && c.rail == -1,
          "override gave %s rail %d", c.devices, c.rail);
    setenv("UCX_NET_DEVICES", "mlx5_0:1", 1);
    CHECK(sl_topo_net_devices(&t, 3, &loc, &c, &eb) == 0 &&
          c.devices[0] == '\0' && strstr(c.why, "UCX_NET_DEVICES") &&
          c.rail == -1, "UCX_NET_DEVICES must win: %s", c.why);
    unsetenv("UCX_NET_DEVICES");
    unsetenv("STAGELINK_NET_DEVICES");
}

/*
 * One GPU visible per process (CUDA_VISIBLE_DEVICES=k, as Slurm and many
 * launchers set it): CUDA names only that GPU, by address, yet rails are
 * shared out over the node's GPUs, so GPU k still gets rail k.
 */
static void test_one_visible(void)
{
    static const char *const rails[] = {"mlx5_0", "mlx5_1", "mlx5_3",
                                        "mlx5_2", "mlx5_4", "mlx5_5",
                                        "mlx5_7", "mlx5_6"};
    static sl_topo_t t, all;
    sl_topo_choice_t c;
    char             root[600], bdf[16];
    int              g, gpu;
    size_t           i;

    load("dgx-h100", &all, root, sizeof(root));
    for (g = 0; g < all.ngpus && g < 8; ++g) {
        /* CUDA spells the address in upper case. */
        for (i = 0; i < sizeof(bdf); ++i) {
            bdf[i] = (char)toupper((unsigned char)all.gpus[g].bdf[i]);
        }
        memset(&t, 0, sizeof(t));
        sl_topo_discover_nics(root, &t);
        gpu = sl_topo_place_gpu(&t, root, bdf);
        sl_topo_select(&t, gpu, 0, &c);
        CHECK(t.ngpus == 8 && gpu == g, "CUDA_VISIBLE_DEVICES=%d: %d GPUs "
              "grouped, this one at %d", g, t.ngpus, gpu);
        CHECK(c.nic >= 0 && strcmp(t.nics[c.nic].name, rails[g]) == 0 &&
              c.rail == g, "CUDA_VISIBLE_DEVICES=%d (%s): %s rail %d, want "
              "%s rail %d (%s)", g, bdf, c.devices, c.rail, rails[g], g,
              c.why);
    }
    /* A GPU the tree lacks (a container without its PCI functions). */
    gpu = sl_topo_place_gpu(&t, root, "0000:C1:00.0");
    CHECK(gpu == 8 && t.ngpus == 9 && strcmp(t.gpus[8].bdf, "0000:c1:00.0") == 0
          && t.gpus[8].pci_path[0] == '\0', "GPU outside the tree: at %d of "
          "%d (%s)", gpu, t.ngpus, t.gpu_source);
    CHECK(sl_topo_place_gpu(&t, root, NULL) == -1 && t.ngpus == 8,
          "no GPU named: -1 and the tree's 8");
}

/* The NICs left out: the one given, and the one too slow. */
static int skipped(const sl_topo_t *t, const char *name, const char *why)
{
    int i;

    for (i = 0; i < t->nnics; ++i) {
        if (strcmp(t->nics[i].name, name) == 0) {
            return why ? strstr(t->nics[i].skip, why) != NULL
                       : t->nics[i].skip[0] != '\0';
        }
    }
    return -1;
}

static int count_skipped(const sl_topo_t *t)
{
    int i, n = 0;

    for (i = 0; i < t->nnics; ++i) {
        n += t->nics[i].skip[0] != '\0';
    }
    return n;
}

static void filter(sl_topo_t *t, const char *stagelink, const char *nccl)
{
    sl_errbuf_t eb;

    stagelink ? setenv("STAGELINK_IB_HCA", stagelink, 1)
              : unsetenv("STAGELINK_IB_HCA");
    nccl ? setenv("NCCL_IB_HCA", nccl, 1) : unsetenv("NCCL_IB_HCA");
    CHECK(sl_topo_filter_nics(t, &eb) == STAGELINK_SUCCESS, "filter %s/%s: %s",
          stagelink ? stagelink : "-", nccl ? nccl : "-", eb.msg);
}

static void test_filter(void)
{
    static sl_topo_t t;
    sl_topo_choice_t c;
    sl_errbuf_t      eb;
    char             root[600], report[8192];
    int              i;

    load("dgx-h100", &t, root, sizeof(root));
    unsetenv("STAGELINK_NIC_MIN_GBPS");
    /* The storage NIC, active this time: 100 Gb/s against 400. */
    for (i = 0; i < t.nnics; ++i) {
        t.nics[i].active |= !strcmp(t.nics[i].name, "mlx5_8");
        t.nics[i].gbps = !strcmp(t.nics[i].name, "mlx5_8") ? 100.0
                                                             : t.nics[i].gbps;
    }
    filter(&t, NULL, NULL);
    CHECK(count_skipped(&t) == 1 && skipped(&t, "mlx5_8", "below") == 1,
          "auto speed floor: mlx5_8 (100 of 400 Gb/s) alone left out");
    sl_topo_select(&t, -1, 8, &c);
    CHECK(c.rail == 0 && strcmp(c.devices, "mlx5_0:1") == 0,
          "no GPU, local rank 8 of 8 NICs wraps to the first: %s", c.devices);
    sl_topo_report(&t, report, sizeof(report));
    CHECK(strstr(report, "left out: 100 Gb/s, below STAGELINK_NIC_MIN_GBPS"),
          "the report says why:\n%s", report);
    setenv("STAGELINK_NIC_MIN_GBPS", "0", 1);
    filter(&t, NULL, NULL);
    CHECK(count_skipped(&t) == 0, "STAGELINK_NIC_MIN_GBPS=0 keeps all");
    setenv("STAGELINK_NIC_MIN_GBPS", "fast", 1);
    CHECK(sl_topo_filter_nics(&t, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "\"fast\""), "a rate that is no number: %s", eb.msg);
    unsetenv("STAGELINK_NIC_MIN_GBPS");

    /* NCCL_IB_HCA's syntax: exact exclusion moves GPU 0 to its switch's
     * other NIC. */
    filter(&t, "^=mlx5_0", NULL);
    CHECK(count_skipped(&t) == 2 && skipped(&t, "mlx5_0", "excluded by "
          "STAGELINK_IB_HCA=^=mlx5_0") == 1, "^=mlx5_0 excludes mlx5_0");
    sl_topo_select(&t, 0, 0, &c);
    CHECK(strcmp(c.devices, "mlx5_1:1") == 0, "GPU 0 without mlx5_0: %s",
          c.devices);
    filter(&t, "mlx5_1,mlx5_2:1", NULL);
    CHECK(count_skipped(&t) == 7 && skipped(&t, "mlx5_1", NULL) == 0 &&
          skipped(&t, "mlx5_2", NULL) == 0 &&
          skipped(&t, "mlx5_0", "not included") == 1,
          "an include list of two, one with its port");
    filter(&t, "=mlx5", NULL);
    CHECK(count_skipped(&t) == 9, "=mlx5 matches no whole name");
    filter(&t, "mlx5", NULL);
    CHECK(count_skipped(&t) == 1, "mlx5 is a prefix of all (speed aside)");
    filter(&t, "mlx5_0:2", NULL);
    CHECK(skipped(&t, "mlx5_0", NULL) == 1, "mlx5_0:2 names a port it "
          "does not use");
    filter(&t, "^mlx5_1,mlx5_2", NULL);
    CHECK(count_skipped(&t) == 3 && skipped(&t, "mlx5_1", "excluded") == 1 &&
          skipped(&t, "mlx5_2", "excluded") == 1, "prefix exclusion");
    /* NCCL's list is the default; stagelink's own wins. */
    filter(&t, NULL, "^=mlx5_3");
    CHECK(skipped(&t, "mlx5_3", "by NCCL_IB_HCA=^=mlx5_3") == 1 &&
          count_skipped(&t) == 2, "NCCL_IB_HCA as the default");
    filter(&t, "^=mlx5_4", "^=mlx5_3");
    CHECK(skipped(&t, "mlx5_3", NULL) == 0 && skipped(&t, "mlx5_4", NULL) == 1,
          "STAGELINK_IB_HCA over NCCL_IB_HCA");
    /* The speed floor counts only the NICs the list keeps: the 100 Gb/s
     * NIC alone included is not then below half of an excluded 400. */
    filter(&t, "=mlx5_8", NULL);
    CHECK(count_skipped(&t) == 8 && skipped(&t, "mlx5_8", NULL) == 0,
          "=mlx5_8: kept, whatever the excluded NICs' speed");
    /* Everything left out: UCX chooses, and says why. */
    filter(&t, "=none", NULL);
    sl_topo_select(&t, 0, 0, &c);
    CHECK(c.nic == -1 && c.devices[0] == '\0' && strstr(c.why, "none usable"),
          "nothing usable: %s", c.why);
    filter(&t, NULL, NULL);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_topo TOPO_DIR\n");
        return 2;
    }
    snprintf(trees, sizeof(trees), "%s", argv[1]);
    test_dgx();
    test_fewer_nics();
    test_empty();
    test_this_machine();
    test_precedence();
    test_one_visible();
    test_filter();
    return check_summary();
}
