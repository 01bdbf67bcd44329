/* cma: peers (pid, pidfd: connect and disconnect) and the path report
 * (registrations and remote keys are cma_mem.c's). */
#include "cma_int.h"

pdx_status_t cma_peer_connect(void *bev, const char *name,
                              const void *conn, size_t len,
                              void **peer_p)
{
    cma_be_t *be = bev;
    const uint8_t *c = conn;
    if (len < 12 || cma_get_le(c, 4) != CMA_MAGIC ||
        cma_get_le(c + 4, 2) != CMA_VERSION ||
        12 + cma_get_le(c + 6, 2) != len) {
        pdx_error("cma: peer %s: malformed connection info (%zu bytes)",
                  name, len);
        return PDX_ERR_CORRUPT;
    }
    size_t hl = (size_t)cma_get_le(c + 6, 2);
    if (hl != strlen(be->host_id) || memcmp(c + 12, be->host_id, hl) != 0) {
        return PDX_ERR_UNSUPPORTED; /* another host: UCX carries it */
    }
    uint64_t pid = cma_get_le(c + 8, 4);
    if (pid == 0 || pid > INT32_MAX) {
        /* process_vm_* and pidfd_open would name no process or a group */
        pdx_error("cma: peer %s: malformed connection info: pid %llu",
                  name, (unsigned long long)pid);
        return PDX_ERR_CORRUPT;
    }
    cma_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return PDX_ERR_NOMEM;
    }
    p->pid = (pid_t)pid;
    p->pidfd = -1;
    *peer_p = p;
    return PDX_OK;
}

/* Reading a peer's memory with process_vm_readv/writev needs the right
 * to ptrace it (PTRACE_MODE_ATTACH_REALCREDS) and a kernel and seccomp
 * filter that allow the call. Two services on one host under different
 * users, in different containers or user namespaces, under
 * kernel.yama.ptrace_scope 1 (not parent and child) or with a
 * non-dumpable peer are refused with EPERM at every copy: a region cma
 * cannot map is then not cma's to carry, and its key is declined
 * (PDX_ERR_UNSUPPORTED), so that the agent takes another backend for it
 * instead of failing every request. Only a refusal counts: EFAULT or a
 * short read means the permission was granted (it is checked first). */
bool cma_pvm_allowed(cma_be_t *be, cma_peer_t *p, uint64_t addr)
{
    if (p->pvm != 0) {
        return p->pvm > 0;
    }
    if (be->pvm_refused) { /* said at create */
        p->pvm = -1;
        snprintf(p->pvm_why, sizeof(p->pvm_why), "%s", be->pvm_why);
        return false;
    }
    uint8_t byte;
    struct iovec l = {&byte, 1};
    struct iovec r = {(void *)(uintptr_t)addr, 1};
    ssize_t n = process_vm_readv(p->pid, &l, 1, &r, 1, 0);
    int e = errno;
    if (n >= 0 || (e != EPERM && e != EACCES && e != ENOSYS)) {
        if (n >= 0 || e != ESRCH) {
            p->pvm = 1; /* ESRCH: gone, or not yet: asked again */
        }
        return true;
    }
    p->pvm = -1;
    snprintf(p->pvm_why, sizeof(p->pvm_why),
             "pid %d's memory is not readable here (process_vm_readv: "
             "%s%s)", (int)p->pid, strerror(e),
             e == ENOSYS ? ""
                         : ": other user or namespace, yama ptrace_scope, "
                           "non-dumpable");
    pdx_info("cma: %s: regions outside shared memory cma maps are not "
             "cma's", p->pvm_why);
    return false;
}

void cma_peer_disconnect(void *bev, void *peerv)
{
    cma_peer_t *p = peerv;
    cma_rev_peer_gone(p);
    if (p->pidfd >= 0) {
        close(p->pidfd);
    }
    free(p);
}

pdx_status_t cma_path(void *bev, void *peer, void *rmdv,
                      char *transport, size_t tlen, char *why,
                      size_t wlen)
{
    const cma_region_t *m = rmdv;
    const cma_peer_t *p = peer;
    if (m == NULL && p != NULL && p->pvm < 0) {
        snprintf(transport, tlen, "memcpy");
        snprintf(why, wlen, "%s", p->pvm_why);
        return PDX_ERR_UNAVAILABLE;
    }
    if (m == NULL) {
        snprintf(transport, tlen, "memcpy|process_vm");
        return PDX_OK;
    }
    if (m->base != NULL) {
        snprintf(transport, tlen, "memcpy");
        return PDX_OK;
    }
    snprintf(transport, tlen, "process_vm");
    snprintf(why, wlen, "%s", m->why);
    return PDX_ERR_UNAVAILABLE;
}
