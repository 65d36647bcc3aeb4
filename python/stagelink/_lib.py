"""libstagelink through ctypes: the C structures field for field, and where
the library is found.

libstagelink is looked for, in order: STAGELINK_LIBRARY (a path; nothing
else is tried when it is set), the library directory this package was
installed with (meson install writes _install_paths.py; a wheel carries
the library in the package's _lib), then the dynamic loader's search
(LD_LIBRARY_PATH, ld.so.cache).  The plugin is found by libstagelink's
loader: STAGELINK_PLUGIN, STAGELINK_PLUGIN_PATH, next to the library, then
its installed plugin directory.  The UCX it runs on: _ucx.py.

SPDX-License-Identifier: MIT
"""

import ctypes
import ctypes.util
import os
import threading

from . import _ucx
from .errors import STATUS, StagelinkError

c_size = ctypes.c_size_t
c_status = ctypes.c_int
P = ctypes.c_void_p
PP = ctypes.POINTER(ctypes.c_void_p)

MODES = {"default": 0, "scatter_gather": 1, "full": 2, "sharded": 3}
PEERS = {"next": 0, "prev": 1}
MEM_HOST, MEM_CUDA = 1, 2
CONFIG_RANK_SET = 0x1
CONFIG_DEVICE_SET = 0x2
TAG_MAX_MICROBATCH = 0xFFFFFFFF
TAG_MAX_CHUNK = 0x7FF
OP_SEND, OP_RECV = 0, 1


class Topology(ctypes.Structure):
    _fields_ = [("prev_rank", ctypes.c_int), ("next_rank", ctypes.c_int),
                ("tp_index", ctypes.c_int), ("struct_size", ctypes.c_uint32),
                ("tp_ranks", ctypes.POINTER(ctypes.c_int))]


ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, c_size)


STORE_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                             ctypes.c_void_p, c_size)
STORE_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p,
                             ctypes.c_void_p, c_size, ctypes.POINTER(c_size))


class Tag(ctypes.Structure):
    _fields_ = [("microbatch", ctypes.c_uint32), ("chunk", ctypes.c_uint16),
                ("direction", ctypes.c_uint8), ("reserved", ctypes.c_uint8)]


class GatherArgs(ctypes.Structure):
    _fields_ = [("buf", ctypes.c_void_p), ("nbytes", c_size),
                ("elem_size", c_size), ("mem_type", ctypes.c_int),
                ("struct_size", ctypes.c_uint32), ("stream", ctypes.c_void_p), ("tag", Tag),
                ("tp_size", ctypes.c_int), ("tp_index", ctypes.c_int),
                ("offsets", ctypes.POINTER(c_size)),
                ("lengths", ctypes.POINTER(c_size))]


GATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p,
                          ctypes.POINTER(GatherArgs))


class Config(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("rank", ctypes.c_int),
                ("world_size", ctypes.c_int), ("tp_size", ctypes.c_int),
                ("pp_size", ctypes.c_int), ("mode", ctypes.c_int),
                ("topology", ctypes.POINTER(Topology)),
                ("allgather", ALLGATHER), ("allgather_ctx", ctypes.c_void_p),
                ("flags", ctypes.c_uint32),
                ("store_set", STORE_SET), ("store_get", STORE_GET),
                ("store_ctx", ctypes.c_void_p),
                ("gather", GATHER), ("gather_ctx", ctypes.c_void_p),
                ("device", ctypes.c_int)]


class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in (
        "rank", "world_size", "tp_size", "pp_size", "dp_size", "tp_index",
        "pp_index", "dp_index", "prev_rank", "next_rank", "local_rank",
        "local_size", "mode")] + [("gather_backend", ctypes.c_char * 16),
                                  ("node_id", ctypes.c_char * 64)]


class Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "stage_bytes_sent", "stage_bytes_recv", "gather_bytes_sent",
        "gather_bytes_recv", "inter_node_bytes_sent", "inter_node_bytes_recv",
        "intra_node_bytes_sent", "intra_node_bytes_recv",
        "transfers_completed")]


class Xfer(ctypes.Structure):
    _fields_ = [("peer", ctypes.c_int), ("struct_size", ctypes.c_uint32), ("buf", ctypes.c_void_p),
                ("nbytes", c_size), ("elem_size", c_size),
                ("mem_type", ctypes.c_int), ("stream", ctypes.c_void_p),
                ("memh", ctypes.c_void_p), ("tag", Tag)]


class Op(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("xfer", Xfer)]


class EnvVar(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("default_value", ctypes.c_char_p),
                ("description", ctypes.c_char_p)]


class JobInfo(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("rank", ctypes.c_int),
                ("world_size", ctypes.c_int), ("local_rank", ctypes.c_int),
                ("local_size", ctypes.c_int),
                ("launcher", ctypes.c_char * 16),
                ("bootstrap", ctypes.c_char * 16),
                ("bootstrap_reason", ctypes.c_char * 160)]


