/*
 * stagelink._calls: what a transfer goes through on its way (its buffer's
 * description, the post, test and wait), in compiled code.  Through
 * ctypes and Python these cost several microseconds a message, more than
 * the transfer itself at a few KiB; everything else stays in ctypes
 * (_lib.py) and Python (communicator.py).
 *
 * The GIL is released around every plugin call, as ctypes does: a call
 * progresses the transport, which may run the config's callbacks (a TP
 * group's gather in Python) and must not hold up the helper thread.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_buffer.h"

#include <string.h>

#include "stagelink/stagelink.h"

typedef struct {
    PyObject_HEAD
    stagelink_comm_t            *comm;
    const stagelink_plugin_v1_t *vt;
    int                          sliced; /* the plugin has wait_for */
    PyObject                    *cuda_stream; /* (tensor, stream) -> stream */
} calls_t;

/* Request attributes, interned once. */
static PyObject *n_handle, *n_buf, *n_desc, *n_stream;

/* An address as ctypes gives it: an int (None for NULL). */
static int calls_addr(PyObject *obj, void **out)
{
    if (obj == Py_None) {
        *out = NULL;
        return 0;
    }
    *out = PyLong_AsVoidPtr(obj);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int calls_init(calls_t *self, PyObject *args, PyObject *kwargs)
{
    PyObject *vt, *comm, *cuda_stream;
    void *vt_addr, *comm_addr;
    static char *names[] = {"vtable", "comm", "cuda_stream", NULL};

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:Calls", names, &vt,
                                     &comm, &cuda_stream) ||
        calls_addr(vt, &vt_addr) || calls_addr(comm, &comm_addr)) {
        return -1;
    }
    if (vt_addr == NULL || comm_addr == NULL) {
        PyErr_SetString(PyExc_ValueError, "Calls(vtable, comm, "
                        "cuda_stream): vtable and comm are the addresses of "
                        "a loaded plugin's vtable and of its communicator, "
                        "not NULL");
        return -1;
    }
    Py_INCREF(cuda_stream);
    Py_XSETREF(self->cuda_stream, cuda_stream);
    self->vt     = vt_addr;
    self->comm   = comm_addr;
    self->sliced = self->vt->struct_size >=
                   offsetof(stagelink_plugin_v1_t, wait_for) +
                   sizeof(self->vt->wait_for);
    return 0;
}

/* The request of an int argument: the handle a post returned. */
static int calls_request(PyObject *obj, stagelink_request_t **req)
{
    *req = PyLong_AsVoidPtr(obj);
    if (*req == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "a request handle of 0: the "
                        "request was never posted or is already released");
    }
    return (*req == NULL) ? -1 : 0;
}

/* isend or irecv of `xfer`; the handle goes into request._handle before
 * the call returns, so that no exception (Ctrl-C) landing on the return
 * can lose a request the library owns.  -1 with an exception set, else
 * the status. */
static int calls_post_xfer(calls_t *self, PyObject *request, int recv,
                           const stagelink_xfer_t *xfer)
{
    stagelink_request_t *req = NULL;
    stagelink_status_t   status;
    PyObject            *handle, *type, *value, *tb, *held;
    int                  failed;

    Py_BEGIN_ALLOW_THREADS
    status = (recv ? self->vt->irecv : self->vt->isend)(self->comm, xfer,
                                                        &req);
    Py_END_ALLOW_THREADS
    if (req != NULL) {
        handle = PyLong_FromVoidPtr(req);
        failed = (handle == NULL) ||
                 PyObject_SetAttr(request, n_handle, handle);
        Py_XDECREF(handle);
        if (failed) {
            /* Nobody can hold it (out of memory): canceled, ended by
             * finalize (stagelink.h); its memory is kept for good, since
             * a send cannot be canceled under UCX. */
            PyErr_Fetch(&type, &value, &tb);
            held = PyObject_GetAttr(request, n_buf); /* leaked on purpose */
            Py_BEGIN_ALLOW_THREADS
            (void)self->vt->cancel(self->comm, req);
            Py_END_ALLOW_THREADS
            if (held == NULL) {
                PyErr_Clear();
            }
            PyErr_Restore(type, value, tb);
            return -1;
        }
    }
    return (int)status;
}

/* A Calls made without its arguments has no plugin to call. */
static int calls_ready(calls_t *self)
{
    if (self->vt == NULL) {
        PyErr_SetString(PyExc_ValueError, "this Calls has no plugin: "
                        "create it as Calls(vtable, comm, cuda_stream)");
        return -1;
    }
    return 0;
}

/* post_xfer(request, recv, xfer_address) -> status: a descriptor the
 * binding built itself (a STAGELINK_CHECK record). */
