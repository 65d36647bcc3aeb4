/*
 * The UCX context, worker and endpoints of a communicator, and how it
 * waits.  Inter-node peers get an endpoint from the peer's network-only
 * worker address: UCX takes two network namespaces of one host (or two
 * containers) for one node and would otherwise move the "inter-node" bytes
 * through shared memory; on real clusters the shared-memory lanes are
 * useless across nodes anyway.  Same-node peers get theirs from a second
 * context and worker that offer only transports inside the node (shared
 * memory, CMA, cuda_ipc): UCX 1.13 rates cuda_ipc below InfiniBand on
 * Hopper, and would otherwise send NVLink traffic through the NIC.  A
 * message arrives at the worker its endpoint names, so a receive from a
 * peer is posted on that peer's worker.  SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_bootstrap.h"
#include "sl_env.h"
#include "sl_log.h"
#include "sl_time.h"
#include "sl_topo.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>


/* The rail: the NIC nearest this rank's GPU, unless the user chose. */
static sl_status_t sl_ucx_rail(sl_comm_t *comm, sl_topo_choice_t *c)
{
    const char   *root = sl_env_get(SL_ENV_SYSFS_ROOT);
    sl_locality_t loc  = {comm->local_rank, comm->local_size};
    sl_topo_t    *topo = calloc(1, sizeof(*topo));
    sl_status_t   status;
    int           gpu;

    if (topo == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate the topology");
    }
    sl_topo_discover_nics(root, topo);
    SL_CHECK_GOTO(sl_topo_filter_nics(topo, &comm->err), out);
    gpu = sl_device_topo_gpus(comm, root, topo);
    SL_CHECK_GOTO(sl_topo_net_devices(topo, gpu, &loc, c, &comm->err), out);
    comm->rail = c->rail;
    snprintf(comm->rail_nic, sizeof(comm->rail_nic), "%s", c->devices);
out:
    free(topo);
    return status;
}

/* A context with tag matching and wakeup, and its one worker. */
static ucs_status_t sl_ucx_open(const ucp_config_t *config, const char *name,
                                int neps, ucp_context_h *ctx,
                                ucp_worker_h *worker)
{
    ucp_params_t        params;
    ucp_worker_params_t wparams;
    ucs_status_t        ucs;

    memset(&params, 0, sizeof(params));
    params.field_mask        = UCP_PARAM_FIELD_FEATURES |
                               UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                               UCP_PARAM_FIELD_NAME;
    params.features          = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.estimated_num_eps = (size_t)neps;
    params.name              = name;
    ucs = ucp_init(&params, config, ctx);
    if (ucs != UCS_OK) {
        *ctx = NULL;
        return ucs;
    }
    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    /* Serialized by the communicator's mutex (ucx_progress.c): the host
     * and the progress thread take turns; UCX's own lock would spin. */
    wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    ucs = ucp_worker_create(*ctx, &wparams, worker);
    if (ucs != UCS_OK) {
        ucp_cleanup(*ctx);
        *ctx    = NULL;
        *worker = NULL;
    }
    return ucs;
}

/* The same-node transports of the main context: ",posix,sysv,cma," */
typedef struct sl_ucx_local_tls {
    char   list[256];
    size_t used;
    int    am; /**< one of them carries messages (a shared-memory FIFO) */
} sl_ucx_local_tls_t;

static void sl_ucx_local_tl(void *arg, const char *tl, size_t tl_len,
                            const char *dev)
{
    sl_ucx_local_tls_t *t = arg;
    char                name[32];
    int                 n;

    (void)dev;
    if (!sl_ucx_tl_local(tl, tl_len) || tl_len + 3 > sizeof(name)) {
        return;
    }
    snprintf(name, sizeof(name), ",%.*s,", (int)tl_len, tl);
    if (strstr(t->list, name) != NULL) {
        return; /* listed for another device */
    }
    n = snprintf(t->list + t->used, sizeof(t->list) - t->used, "%s", name + 1);
    t->used += (n > 0 && (size_t)n < sizeof(t->list) - t->used) ? (size_t)n : 0;
    t->am   |= (tl_len == 4 && strncmp(tl, "sysv", 4) == 0) ||
               (tl_len == 5 && (strncmp(tl, "posix", 5) == 0 ||
                                strncmp(tl, "xpmem", 5) == 0));
}

