/* SPDX-License-Identifier: MIT */
#include "nccl_api.h"

#include "sl_env.h"
#include "sl_log.h"
#include "sl_shard.h"
#include "sl_time.h"

#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t sl_nccl_lock = PTHREAD_MUTEX_INITIALIZER;
static sl_nccl_api_t   sl_nccl;
static int             sl_nccl_loaded;


static sl_status_t sl_nccl_load(sl_errbuf_t *eb)
{
    const struct {
        const char *name;
        void      **slot;
    } syms[] = {
        {"ncclGetVersion", (void **)&sl_nccl.GetVersion},
        {"ncclGetUniqueId", (void **)&sl_nccl.GetUniqueId},
        {"ncclCommInitRank", (void **)&sl_nccl.CommInitRank},
        {"ncclCommInitRankConfig", (void **)&sl_nccl.CommInitRankConfig},
        {"ncclCommGetAsyncError", (void **)&sl_nccl.CommGetAsyncError},
        {"ncclCommDestroy", (void **)&sl_nccl.CommDestroy},
        {"ncclCommAbort", (void **)&sl_nccl.CommAbort},
        {"ncclAllGather", (void **)&sl_nccl.AllGather},
        {"ncclBroadcast", (void **)&sl_nccl.Broadcast},
        {"ncclSend", (void **)&sl_nccl.Send},
        {"ncclRecv", (void **)&sl_nccl.Recv},
        {"ncclGroupStart", (void **)&sl_nccl.GroupStart},
        {"ncclGroupEnd", (void **)&sl_nccl.GroupEnd},
        {"ncclGetErrorString", (void **)&sl_nccl.GetErrorString},
        {"ncclGetLastError", (void **)&sl_nccl.GetLastError},
    };
    const char *names[3] = {sl_env_raw(SL_ENV_NCCL_LIBRARY), "libnccl.so.2",
                            STAGELINK_NCCL_LIBDIR "/libnccl.so.2"};
    char        tried[768] = "";
    void       *handle = NULL;
    size_t      i, used = 0;
    int         version;

    for (i = 0; i < 3 && handle == NULL; ++i) {
        if (names[i] == NULL) {
            continue;
        }
        handle = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL) {
            used += (size_t)snprintf(tried + used, sizeof(tried) - used,
                                     "%s%s", used ? "; " : "", dlerror());
            used = (used < sizeof(tried)) ? used : sizeof(tried) - 1;
        } else {
            snprintf(sl_nccl.path, sizeof(sl_nccl.path), "%s", names[i]);
        }
    }
    if (handle == NULL) {
        return sl_error(eb, STAGELINK_ERR_UNSUPPORTED,
                        "NCCL is not available: %s; set STAGELINK_NCCL_LIBRARY "
                        "to libnccl.so.2's path", tried);
    }
    for (i = 0; i < SL_ARRAY_SIZE(syms); ++i) {
        *syms[i].slot = dlsym(handle, syms[i].name);
        if (*syms[i].slot == NULL) {
            dlclose(handle);
            return sl_error(eb, STAGELINK_ERR_UNSUPPORTED,
                            "%s has no %s: NCCL too old (stagelink needs 2.19 "
                            "or newer)", sl_nccl.path, syms[i].name);
        }
    }
    sl_nccl.GetVersion(&version);
    SL_INFO(SL_SUBSYS_INIT, "NCCL %d loaded from %s", version, sl_nccl.path);
    return STAGELINK_SUCCESS;
}

sl_status_t sl_nccl_api_get(const sl_nccl_api_t **api, sl_errbuf_t *eb)
{
    sl_status_t status = STAGELINK_SUCCESS;

    pthread_mutex_lock(&sl_nccl_lock);
    if (!sl_nccl_loaded) {
        status         = sl_nccl_load(eb);
        sl_nccl_loaded = (status == STAGELINK_SUCCESS);
    }
    pthread_mutex_unlock(&sl_nccl_lock);
    *api = sl_nccl_loaded ? &sl_nccl : NULL;
    return status;
}

