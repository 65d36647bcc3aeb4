/* Admission to the rendezvous.  SPDX-License-Identifier: MIT */
#include "sl_rendezvous.h"
#include "sl_log.h"
#include "sl_sock.h"
#include "sl_time.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A client gets this long from connect to its proof: a silent, slow or
 * stalled connection (a port scanner, a stale rank, a half-open handshake)
 * is dropped instead of holding the rendezvous until its deadline. */
#define SL_RV_HANDSHAKE_S 2.0
/* Connections in handshake at once: one per rank to come and this many
 * more, so the job's own ranks never evict each other; a flood beyond
 * evicts (a real rank dropped this way connects again).  The ranks' share
 * is capped, and with it what a huge world size asks of memory. */
#define SL_RV_STRANGERS 16
#define SL_RV_RANKS_MAX 4096
/* Between a dropped attempt to join and the next. */
#define SL_RV_RETRY_US 20000
/* At most one warning about dropped clients this often. */
#define SL_RV_DROP_SAY_S 1.0
/* Descriptors rank 0 keeps free for the rest of the process (UCX, logs,
 * the host's) while the rendezvous holds its sockets. */
#define SL_RV_FD_RESERVE 64

/* One connection rank 0 is admitting.  FREE -> HELLO on accept; HELLO ->
 * PROOF once a hello with a secret is admitted and challenged; HELLO or
 * PROOF -> FREE when it joins (as its rank's socket) or is dropped. */
typedef enum sl_rv_state {
    SL_RV_FREE,
    SL_RV_HELLO,
    SL_RV_PROOF
} sl_rv_state_t;

typedef struct sl_rv_client {
    sl_rv_state_t  state;
    int            fd;
    size_t         got;
    double         deadline;
    char           peer[64];
    union {
        unsigned char hello[sizeof(sl_boot_hdr_t) + sizeof(sl_boot_hello_t)];
        unsigned char proof[sizeof(sl_boot_proof_t)];
    } in;
    uint32_t       rank;
    sl_auth_bind_t bind;
} sl_rv_client_t;

/* The refusals a rank is told plainly; the rest have sentences of their
 * own (sl_rv_refused). */
static const char *const sl_rv_verdict_text[] = {
    [SL_BOOT_WRONG_KEY]   = "its job key differs from this job's",
    [SL_BOOT_WRONG_WORLD] = "its world size differs from this job's",
    [SL_BOOT_BAD_RANK]    = "its rank is outside the job",
    [SL_BOOT_RANK_TAKEN]  = "its rank has already joined",
};

