/* KV connector: its life (the agent with its backends, arenas and
 * invariants, the children, the store) and its node-wide calls. The calls
 * per request are the MultiConnector's (kv_multi.c). */
#include <pdx/kv_connector.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pdx/backend_instance.h>
#include <pdx/blob.h>
#include <pdx/log.h>
#include <pdx/mem.h>
#include <pdx/peer.h>
#include <pdx/xfer.h>

#include "kv_call_int.h"
#include "kv_connector_int.h"

void pdx_kv_free(void *p)
{
    PDX_ENTER();
    free(p);
    PDX_LEAVE_VOID(PDX_OK);
}

static pdx_status_t set_invariants(pdx_kv_connector_h c)
{
    char buf[128];
    pdx_block_hash_t none;
    pdx_hasher_none_hash(c->hasher, &none);
    char hex[2 * PDX_OFFLOAD_KEY_MAX + 1];
    pdx_block_hash_to_hex(&none, hex, sizeof(hex));
    uint64_t fp = pdx_layout_fingerprint(c->layout);
    char bs[16];
    snprintf(bs, sizeof(bs), "%u", c->block_tokens);
    snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)fp);
    const char *const inv[][2] = {{"hash_algo", c->cfg.hash_algo},
                                  {"none_hash", hex},
                                  {"block_size", bs},
                                  {"kv_dtype", c->cfg.kv_dtype},
                                  {"layout_fingerprint", buf},
                                  {"model_id", c->cfg.model_id},
                                  {"connector_version",
                                   pdx_connector_version()}};
    /* Every one is set (each failure logged by the agent), then one
     * verdict: no OR of negative status codes. */
    bool failed = false;
    for (size_t i = 0; i < sizeof(inv) / sizeof(inv[0]); i++) {
        failed |= pdx_agent_set_invariant(c->agent, inv[i][0], inv[i][1]) !=
                  PDX_OK;
    }
    pdx_info("kv: node %s: none_hash %s (%s), layout fingerprint %016llx, "
             "%zu arenas, %llu B per block", c->cfg.agent_name, hex,
             c->cfg.hash_algo, (unsigned long long)fp, c->narenas,
             (unsigned long long)c->block_bytes);
    if (failed) {
        pdx_error("kv connector %s: cannot set the invariants on its agent",
                  c->cfg.agent_name);
        return PDX_ERR_INVALID;
    }
    return PDX_OK;
}

/* One child per type (the last of each in the config; the schema allows
 * one), then the config order the router asks them in. */
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
    pdx_status_t st = PDX_OK;
    if (c->remote != NULL) {
        st = kv_remote_create(c, c->remote, &c->remote_child);
    }
    if (st == PDX_OK && c->offload != NULL) {
        st = kv_offload_child_create(c, c->offload, &c->offload_child);
    }
    for (uint32_t i = 0; i < c->cfg.nchildren; i++) {
        c->order[i] = c->cfg.children[i].type == PDX_KV_CHILD_REMOTE
                          ? c->remote_child
                          : c->cfg.children[i].type == PDX_KV_CHILD_OFFLOAD
                                ? c->offload_child
                                : NULL;
    }
    return st;
}

static void connector_destroy(pdx_kv_connector_h c);

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* The layout's distinct layers, ascending, and each arena's among them:
 * what layer-wise loads and saves go by. */
