#!/bin/sh
# Runs meson test suites and single tests N times each and prints every
# test's pass count ("peer-kill 20/20"); a SKIP is counted apart
# ("skipped") and fails nothing.  Exit 1 when any run of any test failed,
# timed out or did not run.
usage() {
    cat >&2 <<'EOF'
usage: test/repeat.sh [SUITE]... [-t TEST]... [-n N] [-C BUILD_DIR] [-- MESON_TEST_ARGS]
  SUITE  every test of that meson suite      -t  one test by name (repeatable)
  -n     runs of each test (default 10)      -C  build directory (default: build-test
                                                 in the source tree, as test/run-all.sh)
  e.g.   test/repeat.sh fault -t threads-t1 -n 20 -C build -- --num-processes 1
EOF
    exit 2
}
set -eu
dir=$(dirname "$0")/../build-test n=10 suites='' tests=''
while [ $# -gt 0 ]; do
    case $1 in
    -C) [ $# -ge 2 ] || usage; dir=$2; shift 2 ;;
    -n) [ $# -ge 2 ] || usage; n=$2; shift 2 ;;
    -t) [ $# -ge 2 ] || usage; tests="$tests $2"; shift 2 ;;
    --) shift; break ;;
    -*) usage ;;
    *) suites="$suites $1"; shift ;;
    esac
done
case $n in '' | *[!0-9]* | 0*) usage ;; esac
[ -n "$suites$tests" ] || usage
[ -d "$dir/meson-logs" ] || { echo "repeat.sh: $dir is no meson build directory" >&2; exit 2; }
# A suite's tests by name: meson lists "stagelink:fault / peer-kill".
for s in $suites; do
    listed=$(meson test -C "$dir" --list --suite "$s" 2>/dev/null | sed -n 's|^.* / ||p')
    [ -n "$listed" ] || { echo "repeat.sh: no test in suite $s of $dir" >&2; exit 2; }
    tests="$tests $listed"
done
# shellcheck disable=SC2086 # $tests: names, one word each
tests=$(printf '%s\n' $tests | awk '!seen[$0]++')
# One meson test per round (meson's --repeat stops at the first failure),
# each with its own log (meson-logs/repeat-PID-I.*, so that another meson
# test in the same build directory cannot overwrite it), gathered in
# repeat-PID.json, one line per run of a test.  Built once, before round 1.
log=repeat-$$ status=0 i=0 rebuild=''
: >"$dir/meson-logs/$log.json"
while [ "$i" -lt "$n" ]; do
    i=$((i + 1))
    echo "round $i of $n" >&2
    # shellcheck disable=SC2086
    meson test -C "$dir" $rebuild --logbase "$log-$i" "$@" $tests >/dev/null || true
    # (a --setup names its logs repeat-PID-I-SETUP.json)
    cat "$dir/meson-logs/$log-$i.json" "$dir/meson-logs/$log-$i"-*.json \
        >>"$dir/meson-logs/$log.json" 2>/dev/null || true
    rebuild=--no-rebuild
done
# shellcheck disable=SC2086
python3 - "$dir/meson-logs/$log.json" "$n" $tests <<'EOF' || status=$?
import json, sys
path, n, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = {name: [] for name in names}
try:
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            runs.setdefault(r["name"].split(" / ")[-1], []).append(r["result"])
except FileNotFoundError:
    print(f"repeat.sh: meson wrote no {path}", file=sys.stderr)
failed = False
for name in names:
    res = runs[name]
    ok = sum(r in ("OK", "EXPECTEDFAIL") for r in res)
    notes = [f"{res.count(r)} {'skipped' if r == 'SKIP' else r}"
             for r in sorted(set(res) - {"OK", "EXPECTEDFAIL"})]
    if len(res) < n:
        notes.append(f"{n - len(res)} did not run")
    failed |= ok + res.count("SKIP") < n
    print(f"{name} {ok}/{n}" + (f" ({', '.join(notes)})" if notes else ""))
sys.exit(1 if failed else 0)
EOF
echo "logs: $dir/meson-logs/$log-*.txt"
exit $status
