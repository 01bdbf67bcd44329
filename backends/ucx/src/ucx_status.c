/* ucx: the one translator from ucs_status_t to pdx_status_t, and the level
 * an operation's failure is logged at. */
#include "ucx_int.h"

/* The one translator from ucs_status_t. */
pdx_status_t ucx_status(ucs_status_t s)
{
    switch (s) {
    case UCS_OK: return PDX_OK;
    case UCS_INPROGRESS: return PDX_INPROGRESS;
    case UCS_ERR_NO_MEMORY: return PDX_ERR_NOMEM;
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR: return PDX_ERR_INVALID;
    case UCS_ERR_UNSUPPORTED: return PDX_ERR_UNSUPPORTED;
    case UCS_ERR_NO_ELEM: return PDX_ERR_NOT_FOUND;
    case UCS_ERR_BUSY: return PDX_ERR_BUSY;
    case UCS_ERR_CANCELED: return PDX_ERR_CANCELED;
    case UCS_ERR_TIMED_OUT: return PDX_ERR_TIMEOUT;
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_MESSAGE_TRUNCATED: return PDX_ERR_TOO_LARGE;
    case UCS_ERR_IO_ERROR: return PDX_ERR_IO;
    case UCS_ERR_NO_DEVICE: return PDX_ERR_UNAVAILABLE;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_REJECTED: return PDX_ERR_REMOTE_DISCONNECT;
    default: return PDX_ERR_BACKEND;
    }
}

/* Level for an operation that failed on `peer`: a broken connection is
 * logged once, by the endpoint error handler, not again by each request. */
pdx_log_level_t ucx_op_log_level(ucs_status_t s, ucs_status_t ep_status)
{
    if (ep_status != UCS_OK || s == UCS_ERR_CANCELED ||
        ucx_status(s) == PDX_ERR_REMOTE_DISCONNECT) {
        return PDX_LOG_DEBUG;
    }
    return PDX_LOG_ERROR;
}
