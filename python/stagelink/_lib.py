"""libstagelink as the package finds it, through the compiled binding
(_calls, over the installed headers): the header's constants by name,
and where the library is found.

libstagelink is looked for, in order: STAGELINK_LIBRARY (a path; nothing
else is tried when it is set), the library directory this package was
installed with (meson install writes _install_paths.py; a wheel carries
the library in the package's _lib), then the dynamic loader's search
(LD_LIBRARY_PATH, ld.so.cache).  The plugin is found by libstagelink's
loader: STAGELINK_PLUGIN, STAGELINK_PLUGIN_PATH, next to the library, then
its installed plugin directory.  The UCX it runs on: _ucx.py.

SPDX-License-Identifier: MIT
"""

import os
import sys
import threading

from . import _ucx
from .errors import STATUS, StagelinkError

try:
    from . import _calls
except ImportError as e:  # a build tree's, for another interpreter
    raise ImportError(
        "stagelink's compiled part (stagelink._calls) cannot be imported by "
        "%s: %s.  It is built for the interpreter of the build's -Dpython=; "
        "run through `meson devenv -C BUILD_DIR` with that interpreter, or "
        "install the package for this one (pip install .)"
        % (sys.executable, e)) from None

MODES = {"default": _calls.MODE_DEFAULT,
         "scatter_gather": _calls.MODE_SCATTER_GATHER,
         "full": _calls.MODE_FULL, "sharded": _calls.MODE_SHARDED}
PEERS = {"next": _calls.PEER_NEXT, "prev": _calls.PEER_PREV}
MEM_HOST, MEM_CUDA = _calls.MEM_HOST, _calls.MEM_CUDA
TAG_MAX_MICROBATCH = _calls.TAG_MAX_MICROBATCH
TAG_MAX_CHUNK = _calls.TAG_MAX_CHUNK
OP_SEND, OP_RECV = _calls.OP_SEND, _calls.OP_RECV

SONAME = "libstagelink.so.1"
_lock = threading.Lock()
_opened = False


def _candidates():
    path = os.environ.get("STAGELINK_LIBRARY")
    if path:
        return [path]
    found = []
    try:
        from . import _install_paths
        # A wheel carries the library in the package ("" recorded).
        libdir = _install_paths.LIBDIR or os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "_lib")
        found.append(os.path.join(libdir, SONAME))
    except ImportError:  # a source tree: no install record
        pass
    found.append(SONAME)
    return found


def _open():
    """libstagelink, opened once, no plugin yet; StagelinkError
    (ERR_NOT_FOUND) says where it was looked for and how to point at it."""
    global _opened
    with _lock:
        if _opened:
            return _calls
        tried = []
        for path in _candidates():
            try:
                _calls.open_library(path)
                break
            except OSError as e:
                tried.append("%s (%s)" % (path, e))
        else:
            raise StagelinkError(
                STATUS["ERR_NOT_FOUND"],
                "libstagelink was not found; tried %s.  Install stagelink "
                "(meson install), run through `meson devenv -C BUILD_DIR`, or "
                "set STAGELINK_LIBRARY to the library's path (in a build "
                "tree: BUILD_DIR/src/%s)" % ("; ".join(tried), SONAME))
        _opened = True
        return _calls


def library():
    """The binding, libstagelink open and the UCX the plugin will run on
    chosen (and loaded, when it is the wheel's) before the plugin loads
    libucp.so.0."""
    lib = _open()
    _ucx.choose()
    return lib


def setting(name):
    """A variable of the library's table as its parser reads it (the one
    comm_init uses): canonical text ("1"/"0" for a switch, the choice as
    the table spells it, bytes, seconds), else its default; a value that
    does not parse raises StagelinkError (ERR_CONFIG) naming it."""
    status, value, sentence = _open().env_value(name)
    if status == STATUS["ERR_NOT_FOUND"]:
        raise KeyError(sentence)
    if status != 0:
        raise StagelinkError(status, sentence)
    return value
