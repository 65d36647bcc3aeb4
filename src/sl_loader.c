/*
 * The host-side loader: finds a plugin by short name or path, dlopens it
 * RTLD_NOW|RTLD_LOCAL, resolves stagelink_plugin_v1 and checks its ABI.
 * Every failure says what was tried.  The host is given the loader's own
 * full-size copy of the vtable, so a plugin built against an older v1
 * header (a shorter vtable: entries are only ever appended) still loads;
 * the entries it lacks are stubs here.  SPDX-License-Identifier: MIT
 */
#include "sl_build.h"
#include "sl_auth.h"
#include "sl_env.h"
#include "sl_gpudirect.h"
#include "sl_launcher.h"
#include "sl_log.h"
#include "sl_settings.h"
#include "sl_topo.h"

#include <stagelink/loader.h>

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SL_LOADER_PATH_MAX 4096

/*
 * The first v1 vtable ended with get_counters; every v1 plugin has at least
 * that much.  Entries after it were appended later and are optional.
 */
#define SL_PLUGIN_V1_MIN_SIZE offsetof(stagelink_plugin_v1_t, comm_abort)

/* A vtable holds only pointers after its two 32-bit words. */
#define SL_PLUGIN_V1_ALIGN _Alignof(void *)

/* Whether a vtable of `size` bytes holds the whole entry `field`. */
#define SL_PLUGIN_V1_HAS(size, field) \
    ((size) >= offsetof(stagelink_plugin_v1_t, field) + \
                   sizeof(((stagelink_plugin_v1_t *)0)->field))

struct stagelink_loader {
    void                        *handle;
    const stagelink_plugin_v1_t *plugin; /**< &vtable */
    /** The plugin's entries, and stubs for those it predates. */
    stagelink_plugin_v1_t        vtable;
    char                         path[SL_LOADER_PATH_MAX];
};

