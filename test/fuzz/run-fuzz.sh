#!/bin/sh
# Builds the rendezvous fuzz target (fuzz_bootstrap.c: hellos, proofs and
# exchange messages, sealed or not) with clang's libFuzzer (ASan and
# UBSan on) and runs it for FUZZ_SECONDS (default 60 under CI=true, else
# 10) from the seed corpus; prints executions and coverage.  Skips (77)
# where clang cannot link libFuzzer (Debian: clang, libclang-rt-14-dev).
#   run-fuzz.sh SOURCE_ROOT WORK_DIR BOOTSTRAP_SOURCE...
# (meson passes the bootstrap layer's sources: src/meson.build's list)
# SPDX-License-Identifier: MIT
set -eu
src=$1
work=$2
shift 2
secs=${FUZZ_SECONDS:-$([ "${CI:-}" = true ] && echo 60 || echo 10)}
cc=${FUZZ_CC:-clang}
mkdir -p "$work"
if ! command -v "$cc" >/dev/null 2>&1; then
    echo "SKIP: no $cc (install clang and libclang-rt-14-dev)"
    exit 77
fi
# Whether clang can link libFuzzer at all: only that is a reason to skip.
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n);\nint LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' \
    >"$work/probe.c"
if ! "$cc" -fsanitize=fuzzer "$work/probe.c" -o "$work/probe" 2>"$work/build.log"; then
    cat "$work/build.log"
    echo "SKIP: $cc cannot link a libFuzzer target here (see above)"
    exit 77
fi
if ! "$cc" -std=c11 -D_GNU_SOURCE -O1 -g -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=undefined -I"$src/include" -I"$src/src" \
        "$src/test/fuzz/fuzz_bootstrap.c" "$@" -DSL_HAVE_PMIX=0 \
        -lcrypto -lm -ldl -o "$work/fuzz_bootstrap" 2>"$work/build.log"; then
    cat "$work/build.log"
    echo "FAIL: the fuzz target does not build (see above)"
    exit 1
fi
# libFuzzer adds what it finds to the first corpus directory: a copy.
rm -rf "$work/corpus"
cp -r "$src/test/fuzz/corpus" "$work/corpus"
# A crashing input lands in the work directory, never in the source tree.
STAGELINK_DEBUG=NONE "$work/fuzz_bootstrap" -max_total_time="$secs" -max_len=512 -use_value_profile=1 \
    -artifact_prefix="$work/" -print_final_stats=1 "$work/corpus" >"$work/fuzz.log" 2>&1 || {
    tail -n 40 "$work/fuzz.log"; echo "FAIL: the fuzzer found a crash"; exit 1; }
grep -E 'DONE|stat::number_of_executed_units|stat::peak_rss' "$work/fuzz.log"
echo "corpus: $(ls "$work/corpus" | wc -l) inputs after $secs s"
