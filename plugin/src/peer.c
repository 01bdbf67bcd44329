/* Metadata describe/load and peers: invariant checks, backend connections,
 * pidfd liveness, stale detection through per-incarnation epochs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent_int.h"

pdx_status_t pdxi_agent_describe(pdx_agent_h agent, void **blob_p,
                                size_t *len_p)
{
    pdx_wbuf_t w = {0};
    pdx_status_t st = PDX_OK;
    pthread_mutex_lock(&agent->lock);
    pdx_blob_begin(&w);
    pdx_wbuf_str(&w, agent->name);
    pdx_wbuf_u64(&w, agent->instance);
    pdx_wbuf_u32(&w, agent->generation);
    pdx_wbuf_u32(&w, (uint32_t)getpid());
    pdx_wbuf_str(&w, agent->host_id);
    pdx_wbuf_u16(&w, (uint16_t)agent->ninvariants);
    for (uint32_t i = 0; i < agent->ninvariants; i++) {
        pdx_wbuf_str(&w, agent->invariants[i].key);
        pdx_wbuf_str(&w, agent->invariants[i].value);
    }
    pdx_wbuf_u16(&w, (uint16_t)agent->nbackends);
    for (uint32_t b = 0; b < agent->nbackends && st == PDX_OK; b++) {
        struct pdx_backend *be = agent->backends[b];
        void *conn = NULL;
        size_t clen = 0;
        st = be->ops->conn_info(be->be, &conn, &clen);
        if (st != PDX_OK) {
            pdx_error("agent %s: backend %s conn info: %s", agent->name,
                      be->name, pdx_status_string(st));
            break;
        }
        pdx_wbuf_str(&w, be->name);
        pdx_wbuf_bytes32(&w, conn, (uint32_t)clen);
        free(conn);
    }
    pdx_wbuf_u32(&w, (uint32_t)agent->nregs);
    for (size_t i = 0; i < agent->nregs && st == PDX_OK; i++) {
        struct pdx_mem_reg *r = agent->regs[i];
        pdx_wbuf_u64(&w, r->region.addr);
        pdx_wbuf_u64(&w, r->region.len);
        pdx_wbuf_u32(&w, r->region.dev_id);
        pdx_wbuf_u8(&w, (uint8_t)r->region.mem_type);
        pdx_wbuf_u64(&w, r->region.flags);
        uint16_t nkeys = 0;
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            nkeys += r->md[b] != NULL;
        }
        pdx_wbuf_u16(&w, nkeys);
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            if (r->md[b] == NULL) {
                continue;
            }
            void *key = NULL;
            size_t klen = 0;
            st = agent->backends[b]->ops->mem_pack(agent->backends[b]->be,
                                                   r->md[b], &key, &klen);
            if (st != PDX_OK) {
                pdx_error("agent %s: backend %s pack key: %s", agent->name,
                          agent->backends[b]->name, pdx_status_string(st));
                break;
            }
            pdx_wbuf_u16(&w, (uint16_t)b);
            pdx_wbuf_bytes32(&w, key, (uint32_t)klen);
            free(key);
        }
    }
    pthread_mutex_unlock(&agent->lock);
    if (st == PDX_OK) {
        st = pdx_blob_finish(&w);
    }
    if (st == PDX_OK && agent->ckey.bytes != NULL) {
        st = pdxi_blob_seal(&agent->ckey, &w.data, &w.len); /* sign.h */
    }
    if (st != PDX_OK) {
        free(w.data);
        return st;
    }
    *blob_p = w.data;
    *len_p = w.len;
    return PDX_OK;
}

void pdx_blob_free(void *blob) { free(blob); }

pdx_peer_t *pdx_peer_find(pdx_agent_h agent, const char *name)
{
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (strcmp(p->name, name) == 0) {
            return p;
        }
    }
    return NULL;
}

pdx_peer_region_t *pdx_peer_region_find(pdx_peer_t *peer, pdx_mem_type_t t,
                                        uint64_t addr, uint64_t len)
{
    size_t lo = 0, hi = peer->nregions;
    /* Last region starting at or before (t, addr). */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const pdx_region_t *r = &peer->regions[mid].region;
        if (r->mem_type < t || (r->mem_type == t && r->addr <= addr)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo == 0) {
        return NULL;
    }
    pdx_peer_region_t *g = &peer->regions[lo - 1];
    const pdx_region_t *r = &g->region;
    if (r->mem_type != t || !pdx_region_holds(r, addr, len)) {
        return NULL;
    }
    return g;
}

