/*
 * One communicator's plugin calls (_calls.c), for the requests that are
 * posted and waited through them (_request.c).  Every call releases the
 * GIL, as ctypes does: a call progresses the transport, which may run the
 * config's callbacks (a TP group's gather in Python).
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_PY_CALLS_H
#define STAGELINK_PY_CALLS_H

#include "_buffer.h"

#include "stagelink/stagelink.h"

typedef struct {
    PyObject_HEAD
    stagelink_comm_t            *comm;
    const stagelink_plugin_v1_t *vt;
    int                          sliced; /* the plugin has wait_for */
    PyObject                    *cuda_stream; /* (tensor, stream) -> stream */
} sl_py_calls_t;

extern PyTypeObject sl_py_calls_type;

/* An address as ctypes gives it: an int (None for NULL); -1 on error. */
int sl_py_addr(PyObject *obj, void **out);

/* -1 with ValueError when `req` is no request (never posted, or already
 * released). */
int sl_py_handle(stagelink_request_t *req);

/* `obj` as the Calls of a communicator, ready to call; NULL with an
 * exception when it is not one. */
sl_py_calls_t *sl_py_calls_of(PyObject *obj);

/* One transfer's descriptor from a post's arguments (recv, buf, peer,
 * microbatch, chunk, elem_size, stream), checked by the caller
 * (elem_size 0: the buffer's item size; stream None: torch's current
 * one).  Returns the Buffer (a new reference) or NULL. */
sl_py_buffer_t *sl_py_calls_fill(sl_py_calls_t *c, PyObject *const *args,
                                 stagelink_xfer_t *xfer);

/* isend or irecv of `xfer`; *req is the handle when one was posted. */
stagelink_status_t sl_py_calls_post(sl_py_calls_t *c, int recv,
                                    const stagelink_xfer_t *xfer,
                                    stagelink_request_t **req);

/* One slice of wait_for (-1: to the end; IN_PROGRESS when the slice ends
 * first); a plugin older than wait_for waits to the end. */
stagelink_status_t sl_py_calls_wait(sl_py_calls_t *c,
                                    stagelink_request_t *req, int slice_ms);

#endif
