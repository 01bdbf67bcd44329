/* Prepared lists: descriptors resolved once against the agent's regions
 * or a peer's, with their regions held, for pdx_xfer_make. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "api_int.h"
#include "dlist_int.h"
#include "mem_int.h"
#include "peer_int.h"

/* Entries of a prepared list. Large arrays (a 1M-descriptor model is 24 MB)
 * are mapped on huge pages and populated up front: first-touch faults of a
 * fresh malloc cost more than resolving the descriptors (15-20 vs 5-8
 * ns/desc measured from Python). */
#define DLIST_MAP_MIN (2u << 20)
#define DLIST_HUGE (2u << 20)
/* Descriptors resolved per hold of the agent lock: other threads wait at
 * most for one chunk (about 0.1 ms), not for the whole list. */
#define DLIST_CHUNK 16384

/* Mappings of released lists, kept for the next prepare: releasing a
 * 100k-descriptor list was a 2.4 MB munmap (0.26 ms, issue 19), and a new
 * mapping costs its page faults again. Process-wide (lists of every agent
 * are the same kind of memory), at most DLIST_CACHE_N mappings and
 * DLIST_CACHE_MAX bytes; a leaf lock taken with trylock (contended, or
 * stuck after fork: plain mmap/munmap). */
#define DLIST_CACHE_N 8
#define DLIST_CACHE_MAX (256u << 20)
static pthread_mutex_t g_dl_cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *m;
    size_t len;
} g_dl_cache[DLIST_CACHE_N];
static size_t g_dl_cache_bytes;

static void *dl_cache_take(size_t len, size_t *got_p)
{
    void *m = NULL;
    if (pthread_mutex_trylock(&g_dl_cache_lock) != 0) {
        return NULL;
    }
    int best = -1;
    for (int i = 0; i < DLIST_CACHE_N; i++) {
        /* The smallest that fits, and not more than 4x too large. */
        if (g_dl_cache[i].m != NULL && g_dl_cache[i].len >= len &&
            g_dl_cache[i].len / 4 <= len &&
            (best < 0 || g_dl_cache[i].len < g_dl_cache[best].len)) {
            best = i;
        }
    }
    if (best >= 0) {
        m = g_dl_cache[best].m;
        *got_p = g_dl_cache[best].len;
        g_dl_cache_bytes -= g_dl_cache[best].len;
        g_dl_cache[best].m = NULL;
    }
    pthread_mutex_unlock(&g_dl_cache_lock);
    return m;
}

static bool dl_cache_put(void *m, size_t len)
{
    bool kept = false;
    if (pthread_mutex_trylock(&g_dl_cache_lock) != 0) {
        return false;
    }
    for (int i = 0; i < DLIST_CACHE_N && !kept; i++) {
        if (g_dl_cache[i].m == NULL &&
            g_dl_cache_bytes + len <= DLIST_CACHE_MAX) {
            g_dl_cache[i].m = m;
            g_dl_cache[i].len = len;
            g_dl_cache_bytes += len;
            kept = true;
        }
    }
    pthread_mutex_unlock(&g_dl_cache_lock);
    return kept;
}

static pdx_dlist_entry_t *entries_alloc(size_t n, size_t *map_len_p)
{
    size_t bytes = (n ? n : 1) * sizeof(pdx_dlist_entry_t);
    *map_len_p = 0;
    if (bytes >= DLIST_MAP_MIN) {
        size_t len = (bytes + DLIST_HUGE - 1) & ~(size_t)(DLIST_HUGE - 1);
        /* A cached mapping may be larger: its true length is kept. */
        void *m = dl_cache_take(len, &len);
        if (m == NULL) {
            m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) {
                return malloc(bytes);
            }
            madvise(m, len, MADV_HUGEPAGE);
#ifdef MADV_POPULATE_WRITE
            madvise(m, len, MADV_POPULATE_WRITE); /* best effort */
#endif
        }
        *map_len_p = len;
        return m;
    }
    return malloc(bytes);
}

static void entries_free(pdx_dlist_entry_t *e, size_t map_len)
{
    if (map_len > 0) {
        if (!dl_cache_put(e, map_len)) {
            munmap(e, map_len);
        }
    } else {
        free(e);
    }
}

/* Drop the users a list under construction holds (lock held). */
static void dlist_unhold(struct pdx_dlist *d)
{
    for (size_t i = 0; i < d->nregs; i++) {
        d->regs[i]->users--;
    }
    d->nregs = 0;
    for (size_t i = 0; i < d->nrregs; i++) {
        pdx_peer_region_put_locked(d->rregs[i]);
    }
    d->nrregs = 0;
}

/* Hold peer region `g` in list `d` (once per distinct region). */
static pdx_status_t dlist_hold_remote(struct pdx_dlist *d, size_t *cap,
                                      pdx_peer_region_t *g)
{
    for (size_t i = d->nrregs; i > 0; i--) {
        if (d->rregs[i - 1] == g) {
            return PDX_OK;
        }
    }
    if (d->nrregs == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        void *n = realloc(d->rregs, c * sizeof(*d->rregs));
        if (n == NULL) {
            return PDX_ERR_NOMEM;
        }
        d->rregs = n;
        *cap = c;
    }
    d->rregs[d->nrregs++] = g;
    g->users++;
    return PDX_OK;
}

