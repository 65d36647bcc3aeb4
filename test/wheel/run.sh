#!/bin/sh
# The Python tests run from the wheel `pip install .` builds: the wheel is
# built in pip's isolated (empty) build environment from this tree and
# installed into VENV (tools/make-venv.sh makes it), then each test runs
# under the wheel's own stagelink_run with VENV's interpreter, from an
# empty directory, with no stagelink variable set: the package must find
# its library, plugins, tools and UCX by itself.  Also checks the wheel's
# contents and that STAGELINK_UCX=wheel runs on libucx-cu13's UCX.  The
# tests under megatron-core's own schedules (test_megatron_core.py, and
# test_megatron_gpt.py with its GPT model) run here, where it is installed.
# Usage: test/wheel/run.sh [VENV]
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
[ -x "${1:-$src/.venv}/bin/pip" ] || {
    echo "test/wheel/run.sh: no Python environment in ${1:-$src/.venv}; tools/make-venv.sh makes it" >&2
    exit 1
}
venv=$(cd "${1:-$src/.venv}" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps -w "$tmp/dist" "$src"
wheel=$(ls "$tmp"/dist/stagelink-*.whl)
"$venv/bin/python" - "$wheel" "$src" <<'PY'
import glob, os, sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
# Every module of the package's source, and the built parts.
want = ["stagelink/" + os.path.basename(p) for p in
        sorted(glob.glob(os.path.join(sys.argv[2], "python/stagelink/*.py")))]
want += ["stagelink/_lib/libstagelink.so.1",
        "stagelink/_lib/stagelink/libstagelink-ucx.so",
        "stagelink/_bin/stagelink_run", "stagelink/_bin/stagelink_info"]
missing = [w for w in want if w not in names]
if not any(n.startswith("stagelink/_calls.") and n.endswith(".so") for n in names):
    missing.append("stagelink/_calls (the compiled post and wait)")
if missing:
    sys.exit("the wheel lacks %s" % ", ".join(missing))
print("wheel %s: %d files" % (sys.argv[1].rsplit("/", 1)[1], len(names)))
PY
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
    --force-reinstall "$wheel"
mkdir "$tmp/run"
cd "$tmp/run"
clean="env -u STAGELINK_LIBRARY -u STAGELINK_PLUGIN -u STAGELINK_PLUGIN_PATH
       -u PYTHONPATH -u LD_LIBRARY_PATH STAGELINK_TIMEOUT=60"
py=$venv/bin/python
# The limit is a hang guard: a self-built CPython (a clean root's) runs the
# Megatron-Core tests several times slower than pyenv's (356 s against 60).
run() { $clean "$venv/bin/stagelink_run" -T 900 "$@"; }
failed=0
check() {
    name=$1
    shift
    if "$@" >"$tmp/$name.log" 2>&1; then
        echo "ok   $name"
    else
        echo "FAIL $name"
        tail -20 "$tmp/$name.log"
        failed=1
    fi
}
# The Python tests run under pytest (test/python/conftest.py), in every
# rank of a job.
pytest="$py -m pytest"
tests=$src/test/python
check module $clean $pytest "$tests/test_module.py" --project-version \
    "$("$py" -c 'import stagelink; print(stagelink.__version__)')"
for t in 1 2; do
    n=$((2 * t))
    check binding-t$t run -n $n -- $pytest "$tests/test_binding.py"
    check safety-t$t run -n $n -- $pytest "$tests/test_safety.py"
    check torch-store-t$t run -n $n -- $pytest "$tests/test_torch_store.py"
    check torch-example-t$t run -n $n -- "$py" "$src/python/examples/two_stage_torch.py"
    check megatron-t$t run -n 4 -- $pytest "$tests/test_megatron.py" --tp $t
    check megatron-core-p$((4 / t))-t$t run -n 4 -- $pytest \
        "$tests/test_megatron_core.py" --tp $t
    check megatron-gpt-p$((4 / t))-t$t run -n 4 -- $pytest \
        "$tests/test_megatron_gpt.py" --tp $t
done
check megatron-core-p2-t1 run -n 2 -- $pytest "$tests/test_megatron_core.py"
check megatron-core-p2-t1-cp2 run -n 4 -- $pytest \
    "$tests/test_megatron_core.py" --cp 2
# Two simulated nodes, one stage of t = 2 each: the boundary crosses the
# link (needs root for the namespaces: skipped, saying so, without).
two_node() {
    $clean STAGELINK_RANKS_PER_NODE=2 "$src/tools/lab/stagelink_two_node.sh" \
        -R "$venv/bin/stagelink_run" -N 2 run -- "$@"
}
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
    check megatron-core-two-node-t2 two_node $pytest \
        "$tests/test_megatron_core.py" --tp 2
else
    echo "skip megatron-core-two-node-t2 (network namespaces need root and ip)"
fi
# Which UCX: the wheel's when asked (and by default here: no InfiniBand).
ucx_is() {
    $clean STAGELINK_UCX=$1 "$venv/bin/stagelink_info" >"$tmp/info-$1" 2>&1 &&
        grep -q "^UCX $2" "$tmp/info-$1"
}
check ucx-wheel ucx_is wheel '1\.22\.[0-9]* at run time (.*/libucx/lib/libucp'
check ucx-wheel-any-case ucx_is WHEEL '1\.22\.[0-9]* at run time (.*/libucx/lib/libucp'
# A value it does not know: one sentence, no traceback; a forced UCX that
# another libucp.so.0 already in the process would overrule: refused.
ucx_refused() {
    ! $clean STAGELINK_UCX=bogus "$venv/bin/stagelink_info" >"$tmp/info-bogus" 2>&1 &&
        grep -q 'STAGELINK_UCX="bogus" is not valid; use one of auto, system or wheel' "$tmp/info-bogus" &&
        ! grep -q Traceback "$tmp/info-bogus" &&
        $clean STAGELINK_UCX=wheel "$py" -c '
import ctypes, stagelink
ctypes.CDLL("libucp.so.0", mode=ctypes.RTLD_GLOBAL)  # the system one
try:
    stagelink._lib.library()
except stagelink.StagelinkError as e:
    assert "is loaded in this process already" in str(e), e
else:
    raise SystemExit("STAGELINK_UCX=wheel ran on the system UCX")'
}
check ucx-refused ucx_refused
check ucx-system ucx_is system '[0-9.]* at run time (/usr/lib'
check binding-t2-system-ucx env STAGELINK_UCX=system \
    $clean "$venv/bin/stagelink_run" -T 240 -n 4 -- $pytest "$tests/test_binding.py"
exit $failed
