#!/bin/sh
# Installs what stagelink needs to build and test on Debian 12, as root.
set -eu
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    gcc g++ libc6-dev binutils pkg-config meson ninja-build \
    libucx-dev ucx-utils libibverbs-dev rdma-core \
    openmpi-bin libopenmpi-dev \
    iproute2 gnuplot-nox clang libclang-rt-14-dev valgrind \
    python3-numpy python3-torch python3-setuptools >/dev/null
