/*
 * stagelink._calls: what a transfer goes through on its way (its buffer's
 * description, the post, test and wait, the Request), in compiled code.
 * Through ctypes and Python these cost several microseconds a message,
 * more than the transfer itself at a few KiB; everything else stays in
 * ctypes (_lib.py) and Python (communicator.py).  This file: one
 * communicator's plugin calls.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_calls.h"

#include <string.h>

int sl_py_addr(PyObject *obj, void **out)
{
    if (obj == Py_None) {
        *out = NULL;
        return 0;
    }
    *out = PyLong_AsVoidPtr(obj);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

static int calls_init(sl_py_calls_t *self, PyObject *args, PyObject *kwargs)
{
    PyObject *vt, *comm, *cuda_stream;
    void *vt_addr, *comm_addr;
    static char *names[] = {"vtable", "comm", "cuda_stream", NULL};

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:Calls", names, &vt,
                                     &comm, &cuda_stream) ||
        sl_py_addr(vt, &vt_addr) || sl_py_addr(comm, &comm_addr)) {
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

sl_py_calls_t *sl_py_calls_of(PyObject *obj)
{
    sl_py_calls_t *c = (sl_py_calls_t *)obj;

    if (!PyObject_TypeCheck(obj, &sl_py_calls_type)) {
        PyErr_Format(PyExc_TypeError, "a communicator's _calls is a "
                     "stagelink._calls.Calls, not %s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    if (c->vt == NULL) {
        /* made without its arguments: no plugin to call */
        PyErr_SetString(PyExc_ValueError, "this Calls has no plugin: "
                        "create it as Calls(vtable, comm, cuda_stream)");
        return NULL;
    }
    return c;
}

int sl_py_handle(stagelink_request_t *req)
{
    if (req == NULL) {
        PyErr_SetString(PyExc_ValueError, "a request handle of 0: the "
                        "request was never posted or is already released");
        return -1;
    }
    return 0;
}

/* The request of an int argument: the handle a post returned. */
static int calls_request(PyObject *obj, stagelink_request_t **req)
{
    return (sl_py_addr(obj, (void **)req) || sl_py_handle(*req)) ? -1 : 0;
}

stagelink_status_t sl_py_calls_post(sl_py_calls_t *c, int recv,
                                    const stagelink_xfer_t *xfer,
                                    stagelink_request_t **req)
{
    stagelink_status_t status;

    *req = NULL;
    Py_BEGIN_ALLOW_THREADS
    status = (recv ? c->vt->irecv : c->vt->isend)(c->comm, xfer, req);
    Py_END_ALLOW_THREADS
    return status;
}

stagelink_status_t sl_py_calls_wait(sl_py_calls_t *c,
                                    stagelink_request_t *req, int slice_ms)
{
    stagelink_status_t status;

    Py_BEGIN_ALLOW_THREADS
    status = c->sliced ? c->vt->wait_for(c->comm, req, slice_ms) :
                         c->vt->wait(c->comm, req);
    Py_END_ALLOW_THREADS
    return status;
}

/* The stream a CUDA tensor's transfer is ordered on: cuda_stream(tensor,
 * stream) (torch's current one, or `stream` recorded on the tensor). */
static int calls_cuda_stream(sl_py_calls_t *c, PyObject *tensor,
                             PyObject *stream, void **out)
{
    PyObject *r = PyObject_CallFunctionObjArgs(c->cuda_stream, tensor,
                                               stream, NULL);
    int       failed;

    if (r == NULL) {
        return -1;
    }
    failed = sl_py_addr(r, out);
    Py_DECREF(r);
    return failed;
}

sl_py_buffer_t *sl_py_calls_fill(sl_py_calls_t *c, PyObject *const *args,
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
        calls_cuda_stream(c, args[1], args[6], &xfer->stream)) {
        Py_DECREF(b);
        return NULL;
    }
    return b;
}

/* fill(xfer_address, recv, buf, peer, microbatch, chunk, elem_size,
 *      stream) -> Buffer: a descriptor of a batch, written at that
 * address (a stagelink_op_t's xfer). */
static PyObject *calls_fill_py(sl_py_calls_t *self, PyObject *const *args,
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
    if (sl_py_calls_of((PyObject *)self) == NULL) {
        return NULL;
    }
    return (PyObject *)sl_py_calls_fill(self, args + 1, xfer);
}

/* test(handle) -> (status, done) */
static PyObject *calls_test(sl_py_calls_t *self, PyObject *handle)
{
    stagelink_request_t *req;
    stagelink_status_t status;
    int done = 0;

    if (sl_py_calls_of((PyObject *)self) == NULL ||
        calls_request(handle, &req)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->test(self->comm, req, &done);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ii)", (int)status, done);
}

/* wait(handle, slice_ms) -> status: one slice of wait_for. */
static PyObject *calls_wait(sl_py_calls_t *self, PyObject *const *args,
                            Py_ssize_t nargs)
{
    stagelink_request_t *req;
    int slice_ms;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(handle, slice_ms)");
        return NULL;
    }
    if (sl_py_calls_of((PyObject *)self) == NULL ||
        calls_request(args[0], &req)) {
        return NULL;
    }
    slice_ms = PyLong_AsLong(args[1]);
    if (slice_ms == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return PyLong_FromLong(sl_py_calls_wait(self, req, slice_ms));
}

static PyMethodDef calls_methods[] = {
    {"fill", (PyCFunction)(void (*)(void))calls_fill_py, METH_FASTCALL,
     "fill(xfer_address, recv, buf, peer, microbatch, chunk, elem_size, "
     "stream) -> Buffer: a batch's descriptor written at that address, "
     "as a single post fills its own."},
    {"test", (PyCFunction)calls_test, METH_O,
     "test(handle) -> (status, done)."},
    {"wait", (PyCFunction)(void (*)(void))calls_wait, METH_FASTCALL,
     "wait(handle, slice_ms) -> status: wait_for one slice (-1: to the "
     "end); IN_PROGRESS when the slice ends first."},
    {NULL, NULL, 0, NULL}
};

static void calls_dealloc(sl_py_calls_t *self)
{
    Py_XDECREF(self->cuda_stream);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyTypeObject sl_py_calls_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name      = "stagelink._calls.Calls",
    .tp_basicsize = sizeof(sl_py_calls_t),
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
