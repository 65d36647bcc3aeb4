/*
 * Status propagation and error sentences, shared by every layer.
 * SPDX-License-Identifier: MIT
 */
#ifndef SL_ERROR_H
#define SL_ERROR_H

#include <stagelink/stagelink.h>

#include <stdarg.h>
#include <stddef.h>

typedef stagelink_status_t sl_status_t;

#define SL_ERRBUF_LEN 1024

/** Holds the last error sentence of one communicator (or one init). */
typedef struct sl_errbuf {
    char msg[SL_ERRBUF_LEN];
} sl_errbuf_t;

/**
 * Records `status` with a sentence (what failed, with which values, what
 * to do), logs it at INFO (the caller receives the sentence; WARN is
 * kept for what no caller sees) and returns `status`, so error paths read
 * `return sl_error(eb, STAGELINK_ERR_..., "...", ...)`.  `eb` may be NULL.
 */
sl_status_t sl_error(sl_errbuf_t *eb, sl_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/** The one propagation macro: on failure keep the status and jump. */
#define SL_CHECK_GOTO(_call, _label) \
    do { \
        status = (_call); \
        if (status != STAGELINK_SUCCESS) { \
            goto _label; \
        } \
    } while (0)

#define SL_CHECK(_call) \
    do { \
        sl_status_t _sl_st = (_call); \
        if (_sl_st != STAGELINK_SUCCESS) { \
            return _sl_st; \
        } \
    } while (0)

#define SL_ARRAY_SIZE(_a) (sizeof(_a) / sizeof((_a)[0]))

#endif
