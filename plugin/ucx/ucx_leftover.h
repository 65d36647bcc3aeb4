/*
 * Leftover chunks of a canceled receive's message, taken off the wire in
 * the background (ucx_leftover.c, which alone owns them).
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_UCX_LEFTOVER_H
#define SL_UCX_LEFTOVER_H

#include "sl_error.h"

#include <stddef.h>
#include <stdint.h>

typedef struct stagelink_comm sl_comm_t;
typedef struct sl_leftover    sl_leftover_t;
struct sl_ucx_peer;

/** Posts the receives of chunks first..count-1 of the message on `tag`
 *  from `peer` into `scratch` (`room` bytes, every one there), with room
 *  for `more` added later; the communicator owns the drain, which ends
 *  once every one is in and its transfer released it.  Out of memory it
 *  says so in the log and posts nothing. */
sl_status_t sl_leftover_start(sl_comm_t *comm, struct sl_ucx_peer *peer,
                              uint64_t tag, void *scratch, size_t room,
                              uint64_t first, uint64_t count, size_t more,
                              sl_leftover_t **out);
/** Chunk `index` too (its own receive was canceled before it matched). */
void        sl_leftover_add(sl_leftover_t *lo, uint64_t index);
/** Its transfer ended: it adds no more. */
void        sl_leftover_release(sl_leftover_t *lo);
/** Frees the drains that ended; cancels those of a failed peer. */
void        sl_leftover_progress(sl_comm_t *comm);
/** 1 while a drain of a live peer waits for chunks. */
int         sl_leftover_pending(const sl_comm_t *comm);
/** Cancels every receive still posted (before the worker goes). */
void        sl_leftover_stop(sl_comm_t *comm);
/** Frees every drain (after the worker went: no callback comes). */
void        sl_leftover_cleanup(sl_comm_t *comm);

#endif
