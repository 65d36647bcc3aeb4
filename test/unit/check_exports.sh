#!/bin/sh
# The plugin exports stagelink_plugin_v1 and nothing else (rdma-core's rule:
# providers export nothing internal).  Usage: check_exports.sh PLUGIN.so
set -eu
exports=$(nm -D --defined-only "$1" | awk '{print $NF}' | sort)
echo "exports of $1: $exports"
if [ "$exports" != "stagelink_plugin_v1" ]; then
    echo "FAIL: expected exactly stagelink_plugin_v1" >&2
    exit 1
fi
