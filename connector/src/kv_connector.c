/* KV connector: MultiConnector over a remote P/D child (leases, heartbeats,
 * done/reject notifications, coalesced READs) and an offload child (the
 * host pool, saved by a worker thread off the caller's step path). */
#include <pdx/kv_connector.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include <pdx/log.h>
#include <pdx/notif.h>
#include <pdx/xfer.h>

#include "kv_call.h"
#include "kv_store.h"

#define MSG_PREFIX "pdxkv:"
#define SAVE_QUEUE 4096

typedef struct held {
    struct held *next;
    char req[PDX_KV_REQ_ID_MAX];
    char peer[PDX_NAME_MAX];
    uint64_t deadline_ns;
    pdx_offload_lease_h lease; /* FROM_POOL */
} held_t;

typedef struct load_rec {
    struct load_rec *next;
    char req[PDX_KV_REQ_ID_MAX];
    char peer[PDX_NAME_MAX];
    char peer_req[PDX_KV_REQ_ID_MAX];
    pdx_xfer_h xfer; /* NULL once final or for offload loads */
    pdx_status_t status;
    size_t tokens;
    uint64_t last_hb_ns;
    bool aborted; /* pdx_kv_load_abort asked; ends PDX_ERR_CANCELED */
} load_rec_t;

typedef struct save_rec {
    struct save_rec *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint32_t pending;
    pdx_status_t status;
} save_rec_t;

typedef struct save_item {
    save_rec_t *rec;
    pdx_offload_key_t key;
    uint64_t block_id;
} save_item_t;

typedef struct freed {
    struct freed *next;
    char req[PDX_KV_REQ_ID_MAX];
    pdx_kv_free_reason_t why;
} freed_t;

typedef struct waiter {
    struct waiter *next;
    char req[PDX_KV_REQ_ID_MAX];
    uint64_t deadline_ns;
} waiter_t;

struct pdx_kv_connector {
    uint32_t magic; /* PDX_MAGIC_CONN; first, as pdx_call.h requires */
    pthread_mutex_t lock;
    pthread_cond_t cv; /* save progress */
    pdx_kv_config_t cfg;
    pdx_layout_h layout;
    size_t narenas;
    pdx_arena_t *arenas;
    uint64_t *arena_off; /* offset of each arena's slice in a pool block */
    uint64_t block_bytes;
    uint32_t block_tokens;
    pdx_agent_h agent;
    pdx_hasher_h hasher;
    const pdx_kv_child_config_t *remote, *offload;
    pdx_offload_pool_h pool;
    held_t *held;
    load_rec_t *loads;
    save_rec_t *saves;
    freed_t *freed, *freed_tail;
    waiter_t *waiters;
    save_item_t *queue;
    size_t q_head, q_len;
    pdx_offload_key_t cur_key; /* the block the worker is copying */
    bool cur_busy;
    pthread_t worker;
    bool worker_running;
    bool stop;
    kv_store_t *store; /* kv_store.c: the `store` section; NULL without */
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void pdx_kv_free(void *p)
{
    KV_ENTER();
    free(p);
    KV_LEAVE_VOID(PDX_OK);
}

static pdx_offload_key_t key_of(const pdx_block_hash_t *h)
{
    pdx_offload_key_t k;
    _Static_assert(sizeof(k) == sizeof(*h), "key and hash layouts agree");
    memcpy(&k, h, sizeof(k));
    return k;
}

static int valid_req(const char *req)
{
    size_t n = req ? strlen(req) : 0;
    if (n == 0 || n >= PDX_KV_REQ_ID_MAX) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        if (req[i] <= ' ' || req[i] > '~') {
            return 0;
        }
    }
    return 1;
}

/* `req` of an entry point, whose id must be valid (logged otherwise). */
static bool req_arg_ok(pdx_kv_connector_h c, const char *fn,
                       const pdx_kv_request_t *r)
{
    if (!kv_arg_ok(r, fn, "req") || !kv_arg_ok(r->req_id, fn, "req->req_id")) {
        return false;
    }
    if (!valid_req(r->req_id)) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: kv connector %s: req->req_id of %zu bytes is not "
                      "1..%d printable ASCII characters",
                      fn, c->cfg.agent_name, strnlen(r->req_id, 4096),
                      PDX_KV_REQ_ID_MAX - 1);
        return false;
    }
    if (r->nfull > 0 && r->hashes == NULL) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: req->hashes is NULL (nfull %zu)",
                      fn, r->nfull);
        return false;
    }
    return true;
}

/* Save worker: gathers each block's arena slices into a reserved pool slot
 * so the caller's step never waits on the copy. */
