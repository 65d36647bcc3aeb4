#!/bin/bash
# stagelink_perftest's own tests: argument errors give usage and exit 2; a
# corrupted byte fails the data check (exit 1, with the offset); every test
# kind gives its CSV header and rows whose times are ordered (min <= p50 <=
# p99 <= max, avg <= max) and --json that parses; ucx_perftest's form: a
# server on -p PORT and a client naming it, the client's options ruling
# and the client printing; the stage's time is its slowest rank's;
# stagelink_pipeline's CSV and JSON.
#   check_perftest.sh BUILD_DIR PYTHON
set -u
run=$1/tools/stagelink_run
perf=$1/tools/stagelink_perftest
py=$2
tmp=$(mktemp -d)
srv=
trap '[ -z "$srv" ] || kill "$srv" 2>/dev/null; rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

for args in "-t nonsense" "-t 2" "-s 1X" "-m gpu" "--mode fastest" "-n 0" "-g 0" \
            "--microbatches 0" "-k stream" "-c 1" "a b"; do
    # shellcheck disable=SC2086
    timeout 10 "$perf" $args >/dev/null 2>"$tmp/err"
    rc=$?
    [ $rc = 2 ] && grep -q usage "$tmp/err" || fail "'$args' gave exit $rc, not 2 with usage"
done
# A SERVER under a launcher's variables is a contradiction, not a hang.
RANK=0 WORLD_SIZE=2 timeout 10 "$perf" 127.0.0.1 >/dev/null 2>"$tmp/err"
rc=$?
[ $rc = 2 ] && grep -q "launcher's variables are set" "$tmp/err" || fail "SERVER under RANK: exit $rc: $(cat "$tmp/err")"

"$run" -n 2 -T 60 -- "$perf" -s 4099 -n 2 -w 0 --corrupt >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 1 ] || fail "--corrupt exited with $rc, not 1"
grep -q "differs at byte 2049" "$tmp/err" || fail "--corrupt did not name byte 2049: $(cat "$tmp/err")"

# ordered FILE FIRST_TIME_COLUMN [MIN]: the rows' p50, p99, avg, max
# columns: p50 <= p99 <= max, avg <= max, and p50 > MIN (default 0).
ordered() {
    awk -F, -v c="$2" -v lo="${3:-0}" 'NR > 1 { if (!($(c) <= $(c + 1) && $(c + 1) <= $(c + 3) &&
                                     $(c + 2) <= $(c + 3) && $(c) > lo)) bad++; n++ }
                       END { exit !(n > 0 && bad == 0) }' "$1"
}
header='size,test,mode,t,p50_us,p99_us,avg_us,max_us,algbw_GBps,stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,xnode_B_job,cpu_s,cpu_s_per_GB,wrong'
for kind in boundary shard gather stream duplex pipeline; do
    extra=
    [ $kind = pipeline ] && extra="--microbatches 4 --chunks 2"
    # shellcheck disable=SC2086
    "$run" -n 4 -T 60 -- "$perf" -g 2 -t $kind $extra -s 0,4K,1M -n 5 -w 1 --csv \
        >"$tmp/$kind.csv" 2>"$tmp/err" || fail "-t $kind failed: $(cat "$tmp/err")"
    want=$header
    [ $kind = pipeline ] && want=$header,blocked_us
    [ "$(head -n 1 "$tmp/$kind.csv")" = "$want" ] || fail "-t $kind CSV header: $(head -n 1 "$tmp/$kind.csv")"
    [ "$(awk -F, 'NR > 1 && NF >= 16 && $4 == 2 && $16 == 0 && $14 > 0' "$tmp/$kind.csv" | wc -l)" = 3 ] ||
        fail "-t $kind: want 3 rows, t = 2, wrong = 0, CPU time > 0: $(cat "$tmp/$kind.csv")"
    # The gather is scatter_gather less the shard's median: at small sizes
    # within the noise of zero, either side.
    ordered "$tmp/$kind.csv" 5 "$([ $kind = gather ] && echo -1e9 || echo 0)" ||
        fail "-t $kind: times out of order: $(cat "$tmp/$kind.csv")"