/*
 * The same-node worker: a context of the main one's transports that stay
 * inside the node.  Not made where the user set UCX_TLS (they chose), nor
 * where no shared-memory FIFO works (same-node peers then use the main
 * worker, with one WARN).  Both ends of a pair decide alike from their
 * cards (sl_ucx_ep_create).
 */
static void sl_ucx_local_open(sl_comm_t *comm)
{
    sl_ucx_local_tls_t tls;
    ucp_config_t      *config;
    ucs_status_t       ucs;

    if (comm->local_size <= 1) {
        return; /* no peer on this node */
    }
    if (sl_env_raw(SL_ENV_UCX_TLS) != NULL) {
        SL_INFO(SL_SUBSYS_NET, "UCX_TLS=%s is set: same-node peers use the "
                "transports it names", sl_env_raw(SL_ENV_UCX_TLS));
        return;
    }
    memset(&tls, 0, sizeof(tls));
    tls.list[0] = ',';
    tls.used    = 1;
    sl_ucx_context_tls(comm->ucp_ctx, sl_ucx_local_tl, &tls);
    tls.list[tls.used - 1] = '\0'; /* the trailing comma */
    if (!tls.am) {
        comm->lanes_warned = 1; /* the endpoints' lanes say the rest */
        SL_WARN(SL_SUBSYS_NET, "UCX offers no shared-memory transport here "
                "(same-node ones found: %s): same-node peers go over the "
                "transports of the main worker; check /dev/shm and the "
                "shared-memory limits (ipcs -l)",
                tls.list[1] ? tls.list + 1 : "none");
        return;
    }
    ucs = ucp_config_read(NULL, NULL, &config);
    if (ucs == UCS_OK) {
        ucs = ucp_config_modify(config, "TLS", tls.list + 1);
        if (ucs == UCS_OK) {
            ucs = sl_ucx_open(config, "stagelink-local", comm->layout.tp_size + 2,
                              &comm->local_ctx, &comm->local_worker);
        }
        ucp_config_release(config);
    }
    if (ucs != UCS_OK) {
        comm->lanes_warned = 1;
        SL_WARN(SL_SUBSYS_NET, "cannot open a UCX worker over the same-node "
                "transports %s (%s): same-node peers go over the transports "
                "of the main worker", tls.list + 1, ucs_status_string(ucs));
        return;
    }
    SL_INFO(SL_SUBSYS_NET, "same-node worker: transports %s", tls.list + 1);
}

/* The same-node worker given up before its address went out: same-node
 * peers then use the main worker, on both ends alike (the card says so). */
static void sl_ucx_local_close(sl_comm_t *comm)
{
    ucp_worker_destroy(comm->local_worker);
    ucp_cleanup(comm->local_ctx);
    comm->local_worker = NULL;
    comm->local_ctx    = NULL;
}

/* One fd wakes the communicator for both workers: an epoll set of theirs.
 * Where it cannot be made, the same-node worker is given up (one WARN). */
static void sl_ucx_efd_join(sl_comm_t *comm)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int                fds[2] = {comm->efd, -1}, set, i, saved = 0;
    ucs_status_t       ucs;

    ucs = ucp_worker_get_efd(comm->local_worker, &fds[1]);
    set = (ucs == UCS_OK) ? epoll_create1(EPOLL_CLOEXEC) : -1;
    saved = (ucs == UCS_OK && set < 0) ? errno : 0;
    for (i = 0; set >= 0 && i < 2; ++i) {
        ev.data.fd = fds[i];
        if (epoll_ctl(set, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
            saved = errno;
            close(set);
            set = -1;
        }
    }
    if (set < 0) {
        SL_WARN(SL_SUBSYS_NET, "cannot wait on the same-node UCX worker "
                "beside the main one (%s): same-node peers go over the "
                "transports of the main worker",
                (ucs != UCS_OK) ? ucs_status_string(ucs) : strerror(saved));
        comm->lanes_warned = 1;
        sl_ucx_local_close(comm);
        return;
    }
    comm->efd = set;
}

