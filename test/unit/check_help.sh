#!/bin/sh
# Every installed tool and every script in tools/ and tools/lab/ answers -h and --help
# with exit 0 and a usage line within 10 s, and changes nothing: run in a
# private mount namespace whose /usr, /etc, /var, /opt, /root and source
# tree are overlays, each of which must be left without a written file.
# The C tools also answer --version.
# Usage: check_help.sh BUILD SOURCE   SPDX-License-Identifier: MIT
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null 2>&1; then
    echo "SKIP: the clean root needs root and unshare (a mount namespace)"
    exit 77
fi
if [ "${STAGELINK_IN_CLEAN_ROOT:-}" != 1 ]; then
    exec env STAGELINK_IN_CLEAN_ROOT=1 unshare --mount --propagation private "$0" "$@"
fi
tmp=$(mktemp -d)
trap 'cd /; for d in $dirs; do umount "$d" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
dirs="/usr /etc /var /opt /root $src $build"
i=0
for d in $dirs; do
    i=$((i + 1))
    mkdir -p "$tmp/up$i" "$tmp/work$i"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$tmp/up$i,workdir=$tmp/work$i" "$d"
done
failed=0 checked=0
out=$tmp/out
try() { # try PROGRAM... : -h and --help
    for opt in -h --help; do
        rc=0
        timeout 10 "$@" $opt >"$out" 2>&1 </dev/null || rc=$?
        checked=$((checked + 1))
        if [ $rc != 0 ] || ! grep -qi "^usage" "$out"; then
            echo "FAIL: $* $opt: exit $rc, $(grep -ci '^usage' "$out") usage lines: $(head -3 "$out")"
            failed=$((failed + 1))
        fi
    done
}
for t in stagelink_info stagelink_perftest stagelink_run stagelink_pipeline \
         lab/stagelink_schedule lab/stagelink_soak lab/stagelink_stress \
         lab/stagelink_canary; do
    try "$build/tools/$t"
    timeout 10 "$build/tools/$t" --version >"$out" 2>&1 &&
        grep -q "^${t#lab/} [0-9]" "$out" ||
        { echo "FAIL: $t --version: $(head -2 "$out")"; failed=$((failed + 1)); }
done
cd "$src/tools"
for f in * lab/*; do
    [ -f "$f" ] || continue
    case $(head -c 2 "$f") in
    '#!') try "./$f" ;;
    *) case $f in *.sh) try sh "./$f" ;; *.py) try /usr/bin/python3 "./$f" ;; esac ;;
    esac
done
cd /
i=0
for d in $dirs; do
    i=$((i + 1))
    if [ -n "$(find "$tmp/up$i" -mindepth 1 -print -quit)" ]; then
        echo "FAIL: -h/--help wrote into $d: $(cd "$tmp/up$i" && find . -mindepth 1 | head -5 | tr '\n' ' ')"
        failed=$((failed + 1))
    fi
done
echo "$checked -h/--help answers checked, $failed failures"
[ $checked -gt 30 ] && [ $failed = 0 ]
