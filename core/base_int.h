/* The base room of the core: the clock (common/pdx_clock.h), event fd
 * signalling, the host identity and the log capture hook. Files here call
 * nothing of pdx but each other's logging. */
#ifndef PDX_BASE_H
#define PDX_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/log.h>
#include <pdx/status.h>
#include <pdx/types.h> /* pdx_region_t */

/* The one clock (pdx_now_ns, pdx_deadline_ns, pdx_now_after_ns): shared
 * with every room of the tree. */
#include "pdx_clock.h"

/* An eventfd: make it readable (a saturated counter is readable anyway),
 * and take what it holds (nothing pending is fine). Any thread. */
void pdx_efd_signal(int fd);
void pdx_efd_drain(int fd);

/* "<hostname>/<boot id>/<pid namespace>": same host means same kernel
 * and same pid namespace (pidfds and CUDA IPC work between them). */
pdx_status_t pdx_host_id(char *buf, size_t len);
/* Host ids of one kernel (boot) that differ only by pid namespace. */
bool pdx_host_same_kernel(const char *a, const char *b);

/* Does `r` hold [addr, addr+len)? The one containment check of the agent:
 * len is compared first so the subtraction cannot wrap. */
static inline bool pdx_region_holds(const pdx_region_t *r, uint64_t addr,
                                    uint64_t len)
{
    return len <= r->len && addr >= r->addr && addr - r->addr <= r->len - len;
}

/* log.c hands every error and warning line to this hook before level
 * filtering; call.c installs pdx_call_capture at load (so that log.c never
 * calls up into call.c). NULL: nothing captures. The hook returns nonzero
 * when the line was logged inside a public call (it may become that
 * call's pdx_last_error() text): with pdx_log_set_quiet_failures, such a
 * line is held until the call ends (pdx_log_call_end). */
typedef int (*pdx_log_capture_cb_t)(pdx_log_level_t level, const char *line);
void pdx_log_set_capture(pdx_log_capture_cb_t cb);

/* The end of an outermost public call on this thread (call.c): lines held
 * for it are dropped when it failed (`failed`: they are its
 * pdx_last_error() text) and written otherwise; the agent named for the
 * call's lines is forgotten. */
void pdx_log_call_end(int failed);

/* The agent this thread's lines name (`agent=<name>`): for the current
 * public call (set by the entry checks of api.c, forgotten at the call's
 * end), or for the thread's life (an agent's progress thread). `name` is
 * borrowed: it must outlive the call or the thread. */
void pdx_log_call_agent(const char *name);
void pdx_log_thread_agent(const char *name);

#endif
