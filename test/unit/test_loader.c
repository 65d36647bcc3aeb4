/*
 * Loader failures, each with its sentence: not found (paths named), symbol
 * missing, version mismatch, init failure; and the real plugin loads with
 * RTLD_NOW (no unresolved symbol).  A plugin built against an older v1
 * header (a shorter vtable) loads, with its own entries and the loader's
 * stubs for the rest; a vtable shorter than the original v1 or not a whole
 * number of pointers does not.  Only the public API is used (and dlsym, to
 * compare the host's copy with what the plugin exports).
 *   test_loader BUILD_PLUGIN_DIR NOSYM.so VERSION.so INIT.so OLD_V1.so
 *               OLD_V1_SHORT.so OLD_V1_ODD.so
 * SPDX-License-Identifier: MIT
 */
#include "check.h"

#include <stagelink/loader.h>

#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* Size of the original v1 vtable (through get_counters), as old_v1.c has it. */
#define OLD_V1_SIZE offsetof(stagelink_plugin_v1_t, comm_abort)

/* The vtable the plugin at `path` (already loaded) exports itself. */
static const void *exported_vtable(const char *path)
{
    void       *handle = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    const void *vt;

    if (handle == NULL) {
        return NULL;
    }
    vt = dlsym(handle, STAGELINK_PLUGIN_SYMBOL_V1);
    dlclose(handle); /* the loader still holds it */
    return vt;
}

/* A plugin built against the original v1 header. */
static void check_old_plugin(const char *path)
{
    stagelink_loader_t          *loader = NULL;
    stagelink_comm_t            *comm   = NULL;
    const stagelink_plugin_v1_t *p;
    const void                  *own;
    stagelink_config_t           config;
    stagelink_counters_t         counters;
    char                         err[4096], text[512], small[8];
    size_t                       n;
    int                          rank = 7;

    stagelink_status_t st = stagelink_loader_open(path, &loader, err,
                                                  sizeof(err));
    CHECK(st == STAGELINK_SUCCESS && loader != NULL,
          "old v1 plugin (vtable of %zu bytes) refused: %s", OLD_V1_SIZE, err);
    if (st != STAGELINK_SUCCESS || loader == NULL) {
        return;
    }
    p   = stagelink_loader_plugin(loader);
    own = exported_vtable(stagelink_loader_path(loader));
    CHECK(p != NULL && strcmp(p->name, "old-v1") == 0, "plugin name %s",
          p ? p->name : "(none)");
    CHECK(p->abi_version == STAGELINK_ABI_VERSION_1 &&
              p->struct_size == OLD_V1_SIZE,
          "the copy says version %u, %u bytes (the plugin's: 1, %zu)",
          p->abi_version, p->struct_size, OLD_V1_SIZE);
    /* Every entry the plugin has is its own, not a loader's wrapper. */
    CHECK(own != NULL && (const void *)p != own &&
              memcmp(p, own, OLD_V1_SIZE) == 0,
          "the host's vtable is not the plugin's own up to %zu bytes",
          OLD_V1_SIZE);
    CHECK(p->comm_abort != NULL && p->comm_get_error != NULL &&
              p->describe != NULL && p->wait_for != NULL &&
              p->order_stream != NULL && p->post_batch_sized != NULL,
          "missing entries were not filled");

    memset(&config, 0, sizeof(config));
    config.struct_size = sizeof(config);
    st = stagelink_loader_comm_init(loader, &config, &comm, err, sizeof(err));
    CHECK(st == STAGELINK_SUCCESS && comm != NULL, "old v1 init: %s", err);
    if (st == STAGELINK_SUCCESS && comm != NULL) {
        CHECK(p->get_counters(comm, &counters) == STAGELINK_SUCCESS &&
                  counters.transfers_completed == 4242u,
              "get_counters is not the plugin's (%llu transfers)",
              (unsigned long long)counters.transfers_completed);
        CHECK(p->comm_abort(comm) == STAGELINK_ERR_UNSUPPORTED,
              "comm_abort of an old plugin");
        CHECK(p->comm_get_error(comm, &rank) == STAGELINK_ERR_UNSUPPORTED &&
                  rank == -1,
              "comm_get_error of an old plugin (failed rank %d)", rank);
        CHECK(p->wait_for(comm, NULL, 10) == STAGELINK_ERR_UNSUPPORTED,
              "wait_for of an old plugin");
        CHECK(p->order_stream(comm, NULL, NULL) == STAGELINK_ERR_UNSUPPORTED,
              "order_stream of an old plugin");
        CHECK(p->post_batch_sized(comm, NULL, 0, 0, NULL) ==
                  STAGELINK_ERR_UNSUPPORTED,
              "post_batch_sized of an old plugin");
        CHECK(p->comm_finalize(comm) == STAGELINK_SUCCESS, "finalize");
    }
    CHECK(p->comm_init(NULL, &comm) == STAGELINK_ERR_INVALID_ARG &&
              strstr(p->last_error(NULL), "old-v1 test plugin"),
          "the plugin's own last_error: %s", p->last_error(NULL));

    /* describe: one line, and the length needed, as snprintf. */
    memset(text, 'x', sizeof(text));
    n = p->describe(text, sizeof(text));
    CHECK(n > 0 && n < sizeof(text) && strlen(text) == n &&
              strstr(text, "predates") && strstr(text, "describe") &&
              strchr(text, '\n') == text + n - 1,
          "describe of an old plugin (%zu): %s", n, text);
    CHECK(p->describe(NULL, 0) == n, "describe(NULL, 0) != %zu", n);
    CHECK(p->describe(small, sizeof(small)) == n &&
              strlen(small) == sizeof(small) - 1 &&
              strncmp(small, text, sizeof(small) - 1) == 0,
          "describe into %zu bytes: %s", sizeof(small), small);
    stagelink_loader_close(loader);
}

