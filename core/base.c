/* The event fd helpers (base.h). */
#include <unistd.h>

#include "base_int.h"

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
