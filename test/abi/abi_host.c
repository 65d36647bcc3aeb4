/*
 * The ABI's growth rule from a host's side (stagelink.h, "Growing the
 * ABI"), one named case a row: structs of the v1 baseline (struct_size 0),
 * of this header, of an older header (a config that ends where the
 * original v1 did, with garbage past it), and of a later header (larger
 * structs: a zero tail is taken, a set one fails with STAGELINK_ERR_ABI
 * and posts nothing).  Structs the plugin fills are handed in as garbage.
 * Run on 2 ranks, one stage each (stagelink_run -n 2).
 * SPDX-License-Identifier: MIT
 */
#include "../unit/check.h"
#include "host.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* What a later header may look like: every struct with a field appended. */
typedef struct {
    stagelink_config_t c;
    uint64_t           future;
} later_config_t;
typedef struct {
    stagelink_topology_t t;
    uint64_t             future;
} later_topology_t;
typedef struct {
    stagelink_xfer_t x;
    uint64_t         future;
} later_xfer_t;
typedef struct {
    stagelink_op_kind_t kind;
    later_xfer_t        xfer;
    uint64_t            future;
} later_op_t;

_Static_assert(offsetof(later_op_t, xfer) == offsetof(stagelink_op_t, xfer),
               "a later op keeps the xfer where it was");

#define N 4096 /* floats a transfer */

static sl_host_t h;
static int       stage; /* 0 sends, 1 receives */
static float     data[2][N];

/* init: a communicator from `cfg`, finalized at once when it opens. */
static stagelink_status_t init_with(const stagelink_config_t *cfg)
{
    stagelink_comm_t  *comm = NULL;
    stagelink_status_t st;
    char               err[1024];

    st = stagelink_loader_comm_init(h.loader, cfg, &comm, err, sizeof(err));
    if (st == STAGELINK_SUCCESS) {
        CHECK(h.plugin->comm_finalize(comm) == STAGELINK_SUCCESS,
              "finalize of a communicator from an ABI case");
    } else if (st == STAGELINK_ERR_ABI) {
        CHECK(strstr(err, "struct_size") != NULL || strstr(err, "past the") != NULL,
              "the sentence names the size or the tail: %s", err);
    }
    if (stage == 0) {
        printf("   %-9s %s\n", stagelink_status_string(st) + 10,
               st == STAGELINK_SUCCESS ? "" : err);
    }
    return st;
}

static stagelink_config_t config_now(void)
{
    return (stagelink_config_t){.struct_size = sizeof(stagelink_config_t),
                                .tp_size = 1};
}

static void config_cases(void)
{
    stagelink_config_t cfg;
    later_config_t     later;

    cfg = config_now();
    CHECK(init_with(&cfg) == STAGELINK_SUCCESS, "config of this header");
    cfg.struct_size = 0;
    CHECK(init_with(&cfg) == STAGELINK_SUCCESS, "config struct_size 0");
    /* A host of the original v1: past `flags` its struct is someone
     * else's memory; a plugin that read it would call these. */
    cfg             = config_now();
    cfg.struct_size = offsetof(stagelink_config_t, store_set);
    cfg.store_set   = (stagelink_store_set_fn_t)(uintptr_t)1;
    cfg.store_get   = (stagelink_store_get_fn_t)(uintptr_t)1;
    cfg.gather      = (stagelink_gather_fn_t)(uintptr_t)1;
    CHECK(init_with(&cfg) == STAGELINK_SUCCESS,
          "config of the original v1, garbage past it");
    memset(&later, 0, sizeof(later));
    later.c             = config_now();
    later.c.struct_size = sizeof(later);
    CHECK(init_with(&later.c) == STAGELINK_SUCCESS,
          "config of a later header, its new field 0");
    later.future = 1;
    CHECK(init_with(&later.c) == STAGELINK_ERR_ABI,
          "config of a later header, its new field set");
    cfg             = config_now();
    cfg.struct_size = 4;
    CHECK(init_with(&cfg) == STAGELINK_ERR_ABI, "config struct_size 4");
    cfg.struct_size = sizeof(cfg) + 4;
    CHECK(init_with(&cfg) == STAGELINK_ERR_ABI,
          "config struct_size not a whole number of fields");
}

