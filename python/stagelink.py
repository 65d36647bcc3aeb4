"""stagelink from Python, through ctypes (no compiled extension).

The plugin is loaded by libstagelink's loader with the same rules as any
host (STAGELINK_PLUGIN, STAGELINK_PLUGIN_PATH, the installed plugin
directory); libstagelink itself is found through STAGELINK_LIBRARY (a
path), else the dynamic loader's search for libstagelink.so.1.

Buffers: anything with the buffer protocol (bytearray, memoryview, array,
numpy arrays) and torch tensors (data_ptr, numel, element_size; they must be
contiguous).  A request keeps its buffer alive until it completes.

    import stagelink, torch
    with stagelink.Communicator(tp_size=2) as comm:
        act = torch.empty(4, 1024)
        comm.recv(act, peer="prev", microbatch=0)

SPDX-License-Identifier: MIT
"""

import ctypes
import os

__all__ = ["Communicator", "Request", "StagelinkError", "version"]

_c_size = ctypes.c_size_t
_status = ctypes.c_int

# stagelink_status_t, in the order of include/stagelink/stagelink.h.
_STATUS_NAMES = [
    "SUCCESS", "ERR_INVALID_ARG", "ERR_INVALID_STATE", "ERR_NO_MEMORY",
    "ERR_NOT_FOUND", "ERR_SYMBOL_MISSING", "ERR_VERSION_MISMATCH",
    "ERR_BOOTSTRAP", "ERR_TRANSPORT", "ERR_SIZE_MISMATCH", "ERR_TAG_IN_USE",
    "ERR_NO_PEER", "ERR_CANCELED", "ERR_TIMEOUT", "ERR_UNSUPPORTED",
    "ERR_CONFIG", "ERR_INIT", "ERR_INTERNAL", "ERR_PEER_FAILED",
    "ERR_ABORTED",
]
MODES = {"default": 0, "scatter_gather": 1, "full": 2, "sharded": 3}
PEERS = {"next": 0, "prev": 1}
MEM_AUTO, MEM_HOST, MEM_CUDA = 0, 1, 2
ABI_VERSION_1 = 1
CONFIG_RANK_SET = 0x1


class StagelinkError(RuntimeError):
    """A call failed: `status` is the name (ERR_TIMEOUT, ...), the message
    the library's sentence."""

    def __init__(self, status, message):
        self.status = (_STATUS_NAMES[status] if 0 <= status < len(_STATUS_NAMES)
                       else "status %d" % status)
        self.code = status
        super().__init__("%s: %s" % (self.status, message))


class _Topology(ctypes.Structure):
    _fields_ = [("prev_rank", ctypes.c_int), ("next_rank", ctypes.c_int),
                ("tp_index", ctypes.c_int),
                ("tp_ranks", ctypes.POINTER(ctypes.c_int))]


_ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_void_p, _c_size)


class _Config(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("rank", ctypes.c_int),
                ("world_size", ctypes.c_int), ("tp_size", ctypes.c_int),
                ("pp_size", ctypes.c_int), ("mode", ctypes.c_int),
                ("topology", ctypes.POINTER(_Topology)),
                ("allgather", _ALLGATHER), ("allgather_ctx", ctypes.c_void_p),
                ("flags", ctypes.c_uint32)]


class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in (
        "rank", "world_size", "tp_size", "pp_size", "dp_size", "tp_index",
        "pp_index", "dp_index", "prev_rank", "next_rank", "local_rank",
        "local_size", "mode")] + [("gather_backend", ctypes.c_char * 16),
                                  ("node_id", ctypes.c_char * 64)]


class _Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "stage_bytes_sent", "stage_bytes_recv", "gather_bytes_sent",
        "gather_bytes_recv", "inter_node_bytes_sent", "inter_node_bytes_recv",
        "intra_node_bytes_sent", "intra_node_bytes_recv",
        "transfers_completed")]


class _Tag(ctypes.Structure):
    _fields_ = [("microbatch", ctypes.c_uint32), ("chunk", ctypes.c_uint16),
                ("direction", ctypes.c_uint8), ("reserved", ctypes.c_uint8)]


class _Xfer(ctypes.Structure):
    _fields_ = [("peer", ctypes.c_int), ("buf", ctypes.c_void_p),
                ("nbytes", _c_size), ("elem_size", _c_size),
                ("mem_type", ctypes.c_int), ("stream", ctypes.c_void_p),
                ("memh", ctypes.c_void_p), ("tag", _Tag)]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)