sl_status_t sl_rendezvous_check_hdr(const sl_boot_hdr_t *h, uint64_t job_key,
                                    int world_size, sl_boot_verdict_t *verdict,
                                    sl_errbuf_t *eb)
{
    sl_boot_verdict_t ignored;

    verdict  = (verdict != NULL) ? verdict : &ignored;
    *verdict = SL_BOOT_SILENT;
    if (h->magic != SL_BOOT_MAGIC || h->version != SL_BOOT_VERSION) {
        *verdict = (h->magic == SL_BOOT_MAGIC) ? SL_BOOT_WRONG_VERSION
                                               : SL_BOOT_SILENT;
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "bootstrap message with magic 0x%x version %u, "
                        "expected 0x%x version %u: a client of another "
                        "program or stagelink version", h->magic, h->version,
                        SL_BOOT_MAGIC, SL_BOOT_VERSION);
    }
    if (h->job_key != job_key) {
        *verdict = SL_BOOT_WRONG_KEY;
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u has job key %016llx, this job %016llx: a "
                        "process of another job (or STAGELINK_JOB_KEY differs "
                        "between ranks)", h->rank,
                        (unsigned long long)h->job_key,
                        (unsigned long long)job_key);
    }
    if (h->world_size != (uint32_t)world_size) {
        *verdict = SL_BOOT_WRONG_WORLD;
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u says world size %u, rank 0 says %d; all "
                        "ranks must be started with the same world size",
                        h->rank, h->world_size, world_size);
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_rendezvous_check_hello(const sl_rendezvous_t *rv,
                                      const void *buf, size_t len,
                                      uint32_t *rank,
                                      sl_boot_verdict_t *verdict,
                                      sl_errbuf_t *eb)
{
    char            mine[2 * SL_AUTH_FP_LEN + 1], theirs[sizeof(mine)];
    sl_boot_hdr_t   h;
    sl_boot_hello_t hello;

    *verdict = SL_BOOT_SILENT;
    if (len < sizeof(h)) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "hello of %zu bytes, expected %zu", len,
                        sizeof(h) + sizeof(hello));
    }
    memcpy(&h, buf, sizeof(h));
    if (h.magic != SL_BOOT_MAGIC || h.version != SL_BOOT_VERSION) {
        return sl_rendezvous_check_hdr(&h, rv->job_key, rv->world_size,
                                       verdict, eb);
    }
    if (h.size != sizeof(hello) || len != sizeof(h) + sizeof(hello)) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "hello announces %llu bytes in %zu, expected %zu",
                        (unsigned long long)h.size, len - sizeof(h),
                        sizeof(hello));
    }
    SL_CHECK(sl_rendezvous_check_hdr(&h, rv->job_key, rv->world_size, verdict,
                                     eb));
    memcpy(&hello, (const char *)buf + sizeof(h), sizeof(hello));
    if (h.rank == 0 || h.rank >= (uint32_t)rv->world_size) {
        *verdict = SL_BOOT_BAD_RANK;
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "hello from rank %u, outside 1..%d", h.rank,
                        rv->world_size - 1);
    }
    if (rv->peer_fds[h.rank] >= 0) {
        *verdict = SL_BOOT_RANK_TAKEN;
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u arrived twice: two processes were started "
                        "with the same rank", h.rank);
    }
    if (hello.mode != (uint32_t)rv->auth.mode) {
        *verdict = SL_BOOT_WRONG_MODE;
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u has %s job secret and rank 0 %s; set "
                        "STAGELINK_JOB_SECRET (or _FILE) alike on every rank",
                        h.rank, hello.mode == SL_AUTH_NONE ? "no" : "a",
                        rv->auth.mode == SL_AUTH_NONE ? "none" : "has one");
    }
    if (rv->auth.mode == SL_AUTH_HMAC &&
        memcmp(hello.fingerprint, rv->auth.fingerprint, SL_AUTH_FP_LEN) != 0) {
        *verdict = SL_BOOT_WRONG_SECRET;
        sl_auth_fingerprint_hex(hello.fingerprint, theirs);
        sl_auth_fingerprint_hex(rv->auth.fingerprint, mine);
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u holds a job secret with fingerprint %s, rank "
                        "0 one with fingerprint %s; give every rank the same "
                        "secret", h.rank, theirs, mine);
    }
    *rank    = h.rank;
    *verdict = SL_BOOT_ADMIT;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_rendezvous_check_proof(const sl_rendezvous_t *rv,
                                      const sl_auth_bind_t *bind,
                                      const void *buf, size_t len,
                                      sl_errbuf_t *eb)
{
    uint8_t want[SL_AUTH_MAC_LEN];

    if (len != sizeof(sl_boot_proof_t)) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "proof of %zu bytes, expected %zu", len,
                        sizeof(sl_boot_proof_t));
    }
    SL_CHECK(sl_auth_compute(&rv->auth, SL_AUTH_CLIENT_PROOF, bind, want, eb));
    if (!sl_auth_equal(want, buf, sizeof(want))) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank %u answered the challenge with a wrong proof "
                        "(a forged or replayed hello, or another nonce)",
                        bind->rank);
    }
    return STAGELINK_SUCCESS;
}

/* Whole small message on a fresh socket, never blocking: its buffer has
 * room, and a peer that does not read is dropped anyway. */
