/*
 * Rail affinity on fake sysfs trees (test/topo): NIC and GPU discovery,
 * PCI distance, the NIC each local rank gets, and who decides the device
 * list (UCX_NET_DEVICES, STAGELINK_NET_DEVICES, affinity).
 *   test_topo TOPO_DIR
 * SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "sl_topo.h"

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
    char             dev[SL_TOPO_DEVICES_LEN], why[256], root[600];

    load("dgx-h100", &t, root, sizeof(root));
    unsetenv("UCX_NET_DEVICES");
    unsetenv("STAGELINK_NET_DEVICES");
    CHECK(sl_topo_net_devices(&t, 3, &loc, dev, why, sizeof(why), &eb) == 0 &&
          strcmp(dev, "mlx5_2:1") == 0, "affinity gave %s (%s)", dev, why);
    setenv("STAGELINK_NET_DEVICES", "mlx5_1:1", 1);
    CHECK(sl_topo_net_devices(&t, 3, &loc, dev, why, sizeof(why), &eb) == 0 &&
          strcmp(dev, "mlx5_1:1") == 0, "override gave %s", dev);
    setenv("UCX_NET_DEVICES", "mlx5_0:1", 1);
    CHECK(sl_topo_net_devices(&t, 3, &loc, dev, why, sizeof(why), &eb) == 0 &&
          dev[0] == '\0' && strstr(why, "UCX_NET_DEVICES"),
          "UCX_NET_DEVICES must win: %s", why);
    unsetenv("UCX_NET_DEVICES");
    unsetenv("STAGELINK_NET_DEVICES");
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
    return check_summary();
}
