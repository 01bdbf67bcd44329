/* pdx status codes: one error space for every layer, with a translator per
 * foreign space (ucs_status_t, CUresult, errno) kept next to its user. */
#ifndef PDX_STATUS_H
#define PDX_STATUS_H

#include <pdx/export.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdx_status {
    PDX_OK = 0,
    PDX_INPROGRESS = 1,
    PDX_ERR_INVALID = -1,           /* bad argument */
    PDX_ERR_NOMEM = -2,             /* allocation failed */
    PDX_ERR_NOT_FOUND = -3,         /* no such peer, backend, region, key */
    PDX_ERR_UNSUPPORTED = -4,       /* backend lacks the op or memory type */
    PDX_ERR_BACKEND = -5,           /* backend library failed */
    PDX_ERR_REMOTE_DISCONNECT = -6, /* peer died or its connection broke */
    PDX_ERR_STALE = -7,             /* peer was unloaded or reloaded */
    PDX_ERR_MISMATCH = -8,          /* peer invariants differ */
    PDX_ERR_CORRUPT = -9,           /* blob checksum, bounds or framing */
    PDX_ERR_VERSION = -10,          /* blob or ABI version not understood */
    PDX_ERR_TOO_LARGE = -11,        /* input over a documented limit */
    PDX_ERR_TIMEOUT = -12,          /* deadline passed */
    PDX_ERR_BUSY = -13,             /* resource in use (e.g. leased) */
    PDX_ERR_EXISTS = -14,           /* already present */
    PDX_ERR_UNAVAILABLE = -15,      /* backend cannot run here */
    PDX_ERR_CANCELED = -16,         /* released or aborted by caller */
    PDX_ERR_IO = -17,               /* system call failed */
    PDX_ERR_CONFIG = -18,           /* configuration is wrong */
    PDX_ERR_NO_SPACE = -19,         /* pool full of unevictable blocks */
    PDX_ERR_POLICY = -20,           /* the path policy forbids the only path */
} pdx_status_t;

/* A status in words ("success", "not found", ...).
 *
 * @param [in] status  Any value; one outside the enum is "unknown status".
 * @return A static string; never NULL.
 * Owns: the string is the library's, never freed.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API const char *pdx_status_string(pdx_status_t status);

/* Why the last failing pdx call on the calling thread failed: the error
 * (and warning) lines it logged, joined by "; " in the order they were
 * logged (the first is usually the cause, later ones add the context of
 * outer layers), the same text that went to the log sink whatever the log
 * level; or "<function>: <status string>" when the failure logged nothing.
 * Every public function of libpdx.so (agent, transfers, notifications,
 * connector, layout, hashing, config) records it when it returns an error
 * status (or a negative count), naming the object and the values, and
 * leaves it untouched when it succeeds: read it right after the failing
 * call. A failure inside a callback pdx runs (notification callback) is the
 * callback's own call. "" before any failure.
 *
 * @return The text; "" before any failure on this thread.
 * Owns: a thread-local buffer owned by pdx, valid until the calling
 *       thread's next pdx call; copy it to keep it.
 * Blocks: no.
 * Threads: any thread; each thread has its own.
 */
PDX_API const char *pdx_last_error(void);

/* The status of the calling thread's last failing pdx call (the one
 * pdx_last_error describes).
 *
 * @return That status; PDX_OK before any failure.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread; each thread has its own.
 */
PDX_API pdx_status_t pdx_last_status(void);

/* Forget this thread's last error: pdx_last_error() reads "" and
 * pdx_last_status() PDX_OK again.
 *
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread; it clears the calling thread's only.
 */
PDX_API void pdx_last_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