static int sl_rv_send_now(int fd, const void *buf, size_t len)
{
    return send(fd, buf, len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len;
}

/* Drops said since the last warning, with the latest; nothing when none. */
static void sl_rv_say_drops(sl_rendezvous_t *rv)
{
    if (rv->drops_unsaid > 0) {
        SL_WARN(SL_SUBSYS_BOOT, "dropped %u more rendezvous clients in %.1f "
                "s (a flood or a port scan?); the latest: %s",
                rv->drops_unsaid, sl_time_now() - rv->drop_said_at,
                rv->refused);
        rv->drops_unsaid = 0;
    }
    rv->drop_said_at = sl_time_now();
}

/* Each drop is a warning, but at most one a second: a flood of strangers
 * must not flood stderr too. */
static void sl_rv_drop(sl_rendezvous_t *rv, sl_rv_client_t *c,
                       const char *why)
{
    if (rv->drop_said_at == 0.0 ||
        sl_time_now() - rv->drop_said_at >= SL_RV_DROP_SAY_S) {
        sl_rv_say_drops(rv);
        SL_WARN(SL_SUBSYS_BOOT, "dropped rendezvous client %s: %s", c->peer,
                why);
    } else {
        ++rv->drops_unsaid;
    }
    /* refused[256] holds the peer and the reason's first 190 bytes */
    snprintf(rv->refused, sizeof(rv->refused), "%.63s: %.190s", c->peer,
             why);
    close(c->fd);
    c->fd    = -1;
    c->state = SL_RV_FREE;
}

static void sl_rv_join(sl_rendezvous_t *rv, sl_rv_client_t *c, int *arrived)
{
    rv->peer_fds[c->rank] = c->fd;
    c->fd                 = -1;
    c->state              = SL_RV_FREE;
    ++*arrived;
    SL_TRACE(SL_SUBSYS_BOOT, "rank %u joined (%d/%d)", c->rank, *arrived,
             rv->world_size);
}

/* A real rank of a misconfigured job learns why at once; rank 0's
 * fingerprint goes only to one whose secret differs. */
static void sl_rv_refuse(sl_rendezvous_t *rv, sl_rv_client_t *c,
                         sl_boot_verdict_t verdict)
{
    sl_boot_challenge_t ch = {.magic = SL_BOOT_MAGIC, .verdict = verdict,
                              .mode = rv->auth.mode,
                              .version = SL_BOOT_VERSION};

    if (verdict == SL_BOOT_WRONG_SECRET) {
        memcpy(ch.fingerprint, rv->auth.fingerprint, SL_AUTH_FP_LEN);
    }
    (void)sl_rv_send_now(c->fd, &ch, sizeof(ch));
}

static void sl_rv_hello(sl_rendezvous_t *rv, sl_rv_client_t *c, int *arrived)
{
    sl_boot_challenge_t ch;
    sl_boot_verdict_t   verdict;
    sl_boot_hello_t     hello;
    sl_errbuf_t         why = {{0}};

    memset(&ch, 0, sizeof(ch));
    if (sl_rendezvous_check_hello(rv, c->in.hello, sizeof(c->in.hello),
                                  &c->rank, &verdict, &why) !=
        STAGELINK_SUCCESS) {
        if (verdict != SL_BOOT_SILENT) {
            sl_rv_refuse(rv, c, verdict);
        }
        sl_rv_drop(rv, c, why.msg);
        return;
    }
    memcpy(&hello, c->in.hello + sizeof(sl_boot_hdr_t), sizeof(hello));
    ch.magic   = SL_BOOT_MAGIC;
    ch.mode    = rv->auth.mode;
    ch.version = SL_BOOT_VERSION;
    if (rv->auth.mode == SL_AUTH_HMAC) {
        c->bind = (sl_auth_bind_t){.rank = c->rank,
                                   .world_size = (uint32_t)rv->world_size,
                                   .job_key = rv->job_key};
        memcpy(c->bind.client_nonce, hello.nonce, SL_AUTH_NONCE_LEN);
        if (sl_auth_random(c->bind.root_nonce, SL_AUTH_NONCE_LEN, &why) !=
                STAGELINK_SUCCESS ||
            sl_auth_compute(&rv->auth, SL_AUTH_ROOT_PROOF, &c->bind,
                            ch.proof, &why) != STAGELINK_SUCCESS) {
            sl_rv_drop(rv, c, why.msg);
            return;
        }
        memcpy(ch.nonce, c->bind.root_nonce, SL_AUTH_NONCE_LEN);
    }
    if (!sl_rv_send_now(c->fd, &ch, sizeof(ch))) {
        sl_rv_drop(rv, c, "the challenge could not be sent");
        return;
    }
    if (rv->auth.mode == SL_AUTH_NONE) {
        sl_rv_join(rv, c, arrived);
        return;
    }
    c->state = SL_RV_PROOF;
    c->got   = 0;
}

static void sl_rv_proof(sl_rendezvous_t *rv, sl_rv_client_t *c, int *arrived)
{
    sl_auth_link_t    link = {.sealed = 1};
    sl_boot_welcome_t w    = {.magic = SL_BOOT_MAGIC, .rank = c->rank};
    sl_auth_part_t    part = {&w, offsetof(sl_boot_welcome_t, seal)};
    sl_errbuf_t       why  = {{0}};

    if (sl_rendezvous_check_proof(rv, &c->bind, c->in.proof,
                                  sizeof(c->in.proof), &why) !=
        STAGELINK_SUCCESS) {
        sl_rv_drop(rv, c, why.msg);
        return;
    }
    if (rv->peer_fds[c->rank] >= 0) {
        sl_rv_drop(rv, c, "its rank joined meanwhile on another connection");
        return;
    }
    if (sl_auth_compute(&rv->auth, SL_AUTH_SESSION_KEY, &c->bind, link.key,
                        &why) != STAGELINK_SUCCESS ||
        sl_auth_seal(&link, SL_AUTH_FROM_ROOT, &part, 1, &w.seal, &why) !=
            STAGELINK_SUCCESS) {
        sl_rv_drop(rv, c, why.msg);
        return;
    }
    if (!sl_rv_send_now(c->fd, &w, sizeof(w))) {
        sl_rv_drop(rv, c, "the welcome could not be sent");
        return;
    }
    rv->links[c->rank] = link;
    sl_auth_clear_links(&link, 1);
    sl_rv_join(rv, c, arrived);
}

/* Reads what a connection has sent and moves it along its handshake. */
static void sl_rv_read(sl_rendezvous_t *rv, sl_rv_client_t *c, int *arrived)
{
    sl_boot_hdr_t h;
    unsigned char *buf  = (c->state == SL_RV_HELLO) ? c->in.hello
                                                     : c->in.proof;
    size_t         want = (c->state == SL_RV_HELLO) ? sizeof(c->in.hello)
                                                     : sizeof(c->in.proof);
    ssize_t        n;

    /* The whole hello in one read, as a rank sends it in one segment: a
     * real rank never waits between two reads, where it would be the
     * cheapest slot to evict (sl_rv_slot). */
    n = recv(c->fd, buf + c->got, want - c->got, MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
        return;
    }
    if (n <= 0) {
        sl_rv_drop(rv, c, c->state == SL_RV_HELLO ? "closed before its hello"
                                                  : "closed before its proof");
        return;
    }
    c->got += (size_t)n;
    if (c->state == SL_RV_PROOF) {
        if (c->got == want) {
            sl_rv_proof(rv, c, arrived);
        }
        return;
    }
    if (c->got < sizeof(h)) {
        return;
    }
    /* A foreign or older client is dropped on its header instead of
     * waited for. */
    memcpy(&h, c->in.hello, sizeof(h));
    if (h.magic != SL_BOOT_MAGIC || h.version != SL_BOOT_VERSION ||
        h.size != sizeof(sl_boot_hello_t)) {
        sl_errbuf_t       why = {{0}};
        sl_boot_verdict_t verdict;
        uint32_t          rank;

        (void)sl_rendezvous_check_hello(rv, c->in.hello, sizeof(h), &rank,
                                        &verdict, &why);
        if (verdict == SL_BOOT_WRONG_VERSION) {
            sl_rv_refuse(rv, c, verdict);
        }
        sl_rv_drop(rv, c, why.msg);
        return;
    }
    if (c->got == sizeof(c->in.hello)) {
        sl_rv_hello(rv, c, arrived);
    }
}

static sl_status_t sl_rv_missing(const sl_rendezvous_t *rv, int arrived,
                                 double timeout, sl_errbuf_t *eb)
{
    char   list[160] = "";
    size_t len       = 0;
    int    r;

    for (r = 1; r < rv->world_size && len + 16 < sizeof(list); ++r) {
        if (rv->peer_fds[r] < 0) {
            len += (size_t)snprintf(list + len, sizeof(list) - len, "%s%d",
                                    len ? ", " : "", r);
        }
    }
    return sl_error(eb, STAGELINK_ERR_TIMEOUT,
                    "only %d of %d ranks reached the rendezvous in %.1f s; "
                    "missing: %s%s; check that every rank was started with "
                    "the same MASTER_ADDR/MASTER_PORT, job key and job "
                    "secret%s%s", arrived, rv->world_size, timeout, list,
                    (len + 16 >= sizeof(list)) ? ", ..." : "",
                    rv->refused[0] ? "; last refused: " : "", rv->refused);
}

/* The slot for a new connection: a free one, else the one evicting costs
 * least: silent ones first (nothing sent: a scanner, a half-open flood),
 * then those before their hello, then those at the proof; the oldest of
 * its kind. */
static int sl_rv_slot(const sl_rv_client_t *pend, int npend)
{
    int i, best = 0, rank_i, rank_best = 3;

    for (i = 0; i < npend; ++i) {
        if (pend[i].state == SL_RV_FREE) {
            return i;
        }
        rank_i = (pend[i].state == SL_RV_PROOF) ? 2 : (pend[i].got > 0);
        if (rank_i < rank_best ||
            (rank_i == rank_best && pend[i].deadline < pend[best].deadline)) {
            best      = i;
            rank_best = rank_i;
        }
    }
    return best;
}

static sl_status_t sl_rv_accept_all(sl_rendezvous_t *rv, int lfd,
                                    double deadline, double timeout,
                                    sl_errbuf_t *eb)
{
    int             npend = (rv->world_size - 1 < SL_RV_RANKS_MAX
                                 ? rv->world_size - 1 : SL_RV_RANKS_MAX) +
                            SL_RV_STRANGERS;
    /* Every rank's socket stays open once it joins, and the handshakes
     * in flight come on top: slots only as many as the descriptors left
     * then, so that a flood cannot push rank 0 into EMFILE. */
    int             room  = sl_sock_fds_free() - SL_RV_FD_RESERVE -
                            (rv->world_size - 1);
    sl_rv_client_t *pend  = NULL;
    struct pollfd  *pfd   = NULL;
    int            *slot  = NULL;
    sl_status_t     status  = STAGELINK_SUCCESS;
    int             arrived = 1;
    int             i, n, fd, rc, ms, fd_warned = 0;
    char            peer[64];
    double          now;

    if (room < 1) {
        status = sl_error(eb, STAGELINK_ERR_CONFIG,
                          "rank 0 of %d ranks needs %d descriptors for the "
                          "rendezvous and keeps %d for the rest of the "
                          "process, but only %d are left under the "
                          "open-file limit; raise it (ulimit -n) by at "
                          "least %d", rv->world_size, rv->world_size,
                          SL_RV_FD_RESERVE,
                          room + SL_RV_FD_RESERVE + rv->world_size - 1,
                          1 - room + SL_RV_STRANGERS);
        goto out;
    }
    if (npend > room) {
        SL_INFO(SL_SUBSYS_BOOT, "rendezvous: %d handshake slots instead of "
                "%d under the open-file limit", room, npend);
        npend = room;
    }
    pend = calloc((size_t)npend, sizeof(*pend));
    pfd  = calloc((size_t)npend + 1, sizeof(*pfd));
    slot = calloc((size_t)npend + 1, sizeof(*slot));
    if (pend == NULL || pfd == NULL || slot == NULL) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d rendezvous handshakes", npend);
        goto out;
    }
    for (i = 0; i < npend; ++i) {
        pend[i] = (sl_rv_client_t){.state = SL_RV_FREE, .fd = -1};
    }
    while (arrived < rv->world_size) {
        now = sl_time_now();
        ms  = sl_deadline_ms(deadline);
        n   = 0;
        pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        for (i = 0; i < npend; ++i) {
            if (pend[i].state == SL_RV_FREE) {
                continue;
            }
            if (now >= pend[i].deadline) {
                sl_rv_drop(rv, &pend[i], pend[i].state == SL_RV_HELLO
                               ? "no complete hello in time"
                               : "no proof in time");
                continue;
            }
            slot[n]  = i;
            pfd[n++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
            if (ms < 0 || (pend[i].deadline - now) * 1e3 < ms) {
                ms = (int)((pend[i].deadline - now) * 1e3) + 1;
            }
        }
        if (sl_deadline_passed(deadline)) {
            status = sl_rv_missing(rv, arrived, timeout, eb);
            break;
        }
        rc = poll(pfd, (nfds_t)n, ms);
        if (rc < 0 && errno != EINTR) {
            status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                              "poll on the rendezvous sockets: %s",
                              strerror(errno));
            break;
        }
        for (i = 1; rc > 0 && i < n; ++i) {
            if (pfd[i].revents != 0) {
                sl_rv_read(rv, &pend[slot[i]], &arrived);
            }
        }
        if (rc <= 0 || !(pfd[0].revents & POLLIN)) {
            continue;
        }
        fd = sl_sock_accept(lfd, peer, sizeof(peer));
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                /* Out of descriptors the listener stays readable: pause
                 * instead of spinning on it. */
                if (!fd_warned) {
                    SL_WARN(SL_SUBSYS_BOOT, "rendezvous: accept: %s; "
                            "raise the open-file limit (ulimit -n)",
                            strerror(errno));
                    fd_warned = 1;
                }
                usleep(1000);
            }
            continue;
        }
        i = sl_rv_slot(pend, npend);
        if (pend[i].state != SL_RV_FREE) {
            sl_rv_drop(rv, &pend[i], "evicted by newer connections (all "
                       "handshake slots taken: a flood?)");
        }
        snprintf(pend[i].peer, sizeof(pend[i].peer), "%s", peer);
        pend[i].state    = SL_RV_HELLO;
        pend[i].fd       = fd;
        pend[i].got      = 0;
        pend[i].deadline = sl_time_now() + SL_RV_HANDSHAKE_S;
    }
    for (i = 0; i < npend; ++i) {
        if (pend[i].state != SL_RV_FREE) {
            close(pend[i].fd);
        }
    }
    sl_rv_say_drops(rv);
