/*
 * The UCX context, worker and endpoints of a communicator, and how it
 * waits.  Inter-node peers get an endpoint from the peer's network-only
 * worker address: UCX takes two network namespaces of one host (or two
 * containers) for one node and would otherwise move the "inter-node" bytes
 * through shared memory; on real clusters the shared-memory lanes are
 * useless across nodes anyway.  SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"

#include "sl_bootstrap.h"
#include "sl_env.h"
#include "sl_log.h"
#include "sl_time.h"
#include "sl_topo.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long a wait sleeps while sends to another node are in flight: from
 * 1 ms, doubled while nothing wakes it (a rendezvous send waiting for its
 * receiver is in flight too), reset by any event. */
#define SL_UCX_TX_POLL_MIN_MS 1
#define SL_UCX_TX_POLL_MAX_MS 4

/* How long a wait polls GPU work (copies, stream events) that wakes no fd,
 * yielding, before it looks only every 50 us: a chunk's copy takes
 * microseconds to a few hundred; a kernel the stream holds a send behind
 * may take milliseconds, where the 50 us naps cost nothing that matters. */
#define SL_UCX_BUSY_POLL_S 1e-3

typedef struct sl_rank_card {
    uint32_t full_len; /**< worker address with every transport */
    uint32_t net_len;  /**< network-only worker address */
    uint32_t direct;   /**< this rank's UCX moves device memory itself */
} sl_rank_card_t;

/* The rail: the NIC nearest this rank's GPU, unless the user chose. */
static sl_status_t sl_ucx_rail(sl_comm_t *comm,
                               char devices[SL_TOPO_DEVICES_LEN], char *why,
                               size_t why_len)
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
    gpu    = sl_device_topo_gpus(comm, root, topo);
    status = sl_topo_net_devices(topo, gpu, &loc, devices, why, why_len,
                                 &comm->err);
    free(topo);
    return status;
}

sl_status_t sl_ucx_worker_create(sl_comm_t *comm)
{
    ucp_params_t        params;
    ucp_worker_params_t wparams;
    ucp_config_t       *config;
    char                devices[SL_TOPO_DEVICES_LEN], why[256];
    ucs_status_t        ucs;

    SL_CHECK(sl_ucx_rail(comm, devices, why, sizeof(why)));

    ucs = ucp_config_read(NULL, NULL, &config);
    if (ucs != UCS_OK) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX cannot read its configuration: %s; check the "
                        "UCX_* variables", ucs_status_string(ucs));
    }
    if (devices[0] != '\0') {
        ucs = ucp_config_modify(config, "NET_DEVICES", devices);
        if (ucs != UCS_OK) {
            ucp_config_release(config);
            return sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                            "network devices \"%s\" (%s) are not a valid UCX "
                            "device list: %s", devices, why,
                            ucs_status_string(ucs));
        }
    }
    SL_INFO(SL_SUBSYS_NET, "local rank %d/%d: network devices %s (%s)",
            comm->local_rank, comm->local_size,
            devices[0] ? devices : "chosen by UCX", why);

    memset(&params, 0, sizeof(params));
    params.field_mask        = UCP_PARAM_FIELD_FEATURES |
                               UCP_PARAM_FIELD_ESTIMATED_NUM_EPS |
                               UCP_PARAM_FIELD_NAME;
    params.features          = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.estimated_num_eps = (size_t)comm->layout.tp_size + 2;
    params.name              = "stagelink";
    ucs = ucp_init(&params, config, &comm->ucp_ctx);
    ucp_config_release(config);
    if (ucs != UCS_OK) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "ucp_init failed: %s; check UCX_TLS and "
                        "UCX_NET_DEVICES", ucs_status_string(ucs));
    }

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    ucs = ucp_worker_create(comm->ucp_ctx, &wparams, &comm->worker);
    if (ucs != UCS_OK) {
        ucp_cleanup(comm->ucp_ctx);
        comm->ucp_ctx = NULL;
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "ucp_worker_create failed: %s",
                        ucs_status_string(ucs));
    }
    ucs = ucp_worker_get_efd(comm->worker, &comm->efd);
    if (ucs != UCS_OK) {
        sl_ucx_worker_destroy(comm);
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX worker has no event fd (%s): the transports in "
                        "UCX_TLS must support wakeup",
                        ucs_status_string(ucs));
    }
    return STAGELINK_SUCCESS;
}

