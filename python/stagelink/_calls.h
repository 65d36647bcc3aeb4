/*
 * One communicator of a loaded plugin (_calls.c): the plugin's calls, the
 * state of the communicator's life, and the Python objects the
 * Communicator registered for the paths that run in Python.  Every call
 * that may progress the transport releases the GIL: progress may run the
 * config's callbacks (_config.c), which take it back.
 *
 * SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_PY_CALLS_H
#define STAGELINK_PY_CALLS_H

#include "_buffer.h"
#include "_library.h"

/* The communicator's life; _calls.c makes every transition. */
typedef enum {
    SL_PY_CALLS_NEW,     /* no communicator yet */
    SL_PY_CALLS_OPEN,
    SL_PY_CALLS_CLOSING, /* close() began: no new calls from Python */
    SL_PY_CALLS_CLOSED   /* finalized (or init failed), plugin unloaded */
} sl_py_calls_state_t;

/* What the Communicator registered: called, never looked up by name. */
typedef enum {
    SL_PY_HOOK_ACQUIRE,       /* () the communicator's lock */
    SL_PY_HOOK_RELEASE,       /* () */
    SL_PY_HOOK_REQUIRE_OPEN,  /* (what) raises ClosedError */
    SL_PY_HOOK_REAP,          /* () completes dropped requests */
    SL_PY_HOOK_ARGS,          /* (peer, microbatch, chunk, elem_size) */
    SL_PY_HOOK_POSTED,        /* (request, status) after a failed post */
    SL_PY_HOOK_WAITED,        /* (request, status) after a wait's slice */
    SL_PY_HOOK_SETTLE,        /* (request, status) after an exception */
    SL_PY_HOOK_ATTACH_CHECK,  /* (request, recv, peer, microbatch, chunk) */
    SL_PY_HOOK_ARM,           /* (request) orders the current stream */
    SL_PY_HOOK_RAISE_TIMEOUT, /* (request, seconds or None) */
    SL_PY_HOOK_RESULT,        /* (request) raises its error */
    SL_PY_HOOK_CUDA_STREAM,   /* (tensor, stream) -> cudaStream_t */
    SL_PY_HOOK_STORE_SET,     /* (key, value) -> status */
    SL_PY_HOOK_STORE_GET,     /* (key) -> bytes, or a status */
    SL_PY_HOOK_GATHER,        /* (mem, buf, nbytes, stream, tag, tp_index,
                                  offsets, lengths) -> status */
    SL_PY_HOOK_COUNT
} sl_py_hook_t;

typedef struct {
    PyObject_HEAD
    sl_py_calls_state_t          state;
    stagelink_loader_t          *loader;
    stagelink_comm_t            *comm;
    const stagelink_plugin_v1_t *vt;
    stagelink_comm_info_t        info;
    int                          sliced;    /* the plugin has wait_for */
    int                          batch_sized; /* ... post_batch_sized */
    int                          check;     /* STAGELINK_CHECK */
    unsigned long                max_chunk; /* of a post's chunk */
    PyObject                    *owner;     /* the Communicator */
    PyObject                    *orphans;   /* its dropped requests (a list) */
    PyObject                    *hooks[SL_PY_HOOK_COUNT];
} sl_py_calls_t;

extern PyTypeObject sl_py_calls_type;

/* An address as Python gives it: an int (None for NULL); -1 on error. */
int sl_py_addr(PyObject *obj, void **out);

/* -1 with ValueError when `req` is no request (never posted, or already
 * released). */
int sl_py_handle(stagelink_request_t *req);

/* `obj` as a Calls; NULL with TypeError when it is not one.  Whether its
 * communicator is open is the caller's to ask (state). */
sl_py_calls_t *sl_py_calls_of(PyObject *obj);

/* hook(args...) of `c`; a new reference, or NULL with an exception. */
PyObject *sl_py_calls_hook(sl_py_calls_t *c, sl_py_hook_t hook,
                           PyObject *const *args, size_t nargs);

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

/* post_batch of `count` ops; reqs[i] set for each op posted. */
stagelink_status_t sl_py_calls_post_batch(sl_py_calls_t *c,
                                          const stagelink_op_t *ops,
                                          size_t count,
                                          stagelink_request_t **reqs);

/* One slice of wait_for (-1: to the end; IN_PROGRESS when the slice ends
 * first); a plugin older than wait_for waits to the end. */
stagelink_status_t sl_py_calls_wait(sl_py_calls_t *c,
                                    stagelink_request_t *req, int slice_ms);

/* The config of Calls.open's arguments (_config.c): its callbacks call
 * c's store and gather hooks.  -1 with an exception when an argument is
 * not what it must be; *ranks (freed by the caller) holds the topology's
 * TP ranks. */
int sl_py_config_fill(sl_py_calls_t *c, PyObject *const *args,
                      stagelink_config_t *cfg, stagelink_topology_t *topo,
                      int **ranks);

#define SL_PY_CONFIG_NARGS 11 /* the arguments sl_py_config_fill reads */

#endif