out:
    free(slot);
    free(pfd);
    free(pend);
    return status;
}

/* Why rank 0 refused this rank, said on this rank. */
static sl_status_t sl_rv_refused(const sl_rendezvous_t *rv,
                                 const sl_launcher_t *l,
                                 const sl_boot_challenge_t *ch,
                                 sl_errbuf_t *eb)
{
    char mine[2 * SL_AUTH_FP_LEN + 1], theirs[sizeof(mine)];

    if (ch->verdict == SL_BOOT_WRONG_SECRET) {
        sl_auth_fingerprint_hex(rv->auth.fingerprint, mine);
        sl_auth_fingerprint_hex(ch->fingerprint, theirs);
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank 0 at %s:%d refused rank %d: the job secrets "
                        "differ (this rank's fingerprint %s, rank 0's %s); "
                        "give every rank the same STAGELINK_JOB_SECRET or "
                        "STAGELINK_JOB_SECRET_FILE", l->addr, l->port,
                        rv->rank, mine, theirs);
    }
    if (ch->verdict == SL_BOOT_WRONG_VERSION) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank 0 at %s:%d speaks bootstrap version %u, rank %d "
                        "version %u: run one stagelink release on every rank",
                        l->addr, l->port, ch->version, rv->rank,
                        SL_BOOT_VERSION);
    }
    if (ch->verdict == SL_BOOT_WRONG_MODE) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank 0 at %s:%d refused rank %d: %s; set "
                        "STAGELINK_JOB_SECRET (or _FILE) alike on every rank",
                        l->addr, l->port, rv->rank,
                        rv->auth.mode == SL_AUTH_NONE
                            ? "rank 0 requires a job secret and this rank "
                              "has none"
                            : "this rank has a job secret and rank 0 runs "
                              "without one");
    }
    return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                    "rank 0 at %s:%d refused rank %d (world %d, job key "
                    "%016llx): %s", l->addr, l->port, rv->rank,
                    rv->world_size, (unsigned long long)rv->job_key,
                    (ch->verdict < SL_ARRAY_SIZE(sl_rv_verdict_text) &&
                     sl_rv_verdict_text[ch->verdict] != NULL)
                        ? sl_rv_verdict_text[ch->verdict]
                        : "an unknown reason");
}

