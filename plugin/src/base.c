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