static ucs_status_t sl_ucx_address(sl_comm_t *comm, int net_only,
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
    ucs = ucp_worker_query(comm->worker, &attr);
    if (ucs == UCS_OK) {
        *addr = attr.address;
        *len  = attr.address_length;
    }
    return ucs;
}

static void sl_ucx_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    sl_ucx_callback_ran();
    sl_fault_peer_down(arg, 0, "UCX reported \"%s\" on its endpoint",
                       ucs_status_string(status));
}

static sl_status_t sl_ucx_ep_create(sl_comm_t *comm, sl_ucx_peer_t *peer,
                                    int rank, const sl_rank_card_t *cards,
                                    const char *blobs, size_t blob_len)
{
    const sl_rank_card_t *card  = &cards[rank];
    const char           *node  = comm->node_ids[rank];
    const char           *blob  = blobs + (size_t)rank * blob_len;
    ucp_ep_params_t       params;
    ucs_status_t          ucs;

    peer->comm       = comm;
    peer->rank       = rank;
    peer->inter_node = strcmp(node, comm->node_id) != 0;
    if (peer->inter_node && card->net_len == 0) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "rank %d is on another node (%s) but has no network "
                        "transport; check UCX_TLS and UCX_NET_DEVICES there",
                        rank, node);
    }
    memset(&params, 0, sizeof(params));
    params.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address         = (const ucp_address_t *)(peer->inter_node
                                 ? blob + card->full_len : blob);
    /* UCX 1.13's shared-memory transports cannot report peer failure, so
     * PEER mode would push same-node traffic onto TCP loopback (measured:
     * 1.8 instead of ~10 GB/s).  Same-node peers are watched through their
     * pidfd instead (ucx_fault.c). */
    params.err_mode        = peer->inter_node ? UCP_ERR_HANDLING_MODE_PEER
                                              : UCP_ERR_HANDLING_MODE_NONE;
    params.err_handler.cb  = sl_ucx_ep_error;
    params.err_handler.arg = peer;
    ucs = ucp_ep_create(comm->worker, &params, &peer->ep);
    if (ucs != UCS_OK) {
        peer->ep = NULL;
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "cannot create a UCX endpoint to rank %d (%s node "
                        "%s): %s", rank, peer->inter_node ? "other" : "same",
                        node, ucs_status_string(ucs));
    }
    SL_INFO(SL_SUBSYS_NET, "endpoint to rank %d: %s", rank,
            peer->inter_node ? "inter-node, network transports only"
                             : "same node, all transports");
    return STAGELINK_SUCCESS;
}

