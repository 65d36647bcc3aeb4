#!/bin/bash
# Every variable of the table with the invalid values its type cannot hold
# (test/fault/env_invalid.c reads them from the table): stagelink_info and
# a four-rank run of README's C example must each end within 10 s, and every
# refusal names its variable (a variable the library reads is refused on
# every rank; a launcher's the job does not use may pass).  Then README's
# C example under the values users write, a misspelled name, and sharded
# from the environment.
# Usage: env_sweep.sh BUILD SOURCE PYTHON   SPDX-License-Identifier: MIT
set -u
build=$(cd "$1" && pwd) src=$(cd "$2" && pwd) python=$3
info=$build/tools/stagelink_info
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0 cases=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

"$python" "$src/test/python/readme_examples.py" "$src" "$tmp" || exit 1
# A sanitized build's library needs its runtime first in the host.
san=
ldd "$build/src/libstagelink.so.1" | grep -q libasan && san=-fsanitize=address,undefined
cc -std=c11 -Wall -Werror $san -I "$src/include" -o "$tmp/example_c" "$tmp/example.c" \
    -L "$build/src" -Wl,-rpath,"$build/src" -lstagelink || exit 1

# A launcher's leftovers from the caller would change what the ranks read.
for v in $("$info" -c | awk '/^[A-Za-z_]+ +=/ {print $1}'); do
    case $v in STAGELINK_PLUGIN_PATH) ;; *) unset "$v" ;; esac
done
port=$((29600 + $$ % 200))

# ranks NAME=VALUE...: README's C example (two stages of two TP ranks)
# under torchrun's variables, the settings last so that they override
# them; logs in $tmp/rank0..3, exit codes in rc[0..3].
ranks() {
    local r pids=()
    port=$((port + 1))
    for r in 0 1 2 3; do
        env RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 \
            MASTER_ADDR=127.0.0.1 MASTER_PORT=$port STAGELINK_TIMEOUT=8 \
            "$@" timeout -k 1 10 "$tmp/example_c" >"$tmp/rank$r" 2>&1 &
        pids+=($!)
    done
    for r in 0 1 2 3; do
        rc[r]=0
        wait "${pids[r]}" || rc[r]=$?
    done
}

while IFS=$'\t' read -r name value scope; do
    cases=$((cases + 1))
    rc=0
    env "$name=$value" timeout -k 1 10 "$info" >"$tmp/info" 2>&1 || rc=$?
    [ $rc = 124 ] || [ $rc = 137 ] && fail "stagelink_info under $name=$value ran past 10 s"
    grep -q "INVALID: $name=\"$value\" is not valid" "$tmp/info" && [ $rc = 1 ] ||
        fail "stagelink_info under $name=$value (exit $rc) does not refuse it: $(grep -m1 "^$name " -A3 "$tmp/info")"
    ranks "$name=$value"
    for r in 0 1 2 3; do
        if [ ${rc[r]} = 124 ] || [ ${rc[r]} = 137 ]; then
            fail "rank $r under $name=$value ran past 10 s: $(tail -2 "$tmp/rank$r")"
        elif [ ${rc[r]} != 0 ] && ! grep -q "$name" "$tmp/rank$r"; then
            fail "rank $r under $name=$value failed without naming it: $(tail -2 "$tmp/rank$r")"
        elif [ ${rc[r]} = 0 ] && [ "$scope" = lib ]; then
            fail "rank $r accepted $name=$value"
        fi
    done
done < <("$build/test/fault/env_invalid")
[ $cases -gt 40 ] || fail "only $cases invalid values came from the table"

# Values in the forms users write run README's example.
for setting in STAGELINK_CHUNK=1M STAGELINK_CHUNK=64KiB STAGELINK_PROGRESS_THREAD=yes \
               STAGELINK_PROGRESS_THREAD=off STAGELINK_TIMEOUT=30s STAGELINK_DEBUG=info \
               STAGELINK_MODE=FULL; do
    ranks "$setting"
    [ "${rc[*]}" = "0 0 0 0" ] && [ "$(cat "$tmp"/rank[0-3] | grep -c ": 0 wrong values")" = 4 ] ||
        fail "README's example under $setting: exit ${rc[*]}: $(tail -3 "$tmp/rank2")"
done
# sharded changes what a receive holds: never from the environment.
ranks STAGELINK_MODE=sharded
for r in 0 1 2 3; do
    [ ${rc[r]} != 0 ] && grep -q "STAGELINK_MODE=sharded: sharded changes what a receive holds" "$tmp/rank$r" ||
        fail "rank $r under STAGELINK_MODE=sharded (exit ${rc[r]}): $(tail -2 "$tmp/rank$r")"
done
# A misspelled name is named, with the nearest one, by info and by init.
env STAGELINK_MOED=full "$info" >"$tmp/info" 2>&1
grep -q "STAGELINK_MOED is not a stagelink variable; did you mean STAGELINK_MODE?" "$tmp/info" ||
    fail "stagelink_info does not name STAGELINK_MOED"
ranks STAGELINK_MOED=full
[ "$(grep -c "STAGELINK_MOED is not a stagelink variable; did you mean STAGELINK_MODE?" "$tmp/rank0")" = 1 ] &&
    [ "${rc[*]}" = "0 0 0 0" ] || fail "rank 0 under STAGELINK_MOED: exit ${rc[*]}: $(tail -3 "$tmp/rank0")"
ranks STAGELINK_MOED=full STAGELINK_WARN_UNKNOWN_ENV=off
[ "${rc[*]}" = "0 0 0 0" ] && ! grep -q MOED "$tmp"/rank[0-3] ||
    fail "STAGELINK_WARN_UNKNOWN_ENV=off: exit ${rc[*]}, $(grep -h MOED "$tmp"/rank[0-3] | head -1)"

echo "$cases invalid values swept, $failed failures"
exit $((failed > 0))
