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
# both runs; STALL=1 has run 1's tag_bw read half that at 1 MiB; NOBW=all
# drops every run's tag_bw at 1 MiB, NOBW=run1 run 1's.  The runs differ
# so that a row read against the other run's figures changes the verdict:
# scatter_gather is at 0.99 of the link at 1 MiB and 0.97 at 4 MiB in run
# 1, the other way round in run 2, and each run's peers are 1% behind it
# (gloo-full at t = 1, both sizes); at t = 4 its CPU per GB is 1.5 where
# nixl-slice's is 1.8, and 1.9 where nixl-slice's is 2.5 (run 1: 1 MiB,
# then 4 MiB; run 2 the other way round); nixl-full takes three times
# nixl-slice's CPU, and nixl-slice at t = 2 half (below stagelink's, but
# t = 2 is not the largest t).  Run 1's rows a case moves: E11, E14
# (t = 1, 1 and 4 MiB), E41, E44 (t = 4) efficiencies, C4 CPU per GB at
# t = 4 and 1 MiB, P gloo-full's time at t = 1 and 4 MiB, F full's time
# at t = 1 and 1 MiB (as a fraction of scatter_gather's; otherwise they
# tie).  PEERS2=0 drops run 2's peers.
gen() {
    E11=0.99 E14=0.97 E41=0.99 E44=0.97 C4=1.5 P= F=1 PEERS2=1 NOBW= STALL=0
    for a; do eval "$a"; done
    d=$tmp/run; rm -rf "$d"; mkdir -p "$d"
    awk -v nobw="$NOBW" -v stall="$STALL" 'BEGIN {
        print "run,size,test,bw_MBps,lat_us,cpu_s_per_GB"
        for (r = 1; r <= 2; r++) for (s = 1048576; s <= 4194304; s *= 4) {
            gone = s == 1048576 && (nobw == "all" || (nobw == "run1" && r == 1))
            slow = r == 1 && s == 1048576 && stall
            printf "%d,%d,tag_bw,%s,0,2.0\n", r, s, gone ? "" : sprintf("%.6f", slow ? 476.837158 : 953.674316)
        } }' >"$d/ucx_perftest.csv"
    awk -v e11="$E11" -v e14="$E14" -v e41="$E41" -v e44="$E44" -v c4="$C4" -v p="$P" -v f="$F" -v peers2="$PEERS2" -v d="$d" '
        # Run r at size s is "fast" (0.99, the lower CPU) in run 1 at 1 MiB
        # and in run 2 at 4 MiB.
        function fast(r, s) { return (r == 1) == (s == 1048576) }
        BEGIN {
        sl = d "/stagelink.csv"; pe = d "/peers.csv"
        print "run,size,mode,t,p50_us,avg_us,max_us,algbw_GBps,stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,wrong,cpu_s_per_GB" >sl
        print "run,size,peer,t,avg_us,cpu_s,crossed_B_per_tensor,tensors" >pe
        for (r = 1; r <= 2; r++) for (s = 1048576; s <= 4194304; s *= 4) {
            gb = 16 * s / 1e9; nixl = fast(r, s) ? 1.8 : 2.5
            for (t = 1; t <= 4; t *= 2) {
                e = fast(r, s) ? 0.99 : 0.97; c = (t == 4) ? (fast(r, s) ? 1.5 : 1.9) : 1.5
                if (r == 1 && t == 1) e = (s == 1048576) ? e11 : e14
                if (r == 1 && t == 4) e = (s == 1048576) ? e41 : e44
                if (r == 1 && t == 4 && s == 1048576) c = c4
                sg = s / 1000 / e
                printf "%d,%d,full,%d,0,%.3f,0,0,0,0,0,0,1.5\n", r, s, t,
                       sg * t * ((r == 1 && t == 1 && s == 1048576) ? f : 1) >sl
                printf "%d,%d,scatter_gather,%d,0,%.3f,0,0,0,0,0,0,%s\n", r, s, t, sg, c >sl
                if (r == 2 && !peers2) continue
                if (t == 1) {
                    printf "%d,%d,gloo-full,1,%.1f,1,%d,16\n", r, s, (r == 1 && s == 4194304 && p != "") ? p : 1.01 * sg, s >pe
                    printf "%d,%d,stagelink-py,1,1.0,1,%d,16\n", r, s, s >pe
                }
                if (t == 2) {
                    printf "%d,%d,nixl-slice,2,%.1f,%.9f,%d,16\n", r, s, 1.01 * sg, 0.5 * nixl * gb, s >pe
                    printf "%d,%d,gloo-full,2,%.1f,1,%d,16\n", r, s, 1.01 * sg, s >pe
                }
                if (t == 4) {
                    printf "%d,%d,nixl-slice,4,%.1f,%.9f,%d,16\n", r, s, 1.01 * sg, nixl * gb, s >pe
                    printf "%d,%d,nixl-full,4,%.1f,%.9f,%d,16\n", r, s, 4 * sg, 3 * nixl * gb, s >pe
                }
            }
        } }'
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
expect 1 "run 1, peers faster than scatter_gather: gloo-full at t = 1, 4194304 B, by 0.00% (full and scatter_gather, one path:" P=4323.9
expect 1 "1 of 2 runs held every goal" P=4323.9
expect 0 "run 1, peers faster than scatter_gather: none" P=4324.0
expect 0 "t = 1 over the runs: gloo-full ahead of scatter_gather in 0 of 4 rows; full (scatter_gather's own path at t = 1) in 0 of 4"
expect 1 "t = 1 over the runs: gloo-full ahead of scatter_gather in 1 of 4 rows;" P=4323.9
expect 0 "t = 1 over the runs: gloo-full ahead of scatter_gather in 0 of 4 rows;" P=4324.0
expect 0 "full (scatter_gather's own path at t = 1) in 1 of 4" F=0.9999
expect 0 "full (scatter_gather's own path at t = 1) in 0 of 4" F=0.99996
expect 1 "run 1, CPU per GB at t = 4: ABOVE NIXL's at 1048576 B: 1.81 against nixl-slice's 1.80" C4=1.81
expect 1 "1 of 2 runs held every goal" C4=1.81
expect 0 "run 1, CPU per GB at t = 4: at most NIXL's in every row (1.50-1.90; the least of nixl-slice)"
expect 0 "2 of 2 runs held every goal" NOBW=run1
expect 1 "run 1, link efficiency: MISSED t = 4, 1048576 B: 0.8990 (goal 0.90)" E41=0.899 NOBW=run1
expect 1 "run 2, NOT JUDGED: t = 2, 1048576 B: no tag_bw goodput; t = 4, 1048576 B: no tag_bw goodput" NOBW=all
expect 1 "run 2, NOT JUDGED: no peer rows; no NIXL rows at t = 4" PEERS2=0
gen
rm "$tmp/run/peers.csv"
rc=0
"$verdict" "$tmp/run" >"$tmp/out" 2>&1 || rc=$?
[ "$rc" = 2 ] || { echo "FAIL: a missing peers.csv: exit $rc (want 2):"; cat "$tmp/out"; failed=$((failed + 1)); }
echo "bench-verdict: $failed failures"
[ "$failed" = 0 ]
