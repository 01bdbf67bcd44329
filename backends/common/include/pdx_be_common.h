/* Helpers shared by the backends and stores (backends/common): the
 * monotonic clock and deadlines, and numeric module options. Private to
 * the modules; never part of an exported table. */
#ifndef PDX_BE_COMMON_H
#define PDX_BE_COMMON_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. Any thread. */
uint64_t pdx_be_now_ns(void);

/* CLOCK_REALTIME in nanoseconds (wall clock, for logs and peers' eyes). */
uint64_t pdx_be_realtime_ns(void);

/* The monotonic time `in_ns` from now. */
static inline uint64_t pdx_be_deadline_ns(uint64_t in_ns)
{
    return pdx_be_now_ns() + in_ns;
}

/* Nonzero while the monotonic clock is before `deadline_ns`. */
static inline int pdx_be_before(uint64_t deadline_ns)
{
    return pdx_be_now_ns() < deadline_ns;
}

/* A decimal option value from `lo` to `hi`: digits only (no sign, nothing
 * after them). 0 and *out_p written, or -1 and nothing written; the caller
 * logs, in its own words, with the option's name. */
int pdx_be_opt_uint(const char *value, uint64_t lo, uint64_t hi,
                    uint64_t *out_p);

/* The same with an optional binary suffix k, m or g (KiB, MiB, GiB); the
 * bounds apply to the value in bytes. */
int pdx_be_opt_size(const char *value, uint64_t lo, uint64_t hi,
                    uint64_t *out_p);

#endif
