#!/bin/sh
# stagelink_perftest's own tests: argument errors give usage and exit 2; a
# corrupted byte fails the data check (exit 1, with the offset); --csv gives
# the documented header and numeric rows.
#   check_perftest.sh BUILD_DIR
set -u
run=$1/tools/stagelink_run
perf=$1/tools/stagelink_perftest
failed=0
fail() { echo "FAIL: $*"; failed=1; }

for args in "-k nonsense" "-s 1X" "-m gpu" "-M fastest" "-n 0" "-B 0" "extra"; do
    # shellcheck disable=SC2086
    "$perf" -t 1 $args >/dev/null 2>"$1/perftest.err"
    rc=$?
    [ $rc = 2 ] && grep -q usage "$1/perftest.err" || fail "'$args' gave exit $rc, not 2 with usage"
done

"$run" -n 2 -T 60 -- "$perf" -t 1 -s 4099 -n 2 -w 0 --corrupt >"$1/perftest.out" 2>"$1/perftest.err"
rc=$?
[ $rc = 1 ] || fail "--corrupt exited $rc, not 1"
grep -q "differs at byte 2049" "$1/perftest.err" || fail "--corrupt did not name byte 2049: $(cat "$1/perftest.err")"

"$run" -n 4 -T 60 -- "$perf" -t 2 -s 0,1K,65537 -n 2 -w 1 --csv >"$1/perftest.csv" 2>"$1/perftest.err" ||
    fail "--csv run failed: $(cat "$1/perftest.err")"
head -n 1 "$1/perftest.csv" | grep -qx 'size,mode,t,p50_us,avg_us,max_us,algbw_GBps,stage_B_per_rank,xnode_B_per_rank,gather_B_per_rank,wrong' ||
    fail "CSV header: $(head -n 1 "$1/perftest.csv")"
rows=$(awk -F, 'NR > 1 && NF == 11 && $1 ~ /^[0-9]+$/ && $4 ~ /^[0-9.]+$/ && $11 == 0' "$1/perftest.csv" | wc -l)
[ "$rows" = 3 ] || fail "expected 3 numeric CSV rows with wrong=0, got $rows: $(cat "$1/perftest.csv")"

"$run" -n 4 -T 60 -- "$perf" -t 2 -k pipeline -B 4 -V 2 -s 4K,1M -n 2 -w 1 --csv >"$1/perftest.pipe" 2>"$1/perftest.err" ||
    fail "-k pipeline failed: $(cat "$1/perftest.err")"
[ "$(awk -F, 'NR > 1 && $5 > 0 && NF == 12' "$1/perftest.pipe" | wc -l)" = 2 ] || fail "-k pipeline rows: $(cat "$1/perftest.pipe")"
# With 2 ms of compute per batch the step takes at least 2 ms a
# microbatch, and the time blocked in waits is part of the step.
"$run" -n 4 -T 60 -- "$perf" -t 2 -k pipeline -B 4 -s 64K -P 2000 -n 2 -w 1 --csv >"$1/perftest.pipe" 2>"$1/perftest.err" ||
    fail "-k pipeline -P failed: $(cat "$1/perftest.err")"
[ "$(awk -F, 'NR > 1 && $5 >= 4 * 2000 && $12 >= 0 && $12 < $5' "$1/perftest.pipe" | wc -l)" = 1 ] ||
    fail "-k pipeline -P 2000 rows: $(cat "$1/perftest.pipe")"

# comm_init itself: a median over 3 rounds, with and without a secret.
for u in -U ""; do
    "$run" -n 4 -T 60 $u -- "$perf" -t 2 -k init -n 3 -w 1 >"$1/perftest.init" 2>"$1/perftest.err" ||
        fail "-k init failed: $(cat "$1/perftest.err")"
    grep -q "(bootstrap tcp, $([ -n "$u" ] && echo unauthenticated || echo 'with a job secret')), 3 rounds" "$1/perftest.init" &&
        [ "$(awk 'NF == 3 && $1 > 0 && $1 >= $2 && $1 <= $3' "$1/perftest.init" | wc -l)" = 1 ] ||
        fail "-k init ${u:-with a secret}: $(cat "$1/perftest.init")"
done

# Both ways at once, every received tensor of the last round checked.
"$run" -n 4 -T 60 -- "$perf" -t 2 -k duplex -s 4K,1M -n 4 -w 1 --csv >"$1/perftest.duplex" 2>"$1/perftest.err" ||
    fail "-k duplex failed: $(cat "$1/perftest.err")"
[ "$(awk -F, 'NR > 1 && $5 > 0 && $11 == 0' "$1/perftest.duplex" | wc -l)" = 2 ] || fail "-k duplex rows: $(cat "$1/perftest.duplex")"

[ $failed = 0 ] && echo "perftest checks passed"
exit $failed
