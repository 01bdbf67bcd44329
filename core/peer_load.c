/* Peers loaded, reloaded and unloaded, found by its name: a blob checked
 * (seal, format, invariants), its connections made with every backend,
 * its regions loaded, its pidfd opened; a new generation changes only
 * what changed (per-incarnation epochs and region hashes make requests on
 * what went stale); an unload ends its requests and frees it. Above the
 * request ends and ctl: an unload or reload ends the requests it makes
 * stale. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <xxhash.h>

#include "api_int.h"
#include "backend_int.h"
#include "ctl_int.h"
#include "mem_int.h"
#include "peer_load_int.h"
#include "path_int.h"
#include "peer_int.h"
#include "stats_int.h"
#include "xfer_int.h"

void pdx_peer_destroy_locked(pdx_agent_h agent, pdx_peer_t *peer)
{
    pdx_xfer_fail_peer_locked(agent, peer->epoch, PDX_ERR_STALE,
                              PDX_FAIL_RELEASE);
    pdx_ctl_peer_destroyed_locked(agent, peer); /* retired regions */
    for (size_t i = 0; i < peer->nregions; i++) {
        pdx_peer_region_drop_locked(agent, peer->regions[i]);
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
    pdx_peer_index_del_locked(agent, peer);
    pdx_peer_t **pp = &agent->peers;
    while (*pp != NULL && *pp != peer) {
        pp = &(*pp)->next;
    }
    if (*pp == peer) {
        *pp = peer->next;
    }
    free(peer->regions);
    pdx_path_cost_free(peer);
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
    const pdx_region_t *a = &(*(pdx_peer_region_t *const *)x)->region;
    const pdx_region_t *b = &(*(pdx_peer_region_t *const *)y)->region;
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

/* What a reload compares: the blob's backends and their connection infos,
 * and per region its fields and keys (xxh3, chained). */
static uint64_t hash_conns(const pdx_blob_t *b)
{
    uint64_t h = XXH3_64bits(&b->nbackends, sizeof(b->nbackends));
    for (uint16_t i = 0; i < b->nbackends; i++) {
        h = XXH3_64bits_withSeed(b->backends[i].name,
                                 strlen(b->backends[i].name), h);
        h = XXH3_64bits_withSeed(b->backends[i].conn,
                                 b->backends[i].conn_len, h);
    }
    return h;
}

static uint64_t hash_region(const pdx_blob_t *b, const pdx_blob_region_t *r)
{
    uint64_t f[5] = {r->region.addr, r->region.len, r->region.dev_id,
                     (uint64_t)r->region.mem_type, r->region.flags};
    uint64_t h = XXH3_64bits(f, sizeof(f));
    for (uint16_t k = 0; k < r->nkeys; k++) {
        const pdx_blob_key_t *key = &r->keys[k];
        const char *be = key->backend < b->nbackends
                             ? b->backends[key->backend].name
                             : "";
        h = XXH3_64bits_withSeed(be, strlen(be), h);
        h = XXH3_64bits_withSeed(key->key, key->len, h);
    }
    return h;
}

/* Connect each backend the peer also has; map[i]: our backend for the
 * blob's backend i, or -1. */
static pdx_status_t peer_connect_all(pdx_agent_h agent, pdx_peer_t *p,
                                     const pdx_blob_t *b, int *map)
{
    pdx_status_t st;
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
                p->bpeer[k] = NULL;
                return st;
            }
            map[i] = (int)k;
            connected++;
            break;
        }
    }
    if (connected == 0) {
        pdx_error("peer %s: no common backend (peer has %u, we have %u)",
                  p->name, b->nbackends, agent->nbackends);
        return PDX_ERR_UNSUPPORTED;
    }
    p->conn_hash = hash_conns(b);
    return PDX_OK;
}

/* The map of an already connected peer (what peer_connect_all made). */
static void peer_map(pdx_agent_h agent, const pdx_peer_t *p,
                     const pdx_blob_t *b, int *map)
{
    bool used[PDX_MAX_BACKENDS] = {false};
    for (uint16_t i = 0; i < b->nbackends; i++) {
        map[i] = -1;
        for (uint32_t k = 0; k < agent->nbackends; k++) {
            if (!used[k] && p->bpeer[k] != NULL &&
                strcmp(agent->backends[k]->name, b->backends[i].name) == 0) {
                map[i] = (int)k;
                used[k] = true;
                break;
            }
        }
    }
}

