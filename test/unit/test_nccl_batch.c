/*
 * The NCCL plugin's post path without a GPU: the plugin's source is built
 * into this test, and a communicator is put together by hand with a fake
 * GPU (events that complete at once) and a fake NCCL table (counting the
 * sends and receives enqueued), so the checks before and around NCCL run
 * for real:
 *   - a successful post leaves no error sentence (the tag check must not
 *     find the request it just claimed);
 *   - a tag already in flight is refused, and so is the same (direction,
 *     kind, microbatch, chunk) twice in one batch, with nothing enqueued;
 *   - the same microbatch and chunk in another direction or kind is fine;
 *   - a batch that cannot get all its request slots, or whose NCCL group
 *     cannot be started, leaves every reqs[i] NULL and no slot taken; a
 *     failed event creation keeps its status;
 *   - a tensor of another device than the communicator's is refused,
 *     naming both; NCCL is called in the communicator's context, and the
 *     caller's own context is current again after each call;
 *   - with no device named or current, the rank's local rank picks its
 *     GPU (LOCAL_RANK 3 of two GPUs: device 1), not device 0.
 * SPDX-License-Identifier: MIT
 */
#include "check.h"

#include "nccl_plugin.c"

static int fail_events; /* event_create fails while set */
static int fail_group;  /* ncclGroupStart fails while set */
static int sends, recvs;

static int f_probe(char *why, size_t len)
{
    snprintf(why, len, "fake GPU");
    return 1;
}

static int buf_device; /* the device f_classify places every buffer on */

static stagelink_mem_type_t f_classify(const void *p, int *device)
{
    (void)p;
    *device = buf_device;
    return STAGELINK_MEM_CUDA;
}

/* Contexts: device 0's and 1's primary ones, and one the host made. */
static int           f_ctx[3];
static int          *f_cur;    /* current; NULL none */
static int          *f_at_send; /* what was current when NCCL was called */

static int   f_device_current(void) { return f_cur ? *f_cur : -1; }
static void *f_context_current(void) { return f_cur; }
static sl_status_t f_context_set(void *ctx, sl_errbuf_t *eb)
{
    (void)eb;
    f_cur = ctx;
    return STAGELINK_SUCCESS;
}
static sl_status_t f_device_set(int device, sl_errbuf_t *eb)
{
    return f_context_set(device < 0 ? NULL : &f_ctx[device], eb);
}

static sl_status_t f_event_create(void **ev, sl_errbuf_t *eb)
{
    if (fail_events) {
        return sl_error(eb, STAGELINK_ERR_TRANSPORT, "fake event_create failure");
    }
    *ev = malloc(1);
    return STAGELINK_SUCCESS;
}

static void f_event_destroy(void *ev) { free(ev); }

static sl_status_t f_event_record(void *ev, void *stream, sl_errbuf_t *eb)
{
    (void)ev, (void)stream, (void)eb;
    return STAGELINK_SUCCESS;
}

static int f_event_query(void *ev, sl_status_t *status, sl_errbuf_t *eb)
{
    (void)ev, (void)eb;
    *status = STAGELINK_SUCCESS;
    return 1;
}

/* The GPU without contexts, and the same with them. */
#define FAKE_GPU_EVENTS \
    .probe = f_probe, .classify = f_classify, .event_create = f_event_create, \
    .event_destroy = f_event_destroy, .event_record = f_event_record, \
    .event_query = f_event_query

static const sl_gpu_ops_t fake_gpu = {.name = "fake", FAKE_GPU_EVENTS};

/* Two GPUs on the node. */
static int f_pci_bus_ids(char (*ids)[16], int max, int *current)
{
    int d;

    for (d = 0; d < 2 && d < max; ++d) {
        snprintf(ids[d], 16, "0000:%02x:00.0", d + 1);
    }
    *current = f_device_current();
    return d;
}

static const sl_gpu_ops_t fake_gpu_ctx = {
    .name            = "fake with contexts",
    FAKE_GPU_EVENTS,
    .pci_bus_ids     = f_pci_bus_ids,
    .device_current  = f_device_current,
    .device_set      = f_device_set,
    .context_current = f_context_current,
    .context_set     = f_context_set,
};

