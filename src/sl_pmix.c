/* The bootstrap's store over PMIx.  SPDX-License-Identifier: MIT */
#include "sl_pmix.h"
#include "sl_log.h"
#include "sl_time.h"

#include <stdio.h>

#if SL_HAVE_PMIX
#include <dlfcn.h>
#include <math.h>
#include <pmix.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SL_PMIX_LIBRARY "libpmix.so.2"

/* The calls used, with the types of the header the build saw. */
typedef struct sl_pmix_lib {
    __typeof__(&PMIx_Init)           init;
    __typeof__(&PMIx_Finalize)       finalize;
    __typeof__(&PMIx_Put)            put;
    __typeof__(&PMIx_Commit)         commit;
    __typeof__(&PMIx_Get)            get;
    __typeof__(&PMIx_Fence)          fence;
    __typeof__(&PMIx_Value_destruct) value_destruct;
    __typeof__(&PMIx_Info_load)      info_load;
    __typeof__(&PMIx_Error_string)   error_string;
} sl_pmix_lib_t;

typedef struct sl_pmix {
    pmix_proc_t proc;
    char        prefix[128];
    char        key[PMIX_MAX_KEYLEN + 1];
} sl_pmix_t;

static sl_pmix_lib_t  sl_pmix_lib;
static char           sl_pmix_dlerror[256];
static pthread_once_t sl_pmix_once = PTHREAD_ONCE_INIT;

/* PMIx joined once per process and left at exit, as MPI does: a client
 * that finalizes and joins again meets its server's purged entry and gets
 * that may wait out their timeout.  The plugin stays loaded (-z nodelete),
 * so the exit handler's code does too. */
static pthread_mutex_t sl_pmix_lock = PTHREAD_MUTEX_INITIALIZER;
static pmix_proc_t     sl_pmix_self;
static int             sl_pmix_joined;

/* Opened once and kept: PMIx's own threads run its code until exit.
 * RTLD_GLOBAL, as its components resolve their symbols in it. */
static void sl_pmix_load(void)
{
    void *h = dlopen(SL_PMIX_LIBRARY, RTLD_NOW | RTLD_GLOBAL);

    if (h == NULL) {
        snprintf(sl_pmix_dlerror, sizeof(sl_pmix_dlerror), "%s", dlerror());
        return;
    }
#define SL_PMIX_SYM(_field, _name) \
    *(void **)&sl_pmix_lib._field = dlsym(h, #_name)
    SL_PMIX_SYM(init, PMIx_Init);
    SL_PMIX_SYM(finalize, PMIx_Finalize);
    SL_PMIX_SYM(put, PMIx_Put);
    SL_PMIX_SYM(commit, PMIx_Commit);
    SL_PMIX_SYM(get, PMIx_Get);
    SL_PMIX_SYM(fence, PMIx_Fence);
    SL_PMIX_SYM(value_destruct, PMIx_Value_destruct);
    SL_PMIX_SYM(info_load, PMIx_Info_load);
    SL_PMIX_SYM(error_string, PMIx_Error_string);
#undef SL_PMIX_SYM
    if (sl_pmix_lib.init == NULL || sl_pmix_lib.finalize == NULL ||
        sl_pmix_lib.put == NULL || sl_pmix_lib.commit == NULL ||
        sl_pmix_lib.get == NULL || sl_pmix_lib.fence == NULL ||
        sl_pmix_lib.value_destruct == NULL ||
        sl_pmix_lib.info_load == NULL || sl_pmix_lib.error_string == NULL) {
        snprintf(sl_pmix_dlerror, sizeof(sl_pmix_dlerror),
                 "it lacks a PMIx 4 call (PMIx_Info_load ...): too old a PMIx");
        sl_pmix_lib.init = NULL;
    }
}

static int sl_pmix_key(sl_pmix_t *px, const char *key)
{
    int n = snprintf(px->key, sizeof(px->key), "%s%s", px->prefix, key);

    return n >= 0 && (size_t)n < sizeof(px->key);
}

static sl_status_t sl_pmix_set(void *ctx, const char *key, const void *buf,
                               size_t len, double deadline, sl_errbuf_t *eb)
{
    sl_pmix_t    *px = ctx;
    pmix_value_t  val;
    pmix_status_t rc;

    (void)deadline; /* put and commit hand the bytes to the local server */
    if (!sl_pmix_key(px, key)) {
        return sl_error(eb, STAGELINK_ERR_INTERNAL, "PMIx key %s%s is too "
                        "long", px->prefix, key);
    }
    memset(&val, 0, sizeof(val));
    val.type          = PMIX_BYTE_OBJECT;
    val.data.bo.bytes = (char *)buf;
    val.data.bo.size  = len;
    rc = sl_pmix_lib.put(PMIX_GLOBAL, px->key, &val);
    if (rc == PMIX_SUCCESS) {
        rc = sl_pmix_lib.commit();
    }
    if (rc != PMIX_SUCCESS) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "PMIx_Put/PMIx_Commit of %s (%zu bytes) as rank %u of "
                        "%s: %s", px->key, len, px->proc.rank,
                        px->proc.nspace, sl_pmix_lib.error_string(rc));
    }
    return STAGELINK_SUCCESS;
}

