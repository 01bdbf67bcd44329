/* The base room of the core: the one monotonic clock and deadline helper,
 * event fd signalling, the host identity and the log capture hook. Files
 * here call nothing of pdx but each other's logging. */
#ifndef PDX_BASE_H
#define PDX_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <pdx/log.h>
#include <pdx/status.h>
#include <pdx/backend.h>

/* CLOCK_MONOTONIC in ns: every timer, deadline and timestamp of pdx. */
uint64_t pdx_now_ns(void);
/* A time not before now on pdx_now_ns's clock, at most one kernel tick
 * (1-10 ms) after it: CLOCK_MONOTONIC_COARSE plus its resolution, ~4 ns
 * against ~25 for pdx_now_ns on the 2-core VM. For deadlines that may
 * fire a tick late, never early; compare with `now > t` first. */
uint64_t pdx_now_after_ns(void);

/* The pdx_now_ns() value `ms` milliseconds from now. */
static inline uint64_t pdx_deadline_ns(uint64_t ms)
{
    return pdx_now_ns() + ms * 1000000ull;
}

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
 * calls up into call.c). NULL: nothing captures. */
typedef void (*pdx_log_capture_cb_t)(pdx_log_level_t level, const char *line);
void pdx_log_set_capture(pdx_log_capture_cb_t cb);

#endif