static pdx_status_t setup_layers(pdx_kv_connector_h c)
{
    c->layers = calloc(c->narenas, sizeof(*c->layers));
    c->arena_li = calloc(c->narenas, sizeof(*c->arena_li));
    if (c->layers == NULL || c->arena_li == NULL) {
        pdx_error("kv connector %s: out of memory for %zu arenas",
                  c->cfg.agent_name, c->narenas);
        return PDX_ERR_NOMEM;
    }
    for (size_t a = 0; a < c->narenas; a++) {
        c->layers[a] = c->arenas[a].layer;
    }
    qsort(c->layers, c->narenas, sizeof(*c->layers), cmp_u32);
    uint32_t n = 0;
    for (size_t a = 0; a < c->narenas; a++) {
        if (n == 0 || c->layers[n - 1] != c->layers[a]) {
            c->layers[n++] = c->layers[a];
        }
    }
    c->nlayers = n;
    for (size_t a = 0; a < c->narenas; a++) {
        c->arena_li[a] = (uint32_t)kv_layer_index(c, c->arenas[a].layer);
    }
    return PDX_OK;
}

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
    if ((st = setup_layers(c)) != PDX_OK) {
        goto err;
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
        pdx_option_t opts[PDX_KV_MAX_BACKEND_OPTS];
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
    PDX_ENTER();
    if (!PDX_ARG_OK(params, "params") || !PDX_ARG_OK(conn_p, "conn_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (!(params->field_mask & PDX_KV_PARAM_CONFIG) ||
        params->config == NULL) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: params->config is NULL or not in field_mask",
                      __func__);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (!(params->field_mask & PDX_KV_PARAM_LAYOUT)) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: params->layout not in field_mask",
                      __func__);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (!KV_LAYOUT_OK(params->layout, "params->layout")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(connector_create(params, conn_p));
}

static void connector_destroy(pdx_kv_connector_h c)
{
    /* The children first: the save worker stops before the store. */
    kv_child_t *kids[] = {c->offload_child, c->remote_child};
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++) {
        if (kids[i] != NULL && kids[i]->ops->destroy != NULL) {
            kids[i]->ops->destroy(kids[i]);
        }
    }
    c->offload_child = c->remote_child = NULL;
    kv_store_stop(c->store); /* before the agent and the pool */
    c->store = NULL;
    while (c->loads) {
        kv_load_t *l = c->loads;
        c->loads = l->next;
        kv_load_free(c, l);
    }
    while (c->freed) {
        kv_freed_t *f = c->freed;
        c->freed = f->next;
        free(f);
    }
    kv_pending_free(&c->pending);
    pdx_agent_destroy(c->agent); /* before the pool: the slab is registered */
    pdx_offload_destroy(c->pool);
    pdx_hasher_destroy(c->hasher);
    free(c->arenas);
    free(c->arena_off);
    free(c->layers);
    free(c->arena_li);
    pthread_mutex_destroy(&c->lock);
    pdx_handle_release(c);
}

void pdx_kv_connector_destroy(pdx_kv_connector_h c)
{
    PDX_ENTER();
    if (c == NULL) { /* like free(NULL) */
        PDX_LEAVE_VOID(PDX_OK);
    }
    if (!KV_CONN_REL_OK(c)) {
        PDX_LEAVE_VOID(PDX_ERR_INVALID);
    }
    connector_destroy(c);
    PDX_LEAVE_VOID(PDX_OK);
}

pdx_agent_h pdx_kv_connector_agent(pdx_kv_connector_h c)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c)) {
        PDX_LEAVE_VAL(PDX_ERR_INVALID, NULL);
    }
    PDX_LEAVE_VAL(PDX_OK, c->agent);
}

pdx_hasher_h pdx_kv_connector_hasher(pdx_kv_connector_h c)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c)) {
        PDX_LEAVE_VAL(PDX_ERR_INVALID, NULL);
    }
    PDX_LEAVE_VAL(PDX_OK, c->hasher);
}

pdx_status_t pdx_kv_connector_describe(pdx_kv_connector_h c, void **blob_p,
                                       size_t *len_p)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(blob_p, "blob_p") ||
        !PDX_ARG_OK(len_p, "len_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(pdx_agent_describe(c->agent, blob_p, len_p));
}

pdx_status_t pdx_kv_connector_connect(pdx_kv_connector_h c, const void *blob,
                                      size_t len, char *peer_name_out)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(blob, "blob")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_status_t st = pdx_peer_load(c->agent, blob, len, peer_name_out);
    if (st == PDX_ERR_MISMATCH) {
        pdx_error("kv: node %s refuses the peer: invariants differ (see the "
                  "line above for the field)", c->cfg.agent_name);
    }
    PDX_LEAVE(st);
}