class _PluginV1(ctypes.Structure):
    """stagelink_plugin_v1_t: the vtable, field for field."""
    _fields_ = [
        ("abi_version", ctypes.c_uint32), ("struct_size", ctypes.c_uint32),
        ("name", ctypes.c_char_p), ("version", ctypes.c_char_p),
        ("comm_init", ctypes.CFUNCTYPE(_status, ctypes.POINTER(_Config), _PP)),
        ("comm_finalize", ctypes.CFUNCTYPE(_status, _P)),
        ("comm_info", ctypes.CFUNCTYPE(_status, _P, ctypes.POINTER(_Info))),
        ("last_error", ctypes.CFUNCTYPE(ctypes.c_char_p, _P)),
        ("mem_register", ctypes.CFUNCTYPE(_status, _P, _P, _c_size,
                                          ctypes.c_int, _PP)),
        ("mem_deregister", ctypes.CFUNCTYPE(_status, _P, _P)),
        ("isend", ctypes.CFUNCTYPE(_status, _P, ctypes.POINTER(_Xfer), _PP)),
        ("irecv", ctypes.CFUNCTYPE(_status, _P, ctypes.POINTER(_Xfer), _PP)),
        ("post_batch", ctypes.CFUNCTYPE(_status, _P, _P, _c_size, _PP)),
        ("test", ctypes.CFUNCTYPE(_status, _P, _P,
                                  ctypes.POINTER(ctypes.c_int))),
        ("wait", ctypes.CFUNCTYPE(_status, _P, _P)),
        ("cancel", ctypes.CFUNCTYPE(_status, _P, _P)),
        ("get_counters", ctypes.CFUNCTYPE(_status, _P,
                                          ctypes.POINTER(_Counters))),
        ("comm_abort", ctypes.CFUNCTYPE(_status, _P)),
        ("comm_get_error", ctypes.CFUNCTYPE(_status, _P,
                                            ctypes.POINTER(ctypes.c_int))),
        ("describe", ctypes.CFUNCTYPE(_c_size, ctypes.c_char_p, _c_size)),
    ]


_lib = None


def _library():
    """libstagelink, opened once."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(os.environ.get("STAGELINK_LIBRARY",
                                         "libstagelink.so.1"))
        lib.stagelink_version.restype = ctypes.c_char_p
        lib.stagelink_loader_open.argtypes = [ctypes.c_char_p, _PP,
                                              ctypes.c_char_p, _c_size]
        lib.stagelink_loader_plugin.restype = ctypes.POINTER(_PluginV1)
        lib.stagelink_loader_plugin.argtypes = [_P]
        lib.stagelink_loader_comm_init.argtypes = [
            _P, ctypes.POINTER(_Config), _PP, ctypes.c_char_p, _c_size]
        lib.stagelink_loader_close.argtypes = [_P]
        _lib = lib
    return _lib


def version():
    """Version of libstagelink."""
    return _library().stagelink_version().decode()


def _buffer(obj):
    """(address, nbytes, element size, memory type, keep-alive) of a buffer."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size"):  # torch
        if not obj.is_contiguous():
            raise ValueError("the tensor must be contiguous")
        mem = MEM_CUDA if getattr(obj, "is_cuda", False) else MEM_HOST
        return (obj.data_ptr(), obj.numel() * obj.element_size(),
                obj.element_size(), mem, obj)
    view = memoryview(obj)
    if not view.c_contiguous:
        raise ValueError("the buffer must be C-contiguous")
    nbytes = view.nbytes
    if nbytes == 0:
        return (None, 0, max(view.itemsize, 1), MEM_HOST, obj)
    if view.readonly:
        # Sends only; ctypes reaches a read-only buffer through a copy-free
        # char pointer to bytes, so other read-only objects are refused.
        if not isinstance(obj, bytes):
            raise ValueError("read-only buffers other than bytes cannot be "
                             "passed; use a bytearray or a writable array")
        addr = ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value
    else:
        addr = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(view))
    return (addr, nbytes, view.itemsize, MEM_HOST, (obj, view))


class Request:
    """An isend or irecv in flight; `wait()` completes it."""

    def __init__(self, comm, handle, keep):
        self._comm, self._handle, self._keep = comm, handle, keep

    def wait(self):
        """Blocks (sleeping, not spinning) until done; raises on error."""
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        self._comm._check(self._comm._vt.wait(self._comm._comm, handle))
        self._keep = None

    def test(self):
        """True once done (the request is then released)."""
        if self._handle is None:
            return True
        done = ctypes.c_int(0)
        self._comm._check(self._comm._vt.test(self._comm._comm, self._handle,
                                              ctypes.byref(done)))
        if done.value:
            self._handle, self._keep = None, None
        return bool(done.value)


