#!/bin/sh
# README's test command: every suite with warnings as errors; valgrind
# memcheck on the unit suite and on two- and four-rank transfers; README's
# install and examples in a clean root; the Python tests from the wheel
# `pip install .` builds; README's examples under torchrun, mpirun and
# srun (test/launchers); the unit and multiproc suites
# against UCX 1.13 with CUDA where one is built, and the unit, multiproc
# and fault suites against UCX 1.22 (the libucx-cu13 wheel); tools/lab/gpu-check
# prepared and run (every GPU step skipped here, with the reason); then every suite again under
# AddressSanitizer and UBSan (but fuzz: its target is built with both
# sanitizers already; and python: the interpreter is not instrumented, so
# an instrumented libstagelink cannot be loaded into it).  Each phase
# prints its time.
set -eu
cd "$(dirname "$0")/.."
. tools/phase.sh
rm -rf build-test build-sanitize build-ucx-cuda build-ucx-wheel
phase setup meson setup build-test -Dwarning_level=3 -Dwerror=true
phase build ninja -C build-test
phase test meson test -C build-test --print-errorlogs --num-processes 2 \
    --no-suite launchers
# Skipped tests say why (the gpu suite without a GPU, netns without rights).
grep -h '^SKIP' build-test/meson-logs/testlog.txt | sort | uniq -c || true
check_install() { test/install/check_install.sh build-test || [ $? -eq 77 ]; }
phase install check_install
# The wheel pip builds, in .venv (tools/install-deps.sh makes it), with
# the Python tests run from it: torch 2.11, Megatron-Core 0.19, UCX 1.22.
phase wheel test/wheel/run.sh .venv
# README's examples under torchrun (one node and two simulated ones),
# mpirun and a one-node Slurm of the test's own, through their stores.
phase launchers meson test -C build-test --print-errorlogs --suite launchers

phase valgrind-unit meson test -C build-test --setup valgrind --print-errorlogs \
    --num-processes 2 --suite unit
phase valgrind-ranks meson test -C build-test --setup valgrind --print-errorlogs \
    --num-processes 2 minimal-host t1-p2-sweep t2-p2-scatter_gather-sweep \
    t2-p2-chunked-inflight bad-input-t1 threads-t1 idle-peers-t2-p2 \
    finalize-inflight-sends abi-host

# Against UCX with CUDA (tools/build-ucx-cuda.sh; .ci/run builds it): a
# UCX whose cuda module loads no driver here, so the plugin must stage, and
# stagelink_info must name that UCX.
ucx_cuda=$(realpath -m "${STAGELINK_UCX_CUDA:-/opt/ucx-cuda}")
ucx_cuda_pass() {
    meson setup build-ucx-cuda -Ducx_prefix="$ucx_cuda" -Dwarning_level=3 -Dwerror=true &&
    meson test -C build-ucx-cuda --print-errorlogs --num-processes 2 \
        --suite unit --suite multiproc &&
    STAGELINK_PLUGIN_PATH=build-ucx-cuda/plugin build-ucx-cuda/tools/stagelink_info |
        grep '^UCX .*at run time' | grep -q "$ucx_cuda/lib/libucp.so.*built with CUDA"
}
if [ -e "$ucx_cuda/lib/pkgconfig/ucx.pc" ]; then
    phase ucx-cuda ucx_cuda_pass
else
    echo "SKIP: no UCX with CUDA in $ucx_cuda (tools/build-ucx-cuda.sh builds one)"
fi

# Against UCX 1.22 with CUDA (the libucx-cu13 wheel in .venv, pinned in
# python/requirements-venv.txt): built with its headers, optimized as the
# wheel is (-O3, whose warnings -O0 does not give), every C suite that
# runs here but the two-node ones and the environment sweep (the table's
# parsing, swept once by the test phase), on a UCX with neither verbs nor
# a driver here, and stagelink_info must name that UCX.
ucx_wheel=$(.venv/bin/python -c 'import libucx, os; print(os.path.dirname(libucx.__file__))' 2>/dev/null || true)
ucx_wheel_pass() {
    meson setup build-ucx-wheel -Ducx_prefix="$ucx_wheel" -Dbuildtype=release \
        -Dwarning_level=3 -Dwerror=true &&
    meson test -C build-ucx-wheel --print-errorlogs --num-processes 2 \
        --suite unit --suite multiproc --suite fault --no-suite env &&
    STAGELINK_PLUGIN_PATH=build-ucx-wheel/plugin build-ucx-wheel/tools/stagelink_info |
        grep '^UCX 1\.22\..* at run time' | grep -q "$ucx_wheel/lib/libucp.so.*built with CUDA"
}
if [ -n "$ucx_wheel" ] && [ -e "$ucx_wheel/lib/pkgconfig/ucx.pc" ]; then
    phase ucx-1.22 ucx_wheel_pass
else
    echo "SKIP: no libucx wheel in .venv (tools/make-venv.sh installs it)"
fi

# tools/lab/gpu-check as the GPU machine gets it: its set prepared (under 64
# MiB) and run; without a GPU every GPU step is skipped with the reason
# and it exits 77, which here is the pass.
gpu_check_pass() {
    rm -rf build-gpu-check-set
    tools/lab/gpu-check prepare -u "$ucx_cuda" build-gpu-check-set &&
    { OUT=build-gpu-check-set/out tools/lab/gpu-check run build-gpu-check-set; rc=$?
      [ $rc = 0 ] || [ $rc = 77 ]; }
}
if [ -e "$ucx_cuda/lib/pkgconfig/ucx.pc" ] && [ -n "$ucx_wheel" ]; then
    phase gpu-check gpu_check_pass
else
    echo "SKIP: tools/lab/gpu-check needs the UCX with CUDA and .venv"
fi

phase sanitize-setup meson setup build-sanitize -Db_sanitize=address,undefined \
    -Db_lundef=false -Dwarning_level=3 -Dwerror=true
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
phase sanitize-test meson test -C build-sanitize --print-errorlogs --num-processes 2 \
    --no-suite fuzz --no-suite python --no-suite stress --no-suite launchers
# The stress harness's regression seeds under the sanitizers (the random
# ones ran in the plain pass).
sanitize_stress() {
    ninja -C build-sanitize tools/lab/stagelink_stress &&
    STAGELINK_PLUGIN_PATH=build-sanitize/plugin \
        build-sanitize/tools/lab/stagelink_stress -q -F \
        -s 1,7,11,13,14,457304281883,667193401861,954441796885,487761976442
}
phase sanitize-stress sanitize_stress
phase_summary