/*
 * One attempt to join.  *again is 1 when rank 0 closed the connection
 * before it answered (it evicted or timed us out), 2 when an answer that
 * nothing proves came from rank 0 failed this rank (a refusal, a foreign
 * magic, a wrong proof: a proxy can forge each) while this rank holds a
 * secret; another attempt may succeed.
 */
static sl_status_t sl_rv_join_once(sl_rendezvous_t *rv,
                                   const sl_launcher_t *l, double deadline,
                                   int fd, int *again, sl_errbuf_t *eb)
{
    struct {
        sl_boot_hdr_t   hdr;
        sl_boot_hello_t hello;
    } msg;
    sl_auth_bind_t      bind;
    sl_boot_challenge_t ch;
    sl_boot_proof_t     proof;
    sl_boot_welcome_t   w;
    sl_auth_part_t      part = {&w, offsetof(sl_boot_welcome_t, seal)};
    uint8_t             want[SL_AUTH_MAC_LEN];
    sl_status_t         status;

    *again = 0;
    memset(&msg, 0, sizeof(msg));
    msg.hdr = (sl_boot_hdr_t){SL_BOOT_MAGIC, SL_BOOT_VERSION,
                              (uint32_t)rv->rank, (uint32_t)rv->world_size,
                              rv->job_key, sizeof(msg.hello)};
    msg.hello.mode = rv->auth.mode;
    memcpy(msg.hello.fingerprint, rv->auth.fingerprint, SL_AUTH_FP_LEN);
    if (rv->auth.mode == SL_AUTH_HMAC) {
        SL_CHECK(sl_auth_random(msg.hello.nonce, SL_AUTH_NONCE_LEN, eb));
    }
    *again = 1;
    status = sl_sock_io(fd, &msg, sizeof(msg), 1, deadline, NULL, eb);
    if (status == STAGELINK_SUCCESS) {
        status = sl_sock_io(fd, &ch, sizeof(ch), 0, deadline, NULL, eb);
    }
    if (status != STAGELINK_SUCCESS) {
        return status;
    }
    *again = 0;
    if (ch.magic != SL_BOOT_MAGIC) {
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "%s:%d answered the hello with magic 0x%x, not a "
                          "stagelink rank 0 of version %u", l->addr, l->port,
                          ch.magic, SL_BOOT_VERSION);
        goto unproven;
    }
    if (ch.verdict != SL_BOOT_ADMIT) {
        status = sl_rv_refused(rv, l, &ch, eb);
        goto unproven;
    }
    if (ch.mode != (uint32_t)rv->auth.mode) {
        ch.verdict = SL_BOOT_WRONG_MODE;
        status     = sl_rv_refused(rv, l, &ch, eb);
        goto unproven;
    }
    if (rv->auth.mode == SL_AUTH_NONE) {
        return STAGELINK_SUCCESS;
    }
    bind = (sl_auth_bind_t){.rank = (uint32_t)rv->rank,
                            .world_size = (uint32_t)rv->world_size,
                            .job_key = rv->job_key};
    memcpy(bind.client_nonce, msg.hello.nonce, SL_AUTH_NONCE_LEN);
    memcpy(bind.root_nonce, ch.nonce, SL_AUTH_NONCE_LEN);
    SL_CHECK(sl_auth_compute(&rv->auth, SL_AUTH_ROOT_PROOF, &bind, want, eb));
    if (!sl_auth_equal(want, ch.proof, sizeof(want))) {
        /* Nothing of ours goes to a listener that cannot prove itself. */
        status = sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                          "%s:%d did not prove it holds the job secret (a "
                          "process posing as rank 0?); rank %d sent it "
                          "nothing", l->addr, l->port, rv->rank);
        goto unproven;
    }
    SL_CHECK(sl_auth_compute(&rv->auth, SL_AUTH_CLIENT_PROOF, &bind,
                             proof.proof, eb));
    *again = 1;
    status = sl_sock_io(fd, &proof, sizeof(proof), 1, deadline, NULL, eb);
    if (status == STAGELINK_SUCCESS) {
        status = sl_sock_io(fd, &w, sizeof(w), 0, deadline, NULL, eb);
    }
    if (status != STAGELINK_SUCCESS) {
        return status;
    }
    *again = 0;
    rv->links[0] = (sl_auth_link_t){.sealed = 1};
    SL_CHECK(sl_auth_compute(&rv->auth, SL_AUTH_SESSION_KEY, &bind,
                             rv->links[0].key, eb));
    SL_CHECK(sl_auth_check(&rv->links[0], SL_AUTH_FROM_ROOT, &part, 1,
                           &w.seal, "rank 0's welcome", eb));
    if (w.magic != SL_BOOT_MAGIC || w.rank != (uint32_t)rv->rank) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "rank 0's welcome names rank %u with magic 0x%x, "
                        "this is rank %d", w.rank, w.magic, rv->rank);
    }
    return STAGELINK_SUCCESS;