class PluginV1(ctypes.Structure):
    """stagelink_plugin_v1_t: the vtable, field for field.  The loader hands
    out a full-size copy, stubs included, whatever the plugin's age."""
    _fields_ = [
        ("abi_version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p), ("version", ctypes.c_char_p),
        ("comm_init", ctypes.CFUNCTYPE(c_status, ctypes.POINTER(Config), PP)),
        ("comm_finalize", ctypes.CFUNCTYPE(c_status, P)),
        ("comm_info", ctypes.CFUNCTYPE(c_status, P, ctypes.POINTER(Info))),
        ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p, P)),
        ("mem_register", ctypes.CFUNCTYPE(c_status, P, P, c_size,
                                          ctypes.c_int, PP)),
        ("mem_deregister", ctypes.CFUNCTYPE(c_status, P, P)),
        ("isend", ctypes.CFUNCTYPE(c_status, P, ctypes.POINTER(Xfer), PP)),
        ("irecv", ctypes.CFUNCTYPE(c_status, P, ctypes.POINTER(Xfer), PP)),
        ("post_batch", ctypes.CFUNCTYPE(c_status, P, ctypes.POINTER(Op),
                                        c_size, PP)),
        ("test", ctypes.CFUNCTYPE(c_status, P, P,
                                  ctypes.POINTER(ctypes.c_int))),
        ("wait", ctypes.CFUNCTYPE(c_status, P, P)),
        ("cancel", ctypes.CFUNCTYPE(c_status, P, P)),
        ("get_counters", ctypes.CFUNCTYPE(c_status, P,
                                          ctypes.POINTER(Counters))),
        ("comm_abort", ctypes.CFUNCTYPE(c_status, P)),
        ("comm_get_error", ctypes.CFUNCTYPE(c_status, P,
                                            ctypes.POINTER(ctypes.c_int))),
        ("describe", ctypes.CFUNCTYPE(c_size, ctypes.c_char_p, c_size)),
        ("wait_for", ctypes.CFUNCTYPE(c_status, P, P, ctypes.c_int)),
        ("order_stream", ctypes.CFUNCTYPE(c_status, P, P, P)),
        ("post_batch_sized", ctypes.CFUNCTYPE(c_status, P, ctypes.POINTER(Op),
                                              c_size, c_size, PP)),
    ]


SONAME = "libstagelink.so.1"
_lock = threading.Lock()
_lib = None


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
    other = ctypes.util.find_library("stagelink")
    if other and other != SONAME:
        found.append(other)
    return found


def _open():
    """libstagelink, opened once, no plugin yet; StagelinkError
    (ERR_NOT_FOUND) says where it was looked for and how to point at it."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        for path in _candidates():
            try:
                lib = ctypes.CDLL(path)
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
        lib.stagelink_version.restype = ctypes.c_char_p
        lib.stagelink_status_string.restype = ctypes.c_char_p
        lib.stagelink_status_string.argtypes = [ctypes.c_int]
        lib.stagelink_loader_open.argtypes = [ctypes.c_char_p, PP,
                                              ctypes.c_char_p, c_size]
        lib.stagelink_loader_plugin.restype = ctypes.POINTER(PluginV1)
        lib.stagelink_loader_plugin.argtypes = [P]
        lib.stagelink_loader_comm_init.argtypes = [
            P, ctypes.POINTER(Config), PP, ctypes.c_char_p, c_size]
        lib.stagelink_loader_close.argtypes = [P]
        lib.stagelink_env_var.restype = ctypes.POINTER(EnvVar)
        lib.stagelink_env_var.argtypes = [c_size]
        lib.stagelink_job_query.argtypes = [ctypes.POINTER(JobInfo),
                                            ctypes.c_char_p, c_size]
        lib.stagelink_env_value.argtypes = [ctypes.c_char_p, ctypes.c_char_p,
                                            c_size, ctypes.c_char_p, c_size]
        _lib = lib
        return lib


def library():
    """libstagelink with the UCX the plugin will run on chosen (and loaded,
    when it is the wheel's) before the plugin loads libucp.so.0."""
    lib = _open()
    _ucx.choose()
    return lib


def setting(name):
    """A variable of the library's table as its parser reads it (the one
    comm_init uses): canonical text ("1"/"0" for a switch, the choice as
    the table spells it, bytes, seconds), else its default; a value that
    does not parse raises StagelinkError (ERR_CONFIG) naming it."""
    lib = _open()
    value = ctypes.create_string_buffer(4096)
    err = ctypes.create_string_buffer(1024)
    status = lib.stagelink_env_value(name.encode(), value, len(value), err,
                                     len(err))
    if status == STATUS["ERR_NOT_FOUND"]:
        raise KeyError(err.value.decode(errors="replace"))
    if status != 0:
        raise StagelinkError(status, err.value.decode(errors="replace"))
    return value.value.decode(errors="replace")