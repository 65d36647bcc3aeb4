#!/usr/bin/env bash
# Simulated nodes for stagelink: one network namespace per node, joined by a
# veth pair (two nodes) or through a bridge (more), addresses in
# 198.18.0.0/15, the link optionally rate-limited with tc tbf.  Each node's
# ranks are started by their own command (stagelink_run -o/-w), as on a
# cluster; the veth byte counters measure what really crossed between nodes.
# The ranks share a job secret (STAGELINK_JOB_SECRET, made here unless set),
# so their rendezvous is authenticated as a cluster job's should be.
#
#   stagelink_two_node.sh [options] compare   full vs scatter_gather bytes
#   stagelink_two_node.sh [options] run -- PROGRAM ARGS...  (one stage per node)
#
# Options:
#   -b DIR     build directory (default: the one holding this script's tools)
#   -R PROGRAM the stagelink_run that starts each node's ranks (default: the
#              build directory's, or the one installed beside this script;
#              a wheel's: .venv/bin/stagelink_run)
#   -t "2 4"   TP sizes for compare (ranks per node)
#   -N NODES   nodes for run (default 2)
#   -s SIZE    tensor size for compare (default 16M)
#   -n ITERS   iterations for compare (default 4)
#   -r RATE    tc tbf rate of each node's link, e.g. 8gbit (default: none)
#   -c         check: fail unless scatter_gather/full = 1/t within 3%
# Needs root (ip netns); exits 77 with the reason where it cannot make
# namespaces.  Removes everything it made, also on failure or interrupt.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=""
runner=""
tps="2 4"
nodes=2
size=16M
iters=4
rate=""
check=0
usage() {
    echo "usage: stagelink_two_node.sh [-b DIR] [-R PROGRAM] [-t \"2 4\"] [-N NODES] [-s SIZE] [-n ITERS]"
    echo "                             [-r RATE] [-c] compare | run -- PROGRAM ARGS..."
    sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
}
[ "${1:-}" = --help ] && { usage; exit 0; }
while getopts "b:R:t:N:s:n:r:ch" opt; do
    case $opt in
    b) build=$OPTARG ;;
    R) runner=$OPTARG ;;
    t) tps=$OPTARG ;;
    N) nodes=$OPTARG ;;
    s) size=$OPTARG ;;
    n) iters=$OPTARG ;;
    r) rate=$OPTARG ;;
    c) check=1 ;;
    h) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
action=${1:-compare}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift

# In the sources: the build tree's tools; installed (the lab in
# LIBEXECDIR/stagelink): the ones in bin/, on PATH.
if [ -z "$build" ]; then
    if [ -x "$here/../../build/tools/stagelink_run" ]; then
        tools=$here/../../build/tools
    else
        tools=$(dirname "$(command -v stagelink_run || echo /nonexistent/stagelink_run)")
    fi
else
    tools=$build/tools
    export STAGELINK_PLUGIN_PATH=${STAGELINK_PLUGIN_PATH:-$build/plugin}
fi
run=${runner:-$tools/stagelink_run}
perftest=$tools/stagelink_perftest

. "$here/netns-lib.sh"

case $action in
compare)
    setup_nodes 2
    echo "# two simulated nodes (${ns[*]}), link ${tag}e0<->${tag}e1 198.18.0.1-2${rate:+, tbf $rate}, TCP $link_cc"
    echo "# stagelink_perftest ping-pong of a $size tensor, $iters iterations + 1 warm-up, forward and back"
    echo "# rendezvous authenticated with a job secret (${STAGELINK_JOB_SECRET_FILE:-STAGELINK_JOB_SECRET})"
    printf "%3s %16s %16s %10s %10s\n" t "full B" "scatter_gather B" ratio ideal
    status=0
    for t in $tps; do
        declare -A bytes=()
        for mode in full scatter_gather; do
            before=$(crossed)
            STAGELINK_MODE=$mode STAGELINK_DEBUG=INFO STAGELINK_DEBUG_SUBSYS=BOOT \
                run_job "$t" "$perftest" -g "$t" -s "$size" \
                -n "$iters" -w 1 >"/tmp/${tag}.$mode.$t" 2>&1 || {
                cat "/tmp/${tag}.$mode.$t"; rm -f "/tmp/${tag}".*; exit 1; }
            grep -q "rendezvous on .* complete, $((2 * t)) ranks (authenticated)" \
                "/tmp/${tag}.$mode.$t" || {
                echo "FAIL: t=$t $mode: rank 0 did not report an authenticated rendezvous"
                status=1; }
            bytes[$mode]=$(( $(crossed) - before ))
        done
        ratio=$(awk -v a="${bytes[scatter_gather]}" -v b="${bytes[full]}" 'BEGIN{printf "%.4f", a/b}')
        ideal=$(awk -v t="$t" 'BEGIN{printf "%.4f", 1/t}')
        printf "%3d %16d %16d %10s %10s\n" "$t" "${bytes[full]}" "${bytes[scatter_gather]}" "$ratio" "$ideal"
        sed -n 's/^ *[0-9]/&/p' "/tmp/${tag}.full.$t" "/tmp/${tag}.scatter_gather.$t" | sed 's/^/#   /'
        if [ $check = 1 ] && ! awk -v r="$ratio" -v t="$t" 'BEGIN{d=r*t-1; exit !(d<=0.03 && d>=-0.03)}'; then
            echo "FAIL: t=$t scatter_gather/full = $ratio, not 1/$t within 3%"
            status=1
        fi
        unset bytes
    done
    rm -f "/tmp/${tag}".*
    exit $status
    ;;
run)
    [ $# -gt 0 ] || { echo "run needs -- PROGRAM ARGS" >&2; exit 2; }
    per=${STAGELINK_RANKS_PER_NODE:-1}
    setup_nodes "$nodes"
    before=$(crossed)
    run_job "$per" "$@"
    echo "# $nodes nodes x $per ranks: $(( $(crossed) - before )) bytes crossed between nodes"
    ;;
*)
    echo "unknown action $action" >&2
    exit 2
    ;;
esac
