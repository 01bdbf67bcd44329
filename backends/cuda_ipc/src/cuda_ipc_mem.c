/* cuda_ipc: registrations and keys: DRAM pinned with cuMemHostRegister,
 * VRAM exported as a legacy IPC handle or, for VMM allocations, as a POSIX
 * fd; mem_pack writes the key peers load; rmem_load checks a peer's key
 * and maps its allocation (through the peer's cache, cuda_ipc_peer.c). */
#include "cuda_ipc_int.h"

static pdx_status_t reg_dram(cipc_be_t *be, const pdx_region_t *rg,
                             cipc_md_t *md)
{
    if (!(rg->flags & PDX_REGION_F_PIN)) {
        return PDX_OK;
    }
    /* Page-locked so copies to and from GPUs are DMA at PCIe speed;
     * portable so every context sees it as pinned. */
    pdx_status_t st = cipc_dev_enter(be, 0);
    if (st != PDX_OK) {
        return st;
    }
    CUresult r =
        be->api.MemHostRegister((void *)(uintptr_t)rg->addr, (size_t)rg->len,
                                CU_MEMHOSTREGISTER_PORTABLE);
    cipc_dev_leave(be);
    if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
        pdx_debug("cuda_ipc: DRAM 0x%" PRIx64 " already pinned by its owner",
                  rg->addr);
        return PDX_OK;
    }
    if (r != CUDA_SUCCESS) {
        pdx_error("cuda_ipc: pinning DRAM 0x%" PRIx64 "+%" PRIu64
                  " failed: %s (RLIMIT_MEMLOCK?)",
                  rg->addr, rg->len, cu_err_name(&be->api, r));
        st = cu_status(r);
        return st < 0 ? st : PDX_ERR_BACKEND;
    }
    md->pinned = 1;
    return PDX_OK;
}

/* Export a VMM allocation as a POSIX fd the peer fetches with pidfd_getfd. */
static pdx_status_t export_vmm(cipc_be_t *be, cipc_md_t *md)
{
    CUmemGenericAllocationHandle h;
    CUresult r =
        be->api.MemRetainAllocationHandle(&h, (void *)(uintptr_t)md->base);
    if (r != CUDA_SUCCESS) {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 " is neither cudaMalloc-style "
                  "nor a VMM allocation (%s); cannot share it",
                  md->addr, cu_err_name(&be->api, r));
        return PDX_ERR_UNSUPPORTED;
    }
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    r = be->api.MemGetAllocationPropertiesFromHandle(&prop, h);
    if (r == CUDA_SUCCESS && !(prop.requestedHandleTypes &
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) {
        be->api.MemRelease(h);
        pdx_error("cuda_ipc: VMM allocation at 0x%" PRIx64 " was not created "
                  "shareable as a POSIX fd (requestedHandleTypes 0x%x)",
                  md->base, (unsigned)prop.requestedHandleTypes);
        return PDX_ERR_UNSUPPORTED;
    }
    int fd = -1;
    if (r == CUDA_SUCCESS) {
        r = be->api.MemExportToShareableHandle(
            &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    }
    /* The exported fd keeps its own reference to the allocation. */
    be->api.MemRelease(h);
    if (r != CUDA_SUCCESS) {
        return cipc_cu_fail(be, r, "cuMemExportToShareableHandle");
    }
    md->fd = fd;
    md->kind = CIPC_KIND_VMM_FD;
    return PDX_OK;
}

static pdx_status_t reg_vram(cipc_be_t *be, const pdx_region_t *rg,
                             cipc_md_t *md)
{
    if (rg->dev_id >= (uint32_t)be->ndev) {
        pdx_error("cuda_ipc: VRAM region on device %u, only %d visible",
                  rg->dev_id, be->ndev);
        return PDX_ERR_INVALID;
    }
    int d = (int)rg->dev_id;
    pdx_status_t st = cipc_dev_enter(be, d);
    if (st != PDX_OK) {
        return st;
    }
    CUdeviceptr p = (CUdeviceptr)rg->addr;
    unsigned int mtype = 0;
    int ordinal = -1, legacy = 1;
    CUresult r = be->api.PointerGetAttribute(
        &mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r != CUDA_SUCCESS || mtype != CU_MEMORYTYPE_DEVICE) {
        pdx_error("cuda_ipc: 0x%" PRIx64 " is not device memory (%s)", rg->addr,
                  r ? cu_err_name(&be->api, r) : "host memory");
        st = PDX_ERR_INVALID;
        goto out;
    }
    r = be->api.PointerGetAttribute(&ordinal,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
    if (r != CUDA_SUCCESS) {
        st = cipc_cu_fail(be, r, "cuPointerGetAttribute(DEVICE_ORDINAL)");
        goto out;
    }
    if (ordinal != d) {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 " registered as device %d "
                  "lives on device %d",
                  rg->addr, d, ordinal);
        st = PDX_ERR_INVALID;
        goto out;
    }
    CUdeviceptr base = 0;
    size_t size = 0;
    r = be->api.MemGetAddressRange(&base, &size, p);
    if (r != CUDA_SUCCESS) {
        st = cipc_cu_fail(be, r, "cuMemGetAddressRange");
        goto out;
    }
    if (be->api.PointerGetAttribute(
            &legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) !=
        CUDA_SUCCESS) {
        legacy = 1; /* old driver: try and let cuIpcGetMemHandle say */
    }
    if (!legacy) {
        /* A VMM mapping: its start is offset 0 of the physical allocation
         * (cuMemMap takes offset 0 only). */
        CUdeviceptr mbase = 0;
        size_t msize = 0;
        if (be->api.PointerGetAttribute(&mbase,
                                        CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
                                        p) == CUDA_SUCCESS &&
            be->api.PointerGetAttribute(
                &msize, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p) == CUDA_SUCCESS &&
            msize != 0) {
            base = mbase;
            size = msize;
        }
    }
    if (!cipc_in_range(rg->addr, rg->len, base, size)) {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 "+%" PRIu64 " spans more than "
                  "one allocation (0x%llx+%zu); register per allocation",
                  rg->addr, rg->len, (unsigned long long)base, size);
        st = PDX_ERR_UNSUPPORTED;
        goto out;
    }
    md->base = base;
    md->alloc_size = size;
    if (legacy) {
        CUipcMemHandle h;
        r = be->api.IpcGetMemHandle(&h, base);
        if (r != CUDA_SUCCESS) {
            st = cipc_cu_fail(be, r, "cuIpcGetMemHandle");
            goto out;
        }
        memcpy(md->handle, h.reserved, CIPC_HANDLE_LEN);
        md->kind = CIPC_KIND_LEGACY;
    } else if (be->vmm) {
        st = export_vmm(be, md);
    } else {
        pdx_error("cuda_ipc: VRAM 0x%" PRIx64 " is not legacy-IPC capable "
                  "and the driver lacks the VMM API",
                  rg->addr);
        st = PDX_ERR_UNSUPPORTED;
    }
out:
    cipc_dev_leave(be);
    return st;
}

