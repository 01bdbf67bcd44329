/* The one monotonic clock and the event fd helpers (base.h). */
#include <time.h>
#include <unistd.h>

#include "base.h"

uint64_t pdx_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t pdx_now_after_ns(void)
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
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + res;
}

void pdx_efd_signal(int fd)
{
    uint64_t one = 1;
    if (write(fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is saturated, the fd is readable anyway */
    }
}

void pdx_efd_drain(int fd)
{
    uint64_t v;
    if (read(fd, &v, sizeof(v)) < 0) {
        /* EAGAIN: nothing to drain */
    }
}