static pdx_status_t region_load(pdx_agent_h agent, pdx_peer_t *p,
                                const int *map, const pdx_blob_region_t *br,
                                pdx_peer_region_t *g)
{
    memset(g->slow, 0, sizeof(g->slow));
    for (uint16_t k = 0; k < br->nkeys; k++) {
        const pdx_blob_key_t *key = &br->keys[k];
        int mine = map[key->backend];
        if (mine < 0 || g->rmd[mine] != NULL) {
            continue;
        }
        struct pdx_backend *be = agent->backends[mine];
        pdx_status_t st = be->ops->rmem_load(be->be, p->bpeer[mine],
                                             &g->region, key->key, key->len,
                                             &g->rmd[mine]);
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
            return st;
        }
    }
    return PDX_OK;
}

/* The regions of blob `b` for peer `p`, sorted. With `taken` (one flag per
 * region p has now), a region p has that the blob describes the same way
 * is taken over (flagged): its object, and its keys unless `reload_keys`.
 * The others are made and their keys loaded (*fresh_p flags them). On
 * failure what was made is undone and p's regions are as they were (their
 * keys reloaded in part when reload_keys). */
static pdx_status_t regions_build(pdx_agent_h agent, pdx_peer_t *p,
                                  const pdx_blob_t *b, const int *map,
                                  bool *taken, bool reload_keys,
                                  pdx_peer_region_t ***regions_p,
                                  size_t *n_p, size_t *nfresh_p)
{
    pdx_status_t st = PDX_OK;
    size_t cnt = b->nregions ? b->nregions : 1, n = 0, nfresh = 0;
    pdx_peer_region_t **nr = calloc(cnt, sizeof(*nr));
    bool *fresh = calloc(cnt, sizeof(*fresh));
    if (nr == NULL || fresh == NULL) {
        st = PDX_ERR_NOMEM;
        goto err;
    }
    for (uint32_t i = 0; i < b->nregions; i++) {
        const pdx_blob_region_t *br = &b->regions[i];
        uint64_t h = hash_region(b, br);
        pdx_peer_region_t *g = NULL;
        size_t j = taken != NULL ? pdx_peer_region_index(p,
                                                         br->region.mem_type,
                                                         br->region.addr)
                                 : SIZE_MAX;
        if (j != SIZE_MAX && !taken[j] && p->regions[j]->key_hash == h &&
            !p->regions[j]->gone) {
            const pdx_region_t *o = &p->regions[j]->region, *r = &br->region;
            if (o->addr == r->addr && o->len == r->len &&
                o->mem_type == r->mem_type && o->dev_id == r->dev_id &&
                o->flags == r->flags) {
                g = p->regions[j];
                taken[j] = true;
            }
        }
        if (g == NULL) {
            g = calloc(1, sizeof(*g));
            if (g == NULL) {
                st = PDX_ERR_NOMEM;
                goto err;
            }
            g->region = br->region;
            g->key_hash = h;
            fresh[n] = true;
            nfresh++;
        }
        nr[n++] = g;
        if ((fresh[n - 1] || reload_keys) &&
            (st = region_load(agent, p, map, br, g)) != PDX_OK) {
            goto err;
        }
    }
    if (n > 1) { /* qsort must not see a NULL array */
        /* fresh[] follows blob order: sort pairs by sorting a copy. */
        for (size_t i = 0; i < n; i++) {
            nr[i]->gone = fresh[i]; /* borrowed as a mark while sorting */
        }
        qsort(nr, n, sizeof(*nr), region_order);
        for (size_t i = 0; i < n; i++) {
            fresh[i] = nr[i]->gone;
            nr[i]->gone = false;
        }
    }
    for (size_t i = 1; i < n; i++) {
        const pdx_region_t *a = &nr[i - 1]->region;
        const pdx_region_t *c = &nr[i]->region;
        if (a->mem_type == c->mem_type && a->addr + a->len > c->addr) {
            pdx_error("peer %s: blob has overlapping regions at 0x%llx",
                      p->name, (unsigned long long)c->addr);
            st = PDX_ERR_CORRUPT;
            goto err;
        }
    }
    free(fresh);
    *regions_p = nr;
    *n_p = n;
    if (nfresh_p != NULL) {
        *nfresh_p = nfresh;
    }
    return PDX_OK;

err:
    for (size_t i = 0; nr != NULL && i < n; i++) {
        if (fresh[i]) {
            pdx_peer_region_unload_locked(agent, nr[i]);
            free(nr[i]);
        }
    }
    if (taken != NULL) {
        memset(taken, 0, p->nregions * sizeof(*taken));
    }
    free(nr);
    free(fresh);
    return st;
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
    st = peer_connect_all(agent, p, b, map);
    if (st != PDX_OK) {
        goto err;
    }
    st = regions_build(agent, p, b, map, NULL, false, &p->regions,
                       &p->nregions, NULL);
    if (st != PDX_OK) {
        goto err;
    }
    p->pidfd = open_pidfd(agent, b);
    p->same_host = strcmp(b->host_id, agent->host_id) == 0;
    if (!p->same_host && pdx_host_same_kernel(b->host_id, agent->host_id)) {
        pdx_info("peer %s: same kernel, another pid namespace (%s): no "
                 "pidfd, cma or cuda_ipc across it, so UCX carries its "
                 "transfers by design", p->name, b->host_id);
    }
    p->stats = pdx_peer_stats_get(agent, p->name);
    pdx_path_peer(agent, p, b);
    *peer_p = p;
    return PDX_OK;

err:
    /* Not linked yet: unwind by hand (destroy would search the list). */
    for (uint32_t k = 0; k < agent->nbackends; k++) {
        if (p->bpeer[k] != NULL) {
            agent->backends[k]->ops->peer_disconnect(agent->backends[k]->be,
                                                     p->bpeer[k]);
        }
    }
    free(p);
    return st;
}

