#!/bin/bash
# README's C or Python example under torchrun across two simulated nodes
# (tools/netns-lib.sh): one torchrun a node, two ranks each, meeting
# through the c10d rendezvous on node 0's address; stage 0 and stage 1 on
# different nodes, so the boundary crosses the veth, whose bytes are
# checked: the tensors once, not once a TP rank.  Run from the folder test/launchers/run.sh made (example_c,
# example.py).  Usage: two_node.sh BUILD VENV c|py
# SPDX-License-Identifier: MIT
set -eu
build=$1 venv=$2 kind=$3
run=$build/tools/stagelink_run rate=
. "$(dirname "$0")/../../tools/netns-lib.sh"
setup_nodes 2
port=$(ip netns exec "${ns[0]}" "$run" -P)
if [ "$kind" = c ]; then
    prog=(env STAGELINK_PLUGIN_PATH="$build/plugin" "$venv/bin/torchrun")
    args=(--no-python ./example_c)
else
    prog=(env -u STAGELINK_LIBRARY -u STAGELINK_PLUGIN_PATH -u PYTHONPATH
          "$venv/bin/torchrun")
    args=(example.py)
fi
pids=()
# is_host: torch decides who hosts the c10d store by the machine's hostname,
# which both namespaces share; node 0 hosts it.
for i in 0 1; do
    ip netns exec "${ns[$i]}" "${prog[@]}" --nnodes 2 --nproc-per-node 2 \
        --rdzv-backend c10d --rdzv-endpoint "198.18.0.1:$port" \
        --rdzv-conf "is_host=$([ "$i" = 0 ] && echo 1 || echo 0)" \
        --rdzv-id "stagelink-two-node-$$" --local-addr "198.18.0.$((i + 1))" \
        "${args[@]}" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
bytes=$(crossed)
# What crossed is the examples' tensors once, each TP rank's shard apart
# (the same t times would be twice as much): C's 4 MiB one way, Python's
# 8 microbatches of 8 MiB each way; above it only the bootstrap and the
# transport's headers.
[ "$kind" = c ] && want=$((4 << 20)) || want=$((2 * 8 * 8 << 20))
echo "veth bytes: $bytes (the tensors: $want)"
[ "$rc" = 0 ] && [ "$bytes" -ge "$want" ] && [ "$bytes" -le $((want * 5 / 4)) ]
