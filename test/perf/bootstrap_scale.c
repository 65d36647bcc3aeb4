/*
 * The bootstrap exchange alone against the rank count: WORLD ranks are
 * threads of this process, placed in Megatron's order (t, then data
 * parallel, then p stages), each making init's exchanges with the ranks
 * init names (sl_layout_peers; the NCCL cards with its TP group) and
 * finalize's barrier, with blobs of init's sizes.  Through
 *   store      a store in this process, as torch's TCPStore serves one:
 *              the keys each rank reads are counted;
 *   allgather  the host allgather callback over the same store, the way
 *              stagelink's Python store bootstrap worked before: each
 *              call writes one key and reads every rank's;
 *   tcp        the built-in rendezvous on loopback: the bytes each rank
 *              receives are counted (recv is wrapped).
 * -w adds the exchange init makes when the launcher gives no local rank:
 * 64-byte node identities with every rank.  Prints one CSV line per world:
 *   backend,world,t,p,seconds,reads_per_rank_max,bytes_per_rank_max,bytes_rank0
 * (the maximum over ranks but 0, which serves the tcp rendezvous).  With
 * -c, fails unless each rank's reads stay within its exchanges' peers
 * (store), i.e. do not grow with the world.
 *   bootstrap_scale [-b store|allgather|tcp] [-t T] [-p P] [-w] [-c] WORLD...
 * SPDX-License-Identifier: MIT
 */
#include "loopback.h"
#include "sl_bootstrap.h"
#include "sl_layout.h"
#include "sl_node.h"
#include "sl_time.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Init's blobs: rank facts, a UCX worker address part (tcp and shm,
 * network-only copy included), an NCCL card, the barrier's byte. */
#define FACTS_BYTES 96
#define ADDR_BYTES  720
#define NCCL_BYTES  152
#define BUCKETS     4096

typedef struct entry {
    struct entry *next;
    char          key[64];
    size_t        len;
    char          data[];
} entry_t;

/* One lock and condition per bucket: a set wakes only the readers of
 * keys that hash alike. */
typedef struct bucket {
    pthread_mutex_t lock;
    pthread_cond_t  cv;
    entry_t        *head;
} bucket_t;

static bucket_t         store[BUCKETS];
static __thread uint64_t my_reads, my_bytes;
static int              world, tp, pp, port, no_local;
static const char      *backend = "store";

ssize_t __real_recv(int fd, void *buf, size_t len, int flags);
ssize_t __wrap_recv(int fd, void *buf, size_t len, int flags);
ssize_t __wrap_recv(int fd, void *buf, size_t len, int flags)
{
    ssize_t n = __real_recv(fd, buf, len, flags);

    my_bytes += (n > 0) ? (uint64_t)n : 0;
    return n;
}

static bucket_t *bucket_of(const char *key)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (; *key != '\0'; ++key) {
        h = (h ^ (unsigned char)*key) * 0x100000001b3ull;
    }
    return &store[h % BUCKETS];
}

static int store_set(void *ctx, const char *key, const void *buf, size_t size)
{
    bucket_t *b = bucket_of(key);
    entry_t  *e = malloc(sizeof(*e) + size);

    (void)ctx;
    if (e == NULL) {
        return -1;
    }
    snprintf(e->key, sizeof(e->key), "%s", key);
    memcpy(e->data, buf, size);
    e->len = size;
    pthread_mutex_lock(&b->lock);
    e->next = b->head;
    b->head = e;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->lock);
    return 0;
}

static int store_get(void *ctx, const char *key, void *buf, size_t cap,
                     size_t *size)
{
    bucket_t *b = bucket_of(key);
    entry_t  *e;

    (void)ctx;
    pthread_mutex_lock(&b->lock);
    for (;;) {
        for (e = b->head; e != NULL && strcmp(e->key, key) != 0; e = e->next) {
        }
        if (e != NULL) {
            break;
        }
        pthread_cond_wait(&b->cv, &b->lock);
    }
    *size = e->len;
    memcpy(buf, e->data, (e->len < cap) ? e->len : cap);
    pthread_mutex_unlock(&b->lock);
    my_reads++;
    my_bytes += e->len;
    return 0;
}

static void store_clear(void)
{
    entry_t *e, *next;
    int      i;

    for (i = 0; i < BUCKETS; ++i) {
        for (e = store[i].head; e != NULL; e = next) {
            next = e->next;
            free(e);
        }
        store[i].head = NULL;
    }
}

/* The allgather callback over the store, one round a call. */
typedef struct ag_state {
    int      rank;
    unsigned round;
} ag_state_t;