/* A struct_size the loader must refuse, with both sizes in the sentence. */
static void check_bad_size(const char *path, size_t size)
{
    stagelink_loader_t *loader = NULL;
    stagelink_status_t  st;
    char                err[4096], have[32], need[32];

    snprintf(have, sizeof(have), "%zu bytes", size);
    snprintf(need, sizeof(need), "%zu bytes", OLD_V1_SIZE);
    st = stagelink_loader_open(path, &loader, err, sizeof(err));
    CHECK(st == STAGELINK_ERR_VERSION_MISMATCH && loader == NULL &&
              strstr(err, have) && strstr(err, need) && strstr(err, path),
          "vtable of %zu bytes: %s (%s)", size, err,
          stagelink_status_string(st));
    if (loader != NULL) {
        stagelink_loader_close(loader);
    }
}

int main(int argc, char **argv)
{
    stagelink_loader_t *loader = NULL;
    stagelink_comm_t   *comm   = NULL;
    stagelink_config_t  config;
    char                err[4096];
    stagelink_status_t  st;
    size_t              i;

    if (argc != 8) {
        fprintf(stderr, "usage: test_loader PLUGIN_DIR NOSYM VERSION INIT "
                "OLD_V1 OLD_V1_SHORT OLD_V1_ODD\n");
        return 2;
    }
    setenv("STAGELINK_PLUGIN_PATH", argv[1], 1);

    st = stagelink_loader_open("nonexistent", &loader, err, sizeof(err));
    CHECK(st == STAGELINK_ERR_NOT_FOUND && loader == NULL &&
          strstr(err, "libstagelink-nonexistent.so") && strstr(err, argv[1]) &&
          strstr(err, STAGELINK_PLUGIN_DIR), "not found: %s", err);

    st = stagelink_loader_open(argv[2], &loader, err, sizeof(err));
    CHECK(st == STAGELINK_ERR_SYMBOL_MISSING && strstr(err, argv[2]) &&
          strstr(err, "stagelink_plugin_v1"), "no symbol: %s", err);

    st = stagelink_loader_open(argv[3], &loader, err, sizeof(err));
    CHECK(st == STAGELINK_ERR_VERSION_MISMATCH && strstr(err, "version 99") &&
          strstr(err, "version 1"), "wrong version: %s", err);

    st = stagelink_loader_open(argv[4], &loader, err, sizeof(err));
    CHECK(st == STAGELINK_SUCCESS, "init plugin did not load: %s", err);
    if (st == STAGELINK_SUCCESS) {
        memset(&config, 0, sizeof(config));
        config.struct_size = sizeof(config);
        st = stagelink_loader_comm_init(loader, &config, &comm, err,
                                        sizeof(err));
        CHECK(st == STAGELINK_ERR_INIT && comm == NULL &&
              strstr(err, "deliberate init failure") &&
              strstr(err, "broken-init"), "init failure: %s", err);
        stagelink_loader_close(loader);
    }

    check_old_plugin(argv[5]);
    check_bad_size(argv[6], offsetof(stagelink_plugin_v1_t, get_counters));
    check_bad_size(argv[7], OLD_V1_SIZE + sizeof(void *) / 2);

    /* The real plugin, by short name and through STAGELINK_PLUGIN. */
    setenv("STAGELINK_PLUGIN", "ucx", 1);
    st = stagelink_loader_open(NULL, &loader, err, sizeof(err));
    CHECK(st == STAGELINK_SUCCESS, "ucx plugin: %s", err);
    if (st == STAGELINK_SUCCESS) {
        const stagelink_plugin_v1_t *p = stagelink_loader_plugin(loader);

        CHECK(strcmp(p->name, "ucx") == 0 && strcmp(p->version,
              stagelink_version()) == 0, "plugin %s %s", p->name, p->version);
        CHECK(strstr(stagelink_loader_path(loader), argv[1]) != NULL,
              "loaded from %s, not the plugin path", stagelink_loader_path(loader));
        {
            const void *own = exported_vtable(stagelink_loader_path(loader));

            /* A current plugin: the copy is its vtable, entry for entry. */
            CHECK(p->struct_size == sizeof(*p) && own != NULL &&
                      memcmp(p, own, sizeof(*p)) == 0,
                  "the ucx plugin's vtable (%u bytes) differs from the "
                  "host's copy", p->struct_size);
        }
        CHECK(p->comm_init(NULL, &comm) == STAGELINK_ERR_INVALID_ARG &&
              strstr(p->last_error(NULL), "config"),
              "NULL config: %s", p->last_error(NULL));
        stagelink_loader_close(loader);
    }
    CHECK(stagelink_loader_open("", &loader, err, sizeof(err)) ==
              STAGELINK_ERR_INVALID_ARG, "empty name accepted");

    CHECK(stagelink_env_count() > 10, "env table has %zu entries",
          stagelink_env_count());
    for (i = 0; i < stagelink_env_count(); ++i) {
        CHECK(strncmp(stagelink_env_var(i)->name, "", 1) != 0,
              "env entry %zu has no name", i);
    }
    CHECK(stagelink_env_var(stagelink_env_count()) == NULL,
          "env entry past the end");
    CHECK(strcmp(stagelink_status_string(STAGELINK_ERR_TIMEOUT),
                 "STAGELINK_ERR_TIMEOUT") == 0, "status string");
    return check_summary();
}