sl_status_t sl_ucx_worker_create(sl_comm_t *comm)
{
    ucp_config_t       *config;
    sl_topo_choice_t    rail;
    ucs_status_t        ucs;

    SL_CHECK(sl_ucx_rail(comm, &rail));

    ucs = ucp_config_read(NULL, NULL, &config);
    if (ucs != UCS_OK) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX cannot read its configuration: %s; check the "
                        "UCX_* variables", ucs_status_string(ucs));
    }
    /* A fake tree's NICs are fictions UCX cannot open: there the rail is
     * chosen, logged and checked across nodes, and UCX picks devices. */
    if (rail.devices[0] != '\0' &&
        (rail.rail < 0 || sl_env_raw(SL_ENV_SYSFS_ROOT) == NULL)) {
        ucs = ucp_config_modify(config, "NET_DEVICES", rail.devices);
        if (ucs != UCS_OK) {
            ucp_config_release(config);
            return sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                            "network devices \"%s\" (%s) are not a valid UCX "
                            "device list: %s", rail.devices, rail.why,
                            ucs_status_string(ucs));
        }
    }
    SL_INFO(SL_SUBSYS_NET, "local rank %d/%d: network devices %s (%s)",
            comm->local_rank, comm->local_size,
            rail.devices[0] ? rail.devices : "chosen by UCX", rail.why);

    ucs = sl_ucx_open(config, "stagelink", comm->layout.tp_size + 2,
                      &comm->ucp_ctx, &comm->worker);
    ucp_config_release(config);
    if (ucs != UCS_OK) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX cannot open a context and worker: %s; check "
                        "UCX_TLS and UCX_NET_DEVICES", ucs_status_string(ucs));
    }
    ucs = ucp_worker_get_efd(comm->worker, &comm->efd);
    if (ucs != UCS_OK) {
        sl_ucx_worker_destroy(comm);
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX worker has no event fd (%s): the transports in "
                        "UCX_TLS must support wakeup",
                        ucs_status_string(ucs));
    }
    sl_ucx_local_open(comm);
    if (comm->local_worker != NULL) {
        sl_ucx_efd_join(comm);
    }
    return STAGELINK_SUCCESS;
}

static ucs_status_t sl_ucx_address(ucp_worker_h worker, int net_only,
                                   ucp_address_t **addr, size_t *len)
{
    ucp_worker_attr_t attr;
    ucs_status_t      ucs;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_WORKER_ATTR_FIELD_ADDRESS;
    if (net_only) {
        attr.field_mask   |= UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
        attr.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    }
    ucs = ucp_worker_query(worker, &attr);
    if (ucs == UCS_OK) {
        *addr = attr.address;
        *len  = attr.address_length;
    }
    return ucs;
}

static void sl_ucx_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    sl_ucx_callback_ran(((sl_ucx_peer_t *)arg)->comm);
    sl_peer_down(arg, 0, "UCX reported \"%s\" on its endpoint",
                       ucs_status_string(status));
}