sl_status_t sl_nccl_check(const sl_nccl_api_t *api, ncclResult_t result,
                          ncclComm_t comm, const char *what, sl_errbuf_t *eb)
{
    if (result == ncclSuccess || result == ncclInProgress) {
        return STAGELINK_SUCCESS;
    }
    return sl_error(eb, STAGELINK_ERR_TRANSPORT, "%s failed: %s%s%s", what,
                    api->GetErrorString(result), comm ? ": " : "",
                    comm ? api->GetLastError(comm) : "");
}

sl_status_t sl_nccl_settle(const sl_nccl_api_t *api, ncclComm_t comm,
                           double deadline, const atomic_int *stop,
                           pthread_mutex_t *mu, const char *what,
                           sl_errbuf_t *eb)
{
    ncclResult_t state = ncclSuccess, got = ncclSuccess;
    long         nap   = 0;
    int          stopped;

    for (;;) {
        if (mu != NULL) {
            pthread_mutex_lock(mu);
        }
        stopped = (stop != NULL && atomic_load(stop));
        if (!stopped) {
            got = api->CommGetAsyncError(comm, &state);
        }
        if (mu != NULL) {
            pthread_mutex_unlock(mu);
        }
        if (stopped) {
            return sl_error(eb, STAGELINK_ERR_ABORTED, "%s was given up: the "
                            "communicator was aborted", what);
        }
        SL_CHECK(sl_nccl_check(api, got, comm, "ncclCommGetAsyncError", eb));
        if (state != ncclInProgress) {
            return sl_nccl_check(api, state, comm, what, eb);
        }
        if (sl_deadline_passed(deadline)) {
            return sl_error(eb, STAGELINK_ERR_TIMEOUT, "%s did not finish "
                            "within STAGELINK_TIMEOUT: a TP peer never joined "
                            "(it died, or its host never made the call); "
                            "check the other ranks' logs", what);
        }
        sl_time_nap(&nap); /* ranks may share cores with their peers */
    }
}

sl_status_t sl_nccl_comms_open(const sl_nccl_api_t *api, sl_nccl_open_t *opens,
                               int n, double deadline, sl_errbuf_t *eb)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    sl_errbuf_t  later;
    sl_status_t  status;
    int          i;

    config.blocking = 0;
    for (i = 0; i < n; ++i) {
        *opens[i].comm = NULL;
    }
    SL_CHECK(sl_nccl_check(api, api->GroupStart(), NULL, "ncclGroupStart", eb));
    status = STAGELINK_SUCCESS;
    for (i = 0; i < n && status == STAGELINK_SUCCESS; ++i) {
        status = sl_nccl_check(api, api->CommInitRankConfig(opens[i].comm,
                                                            opens[i].nranks,
                                                            opens[i].id,
                                                            opens[i].rank,
                                                            &config),
                               NULL, opens[i].what, eb);
    }
    /* The group ends in any case; a failure above keeps its sentence. */
    if (sl_nccl_check(api, api->GroupEnd(), NULL, "ncclGroupEnd",
                      (status == STAGELINK_SUCCESS) ? eb : &later) !=
        STAGELINK_SUCCESS) {
        status = STAGELINK_ERR_TRANSPORT;
    }
    for (i = 0; i < n && status == STAGELINK_SUCCESS; ++i) {
        if (*opens[i].comm != NULL) {
            status = sl_nccl_settle(api, *opens[i].comm, deadline, NULL,
                                    NULL, opens[i].what, eb);
        }
    }
    for (i = 0; i < n && status != STAGELINK_SUCCESS; ++i) {
        if (*opens[i].comm != NULL) {
            api->CommAbort(*opens[i].comm);
            *opens[i].comm = NULL;
        }
    }
    return status;
}

sl_status_t sl_nccl_async_error(const sl_nccl_api_t *api, ncclComm_t comm,
                                const char *what, sl_errbuf_t *eb)
{
    ncclResult_t state = ncclSuccess;
    char         name[160];

    SL_CHECK(sl_nccl_check(api, api->CommGetAsyncError(comm, &state), comm,
                           "ncclCommGetAsyncError", eb));
    snprintf(name, sizeof(name), "NCCL (an asynchronous error of %s)", what);
    return sl_nccl_check(api, state, comm, name, eb);
}