void pdx_peer_destroy_locked(pdx_agent_h agent, pdx_peer_t *peer)
{
    pdx_xfer_fail_peer_locked(agent, peer->epoch, PDX_ERR_STALE,
                              PDX_FAIL_RELEASE);
    for (size_t i = 0; i < peer->nregions; i++) {
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            if (peer->regions[i].rmd[b] != NULL) {
                agent->backends[b]->ops->rmem_unload(agent->backends[b]->be,
                                                     peer->regions[i].rmd[b]);
            }
        }
    }
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (peer->bpeer[b] != NULL) {
            agent->backends[b]->ops->peer_disconnect(agent->backends[b]->be,
                                                     peer->bpeer[b]);
        }
    }
    if (peer->pidfd >= 0) {
        close(peer->pidfd);
    }
    pdx_peer_t **pp = &agent->peers;
    while (*pp != NULL && *pp != peer) {
        pp = &(*pp)->next;
    }
    if (*pp == peer) {
        *pp = peer->next;
    }
    free(peer->regions);
    free(peer);
}

/* Every invariant set on either side must be set on both and be equal. */
static pdx_status_t check_invariants(pdx_agent_h agent, const pdx_blob_t *b)
{
    for (uint32_t i = 0; i < agent->ninvariants; i++) {
        const pdx_invariant_t *mine = &agent->invariants[i];
        const char *theirs = NULL;
        for (uint16_t j = 0; j < b->ninv; j++) {
            if (strcmp(b->inv[j].key, mine->key) == 0) {
                theirs = b->inv[j].value;
            }
        }
        if (theirs == NULL || strcmp(theirs, mine->value) != 0) {
            pdx_error("peer %s: %s mismatch: local %s, remote %s", b->name,
                      mine->key, mine->value, theirs ? theirs : "(unset)");
            return PDX_ERR_MISMATCH;
        }
    }
    for (uint16_t j = 0; j < b->ninv; j++) {
        int found = 0;
        for (uint32_t i = 0; i < agent->ninvariants && !found; i++) {
            found = strcmp(agent->invariants[i].key, b->inv[j].key) == 0;
        }
        if (!found) {
            pdx_error("peer %s: %s mismatch: local (unset), remote %s",
                      b->name, b->inv[j].key, b->inv[j].value);
            return PDX_ERR_MISMATCH;
        }
    }
    return PDX_OK;
}

static int region_order(const void *x, const void *y)
{
    const pdx_region_t *a = &((const pdx_peer_region_t *)x)->region;
    const pdx_region_t *b = &((const pdx_peer_region_t *)y)->region;
    if (a->mem_type != b->mem_type) {
        return a->mem_type < b->mem_type ? -1 : 1;
    }
    return a->addr < b->addr ? -1 : (a->addr > b->addr);
}

static int open_pidfd(pdx_agent_h agent, const pdx_blob_t *b)
{
#ifdef SYS_pidfd_open
    if (strcmp(b->host_id, agent->host_id) != 0 || b->pid <= 0) {
        return -1;
    }
    int fd = (int)syscall(SYS_pidfd_open, (pid_t)b->pid, 0);
    if (fd < 0) {
        /* ESRCH can also mean another pid namespace: no liveness watch
         * rather than a false death. */
        pdx_debug("peer %s: pidfd_open(%d): %s; liveness through the "
                  "backends only", b->name, (int)b->pid, strerror(errno));
    }
    return fd;
#else
    return -1;
#endif
}