static sl_status_t sl_ucx_ep_create(sl_comm_t *comm, sl_ucx_peer_t *peer,
                                    const sl_boot_blob_t *part)
{
    const char           *node = peer->node_id;
    const sl_rank_card_t *card = (const sl_rank_card_t *)(const void *)part->data;
    const char           *addr = part->data + sizeof(*card);
    int                   rank = peer->rank;
    ucp_ep_params_t       params;
    ucs_status_t          ucs;

    peer->comm       = comm;
    peer->inter_node = strcmp(node, comm->node_id) != 0;
    if (peer->inter_node && card->net_len == 0) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "rank %d is on another node (%s) but has no network "
                        "transport; check UCX_TLS and UCX_NET_DEVICES there",
                        rank, node);
    }
    /* Both ends decide alike, from each other's card and process (shared
     * memory and CMA reach only within one pid and IPC namespace). */
    peer->local  = comm->local_worker != NULL && card->local_len > 0 &&
                   sl_peer_shares_memory(peer);
    peer->worker = peer->local ? comm->local_worker : comm->worker;
    memset(&params, 0, sizeof(params));
    params.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address         = (const ucp_address_t *)(
        peer->inter_node ? addr + card->full_len
        : peer->local    ? addr + card->full_len + card->net_len : addr);
    /* UCX 1.13's shared-memory transports cannot report peer failure, so
     * PEER mode would push same-node traffic onto TCP loopback (design.md).
     * Same-node peers are watched through their pidfd instead (ucx_fault.c). */
    params.err_mode        = peer->inter_node ? UCP_ERR_HANDLING_MODE_PEER
                                              : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb  = sl_ucx_ep_error;
    params.err_handler.arg = peer;
    ucs = ucp_ep_create(peer->worker, &params, &peer->ep);
    if (ucs != UCS_OK) {
        peer->ep = NULL;
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "cannot create a UCX endpoint to rank %d (%s node "
                        "%s): %s", rank, peer->inter_node ? "other" : "same",
                        node, ucs_status_string(ucs));
    }
    sl_ucx_ep_lanes(peer);
    return STAGELINK_SUCCESS;
}

/* A peer's part: a card, then addresses of the lengths it gives. */
static sl_status_t sl_ucx_part_check(sl_comm_t *comm, int rank,
                                     const sl_boot_blob_t *part, int direct)
{
    sl_rank_card_t card;

    if (part->len < sizeof(card)) {
        return sl_error(&comm->err, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d's worker address part has %zu bytes, less "
                        "than its %zu-byte header", rank, part->len,
                        sizeof(card));
    }
    memcpy(&card, part->data, sizeof(card));
    if (card.version != SL_WIRE_VERSION) {
        /* Before wire versions the card began with an address length. */
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                        "rank %d speaks %s stagelink UCX wire than this rank's "
                        "(version %u, stagelink %s): every rank of a job must "
                        "run the same stagelink release", rank,
                        (card.version > 0 && card.version < 256)
                            ? "another version of the" : "an older",
                        SL_WIRE_VERSION, STAGELINK_VERSION_STRING);
    }
    if (part->len != sizeof(card) + (size_t)card.full_len + card.net_len +
                         card.local_len ||
        card.full_len == 0) {
        return sl_error(&comm->err, STAGELINK_ERR_BOOTSTRAP,
                        "rank %d's worker address part has %zu bytes for "
                        "addresses of %u, %u and %u bytes: ranks run "
                        "different stagelink versions?", rank, part->len,
                        card.full_len, card.net_len, card.local_len);
    }
    /* The automatic chunk size follows this; each rank must pick the same,
     * and its peers are all it can ask. */
    if (comm->chunk == 0 && (int)card.direct != direct) {
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                        "rank %d's UCX %s device memory directly on every "
                        "path and this rank's %s, so STAGELINK_CHUNK=auto "
                        "cannot pick one chunk size for both: give every "
                        "rank the same GPU, UCX, GPU-direct RDMA support and "
                        "STAGELINK_GPU_DIRECT, or set STAGELINK_CHUNK alike "
                        "on every rank",
                        rank, card.direct ? "moves" : "does not move",
                        direct ? "does" : "does not");
    }
    return STAGELINK_SUCCESS;
}

/*
 * Both ends of a stage boundary on one rail, or a warning naming both: on
 * a rail-optimised fabric each rail is a switch (often a subnet) of its
 * own, so another rail means spine hops, or no route at all.  It happens
 * when t·dp is not a multiple of the GPUs per node.
 */
