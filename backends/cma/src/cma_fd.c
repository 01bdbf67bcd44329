/* cma: a copy of a peer's fd (a shared region's memfd, its revocation
 * table), below cma_mem.c and cma_rev.c, which both map them. */
#include "cma_int.h"

/* A copy of the peer's fd `fd`: pidfd_getfd, else /proc/<pid>/fd/<fd>
 * (where a seccomp filter refuses the former). -1 with `why` set. */
int cma_peer_fd(cma_peer_t *p, int fd, char *why, size_t why_len)
{
    if (p->pidfd < 0) {
        p->pidfd = (int)syscall(SYS_pidfd_open, p->pid, 0);
    }
    if (p->pidfd >= 0) {
        int got = (int)syscall(SYS_pidfd_getfd, p->pidfd, fd, 0);
        if (got >= 0) {
            return got;
        }
    }
    int e = errno;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)p->pid, fd);
    int got = open(path, O_RDWR | O_CLOEXEC);
    if (got < 0) {
        snprintf(why, why_len, "pidfd_getfd: %s; open %s: %s", strerror(e),
                 path, strerror(errno));
    }
    return got;
}
