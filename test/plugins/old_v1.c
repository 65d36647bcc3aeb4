/*
 * A plugin built against an older v1 header: its vtable is the original v1
 * prefix (abi_version through get_counters), without the entries appended
 * since (comm_abort, comm_get_error, describe).  The struct below mirrors
 * that prefix; the public header is not touched for it.  The loader must
 * take it and fill the rest with its own stubs.
 *
 * Built three times (test/meson.build):
 *   old_v1        the old prefix, struct_size = its size
 *   old_v1_short  -DOLD_V1_SHORT: struct_size ends before get_counters
 *   old_v1_odd    -DOLD_V1_ODD: struct_size not a whole number of pointers
 * The two broken sizes must be refused.  SPDX-License-Identifier: MIT
 */
#include <stagelink/stagelink.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* The v1 vtable as it was before comm_abort was appended. */
typedef struct old_plugin_v1 {
    uint32_t    abi_version;
    uint32_t    struct_size;
    const char *name;
    const char *version;
    stagelink_status_t (*comm_init)(const stagelink_config_t *config,
                                    stagelink_comm_t **comm);
    stagelink_status_t (*comm_finalize)(stagelink_comm_t *comm);
    stagelink_status_t (*comm_info)(stagelink_comm_t *comm,
                                    stagelink_comm_info_t *info);
    const char *(*last_error)(stagelink_comm_t *comm);
    stagelink_status_t (*mem_register)(stagelink_comm_t *comm, void *buf,
                                       size_t nbytes,
                                       stagelink_mem_type_t mem_type,
                                       stagelink_memh_t **memh);
    stagelink_status_t (*mem_deregister)(stagelink_comm_t *comm,
                                         stagelink_memh_t *memh);
    stagelink_status_t (*isend)(stagelink_comm_t *comm,
                                const stagelink_xfer_t *xfer,
                                stagelink_request_t **request);
    stagelink_status_t (*irecv)(stagelink_comm_t *comm,
                                const stagelink_xfer_t *xfer,
                                stagelink_request_t **request);
    stagelink_status_t (*post_batch)(stagelink_comm_t *comm,
                                     const stagelink_op_t *ops, size_t count,
                                     stagelink_request_t **requests);
    stagelink_status_t (*test)(stagelink_comm_t *comm,
                               stagelink_request_t *request, int *done);
    stagelink_status_t (*wait)(stagelink_comm_t *comm,
                               stagelink_request_t *request);
    stagelink_status_t (*cancel)(stagelink_comm_t *comm,
                                 stagelink_request_t *request);
    stagelink_status_t (*get_counters)(stagelink_comm_t *comm,
                                       stagelink_counters_t *counters);
} old_plugin_v1_t;

#if defined(OLD_V1_SHORT)
#define OLD_V1_NAME "old-v1-short"
#define OLD_V1_SIZE offsetof(old_plugin_v1_t, get_counters)
#elif defined(OLD_V1_ODD)
#define OLD_V1_NAME "old-v1-odd"
#define OLD_V1_SIZE (sizeof(old_plugin_v1_t) + sizeof(void *) / 2)
#else
#define OLD_V1_NAME "old-v1"
#define OLD_V1_SIZE sizeof(old_plugin_v1_t)
#endif

/* What get_counters reports, so a host can tell this plugin answered. */
#define OLD_V1_TRANSFERS 4242u

struct stagelink_comm {
    int rank;
};

static __thread char old_error[128] = "no error";

static stagelink_status_t old_fail(stagelink_status_t status, const char *what)
{
    snprintf(old_error, sizeof(old_error), "old-v1 test plugin: %s", what);
    return status;
}

static stagelink_status_t old_comm_init(const stagelink_config_t *config,
                                        stagelink_comm_t **comm)
{
    if (config == NULL || comm == NULL) {
        return old_fail(STAGELINK_ERR_INVALID_ARG, "comm_init needs a config");
    }
    *comm = calloc(1, sizeof(**comm));
    return (*comm == NULL) ? old_fail(STAGELINK_ERR_NO_MEMORY, "no memory")
                           : STAGELINK_SUCCESS;
}