static void sl_ucx_rail_check(const sl_comm_t *comm, const sl_ucx_peer_t *peer,
                              const sl_boot_blob_t *part)
{
    sl_rank_card_t card;

    memcpy(&card, part->data, sizeof(card));
    card.nic[sizeof(card.nic) - 1] = '\0';
    if (strcmp(peer->node_id, comm->node_id) == 0 || comm->rail < 0 ||
        card.rail < 0 || card.rail == comm->rail) {
        return;
    }
    SL_WARN(SL_SUBSYS_NET, "rank %d (node %s) uses NIC %s on rail %d, but "
            "its stage peer rank %d (node %s) uses NIC %s on rail %d: their "
            "traffic crosses rails (spine hops, or no route where rails are "
            "separate subnets); make t*dp a multiple of the GPUs per node, "
            "or give both ends the same rail with STAGELINK_NET_DEVICES",
            comm->layout.rank, comm->node_id, comm->rail_nic, comm->rail,
            peer->rank, peer->node_id, card.nic, (int)card.rail);
}

/* The endpoint slots of `rank` (sl_peer_at; this rank's own has none). */
static sl_status_t sl_ucx_connect_rank(sl_comm_t *comm, int rank,
                                       const sl_boot_blob_t *part)
{
    int k;

    for (k = 0; k < sl_peer_count(comm); ++k) {
        if (sl_peer_at(comm, k)->rank == rank) {
            SL_CHECK(sl_ucx_ep_create(comm, sl_peer_at(comm, k), part));
        }
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_ucx_connect(sl_comm_t *comm, sl_bootstrap_t *bs)
{
    ucp_address_t  *full = NULL, *net = NULL, *local = NULL;
    size_t          full_len, net_len = 0, local_len = 0, len;
    sl_rank_card_t  card;
    sl_boot_blob_t *parts = NULL;
    char           *mine = NULL;
    sl_status_t     status;
    ucs_status_t    ucs;
    int             i;

    ucs = sl_ucx_address(comm->worker, 0, &full, &full_len);
    if (ucs != UCS_OK) {
        full   = NULL;
        status = sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                          "cannot query the UCX worker address: %s",
                          ucs_status_string(ucs));
        goto out;
    }
    /* A worker without network transports (UCX_TLS=shm) has no such address. */
    if (sl_ucx_address(comm->worker, 1, &net, &net_len) != UCS_OK) {
        net     = NULL;
        net_len = 0;
    }
    if (comm->local_worker != NULL) {
        ucs = sl_ucx_address(comm->local_worker, 0, &local, &local_len);
        if (ucs != UCS_OK) {
            local  = NULL;
            status = sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                              "cannot query the same-node UCX worker's "
                              "address: %s", ucs_status_string(ucs));
            goto out;
        }
    }
    len = sizeof(card) + full_len + net_len + local_len;
    memset(&card, 0, sizeof(card));
    card.version  = SL_WIRE_VERSION;
    card.full_len = (uint32_t)full_len;
    card.net_len  = (uint32_t)net_len;
    card.local_len = (uint32_t)local_len;
    card.direct   = (uint32_t)sl_device_all_direct(comm);
    card.rail     = comm->rail;
    snprintf(card.nic, sizeof(card.nic), "%s", comm->rail_nic);
    if (len > SL_BOOTSTRAP_MAX_BLOCK) {
        status = sl_error(&comm->err, STAGELINK_ERR_BOOTSTRAP,
                          "UCX worker addresses of %zu, %zu and %zu bytes "
                          "exceed the bootstrap limit of %u", full_len,
                          net_len, local_len, SL_BOOTSTRAP_MAX_BLOCK);
        goto out;
    }
    mine  = malloc(len);
    parts = calloc((size_t)comm->npeers + 1, sizeof(*parts));
    if (mine == NULL || parts == NULL) {
        status = sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate the worker addresses of %d peers",
                          comm->npeers);
        goto out;
    }
    memcpy(mine, &card, sizeof(card));
    memcpy(mine + sizeof(card), full, full_len);
    if (net_len > 0) {
        memcpy(mine + sizeof(card) + full_len, net, net_len);
    }
    if (local_len > 0) {
        memcpy(mine + sizeof(card) + full_len + net_len, local, local_len);
    }
    SL_CHECK_GOTO(sl_bootstrap_exchange(bs, "addr", mine, len,
                                        comm->peer_ranks, comm->npeers, parts,
                                        &comm->err), out);
    for (i = 0; i < comm->npeers; ++i) {
        SL_CHECK_GOTO(sl_ucx_part_check(comm, comm->peer_ranks[i], &parts[i],
                                        (int)card.direct), out);
    }
    comm->all_direct = (int)card.direct;
    for (i = 0; i < comm->npeers; ++i) {
        SL_CHECK_GOTO(sl_ucx_connect_rank(comm, comm->peer_ranks[i],
                                          &parts[i]), out);
        if (comm->peer_ranks[i] == comm->prev.rank) {
            sl_ucx_rail_check(comm, &comm->prev, &parts[i]);
        }
        if (comm->peer_ranks[i] == comm->next.rank) {
            sl_ucx_rail_check(comm, &comm->next, &parts[i]);
        }
    }
    status = STAGELINK_SUCCESS;