unproven:
    *again = (rv->auth.mode == SL_AUTH_HMAC) ? 2 : 0;
    return status;
}

static sl_status_t sl_rv_connect(sl_rendezvous_t *rv, const sl_launcher_t *l,
                              double deadline, sl_errbuf_t *eb)
{
    char        unproven[SL_ERRBUF_LEN] = "", last[SL_ERRBUF_LEN];
    sl_status_t status;
    int         again, fd, tries;

    for (tries = 1;; ++tries) {
        status = sl_sock_connect(l->addr, l->port, "rank 0", deadline, &fd,
                                 eb);
        if (status != STAGELINK_SUCCESS) {
            goto fail;
        }
        status = sl_rv_join_once(rv, l, deadline, fd, &again, eb);
        if (status == STAGELINK_SUCCESS) {
            rv->root_fd = fd;
            SL_INFO(SL_SUBSYS_BOOT, "joined rendezvous %s:%d (%s, %d "
                    "attempt%s)", l->addr, l->port,
                    rv->auth.mode == SL_AUTH_HMAC ? "authenticated"
                                                  : "unauthenticated",
                    tries, tries > 1 ? "s" : "");
            return STAGELINK_SUCCESS;
        }
        close(fd);
        if (!again) {
            return status;
        }
        if (again == 2 && unproven[0] == '\0') {
            snprintf(unproven, sizeof(unproven), "%s", eb->msg);
            SL_WARN(SL_SUBSYS_BOOT, "%s; nothing proves that rank 0 sent "
                    "this answer (a proxy could forge it), so rank %d tries "
                    "again until its deadline", unproven, rv->rank);
        }
        if (sl_deadline_passed(deadline)) {
            goto fail;
        }
        SL_INFO(SL_SUBSYS_BOOT, "attempt %d to join failed (%s); joining "
                "again", tries, eb->msg);
        usleep(SL_RV_RETRY_US);
    }
fail:
    snprintf(last, sizeof(last), "%s", eb->msg);
    if (unproven[0] != '\0') {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP, "rank %d did not join "
                        "rank 0 at %s:%d before its deadline (%d attempts); "
                        "the first answer, unauthenticated: %s", rv->rank,
                        l->addr, l->port, tries, unproven);
    }
    if (tries == 1) {
        return status; /* the connect's own sentence names the address */
    }
    return sl_error(eb, status, "rank 0 at %s:%d closed all %d attempts of "
                    "rank %d to join before answering (last: %s); is it a "
                    "rank 0 of this job and stagelink version, and not "
                    "flooded?", l->addr, l->port, tries, rv->rank, last);
}

