#!/usr/bin/env bash
# Same-node peers never go through a NIC: the transports UCX chose for
# every same-node endpoint (ucp_ep_print_info's lanes, logged at INFO by
# ucx_worker.c) are printed, and the test fails when one is a network
# transport.  t=2 p=2 on one node: each rank has two same-node endpoints.
# Then the check itself: with UCX_TLS=tcp,self the same run must be caught
# (tcp carries same-node bytes) and warned about.
#   same_node_lanes.sh STAGELINK_RUN XFER_CHECK
# SPDX-License-Identifier: MIT
set -euo pipefail
run=$1 xfer=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export STAGELINK_DEBUG=INFO STAGELINK_DEBUG_SUBSYS=NET

local_tl='^(self|sysv|posix|cma|knem|xpmem|cuda_ipc|cuda_copy|gdr_copy)/'

# lanes NAME: the run's same-node lanes, one "rank R -> P: TL/DEV" a line.
lanes() {
    sed -n 's/.*\[\([0-9]*\)\] STAGELINK INFO endpoint to rank \([0-9]*\): same node over \(.*\)/\1 \2 \3/p' \
        "$out/$1.err" | while read -r me peer rest; do
        for l in $rest; do echo "rank $me -> $peer: $l"; done
    done
}

# network NAME: the lanes of NAME that are not same-node transports.
network() { lanes "$1" | awk '{print $NF}' | grep -Ev "$local_tl" || true; }

job() { # NAME [VAR=VALUE...]
    local name=$1; shift
    env "$@" "$run" -n 4 -T 120 -- "$xfer" -t 2 -p 2 -n 2 -s 0,4097,1048577 1f1b \
        >"$out/$name.out" 2>"$out/$name.err" || {
        echo "FAIL: $name: the job failed"; cat "$out/$name.err"; exit 1; }
}

job default
lanes default
n=$(grep -c "same node over" "$out/default.err" || true)
if [ "$n" != 8 ]; then
    echo "FAIL: $n same-node endpoints reported, want 8"; cat "$out/default.err"; exit 1
fi
bad=$(network default)
if [ -n "$bad" ]; then
    echo "FAIL: same-node endpoints over network transports: $bad"; exit 1
fi
if grep -q "a network transport" "$out/default.err"; then
    echo "FAIL: the plugin warned of a network transport the lanes do not show"; exit 1
fi
echo "same-node endpoints: 8, all over shared memory"

job tcp-only UCX_TLS=tcp,self
bad=$(network tcp-only)
warned=$(grep -c "a network transport: same-node bytes cross a NIC" "$out/tcp-only.err" || true)
if [ -z "$bad" ] || [ "$warned" != 8 ]; then
    echo "FAIL: UCX_TLS=tcp,self: network lanes \"$bad\", $warned warnings (want 8)"
    cat "$out/tcp-only.err"; exit 1
fi
echo "UCX_TLS=tcp,self: caught ($(echo "$bad" | sort -u | tr '\n' ' ')), 8 warnings"