pdx_status_t cipc_op_mem_register(void *be_, const pdx_region_t *rg,
                                  void **md_p)
{
    cipc_be_t *be = be_;
    if (rg == NULL || rg->len == 0 || rg->addr == 0 ||
        rg->addr + rg->len < rg->addr) {
        return PDX_ERR_INVALID;
    }
    if (rg->mem_type != PDX_MEM_DRAM && rg->mem_type != PDX_MEM_VRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    cipc_md_t *md = calloc(1, sizeof(*md));
    if (md == NULL) {
        return PDX_ERR_NOMEM;
    }
    md->type = rg->mem_type;
    md->addr = rg->addr;
    md->len = rg->len;
    md->fd = -1;
    md->dev = -1;
    md->kind = CIPC_KIND_HOST;
    md->base = rg->addr;
    md->alloc_size = rg->len;
    pdx_status_t st;
    if (rg->mem_type == PDX_MEM_DRAM) {
        st = reg_dram(be, rg, md);
    } else {
        md->dev = (int)rg->dev_id;
        st = reg_vram(be, rg, md);
    }
    if (st != PDX_OK) {
        free(md);
        return st;
    }
    *md_p = md;
    return PDX_OK;
}

void cipc_op_mem_deregister(void *be_, void *md_)
{
    cipc_be_t *be = be_;
    cipc_md_t *md = md_;
    if (md == NULL) {
        return;
    }
    if (md->pinned && cipc_dev_enter(be, 0) == PDX_OK) {
        CUresult r = be->api.MemHostUnregister((void *)(uintptr_t)md->addr);
        if (r != CUDA_SUCCESS) {
            pdx_warn("cuda_ipc: cuMemHostUnregister 0x%" PRIx64 ": %s",
                     md->addr, cu_err_name(&be->api, r));
        }
        cipc_dev_leave(be);
    }
    if (md->fd >= 0) {
        close(md->fd);
    }
    free(md);
}

pdx_status_t cipc_op_mem_pack(void *be_, void *md_, void **buf_p, size_t *len_p)
{
    cipc_be_t *be = be_;
    cipc_md_t *md = md_;
    cipc_key_t k;
    memset(&k, 0, sizeof(k));
    k.kind = (uint16_t)md->kind;
    if (md->dev >= 0) {
        memcpy(k.uuid, be->uuids[md->dev], CIPC_UUID_LEN);
    }
    k.pid = (uint32_t)be->ident.pid;
    k.fd = md->fd;
    k.base = md->base;
    k.alloc_size = md->alloc_size;
    k.offset = md->addr - md->base;
    k.len = md->len;
    memcpy(k.handle, md->handle, CIPC_HANDLE_LEN);
    snprintf(k.host_id, sizeof(k.host_id), "%s", be->host_id);
    return cipc_key_encode(&k, buf_p, len_p);
}

pdx_status_t cipc_op_rmem_load(void *be_, void *peer_, const pdx_region_t *rg,
                               const void *key, size_t key_len, void **rmd_p)
{
    cipc_be_t *be = be_;
    cipc_peer_t *p = peer_;
    char why[96];
    cipc_key_t k;
    pdx_status_t st = cipc_key_decode(key, key_len, &k, why, sizeof(why));
    if (st != PDX_OK) {
        pdx_error("cuda_ipc: peer %s: bad region key: %s", p->name, why);
        return st;
    }
    if (k.pid != p->pid || strcmp(k.host_id, p->host_id) != 0) {
        pdx_error("cuda_ipc: peer %s: region key from pid %u on %s, but the "
                  "peer is pid %u on %s",
                  p->name, k.pid, k.host_id, p->pid, p->host_id);
        return PDX_ERR_INVALID;
    }
    pdx_mem_type_t want =
        k.kind == CIPC_KIND_HOST ? PDX_MEM_DRAM : PDX_MEM_VRAM;
    if (rg != NULL && (rg->mem_type != want || rg->addr != k.base + k.offset ||
                       rg->len != k.len)) {
        pdx_error("cuda_ipc: peer %s: region 0x%" PRIx64 "+%" PRIu64
                  " does not match its key 0x%" PRIx64 "+%" PRIu64,
                  p->name, rg->addr, rg->len, k.base + k.offset, k.len);
        return PDX_ERR_INVALID;
    }
    cipc_rmd_t *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        return PDX_ERR_NOMEM;
    }
    r->peer = p;
    r->addr = k.base + k.offset;
    r->len = k.len;
    if (k.kind == CIPC_KIND_HOST) {
        /* The peer's DRAM is not reachable through CUDA IPC. Loading it
         * still succeeds: the agent loads every key of a peer and fails the
         * whole peer on an error, though UCX reaches this region fine.
         * A transfer that uses it here fails with PDX_ERR_UNSUPPORTED. */
        r->host = 1;
        r->dev = -1;
        p->nrmd++;
        *rmd_p = r;
        return PDX_OK;
    }
    int dev = cipc_uuid_to_ordinal((const uint8_t(*)[CIPC_UUID_LEN])be->uuids,
                                   (size_t)be->ndev, k.uuid);
    if (dev < 0) {
        /* Not visible here (CUDA_VISIBLE_DEVICES differs, e.g. one GPU per
         * DP rank): open it from device 0, through peer access (NVLink or
         * PCIe P2P); cuIpcOpenMemHandle enables it lazily. */
        char u[48];
        cipc_uuid_format(k.uuid, u, sizeof(u));
        pdx_info("cuda_ipc: peer %s: region on %s, not visible here; "
                 "reaching it from device 0 through peer access",
                 p->name, u);
        dev = 0;
    }
    r->dev = dev;
    if (p->self) {
        /* Same process: the peer's addresses are ours. Its ordinals are
         * ours too, and dev_ctx makes sure the context exists. */
        st = cipc_dev_ctx(be, dev);
        r->ptr = (CUdeviceptr)r->addr;
    } else {
        cipc_map_t *m;
        st = cipc_peer_map(be, p, &k, dev, &m);
        if (st == PDX_OK) {
            r->ptr = m->local_base + (CUdeviceptr)k.offset;
        }
    }
    if (st != PDX_OK) {
        free(r);
        return st;
    }
    p->nrmd++;
    *rmd_p = r;
    return PDX_OK;
}

void cipc_op_rmem_unload(void *be_, void *rmd_)
{
    cipc_rmd_t *r = rmd_;
    if (r == NULL) {
        return;
    }
    /* The mapping stays cached on the peer until it disconnects. */
    r->peer->nrmd--;
    free(r);
}
