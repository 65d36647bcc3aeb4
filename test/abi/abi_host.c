/*
 * The ABI's growth rule from a host's side (stagelink.h, "Growing the
 * ABI"): every struct the host passes in, as a host built against the
 * header before struct_size (its layout mirrored here, zeroed), against
 * this header (sizeof, and 0), and against a later one (one field
 * appended: taken while it is 0, STAGELINK_ERR_ABI once it is set, and a
 * refused post leaves its tag free); sizes below the smallest, not whole
 * fields, or garbage fail too.  Structs the plugin fills are handed in as
 * garbage.  Run on 2 ranks, one stage each (stagelink_run -n 2).
 * SPDX-License-Identifier: MIT
 */
#include "../unit/check.h"
#include "host.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* The transfer descriptor and topology of the header before struct_size:
 * the field it takes was padding. */
typedef struct {
    stagelink_peer_t     peer;
    void                *buf;
    size_t               nbytes, elem_size;
    stagelink_mem_type_t mem_type;
    void                *stream;
    stagelink_memh_t    *memh;
    stagelink_tag_t      tag;
} older_xfer_t;
typedef struct {
    int        prev_rank, next_rank, tp_index;
    const int *tp_ranks;
} older_topology_t;

_Static_assert(sizeof(older_xfer_t) == sizeof(stagelink_xfer_t) &&
                   offsetof(older_xfer_t, buf) == offsetof(stagelink_xfer_t, buf) &&
                   offsetof(older_xfer_t, tag) == offsetof(stagelink_xfer_t, tag),
               "the xfer's layout is the older header's");
_Static_assert(sizeof(older_topology_t) == sizeof(stagelink_topology_t) &&
                   offsetof(older_topology_t, tp_ranks) ==
                       offsetof(stagelink_topology_t, tp_ranks),
               "the topology's layout is the older header's");

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
static uint32_t  next_mb = 1;
static float     data[2][N];

static void said(stagelink_status_t st, const char *sentence)
{
    if (stage == 0) {
        printf("   %-9s %s\n", stagelink_status_string(st) + 10,
               st == STAGELINK_SUCCESS ? "" : sentence);
    }
}

/*
 * The sizes every struct passed in is tried with.  `later` holds the
 * struct of a later header (this header's, one field `future` appended);
 * `try` makes one use of it: a communicator, a transfer.
 */
static void size_cases(const char *what, uint32_t *struct_size, size_t size,
                       uint64_t *future, size_t later_size,
                       stagelink_status_t (*try)(void))
{
    static const struct {
        const char        *name;
        enum { AS_IS, SIZEOF, LATER, SIZEOF_PLUS_4 } size;
        uint64_t           future;
        uint32_t           value;
        stagelink_status_t want;
    } cases[] = {
        {"of this header", SIZEOF, 0, 0, STAGELINK_SUCCESS},
        {"struct_size 0", AS_IS, 0, 0, STAGELINK_SUCCESS},
        {"of a later header, its new field 0", LATER, 0, 0, STAGELINK_SUCCESS},
        {"of a later header, its new field set", LATER, 1, 0, STAGELINK_ERR_ABI},
        {"struct_size 4", AS_IS, 0, 4, STAGELINK_ERR_ABI},
        {"struct_size not a whole number of fields", SIZEOF_PLUS_4, 0, 0,
         STAGELINK_ERR_ABI},
        {"struct_size of garbage (uninitialised)", AS_IS, 0, 0x7ffc1230u,
         STAGELINK_ERR_ABI},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        stagelink_status_t got;

        *struct_size = cases[i].size == SIZEOF          ? (uint32_t)size
                       : cases[i].size == LATER         ? (uint32_t)later_size
                       : cases[i].size == SIZEOF_PLUS_4 ? (uint32_t)size + 4
                                                        : cases[i].value;
        *future      = cases[i].future;
        got          = try();
        CHECK(got == cases[i].want, "%s %s: %s, want %s", what, cases[i].name,
              stagelink_status_string(got),
              stagelink_status_string(cases[i].want));
    }
    *struct_size = 0;
    *future      = 0;
}

