/*
 * stagelink.Request's compiled part: the state of one posted transfer, its
 * post and its wait loop.  A post and a wait that completes are the whole
 * of a message's cost from Python, so their common path runs here without
 * a Python frame; every other path (an error, a deadline, a dropped
 * request to reap, a CUDA stream to order, a STAGELINK_CHECK descriptor)
 * is handed to the Python the Communicator registered (Calls.bind), under
 * the same hold of the communicator's lock.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_request.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <structmember.h>
#include <time.h>

/* Names passed to the require_open hook, interned once. */
static PyObject *n_isend, *n_irecv, *n_wait, *n_batch;

int sl_py_request_init(void)
{
    static const sl_py_name_t names[] = {
        {&n_isend, "isend"}, {&n_irecv, "irecv"}, {&n_wait, "wait"},
        {&n_batch, "batch_isend_irecv"},
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
    if (self->calls == NULL) {
        PyErr_SetString(PyExc_ValueError, "this Request belongs to no "
                        "communicator: Requests come from a Communicator's "
                        "isend, irecv and batch_isend_irecv");
        return -1;
    }
    return 0;
}

/* The hook `hook`(request, status): its Python handling of a status. */
static PyObject *request_hook_status(sl_py_request_t *self,
                                     sl_py_hook_t hook,
                                     stagelink_status_t status)
{
    PyObject *args[2] = {(PyObject *)self, PyLong_FromLong(status)}, *r;

    if (args[1] == NULL) {
        return NULL;
    }
    r = sl_py_calls_hook(self->calls, hook, args, 2);
    Py_DECREF(args[1]);
    return r;
}

/* hook(request): a Request method on an uncommon path. */
static int request_hook(sl_py_request_t *self, sl_py_hook_t hook)
{
    PyObject *arg = (PyObject *)self;
    PyObject *r   = sl_py_calls_hook(self->calls, hook, &arg, 1);

    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* The communicator's lock taken (one thread in the library at a time);
 * -1 with an exception when it could not be. */
static int request_lock(sl_py_calls_t *c)
{
    PyObject *r = sl_py_calls_hook(c, SL_PY_HOOK_ACQUIRE, NULL, 0);

    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* Gives the lock back whatever happened: `rc` as it was, or -1 when the
 * release failed; an exception being raised is kept, as the first. */
static int request_unlock(sl_py_calls_t *c, int rc)
{
    PyObject *type, *value, *tb, *r;

    PyErr_Fetch(&type, &value, &tb);
    r = sl_py_calls_hook(c, SL_PY_HOOK_RELEASE, NULL, 0);
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

/* Whether the communicator is open; raises ClosedError (through the
 * require_open hook) when not. */
static int request_comm_open(sl_py_calls_t *c, PyObject *what)
{
    PyObject *r;

    if (c->state == SL_PY_CALLS_OPEN) {
        return 0;
    }
    r = sl_py_calls_hook(c, SL_PY_HOOK_REQUIRE_OPEN, &what, 1);
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* Dropped requests completed first (the reap hook), when there are any. */
static int request_reap(sl_py_calls_t *c)
{
    PyObject *r;

    if (c->orphans == NULL || PyList_GET_SIZE(c->orphans) == 0) {
        return 0;
    }
    r = sl_py_calls_hook(c, SL_PY_HOOK_REAP, NULL, 0);
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
        PyErr_Clear(); /* negative or too large: the args hook says so */
        return 0;
    }
    return *out <= max;
}

/* A post's (peer, microbatch, chunk, elem_size) as the descriptor takes
 * them, new references in out[4].  The common ones ("next" or "prev",
 * small ints, no elem_size) are taken in line; anything else goes to the
 * args hook, which checks it and says what is wrong. */
static int request_args(sl_py_calls_t *c, PyObject *const *in,
                        PyObject **out)
{
    PyObject          *r;
    unsigned long long v;
    int                peer = -1, i;

    if (PyUnicode_CheckExact(in[0])) {
        peer = (PyUnicode_CompareWithASCIIString(in[0], "next") == 0) ?
               STAGELINK_PEER_NEXT :
               (PyUnicode_CompareWithASCIIString(in[0], "prev") == 0) ?
               STAGELINK_PEER_PREV : -1;
    }
    if (peer >= 0 && in[3] == Py_None &&
        request_small(in[1], STAGELINK_TAG_MAX_MICROBATCH, &v) &&
        request_small(in[2], c->max_chunk, &v)) {
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
    r = sl_py_calls_hook(c, SL_PY_HOOK_ARGS, in, 4);
    if (r == NULL) {
        return -1;
    }
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 4) {
        PyErr_SetString(PyExc_TypeError, "the args hook returns "
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
 * posted goes beside it (the attach_check hook, which cancels the
 * transfer when it cannot). */
static int request_checked(sl_py_request_t *self, PyObject *recv,
                           PyObject *const *args)
{
    PyObject *call[5] = {(PyObject *)self, recv, args[0], args[1], args[2]};
    PyObject *r;

    if (!self->calls->check) {
        return 0;
    }
    r = sl_py_calls_hook(self->calls, SL_PY_HOOK_ATTACH_CHECK, call, 5);
    Py_XDECREF(r);
    return (r == NULL) ? -1 : 0;
}

/* A new Request of `cls` on `c` for one transfer: its buffer described
 * (held from here), *xfer filled, what it is and what a CUDA receive's
 * wait orders after.  fill: (recv, buf, peer, microbatch, chunk,
 * elem_size, stream); `what` NULL: a data transfer's description. */
static sl_py_request_t *request_new(PyTypeObject *cls, sl_py_calls_t *c,
                                    PyObject *const *fill, PyObject *what,
                                    stagelink_xfer_t *xfer)
{
    sl_py_request_t *self = (sl_py_request_t *)cls->tp_alloc(cls, 0);
    sl_py_buffer_t  *b;

    if (self == NULL) {
        return NULL;
    }
    self->done = 1; /* nothing to reap until it is posted */
    Py_INCREF(c);
    self->calls = c;
    b = sl_py_calls_fill(c, fill, xfer);
    if (b == NULL) {
        goto err;
    }
    self->buf = (PyObject *)b;
    /* Its sentences are made from this only when one is needed. */
    if (what != NULL) {
        Py_INCREF(what);
        self->desc = what;
    } else {
        self->desc = PyTuple_Pack(5, fill[0], fill[3], fill[4], fill[2],
                                  (PyObject *)b);
        if (self->desc == NULL) {
            goto err;
        }
    }
    if (PyObject_IsTrue(fill[0]) && b->mem == STAGELINK_MEM_CUDA) {
        self->stream = Py_BuildValue("(Ni)", PyLong_FromVoidPtr(xfer->stream),
                                     b->device);
        if (self->stream == NULL) {
            goto err;
        }
    }
    return self;

err:
    Py_DECREF(self);
    return NULL;
}

/* isend or irecv of a Request just made; a failed post raises through
 * the posted hook, its memory let go when nothing was posted. */
static int request_post_one(sl_py_request_t *self, int recv,
                            const stagelink_xfer_t *xfer)
{
    stagelink_status_t status;
    PyObject          *r;

    status = sl_py_calls_post(self->calls, recv, xfer, &self->handle);
    self->done = (self->handle == NULL);
    if (status == STAGELINK_SUCCESS) {
        return 0;
    }
    if (status > 0) {
        sl_py_buffer_release((sl_py_buffer_t *)self->buf);
    }
    r = request_hook_status(self, SL_PY_HOOK_POSTED, status);
    Py_XDECREF(r); /* it raises */
    return -1;
}

/* The post of one tensor, the lock held; args as _post's. */
static sl_py_request_t *request_post_locked(PyTypeObject *cls,
                                            sl_py_calls_t *c,
                                            PyObject *const *args)
{
    stagelink_xfer_t xfer;
    sl_py_request_t *self = NULL;
    PyObject        *fill[7] = {NULL};
    int              recv, i;

    recv = PyObject_IsTrue(args[1]);
    if (recv < 0 || request_comm_open(c, recv ? n_irecv : n_isend) ||
        request_args(c, args + 3, fill + 2) || request_reap(c)) {
        goto out;
    }
    /* (recv, buf, peer, microbatch, chunk, elem_size, stream) */
    fill[0] = args[1];
    fill[1] = args[2];
    fill[6] = args[7];
    self = request_new(cls, c, fill, NULL, &xfer);
    if (self == NULL || request_post_one(self, recv, &xfer) ||
        request_checked(self, args[1], fill + 2)) {
        Py_CLEAR(self);
    }
out:
    for (i = 2; i < 6; ++i) {
        Py_XDECREF(fill[i]);
    }
    return self;
}

/* Request._post(calls, recv, buf, peer, microbatch, chunk, elem_size,
 *               stream) -> Request
 * The whole post of one tensor, as isend and irecv take it, under the
 * communicator's lock: the arguments checked, dropped requests reaped,
 * `buf` described (its memory held by the request from here), the
 * descriptor filled and posted, and with STAGELINK_CHECK its dtype/shape
 * descriptor posted beside it.  A failed post raises. */
static PyObject *request_post_py(PyTypeObject *cls, PyObject *const *args,
                                 Py_ssize_t nargs)
{
    sl_py_request_t *self;
    sl_py_calls_t   *c;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "_post(calls, recv, buf, peer, "
                        "microbatch, chunk, elem_size, stream)");
        return NULL;
    }
    c = sl_py_calls_of(args[0]);
    if (c == NULL || request_lock(c)) {
        return NULL;
    }
    self = request_post_locked(cls, c, args);
    if (request_unlock(c, 0) && self != NULL) {
        Py_CLEAR(self); /* dropped: completed in the background */
    }
    return (PyObject *)self;
}

/* Request._post_record(calls, recv, record, peer, microbatch, chunk,
 *                      elem_size, what) -> Request
 * A host record of the binding's own (STAGELINK_CHECK's descriptor),
 * posted as given, the lock held by the caller. */
static PyObject *request_post_record_py(PyTypeObject *cls,
                                        PyObject *const *args,
                                        Py_ssize_t nargs)
{
    stagelink_xfer_t xfer;
    sl_py_request_t *self;
    sl_py_calls_t   *c;
    PyObject        *fill[7];
    int              recv;

    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "_post_record(calls, recv, record, "
                        "peer, microbatch, chunk, elem_size, what)");
        return NULL;
    }
    c = sl_py_calls_of(args[0]);
    if (c == NULL || (recv = PyObject_IsTrue(args[1])) < 0 ||
        request_comm_open(c, recv ? n_irecv : n_isend)) {
        return NULL;
    }
    memcpy(fill, args + 1, 6 * sizeof(*fill));
    fill[6] = Py_None;
    self    = request_new(cls, c, fill, args[7], &xfer);
    if (self == NULL || request_post_one(self, recv, &xfer)) {
        Py_XDECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Request._post_batch(calls, ops) -> (status, [Request])
 * ops: (recv, buf, peer, microbatch, chunk) each, checked by the caller,
 * who holds the lock.  post_batch posts all or none: on failure every
 * buffer is let go and no Request is returned. */
static PyObject *request_post_batch_py(PyTypeObject *cls,
                                       PyObject *const *args,
                                       Py_ssize_t nargs)
{
    stagelink_request_t **handles = NULL;
    stagelink_op_t       *ops     = NULL;
    stagelink_status_t    status;
    sl_py_request_t      *req;
    sl_py_calls_t        *c;
    PyObject             *list = NULL, *fill[7], *zero, *r = NULL;
    Py_ssize_t            n, i;
    int                   recv;

    if (nargs != 2 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "_post_batch(calls, ops): ops a "
                        "list of (recv, buf, peer, microbatch, chunk)");
        return NULL;
    }
    c = sl_py_calls_of(args[0]);
    if (c == NULL || request_comm_open(c, n_batch)) {
        return NULL;
    }
    n       = PyList_GET_SIZE(args[1]);
    ops     = calloc((size_t)n + 1, sizeof(*ops));
    handles = calloc((size_t)n + 1, sizeof(*handles));
    list    = PyList_New(n);
    zero    = PyLong_FromLong(0);
    if (ops == NULL || handles == NULL || list == NULL || zero == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (i = 0; i < n; ++i) {
        PyObject *op = PyList_GET_ITEM(args[1], i);

        if (!PyTuple_Check(op) || PyTuple_GET_SIZE(op) != 5) {
            PyErr_SetString(PyExc_TypeError, "_post_batch: each op is "
                            "(recv, buf, peer, microbatch, chunk)");
            goto out;
        }
        memcpy(fill, &PyTuple_GET_ITEM(op, 0), 5 * sizeof(*fill));
        fill[5] = zero;
        fill[6] = Py_None;
        recv    = PyObject_IsTrue(fill[0]);
        if (recv < 0) {
            goto out;
        }
        ops[i].kind = recv ? STAGELINK_OP_RECV : STAGELINK_OP_SEND;
        req         = request_new(cls, c, fill, NULL, &ops[i].xfer);
        if (req == NULL) {
            goto out;
        }
        PyList_SET_ITEM(list, i, (PyObject *)req);
    }
    status = sl_py_calls_post_batch(c, ops, (size_t)n, handles);
    if (status == STAGELINK_SUCCESS) {
        for (i = 0; i < n; ++i) {
            req         = (sl_py_request_t *)PyList_GET_ITEM(list, i);
            req->handle = handles[i];
            req->done   = (handles[i] == NULL);
        }
        r = Py_BuildValue("(iO)", 0, list);
        goto out_free;
    }
    r = Py_BuildValue("(i[])", (int)status);
out:
    for (i = 0; list != NULL && i < n; ++i) { /* nothing stays posted */
        req = (sl_py_request_t *)PyList_GET_ITEM(list, i);
        if (req != NULL && req->buf != NULL) {
            sl_py_buffer_release((sl_py_buffer_t *)req->buf);
        }
    }
out_free:
    Py_XDECREF(list);
    Py_XDECREF(zero);
    free(ops);
    free(handles);
    return r;
}

/* Completed without an error and without a descriptor to settle: its
 * memory is let go (as Communicator._complete does for status 0). */
static void request_done_ok(sl_py_request_t *self)
{
    PyObject *buf = self->buf;

    self->done   = 1;
    self->handle = NULL;
    self->buf    = NULL;
    if (buf != NULL && Py_IS_TYPE(buf, &sl_py_buffer_type)) {
        sl_py_buffer_release((sl_py_buffer_t *)buf);
    }
    Py_XDECREF(buf);
}

/* The settle hook(request, status), keeping the exception being raised. */
static void request_settle(sl_py_request_t *self, stagelink_status_t status)
{
    PyObject *type, *value, *tb, *r;

    PyErr_Fetch(&type, &value, &tb);
    r = request_hook_status(self, SL_PY_HOOK_SETTLE, status);
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
    sl_py_calls_t *c = self->calls;
    PyObject      *r;

    *status = STAGELINK_SUCCESS;
    if (request_comm_open(c, n_wait)) {
        return -1;
    }
    if (self->done) { /* another thread completed it meanwhile */
        return 0;
    }
    if (request_reap(c) ||
        (!request_none(self->stream) && request_hook(self, SL_PY_HOOK_ARM))) {
        return -1;
    }
    if (self->done) { /* the reap completed it */
        return 0;
    }
    if (sl_py_handle(self->handle)) {
        return -1;
    }
    *status = sl_py_calls_wait(c, self->handle, slice_ms);
    if (*status == STAGELINK_IN_PROGRESS) {
        return 0;
    }
    if (*status == STAGELINK_SUCCESS && request_none(self->check)) {
        request_done_ok(self);
        return 0;
    }
    r = request_hook_status(self, SL_PY_HOOK_WAITED, *status);
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
    if (request_lock(self->calls)) {
        return -1;
    }
    return request_unlock(self->calls, request_slice_locked(self, slice_ms,
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
            PyObject *call[2] = {(PyObject *)self,
                                 (status == STAGELINK_ERR_TIMEOUT) ? Py_None
                                                                   : seconds};

            r = sl_py_calls_hook(self->calls, SL_PY_HOOK_RAISE_TIMEOUT,
                                 call, 2);
            Py_XDECREF(r);
            return NULL;
        }
        if (!self->done && PyErr_CheckSignals()) {
            return NULL; /* Ctrl-C: the request stays in flight */
        }
    }
    if ((!request_none(self->err) || !request_none(self->stream)) &&
        request_hook(self, SL_PY_HOOK_RESULT)) {
        return NULL;
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
    Py_VISIT((PyObject *)self->calls);
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

static PyObject *request_comm(sl_py_request_t *self, void *closure)
{
    PyObject *owner = (self->calls != NULL) ? self->calls->owner : NULL;

    (void)closure;
    if (owner == NULL) {
        Py_RETURN_NONE;
    }
    Py_INCREF(owner);
    return owner;
}

static PyGetSetDef request_getset[] = {
    {"_comm", (getter)request_comm, NULL, "the Communicator", NULL},
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
     "_post(calls, recv, buf, peer, microbatch, chunk, elem_size, stream) "
     "-> Request: describes buf (held by the request) and posts it."},
    {"_post_record", (PyCFunction)(void (*)(void))request_post_record_py,
     METH_FASTCALL | METH_CLASS,
     "_post_record(calls, recv, record, peer, microbatch, chunk, "
     "elem_size, what) -> Request: a host record posted as given."},
    {"_post_batch", (PyCFunction)(void (*)(void))request_post_batch_py,
     METH_FASTCALL | METH_CLASS,
     "_post_batch(calls, ops) -> (status, [Request]): post_batch of "
     "(recv, buf, peer, microbatch, chunk) each."},
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
    .tp_new            = PyType_GenericNew,
};