static stagelink_status_t old_comm_finalize(stagelink_comm_t *comm)
{
    free(comm);
    return STAGELINK_SUCCESS;
}

static stagelink_status_t old_comm_info(stagelink_comm_t *comm,
                                        stagelink_comm_info_t *info)
{
    if (comm == NULL || info == NULL) {
        return old_fail(STAGELINK_ERR_INVALID_ARG, "comm_info: NULL argument");
    }
    info->rank       = comm->rank;
    info->world_size = 1;
    snprintf(info->gather_backend, sizeof(info->gather_backend), "none");
    return STAGELINK_SUCCESS;
}

static const char *old_last_error(stagelink_comm_t *comm)
{
    (void)comm;
    return old_error;
}

static stagelink_status_t old_mem_register(stagelink_comm_t *comm, void *buf,
                                           size_t nbytes,
                                           stagelink_mem_type_t mem_type,
                                           stagelink_memh_t **memh)
{
    (void)comm, (void)buf, (void)nbytes, (void)mem_type, (void)memh;
    return old_fail(STAGELINK_ERR_UNSUPPORTED, "no registration");
}

static stagelink_status_t old_mem_deregister(stagelink_comm_t *comm,
                                             stagelink_memh_t *memh)
{
    (void)comm, (void)memh;
    return old_fail(STAGELINK_ERR_UNSUPPORTED, "no registration");
}

static stagelink_status_t old_post(stagelink_comm_t *comm,
                                   const stagelink_xfer_t *xfer,
                                   stagelink_request_t **request)
{
    (void)comm, (void)xfer, (void)request;
    return old_fail(STAGELINK_ERR_NO_PEER, "a world of one rank has no peer");
}

static stagelink_status_t old_post_batch(stagelink_comm_t *comm,
                                         const stagelink_op_t *ops,
                                         size_t count,
                                         stagelink_request_t **requests)
{
    (void)comm, (void)ops, (void)requests;
    return count ? old_fail(STAGELINK_ERR_NO_PEER, "a world of one rank has "
                            "no peer") : STAGELINK_SUCCESS;
}

static stagelink_status_t old_test(stagelink_comm_t *comm,
                                   stagelink_request_t *request, int *done)
{
    (void)comm, (void)request, (void)done;
    return old_fail(STAGELINK_ERR_INVALID_ARG, "no request is in flight");
}

static stagelink_status_t old_request(stagelink_comm_t *comm,
                                      stagelink_request_t *request)
{
    (void)comm, (void)request;
    return old_fail(STAGELINK_ERR_INVALID_ARG, "no request is in flight");
}

static stagelink_status_t old_get_counters(stagelink_comm_t *comm,
                                           stagelink_counters_t *counters)
{
    if (comm == NULL || counters == NULL) {
        return old_fail(STAGELINK_ERR_INVALID_ARG, "get_counters: NULL argument");
    }
    *counters                     = (stagelink_counters_t){0};
    counters->transfers_completed = OLD_V1_TRANSFERS;
    return STAGELINK_SUCCESS;
}

__attribute__((visibility("default")))
const old_plugin_v1_t stagelink_plugin_v1 = {
    .abi_version    = STAGELINK_ABI_VERSION_1,
    .struct_size    = (uint32_t)OLD_V1_SIZE,
    .name           = OLD_V1_NAME,
    .version        = "0.0.1",
    .comm_init      = old_comm_init,
    .comm_finalize  = old_comm_finalize,
    .comm_info      = old_comm_info,
    .last_error     = old_last_error,
    .mem_register   = old_mem_register,
    .mem_deregister = old_mem_deregister,
    .isend          = old_post,
    .irecv          = old_post,
    .post_batch     = old_post_batch,
    .test           = old_test,
    .wait           = old_request,
    .cancel         = old_request,
    .get_counters   = old_get_counters,
};