/* One PMIx_Get of the peer's key, waiting up to `deadline`. */
static pmix_status_t sl_pmix_get_once(sl_pmix_t *px, const pmix_proc_t *peer,
                                      int refresh, double deadline,
                                      pmix_value_t **val)
{
    pmix_info_t info[2];
    bool        yes   = true;
    size_t      ninfo = 0;
    int         secs;

    memset(info, 0, sizeof(info));
    if (refresh) {
        sl_pmix_lib.info_load(&info[ninfo++], PMIX_GET_REFRESH_CACHE, &yes,
                              PMIX_BOOL);
    }
    if (deadline != 0.0) {
        double left = deadline - sl_time_now();

        secs = left < 1.0 ? 1 : (int)ceil(left);
        sl_pmix_lib.info_load(&info[ninfo++], PMIX_TIMEOUT, &secs, PMIX_INT);
    }
    *val = NULL;
    return sl_pmix_lib.get(peer, px->key, info, ninfo, val);
}

/*
 * A get waits for the peer's commit where the server knows the key will
 * come (a local peer's first commit, a remote peer's data not yet
 * fetched).  A key committed after data of the same peer reached this
 * node's cache is NOT_FOUND there, and a peer between an earlier
 * communicator's PMIx_Finalize and this one's PMIx_Init has no entry at
 * all (PROC_ENTRY_NOT_FOUND): asked again with the cache refreshed, then
 * again after a nap, until the deadline.
 */
static int sl_pmix_not_yet(pmix_status_t rc)
{
    return rc == PMIX_ERR_NOT_FOUND || rc == PMIX_ERR_PROC_ENTRY_NOT_FOUND;
}

static sl_status_t sl_pmix_get(void *ctx, const char *key, void *buf,
                               size_t capacity, size_t *size, double deadline,
                               const sl_sock_progress_t *progress,
                               sl_errbuf_t *eb)
{
    sl_pmix_t    *px    = ctx;
    pmix_proc_t   peer  = px->proc;
    pmix_value_t *val   = NULL;
    const char   *slash = strrchr(key, '/');
    pmix_status_t rc;
    long          nap = 0;
    int           tries;

    (void)progress; /* PMIx_Get blocks; init's exchanges need none */
    if (slash == NULL || !sl_pmix_key(px, key)) {
        return sl_error(eb, STAGELINK_ERR_INTERNAL, "PMIx key %s%s has no "
                        "rank or is too long", px->prefix, key);
    }
    peer.rank = (pmix_rank_t)strtoul(slash + 1, NULL, 10);
    for (tries = 0;; ++tries) {
        rc = sl_pmix_get_once(px, &peer, tries > 0, deadline, &val);
        if (!sl_pmix_not_yet(rc) || sl_deadline_passed(deadline)) {
            break;
        }
        if (tries > 0) {
            sl_time_nap(&nap);
        }
    }
    if (rc != PMIX_SUCCESS || val == NULL || val->type != PMIX_BYTE_OBJECT) {
        if (val != NULL) {
            sl_pmix_lib.value_destruct(val);
            free(val);
        }
        return sl_error(eb, rc == PMIX_ERR_TIMEOUT || sl_pmix_not_yet(rc)
                            ? STAGELINK_ERR_TIMEOUT : STAGELINK_ERR_BOOTSTRAP,
                        "PMIx_Get of %s from rank %u of %s: %s", px->key,
                        peer.rank, peer.nspace,
                        rc != PMIX_SUCCESS ? sl_pmix_lib.error_string(rc)
                                           : "not a byte object");
    }
    *size = val->data.bo.size;
    memcpy(buf, val->data.bo.bytes, *size < capacity ? *size : capacity);
    sl_pmix_lib.value_destruct(val);
    free(val);
    return STAGELINK_SUCCESS;
}

/* A fence without data: a peer's keys may leave with it once it
 * finalizes, so keys cannot make a closing barrier here. */
