/*
 * What a Python object passed as a transfer buffer is: its address, size,
 * element size, memory type, dtype and shape, and the reference that keeps
 * its memory alive while the transport may still read or write it.
 *
 * Torch tensors are held by their storage, not by the tensor object:
 * Megatron frees an activation with `out.data = torch.empty(1)` while its
 * send is in flight, which swaps the tensor's storage and would otherwise
 * free the memory under the transport.  Buffer-protocol objects
 * (bytearray, numpy arrays and scalars, array, memoryview, bytes) are held
 * by a buffer export, which also stops a bytearray from being resized
 * under the transport.  Torch is looked at only once the host imported it.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_buffer.h"

#include <stddef.h>
#include <string.h>

#include <structmember.h>

#include "stagelink/stagelink.h"

/* torch.Tensor and torch.strided, once torch is imported (kept). */
static PyObject *torch_tensor, *torch_strided;

/* Attribute names, interned once. */
static PyObject *n_layout, *n_is_contiguous, *n_is_cuda, *n_is_cpu,
                *n_get_device, *n_device, *n_data_ptr, *n_element_size,
                *n_numel, *n_untyped_storage, *n_storage, *n_dtype, *n_shape,
                *n_stride, *n_type, *n_torch, *n_is_conj, *n_is_neg;


int sl_py_buffer_init(void)
{
    static const sl_py_name_t names[] = {
        {&n_layout, "layout"}, {&n_is_contiguous, "is_contiguous"},
        {&n_is_cuda, "is_cuda"}, {&n_is_cpu, "is_cpu"},
        {&n_get_device, "get_device"}, {&n_device, "device"},
        {&n_data_ptr, "data_ptr"}, {&n_element_size, "element_size"},
        {&n_numel, "numel"}, {&n_untyped_storage, "untyped_storage"},
        {&n_storage, "storage"}, {&n_dtype, "dtype"}, {&n_shape, "shape"},
        {&n_stride, "stride"}, {&n_type, "type"}, {&n_torch, "torch"},
        {&n_is_conj, "is_conj"}, {&n_is_neg, "is_neg"},
    };

    return sl_py_intern(names, sizeof(names) / sizeof(names[0]));
}

/* 1 when `obj` is a torch tensor, 0 when not (or torch is not imported),
 * -1 on error. */
static int sl_py_is_tensor(PyObject *obj)
{
    PyObject *torch;

    if (torch_tensor == NULL) {
        torch = PyImport_GetModule(n_torch);
        if (torch == NULL || torch == Py_None) { /* None: torch blocked */
            Py_XDECREF(torch);
            return PyErr_Occurred() ? -1 : 0;
        }
        torch_tensor = PyObject_GetAttrString(torch, "Tensor");
        if (torch_tensor != NULL) {
            torch_strided = PyObject_GetAttrString(torch, "strided");
        }
        Py_DECREF(torch);
        if (torch_strided == NULL) {
            Py_CLEAR(torch_tensor);
            return -1;
        }
    }
    return PyObject_IsInstance(obj, torch_tensor);
}

