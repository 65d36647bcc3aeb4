#!/bin/sh
# build-ucx-cuda.sh PREFIX: UCX with its CUDA transports (cuda_copy,
# cuda_ipc), built from Debian's own source package of the UCX this machine
# runs, against the CUDA toolkit in $CUDA_HOME (default /usr/local/cuda).
#
# Debian's libucx0 is configured without CUDA, so with it stagelink can only
# stage device buffers through host memory; this build is what makes the
# plugin's direct path (device pointers handed to ucp_tag_send_nbx) exist.
#
# Only Debian's repositories are used: the source comes from a deb-src entry
# for this release's main, nvml.h from libnvidia-ml-dev in non-free, both fetched
# through a private apt state so the system's sources stay as they are.  No
# driver is needed to build: libuct_cuda links against a stub
# libnvidia-ml.so.1 made from nvml.h; at run time the driver's library of
# that name is loaded instead, and where there is none UCX reports that its
# cuda module failed to load and carries on with host transports.
#
# Shared libraries only.  When PREFIX already holds a build of the same
# source version for the same CUDA, nothing is done.  Needs root for apt
# (build dependencies); about 5 minutes on 2 cores.
set -eu

usage() { echo "usage: tools/build-ucx-cuda.sh PREFIX    UCX with CUDA from Debian's source into PREFIX (as root)"; }
case "${1:-}" in -h|--help) usage; exit 0 ;; -*) usage >&2; exit 2 ;; esac
[ $# -eq 1 ] || { usage >&2; exit 2; }
prefix=$(realpath -m "$1")
cuda=${CUDA_HOME:-/usr/local/cuda}
[ -f "$cuda/include/cuda.h" ] || { echo "build-ucx-cuda: no CUDA toolkit in $cuda (set CUDA_HOME)" >&2; exit 1; }
cuda_version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda/include/cuda.h")
# The UCX this machine's libucx-dev is: the CUDA build is of the same
# source, so a plugin built against either sees the same API.
ucx_version=$(dpkg-query -W -f '${Version}' libucx-dev 2>/dev/null || true)
[ -n "$ucx_version" ] || { echo "build-ucx-cuda: libucx-dev is not installed (tools/install-deps.sh)" >&2; exit 1; }
stamp=$prefix/share/stagelink/ucx-cuda.stamp
# Bumped when this recipe changes what it builds.
recipe=2
want="ucx $ucx_version cuda $cuda_version recipe $recipe"

modules() {
    printf 'UCT modules in %s: ' "$prefix"
    ls "$prefix/lib/ucx" | sed -n 's/^libuct_\(.*\)\.so$/\1/p' | tr '\n' ' '
    echo
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -e "$prefix/lib/libucp.so" ]; then
    echo "build-ucx-cuda: $prefix already holds $want"
    modules
    exit 0
fi

[ "$(id -u)" -eq 0 ] || { echo "build-ucx-cuda: needs root (apt)" >&2; exit 1; }
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { echo "build-ucx-cuda: no VERSION_CODENAME in /etc/os-release" >&2; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends dpkg-dev autoconf automake \
    libtool make g++ pkg-config libnuma-dev libibverbs-dev librdmacm-dev \
    >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/ucx-cuda.XXXXXX")
# Kept when the build fails, for its config.log.
trap 'echo "build-ucx-cuda: failed; the build is kept in $work" >&2' EXIT
apt_dir=$work/apt
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$apt_dir/sources.list" <<EOF
deb-src [signed-by=$keyring] http://deb.debian.org/debian $codename main
deb [signed-by=$keyring] http://deb.debian.org/debian $codename non-free
EOF
apt() {
    apt-get -qq -o APT::Sandbox::User=root -o Dir::Etc::SourceList="$apt_dir/sources.list" \
        -o Dir::Etc::SourceParts="$apt_dir/parts" \
        -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" "$@"
}
apt update
cd "$work"
apt source --download-only "ucx=$ucx_version" ||
    { echo "build-ucx-cuda: $codename's sources have no ucx $ucx_version (the installed libucx-dev)" >&2; exit 1; }
apt download libnvidia-ml-dev
dpkg-source -x ucx_*.dsc src >/dev/null
dpkg -x libnvidia-ml-dev_*.deb nvml
nvml_h=$(find nvml -name nvml.h | head -n 1)
[ -n "$nvml_h" ] || { echo "build-ucx-cuda: libnvidia-ml-dev has no nvml.h" >&2; exit 1; }

# The stub: every function nvml.h declares, doing nothing; same soname as
# the driver's library, so the real one is what the dynamic linker loads.
mkdir stub
sed -n 's/.*DECLDIR[[:space:]]*\(nvml[A-Za-z0-9_]*\)[[:space:]]*(.*/\1/p' "$nvml_h" |
    sort -u | sed 's/.*/int &(void) { return 999; }/' >stub/nvml_stub.c
cc -shared -fPIC -Wl,-soname,libnvidia-ml.so.1 -o stub/libnvidia-ml.so stub/nvml_stub.c

# Debian keeps upstream's own packaging in debian.upstream/; configure.ac
# still generates files into debian/, from those templates.
cd src
if [ -d debian.upstream ]; then
    for f in debian.upstream/*; do
        [ -e "debian/$(basename "$f")" ] || cp -r "$f" debian/
    done
fi
./autogen.sh >/dev/null 2>&1
./configure -q --prefix="$prefix" --disable-static --enable-shared \
    --enable-mt --with-cuda="$cuda" --with-verbs --with-rdmacm \
    --without-java --without-go --without-rocm --without-knem --without-xpmem \
    --disable-doxygen-doc --disable-logging --disable-debug --disable-assertions \
    CPPFLAGS="-I$(cd "$(dirname "$work/$nvml_h")" && pwd)" \
    LDFLAGS="-L$work/stub -Wl,-rpath-link,$work/stub -Wl,-rpath,$cuda/lib64"
grep -q '^#define HAVE_CUDA 1' config.h ||
    { echo "build-ucx-cuda: configure did not enable CUDA" >&2; exit 1; }
# Only the libraries and the two tools: UCX's own tests do not build with
# CUDA 13 (test_cuda_hook.c uses the old cuCtxCreate) and are not needed.
for d in src/ucm src/ucs src/uct src/ucp src/tools/info src/tools/perf; do
    make -s -C "$d" -j"$(nproc)" install >/dev/null
done
# pkg-config's ucx.pc and the headers' install hooks live at the top.
make -s install-pkgconfigDATA >/dev/null 2>&1 || install -D -m 644 ucx.pc "$prefix/lib/pkgconfig/ucx.pc"
find "$prefix" -name '*.la' -delete
mkdir -p "$(dirname "$stamp")"
echo "$want" >"$stamp"
trap - EXIT
rm -rf "$work"
echo "build-ucx-cuda: installed $want in $prefix"
modules