static ncclResult_t n_ok(void) { return ncclSuccess; }
static ncclResult_t n_group_start(void)
{
    return fail_group ? ncclSystemError : ncclSuccess;
}
static ncclResult_t n_destroy(ncclComm_t comm) { (void)comm; return ncclSuccess; }

static ncclResult_t n_send(const void *buf, size_t count, ncclDataType_t type,
                           int peer, ncclComm_t comm, cudaStream_t stream)
{
    (void)buf, (void)count, (void)type, (void)peer, (void)comm, (void)stream;
    f_at_send = f_cur;
    ++sends;
    return ncclSuccess;
}

static ncclResult_t n_recv(void *buf, size_t count, ncclDataType_t type,
                           int peer, ncclComm_t comm, cudaStream_t stream)
{
    (void)buf, (void)count, (void)type, (void)peer, (void)comm, (void)stream;
    ++recvs;
    return ncclSuccess;
}

static const char *n_string(ncclResult_t r) { (void)r; return "fake"; }
static const char *n_last(ncclComm_t comm) { (void)comm; return "fake"; }

/* Every call done at once, no asynchronous error. */
static ncclResult_t n_async(ncclComm_t comm, ncclResult_t *state)
{
    (void)comm;
    *state = ncclSuccess;
    return ncclSuccess;
}

static const sl_nccl_api_t fake_nccl = {
    .CommGetAsyncError = n_async,
    .CommDestroy    = n_destroy,
    .CommAbort      = n_destroy,
    .Send           = n_send,
    .Recv           = n_recv,
    .GroupStart     = n_group_start,
    .GroupEnd       = n_ok,
    .GetErrorString = n_string,
    .GetLastError   = n_last,
};

/* Rank 1 of three stages (t = 1): both neighbours exist. */
static sl_ncomm_t *make_comm(int max_requests)
{
    sl_ncomm_t *c = calloc(1, sizeof(*c));

    pthread_mutex_init(&c->nccl_mu, NULL);
    c->gpu               = &fake_gpu;
    c->api               = &fake_nccl;
    c->set.mode          = STAGELINK_MODE_FULL;
    c->set.timeout       = 5;
    c->set.max_requests  = max_requests;
    c->reqs = calloc((size_t)max_requests, sizeof(*c->reqs));
    if (sl_layout_from_order(1, 3, 1, 3, &c->layout, &c->err) !=
            STAGELINK_SUCCESS ||
        sl_registry_add(&sl_live, c, &c->err) != STAGELINK_SUCCESS) {
        fprintf(stderr, "cannot set up the communicator: %s\n", c->err.msg);
        exit(1);
    }
    c->prev = (ncclComm_t)&c->prev; /* any non-NULL handle */
    c->next = (ncclComm_t)&c->next;
    return c;
}

static int in_use(const sl_ncomm_t *c)
{
    int i, n = 0;

    for (i = 0; i < c->set.max_requests; ++i) {
        n += c->reqs[i].in_use;
    }
    return n;
}

static char buf[64];

static stagelink_op_t op(stagelink_op_kind_t kind, stagelink_peer_t peer,
                         uint32_t mb, uint16_t chunk)
{
    stagelink_op_t o;

    memset(&o, 0, sizeof(o));
    o.kind               = kind;
    o.xfer.peer          = peer;
    o.xfer.buf           = buf;
    o.xfer.nbytes        = sizeof(buf);
    o.xfer.mem_type      = STAGELINK_MEM_CUDA;
    o.xfer.tag.microbatch = mb;
    o.xfer.tag.chunk     = chunk;
    return o;
}

/* Completes every request in reqs[0..n) through the vtable's wait. */
static void complete(sl_ncomm_t *c, stagelink_request_t **reqs, size_t n)
{
    size_t i;

    for (i = 0; i < n; ++i) {
        if (reqs[i] != NULL) {
            CHECK(stagelink_plugin_v1.wait(c, reqs[i]) == STAGELINK_SUCCESS,
                  "wait %zu: %s", i, c->err.msg);
            reqs[i] = NULL;
        }
    }
}

static const stagelink_plugin_v1_t *const P = &stagelink_plugin_v1;

