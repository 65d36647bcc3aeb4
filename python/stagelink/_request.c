/*
 * stagelink.Request's compiled part: the state of one posted transfer, its
 * post and its wait loop.  A post and a wait that completes are the whole
 * of a message's cost from Python, so their common path runs here without
 * a Python frame; every other path (an error, a deadline, a dropped
 * request to reap, a CUDA stream to order, a STAGELINK_CHECK descriptor)
 * is handed to the Communicator's and Request's Python methods, under the
 * same hold of the communicator's lock.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_request.h"

#include <math.h>
#include <structmember.h>
#include <time.h>

/* Names asked for, interned once. */
static PyObject *n_calls, *n_lock, *n_acquire, *n_release, *n_open,
                *n_closing, *n_require_open, *n_wait, *n_orphans, *n_reap,
                *n_arm, *n_waited, *n_posted, *n_result, *n_raise_timeout,
                *n_settle, *n_isend, *n_irecv, *n_args, *n_max_chunk,
                *n_check, *n_attach_check;

int sl_py_request_init(void)
{
    static const sl_py_name_t names[] = {
        {&n_calls, "_calls"}, {&n_lock, "_lock"}, {&n_acquire, "acquire"},
        {&n_release, "release"}, {&n_open, "_open"},
        {&n_closing, "_closing"}, {&n_require_open, "_require_open"},
        {&n_wait, "wait"}, {&n_orphans, "_orphans"}, {&n_reap, "_reap"},
        {&n_arm, "_arm_current_stream"}, {&n_waited, "_waited"},
        {&n_posted, "_posted"}, {&n_result, "_result"},
        {&n_raise_timeout, "_raise_timeout"}, {&n_settle, "_settle"},
        {&n_isend, "isend"}, {&n_irecv, "irecv"}, {&n_args, "_args"},
        {&n_max_chunk, "_max_chunk"}, {&n_check, "_check"},
        {&n_attach_check, "_attach_check"},
    };

    return sl_py_intern(names, sizeof(names) / sizeof(names[0]));
}

static int request_none(PyObject *obj)
{
    return obj == NULL || obj == Py_None;
}

/* -1 with ValueError for a Request made without a communicator. */
static int request_ready(sl_py_request_t *self)
{
    if (self->comm == NULL || self->calls == NULL) {
        PyErr_SetString(PyExc_ValueError, "this Request belongs to no "
                        "communicator: Requests come from a Communicator's "
                        "isend, irecv and batch_isend_irecv");
        return -1;
    }
    return 0;
}

/* comm.<name>(request, status): its Python handling of a status. */
static PyObject *request_call_status(PyObject *comm, PyObject *name,
                                     sl_py_request_t *self,
                                     stagelink_status_t status)
{
    PyObject *st = PyLong_FromLong(status), *r;

    if (st == NULL) {
        return NULL;
    }
    r = PyObject_CallMethodObjArgs(comm, name, (PyObject *)self, st, NULL);
    Py_DECREF(st);
    return r;
}

/* The communicator's Calls, checked; kept by the request. */
static int request_bind(sl_py_request_t *self, PyObject *comm)
{
    PyObject *calls = PyObject_GetAttr(comm, n_calls);

    if (calls == NULL) {
        return -1;
    }
    if (sl_py_calls_of(calls) == NULL) {
        Py_DECREF(calls);
        return -1;
    }
    Py_INCREF(comm);
    Py_XSETREF(self->comm, comm);
    Py_XSETREF(self->calls, calls);
    return 0;
}

/* Request(comm, handle=None, buf=None, what=None, check=None,
 *         stream=None) */
static int request_init(sl_py_request_t *self, PyObject *args,
                        PyObject *kwargs)
{
    static char *names[] = {"comm", "handle", "buf", "what", "check",
                            "stream", NULL};
    PyObject *comm, *handle = Py_None, *buf = NULL, *what = NULL;
    PyObject *check = NULL, *stream = NULL;
    void     *req;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|OOOOO:Request", names,
                                     &comm, &handle, &buf, &what, &check,
                                     &stream) ||
        sl_py_addr(handle, &req) || request_bind(self, comm)) {
        return -1;
    }
    self->handle = req;
    Py_XINCREF(buf);
    Py_XSETREF(self->buf, buf);
    Py_XINCREF(what);
    Py_XSETREF(self->desc, what);
    Py_XINCREF(check);
    Py_XSETREF(self->check, check);
    Py_XINCREF(stream);
    Py_XSETREF(self->stream, stream);
    return 0;
}

