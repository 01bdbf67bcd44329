/* Shared host memory: pdx_mem_alloc/free (memfd, MAP_SHARED) and
 * pdx_mem_share/unshare (a caller's own MAP_SHARED mapping of an fd).
 *
 * A process-wide registry, sorted by address, of the ranges a same-host
 * peer may map. pdx_mem_register looks a region up here and hands the fd
 * and offset to the backends (PDX_REGION_F_SHARED); the cma backend packs
 * them in the region's key, and a peer maps the memory (pidfd_getfd, mmap)
 * so that a transfer is one memcpy by the initiator. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "api_int.h"
#include "base_int.h"
#include "shm_int.h"

typedef struct shm_ent {
    uint64_t addr, len;
    int fd;           /* owned (a dup for pdx_mem_share) */
    uint64_t fd_off;  /* offset of `addr` in the file */
    bool allocated;   /* pdx_mem_alloc: munmap on free */
    uint32_t users;   /* registrations inside this range */
    bool inherited;   /* from the parent, in a forked child: fd closed,
                       * never found, dropped on free/unshare/overlap */
} shm_ent_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static shm_ent_t **g_ents;
static size_t g_n, g_cap;
/* Starts of inherited entries a child's own mapping took the place of
 * (drop_inherited): a later free or unshare of one is the documented
 * no-op, not "not found". The last GONE_MAX, lock held. */
#define GONE_MAX 64
static struct {
    uint64_t addr;
    bool allocated;
} g_gone[GONE_MAX];
static size_t g_ngone;

static bool take_gone(uint64_t a, bool allocated)
{
    for (size_t i = 0; i < g_ngone && i < GONE_MAX; i++) {
        if (g_gone[i].addr == a && g_gone[i].allocated == allocated) {
            g_gone[i].addr = 0;
            return true;
        }
    }
    return false;
}

/* First entry whose addr >= a. Lock held. */
static size_t lower_bound(uint64_t a)
{
    size_t lo = 0, hi = g_n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g_ents[mid]->addr < a) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Entry holding [a, a+len), or NULL. Lock held. */
static shm_ent_t *find_any(uint64_t a, uint64_t len)
{
    size_t i = lower_bound(a);
    if (i < g_n && g_ents[i]->addr == a) {
        return len <= g_ents[i]->len ? g_ents[i] : NULL;
    }
    if (i == 0) {
        return NULL;
    }
    shm_ent_t *e = g_ents[i - 1];
    pdx_region_t r = {.addr = e->addr, .len = e->len};
    return pdx_region_holds(&r, a, len) ? e : NULL;
}

/* The same, never an entry inherited from the parent. */
static shm_ent_t *find(uint64_t a, uint64_t len)
{
    shm_ent_t *e = find_any(a, len);
    return e != NULL && !e->inherited ? e : NULL;
}

static void drop_at(size_t i)
{
    memmove(&g_ents[i], &g_ents[i + 1], (g_n - i - 1) * sizeof(*g_ents));
    g_n--;
    if (g_n == 0) {
        free(g_ents);
        g_ents = NULL;
        g_cap = 0;
    }
}

/* A child's new mapping may take an address the parent's memory had (not
 * mapped here: MADV_DONTFORK): entries inherited over [a, a+len) go. */
static void drop_inherited(uint64_t a, uint64_t len)
{
    size_t i = lower_bound(a);
    if (i > 0) {
        i--;
    }
    while (i < g_n && g_ents[i]->addr < a + len) {
        shm_ent_t *e = g_ents[i];
        if (e->inherited && e->addr + e->len > a) {
            g_gone[g_ngone % GONE_MAX].addr = e->addr;
            g_gone[g_ngone % GONE_MAX].allocated = e->allocated;
            g_ngone++;
            drop_at(i);
            free(e);
            continue;
        }
        i++;
    }
}

/* shm's part of fork: 0 before fork (take its lock), 1 in the parent
 * after (release it), 2 in the child (release it, forget what the parent
 * shared: MADV_DONTFORK memory is not mapped in the child). No other pdx
 * lock is taken under g_lock, so its order against call.c's is free. */
static void shm_atfork(int phase)
{
    if (phase == 0) {
        pthread_mutex_lock(&g_lock);
        return;
    }
    if (phase == 2) {
        for (size_t i = 0; i < g_n; i++) {
            if (!g_ents[i]->inherited) {
                close(g_ents[i]->fd);
                g_ents[i]->fd = -1;
                g_ents[i]->inherited = true;
            }
        }
    }
    pthread_mutex_unlock(&g_lock);
}