static void drop_comm(sl_ncomm_t *c)
{
    sl_registry_remove(&sl_live, c);
    sl_ncomm_destroy(c);
}

/* A clean post leaves no error sentence behind; the same tag again while
 * in flight is refused, its request pointer NULL. */
static void tag_in_flight_case(sl_ncomm_t *c)
{
    stagelink_request_t *held[2], *req;
    stagelink_op_t       ops[2];
    stagelink_status_t   st;

    c->err.msg[0] = '\0';
    ops[0] = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 1, 0);
    st     = P->isend(c, &ops[0].xfer, &held[0]);
    CHECK(st == STAGELINK_SUCCESS && held[0] != NULL, "isend: %s", c->err.msg);
    CHECK(c->err.msg[0] == '\0',
          "a successful isend left an error sentence: %s", c->err.msg);
    c->err.msg[0] = '\0';
    ops[1] = op(STAGELINK_OP_RECV, STAGELINK_PEER_PREV, 1, 0);
    st     = P->irecv(c, &ops[1].xfer, &held[1]);
    CHECK(st == STAGELINK_SUCCESS && held[1] != NULL, "irecv: %s", c->err.msg);
    CHECK(c->err.msg[0] == '\0',
          "a successful irecv left an error sentence: %s", c->err.msg);
    req = (stagelink_request_t *)&st; /* garbage the call must clear */
    st  = P->isend(c, &ops[0].xfer, &req);
    CHECK(st == STAGELINK_ERR_TAG_IN_USE && req == NULL &&
              strstr(c->err.msg, "microbatch 1 chunk 0"),
          "tag in flight: %s (%s)", stagelink_status_string(st), c->err.msg);
    CHECK(in_use(c) == 2, "%d slots in use, expected 2", in_use(c));
    complete(c, held, 2);
}

/* Twice the same (kind, direction, microbatch, chunk) in one batch:
 * refused as a whole, nothing enqueued, no slot taken; the same for two
 * receives from one side. */
static void duplicate_in_batch_case(sl_ncomm_t *c)
{
    stagelink_request_t *reqs[3];
    stagelink_op_t       ops[3];
    stagelink_status_t   st;
    int                  s0 = sends, r0 = recvs, i;

    ops[0] = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 5, 3);
    ops[1] = op(STAGELINK_OP_RECV, STAGELINK_PEER_NEXT, 6, 3);
    ops[2] = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 5, 3);
    for (i = 0; i < 3; ++i) {
        reqs[i] = (stagelink_request_t *)&st;
    }
    st = P->post_batch(c, ops, 3, reqs);
    CHECK(st == STAGELINK_ERR_TAG_IN_USE, "duplicate tags in one batch: %s "
          "(%s)", stagelink_status_string(st), c->err.msg);
    CHECK(strstr(c->err.msg, "microbatch 5 chunk 3") != NULL,
          "the sentence does not name the tag: %s", c->err.msg);
    CHECK(sends == s0 && recvs == r0 && in_use(c) == 0,
          "a refused batch enqueued %d sends, %d receives, took %d slots",
          sends - s0, recvs - r0, in_use(c));
    CHECK(reqs[0] == NULL && reqs[1] == NULL && reqs[2] == NULL,
          "a refused batch left request pointers set");
    if (st == STAGELINK_SUCCESS) {
        complete(c, reqs, 3);
    }
    ops[0] = op(STAGELINK_OP_RECV, STAGELINK_PEER_PREV, 9, 0);
    ops[1] = op(STAGELINK_OP_RECV, STAGELINK_PEER_PREV, 9, 0);
    st     = P->post_batch(c, ops, 2, reqs);
    CHECK(st == STAGELINK_ERR_TAG_IN_USE, "two receives of one tag in one "
          "batch: %s", stagelink_status_string(st));
    if (st == STAGELINK_SUCCESS) {
        complete(c, reqs, 2);
    }
}

