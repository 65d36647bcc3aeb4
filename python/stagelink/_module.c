/*
 * The module stagelink._calls: its types (Calls, _calls.c; Request,
 * _request.c; Buffer, _buffer.c), describe, and the wait's slice.
 *
 * SPDX-License-Identifier: MIT
 */
#include "_request.h"

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
                 "and its Request, compiled.",
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

    if (sl_py_buffer_init() || sl_py_request_init()) {
        return NULL;
    }
    mod = PyModule_Create(&calls_module);
    if (mod == NULL) {
        return NULL;
    }
    if (calls_add_type(mod, "Calls", &sl_py_calls_type) ||
        calls_add_type(mod, "Buffer", &sl_py_buffer_type) ||
        calls_add_type(mod, "Request", &sl_py_request_type) ||
        PyModule_AddIntConstant(mod, "SLICE_MS", SL_PY_SLICE_MS)) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