static void shm_fork_prepare(void) { shm_atfork(0); }
static void shm_fork_parent(void) { shm_atfork(1); }
static void shm_fork_child(void) { shm_atfork(2); }

__attribute__((constructor)) static void shm_fork_init(void)
{
    pthread_atfork(shm_fork_prepare, shm_fork_parent, shm_fork_child);
}

static pdx_status_t insert(uint64_t a, uint64_t len, int fd, uint64_t off,
                           bool allocated)
{
    pdx_status_t st = PDX_OK;
    pthread_mutex_lock(&g_lock);
    drop_inherited(a, len);
    size_t i = lower_bound(a);
    if ((i < g_n && g_ents[i]->addr < a + len) ||
        (i > 0 && g_ents[i - 1]->addr + g_ents[i - 1]->len > a)) {
        pdx_error("mem share: 0x%llx+%llu overlaps shared memory already "
                  "known to pdx", (unsigned long long)a,
                  (unsigned long long)len);
        st = PDX_ERR_EXISTS;
        goto out;
    }
    if (g_n == g_cap) {
        size_t cap = g_cap ? g_cap * 2 : 16;
        void *p = realloc(g_ents, cap * sizeof(*g_ents));
        if (p == NULL) {
            st = PDX_ERR_NOMEM;
            goto out;
        }
        g_ents = p;
        g_cap = cap;
    }
    shm_ent_t *e = calloc(1, sizeof(*e));
    if (e == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    *e = (shm_ent_t){.addr = a, .len = len, .fd = fd, .fd_off = off,
                     .allocated = allocated};
    memmove(&g_ents[i + 1], &g_ents[i], (g_n - i) * sizeof(*g_ents));
    g_ents[i] = e;
    g_n++;
out:
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* Remove the entry starting at `a` if it is idle; returns it (caller
 * frees) or NULL with *st_p set. */
static shm_ent_t *remove_at(uint64_t a, bool allocated, pdx_status_t *st_p)
{
    pthread_mutex_lock(&g_lock);
    size_t i = lower_bound(a);
    shm_ent_t *e = NULL;
    if (i < g_n && g_ents[i]->addr == a && g_ents[i]->inherited) {
        /* The parent's, in a forked child: forgotten, nothing unmapped. */
        e = g_ents[i];
        drop_at(i);
        *st_p = PDX_OK;
    } else if ((i >= g_n || g_ents[i]->addr != a) &&
               take_gone(a, allocated)) {
        /* The parent's, superseded by a mapping of the child's own that
         * has gone since: forgotten already. */
        *st_p = PDX_OK;
    } else if (i >= g_n || g_ents[i]->addr != a ||
               g_ents[i]->allocated != allocated) {
        pdx_error("mem %s: 0x%llx is not the start of memory from %s",
                  allocated ? "free" : "unshare", (unsigned long long)a,
                  allocated ? "pdx_mem_alloc" : "pdx_mem_share");
        *st_p = PDX_ERR_NOT_FOUND;
    } else if (g_ents[i]->users > 0) {
        pdx_error("mem %s: 0x%llx is still registered (%u registrations); "
                  "deregister it first", allocated ? "free" : "unshare",
                  (unsigned long long)a, g_ents[i]->users);
        *st_p = PDX_ERR_BUSY;
    } else {
        e = g_ents[i];
        drop_at(i);
        *st_p = PDX_OK;
    }
    pthread_mutex_unlock(&g_lock);
    return e;
}

pdx_status_t pdxi_mem_alloc(size_t len, uint64_t flags, void **ptr_p)
{
    if (len == 0 || ptr_p == NULL || (flags & ~PDX_MEM_F_POPULATE) != 0) {
        pdx_error("mem alloc: invalid arguments (len %zu, flags 0x%llx)", len,
                  (unsigned long long)flags);
        return PDX_ERR_INVALID;
    }
    int fd = memfd_create("pdx-shm", MFD_CLOEXEC);
    if (fd < 0) {
        pdx_error("mem alloc: memfd_create: %s", strerror(errno));
        return errno == ENOMEM ? PDX_ERR_NOMEM : PDX_ERR_IO;
    }
    if (ftruncate(fd, (off_t)len) != 0) {
        pdx_error("mem alloc: ftruncate to %zu bytes: %s", len,
                  strerror(errno));
        close(fd);
        return PDX_ERR_NOMEM;
    }
    int mflags = MAP_SHARED | ((flags & PDX_MEM_F_POPULATE) ? MAP_POPULATE : 0);
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, mflags, fd, 0);
    if (p == MAP_FAILED) {
        pdx_error("mem alloc: mmap of %zu bytes: %s", len, strerror(errno));
        close(fd);
        return PDX_ERR_NOMEM;
    }
    /* Not inherited by fork: MAP_SHARED would otherwise give a child the
     * parent's live KV memory (not a copy, as private memory would be). */
    (void)madvise(p, len, MADV_DONTFORK);
    pdx_status_t st = insert((uint64_t)(uintptr_t)p, len, fd, 0, true);
    if (st != PDX_OK) {
        munmap(p, len);
        close(fd);
        return st;
    }
    *ptr_p = p;
    return PDX_OK;
}

pdx_status_t pdxi_mem_free(void *ptr)
{
    if (ptr == NULL) {
        return PDX_OK;
    }
    pdx_status_t st;
    shm_ent_t *e = remove_at((uint64_t)(uintptr_t)ptr, true, &st);
    if (e != NULL && !e->inherited) {
        munmap(ptr, e->len);
        close(e->fd);
    }
    free(e);
    return st;
}

pdx_status_t pdxi_mem_share(void *addr, size_t len, int fd, uint64_t offset)
{
    struct stat sb;
    long pg = sysconf(_SC_PAGESIZE);
    uint64_t a = (uint64_t)(uintptr_t)addr;
    if (addr == NULL || len == 0 || a + len < a || fd < 0 ||
        (a & (uint64_t)(pg - 1)) != (offset & (uint64_t)(pg - 1))) {
        pdx_error("mem share: invalid arguments (addr %p, len %zu, fd %d, "
                  "offset %llu; addr and offset must agree modulo the page "
                  "size)", addr, len, fd, (unsigned long long)offset);
        return PDX_ERR_INVALID;
    }
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (uint64_t)sb.st_size < offset + len) {
        pdx_error("mem share: fd %d is not a regular file of at least %llu "
                  "bytes", fd, (unsigned long long)(offset + len));
        return PDX_ERR_INVALID;
    }
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) {
        pdx_error("mem share: dup of fd %d: %s", fd, strerror(errno));
        return PDX_ERR_IO;
    }
    pdx_status_t st = insert(a, len, dup_fd, offset, false);
    if (st != PDX_OK) {
        close(dup_fd);
    }
    return st;
}

