/*
 * stagelink_info: what this installation is and will do, in the manner of
 * ucx_info and ibv_devinfo.  Without options: version, build features,
 * GPU-direct support, RDMA devices and ports, GPUs, the NIC each local rank
 * would use, what the plugin the loader finds reports (UCX version,
 * transports, memory types, GPU runtime), and every variable.  Works with
 * none of it present (exit 0) and says what is missing.  -c: the variables
 * only; -m: as a Markdown table (the one in docs/configuration.md is made with it).
 * SPDX-License-Identifier: MIT
 */
#include <stagelink/loader.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void print_vars(int markdown)
{
    size_t i;

    if (markdown) {
        printf("| variable | default | meaning |\n|---|---|---|\n");
    }
    for (i = 0; i < stagelink_env_count(); ++i) {
        const stagelink_env_var_t *v     = stagelink_env_var(i);
        const char                *value = getenv(v->name);

        if (value != NULL && stagelink_env_var_secret(i)) {
            value = "(set, not shown)";
        }

        if (markdown) {
            printf("| `%s` | %s | %s |\n", v->name,
                   v->default_value[0] ? v->default_value : "(unset)",
                   v->description);
        } else {
            printf("%-28s = %-16s (default: %s)\n    %s\n", v->name,
                   value ? value : "(unset)",
                   v->default_value[0] ? v->default_value : "none",
                   v->description);
        }
    }
}

int main(int argc, char **argv)
{
    stagelink_loader_t          *loader;
    const stagelink_plugin_v1_t *p;
    char                         err[4096];
    static char                  report[16384];
    int                          opt, config_only = 0, markdown = 0;

    while ((opt = getopt(argc, argv, "cmh")) != -1) {
        switch (opt) {
        case 'c': config_only = 1; break;
        case 'm': markdown = config_only = 1; break;
        default:
            fprintf(stderr, "usage: stagelink_info [-c] [-m]\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    if (config_only) {
        print_vars(markdown);
        return 0;
    }
    printf("# stagelink %s (ABI v%u)\n", stagelink_version(),
           STAGELINK_ABI_VERSION_1);
    stagelink_system_report(report, sizeof(report));
    printf("%s", report);
    if (stagelink_loader_open(NULL, &loader, err, sizeof(err)) ==
        STAGELINK_SUCCESS) {
        p = stagelink_loader_plugin(loader);
        printf("# plugin: %s %s from %s\n", p->name, p->version,
               stagelink_loader_path(loader));
        if (p->describe != NULL) {
            p->describe(report, sizeof(report));
            printf("%s", report);
        }
        stagelink_loader_close(loader);
    } else {
        printf("# plugin: none loaded: %s\n", err);
    }
    printf("# environment:\n");
    print_vars(0);
    return 0;
}