/* The communicator's lock taken (one thread in the library at a time);
 * NULL with an exception when it could not be. */
static PyObject *request_lock(PyObject *comm)
{
    PyObject *lock = PyObject_GetAttr(comm, n_lock), *r;

    if (lock == NULL) {
        return NULL;
    }
    r = PyObject_CallMethodNoArgs(lock, n_acquire);
    if (r == NULL) {
        Py_DECREF(lock);
        return NULL;
    }
    Py_DECREF(r);
    return lock;
}

/* Gives the lock back whatever happened: `rc` as it was, or -1 when the
 * release failed; an exception being raised is kept, as the first. */
static int request_unlock(PyObject *lock, int rc)
{
    PyObject *type, *value, *tb, *r;

    PyErr_Fetch(&type, &value, &tb);
    r = PyObject_CallMethodNoArgs(lock, n_release);
    Py_DECREF(lock);
    if (r == NULL) {
        rc = -1;
        if (type != NULL) {
            PyErr_Clear();
        }
    }
    Py_XDECREF(r);
    if (type != NULL) {
        PyErr_Restore(type, value, tb);
    }
    return rc;
}

/* Whether the communicator is open; raises ClosedError (through
 * comm._require_open(what)) when not. */
static int request_comm_open(PyObject *comm, PyObject *what)
{
    PyObject *open = PyObject_GetAttr(comm, n_open), *closing, *r;
    int       ok;

    if (open == NULL) {
        return -1;
    }
    closing = PyObject_GetAttr(comm, n_closing);
    ok = (open == Py_True && closing == Py_False);
    Py_DECREF(open);
    if (closing == NULL) {
        return -1;
    }
    Py_DECREF(closing);
    if (ok) {
        return 0;
    }
    r = PyObject_CallMethodOneArg(comm, n_require_open, what);
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* Dropped requests completed first (comm._reap), when there are any. */
static int request_reap(PyObject *comm)
{
    PyObject  *orphans = PyObject_GetAttr(comm, n_orphans), *r;
    Py_ssize_t n;

    if (orphans == NULL) {
        return -1;
    }
    n = PyObject_Length(orphans);
    Py_DECREF(orphans);
    if (n <= 0) {
        return (int)n;
    }
    r = PyObject_CallMethodNoArgs(comm, n_reap);
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* An exact int within [0, max] as *out; 0 when `obj` is anything else. */
static int request_small(PyObject *obj, unsigned long long max,
                         unsigned long long *out)
{
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    *out = PyLong_AsUnsignedLongLong(obj);
    if (*out == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or too large: comm._args says so */
        return 0;
    }
    return *out <= max;
}

/* A post's (peer, microbatch, chunk, elem_size) as the descriptor takes
 * them, new references in out[4].  The common ones ("next" or "prev",
 * small ints, no elem_size) are taken in line; anything else goes to
 * comm._args, which checks it and says what is wrong. */
static int request_args(PyObject *comm, PyObject *const *in, PyObject **out)
{
    PyObject          *r, *max_obj;
    unsigned long long v, max_chunk;
    int                peer = -1, fast, i;

    if (PyUnicode_CheckExact(in[0])) {
        peer = (PyUnicode_CompareWithASCIIString(in[0], "next") == 0) ?
               STAGELINK_PEER_NEXT :
               (PyUnicode_CompareWithASCIIString(in[0], "prev") == 0) ?
               STAGELINK_PEER_PREV : -1;
    }
    fast = peer >= 0 && in[3] == Py_None &&
           request_small(in[1], STAGELINK_TAG_MAX_MICROBATCH, &v);
    if (fast) {
        max_obj = PyObject_GetAttr(comm, n_max_chunk);
        if (max_obj == NULL) {
            return -1;
        }
        max_chunk = PyLong_AsUnsignedLongLong(max_obj);
        Py_DECREF(max_obj);
        if (max_chunk == (unsigned long long)-1 && PyErr_Occurred()) {
            return -1;
        }
        fast = request_small(in[2], max_chunk, &v);
    }
    if (fast) {
        out[0] = PyLong_FromLong(peer);
        out[3] = PyLong_FromLong(0);
        if (out[0] == NULL || out[3] == NULL) {
            Py_CLEAR(out[0]);
            Py_CLEAR(out[3]);
            return -1;
        }
        Py_INCREF(in[1]);
        Py_INCREF(in[2]);
        out[1] = in[1];
        out[2] = in[2];
        return 0;
    }
    r = PyObject_CallMethodObjArgs(comm, n_args, in[0], in[1], in[2], in[3],
                                   NULL);
    if (r == NULL) {
        return -1;
    }
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
        PyErr_SetString(PyExc_TypeError, "Communicator._args returns "
                        "(peer, microbatch, chunk, elem_size)");
        Py_DECREF(r);
        return -1;
    }
    for (i = 0; i < 4; ++i) {
        out[i] = PyTuple_GET_ITEM(r, i);
        Py_INCREF(out[i]);
    }
    Py_DECREF(r);
    return 0;
}

/* With STAGELINK_CHECK, the dtype/shape descriptor of a request just
 * posted goes beside it (comm._attach_check, which cancels the transfer
 * when it cannot). */
static int request_checked(sl_py_request_t *self, PyObject *comm,
                           PyObject *recv, PyObject *const *args)
{
    PyObject *on = PyObject_GetAttr(comm, n_check), *r;
    int       truth;

    if (on == NULL) {
        return -1;
    }
    truth = PyObject_IsTrue(on);
    Py_DECREF(on);
    if (truth <= 0) {
        return truth;
    }
    r = PyObject_CallMethodObjArgs(comm, n_attach_check, (PyObject *)self,
                                   recv, args[0], args[1], args[2], NULL);
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* The post of one tensor, the lock held; args as _post's. */
static sl_py_request_t *request_post_locked(PyTypeObject *cls,
                                            PyObject *const *args)
{
    stagelink_xfer_t   xfer;
    sl_py_request_t   *self;
    sl_py_buffer_t    *b;
    stagelink_status_t status;
    PyObject          *fill[7] = {NULL}, *r;
    int                recv, i;

    recv = PyObject_IsTrue(args[1]);
    if (recv < 0 ||
        request_comm_open(args[0], recv ? n_irecv : n_isend) ||
        request_args(args[0], args + 3, fill + 2) ||
        request_reap(args[0]) < 0) {
        goto err_args;
    }
    self = (sl_py_request_t *)cls->tp_alloc(cls, 0);
    if (self == NULL || request_bind(self, args[0])) {
        goto err;
    }
    /* (recv, buf, peer, microbatch, chunk, elem_size, stream) */
    fill[0] = args[1];
    fill[1] = args[2];
    fill[6] = args[7];
    b = sl_py_calls_fill((sl_py_calls_t *)self->calls, fill, &xfer);
    if (b == NULL) {
        goto err;
    }
    self->buf = (PyObject *)b;
    /* What the request is (its sentences are made from it only when one
     * is needed), and for a CUDA receive what its wait orders after. */
    self->desc = PyTuple_Pack(5, args[1], fill[3], fill[4], fill[2],
                              (PyObject *)b);
    if (self->desc == NULL) {
        goto err;
    }
    if (recv && b->mem == STAGELINK_MEM_CUDA) {
        self->stream = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(xfer.stream),
                                     b->device);
        if (self->stream == NULL) {
            goto err;
        }
    }
    status = sl_py_calls_post((sl_py_calls_t *)self->calls, recv, &xfer,
                              &self->handle);
    if (status != STAGELINK_SUCCESS) {
        if (status > 0) {
            sl_py_buffer_release(b); /* nothing was posted: memory goes */
        }
        r = request_call_status(args[0], n_posted, self, status);
        Py_XDECREF(r); /* it raises */
        goto err;
    }
    if (request_checked(self, args[0], args[1], fill + 2)) {
        goto err;
    }
    for (i = 2; i < 6; ++i) {
        Py_DECREF(fill[i]);
    }
    return self;

err:
    if (self != NULL && self->handle == NULL) {
        self->done = 1; /* nothing to reap when it is dropped */
    }
    Py_XDECREF(self);
err_args:
    for (i = 2; i < 6; ++i) {
        Py_XDECREF(fill[i]);
    }
    return NULL;
}

/* Request._post(comm, recv, buf, peer, microbatch, chunk, elem_size,
 *               stream) -> Request
 * The whole post of one tensor, as isend and irecv take it, under the
 * communicator's lock: the arguments checked, dropped requests reaped,
 * `buf` described (its memory held by the request from here), the
 * descriptor filled and posted, and with STAGELINK_CHECK its dtype/shape
 * descriptor posted beside it.  A failed post raises, through
 * comm._posted. */
static PyObject *request_post_py(PyTypeObject *cls, PyObject *const *args,
                                 Py_ssize_t nargs)
{
    sl_py_request_t *self;
    PyObject        *lock;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "_post(comm, recv, buf, peer, "
                        "microbatch, chunk, elem_size, stream)");
        return NULL;
    }
    lock = request_lock(args[0]);
    if (lock == NULL) {
        return NULL;
    }
    self = request_post_locked(cls, args);
    if (request_unlock(lock, 0) && self != NULL) {
        Py_CLEAR(self); /* dropped: completed in the background */
    }
    return (PyObject *)self;
}