static void *save_main(void *arg)
{
    pdx_kv_connector_h c = arg;
    pthread_mutex_lock(&c->lock);
    for (;;) {
        while (c->q_len == 0 && !c->stop) {
            pthread_cond_wait(&c->cv, &c->lock);
        }
        if (c->q_len == 0 && c->stop) {
            break;
        }
        save_item_t it = c->queue[c->q_head];
        c->q_head = (c->q_head + 1) % SAVE_QUEUE;
        c->q_len--;
        c->cur_key = it.key;
        c->cur_busy = true;
        pthread_mutex_unlock(&c->lock);
        pdx_offload_resv_t resv;
        pdx_status_t st = pdx_offload_reserve(c->pool, &it.key,
                                              PDX_OFFLOAD_RETAINED, &resv);
        if (st == PDX_OK) {
            unsigned char *dst = resv.dst;
            for (size_t a = 0; a < c->narenas; a++) {
                const pdx_arena_t *ar = &c->arenas[a];
                uint64_t bb = (uint64_t)ar->bytes_per_token * ar->block_tokens;
                memcpy(dst + c->arena_off[a],
                       (const void *)(uintptr_t)(ar->base +
                                                 it.block_id * ar->stride),
                       bb);
            }
            st = pdx_offload_commit(c->pool, &resv);
            if (st == PDX_OK) {
                kv_store_saved(c->store, &it.key); /* owner registry */
            }
        } else if (st == PDX_ERR_EXISTS) {
            st = PDX_OK; /* already saved: a duplicate costs nothing */
        }
        pthread_mutex_lock(&c->lock);
        if (st != PDX_OK && it.rec->status == PDX_OK) {
            pdx_warn("kv: save of a block of %s failed: %s", it.rec->req,
                     pdx_status_string(st));
            it.rec->status = st;
        }
        it.rec->pending--;
        c->cur_busy = false;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static pdx_status_t set_invariants(pdx_kv_connector_h c)
{
    char buf[128];
    pdx_block_hash_t none;
    pdx_hasher_none_hash(c->hasher, &none);
    char hex[2 * PDX_OFFLOAD_KEY_MAX + 1];
    pdx_block_hash_to_hex(&none, hex, sizeof(hex));
    uint64_t fp = pdx_layout_fingerprint(c->layout);
    pdx_status_t st = PDX_OK;
    st |= pdx_agent_set_invariant(c->agent, "hash_algo", c->cfg.hash_algo);
    st |= pdx_agent_set_invariant(c->agent, "none_hash", hex);
    snprintf(buf, sizeof(buf), "%u", c->block_tokens);
    st |= pdx_agent_set_invariant(c->agent, "block_size", buf);
    st |= pdx_agent_set_invariant(c->agent, "kv_dtype", c->cfg.kv_dtype);
    snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)fp);
    st |= pdx_agent_set_invariant(c->agent, "layout_fingerprint", buf);
    st |= pdx_agent_set_invariant(c->agent, "model_id", c->cfg.model_id);
    st |= pdx_agent_set_invariant(c->agent, "connector_version",
                                  pdx_connector_version());
    pdx_info("kv: node %s: none_hash %s (%s), layout fingerprint %016llx, "
             "%zu arenas, %llu B per block", c->cfg.agent_name, hex,
             c->cfg.hash_algo, (unsigned long long)fp, c->narenas,
             (unsigned long long)c->block_bytes);
    if (st != PDX_OK) {
        pdx_error("kv connector %s: cannot set the invariants on its agent",
                  c->cfg.agent_name);
        return PDX_ERR_INVALID;
    }
    return PDX_OK;
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

static pdx_status_t setup_children(pdx_kv_connector_h c)
{
    for (uint32_t i = 0; i < c->cfg.nchildren; i++) {
        const pdx_kv_child_config_t *ch = &c->cfg.children[i];
        if (ch->type == PDX_KV_CHILD_REMOTE) {
            c->remote = ch;
        } else if (ch->type == PDX_KV_CHILD_OFFLOAD) {
            c->offload = ch;
        }
    }
    if (c->offload == NULL) {
        return PDX_OK;
    }
    /* No PDX_OFFLOAD_FLAG_HUGEPAGE: huge pages would make the slab
     * anonymous memory (THP does not back shared memory by default), and a
     * same-host peer loading saved blocks (D-to-P reuse) would fall back to
     * process_vm_readv; shared, it maps the slab and copies with memcpy. */
    pdx_offload_params_t op = {
        .field_mask = PDX_OFFLOAD_PARAM_BUDGET_BYTES |
                      PDX_OFFLOAD_PARAM_NRANKS_PER_HOST |
                      PDX_OFFLOAD_PARAM_BLOCK_BYTES | PDX_OFFLOAD_PARAM_FLAGS,
        .flags = PDX_OFFLOAD_FLAG_ASYNC_SAVE | PDX_OFFLOAD_FLAG_PREFAULT,
        .budget_bytes = c->offload->budget_bytes,
        .nranks_per_host = c->offload->ranks_per_host
                               ? c->offload->ranks_per_host : 1,
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
    if (st != PDX_OK) {
        return st;
    }
    c->queue = calloc(SAVE_QUEUE, sizeof(*c->queue));
    if (c->queue == NULL) {
        pdx_error("kv connector %s: out of memory for the save queue",
                  c->cfg.agent_name);
        return PDX_ERR_NOMEM;
    }
    int rc = pthread_create(&c->worker, NULL, save_main, c);
    if (rc != 0) {
        pdx_error("kv connector %s: cannot start the save worker: %s",
                  c->cfg.agent_name, strerror(rc));
        return PDX_ERR_IO;
    }
    c->worker_running = true;
    return PDX_OK;
}

static void connector_destroy(pdx_kv_connector_h c);

static pdx_status_t connector_create(const pdx_kv_connector_params_t *params,
                                     pdx_kv_connector_h *conn_p)
{
    pdx_status_t st;
    pdx_kv_connector_h c = pdx_handle_alloc(sizeof(*c), PDX_MAGIC_CONN);
    if (c == NULL) {
        pdx_error("kv connector %s: out of memory",
                  params->config->agent_name);
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->cfg = *params->config;
    for (uint32_t i = 0; i < c->cfg.nbackend_opts; i++) {
        c->cfg.backend_opts[i].key = c->cfg.opt_buf[i][0];
        c->cfg.backend_opts[i].value = c->cfg.opt_buf[i][1];
    }
    c->layout = params->layout;
    c->narenas = pdx_layout_num_arenas(c->layout);
    c->block_tokens = pdx_layout_block_tokens(c->layout);
    c->block_bytes = pdx_layout_bytes_per_block(c->layout);
    if (c->narenas == 0) {
        pdx_error("kv connector %s: the layout has no arenas",
                  c->cfg.agent_name);
        st = PDX_ERR_INVALID;
        goto err;
    }
    c->arenas = calloc(c->narenas, sizeof(*c->arenas));
    c->arena_off = calloc(c->narenas, sizeof(*c->arena_off));
    if (c->arenas == NULL || c->arena_off == NULL) {
        pdx_error("kv connector %s: out of memory for %zu arenas",
                  c->cfg.agent_name, c->narenas);
        st = PDX_ERR_NOMEM;
        goto err;
    }
    uint64_t off = 0;
    for (size_t a = 0; a < c->narenas; a++) {
        pdx_layout_get_arena(c->layout, a, &c->arenas[a]);
        c->arena_off[a] = off;
        off += (uint64_t)c->arenas[a].bytes_per_token *
               c->arenas[a].block_tokens;
    }
    pdx_hash_algo_t algo;
    st = pdx_hash_algo_from_string(c->cfg.hash_algo, &algo);
    if (st == PDX_OK) {
        st = pdx_hasher_create(algo, c->cfg.hash_seed, c->block_tokens,
                               &c->hasher);
    }
    if (st != PDX_OK) {
        pdx_error("kv: hasher %s: %s", c->cfg.hash_algo,
                  pdx_status_string(st));
        goto err;
    }
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_FLAGS,
                             .flags = PDX_AGENT_F_PROGRESS_THREAD};
    if ((params->field_mask & PDX_KV_PARAM_AGENT_PARAMS) &&
        params->agent_params != NULL) {
        ap = *params->agent_params;
    }
    if (!(ap.field_mask & PDX_AGENT_PARAM_PATH_POLICY)) {
        ap.field_mask |= PDX_AGENT_PARAM_PATH_POLICY;
        ap.path_policy = c->cfg.path_policy;
    }
    if (!(ap.field_mask & PDX_AGENT_PARAM_CLUSTER_KEY) &&
        c->cfg.cluster_key_file[0] != '\0') {
        ap.field_mask |= PDX_AGENT_PARAM_CLUSTER_KEY;
        ap.cluster_key = NULL;
        ap.cluster_key_file = c->cfg.cluster_key_file;
    }
    kv_store_agent_params(&c->cfg, &ap);
    st = pdx_agent_create(c->cfg.agent_name, &ap, &c->agent);
    if (st != PDX_OK) {
        goto err;
    }
    for (uint32_t b = 0; b < c->cfg.nbackends; b++) {
        /* Each backend gets only its own options. */
        pdx_kv_t opts[PDX_KV_MAX_BACKEND_OPTS];
        size_t nopts = pdx_kv_config_backend_opts(&c->cfg, b, opts,
                                                  PDX_KV_MAX_BACKEND_OPTS);
        /* Probe first: a backend this host cannot run is one warning
         * naming the config and the reason (or a refusal when the config
         * requires it), not an error from the loader. */
        char why[512] = "";
        st = pdx_backend_probe(c->cfg.backends[b], NULL, why, sizeof(why));
        if (st == PDX_OK) {
            st = pdx_backend_create(c->agent, c->cfg.backends[b], opts, nopts,
                                    NULL);
            if (st == PDX_ERR_UNAVAILABLE || st == PDX_ERR_NOT_FOUND) {
                snprintf(why, sizeof(why), "%s (see the line above)",
                         pdx_status_string(st));
            }
        }
        if ((st == PDX_ERR_UNAVAILABLE || st == PDX_ERR_NOT_FOUND ||
             st == PDX_ERR_VERSION) &&
            !c->cfg.backend_required[b]) {
            pdx_warn("kv %s: config %s: backend %s cannot be used here (%s); "
                     "going on without it (set \"required\": true to refuse "
                     "instead)", c->cfg.agent_name, c->cfg.source,
                     c->cfg.backends[b], why);
            continue;
        }
        if (st != PDX_OK) {
            pdx_error("kv %s: config %s: required backend %s cannot be used "
                      "here: %s", c->cfg.agent_name, c->cfg.source,
                      c->cfg.backends[b], why[0] ? why : pdx_status_string(st));
            goto err;
        }
    }
    for (size_t a = 0; a < c->narenas; a++) {
        const pdx_arena_t *ar = &c->arenas[a];
        pdx_mem_reg_h reg;
        uint64_t span = (ar->num_blocks - 1) * ar->stride +
                        (uint64_t)ar->bytes_per_token * ar->block_tokens;
        if (ar->base == 0) {
            pdx_error("kv: arena %s has no memory (base not set)", ar->name);
            st = PDX_ERR_INVALID;
            goto err;
        }
        st = pdx_mem_register(c->agent, ar->mem_type, ar->base, span,
                              ar->dev_id, 0, &reg);
        if (st != PDX_OK) {
            goto err;
        }
    }
    if ((st = set_invariants(c)) != PDX_OK ||
        (st = setup_children(c)) != PDX_OK ||
        (st = kv_store_start(&c->cfg, c->agent, c->pool, c->block_tokens,
                             &c->store)) != PDX_OK) {
        goto err;
    }
    *conn_p = c;
    return PDX_OK;
err:
    connector_destroy(c);
    return st;
}

pdx_status_t pdx_kv_connector_create(const pdx_kv_connector_params_t *params,
                                     pdx_kv_connector_h *conn_p)
{
    KV_ENTER();
    if (!KV_ARG_OK(params, "params") || !KV_ARG_OK(conn_p, "conn_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (!(params->field_mask & PDX_KV_PARAM_CONFIG) ||
        params->config == NULL) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: params->config is NULL or not in field_mask",
                      __func__);
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (!(params->field_mask & PDX_KV_PARAM_LAYOUT)) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: params->layout not in field_mask",
                      __func__);
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (!KV_LAYOUT_OK(params->layout, "params->layout")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(connector_create(params, conn_p));
}

static void free_held(pdx_kv_connector_h c, held_t *h,
                      pdx_kv_free_reason_t why)
{
    if (h->lease != NULL) {
        pdx_offload_release(c->pool, h->lease);
    }
    freed_t *f = calloc(1, sizeof(*f));
    if (f != NULL) {
        snprintf(f->req, sizeof(f->req), "%s", h->req);
        f->why = why;
        if (c->freed_tail) {
            c->freed_tail->next = f;
        } else {
            c->freed = f;
        }
        c->freed_tail = f;
    }
    free(h);
}

static void connector_destroy(pdx_kv_connector_h c)
{
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    if (c->worker_running) {
        pthread_join(c->worker, NULL);
    }
    kv_store_stop(c->store); /* before the agent and the pool */
    c->store = NULL;
    while (c->held) {
        held_t *h = c->held;
        c->held = h->next;
        if (h->lease) {
            pdx_offload_release(c->pool, h->lease);
        }
        free(h);
    }
    while (c->loads) {
        load_rec_t *l = c->loads;
        c->loads = l->next;
        if (l->xfer) {
            pdx_xfer_release(l->xfer);
        }
        free(l);
    }
    while (c->saves) {
        save_rec_t *s = c->saves;
        c->saves = s->next;
        free(s);
    }
    while (c->freed) {
        freed_t *f = c->freed;
        c->freed = f->next;
        free(f);
    }
    while (c->waiters) {
        waiter_t *w = c->waiters;
        c->waiters = w->next;
        free(w);
    }
    pdx_agent_destroy(c->agent); /* before the pool: the slab is registered */
    pdx_offload_destroy(c->pool);
    pdx_hasher_destroy(c->hasher);
    free(c->queue);
    free(c->arenas);
    free(c->arena_off);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lock);
    pdx_handle_release(c);
}

void pdx_kv_connector_destroy(pdx_kv_connector_h c)
{
    KV_ENTER();
    if (c == NULL) { /* like free(NULL) */
        KV_LEAVE_VOID(PDX_OK);
    }
    if (!KV_CONN_REL_OK(c)) {
        KV_LEAVE_VOID(PDX_ERR_INVALID);
    }
    connector_destroy(c);
    KV_LEAVE_VOID(PDX_OK);
}

pdx_agent_h pdx_kv_connector_agent(pdx_kv_connector_h c)
{
    KV_ENTER();
    if (!KV_CONN_OK(c)) {
        KV_LEAVE_VAL(PDX_ERR_INVALID, NULL);
    }
    KV_LEAVE_VAL(PDX_OK, c->agent);
}

pdx_hasher_h pdx_kv_connector_hasher(pdx_kv_connector_h c)
{
    KV_ENTER();
    if (!KV_CONN_OK(c)) {
        KV_LEAVE_VAL(PDX_ERR_INVALID, NULL);
    }
    KV_LEAVE_VAL(PDX_OK, c->hasher);
}

pdx_status_t pdx_kv_connector_describe(pdx_kv_connector_h c, void **blob_p,
                                       size_t *len_p)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(blob_p, "blob_p") ||
        !KV_ARG_OK(len_p, "len_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(pdx_agent_describe(c->agent, blob_p, len_p));
}

pdx_status_t pdx_kv_connector_connect(pdx_kv_connector_h c, const void *blob,
                                      size_t len, char *peer_name_out)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(blob, "blob")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pdx_status_t st = pdx_peer_load(c->agent, blob, len, peer_name_out);
    if (st == PDX_ERR_MISMATCH) {
        pdx_error("kv: node %s refuses the peer: invariants differ (see the "
                  "line above for the field)", c->cfg.agent_name);
    }
    KV_LEAVE(st);
}