/* An int result of obj.name() into *out; -1 on error. */
static int sl_py_call_size(PyObject *obj, PyObject *name, size_t *out)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);

    if (r == NULL) {
        return -1;
    }
    *out = PyLong_AsSize_t(r);
    Py_DECREF(r);
    return (*out == (size_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* The truth of obj.name() (a method); `absent` where obj has none (an
 * older torch), unless that is -1: then, as on any error, -1. */
static int sl_py_call_truth(PyObject *obj, PyObject *name, int absent)
{
    PyObject *r = PyObject_CallMethodNoArgs(obj, name);
    int       truth;

    if (r == NULL) {
        if (absent < 0 || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
            return -1;
        }
        PyErr_Clear();
        return absent;
    }
    truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

/* The truth of obj.name (a property); -1 on error. */
static int sl_py_flag(PyObject *obj, PyObject *name)
{
    PyObject *r = PyObject_GetAttr(obj, name);
    int       truth;

    if (r == NULL) {
        return -1;
    }
    truth = PyObject_IsTrue(r);
    Py_DECREF(r);
    return truth;
}

/* A CPU tensor: is_cpu where torch has it, else device.type == "cpu". */
static int sl_py_tensor_on_cpu(PyObject *obj)
{
    PyObject *device, *type;
    int       cpu;

    cpu = sl_py_flag(obj, n_is_cpu);
    if (cpu >= 0 || !PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return cpu;
    }
    PyErr_Clear();
    device = PyObject_GetAttr(obj, n_device);
    if (device == NULL) {
        return -1;
    }
    type = PyObject_GetAttr(device, n_type);
    Py_DECREF(device);
    if (type == NULL) {
        return -1;
    }
    cpu = PyUnicode_Check(type) && PyUnicode_CompareWithASCIIString(type,
                                                                   "cpu") == 0;
    Py_DECREF(type);
    return cpu;
}

/* Views whose memory is not their values, and what to pass instead. */
static const struct {
    PyObject  **name;
    const char *what;
} lazy_views[] = {
    {&n_is_conj, "a conjugate view (tensor.conj()), whose memory holds the "
                 "values unconjugated: pass tensor.resolve_conj()"},
    {&n_is_neg, "a negative view, whose memory holds the values negated: "
                "pass tensor.resolve_neg()"},
};

static int sl_py_describe_tensor(sl_py_buffer_t *b, PyObject *obj)
{
    PyObject *layout, *r, *shape = NULL, *strides = NULL, *device;
    size_t    numel, i;
    int       flag;

    layout = PyObject_GetAttr(obj, n_layout);
    if (layout == NULL) {
        return -1;
    }
    if (layout != torch_strided) {
        PyErr_Format(PyExc_ValueError, "a %S tensor cannot be transferred: "
                     "pass a dense (strided) tensor", layout);
        Py_DECREF(layout);
        return -1;
    }
    Py_DECREF(layout);

    /* A conjugate or negative view keeps its memory and a flag: its
     * bytes are not its values. */
    for (i = 0; i < sizeof(lazy_views) / sizeof(lazy_views[0]); ++i) {
        flag = sl_py_call_truth(obj, *lazy_views[i].name, 0);
        if (flag > 0) {
            PyErr_Format(PyExc_ValueError, "the tensor is %s",
                         lazy_views[i].what);
        }
        if (flag != 0) {
            return -1;
        }
    }
    flag = sl_py_call_truth(obj, n_is_contiguous, -1);
    if (flag < 0) {
        return -1;
    }
    if (!flag) {
        r = PyObject_GetAttr(obj, n_shape);
        if (r != NULL) {
            shape = PySequence_Tuple(r);
            Py_DECREF(r);
        }
        strides = (shape != NULL) ?
                  PyObject_CallMethodNoArgs(obj, n_stride) : NULL;
        if (strides != NULL) {
            PyErr_Format(PyExc_ValueError, "the tensor (shape %R, strides %R) "
                         "is not contiguous: pass tensor.contiguous()", shape,
                         strides);
        }
        Py_XDECREF(shape);
        Py_XDECREF(strides);
        return -1;
    }

    flag = sl_py_tensor_on_cpu(obj);
    if (flag < 0) {
        return -1;
    }
    if (flag) {
        b->mem = STAGELINK_MEM_HOST;
    } else {
        size_t index;

        flag = sl_py_flag(obj, n_is_cuda);
        if (flag < 0) {
            return -1;
        }
        if (!flag) {
            device = PyObject_GetAttr(obj, n_device);
            if (device != NULL) {
                PyErr_Format(PyExc_ValueError, "tensors on %S cannot be "
                             "transferred: use CPU or CUDA tensors", device);
                Py_DECREF(device);
            }
            return -1;
        }
        if (sl_py_call_size(obj, n_get_device, &index)) {
            return -1;
        }
        b->mem    = STAGELINK_MEM_CUDA;
        b->device = (int)index;
    }

    r = PyObject_CallMethodNoArgs(obj, n_data_ptr);
    if (r == NULL) {
        return -1;
    }
    b->addr = PyLong_AsVoidPtr(r);
    Py_DECREF(r);
    if ((b->addr == NULL && PyErr_Occurred()) ||
        sl_py_call_size(obj, n_element_size, &b->itemsize) ||
        sl_py_call_size(obj, n_numel, &numel)) {
        return -1;
    }
    b->nbytes = numel * b->itemsize;

    b->keep = PyObject_CallMethodNoArgs(obj, n_untyped_storage);
    if (b->keep == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear(); /* a torch older than untyped storages */
        b->keep = PyObject_CallMethodNoArgs(obj, n_storage);
    }
    if (b->keep == NULL) {
        return -1;
    }
    b->dtype = PyObject_GetAttr(obj, n_dtype);
    b->shape = (b->dtype != NULL) ? PyObject_GetAttr(obj, n_shape) : NULL;
    return (b->shape == NULL) ? -1 : 0;
}

/* Whether `obj` exports its memory read-only (as memoryview would); -1
 * on an error other than the buffer protocol's own. */
static int sl_py_readonly(PyObject *obj)
{
    Py_buffer view;
    int       readonly;

    if (PyObject_GetBuffer(obj, &view, PyBUF_FULL_RO) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError) &&
            !PyErr_ExceptionMatches(PyExc_BufferError) &&
            !PyErr_ExceptionMatches(PyExc_ValueError)) {
            return -1;
        }
        PyErr_Clear();
        return 0;
    }
    readonly = view.readonly;
    PyBuffer_Release(&view);
    return readonly;
}

/* struct-module format codes to the dtype names torch and numpy print. */
static const char *sl_py_format_name(const char *fmt)
{
    static const char *const names[][2] = {
        {"b", "int8"}, {"B", "uint8"}, {"c", "uint8"}, {"?", "bool"},
        {"h", "int16"}, {"H", "uint16"}, {"i", "int32"}, {"I", "uint32"},
        {"l", "int64"}, {"L", "uint64"}, {"q", "int64"}, {"Q", "uint64"},
        {"e", "float16"}, {"f", "float32"}, {"d", "float64"},
        {"Zf", "complex64"}, {"Zd", "complex128"},
    };
    size_t i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
        if (strcmp(fmt, names[i][0]) == 0) {
            return names[i][1];
        }
    }
    return fmt;
}

