#!/bin/bash
# stagelink_run supervising as srun and torchrun do: the first failing
# rank's exit code, a signal's 128 + N, the others ended (SIGTERM first, so
# a rank's handler runs and its buffered output survives; SIGKILL after -G
# for one that ignores it), SIGTERM to stagelink_run forwarded, no rank nor
# a rank's child left after it ends (also one in a session of its own, and
# after ranks that succeeded), none when it is SIGKILLed, -l labels,
# -T's deadline, malformed numbers refused.  Every wait is on a marker file
# or a process's end, each bounded.
# Usage: test/launchers/stagelink_run.sh STAGELINK_RUN   SPDX-License-Identifier: MIT
set -u
run=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0 passed=0
ok() { echo "ok   $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1"; failed=$((failed + 1)); }
# expect NAME RC COMMAND...: the command exits with RC.
expect() {
    local name=$1 want=$2 got
    shift 2
    timeout 60 "$@" >"$tmp/out" 2>&1
    got=$?
    if [ "$got" = "$want" ]; then ok "$name (exit $got)"; else
        bad "$name: exit $got, want $want"; cat "$tmp/out"; fi
}
# await FILE...: each file exists (a rank's marker), within 30 s.
await() {
    local f i
    for f in "$@"; do
        for i in $(seq 300); do [ -e "$f" ] && break; sleep 0.1; done
        [ -e "$f" ] || { echo "no $f after 30 s"; return 1; }
    done
}
# gone PID...: true when none of these processes is left, within 10 s (a
# SIGKILLed parent's children get their parent-death signal at once).
gone() {
    local p
    for p in "$@"; do timeout 10 tail --pid="$p" -f /dev/null || return 1; done
}

expect exit-code 3 "$run" -n 2 -- sh -c 'exit 3'
expect first-failing-rank 5 "$run" -n 3 -- \
    sh -c '[ "$RANK" = 1 ] && exit 5; exec sleep 100'
expect signal-128-plus-n 138 "$run" -n 2 -- \
    sh -c '[ "$RANK" = 0 ] && kill -USR1 $$; exec sleep 100'
expect deadline-124 124 "$run" -n 2 -T 1 -- sleep 100
for arg in "-T abc" "-T 1x" "-G -1" "-n 0" "-n 2x"; do
    # shellcheck disable=SC2086
    expect "refused $arg" 2 "$run" $arg -- true
done
# Part of a job (-w past -n) meets the rest only at an address and port
# given alike on every node: without them it is refused, not left waiting.
expect "part of a job without MASTER_ADDR" 2 env -u MASTER_ADDR -u MASTER_PORT \
    "$run" -n 2 -w 4 -- true
expect "part of a job without MASTER_PORT" 2 env -u MASTER_PORT \
    MASTER_ADDR=127.0.0.1 "$run" -n 2 -o 2 -w 4 -- true

# -l: every line labelled with its rank, and nothing else printed.
timeout 60 "$run" -n 2 -l -- sh -c 'echo a; echo b' >"$tmp/l" 2>&1
if [ "$(sort "$tmp/l" | tr '\n' ' ')" = "0: a 0: b 1: a 1: b " ]; then
    ok label; else bad "label: $(tr '\n' '|' <"$tmp/l")"; fi

# A failing rank: the others get SIGTERM, and their handlers run, so what a
# rank buffered is flushed (here the handler's line).
rm -f "$tmp"/up.*
timeout 60 "$run" -n 3 -- sh -c 'trap "echo rank $RANK flushed; exit 0" TERM
    [ "$RANK" = 2 ] && { while [ ! -e '"$tmp"'/up.0 ] || [ ! -e '"$tmp"'/up.1 ]; do
        sleep 0.1; done; exit 7; }
    touch '"$tmp"'/up.$RANK; sleep 100 & wait' >"$tmp/t" 2>&1
rc=$?
if [ $rc = 7 ] && grep -q "rank 0 flushed" "$tmp/t" && grep -q "rank 1 flushed" "$tmp/t"; then
    ok "others get SIGTERM first"; else bad "others get SIGTERM first: exit $rc"; cat "$tmp/t"; fi

# SIGTERM to stagelink_run: forwarded; a rank that ignores it, and its
# child, are SIGKILLed after -G; none is left when stagelink_run returns.
rm -f "$tmp"/pid.*
"$run" -n 2 -G 1 -- sh -c 'trap "" TERM; sleep 100 & echo $! >'"$tmp"'/pid.child$RANK
    echo $$ >'"$tmp"'/pid.$RANK; wait; wait' >"$tmp/s" 2>&1 &
sup=$!
if await "$tmp"/pid.0 "$tmp"/pid.1 "$tmp"/pid.child0 "$tmp"/pid.child1; then
    pids=$(cat "$tmp"/pid.*)
    kill -TERM $sup
    wait $sup
    rc=$?
    left=$(for p in $pids; do kill -0 "$p" 2>/dev/null && echo "$p"; done)
    if [ -z "$left" ] && [ $rc != 0 ]; then ok "SIGTERM leaves no rank (exit $rc)"
    else bad "SIGTERM leaves no rank: exit $rc, left: $left"; fi
else
    kill -KILL $sup; bad "SIGTERM leaves no rank: ranks did not start"
fi

# Ranks that end well but leave processes behind, one of them in a session
# of its own: ended, and reaped before stagelink_run returns 0.
rm -f "$tmp"/pid.*
timeout 60 "$run" -n 2 -G 1 -- sh -c 'sleep 100 & echo $! >'"$tmp"'/pid.bg$RANK
    setsid sleep 100 & echo $! >'"$tmp"'/pid.sid$RANK' >"$tmp/b" 2>&1
rc=$?
left=$(for p in $(cat "$tmp"/pid.*); do kill -0 "$p" 2>/dev/null && echo "$p"; done)
if [ $rc = 0 ] && [ "$(ls "$tmp"/pid.* | wc -l)" = 4 ] && [ -z "$left" ]; then
    ok "leftover processes ended"; else bad "leftover processes ended: exit $rc, left: $left"; cat "$tmp/b"; fi

# SIGKILL to stagelink_run: the parent-death signal ends every rank.
rm -f "$tmp"/pid.*
"$run" -n 2 -- sh -c 'echo $$ >'"$tmp"'/pid.$RANK; exec sleep 100' >/dev/null 2>&1 &
sup=$!
if await "$tmp"/pid.0 "$tmp"/pid.1; then
    pids=$(cat "$tmp"/pid.*)
    kill -KILL $sup
    wait $sup 2>/dev/null
    # shellcheck disable=SC2086
    if gone $pids; then ok "SIGKILL leaves no rank"; else
        bad "SIGKILL leaves no rank: $(ps -o pid,cmd -p "${pids//$'\n'/,}")"; fi
else
    kill -KILL $sup; bad "SIGKILL leaves no rank: ranks did not start"
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