/* Handoff parameters, parsed. */
typedef struct handoff {
    char agent[PDX_NAME_MAX];
    char req[PDX_KV_REQ_ID_MAX];
    bool pool;
    size_t tokens;
    size_t n; /* full blocks */
    pdx_block_hash_t *hashes;
    uint64_t *ids;   /* arena: block ids; pool: slot addresses */
    uint64_t *bases; /* arena only: per arena */
    uint64_t *strides;
    bool has_tail;
    pdx_block_hash_t tail_hash;
    uint64_t tail_id;
    uint32_t tail_tokens;
} handoff_t;

static void handoff_free(handoff_t *h)
{
    free(h->hashes);
    free(h->ids);
    free(h->bases);
    free(h->strides);
}

static int json_u64_array(const cJSON *arr, uint64_t **out, size_t *n_p)
{
    if (!cJSON_IsArray(arr)) {
        return 0;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    *out = calloc(n ? n : 1, sizeof(uint64_t));
    if (*out == NULL) {
        return 0;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, arr)
    {
        /* Addresses and ids travel as decimal strings: a double cannot
         * hold every 64-bit value. */
        if (!cJSON_IsString(e)) {
            return 0;
        }
        char *end;
        (*out)[i++] = strtoull(e->valuestring, &end, 10);
        if (*end != '\0') {
            return 0;
        }
    }
    *n_p = n;
    return 1;
}

/* A JSON number that is a whole count in [0, max]; anything else (negative,
 * fractional, NaN, huge) is refused before it is converted. */
static int json_count(const cJSON *n, double max)
{
    return cJSON_IsNumber(n) && n->valuedouble >= 0 &&
           n->valuedouble <= max &&
           n->valuedouble == (double)(uint64_t)n->valuedouble;
}

static pdx_status_t handoff_parse(const char *json, size_t narenas,
                                  handoff_t *h)
{
    memset(h, 0, sizeof(*h));
    cJSON *root = cJSON_Parse(json);
    pdx_status_t st = PDX_ERR_CORRUPT;
    if (root == NULL) {
        pdx_error("kv: handoff parameters are not JSON");
        return st;
    }
    const cJSON *agent = cJSON_GetObjectItemCaseSensitive(root, "agent");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(root, "req");
    const cJSON *src = cJSON_GetObjectItemCaseSensitive(root, "source");
    const cJSON *tok = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    const cJSON *hs = cJSON_GetObjectItemCaseSensitive(root, "hashes");
    size_t nids = 0, nb = 0, ns = 0;
    if (!cJSON_IsString(agent) || strlen(agent->valuestring) >= PDX_NAME_MAX ||
        !cJSON_IsString(req) || !valid_req(req->valuestring) ||
        !cJSON_IsString(src) || !json_count(tok, 9007199254740992.0) ||
        !cJSON_IsArray(hs)) {
        pdx_error("kv: handoff parameters lack agent, req, source, tokens or "
                  "hashes");
        goto out;
    }
    snprintf(h->agent, sizeof(h->agent), "%s", agent->valuestring);
    snprintf(h->req, sizeof(h->req), "%s", req->valuestring);
    h->pool = strcmp(src->valuestring, "pool") == 0;
    h->tokens = (size_t)tok->valuedouble;
    h->n = (size_t)cJSON_GetArraySize(hs);
    h->hashes = calloc(h->n ? h->n : 1, sizeof(*h->hashes));
    if (h->hashes == NULL) {
        pdx_error("kv: handoff of %s: out of memory for %zu hashes", h->req,
                  h->n);
        st = PDX_ERR_NOMEM;
        goto out;
    }
    size_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, hs)
    {
        if (!cJSON_IsString(e) ||
            pdx_block_hash_from_hex(e->valuestring, &h->hashes[i++]) !=
                PDX_OK) {
            pdx_error("kv: handoff hash %zu is not hex", i - 1);
            goto out;
        }
    }
    if (!json_u64_array(cJSON_GetObjectItemCaseSensitive(
                            root, h->pool ? "addrs" : "ids"),
                        &h->ids, &nids) ||
        nids != h->n) {
        pdx_error("kv: handoff block list missing or of the wrong length");
        goto out;
    }
    if (!h->pool &&
        (!json_u64_array(cJSON_GetObjectItemCaseSensitive(root, "bases"),
                         &h->bases, &nb) ||
         !json_u64_array(cJSON_GetObjectItemCaseSensitive(root, "strides"),
                         &h->strides, &ns) ||
         nb != narenas || ns != narenas)) {
        pdx_error("kv: handoff arena bases/strides missing or not %zu",
                  narenas);
        goto out;
    }
    const cJSON *tail = cJSON_GetObjectItemCaseSensitive(root, "tail");
    if (cJSON_IsObject(tail)) {
        const cJSON *th = cJSON_GetObjectItemCaseSensitive(tail, "hash");
        const cJSON *tid = cJSON_GetObjectItemCaseSensitive(tail, "id");
        const cJSON *tt = cJSON_GetObjectItemCaseSensitive(tail, "tokens");
        if (!cJSON_IsString(th) || !cJSON_IsString(tid) ||
            !json_count(tt, PDX_HASH_BLOCK_SIZE_MAX) ||
            pdx_block_hash_from_hex(th->valuestring, &h->tail_hash) !=
                PDX_OK) {
            pdx_error("kv: handoff tail malformed");
            goto out;
        }
        h->tail_id = strtoull(tid->valuestring, NULL, 10);
        h->tail_tokens = (uint32_t)tt->valuedouble;
        h->has_tail = true;
    }
    st = PDX_OK;
out:
    cJSON_Delete(root);
    if (st != PDX_OK) {
        handoff_free(h);
    }
    return st;
}