class Communicator:
    """One stagelink communicator: init on construction, finalize on close()
    or at the end of a `with` block.  Ranks come from the launcher
    (torchrun, mpirun, Slurm, stagelink_run) unless rank and world_size are
    given."""

    def __init__(self, tp_size=1, pp_size=0, mode="default", rank=None,
                 world_size=None, plugin=None):
        lib = _library()
        err = ctypes.create_string_buffer(2048)
        self._loader = ctypes.c_void_p()
        self._comm = ctypes.c_void_p()
        status = lib.stagelink_loader_open(
            plugin.encode() if plugin else None, ctypes.byref(self._loader),
            err, len(err))
        if status != 0:
            raise StagelinkError(status, err.value.decode())
        self._vt = lib.stagelink_loader_plugin(self._loader).contents
        cfg = _Config(struct_size=ctypes.sizeof(_Config), tp_size=tp_size,
                      pp_size=pp_size, mode=MODES[mode])
        if rank is not None:
            cfg.rank, cfg.world_size = rank, world_size
            cfg.flags = CONFIG_RANK_SET
        status = lib.stagelink_loader_comm_init(
            self._loader, ctypes.byref(cfg), ctypes.byref(self._comm), err,
            len(err))
        if status != 0:
            lib.stagelink_loader_close(self._loader)
            raise StagelinkError(status, err.value.decode())
        info = _Info()
        self._check(self._vt.comm_info(self._comm, ctypes.byref(info)))
        self.info = {name: getattr(info, name) for name, _ in _Info._fields_}
        for key in ("gather_backend", "node_id"):
            self.info[key] = self.info[key].decode()
        self.plugin = self._vt.name.decode()

    def _check(self, status):
        if status != 0:
            raise StagelinkError(status,
                                 self._vt.last_error(self._comm).decode())

    def _post(self, fn, buf, peer, microbatch, chunk, elem_size, stream):
        addr, nbytes, itemsize, mem, keep = _buffer(buf)
        if stream is None and mem == MEM_CUDA:
            # The stream that produced the tensor orders the transfer.
            import torch
            stream = torch.cuda.current_stream(buf.device).cuda_stream
        xfer = _Xfer(peer=PEERS[peer], buf=addr, nbytes=nbytes,
                     elem_size=elem_size or itemsize, mem_type=mem,
                     stream=stream, tag=_Tag(microbatch=microbatch,
                                             chunk=chunk))
        handle = ctypes.c_void_p()
        self._check(fn(self._comm, ctypes.byref(xfer), ctypes.byref(handle)))
        return Request(self, handle, keep)

    def isend(self, buf, peer="next", microbatch=0, chunk=0, elem_size=None,
              stream=None):
        """Starts sending `buf` to the next ("next") or previous ("prev")
        stage; the tag is (microbatch, chunk); shards fall on elements.
        A CUDA tensor is ordered on `stream` (a cudaStream_t as an int;
        default: torch's current stream of its device)."""
        return self._post(self._vt.isend, buf, peer, microbatch, chunk,
                          elem_size, stream)

    def irecv(self, buf, peer="prev", microbatch=0, chunk=0, elem_size=None,
              stream=None):
        """Starts receiving into `buf` (the full tensor) from a stage."""
        return self._post(self._vt.irecv, buf, peer, microbatch, chunk,
                          elem_size, stream)

    def send(self, buf, **kw):
        self.isend(buf, **kw).wait()

    def recv(self, buf, **kw):
        self.irecv(buf, **kw).wait()

    def counters(self):
        c = _Counters()
        self._check(self._vt.get_counters(self._comm, ctypes.byref(c)))
        return {name: getattr(c, name) for name, _ in _Counters._fields_}

    def abort(self):
        """Fails every transfer in flight; callable from any thread."""
        self._check(self._vt.comm_abort(self._comm))

    def close(self):
        """Finalizes (collective) and unloads the plugin."""
        if self._comm:
            comm, self._comm = self._comm, ctypes.c_void_p()
            status = self._vt.comm_finalize(comm)
            _library().stagelink_loader_close(self._loader)
            if status != 0:
                raise StagelinkError(status, "comm_finalize failed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