sl_status_t sl_ucx_connect(sl_comm_t *comm, sl_bootstrap_t *bs)
{
    int             world = comm->layout.world_size;
    ucp_address_t  *full = NULL, *net = NULL;
    size_t          full_len, net_len = 0, blob_len = 0;
    sl_rank_card_t  card, *cards = NULL;
    char           *blob = NULL, *blobs = NULL;
    sl_status_t     status;
    ucs_status_t    ucs;
    int             r, k;

    ucs = sl_ucx_address(comm, 0, &full, &full_len);
    if (ucs != UCS_OK) {
        full   = NULL;
        status = sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                          "cannot query the UCX worker address: %s",
                          ucs_status_string(ucs));
        goto out;
    }
    /* A worker without network transports (UCX_TLS=shm) has no such address. */
    if (sl_ucx_address(comm, 1, &net, &net_len) != UCS_OK) {
        net     = NULL;
        net_len = 0;
    }
    memset(&card, 0, sizeof(card));
    card.full_len = (uint32_t)full_len;
    card.net_len  = (uint32_t)net_len;
    card.direct   = (uint32_t)(comm->gpu_usable && comm->ucx_cuda);

    cards = calloc((size_t)world, sizeof(*cards));
    if (cards == NULL) {
        status = sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d rank cards", world);
        goto out;
    }
    SL_CHECK_GOTO(sl_bootstrap_allgather(bs, &card, cards, sizeof(card),
                                         &comm->err), out);
    comm->all_direct = 1;
    for (r = 0; r < world; ++r) {
        size_t len = (size_t)cards[r].full_len + cards[r].net_len;
        blob_len   = (len > blob_len) ? len : blob_len;
        comm->all_direct = comm->all_direct && cards[r].direct;
    }
    if (blob_len > SL_BOOTSTRAP_MAX_BLOCK) {
        status = sl_error(&comm->err, STAGELINK_ERR_BOOTSTRAP,
                          "a UCX worker address of %zu bytes exceeds the "
                          "bootstrap limit of %u", blob_len,
                          SL_BOOTSTRAP_MAX_BLOCK);
        goto out;
    }
    blob  = calloc(1, blob_len);
    blobs = calloc((size_t)world, blob_len);
    if (blob == NULL || blobs == NULL) {
        status = sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d worker addresses of %zu bytes",
                          world, blob_len);
        goto out;
    }
    memcpy(blob, full, full_len);
    if (net_len > 0) {
        memcpy(blob + full_len, net, net_len);
    }
    SL_CHECK_GOTO(sl_bootstrap_allgather(bs, blob, blobs, blob_len,
                                         &comm->err), out);

    if (comm->layout.prev_rank >= 0) {
        SL_CHECK_GOTO(sl_ucx_ep_create(comm, &comm->prev,
                                       comm->layout.prev_rank, cards, blobs,
                                       blob_len), out);
    }
    if (comm->layout.next_rank >= 0) {
        SL_CHECK_GOTO(sl_ucx_ep_create(comm, &comm->next,
                                       comm->layout.next_rank, cards, blobs,
                                       blob_len), out);
    }
    for (k = 0; k < comm->layout.tp_size; ++k) {
        if (k != comm->layout.tp_index) {
            SL_CHECK_GOTO(sl_ucx_ep_create(comm, &comm->tp_peers[k],
                                           comm->layout.tp_ranks[k], cards,
                                           blobs, blob_len), out);
        }
    }
    status = STAGELINK_SUCCESS;
out:
    free(blobs);
    free(blob);
    free(cards);
    if (net != NULL) {
        ucp_worker_release_address(comm->worker, net);
    }
    if (full != NULL) {
        ucp_worker_release_address(comm->worker, full);
    }
    return status;
}

/*
 * UCX 1.13's TCP transport does not wake the worker's event fd when a full
 * socket becomes writable again: what it buffered then waits for the next
 * progress call (seen: a rank asleep in poll() with chunks for a peer still
 * queued, the peer waiting for them until its deadline; stagelink_stress
 * seed 667193401861 over two namespaces).  So while sends to another node
 * are in flight, and for a moment after the last one (an eager send is
 * complete for us while UCX still holds its bytes), a wait sleeps briefly.
 * (Flushing the endpoints to find out tripped an assertion in UCX's TCP
 * transport when the peer closed: tcp_ep.c PUT_TX_WAITING_ACK.)
 */
static int sl_ucx_tx_pending(const sl_comm_t *comm)
{
    return comm->net_sends > 0 || sl_time_now() < comm->net_quiet_at;
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
            ucp_worker_progress(comm->worker);
            ucs = ucp_request_check_status(req);
        } while (ucs == UCS_INPROGRESS && !sl_deadline_passed(deadline));
        if (ucs == UCS_INPROGRESS) {
            /* The peer is gone or stuck: drop the endpoint without flush. */
            ucp_request_cancel(comm->worker, req);
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
    if (comm->ucp_ctx != NULL) {
        /* After the worker: operations in flight until then may use them. */
        sl_mem_cleanup(comm);
        ucp_cleanup(comm->ucp_ctx);
        comm->ucp_ctx = NULL;
    }
}

void sl_ucx_progress_register(sl_comm_t *comm, const sl_progress_hook_t *hook)
{
    /* Fixed at build time: every subsystem registers once. */
    if (comm->nhooks < SL_MAX_PROGRESS_HOOKS) {
        comm->hooks[comm->nhooks++] = hook;
    }
}

atomic_uint sl_ucx_callbacks;

