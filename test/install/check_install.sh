#!/bin/sh
# `meson install` into the configured prefix, then used as a user would,
# from / with no stagelink variable set: Debian's python3 imports the
# package and runs a two-rank job through the installed stagelink_run, and
# README's C example builds against the installed header (pkg-config) and
# runs.  It writes into the prefix, so it runs under CI=true (a throwaway
# machine) or with STAGELINK_INSTALL_CHECK=1.  Usage: check_install.sh BUILD_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ "${CI:-}" != true ] && [ "${STAGELINK_INSTALL_CHECK:-}" != 1 ]; then
    echo "SKIP: installs into the prefix; set CI=true or STAGELINK_INSTALL_CHECK=1"
    exit 77
fi
meson install -C "$build" --no-rebuild --quiet
ldconfig
cd /
clean="env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp"
$clean /usr/bin/python3 -c 'import stagelink
print("stagelink", stagelink.__version__, "with libstagelink", stagelink.library_version())'
$clean stagelink_run -n 2 -T 60 -- /usr/bin/python3 -c 'import stagelink
with stagelink.Communicator() as c:
    b = bytearray(b"x" * 100000) if c.is_first_stage else bytearray(100000)
    (c.send if c.is_first_stage else c.recv)(b, microbatch=1)
    assert b == bytearray(b"x" * 100000), "wrong bytes"
    print("rank", c.rank, "moved 100000 bytes through the installed package")'
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed -n '/^<!-- example: c -->$/,/^```$/p' "$src/README.md" | sed '1,2d;$d' > "$tmp/example.c"
[ -s "$tmp/example.c" ] || { echo "README.md has no C example"; exit 1; }
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$tmp/example" "$tmp/example.c" $($clean pkg-config --cflags --libs stagelink)
$clean stagelink_run -n 4 -T 60 -- "$tmp/example"
echo "installed: package, tools, header, pkg-config file and plugin work with no variable set"