/* One microbatch and chunk in every kind and direction: all distinct. */
static void four_directions_case(sl_ncomm_t *c)
{
    stagelink_request_t *reqs[4];
    stagelink_op_t       ops[4];
    stagelink_status_t   st;
    int                  s0 = sends, r0 = recvs;

    ops[0] = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 7, 1); /* forward */
    ops[1] = op(STAGELINK_OP_SEND, STAGELINK_PEER_PREV, 7, 1); /* backward */
    ops[2] = op(STAGELINK_OP_RECV, STAGELINK_PEER_NEXT, 7, 1); /* backward */
    ops[3] = op(STAGELINK_OP_RECV, STAGELINK_PEER_PREV, 7, 1); /* forward */
    c->err.msg[0] = '\0';
    st = P->post_batch(c, ops, 4, reqs);
    CHECK(st == STAGELINK_SUCCESS && sends == s0 + 2 && recvs == r0 + 2,
          "four directions of one tag: %s (%s)", stagelink_status_string(st),
          c->err.msg);
    CHECK(c->err.msg[0] == '\0',
          "a successful batch left an error sentence: %s", c->err.msg);
    if (st == STAGELINK_SUCCESS) {
        complete(c, reqs, 4);
    }
}

/* Not enough slots for the batch: none taken, every pointer NULL. */
static void slots_short_case(sl_ncomm_t *c)
{
    stagelink_request_t *held[7], *reqs[2];
    stagelink_op_t       ops[2];
    stagelink_status_t   st;
    int                  before, s0, r0, i;

    for (i = 0; i < 7; ++i) { /* 7 of 8 slots in use */
        ops[0] = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 100 + (uint32_t)i, 0);
        CHECK(P->isend(c, &ops[0].xfer, &held[i]) == STAGELINK_SUCCESS,
              "filling slot %d: %s", i, c->err.msg);
    }
    ops[0] = op(STAGELINK_OP_RECV, STAGELINK_PEER_NEXT, 200, 0);
    ops[1] = op(STAGELINK_OP_RECV, STAGELINK_PEER_PREV, 200, 0);
    before = in_use(c);
    s0     = sends;
    r0     = recvs;
    st     = P->post_batch(c, ops, 2, reqs);
    CHECK(st == STAGELINK_ERR_NO_MEMORY && strstr(c->err.msg, "in flight"),
          "batch of 2 with one slot free: %s (%s)",
          stagelink_status_string(st), c->err.msg);
    CHECK(reqs[0] == NULL && reqs[1] == NULL,
          "a batch without slots left reqs[] = {%p, %p}", (void *)reqs[0],
          (void *)reqs[1]);
    CHECK(in_use(c) == before && sends == s0 && recvs == r0,
          "a batch without slots took %d slots, enqueued %d operations",
          in_use(c) - before, sends - s0 + recvs - r0);
    if (st == STAGELINK_SUCCESS) {
        complete(c, reqs, 2);
    }
    complete(c, held, 7);
}

/* NCCL refuses the group: the batch's slots come back, pointers NULL. */
static void group_refused_case(sl_ncomm_t *c)
{
    stagelink_request_t *reqs[2];
    stagelink_op_t       ops[2];
    stagelink_status_t   st;

    fail_group = 1;
    ops[0]     = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 300, 0);
    ops[1]     = op(STAGELINK_OP_RECV, STAGELINK_PEER_PREV, 300, 0);
    st         = P->post_batch(c, ops, 2, reqs);
    CHECK(st == STAGELINK_ERR_TRANSPORT && strstr(c->err.msg, "ncclGroupStart"),
          "ncclGroupStart failure: %s (%s)", stagelink_status_string(st),
          c->err.msg);
    CHECK(reqs[0] == NULL && reqs[1] == NULL && in_use(c) == 0,
          "after ncclGroupStart failed: reqs[] = {%p, %p}, %d slots in use",
          (void *)reqs[0], (void *)reqs[1], in_use(c));
    fail_group = 0;
}

/* A slot whose event cannot be made: that status, not NO_MEMORY. */
static void event_refused_case(sl_ncomm_t *c)
{
    stagelink_request_t *req = (stagelink_request_t *)c;
    stagelink_op_t       o   = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 1, 0);
    stagelink_status_t   st;

    fail_events = 1;
    st          = P->isend(c, &o.xfer, &req);
    CHECK(st == STAGELINK_ERR_TRANSPORT && req == NULL &&
              strstr(c->err.msg, "fake event_create failure") && in_use(c) == 0,
          "event creation failure: %s (%s), %d slots in use",
          stagelink_status_string(st), c->err.msg, in_use(c));
    fail_events = 0;
}

