#!/bin/sh
# Installs what stagelink needs to build and test on Debian 12, as root:
# Debian's packages (the C path: meson install, Debian's python3 with its
# headers, for the package's compiled part, and its torch), then the
# repository's Python environment, .venv, from the pins of
# python/requirements-venv.txt with stagelink's own wheel in it
# (tools/make-venv.sh; STAGELINK_NO_VENV=1 leaves it out).  dpkg-dev: meson
# asks its dpkg-architecture for the multiarch libdir the loader searches.
# libpmix-dev, slurm-wlm and munge: the launcher tests start srun and mpirun
# (PMIx) on this machine.
set -eu
case "${1:-}" in
-h|--help)
    echo "usage: tools/install-deps.sh    as root: Debian 12's packages, then .venv (tools/make-venv.sh;"
    echo "       STAGELINK_NO_VENV=1 leaves .venv out).  Takes no argument; -h changes nothing."
    exit 0 ;;
"") ;;
*) echo "install-deps.sh: no argument is taken (got \"$1\"); -h tells what it does" >&2; exit 2 ;;
esac
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    gcc g++ libc6-dev binutils pkg-config meson ninja-build dpkg-dev \
    libucx-dev ucx-utils libibverbs-dev rdma-core libssl-dev \
    openmpi-bin libopenmpi-dev libpmix-dev slurm-wlm slurm-wlm-basic-plugins munge \
    iproute2 ethtool gnuplot-nox clang libclang-rt-14-dev valgrind ca-certificates \
    python3-dev python3-numpy python3-torch python3-pytest >/dev/null
if [ "${STAGELINK_NO_VENV:-0}" != 1 ]; then
    "$(dirname "$0")/make-venv.sh"
fi