/* The placement Megatron's rank order gives, explicitly. */
static void topology_cases(void)
{
    int                ranks[1] = {stage};
    stagelink_config_t cfg      = config_now();
    later_topology_t   later;

    memset(&later, 0, sizeof(later));
    later.t = (stagelink_topology_t){.prev_rank = stage - 1,
                                     .next_rank = stage == 0 ? 1 : -1,
                                     .tp_index  = 0, .tp_ranks = ranks};
    cfg.topology = &later.t;
    CHECK(init_with(&cfg) == STAGELINK_SUCCESS, "topology struct_size 0");
    later.t.struct_size = sizeof(later.t);
    CHECK(init_with(&cfg) == STAGELINK_SUCCESS, "topology of this header");
    later.t.struct_size = sizeof(later);
    CHECK(init_with(&cfg) == STAGELINK_SUCCESS,
          "topology of a later header, its new field 0");
    later.future = 1;
    CHECK(init_with(&cfg) == STAGELINK_ERR_ABI,
          "topology of a later header, its new field set");
    later.t.struct_size = 4;
    CHECK(init_with(&cfg) == STAGELINK_ERR_ABI, "topology struct_size 4");
}

static void fill(int which, uint32_t mb)
{
    for (int i = 0; i < N; ++i) {
        data[which][i] = (stage == 0) ? (float)(mb * N + (uint32_t)i) : -1.0f;
    }
}

static int holds(int which, uint32_t mb)
{
    for (int i = 0; i < N; ++i) {
        if (data[which][i] != (float)(mb * N + (uint32_t)i)) {
            return 0;
        }
    }
    return 1;
}

static stagelink_xfer_t xfer_of(int which, uint32_t mb)
{
    fill(which, mb);
    return sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                        data[which], sizeof(data[which]), sizeof(float), mb, 0);
}

/* One transfer through isend or irecv; the status of the post. */
static stagelink_status_t post_wait(const stagelink_xfer_t *x)
{
    stagelink_request_t *req = NULL;
    stagelink_status_t   st  = (stage == 0)
                                   ? h.plugin->isend(h.comm, x, &req)
                                   : h.plugin->irecv(h.comm, x, &req);

    if (st == STAGELINK_SUCCESS) {
        CHECK(sl_host_report(&h, h.plugin->wait(h.comm, req), "wait") ==
                  STAGELINK_SUCCESS, "wait");
    } else if (stage == 0) {
        printf("   %-9s %s\n", stagelink_status_string(st) + 10,
               h.plugin->last_error(h.comm));
    }
    return st;
}

static void xfer_cases(void)
{
    stagelink_xfer_t x;
    later_xfer_t     later;

    x = xfer_of(0, 1);
    CHECK(post_wait(&x) == STAGELINK_SUCCESS && (stage == 0 || holds(0, 1)),
          "xfer struct_size 0");
    x             = xfer_of(0, 2);
    x.struct_size = sizeof(x);
    CHECK(post_wait(&x) == STAGELINK_SUCCESS && (stage == 0 || holds(0, 2)),
          "xfer of this header");
    memset(&later, 0, sizeof(later));
    later.x             = xfer_of(0, 3);
    later.x.struct_size = sizeof(later);
    CHECK(post_wait(&later.x) == STAGELINK_SUCCESS &&
              (stage == 0 || holds(0, 3)),
          "xfer of a later header, its new field 0");
    /* Refused on both sides without a post: tag 4 is free afterwards. */
    later.x      = xfer_of(0, 4);
    later.x.struct_size = sizeof(later);
    later.future = 1;
    CHECK(post_wait(&later.x) == STAGELINK_ERR_ABI,
          "xfer of a later header, its new field set");
    x             = xfer_of(0, 4);
    x.struct_size = 4;
    CHECK(post_wait(&x) == STAGELINK_ERR_ABI, "xfer struct_size 4");
    x.struct_size = sizeof(x) + 1;
    CHECK(post_wait(&x) == STAGELINK_ERR_ABI,
          "xfer struct_size not a whole number of fields");
    x.struct_size = 0x7ffc1230u; /* what an uninitialised one may hold */
    CHECK(post_wait(&x) == STAGELINK_ERR_ABI, "xfer struct_size of garbage");
    x = xfer_of(0, 4);
    CHECK(post_wait(&x) == STAGELINK_SUCCESS && (stage == 0 || holds(0, 4)),
          "the tag of the refused posts, free");
}

/* Two transfers in one batch, ops `op_size` apart; the status of the post. */
static stagelink_status_t batch(const void *ops, size_t op_size, int sized)
{
    stagelink_request_t *req[2] = {NULL, NULL};
    stagelink_status_t   st;

    st = sized ? h.plugin->post_batch_sized(h.comm, ops, 2, op_size, req)
               : h.plugin->post_batch(h.comm, ops, 2, req);
    for (int i = 0; st == STAGELINK_SUCCESS && i < 2; ++i) {
        CHECK(sl_host_report(&h, h.plugin->wait(h.comm, req[i]), "wait") ==
                  STAGELINK_SUCCESS, "wait of op %d", i);
    }
    if (st != STAGELINK_SUCCESS) {
        CHECK(req[0] == NULL && req[1] == NULL, "a refused batch posts nothing");
        if (stage == 0) {
            printf("   %-9s %s\n", stagelink_status_string(st) + 10,
                   h.plugin->last_error(h.comm));
        }
    }
    return st;
}