out:
    sl_bootstrap_blobs_free(parts, comm->npeers);
    free(parts);
    free(mine);
    if (local != NULL) {
        ucp_worker_release_address(comm->local_worker, local);
    }
    if (net != NULL) {
        ucp_worker_release_address(comm->worker, net);
    }
    if (full != NULL) {
        ucp_worker_release_address(comm->worker, full);
    }
    return status;
}

void sl_ucx_ep_force_close(sl_ucx_peer_t *peer)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    req;

    if (peer->ep == NULL) {
        return;
    }
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags        = UCP_EP_CLOSE_FLAG_FORCE;
    req = ucp_ep_close_nbx(peer->ep, &param);
    peer->ep = NULL;
    if (UCS_PTR_IS_PTR(req)) {
        peer->close_req = req;
    }
}

static void sl_ucx_ep_close(sl_comm_t *comm, sl_ucx_peer_t *peer)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    req;
    double              deadline = sl_deadline(comm->timeout);
    ucs_status_t        ucs;

    if (peer->ep == NULL && peer->close_req == NULL) {
        return;
    }
    memset(&param, 0, sizeof(param));
    if (comm->fault != STAGELINK_SUCCESS) {
        /* After a failure or an abort nothing is flushed: a live peer may
         * have given up its receives, so our sends to it never end. */
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags        = UCP_EP_CLOSE_FLAG_FORCE;
    }
    /* Closed by force after a failure: only its completion is left. */
    req = (peer->ep != NULL) ? ucp_ep_close_nbx(peer->ep, &param)
                             : peer->close_req;
    peer->close_req = NULL;
    if (UCS_PTR_IS_PTR(req)) {
        do {
            sl_ucx_worker_progress(comm);
            ucs = ucp_request_check_status(req);
        } while (ucs == UCS_INPROGRESS && !sl_deadline_passed(deadline));
        if (ucs == UCS_INPROGRESS) {
            /* The peer is gone or stuck: drop the endpoint without flush. */
            ucp_request_cancel(peer->worker, req);
            SL_WARN(SL_SUBSYS_NET, "closing the endpoint to rank %d timed "
                    "out; dropped it", peer->rank);
        }
        ucp_request_free(req);
    }
    peer->ep = NULL;
}