/* A type's own name, as Python prints it ("ndarray", not "numpy.ndarray"). */
static const char *sl_py_type_name(PyObject *obj)
{
    const char *name = Py_TYPE(obj)->tp_name;
    const char *dot  = strrchr(name, '.');

    return (dot != NULL) ? dot + 1 : name;
}

static int sl_py_describe_export(sl_py_buffer_t *b, PyObject *obj,
                                 int writable)
{
    int        flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT, readonly;
    PyObject  *type, *value, *tb, *dtype;
    Py_buffer *v = &b->view;
    const char *fmt;
    Py_ssize_t i;

    if (writable) {
        flags |= PyBUF_WRITABLE;
    }
    if (PyObject_GetBuffer(obj, v, flags) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "%s is no buffer: pass a torch "
                         "tensor, a numpy array, a bytearray or another "
                         "object with the buffer protocol",
                         sl_py_type_name(obj));
        } else if (PyErr_ExceptionMatches(PyExc_BufferError) ||
                   PyErr_ExceptionMatches(PyExc_ValueError)) {
            /* numpy raises ValueError */
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            readonly = writable ? sl_py_readonly(obj) : 0;
            if (readonly < 0) {
                /* that error, not the buffer's */
            } else if (readonly) {
                PyErr_Format(PyExc_ValueError, "a receive buffer must be "
                             "writable; %s is read-only (bytes, read-only "
                             "arrays and scalars can only be sent)",
                             sl_py_type_name(obj));
            } else {
                PyErr_Format(PyExc_ValueError, "the buffer must be "
                             "C-contiguous (%S): pass a contiguous copy",
                             value);
            }
            Py_XDECREF(type);
            Py_XDECREF(value);
            Py_XDECREF(tb);
        }
        return -1;
    }
    b->exported = 1;
    b->addr     = v->buf;
    b->nbytes   = (size_t)v->len;
    b->itemsize = (v->itemsize > 0) ? (size_t)v->itemsize : 1;
    b->mem      = STAGELINK_MEM_HOST;
    if (v->ndim == 0) {
        b->shape = PyTuple_New(0); /* a scalar: numpy's scalars, 0-d arrays */
    } else if (v->shape != NULL) {
        b->shape = PyTuple_New(v->ndim);
        for (i = 0; b->shape != NULL && i < v->ndim; ++i) {
            PyObject *dim = PyLong_FromSsize_t(v->shape[i]);

            if (dim == NULL) {
                Py_CLEAR(b->shape);
                break;
            }
            PyTuple_SET_ITEM(b->shape, i, dim);
        }
    } else {
        b->shape = Py_BuildValue("(n)", (Py_ssize_t)(b->nbytes / b->itemsize));
    }
    if (b->shape == NULL) {
        return -1;
    }
    /* numpy's own name where it has one */
    dtype = PyObject_GetAttr(obj, n_dtype);
    if (dtype != NULL && dtype != Py_None) {
        b->dtype = PyObject_Str(dtype);
        Py_DECREF(dtype);
        return (b->dtype == NULL) ? -1 : 0;
    }
    if (dtype != NULL) {
        Py_DECREF(dtype);
    } else if (!PyErr_ExceptionMatches(PyExc_AttributeError)) {
        return -1;
    }
    PyErr_Clear();
    fmt = (v->format != NULL) ? v->format : "B";
    fmt += strspn(fmt, "@=<>!");
    b->dtype = PyUnicode_FromString(sl_py_format_name(fmt));
    return (b->dtype == NULL) ? -1 : 0;
}

