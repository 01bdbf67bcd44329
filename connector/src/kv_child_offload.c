/* The offload child: the host pool, saved by a worker thread off the
 * caller's step path, looked up (waiting, bounded, for a prefix still on
 * its way in) and loaded by copy; with a store, the cross-node hits the
 * owner registry finds, READ from the owner's pool. */
#include <stdio.h>
#include <stdlib.h>

#include <pdx/log.h>
#include <pdx/mem.h>

#include "kv_connector_int.h"
#include "kv_devcopy_int.h"

#define SAVE_QUEUE 4096

/* A pool slot filled layer by layer (pdx_kv_save_layer): reserved at its
 * block's first layer, published when `left` reaches 0. */
typedef struct layer_slot {
    struct layer_slot *next;
    pdx_offload_key_t key;
    pdx_offload_resv_t resv;
    uint32_t left;
    bool reserved; /* resv is live */
} layer_slot_t;

typedef struct save_rec {
    struct save_rec *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint32_t pending;
    pdx_status_t status;
    layer_slot_t *slots; /* blocks being saved layer by layer */
    bool dropped;        /* pdx_kv_request_dropped: queued items skipped */
} save_rec_t;

typedef struct save_item {
    save_rec_t *rec;
    pdx_offload_key_t key;
    uint64_t block_id;
    int32_t li; /* the layer index to copy; -1: the whole block */
} save_item_t;

typedef struct offload_child {
    kv_child_t base; /* first */
    pthread_cond_t cv; /* save progress, with the connector's lock */
    save_rec_t *saves;
    save_item_t *queue;
    size_t q_head, q_len;
    pdx_offload_key_t cur_key; /* the block the worker is copying */
    save_rec_t *cur_rec;       /* and for which request */
    bool cur_busy;
    pthread_t worker;
    bool worker_running;
    bool stop;
    kv_devcopy_t *dev; /* VRAM arenas: copies through the CUDA driver */
} offload_child_t;

static offload_child_t *offload_of(kv_child_t *ch)
{
    return (offload_child_t *)ch;
}

static pdx_offload_key_t key_of(const pdx_block_hash_t *h)
{
    pdx_offload_key_t k;
    _Static_assert(sizeof(k) == sizeof(*h), "key and hash layouts agree");
    memcpy(&k, h, sizeof(k));
    return k;
}

/* Copies arena a's slice of block `id` into a pool slot at dst (from the
 * device when the arenas are VRAM). */
static pdx_status_t copy_arena(offload_child_t *oc, size_t a,
                               unsigned char *dst, uint64_t id)
{
    pdx_kv_connector_h c = oc->base.conn;
    const pdx_arena_t *ar = &c->arenas[a];
    kv_devcopy_t *dev = oc->dev;
    if (dev != NULL) {
        return kv_devcopy_d2h(dev, dst + c->arena_off[a],
                              ar->base + id * ar->stride,
                              kv_arena_block_bytes(ar));
    }
    memcpy(dst + c->arena_off[a],
           (const void *)(uintptr_t)(ar->base + id * ar->stride),
           kv_arena_block_bytes(ar));
    return PDX_OK;
}

/* The other way: a pool block's slice of arena a into block `id`. */
static pdx_status_t copy_back(pdx_kv_connector_h c, kv_devcopy_t *dev,
                              size_t a, const unsigned char *src, uint64_t id)
{
    const pdx_arena_t *ar = &c->arenas[a];
    if (dev != NULL) {
        return kv_devcopy_h2d(dev, ar->base + id * ar->stride,
                              src + c->arena_off[a],
                              kv_arena_block_bytes(ar));
    }
    memcpy((void *)(uintptr_t)(ar->base + id * ar->stride),
           src + c->arena_off[a], kv_arena_block_bytes(ar));
    return PDX_OK;
}

