/*
 * What a process holds, for leak checks: open descriptors and resident
 * memory.  SPDX-License-Identifier: MIT
 */
#ifndef SL_TEST_RESOURCES_H
#define SL_TEST_RESOURCES_H

#include <dirent.h>
#include <stdio.h>
#include <unistd.h>

static inline int open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int  n = 0;

    while (d != NULL && readdir(d) != NULL) {
        ++n;
    }
    if (d != NULL) {
        closedir(d);
    }
    return n - 3; /* ".", ".." and the directory's own descriptor */
}

static inline long rss_bytes(void)
{
    long  pages = 0, resident = 0;
    FILE *f     = fopen("/proc/self/statm", "r");

    if (f != NULL && fscanf(f, "%ld %ld", &pages, &resident) != 2) {
        resident = 0;
    }
    if (f != NULL) {
        fclose(f);
    }
    return resident * sysconf(_SC_PAGESIZE);
}

#endif
