/* cma: registrations and their keys (DRAM only; a key says whether the
 * region is shared memory a peer can map), and remote keys: a peer's
 * shared region mapped here when it can be (then a copy is a memcpy),
 * else reached with process_vm_readv/writev. */
#include "cma_int.h"

pdx_status_t cma_mem_register(void *bev, const pdx_region_t *r,
                              void **md_p)
{
    if (r->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    cma_region_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->addr = r->addr;
    m->len = r->len;
    m->shm_fd = (r->flags & PDX_REGION_F_SHARED) ? r->shm_fd : -1;
    m->shm_offset = r->shm_offset;
    cma_rev_register(bev, m);
    *md_p = m;
    return PDX_OK;
}

void cma_mem_deregister(void *bev, void *md)
{
    cma_rev_deregister(bev, md);
    free(md);
}

pdx_status_t cma_mem_pack(void *bev, void *mdv, void **buf_p,
                          size_t *len_p)
{
    const cma_region_t *m = mdv;
    struct stat sb;
    bool shared = m->shm_fd >= 0 && fstat(m->shm_fd, &sb) == 0;
    size_t base = shared ? CMA_KEY_SHARED : CMA_KEY_PLAIN;
    size_t n = base + CMA_KEY_REV;
    uint8_t *b = malloc(n);
    if (b == NULL) {
        return PDX_ERR_NOMEM;
    }
    cma_put_le(b, m->addr, 8);
    cma_put_le(b + 8, m->len, 8);
    if (shared) {
        cma_put_le(b + 16, (uint32_t)m->shm_fd, 4);
        cma_put_le(b + 20, (uint64_t)sb.st_ino, 8);
        cma_put_le(b + 28, m->shm_offset, 8);
    }
    cma_rev_pack(bev, m, b + base);
    *buf_p = b;
    *len_p = n;
    return PDX_OK;
}

/* Map a peer's shared region into this process; false (with `why`) if
 * anything does not hold, and the region goes through process_vm_*. */
static bool map_shared(cma_peer_t *p, cma_region_t *m, const uint8_t *k,
                       char *why, size_t why_len)
{
    int rfd = (int)cma_get_le(k + 16, 4);
    uint64_t ino = cma_get_le(k + 20, 8), off = cma_get_le(k + 28, 8);
    long pg = sysconf(_SC_PAGESIZE);
    if ((off & (uint64_t)(pg - 1)) != (m->addr & (uint64_t)(pg - 1)) ||
        off + m->len < off || m->len > SIZE_MAX - (size_t)pg) {
        snprintf(why, why_len, "file offset %llu does not fit the region",
                 (unsigned long long)off);
        return false;
    }
    int fd = cma_peer_fd(p, rfd, why, why_len);
    if (fd < 0) {
        return false;
    }
    struct stat sb;
    bool ok = false;
    if (fstat(fd, &sb) != 0 || (uint64_t)sb.st_ino != ino ||
        !S_ISREG(sb.st_mode) || (uint64_t)sb.st_size < off + m->len) {
        snprintf(why, why_len, "fd %d of pid %d is not the file the key "
                 "names (inode %llu, %llu bytes)", rfd, (int)p->pid,
                 (unsigned long long)ino,
                 (unsigned long long)(off + m->len));
    } else {
        uint64_t lead = off & (uint64_t)(pg - 1);
        size_t maplen = (size_t)(lead + m->len);
        void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED,
                         fd, (off_t)(off - lead));
        if (map == MAP_FAILED) {
            snprintf(why, why_len, "mmap: %s", strerror(errno));
        } else {
            m->map = map;
            m->map_len = maplen;
            m->base = (uint8_t *)map + lead;
            ok = true;
        }
    }
    close(fd);
    return ok;
}

pdx_status_t cma_rmem_load(void *bev, void *peer,
                           const pdx_region_t *r, const void *key,
                           size_t len, void **rmd_p)
{
    if (r->mem_type != PDX_MEM_DRAM) {
        return PDX_ERR_UNSUPPORTED;
    }
    const uint8_t *k = key;
    /* A key with a revocation part, or one of a pdx before them. */
    size_t base = len >= CMA_KEY_PLAIN + CMA_KEY_REV ? len - CMA_KEY_REV
                                                     : len;
    if ((base != CMA_KEY_PLAIN && base != CMA_KEY_SHARED) ||
        cma_get_le(k, 8) != r->addr || cma_get_le(k + 8, 8) != r->len) {
        pdx_error("cma: region 0x%llx+%llu: malformed key (%zu bytes; "
                  "length, address or size field does not match the region)",
                  (unsigned long long)r->addr, (unsigned long long)r->len,
                  len);
        return PDX_ERR_CORRUPT;
    }
    cma_region_t *m = calloc(1, sizeof(*m));
    if (m == NULL) {
        return PDX_ERR_NOMEM;
    }
    m->addr = r->addr;
    m->len = r->len;
    m->shm_fd = -1;
    char why[256] = "";
    if (base != len) {
        cma_rev_load(peer, m, k + base);
    }
    bool mapped = base == CMA_KEY_SHARED &&
                  map_shared(peer, m, k, why, sizeof(why));
    if (!mapped && !cma_pvm_allowed(bev, peer, r->addr)) {
        /* Neither a mapping nor process_vm_*: another backend's region. */
        free(m);
        return PDX_ERR_UNSUPPORTED;
    }
    if (base == CMA_KEY_SHARED && !mapped) {
        /* The agent warns once per peer with this reason (path report). */
        pdx_info("cma: shared region 0x%llx+%llu of pid %d not mapped (%s): "
                 "process_vm_readv/writev instead",
                 (unsigned long long)r->addr, (unsigned long long)r->len,
                 (int)((cma_peer_t *)peer)->pid, why);
        snprintf(m->why, sizeof(m->why), "shared memory of pid %d not "
                 "mappable here (%s): process_vm_readv/writev",
                 (int)((cma_peer_t *)peer)->pid, why);
    } else if (base == CMA_KEY_SHARED) {
        cma_warm_add(bev, m);
    } else if (base == CMA_KEY_PLAIN) {
        snprintf(m->why, sizeof(m->why), "not shared memory on the peer "
                 "(not from pdx_mem_alloc or pdx_mem_share): "
                 "process_vm_readv/writev");
    }
    *rmd_p = m;
    return PDX_OK;
}

void cma_rmem_unload(void *bev, void *rmdv)
{
    cma_region_t *m = rmdv;
    if (m->map != NULL) {
        cma_warm_remove(bev, m);
        munmap(m->map, m->map_len);
    }
    free(m);
}