static void batch_cases(void)
{
    stagelink_op_kind_t kind = stage == 0 ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;
    stagelink_op_t      ops[2];
    later_op_t          later[2];
    uint32_t            mb = 10;

    for (int sized = 0; sized < 3; ++sized, mb += 2) {
        ops[0] = (stagelink_op_t){kind, xfer_of(0, mb)};
        ops[1] = (stagelink_op_t){kind, xfer_of(1, mb + 1)};
        CHECK(batch(ops, sized == 2 ? 0 : sizeof(ops[0]), sized) ==
                  STAGELINK_SUCCESS &&
                  (stage == 0 || (holds(0, mb) && holds(1, mb + 1))),
              "ops of this header, %s",
              sized == 0 ? "post_batch" : sized == 1 ? "op_size sizeof" : "op_size 0");
    }
    memset(later, 0, sizeof(later));
    for (int i = 0; i < 2; ++i) {
        later[i].kind               = kind;
        later[i].xfer.x             = xfer_of(i, 20 + (uint32_t)i);
        later[i].xfer.x.struct_size = sizeof(later[i].xfer);
    }
    CHECK(batch(later, sizeof(later[0]), 1) == STAGELINK_SUCCESS &&
              (stage == 0 || (holds(0, 20) && holds(1, 21))),
          "ops of a later header, their new fields 0");
    for (int i = 0; i < 2; ++i) {
        later[i].xfer.x.tag.microbatch = 22 + (uint32_t)i;
    }
    later[1].future = 1;
    CHECK(batch(later, sizeof(later[0]), 1) == STAGELINK_ERR_ABI,
          "ops of a later header, the second op's new field set");
    later[1].future      = 0;
    later[1].xfer.future = 1;
    CHECK(batch(later, sizeof(later[0]), 1) == STAGELINK_ERR_ABI,
          "ops of a later header, the second xfer's new field set");
    later[1].xfer.future = 0;
    CHECK(batch(later, sizeof(ops[0]), 1) == STAGELINK_ERR_ABI,
          "ops whose xfer overruns op_size");
    CHECK(batch(ops, 4, 1) == STAGELINK_ERR_ABI, "op_size 4");
    for (int i = 0; i < 2; ++i) {
        later[i].xfer.x = xfer_of(i, 22 + (uint32_t)i);
        later[i].xfer.x.struct_size = sizeof(later[i].xfer);
    }
    CHECK(batch(later, sizeof(later[0]), 1) == STAGELINK_SUCCESS &&
              (stage == 0 || (holds(0, 22) && holds(1, 23))),
          "the tags of the refused batches, free");
}

/* Structs the plugin fills come in as garbage and go out whole. */
static void output_cases(void)
{
    stagelink_comm_info_t info;
    stagelink_counters_t  counters;

    memset(&info, 0xab, sizeof(info));
    CHECK(h.plugin->comm_info(h.comm, &info) == STAGELINK_SUCCESS &&
              info.struct_size == sizeof(info) && info.rank == stage &&
              info.world_size == 2 && memchr(info.node_id, 0, sizeof(info.node_id)),
          "comm_info into garbage: struct_size %u, rank %d", info.struct_size,
          info.rank);
    memset(&counters, 0xab, sizeof(counters));
    CHECK(h.plugin->get_counters(h.comm, &counters) == STAGELINK_SUCCESS &&
              counters.struct_size == sizeof(counters) &&
              counters.transfers_completed == 14,
          "counters into garbage: struct_size %u, %llu transfers",
          counters.struct_size,
          (unsigned long long)counters.transfers_completed);
}

static const struct {
    const char *name;
    void (*run)(void);
} cases[] = {
    {"config", config_cases},     {"topology", topology_cases},
    {"xfer", xfer_cases},         {"post_batch", batch_cases},
    {"output structs", output_cases},
};

int main(void)
{
    if (sl_host_open(&h, 1, 2, STAGELINK_MODE_SCATTER_GATHER) != 0) {
        return 1;
    }
    stage = h.info.pp_index;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        if (stage == 0) {
            printf("%s\n", cases[i].name);
        }
        cases[i].run();
    }
    sl_host_close(&h);
    return check_summary();
}