/* Across nodes, anyone on the network who learns the job key can join:
 * said as a warning once a process; on one node (loopback) as info. */
static void sl_rv_say_unauthenticated(const sl_launcher_t *l)
{
    static atomic_int said;
    const char       *addr = (l->rank == 0) ? l->bind : l->addr;

    if (!sl_sock_is_loopback(addr) && !atomic_exchange(&said, 1)) {
        SL_WARN(SL_SUBSYS_BOOT, "the rendezvous at %s:%d runs "
                "unauthenticated across nodes: any process that reaches it "
                "with the job key can join the job; give every rank the "
                "same STAGELINK_JOB_SECRET or STAGELINK_JOB_SECRET_FILE",
                addr, l->port);
        return;
    }
    SL_INFO(SL_SUBSYS_BOOT, "the rendezvous at %s:%d is unauthenticated: "
            "any process that reaches it with the job key can join", addr,
            l->port);
}

/* A host name that resolves to loopback on rank 0's node (Debian's
 * "127.0.1.1 host" line) while ranks run on other nodes: they cannot reach
 * the listener, and would only time out.  A literal loopback address is the
 * user's choice (several invocations on one host). */
static void sl_rv_say_loopback(const sl_launcher_t *l)
{
    struct in6_addr any;

    if (l->local_size >= 0 && l->local_size < l->world_size &&
        inet_pton(AF_INET, l->bind, &any) != 1 &&
        inet_pton(AF_INET6, l->bind, &any) != 1 &&
        strcmp(l->bind, "localhost") != 0 && sl_sock_is_loopback(l->bind)) {
        SL_WARN(SL_SUBSYS_BOOT, "rank 0 listens on %s:%d, which resolves to "
                "a loopback address here, while %d of %d ranks run on this "
                "node: the others cannot reach it; set MASTER_ADDR (or "
                "STAGELINK_BOOTSTRAP_ADDR) to this node's network address, "
                "or STAGELINK_BOOTSTRAP_BIND=0.0.0.0", l->bind, l->port,
                l->local_size, l->world_size);
    }
}

