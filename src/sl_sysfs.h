/*
 * Reads of sysfs under a configurable root (STAGELINK_SYSFS_ROOT), so that
 * every topology and GPU-direct question can be asked of a fake tree.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_SYSFS_H
#define SL_SYSFS_H

#include <stddef.h>

/** First line of root+path, newline removed; 0 when it cannot be read. */
int sl_sysfs_read(const char *root, const char *path, char *out, size_t len);

/** root+path as a number (decimal or 0x hex); 0 when absent or not one. */
int sl_sysfs_read_long(const char *root, const char *path, long *value);

/**
 * Where the device that root+link points to sits in the PCI tree: the
 * resolved path below /sys/devices ("pci0000:00/0000:00:01.0/.../0000:03:00.0").
 * 0 when the link does not resolve inside root's /sys/devices.
 */
int sl_sysfs_pci_path(const char *root, const char *link, char *out,
                      size_t len);

#endif
