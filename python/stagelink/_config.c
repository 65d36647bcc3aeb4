/*
 * The config a Communicator's arguments make (Calls.open), and its
 * callbacks: the bootstrap's store and the TP group's gather, each a
 * callable the Communicator registered, called with the GIL taken back
 * (the plugin calls them from inside a call that released it).
 *
 * SPDX-License-Identifier: MIT
 */
#include "_calls.h"

#include <stdlib.h>
#include <string.h>

/* The status of a callback's result (an int, 0 for success); a callback
 * that raised or returned anything else is reported unraisable and fails
 * the call. */
static int config_status(PyObject *r, PyObject *hook)
{
    long status = (r != NULL && PyLong_Check(r)) ? PyLong_AsLong(r) : 1;

    if (r != NULL && !PyLong_Check(r)) {
        PyErr_Format(PyExc_TypeError, "a store or gather callback returned "
                     "%R, not a status (an int)", r);
    }
    if (r == NULL || PyErr_Occurred()) {
        PyErr_WriteUnraisable(hook);
        status = 1;
    }
    Py_XDECREF(r);
    return (int)status;
}

static int config_store_set(void *ctx, const char *key, const void *buf,
                            size_t size)
{
    sl_py_calls_t   *c     = ctx;
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject        *args[2], *r = NULL;
    int              status;

    args[0] = PyUnicode_FromString(key);
    args[1] = PyBytes_FromStringAndSize(buf, (Py_ssize_t)size);
    if (args[0] != NULL && args[1] != NULL) {
        r = sl_py_calls_hook(c, SL_PY_HOOK_STORE_SET, args, 2);
    }
    Py_XDECREF(args[0]);
    Py_XDECREF(args[1]);
    status = config_status(r, c->hooks[SL_PY_HOOK_STORE_SET]);
    PyGILState_Release(state);
    return status;
}

/* store_get(key) returns the value (bytes) or a failed status (an int). */
static int config_store_get(void *ctx, const char *key, void *buf,
                            size_t capacity, size_t *size)
{
    sl_py_calls_t   *c     = ctx;
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject        *arg   = PyUnicode_FromString(key), *r = NULL;
    int              status;

    if (arg != NULL) {
        r = sl_py_calls_hook(c, SL_PY_HOOK_STORE_GET, &arg, 1);
        Py_DECREF(arg);
    }
    if (r != NULL && PyLong_Check(r) && PyLong_AsLong(r) == 0) {
        Py_SETREF(r, PyLong_FromLong(1)); /* success without a value */
    }
    if (r != NULL && PyBytes_Check(r)) {
        *size = (size_t)PyBytes_GET_SIZE(r);
        memcpy(buf, PyBytes_AS_STRING(r), (*size < capacity) ? *size :
                                                               capacity);
        Py_DECREF(r);
        status = 0;
    } else {
        status = config_status(r, c->hooks[SL_PY_HOOK_STORE_GET]);
    }
    PyGILState_Release(state);
    return status;
}

/* gather(mem_type, buf, nbytes, stream, (microbatch, chunk, direction),
 *        tp_index, offsets, lengths): buf a writable memoryview of host
 * memory, else the device address.  The view is valid for the call only
 * (the receive's buffer, which the host owns), as the memory it shows. */
static int config_gather(void *ctx, const stagelink_gather_args_t *a)
{
    sl_py_calls_t   *c     = ctx;
    PyGILState_STATE state = PyGILState_Ensure();
    PyObject        *args[8] = {NULL}, *r = NULL;
    int              i, status, ok = 1;

    args[0] = PyLong_FromLong(a->mem_type);
    args[1] = (a->mem_type == STAGELINK_MEM_HOST)
                  ? PyMemoryView_FromMemory(a->buf, (Py_ssize_t)a->nbytes,
                                            PyBUF_WRITE)
                  : PyLong_FromVoidPtr(a->buf);
    args[2] = PyLong_FromSize_t(a->nbytes);
    args[3] = PyLong_FromVoidPtr(a->stream);
    args[4] = Py_BuildValue("(kkk)", (unsigned long)a->tag.microbatch,
                            (unsigned long)a->tag.chunk,
                            (unsigned long)a->tag.direction);
    args[5] = PyLong_FromLong(a->tp_index);
    args[6] = PyTuple_New(a->tp_size);
    args[7] = PyTuple_New(a->tp_size);
    for (i = 0; i < 8; ++i) {
        ok = ok && args[i] != NULL;
    }
    for (i = 0; ok && i < a->tp_size; ++i) {
        PyObject *off = PyLong_FromSize_t(a->offsets[i]);
        PyObject *len = PyLong_FromSize_t(a->lengths[i]);

        PyTuple_SET_ITEM(args[6], i, off);
        PyTuple_SET_ITEM(args[7], i, len);
        ok = off != NULL && len != NULL;
    }
    if (ok) {
        r = sl_py_calls_hook(c, SL_PY_HOOK_GATHER, args, 8);
    }
    for (i = 0; i < 8; ++i) {
        Py_XDECREF(args[i]);
    }
    status = config_status(r, c->hooks[SL_PY_HOOK_GATHER]);
    PyGILState_Release(state);
    return status;
}