/* A whole block into a pool slot (no lock held). */
static pdx_status_t save_whole(offload_child_t *oc, const save_item_t *it)
{
    pdx_kv_connector_h c = oc->base.conn;
    pdx_offload_resv_t resv;
    pdx_status_t st = pdx_offload_reserve(c->pool, &it->key,
                                          PDX_OFFLOAD_RETAINED, &resv);
    if (st == PDX_OK) {
        for (size_t a = 0; a < c->narenas && st == PDX_OK; a++) {
            st = copy_arena(oc, a, resv.dst, it->block_id);
        }
        if (st != PDX_OK) {
            pdx_offload_abort(c->pool, &resv);
            return st;
        }
        st = pdx_offload_commit(c->pool, &resv);
        if (st == PDX_OK) {
            kv_store_saved(c->store, &it->key); /* owner registry */
        }
    } else if (st == PDX_ERR_EXISTS) {
        st = PDX_OK; /* already saved: a duplicate costs nothing */
    }
    return st;
}

static bool same_key(const pdx_offload_key_t *a, const pdx_offload_key_t *b);

static void slots_abort(pdx_kv_connector_h c, save_rec_t *s)
{
    while (s->slots != NULL) {
        layer_slot_t *sl = s->slots;
        s->slots = sl->next;
        if (sl->reserved) {
            pdx_offload_abort(c->pool, &sl->resv);
        }
        free(sl);
    }
}

