/*
 * Chunked transfers (which messages go in chunks: sl_sub_in_chunks in
 * ucx_sub.c): ordered chunks on one tag, their size derived from the
 * message's (sl_chunked_size), and above one chunk a 16-byte length header
 * first, so a receiver knows the sender's size, and so its chunks, before
 * any data and drains a mismatched sender instead of leaving its chunks on
 * the wire (src/staging decides what happens next).  Each
 * side moves its chunks its own way: in place (host memory, or device memory
 * when UCX has CUDA), or through pinned bounce buffers (device memory, UCX
 * without CUDA).  A TP rank forwards each chunk of its shard to its peers as
 * soon as it has landed, so the gather overlaps the shard's transfer.
 * SPDX-License-Identifier: MIT
 */
#include "ucx_comm.h"
#include "gather.h"

#include "sl_log.h"
#include "sl_settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Frees a list; a copy still in flight (a transfer detached or abandoned
 * mid-way, after a peer's failure) gives its event back to the runtime. */
static void sl_staged_free_list(sl_comm_t *comm, sl_staged_t *s)
{
    sl_staged_t *next;
    int          i;

    for (; s != NULL; s = next) {
        next = s->next;
        for (i = 0; i < comm->nbufs; ++i) {
            if (s->slots[i].in_use && s->slots[i].copy != NULL) {
                comm->gpu->event_destroy(s->slots[i].copy);
            }
        }
        free(s->slots);
        free(s);
    }
}

/* Every transition of sl_chunked_state_t (ucx_comm.h); one that the
 * machine does not make is a bug, said at once. */
static void sl_chunked_to(sl_staged_t *st, sl_chunked_state_t to)
{
    static const char *const names[] = {"moving", "awaiting the header",
                                        "draining", "detached"};
    int ok;

    switch (st->state) {
    case SL_CHUNKED_MOVING:
        ok = (to == SL_CHUNKED_AWAITING || to == SL_CHUNKED_DRAINING ||
              to == SL_CHUNKED_DETACHED);
        break;
    case SL_CHUNKED_AWAITING:
        ok = (to != SL_CHUNKED_AWAITING);
        break;
    case SL_CHUNKED_DRAINING:
        ok = (to == SL_CHUNKED_DETACHED);
        break;
    default:
        ok = 0;
        break;
    }
    if (!ok) {
        SL_WARN(SL_SUBSYS_NET, "internal: a chunked transfer went from %s to "
                "%s, which it never should", names[st->state], names[to]);
    }
    st->state = to;
}

/* The tag of chunk `index` (a message of one chunk has the plain tag). */
static uint64_t sl_chunk_tag(const sl_staged_t *st, size_t index)
{
    return st->framed ? sl_tag_chunk(st->sub->tag, index) : st->sub->tag;
}

/*
 * STAGELINK_CHUNK=auto.  Every chunk is one tagged message, so one
 * rendezvous: a few microseconds of protocol that a staged chunk spends
 * anyway on its copies, but that at NVLink or HDR rates outweighs moving
 * 1 MiB (on an H200, two processes: 1 MiB chunks carried a 64 MiB tensor at
 * 107 GB/s, 16 MiB chunks at 1.3 TB/s, UCX's own limit 1.7 TB/s).  So where
 * every rank's UCX moves device memory directly on every path
 * (sl_device_all_direct), chunks are 16 MiB.
 *
 * Elsewhere, in scatter_gather, the chunk is also the unit a TP rank
 * relays: it forwards chunk k of its shard only once chunk k has landed,
 * so the gather trails the shard by a chunk.  A message above 1 MiB is
 * cut in sixteenths, within 256 KiB (below which per-message costs show)
 * and 1 MiB (the bounce buffers); one of at most 1 MiB still goes whole,
 * since each chunk is relayed to t - 1 peers (docs/model.md has the
 * measurements).
 *
 * The chunk of a message depends on its length and on what every rank
 * agreed, so both ends cut it alike, and a receiver that learns a
 * mismatched sender's length from its header knows its chunks too.
 */
#define SL_CHUNK_DIRECT     ((size_t)16 << 20)
#define SL_CHUNK_STAGED     ((size_t)1 << 20)
#define SL_CHUNK_STAGED_MIN ((size_t)256 << 10)
#define SL_CHUNKS_PER_MSG   16u
#define SL_CHUNK_ALIGN      ((size_t)4096)

