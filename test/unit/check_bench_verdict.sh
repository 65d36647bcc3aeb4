#!/bin/sh
# tools/lab/bench-verdict judges runs as docs/performance.md's goals say.
# Made-up CSVs of two runs that hold every goal must pass; each goal
# broken alone in run 1 (an efficiency just under its floor at 1 and
# 4 MiB, against the best tag_bw when run 1's stalled; a peer a hair
# ahead; CPU per GB just over the least NIXL peer's) must fail run 1 only
# and name the row, and so must a run whose goals cannot be judged (no
# tag_bw, no peers).  A failure means the verdict would pass
# a run that missed, or fail one that held.
# Usage: check_bench_verdict.sh SOURCE   SPDX-License-Identifier: MIT
set -eu
verdict=$(cd "$1" && pwd)/tools/lab/bench-verdict
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# gen [NAME=VALUE...]: the link moves 1000 B/us (953.674316 MiB/s) in
# both runs; STALL=1 has run 1's tag_bw read half that at 1 MiB, NOBW=1
# drops every tag_bw at 1 MiB.  scatter_gather is at 0.99 of the link in every row of both
# runs but those run 1 sets: E11, E14 (t = 1, 1 and 4 MiB), E41, E44
# (t = 4); C4 is its CPU per GB at t = 4 in run 1 (1.5 elsewhere).  Peers:
# gloo-full at t = 1, 4 MiB (run 1: P us; else 1% behind), nixl-slice (2.0
# CPU-s per GB) and nixl-full (6.0) at t = 4, and nixl-slice at t = 2 with
# 1.0 (below stagelink's, but t = 2 is not the largest t); PEERS2=0 drops
# run 2's peers.
gen() {
    E11=0.99 E14=0.99 E41=0.99 E44=0.99 C4=1.5 P= PEERS2=1 NOBW=0 STALL=0
    for a; do eval "$a"; done
    d=$tmp/run; rm -rf "$d"; mkdir -p "$d"
    awk -v nobw="$NOBW" -v stall="$STALL" 'BEGIN {
        print "run,size,test,bw_MBps,lat_us,cpu_s_per_GB"
        for (r = 1; r <= 2; r++) for (s = 1048576; s <= 4194304; s *= 4)
            printf "%d,%d,tag_bw,%s,0,2.0\n", r, s, (s == 1048576 && nobw) ? "" : \
                   sprintf("%.6f", (r == 1 && s == 1048576 && stall) ? 476.837158 : 953.674316) }' \
        >"$d/ucx_perftest.csv"
    awk -v e11="$E11" -v e14="$E14" -v e41="$E41" -v e44="$E44" -v c4="$C4" 'BEGIN {
        print "run,size,mode,t,p50_us,avg_us,max_us,algbw_GBps,stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,wrong,cpu_s_per_GB"
        for (r = 1; r <= 2; r++) for (t = 1; t <= 4; t *= 2) for (s = 1048576; s <= 4194304; s *= 4) {
            e = 0.99
            if (r == 1 && t == 1) e = (s == 1048576) ? e11 : e14
            if (r == 1 && t == 4) e = (s == 1048576) ? e41 : e44
            sg = s / 1000 / e
            printf "%d,%d,full,%d,0,%.3f,0,0,0,0,0,0,1.5\n", r, s, t, sg * t
            printf "%d,%d,scatter_gather,%d,0,%.3f,0,0,0,0,0,0,%s\n", r, s, t, sg, (r == 1 && t == 4) ? c4 : 1.5
        } }' >"$d/stagelink.csv"
    awk -v p="$P" -v peers2="$PEERS2" 'BEGIN {
        print "run,size,peer,t,avg_us,cpu_s,crossed_B_per_tensor,tensors"
        for (r = 1; r <= 1 + peers2; r++) {
            s = 4194304; link = s / 1000
            printf "%d,%d,gloo-full,1,%.1f,1,%d,16\n", r, s, (r == 1 && p != "") ? p : 1.01 * link / 0.99, s
            printf "%d,%d,stagelink-py,1,1.0,1,%d,16\n", r, s, s
            for (s = 1048576; s <= 4194304; s *= 4) {
                gb = 16 * s / 1e9; link = s / 1000
                printf "%d,%d,nixl-slice,4,%.1f,%.9f,%d,16\n", r, s, 2 * link, 2.0 * gb, s
                printf "%d,%d,nixl-full,4,%.1f,%.9f,%d,16\n", r, s, 4 * link, 6.0 * gb, s
                printf "%d,%d,nixl-slice,2,%.1f,%.9f,%d,16\n", r, s, 2 * link, 1.0 * gb, s
            }
        } }' >"$d/peers.csv"
}
# expect RC PATTERN [NAME=VALUE...]: bench-verdict exits RC and prints
# PATTERN (a fixed string).
expect() {
    want=$1 pattern=$2; shift 2
    gen "$@"
    rc=0
    "$verdict" "$tmp/run" >"$tmp/out" 2>&1 || rc=$?
    if [ "$rc" != "$want" ] || ! grep -qF "$pattern" "$tmp/out"; then
        echo "FAIL: gen $*: exit $rc (want $want), no \"$pattern\" in:"
        cat "$tmp/out"
        failed=$((failed + 1))
    fi
}
expect 0 "2 of 2 runs held every goal"
expect 0 "run 1, link efficiency: held (least 0.90 of the best tag_bw, t = 4, 1048576 B)" E41=0.9001
expect 1 "run 1, link efficiency: MISSED t = 4, 1048576 B: 0.8990 (goal 0.90)" E41=0.899
expect 1 "1 of 2 runs held every goal" E41=0.899
expect 1 "run 1, link efficiency: MISSED t = 4, 1048576 B: 0.8990 (goal 0.90)" E41=0.899 STALL=1
expect 1 "run 1, link efficiency: MISSED t = 4, 4194304 B: 0.9490 (goal 0.95)" E44=0.949
expect 1 "run 1, link efficiency: MISSED t = 1, 4194304 B: 0.9490 (goal 0.95)" E14=0.949
expect 0 "2 of 2 runs held every goal" E11=0.85
expect 1 "run 1, peers faster than scatter_gather: gloo-full at t = 1, 4194304 B, by 0.02% (full and scatter_gather, one path:" P=4236.0
expect 1 "1 of 2 runs held every goal" P=4236.0
expect 0 "run 1, peers faster than scatter_gather: none" P=4236.7
expect 1 "run 1, CPU per GB at t = 4: ABOVE NIXL's at 1048576 B: 2.01 against nixl-slice's 2.00" C4=2.01
expect 1 "1 of 2 runs held every goal" C4=2.01
expect 0 "run 1, CPU per GB at t = 4: at most NIXL's in every row (1.50-1.50; the least of nixl-slice)"
expect 1 "run 2, NOT JUDGED: t = 2, 1048576 B: no tag_bw goodput; t = 4, 1048576 B: no tag_bw goodput" NOBW=1
expect 1 "run 2, NOT JUDGED: no peer rows; no NIXL rows at t = 4" PEERS2=0
gen
rm "$tmp/run/peers.csv"
rc=0
"$verdict" "$tmp/run" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" = 2 ] || { echo "FAIL: a missing peers.csv: exit $rc (want 2):"; cat "$tmp/out"; failed=$((failed + 1)); }
echo "bench-verdict: $failed failures"
[ "$failed" = 0 ]
