/* SPDX-License-Identifier: MIT */
#include "sl_sysfs.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int sl_sysfs_read(const char *root, const char *path, char *out, size_t len)
{
    char  full[PATH_MAX];
    FILE *f;
    int   ok;

    snprintf(full, sizeof(full), "%s%s", root, path);
    f = fopen(full, "r");
    if (f == NULL) {
        return 0;
    }
    ok = (fgets(out, (int)len, f) != NULL);
    fclose(f);
    if (!ok) {
        out[0] = '\0';
    }
    out[strcspn(out, "\n")] = '\0';
    return 1;
}

int sl_sysfs_read_long(const char *root, const char *path, long *value)
{
    char  text[64];
    char *end;

    if (!sl_sysfs_read(root, path, text, sizeof(text)) || text[0] == '\0') {
        return 0;
    }
    *value = strtol(text, &end, 0);
    return *end == '\0';
}

int sl_sysfs_pci_path(const char *root, const char *link, char *out,
                      size_t len)
{
    char   full[PATH_MAX], resolved[PATH_MAX], devices[PATH_MAX];
    size_t n;

    snprintf(full, sizeof(full), "%s%s", root, link);
    snprintf(devices, sizeof(devices), "%s/sys/devices/", root);
    /* The root itself may be reached through links (a temporary dir). */
    if (realpath(full, resolved) == NULL) {
        return 0;
    }
    if (realpath(devices, full) == NULL) {
        return 0;
    }
    n = strlen(full);
    if (strncmp(resolved, full, n) != 0 || resolved[n] != '/') {
        return 0;
    }
    snprintf(out, len, "%s", resolved + n + 1);
    return 1;
}
