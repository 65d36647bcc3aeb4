#!/usr/bin/env bash
# Both ends of a stage boundary on one rail, or a warning naming both.
# Two simulated nodes (STAGELINK_NODE_ID and LOCAL_RANK by rank) on the fake DGX tree,
# where local rank i sits on GPU i and so on rail i:
#   t=2 p=2, two ranks a node: stage 0 on rails 0-1 of node a, stage 1 on
#           rails 0-1 of node b; no warning;
#   t=2 p=3, four ranks on node a, two on node b: stage 1 (node a, rails
#           2-3) sends to stage 2 (node b, rails 0-1); each end warns,
#           naming both ranks, both nodes and both NICs.
# Transfers run and are checked either way.
#   rails.sh STAGELINK_RUN XFER_CHECK TOPO_DIR
# SPDX-License-Identifier: MIT
set -euo pipefail
run=$1 xfer=$2 topo=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export STAGELINK_SYSFS_ROOT=$topo/dgx-h100 STAGELINK_DEBUG=WARN
unset UCX_NET_DEVICES STAGELINK_NET_DEVICES STAGELINK_IB_HCA NCCL_IB_HCA

# job NAME RANKS RANKS_ON_NODE_A PP
job() {
    "$run" -n "$2" -T 120 -- bash -c \
        'a='"$3"' n='"$2"'
         if [ "$RANK" -lt "$a" ]; then node=0 LOCAL_RANK=$RANK LOCAL_WORLD_SIZE=$a
         else node=1 LOCAL_RANK=$((RANK - a)) LOCAL_WORLD_SIZE=$((n - a)); fi
         STAGELINK_NODE_ID=node-$node exec "$@"' _ \
        "$xfer" -t 2 -p "$4" -n 2 -s 0,4097,1048577 1f1b >"$out/$1.out" 2>"$out/$1.err" || {
        echo "FAIL: $1 job failed"; cat "$out/$1.err"; exit 1; }
}

job matched 4 2 2
if grep -i "rail" "$out/matched.err"; then
    echo "FAIL: boundary on matching rails warned"; exit 1
fi
echo "matched rails: no warning"

job crossed 6 4 3
fails=0
for pair in "2 node-0 mlx5_3:1 2 4 node-1 mlx5_0:1 0" \
            "3 node-0 mlx5_2:1 3 5 node-1 mlx5_1:1 1" \
            "4 node-1 mlx5_0:1 0 2 node-0 mlx5_3:1 2" \
            "5 node-1 mlx5_1:1 1 3 node-0 mlx5_2:1 3"; do
    set -- $pair
    want="rank $1 (node $2) uses NIC $3 on rail $4, but its stage peer rank $5 (node $6) uses NIC $7 on rail $8"
    if ! grep -qF "$want" "$out/crossed.err"; then
        echo "FAIL: no warning \"$want\""; fails=1
    fi
done
n=$(grep -c "crosses rails" "$out/crossed.err" || true)
if [ "$n" != 4 ]; then
    echo "FAIL: $n rail warnings, want 4 (ranks 2-5, one each)"; fails=1
fi
grep "crosses rails" "$out/crossed.err" | head -1
if [ "$fails" != 0 ]; then cat "$out/crossed.err"; exit 1; fi
echo "crossed rails: ranks 2-5 each warned, naming both ends"