void sl_ucx_progress(sl_comm_t *comm)
{
    unsigned events, seen;
    int      i;

    /* One UCX round at a time: a round may serve a large copy, and the
     * chunks it freed are posted before the next one.  A round goes on
     * while it did anything: UCX progressed, or a callback of ours ran,
     * also inside an operation a hook posted (a receive matching a
     * message already there completes within its post), whose follow-up
     * is the hooks' to do (seed 487761976442 over two namespaces drained
     * a mismatched sender one chunk per deadline). */
    do {
        seen   = atomic_load_explicit(&sl_ucx_callbacks, memory_order_relaxed);
        events = ucp_worker_progress(comm->worker);
        for (i = 0; i < comm->nhooks; ++i) {
            if (comm->hooks[i]->round != NULL) {
                comm->hooks[i]->round(comm);
            }
        }
    } while (events != 0 ||
             atomic_load_explicit(&sl_ucx_callbacks, memory_order_relaxed) !=
                 seen);
    for (i = 0; i < comm->nhooks; ++i) {
        if (comm->hooks[i]->after != NULL) {
            comm->hooks[i]->after(comm);
        }
    }
}

/* Whether a subsystem waits for something that does not wake the fd. */
static int sl_ucx_hooks_busy(const sl_comm_t *comm)
{
    int i;

    for (i = 0; i < comm->nhooks; ++i) {
        if (comm->hooks[i]->busy != NULL && comm->hooks[i]->busy(comm)) {
            return 1;
        }
    }
    return 0;
}

void sl_ucx_progress_cb(void *comm)
{
    sl_ucx_progress(comm);
}

void sl_ucx_flush(sl_comm_t *comm)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    req;
    double              deadline = sl_deadline(comm->timeout);

    memset(&param, 0, sizeof(param));
    req = ucp_worker_flush_nbx(comm->worker, &param);
    if (!UCS_PTR_IS_PTR(req)) {
        return;
    }
    while (ucp_request_check_status(req) == UCS_INPROGRESS &&
           !sl_deadline_passed(deadline)) {
        sl_ucx_progress(comm);
    }
    if (ucp_request_check_status(req) == UCS_INPROGRESS) {
        SL_WARN(SL_SUBSYS_NET, "flushing the UCX worker timed out after "
                "%.1f s", comm->timeout);
        ucp_request_cancel(comm->worker, req);
    }
    ucp_request_free(req);
}

void sl_ucx_discard_unexpected(sl_comm_t *comm)
{
    ucp_tag_recv_info_t info;
    ucp_request_param_t param;
    ucp_tag_message_h   msg;
    ucs_status_ptr_t    req;
    void               *scratch;
    int                 dropped = 0;
    double              deadline = sl_deadline(comm->timeout);

    sl_ucx_progress(comm);
    memset(&param, 0, sizeof(param));
    while ((msg = ucp_tag_probe_nb(comm->worker, 0, 0, 1, &info)) != NULL) {
        scratch = malloc(info.length ? info.length : 1);
        if (scratch == NULL) {
            break;
        }
        req = ucp_tag_msg_recv_nbx(comm->worker, scratch, info.length, msg,
                                   &param);
        if (UCS_PTR_IS_PTR(req)) {
            while (ucp_request_check_status(req) == UCS_INPROGRESS &&
                   !sl_deadline_passed(deadline)) {
                ucp_worker_progress(comm->worker);
            }
            if (ucp_request_check_status(req) == UCS_INPROGRESS) {
                /* A rendezvous whose sender is gone: UCX may still write
                 * into the scratch buffer, so it is left to the process. */
                SL_WARN(SL_SUBSYS_NET, "dropping a %zu-byte message of a "
                        "canceled transfer did not finish in %.1f s; left "
                        "it", info.length, comm->timeout);
                break;
            }
            ucp_request_free(req);
        }
        free(scratch);
        ++dropped;
    }
    if (dropped > 0) {
        SL_INFO(SL_SUBSYS_NET, "dropped %d messages of canceled or failed "
                "transfers", dropped);
    }
}

void sl_ucx_param_init(ucp_request_param_t *param, void *user_data,
                       ucs_memory_type_t mem_type,
                       const stagelink_memh_t *memh)
{
    memset(param, 0, sizeof(*param));
    param->op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                          UCP_OP_ATTR_FIELD_USER_DATA |
                          UCP_OP_ATTR_FIELD_MEMORY_TYPE;
    param->user_data    = user_data;
    param->memory_type  = mem_type;
    if (memh != NULL && memh->ucp_memh != NULL) {
        param->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param->memh          = memh->ucp_memh;
    }
}