static int store_allgather(void *ctx, const void *send, void *recv,
                           size_t size)
{
    ag_state_t *s = ctx;
    char        key[64];
    size_t      got;
    int         r;

    snprintf(key, sizeof(key), "ag%u/%d", s->round, s->rank);
    if (store_set(NULL, key, send, size) != 0) {
        return -1;
    }
    for (r = 0; r < world; ++r) {
        snprintf(key, sizeof(key), "ag%u/%d", s->round, r);
        if (store_get(NULL, key, (char *)recv + (size_t)r * size, size, &got) !=
                0 || got != size) {
            return -1;
        }
    }
    s->round++;
    return 0;
}

typedef struct rank_run {
    int         rank;
    sl_status_t status;
    uint64_t    reads, bytes, bound;
    char        msg[SL_ERRBUF_LEN];
} rank_run_t;

static int *everyone; /* 0..world-1 */

static sl_status_t rank_exchanges(sl_bootstrap_t *bs, const sl_layout_t *l,
                                  rank_run_t *run, sl_errbuf_t *eb)
{
    char           facts[FACTS_BYTES] = {0}, addr[ADDR_BYTES] = {0};
    char           nccl[NCCL_BYTES] = {0};
    int            peers[64], n;
    sl_boot_blob_t got[64];
    char          *out;
    sl_status_t    status;

    if (l->tp_size + 1 > 64) {
        return sl_error(eb, STAGELINK_ERR_INVALID_ARG, "t %d above 63",
                        l->tp_size);
    }
    n          = sl_layout_peers(l, peers);
    run->bound = 3ull * (uint64_t)n + (uint64_t)l->tp_size;
    out        = malloc((size_t)world * SL_NODE_ID_LEN + NCCL_BYTES * 64);
    if (out == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY, "no memory");
    }
    status = sl_bootstrap_exchange_fixed(bs, "facts", facts, sizeof(facts),
                                         peers, n, out, eb);
    if (status == STAGELINK_SUCCESS && no_local) {
        run->bound += (uint64_t)world;
        status = sl_bootstrap_exchange_fixed(bs, "nodes", nccl, SL_NODE_ID_LEN,
                                             everyone, world, out, eb);
    }
    if (status == STAGELINK_SUCCESS) {
        status = sl_bootstrap_exchange(bs, "addr", addr, sizeof(addr), peers,
                                       n, got, eb);
        sl_bootstrap_blobs_free(got, n);
    }
    if (status == STAGELINK_SUCCESS) {
        status = sl_bootstrap_exchange_fixed(bs, "nccl", nccl, sizeof(nccl),
                                             l->tp_ranks, l->tp_size, out, eb);
    }
    if (status == STAGELINK_SUCCESS) {
        status = sl_bootstrap_barrier(bs, peers, n, eb);
    }
    free(out);
    return status;
}

static void *run_rank(void *arg)
{
    rank_run_t   *run = arg;
    sl_launcher_t la  = {.source = "bench", .rank = run->rank,
                         .world_size = world, .local_rank = 0,
                         .local_size = 1, .port = port};
    stagelink_config_t cfg;
    ag_state_t    ag = {run->rank, 0};
    sl_bootstrap_t bs;
    sl_layout_t   l;
    sl_errbuf_t   eb = {{0}};

    memset(&cfg, 0, sizeof(cfg));
    strcpy(la.addr, "127.0.0.1");
    strcpy(la.bind, "127.0.0.1");
    la.boot = strcmp(backend, "tcp") == 0 ? SL_BOOT_TCP : SL_BOOT_CALLBACKS;
    if (strcmp(backend, "store") == 0) {
        cfg.store_set = store_set;
        cfg.store_get = store_get;
    } else if (strcmp(backend, "allgather") == 0) {
        cfg.allgather     = store_allgather;
        cfg.allgather_ctx = &ag;
    }
    my_reads = my_bytes = 0;
    run->status = sl_layout_from_order(run->rank, world, tp, pp, &l, &eb);
    if (run->status == STAGELINK_SUCCESS) {
        run->status = sl_bootstrap_init(&bs, &cfg, &la, 120.0, &eb);
        if (run->status == STAGELINK_SUCCESS) {
            run->status = rank_exchanges(&bs, &l, run, &eb);
            sl_bootstrap_cleanup(&bs);
        }
        sl_layout_cleanup(&l);
    }
    run->reads = my_reads;
    run->bytes = my_bytes;
    snprintf(run->msg, sizeof(run->msg), "%s", eb.msg);
    return NULL;
}

