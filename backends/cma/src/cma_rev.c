/* cma: revocation words (cma_int.h): a memfd table of one 64-bit word per
 * registered region, which peers map read-only and look at around every
 * copy. The agent tells the peers that loaded it of a removed region
 * (ctl.c); a peer it never loaded (vLLM's pull shape) hears nothing, and
 * without this a READ of a region mapped from shared memory returned OK
 * with whatever the memory held after the owner freed it. */
#include "cma_int.h"

#include <sys/random.h>

static uint64_t rev_token(void)
{
    uint64_t t = 0;
    while (t == 0) {
        if (getrandom(&t, sizeof(t), 0) != (ssize_t)sizeof(t)) {
            t = (uint64_t)pdx_now_ns() ^ ((uint64_t)getpid() << 32);
        }
    }
    return t;
}

/* The table, made at the first registration; false when it cannot be. */
static bool rev_table(cma_be_t *be)
{
    if (be->rev != NULL) {
        return true;
    }
    if (be->rev_fd == -2) {
        return false; /* tried */
    }
    size_t bytes = (size_t)CMA_REV_SLOTS * sizeof(uint64_t);
    int fd = memfd_create("pdx-cma-rev", MFD_CLOEXEC);
    struct stat sb;
    void *map = MAP_FAILED;
    if (fd >= 0 && ftruncate(fd, (off_t)bytes) == 0 && fstat(fd, &sb) == 0) {
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (map == MAP_FAILED) {
        pdx_warn("cma: no revocation table (%s): peers that never loaded "
                 "this agent are not told of removed regions",
                 strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        be->rev_fd = -2;
        return false;
    }
    be->rev_fd = fd;
    be->rev_ino = (uint64_t)sb.st_ino;
    be->rev = map;
    return true;
}

void cma_rev_register(cma_be_t *be, cma_region_t *m)
{
    m->rev_token = 0;
    if (!rev_table(be)) {
        return;
    }
    uint32_t slot;
    if (be->nrev_free > 0) {
        slot = be->rev_free[--be->nrev_free];
    } else if (be->rev_next < CMA_REV_SLOTS) {
        slot = be->rev_next++;
    } else {
        pdx_info("cma: %u regions registered: region 0x%llx+%llu has no "
                 "revocation word", CMA_REV_SLOTS,
                 (unsigned long long)m->addr, (unsigned long long)m->len);
        return;
    }
    m->rev_slot = slot;
    m->rev_token = rev_token();
    atomic_store_explicit(&be->rev[slot], m->rev_token, memory_order_release);
}

void cma_rev_deregister(cma_be_t *be, cma_region_t *m)
{
    if (m->rev_token == 0) {
        return;
    }
    /* From here no peer's copy with it ends OK. */
    atomic_store_explicit(&be->rev[m->rev_slot], 0, memory_order_seq_cst);
    if (be->rev_free == NULL) {
        be->rev_free = malloc(CMA_REV_SLOTS * sizeof(*be->rev_free));
    }
    if (be->rev_free != NULL) {
        be->rev_free[be->nrev_free++] = m->rev_slot;
    }
    m->rev_token = 0;
}

void cma_rev_pack(const cma_be_t *be, const cma_region_t *m, uint8_t *k)
{
    int has = m->rev_token != 0;
    cma_put_le(k, has ? (uint32_t)be->rev_fd : UINT32_MAX, 4);
    cma_put_le(k + 4, has ? be->rev_ino : 0, 8);
    cma_put_le(k + 12, has ? m->rev_slot : 0, 4);
    cma_put_le(k + 16, m->rev_token, 8);
}

void cma_rev_load(cma_peer_t *p, cma_region_t *m, const uint8_t *k)
{
    int rfd = (int)cma_get_le(k, 4);
    uint64_t ino = cma_get_le(k + 4, 8);
    uint64_t slot = cma_get_le(k + 12, 4), token = cma_get_le(k + 16, 8);
    m->rev_word = NULL;
    if (token == 0 || slot >= CMA_REV_SLOTS || rfd < 0) {
        return;
    }
    if (p->rev == NULL && !p->rev_failed) {
        char why[256] = "";
        int fd = cma_peer_fd(p, rfd, why, sizeof(why));
        size_t bytes = (size_t)CMA_REV_SLOTS * sizeof(uint64_t);
        struct stat sb;
        void *map = MAP_FAILED;
        if (fd >= 0 && fstat(fd, &sb) == 0 && (uint64_t)sb.st_ino == ino &&
            S_ISREG(sb.st_mode) && (uint64_t)sb.st_size >= bytes) {
            map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
            if (map == MAP_FAILED) {
                snprintf(why, sizeof(why), "mmap: %s", strerror(errno));
            }
        } else if (fd >= 0) {
            snprintf(why, sizeof(why), "fd %d of pid %d is not the table the "
                     "key names", rfd, (int)p->pid);
        }
        if (fd >= 0) {
            close(fd);
        }
        if (map == MAP_FAILED) {
            pdx_info("cma: pid %d's revocation table not mapped (%s): its "
                     "regions go unchecked (a removal reaches us only as a "
                     "notice)", (int)p->pid, why);
            p->rev_failed = true;
            return;
        }
        p->rev = map;
        p->rev_ino = ino;
    }
    if (p->rev != NULL && p->rev_ino == ino) {
        m->rev_word = &p->rev[slot];
        m->rev_token = token;
    }
}

void cma_rev_peer_gone(cma_peer_t *p)
{
    if (p->rev != NULL) {
        munmap((void *)(uintptr_t)p->rev,
               (size_t)CMA_REV_SLOTS * sizeof(uint64_t));
        p->rev = NULL;
    }
}

bool cma_rev_ok(const pdx_backend_iov_t *iov, size_t n)
{
    const cma_region_t *last = NULL;
    for (size_t i = 0; i < n; i++) {
        const cma_region_t *m = iov[i].remote_md;
        if (m == last || m->rev_word == NULL) {
            continue;
        }
        last = m;
        if (atomic_load_explicit(m->rev_word, memory_order_acquire) !=
            m->rev_token) {
            return false;
        }
    }
    return true;
}

void cma_rev_fini(cma_be_t *be)
{
    if (be->rev != NULL) {
        munmap(be->rev, (size_t)CMA_REV_SLOTS * sizeof(uint64_t));
    }
    if (be->rev_fd >= 0) {
        close(be->rev_fd);
    }
    free(be->rev_free);
}