static sl_status_t sl_pmix_barrier(void *ctx, double deadline,
                                   sl_errbuf_t *eb)
{
    sl_pmix_t    *px  = ctx;
    pmix_proc_t   all = px->proc;
    pmix_info_t   info;
    pmix_status_t rc;
    size_t        ninfo = 0;
    int           secs;

    all.rank = PMIX_RANK_WILDCARD;
    memset(&info, 0, sizeof(info));
    if (deadline != 0.0) {
        double left = deadline - sl_time_now();

        secs = left < 1.0 ? 1 : (int)ceil(left);
        sl_pmix_lib.info_load(&info, PMIX_TIMEOUT, &secs, PMIX_INT);
        ninfo = 1;
    }
    rc = sl_pmix_lib.fence(&all, 1, ninfo ? &info : NULL, ninfo);
    if (rc != PMIX_SUCCESS) {
        return sl_error(eb, rc == PMIX_ERR_TIMEOUT ? STAGELINK_ERR_TIMEOUT
                                                   : STAGELINK_ERR_BOOTSTRAP,
                        "PMIx_Fence of %s: %s; did every rank reach "
                        "finalize?", px->proc.nspace,
                        sl_pmix_lib.error_string(rc));
    }
    return STAGELINK_SUCCESS;
}

static void sl_pmix_close(void *ctx)
{
    free(ctx);
}

static void sl_pmix_exit(void)
{
    sl_pmix_lib.finalize(NULL, 0);
}

static pmix_status_t sl_pmix_join(pmix_proc_t *proc)
{
    pmix_status_t rc = PMIX_SUCCESS;

    pthread_mutex_lock(&sl_pmix_lock);
    if (!sl_pmix_joined) {
        rc = sl_pmix_lib.init(&sl_pmix_self, NULL, 0);
        if (rc == PMIX_SUCCESS && atexit(sl_pmix_exit) != 0) {
            sl_pmix_lib.finalize(NULL, 0);
            rc = PMIX_ERR_NOMEM;
        }
        sl_pmix_joined = rc == PMIX_SUCCESS;
    }
    *proc = sl_pmix_self;
    pthread_mutex_unlock(&sl_pmix_lock);
    return rc;
}

static const sl_kv_ops_t sl_pmix_ops = {
    .name    = "pmix",
    .set     = sl_pmix_set,
    .get     = sl_pmix_get,
    .barrier = sl_pmix_barrier,
    .close   = sl_pmix_close,
};

sl_status_t sl_pmix_open(sl_kv_t *kv, int pmix_rank, const char *comm_id,
                         double deadline, sl_errbuf_t *eb)
{
    sl_pmix_t    *px;
    pmix_status_t rc;

    (void)deadline; /* PMIx_Init meets the local server, or fails at once */
    pthread_once(&sl_pmix_once, sl_pmix_load);
    if (sl_pmix_lib.init == NULL) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "the PMIx bootstrap cannot open %s (%s); install "
                        "PMIx (Debian: libpmix2), or set STAGELINK_BOOTSTRAP="
                        "tcp", SL_PMIX_LIBRARY, sl_pmix_dlerror);
    }
    px = calloc(1, sizeof(*px));
    if (px == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate a PMIx client");
    }
    rc = sl_pmix_join(&px->proc);
    if (rc != PMIX_SUCCESS) {
        free(px);
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "PMIx_Init as PMIX_RANK=%d: %s; was this process "
                        "started by the launcher's PMIx (srun --mpi=pmix, "
                        "mpirun)? Else set STAGELINK_BOOTSTRAP=tcp",
                        pmix_rank, sl_pmix_lib.error_string(rc));
    }
    if (px->proc.rank != (pmix_rank_t)pmix_rank) {
        sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                 "PMIx says this process is rank %u of %s, PMIX_RANK says %d: "
                 "an environment inherited from another process?",
                 px->proc.rank, px->proc.nspace, pmix_rank);
        sl_pmix_close(px);
        return STAGELINK_ERR_BOOTSTRAP;
    }
    snprintf(px->prefix, sizeof(px->prefix), "stagelink.%s.", comm_id);
    SL_INFO(SL_SUBSYS_BOOT, "bootstrap through PMIx as rank %u of %s, keys "
            "under %s", px->proc.rank, px->proc.nspace, px->prefix);
    kv->ops = &sl_pmix_ops;
    kv->ctx = px;
    return STAGELINK_SUCCESS;
}

#else

sl_status_t sl_pmix_open(sl_kv_t *kv, int pmix_rank, const char *comm_id,
                         double deadline, sl_errbuf_t *eb)
{
    (void)kv;
    (void)comm_id;
    (void)deadline;
    return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                    "PMIX_RANK=%d asks for the PMIx bootstrap, but this "
                    "stagelink was built without PMIx (pmix.h of Debian's "
                    "libpmix-dev at build time); set STAGELINK_BOOTSTRAP=tcp "
                    "or rebuild with -Dpmix=enabled", pmix_rank);
}

#endif
