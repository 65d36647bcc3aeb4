/*
 * stagelink_info: what this installation is and will do, in the manner of
 * ucx_info and ibv_devinfo.  Without options: version, build features,
 * GPU-direct support, RDMA devices and ports, GPUs, the NIC each local rank
 * would use, what the plugin the loader finds reports (UCX version,
 * transports, memory types, GPU runtime), and every variable.  Works with
 * none of it present and says what is missing; exits 1 when the plugin
 * does not load or a variable does not parse.  -c: the variables only; -m:
 * as a Markdown table (the one in docs/configuration.md is made with it).
 * SPDX-License-Identifier: MIT
 */
#include <stagelink/loader.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints the table with each value as set; returns how many do not parse. */
static int print_vars(int markdown)
{
    int    invalid = 0;
    size_t i;

    if (markdown) {
        printf("| variable | default | accepts | meaning |\n|---|---|---|---|\n");
    }
    for (i = 0; i < stagelink_env_count(); ++i) {
        const stagelink_env_var_t *v     = stagelink_env_var(i);
        const char                *value = getenv(v->name);
        char                       err[1024], forms[512];

        if (value != NULL && stagelink_env_var_secret(i)) {
            value = "(set, not shown)";
        }
        stagelink_env_var_forms(i, forms, sizeof(forms));
        if (markdown) {
            printf("| `%s` | %s | %s | %s |\n", v->name,
                   v->default_value[0] ? v->default_value : "(unset)", forms,
                   v->description);
            continue;
        }
        printf("%-28s = %-16s (default: %s)\n    %s\n    accepts: %s\n",
               v->name, value ? value : "(unset)",
               v->default_value[0] ? v->default_value : "none",
               v->description, forms);
        if (stagelink_env_value(v->name, NULL, 0, err, sizeof(err)) !=
            STAGELINK_SUCCESS) {
            printf("    INVALID: %s\n", err);
            ++invalid;
        }
    }
    return invalid;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: stagelink_info [-c | -m] [-h] [--version]\n"
            "  What this installation is and will do: version, build, RDMA devices,\n"
            "  GPUs, each local rank's NIC, the bootstrap, the plugins found and what\n"
            "  the one STAGELINK_PLUGIN names reports, and every variable with its\n"
            "  value.  Exits 1 when the plugin does not load or a variable does not\n"
            "  parse (each says why), so a health check can use it.\n"
            "  -c          the variables only (exit 1 when one does not parse)\n"
            "  -m          the variables as a Markdown table (docs/configuration.md)\n"
            "  -h, --help  this text\n"
            "  --version   the version and ABI\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0}};
    stagelink_loader_t          *loader;
    const stagelink_plugin_v1_t *p;
    char                         err[4096];
    static char                  report[16384];
    int                          opt, config_only = 0, markdown = 0, failed = 0;
    int                          unknown;

    while ((opt = getopt_long(argc, argv, "cmh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': config_only = 1; break;
        case 'm': markdown = config_only = 1; break;
        case 'h': usage(stdout); return 0;
        case 'V':
            printf("stagelink_info %s (ABI v%u)\n", stagelink_version(),
                   STAGELINK_ABI_VERSION_1);
            return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "stagelink_info: unexpected argument \"%s\"\n",
                argv[optind]);
        usage(stderr);
        return 2;
    }
    if (markdown) {
        print_vars(1);
        return 0;
    }
    if (!config_only) {
        printf("# stagelink %s (ABI v%u)\n", stagelink_version(),
               STAGELINK_ABI_VERSION_1);
        stagelink_system_report(report, sizeof(report));
        printf("%s", report);
        stagelink_plugins_found(report, sizeof(report));
        printf("# plugins found:%s\n%s", report[0] ? "" : " none", report);
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
            failed = 1;
        }
        printf("# environment:\n");
    }
    if (print_vars(0) > 0) {
        failed = 1;
    }
    unknown = stagelink_env_unknown(report, sizeof(report));
    if (unknown > 0) {
        printf("# unknown variables (%d):\n%s\n", unknown, report);
    }
    return failed;
}
