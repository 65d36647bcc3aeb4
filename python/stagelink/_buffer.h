/*
 * What a Python object passed as a transfer buffer is (_buffer.c), for
 * the calls that post it (_calls.c).
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_PY_BUFFER_H
#define STAGELINK_PY_BUFFER_H

#include "_names.h"

#include <stddef.h>

typedef struct {
    PyObject_HEAD
    void      *addr;
    size_t     nbytes;
    size_t     itemsize;
    int        mem;      /* stagelink_mem_type_t */
    int        device;   /* a CUDA tensor's device, else -1 */
    PyObject  *dtype;    /* torch.dtype, or the name (str) */
    PyObject  *shape;    /* a tuple (torch.Size) */
    PyObject  *keep;     /* a tensor's storage, or NULL */
    Py_buffer  view;     /* a buffer export, held while `exported` */
    int        exported;
} sl_py_buffer_t;

extern PyTypeObject sl_py_buffer_type;

/* Once, at the module's init: the names describe asks for; -1 on error. */
int sl_py_buffer_init(void);

/* The Buffer of `obj` (a new reference), or NULL with an exception:
 * ValueError or TypeError saying why it cannot be one, or what the object
 * itself raised. */
sl_py_buffer_t *sl_py_buffer_describe(PyObject *obj, int writable);

/* Drops what held the memory: the transport no longer touches it. */
void sl_py_buffer_release(sl_py_buffer_t *b);

/* describe(obj, writable) for Python. */
PyObject *sl_py_describe(PyObject *module, PyObject *const *args,
                         Py_ssize_t nargs);

#endif