static bool blob_has_backend(const pdx_blob_t *b, const char *name)
{
    for (uint16_t i = 0; i < b->nbackends; i++) {
        if (strcmp(b->backends[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

/* The path report of a new peer: each backend's transport for it, which
 * regions take a backend's fallback, and for a same-host peer why host or
 * GPU memory would not take the fast path (warned once here). */
static void peer_paths(pdx_agent_h agent, pdx_peer_t *p, const pdx_blob_t *b)
{
    int cma = -1, cipc = -1;
    for (uint32_t k = 0; k < agent->nbackends; k++) {
        struct pdx_backend *be = agent->backends[k];
        uint64_t caps = be->ops->caps;
        if (caps & PDX_BACKEND_CAP_SAME_HOST) {
            if (caps & PDX_BACKEND_CAP_VRAM) {
                cipc = (int)k;
            } else {
                cma = (int)k;
            }
        }
        if (p->bpeer[k] == NULL) {
            continue;
        }
        char why[PDX_WHY_MAX] = "";
        if (PDX_BE_HAS(be->ops, path)) {
            be->ops->path(be->be, p->bpeer[k], NULL, p->transport[k],
                          sizeof(p->transport[k]), why, sizeof(why));
            for (size_t i = 0; i < p->nregions; i++) {
                pdx_peer_region_t *g = &p->regions[i];
                if (g->rmd[k] == NULL) {
                    continue;
                }
                char t[64], w[PDX_WHY_MAX] = "";
                if (be->ops->path(be->be, p->bpeer[k], g->rmd[k], t,
                                  sizeof(t), w, sizeof(w)) != PDX_OK) {
                    g->slow[k] = true;
                    if (p->slow_why[k][0] == '\0') {
                        snprintf(p->slow_why[k], sizeof(p->slow_why[k]),
                                 "region 0x%llx+%llu: %s",
                                 (unsigned long long)g->region.addr,
                                 (unsigned long long)g->region.len, w);
                    }
                }
            }
        } else {
            snprintf(p->transport[k], sizeof(p->transport[k]), "%s",
                     be->name);
        }
    }
    if (!p->same_host) {
        return;
    }
    if (cma < 0) {
        snprintf(p->dram_why, sizeof(p->dram_why),
                 "the cma backend is not created on agent %s", agent->name);
    } else if (!blob_has_backend(b, "cma")) {
        snprintf(p->dram_why, sizeof(p->dram_why),
                 "peer %s has no cma backend", p->name);
    } else if (p->bpeer[cma] == NULL) {
        snprintf(p->dram_why, sizeof(p->dram_why),
                 "cma declined peer %s (another host to it)", p->name);
    }
    if (cipc < 0) {
        snprintf(p->vram_why, sizeof(p->vram_why),
                 "the cuda_ipc backend is not created on agent %s",
                 agent->name);
    } else if (!blob_has_backend(b, "cuda_ipc")) {
        snprintf(p->vram_why, sizeof(p->vram_why),
                 "peer %s has no cuda_ipc backend", p->name);
    } else if (p->bpeer[cipc] == NULL) {
        snprintf(p->vram_why, sizeof(p->vram_why),
                 "cuda_ipc declined peer %s", p->name);
    }
    bool has_dram = false, has_vram = false;
    for (size_t i = 0; i < p->nregions; i++) {
        has_dram |= p->regions[i].region.mem_type == PDX_MEM_DRAM;
        has_vram |= p->regions[i].region.mem_type == PDX_MEM_VRAM;
    }
    const char *why = has_dram && p->dram_why[0]   ? p->dram_why
                      : has_vram && p->vram_why[0] ? p->vram_why
                      : cma >= 0 && p->slow_why[cma][0] ? p->slow_why[cma]
                                                        : NULL;
    if (why != NULL) {
        pdx_warn("agent %s: peer %s is on this host but transfers with it "
                 "will take a slower path (%s)%s", agent->name, p->name, why,
                 agent->params.path_policy == PDX_PATH_POLICY_SAME_HOST_FAST
                     ? ": the path policy will refuse them"
                     : "");
    }
}

/* Build a peer from a parsed blob: connect each backend the peer also has,
 * load each region key. */
static pdx_status_t peer_build(pdx_agent_h agent, const pdx_blob_t *b,
                               pdx_peer_t **peer_p)
{
    pdx_status_t st;
    pdx_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return PDX_ERR_NOMEM;
    }
    p->pidfd = -1;
    snprintf(p->name, sizeof(p->name), "%s", b->name);
    snprintf(p->host_id, sizeof(p->host_id), "%s", b->host_id);
    p->instance = b->instance;
    p->generation = b->generation;
    p->pid = b->pid;
    p->epoch = agent->next_epoch++;
    /* Map the peer's backend indices to ours. */
    int map[PDX_BLOB_MAX_BACKENDS];
    uint32_t connected = 0;
    for (uint16_t i = 0; i < b->nbackends; i++) {
        map[i] = -1;
        for (uint32_t k = 0; k < agent->nbackends; k++) {
            struct pdx_backend *be = agent->backends[k];
            if (strcmp(be->name, b->backends[i].name) != 0 ||
                p->bpeer[k] != NULL) {
                continue;
            }
            st = be->ops->peer_connect(be->be, p->name, b->backends[i].conn,
                                       b->backends[i].conn_len, &p->bpeer[k]);
            if (st == PDX_ERR_UNSUPPORTED) {
                pdx_info("peer %s: backend %s declines (not reachable this "
                         "way); using others", p->name, be->name);
                p->bpeer[k] = NULL;
                break;
            }
            if (st != PDX_OK) {
                pdx_error("peer %s: backend %s connect failed: %s", p->name,
                          be->name, pdx_status_string(st));
                goto err;
            }
            map[i] = (int)k;
            connected++;
            break;
        }
    }
    if (connected == 0) {
        pdx_error("peer %s: no common backend (peer has %u, we have %u)",
                  p->name, b->nbackends, agent->nbackends);
        st = PDX_ERR_UNSUPPORTED;
        goto err;
    }
    if (b->nregions > 0) {
        p->regions = calloc(b->nregions, sizeof(*p->regions));
        if (p->regions == NULL) {
            st = PDX_ERR_NOMEM;
            goto err;
        }
    }
    for (uint32_t i = 0; i < b->nregions; i++) {
        pdx_peer_region_t *g = &p->regions[p->nregions++];
        g->region = b->regions[i].region;
        for (uint16_t k = 0; k < b->regions[i].nkeys; k++) {
            const pdx_blob_key_t *key = &b->regions[i].keys[k];
            int mine = map[key->backend];
            if (mine < 0 || g->rmd[mine] != NULL) {
                continue;
            }
            struct pdx_backend *be = agent->backends[mine];
            st = be->ops->rmem_load(be->be, p->bpeer[mine], &g->region,
                                    key->key, key->len, &g->rmd[mine]);
            if (st == PDX_ERR_UNSUPPORTED) {
                /* This backend cannot reach this region; others may. */
                g->rmd[mine] = NULL;
                continue;
            }
            if (st != PDX_OK) {
                pdx_error("peer %s: backend %s could not load the key of "
                          "region 0x%llx+%llu: %s", p->name, be->name,
                          (unsigned long long)g->region.addr,
                          (unsigned long long)g->region.len,
                          pdx_status_string(st));
                g->rmd[mine] = NULL;
                goto err;
            }
        }
    }
    if (p->nregions > 1) { /* qsort must not see a NULL array */
        qsort(p->regions, p->nregions, sizeof(*p->regions), region_order);
    }
    for (size_t i = 1; i < p->nregions; i++) {
        const pdx_region_t *a = &p->regions[i - 1].region;
        const pdx_region_t *c = &p->regions[i].region;
        if (a->mem_type == c->mem_type && a->addr + a->len > c->addr) {
            pdx_error("peer %s: blob has overlapping regions at 0x%llx",
                      p->name, (unsigned long long)c->addr);
            st = PDX_ERR_CORRUPT;
            goto err;
        }
    }
    p->pidfd = open_pidfd(agent, b);
    p->same_host = strcmp(b->host_id, agent->host_id) == 0;
    if (!p->same_host && pdx_host_same_kernel(b->host_id, agent->host_id)) {
        pdx_info("peer %s: same kernel, another pid namespace (%s): no "
                 "pidfd, cma or cuda_ipc across it, so UCX carries its "
                 "transfers by design", p->name, b->host_id);
    }
    p->stats = pdx_peer_stats_get(agent, p->name);
    peer_paths(agent, p, b);
    *peer_p = p;
    return PDX_OK;

err:
    /* Not linked yet: unwind by hand (destroy would search the list). */
    for (size_t i = 0; i < p->nregions; i++) {
        for (uint32_t k = 0; k < agent->nbackends; k++) {
            if (p->regions[i].rmd[k] != NULL) {
                agent->backends[k]->ops->rmem_unload(agent->backends[k]->be,
                                                     p->regions[i].rmd[k]);
            }
        }
    }
    for (uint32_t k = 0; k < agent->nbackends; k++) {
        if (p->bpeer[k] != NULL) {
            agent->backends[k]->ops->peer_disconnect(agent->backends[k]->be,
                                                     p->bpeer[k]);
        }
    }
    free(p->regions);
    free(p);
    return st;
}

pdx_status_t pdxi_peer_load(pdx_agent_h agent, const void *blob, size_t len,
                           char *name_out)
{
    char why[256];
    pdx_blob_t *b = NULL;
    const void *inner = NULL;
    size_t inner_len = 0;
    /* The cluster key's check first (sign.h): an agent with a key parses
     * nothing that is not signed with it. */
    pdx_status_t st = pdxi_blob_open(&agent->ckey, blob, len, &inner,
                                     &inner_len, why, sizeof(why));
    if (st == PDX_OK) {
        st = pdx_blob_parse(inner, inner_len, &b, why, sizeof(why));
    }
    if (st != PDX_OK) {
        pdx_error("agent %s: peer metadata rejected: %s", agent->name, why);
        return st;
    }
    pthread_mutex_lock(&agent->lock);
    if (strcmp(b->name, agent->name) == 0 && b->instance == agent->instance) {
        pdx_error("agent %s: refusing to load its own metadata as a peer",
                  agent->name);
        st = PDX_ERR_INVALID;
        goto out;
    }
    st = check_invariants(agent, b);
    if (st != PDX_OK) {
        goto out;
    }
    pdx_peer_t *old = pdx_peer_find(agent, b->name);
    if (old != NULL && old->instance == b->instance &&
        old->generation == b->generation && old->dead == PDX_OK) {
        st = PDX_OK; /* same description again */
        goto done;
    }
    pdx_peer_t *p = NULL;
    if (old != NULL) {
        /* A restarted or changed peer: requests against the old one are
         * stale from now on. */
        pdx_info("peer %s: new description (generation %u -> %u%s), "
                 "replacing", b->name, old->generation, b->generation,
                 old->instance != b->instance ? ", new instance" : "");
        pdx_peer_destroy_locked(agent, old);
    }
    st = peer_build(agent, b, &p);
    if (st != PDX_OK) {
        goto out;
    }
    p->next = agent->peers;
    agent->peers = p;
    pdx_info("agent %s: peer %s loaded (generation %u, %zu regions, pid %d%s)",
             agent->name, p->name, p->generation, p->nregions, (int)p->pid,
             p->pidfd >= 0 ? ", same host" : "");
done:
    if (name_out != NULL) {
        snprintf(name_out, PDX_NAME_MAX, "%s", b->name);
    }
out:
    pthread_mutex_unlock(&agent->lock);
    pdx_blob_free_parsed(b);
    return st;
}

pdx_status_t pdxi_peer_unload(pdx_agent_h agent, const char *name)
{
    pthread_mutex_lock(&agent->lock);
    pdx_peer_t *p = pdx_peer_find(agent, name);
    if (p != NULL) {
        pdx_peer_destroy_locked(agent, p);
    } else {
        pdx_error("agent %s: unload: unknown peer %s", agent->name, name);
    }
    pthread_mutex_unlock(&agent->lock);
    return p != NULL ? PDX_OK : PDX_ERR_NOT_FOUND;
}

pdx_status_t pdxi_peer_state(pdx_agent_h agent, const char *name)
{
    pthread_mutex_lock(&agent->lock);
    pdx_peer_t *p = pdx_peer_find(agent, name);
    pdx_status_t st = p == NULL ? PDX_ERR_NOT_FOUND : p->dead;
    if (p == NULL) {
        pdx_call_note("agent %s: peer %s is not loaded", agent->name, name);
    } else if (st != PDX_OK) {
        pdx_call_note("agent %s: peer %s is gone (%s)", agent->name, name,
                      p->dead_how);
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}

pdx_status_t pdxi_peer_info(pdx_agent_h agent, const char *name,
                            pdx_peer_info_t *info, pdx_region_info_t *regions,
                            size_t max_regions)
{
    pthread_mutex_lock(&agent->lock);
    pdx_peer_t *p = pdx_peer_find(agent, name);
    if (p == NULL) {
        pthread_mutex_unlock(&agent->lock);
        pdx_error("agent %s: peer info: unknown peer %s", agent->name, name);
        return PDX_ERR_NOT_FOUND;
    }
    memset(info, 0, sizeof(*info));
    snprintf(info->name, sizeof(info->name), "%s", p->name);
    snprintf(info->host_id, sizeof(info->host_id), "%s", p->host_id);
    info->instance = p->instance;
    info->generation = p->generation;
    info->pid = p->pid;
    info->same_host = p->same_host;
    info->state = p->dead;
    info->nregions = p->nregions;
    size_t off = 0;
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (p->bpeer[b] == NULL || off >= sizeof(info->backends)) {
            continue;
        }
        int n = snprintf(info->backends + off, sizeof(info->backends) - off,
                         "%s%s", off ? "," : "", agent->backends[b]->name);
        off += n > 0 ? (size_t)n : 0;
    }
    for (size_t i = 0; regions != NULL && i < max_regions && i < p->nregions;
         i++) {
        const pdx_region_t *r = &p->regions[i].region;
        regions[i] = (pdx_region_info_t){.addr = r->addr, .len = r->len,
                                         .dev_id = r->dev_id,
                                         .mem_type = r->mem_type,
                                         .flags = r->flags};
    }
    pthread_mutex_unlock(&agent->lock);
    return PDX_OK;
}