void sl_ucx_worker_destroy(sl_comm_t *comm)
{
    int k;

    if (comm->worker != NULL) {
        sl_ucx_ep_close(comm, &comm->prev);
        sl_ucx_ep_close(comm, &comm->next);
        for (k = 0; comm->tp_peers != NULL && k < comm->layout.tp_size; ++k) {
            sl_ucx_ep_close(comm, &comm->tp_peers[k]);
        }
        ucp_worker_destroy(comm->worker);
        comm->worker = NULL;
    }
    if (comm->local_worker != NULL) {
        close(comm->efd); /* the epoll set of both workers' (efd_join) */
        ucp_worker_destroy(comm->local_worker);
        comm->local_worker = NULL;
    }
    free(comm->drain_left); /* nothing writes into it any more */
    comm->drain_left = NULL;
    /* After the workers: operations in flight until then may use them. */
    sl_mem_cleanup(comm);
    if (comm->local_ctx != NULL) {
        ucp_cleanup(comm->local_ctx);
        comm->local_ctx = NULL;
    }
    if (comm->ucp_ctx != NULL) {
        ucp_cleanup(comm->ucp_ctx);
        comm->ucp_ctx = NULL;
    }
}

unsigned sl_ucx_worker_progress(sl_comm_t *comm)
{
    unsigned events = ucp_worker_progress(comm->worker);

    if (comm->local_worker != NULL) {
        events += ucp_worker_progress(comm->local_worker);
    }
    return events;
}

ucs_status_t sl_ucx_worker_arm(sl_comm_t *comm)
{
    ucs_status_t ucs = ucp_worker_arm(comm->worker);

    if (ucs == UCS_OK && comm->local_worker != NULL) {
        ucs = ucp_worker_arm(comm->local_worker);
    }
    return ucs;
}

unsigned sl_ucx_progress(sl_comm_t *comm)
{
    unsigned events = 0, seen;
    int      i;

    /* One UCX round, then the hooks, and back to the caller, who checks
     * what it waits for: going on while UCX had work kept a host's wait
     * through a whole stream (UCX writes more each round while the socket
     * drains), so the next post waited, the window emptied and the link
     * idled.  Rounds go on only while a callback ran inside an operation a
     * hook posted (a receive matching a message already there completes
     * within its post): that follow-up is the hooks' before any sleep. */
    do {
        events += sl_ucx_worker_progress(comm);
        seen    = comm->callbacks;
        for (i = 0; i < comm->nhooks; ++i) {
            if (comm->hooks[i]->round != NULL) {
                comm->hooks[i]->round(comm);
            }
        }
    } while (comm->callbacks != seen);
    for (i = 0; i < comm->nhooks; ++i) {
        if (comm->hooks[i]->after != NULL) {
            comm->hooks[i]->after(comm);
        }
    }
    return events;
}

void sl_ucx_progress_drain(sl_comm_t *comm, double deadline)
{
    unsigned seen;

    do {
        seen = comm->callbacks;
    } while ((sl_ucx_progress(comm) != 0 || comm->callbacks != seen) &&
             !sl_deadline_passed(deadline));
}

void sl_ucx_progress_cb(void *comm)
{
    sl_ucx_progress_drain(comm, 0.0);
}

static void sl_ucx_flush_one(sl_comm_t *comm, ucp_worker_h worker,
                             double deadline)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    req;

    memset(&param, 0, sizeof(param));
    req = ucp_worker_flush_nbx(worker, &param);
    if (!UCS_PTR_IS_PTR(req)) {
        return;
    }
    while (ucp_request_check_status(req) == UCS_INPROGRESS &&
           !sl_deadline_passed(deadline)) {
        sl_ucx_progress(comm);
    }
    if (ucp_request_check_status(req) == UCS_INPROGRESS) {
        SL_WARN(SL_SUBSYS_NET, "flushing the UCX %s worker did not finish "
                "within the %.1f s grace of finalize",
                (worker == comm->worker) ? "main" : "same-node", comm->grace);
        ucp_request_cancel(worker, req);
    }
    ucp_request_free(req);
}

void sl_ucx_flush(sl_comm_t *comm, double deadline)
{
    sl_ucx_flush_one(comm, comm->worker, deadline);
    if (comm->local_worker != NULL) {
        sl_ucx_flush_one(comm, comm->local_worker, deadline);
    }
}

/* What sl_ucx_discard_unexpected dropped, for its one line. */
typedef struct sl_ucx_dropped {
    char   names[512];
    size_t used;
    int    count;
} sl_ucx_dropped_t;