done
# With 2 ms of compute per batch the step takes at least 2 ms a
# microbatch, and the time blocked in waits is part of the step.
"$run" -n 4 -T 60 -- "$perf" -g 2 -t pipeline --microbatches 4 -s 64K --compute-us 2000 -n 2 -w 1 --csv \
    >"$tmp/pipe" 2>"$tmp/err" || fail "-t pipeline --compute-us failed: $(cat "$tmp/err")"
[ "$(awk -F, 'NR > 1 && $5 >= 4 * 2000 && $17 >= 0 && $17 < $7' "$tmp/pipe" | wc -l)" = 1 ] ||
    fail "-t pipeline --compute-us 2000 rows: $(cat "$tmp/pipe")"

# comm_init itself, with and without a secret, as text, CSV and JSON.
for u in -U ""; do
    "$run" -n 4 -T 60 $u -- "$perf" -g 2 -t init -n 3 -w 1 >"$tmp/init" 2>"$tmp/err" ||
        fail "-t init failed: $(cat "$tmp/err")"
    grep -q "(bootstrap tcp, $([ -n "$u" ] && echo unauthenticated || echo 'with a job secret')), 3 rounds" "$tmp/init" &&
        [ "$(awk 'NF == 6 && $1 > 0 && $1 <= $2 && $2 <= $5 && $4 <= $1' "$tmp/init" | wc -l)" = 1 ] ||
        fail "-t init ${u:-with a secret}: $(cat "$tmp/init")"
done
"$run" -n 4 -T 60 -- "$perf" -g 2 -t init -n 3 -w 1 --csv >"$tmp/init.csv" 2>"$tmp/err"
[ "$(head -n 1 "$tmp/init.csv")" = test,t,ranks,bootstrap,sealed,rounds,p50_ms,p99_ms,avg_ms,min_ms,max_ms,cpu_s ] &&
    [ "$(awk -F, 'NR == 2 && $1 == "init" && $4 == "tcp" && $5 == 1 && $7 <= $8 && $8 <= $11' "$tmp/init.csv" | wc -l)" = 1 ] ||
    fail "-t init --csv: $(cat "$tmp/init.csv")"
for kind in init stream; do
    "$run" -n 4 -T 60 -- "$perf" -g 2 -t $kind -s 4K -n 3 -w 1 --json >"$tmp/$kind.json" 2>"$tmp/err" &&
        "$py" -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["t"] == 2 and d["rows"], d' \
            "$tmp/$kind.json" || fail "-t $kind --json: $(cat "$tmp/$kind.json" "$tmp/err")"
done

# ucx_perftest's form: the server waits, the client's options rule and it
# prints the JSON; the server prints no result.
port=$((14000 + $$ % 1000))
timeout 60 "$perf" -p $port >"$tmp/server" 2>"$tmp/server.err" &
srv=$!
timeout 60 "$perf" -p $port -t stream -s 4K,64K -n 4 -w 1 --json 127.0.0.1 >"$tmp/client.json" 2>"$tmp/client.err" ||
    fail "the client failed: $(cat "$tmp/client.err")"
wait $srv || fail "the server failed: $(cat "$tmp/server.err")"
srv=
"$py" -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["test"] == "stream" and d["t"] == 1 and d["ranks"] == 2, d
assert [r["size"] for r in d["rows"]] == [4096, 65536], d
assert all(r["min_us"] <= r["p50_us"] <= r["p99_us"] <= r["max_us"] and r["wrong"] == 0 for r in d["rows"]), d' \
    "$tmp/client.json" || fail "the client's JSON: $(cat "$tmp/client.json")"