/* --- the config and the topology: a communicator each ------------------ */

static later_config_t   cfg;
static later_topology_t topo;
static int              tp_ranks[1];

static stagelink_status_t try_init(void)
{
    stagelink_comm_t  *comm = NULL;
    stagelink_status_t st;
    char               err[1024];

    st = stagelink_loader_comm_init(h.loader, &cfg.c, &comm, err, sizeof(err));
    if (st == STAGELINK_SUCCESS) {
        CHECK(h.plugin->comm_finalize(comm) == STAGELINK_SUCCESS,
              "finalize of a communicator from an ABI case");
    } else {
        CHECK(st != STAGELINK_ERR_ABI || strstr(err, "struct_size") != NULL ||
                  strstr(err, "past the") != NULL,
              "the sentence names the size or the tail: %s", err);
    }
    said(st, err);
    return st;
}

static void config_cases(void)
{
    cfg = (later_config_t){.c = {.tp_size = 1}};
    size_cases("config", &cfg.c.struct_size, sizeof(cfg.c), &cfg.future,
               sizeof(cfg), try_init);
    /* A host of the original v1: past `flags` its struct is someone
     * else's memory; a plugin that read it would call these. */
    cfg.c.struct_size = offsetof(stagelink_config_t, store_set);
    cfg.c.store_set   = (stagelink_store_set_fn_t)(uintptr_t)1;
    cfg.c.store_get   = (stagelink_store_get_fn_t)(uintptr_t)1;
    cfg.c.gather      = (stagelink_gather_fn_t)(uintptr_t)1;
    CHECK(try_init() == STAGELINK_SUCCESS,
          "config of the original v1, garbage past it");
}

/* The placement Megatron's rank order gives, explicitly. */
static void topology_cases(void)
{
    older_topology_t older;

    memset(&older, 0, sizeof(older)); /* as a host zeroes its struct */
    older.prev_rank = stage - 1;
    older.next_rank = stage == 0 ? 1 : -1;
    older.tp_ranks  = tp_ranks;
    tp_ranks[0]     = stage;
    cfg         = (later_config_t){.c = {.struct_size = sizeof(cfg.c),
                                         .tp_size     = 1,
                                         .topology    = &topo.t}};
    memset(&topo, 0, sizeof(topo));
    memcpy(&topo.t, &older, sizeof(older));
    CHECK(try_init() == STAGELINK_SUCCESS, "topology of the older header");
    size_cases("topology", &topo.t.struct_size, sizeof(topo.t), &topo.future,
               sizeof(topo), try_init);
}

/* --- transfers --------------------------------------------------------- */

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

/* A transfer of data[which] with microbatch `mb`, its struct_size 0. */
static stagelink_xfer_t xfer_of(int which, uint32_t mb)
{
    fill(which, mb);
    return sl_host_xfer(stage == 0 ? STAGELINK_PEER_NEXT : STAGELINK_PEER_PREV,
                        data[which], sizeof(data[which]), sizeof(float), mb, 0);
}

static stagelink_status_t post_wait(const stagelink_xfer_t *x)
{
    stagelink_request_t *req = NULL;
    stagelink_status_t   st  = (stage == 0)
                                   ? h.plugin->isend(h.comm, x, &req)
                                   : h.plugin->irecv(h.comm, x, &req);

    if (st == STAGELINK_SUCCESS) {
        CHECK(sl_host_report(&h, h.plugin->wait(h.comm, req), "wait") ==
                  STAGELINK_SUCCESS, "wait");
        CHECK(stage == 0 || holds(0, x->tag.microbatch), "data of microbatch %u",
              x->tag.microbatch);
    }
    said(st, h.plugin->last_error(h.comm));
    return st;
}

static later_xfer_t xfer;

/* Each case with a tag of its own; a refused one leaves it free. */
static stagelink_status_t try_xfer(void)
{
    stagelink_xfer_t   fresh = xfer_of(0, next_mb);
    stagelink_status_t st;

    fresh.struct_size = xfer.x.struct_size;
    xfer.x            = fresh;
    st                = post_wait(&xfer.x);
    next_mb += (st == STAGELINK_SUCCESS);
    return st;
}

