#!/usr/bin/env bash
# stagelink_stress with every job split over two simulated nodes (network
# namespaces joined by a veth pair): the regression seeds, then random ones
# until the budget is spent.
#   stress.sh BUILD_DIR SOURCE_DIR BUDGET_S SEED,...
# SPDX-License-Identifier: MIT
set -euo pipefail
build=$1
src=$2
budget=$3
seeds=$4
rate=""
export STAGELINK_PLUGIN_PATH=$build/plugin
. "$src/tools/lab/netns-lib.sh"
setup_nodes 2
# The regression seeds with the fixed chunks they were found with (-F).
"$build/tools/lab/stagelink_stress" -q -N "${ns[0]},${ns[1]}" -F -s "$seeds"
"$build/tools/lab/stagelink_stress" -q -N "${ns[0]},${ns[1]}" -r 1000 -b "$budget"