int sl_chunked_relayed(const sl_comm_t *comm)
{
    return comm->mode == STAGELINK_MODE_SCATTER_GATHER &&
           comm->layout.tp_size > 1;
}

/* The chunk, then the bounce buffers of that chunk (auto: by bytes). */
static void sl_chunked_buffers(sl_comm_t *comm)
{
    if (comm->nbufs == 0) {
        comm->nbufs = sl_settings_auto_buffers(comm->local_size, comm->chunk);
        SL_INFO(SL_SUBSYS_NET, "%d chunks in flight per transfer, as many "
                "bounce buffers a direction when staging (auto: %d ranks on "
                "this node, %zu-byte chunks)", comm->nbufs, comm->local_size,
                comm->chunk);
    }
}

static void sl_chunked_decide(sl_comm_t *comm)
{
    if (comm->chunk != 0) {
        comm->chunk_min = comm->chunk; /* set by the user: every message */
        return;
    }
    if (comm->all_direct) {
        comm->chunk = comm->chunk_min = SL_CHUNK_DIRECT;
        SL_INFO(SL_SUBSYS_NET, "chunk %zu bytes (STAGELINK_CHUNK=auto: every "
                "rank's UCX moves device memory directly)", comm->chunk);
    } else if (sl_chunked_relayed(comm)) {
        comm->chunk     = SL_CHUNK_STAGED;
        comm->chunk_min = SL_CHUNK_STAGED_MIN;
        SL_INFO(SL_SUBSYS_NET, "messages above %zu bytes go in sixteenths of "
                "%zu to %zu bytes (STAGELINK_CHUNK=auto: shards are relayed)",
                comm->chunk, comm->chunk_min, comm->chunk);
    } else {
        comm->chunk = comm->chunk_min = SL_CHUNK_STAGED;
        SL_INFO(SL_SUBSYS_NET, "chunk %zu bytes (STAGELINK_CHUNK=auto: some "
                "rank stages device memory, or has no GPU)", comm->chunk);
    }
}

void sl_chunked_size_agree(sl_comm_t *comm)
{
    sl_chunked_decide(comm);
    sl_chunked_buffers(comm);
}

size_t sl_chunked_size(const sl_comm_t *comm, size_t len)
{
    size_t c;

    if (len <= comm->chunk || comm->chunk_min == comm->chunk) {
        return comm->chunk; /* one message, or one chunk size for all */
    }
    /* Rounded up without overflow: a length may come from a header. */
    c = len / SL_CHUNKS_PER_MSG + (len % SL_CHUNKS_PER_MSG != 0);
    c = (c / SL_CHUNK_ALIGN + (c % SL_CHUNK_ALIGN != 0)) * SL_CHUNK_ALIGN;
    return (c < comm->chunk_min) ? comm->chunk_min
         : (c > comm->chunk)     ? comm->chunk
                                 : c;
}

int sl_chunked_framed(const sl_comm_t *comm, size_t len)
{
    return len > comm->chunk;
}

/* The number of chunks a sender of `len` bytes cuts. */
static uint64_t sl_chunked_count(const sl_comm_t *comm, uint64_t len)
{
    size_t c = sl_chunked_size(comm, (size_t)len);

    return len / c + (len % c != 0);
}

/* UCX's outcome of one operation of a chunked transfer. */
static sl_status_t sl_chunk_status(const sl_staged_t *st, ucs_status_t ucs)
{
    return sl_wire_status(st->sub->peer, ucs, "a chunk");
}

static void sl_chunk_send_cb(void *request, ucs_status_t status, void *user)
{
    sl_staging_slot_t *slot = user;
    sl_staged_t       *st   = slot->x->user;

    sl_ucx_callback_ran(st->sub->req->comm);
    ucp_request_free(request);
    if (st->state == SL_CHUNKED_DETACHED) {
        return;
    }
    slot->net = NULL;
    sl_staging_net_done(slot, sl_chunk_status(st, status));
    /* The next chunk goes out now, not after this progress call has served
     * every pending copy. */
    sl_staging_progress(slot->x);
}

/*
 * The own shard landed further: the gather hears it at once, through its
 * own callback, from this one (posting is allowed there), not after
 * progress returns.
 */
