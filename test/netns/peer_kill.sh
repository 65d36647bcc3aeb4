#!/usr/bin/env bash
# test/fault/peer_kill.c between two simulated nodes: each stage's ranks in
# their own network namespace, joined by a veth pair, so a dead peer is
# seen across a real link.
#   peer_kill.sh BUILD_DIR SOURCE_DIR
# SPDX-License-Identifier: MIT
set -euo pipefail
build=$1
src=$2
export STAGELINK_PLUGIN_PATH=$build/plugin
rate=""
. "$src/tools/lab/netns-lib.sh"
setup_nodes 2
PEER_KILL_NETNS="${tag}n0 ${tag}n1" PEER_KILL_ADDR=198.18.0.1 \
    "$build/test/fault/peer_kill"
