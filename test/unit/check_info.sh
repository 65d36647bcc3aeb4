#!/bin/sh
# stagelink_info on this machine (no RDMA device, no GPU: a report, exit 0),
# with no plugin to load (exit 1, the plugins it found), with -c, on the fake DGX tree (the rails), and
# with and without a job secret (the rendezvous's mode).
#   check_info.sh STAGELINK_INFO TOPO_DIR
# SPDX-License-Identifier: MIT
set -eu
info=$1
topo=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
has() { grep -q -- "$1" "$out" || fail "no \"$1\" in the report"; }

"$info" >"$out" 2>/dev/null || fail "stagelink_info exited with $?"
sed -n '1,12p' "$out"
has "^build: CUDA .* libibverbs"
has "^RDMA devices: "
has "^GPUs: "
has "local rank 0: "
has "^# plugin: ucx"
has "^UCX [0-9.]* at run time (/.*/libucp\.so[.0-9]*, built with.* CUDA)"
has "^UCX transports"
has "^UCX memory types: host"
has "^STAGELINK_SYSFS_ROOT"
if grep -q "^RDMA devices: no RDMA devices" "$out"; then
    has "local rank 0: UCX chooses"
fi

rc=0
STAGELINK_PLUGIN=nosuch "$info" >"$out" 2>/dev/null || rc=$?
[ $rc = 1 ] || fail "stagelink_info without a plugin exited with $rc, not 1"
has "^# plugin: none loaded: plugin \"nosuch\" not found"
has "^# plugins found:"
has "/libstagelink-ucx.so$"
rc=0
STAGELINK_PLUGIN_PATH=/nonexistent "$info" >"$out" 2>/dev/null || rc=$?
[ $rc = 1 ] || fail "stagelink_info with a missing STAGELINK_PLUGIN_PATH exited with $rc, not 1"
has "^# plugin: none loaded: STAGELINK_PLUGIN_PATH=\"/nonexistent\" is not valid"
has "^    INVALID: STAGELINK_PLUGIN_PATH="
for opt in -h --help --version; do
    "$info" $opt >"$out" 2>&1 || fail "stagelink_info $opt exited with $?"
done
has "^stagelink_info [0-9]"
# Where a CUDA build finds no driver it says so (a build without CUDA
# reports no GPU runtime at all).
if "$info" | grep -q "^build: CUDA yes" && ! ldconfig -p | grep -q "libcuda\.so\.1 "; then
    "$info" >"$out" 2>/dev/null
    has "no CUDA driver: libcuda.so.1 cannot be opened"
fi

"$info" -c >"$out" 2>/dev/null
has "^STAGELINK_TIMEOUT"
grep -q "^RDMA devices" "$out" && fail "-c printed more than the configuration"

STAGELINK_SYSFS_ROOT=$topo/dgx-h100 "$info" >"$out" 2>/dev/null
has "^RDMA devices: sysfs tree"
has "mlx5_8 *port 1 down"
has "mlx5_8 .*; left out: 100 Gb/s, below STAGELINK_NIC_MIN_GBPS=auto (200 Gb/s)"
has "^GPUs: 8"
has "local rank 2: mlx5_3:1 (GPU 2 (0000:23:00.0): 2 NICs on the same PCIe switch, NIC 0"
has "local rank 7: mlx5_6:1"

# The rendezvous's mode, and never the secret itself.
env -u STAGELINK_JOB_SECRET -u STAGELINK_JOB_SECRET_FILE "$info" >"$out" 2>/dev/null
has "^rendezvous: unauthenticated (no STAGELINK_JOB_SECRET"
STAGELINK_JOB_SECRET=info-check-secret-42 "$info" >"$out" 2>/dev/null
has "^rendezvous: authenticated (mutual HMAC-SHA256 .*secret from STAGELINK_JOB_SECRET, fingerprint [0-9a-f]\{16\} for job key [0-9a-f]\{16\})"
has "^STAGELINK_JOB_SECRET *= (set, not shown)"
grep -q "info-check-secret-42" "$out" && fail "stagelink_info printed the job secret"
STAGELINK_JOB_SECRET=x STAGELINK_JOB_SECRET_FILE=/x "$info" >"$out" 2>/dev/null
has "^rendezvous: refused at init: both STAGELINK_JOB_SECRET and"

STAGELINK_SYSFS_ROOT=$topo/empty "$info" >"$out" 2>/dev/null
has "^RDMA devices: no RDMA devices in the sysfs tree"
has "local rank 0: UCX chooses"
echo "stagelink_info: all reports as expected"
