#!/bin/bash
# README's C and Python examples, as written, under the launchers users
# start them with, each bootstrapping through that launcher's own store:
# torchrun (static and --standalone: its agent's TCPStore on MASTER_PORT),
# torchrun and mpirun across two simulated nodes (two_node.sh), a
# Megatron-Core case under torchrun, Open MPI's mpirun and a one-node
# Slurm (srun --mpi=pmix; daemons started and stopped here) through PMIx
# (and the batch script's own process refused as no task of srun),
# the last two with MASTER_ADDR:MASTER_PORT held by another listener, so
# that only PMIx can serve.  C against BUILD's library, Python from the
# wheel installed in VENV (test/wheel/run.sh installs it first).
# Usage: test/launchers/run.sh BUILD [VENV]   SPDX-License-Identifier: MIT
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
venv=$(realpath -m "${2:-$src/.venv}")
run=$build/tools/stagelink_run
py=$venv/bin/python
tmp=$(mktemp -d)
holder=
cleanup() {
    [ -z "$holder" ] || kill "$holder" 2>/dev/null || true
    [ ! -d "$tmp/slurm" ] || slurm_stop "$tmp/slurm"
    rm -rf "$tmp"
}
trap cleanup EXIT
# meson's timeout and ^C end the test through its cleanup, daemons and all.
trap 'exit 143' TERM
trap 'exit 130' INT
. "$src/test/launchers/slurm.sh"

[ "$(id -u)" = 0 ] || { echo "SKIP: the launcher tests need root (Slurm's daemons, namespaces)"; exit 77; }
[ -x "$venv/bin/torchrun" ] || { echo "SKIP: no torchrun in $venv (tools/make-venv.sh makes it)"; exit 77; }

"$py" "$src/test/python/readme_examples.py" "$src" "$tmp"
cc -std=c11 -Wall -Werror -I "$src/include" -o "$tmp/example_c" \
    "$tmp/example.c" -L "$build/src" -Wl,-rpath,"$build/src" -lstagelink
cd "$tmp"
export STAGELINK_TIMEOUT=60 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# C runs on BUILD's plugins; Python finds the wheel's by itself.
c_env="env STAGELINK_PLUGIN_PATH=$build/plugin"
py_env="env -u STAGELINK_LIBRARY -u STAGELINK_PLUGIN_PATH -u PYTHONPATH"
failed=0 passed=0
# check NAME LINES COMMAND...: passes when the command exits 0 and printed
# LINES lines of README's examples (one a rank: "0 wrong values" from C,
# "bytes sent to the other stage" from Python), counted as matches: ranks
# share the output, and an unbuffered print writes its newline apart.
check() {
    local name=$1 lines=$2 got t0=$SECONDS
    shift 2
    if timeout 240 "$@" >"$tmp/$name.log" 2>&1 &&
       got=$(grep -o ': 0 wrong values\|: [0-9]* bytes sent to the other stage' \
             "$tmp/$name.log" | wc -l) && [ "$got" = "$lines" ]; then
        echo "ok   $name ($((SECONDS - t0)) s)"
        passed=$((passed + 1))
    else
        echo "FAIL $name ($((SECONDS - t0)) s)"
        grep -v '^W[0-9]' "$tmp/$name.log" | tail -20
        failed=$((failed + 1))
    fi
}

tr=$venv/bin/torchrun
check torchrun-c 4 $c_env "$tr" --nproc-per-node 4 --master-port "$("$run" -P)" \
    --no-python ./example_c
check torchrun-standalone-c 4 $c_env "$tr" --standalone --nproc-per-node 4 \
    --no-python ./example_c
check torchrun-standalone-py 4 $py_env "$tr" --standalone --nproc-per-node 4 \
    example.py
check torchrun-megatron-core 0 $py_env "$tr" --standalone --nproc-per-node 4 \
    -m pytest "$src/test/python/test_megatron_core.py" --tp 2
for launcher in torchrun mpirun; do
    for kind in c py; do
        check $launcher-two-node-$kind 4 "$src/test/launchers/two_node.sh" \
            "$build" "$venv" $launcher $kind
    done
done

# MASTER_ADDR:MASTER_PORT held by a listener that is not stagelink's.
coproc HOLD { exec "$py" -c 'import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
print(s.getsockname()[1], flush=True); sys.stdin.read()'; }
holder=$HOLD_PID
read -r held <&"${HOLD[0]}"
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$held

mpi="mpirun --oversubscribe -np 4 -x STAGELINK_TIMEOUT -x MASTER_ADDR -x MASTER_PORT"
check mpirun-c 4 $c_env $mpi -x STAGELINK_PLUGIN_PATH ./example_c
check mpirun-py 4 $py_env $mpi "$py" example.py

if slurm_start "$tmp/slurm"; then
    check slurm-c 4 $c_env srun --mpi=pmix -n 4 ./example_c
    check slurm-py 4 $py_env srun --mpi=pmix -n 4 "$py" example.py
    # The batch script's own process (SLURM_PROCID=0 of SLURM_NTASKS=4, no
    # srun) is no rank of 4: it refuses, naming why, and waits for nobody.
    t0=$SECONDS
    if timeout 240 sbatch --wait -n 4 -o "$tmp/batch.log" \
           --wrap "$c_env ./example_c" >/dev/null 2>&1; then
        echo "FAIL slurm-batch-script: README's C example ran as a job of 4"
        failed=$((failed + 1))
    elif grep -q "this is a Slurm batch script" "$tmp/batch.log"; then
        echo "ok   slurm-batch-script ($((SECONDS - t0)) s)"
        passed=$((passed + 1))
    else
        echo "FAIL slurm-batch-script: $(tail -3 "$tmp/batch.log")"
        failed=$((failed + 1))
    fi
else
    echo "FAIL slurm: the daemons did not start"
    failed=$((failed + 1))
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
