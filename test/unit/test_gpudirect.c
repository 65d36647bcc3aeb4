/* GPU-direct detection on fake sysfs trees.  SPDX-License-Identifier: MIT */
#include "check.h"
#include "sl_gpudirect.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void put(const char *root, const char *dir, const char *file,
                const char *text)
{
    char  path[512];
    FILE *f;

    snprintf(path, sizeof(path), "mkdir -p '%s%s'", root, dir);
    if (system(path) != 0) {
        return;
    }
    snprintf(path, sizeof(path), "%s%s/%s", root, dir, file);
    f = fopen(path, "w");
    if (f != NULL) {
        fputs(text, f);
        fclose(f);
    }
}

int main(void)
{
    char           root[] = "/tmp/sl_gd_XXXXXX", cmd[256], text[512];
    sl_gpudirect_t gd;

    if (mkdtemp(root) == NULL) {
        return 1;
    }
    sl_gpudirect_detect(root, &gd);
    sl_gpudirect_describe(&gd, text, sizeof(text));
    CHECK(!gd.nv_mem && !gd.peermem && strstr(text, "no peer-memory module"),
          "empty tree: %s", text);

    put(root, "/sys/module/nvidia_peermem", "version", "535.104.05\n");
    sl_gpudirect_detect(root, &gd);
    sl_gpudirect_describe(&gd, text, sizeof(text));
    CHECK(gd.peermem && !gd.nv_mem && strstr(text, "535.104.05") &&
          strstr(text, "UCX 1.13 only looks"), "peermem only: %s", text);

    put(root, "/sys/kernel/mm/memory_peers/nv_mem", "version", "1.3-0\n");
    sl_gpudirect_detect(root, &gd);
    sl_gpudirect_describe(&gd, text, sizeof(text));
    CHECK(gd.nv_mem && strcmp(gd.nv_mem_version, "1.3-0") == 0 &&
          strstr(text, "UCX 1.13 detects it"), "both: %s", text);

    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    CHECK(system(cmd) == 0, "cleanup");
    return check_summary();
}