static void sl_chunk_landed(sl_req_t *req, const sl_staging_xfer_t *shard)
{
    if (shard->status == STAGELINK_SUCCESS && req->gather != NULL &&
        req->gather->landed != NULL) {
        req->gather->landed(req->gather_state, req, sl_staging_landed(shard));
    }
}

void sl_chunked_relay(sl_sub_t *sub)
{
    if (sub->staged != NULL) {
        sl_staging_progress(&sub->staged->x);
    }
}

/* Where the slot's chunk landed, when the CPU can read it (NULL: device
 * memory). */
static const void *sl_chunk_landed_at(const sl_staging_slot_t *slot)
{
    const sl_staging_xfer_t *x  = slot->x;
    const sl_staged_t       *st = x->user;

    if (!x->direct) {
        return x->pool->bufs[1][slot->buf];
    }
    return st->sub->req->device ? NULL
                                : x->device + slot->index * x->chunk;
}

static void sl_chunk_recv_cb(void *request, ucs_status_t status,
                             const ucp_tag_recv_info_t *info, void *user)
{
    sl_staging_slot_t *slot = user;
    sl_staged_t       *st   = slot->x->user;
    const void        *at   = sl_chunk_landed_at(slot);
    uint64_t           value = 0;
    sl_status_t        s;
    sl_msg_kind_t      kind;

    sl_ucx_callback_ran(st->sub->req->comm);
    ucp_request_free(request);
    if (st->state == SL_CHUNKED_DETACHED) {
        return;
    }
    slot->net = NULL;
    s         = sl_chunk_status(st, status);
    if (status == UCS_ERR_CANCELED && st->leftover != NULL) {
        sl_leftover_add(st->leftover, slot->index);
    }
    if (status == UCS_ERR_MESSAGE_TRUNCATED &&
        info->sender_tag == (sl_chunk_tag(st, slot->index) | SL_TAG_HEADER)) {
        /* A notice longer than a short chunk: the sender gave up. */
        s = STAGELINK_ERR_TRANSPORT;
        if (st->notice == STAGELINK_SUCCESS) {
            st->notice = s;
        }
    } else if (s == STAGELINK_SUCCESS) {
        /* A notice read from device memory would need a copy: its status
         * stays unknown (TRANSPORT), the failure does not. */
        kind = (at != NULL) ? sl_msg_classify(sl_chunk_tag(st, slot->index),
                                              info, at, &value)
             : ((info->sender_tag & SL_TAG_MASK_HEADER) ==
                    sl_chunk_tag(st, slot->index) &&
                (info->sender_tag & SL_TAG_HEADER)) ? SL_MSG_NOTICE
                                                    : SL_MSG_DATA;
        if (kind == SL_MSG_HEADER && !st->framed) {
            /* A framed sender met a receive of one chunk: its chunks are
             * drained, as a plain receive drains them (sl_sub_drain), so
             * none is left for a later transfer with the tag. */
            st->hdr.value  = value;
            st->drain_left = sl_chunked_count(st->sub->req->comm, value);
            sl_chunked_to(st, SL_CHUNKED_DRAINING);
            s              = STAGELINK_ERR_SIZE_MISMATCH;
        } else if (kind == SL_MSG_NOTICE) {
            /* The sender gave up: each chunk it did not send is a notice. */
            s = sl_notice_status(value);
            if (st->notice == STAGELINK_SUCCESS) {
                st->notice = s;
            }
        } else if (kind == SL_MSG_BAD) {
            /* A control message in a chunk's place is a notice; one
             * shorter than 16 bytes (a short device chunk's) has no
             * readable status. */
            s = STAGELINK_ERR_TRANSPORT;
            if (st->notice == STAGELINK_SUCCESS) {
                st->notice = s;
            }
        } else if (kind != SL_MSG_DATA ||
                   info->length != sl_staging_chunk_len(slot->x, slot->index)) {
            /* A short chunk: the sender passed a different nbytes. */
            s = STAGELINK_ERR_SIZE_MISMATCH;
        }
    }
    /* A relayed chunk leaves before its sub ends: flushed first where RDMA
     * writes need it (the sub's end flushes the rest). */
    if (s == STAGELINK_SUCCESS && slot->x->direct && st->sub->req->device &&
        st->sub->kind == SL_SUB_STAGE_RECV && st->sub->req->gather_part.forwarding) {
        s = sl_device_rdma_landed(st->sub->req->comm, st->sub->peer);
    }
    sl_staging_net_done(slot, s);
    sl_staging_progress(slot->x); /* the next receive, at once */
    if (st->sub->kind == SL_SUB_STAGE_RECV) {
        sl_chunk_landed(st->sub->req, slot->x);
    }
}

