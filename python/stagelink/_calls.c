/*
 * stagelink._calls.Calls: one communicator of a loaded plugin.  It owns
 * the communicator's life (sl_py_calls_state_t), makes every plugin call
 * the package makes, and holds what the Communicator registered for the
 * paths that stay in Python (sl_py_hook_t).  Python passes arguments
 * down and gets statuses back; the compiled layer never looks up a
 * Python name.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_calls.h"

#include <limits.h>
#include <stdlib.h>
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

sl_py_calls_t *sl_py_calls_of(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, &sl_py_calls_type)) {
        PyErr_Format(PyExc_TypeError, "a communicator's calls are a "
                     "stagelink._calls.Calls, not %s", Py_TYPE(obj)->tp_name);
        return NULL;
    }
    return (sl_py_calls_t *)obj;
}

/* -1 with ValueError when there is no communicator to call. */
static int calls_ready(sl_py_calls_t *self)
{
    if (self->comm == NULL) {
        PyErr_SetString(PyExc_ValueError, "this Calls has no communicator: "
                        "it is not open yet, or finalized");
        return -1;
    }
    return 0;
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

PyObject *sl_py_calls_hook(sl_py_calls_t *c, sl_py_hook_t hook,
                           PyObject *const *args, size_t nargs)
{
    if (c->hooks[hook] == NULL) {
        PyErr_Format(PyExc_ValueError, "Calls: hook %d is not registered "
                     "(Calls.bind registers them)", (int)hook);
        return NULL;
    }
    return PyObject_Vectorcall(c->hooks[hook], args, nargs, NULL);
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

stagelink_status_t sl_py_calls_post_batch(sl_py_calls_t *c,
                                          const stagelink_op_t *ops,
                                          size_t count,
                                          stagelink_request_t **reqs)
{
    stagelink_status_t status;

    Py_BEGIN_ALLOW_THREADS
    status = c->batch_sized ? c->vt->post_batch_sized(c->comm, ops, count,
                                                      sizeof(*ops), reqs)
                            : c->vt->post_batch(c->comm, ops, count, reqs);
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

/* The stream a CUDA tensor's transfer is ordered on: the cuda_stream hook
 * (torch's current one, or `stream` recorded on the tensor). */
static int calls_cuda_stream(sl_py_calls_t *c, PyObject *tensor,
                             PyObject *stream, void **out)
{
    PyObject *args[2] = {tensor, stream};
    PyObject *r = sl_py_calls_hook(c, SL_PY_HOOK_CUDA_STREAM, args, 2);
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

/* The plugin unloaded and every pointer into it dropped, the config's
 * callbacks let go (the store, the TP group): CLOSED. */
static void calls_unload(sl_py_calls_t *self)
{
    int i;

    sl_py_lib.stagelink_loader_close(self->loader);
    self->loader = NULL;
    self->comm   = NULL;
    self->vt     = NULL;
    self->state  = SL_PY_CALLS_CLOSED;
    for (i = SL_PY_HOOK_STORE_SET; i <= SL_PY_HOOK_GATHER; ++i) {
        Py_CLEAR(self->hooks[i]);
    }
}

/* open(plugin, tp_size, pp_size, mode, rank, world_size, device,
 *      topology, store_set, store_get, gather) -> (status, sentence)
 * The plugin loaded and the communicator initialised, its placement
 * read: NEW -> OPEN; on failure NEW -> CLOSED, nothing loaded. */
static PyObject *calls_open(sl_py_calls_t *self, PyObject *const *args,
                            Py_ssize_t nargs)
{
    stagelink_topology_t topo;
    stagelink_config_t   cfg;
    stagelink_status_t   status;
    const char          *plugin = NULL;
    char                 err[4096] = "";
    int                 *ranks = NULL;

    if (nargs != SL_PY_CONFIG_NARGS) {
        PyErr_SetString(PyExc_TypeError, "open(plugin, tp_size, pp_size, "
                        "mode, rank, world_size, device, topology, "
                        "store_set, store_get, gather)");
        return NULL;
    }
    if (self->state != SL_PY_CALLS_NEW) {
        PyErr_SetString(PyExc_ValueError, "open: this Calls was opened "
                        "before; a communicator gets a Calls of its own");
        return NULL;
    }
    if (sl_py_library_ready() ||
        (args[0] != Py_None && (plugin = PyUnicode_AsUTF8(args[0])) == NULL) ||
        sl_py_config_fill(self, args, &cfg, &topo, &ranks)) {
        free(ranks);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = sl_py_lib.stagelink_loader_open(plugin, &self->loader, err,
                                             sizeof(err));
    if (status == STAGELINK_SUCCESS) {
        self->vt = sl_py_lib.stagelink_loader_plugin(self->loader);
        status   = sl_py_lib.stagelink_loader_comm_init(
            self->loader, &cfg, &self->comm, err, sizeof(err));
    }
    if (status == STAGELINK_SUCCESS) {
        status = self->vt->comm_info(self->comm, &self->info);
        if (status != STAGELINK_SUCCESS) {
            snprintf(err, sizeof(err), "%s", self->vt->last_error(self->comm));
            self->vt->comm_abort(self->comm);
            self->vt->comm_finalize(self->comm);
        }
    }
    Py_END_ALLOW_THREADS
    free(ranks);
    if (status != STAGELINK_SUCCESS) {
        if (self->loader != NULL) {
            calls_unload(self);
        }
        self->state = SL_PY_CALLS_CLOSED;
        return Py_BuildValue("(is)", (int)status, err);
    }
    self->sliced = self->vt->struct_size >=
                   offsetof(stagelink_plugin_v1_t, wait_for) +
                   sizeof(self->vt->wait_for);
    self->batch_sized = self->vt->struct_size >=
                        offsetof(stagelink_plugin_v1_t, post_batch_sized) +
                        sizeof(self->vt->post_batch_sized);
    self->state  = SL_PY_CALLS_OPEN;
    return Py_BuildValue("(is)", 0, "");
}

/* bind(owner, orphans, check, max_chunk, **hooks): what the Communicator
 * registers once it is open. */
static PyObject *calls_bind(sl_py_calls_t *self, PyObject *args,
                            PyObject *kwargs)
{
    static char *names[] = {
        "owner", "orphans", "check", "max_chunk", "acquire", "release",
        "require_open", "reap", "args", "posted", "waited", "settle",
        "attach_check", "arm", "raise_timeout", "result", "cuda_stream",
        NULL};
    PyObject     *owner, *orphans, *hooks[SL_PY_HOOK_STORE_SET];
    int           check, i;
    unsigned long max_chunk;

    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OO!pk$OOOOOOOOOOOOO:bind", names, &owner,
            &PyList_Type, &orphans, &check, &max_chunk,
            &hooks[SL_PY_HOOK_ACQUIRE], &hooks[SL_PY_HOOK_RELEASE],
            &hooks[SL_PY_HOOK_REQUIRE_OPEN], &hooks[SL_PY_HOOK_REAP],
            &hooks[SL_PY_HOOK_ARGS], &hooks[SL_PY_HOOK_POSTED],
            &hooks[SL_PY_HOOK_WAITED], &hooks[SL_PY_HOOK_SETTLE],
            &hooks[SL_PY_HOOK_ATTACH_CHECK], &hooks[SL_PY_HOOK_ARM],
            &hooks[SL_PY_HOOK_RAISE_TIMEOUT], &hooks[SL_PY_HOOK_RESULT],
            &hooks[SL_PY_HOOK_CUDA_STREAM])) {
        return NULL;
    }
    for (i = 0; i < SL_PY_HOOK_STORE_SET; ++i) {
        if (!PyCallable_Check(hooks[i])) {
            PyErr_Format(PyExc_TypeError, "bind: every hook is a callable, "
                         "not %R", hooks[i]);
            return NULL;
        }
    }
    for (i = 0; i < SL_PY_HOOK_STORE_SET; ++i) {
        Py_INCREF(hooks[i]);
        Py_XSETREF(self->hooks[i], hooks[i]);
    }
    Py_INCREF(owner);
    Py_XSETREF(self->owner, owner);
    Py_INCREF(orphans);
    Py_XSETREF(self->orphans, orphans);
    self->check     = check;
    self->max_chunk = max_chunk;
    Py_RETURN_NONE;
}

/* info() -> dict: what the communicator resolved at init. */
static PyObject *calls_info(sl_py_calls_t *self, PyObject *unused)
{
    const stagelink_comm_info_t *i = &self->info;

    (void)unused;
    if (calls_ready(self)) {
        return NULL;
    }
    return Py_BuildValue(
        "{" "sisisisi" "sisisisi" "sisisisi" "si" "ssss" "}", "rank", i->rank, "world_size",
        i->world_size, "tp_size", i->tp_size, "pp_size", i->pp_size,
        "dp_size", i->dp_size, "tp_index", i->tp_index, "pp_index",
        i->pp_index, "dp_index", i->dp_index, "prev_rank", i->prev_rank,
        "next_rank", i->next_rank, "local_rank", i->local_rank,
        "local_size", i->local_size, "mode", (int)i->mode,
        "gather_backend", i->gather_backend, "node_id", i->node_id);
}

/* counters() -> (status, dict) */
static PyObject *calls_counters(sl_py_calls_t *self, PyObject *unused)
{
    stagelink_counters_t c;
    stagelink_status_t   status;

    (void)unused;
    if (calls_ready(self)) {
        return NULL;
    }
    memset(&c, 0, sizeof(c));
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->get_counters(self->comm, &c);
    Py_END_ALLOW_THREADS
    return Py_BuildValue(
        "(i{sKsKsKsKsKsKsKsKsK})", (int)status,
        "stage_bytes_sent", (unsigned long long)c.stage_bytes_sent,
        "stage_bytes_recv", (unsigned long long)c.stage_bytes_recv,
        "gather_bytes_sent", (unsigned long long)c.gather_bytes_sent,
        "gather_bytes_recv", (unsigned long long)c.gather_bytes_recv,
        "inter_node_bytes_sent", (unsigned long long)c.inter_node_bytes_sent,
        "inter_node_bytes_recv", (unsigned long long)c.inter_node_bytes_recv,
        "intra_node_bytes_sent", (unsigned long long)c.intra_node_bytes_sent,
        "intra_node_bytes_recv", (unsigned long long)c.intra_node_bytes_recv,
        "transfers_completed", (unsigned long long)c.transfers_completed);
}

/* The sentence, copied once: comm_abort may rewrite it meanwhile. */
static PyObject *calls_last_error(sl_py_calls_t *self, PyObject *unused)
{
    const char *text;
    char        copy[4096];

    (void)unused;
    if (calls_ready(self)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    text = self->vt->last_error(self->comm);
    snprintf(copy, sizeof(copy), "%s", (text != NULL) ? text : "");
    Py_END_ALLOW_THREADS
    return PyUnicode_DecodeUTF8(copy, (Py_ssize_t)strlen(copy), "replace");
}

/* get_error() -> (status, failed rank): without progressing. */
static PyObject *calls_get_error(sl_py_calls_t *self, PyObject *unused)
{
    stagelink_status_t status;
    int                rank = -1;

    (void)unused;
    if (calls_ready(self)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->comm_get_error(self->comm, &rank);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(ii)", (int)status, rank);
}

/* test(handle) -> (status, done) */
static PyObject *calls_test(sl_py_calls_t *self, PyObject *handle)
{
    stagelink_request_t *req;
    stagelink_status_t   status;
    int                  done = 0;

    if (calls_ready(self) ||
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
    long                 slice;
    int                  slice_ms;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(handle, slice_ms)");
        return NULL;
    }
    if (calls_ready(self) ||
        calls_request(args[0], &req)) {
        return NULL;
    }
    slice = PyLong_AsLong(args[1]);
    if (slice == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (slice < -1 || slice > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "wait: slice_ms %ld is not -1 (to "
                     "the end) or milliseconds up to %d", slice, INT_MAX);
        return NULL;
    }
    slice_ms = (int)slice;
    return PyLong_FromLong(sl_py_calls_wait(self, req, slice_ms));
}

/* cancel(handle) -> status */
static PyObject *calls_cancel(sl_py_calls_t *self, PyObject *handle)
{
    stagelink_request_t *req;
    stagelink_status_t   status;

    if (calls_ready(self) ||
        calls_request(handle, &req)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->cancel(self->comm, req);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

/* order_stream(handle, stream) -> status: the library orders `stream`
 * (an int, None: none) after the request's data at completion. */
static PyObject *calls_order_stream(sl_py_calls_t *self,
                                    PyObject *const *args, Py_ssize_t nargs)
{
    stagelink_request_t *req;
    stagelink_status_t   status;
    void                *stream;

    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "order_stream(handle, stream)");
        return NULL;
    }
    if (calls_ready(self) ||
        calls_request(args[0], &req) || sl_py_addr(args[1], &stream)) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->order_stream(self->comm, req, stream);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(status);
}

/* abort() -> status; from any thread, also during a wait.  Finalized: 0. */
static PyObject *calls_abort(sl_py_calls_t *self, PyObject *unused)
{
    const stagelink_plugin_v1_t *vt     = self->vt;
    stagelink_comm_t            *comm   = self->comm;
    stagelink_status_t           status = STAGELINK_SUCCESS;

    (void)unused;
    if (comm != NULL) {
        Py_BEGIN_ALLOW_THREADS
        status = vt->comm_abort(comm);
        Py_END_ALLOW_THREADS
    }
    return PyLong_FromLong(status);
}

/* begin_close() -> bool: OPEN -> CLOSING; False when it was not open. */
static PyObject *calls_begin_close(sl_py_calls_t *self, PyObject *unused)
{
    (void)unused;
    if (self->state != SL_PY_CALLS_OPEN) {
        Py_RETURN_FALSE;
    }
    self->state = SL_PY_CALLS_CLOSING;
    Py_RETURN_TRUE;
}

/* finalize() -> (status, sentence): comm_finalize (collective), then the
 * plugin unloaded: OPEN or CLOSING -> CLOSED.  Once closed, (0, ""). */
static PyObject *calls_finalize(sl_py_calls_t *self, PyObject *unused)
{
    stagelink_status_t status;
    char               err[4096] = "";

    (void)unused;
    if (self->comm == NULL) {
        return Py_BuildValue("(is)", 0, "");
    }
    Py_BEGIN_ALLOW_THREADS
    status = self->vt->comm_finalize(self->comm);
    if (status != STAGELINK_SUCCESS) {
        snprintf(err, sizeof(err), "%s", self->vt->last_error(self->comm));
    }
    Py_END_ALLOW_THREADS
    calls_unload(self);
    return Py_BuildValue("(is)", (int)status, err);
}

static PyObject *calls_get_open(sl_py_calls_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->state == SL_PY_CALLS_OPEN ||
                           self->state == SL_PY_CALLS_CLOSING);
}

static PyObject *calls_get_closing(sl_py_calls_t *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->state == SL_PY_CALLS_CLOSING);
}

static PyObject *calls_get_plugin(sl_py_calls_t *self, void *closure)
{
    (void)closure;
    if (self->vt == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(self->vt->name);
}

static int calls_traverse(sl_py_calls_t *self, visitproc visit, void *arg)
{
    int i;

    Py_VISIT(self->owner);
    Py_VISIT(self->orphans);
    for (i = 0; i < SL_PY_HOOK_COUNT; ++i) {
        Py_VISIT(self->hooks[i]);
    }
    return 0;
}

static int calls_clear(sl_py_calls_t *self)
{
    int i;

    Py_CLEAR(self->owner);
    Py_CLEAR(self->orphans);
    for (i = 0; i < SL_PY_HOOK_COUNT; ++i) {
        Py_CLEAR(self->hooks[i]);
    }
    return 0;
}

static void calls_dealloc(sl_py_calls_t *self)
{
    PyObject_GC_UnTrack(self);
    calls_clear(self);
    /* A communicator never closed stays loaded: its peers may still be
     * in a collective with it, and the process is about to exit. */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef calls_methods[] = {
    {"open", (PyCFunction)(void (*)(void))calls_open, METH_FASTCALL,
     "open(plugin, tp_size, pp_size, mode, rank, world_size, device, "
     "topology, store_set, store_get, gather) -> (status, sentence): loads "
     "the plugin and initialises the communicator (collective)."},
    {"bind", (PyCFunction)(void (*)(void))calls_bind,
     METH_VARARGS | METH_KEYWORDS,
     "bind(owner, orphans, check, max_chunk, *, acquire, release, "
     "require_open, reap, args, posted, waited, settle, attach_check, arm, "
     "raise_timeout, result, cuda_stream): what the Communicator "
     "registers for the paths that run in Python."},
    {"info", (PyCFunction)calls_info, METH_NOARGS,
     "info() -> dict: stagelink_comm_info_t, field for field."},
    {"counters", (PyCFunction)calls_counters, METH_NOARGS,
     "counters() -> (status, dict): stagelink_counters_t."},
    {"last_error", (PyCFunction)calls_last_error, METH_NOARGS,
     "last_error() -> the sentence of the last failed call."},
    {"get_error", (PyCFunction)calls_get_error, METH_NOARGS,
     "get_error() -> (status, failed rank)."},
    {"test", (PyCFunction)calls_test, METH_O,
     "test(handle) -> (status, done)."},
    {"wait", (PyCFunction)(void (*)(void))calls_wait, METH_FASTCALL,
     "wait(handle, slice_ms) -> status: wait_for one slice (-1: to the "
     "end); IN_PROGRESS when the slice ends first."},
    {"cancel", (PyCFunction)calls_cancel, METH_O,
     "cancel(handle) -> status."},
    {"order_stream", (PyCFunction)(void (*)(void))calls_order_stream,
     METH_FASTCALL, "order_stream(handle, stream) -> status."},
    {"abort", (PyCFunction)calls_abort, METH_NOARGS,
     "abort() -> status (0 once finalized)."},
    {"begin_close", (PyCFunction)calls_begin_close, METH_NOARGS,
     "begin_close() -> True when an open communicator began closing."},
    {"finalize", (PyCFunction)calls_finalize, METH_NOARGS,
     "finalize() -> (status, sentence): comm_finalize, then the plugin "
     "unloaded; (0, '') once done."},
    {NULL, NULL, 0, NULL}
};

static PyGetSetDef calls_getset[] = {
    {"is_open", (getter)calls_get_open, NULL,
     "initialised and not finalized (closing included)", NULL},
    {"is_closing", (getter)calls_get_closing, NULL, "close() began", NULL},
    {"plugin", (getter)calls_get_plugin, NULL, "the plugin's name", NULL},
    {NULL, NULL, NULL, NULL, NULL}
};

PyTypeObject sl_py_calls_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name      = "stagelink._calls.Calls",
    .tp_basicsize = sizeof(sl_py_calls_t),
    .tp_dealloc   = (destructor)calls_dealloc,
    .tp_flags     = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc       = "Calls(): one communicator of a loaded plugin: open, "
                    "bind, its calls, finalize.",
    .tp_traverse  = (traverseproc)calls_traverse,
    .tp_clear     = (inquiry)calls_clear,
    .tp_methods   = calls_methods,
    .tp_getset    = calls_getset,
    .tp_new       = PyType_GenericNew,
};
