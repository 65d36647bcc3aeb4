/*
 * The module stagelink._calls, the package's one binding of libstagelink:
 * its types (Calls, _calls.c and _config.c; Request, _request.c; Buffer,
 * _buffer.c), the library's own calls (_library.c), describe, and the
 * header's constants, so Python never restates them.
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
    .m_doc     = "libstagelink's binding: the library, a communicator's "
                 "calls, a transfer's buffer and its Request.",
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

/* The header's constants the package uses, by the header's names less
 * the prefix. */
static int calls_add_constants(PyObject *mod)
{
#define SL_PY_CONST(_name) {#_name, (long long)STAGELINK_##_name}
    static const struct {
        const char *name;
        long long   value;
    } constants[] = {
        SL_PY_CONST(MODE_DEFAULT), SL_PY_CONST(MODE_SCATTER_GATHER),
        SL_PY_CONST(MODE_FULL), SL_PY_CONST(MODE_SHARDED),
        SL_PY_CONST(PEER_NEXT), SL_PY_CONST(PEER_PREV),
        SL_PY_CONST(MEM_HOST), SL_PY_CONST(MEM_CUDA),
        SL_PY_CONST(OP_SEND), SL_PY_CONST(OP_RECV),
        SL_PY_CONST(TAG_MAX_MICROBATCH), SL_PY_CONST(TAG_MAX_CHUNK),
    };
#undef SL_PY_CONST
    size_t i;

    for (i = 0; i < sizeof(constants) / sizeof(constants[0]); ++i) {
        PyObject *v = PyLong_FromLongLong(constants[i].value);

        if (v == NULL || PyModule_AddObject(mod, constants[i].name, v) < 0) {
            Py_XDECREF(v);
            return -1;
        }
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
        PyModule_AddIntConstant(mod, "SLICE_MS", SL_PY_SLICE_MS) ||
        PyModule_AddFunctions(mod, sl_py_library_methods) ||
        calls_add_constants(mod)) {
        Py_DECREF(mod);
        return NULL;
    }
    return mod;
}
