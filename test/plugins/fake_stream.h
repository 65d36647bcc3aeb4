/*
 * The fake GPU's streams, shared by the fake device of a test program and
 * the fake NCCL (test/plugins/fake_nccl.c): a stream runs what is queued on
 * it in order, on a thread of its own, as a GPU would.  A test program that
 * has such streams exports fake_stream_enqueue (link it with -rdynamic);
 * the fake NCCL finds it with dlsym.  SPDX-License-Identifier: MIT
 */
#ifndef SL_FAKE_STREAM_H
#define SL_FAKE_STREAM_H

typedef void (*fake_stream_fn_t)(void *arg);

/** Runs fn(arg) on `stream` after everything queued on it before. */
typedef void (*fake_stream_enqueue_t)(void *stream, fake_stream_fn_t fn,
                                      void *arg);

#define FAKE_STREAM_ENQUEUE "fake_stream_enqueue"

#endif
