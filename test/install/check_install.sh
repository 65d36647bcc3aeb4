#!/bin/sh
# README's install and examples, exactly as README gives them, in a clean
# root: a private mount namespace whose /usr/local is empty and whose /etc
# (the loader's cache) is a throwaway overlay, so neither an earlier
# install nor an earlier ldconfig on this machine can help.  Inside it:
# `meson install -C BUILD_DIR`, then README's C example built with
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