sl_py_buffer_t *sl_py_buffer_describe(PyObject *obj, int writable)
{
    sl_py_buffer_t *b;
    int             tensor;

    b = PyObject_New(sl_py_buffer_t, &sl_py_buffer_type);
    if (b == NULL) {
        return NULL;
    }
    b->addr     = NULL;
    b->nbytes   = 0;
    b->itemsize = 1;
    b->mem      = STAGELINK_MEM_HOST;
    b->device   = -1;
    b->dtype    = NULL;
    b->shape    = NULL;
    b->keep     = NULL;
    b->exported = 0;
    tensor = sl_py_is_tensor(obj);
    if (tensor < 0 || (tensor ? sl_py_describe_tensor(b, obj) :
                                sl_py_describe_export(b, obj, writable))) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

PyObject *sl_py_describe(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs)
{
    int writable;

    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "describe(obj, writable)");
        return NULL;
    }
    writable = PyObject_IsTrue(args[1]);
    return (writable < 0) ? NULL :
                            (PyObject *)sl_py_buffer_describe(args[0], writable);
}

void sl_py_buffer_release(sl_py_buffer_t *b)
{
    if (b->exported) {
        b->exported = 0;
        PyBuffer_Release(&b->view);
    }
    Py_CLEAR(b->keep);
}

static PyObject *sl_py_buffer_release_py(sl_py_buffer_t *b, PyObject *unused)
{
    (void)unused;
    sl_py_buffer_release(b);
    Py_RETURN_NONE;
}

static void sl_py_buffer_dealloc(sl_py_buffer_t *b)
{
    sl_py_buffer_release(b);
    Py_XDECREF(b->dtype);
    Py_XDECREF(b->shape);
    PyObject_Free(b);
}

/* The element type's name, as torch and numpy print it. */
static PyObject *sl_py_buffer_dtype(sl_py_buffer_t *b, void *closure)
{
    PyObject *name, *prefix, *empty, *bare = NULL;

    (void)closure;
    if (PyUnicode_Check(b->dtype)) {
        Py_INCREF(b->dtype);
        return b->dtype;
    }
    name   = PyObject_Str(b->dtype); /* "torch.float32" -> "float32" */
    prefix = PyUnicode_FromString("torch.");
    empty  = PyUnicode_FromString("");
    if (name != NULL && prefix != NULL && empty != NULL) {
        bare = PyUnicode_Replace(name, prefix, empty, -1);
    }
    Py_XDECREF(empty);
    Py_XDECREF(prefix);
    Py_XDECREF(name);
    return bare;
}