static void xfer_cases(void)
{
    stagelink_xfer_t x = xfer_of(0, next_mb);
    older_xfer_t     older;

    memset(&older, 0, sizeof(older)); /* as a host zeroes its struct */
    older.peer      = x.peer;
    older.buf       = x.buf;
    older.nbytes    = x.nbytes;
    older.elem_size = x.elem_size;
    older.mem_type  = x.mem_type;
    older.tag       = x.tag;
    CHECK(post_wait((const stagelink_xfer_t *)(const void *)&older) ==
              STAGELINK_SUCCESS, "xfer of the older header");
    ++next_mb;
    memset(&xfer, 0, sizeof(xfer));
    size_cases("xfer", &xfer.x.struct_size, sizeof(xfer.x), &xfer.future,
               sizeof(xfer), try_xfer);
}

/* Two transfers in one batch, ops `op_size` apart (0: post_batch). */
static stagelink_status_t batch(const void *ops, size_t op_size, int sized)
{
    stagelink_request_t *req[2] = {(void *)1, (void *)1};
    stagelink_status_t   st;

    st = sized ? h.plugin->post_batch_sized(h.comm, ops, 2, op_size, req)
               : h.plugin->post_batch(h.comm, ops, 2, req);
    for (int i = 0; st == STAGELINK_SUCCESS && i < 2; ++i) {
        CHECK(sl_host_report(&h, h.plugin->wait(h.comm, req[i]), "wait") ==
                  STAGELINK_SUCCESS, "wait of op %d", i);
    }
    CHECK(st == STAGELINK_SUCCESS || (req[0] == NULL && req[1] == NULL),
          "a refused batch posts nothing and says so in its requests");
    said(st, h.plugin->last_error(h.comm));
    return st;
}

static void batch_cases(void)
{
    stagelink_op_kind_t kind = stage == 0 ? STAGELINK_OP_SEND : STAGELINK_OP_RECV;
    stagelink_op_t      ops[2];
    later_op_t          later[2];
    uint32_t            mb;

    for (int sized = 0; sized < 3; ++sized, next_mb += 2) {
        mb     = next_mb;
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
        later[i].xfer.x             = xfer_of(i, next_mb + (uint32_t)i);
        later[i].xfer.x.struct_size = sizeof(later[i].xfer);
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
          "ops whose xfer runs past op_size");
    CHECK(batch(ops, 4, 1) == STAGELINK_ERR_ABI, "op_size 4");
    CHECK(batch(ops, 1u << 20, 1) == STAGELINK_ERR_ABI, "op_size of garbage");
    mb = next_mb;
    CHECK(batch(later, sizeof(later[0]), 1) == STAGELINK_SUCCESS &&
              (stage == 0 || (holds(0, mb) && holds(1, mb + 1))),
          "ops of a later header, their new fields 0, on the refused tags");
    next_mb += 2;
}

/* Structs the plugin fills come in as garbage and go out whole. */
static void output_cases(void)
{
    stagelink_comm_info_t info;
    stagelink_counters_t  counters;

    memset(&info, 0xab, sizeof(info));
    CHECK(h.plugin->comm_info(h.comm, &info) == STAGELINK_SUCCESS &&
              info.rank == stage && info.world_size == 2 &&
              info.pp_index == stage &&
              memchr(info.node_id, 0, sizeof(info.node_id)) != NULL &&
              memchr(info.gather_backend, 0, sizeof(info.gather_backend)) != NULL,
          "comm_info into garbage: rank %d of %d", info.rank, info.world_size);
    memset(&counters, 0xab, sizeof(counters));
    CHECK(h.plugin->get_counters(h.comm, &counters) == STAGELINK_SUCCESS &&
              counters.transfers_completed == next_mb - 1,
          "counters into garbage: %llu transfers, want %u",
          (unsigned long long)counters.transfers_completed, next_mb - 1);
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