sl_status_t sl_ucx_wait(sl_comm_t *comm, sl_req_t *req)
{
    return sl_ucx_wait_until(comm, req, sl_deadline(comm->timeout), 0.0);
}

sl_status_t sl_ucx_wait_until(sl_comm_t *comm, sl_req_t *req,
                              double deadline, double slice_end)
{
    double        spin_until = sl_time_now() + comm->spin;
    double        busy_until = -1.0, now, wake;
    int           ready, tx_ms = SL_UCX_TX_POLL_MIN_MS, tx_wait;
    unsigned      seen;
    ucs_status_t  ucs;

    for (;;) {
        sl_ucx_progress(comm);
        if (sl_req_done(req)) {
            return STAGELINK_SUCCESS;
        }
        if (sl_deadline_passed(slice_end) && !sl_deadline_passed(deadline)) {
            return STAGELINK_IN_PROGRESS;
        }
        if (sl_deadline_passed(deadline)) {
            char pending[512];

            sl_req_describe_pending(req, pending, sizeof(pending));
            return sl_error(&comm->err, STAGELINK_ERR_TIMEOUT,
                            "%s of microbatch %u chunk %u did not complete "
                            "in %.1f s, waiting for: %s; the request stays in "
                            "flight: wait again or cancel it",
                            sl_req_what(req), req->xfer.tag.microbatch, req->xfer.tag.chunk,
                            comm->timeout, pending);
        }
        if (sl_time_now() < spin_until) {
            continue;
        }
        if (sl_ucx_hooks_busy(comm)) {
            /* GPU copies and stream events do not wake the UCX event fd.
             * With cores to spare (spin > 0) they are polled, yielding, for
             * up to SL_UCX_BUSY_POLL_S: a 50 us nanosleep overshoots on
             * virtual machines (on an H200 VM a staged 1-byte tensor took
             * 294 us one way, its four copies 7.5 us each).  On an
             * oversubscribed node the peers need the core more than this
             * rank needs the microseconds. */
            struct timespec ts = {0, 50000};

            now        = sl_time_now();
            busy_until = (busy_until < 0) ? now + SL_UCX_BUSY_POLL_S : busy_until;
            if (comm->spin > 0 && now < busy_until) {
                sched_yield();
            } else {
                nanosleep(&ts, NULL);
            }
            continue;
        }
        busy_until = -1.0;
        /* UCX may be armed only right after a progress call that found
         * nothing to do (ucp_worker_arm's contract): the hooks ran after
         * the last one and may have posted operations whose next step
         * waits in UCX's progress queue, which no fd reports.  That call
         * can also run a completion UCX deferred without counting it: a
         * callback of ours that ran means the hooks have its follow-up to
         * do before any sleep. */
        seen = atomic_load_explicit(&sl_ucx_callbacks, memory_order_relaxed);
        if (ucp_worker_progress(comm->worker) != 0 ||
            atomic_load_explicit(&sl_ucx_callbacks, memory_order_relaxed) !=
                seen) {
            continue;
        }
        /* Eight ranks may share two cores: sleep until UCX has events. */
        ucs = ucp_worker_arm(comm->worker);
        if (ucs == UCS_ERR_BUSY) {
            continue;
        }
        if (ucs != UCS_OK) {
            return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                            "ucp_worker_arm failed: %s",
                            ucs_status_string(ucs));
        }
        /* Same-node peers' pidfds wake us too when one of them dies; a
         * fault held back for a direct sighting, when its grace ends. */
        wake    = sl_deadline_earlier(sl_deadline_earlier(deadline, slice_end),
                                      sl_fault_wake_at(comm));
        tx_wait = sl_ucx_tx_pending(comm);
        ready   = poll(comm->pfds, (nfds_t)comm->npfds,
                       tx_wait ? tx_ms : sl_deadline_ms(wake));
        tx_ms   = (ready == 0 && tx_wait && tx_ms < SL_UCX_TX_POLL_MAX_MS)
                      ? 2 * tx_ms : (ready != 0 ? SL_UCX_TX_POLL_MIN_MS : tx_ms);
        if (ready < 0 && errno != EINTR) {
            return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                            "poll on the UCX event fd failed: %s",
                            strerror(errno));
        }
        if (ready > 0 && comm->npfds > 1) {
            sl_fault_polled(comm);
        }
    }
}
