/* Status names and error sentences.  SPDX-License-Identifier: MIT */
#include "sl_error.h"
#include "sl_log.h"

#include <stdio.h>

const char *stagelink_status_string(stagelink_status_t status)
{
    switch (status) {
    case STAGELINK_SUCCESS:              return "STAGELINK_SUCCESS";
    case STAGELINK_ERR_INVALID_ARG:      return "STAGELINK_ERR_INVALID_ARG";
    case STAGELINK_ERR_INVALID_STATE:    return "STAGELINK_ERR_INVALID_STATE";
    case STAGELINK_ERR_NO_MEMORY:        return "STAGELINK_ERR_NO_MEMORY";
    case STAGELINK_ERR_NOT_FOUND:        return "STAGELINK_ERR_NOT_FOUND";
    case STAGELINK_ERR_SYMBOL_MISSING:   return "STAGELINK_ERR_SYMBOL_MISSING";
    case STAGELINK_ERR_VERSION_MISMATCH: return "STAGELINK_ERR_VERSION_MISMATCH";
    case STAGELINK_ERR_BOOTSTRAP:        return "STAGELINK_ERR_BOOTSTRAP";
    case STAGELINK_ERR_TRANSPORT:        return "STAGELINK_ERR_TRANSPORT";
    case STAGELINK_ERR_SIZE_MISMATCH:    return "STAGELINK_ERR_SIZE_MISMATCH";
    case STAGELINK_ERR_TAG_IN_USE:       return "STAGELINK_ERR_TAG_IN_USE";
    case STAGELINK_ERR_NO_PEER:          return "STAGELINK_ERR_NO_PEER";
    case STAGELINK_ERR_CANCELED:         return "STAGELINK_ERR_CANCELED";
    case STAGELINK_ERR_TIMEOUT:          return "STAGELINK_ERR_TIMEOUT";
    case STAGELINK_ERR_UNSUPPORTED:      return "STAGELINK_ERR_UNSUPPORTED";
    case STAGELINK_ERR_CONFIG:           return "STAGELINK_ERR_CONFIG";
    case STAGELINK_ERR_INIT:             return "STAGELINK_ERR_INIT";
    case STAGELINK_ERR_INTERNAL:         return "STAGELINK_ERR_INTERNAL";
    case STAGELINK_ERR_PEER_FAILED:      return "STAGELINK_ERR_PEER_FAILED";
    case STAGELINK_ERR_ABORTED:          return "STAGELINK_ERR_ABORTED";
    case STAGELINK_IN_PROGRESS:          return "STAGELINK_IN_PROGRESS";
    case STAGELINK_ERR_ABANDONED:        return "STAGELINK_ERR_ABANDONED";
    case STAGELINK_ERR_ABI:              return "STAGELINK_ERR_ABI";
    }
    return "STAGELINK_ERR_UNKNOWN_STATUS";
}

sl_status_t sl_error(sl_errbuf_t *eb, sl_status_t status, const char *fmt, ...)
{
    char    local[SL_ERRBUF_LEN];
    char   *msg = (eb != NULL) ? eb->msg : local;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, SL_ERRBUF_LEN, fmt, ap);
    va_end(ap);
    sl_log(SL_LOG_INFO, SL_SUBSYS_ALL, "%s: %s", stagelink_status_string(status),
           msg);
    return status;
}