static PyObject *calls_post_xfer_py(calls_t *self, PyObject *const *args,
                                    Py_ssize_t nargs)
{
    const stagelink_xfer_t *xfer;
    int recv, status;

    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "post_xfer(request, recv, xfer_address)");
        return NULL;
    }
    recv = PyObject_IsTrue(args[1]);
    xfer = PyLong_AsVoidPtr(args[2]);
    if (calls_ready(self) || recv < 0 || (xfer == NULL && PyErr_Occurred())) {
        return NULL;
    }
    status = calls_post_xfer(self, args[0], recv, xfer);
    return (status < 0) ? NULL : PyLong_FromLong(status);
}

/* The stream a CUDA tensor's transfer is ordered on: cuda_stream(tensor,
 * stream) (torch's current one, or `stream` recorded on the tensor). */
static int calls_cuda_stream(calls_t *self, PyObject *tensor,
                             PyObject *stream, void **out)
{
    PyObject *r = PyObject_CallFunctionObjArgs(self->cuda_stream, tensor,
                                               stream, NULL);
    int       failed;

    if (r == NULL) {
        return -1;
    }
    failed = calls_addr(r, out);
    Py_DECREF(r);
    return failed;
}

/* One transfer's descriptor from its arguments, as post and fill take
 * them: (recv, buf, peer, microbatch, chunk, elem_size, stream), checked
 * by the caller (elem_size 0: the buffer's item size; stream None:
 * torch's current one).  Returns the Buffer (a new reference) or NULL. */
static sl_py_buffer_t *calls_fill(calls_t *self, PyObject *const *args,
                                  stagelink_xfer_t *xfer)
{
    sl_py_buffer_t *b;
    size_t          elem_size;
    int             recv;

    memset(xfer, 0, sizeof(*xfer));
    recv                 = PyObject_IsTrue(args[0]);
    xfer->peer           = (stagelink_peer_t)PyLong_AsLong(args[2]);
    xfer->tag.microbatch = (uint32_t)PyLong_AsUnsignedLong(args[3]);
    xfer->tag.chunk      = (uint16_t)PyLong_AsUnsignedLong(args[4]);
    elem_size            = PyLong_AsSize_t(args[5]);
    if (recv < 0 || PyErr_Occurred()) {
        return NULL;
    }
    b = sl_py_buffer_describe(args[1], recv);
    if (b == NULL) {
        return NULL;
    }
    xfer->buf       = b->addr;
    xfer->nbytes    = b->nbytes;
    xfer->elem_size = elem_size ? elem_size : b->itemsize;
    xfer->mem_type  = (stagelink_mem_type_t)b->mem;
    if (b->mem == STAGELINK_MEM_CUDA &&
        calls_cuda_stream(self, args[1], args[6], &xfer->stream)) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

/* fill(xfer_address, recv, buf, peer, microbatch, chunk, elem_size,
 *      stream) -> Buffer: a descriptor of a batch, written at that
 * address (a stagelink_op_t's xfer). */
static PyObject *calls_fill_py(calls_t *self, PyObject *const *args,
                               Py_ssize_t nargs)
{
    stagelink_xfer_t *xfer;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "fill(xfer_address, recv, buf, "
                        "peer, microbatch, chunk, elem_size, stream)");
        return NULL;
    }
    xfer = PyLong_AsVoidPtr(args[0]);
    if (xfer == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_ValueError, "fill: a NULL descriptor");
        }
        return NULL;
    }
    return (PyObject *)calls_fill(self, args + 1, xfer);
}

/* post(request, recv, buf, peer, microbatch, chunk, elem_size, stream)
 *   -> status
 * The whole post of one tensor: `buf` described (the memory held by
 * request._buf from here), the descriptor filled and posted. */
static PyObject *calls_post(calls_t *self, PyObject *const *args,
                            Py_ssize_t nargs)
{
    stagelink_xfer_t xfer;
    sl_py_buffer_t  *b;
    PyObject        *request, *desc = NULL, *where = NULL;
    int              recv, status = -1;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "post(request, recv, buf, peer, "
                        "microbatch, chunk, elem_size, stream)");
        return NULL;
    }
    if (calls_ready(self)) {
        return NULL;
    }
    request = args[0];
    b       = calls_fill(self, args + 1, &xfer);
    if (b == NULL) {
        return NULL;
    }
    recv = PyObject_IsTrue(args[1]);
    /* What the request is (its sentences are made from it only when one
     * is needed), and for a CUDA receive what its wait orders after. */
    desc = PyTuple_Pack(5, args[1], args[4], args[5], args[3], (PyObject *)b);
    if (desc == NULL || PyObject_SetAttr(request, n_desc, desc) ||
        PyObject_SetAttr(request, n_buf, (PyObject *)b)) {
        goto out;
    }
    if (recv && b->mem == STAGELINK_MEM_CUDA) {
        where = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(xfer.stream),
                              b->device);
        if (where == NULL || PyObject_SetAttr(request, n_stream, where)) {
            goto out;
        }
    }
    status = calls_post_xfer(self, request, recv, &xfer);
    if (status > 0) {
        sl_py_buffer_release(b); /* nothing was posted: the memory goes */
    }