/* The same instance again, with a new generation or back from the dead:
 * keep the peer (its epoch, so its prepared lists) and every region the
 * new blob describes the same way (address, length, type, flags, keys), so
 * only requests and lists using a removed or changed region fail (STALE).
 * A dead peer is reconnected first (its requests end STALE; lists on
 * unchanged regions work again). PDX_ERR_STALE when it cannot be kept as
 * it is (another pid, host or connection info): the caller replaces it.
 * Other errors: a live peer is left as it was; a dead one is broken (the
 * caller destroys it). */
static pdx_status_t peer_refresh(pdx_agent_h agent, pdx_peer_t *p,
                                 const pdx_blob_t *b)
{
    bool revive = p->dead != PDX_OK;
    if (b->pid != p->pid || strcmp(b->host_id, p->host_id) != 0 ||
        hash_conns(b) != p->conn_hash) {
        return PDX_ERR_STALE;
    }
    if (revive && (p->dead_final || pdx_peer_pid_exited(p))) {
        pdx_error("agent %s: peer %s: described again but %s: it stays "
                  "dead", agent->name, p->name,
                  p->dead_final ? p->dead_how : "its process exited");
        return PDX_ERR_REMOTE_DISCONNECT;
    }
    int map[PDX_BLOB_MAX_BACKENDS];
    pdx_status_t st;
    if (revive) {
        /* Its requests ended when it died; their keys go now. */
        pdx_xfer_fail_rmds_locked(agent, p->epoch, NULL, 0);
        for (size_t i = 0; i < p->nregions; i++) {
            pdx_peer_region_unload_locked(agent, p->regions[i]);
        }
        for (uint32_t k = 0; k < agent->nbackends; k++) {
            if (p->bpeer[k] != NULL) {
                agent->backends[k]->ops->peer_disconnect(
                    agent->backends[k]->be, p->bpeer[k]);
                p->bpeer[k] = NULL;
            }
        }
        if ((st = peer_connect_all(agent, p, b, map)) != PDX_OK) {
            return st;
        }
    } else {
        peer_map(agent, p, b, map);
    }
    bool *taken = calloc(p->nregions ? p->nregions : 1, sizeof(*taken));
    void **gone = calloc(p->nregions * agent->nbackends + 1, sizeof(*gone));
    pdx_peer_region_t **nr = NULL;
    size_t nn = 0, nfresh = 0, ngone = 0, nregions_gone = 0;
    if (taken == NULL || gone == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    st = regions_build(agent, p, b, map, taken, revive, &nr, &nn, &nfresh);
    if (st != PDX_OK) {
        goto out;
    }
    /* Requests using a region the blob no longer holds end now, before
     * its keys go. */
    for (size_t i = 0; i < p->nregions; i++) {
        if (taken[i]) {
            continue;
        }
        nregions_gone++;
        for (uint32_t k = 0; k < agent->nbackends; k++) {
            if (p->regions[i]->rmd[k] != NULL) {
                gone[ngone++] = p->regions[i]->rmd[k];
            }
        }
    }
    if (ngone > 0) {
        pdx_xfer_fail_rmds_locked(agent, p->epoch, gone, ngone);
    }
    for (size_t i = 0; i < p->nregions; i++) {
        if (!taken[i]) {
            pdx_peer_region_drop_locked(agent, p->regions[i]);
        }
    }
    free(p->regions);
    p->regions = nr;
    p->nregions = nn;
    pdx_info("agent %s: peer %s %s (generation %u -> %u): %zu regions kept, "
             "%zu removed or changed, %zu new", agent->name, p->name,
             revive ? "revived" : "updated", p->generation, b->generation,
             nn - nfresh, nregions_gone, nfresh);
    p->generation = b->generation;
    if (revive) {
        memset(p->transport, 0, sizeof(p->transport));
        memset(p->slow_why, 0, sizeof(p->slow_why));
        p->dram_why[0] = p->vram_why[0] = '\0';
        pdx_path_peer(agent, p, b);
        p->dead = PDX_OK;
        p->dead_how[0] = '\0';
        /* Its pidfd left the progress thread's set when it was found
         * dead: watched again from the next pass (wake a sleeping one). */
        pdx_agent_wake(agent);
    } else {
        for (size_t i = 0; i < nn; i++) {
            for (uint32_t k = 0; k < agent->nbackends; k++) {
                if (nr[i]->rmd[k] != NULL && !nr[i]->slow[k]) {
                    pdx_path_region(agent, p, nr[i], k);
                }
            }
        }
    }
out:
    free(taken);
    free(gone);
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
    pdx_agent_lock(agent);
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
    if (old != NULL && old->instance == b->instance) {
        /* The same process, changed or back: keep what did not change. */
        st = peer_refresh(agent, old, b);
        if (st == PDX_OK) {
            goto done;
        }
        if ((st != PDX_ERR_STALE && old->dead == PDX_OK) ||
            st == PDX_ERR_REMOTE_DISCONNECT) {
            goto out; /* left as it was */
        }
    }
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
    pdx_peer_index_add_locked(agent, p);
    p->next = agent->peers;
    agent->peers = p;
    pdx_info("agent %s: peer %s loaded (generation %u, %zu regions, pid %d%s)",
             agent->name, p->name, p->generation, p->nregions, (int)p->pid,
             p->pidfd >= 0 ? ", same host" : "");
done:
    if (name_out != NULL) {
        snprintf(name_out, PDX_NAME_MAX, "%s", b->name);
    }
    /* discovery.c: watch its key from now on (non-blocking). */
    pdx_disc_peer_loaded_locked(agent, b->name);
out:
    pthread_mutex_unlock(&agent->lock);
    pdx_blob_free_parsed(b);
    return st;
}

pdx_status_t pdxi_peer_unload(pdx_agent_h agent, const char *name)
{
    pdx_agent_lock(agent);
    pdx_peer_t *p = pdx_peer_find(agent, name);
    if (p != NULL) {
        pdx_peer_destroy_locked(agent, p);
        pdx_disc_peer_unloaded_locked(agent, name);
    } else {
        pdx_error("agent %s: unload: unknown peer %s", agent->name, name);
    }
    pthread_mutex_unlock(&agent->lock);
    return p != NULL ? PDX_OK : PDX_ERR_NOT_FOUND;
}

