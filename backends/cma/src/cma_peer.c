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
