/* pdx logging: level from PDX_LOG_LEVEL (error|warn|info|debug|trace,
 * default warn; any other value is reported once, at load) or set here,
 * and an optional sink callback. The default sink writes one line per
 * message to stderr: "<UTC time, ms> pdx <level> pid=<pid> agent=<name>:
 * <message>" (agent=- where no agent is at hand).
 *
 * The log sink is process-wide on purpose (like UCX's and NCCL's): log lines
 * come from backends and the connector that have no agent at hand. It is the
 * one piece of global state; it is set with atomics and is safe to change
 * from any thread. */
#ifndef PDX_LOG_H
#define PDX_LOG_H

#include <pdx/export.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pdx_log_level {
    PDX_LOG_ERROR = 0,
    PDX_LOG_WARN = 1,
    PDX_LOG_INFO = 2,
    PDX_LOG_DEBUG = 3,
    PDX_LOG_TRACE = 4,
} pdx_log_level_t;

/* A log sink. `msg` is one line without a trailing newline, valid only for
 * the call. May be called from any thread, including the progress thread,
 * concurrently; must not call back into pdx. */
typedef void (*pdx_log_cb_t)(void *arg, pdx_log_level_t level,
                             const char *msg);

/* Install the log sink.
 *
 * @param [in] cb   The sink; NULL restores the default (stderr, with a "pdx"
 *                  prefix).
 * @param [in] arg  Passed to `cb`.
 * Owns: `cb` and `arg` are borrowed while installed, and a little longer:
 *       a line started before a later pdx_log_set_handler returned may
 *       still reach this sink.
 * Blocks: no.
 * Threads: any thread; it takes effect for lines started after it
 *       returns.
 */
PDX_API void pdx_log_set_handler(pdx_log_cb_t cb, void *arg);

/* Set the level: lines above it are dropped (they still become
 * pdx_last_error() text when they are errors or warnings of a failing
 * call).
 *
 * @param [in] level  The new level.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API void pdx_log_set_level(pdx_log_level_t level);

/* The current level: PDX_LOG_LEVEL's (read once, at first use) until
 * pdx_log_set_level.
 *
 * @return The level.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread.
 */
PDX_API pdx_log_level_t pdx_log_get_level(void);

/* Lines of calls that fail, for bindings that raise every failure with
 * its pdx_last_error() text (the Python package does): with `quiet`
 * nonzero, error and warning lines logged on a thread inside a public call
 * are held until that call returns, then dropped if it failed (the caller
 * has them as pdx_last_error()) and written if it succeeded. At level
 * info or above they are written at once, as without. Lines of other
 * threads (the progress thread) are never held. Default 0: written at
 * once.
 *
 * @param [in] quiet  Nonzero to hold them, 0 to write them at once.
 * Owns: nothing.
 * Blocks: no.
 * Threads: any thread; it takes effect for lines started after it
 *       returns.
 */
PDX_API void pdx_log_set_quiet_failures(int quiet);

/* Log a line through the current sink (used by backends and tools too).
 * Identical error and warning lines are rate-limited: at most 5 per 10 s
 * reach the sink (PDX_LOG_REPEAT="N/MS" changes it, "0/1" turns it off);
 * the first one shown after a window says how many were left out.
 * pdx_last_error() still gets every line of a failing call.
 *
 * @param [in] level  The line's level.
 * @param [in] fmt    printf-style format; the line is cut at 1023 bytes.
 * @param [in] ...    Its arguments.
 * Owns: the caller keeps `fmt` and the arguments (read during the call
 *       only).
 * Blocks: no, beyond the sink itself (the default sink writes to stderr).
 * Threads: any thread.
 */
PDX_API void pdx_log(pdx_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define pdx_error(...) pdx_log(PDX_LOG_ERROR, __VA_ARGS__)
#define pdx_warn(...) pdx_log(PDX_LOG_WARN, __VA_ARGS__)
#define pdx_info(...) pdx_log(PDX_LOG_INFO, __VA_ARGS__)
#define pdx_debug(...)                                                         \
    do {                                                                       \
        if (pdx_log_get_level() >= PDX_LOG_DEBUG)                              \
            pdx_log(PDX_LOG_DEBUG, __VA_ARGS__);                               \
    } while (0)
#define pdx_trace(...)                                                         \
    do {                                                                       \
        if (pdx_log_get_level() >= PDX_LOG_TRACE)                              \
            pdx_log(PDX_LOG_TRACE, __VA_ARGS__);                               \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