static sl_status_t sl_dev_net_post(void *ctx, sl_staging_slot_t *slot,
                                   void *host, size_t len)
{
    sl_comm_t          *comm  = ctx;
    sl_staged_t        *st    = slot->x->user;
    sl_sub_t           *sub   = st->sub;
    size_t              index = slot->index;
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;
    sl_status_t         fault;

    /* A chunk moved in place lies inside the host's registration; a staged
     * one is in the plugin's own host buffer. */
    sl_ucx_param_init(&param, slot,
                      (slot->x->direct && sub->req->device)
                          ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
                      slot->x->direct ? sub->req->xfer.memh : NULL, sub->peer);
    if (slot->x->recv) {
        /* A staged chunk of under 16 bytes still offers 16 of its bounce
         * buffer, so that a length header or a notice in its place lands
         * whole and is read (truncated, it would be lost and a framed
         * sender left undrained); data of another length shows by its
         * length (sl_chunk_recv_cb). */
        size_t room = (!slot->x->direct && len < SL_CTL_LEN) ? SL_CTL_LEN : len;

        param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.cb.recv       = sl_chunk_recv_cb;
        ptr = ucp_tag_recv_nbx(sub->peer->worker, host, room,
                               sl_chunk_tag(st, index), SL_TAG_MASK_HEADER,
                               &param);
    } else if ((fault = sl_peer_check(comm, sub->peer)) !=
               STAGELINK_SUCCESS) {
        /* After a failure or an abort nothing more goes out, also not from
         * the callbacks a forced endpoint close runs; the request already
         * says why. */
        return fault;
    } else if (len == 0 && slot->x->status != STAGELINK_SUCCESS) {
        /* Given up: a notice of the cause in place of the chunk.  Its
         * length never equals the chunk's, so it is never taken for data
         * even where its tag cannot be read (a garbage sender_tag): a chunk
         * of up to 16 bytes gets one byte more (the receiver sees a
         * truncation, a failure whose cause is lost). */
        size_t clen = sl_staging_chunk_len(slot->x, index);

        sl_notice_make(st->notice_msg, slot->x->status);
        sl_ucx_param_init(&param, slot, UCS_MEMORY_TYPE_HOST, NULL, NULL);
        param.cb.send = sl_chunk_send_cb;
        ptr = ucp_tag_send_nbx(sub->peer->ep, st->notice_msg,
                               (clen > SL_CTL_LEN) ? SL_CTL_LEN : clen + 1,
                               sl_chunk_tag(st, index) | SL_TAG_HEADER,
                               &param);
    } else {
        param.cb.send = sl_chunk_send_cb;
        ptr = ucp_tag_send_nbx(sub->peer->ep, host, len,
                               sl_chunk_tag(st, index), &param);
    }
    if (UCS_PTR_IS_ERR(ptr)) {
        return sl_error(&comm->err, STAGELINK_ERR_TRANSPORT,
                        "UCX refused chunk %zu of a chunked transfer with rank "
                        "%d: %s", slot->index, sub->peer->rank,
                        ucs_status_string(UCS_PTR_STATUS(ptr)));
    }
    if (ptr == NULL) {
        sl_staging_net_done(slot, STAGELINK_SUCCESS);
    } else if (slot->in_use && slot->state == SL_CHUNK_ON_WIRE &&
               slot->index == index) {
        /* Not completed inside the call (see sl_sub_started). */
        slot->net = ptr;
    }
    return STAGELINK_SUCCESS;
}

static int sl_dev_net_ready(void *ctx, sl_staging_xfer_t *x)
{
    sl_staged_t        *st = x->user;
    ucp_tag_recv_info_t info;

    (void)ctx;
    return ucp_tag_probe_nb(st->sub->peer->worker,
                            sl_chunk_tag(st, x->next_post),
                            SL_TAG_MASK_HEADER, 0, &info) != NULL;
}

static void sl_hdr_send_cb(void *request, ucs_status_t status, void *user)
{
    sl_staged_t *st = user;

    sl_ucx_callback_ran(st->sub->req->comm);
    ucp_request_free(request);
    if (st->state == SL_CHUNKED_DETACHED) {
        return;
    }
    st->hdr_req  = NULL;
    st->ctl_busy = 0;
    if (status != UCS_OK && st->x.status == STAGELINK_SUCCESS) {
        st->x.status = sl_chunk_status(st, status);
    }
}

