/*
 * --help and --version, answered alike by every tool (rc 0, stdout).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_TOOL_OPTS_H
#define SL_TOOL_OPTS_H

#include <getopt.h>
#include <stdio.h>

#define SL_TOOL_LONGOPTS \
    {"help", no_argument, NULL, 'h'}, {"version", no_argument, NULL, 'V'}

static const struct option sl_tool_longopts[] = {SL_TOOL_LONGOPTS,
                                                 {NULL, 0, NULL, 0}};

static inline int sl_tool_version(const char *name)
{
    printf("%s %s\n", name, STAGELINK_VERSION_STRING);
    return 0;
}

#endif