/* Drops `worker`'s unexpected messages; 0 once a drop outlived `deadline`. */
static int sl_ucx_discard_one(sl_comm_t *comm, ucp_worker_h worker,
                              double deadline, sl_ucx_dropped_t *d)
{
    ucp_tag_recv_info_t info;
    ucp_request_param_t param;
    ucp_tag_message_h   msg;
    ucs_status_ptr_t    req;
    sl_tag_fields_t     f;
    void               *scratch;
    char               *names = d->names;
    size_t              used  = d->used;
    int                 dropped = d->count, n, left = 1;

    memset(&param, 0, sizeof(param));
    while ((msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info)) != NULL) {
        sl_tag_decode(info.sender_tag, &f);
        n = (f.cls == SL_TAG_CLASS_STAGE)
                ? snprintf(names + used, sizeof(d->names) - used, "%s%s "
                           "microbatch %u chunk %u (%zu bytes)",
                           dropped ? ", " : "", f.backward ? "backward"
                                                           : "forward",
                           f.microbatch, f.chunk, info.length)
                : snprintf(names + used, sizeof(d->names) - used, "%sa %zu-byte "
                           "control message", dropped ? ", " : "",
                           info.length);
        used = (n > 0 && (size_t)n < sizeof(d->names) - used) ? used + (size_t)n
                                                           : used;
        ++dropped;
        scratch = malloc(info.length ? info.length : 1);
        if (scratch == NULL) {
            break;
        }
        req = ucp_tag_msg_recv_nbx(worker, scratch, info.length, msg,
                                   &param);
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS &&
                   !sl_deadline_passed(deadline)) {
                sl_ucx_worker_progress(comm);
            }
            if (ucp_request_check_status(req) == UCS_INPROGRESS) {
                ucp_request_free(req); /* released by UCX once done */
                /* A rendezvous whose sender gave up: UCX may still write
                 * into the buffer until the worker is destroyed. */
                SL_INFO(SL_SUBSYS_NET, "dropping a %zu-byte message that "
                        "no receive took did not finish by finalize's "
                        "deadline; its buffer goes with the worker",
                        info.length);
                comm->drain_left = scratch;
                left             = 0;
                break;
            }
            ucp_request_free(req);
        }
        free(scratch);
    }
    d->used  = used;
    d->count = dropped;
    return left;
}

void sl_ucx_discard_unexpected(sl_comm_t *comm, double deadline)
{
    sl_ucx_dropped_t d = {.names = "", .used = 0, .count = 0};

    sl_ucx_progress_drain(comm, deadline); /* what reached this rank */
    if (sl_ucx_discard_one(comm, comm->worker, deadline, &d) &&
        comm->local_worker != NULL) {
        sl_ucx_discard_one(comm, comm->local_worker, deadline, &d);
    }
    if (d.count > 0) {
        /* Those of canceled or failed transfers, or sends nobody posted a
         * receive for (finalize's own sentence names the sender's). */
        SL_INFO(SL_SUBSYS_NET, "finalize dropped %d messages sent to this "
                "rank that no receive took: %s", d.count, d.names);
    }
}

void sl_ucx_param_init(ucp_request_param_t *param, void *user_data,
                       ucs_memory_type_t mem_type,
                       const stagelink_memh_t *memh,
                       const sl_ucx_peer_t *peer)
{
    ucp_mem_h ucp_memh = (memh == NULL) ? NULL
                         : (peer != NULL && peer->local) ? memh->ucp_memh_local
                                                         : memh->ucp_memh;

    memset(param, 0, sizeof(*param));
    param->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                          UCP_OP_ATTR_FIELD_USER_DATA |
                          UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param->user_data    = user_data;
    param->memory_type  = mem_type;
    if (mem_type == UCS_MEMORY_TYPE_CUDA) {
        /* UCX 1.13's inline path reads a small buffer on the CPU where its
         * memory-type cache is empty: device memory never takes it. */
        param->op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    }
    if (ucp_memh != NULL) {
        param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param->memh          = ucp_memh;
    }
}
