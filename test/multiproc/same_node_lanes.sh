#!/usr/bin/env bash
# Which transports every endpoint took (ucp_ep_print_info's lanes, logged at
# INFO by ucx_lanes.c).  A same-node endpoint must sit on the same-node
# worker, whose context offers only transports inside the node (logged
# too), and use only those; an endpoint to another node only network ones.
#   same_node_lanes.sh STAGELINK_RUN XFER_CHECK
#       one node, t=2 p=2 (8 same-node endpoints); then the user's UCX_TLS
#       (tcp,self: it wins, and is warned about once a rank) and a UCX with
#       no shared memory (UCX_SHM_DEVICES=: one WARN a rank, the fallback)
#   same_node_lanes.sh STAGELINK_RUN XFER_CHECK TWO_NODE BUILD_DIR
#       two simulated nodes, one stage of t=2 each: 4 same-node endpoints
#       (TP peers) and 4 across the link
# SPDX-License-Identifier: MIT
set -euo pipefail
run=$1 xfer=$2 two_node=${3:-} build=${4:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export STAGELINK_DEBUG=INFO STAGELINK_DEBUG_SUBSYS=NET

local_tl='^(self|sysv|posix|cma|knem|xpmem|cuda_ipc|cuda_copy|gdr_copy)/'
args=(-t 2 -p 2 -n 2 -s 0,4097,1048577 1f1b)

# lanes NAME WHERE: "rank R -> P: TL/DEV WORKER" a line, for the endpoints
# WHERE ("same node" or "other node") of the run NAME.
lanes() {
    sed -n "s/.*\[\([0-9]*\)\] STAGELINK INFO endpoint to rank \([0-9]*\): $2 over \(.*\) (\(.*\) worker)$/\1 \2 \4 \3/p" \
        "$out/$1.err" | while read -r me peer worker rest; do
        for l in $rest; do echo "rank $me -> $peer: $l $worker"; done
    done
}

# network NAME WHERE: the lanes that are not same-node transports.
network() { lanes "$1" "$2" | awk '{print $5}' | grep -Ev "$local_tl" || true; }
# inside NAME WHERE: the lanes that are same-node transports.
inside() { lanes "$1" "$2" | awk '{print $5}' | grep -E "$local_tl" || true; }
# count NAME WHERE [WORKER]: endpoints reported (on WORKER's worker).
count() {
    grep -c "endpoint to rank [0-9]*: $2 over .*(${3:-.*} worker)$" "$out/$1.err" || true
}
warns() { grep -c "STAGELINK WARN .*$2" "$out/$1.err" || true; }
fail() { echo "FAIL: $*"; cat "$out/$name.err"; exit 1; }

job() { # NAME [VAR=VALUE...]
    name=$1; shift
    env "$@" "$run" -n 4 -T 120 -- "$xfer" "${args[@]}" \
        >"$out/$name.out" 2>"$out/$name.err" || fail "$name: the job failed"
}

# The same-node worker's transports, as each rank logged them.
worker_tls() {
    sed -n 's/.*same-node worker: transports \(.*\)$/\1/p' "$out/$1.err" |
        tr ',' '\n' | sort -u
}

check_worker() { # NAME RANKS
    local n bad
    n=$(grep -c "same-node worker: transports" "$out/$1.err" || true)
    [ "$n" = "$2" ] || fail "$1: $n ranks made a same-node worker, want $2"
    bad=$(worker_tls "$1" | sed 's|$|/|' | grep -Ev "$local_tl" || true)
    [ -z "$bad" ] || fail "$1: the same-node worker offers $bad"
    echo "$1: same-node worker of every rank: $(worker_tls "$1" | tr '\n' ' ')"
}

if [ -n "$two_node" ]; then
    name=two-node
    STAGELINK_RANKS_PER_NODE=2 "$two_node" -b "$build" -R "$run" -N 2 run -- \
        "$xfer" "${args[@]}" >"$out/$name.err" 2>&1 ||
        { rc=$?; [ $rc = 77 ] && { cat "$out/$name.err"; exit 77; }; fail "the job failed ($rc)"; }
    check_worker two-node 4
    lanes two-node "same node"; lanes two-node "other node"
    [ "$(count two-node "same node" same-node)" = 4 ] ||
        fail "$(count two-node "same node" same-node) same-node endpoints on the same-node worker, want 4"
    [ "$(count two-node "other node" main)" = 4 ] ||
        fail "$(count two-node "other node" main) endpoints across nodes, want 4"
    bad=$(network two-node "same node")
    [ -z "$bad" ] || fail "same-node endpoints over network transports: $bad"
    bad=$(inside two-node "other node")
    [ -z "$bad" ] || fail "endpoints across nodes over same-node transports: $bad"
    [ -n "$(network two-node "other node")" ] || fail "no lanes across nodes reported"
    echo "two nodes: 4 same-node endpoints over shared memory, 4 across over $(network two-node "other node" | sort -u | tr '\n' ' ')"
    exit 0
fi

job default
check_worker default 4
lanes default "same node"
n=$(count default "same node" same-node)
[ "$n" = 8 ] || fail "$n same-node endpoints on the same-node worker, want 8"
bad=$(network default "same node")
[ -z "$bad" ] || fail "same-node endpoints over network transports: $bad"
[ "$(warns default "network transport")" = 0 ] ||
    fail "the plugin warned of a network transport the lanes do not show"
echo "same-node endpoints: 8, all on the same-node worker over shared memory"

job tcp-only UCX_TLS=tcp,self
bad=$(network tcp-only "same node")
warned=$(warns tcp-only "a network transport: same-node bytes cross a NIC")
[ -n "$bad" ] && [ "$warned" = 4 ] &&
    [ "$(count tcp-only "same node" main)" = 8 ] ||
    fail "UCX_TLS=tcp,self: network lanes \"$bad\", $warned warnings (want one a rank), $(count tcp-only "same node" main) endpoints on the main worker (want 8)"
echo "UCX_TLS=tcp,self: the user's choice holds ($(echo "$bad" | sort -u | tr '\n' ' ')), one warning a rank"

job no-shm UCX_SHM_DEVICES=
fallback=$(warns no-shm "UCX offers no shared-memory transport here")
lanes_warned=$(warns no-shm "network transport")
[ "$fallback" = 4 ] && [ "$lanes_warned" = 0 ] &&
    [ "$(count no-shm "same node" main)" = 8 ] ||
    fail "UCX_SHM_DEVICES=: $fallback fallback warnings (want one a rank), $lanes_warned more of the lanes (want none), $(count no-shm "same node" main) endpoints on the main worker (want 8)"
echo "no shared memory: fell back to the main worker with one WARN a rank"