pdx_status_t pdx_kv_params_check(const char *params, size_t len,
                                 size_t narenas)
{
    KV_ENTER();
    if (!KV_ARG_OK(params, "params")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    char *text = len < SIZE_MAX ? malloc(len + 1) : NULL;
    if (text == NULL) {
        pdx_error("kv: params check: out of memory for %zu bytes", len);
        KV_LEAVE(PDX_ERR_NOMEM);
    }
    memcpy(text, params, len);
    text[len] = '\0';
    handoff_t h;
    pdx_status_t st = handoff_parse(text, narenas, &h);
    if (st == PDX_OK) {
        handoff_free(&h);
    }
    free(text);
    KV_LEAVE(st);
}

static size_t cap_tokens(const pdx_kv_request_t *r, size_t tokens)
{
    /* The last prompt token is always recomputed: its logits are needed. */
    size_t limit = r->prompt_tokens > 0 ? r->prompt_tokens - 1 : 0;
    return tokens < limit ? tokens : limit;
}

static size_t match_remote(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                           const handoff_t *h, bool *tail_p)
{
    size_t k = 0;
    while (k < r->nfull && k < h->n &&
           pdx_block_hash_equal(&r->hashes[k], &h->hashes[k])) {
        k++;
    }
    *tail_p = c->remote->load_tail && k == r->nfull && k == h->n &&
              r->has_tail && h->has_tail &&
              r->tail_tokens == h->tail_tokens &&
              pdx_block_hash_equal(&r->tail_hash, &h->tail_hash);
    return k;
}

static waiter_t **find_waiter(pdx_kv_connector_h c, const char *req)
{
    waiter_t **w = &c->waiters;
    while (*w != NULL && strcmp((*w)->req, req) != 0) {
        w = &(*w)->next;
    }
    return w;
}

static bool same_key(const pdx_offload_key_t *a, const pdx_offload_key_t *b)
{
    return a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0;
}

/* Is this block queued for saving or being copied in right now? Only such
 * blocks make a lookup wait: unrelated saves never stall it. */
static bool save_in_flight(pdx_kv_connector_h c, const pdx_offload_key_t *k)
{
    if (c->cur_busy && same_key(&c->cur_key, k)) {
        return true;
    }
    for (size_t i = 0; i < c->q_len; i++) {
        if (same_key(&c->queue[(c->q_head + i) % SAVE_QUEUE].key, k)) {
            return true;
        }
    }
    return false;
}

static pdx_status_t lookup(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                           pdx_kv_match_t *match_p)
{
    pdx_kv_match_t m = {0};
    pdx_status_t st = PDX_OK;
    if (c->store != NULL && r->params != NULL) {
        /* The handoff's agent, by name through the store (bounded). */
        kv_store_discover(c->store, r->params);
    }
    pthread_mutex_lock(&c->lock);
    for (uint32_t i = 0; i < c->cfg.nchildren && m.blocks == 0 && !m.tail;
         i++) {
        const pdx_kv_child_config_t *ch = &c->cfg.children[i];
        if (ch->type == PDX_KV_CHILD_REMOTE && r->params != NULL) {
            handoff_t h;
            if (handoff_parse(r->params, c->narenas, &h) != PDX_OK) {
                continue;
            }
            if (pdx_peer_state(c->agent, h.agent) == PDX_OK) {
                bool tail;
                size_t k = match_remote(c, r, &h, &tail);
                if (k > 0 || tail) {
                    m = (pdx_kv_match_t){.source = PDX_KV_SOURCE_REMOTE,
                                         .blocks = k, .tail = tail};
                }
            } else {
                pdx_warn("kv: lookup %s: peer %s not connected or dead",
                         r->req_id, h.agent);
            }
            handoff_free(&h);
        } else if (ch->type == PDX_KV_CHILD_OFFLOAD && c->pool != NULL &&
                   ch->mode != PDX_KV_OFFLOAD_SAVE_ONLY && r->nfull > 0) {
            pdx_offload_key_t *keys = malloc(r->nfull * sizeof(*keys));
            if (keys == NULL) {
                pdx_error("kv connector %s: lookup %s: out of memory for %zu "
                          "keys",
                          c->cfg.agent_name, r->req_id, r->nfull);
                st = PDX_ERR_NOMEM;
                break;
            }
            for (size_t k = 0; k < r->nfull; k++) {
                keys[k] = key_of(&r->hashes[k]);
            }
            size_t prefix = 0;
            pdx_offload_query(c->pool, keys, r->nfull, &prefix);
            free(keys);
            bool tail = false;
            if (prefix == r->nfull && r->has_tail && ch->save_tail) {
                pdx_offload_key_t tk = key_of(&r->tail_hash);
                size_t t = 0;
                pdx_offload_query(c->pool, &tk, 1, &t);
                tail = t == 1;
            }
            pdx_offload_key_t missing;
            if (prefix < r->nfull) {
                missing = key_of(&r->hashes[prefix]);
            }
            if (prefix < r->nfull && ch->wait_for_full_prefix &&
                save_in_flight(c, &missing)) {
                /* Part of the prefix may still be on its way into the
                 * pool: pending until it lands or the deadline passes. */
                waiter_t **w = find_waiter(c, r->req_id);
                uint64_t now = now_ns();
                if (*w == NULL) {
                    waiter_t *n = calloc(1, sizeof(*n));
                    if (n != NULL) {
                        snprintf(n->req, sizeof(n->req), "%s", r->req_id);
                        n->deadline_ns =
                            now + (uint64_t)ch->wait_timeout_ms * 1000000ull;
                        *w = n;
                    }
                }
                if (*w != NULL && now < (*w)->deadline_ns) {
                    st = PDX_INPROGRESS;
                    break;
                }
            }
            if (prefix > 0 || tail) {
                m = (pdx_kv_match_t){.source = PDX_KV_SOURCE_OFFLOAD,
                                     .blocks = prefix, .tail = tail};
            }
            if (c->store != NULL) {
                /* Another node's pool may hold a longer prefix. */
                st = kv_store_match(c->store, r, prefix, &m);
                if (st == PDX_INPROGRESS) {
                    break;
                }
            }
        }
    }
    if (st == PDX_OK) {
        waiter_t **w = find_waiter(c, r->req_id);
        if (*w != NULL) {
            waiter_t *dead = *w;
            *w = dead->next;
            free(dead);
        }
        m.tokens = cap_tokens(r, m.blocks * c->block_tokens +
                                     (m.tail ? r->tail_tokens : 0));
        *match_p = m;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

pdx_status_t pdx_kv_lookup(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                           pdx_kv_match_t *match_p)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !KV_ARG_OK(match_p, "match_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(lookup(c, r, match_p));
}

static load_rec_t *find_load(pdx_kv_connector_h c, const char *req)
{
    for (load_rec_t *l = c->loads; l != NULL; l = l->next) {
        if (strcmp(l->req, req) == 0) {
            return l;
        }
    }
    return NULL;
}

static uint64_t arena_block_bytes(const pdx_arena_t *a)
{
    return (uint64_t)a->bytes_per_token * a->block_tokens;
}

/* Remote load: one READ, arena by arena, contiguous runs merged by the
 * agent, the done notification riding on the request. */
static pdx_status_t load_remote(pdx_kv_connector_h c,
                                const pdx_kv_request_t *r,
                                const pdx_kv_match_t *m, const uint64_t *ids,
                                load_rec_t *rec)
{
    handoff_t h;
    pdx_status_t st = handoff_parse(r->params, c->narenas, &h);
    if (st != PDX_OK) {
        return st;
    }
    size_t nb = m->blocks + (m->tail ? 1 : 0);
    size_t n = nb * c->narenas, j = 0;
    pdx_desc_t *l = NULL, *rm = NULL;
    if (m->blocks > h.n || (m->tail && !h.has_tail)) {
        /* A match that is not this handoff's: never index past it. */
        pdx_error("kv connector %s: load %s: match of %zu blocks%s exceeds "
                  "the handoff's %zu blocks%s",
                  c->cfg.agent_name, r->req_id, m->blocks,
                  m->tail ? " and a tail" : "", h.n,
                  h.has_tail ? " and a tail" : "");
        st = PDX_ERR_INVALID;
        goto out;
    }
    l = malloc(n * sizeof(*l));
    rm = malloc(n * sizeof(*rm));
    if (l == NULL || rm == NULL) {
        pdx_error("kv connector %s: load %s: out of memory for %zu "
                  "descriptors",
                  c->cfg.agent_name, r->req_id, n);
        st = PDX_ERR_NOMEM;
        goto out;
    }
    for (size_t a = 0; a < c->narenas; a++) {
        const pdx_arena_t *ar = &c->arenas[a];
        uint64_t bb = arena_block_bytes(ar);
        for (size_t b = 0; b < nb; b++) {
            bool tail = b == m->blocks;
            uint64_t rid = tail ? h.tail_id : h.ids[b];
            if (ids[b] >= ar->num_blocks) {
                pdx_error("kv: load %s: local block id %llu out of range",
                          r->req_id, (unsigned long long)ids[b]);
                st = PDX_ERR_INVALID;
                goto out;
            }
            uint64_t la = ar->base + ids[b] * ar->stride;
            uint64_t ra = h.pool ? rid + c->arena_off[a]
                                 : h.bases[a] + rid * h.strides[a];
            if (j > 0 && b > 0 && l[j - 1].addr + l[j - 1].len == la &&
                rm[j - 1].addr + rm[j - 1].len == ra) {
                /* Runs merged as they are built: a 128K-token request is
                 * 101 pieces, not 200k descriptors to write and merge. */
                l[j - 1].len += bb;
                rm[j - 1].len += bb;
                continue;
            }
            l[j] = (pdx_desc_t){.addr = la, .len = bb, .dev_id = ar->dev_id};
            rm[j] = (pdx_desc_t){.addr = ra, .len = bb};
            j++;
        }
    }
    pdx_desc_list_t ll = {pdx_layout_mem_type(c->layout), l, j};
    pdx_desc_list_t rl = {PDX_MEM_DRAM, rm, j};
    char note[128];
    snprintf(note, sizeof(note), MSG_PREFIX "done %s", h.req);
    st = pdx_xfer_create(c->agent, PDX_XFER_READ, &ll, &rl, h.agent, note,
                         strlen(note), &rec->xfer);
    if (st != PDX_OK) {
        pdx_error("kv connector %s: load %s: cannot prepare the read of %zu "
                  "blocks from %s: %s",
                  c->cfg.agent_name, r->req_id, nb, h.agent,
                  pdx_status_string(st));
        goto out;
    }
    st = pdx_xfer_post(rec->xfer);
    if (st >= 0) {
        snprintf(rec->peer, sizeof(rec->peer), "%s", h.agent);
        snprintf(rec->peer_req, sizeof(rec->peer_req), "%s", h.req);
        rec->status = PDX_INPROGRESS;
        rec->last_hb_ns = now_ns();
        pdx_debug("kv: load %s: %zu blocks from %s in %zu pieces", r->req_id,
                  nb, h.agent, pdx_xfer_segments(rec->xfer));
        st = PDX_OK;
    } else {
        pdx_error("kv connector %s: load %s: the read from %s did not start: "
                  "%s",
                  c->cfg.agent_name, r->req_id, h.agent,
                  pdx_status_string(st));
        pdx_xfer_release(rec->xfer);
        rec->xfer = NULL;
    }
out:
    free(l);
    free(rm);
    handoff_free(&h);
    return st;
}

static pdx_status_t load_offload(pdx_kv_connector_h c,
                                 const pdx_kv_request_t *r,
                                 const pdx_kv_match_t *m, const uint64_t *ids)
{
    size_t nb = m->blocks + (m->tail ? 1 : 0);
    pdx_offload_key_t *keys = malloc((nb ? nb : 1) * sizeof(*keys));
    if (keys == NULL) {
        pdx_error("kv connector %s: load %s: out of memory for %zu keys",
                  c->cfg.agent_name, r->req_id, nb);
        return PDX_ERR_NOMEM;
    }
    for (size_t b = 0; b < m->blocks; b++) {
        keys[b] = key_of(&r->hashes[b]);
    }
    if (m->tail) {
        keys[m->blocks] = key_of(&r->tail_hash);
    }
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
    for (size_t b = 0; b < nb; b++) {
        const void *src;
        pdx_offload_lease_block(c->pool, lease, b, &src);
        for (size_t a = 0; a < c->narenas; a++) {
            const pdx_arena_t *ar = &c->arenas[a];
            memcpy((void *)(uintptr_t)(ar->base + ids[b] * ar->stride),
                   (const unsigned char *)src + c->arena_off[a],
                   arena_block_bytes(ar));
        }
    }
    pdx_offload_release(c->pool, lease);
    return PDX_OK;
}

static pdx_status_t load(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const pdx_kv_match_t *m, const uint64_t *ids)
{
    pdx_status_t st, copied = PDX_OK;
    if (m->source == PDX_KV_SOURCE_OFFLOAD && c->pool != NULL &&
        (m->blocks > 0 || m->tail)) {
        /* The pool is thread-safe and the lease pins the blocks: copy
         * without the connector lock so progress and lookups go on. */
        copied = load_offload(c, r, m, ids);
    }
    pthread_mutex_lock(&c->lock);
    if (find_load(c, r->req_id) != NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv: load %s: already loading", r->req_id);
        return PDX_ERR_EXISTS;
    }
    load_rec_t *rec = calloc(1, sizeof(*rec));
    if (rec == NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: load %s: out of memory",
                  c->cfg.agent_name, r->req_id);
        return PDX_ERR_NOMEM;
    }
    snprintf(rec->req, sizeof(rec->req), "%s", r->req_id);
    rec->tokens = m->tokens;
    char *xparams = NULL;
    if (m->blocks == 0 && !m->tail) {
        rec->status = PDX_OK;
        st = PDX_OK;
    } else if (m->source == PDX_KV_SOURCE_REMOTE && c->store != NULL &&
               (xparams = kv_store_take_params(c->store, r->req_id)) !=
                   NULL) {
        /* A cross-node offload hit: a handoff from the owner's pool. */
        pdx_kv_request_t r2 = *r;
        r2.params = xparams;
        st = load_remote(c, &r2, m, ids, rec);
        free(xparams);
    } else if (m->source == PDX_KV_SOURCE_REMOTE && r->params != NULL &&
               c->remote != NULL) {
        st = load_remote(c, r, m, ids, rec);
    } else if (m->source == PDX_KV_SOURCE_OFFLOAD && c->pool != NULL) {
        st = copied;
        rec->status = st;
    } else {
        pdx_error("kv connector %s: load %s: match source %d has no child "
                  "here to load from (remote needs req->params and a remote "
                  "child, offload an offload child)",
                  c->cfg.agent_name, r->req_id, (int)m->source);
        st = PDX_ERR_INVALID;
    }
    if (st != PDX_OK && st != PDX_ERR_NOT_FOUND) {
        free(rec);
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    if (st == PDX_ERR_NOT_FOUND) {
        rec->status = st; /* reported by load_check under the policy */
    }
    rec->next = c->loads;
    c->loads = rec;
    pthread_mutex_unlock(&c->lock);
    return PDX_OK;
}

pdx_status_t pdx_kv_load(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const pdx_kv_match_t *m, const uint64_t *ids)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !KV_ARG_OK(m, "match")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if ((m->blocks > 0 || m->tail) && !KV_ARG_OK(ids, "block_ids")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (m->blocks > r->nfull || (m->tail && !r->has_tail)) {
        pdx_error("kv connector %s: load %s: match of %zu blocks%s exceeds "
                  "the request's %zu blocks%s",
                  c->cfg.agent_name, r->req_id, m->blocks,
                  m->tail ? " and a tail" : "", r->nfull,
                  r->has_tail ? " and a tail" : "");
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(load(c, r, m, ids));
}

pdx_status_t pdx_kv_load_abort(pdx_kv_connector_h c, const char *req_id)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(req_id, "req_id")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&c->lock);
    load_rec_t *l = find_load(c, req_id);
    if (l == NULL || l->aborted) {
        bool aborting = l != NULL;
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: load abort: %s request %.*s",
                  c->cfg.agent_name,
                  aborting ? "already aborting the load of"
                           : "no load is known of",
                  PDX_KV_REQ_ID_MAX, req_id);
        KV_LEAVE(PDX_ERR_NOT_FOUND);
    }
    l->aborted = true;
    if (l->xfer != NULL) {
        /* Asked, not waited for: the peer may still be answering, and
         * waiting here would hold every lock of this node meanwhile. */
        pdx_xfer_abort(l->xfer);
        if (l->peer[0] != '\0') {
            char note[128];
            snprintf(note, sizeof(note), MSG_PREFIX "reject %s", l->peer_req);
            pdx_notif_send(c->agent, l->peer, note, strlen(note));
        }
    }
    pthread_mutex_unlock(&c->lock);
    KV_LEAVE(PDX_OK);
}

static pdx_status_t load_check(pdx_kv_connector_h c, const char *req_id,
                               size_t *tokens_p)
{
    pthread_mutex_lock(&c->lock);
    load_rec_t **pp = &c->loads;
    while (*pp != NULL && strcmp((*pp)->req, req_id) != 0) {
        pp = &(*pp)->next;
    }
    load_rec_t *l = *pp;
    if (l == NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: load check: no load of request %.*s is "
                  "known",
                  c->cfg.agent_name, PDX_KV_REQ_ID_MAX, req_id);
        return PDX_ERR_NOT_FOUND;
    }
    if (l->xfer != NULL) {
        l->status = pdx_xfer_check(l->xfer);
        if (l->status != PDX_INPROGRESS) {
            pdx_xfer_release(l->xfer);
            l->xfer = NULL;
        }
    }
    pdx_status_t st = l->status;
    if (st == PDX_INPROGRESS) {
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    *pp = l->next;
    size_t tokens = l->tokens;
    if (l->aborted) {
        /* Final: no byte lands any more; the blocks are the caller's. The
         * load may have completed first (PDX_OK, data valid). */
        free(l);
        pthread_mutex_unlock(&c->lock);
        if (st == PDX_OK) {
            *tokens_p = tokens;
            return PDX_OK;
        }
        pdx_error("kv connector %s: load %.*s: aborted (%s when it stopped)",
                  c->cfg.agent_name, PDX_KV_REQ_ID_MAX, req_id,
                  pdx_status_string(st));
        return PDX_ERR_CANCELED;
    }
    if (st != PDX_OK) {
        pdx_warn("kv: load %s failed: %s (policy %s)", req_id,
                 pdx_status_string(st),
                 c->remote && c->remote->failure_policy == PDX_KV_FAIL_FAIL
                     ? "fail" : "recompute");
        if (l->peer[0] != '\0') {
            char note[128];
            snprintf(note, sizeof(note), MSG_PREFIX "reject %s", l->peer_req);
            pdx_notif_send(c->agent, l->peer, note, strlen(note));
        }
        if (c->remote == NULL ||
            c->remote->failure_policy == PDX_KV_FAIL_RECOMPUTE) {
            st = PDX_OK;
            tokens = 0;
        }
    }
    free(l);
    pthread_mutex_unlock(&c->lock);
    if (st == PDX_OK) {
        *tokens_p = tokens;
    }
    return st;
}

pdx_status_t pdx_kv_load_check(pdx_kv_connector_h c, const char *req_id,
                               size_t *tokens_p)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(req_id, "req_id") ||
        !KV_ARG_OK(tokens_p, "tokens_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(load_check(c, req_id, tokens_p));
}

pdx_status_t pdx_kv_save(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const uint64_t *ids)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r)) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if ((r->nfull > 0 || r->has_tail) && !KV_ARG_OK(ids, "block_ids")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (c->pool == NULL || c->offload->mode == PDX_KV_OFFLOAD_LOAD_ONLY) {
        KV_LEAVE(PDX_OK); /* no child saves */
    }
    size_t n = r->nfull + (r->has_tail && c->offload->save_tail ? 1 : 0);
    pthread_mutex_lock(&c->lock);
    save_rec_t *s = NULL;
    for (save_rec_t *x = c->saves; x != NULL; x = x->next) {
        if (strcmp(x->req, r->req_id) == 0) {
            s = x;
        }
    }
    if (s == NULL) {
        s = calloc(1, sizeof(*s));
        if (s == NULL) {
            pthread_mutex_unlock(&c->lock);
            pdx_error("kv connector %s: save %s: out of memory",
                      c->cfg.agent_name, r->req_id);
            KV_LEAVE(PDX_ERR_NOMEM);
        }
        snprintf(s->req, sizeof(s->req), "%s", r->req_id);
        s->next = c->saves;
        c->saves = s;
    }
    for (size_t i = 0; i < n; i++) {
        uint64_t id = ids[i];
        if (id >= c->arenas[0].num_blocks) {
            /* Reported by pdx_kv_save_check, as a failed copy would be. */
            pdx_error("kv connector %s: save %s: block id %llu out of range "
                      "(%llu blocks)",
                      c->cfg.agent_name, r->req_id, (unsigned long long)id,
                      (unsigned long long)c->arenas[0].num_blocks);
            s->status = PDX_ERR_INVALID;
            break;
        }
        /* Bounded queue: wait for the worker rather than drop a save. */
        for (int guard = 0; c->q_len == SAVE_QUEUE && guard < 100000;
             guard++) {
            pthread_cond_wait(&c->cv, &c->lock);
        }
        if (c->q_len == SAVE_QUEUE) {
            pdx_error("kv connector %s: save %s: the save queue stayed full "
                      "(%d blocks); %zu of %zu blocks queued",
                      c->cfg.agent_name, r->req_id, SAVE_QUEUE, i, n);
            s->status = PDX_ERR_BUSY;
            break;
        }
        save_item_t *it = &c->queue[(c->q_head + c->q_len) % SAVE_QUEUE];
        it->rec = s;
        it->block_id = id;
        it->key = key_of(i < r->nfull ? &r->hashes[i] : &r->tail_hash);
        s->pending++;
        c->q_len++;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    KV_LEAVE(PDX_OK);
}

pdx_status_t pdx_kv_save_check(pdx_kv_connector_h c, const char *req_id)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(req_id, "req_id")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&c->lock);
    save_rec_t **pp = &c->saves;
    while (*pp != NULL && strcmp((*pp)->req, req_id) != 0) {
        pp = &(*pp)->next;
    }
    pdx_status_t st = PDX_OK;
    if (*pp != NULL) {
        save_rec_t *s = *pp;
        if (s->pending > 0) {
            st = PDX_INPROGRESS;
        } else {
            st = s->status;
            *pp = s->next;
            free(s);
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (st < 0) {
        pdx_error("kv connector %s: save %.*s failed: %s", c->cfg.agent_name,
                  PDX_KV_REQ_ID_MAX, req_id, pdx_status_string(st));
    }
    KV_LEAVE(st);
}

static void json_add_u64s(cJSON *obj, const char *name, const uint64_t *v,
                          size_t n)
{
    cJSON *arr = cJSON_AddArrayToObject(obj, name);
    char buf[24];
    for (size_t i = 0; i < n; i++) {
        snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v[i]);
        cJSON_AddItemToArray(arr, cJSON_CreateString(buf));
    }
}

