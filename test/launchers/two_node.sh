#!/bin/bash
# README's C or Python example across two simulated nodes
# (tools/lab/netns-lib.sh), two ranks each, stage 0 and stage 1 on different
# nodes, so the boundary crosses the veth, whose bytes are checked: the
# tensors once, not once a TP rank.
#   torchrun: one torchrun a node, meeting through the c10d rendezvous on
#             node 0's address; stagelink joins the agent's store;
#   mpirun:   one mpirun on node 0, its orted on node 1 started through
#             netns-rsh.sh; stagelink joins PMIx, with no MASTER_ADDR.
# Run from the folder test/launchers/run.sh made (example_c, example.py).
# Usage: two_node.sh BUILD VENV torchrun|mpirun c|py
# SPDX-License-Identifier: MIT
set -eu
build=$1 venv=$2 launcher=$3 kind=$4
here=$(cd "$(dirname "$0")" && pwd)
run=$build/tools/stagelink_run rate=
. "$here/../../tools/lab/netns-lib.sh"
setup_nodes 2
if [ "$kind" = c ]; then
    env=(env STAGELINK_PLUGIN_PATH="$build/plugin")
    prog=(./example_c)
else
    env=(env -u STAGELINK_LIBRARY -u STAGELINK_PLUGIN_PATH -u PYTHONPATH)
    prog=("$venv/bin/python" example.py)
fi
rc=0
if [ "$launcher" = torchrun ]; then
    [ "$kind" = c ] && prog=(--no-python "${prog[@]}") || prog=("${prog[@]:1}")
    port=$(ip netns exec "${ns[0]}" "$run" -P)
    pids=()
    # is_host: torch picks the c10d store's host by the machine's hostname,
    # which both namespaces share; node 0 hosts it.
    for i in 0 1; do
        ip netns exec "${ns[$i]}" "${env[@]}" "$venv/bin/torchrun" --nnodes 2 \
            --nproc-per-node 2 --rdzv-backend c10d \
            --rdzv-endpoint "198.18.0.1:$port" \
            --rdzv-conf "is_host=$([ "$i" = 0 ] && echo 1 || echo 0)" \
            --rdzv-id "stagelink-two-node-$$" \
            --local-addr "198.18.0.$((i + 1))" "${prog[@]}" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
else
    export NETNS_TAG=$tag
    ip netns exec "${ns[0]}" env -u MASTER_ADDR -u MASTER_PORT "${env[@]:1}" \
        mpirun --host 198.18.0.1:2,198.18.0.2:2 -np 4 \
        --mca plm_rsh_agent "$here/netns-rsh.sh" \
        --mca oob_tcp_if_include 198.18.0.0/24 \
        -x STAGELINK_TIMEOUT -x STAGELINK_PLUGIN_PATH "${prog[@]}" || rc=1
fi
bytes=$(crossed)
# C's 4 MiB one way, Python's 8 microbatches of 8 MiB each way; above it
# only the bootstrap, the launcher's own traffic and the transport's headers.
[ "$kind" = c ] && want=$((4 << 20)) || want=$((2 * 8 * 8 << 20))
echo "veth bytes: $bytes (the tensors: $want)"
[ "$rc" = 0 ] && [ "$bytes" -ge "$want" ] && [ "$bytes" -le $((want * 5 / 4)) ]