out:
    Py_XDECREF(where);
    Py_XDECREF(desc);
    Py_DECREF(b);
    return (status == -1) ? NULL : PyLong_FromLong(status);
}

/* test(handle) -> (status, done) */
static PyObject *calls_test(calls_t *self, PyObject *handle)
{
    stagelink_request_t *req;
    stagelink_status_t status;
    int done = 0;

    if (calls_ready(self) || calls_request(handle, &req)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->test(self->comm, req, &done);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ii)", (int)status, done);
}

/* wait(handle, slice_ms) -> status: one slice of wait_for (IN_PROGRESS
 * when it ends first); a plugin older than wait_for waits to the end. */
static PyObject *calls_wait(calls_t *self, PyObject *const *args,
                            Py_ssize_t nargs)
{
    stagelink_request_t *req;
    stagelink_status_t status;
    int slice_ms;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(handle, slice_ms)");
        return NULL;
    }
    if (calls_ready(self) || calls_request(args[0], &req)) {
        return NULL;
    }
    slice_ms = PyLong_AsLong(args[1]);
    if (slice_ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->sliced ? self->vt->wait_for(self->comm, req, slice_ms) :
                            self->vt->wait(self->comm, req);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

static PyMethodDef calls_methods[] = {
    {"post", (PyCFunction)(void (*)(void))calls_post, METH_FASTCALL,
     "post(request, recv, buf, peer, microbatch, chunk, elem_size, stream) "
     "-> status: describes buf (held by request._buf) and posts it; the "
     "handle (an int) goes into request._handle when one was posted."},
    {"fill", (PyCFunction)(void (*)(void))calls_fill_py, METH_FASTCALL,
     "fill(xfer_address, recv, buf, peer, microbatch, chunk, elem_size, "
     "stream) -> Buffer: a batch's descriptor written at that address, "
     "as post fills its own."},
    {"post_xfer", (PyCFunction)(void (*)(void))calls_post_xfer_py,
     METH_FASTCALL,
     "post_xfer(request, recv, xfer_address) -> status: isend or irecv of "
     "a stagelink_xfer_t the caller built."},
    {"test", (PyCFunction)calls_test, METH_O,
     "test(handle) -> (status, done)."},
    {"wait", (PyCFunction)(void (*)(void))calls_wait, METH_FASTCALL,
     "wait(handle, slice_ms) -> status: wait_for one slice (-1: to the "
     "end); IN_PROGRESS when the slice ends first."},
    {NULL, NULL, 0, NULL}
};

static void calls_dealloc(calls_t *self)
{
    Py_XDECREF(self->cuda_stream);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject calls_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name      = "stagelink._calls.Calls",
    .tp_basicsize = sizeof(calls_t),
    .tp_dealloc   = (destructor)calls_dealloc,
    .tp_flags     = Py_TPFLAGS_DEFAULT,
    .tp_doc       = "Calls(vtable, comm, cuda_stream): the posts, test and "
                    "wait of one communicator of a loaded plugin (addresses "
                    "as ints; cuda_stream(tensor, stream) gives the stream "
                    "a CUDA tensor's transfer is ordered on).",
    .tp_methods   = calls_methods,
    .tp_init      = (initproc)calls_init,
    .tp_new       = PyType_GenericNew,
};

static PyMethodDef module_methods[] = {
    {"describe", (PyCFunction)(void (*)(void))sl_py_describe, METH_FASTCALL,
     "describe(obj, writable) -> Buffer: what obj is as a transfer buffer "
     "(ValueError or TypeError when it cannot be one); it holds the memory "
     "until release()."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef calls_module = {
    PyModuleDef_HEAD_INIT,
    .m_name    = "stagelink._calls",
    .m_doc     = "A transfer's buffer description, post, test and wait, "
                 "compiled.",
    .m_size    = -1,
    .m_methods = module_methods,
};

static int calls_add_type(PyObject *mod, const char *name, PyTypeObject *type)
{
    if (PyType_Ready(type) < 0) {
        return -1;
    }
    Py_INCREF(type);
    if (PyModule_AddObject(mod, name, (PyObject *)type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__calls(void)
{
    PyObject *mod;

    if (sl_py_buffer_init() ||
        (n_handle = PyUnicode_InternFromString("_handle")) == NULL ||
        (n_buf = PyUnicode_InternFromString("_buf")) == NULL ||
        (n_desc = PyUnicode_InternFromString("_desc")) == NULL ||
        (n_stream = PyUnicode_InternFromString("_stream")) == NULL) {
        return NULL;
    }
    mod = PyModule_Create(&calls_module);
    if (mod == NULL) {
        return NULL;
    }
    if (calls_add_type(mod, "Calls", &calls_type) ||
        calls_add_type(mod, "Buffer", &sl_py_buffer_type)) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