/* The communicator's device: with none named or current, local rank 3 of
 * a node of two GPUs takes GPU 1, not device 0; with the config's
 * device 1, the host keeps a context of its own between calls. */
static void device_choice_case(sl_ncomm_t *c)
{
    stagelink_config_t cfg  = {.struct_size = sizeof(cfg),
                               .flags = STAGELINK_CONFIG_DEVICE_SET, .device = 1};
    stagelink_config_t none = {.struct_size = sizeof(none)};

    f_ctx[0] = 0, f_ctx[1] = 1, f_ctx[2] = 0;
    c->gpu   = &fake_gpu_ctx;
    f_cur    = NULL;
    CHECK(sl_nccl_device(c, &none, 3) == STAGELINK_SUCCESS &&
          c->device == 1 && c->context == &f_ctx[1] && f_cur == NULL,
          "no device current, local rank 3 of 2 GPUs: device %d, "
          "context %p, the thread's afterwards %p", c->device, c->context,
          (void *)f_cur);
    f_cur = &f_ctx[2];
    CHECK(sl_nccl_device(c, &cfg, 0) == STAGELINK_SUCCESS && c->device == 1 &&
          c->context == &f_ctx[1] && f_cur == &f_ctx[2],
          "device of the config: %d, context %p, the host's kept: %d",
          c->device, c->context, f_cur == &f_ctx[2]);
}

/* A tensor of another device is refused, naming both; NCCL is called in
 * the communicator's context, and the caller's own is current again after
 * each call (none, for a thread that had none). */
static void device_context_case(sl_ncomm_t *c)
{
    stagelink_request_t *req;
    stagelink_op_t       o = op(STAGELINK_OP_SEND, STAGELINK_PEER_NEXT, 1, 0);
    stagelink_status_t   st;

    device_choice_case(c);
    buf_device = 0;
    st         = P->isend(c, &o.xfer, &req);
    CHECK(st == STAGELINK_ERR_INVALID_ARG && strstr(c->err.msg, "device 0") &&
          strstr(c->err.msg, "device 1"), "a tensor of device 0 on a "
          "communicator of device 1: %s (%s)", stagelink_status_string(st),
          c->err.msg);
    buf_device = 1;
    f_at_send  = NULL;
    st         = P->isend(c, &o.xfer, &req);
    CHECK(st == STAGELINK_SUCCESS && f_at_send == &f_ctx[1],
          "ncclSend called in context %p, want device 1's (%s)",
          (void *)f_at_send, c->err.msg);
    CHECK(f_cur == &f_ctx[2], "after isend the host's own context is gone");
    complete(c, &req, 1);
    CHECK(f_cur == &f_ctx[2], "after wait the host's own context is gone");
    f_cur = NULL;
    st    = P->isend(c, &o.xfer, &req);
    complete(c, &req, 1);
    CHECK(st == STAGELINK_SUCCESS && f_cur == NULL, "a thread without a "
          "context has one after the calls");
}

static const struct {
    const char *name;
    void (*run)(sl_ncomm_t *c);
    int         slots; /* the communicator's STAGELINK_MAX_REQUESTS */
} cases[] = {
    {"tag in flight", tag_in_flight_case, 8},
    {"duplicate tag in one batch", duplicate_in_batch_case, 8},
    {"one tag in four directions", four_directions_case, 8},
    {"too few slots for a batch", slots_short_case, 8},
    {"NCCL refuses the group", group_refused_case, 8},
    {"an event cannot be made", event_refused_case, 2},
    {"device and contexts", device_context_case, 2},
};

int main(void)
{
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        sl_ncomm_t *c      = make_comm(cases[i].slots);
        int         failed = check_failed;

        cases[i].run(c);
        CHECK(in_use(c) == 0, "%s: %d slots still in use", cases[i].name, in_use(c));
        drop_comm(c);
        printf("%-32s %s\n", cases[i].name, check_failed == failed ? "ok" : "FAILED");
    }
    return check_summary();
}