static void rec_unlink_free(offload_child_t *oc, save_rec_t *s)
{
    for (save_rec_t **pp = &oc->saves; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    slots_abort(oc->base.conn, s);
    free(s);
}

/* One layer of one block into its slot, reserved at the first of its
 * layers; published after the last. Called and returns with c->lock held;
 * the reservation and the copy run without it (one worker: nothing else
 * touches the slot meanwhile but pdx_kv_request_dropped, which waits for
 * the worker to leave this request). */
static pdx_status_t save_layer_item(offload_child_t *oc, const save_item_t *it)
{
    pdx_kv_connector_h c = oc->base.conn;
    layer_slot_t *sl = it->rec->slots;
    while (sl != NULL && !same_key(&sl->key, &it->key)) {
        sl = sl->next;
    }
    pdx_status_t st = PDX_OK;
    if (sl == NULL) {
        sl = calloc(1, sizeof(*sl));
        if (sl == NULL) {
            return PDX_ERR_NOMEM;
        }
        sl->key = it->key;
        sl->left = c->nlayers;
        sl->next = it->rec->slots;
        it->rec->slots = sl;
        pthread_mutex_unlock(&c->lock);
        st = pdx_offload_reserve(c->pool, &it->key, PDX_OFFLOAD_RETAINED,
                                 &sl->resv);
        pthread_mutex_lock(&c->lock);
        sl->reserved = st == PDX_OK;
        if (st == PDX_ERR_EXISTS) {
            st = PDX_OK; /* saved already, or being saved by another */
        }
    }
    if (sl->reserved) {
        pthread_mutex_unlock(&c->lock);
        for (size_t a = 0; a < c->narenas && st == PDX_OK; a++) {
            if (c->arena_li[a] == (uint32_t)it->li) {
                st = copy_arena(oc, a, sl->resv.dst, it->block_id);
            }
        }
        pthread_mutex_lock(&c->lock);
        if (st != PDX_OK) {
            /* The block is given up: published by no later layer. */
            pdx_offload_abort(c->pool, &sl->resv);
            sl->reserved = false;
        }
    }
    if (--sl->left == 0) {
        for (layer_slot_t **pp = &it->rec->slots; *pp; pp = &(*pp)->next) {
            if (*pp == sl) {
                *pp = sl->next;
                break;
            }
        }
        if (sl->reserved) {
            pthread_mutex_unlock(&c->lock);
            st = pdx_offload_commit(c->pool, &sl->resv);
            if (st == PDX_OK) {
                kv_store_saved(c->store, &sl->key);
            }
            pthread_mutex_lock(&c->lock);
        }
        free(sl);
    }
    return st;
}

/* Save worker: gathers each block's arena slices into a reserved pool slot
 * so the caller's step never waits on the copy. */
static void *save_main(void *arg)
{
    offload_child_t *oc = arg;
    pdx_kv_connector_h c = oc->base.conn;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (oc->q_len == 0 && !oc->stop) {
            pthread_cond_wait(&oc->cv, &c->lock);
        }
        if (oc->q_len == 0 && oc->stop) {
            break;
        }
        save_item_t it = oc->queue[oc->q_head];
        oc->q_head = (oc->q_head + 1) % SAVE_QUEUE;
        oc->q_len--;
        oc->cur_key = it.key;
        oc->cur_rec = it.rec;
        oc->cur_busy = true;
        pdx_status_t st = PDX_OK;
        if (it.rec->dropped && it.li >= 0) {
            /* a layer of a dropped request: skipped */
        } else if (it.li >= 0) {
            st = save_layer_item(oc, &it); /* unlocks while copying */
        } else {
            pthread_mutex_unlock(&c->lock);
            st = save_whole(oc, &it);
            pthread_mutex_lock(&c->lock);
        }
        if (st != PDX_OK && it.rec->status == PDX_OK) {
            pdx_warn("kv: save of a block of %s failed: %s", it.rec->req,
                     pdx_status_string(st));
            it.rec->status = st;
        }
        it.rec->pending--;
        oc->cur_busy = false;
        oc->cur_rec = NULL;
        if (it.rec->dropped && it.rec->pending == 0) {
            rec_unlink_free(oc, it.rec);
        }
        pthread_cond_broadcast(&oc->cv);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Pool eviction (save worker, no lock held): the owner registry forgets
 * the block, batched on its own thread. */
static void on_pool_evict(void *arg, const pdx_offload_key_t *key,
                          pdx_offload_class_t cls)
{
    pdx_kv_connector_h c = arg;
    (void)cls;
    kv_store_evicted(c->store, key);
}

static bool same_key(const pdx_offload_key_t *a, const pdx_offload_key_t *b)
{
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

/* Is this block queued for saving or being copied in right now? Only such
 * blocks make a lookup wait: unrelated saves never stall it. */
static bool save_in_flight(offload_child_t *oc, const pdx_offload_key_t *k)
{
    if (oc->cur_busy && same_key(&oc->cur_key, k)) {
        return true;
    }
    for (size_t i = 0; i < oc->q_len; i++) {
        if (same_key(&oc->queue[(oc->q_head + i) % SAVE_QUEUE].key, k)) {
            return true;
        }
    }
    return false;
}

static pdx_status_t offload_lookup(kv_child_t *ch, const pdx_kv_request_t *r,
                                   pdx_kv_match_t *m)
{
    offload_child_t *oc = offload_of(ch);
    pdx_kv_connector_h c = ch->conn;
    if (ch->cfg->mode == PDX_KV_OFFLOAD_SAVE_ONLY || r->nfull == 0) {
        return PDX_OK;
    }
    pdx_offload_key_t *keys = malloc(r->nfull * sizeof(*keys));
    if (keys == NULL) {
        pdx_error("kv connector %s: lookup %s: out of memory for %zu keys",
                  c->cfg.agent_name, r->req_id, r->nfull);
        return PDX_ERR_NOMEM;
    }
    for (size_t k = 0; k < r->nfull; k++) {
        keys[k] = key_of(&r->hashes[k]);
    }
    size_t prefix = 0;
    pdx_offload_query(c->pool, keys, r->nfull, &prefix);
    free(keys);
    bool tail = false;
    if (prefix == r->nfull && r->has_tail && ch->cfg->save_tail) {
        pdx_offload_key_t tk = key_of(&r->tail_hash);
        size_t t = 0;
        pdx_offload_query(c->pool, &tk, 1, &t);
        tail = t == 1;
    }
    pdx_offload_key_t missing;
    if (prefix < r->nfull) {
        missing = key_of(&r->hashes[prefix]);
    }
    if (prefix < r->nfull && ch->cfg->wait_for_full_prefix &&
        save_in_flight(oc, &missing) &&
        kv_pending_wait(&c->pending, r->req_id, ch->cfg->wait_timeout_ms)) {
        /* Part of the prefix may still be on its way into the pool:
         * pending until it lands or the deadline passes. */
        return PDX_INPROGRESS;
    }
    if (prefix > 0 || tail) {
        *m = (pdx_kv_match_t){.source = PDX_KV_SOURCE_OFFLOAD,
                              .blocks = prefix, .tail = tail};
    }
    if (c->store != NULL) {
        /* Another node's pool may hold a longer prefix. */
        return kv_store_match(c->store, r, prefix, m);
    }
    return PDX_OK;
}

/* The copy out of the pool: thread-safe, and the lease pins the blocks, so
 * it runs without the connector lock and progress and lookups go on. */
static pdx_status_t offload_load_prepare(kv_child_t *ch,
                                         const pdx_kv_request_t *r,
                                         const pdx_kv_match_t *m,
                                         const kv_load_opts_t *o,
                                         const uint64_t *ids)
{
    pdx_kv_connector_h c = ch->conn;
    size_t first = o->first;
    size_t nb = m->blocks + (m->tail ? 1 : 0);
    if (first >= nb) {
        return PDX_OK; /* the engine has all of it */
    }
    pdx_offload_key_t *keys = malloc((nb ? nb : 1) * sizeof(*keys));
    if (keys == NULL) {
        pdx_error("kv connector %s: load %s: out of memory for %zu keys",
                  c->cfg.agent_name, r->req_id, nb);
        return PDX_ERR_NOMEM;
    }
    for (size_t b = first; b < m->blocks; b++) {
        keys[b - first] = key_of(&r->hashes[b]);
    }
    if (m->tail) {
        keys[m->blocks - first] = key_of(&r->tail_hash);
    }
    nb -= first;
    pdx_offload_lease_h lease = NULL;
    size_t got = 0;
    pdx_status_t st = pdx_offload_lease(c->pool, keys, nb, &lease, &got);
    free(keys);
    if (st != PDX_OK || got < nb) {
        /* Evicted since the lookup. */
        if (lease) {
            pdx_offload_release(c->pool, lease);
        }
        return PDX_ERR_NOT_FOUND;
    }
    kv_devcopy_t *dev = offload_of(ch)->dev;
    for (size_t b = 0; b < nb && st == PDX_OK; b++) {
        const void *src;
        pdx_offload_lease_block(c->pool, lease, b, &src);
        for (size_t a = 0; a < c->narenas && st == PDX_OK; a++) {
            st = copy_back(c, dev, a, src, ids[b]);
        }
    }
    pdx_offload_release(c->pool, lease);
    return st;
}

static pdx_status_t offload_load(kv_child_t *ch, const pdx_kv_request_t *r,
                                 const pdx_kv_match_t *m,
                                 const kv_load_opts_t *o, const uint64_t *ids,
                                 pdx_status_t prepared, kv_load_t *l)
{
    if (m->source == PDX_KV_SOURCE_REMOTE) {
        /* A cross-node hit: a handoff from the owner's pool. */
        return kv_remote_read(ch->conn, r, m, o, ids, l);
    }
    l->status = prepared; /* copied by offload_load_prepare */
    return prepared;
}

/* The save record of req_id (made when missing; NULL out of memory). */
static save_rec_t *save_rec(offload_child_t *oc, const char *req_id)
{
    for (save_rec_t *x = oc->saves; x != NULL; x = x->next) {
        if (!x->dropped && strcmp(x->req, req_id) == 0) {
            return x;
        }
    }
    save_rec_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        pdx_error("kv connector %s: save %s: out of memory",
                  oc->base.conn->cfg.agent_name, req_id);
        return NULL;
    }
    snprintf(s->req, sizeof(s->req), "%s", req_id);
    s->next = oc->saves;
    oc->saves = s;
    return s;
}

/* One item on the save queue: block `id` (layer index li, -1 for all of
 * it) as `key`. False, with s->status set, when it cannot be. */
static bool enqueue(offload_child_t *oc, save_rec_t *s, const char *req,
                    const pdx_offload_key_t *key, uint64_t id, int32_t li)
{
    pdx_kv_connector_h c = oc->base.conn;
    if (id >= c->arenas[0].num_blocks) {
        /* Reported by pdx_kv_save_check, as a failed copy would be. */
        pdx_error("kv connector %s: save %s: block id %llu out of range "
                  "(%llu blocks)",
                  c->cfg.agent_name, req, (unsigned long long)id,
                  (unsigned long long)c->arenas[0].num_blocks);
        s->status = PDX_ERR_INVALID;
        return false;
    }
    /* Bounded queue: wait for the worker rather than drop a save. */
    for (int guard = 0; oc->q_len == SAVE_QUEUE && guard < 100000; guard++) {
        pthread_cond_wait(&oc->cv, &c->lock);
    }
    if (oc->q_len == SAVE_QUEUE) {
        pdx_error("kv connector %s: save %s: the save queue stayed full "
                  "(%d blocks)",
                  c->cfg.agent_name, req, SAVE_QUEUE);
        s->status = PDX_ERR_BUSY;
        return false;
    }
    save_item_t *it = &oc->queue[(oc->q_head + oc->q_len) % SAVE_QUEUE];
    it->rec = s;
    it->block_id = id;
    it->key = *key;
    it->li = li;
    s->pending++;
    oc->q_len++;
    return true;
}

static pdx_status_t offload_save(kv_child_t *ch, const pdx_kv_request_t *r,
                                 const uint64_t *ids)
{
    offload_child_t *oc = offload_of(ch);
    if (ch->cfg->mode == PDX_KV_OFFLOAD_LOAD_ONLY) {
        return PDX_OK;
    }
    size_t n = r->nfull + (r->has_tail && ch->cfg->save_tail ? 1 : 0);
    save_rec_t *s = save_rec(oc, r->req_id);
    if (s == NULL) {
        return PDX_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pdx_offload_key_t k =
            key_of(i < r->nfull ? &r->hashes[i] : &r->tail_hash);
        if (!enqueue(oc, s, r->req_id, &k, ids[i], -1)) {
            break;
        }
    }
    pthread_cond_broadcast(&oc->cv);
    return PDX_OK;
}

/* Layer-wise: the blocks this step completed (a full block wholly below
 * s->tokens; the partial tail on the last step), this layer of each. */
static pdx_status_t offload_save_layer(kv_child_t *ch,
                                       const pdx_kv_request_t *r,
                                       const pdx_kv_layer_save_t *ls,
                                       const uint64_t *ids)
{
    offload_child_t *oc = offload_of(ch);
    pdx_kv_connector_h c = ch->conn;
    if (ch->cfg->mode == PDX_KV_OFFLOAD_LOAD_ONLY) {
        return PDX_OK;
    }
    int li = kv_layer_index(c, ls->layer);
    save_rec_t *s = NULL;
    for (size_t i = 0; i < ls->nblocks; i++) {
        size_t b = ls->first_block + i;
        const pdx_block_hash_t *h = NULL;
        if (b < r->nfull && (b + 1) * (size_t)c->block_tokens <= ls->tokens) {
            h = &r->hashes[b];
        } else if (b == r->nfull && r->has_tail && ls->last &&
                   ch->cfg->save_tail) {
            h = &r->tail_hash;
        }
        if (h == NULL) {
            continue;
        }
        if (s == NULL && (s = save_rec(oc, r->req_id)) == NULL) {
            return PDX_ERR_NOMEM;
        }
        pdx_offload_key_t k = key_of(h);
        if (!enqueue(oc, s, r->req_id, &k, ids[i], li)) {
            break;
        }
    }
    pthread_cond_broadcast(&oc->cv);
    return PDX_OK;
}

/* The request is gone: its queued items are skipped, its slots given
 * back once the worker is not copying for it. */
static void offload_request_dropped(kv_child_t *ch, const char *req_id)
{
    offload_child_t *oc = offload_of(ch);
    pdx_kv_connector_h c = ch->conn;
    for (save_rec_t *s = oc->saves; s != NULL; s = s->next) {
        if (s->dropped || strcmp(s->req, req_id) != 0) {
            continue;
        }
        while (oc->cur_busy && oc->cur_rec == s) {
            pthread_cond_wait(&oc->cv, &c->lock);
        }
        s->dropped = true;
        if (s->pending == 0) {
            rec_unlink_free(oc, s);
        } else {
            slots_abort(c, s);
        }
        return;
    }
}

static pdx_status_t offload_save_check(kv_child_t *ch, const char *req_id)
{
    offload_child_t *oc = offload_of(ch);
    save_rec_t **pp = &oc->saves;
    while (*pp != NULL &&
           ((*pp)->dropped || strcmp((*pp)->req, req_id) != 0)) {
        pp = &(*pp)->next;
    }
    pdx_status_t st = PDX_OK;
    if (*pp != NULL) {
        save_rec_t *s = *pp;
        if (s->pending > 0 || s->slots != NULL) {
            st = PDX_INPROGRESS;
        } else {
            st = s->status;
            *pp = s->next;
            free(s);
        }
    }
    return st;
}

/* Wait (bounded) until the worker saved everything queued for `req`. */
static void wait_saved(offload_child_t *oc, const char *req,
                       uint32_t timeout_ms)
{
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    for (;;) {
        save_rec_t *s = oc->saves;
        while (s != NULL && (s->dropped || strcmp(s->req, req) != 0)) {
            s = s->next;
        }
        if (s == NULL || (s->pending == 0 && s->slots == NULL)) {
            return;
        }
        if (pthread_cond_timedwait(&oc->cv, &oc->base.conn->lock, &dl) !=
            0) {
            return;
        }
    }
}

/* Its part of a handoff: from the pool, the leased slots of the saved
 * blocks; in any case how many of the request's blocks the pool holds. */
static pdx_status_t offload_request_finished(kv_child_t *ch, kv_finish_t *f)
{
    offload_child_t *oc = offload_of(ch);
    pdx_kv_connector_h c = ch->conn;
    const pdx_kv_request_t *r = f->r;
    if (f->from == PDX_KV_FROM_POOL) {
        wait_saved(oc, r->req_id, ch->cfg->wait_timeout_ms);
        size_t n = r->nfull;
        pdx_offload_key_t *keys = malloc((n ? n : 1) * sizeof(*keys));
        uint64_t *addrs = malloc((n ? n : 1) * sizeof(*addrs));
        if (keys == NULL || addrs == NULL) {
            free(keys);
            free(addrs);
            return PDX_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            keys[i] = key_of(&r->hashes[i]);
        }
        size_t got = 0;
        if (n > 0 &&
            pdx_offload_lease(c->pool, keys, n, &f->lease, &got) == PDX_OK) {
            n = got;
            for (size_t i = 0; i < n; i++) {
                const void *p;
                pdx_offload_lease_block(c->pool, f->lease, i, &p);
                addrs[i] = (uintptr_t)p;
            }
        } else {
            n = 0;
        }
        free(keys);
        f->addrs = addrs;
        f->n_addrs = n;
    }
    if (r->nfull > 0) {
        size_t have = 0;
        pdx_offload_key_t *k2 = malloc(r->nfull * sizeof(*k2));
        if (k2 == NULL) {
            return PDX_ERR_NOMEM;
        }
        for (size_t i = 0; i < r->nfull; i++) {
            k2[i] = key_of(&r->hashes[i]);
        }
        pdx_offload_query(c->pool, k2, r->nfull, &have);
        free(k2);
        f->has_offload_blocks = true;
        f->offload_blocks = have;
    }
    return PDX_OK;
}

static void offload_destroy(kv_child_t *ch)
{
    offload_child_t *oc = offload_of(ch);
    pdx_kv_connector_h c = ch->conn;
    pthread_mutex_lock(&c->lock);
    oc->stop = true;
    pthread_cond_broadcast(&oc->cv);
    pthread_mutex_unlock(&c->lock);
    if (oc->worker_running) {
        pthread_join(oc->worker, NULL);
    }
    while (oc->saves) {
        save_rec_t *s = oc->saves;
        oc->saves = s->next;
        slots_abort(c, s);
        free(s);
    }
    free(oc->queue);
    kv_devcopy_close(oc->dev);
    pthread_cond_destroy(&oc->cv);
    free(oc);
}

static const kv_child_ops_t offload_ops = {
    .name = "offload",
    .lookup = offload_lookup,
    .load_prepare = offload_load_prepare,
    .load = offload_load,
    .load_check = kv_remote_read_check, /* cross-node hits are READs */
    .save = offload_save,
    .save_check = offload_save_check,
    .save_layer = offload_save_layer,
    .request_dropped = offload_request_dropped,
    .request_finished = offload_request_finished,
    .destroy = offload_destroy,
};

/* The pool (c->pool, the connector's: it outlives the agent, which has its
 * slab registered) and the child's save worker. */
static pdx_status_t make_pool(pdx_kv_connector_h c,
                              const pdx_kv_child_config_t *cfg)
{
    /* No PDX_OFFLOAD_FLAG_HUGEPAGE: huge pages would make the slab
     * anonymous memory (THP does not back shared memory by default), and a
     * same-host peer loading saved blocks (D-to-P reuse) would fall back to
     * process_vm_readv; shared, it maps the slab and copies with memcpy. */
    pdx_offload_params_t op = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_NRANKS_PER_HOST |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS,
        .flags = PDX_OFFLOAD_FLAG_ASYNC_SAVE | PDX_OFFLOAD_FLAG_PREFAULT,
        .budget_bytes = cfg->budget_bytes,
        .nranks_per_host = cfg->ranks_per_host ? cfg->ranks_per_host : 1,
        .block_bytes = c->block_bytes};
    if (c->cfg.has_store) { /* owner counts from the registry */
        op.field_mask |= PDX_OFFLOAD_PARAM_DEMOTE_OWNERS |
                         PDX_OFFLOAD_PARAM_EVICT;
        op.demote_owners = c->cfg.store_demote_owners;
        op.evict_cb = on_pool_evict;
        op.evict_arg = c;
    }
    pdx_status_t st = pdx_offload_create(&op, &c->pool);
    if (st != PDX_OK) {
        return st;
    }
    /* Registered so a peer can READ blocks saved here (D-to-P reuse). */
    void *slab;
    size_t slab_len;
    pdx_mem_reg_h reg;
    st = pdx_offload_slab(c->pool, &slab, &slab_len);
    if (st == PDX_OK) {
        st = pdx_mem_register(c->agent, PDX_MEM_DRAM, (uintptr_t)slab,
                              slab_len, 0, 0, &reg);
    }
    return st;
}

pdx_status_t kv_offload_child_create(pdx_kv_connector_h c,
                                     const pdx_kv_child_config_t *cfg,
                                     kv_child_t **ch_p)
{
    pdx_status_t st = make_pool(c, cfg);
    if (st != PDX_OK) {
        return st;
    }
    offload_child_t *oc = calloc(1, sizeof(*oc));
    save_item_t *queue = calloc(SAVE_QUEUE, sizeof(*queue));
    if (oc == NULL || queue == NULL) {
        pdx_error("kv connector %s: out of memory for the save queue",
                  c->cfg.agent_name);
        free(oc);
        free(queue);
        return PDX_ERR_NOMEM;
    }
    oc->base = (kv_child_t){.ops = &offload_ops, .conn = c, .cfg = cfg};
    oc->queue = queue;
    if (pdx_layout_mem_type(c->layout) == PDX_MEM_VRAM) {
        /* Arena and pool copies through the driver: one device each. */
        for (size_t a = 1; a < c->narenas; a++) {
            if (c->arenas[a].dev_id != c->arenas[0].dev_id) {
                pdx_error("kv connector %s: the offload tier takes VRAM "
                          "arenas of one device (arena %s is on %u, %s on "
                          "%u)",
                          c->cfg.agent_name, c->arenas[a].name,
                          c->arenas[a].dev_id, c->arenas[0].name,
                          c->arenas[0].dev_id);
                free(oc);
                free(queue);
                return PDX_ERR_INVALID;
            }
        }
        st = kv_devcopy_open(c->arenas[0].dev_id, &oc->dev);
        if (st != PDX_OK) {
            free(oc);
            free(queue);
            return st;
        }
    }
    pthread_cond_init(&oc->cv, NULL);
    int rc = pthread_create(&oc->worker, NULL, save_main, oc);
    if (rc != 0) {
        pdx_error("kv connector %s: cannot start the save worker: %s",
                  c->cfg.agent_name, strerror(rc));
        offload_destroy(&oc->base);
        return PDX_ERR_IO;
    }
    oc->worker_running = true;
    *ch_p = &oc->base;
    return PDX_OK;
}
