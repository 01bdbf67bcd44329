/* The one clock of the pdx tree: CLOCK_MONOTONIC for every timer, deadline
 * and timestamp (core, connector, modules, the Python extension, tools,
 * tests), CLOCK_REALTIME only for wall-clock fields others read. Header
 * only, so that every room may use it without a link dependency and no
 * library exports it. Any thread. */
#ifndef PDX_CLOCK_H
#define PDX_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t pdx_clock_read_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in ns, ms and s. */
static inline uint64_t pdx_now_ns(void)
{
    return pdx_clock_read_ns(CLOCK_MONOTONIC);
}
static inline uint64_t pdx_now_ms(void) { return pdx_now_ns() / 1000000ull; }
static inline double pdx_now_s(void) { return (double)pdx_now_ns() * 1e-9; }
/* Milliseconds as a double, for reports and ms deadlines of tools. */
static inline double pdx_now_ms_f(void)
{
    return (double)pdx_now_ns() * 1e-6;
}

/* CLOCK_REALTIME in ns (wall clock: logs, fields a peer or a person reads). */
static inline uint64_t pdx_realtime_ns(void)
{
    return pdx_clock_read_ns(CLOCK_REALTIME);
}

/* The pdx_now_ns() value `ms` milliseconds from now. */
static inline uint64_t pdx_deadline_ns(uint64_t ms)
{
    return pdx_now_ns() + ms * 1000000ull;
}

/* The pdx_now_ns() value `ns` nanoseconds from now. */
static inline uint64_t pdx_after_ns(uint64_t ns) { return pdx_now_ns() + ns; }

/* Is the clock still before `deadline_ns`? */
static inline bool pdx_before(uint64_t deadline_ns)
{
    return pdx_now_ns() < deadline_ns;
}

/* The absolute time `ms` milliseconds from now on clock `id`, for timed
 * waits (pthread_cond_timedwait on a condition of that clock). */
static inline struct timespec pdx_abstime_ms(clockid_t id, uint64_t ms)
{
    uint64_t t = pdx_clock_read_ns(id) + ms * 1000000ull;
    struct timespec ts = {(time_t)(t / 1000000000ull),
                          (long)(t % 1000000000ull)};
    return ts;
}

/* A time not before now on pdx_now_ns's clock, at most one kernel tick
 * (1-10 ms) after it: CLOCK_MONOTONIC_COARSE plus its resolution, several
 * times cheaper than pdx_now_ns. For deadlines that may fire a tick late,
 * never early; compare with `now > t` first. */
static inline uint64_t pdx_now_after_ns(void)
{
    static uint64_t res_ns; /* the coarse clock's tick; 0: not read yet */
    uint64_t res = __atomic_load_n(&res_ns, __ATOMIC_RELAXED);
    if (res == 0) {
        struct timespec r;
        res = clock_getres(CLOCK_MONOTONIC_COARSE, &r) == 0
                  ? (uint64_t)r.tv_sec * 1000000000ull + (uint64_t)r.tv_nsec
                  : 10000000ull;
        res = res == 0 ? 1 : res;
        __atomic_store_n(&res_ns, res, __ATOMIC_RELAXED);
    }
    return pdx_clock_read_ns(CLOCK_MONOTONIC_COARSE) + res;
}

#endif
