/* cuda_ipc: peers: connect (same host, another or this very process),
 * and their allocations opened here (legacy IPC or VMM fd) and cached
 * until disconnect (the remote keys that use them are cuda_ipc_mem.c's). */
#include "cuda_ipc_int.h"

pdx_status_t cipc_op_peer_connect(void *be_, const char *peer_name,
                                  const void *conn, size_t conn_len,
                                  void **peer_p)
{
    cipc_be_t *be = be_;
    const char *pname = peer_name != NULL ? peer_name : "?";
    char why[96];
    cipc_conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = cipc_conn_decode(conn, conn_len, c, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_error("cuda_ipc: peer %s: bad conn info: %s", pname, why);
        goto out;
    }
    if (!cipc_same_host(be->host_id, c->host_id)) {
        pdx_debug("cuda_ipc: peer %s is on host %s, not %s: declined", pname,
                  c->host_id, be->host_id);
        st = PDX_ERR_UNSUPPORTED;
        goto out;
    }
    /* Devices of the peer that this process sees too. None is fine: with
     * one GPU per DP rank, P's and D's GPUs differ, and their memory is
     * reached through peer access (see rmem_load). */
    int visible = 0;
    for (uint16_t i = 0; i < c->ndev; i++) {
        visible +=
            cipc_uuid_to_ordinal((const uint8_t(*)[CIPC_UUID_LEN])be->uuids,
                                 (size_t)be->ndev, c->uuid[i]) >= 0;
    }
    cipc_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    snprintf(p->name, sizeof(p->name), "%s", pname);
    snprintf(p->host_id, sizeof(p->host_id), "%s", c->host_id);
    p->pid = c->pid;
    p->self = c->pid == (uint32_t)be->ident.pid && c->token == be->ident.token;
    pdx_debug("cuda_ipc: peer %s: pid %u%s, %d of %u device(s) visible", pname,
              c->pid, p->self ? " (this process)" : "", visible, c->ndev);
    *peer_p = p;
out:
    free(c);
    return st;
}

static void map_close(cipc_be_t *be, cipc_map_t *m)
{
    if (cipc_dev_enter(be, m->dev) != PDX_OK) {
        return;
    }
    CUresult r;
    if (m->kind == CIPC_KIND_LEGACY) {
        r = be->api.IpcCloseMemHandle(m->local_base);
        if (r != CUDA_SUCCESS) {
            pdx_warn("cuda_ipc: cuIpcCloseMemHandle: %s",
                     cu_err_name(&be->api, r));
        }
    } else {
        be->api.MemUnmap(m->local_base, (size_t)m->size);
        be->api.MemAddressFree(m->local_base, (size_t)m->size);
        be->api.MemRelease(m->vmm_handle);
    }
    cipc_dev_leave(be);
}

void cipc_op_peer_disconnect(void *be_, void *peer_)
{
    cipc_be_t *be = be_;
    cipc_peer_t *p = peer_;
    if (p == NULL) {
        return;
    }
    if (p->nrmd != 0) {
        pdx_warn("cuda_ipc: peer %s disconnected with %zu region(s) loaded",
                 p->name, p->nrmd);
    }
    while (p->maps != NULL) {
        cipc_map_t *m = p->maps;
        p->maps = m->next;
        map_close(be, m);
        free(m);
    }
    free(p);
}

