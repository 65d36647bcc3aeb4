/*
 * libstagelink, opened once by the path the package chose (_lib.py), and
 * the calls that need no communicator: its version, status names, the
 * variable table's parser, the launcher's view of this process.  The UCX
 * libraries of a wheel are opened here too, globally, before any plugin
 * loads libucp.so.0.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_library.h"

#include <dlfcn.h>
#include <string.h>

sl_py_library_t sl_py_lib;

int sl_py_library_ready(void)
{
    if (sl_py_lib.stagelink_version == NULL) {
        PyErr_SetString(PyExc_ValueError, "libstagelink is not open yet: "
                        "stagelink._lib.library() opens it");
        return -1;
    }
    return 0;
}

/* dlopen(path, mode); NULL with OSError carrying dlerror()'s sentence. */
static void *library_dlopen(const char *path, int mode)
{
    void *h = dlopen(path, mode);

    if (h == NULL) {
        PyErr_SetString(PyExc_OSError, dlerror());
    }
    return h;
}

/* open_library(path): libstagelink's entry points from `path`, once (a
 * second call is a no-op); OSError saying why it cannot be used. */
static PyObject *library_open(PyObject *module, PyObject *arg)
{
    sl_py_library_t lib;
    const char     *path = PyUnicode_AsUTF8(arg);
    void           *h;

    (void)module;
    if (path == NULL) {
        return NULL;
    }
    if (sl_py_lib.stagelink_version != NULL) {
        Py_RETURN_NONE;
    }
    h = library_dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        return NULL;
    }
#define SL_PY_SYM(_name) \
    if ((*(void **)&lib._name = dlsym(h, #_name)) == NULL) goto err_sym
    SL_PY_SYM(stagelink_version);
    SL_PY_SYM(stagelink_status_string);
    SL_PY_SYM(stagelink_loader_open);
    SL_PY_SYM(stagelink_loader_plugin);
    SL_PY_SYM(stagelink_loader_comm_init);
    SL_PY_SYM(stagelink_loader_close);
    SL_PY_SYM(stagelink_env_value);
    SL_PY_SYM(stagelink_job_query);
#undef SL_PY_SYM
    sl_py_lib = lib; /* kept open for the life of the process */
    Py_RETURN_NONE;

err_sym:
    PyErr_Format(PyExc_OSError, "%s is no libstagelink of this package's "
                 "version: %s", path, dlerror());
    dlclose(h);
    return NULL;
}

/* load_global(path): a library the plugin will need, opened for good with
 * its symbols global (the wheel's UCX); OSError when it cannot be. */
static PyObject *library_load_global(PyObject *module, PyObject *arg)
{
    const char *path = PyUnicode_AsUTF8(arg);

    (void)module;
    if (path == NULL || library_dlopen(path, RTLD_NOW | RTLD_GLOBAL) == NULL) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *library_version(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    if (sl_py_library_ready()) {
        return NULL;
    }
    return PyUnicode_FromString(sl_py_lib.stagelink_version());
}

static PyObject *library_status_string(PyObject *module, PyObject *arg)
{
    long status = PyLong_AsLong(arg);

    (void)module;
    if ((status == -1 && PyErr_Occurred()) || sl_py_library_ready()) {
        return NULL;
    }
    return PyUnicode_FromString(
        sl_py_lib.stagelink_status_string((stagelink_status_t)status));
}

/* env_value(name) -> (status, value, sentence) */
static PyObject *library_env_value(PyObject *module, PyObject *arg)
{
    const char        *name = PyUnicode_AsUTF8(arg);
    char               value[4096] = "", err[1024] = "";
    stagelink_status_t status;

    (void)module;
    if (name == NULL || sl_py_library_ready()) {
        return NULL;
    }
    status = sl_py_lib.stagelink_env_value(name, value, sizeof(value), err,
                                           sizeof(err));
    return Py_BuildValue("(iNN)", (int)status,
                         PyUnicode_DecodeUTF8(value, (Py_ssize_t)strlen(value),
                                              "replace"),
                         PyUnicode_DecodeUTF8(err, (Py_ssize_t)strlen(err),
                                              "replace"));
}

/* job_query() -> (status, (rank, world_size, local_rank, local_size,
 *                  launcher, bootstrap, reason) or the sentence) */
static PyObject *library_job_query(PyObject *module, PyObject *unused)
{
    stagelink_job_info_t job = {.struct_size = sizeof(job)};
    stagelink_status_t   status;
    char                 err[1024] = "";

    (void)module;
    (void)unused;
    if (sl_py_library_ready()) {
        return NULL;
    }
    status = sl_py_lib.stagelink_job_query(&job, err, sizeof(err));
    if (status != STAGELINK_SUCCESS) {
        return Py_BuildValue("(is)", (int)status, err);
    }
    return Py_BuildValue("(i(iiiisss))", (int)status, job.rank,
                         job.world_size, job.local_rank, job.local_size,
                         job.launcher, job.bootstrap, job.bootstrap_reason);
}

PyMethodDef sl_py_library_methods[] = {
    {"open_library", library_open, METH_O,
     "open_library(path): libstagelink's entry points from path (once); "
     "OSError when it cannot be opened or is not libstagelink."},
    {"load_global", library_load_global, METH_O,
     "load_global(path): opens a library for good, its symbols global."},
    {"version", library_version, METH_NOARGS,
     "version() -> libstagelink's version."},
    {"status_string", library_status_string, METH_O,
     "status_string(status) -> its name (STAGELINK_...)."},
    {"env_value", library_env_value, METH_O,
     "env_value(name) -> (status, value, sentence): a variable of the "
     "table as comm_init's parser reads it."},
    {"job_query", library_job_query, METH_NOARGS,
     "job_query() -> (status, job tuple or sentence): this process's "
     "place in its job as the launcher's environment gives it."},
    {NULL, NULL, 0, NULL}
};
