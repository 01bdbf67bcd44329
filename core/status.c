/* Status strings. */
#include <pdx/status.h>

const char *pdx_status_string(pdx_status_t s)
{
    switch (s) {
    case PDX_OK: return "success";
    case PDX_INPROGRESS: return "in progress";
    case PDX_ERR_INVALID: return "invalid argument";
    case PDX_ERR_NOMEM: return "out of memory";
    case PDX_ERR_NOT_FOUND: return "not found";
    case PDX_ERR_UNSUPPORTED: return "unsupported";
    case PDX_ERR_BACKEND: return "backend error";
    case PDX_ERR_REMOTE_DISCONNECT: return "remote disconnected";
    case PDX_ERR_STALE: return "stale peer handle";
    case PDX_ERR_MISMATCH: return "invariant mismatch";
    case PDX_ERR_CORRUPT: return "corrupt data";
    case PDX_ERR_VERSION: return "version mismatch";
    case PDX_ERR_TOO_LARGE: return "too large";
    case PDX_ERR_TIMEOUT: return "timed out";
    case PDX_ERR_BUSY: return "busy";
    case PDX_ERR_EXISTS: return "already exists";
    case PDX_ERR_UNAVAILABLE: return "unavailable";
    case PDX_ERR_CANCELED: return "canceled";
    case PDX_ERR_IO: return "i/o error";
    case PDX_ERR_CONFIG: return "configuration error";
    case PDX_ERR_NO_SPACE: return "no space";
    case PDX_ERR_POLICY: return "forbidden by path policy";
    }
    return "unknown status";
}