/* An int argument into *out; None leaves it and returns 0 in *set. */
static int config_int(PyObject *obj, int *out, int *set)
{
    long v;

    *set = (obj != Py_None);
    if (!*set) {
        return 0;
    }
    v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* A callable, or None (not registered); -1 with TypeError. */
static int config_hook(sl_py_calls_t *c, sl_py_hook_t hook, PyObject *obj)
{
    if (obj == Py_None) {
        return 0;
    }
    if (!PyCallable_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "open: a callback is a callable or "
                     "None, not %R", obj);
        return -1;
    }
    Py_INCREF(obj);
    Py_XSETREF(c->hooks[hook], obj);
    return 1;
}

/* topology: (prev_rank, next_rank, tp_index, tp_ranks) */
static int config_topology(PyObject *obj, stagelink_topology_t *topo,
                           int **ranks)
{
    PyObject  *list;
    Py_ssize_t n, i;

    memset(topo, 0, sizeof(*topo));
    topo->struct_size = sizeof(*topo);
    if (!PyArg_ParseTuple(obj, "iiiO!:topology", &topo->prev_rank,
                          &topo->next_rank, &topo->tp_index, &PyList_Type,
                          &list)) {
        return -1;
    }
    n      = PyList_GET_SIZE(list);
    *ranks = calloc((size_t)n + 1, sizeof(**ranks));
    if (*ranks == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (i = 0; i < n; ++i) {
        (*ranks)[i] = (int)PyLong_AsLong(PyList_GET_ITEM(list, i));
        if ((*ranks)[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    topo->tp_ranks = *ranks;
    return 0;
}

int sl_py_config_fill(sl_py_calls_t *c, PyObject *const *args,
                      stagelink_config_t *cfg, stagelink_topology_t *topo,
                      int **ranks)
{
    int set, rank_set, world_set, mode = 0, store_set, store_get, gather;

    memset(cfg, 0, sizeof(*cfg));
    cfg->struct_size = sizeof(*cfg);
    if (config_int(args[1], &cfg->tp_size, &set) ||
        config_int(args[2], &cfg->pp_size, &set) ||
        config_int(args[3], &mode, &set) ||
        config_int(args[4], &cfg->rank, &rank_set) ||
        config_int(args[5], &cfg->world_size, &world_set)) {
        return -1;
    }
    if (rank_set != world_set) {
        PyErr_SetString(PyExc_ValueError, "open: give rank and world_size "
                        "together, or neither");
        return -1;
    }
    cfg->mode   = (stagelink_mode_t)mode;
    cfg->flags |= rank_set ? STAGELINK_CONFIG_RANK_SET : 0;
    if (config_int(args[6], &cfg->device, &set)) {
        return -1;
    }
    cfg->flags |= set ? STAGELINK_CONFIG_DEVICE_SET : 0;
    if (args[7] != Py_None) {
        if (config_topology(args[7], topo, ranks)) {
            return -1;
        }
        cfg->topology = topo;
    }
    store_set = config_hook(c, SL_PY_HOOK_STORE_SET, args[8]);
    store_get = config_hook(c, SL_PY_HOOK_STORE_GET, args[9]);
    gather    = config_hook(c, SL_PY_HOOK_GATHER, args[10]);
    if (store_set < 0 || store_get < 0 || gather < 0) {
        return -1;
    }
    if (store_set && store_get) {
        cfg->store_set = config_store_set;
        cfg->store_get = config_store_get;
        cfg->store_ctx = c;
    }
    if (gather) {
        cfg->gather     = config_gather;
        cfg->gather_ctx = c;
    }
    return 0;
}
