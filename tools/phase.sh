# Sourced by .ci/run and test/run-all.sh: `phase NAME COMMAND...` runs the
# command, prints "phase NAME: N s" and stops the script on failure;
# `phase_summary` prints every phase's time again at the end.
case "$0" in *phase.sh) case "${1:-}" in -h|--help)
    echo "usage: . tools/phase.sh; phase NAME COMMAND...; phase_summary    (a library: sourced, not run)"
    exit 0 ;; esac ;; esac
phase_log=${phase_log:-}
phase() {
    _name=$1
    shift
    _t0=$(date +%s)
    echo "=== phase $_name: $*"
    if "$@"; then _rc=0; else _rc=$?; fi
    _dt=$(($(date +%s) - _t0))
    phase_log="$phase_log
  $_name: $_dt s"
    echo "=== phase $_name: $_dt s (exit $_rc)"
    [ "$_rc" -eq 0 ] || { phase_summary; exit "$_rc"; }
}
phase_summary() {
    echo "=== phase times:$phase_log"
}
