/*
 * Loader failures, each with its sentence: not found (paths named), symbol
 * missing, version mismatch, init failure; and the real plugin loads with
 * RTLD_NOW (no unresolved symbol).  Only the public API is used.
 *   test_loader BUILD_PLUGIN_DIR NOSYM.so VERSION.so INIT.so
 * SPDX-License-Identifier: MIT
 */
#include "check.h"

#include <stagelink/loader.h>

#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    stagelink_loader_t *loader = NULL;
    stagelink_comm_t   *comm   = NULL;
    stagelink_config_t  config;
    char                err[4096];
    stagelink_status_t  st;
    size_t              i;

    if (argc != 5) {
        fprintf(stderr, "usage: test_loader PLUGIN_DIR NOSYM VERSION INIT\n");
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