static stagelink_status_t sl_loader_fail(char *err, size_t errlen,
                                         stagelink_status_t status,
                                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static stagelink_status_t sl_loader_fail(char *err, size_t errlen,
                                         stagelink_status_t status,
                                         const char *fmt, ...)
{
    char    msg[2 * SL_LOADER_PATH_MAX];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* WARN only where the caller gets no sentence: errors it receives are
     * INFO (STAGELINK_DEBUG=INFO shows them), not noise on every rank. */
    sl_log((err != NULL && errlen > 0) ? SL_LOG_INFO : SL_LOG_WARN,
           SL_SUBSYS_INIT, "%s: %s", stagelink_status_string(status), msg);
    if (err != NULL && errlen > 0) {
        snprintf(err, errlen, "%s", msg);
    }
    return status;
}

/*
 * Stubs for the entries a plugin built against an older v1 header lacks.
 * A stub gets no loader and cannot reach the plugin's error sentences
 * (last_error stays the plugin's own), so it says why in the log, once.
 */
static void sl_loader_stub_note(atomic_flag *once, const char *entry)
{
    if (!atomic_flag_test_and_set(once)) {
        SL_WARN(SL_SUBSYS_INIT, "%s: the plugin predates the %s entry of the "
                "v1 vtable (built against an older stagelink.h); rebuild it "
                "to get it", stagelink_status_string(STAGELINK_ERR_UNSUPPORTED),
                entry);
    }
}

static stagelink_status_t sl_loader_stub_comm_abort(stagelink_comm_t *comm)
{
    static atomic_flag once = ATOMIC_FLAG_INIT;

    (void)comm;
    sl_loader_stub_note(&once, "comm_abort");
    return STAGELINK_ERR_UNSUPPORTED;
}

static stagelink_status_t sl_loader_stub_comm_get_error(stagelink_comm_t *comm,
                                                        int *failed_rank)
{
    static atomic_flag once = ATOMIC_FLAG_INIT;

    (void)comm;
    if (failed_rank != NULL) {
        *failed_rank = -1;
    }
    sl_loader_stub_note(&once, "comm_get_error");
    return STAGELINK_ERR_UNSUPPORTED;
}

static stagelink_status_t sl_loader_stub_wait_for(stagelink_comm_t *comm,
                                                  stagelink_request_t *request,
                                                  int timeout_ms)
{
    static atomic_flag once = ATOMIC_FLAG_INIT;

    (void)comm;
    (void)request;
    (void)timeout_ms;
    sl_loader_stub_note(&once, "wait_for");
    return STAGELINK_ERR_UNSUPPORTED;
}

static stagelink_status_t sl_loader_stub_order_stream(stagelink_comm_t *comm,
                                                      stagelink_request_t *request,
                                                      void *stream)
{
    static atomic_flag once = ATOMIC_FLAG_INIT;

    (void)comm;
    (void)request;
    (void)stream;
    sl_loader_stub_note(&once, "order_stream");
    return STAGELINK_ERR_UNSUPPORTED;
}

static stagelink_status_t sl_loader_stub_post_batch_sized(
    stagelink_comm_t *comm, const stagelink_op_t *ops, size_t count,
    size_t op_size, stagelink_request_t **requests)
{
    static atomic_flag once = ATOMIC_FLAG_INIT;

    (void)comm;
    (void)ops;
    (void)count;
    (void)op_size;
    (void)requests;
    sl_loader_stub_note(&once, "post_batch_sized");
    return STAGELINK_ERR_UNSUPPORTED;
}

static size_t sl_loader_stub_describe(char *buf, size_t len)
{
    int n = snprintf(buf, len, "this plugin predates the describe entry of "
                     "the v1 vtable (built against an older stagelink.h): "
                     "it cannot describe what it sees\n");

    return (n < 0) ? 0 : (size_t)n;
}

/*
 * The host's copy: the plugin's entries as far as its vtable goes (its
 * struct_size stays, so a host can tell), stubs for the rest.
 */
static void sl_loader_fill(stagelink_loader_t *loader,
                           const stagelink_plugin_v1_t *plugin)
{
    stagelink_plugin_v1_t *vt   = &loader->vtable;
    size_t                 size = plugin->struct_size;

    memcpy(vt, plugin, size < sizeof(*vt) ? size : sizeof(*vt));
    if (!SL_PLUGIN_V1_HAS(size, comm_abort)) {
        vt->comm_abort = sl_loader_stub_comm_abort;
    }
    if (!SL_PLUGIN_V1_HAS(size, comm_get_error)) {
        vt->comm_get_error = sl_loader_stub_comm_get_error;
    }
    if (!SL_PLUGIN_V1_HAS(size, describe)) {
        vt->describe = sl_loader_stub_describe;
    }
    if (!SL_PLUGIN_V1_HAS(size, wait_for)) {
        vt->wait_for = sl_loader_stub_wait_for;
    }
    if (!SL_PLUGIN_V1_HAS(size, order_stream)) {
        vt->order_stream = sl_loader_stub_order_stream;
    }
    if (!SL_PLUGIN_V1_HAS(size, post_batch_sized)) {
        vt->post_batch_sized = sl_loader_stub_post_batch_sized;
    }
    if (size < sizeof(*vt)) {
        SL_INFO(SL_SUBSYS_INIT, "%s: vtable of %zu bytes from an older v1 "
                "header (this host's: %zu); entries past it answer %s",
                loader->path, size, sizeof(*vt),
                stagelink_status_string(STAGELINK_ERR_UNSUPPORTED));
    }
    loader->plugin = vt;
}

/* Appends "candidate: dlerror" to the list of attempts. */
static void sl_loader_note(char *tried, size_t len, const char *candidate,
                           const char *why)
{
    size_t used = strlen(tried);

    snprintf(tried + used, len - used, "%s%s (%s)", used ? "; " : "",
             candidate, why);
}

static void *sl_loader_try(const char *candidate, char *tried, size_t len)
{
    void *handle = dlopen(candidate, RTLD_NOW | RTLD_LOCAL);

    if (handle == NULL) {
        const char *why = dlerror();
        sl_loader_note(tried, len, candidate, why ? why : "unknown error");
    }
    return handle;
}

/* dir/sub+file into out; 0 when it does not fit. */
static int sl_loader_join(char *out, size_t len, const char *dir,
                          const char *sub, const char *file)
{
    int n = snprintf(out, len, "%s/%s%s", dir, sub, file);

    return n > 0 && (size_t)n < len;
}

/* The directory libstagelink was loaded from; 0 when unknown. */
static int sl_loader_own_dir(char *out, size_t len)
{
    stagelink_status_t (*self)(const char *, stagelink_loader_t **, char *,
                               size_t) = stagelink_loader_open;
    const char *slash;
    void       *addr;
    Dl_info     info;

    /* ISO C has no cast from a function pointer to void *: copy it. */
    memcpy(&addr, &self, sizeof(addr));
    if (!dladdr(addr, &info) || info.dli_fname == NULL ||
        (slash = strrchr(info.dli_fname, '/')) == NULL) {
        return 0;
    }
    snprintf(out, len, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
    return 1;
}

/* The directories searched for plugins, in order: STAGELINK_PLUGIN_PATH's,
 * then next to this library (an install moved as a whole, a wheel), then
 * where it was installed; returns how many. */
#define SL_LOADER_DIRS 16
static char            sl_loader_dir_list[SL_LOADER_DIRS][SL_LOADER_PATH_MAX]; /* too big for a stack */
static pthread_mutex_t sl_loader_dir_lock = PTHREAD_MUTEX_INITIALIZER;

static int sl_loader_dirs(void)
{
    const char *plugin_path = sl_env_raw(SL_ENV_PLUGIN_PATH);
    char        list[SL_LOADER_PATH_MAX], own[SL_LOADER_PATH_MAX];
    char       *save = NULL, *dir;
    int         n = 0;

    if (plugin_path != NULL) {
        snprintf(list, sizeof(list), "%s", plugin_path);
        for (dir = strtok_r(list, ":", &save);
             dir != NULL && n < SL_LOADER_DIRS - 2;
             dir = strtok_r(NULL, ":", &save)) {
            snprintf(sl_loader_dir_list[n++], SL_LOADER_PATH_MAX, "%s", dir);
        }
    }
    if (sl_loader_own_dir(own, sizeof(own)) &&
        sl_loader_join(sl_loader_dir_list[n], SL_LOADER_PATH_MAX, own, "", "stagelink")) {
        ++n;
    }
    if (STAGELINK_PLUGIN_DIR[0] != '\0' &&
        (n == 0 || strcmp(sl_loader_dir_list[n - 1], STAGELINK_PLUGIN_DIR) != 0)) {
        snprintf(sl_loader_dir_list[n++], SL_LOADER_PATH_MAX, "%s", STAGELINK_PLUGIN_DIR);
    }
    return n;
}

static void *sl_loader_search(const char *name, char *path, size_t pathlen,
                              char *tried, size_t triedlen)
{
    char        file[256];
    void       *handle = NULL;
    int         n, i;

    if (strchr(name, '/') != NULL) {
        snprintf(path, pathlen, "%s", name);
        return sl_loader_try(name, tried, triedlen);
    }
    snprintf(file, sizeof(file), "libstagelink-%s.so", name);
    pthread_mutex_lock(&sl_loader_dir_lock);
    n = sl_loader_dirs();
    for (i = 0; i < n && handle == NULL; ++i) {
        if (sl_loader_join(path, pathlen, sl_loader_dir_list[i], "", file)) {
            handle = sl_loader_try(path, tried, triedlen);
        }
    }
    pthread_mutex_unlock(&sl_loader_dir_lock);
    if (handle != NULL) {
        return handle;
    }
    /* Last, the dynamic loader's own search: LD_LIBRARY_PATH, rpath, cache. */
    snprintf(path, pathlen, "%s", file);
    return sl_loader_try(file, tried, triedlen);
}

size_t stagelink_plugins_found(char *buf, size_t len)
{
    size_t         used = 0;
    int            n, i;

    if (len > 0) {
        buf[0] = '\0';
    }
    pthread_mutex_lock(&sl_loader_dir_lock);
    n = sl_loader_dirs();
    for (i = 0; i < n; ++i) {
        DIR           *d = opendir(sl_loader_dir_list[i]);
        struct dirent *ent;

        while (d != NULL && (ent = readdir(d)) != NULL) {
            size_t nlen = strlen(ent->d_name);

            if (strncmp(ent->d_name, "libstagelink-", 13) == 0 && nlen > 16 &&
                strcmp(ent->d_name + nlen - 3, ".so") == 0) {
                used += (size_t)snprintf(buf + (used < len ? used : len),
                                         used < len ? len - used : 0,
                                         "%s/%s\n", sl_loader_dir_list[i], ent->d_name);
            }
        }
        if (d != NULL) {
            closedir(d);
        }
    }
    pthread_mutex_unlock(&sl_loader_dir_lock);
    return used;
}

stagelink_status_t stagelink_loader_open(const char *name,
                                         stagelink_loader_t **loader_out,
                                         char *err, size_t errlen)
{
    char                         tried[2 * SL_LOADER_PATH_MAX] = "";
    stagelink_loader_t          *loader;
    const stagelink_plugin_v1_t *plugin;
    stagelink_status_t           status;

    if (loader_out == NULL) {
        return sl_loader_fail(err, errlen, STAGELINK_ERR_INVALID_ARG,
                              "stagelink_loader_open: loader is NULL");
    }
    *loader_out = NULL;
    {
        sl_errbuf_t    eb;
        sl_env_value_t dirs;

        /* The variables the open reads, refused here with their sentence
         * rather than as "not found". */
        if (sl_settings_log(&eb) != STAGELINK_SUCCESS ||
            sl_env_parse(SL_ENV_PLUGIN_PATH, &dirs, &eb) != STAGELINK_SUCCESS) {
            return sl_loader_fail(err, errlen, STAGELINK_ERR_CONFIG, "%s",
                                  eb.msg);
        }
    }
    if (name == NULL) {
        name = sl_env_get(SL_ENV_PLUGIN);
    }
    if (name[0] == '\0') {
        return sl_loader_fail(err, errlen, STAGELINK_ERR_INVALID_ARG,
                              "empty plugin name; use a short name such as "
                              "\"ucx\" or a path");
    }
    loader = calloc(1, sizeof(*loader));
    if (loader == NULL) {
        return sl_loader_fail(err, errlen, STAGELINK_ERR_NO_MEMORY,
                              "cannot allocate a loader");
    }
    loader->handle = sl_loader_search(name, loader->path, sizeof(loader->path),
                                      tried, sizeof(tried));
    if (loader->handle == NULL) {
        status = sl_loader_fail(err, errlen, STAGELINK_ERR_NOT_FOUND,
                                "plugin \"%s\" not found; tried: %s. Set "
                                "STAGELINK_PLUGIN to a path or "
                                "STAGELINK_PLUGIN_PATH to its directory",
                                name, tried);
        goto err_free;
    }
    dlerror();
    plugin = dlsym(loader->handle, STAGELINK_PLUGIN_SYMBOL_V1);
    if (plugin == NULL) {
        status = sl_loader_fail(err, errlen, STAGELINK_ERR_SYMBOL_MISSING,
                                "%s has no symbol %s: not a stagelink plugin, "
                                "or one without ABI version %u",
                                loader->path, STAGELINK_PLUGIN_SYMBOL_V1,
                                STAGELINK_ABI_VERSION_1);
        goto err_close;
    }
    if (plugin->abi_version != STAGELINK_ABI_VERSION_1) {
        status = sl_loader_fail(err, errlen, STAGELINK_ERR_VERSION_MISMATCH,
                                "%s: %s has ABI version %u (vtable %u bytes), "
                                "this host needs version %u (%zu bytes); "
                                "rebuild the plugin or the host",
                                loader->path, STAGELINK_PLUGIN_SYMBOL_V1,
                                plugin->abi_version, plugin->struct_size,
                                STAGELINK_ABI_VERSION_1,
                                sizeof(stagelink_plugin_v1_t));
        goto err_close;
    }
    /* Older v1 plugins have a shorter vtable, never one without the
     * original entries or with a part of a pointer. */
    if (plugin->struct_size < SL_PLUGIN_V1_MIN_SIZE ||
        plugin->struct_size % SL_PLUGIN_V1_ALIGN != 0) {
        status = sl_loader_fail(err, errlen, STAGELINK_ERR_VERSION_MISMATCH,
                                "%s: %s declares a vtable of %u bytes, but a "
                                "version %u vtable is at least %zu bytes "
                                "(abi_version through get_counters) and a "
                                "multiple of %zu (this host's is %zu bytes); "
                                "the plugin's struct_size is wrong: rebuild it",
                                loader->path, STAGELINK_PLUGIN_SYMBOL_V1,
                                plugin->struct_size, STAGELINK_ABI_VERSION_1,
                                SL_PLUGIN_V1_MIN_SIZE, SL_PLUGIN_V1_ALIGN,
                                sizeof(stagelink_plugin_v1_t));
        goto err_close;
    }
    sl_loader_fill(loader, plugin);
    SL_INFO(SL_SUBSYS_INIT, "loaded plugin %s %s from %s",
            plugin->name ? plugin->name : "?",
            plugin->version ? plugin->version : "?", loader->path);
    *loader_out = loader;
    return STAGELINK_SUCCESS;

err_close:
    dlclose(loader->handle);
err_free:
    free(loader);
    return status;
}

const stagelink_plugin_v1_t *
stagelink_loader_plugin(const stagelink_loader_t *loader)
{
    return (loader != NULL) ? loader->plugin : NULL;
}

const char *stagelink_loader_path(const stagelink_loader_t *loader)
{
    return (loader != NULL) ? loader->path : NULL;
}

stagelink_status_t stagelink_loader_comm_init(const stagelink_loader_t *loader,
                                              const stagelink_config_t *config,
                                              stagelink_comm_t **comm,
                                              char *err, size_t errlen)
{
    stagelink_status_t status;

    if (loader == NULL) {
        return sl_loader_fail(err, errlen, STAGELINK_ERR_INVALID_ARG,
                              "stagelink_loader_comm_init: loader is NULL");
    }
    status = loader->plugin->comm_init(config, comm);
    if (status != STAGELINK_SUCCESS) {
        return sl_loader_fail(err, errlen, status,
                              "plugin %s (%s) failed to initialize: %s",
                              loader->plugin->name, loader->path,
                              loader->plugin->last_error(NULL));
    }
    return STAGELINK_SUCCESS;
}

void stagelink_loader_close(stagelink_loader_t *loader)
{
    if (loader != NULL) {
        dlclose(loader->handle);
        free(loader);
    }
}

size_t stagelink_env_count(void)
{
    return SL_ENV_COUNT;
}

const stagelink_env_var_t *stagelink_env_var(size_t index)
{
    return (index < SL_ENV_COUNT) ? &sl_env_table[index].pub : NULL;
}

int stagelink_env_var_secret(size_t index)
{
    return index < SL_ENV_COUNT &&
           (sl_env_table[index].flags & SL_ENV_F_SECRET) != 0;
}

stagelink_status_t stagelink_env_value(const char *name, char *value,
                                       size_t len, char *err, size_t errlen)
{
    sl_env_id_t           id = (name != NULL) ? sl_env_find(name) : SL_ENV_COUNT;
    const sl_env_entry_t *e;
    sl_env_value_t        v;
    sl_errbuf_t           eb;

    if (id == SL_ENV_COUNT) {
        return sl_loader_fail(err, errlen, STAGELINK_ERR_NOT_FOUND,
                              "%s is not a variable of stagelink's table "
                              "(stagelink_info -c lists them)",
                              name != NULL ? name : "(null)");
    }
    if (sl_env_parse(id, &v, &eb) != STAGELINK_SUCCESS) {
        return sl_loader_fail(err, errlen, STAGELINK_ERR_CONFIG, "%s", eb.msg);
    }
    e = &sl_env_table[id];
    if (value == NULL || len == 0) {
        return STAGELINK_SUCCESS;
    }
    if (v.text == NULL) {
        value[0] = '\0';
    } else if (e->flags & SL_ENV_F_SECRET) {
        snprintf(value, len, "(set, not shown)");
    } else if (v.is_auto) {
        snprintf(value, len, "auto");
    } else {
        switch (e->type) {
        case SL_ENV_T_BOOL:   snprintf(value, len, "%d", v.flag); break;
        case SL_ENV_T_INT:
        case SL_ENV_T_SIZE:
            snprintf(value, len, "%llu", (unsigned long long)v.u64);
            break;
        case SL_ENV_T_SECONDS:
        case SL_ENV_T_NUMBER: snprintf(value, len, "%.17g", v.real); break;
        case SL_ENV_T_ENUM:
            snprintf(value, len, "%s", e->choices[v.choice]);
            break;
        default: snprintf(value, len, "%s", v.text); break;
        }
    }
    return STAGELINK_SUCCESS;
}

void stagelink_env_var_forms(size_t index, char *buf, size_t len)
{
    if (len > 0) {
        buf[0] = '\0';
    }
    if (index < SL_ENV_COUNT && len > 0) {
        sl_env_forms((sl_env_id_t)index, buf, len);
    }
}

int stagelink_env_unknown(char *buf, size_t len)
{
    return sl_env_unknown(buf, len);
}

stagelink_status_t stagelink_job_query(stagelink_job_info_t *job, char *err,
                                       size_t errlen)
{
    stagelink_config_t config = {.struct_size = sizeof(config)};
    sl_launcher_t      l;
    sl_errbuf_t        eb;
    sl_status_t        status;

    if (job == NULL || job->struct_size < sizeof(*job)) {
        status = sl_error(&eb, STAGELINK_ERR_INVALID_ARG,
                          "stagelink_job_query needs a job whose struct_size "
                          "is at least %zu", sizeof(*job));
        goto out;
    }
    status = sl_launcher_detect(&config, &l, &eb);
    if (status == STAGELINK_SUCCESS) {
        job->rank       = l.rank;
        job->world_size = l.world_size;
        job->local_rank = l.local_rank;
        job->local_size = l.local_size;
        snprintf(job->launcher, sizeof(job->launcher), "%s", l.source);
        snprintf(job->bootstrap, sizeof(job->bootstrap), "%s",
                 sl_boot_kind_names[l.boot]);
        snprintf(job->bootstrap_reason, sizeof(job->bootstrap_reason), "%s",
                 l.boot_why);
    }
out:
    if (status != STAGELINK_SUCCESS && err != NULL && errlen > 0) {
        snprintf(err, errlen, "%s", eb.msg);
    }
    return status;
}

/* The bootstrap line: what a job launched with this environment would use. */
static size_t sl_report_bootstrap(char *buf, size_t len)
{
    stagelink_job_info_t job = {.struct_size = sizeof(job)};
    char                 err[SL_ERRBUF_LEN];
    int                  n;

    if (stagelink_job_query(&job, err, sizeof(err)) != STAGELINK_SUCCESS) {
        n = snprintf(buf, len, "bootstrap: no launcher's rank here (%s)\n",
                     err);
    } else {
        n = snprintf(buf, len, "bootstrap: %s (%s), rank %d of %d from %s\n",
                     job.bootstrap, job.bootstrap_reason, job.rank,
                     job.world_size, job.launcher);
    }
    return n < 0 ? 0 : (size_t)n;
}

const char *stagelink_version(void)
{
    return STAGELINK_VERSION_STRING;
}

size_t stagelink_system_report(char *buf, size_t len)
{
    const char     *root = sl_env_get(SL_ENV_SYSFS_ROOT);
    sl_gpudirect_t  gd;
    sl_topo_t      *topo;
    sl_errbuf_t     eb;
    char            gpudirect[512];
    int             n;

    sl_gpudirect_detect(root, &gd);
    sl_gpudirect_describe(&gd, gpudirect, sizeof(gpudirect));
    n = snprintf(buf, len,
                 "build: CUDA %s, NCCL %s, libibverbs %s, UCX %s\n"
                 "%s\n",
                 SL_BUILD_CUDA ? "yes (static runtime)" : "no",
                 SL_BUILD_NCCL ? "yes (opened at run time)" : "no",
                 SL_BUILD_VERBS ? "yes" : "no (sysfs only)",
                 SL_BUILD_UCX_VERSION, gpudirect);
    if (n < 0) {
        return 0;
    }
    topo = calloc(1, sizeof(*topo));
    if (topo == NULL) {
        return (size_t)n;
    }
    sl_topo_discover_nics(root, topo);
    sl_topo_discover_gpus(root, topo);
    if (sl_topo_filter_nics(topo, &eb) != STAGELINK_SUCCESS) {
        n += snprintf(buf + ((size_t)n < len ? (size_t)n : len),
                      (size_t)n < len ? len - (size_t)n : 0, "%s\n", eb.msg);
    }
    n += (int)sl_topo_report(topo, buf + ((size_t)n < len ? (size_t)n : len),
                             (size_t)n < len ? len - (size_t)n : 0);
    free(topo);
    n += (int)sl_report_bootstrap(buf + ((size_t)n < len ? (size_t)n : len),
                                  (size_t)n < len ? len - (size_t)n : 0);
    n += (int)sl_auth_describe(buf + ((size_t)n < len ? (size_t)n : len),
                               (size_t)n < len ? len - (size_t)n : 0);
    return (size_t)n;
}
