#!/bin/sh
# Rank 0 of a job spread over nodes, whose MASTER_ADDR is a host name that
# resolves to loopback on its node (Debian's "127.0.1.1 host" line in
# /etc/hosts, here in a mount namespace of its own): it warns, naming the
# fix, before it listens where no other node can reach it.  The same rank
# on one node, or with a literal loopback address, says nothing.
# Usage: rendezvous_loopback.sh BUILD_DIR   (root; 77 without)
set -u
perf=$1/tools/stagelink_perftest
port=$("$1/tools/stagelink_run" -P) || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '127.0.0.1 localhost\n127.0.1.1 sl-loopback-host\n' >"$tmp/hosts"
unshare -m true 2>/dev/null || { echo "SKIP: no mount namespace (needs root)"; exit 77; }

# rank0 LOCAL_WORLD_SIZE MASTER_ADDR: rank 0's stderr, alone in a job of 2
# (it ends at its 2 s deadline: the other rank never comes).
rank0() {
    unshare -m sh -c 'mount --bind "$1" /etc/hosts && exec env RANK=0 \
        WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE="$2" MASTER_ADDR="$3" \
        MASTER_PORT="$4" STAGELINK_TIMEOUT=2 "$5" -t init -n 1 -w 0' \
        sh "$tmp/hosts" "$1" "$2" "$port" "$perf" 2>&1 >/dev/null
}
fail=0
out=$(rank0 1 sl-loopback-host)
case $out in
*"resolves to a loopback address here, while 1 of 2 ranks"*STAGELINK_BOOTSTRAP_BIND*) echo "ok: warned";;
*) echo "FAIL: no warning for a loopback MASTER_ADDR across nodes: $out"; fail=1;;
esac
for args in "2 sl-loopback-host" "1 127.0.0.1"; do
    # shellcheck disable=SC2086
    out=$(rank0 $args)
    case $out in
    *"resolves to a loopback"*) echo "FAIL: warned for $args: $out"; fail=1;;
    *"1 of 2 ranks reached the rendezvous"*) echo "ok: quiet for $args";;
    *) echo "FAIL: $args did not reach the rendezvous: $out"; fail=1;;
    esac
done
exit $fail