/* The sender's length: go on with the chunks, or drain a mismatch. */
static void sl_hdr_recv_cb(void *request, ucs_status_t status,
                           const ucp_tag_recv_info_t *info, void *user)
{
    sl_staged_t  *st   = user;
    sl_comm_t    *comm = st->sub->req->comm;
    uint64_t      value = 0;
    sl_msg_kind_t kind;

    sl_ucx_callback_ran(st->sub->req->comm);
    ucp_request_free(request);
    if (st->state == SL_CHUNKED_DETACHED) {
        return;
    }
    st->hdr_req  = NULL;
    st->ctl_busy = 0;
    kind = (status == UCS_OK)
               ? sl_msg_classify(st->sub->tag, info, &st->hdr, &value)
               : SL_MSG_DATA;
    if (kind == SL_MSG_NOTICE) {
        /* The sender gave up before its first chunk: none will follow. */
        st->notice = sl_notice_status(value);
        sl_staging_abandon(&st->x, st->notice);
        sl_chunked_to(st, SL_CHUNKED_MOVING);
        return;
    }
    if (kind == SL_MSG_HEADER) {
        st->hdr.value = value;
        if (value == st->x.len) {
            sl_chunked_to(st, SL_CHUNKED_MOVING);
            sl_staging_progress(&st->x); /* start the chunks at once */
            return;
        }
        st->drain_left = sl_chunked_count(comm, value);
    } else if (kind == SL_MSG_DATA &&
               (status == UCS_OK || status == UCS_ERR_MESSAGE_TRUNCATED)) {
        /* A plain message: the sender's part fits one chunk. */
        st->hdr.value = (status == UCS_OK) ? info->length : UINT64_MAX;
    } else {
        st->x.status = (kind == SL_MSG_BAD) ? STAGELINK_ERR_INTERNAL
                                            : sl_chunk_status(st, status);
        sl_chunked_to(st, SL_CHUNKED_DRAINING);
        return;
    }
    st->x.status = STAGELINK_ERR_SIZE_MISMATCH;
    sl_chunked_to(st, SL_CHUNKED_DRAINING);
}

static void sl_drain_cb(void *request, ucs_status_t status,
                        const ucp_tag_recv_info_t *info, void *user)
{
    sl_staged_t *st = user;

    (void)info;
    sl_ucx_callback_ran(st->sub->req->comm);
    ucp_request_free(request);
    if (st->state == SL_CHUNKED_DETACHED) {
        return;
    }
    if (status == UCS_ERR_CANCELED && st->leftover != NULL) {
        sl_leftover_add(st->leftover, st->drain_index);
    }
    st->drain_req  = NULL;
    st->drain_left = (status == UCS_OK) ? st->drain_left - 1 : 0;
    st->ctl_busy   = 0;
}

/* The largest chunk, where chunks nobody keeps are dropped (NULL: out of
 * memory). */
static void *sl_chunked_scratch(sl_comm_t *comm)
{
    if (comm->scratch == NULL) {
        comm->scratch = malloc(comm->chunk);
    }
    return comm->scratch;
}

/* One chunk of a mismatched sender at a time into the scratch chunk, so
 * none is left to be matched by a later transfer with the same tag. */
static int sl_drain_progress(sl_comm_t *comm, sl_staged_t *st)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;

    if (st->drain_left > 0 && st->drain_req == NULL) {
        if (sl_chunked_scratch(comm) == NULL) {
            st->drain_left = 0;
            return 1;
        }
        sl_ucx_param_init(&param, st, UCS_MEMORY_TYPE_HOST, NULL, NULL);
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.cb.recv       = sl_drain_cb;
        st->ctl_busy        = 1;
        /* In order: chunk (total - left) of the sender's. */
        st->drain_index = sl_chunked_count(comm, st->hdr.value) - st->drain_left;
        ptr = ucp_tag_recv_nbx(st->sub->peer->worker, comm->scratch, comm->chunk,
                               sl_tag_chunk(st->sub->tag, st->drain_index),
                               SL_TAG_MASK_HEADER, &param);
        if (UCS_PTR_IS_PTR(ptr)) {
            st->drain_req = st->ctl_busy ? ptr : NULL; /* see sl_sub_started */
        } else {
            st->drain_left = 0;
        }
    }
    return st->drain_left == 0 && st->drain_req == NULL;
}