sl_status_t sl_nccl_allgather_inplace(const sl_nccl_api_t *api, ncclComm_t comm,
                                      void *buf, size_t nbytes,
                                      size_t elem_size, int parts, int index,
                                      cudaStream_t stream, sl_errbuf_t *eb)
{
    size_t      esize = (elem_size == 0) ? 1 : elem_size;
    sl_shard_t  shard = sl_shard_get(nbytes, elem_size, parts, index);
    sl_status_t status = STAGELINK_SUCCESS;
    int         k;

    if ((nbytes / esize) % (size_t)parts == 0) {
        return sl_nccl_check(api, api->AllGather((char *)buf + shard.offset,
                                                 buf, shard.length, ncclInt8,
                                                 comm, stream),
                             comm, "ncclAllGather", eb);
    }
    SL_CHECK(sl_nccl_check(api, api->GroupStart(), NULL, "ncclGroupStart", eb));
    for (k = 0; k < parts && status == STAGELINK_SUCCESS; ++k) {
        shard  = sl_shard_get(nbytes, elem_size, parts, k);
        status = sl_nccl_check(api, api->Broadcast((char *)buf + shard.offset,
                                                   (char *)buf + shard.offset,
                                                   shard.length, ncclInt8, k,
                                                   comm, stream),
                               comm, "ncclBroadcast", eb);
    }
    SL_CHECK(sl_nccl_check(api, api->GroupEnd(), comm, "ncclGroupEnd", eb));
    return status;
}

struct sl_nccl_thread {
    pthread_t       thread;
    pthread_mutex_t mu;
    pthread_cond_t  cv;
    sl_nccl_job_t   job;  /**< set: a job waits to run; NULL once it ran */
    void           *arg;
    sl_errbuf_t    *eb;
    sl_status_t     result;
    int             stop;
};

static void *sl_nccl_thread_main(void *arg)
{
    sl_nccl_thread_t *t = arg;

    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (t->job == NULL && !t->stop) {
            pthread_cond_wait(&t->cv, &t->mu);
        }
        if (t->job == NULL) {
            break;
        }
        /* The caller waits under no lock of ours: it sleeps on cv. */
        pthread_mutex_unlock(&t->mu);
        t->result = t->job(t->arg, t->eb);
        pthread_mutex_lock(&t->mu);
        t->job = NULL;
        pthread_cond_broadcast(&t->cv);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

sl_status_t sl_nccl_thread_start(sl_nccl_thread_t **out, sl_errbuf_t *eb)
{
    sl_nccl_thread_t *t = calloc(1, sizeof(*t));
    sigset_t          all, old;
    int               rc;

    *out = NULL;
    if (t == NULL) {
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY,
                        "cannot allocate the NCCL calls' thread");
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    /* Signals stay the host's: the thread takes none. */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&t->thread, NULL, sl_nccl_thread_main, t);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return sl_error(eb, STAGELINK_ERR_NO_MEMORY, "cannot start the "
                        "thread that makes NCCL's calls: %s", strerror(rc));
    }
    *out = t;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_nccl_thread_run(sl_nccl_thread_t *t, sl_nccl_job_t job,
                               void *arg, sl_errbuf_t *eb)
{
    sl_status_t result;

    pthread_mutex_lock(&t->mu);
    t->job = job;
    t->arg = arg;
    t->eb  = eb;
    pthread_cond_broadcast(&t->cv);
    while (t->job != NULL) {
        pthread_cond_wait(&t->cv, &t->mu);
    }
    result = t->result;
    pthread_mutex_unlock(&t->mu);
    return result;
}

void sl_nccl_thread_stop(sl_nccl_thread_t *t)
{
    if (t == NULL) {
        return;
    }
    pthread_mutex_lock(&t->mu);
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    pthread_join(t->thread, NULL);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