pdx_status_t pdxi_mem_unshare(void *addr)
{
    pdx_status_t st;
    shm_ent_t *e = remove_at((uint64_t)(uintptr_t)addr, false, &st);
    if (e != NULL && !e->inherited) {
        close(e->fd);
    }
    free(e);
    return st;
}

pdx_status_t pdxi_mem_fd(const void *ptr, uint64_t len, int *fd_p,
                         uint64_t *offset_p)
{
    pdx_status_t st = PDX_ERR_NOT_FOUND;
    pthread_mutex_lock(&g_lock);
    shm_ent_t *e = find((uint64_t)(uintptr_t)ptr, len ? len : 1);
    if (e != NULL) {
        *fd_p = e->fd;
        *offset_p = e->fd_off + ((uint64_t)(uintptr_t)ptr - e->addr);
        st = PDX_OK;
    }
    pthread_mutex_unlock(&g_lock);
    if (st != PDX_OK) {
        pdx_error("mem fd: %p+%llu is not in memory from pdx_mem_alloc or "
                  "pdx_mem_share", ptr, (unsigned long long)len);
    }
    return st;
}

bool pdx_shm_acquire(uint64_t addr, uint64_t len, int *fd_p, uint64_t *off_p)
{
    bool found = false;
    pthread_mutex_lock(&g_lock);
    shm_ent_t *e = find(addr, len);
    if (e != NULL) {
        e->users++;
        *fd_p = e->fd;
        *off_p = e->fd_off + (addr - e->addr);
        found = true;
    }
    pthread_mutex_unlock(&g_lock);
    return found;
}

void pdx_shm_release(uint64_t addr, uint64_t len)
{
    pthread_mutex_lock(&g_lock);
    shm_ent_t *e = find(addr, len);
    if (e != NULL && e->users > 0) {
        e->users--;
    }
    pthread_mutex_unlock(&g_lock);
}