sl_status_t sl_rendezvous_open(sl_rendezvous_t *rv,
                               const sl_launcher_t *launcher, double timeout,
                               sl_errbuf_t *eb)
{
    double      deadline = sl_deadline(timeout);
    sl_status_t status;
    int         lfd = -1, i;

    memset(rv, 0, sizeof(*rv));
    rv->rank       = launcher->rank;
    rv->world_size = launcher->world_size;
    rv->job_key    = launcher->job_key;
    rv->root_fd    = -1;
    SL_CHECK_GOTO(sl_auth_load(&rv->auth, rv->job_key, eb), err);
    if (rv->auth.mode == SL_AUTH_NONE) {
        sl_rv_say_unauthenticated(launcher);
    }
    rv->links = calloc(rv->rank == 0 ? (size_t)rv->world_size : 1,
                       sizeof(*rv->links));
    if (rv->links == NULL) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d rendezvous links",
                          rv->world_size);
        goto err;
    }
    if (rv->rank != 0) {
        SL_CHECK_GOTO(sl_rv_connect(rv, launcher, deadline, eb), err);
        sl_auth_clear(&rv->auth);
        return STAGELINK_SUCCESS;
    }
    rv->peer_fds = malloc((size_t)rv->world_size * sizeof(int));
    if (rv->peer_fds == NULL) {
        status = sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                          "cannot allocate %d rendezvous sockets",
                          rv->world_size);
        goto err;
    }
    for (i = 0; i < rv->world_size; ++i) {
        rv->peer_fds[i] = -1;
    }
    sl_rv_say_loopback(launcher);
    SL_CHECK_GOTO(sl_sock_listen(launcher, &lfd, eb), err);
    status = sl_rv_accept_all(rv, lfd, deadline, timeout, eb);
    /* Later clients must find nobody listening rather than hang. */
    close(lfd);
    if (status != STAGELINK_SUCCESS) {
        goto err;
    }
    SL_INFO(SL_SUBSYS_BOOT, "rendezvous on %s:%d complete, %d ranks (%s)",
            launcher->addr, launcher->port, rv->world_size,
            rv->auth.mode == SL_AUTH_HMAC ? "authenticated"
                                          : "unauthenticated");
    sl_auth_clear(&rv->auth); /* the links' keys are all that is needed */
    return STAGELINK_SUCCESS;
err:
    sl_rendezvous_close(rv);
    return status;
}

void sl_rendezvous_close(sl_rendezvous_t *rv)
{
    int i;

    if (rv->root_fd >= 0) {
        close(rv->root_fd);
        rv->root_fd = -1;
    }
    if (rv->peer_fds != NULL) {
        for (i = 0; i < rv->world_size; ++i) {
            if (rv->peer_fds[i] >= 0) {
                close(rv->peer_fds[i]);
            }
        }
        free(rv->peer_fds);
        rv->peer_fds = NULL;
    }
    if (rv->links != NULL) {
        sl_auth_clear_links(rv->links,
                            rv->rank == 0 ? (size_t)rv->world_size : 1);
        free(rv->links);
        rv->links = NULL;
    }
    sl_auth_clear(&rv->auth);
}