/* Open a peer's VMM allocation: fetch its fd, import, map, grant access. */
static pdx_status_t open_vmm(cipc_be_t *be, cipc_peer_t *p, const cipc_key_t *k,
                             cipc_map_t *m)
{
    if (!be->vmm) {
        pdx_error("cuda_ipc: peer %s shares VMM memory; this driver lacks "
                  "the VMM API",
                  p->name);
        return PDX_ERR_UNSUPPORTED;
    }
    int fd = be->api.peer_fd((pid_t)k->pid, k->fd);
    if (fd < 0) {
        int e = errno;
        pdx_error("cuda_ipc: peer %s: pidfd_getfd(pid %u, fd %d): %s%s",
                  p->name, k->pid, k->fd, strerror(e),
                  e == EPERM   ? " (needs ptrace permission over the peer: "
                                 "same user and kernel.yama.ptrace_scope 0, "
                                 "or the peer calling prctl(PR_SET_PTRACER))"
                  : e == ESRCH ? " (peer in another pid namespace?)"
                               : "");
        return e == EPERM ? PDX_ERR_UNSUPPORTED : PDX_ERR_IO;
    }
    CUmemGenericAllocationHandle h;
    CUresult r = be->api.MemImportFromShareableHandle(
        &h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd);
    if (r != CUDA_SUCCESS) {
        return cipc_cu_fail(be, r, "cuMemImportFromShareableHandle");
    }
    CUdeviceptr va = 0;
    size_t size = (size_t)k->alloc_size;
    r = be->api.MemAddressReserve(&va, size, 0, 0, 0);
    if (r != CUDA_SUCCESS) {
        be->api.MemRelease(h);
        return cipc_cu_fail(be, r, "cuMemAddressReserve");
    }
    r = be->api.MemMap(va, size, 0, h, 0);
    if (r != CUDA_SUCCESS) {
        be->api.MemAddressFree(va, size);
        be->api.MemRelease(h);
        return cipc_cu_fail(be, r, "cuMemMap");
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = m->dev; /* an ordinal, as CUmemLocation wants */
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = be->api.MemSetAccess(va, size, &acc, 1);
    if (r != CUDA_SUCCESS) {
        be->api.MemUnmap(va, size);
        be->api.MemAddressFree(va, size);
        be->api.MemRelease(h);
        return cipc_cu_fail(be, r, "cuMemSetAccess");
    }
    m->local_base = va;
    m->vmm_handle = h;
    return PDX_OK;
}

/* The peer's allocation behind `k`, opened once and cached. */
pdx_status_t cipc_peer_map(cipc_be_t *be, cipc_peer_t *p, const cipc_key_t *k,
                           int dev, cipc_map_t **m_p)
{
    for (cipc_map_t *m = p->maps; m != NULL; m = m->next) {
        if (m->kind == (cipc_kind_t)k->kind && m->dev == dev &&
            m->remote_base == k->base) {
            if (m->size != k->alloc_size) {
                pdx_error("cuda_ipc: peer %s: allocation 0x%" PRIx64
                          " changed size (%" PRIu64 " -> %" PRIu64
                          "); reload the peer",
                          p->name, k->base, m->size, k->alloc_size);
                return PDX_ERR_STALE;
            }
            *m_p = m;
            return PDX_OK;
        }
    }
    cipc_map_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->kind = (cipc_kind_t)k->kind;
    m->dev = dev;
    m->remote_base = k->base;
    m->size = k->alloc_size;
    pdx_status_t st = cipc_dev_enter(be, dev);
    if (st != PDX_OK) {
        free(m);
        return st;
    }
    if (m->kind == CIPC_KIND_LEGACY) {
        CUipcMemHandle h;
        memcpy(h.reserved, k->handle, CIPC_HANDLE_LEN);
        CUresult r = be->api.IpcOpenMemHandle(
            &m->local_base, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r != CUDA_SUCCESS) {
            pdx_error("cuda_ipc: peer %s: cuIpcOpenMemHandle failed: %s "
                      "(CUDA IPC refused between these processes?)",
                      p->name, cu_err_name(&be->api, r));
            st = cu_status(r);
            st = st < 0 ? st : PDX_ERR_BACKEND;
        }
    } else {
        st = open_vmm(be, p, k, m);
    }
    cipc_dev_leave(be);
    if (st != PDX_OK) {
        free(m);
        return st;
    }
    m->next = p->maps;
    p->maps = m;
    *m_p = m;
    return PDX_OK;
}
