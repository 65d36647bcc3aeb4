"""What a Python object passed as a transfer buffer is: its address, size,
element size, memory type, dtype and shape, and the reference that keeps
its memory alive while the transport may still read or write it.

Torch tensors are held by their storage, not by the tensor object: Megatron
frees an activation with `out.data = torch.empty(1)` while its send is in
flight, which swaps the tensor's storage and would otherwise free the
memory under the transport.  Buffer-protocol objects (bytearray, numpy
arrays and scalars, array, memoryview, bytes) are held by a buffer export,
which also stops a bytearray from being resized under the transport.

SPDX-License-Identifier: MIT
"""

import ctypes
import sys

from . import _lib

_PyBUF_WRITABLE = 0x0001
_PyBUF_FORMAT = 0x0004
_PyBUF_C_CONTIGUOUS = 0x0020 | 0x0010 | 0x0008  # with STRIDES and ND


class _PyBuffer(ctypes.Structure):
    """Py_buffer (Include/pybuffer.h), stable since Python 3.3."""
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p),
                ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
                ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
                ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
                ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer),
                        ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None

# struct-module format codes to the dtype names torch and numpy print.
_FORMATS = {"b": "int8", "B": "uint8", "c": "uint8", "?": "bool",
            "h": "int16", "H": "uint16", "i": "int32", "I": "uint32",
            "l": "int64", "L": "uint64", "q": "int64", "Q": "uint64",
            "e": "float16", "f": "float32", "d": "float64",
            "Zf": "complex64", "Zd": "complex128"}


class _Export:
    """A buffer export held until release(): the memory can be neither
    freed nor resized meanwhile."""
    __slots__ = ("view", "held")

    def __init__(self, obj, writable):
        self.view, self.held = _PyBuffer(), False
        flags = _PyBUF_C_CONTIGUOUS | _PyBUF_FORMAT
        if writable:
            flags |= _PyBUF_WRITABLE
        try:
            _get_buffer(obj, ctypes.byref(self.view), flags)
        except (BufferError, ValueError) as e:  # numpy raises ValueError
            if writable and _readonly(obj):
                raise ValueError(
                    "a receive buffer must be writable; %s is read-only "
                    "(bytes, read-only arrays and scalars can only be sent)"
                    % type(obj).__name__) from None
            raise ValueError("the buffer must be C-contiguous (%s): pass a "
                             "contiguous copy" % e) from None
        self.held = True

    def release(self):
        if self.held:
            self.held = False
            _release_buffer(ctypes.byref(self.view))

    def __del__(self):
        self.release()


def _readonly(obj):
    try:
        with memoryview(obj) as view:
            return view.readonly
    except TypeError:
        return False


class Buffer:
    """One transfer's buffer, described once at post time (its dtype's
    name only when asked: a post should not pay for a string it rarely
    shows)."""
    __slots__ = ("addr", "nbytes", "itemsize", "mem", "keep", "_dtype",
                 "shape", "device")

    @property
    def dtype(self):
        """The element type's name, as torch and numpy print it."""
        d = self._dtype
        return d if isinstance(d, str) else str(d).replace("torch.", "")

    def release(self):
        """Drops what held the memory; the transport no longer touches it."""
        if isinstance(self.keep, _Export):
            self.keep.release()
        self.keep = None

    def describe(self):
        return "%s[%s]" % (self.dtype, ", ".join(map(str, self.shape)))


class Held:
    """Memory of the binding's own (a descriptor record), held like a
    Buffer."""
    __slots__ = ("keep",)

    def __init__(self, keep):
        self.keep = keep

    def release(self):
        self.keep = None


def _torch_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def describe(obj, writable):
    """The Buffer of `obj`; ValueError or TypeError when it cannot be one."""
    b = Buffer()
    if _torch_tensor(obj):
        if obj.layout is not sys.modules["torch"].strided:
            raise ValueError("a %s tensor cannot be transferred: pass a dense "
                             "(strided) tensor" % obj.layout)
        if not obj.is_contiguous():
            raise ValueError("the tensor (shape %s, strides %s) is not "
                             "contiguous: pass tensor.contiguous()"
                             % (tuple(obj.shape), obj.stride()))
        if obj.is_cuda:
            b.mem, b.device = _lib.MEM_CUDA, obj.get_device()
        elif obj.device.type == "cpu":
            b.mem, b.device = _lib.MEM_HOST, None
        else:
            raise ValueError("tensors on %s cannot be transferred: use CPU or "
                             "CUDA tensors" % obj.device)
        b.addr, b.itemsize = obj.data_ptr(), obj.element_size()
        b.nbytes = obj.numel() * b.itemsize
        storage = getattr(obj, "untyped_storage", None)
        b.keep = storage() if storage is not None else obj.storage()
        b._dtype = obj.dtype
        b.shape = obj.shape  # torch.Size: a tuple
        return b
    try:
        export = _Export(obj, writable)
    except TypeError:
        raise TypeError("%s is no buffer: pass a torch tensor, a numpy array, "
                        "a bytearray or another object with the buffer "
                        "protocol" % type(obj).__name__) from None
    v = export.view
    b.addr, b.nbytes = v.buf, v.len
    b.itemsize = max(v.itemsize, 1)
    b.mem, b.device, b.keep = _lib.MEM_HOST, None, export
    if v.ndim == 0:
        b.shape = ()  # a scalar: numpy's scalars and 0-d arrays
    else:
        b.shape = (tuple(v.shape[i] for i in range(v.ndim)) if v.shape
                   else (v.len // b.itemsize,))
    fmt = (v.format or b"B").decode().lstrip("@=<>!")
    dtype = getattr(obj, "dtype", None)  # numpy's own name where it has one
    b._dtype = str(dtype) if dtype is not None else _FORMATS.get(fmt, fmt)
    return b
