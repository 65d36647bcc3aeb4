/*
 * stagelink.Request's compiled part (_request.c): the state of one posted
 * transfer, its post and its wait.  communicator.py's Request adds the
 * rest (test, cancel, what a dropped one becomes) in Python, and
 * registers what the wait hands over on its uncommon paths (Calls.bind).
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_PY_REQUEST_H
#define STAGELINK_PY_REQUEST_H

#include "_calls.h"

#define SL_PY_SLICE_MS 50 /* a wait looks at pending signals this often */

typedef struct {
    PyObject_HEAD
    stagelink_request_t *handle;    /* NULL: never posted, or released */
    sl_py_calls_t       *calls;     /* its communicator's */
    PyObject            *buf;       /* what holds the memory (a Buffer) */
    PyObject            *desc;      /* what it is, for sentences */
    PyObject            *err;       /* (status, sentence) once failed */
    PyObject            *timed_out; /* the library's deadline's sentence */
    PyObject            *check;     /* STAGELINK_CHECK's descriptor */
    PyObject            *stream;    /* a CUDA receive: (stream, device) */
    PyObject            *ordered;   /* the stream ordered at completion */
    PyObject            *weakrefs;
    char                 done;
} sl_py_request_t;

extern PyTypeObject sl_py_request_type;

/* Once, at the module's init: the names a request passes; -1 on error. */
int sl_py_request_init(void);

#endif