[ -s "$tmp/server" ] && fail "the server printed: $(cat "$tmp/server")"
grep -q "waiting for a client on port $port" "$tmp/server.err" || fail "the server did not say it waits: $(cat "$tmp/server.err")"
# With a job secret, as any rank takes it; a client with another is refused.
STAGELINK_JOB_SECRET=perftest-secret-1 timeout 60 "$perf" -p $port >"$tmp/server" 2>"$tmp/server.err" &
srv=$!
STAGELINK_JOB_SECRET=perftest-secret-1 timeout 60 "$perf" -p $port -s 4K -n 2 -w 0 --csv 127.0.0.1 \
    >"$tmp/client.csv" 2>"$tmp/client.err" || fail "the client with the secret failed: $(cat "$tmp/client.err")"
wait $srv || fail "the server with the secret failed: $(cat "$tmp/server.err")"
srv=
[ "$(awk -F, 'NR == 2 && $1 == 4096 && $2 == "boundary"' "$tmp/client.csv" | wc -l)" = 1 ] ||
    fail "the client's CSV with a secret: $(cat "$tmp/client.csv")"
STAGELINK_TIMEOUT=5 STAGELINK_JOB_SECRET=perftest-secret-1 timeout 30 "$perf" -p $port >"$tmp/server" 2>"$tmp/server.err" &
srv=$!
STAGELINK_TIMEOUT=5 STAGELINK_JOB_SECRET=another-secret timeout 30 "$perf" -p $port -s 4K -n 2 127.0.0.1 \
    >"$tmp/client.csv" 2>"$tmp/client.err" && fail "a client with another secret ran: $(cat "$tmp/client.csv")"
grep -qi "secret" "$tmp/client.err" || fail "the refused client did not name the secret: $(cat "$tmp/client.err")"
wait $srv && fail "the server ran with a client of another secret"
srv=
# A server that cannot do what the client asks says so to the client,
# which does not wait for it: -m cuda on a machine without a GPU.
if ! "$1/tools/stagelink_info" 2>/dev/null | grep -q "^GPU: [0-9]* CUDA device"; then
    timeout 30 "$perf" -p $port >"$tmp/server" 2>"$tmp/server.err" &
    srv=$!
    timeout 30 "$perf" -p $port -m cuda -s 4K -n 2 127.0.0.1 >"$tmp/client.csv" 2>"$tmp/client.err"
    rc=$?
    wait $srv
    srv=
    { [ $rc = 77 ] || { [ $rc = 1 ] && grep -q "the server refused: -m cuda" "$tmp/client.err"; }; } ||
        fail "-m cuda against a server without a GPU: exit $rc: $(cat "$tmp/client.err")"
fi

# stagelink_pipeline's CSV and JSON: a row a rank and mode (sharded: the
# scatter_gather schedule's link alone).
pipe=${perf%/*}/stagelink_pipeline
"$run" -n 4 -T 60 -- "$pipe" -t 2 -m 4 -s 64K -i 1 --csv >"$tmp/pipe.csv" 2>"$tmp/err" ||
    fail "stagelink_pipeline --csv: $(cat "$tmp/err")"
[ "$(head -n 1 "$tmp/pipe.csv")" = rank,mode,schedule,p,t,d,v,microbatches,size,compute_us,steps,step_ms,bubble_pct,wait_ms,xnode_B_per_step ] &&
    [ "$(awk -F, 'NR > 1 && NF == 15 && $12 > 0' "$tmp/pipe.csv" | wc -l)" = 12 ] ||
    fail "stagelink_pipeline --csv: $(cat "$tmp/pipe.csv")"
"$run" -n 4 -T 60 -- "$pipe" -t 2 -m 4 -s 64K -i 1 --json >"$tmp/pipe.json" 2>"$tmp/err" &&
    "$py" -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 12 and {r["mode"] for r in rows} == {"full", "scatter_gather", "sharded"}, rows' \
        "$tmp/pipe.json" || fail "stagelink_pipeline --json: $(cat "$tmp/pipe.json" "$tmp/err")"

[ $failed = 0 ] && echo "perftest checks passed"
exit $failed