static int run_world(int check)
{
    pthread_attr_t attr;
    pthread_t     *th   = calloc((size_t)world, sizeof(*th));
    rank_run_t    *runs = calloc((size_t)world, sizeof(*runs));
    uint64_t       reads = 0, bytes = 0;
    double         t0;
    int            r, bad = 0, held = -1;

    if (th == NULL || runs == NULL) {
        return 1;
    }
    if (strcmp(backend, "tcp") == 0 && (held = hold_port(&port)) < 0) {
        return 1;
    }
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 << 10);
    t0 = sl_time_now();
    for (r = 0; r < world; ++r) {
        runs[r].rank = r;
        if (pthread_create(&th[r], &attr, run_rank, &runs[r]) != 0) {
            fprintf(stderr, "cannot start thread %d\n", r);
            return 1; /* the process exits: the others go with it */
        }
    }
    for (r = 0; r < world; ++r) {
        pthread_join(th[r], NULL);
    }
    t0 = sl_time_now() - t0;
    for (r = 0; r < world; ++r) {
        if (runs[r].status != STAGELINK_SUCCESS) {
            fprintf(stderr, "rank %d: %s\n", r, runs[r].msg);
            bad = 1;
        }
        if (check && runs[r].reads > runs[r].bound) {
            fprintf(stderr, "rank %d read %llu keys, more than the %llu its "
                    "peers publish in init's exchanges\n", r,
                    (unsigned long long)runs[r].reads,
                    (unsigned long long)runs[r].bound);
            bad = 1;
        }
        reads = (runs[r].reads > reads) ? runs[r].reads : reads;
        if (r > 0) {
            bytes = (runs[r].bytes > bytes) ? runs[r].bytes : bytes;
        }
    }
    printf("%s%s,%d,%d,%d,%.3f,%llu,%llu,%llu\n", backend,
           no_local ? "-nodes" : "", world, tp, pp, t0,
           (unsigned long long)reads, (unsigned long long)bytes,
           (unsigned long long)runs[0].bytes);
    fflush(stdout);
    if (held >= 0) {
        close(held);
    }
    store_clear();
    pthread_attr_destroy(&attr);
    free(runs);
    free(th);
    return bad;
}

int main(int argc, char **argv)
{
    struct rlimit lim;
    int           opt, check = 0, bad = 0, i, p_max = 16;

    tp = 8;
    while ((opt = getopt(argc, argv, "b:t:p:wc")) != -1) {
        switch (opt) {
        case 'b': backend = optarg; break;
        case 't': tp = atoi(optarg); break;
        case 'p': p_max = atoi(optarg); break;
        case 'w': no_local = 1; break;
        case 'c': check = 1; break;
        default:
            fprintf(stderr, "usage: bootstrap_scale [-b store|allgather|tcp] "
                    "[-t T] [-p P] [-w] [-c] WORLD...\n");
            return 2;
        }
    }
    if (strcmp(backend, "store") != 0 && strcmp(backend, "allgather") != 0 &&
        strcmp(backend, "tcp") != 0) {
        fprintf(stderr, "unknown backend %s\n", backend);
        return 2;
    }
    /* tcp: rank 0 holds a socket per rank, each rank one. */
    if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < 8192) {
        lim.rlim_cur = (lim.rlim_max < 8192) ? lim.rlim_max : 8192;
        setrlimit(RLIMIT_NOFILE, &lim);
    }
    for (i = 0; i < BUCKETS; ++i) {
        pthread_mutex_init(&store[i].lock, NULL);
        pthread_cond_init(&store[i].cv, NULL);
    }
    setenv("STAGELINK_DEBUG", "WARN", 0);
    printf("backend,world,t,p,seconds,reads_per_rank_max,bytes_per_rank_max,"
           "bytes_rank0\n");
    for (i = optind; i < argc; ++i) {
        world = atoi(argv[i]);
        if (world < tp || world % tp != 0) {
            fprintf(stderr, "world %d is not a multiple of t %d\n", world, tp);
            return 2;
        }
        /* Megatron's order: t, then data parallel, then p stages. */
        pp = (world / tp < p_max) ? world / tp : p_max;
        while ((world / tp) % pp != 0) {
            --pp;
        }
        everyone = calloc((size_t)world, sizeof(*everyone));
        for (opt = 0; everyone != NULL && opt < world; ++opt) {
            everyone[opt] = opt;
        }
        bad |= (everyone == NULL) || run_world(check);
        free(everyone);
    }
    return bad;
}