/* A framed transfer starts with its header: the length, sent or awaited. */
static void sl_hdr_post(sl_staged_t *st)
{
    ucp_request_param_t param;
    ucs_status_ptr_t    ptr;

    sl_ucx_param_init(&param, st, UCS_MEMORY_TYPE_HOST, NULL, NULL);
    st->ctl_busy = 1;
    if (st->x.recv) {
        sl_chunked_to(st, SL_CHUNKED_AWAITING);
        param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        param.cb.recv       = sl_hdr_recv_cb;
        ptr = ucp_tag_recv_nbx(st->sub->peer->worker, &st->hdr, sizeof(st->hdr),
                               st->sub->tag, SL_TAG_MASK_HEADER, &param);
    } else if (st->sub->peer->failed) {
        ptr = UCS_STATUS_PTR(UCS_ERR_CONNECTION_RESET);
    } else {
        st->hdr.magic    = SL_HEADER_MAGIC;
        st->hdr.value    = st->x.len;
        param.cb.send = sl_hdr_send_cb;
        ptr = ucp_tag_send_nbx(st->sub->peer->ep, &st->hdr, sizeof(st->hdr),
                               st->sub->tag | SL_TAG_HEADER, &param);
    }
    if (UCS_PTR_IS_PTR(ptr)) {
        st->hdr_req = st->ctl_busy ? ptr : NULL; /* see sl_sub_started */
    } else if (ptr == NULL) {
        st->ctl_busy = 0;
    } else {
        st->x.status = STAGELINK_ERR_TRANSPORT;
        if (st->x.recv) {
            sl_chunked_to(st, SL_CHUNKED_DRAINING);
        }
    }
}

static const sl_staging_ops_t sl_dev_staging_ops = {
    .copy_start = sl_device_copy_start,
    .copy_test  = sl_device_copy_test,
    .net_post   = sl_dev_net_post,
    .net_ready  = sl_dev_net_ready,
};

