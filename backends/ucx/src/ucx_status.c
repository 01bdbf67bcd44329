/* ucx: the one translator from ucs_status_t to pdx_status_t, the level
 * an operation's failure is logged at, and the fd headroom UCX needs. */
#include "ucx_int.h"

#include <dirent.h>
#include <sys/resource.h>

/* Room for `need` more fds under RLIMIT_NOFILE? UCX opens fds when it
 * makes a context, a worker or an endpoint, and treats running out as
 * anything but that (an I/O or shared memory error, "no resources",
 * a connection reset, or an abort in ucp_worker_create): so pdx looks
 * first. PDX_OK, or PDX_ERR_IO with "too many open files" logged. Reads
 * /proc/self/fd (O(open fds)); where it cannot, PDX_OK. */
pdx_status_t ucx_fd_room(unsigned need, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) {
        return PDX_OK;
    }
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        return PDX_OK;
    }
    long open = -1; /* the directory's own fd */
    while (readdir(d) != NULL) {
        open++;
    }
    closedir(d);
    open -= 2; /* "." and ".." */
    if (open < 0 || (long long)rl.rlim_cur - open >= (long long)need) {
        return PDX_OK;
    }
    pdx_error("ucx: %s: too many open files (%ld of RLIMIT_NOFILE %llu in "
              "use; UCX needs about %u more)", what, open,
              (unsigned long long)rl.rlim_cur, need);
    return PDX_ERR_IO;
}

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
