#!/usr/bin/env bash
# stagelink_perftest on two simulated nodes, the link limited by tc tbf,
# against ucx_perftest's tag_bw goodput on the same veth in the same run:
# at t = 2 and 4, full and scatter_gather, stream and boundary, no row is
# faster than the bytes its ranks put on each direction of the link allow
# at that goodput (within 2%).  Every time is the stage's: rank 0's own pair finishing
# first does not make a row.
#   perftest_link.sh BUILD_DIR SOURCE_DIR   SPDX-License-Identifier: MIT
set -euo pipefail
build=$1
src=$2
export STAGELINK_PLUGIN_PATH=$build/plugin STAGELINK_TIMEOUT=120
run=$build/tools/stagelink_run
perf=$build/tools/stagelink_perftest
rate=1gbit
size=4194304
. "$src/tools/lab/netns-lib.sh"
command -v ucx_perftest >/dev/null || skip "no ucx_perftest (Debian's ucx-utils)"
setup_nodes 2
out=$(mktemp -d)
trap 'rm -rf "$out"; cleanup' EXIT

# The goodput: ucx_perftest's tag_bw over tcp on the veth, the best of
# three runs (a capacity: a run the machine's load slowed reads low).
goodput=0
for try in 1 2 3; do
    # bytes,test,bw_MBps (MiB/s),...
    got=$(ucx_perftest_row $size tag_bw 24 "$out" | awk -F, '{print $3 * 1048576 / 1e6}')   # bytes/us
    [ -n "$got" ] && [ "$got" != 0 ] || { echo "FAIL: no ucx_perftest result"; exit 1; }
    echo "# ucx_perftest tag_bw run $try: $got B/us"
    goodput=$(awk -v a="$goodput" -v b="$got" 'BEGIN {print (b > a) ? b : a}')
done
echo "# ucx_perftest tag_bw goodput on the $rate veth, the best of 3: $goodput B/us"

failed=0 rows=0
for t in 2 4; do
    for mode in full scatter_gather; do
        for test in stream boundary; do
            run_job "$t" "$perf" -g "$t" -t $test --mode $mode -s $size -n 4 -w 1 --csv \
                >"$out/row" 2>"$out/err" || { echo "FAIL: t=$t $mode $test: $(tail -3 "$out/err")"; failed=1; continue; }
            # xnode_B_job: every rank's bytes to the other node an iteration.
            # A stream's go one way.  A round trip's half go each way, and a
            # full-duplex link carries both at once (full mode's TP pairs
            # run apart, so one's forward meets another's return): its
            # round trip needs a direction's bytes, and half of that is the
            # one-way time the row gives.
            if ! awk -F, -v g="$goodput" -v k=$test -v t=$t '
                NR == 2 { bytes = (k == "boundary") ? $13 / 2 : $13
                          floor = (k == "boundary") ? bytes / g / 2 : bytes / g
                          printf "t=%d %-14s %-8s avg %9.1f us; %d bytes a direction need %9.1f us (x %.3f)\n",
                                 t, $3, k, $7, bytes, floor, $7 / floor
                          exit !($7 >= 0.98 * floor && $13 > 0) }' "$out/row"; then
                echo "FAIL: t=$t $mode $test is faster than its bytes allow: $(cat "$out/row")"
                failed=1
            fi
            rows=$((rows + 1))
        done
    done
done
[ $rows = 8 ] || failed=1
exit $failed