/* _post_xfer(recv, xfer_address) -> status: isend or irecv of a
 * stagelink_xfer_t the binding built itself (a STAGELINK_CHECK record). */
static PyObject *request_post_xfer_py(sl_py_request_t *self,
                                      PyObject *const *args,
                                      Py_ssize_t nargs)
{
    const stagelink_xfer_t *xfer;
    int recv;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "_post_xfer(recv, xfer_address)");
        return NULL;
    }
    recv = PyObject_IsTrue(args[0]);
    xfer = PyLong_AsVoidPtr(args[1]);
    if (recv < 0 || (xfer == NULL && PyErr_Occurred()) ||
        request_ready(self)) {
        return NULL;
    }
    return PyLong_FromLong(sl_py_calls_post((sl_py_calls_t *)self->calls,
                                            recv, xfer, &self->handle));
}

/* Completed without an error and without a descriptor to settle: its
 * memory is let go (as Communicator._complete does for status 0). */
static int request_done_ok(sl_py_request_t *self)
{
    PyObject *buf = self->buf, *r;

    self->done   = 1;
    self->handle = NULL;
    self->buf    = NULL;
    if (request_none(buf)) {
        Py_XDECREF(buf);
        return 0;
    }
    if (Py_IS_TYPE(buf, &sl_py_buffer_type)) {
        sl_py_buffer_release((sl_py_buffer_t *)buf);
        Py_DECREF(buf);
        return 0;
    }
    r = PyObject_CallMethodNoArgs(buf, n_release);
    Py_DECREF(buf);
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* comm._settle(request, status), keeping the exception being raised. */
static void request_settle(sl_py_request_t *self, stagelink_status_t status)
{
    PyObject *type, *value, *tb, *r;

    PyErr_Fetch(&type, &value, &tb);
    r = request_call_status(self->comm, n_settle, self, status);
    if (r == NULL) {
        PyErr_Clear();
    }
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

/* One slice of the wait, with the communicator's lock held. */
static int request_slice_locked(sl_py_request_t *self, int slice_ms,
                                int *status)
{
    PyObject *r;

    *status = STAGELINK_SUCCESS;
    if (request_comm_open(self->comm, n_wait)) {
        return -1;
    }
    if (self->done) { /* another thread completed it meanwhile */
        return 0;
    }
    if (request_reap(self->comm) < 0) {
        return -1;
    }
    if (!request_none(self->stream)) {
        r = PyObject_CallMethodNoArgs((PyObject *)self, n_arm);
        if (r == NULL) {
            return -1;
        }
        Py_DECREF(r);
    }
    if (self->done) { /* the reap completed it */
        return 0;
    }
    if (sl_py_handle(self->handle)) {
        return -1;
    }
    *status = sl_py_calls_wait((sl_py_calls_t *)self->calls, self->handle,
                               slice_ms);
    if (*status == STAGELINK_IN_PROGRESS) {
        return 0;
    }
    if (*status == STAGELINK_SUCCESS && request_none(self->check)) {
        return request_done_ok(self);
    }
    r = request_call_status(self->comm, n_waited, self, *status);
    if (r == NULL && !self->done && *status != STAGELINK_IN_PROGRESS &&
        *status != STAGELINK_ERR_TIMEOUT) {
        request_settle(self, *status); /* an exception landed midway */
    }
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* One slice of the wait, under the communicator's lock. */
static int request_slice(sl_py_request_t *self, int slice_ms, int *status)
{
    PyObject *lock = request_lock(self->comm);

    if (lock == NULL) {
        return -1;
    }
    return request_unlock(lock, request_slice_locked(self, slice_ms,
                                                     status));
}

static double request_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *request_wait_until(sl_py_request_t *self, PyObject *seconds,
                                    double deadline);

/* wait(timeout=None) */
static PyObject *request_wait(sl_py_request_t *self, PyObject *const *args,
                              Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject  *timeout = Py_None, *seconds = NULL, *r;
    Py_ssize_t nkw = (kwnames != NULL) ? PyTuple_GET_SIZE(kwnames) : 0;
    double     limit = 0, deadline = 0;

    if (nargs + nkw > 1) {
        PyErr_Format(PyExc_TypeError, "wait() takes at most 1 argument "
                     "(%zd given)", nargs + nkw);
        return NULL;
    }
    if (nkw == 1 && PyUnicode_CompareWithASCIIString(
                        PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0) {
        PyErr_Format(PyExc_TypeError, "wait() got an unexpected keyword "
                     "argument '%U'", PyTuple_GET_ITEM(kwnames, 0));
        return NULL;
    }
    if (nargs + nkw == 1) {
        timeout = args[0];
    }
    if (timeout != Py_None) {
        /* seconds, or a datetime.timedelta as torch's Work.wait takes */
        seconds = PyNumber_Check(timeout)
                      ? PyNumber_Float(timeout)
                      : PyObject_CallMethod(timeout, "total_seconds", NULL);
        if (seconds == NULL || !PyFloat_Check(seconds)) {
            PyErr_Clear();
            Py_XDECREF(seconds);
            PyErr_Format(PyExc_TypeError, "wait(timeout=%R): give seconds "
                         "(a number or a datetime.timedelta), or None to "
                         "wait until it completes", timeout);
            return NULL;
        }
        limit = PyFloat_AS_DOUBLE(seconds);
        if (isnan(limit)) {
            Py_DECREF(seconds);
            PyErr_SetString(PyExc_ValueError, "wait(timeout=nan): give "
                            "seconds, or None to wait until it completes");
            return NULL;
        }
        deadline = request_now() + limit;
    }
    r = request_wait_until(self, seconds, deadline);
    Py_XDECREF(seconds);
    return r;
}

/* wait()'s loop; `seconds` NULL: no deadline of its own.  True once done,
 * as torch's Work.wait(). */
static PyObject *request_wait_until(sl_py_request_t *self, PyObject *seconds,
                                    double deadline)
{
    PyObject *r;
    double    left;
    int       slice_ms, status;

    if (!self->done && request_ready(self)) {
        return NULL;
    }
    while (!self->done) {
        slice_ms = SL_PY_SLICE_MS;
        if (seconds != NULL) {
            left = (deadline - request_now()) * 1e3;
            if (left < slice_ms) {
                slice_ms = (left > 0) ? (int)left : 0;
            }
        }
        if (request_slice(self, slice_ms, &status)) {
            return NULL;
        }
        if (status == STAGELINK_ERR_TIMEOUT ||
            (!self->done && seconds != NULL &&
             request_now() >= deadline)) {
            /* the library's deadline (its sentence), or this wait's */
            r = PyObject_CallMethodOneArg(
                (PyObject *)self, n_raise_timeout,
                (status == STAGELINK_ERR_TIMEOUT) ? Py_None : seconds);
            Py_XDECREF(r);
            return NULL;
        }
        if (!self->done && PyErr_CheckSignals()) {
            return NULL; /* Ctrl-C: the request stays in flight */
        }
    }
    if (!request_none(self->err) || !request_none(self->stream)) {
        r = PyObject_CallMethodNoArgs((PyObject *)self, n_result);
        if (r == NULL) {
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_RETURN_TRUE;
}

static PyObject *request_handle(sl_py_request_t *self, void *closure)
{
    (void)closure;
    if (self->handle == NULL) {
        Py_RETURN_NONE;
    }
    return PyLong_FromVoidPtr(self->handle);
}

static int request_set_handle(sl_py_request_t *self, PyObject *value,
                              void *closure)
{
    (void)closure;
    void *req;

    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "_handle cannot be deleted");
        return -1;
    }
    if (sl_py_addr(value, &req)) {
        return -1;
    }
    self->handle = req;
    return 0;
}

static int request_traverse(sl_py_request_t *self, visitproc visit,
                            void *arg)
{
    Py_VISIT(self->comm);
    Py_VISIT(self->calls);
    Py_VISIT(self->buf);
    Py_VISIT(self->desc);
    Py_VISIT(self->err);
    Py_VISIT(self->timed_out);
    Py_VISIT(self->check);
    Py_VISIT(self->stream);
    Py_VISIT(self->ordered);
    return 0;
}

static int request_clear(sl_py_request_t *self)
{
    Py_CLEAR(self->comm);
    Py_CLEAR(self->calls);
    Py_CLEAR(self->buf);
    Py_CLEAR(self->desc);
    Py_CLEAR(self->err);
    Py_CLEAR(self->timed_out);
    Py_CLEAR(self->check);
    Py_CLEAR(self->stream);
    Py_CLEAR(self->ordered);
    return 0;
}

static void request_dealloc(sl_py_request_t *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) {
        PyObject_ClearWeakRefs((PyObject *)self);
    }
    request_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define SL_PY_REQUEST_MEMBER(name, field, doc) \
    {name, T_OBJECT, offsetof(sl_py_request_t, field), 0, doc}

static PyMemberDef request_members[] = {
    {"_comm", T_OBJECT, offsetof(sl_py_request_t, comm), READONLY,
     "the Communicator"},
    {"_done", T_BOOL, offsetof(sl_py_request_t, done), 0,
     "completed (or never posted)"},
    SL_PY_REQUEST_MEMBER("_buf", buf, "what holds the memory"),
    SL_PY_REQUEST_MEMBER("_desc", desc, "what it is, for sentences"),
    SL_PY_REQUEST_MEMBER("_err", err, "(status, sentence) once failed"),
    SL_PY_REQUEST_MEMBER("_timed_out", timed_out,
                         "the library's deadline's sentence"),
    SL_PY_REQUEST_MEMBER("_check", check, "STAGELINK_CHECK's descriptor"),
    SL_PY_REQUEST_MEMBER("_stream", stream,
                         "a CUDA receive: (cudaStream_t of the post, "
                         "device); the data is ready on that stream"),
    SL_PY_REQUEST_MEMBER("_ordered", ordered,
                         "the stream the library orders at completion"),
    {NULL, 0, 0, 0, NULL}
};

static PyGetSetDef request_getset[] = {
    {"_handle", (getter)request_handle, (setter)request_set_handle,
     "the library's request (an int), None once released", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

static PyMethodDef request_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))request_wait,
     METH_FASTCALL | METH_KEYWORDS,
     "wait($self, /, timeout=None)\n--\n\n"
     "Blocks until the transfer completes and returns True; raises its error.  As torch's Work.wait(), the current CUDA stream then waits "
     "for a received CUDA tensor's data (an event on the post's "
     "stream).\n\n"
     "The wait sleeps in slices of 50 ms, so signals are handled at once "
     "(Ctrl-C raises KeyboardInterrupt; the request stays in flight).  "
     "`timeout` (seconds, or a datetime.timedelta) bounds this wait only: on expiry TimeoutError is "
     "raised and the request stays in flight, as after the library's own "
     "deadline (STAGELINK_TIMEOUT): wait again or cancel it."},
    {"_post", (PyCFunction)(void (*)(void))request_post_py,
     METH_FASTCALL | METH_CLASS,
     "_post(comm, recv, buf, peer, microbatch, chunk, elem_size, stream) "
     "-> Request: describes buf (held by the request) and posts it."},
    {"_post_xfer", (PyCFunction)(void (*)(void))request_post_xfer_py,
     METH_FASTCALL,
     "_post_xfer(recv, xfer_address) -> status: isend or irecv of a "
     "stagelink_xfer_t the caller built."},
    {NULL, NULL, 0, NULL}
};

PyTypeObject sl_py_request_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name           = "stagelink._calls.Request",
    .tp_basicsize      = sizeof(sl_py_request_t),
    .tp_dealloc        = (destructor)request_dealloc,
    .tp_flags          = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE |
                         Py_TPFLAGS_HAVE_GC,
    .tp_doc            = "One posted transfer's state, post and wait "
                         "(stagelink.Request's compiled part).",
    .tp_traverse       = (traverseproc)request_traverse,
    .tp_clear          = (inquiry)request_clear,
    .tp_weaklistoffset = offsetof(sl_py_request_t, weakrefs),
    .tp_methods        = request_methods,
    .tp_members        = request_members,
    .tp_getset         = request_getset,
    .tp_init           = (initproc)request_init,
    .tp_new            = PyType_GenericNew,
};