/* MultiConnector: merge child `b`'s transfer parameters into `a`'s; a key
 * both set is an error naming the key and both children. */
static pdx_status_t merge_params(cJSON *a, const cJSON *b, const char *an,
                                 const char *bn)
{
    if (!cJSON_IsObject(a) || !cJSON_IsObject(b)) {
        pdx_error("kv: transfer parameters of %s and %s must be objects", an,
                  bn);
        return PDX_ERR_INVALID;
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, b)
    {
        if (cJSON_GetObjectItemCaseSensitive(a, e->string) != NULL) {
            pdx_error("kv: transfer parameters clash: children %s and %s "
                      "both set \"%s\"", an, bn, e->string);
            return PDX_ERR_EXISTS;
        }
    }
    cJSON_ArrayForEach(e, b)
    {
        cJSON *dup = cJSON_Duplicate(e, 1);
        if (dup == NULL) {
            return PDX_ERR_NOMEM;
        }
        cJSON_AddItemToObject(a, e->string, dup);
    }
    return PDX_OK;
}

pdx_status_t pdx_kv_params_merge(const char *a, const char *b, char **out_p)
{
    KV_ENTER();
    if (!KV_ARG_OK(a, "a") || !KV_ARG_OK(b, "b") ||
        !KV_ARG_OK(out_p, "out_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    cJSON *ja = cJSON_Parse(a), *jb = cJSON_Parse(b);
    pdx_status_t st = PDX_ERR_CORRUPT;
    if (ja != NULL && jb != NULL) {
        st = merge_params(ja, jb, "first", "second");
    } else {
        pdx_error("kv: params merge: the %s parameters are not JSON",
                  ja == NULL ? "first" : "second");
    }
    if (st == PDX_OK) {
        char *text = cJSON_PrintUnformatted(ja);
        st = text ? PDX_OK : PDX_ERR_NOMEM;
        if (text) {
            *out_p = text;
        } else {
            pdx_error("kv: params merge: out of memory");
        }
    }
    cJSON_Delete(ja);
    cJSON_Delete(jb);
    KV_LEAVE(st);
}

/* Wait (bounded) until the worker saved everything queued for `req`. */
static void wait_saved(pdx_kv_connector_h c, const char *req,
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
        save_rec_t *s = c->saves;
        while (s != NULL && strcmp(s->req, req) != 0) {
            s = s->next;
        }
        if (s == NULL || s->pending == 0) {
            return;
        }
        if (pthread_cond_timedwait(&c->cv, &c->lock, &dl) != 0) {
            return;
        }
    }
}

static pdx_status_t request_finished(pdx_kv_connector_h c,
                                     const pdx_kv_request_t *r,
                                     const uint64_t *ids, size_t tokens,
                                     pdx_kv_handoff_from_t from,
                                     char **params_p)
{
    if (c->remote == NULL) {
        pdx_error("kv: request_finished %s: no remote child configured",
                  r->req_id);
        return PDX_ERR_UNSUPPORTED;
    }
    if (from == PDX_KV_FROM_POOL && c->pool == NULL) {
        pdx_error("kv connector %s: request_finished %s: a handoff from the "
                  "pool needs an offload child",
                  c->cfg.agent_name, r->req_id);
        return PDX_ERR_UNSUPPORTED;
    }
    pdx_status_t st = PDX_OK;
    cJSON *root = cJSON_CreateObject();
    held_t *h = calloc(1, sizeof(*h));
    pdx_offload_key_t *keys = NULL;
    if (root == NULL || h == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    pthread_mutex_lock(&c->lock);
    cJSON_AddStringToObject(root, "agent", c->cfg.agent_name);
    cJSON_AddStringToObject(root, "req", r->req_id);
    cJSON_AddStringToObject(root, "source",
                            from == PDX_KV_FROM_POOL ? "pool" : "arena");
    size_t n = r->nfull;
    uint64_t *addrs = NULL;
    if (from == PDX_KV_FROM_POOL) {
        wait_saved(c, r->req_id, c->offload->wait_timeout_ms);
        keys = malloc((n ? n : 1) * sizeof(*keys));
        addrs = malloc((n ? n : 1) * sizeof(*addrs));
        if (keys == NULL || addrs == NULL) {
            st = PDX_ERR_NOMEM;
            free(addrs);
            goto unlock;
        }
        for (size_t i = 0; i < n; i++) {
            keys[i] = key_of(&r->hashes[i]);
        }
        size_t got = 0;
        if (n > 0 &&
            pdx_offload_lease(c->pool, keys, n, &h->lease, &got) == PDX_OK) {
            n = got;
            for (size_t i = 0; i < n; i++) {
                const void *p;
                pdx_offload_lease_block(c->pool, h->lease, i, &p);
                addrs[i] = (uintptr_t)p;
            }
        } else {
            n = 0;
        }
        json_add_u64s(root, "addrs", addrs, n);
        free(addrs);
    } else {
        json_add_u64s(root, "ids", ids, n);
        uint64_t *v = malloc(c->narenas * 2 * sizeof(*v));
        if (v == NULL) {
            st = PDX_ERR_NOMEM;
            goto unlock;
        }
        for (size_t a = 0; a < c->narenas; a++) {
            v[a] = c->arenas[a].base;
            v[c->narenas + a] = c->arenas[a].stride;
        }
        json_add_u64s(root, "bases", v, c->narenas);
        json_add_u64s(root, "strides", v + c->narenas, c->narenas);
        free(v);
        if (r->has_tail) {
            char hex[2 * PDX_OFFLOAD_KEY_MAX + 1], id[24];
            pdx_block_hash_to_hex(&r->tail_hash, hex, sizeof(hex));
            snprintf(id, sizeof(id), "%llu", (unsigned long long)ids[n]);
            cJSON *t = cJSON_AddObjectToObject(root, "tail");
            cJSON_AddStringToObject(t, "hash", hex);
            cJSON_AddStringToObject(t, "id", id);
            cJSON_AddNumberToObject(t, "tokens", r->tail_tokens);
        }
    }
    size_t covered = n * c->block_tokens +
                     (from == PDX_KV_FROM_ARENA && r->has_tail
                          ? r->tail_tokens : 0);
    cJSON_AddNumberToObject(root, "tokens",
                            (double)(tokens < covered ? tokens : covered));
    cJSON *hs = cJSON_AddArrayToObject(root, "hashes");
    for (size_t i = 0; i < n; i++) {
        char hex[2 * PDX_OFFLOAD_KEY_MAX + 1];
        pdx_block_hash_to_hex(&r->hashes[i], hex, sizeof(hex));
        cJSON_AddItemToArray(hs, cJSON_CreateString(hex));
    }
    if (c->pool != NULL && r->nfull > 0) {
        /* The offload child's part: how much of this request the local
         * pool holds, so a router can prefer this node next turn. */
        cJSON *off = cJSON_CreateObject();
        size_t have = 0;
        pdx_offload_key_t *k2 = malloc(r->nfull * sizeof(*k2));
        if (off == NULL || k2 == NULL) {
            cJSON_Delete(off);
            free(k2);
            st = PDX_ERR_NOMEM;
            goto unlock;
        }
        for (size_t i = 0; i < r->nfull; i++) {
            k2[i] = key_of(&r->hashes[i]);
        }
        pdx_offload_query(c->pool, k2, r->nfull, &have);
        free(k2);
        cJSON_AddNumberToObject(off, "offload_blocks", (double)have);
        st = merge_params(root, off, "remote", "offload");
        cJSON_Delete(off);
        if (st != PDX_OK) {
            goto unlock;
        }
    }
    char *text = cJSON_PrintUnformatted(root);
    if (text == NULL) {
        st = PDX_ERR_NOMEM;
        goto unlock;
    }
    snprintf(h->req, sizeof(h->req), "%s", r->req_id);
    snprintf(h->peer, sizeof(h->peer), "%s", c->cfg.peer_name);
    h->deadline_ns = now_ns() + (uint64_t)c->remote->lease_ms * 1000000ull;
    h->next = c->held;
    c->held = h;
    h = NULL;
    *params_p = text;
unlock:
    pthread_mutex_unlock(&c->lock);
out:
    if (st == PDX_ERR_NOMEM) {
        pdx_error("kv connector %s: request_finished %s: out of memory",
                  c->cfg.agent_name, r->req_id);
    }
    if (h != NULL) {
        if (h->lease) {
            pdx_offload_release(c->pool, h->lease);
        }
        free(h);
    }
    free(keys);
    cJSON_Delete(root);
    return st;
}

pdx_status_t pdx_kv_request_finished(pdx_kv_connector_h c,
                                     const pdx_kv_request_t *r,
                                     const uint64_t *ids, size_t tokens,
                                     pdx_kv_handoff_from_t from,
                                     char **params_p)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !KV_ARG_OK(params_p, "params_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (from != PDX_KV_FROM_ARENA && from != PDX_KV_FROM_POOL) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: from %d is not a pdx_kv_handoff_from_t", __func__,
                      (int)from);
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (from == PDX_KV_FROM_ARENA && (r->nfull > 0 || r->has_tail) &&
        !KV_ARG_OK(ids, "block_ids")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    KV_LEAVE(request_finished(c, r, ids, tokens, from, params_p));
}

pdx_status_t pdx_kv_reject(pdx_kv_connector_h c, const char *params)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(params, "params")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    handoff_t h;
    pdx_status_t st = handoff_parse(params, c->narenas, &h);
    if (st != PDX_OK) {
        KV_LEAVE(st);
    }
    if (c->store != NULL) {
        kv_store_discover(c->store, params); /* the holder, by name */
    }
    char note[128];
    snprintf(note, sizeof(note), MSG_PREFIX "reject %s", h.req);
    st = pdx_notif_send(c->agent, h.agent, note, strlen(note));
    if (st != PDX_OK) {
        pdx_error("kv connector %s: reject of %s: cannot notify %s: %s",
                  c->cfg.agent_name, h.req, h.agent, pdx_status_string(st));
    }
    handoff_free(&h);
    KV_LEAVE(st);
}

static void on_note(void *arg, const char *peer, const void *msg, size_t len)
{
    pdx_kv_connector_h c = arg; /* c->lock is held by pdx_kv_progress */
    if (kv_store_on_note(c->store, peer, msg, len)) {
        return; /* cross-node offload messages */
    }
    char text[160];
    if (len >= sizeof(text) || len < sizeof(MSG_PREFIX) - 1 ||
        memcmp(msg, MSG_PREFIX, sizeof(MSG_PREFIX) - 1) != 0) {
        pdx_debug("kv: ignoring a %zu-byte message from %s", len, peer);
        return;
    }
    memcpy(text, msg, len);
    text[len] = '\0';
    char verb[16], req[PDX_KV_REQ_ID_MAX];
    if (sscanf(text + sizeof(MSG_PREFIX) - 1, "%15s %63s", verb, req) != 2) {
        return;
    }
    held_t **pp = &c->held;
    while (*pp != NULL && strcmp((*pp)->req, req) != 0) {
        pp = &(*pp)->next;
    }
    if (*pp == NULL) {
        pdx_debug("kv: %s for unknown request %s from %s", verb, req, peer);
        return;
    }
    held_t *h = *pp;
    snprintf(h->peer, sizeof(h->peer), "%s", peer); /* its reader */
    if (strcmp(verb, "hb") == 0) {
        h->deadline_ns = now_ns() + (uint64_t)c->remote->lease_ms * 1000000ull;
    } else if (strcmp(verb, "done") == 0 || strcmp(verb, "reject") == 0) {
        *pp = h->next;
        pdx_debug("kv: %s freed by %s (%s)", req, peer, verb);
        free_held(c, h, verb[0] == 'd' ? PDX_KV_FREED_DONE
                                       : PDX_KV_FREED_REJECT);
    }
}

int pdx_kv_progress(pdx_kv_connector_h c)
{
    KV_ENTER();
    if (!KV_CONN_OK(c)) {
        KV_LEAVE_INT(PDX_ERR_INVALID);
    }
    int events = 0;
    pthread_mutex_lock(&c->lock);
    events += pdx_notif_poll(c->agent, on_note, c);
    bool check_dead = false;
    events += kv_store_progress(c->store, &check_dead);
    uint64_t now = now_ns();
    for (held_t **pp = &c->held; *pp != NULL;) {
        held_t *h = *pp;
        if (now > h->deadline_ns) {
            *pp = h->next;
            pdx_warn("kv: lease of %s expired (peer %s never read it or "
                     "died): freeing its blocks", h->req, h->peer);
            free_held(c, h, PDX_KV_FREED_EXPIRED);
            events++;
        } else if (check_dead && h->peer[0] != '\0' &&
                   pdx_peer_state(c->agent, h->peer) ==
                       PDX_ERR_REMOTE_DISCONNECT) {
            /* Its reader is gone (store lease or connection): free now
             * rather than at the handoff lease. */
            *pp = h->next;
            pdx_warn("kv: reader %s of %s is gone: freeing its blocks",
                     h->peer, h->req);
            kv_store_note_peer_gone(c->store);
            free_held(c, h, PDX_KV_FREED_PEER_GONE);
            events++;
        } else {
            pp = &h->next;
        }
    }
    if (c->remote != NULL) {
        uint64_t period = (uint64_t)c->remote->heartbeat_ms * 1000000ull;
        for (load_rec_t *l = c->loads; l != NULL; l = l->next) {
            if (l->xfer != NULL && now - l->last_hb_ns >= period) {
                char note[128];
                snprintf(note, sizeof(note), MSG_PREFIX "hb %s", l->peer_req);
                pdx_notif_send(c->agent, l->peer, note, strlen(note));
                l->last_hb_ns = now;
            }
        }
    }
    pthread_mutex_unlock(&c->lock);
    KV_LEAVE_INT(events);
}

int pdx_kv_poll_freed(pdx_kv_connector_h c, pdx_kv_freed_cb_t cb, void *arg)
{
    KV_ENTER();
    if (!KV_CONN_OK(c)) {
        KV_LEAVE_INT(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&c->lock);
    freed_t *list = c->freed;
    c->freed = c->freed_tail = NULL;
    pthread_mutex_unlock(&c->lock);
    int n = 0;
    while (list != NULL) {
        freed_t *f = list;
        list = f->next;
        if (cb != NULL) {
            /* The caller's code: its own pdx calls record their own
             * errors, not this call's. */
            int d = pdx_call_suspend();
            cb(arg, f->req, f->why);
            pdx_call_resume(d);
        }
        free(f);
        n++;
    }
    KV_LEAVE_INT(n);
}

size_t pdx_kv_held_requests(pdx_kv_connector_h c)
{
    KV_ENTER();
    if (!KV_CONN_OK(c)) {
        KV_LEAVE_VAL(PDX_ERR_INVALID, 0);
    }
    size_t n = 0;
    pthread_mutex_lock(&c->lock);
    for (held_t *h = c->held; h != NULL; h = h->next) {
        n++;
    }
    pthread_mutex_unlock(&c->lock);
    KV_LEAVE_VAL(PDX_OK, n);
}

pdx_status_t pdx_kv_offload_stats(pdx_kv_connector_h c,
                                  pdx_offload_stats_t *stats_p)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(stats_p, "stats_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (c->pool == NULL) {
        pdx_error("kv connector %s: offload stats: no offload child",
                  c->cfg.agent_name);
        KV_LEAVE(PDX_ERR_NOT_FOUND);
    }
    KV_LEAVE(pdx_offload_stats(c->pool, stats_p));
}

pdx_status_t pdx_kv_store_stats(pdx_kv_connector_h c,
                                pdx_kv_store_stats_t *stats_p)
{
    KV_ENTER();
    if (!KV_CONN_OK(c) || !KV_ARG_OK(stats_p, "stats_p")) {
        KV_LEAVE(PDX_ERR_INVALID);
    }
    if (c->store == NULL) {
        pdx_error("kv connector %s: store stats: no store section",
                  c->cfg.agent_name);
        KV_LEAVE(PDX_ERR_NOT_FOUND);
    }
    kv_store_stats(c->store, stats_p);
    KV_LEAVE(PDX_OK);
}