/* A chunked transfer object, from the free list (none made in steady state). */
static sl_status_t sl_staged_get(sl_comm_t *comm, sl_sub_t *sub, int recv,
                                 int direct, void *buf, size_t len,
                                 sl_staged_t **out)
{
    sl_staged_t *st = comm->staged_free;

    if (st != NULL) {
        comm->staged_free = st->next;
    } else {
        st = calloc(1, sizeof(*st));
        if (st == NULL || (st->slots = calloc((size_t)comm->nbufs,
                                              sizeof(*st->slots))) == NULL) {
            free(st);
            return sl_error(&comm->err, STAGELINK_ERR_NO_MEMORY,
                            "cannot allocate a chunked transfer of %d slots",
                            comm->nbufs);
        }
    }
    if (comm->staging.nbufs == 0) {
        /* Chunks moved in place take no buffers; the pool sizes the window. */
        comm->staging.chunk = comm->chunk;
        comm->staging.nbufs = comm->nbufs;
    }
    sl_staging_xfer_init(&st->x, &sl_dev_staging_ops, comm, &comm->staging,
                         recv, direct, buf, len, sl_chunked_size(comm, len),
                         st->slots);
    st->x.user          = st;
    st->sub             = sub;
    st->framed          = sl_chunked_framed(comm, len);
    st->state           = SL_CHUNKED_MOVING;
    st->hdr_req         = st->drain_req = NULL;
    st->ctl_busy        = 0;
    st->drain_left      = 0;
    st->notice          = STAGELINK_SUCCESS;
    st->leftover        = NULL;
    st->next            = comm->staged_active;
    comm->staged_active = st;
    *out                = st;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_chunked_sub_prepare(sl_sub_t *sub, void *buf, size_t len,
                                   int recv, sl_chunked_end_t end,
                                   sl_staged_t **out)
{
    sl_req_t    *req    = sub->req;
    sl_comm_t   *comm   = req->comm;
    int          direct = 1;
    sl_staged_t *st     = NULL; /* set by sl_staged_get (-O3 cannot tell) */

    if (req->device) {
        SL_CHECK(sl_device_buffer_path(comm, sub->peer, buf, &direct));
    }
    if (!direct) {
        SL_CHECK(sl_device_staging_ready(comm));
    }
    SL_CHECK(sl_staged_get(comm, sub, recv, direct, buf, len, &st));
    st->end = end;
    if (!recv && sub->kind == SL_SUB_GATHER_SEND && req->gather_part.forwarding) {
        st->x.avail = &req->gather_part.stage_landed; /* relay: each chunk as it lands */
    }
    *out = st;
    return STAGELINK_SUCCESS;
}

void sl_chunked_sub_kick(sl_staged_t *st)
{
    if (st->framed) {
        sl_hdr_post(st);
    }
    if (st->state == SL_CHUNKED_MOVING) {
        sl_staging_progress(&st->x);
    }
}

sl_status_t sl_chunked_drain(sl_sub_t *sub, uint64_t len, sl_chunked_end_t end,
                             sl_staged_t **out)
{
    sl_comm_t   *comm = sub->req->comm;
    sl_staged_t *st   = NULL; /* set by sl_staged_get (-O3 cannot tell) */

    SL_CHECK(sl_staged_get(comm, sub, 1, 1, NULL, 0, &st));
    st->end        = end;
    st->hdr.value  = len;
    st->framed     = 1;
    st->drain_left = sl_chunked_count(comm, len);
    sl_chunked_to(st, SL_CHUNKED_DRAINING);
    st->x.status   = STAGELINK_ERR_SIZE_MISMATCH;
    *out           = st;
    return STAGELINK_SUCCESS;
}

void sl_chunked_give_up(sl_sub_t *sub, sl_status_t status)
{
    if (sub->staged != NULL && sub->staged->x.status == STAGELINK_SUCCESS) {
        sub->staged->x.status = status;
    }
}

/* A canceled receive whose sender's message has matched (its length header
 * came) leaves the chunks it has not taken, from `first` on, to a drain in
 * the background; 0 when there is no memory for one (it takes them
 * itself). */
static int sl_chunked_leave(sl_comm_t *comm, sl_staged_t *st, uint64_t first,
                            uint64_t count, size_t more)
{
    return sl_chunked_scratch(comm) != NULL &&
           sl_leftover_start(comm, st->sub->peer, st->sub->tag,
                             comm->scratch, comm->chunk, first, count, more,
                             &st->leftover) == STAGELINK_SUCCESS;
}

void sl_chunked_cancel(sl_comm_t *comm, sl_staged_t *st,
                       sl_cancel_reach_t reach)
{
    sl_ucx_peer_t *peer = st->sub->peer;
    uint64_t       total;
    int            i;

    if (reach == SL_CANCEL_DRAIN && st->x.recv && st->leftover == NULL &&
        !peer->failed) {
        /* Its chunks not yet posted, and those canceled below before they
         * matched (sl_chunk_recv_cb adds them), go to the drain. */
        if (st->framed && st->state == SL_CHUNKED_MOVING &&
            st->x.done < st->x.nchunks) {
            if (!sl_chunked_leave(comm, st, st->x.next_post, st->x.nchunks,
                                  (size_t)comm->nbufs)) {
                return;
            }
            sl_staging_abandon(&st->x, STAGELINK_ERR_CANCELED);
        }
        /* A mismatched sender's, after its drain receive in flight. */
        if (st->state == SL_CHUNKED_DRAINING && st->drain_left > 0) {
            total = sl_chunked_count(comm, st->hdr.value);
            if (!sl_chunked_leave(comm, st,
                                  total - st->drain_left + (st->drain_req != NULL),
                                  total, 1)) {
                return;
            }
            if (st->drain_req != NULL) {
                ucp_request_cancel(peer->worker, st->drain_req);
            }
            st->drain_left = (st->drain_req != NULL); /* matched: it lands */
        }
    }
    if (st->x.status == STAGELINK_SUCCESS) {
        st->x.status = STAGELINK_ERR_CANCELED;
    }
    if (peer->failed) {
        /* No more chunks will come from it, nor be taken by it. */
        sl_staging_abandon(&st->x, STAGELINK_ERR_PEER_FAILED);
        st->drain_left = 0;
        if (st->drain_req != NULL) {
            ucp_request_cancel(peer->worker, st->drain_req);
        }
    } else if (reach == SL_CANCEL_ALL && st->x.recv) {
        /* Nothing more is posted: a slot canceled below would otherwise
         * take the next chunk at once. */
        sl_staging_abandon(&st->x, STAGELINK_ERR_CANCELED);
    }
    if (st->hdr_req != NULL) {
        ucp_request_cancel(peer->worker, st->hdr_req);
    }
    for (i = 0; i < comm->nbufs; ++i) {
        if (st->slots[i].in_use && st->slots[i].net != NULL) {
            ucp_request_cancel(peer->worker, st->slots[i].net);
        }
    }
}

static void sl_chunked_progress(sl_comm_t *comm)
{
    sl_staged_t **link, *st;
    sl_sub_t     *sub;

    link = &comm->staged_active;
    while ((st = *link) != NULL) {
        int  done;
        char why[192];

        done = 0;
        if (st->state == SL_CHUNKED_MOVING) {
            done = sl_staging_progress(&st->x) && st->hdr_req == NULL;
        }
        if (st->state == SL_CHUNKED_DRAINING) {
            /* Also one that a chunk's callback turned into a drain, maybe
             * inside the progress call above. */
            done = sl_drain_progress(comm, st);
        }

        if (st->sub->kind == SL_SUB_STAGE_RECV) {
            sl_chunk_landed(st->sub->req, &st->x); /* staged chunks land here */
        }
        if (!done) {
            link = &st->next;
            continue;
        }
        *link             = st->next;
        sub               = st->sub;
        st->next          = comm->staged_free;
        comm->staged_free = st;
        if (st->leftover != NULL) {
            sl_leftover_release(st->leftover);
        }
        if (st->state == SL_CHUNKED_DRAINING &&
            st->x.status == STAGELINK_ERR_SIZE_MISMATCH) {
            if (st->hdr.value == UINT64_MAX) {
                snprintf(why, sizeof(why), "the sender's part went as one "
                         "message (a smaller part, at most one chunk), this "
                         "one is %zu bytes; both sides must pass the same "
                         "nbytes and elem_size", sub->expected);
            } else {
                snprintf(why, sizeof(why), "the sender's part is %llu bytes, "
                         "this one %zu; both sides must pass the same nbytes and "
                         "elem_size",
                         (unsigned long long)st->hdr.value, sub->expected);
            }
            st->end(sub, st->x.status, STAGELINK_SUCCESS, 0, why);
            continue;
        }
        if (st->notice != STAGELINK_SUCCESS) {
            /* The sender gave up and said why: its status is the cause. */
            st->end(sub, STAGELINK_SUCCESS, st->notice, 0, "");
            continue;
        }
        st->end(sub, st->x.status, STAGELINK_SUCCESS,
                (st->x.status == STAGELINK_SUCCESS) ? st->x.len : 0,
                (st->x.status == STAGELINK_ERR_SIZE_MISMATCH)
                    ? "a chunk arrived with another length: the sender "
                      "passed a different nbytes"
                    : comm->err.msg);
    }
    sl_leftover_progress(comm);
}

/* A GPU copy of a staged chunk completes without waking the UCX event fd;
 * chunks on the wire are UCX events and do. */
static int sl_chunked_copying(const sl_comm_t *comm)
{
    const sl_staged_t *st;

    for (st = comm->staged_active; st != NULL; st = st->next) {
        if (!st->x.direct && sl_staging_copying(&st->x)) {
            return 1;
        }
    }
    return 0;
}

void sl_chunked_init(sl_comm_t *comm)
{
    static const sl_progress_hook_t hook = {
        .round = sl_chunked_progress,
        .busy  = sl_chunked_copying,
    };

    sl_ucx_progress_register(comm, &hook);
}

void sl_chunked_detach(sl_comm_t *comm, sl_staged_t *st)
{
    sl_staged_t **link = &comm->staged_active;

    while (*link != st) {
        link = &(*link)->next;
    }
    *link                 = st->next;
    if (st->leftover != NULL) {
        sl_leftover_release(st->leftover);
    }
    sl_chunked_to(st, SL_CHUNKED_DETACHED);
    st->next              = comm->staged_detached;
    comm->staged_detached = st;
}

void sl_chunked_cleanup(sl_comm_t *comm)
{
    sl_staged_free_list(comm, comm->staged_active);
    sl_staged_free_list(comm, comm->staged_free);
    sl_staged_free_list(comm, comm->staged_detached);
    comm->staged_active = comm->staged_free = comm->staged_detached = NULL;
    sl_leftover_cleanup(comm);
    free(comm->scratch);
    comm->scratch = NULL;
}
