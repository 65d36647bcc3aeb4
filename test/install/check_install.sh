#!/bin/sh
# README's install and examples, exactly as README gives them, in a clean
# root: a private mount namespace whose /usr/local is empty and whose /etc
# (the loader's cache) is a throwaway overlay, so neither an earlier
# install nor an earlier ldconfig on this machine can help.  Inside it:
# `meson install -C BUILD_DIR` (bin/ holds only the four tools users run),
# then README's C example built with
# `cc example.c -lstagelink` and run with `stagelink_run -n 4 ./a.out`, and
# README's Python example with `stagelink_run -n 4 python3 example.py`,
# from a fresh directory with no stagelink variable set.
# Usage: check_install.sh BUILD_DIR
set -eu
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null 2>&1; then
    echo "SKIP: the clean root needs root and unshare (a mount namespace)"
    exit 77
fi
if [ "${STAGELINK_IN_CLEAN_ROOT:-}" != 1 ]; then
    exec env STAGELINK_IN_CLEAN_ROOT=1 unshare --mount --propagation private \
        "$0" "$@"
fi
tmp=$(mktemp -d)
trap 'cd /; rm -rf "$tmp"' EXIT
mkdir -p "$tmp/etc-up" "$tmp/etc-work" "$tmp/run"
mount -t overlay overlay \
    -o "lowerdir=/etc,upperdir=$tmp/etc-up,workdir=$tmp/etc-work" /etc
mount -t tmpfs tmpfs /usr/local
meson install -C "$build" --no-rebuild --quiet
# bin/ holds what users run; the lab (model, benches, stress, soak) only
# with -Dlab=true, and then in libexec/stagelink.
got=$(ls /usr/local/bin | tr '\n' ' ')
[ "$got" = "stagelink_info stagelink_perftest stagelink_pipeline stagelink_run " ] ||
    { echo "bin/ holds $got, not just stagelink_info, _perftest, _pipeline and _run"; exit 1; }
lab=$(meson introspect --buildoptions "$build" | /usr/bin/python3 -c \
    'import json, sys; print([o["value"] for o in json.load(sys.stdin) if o["name"] == "lab"][0])')
if [ "$lab" = False ] && [ -e /usr/local/libexec/stagelink ]; then
    echo "the lab was installed without -Dlab=true"; exit 1
fi
example() {
    sed -n "/^<!-- example: $1 -->\$/,/^\`\`\`\$/p" "$src/README.md" | sed '1,2d;$d'
}
example c > "$tmp/run/example.c"
example python > "$tmp/run/example.py"
[ -s "$tmp/run/example.c" ] && [ -s "$tmp/run/example.py" ] ||
    { echo "README.md lacks its C or Python example"; exit 1; }
cd "$tmp/run"
clean="env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=$tmp"
$clean sh -c 'cc example.c -lstagelink && stagelink_run -n 4 ./a.out'
$clean sh -c 'stagelink_run -n 4 python3 example.py'
echo "installed into an empty /usr/local: README's C and Python examples ran as written"