pdx_status_t pdxi_dlist_prepare(pdx_agent_h agent, const char *peer,
                                const pdx_desc_list_t *list,
                                pdx_dlist_h *dlist_p)
{
    if (list->count > UINT32_MAX) {
        pdx_error("agent %s: prepare: %zu descriptors (at most %u)",
                  agent->name, list->count, UINT32_MAX);
        return PDX_ERR_TOO_LARGE;
    }
    pdx_status_t st = PDX_OK;
    struct pdx_dlist *d = pdx_handle_alloc(sizeof(*d), PDX_MAGIC_DLIST);
    if (d == NULL) {
        return PDX_ERR_NOMEM;
    }
    d->agent = agent;
    d->mem_type = list->mem_type;
    d->count = list->count;
    d->entries = entries_alloc(list->count, &d->entries_map_len);
    if (d->entries == NULL) {
        pdx_error("agent %s: prepare: out of memory for %zu descriptors",
                  agent->name, list->count);
        pdx_handle_release(d);
        return PDX_ERR_NOMEM;
    }
    size_t capset = 0, caprset = 0;
    pdx_agent_lock(agent);
    pdx_peer_t *p = NULL;
    if (peer != NULL) {
        p = pdx_peer_find(agent, peer);
        if (p == NULL) {
            pdx_error("agent %s: prepare: unknown peer %s", agent->name, peer);
            st = PDX_ERR_NOT_FOUND;
            goto err;
        }
        d->remote = true;
        snprintf(d->peer_name, sizeof(d->peer_name), "%s", peer);
        d->peer_epoch = p->epoch;
    }
    void *last = NULL;
    for (size_t i = 0; i < list->count; i++) {
        if (i > 0 && i % DLIST_CHUNK == 0) {
            /* Let other threads in. Local regions found so far hold users
             * (they cannot be deregistered); a peer's are valid while the
             * peer keeps its incarnation. */
            pthread_mutex_unlock(&agent->lock);
            pdx_agent_lock(agent);
            if (p != NULL) {
                p = pdx_peer_find(agent, peer);
                if (p == NULL || p->epoch != d->peer_epoch) {
                    pdx_error("agent %s: prepare: peer %s was unloaded or "
                              "reloaded meanwhile", agent->name, peer);
                    st = PDX_ERR_STALE;
                    goto err;
                }
            }
        }
        const pdx_desc_t *e = &list->descs[i];
        void *region;
        if (e->len == 0) {
            pdx_error("agent %s: prepare: descriptor %zu has length 0",
                      agent->name, i);
            st = PDX_ERR_INVALID;
            goto err;
        }
        if (p != NULL) {
            pdx_peer_region_t *g = last;
            if (g == NULL || !pdx_region_holds(&g->region, e->addr, e->len)) {
                g = pdx_peer_region_find(p, list->mem_type, e->addr, e->len);
                if (g != NULL &&
                    (st = dlist_hold_remote(d, &caprset, g)) != PDX_OK) {
                    goto err;
                }
            }
            region = g;
        } else {
            struct pdx_mem_reg *r = last;
            if (r == NULL || !pdx_region_holds(&r->region, e->addr, e->len)) {
                r = pdx_reg_find(agent, list->mem_type, e->addr, e->len);
                if (r != NULL) {
                    size_t before = d->nregs;
                    if ((st = pdx_mem_reg_set_add(&d->regs, &d->nregs,
                                                  &capset, r)) != PDX_OK) {
                        goto err;
                    }
                    if (d->nregs > before) {
                        r->users++; /* held from now: see the chunks */
                    }
                }
            }
            region = r;
        }
        if (region == NULL) {
            pdx_error("agent %s: prepare: descriptor %zu 0x%llx+%llu is not "
                      "in %s registered memory", agent->name, i,
                      (unsigned long long)e->addr, (unsigned long long)e->len,
                      p ? p->name : "this agent's");
            st = PDX_ERR_NOT_FOUND;
            goto err;
        }
        last = region;
        d->entries[i] = (pdx_dlist_entry_t){.addr = e->addr, .len = e->len,
                                            .region = region};
    }
    pthread_mutex_unlock(&agent->lock);
    *dlist_p = d;
    return PDX_OK;
err:
    dlist_unhold(d);
    pthread_mutex_unlock(&agent->lock);
    free(d->regs);
    free(d->rregs);
    entries_free(d->entries, d->entries_map_len);
    pdx_handle_release(d);
    return st;
}

void pdxi_dlist_release(pdx_dlist_h d)
{
    pdx_agent_lock(d->agent);
    dlist_unhold(d);
    pthread_mutex_unlock(&d->agent->lock);
    free(d->regs);
    free(d->rregs);
    d->rregs = NULL;
    entries_free(d->entries, d->entries_map_len);
    d->regs = NULL;
    d->entries = NULL;
    pdx_handle_release(d);
}

