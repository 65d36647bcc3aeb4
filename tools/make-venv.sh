#!/bin/sh
# make-venv.sh [VENV]: the repository's Python environment (default .venv
# at the repository root): a Python of 3.12 or newer, every package of
# python/requirements-venv.txt at its pinned version, then stagelink itself
# as the wheel `pip install .` builds from this tree.
#
# The interpreter: $STAGELINK_PYTHON, else python3.12 or python3.13 on
# PATH or among pyenv's versions, else CPython built from Debian's source
# of python3.13 (the orig tarball of trixie, checked against its SHA-256)
# into /opt/stagelink-python (kept once built; about 5 minutes on 2 cores).
# An existing VENV whose packages match the pins is kept; only the wheel
# is rebuilt.  Needs the network (the package index, Debian's mirror).
set -eu
case "${1:-}" in
-h|--help) echo "usage: tools/make-venv.sh [VENV]    the pinned Python environment (default .venv) with stagelink's wheel"; exit 0 ;;
-*) echo "make-venv.sh: unknown option \"$1\"; -h tells what it does" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
venv=${1:-.venv}
req=python/requirements-venv.txt
cpython_version=3.13.5
cpython_sha256=93e583f243454e6e9e4588ca2c2662206ad961659863277afcdb96801647d640
cpython_url=http://deb.debian.org/debian/pool/main/p/python3.13/python3.13_$cpython_version.orig.tar.xz
cpython_prefix=/opt/stagelink-python

new_enough() {
    "$1" -c 'import sys, ssl, ctypes, venv; sys.exit(sys.version_info < (3, 12))' \
        2>/dev/null
}

build_cpython() {
    src=$(mktemp -d)
    trap 'rm -rf "$src"' EXIT
    apt-get install -y -qq --no-install-recommends make libssl-dev \
        libffi-dev zlib1g-dev libbz2-dev liblzma-dev libsqlite3-dev \
        uuid-dev libreadline-dev xz-utils curl \
        ca-certificates >/dev/null
    curl -fsSL -o "$src/cpython.tar.xz" "$cpython_url"
    echo "$cpython_sha256  $src/cpython.tar.xz" | sha256sum -c --quiet
    tar -xJf "$src/cpython.tar.xz" -C "$src"
    (cd "$src/Python-$cpython_version" &&
        ./configure -q --prefix="$cpython_prefix" --with-ensurepip=install &&
        make -s -j"$(nproc)" && make -s install) >"$src/build.log" 2>&1 ||
        { tail -30 "$src/build.log" >&2; exit 1; }
}

find_python() {
    for p in "${STAGELINK_PYTHON:-}" python3.12 python3.13 \
             "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 \
             "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.13.*/bin/python3.13 \
             "$cpython_prefix/bin/python3"; do
        if [ -n "$p" ] && command -v "$p" >/dev/null 2>&1 && new_enough "$p"; then
            # A pyenv shim answers for a version it has not installed: run it.
            command -v "$p"
            return 0
        fi
    done
    return 1
}

# Not in an AND-OR list: there set -e would not stop a failed checksum.
if ! python=$(find_python); then
    build_cpython >&2
    python=$(find_python)
fi
echo "make-venv: $venv from $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))"
if [ ! -x "$venv/bin/python" ] || ! new_enough "$venv/bin/python"; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
fi
# Only what differs from the pins is installed (pip's cache keeps wheels).
"$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
    --force-reinstall .
"$venv/bin/python" -c 'import stagelink, torch, megatron.core
print("make-venv: stagelink", stagelink.__version__, "torch", torch.__version__,
      "megatron-core", megatron.core.__version__)'
