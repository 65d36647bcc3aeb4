"""Which UCX the UCX plugin runs on, chosen once before libstagelink opens
the plugin (STAGELINK_UCX, in the variable table of docs/configuration.md):

  auto    for a wheel: the system's UCX where it has an InfiniBand
          transport (its libuct_ib module, and an InfiniBand device on the
          node), else the UCX of the libucx-cu13 wheel where it is
          installed (CUDA, shared memory and TCP; no verbs), else the
          system's; for meson install and build trees, the UCX the plugin
          was built against;
  system  the dynamic loader's libucp.so.0 (LD_LIBRARY_PATH, ld.so.cache);
  wheel   libucx-cu13's, an error where it is not installed.

The wheel's libraries are loaded first and globally, so the plugin's
libucp.so.0 is theirs; where a libucp.so.0 is loaded already, that one
stays (two copies would not share the plugin's), and a STAGELINK_UCX
naming the other is refused.  The plugin was built against an older UCX's
headers; UCX keeps its ABI across 1.x, newer libraries serve older callers.

SPDX-License-Identifier: MIT
"""

import importlib.util
import os
import subprocess
import threading

from .errors import STATUS, StagelinkError

# In dependency order; a library loaded by path serves every later
# request for its soname (the plugin's DT_NEEDED libucp.so.0).
_UCX_LIBS = ("libucs.so.0", "libucs_signal.so.0", "libuct.so.0",
             "libucp.so.0")
_lock = threading.Lock()
_chosen = None


def _system_libucp():
    """Path of the system's libucp.so.0 in the loader's cache, or None."""
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.access(ldconfig, os.X_OK):
            try:
                out = subprocess.run([ldconfig, "-p"], capture_output=True,
                                     text=True, timeout=10).stdout
            except (OSError, subprocess.SubprocessError):
                return None
            for line in out.splitlines():
                if line.strip().startswith("libucp.so.0 ") and "=>" in line:
                    return line.split("=>", 1)[1].strip()
            return None
    return None


def _has_ib(libucp):
    """Whether this UCX has its InfiniBand transport and the node a device."""
    moddir = os.path.join(os.path.dirname(libucp), "ucx")
    try:
        module = any(f.startswith("libuct_ib") for f in os.listdir(moddir))
        devices = os.listdir("/sys/class/infiniband")
    except OSError:
        return False
    return module and bool(devices)


def _wheel_libdir():
    """The lib directory of the libucx-cu13 wheel, or None."""
    spec = importlib.util.find_spec("libucx")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        libdir = os.path.join(root, "lib")
        if os.path.exists(os.path.join(libdir, "libucp.so.0")):
            return libdir
    return None


def _in_wheel():
    """Whether this package is a wheel's (its library inside it)."""
    try:
        from . import _install_paths
    except ImportError:
        return False
    return _install_paths.LIBDIR == ""


def _loaded_libucp():
    """The path of the libucp.so.0 in the process already (Open MPI's UCX,
    an earlier import), or None: a second copy would not be the plugin's."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(None, 5)[-1].strip()
                if os.path.basename(path).startswith("libucp.so"):
                    return path
    except OSError:
        pass
    return None


def _decide():
    from . import _lib  # libstagelink's parser; it loads no UCX
    value = _lib.setting("STAGELINK_UCX")
    wheel = _wheel_libdir()
    loaded = _loaded_libucp()
    if value == "auto" and not _in_wheel() and loaded is None:
        # meson install and build trees run on the UCX they were built
        # with (the system's, or -Ducx_prefix's, by run path).
        return {"ucx": "system", "libdir": None,
                "why": "not a wheel: the UCX the plugin was built against"}
    if loaded is not None:
        which = ("wheel" if wheel is not None and
                 os.path.realpath(loaded).startswith(
                     os.path.realpath(wheel) + os.sep) else "system")
        if value not in ("auto", which):
            raise StagelinkError(
                STATUS["ERR_CONFIG"],
                "STAGELINK_UCX=%s, but %s libucp.so.0 (%s) is loaded in this "
                "process already, and the plugin would run on it: import "
                "stagelink before what loads it, or set STAGELINK_UCX=%s"
                % (value, "libucx-cu13's" if which == "wheel"
                   else "another", loaded, which))
        return {"ucx": which, "libdir": wheel if which == "wheel" else None,
                "why": "its libucp.so.0 (%s) is loaded in this process "
                       "already" % loaded}
    system = _system_libucp()
    if value == "wheel" and wheel is None:
        raise StagelinkError(
            STATUS["ERR_NOT_FOUND"],
            "STAGELINK_UCX=wheel, but the libucx-cu13 wheel is not installed "
            "(pip install 'stagelink[ucx]', or unset STAGELINK_UCX)")
    if value == "wheel":
        return {"ucx": "wheel", "libdir": wheel, "why": "STAGELINK_UCX=wheel"}
    if value == "system":
        return {"ucx": "system", "libdir": None, "why": "STAGELINK_UCX=system"}
    if system is not None and _has_ib(system):
        return {"ucx": "system", "libdir": None,
                "why": "the system's UCX (%s) has an InfiniBand transport"
                       % system}
    if wheel is not None:
        return {"ucx": "wheel", "libdir": wheel,
                "why": "the system's UCX %s; libucx-cu13 is installed" %
                       ("has no InfiniBand transport or device" if system
                        else "is not in the loader's cache")}
    return {"ucx": "system", "libdir": None,
            "why": "no libucx-cu13 wheel; the system's UCX, as the loader "
                   "finds it"}


def choose():
    """The UCX in use ({"ucx": "system"|"wheel", "libdir", "why"}), its
    libraries loaded when it is the wheel's; the same answer every call."""
    global _chosen
    with _lock:
        if _chosen is None:
            from . import _lib  # the binding, imported with its message
            chosen = _decide()
            if chosen["ucx"] == "wheel":
                for name in _UCX_LIBS:
                    path = os.path.join(chosen["libdir"], name)
                    if os.path.exists(path):
                        _lib._calls.load_global(path)
            _chosen = chosen
        return dict(_chosen)


def export(env):
    """Makes a child process (a C tool, a rank) find the same UCX."""
    chosen = choose()
    if chosen["ucx"] == "wheel":
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = chosen["libdir"] + (":" + old if old else "")
    env["STAGELINK_UCX"] = chosen["ucx"]
