#!/bin/sh
# tools/lab/bench-verdict judges runs as docs/performance.md's goals say:
# made-up CSVs of one run that holds every goal must pass, and each goal
# broken alone (link efficiency just under its floor, a peer a hair ahead,
# CPU per GB just over NIXL's) must fail that run and name the row; a
# missing CSV is a usage error.  A failure means the verdict would pass a
# run that missed, or fail one that held.
# Usage: check_bench_verdict.sh SOURCE   SPDX-License-Identifier: MIT
set -eu
verdict=$(cd "$1" && pwd)/tools/lab/bench-verdict
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# gen EFF_T4_1M PEER_T1_4M_US SL_CPU_T4: one run; the link moves 1000 B/us
# (953.674316 MiB/s), so a 1 MiB tensor at the link takes 1048.576 us.
gen() {
    d=$tmp/run; rm -rf "$d"; mkdir -p "$d"
    {
        echo "run,size,test,bw_MBps,lat_us,cpu_s_per_GB"
        for s in 1048576 4194304; do echo "1,$s,tag_bw,953.674316,0,2.0"; done
    } >"$d/ucx_perftest.csv"
    awk -v e4="$1" -v c4="$3" 'BEGIN {
        print "run,size,mode,t,p50_us,avg_us,max_us,algbw_GBps,stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,wrong,cpu_s_per_GB"
        for (t = 1; t <= 4; t *= 2) for (s = 1048576; s <= 4194304; s *= 4) {
            e = (t == 4 && s == 1048576) ? e4 : 0.99; sg = s / 1000 / e
            printf "1,%d,full,%d,0,%.3f,0,0,0,0,0,0,1.5\n", s, t, sg * t
            printf "1,%d,scatter_gather,%d,0,%.3f,0,0,0,0,0,0,%s\n", s, t, sg, (t == 4 ? c4 : 1.5)
        } }' >"$d/stagelink.csv"
    # Peers: 16 tensors; nixl-slice at t = 4 takes 2.0 CPU-s per GB.
    {
        echo "run,size,peer,t,avg_us,cpu_s,crossed_B_per_tensor,tensors"
        echo "1,4194304,gloo-full,1,$2,1,4194304,16"
        echo "1,4194304,stagelink-py,1,1.0,1,4194304,16"
        for s in 1048576 4194304; do
            awk -v s="$s" 'BEGIN { printf "1,%d,nixl-slice,4,%.3f,%.6f,%d,16\n", s, 2 * s / 1000, 2.0 * 16 * s / 1e9, s }'
        done
    } >"$d/peers.csv"
}
# expect RC PATTERN ARGS...: bench-verdict exits RC and prints PATTERN.
expect() {
    want=$1 pattern=$2; shift 2
    gen "$@"
    rc=0
    "$verdict" "$tmp/run" >"$tmp/out" 2>&1 || rc=$?
    if [ "$rc" != "$want" ] || ! grep -q "$pattern" "$tmp/out"; then
        echo "FAIL: gen $*: exit $rc (want $want), no \"$pattern\" in: $(cat "$tmp/out")"
        failed=$((failed + 1))
    fi
}
expect 0 "1 of 1 runs held" 0.99 4300 1.9
expect 0 "least 0.90, t = 4, 1048576 B" 0.9001 4300 1.9
expect 1 "MISSED t = 4, 1048576 B: 0.899 (goal 0.90)" 0.899 4300 1.9
expect 1 "gloo-full at t = 1, 4194304 B, by 0.02% (full and" 0.99 4236 1.9
expect 0 "peers faster than scatter_gather: none" 0.99 4237 1.9
expect 1 "ABOVE NIXL's at 1048576 B: 2.01 against 2.00" 0.99 4300 2.01
gen 0.99 4300 1.9
rm "$tmp/run/peers.csv"
rc=0
"$verdict" "$tmp/run" >/dev/null 2>&1 || rc=$?
[ "$rc" = 2 ] || { echo "FAIL: a missing peers.csv: exit $rc (want 2)"; failed=$((failed + 1)); }
echo "bench-verdict: $failed failures"
[ "$failed" = 0 ]