/* "float32[4, 1024]": what the request carries, for sentences. */
static PyObject *sl_py_buffer_text(sl_py_buffer_t *b, PyObject *unused)
{
    PyObject *dtype, *dims, *sep, *joined, *text = NULL;
    Py_ssize_t i, n = PyTuple_Size(b->shape);

    (void)unused;
    if (n < 0) {
        return NULL;
    }
    dims = PyList_New(n);
    for (i = 0; dims != NULL && i < n; ++i) {
        PyObject *dim = PyObject_Str(PyTuple_GET_ITEM(b->shape, i));

        if (dim == NULL) {
            Py_CLEAR(dims);
            break;
        }
        PyList_SET_ITEM(dims, i, dim);
    }
    if (dims == NULL) {
        return NULL;
    }
    sep    = PyUnicode_FromString(", ");
    joined = (sep != NULL) ? PyUnicode_Join(sep, dims) : NULL;
    dtype  = (joined != NULL) ? sl_py_buffer_dtype(b, NULL) : NULL;
    if (dtype != NULL) {
        text = PyUnicode_FromFormat("%U[%U]", dtype, joined);
    }
    Py_XDECREF(dtype);
    Py_XDECREF(joined);
    Py_XDECREF(sep);
    Py_DECREF(dims);
    return text;
}

static PyObject *sl_py_buffer_addr(sl_py_buffer_t *b, void *closure)
{
    (void)closure;
    return PyLong_FromVoidPtr(b->addr);
}

static PyObject *sl_py_buffer_nbytes(sl_py_buffer_t *b, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(b->nbytes);
}

static PyObject *sl_py_buffer_itemsize(sl_py_buffer_t *b, void *closure)
{
    (void)closure;
    return PyLong_FromSize_t(b->itemsize);
}

static PyObject *sl_py_buffer_device(sl_py_buffer_t *b, void *closure)
{
    (void)closure;
    if (b->device < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLong(b->device);
}

static PyMemberDef sl_py_buffer_members[] = {
    {"mem", T_INT, offsetof(sl_py_buffer_t, mem), READONLY,
     "stagelink_mem_type_t"},
    {"shape", T_OBJECT, offsetof(sl_py_buffer_t, shape), READONLY, "a tuple"},
    {NULL, 0, 0, 0, NULL}
};

static PyGetSetDef sl_py_buffer_getset[] = {
    {"addr", (getter)sl_py_buffer_addr, NULL, "the first byte", NULL},
    {"nbytes", (getter)sl_py_buffer_nbytes, NULL, "its size in bytes", NULL},
    {"itemsize", (getter)sl_py_buffer_itemsize, NULL, "an element's size",
     NULL},
    {"device", (getter)sl_py_buffer_device, NULL,
     "a CUDA tensor's device, else None", NULL},
    {"dtype", (getter)sl_py_buffer_dtype, NULL,
     "the element type's name, as torch and numpy print it", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyMethodDef sl_py_buffer_methods[] = {
    {"release", (PyCFunction)sl_py_buffer_release_py, METH_NOARGS,
     "Drops what held the memory; the transport no longer touches it."},
    {"describe", (PyCFunction)sl_py_buffer_text, METH_NOARGS,
     "dtype[shape], for sentences."},
    {NULL, NULL, 0, NULL}
};

PyTypeObject sl_py_buffer_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name      = "stagelink._calls.Buffer",
    .tp_basicsize = sizeof(sl_py_buffer_t),
    .tp_dealloc   = (destructor)sl_py_buffer_dealloc,
    .tp_flags     = Py_TPFLAGS_DEFAULT,
    .tp_doc       = "One transfer's buffer, described at post time "
                    "(describe(obj, writable)); it holds the memory until "
                    "release().",
    .tp_methods   = sl_py_buffer_methods,
    .tp_getset    = sl_py_buffer_getset,
    .tp_members   = sl_py_buffer_members,
};
