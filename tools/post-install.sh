#!/bin/sh
# meson's install script: after an install into the system (no DESTDIR, as
# root), the dynamic loader's cache is refreshed, so that a program built
# with `cc prog.c -lstagelink` finds libstagelink.so.1 as it would after a
# package install.  Usage (from meson): post-install.sh LIBDIR
set -eu
case "${1:-}" in
-h|--help) echo "usage: post-install.sh LIBDIR    meson install's step: refreshes the loader's cache (root, no DESTDIR)"; exit 0 ;;
esac
[ -z "${DESTDIR:-}" ] || exit 0
if [ "$(id -u)" != 0 ] || ! command -v ldconfig >/dev/null 2>&1; then
    echo "stagelink: run ldconfig as root, or set LD_LIBRARY_PATH=$1, before running programs linked with -lstagelink"
    exit 0
fi
ldconfig
# A libdir outside the loader's search path (lib64 where meson cannot ask
# dpkg for Debian's multiarch directory): the loader is told of it.
if ! ldconfig -p | grep -q "libstagelink\.so\.1 .*=> $1/"; then
    echo "$1" >/etc/ld.so.conf.d/stagelink.conf
    ldconfig
fi
