#!/usr/bin/env bash
# Faults between two simulated nodes (namespaces joined by a veth pair, the
# link at 2 Gbit/s so 64 MiB takes ~0.3 s), with stagelink_soak moving
# checked 64 MiB tensors back and forth, STAGELINK_TIMEOUT=2:
#  1. the link goes down mid-transfer for 4 s and comes back: every wait
#     that passes the deadline returns TIMEOUT within it (no hang), is
#     waited on again, and once the link is back the transfers complete
#     with every byte intact;
#  2. the rank of node 1 is SIGKILLed mid-transfer: the rank of node 0
#     returns PEER_FAILED naming it within the deadline and exits;
#  3. a firewall passes the bootstrap's port and holds every other TCP
#     segment that carries data, so UCX never connects: init fails on both
#     ranks at the deadline, naming the other rank and UCX.
#   link_fault.sh BUILD_DIR SOURCE_DIR
# SPDX-License-Identifier: MIT
set -euo pipefail
build=$1
src=$2
run=$build/tools/stagelink_run
soak=$build/tools/lab/stagelink_soak
rate=2gbit
deadline=2
export STAGELINK_PLUGIN_PATH=$build/plugin STAGELINK_TIMEOUT=$deadline
. "$src/tools/lab/netns-lib.sh"
setup_nodes 2
out=$(mktemp -d)
trap 'cleanup; rm -rf "$out"' EXIT
fail() { echo "FAIL: $*"; cat "$out"/*.log; exit 1; }

# Blocks until a line of file $1 matches the extended regex $2, for at most
# $3 s, or until process $4 (the job) has ended: tail follows the file
# (inotify: no polling here) and grep stops at the first match.
await_line() {
    grep -q -m1 -E "$2" < <(timeout "$3" tail --pid="$4" -n +1 -f "$1" 2>/dev/null)
}

# The soak's progress line (-p) after its first full iteration, printed as
# it starts the next one: the job runs and its next transfer is starting.
running() {
    echo "^soak: rank $1: [0-9.]+ s, [1-9][0-9]* iterations"
}

# The soak process of node $1, once it runs.
soak_pid() {
    local p
    for p in $(ip netns pids "${tag}n$1"); do
        if [ "$(cat "/proc/$p/comm" 2>/dev/null)" = stagelink_soak ]; then
            echo "$p"
            return
        fi
    done
}

echo "# 1. link down for 4 s mid-transfer, then up"
run_job 1 "$soak" -s 64M -n 16 -r 10 -p 0.1 >"$out/flap.log" 2>&1 &
job=$!
await_line "$out/flap.log" "$(running 0)" 60 "$job" ||
    fail "rank 0 did not start transferring within 60 s"
ip -n "${tag}n0" link set "${tag}e0" down
echo "# link down at $(date +%T.%N)"
sleep 4
ip -n "${tag}n0" link set "${tag}e0" up
echo "# link up at $(date +%T.%N)"
wait "$job" || fail "the soak did not survive the link going down and up"
cat "$out/flap.log"
grep -q "0 mismatches" "$out/flap.log" || fail "bytes differ after the flap"
timeouts=$(grep -c "wait timed out" "$out/flap.log" || true)
[ "$timeouts" -ge 1 ] || fail "no wait timed out while the link was down 4 s"
# Each timed-out wait ended at the deadline, not later: the seconds are
# the field after "after" in "wait timed out after 2.00 s; waiting again".
awk -v d=$deadline '/wait timed out after/ { t = "";
    for (i = 1; i < NF; i++) if ($i == "after") t = $(i + 1);
    if (t !~ /^[0-9.]+$/) { print "no time in: " $0; bad = 1 }
    else if (t + 0 > d + 0.5) { print "a wait took " t " s"; bad = 1 } }
    END { exit bad }' "$out/flap.log" || fail "a timed-out wait overran the deadline"
echo "# $timeouts waits timed out within ${deadline} s and were retried; all transfers completed intact"

echo "# 2. node 1's rank SIGKILLed mid-transfer"
run_job 1 "$soak" -s 64M -n 1000 -p 0.1 >"$out/kill.log" 2>&1 &
job=$!
await_line "$out/kill.log" "$(running 1)" 60 "$job" ||
    fail "rank 1 did not start transferring within 60 s"
victim=$(soak_pid 1)
[ -n "$victim" ] || fail "no soak process on node 1"
killed=$(date +%s.%N)
kill -9 "$victim"
wait "$job" && fail "the job succeeded although a rank was killed"
cat "$out/kill.log"
grep -q "STAGELINK_ERR_PEER_FAILED.*rank 1" "$out/kill.log" ||
    fail "rank 0 did not report rank 1 as failed"
errored=$(sed -n 's/^rank 0: iteration [0-9]*: error at \([0-9.]*\)$/\1/p' "$out/kill.log")
[ -n "$errored" ] || fail "rank 0 reported no error time"
awk -v k="$killed" -v e="$errored" -v d=$deadline 'BEGIN {
    printf "# rank 0 failed %.3f s after the kill (deadline %d s)\n", e - k, d;
    exit !(e - k < d) }' || fail "rank 0 took longer than the deadline"

echo "# 3. UCX's traffic held, the bootstrap's port open"
port=$(ip netns exec "${tag}n0" "$run" -P)
# A firewall from the qdiscs this kernel has (no tc actions): TCP segments
# that carry data, other than the bootstrap's, go to a class of 8 bit/s,
# which lets one through and holds the next for a minute.  Handshakes pass
# (UCX 1.13 waits in connect() while a SYN is dropped), so UCX's endpoints are made and
# never carry a message.
for i in 0 1; do
    t="ip netns exec ${tag}n$i tc"
    $t qdisc replace dev "${tag}e$i" root handle 1: htb default 10
    $t class add dev "${tag}e$i" parent 1: classid 1:10 htb rate "$rate" quantum 65535
    $t class add dev "${tag}e$i" parent 1: classid 1:20 htb rate 8bit ceil 8bit \
        burst 1b cburst 1b quantum 65535
    for dir in sport dport; do
        $t filter add dev "${tag}e$i" parent 1: protocol ip prio 1 u32 \
            match ip $dir "$port" 0xffff flowid 1:10
    done
    # Under 64 bytes in all: a SYN, an ACK, a FIN, no data.
    $t filter add dev "${tag}e$i" parent 1: protocol ip prio 2 u32 \
        match ip protocol 6 0xff match u16 0 0xffc0 at 2 flowid 1:10
    $t filter add dev "${tag}e$i" parent 1: protocol ip prio 3 u32 \
        match ip protocol 6 0xff flowid 1:20
done
started=$(date +%s.%N)
pids=()
export STAGELINK_JOB_SECRET=${STAGELINK_JOB_SECRET:-$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')}
for i in 0 1; do
    MASTER_ADDR=198.18.0.1 MASTER_PORT=$port ip netns exec "${tag}n$i" \
        "$run" -n 1 -o "$i" -w 2 -T 60 -- "$soak" -s 1M -n 1 \
        >"$out/firewall$i.log" 2>&1 &
    pids+=($!)
done
for i in 0 1; do
    wait "${pids[$i]}" && fail "rank $i's job succeeded with UCX's traffic held"
done
ended=$(date +%s.%N)
cat "$out"/firewall*.log
for i in 0 1; do
    grep -q "failed to initialize: rank $((1 - i)) .*exchanged no hello over UCX" \
        "$out/firewall$i.log" ||
        fail "rank $i's init did not fail naming rank $((1 - i)) and UCX"
done
# About the deadline (the endpoints that never connected are closed by
# force): not the minutes TCP takes to give up on a connection.
awk -v s="$started" -v e="$ended" -v d=$deadline 'BEGIN {
    printf "# both inits failed %.3f s after the start (deadline %d s)\n", e - s, d;
    exit !(e - s < 15 * d) }' || fail "init took far longer than the deadline"
