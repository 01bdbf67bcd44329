/* Deployment config: one JSON file per role checked key by key into
 * pdx_kv_config_t, with the strict reader of kv_json.h. Every error names
 * the file, the JSON path and what was expected; configs/README.md is the
 * schema this file implements, with the values derived from it. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include <pdx/kv_config.h>
#include <pdx/kv_hash.h>

#include "kv_call_int.h"
#include "kv_json_int.h"

#define NUM_LAYERS_MAX 4096
#define MTP_LAYERS_MAX 16
#define BYTES_PER_TOKEN_MAX (1u << 20)
#define PARALLEL_MAX 4096
#define DEVICE_MAX 1023
#define MS_MAX 86400000u /* one day */

/* A NULL required argument: logged with the function named, and in `err`. */
static bool cfg_arg_ok(const void *p, const char *fn, const char *what,
                       char *err, size_t err_len)
{
    if (p != NULL)
        return true;
    pdx_arg_ok(p, fn, what);
    if (err != NULL && err_len > 0)
        snprintf(err, err_len, "%s: %s is NULL", fn, what);
    return false;
}

/* ---- sections ------------------------------------------------------- */

static const char *const ROLE_NAMES[] = {"producer", "consumer", "both"};
static const pdx_kv_role_t ROLES[] = {PDX_KV_ROLE_PRODUCER,
                                      PDX_KV_ROLE_CONSUMER, PDX_KV_ROLE_BOTH};

static int indexshare_layer(uint32_t l, uint32_t num_layers)
{
    /* IndexShare (GLM-5.x): layers 0, 1, 2 keep their own indexer, then
     * every 4th from 6 up to num_layers - 4 (74 of 78). */
    if (l >= num_layers)
        return 0;
    if (l <= 2)
        return 1;
    return l >= 6 && num_layers >= 4 && l <= num_layers - 4 && (l - 6) % 4 == 0;
}

static pdx_status_t add_index_layer(kvj_ctx_t *c, pdx_kv_config_t *cfg,
                                    uint32_t layer)
{
    if (cfg->n_index_k_layers >= PDX_KV_MAX_INDEX_LAYERS)
        return kvj_fail_at(c, "more than %d index-K layers",
                           PDX_KV_MAX_INDEX_LAYERS);
    cfg->index_k_layers[cfg->n_index_k_layers++] = layer;
    return PDX_OK;
}

#define INDEX_LAYERS_EXPECT                                                    \
    "an array of layer numbers or one of \"indexshare\", \"all\", \"none\""

static pdx_status_t parse_index_layers(kvj_ctx_t *c, const cJSON *model,
                                       pdx_kv_config_t *cfg)
{
    const cJSON *v = kvj_member(model, "index_k_layers");
    size_t old = kvj_push_key(c, "index_k_layers");
    pdx_status_t st = PDX_OK;
    cfg->n_index_k_layers = 0;
    if (v == NULL) {
        /* none */
    } else if (cJSON_IsString(v) && v->valuestring != NULL) {
        const char *s = v->valuestring;
        int all = strcmp(s, "all") == 0;
        if (!all && strcmp(s, "indexshare") != 0 && strcmp(s, "none") != 0)
            return kvj_fail_type(c, v, INDEX_LAYERS_EXPECT);
        if (strcmp(s, "none") != 0)
            for (uint32_t l = 0; l < cfg->num_layers && st == PDX_OK; l++)
                if (all || indexshare_layer(l, cfg->num_layers))
                    st = add_index_layer(c, cfg, l);
    } else if (cJSON_IsArray(v)) {
        size_t i = 0;
        for (const cJSON *e = v->child; e != NULL && st == PDX_OK;
             e = e->next, i++) {
            size_t o2 = kvj_push_index(c, i);
            uint64_t l;
            st = kvj_read_uint(c, e, 0, cfg->num_layers - 1, &l);
            if (st != PDX_OK) {
                char got[64];
                kvj_describe(e, got, sizeof(got));
                return kvj_fail_at(c,
                                   "expected a layer number from 0 to %" PRIu32
                                   " (num_layers is %" PRIu32 "), got %s",
                                   cfg->num_layers - 1, cfg->num_layers, got);
            }
            if (cfg->n_index_k_layers > 0 &&
                l <= cfg->index_k_layers[cfg->n_index_k_layers - 1])
                return kvj_fail_at(
                    c,
                    "layer %" PRIu64 " after %" PRIu32
                    ": expected increasing layer numbers",
                    l, cfg->index_k_layers[cfg->n_index_k_layers - 1]);
            kvj_pop(c, o2);
            st = add_index_layer(c, cfg, (uint32_t)l);
        }
    } else {
        return kvj_fail_type(c, v, INDEX_LAYERS_EXPECT);
    }
    if (st != PDX_OK)
        return st;
    if (cfg->n_index_k_layers > 0 && cfg->index_k_bytes_per_token == 0)
        return kvj_fail_at(c,
                           "%" PRIu32 " index-K layers listed but "
                           "$.model.index_k_bytes_per_token is 0 or absent",
                           cfg->n_index_k_layers);
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_model(kvj_ctx_t *c, const cJSON *root,
                                pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"id",
                                       "kv_dtype",
                                       "num_layers",
                                       "mla_bytes_per_token",
                                       "index_k_bytes_per_token",
                                       "index_k_layers",
                                       "mtp_layers"};
    const cJSON *m;
    size_t old;
    pdx_status_t st = kvj_get_object(c, root, "model", 1, &m, &old);
    if (st == PDX_OK)
        st =
            kvj_check_keys(c, m, keys, sizeof(keys) / sizeof(keys[0]), "model");
    if (st == PDX_OK)
        st = kvj_get_str(c, m, "id", cfg->model_id, sizeof(cfg->model_id), 1,
                         KVJ_STR_ANY, 1, "");
    if (st == PDX_OK)
        st = kvj_get_str(c, m, "kv_dtype", cfg->kv_dtype, sizeof(cfg->kv_dtype),
                         1, KVJ_STR_NAME, 1, "");
    if (st == PDX_OK)
        st = kvj_get_u32(c, m, "num_layers", 1, NUM_LAYERS_MAX, 1, 0,
                         &cfg->num_layers);
    if (st == PDX_OK)
        st = kvj_get_u32(c, m, "mla_bytes_per_token", 1, BYTES_PER_TOKEN_MAX, 1,
                         0, &cfg->mla_bytes_per_token);
    if (st == PDX_OK)
        st =
            kvj_get_u32(c, m, "index_k_bytes_per_token", 0, BYTES_PER_TOKEN_MAX,
                        0, 0, &cfg->index_k_bytes_per_token);
    if (st == PDX_OK)
        st = kvj_get_u32(c, m, "mtp_layers", 0, MTP_LAYERS_MAX, 0, 0,
                         &cfg->mtp_layers);
    if (st == PDX_OK)
        st = parse_index_layers(c, m, cfg);
    if (st != PDX_OK)
        return st;
    if (cfg->index_k_bytes_per_token > 0 && cfg->n_index_k_layers == 0 &&
        cfg->mtp_layers == 0) {
        kvj_push_key(c, "index_k_bytes_per_token");
        return kvj_fail_at(c,
                           "%" PRIu32
                           " bytes per token, but no layer carries an "
                           "index-K cache (index_k_layers is empty and "
                           "mtp_layers is 0)",
                           cfg->index_k_bytes_per_token);
    }
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_parallel(kvj_ctx_t *c, const cJSON *root,
                                   pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"dp_size", "dp_rank", "tp_size",
                                       "tp_rank"};
    const cJSON *p;
    size_t old;
    pdx_status_t st = kvj_get_object(c, root, "parallel", 0, &p, &old);
    if (st == PDX_OK && p != NULL)
        st = kvj_check_keys(c, p, keys, 4, "parallel");
    if (st == PDX_OK)
        st = kvj_get_u32(c, p, "dp_size", 1, PARALLEL_MAX, 0, 1, &cfg->dp_size);
    if (st == PDX_OK)
        st = kvj_get_u32(c, p, "dp_rank", 0, PARALLEL_MAX, 0, 0, &cfg->dp_rank);
    if (st == PDX_OK)
        st = kvj_get_u32(c, p, "tp_size", 1, PARALLEL_MAX, 0, 1, &cfg->tp_size);
    if (st == PDX_OK)
        st = kvj_get_u32(c, p, "tp_rank", 0, PARALLEL_MAX, 0, 0, &cfg->tp_rank);
    if (st != PDX_OK)
        return st;
    if (cfg->dp_rank >= cfg->dp_size) {
        kvj_push_key(c, "dp_rank");
        return kvj_fail_at(c, "%" PRIu32 " is not below dp_size (%" PRIu32 ")",
                           cfg->dp_rank, cfg->dp_size);
    }
    if (cfg->tp_rank >= cfg->tp_size) {
        kvj_push_key(c, "tp_rank");
        return kvj_fail_at(c, "%" PRIu32 " is not below tp_size (%" PRIu32 ")",
                           cfg->tp_rank, cfg->tp_size);
    }
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_kv(kvj_ctx_t *c, const cJSON *root,
                             pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"block_tokens", "num_blocks",
                                       "bytes_per_block", "memory", "device"};
    static const char *const mems[] = {"dram", "vram"};
    const cJSON *k;
    size_t old, mem = 0;
    uint64_t given = 0;
    pdx_status_t st = kvj_get_object(c, root, "kv", 1, &k, &old);
    if (st == PDX_OK)
        st = kvj_check_keys(c, k, keys, 5, "kv");
    if (st == PDX_OK)
        st = kvj_get_u32(c, k, "block_tokens", 1, PDX_HASH_BLOCK_SIZE_MAX, 1, 0,
                         &cfg->block_tokens);
    if (st == PDX_OK)
        st = kvj_get_u32(c, k, "num_blocks", 1, UINT32_MAX, 1, 0,
                         &cfg->num_blocks);
    if (st == PDX_OK)
        st =
            kvj_get_uint(c, k, "bytes_per_block", 1, KVJ_INT_MAX, 0, 0, &given);
    if (st == PDX_OK)
        st = kvj_get_enum(c, k, "memory", mems, 2, 0, 0, &mem);
    if (st == PDX_OK)
        st = kvj_get_u32(c, k, "device", 0, DEVICE_MAX, 0, 0, &cfg->device);
    if (st != PDX_OK)
        return st;
    cfg->mem_type = mem == 1 ? PDX_MEM_VRAM : PDX_MEM_DRAM;
    cfg->bytes_per_block = pdx_kv_config_bytes_per_block(cfg);
    if (given != 0 && given != cfg->bytes_per_block) {
        kvj_push_key(c, "bytes_per_block");
        return kvj_fail_at(
            c,
            "%" PRIu64 " does not match the model's layout: %" PRIu64
            " bytes = (%" PRIu32 " layers x %" PRIu32 " + %" PRIu32
            " index-K layers x %" PRIu32 " + %" PRIu32 " MTP layers x (%" PRIu32
            " + %" PRIu32 ")) x %" PRIu32 " tokens",
            given, cfg->bytes_per_block, cfg->num_layers,
            cfg->mla_bytes_per_token, cfg->n_index_k_layers,
            cfg->index_k_bytes_per_token, cfg->mtp_layers,
            cfg->mla_bytes_per_token, cfg->index_k_bytes_per_token,
            cfg->block_tokens);
    }
    uint64_t total;
    if (__builtin_mul_overflow(cfg->bytes_per_block, (uint64_t)cfg->num_blocks,
                               &total) ||
        total > (1ull << 62)) {
        kvj_push_key(c, "num_blocks");
        return kvj_fail_at(c,
                           "%" PRIu32 " blocks of %" PRIu64
                           " bytes exceed 2^62 bytes of arenas",
                           cfg->num_blocks, cfg->bytes_per_block);
    }
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_hashing(kvj_ctx_t *c, const cJSON *root,
                                  pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"algorithm", "seed"};
    static const char *const algos[] = {"xxhash_cbor", "sha256_cbor"};
    const cJSON *h;
    size_t old, algo = 1;
    pdx_status_t st = kvj_get_object(c, root, "hashing", 1, &h, &old);
    if (st == PDX_OK)
        st = kvj_check_keys(c, h, keys, 2, "hashing");
    if (st == PDX_OK)
        st = kvj_get_enum(c, h, "algorithm", algos, 2, 0, 1, &algo);
    if (st == PDX_OK)
        st = kvj_get_str(c, h, "seed", cfg->hash_seed, sizeof(cfg->hash_seed),
                         0, KVJ_STR_SEED, 1, "");
    if (st != PDX_OK)
        return st;
    snprintf(cfg->hash_algo, sizeof(cfg->hash_algo), "%s", algos[algo]);
    kvj_pop(c, old);
    return PDX_OK;
}

/* "zai-org/GLM-5.2-FP8" -> "glm52": the part after the last '/',
 * lower-cased, letters and digits only, up to the first '-' that follows a
 * digit ("GLM-5.2" ends at "-FP8"). "pdx" when nothing is left. */
static void model_short(const char *id, char *out, size_t len)
{
    const char *s = strrchr(id, '/');
    s = s != NULL ? s + 1 : id;
    size_t o = 0;
    int digit = 0;
    for (; *s && o + 1 < len && o < 24; s++) {
        char ch = *s;
        if (ch == '-' && digit)
            break;
        if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9')) {
            out[o++] = ch;
            digit = ch >= '0' && ch <= '9';
        }
    }
    out[o] = '\0';
    if (o == 0)
        snprintf(out, len, "pdx");
}

static pdx_status_t parse_agent(kvj_ctx_t *c, const cJSON *root,
                                pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"name", "role", "peer", "peer_address",
                                       "path_policy", "cluster_key_file"};
    static const char *const policies[] = {"any", "same_host_fast",
                                           "native"};
    const cJSON *a;
    size_t old, role = 0, policy = 0;
    pdx_status_t st = kvj_get_object(c, root, "agent", 1, &a, &old);
    if (st == PDX_OK)
        st = kvj_check_keys(c, a, keys, 6, "agent");
    if (st == PDX_OK)
        st = kvj_get_enum(c, a, "role", ROLE_NAMES, 3, 1, 0, &role);
    if (st == PDX_OK)
        st = kvj_get_enum(c, a, "path_policy", policies, 3, 0, 0, &policy);
    /* The cluster key's file (docs/SECURITY.md); read at agent creation. */
    if (st == PDX_OK)
        st = kvj_get_str(c, a, "cluster_key_file", cfg->cluster_key_file,
                         sizeof(cfg->cluster_key_file), 1, KVJ_STR_ANY, 0, "");
    if (st != PDX_OK)
        return st;
    cfg->role = ROLES[role];
    cfg->path_policy = (uint32_t)policy;

    char def[64], shortname[32];
    static const char *const tag[] = {"p", "d", "pd"};
    model_short(cfg->model_id, shortname, sizeof(shortname));
    if (cfg->tp_size > 1)
        snprintf(def, sizeof(def), "%s-%s-dp%" PRIu32 "-tp%" PRIu32, shortname,
                 tag[role], cfg->dp_rank, cfg->tp_rank);
    else
        snprintf(def, sizeof(def), "%s-%s-dp%" PRIu32, shortname, tag[role],
                 cfg->dp_rank);
    st = kvj_get_str(c, a, "name", cfg->agent_name, sizeof(cfg->agent_name), 1,
                     KVJ_STR_NAME, 0, def);
    if (st == PDX_OK)
        st = kvj_get_str(c, a, "peer", cfg->peer_name, sizeof(cfg->peer_name),
                         1, KVJ_STR_NAME, 0, "");
    if (st == PDX_OK)
        st = kvj_get_str(c, a, "peer_address", cfg->peer_address,
                         sizeof(cfg->peer_address), 0, KVJ_STR_ANY, 0, "");
    if (st != PDX_OK)
        return st;
    /* With a store, peers come from handoff parameters, found by name. */
    if (cfg->role != PDX_KV_ROLE_BOTH && cfg->peer_name[0] == '\0' &&
        kvj_member(root, "store") == NULL) {
        kvj_push_key(c, "peer");
        return kvj_fail_at(
            c,
            "missing (required for role %s: the %s agent's name, "
            "e.g. \"%s\")",
            ROLE_NAMES[role],
            cfg->role == PDX_KV_ROLE_PRODUCER ? "decode" : "prefill",
            cfg->role == PDX_KV_ROLE_PRODUCER ? "glm52-d-dp0" : "glm52-p-dp0");
    }
    if (strcmp(cfg->peer_name, cfg->agent_name) == 0) {
        kvj_push_key(c, "peer");
        return kvj_fail_at(c, "\"%s\" is this agent's own name",
                           cfg->peer_name);
    }
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_remote(kvj_ctx_t *c, const cJSON *ch,
                                 pdx_kv_child_config_t *out)
{
    static const char *const keys[] = {"type", "lease_ms", "heartbeat_ms",
                                       "failure_policy", "load_tail"};
    static const char *const policies[] = {"recompute", "fail"};
    size_t pol = 0;
    pdx_status_t st = kvj_check_keys(c, ch, keys, 5, "a \"remote\" child");
    if (st == PDX_OK)
        st =
            kvj_get_u32(c, ch, "lease_ms", 1, MS_MAX, 0, 30000, &out->lease_ms);
    if (st == PDX_OK)
        st = kvj_get_u32(c, ch, "heartbeat_ms", 1, MS_MAX, 0, 2000,
                         &out->heartbeat_ms);
    if (st == PDX_OK)
        st = kvj_get_enum(c, ch, "failure_policy", policies, 2, 0, 0, &pol);
    if (st == PDX_OK)
        st = kvj_get_bool(c, ch, "load_tail", true, &out->load_tail);
    if (st != PDX_OK)
        return st;
    out->failure_policy = pol == 1 ? PDX_KV_FAIL_FAIL : PDX_KV_FAIL_RECOMPUTE;
    if (out->heartbeat_ms >= out->lease_ms) {
        kvj_push_key(c, "heartbeat_ms");
        return kvj_fail_at(c,
                           "%" PRIu32 " is not below lease_ms (%" PRIu32
                           "): leases would expire between heartbeats",
                           out->heartbeat_ms, out->lease_ms);
    }
    return PDX_OK;
}

static pdx_status_t parse_offload(kvj_ctx_t *c, const cJSON *ch,
                                  const pdx_kv_config_t *cfg,
                                  pdx_kv_child_config_t *out)
{
    static const char *const keys[] = {"type",
                                       "mode",
                                       "budget_bytes",
                                       "ranks_per_host",
                                       "wait_for_full_prefix",
                                       "wait_timeout_ms",
                                       "save_tail"};
    static const char *const modes[] = {"read_write", "save_only", "load_only"};
    static const pdx_kv_offload_mode_t mode_vals[] = {PDX_KV_OFFLOAD_READ_WRITE,
                                                      PDX_KV_OFFLOAD_SAVE_ONLY,
                                                      PDX_KV_OFFLOAD_LOAD_ONLY};
    size_t mode = 0;
    pdx_status_t st = kvj_check_keys(c, ch, keys, 7, "an \"offload\" child");
    if (st == PDX_OK)
        st = kvj_get_enum(c, ch, "mode", modes, 3, 0, 0, &mode);
    if (st == PDX_OK)
        st = kvj_get_size(c, ch, "budget_bytes", &out->budget_bytes);
    if (st == PDX_OK)
        st = kvj_get_u32(c, ch, "ranks_per_host", 1, cfg->dp_size, 0,
                         cfg->dp_size, &out->ranks_per_host);
    if (st == PDX_OK)
        st = kvj_get_bool(c, ch, "wait_for_full_prefix", false,
                          &out->wait_for_full_prefix);
    if (st == PDX_OK)
        st = kvj_get_u32(c, ch, "wait_timeout_ms", 0, MS_MAX, 0, 2000,
                         &out->wait_timeout_ms);
    if (st == PDX_OK)
        st = kvj_get_bool(c, ch, "save_tail", true, &out->save_tail);
    if (st != PDX_OK)
        return st;
    out->mode = mode_vals[mode];
    uint64_t per_rank = out->budget_bytes / out->ranks_per_host;
    if (per_rank < cfg->bytes_per_block) {
        kvj_push_key(c, "budget_bytes");
        if (out->ranks_per_host == 1)
            return kvj_fail_at(
                c, "%" PRIu64 " is smaller than one block (%" PRIu64 " bytes)",
                out->budget_bytes, cfg->bytes_per_block);
        return kvj_fail_at(
            c,
            "%" PRIu64 " over %" PRIu32 " ranks per host is %" PRIu64
            " bytes per rank, smaller than one block (%" PRIu64 " bytes)",
            out->budget_bytes, out->ranks_per_host, per_rank,
            cfg->bytes_per_block);
    }
    if (out->wait_for_full_prefix && out->mode == PDX_KV_OFFLOAD_SAVE_ONLY) {
        kvj_push_key(c, "wait_for_full_prefix");
        return kvj_fail_at(
            c, "%s",
            "true, but mode save_only never loads (use read_write "
            "or load_only, or false)");
    }
    return PDX_OK;
}

static pdx_status_t parse_connector(kvj_ctx_t *c, const cJSON *root,
                                    pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"type", "children"};
    static const char *const types[] = {"multi"};
    static const char *const child_types[] = {"remote", "offload"};
    const cJSON *conn;
    size_t old, t = 0;
    pdx_status_t st = kvj_get_object(c, root, "connector", 1, &conn, &old);
    if (st == PDX_OK)
        st = kvj_check_keys(c, conn, keys, 2, "connector");
    if (st == PDX_OK)
        st = kvj_get_enum(c, conn, "type", types, 1, 0, 0, &t);
    if (st != PDX_OK)
        return st;

    const cJSON *kids = kvj_member(conn, "children");
    size_t o1 = kvj_push_key(c, "children");
    char exp[64];
    snprintf(exp, sizeof(exp), "an array of 1 to %d child objects",
             PDX_KV_MAX_CHILDREN);
    if (kids == NULL)
        return kvj_fail_at(c, "missing (required: %s)", exp);
    if (!cJSON_IsArray(kids))
        return kvj_fail_type(c, kids, exp);
    int n = cJSON_GetArraySize(kids);
    if (n < 1 || n > PDX_KV_MAX_CHILDREN)
        return kvj_fail_at(c, "expected %s, got %d", exp, n);

    size_t i = 0;
    uint32_t types_seen = 0;
    for (const cJSON *ch = kids->child; ch != NULL; ch = ch->next, i++) {
        size_t o2 = kvj_push_index(c, i);
        pdx_kv_child_config_t *out = &cfg->children[i];
        size_t ct = 0;
        memset(out, 0, sizeof(*out));
        if (!cJSON_IsObject(ch))
            return kvj_fail_type(c, ch, "a child object");
        st = kvj_get_enum(c, ch, "type", child_types, 2, 1, 0, &ct);
        if (st != PDX_OK)
            return st;
        if (types_seen & (1u << ct)) {
            kvj_push_key(c, "type");
            return kvj_fail_at(c,
                               "a second \"%s\" child (each type may appear "
                               "once)",
                               child_types[ct]);
        }
        types_seen |= 1u << ct;
        out->type = ct == 0 ? PDX_KV_CHILD_REMOTE : PDX_KV_CHILD_OFFLOAD;
        st =
            ct == 0 ? parse_remote(c, ch, out) : parse_offload(c, ch, cfg, out);
        if (st != PDX_OK)
            return st;
        kvj_pop(c, o2);
    }
    cfg->nchildren = (uint32_t)i;
    kvj_pop(c, o1);

    if ((types_seen & 1u) && cfg->peer_name[0] == '\0' &&
        kvj_member(root, "store") == NULL) { /* with a store: found by name */
        kvj_pop(c, 1);                       /* back to "$" */
        kvj_push_key(c, "agent");
        kvj_push_key(c, "peer");
        return kvj_fail_at(c, "%s",
                           "missing (required by the \"remote\" child in "
                           "$.connector.children: the peer agent's name)");
    }
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_backend_opts(kvj_ctx_t *c, const cJSON *opts,
                                       pdx_kv_config_t *cfg, uint32_t owner)
{
    for (const cJSON *o = opts->child; o != NULL; o = o->next) {
        const char *key = o->string != NULL ? o->string : "";
        size_t old = kvj_push_key(c, key);
        uint32_t k = cfg->nbackend_opts;
        if (k >= PDX_KV_MAX_BACKEND_OPTS)
            return kvj_fail_at(c, "more than %d backend options in all",
                               PDX_KV_MAX_BACKEND_OPTS);
        size_t kl = strlen(key);
        if (kl == 0 || kl >= sizeof(cfg->opt_buf[k][0]) ||
            !kvj_str_ok(key, KVJ_STR_NAME))
            return kvj_fail_at(c,
                               "option name: expected 1 to %zu bytes of "
                               "[A-Za-z0-9._-]",
                               sizeof(cfg->opt_buf[k][0]) - 1);
        for (uint32_t j = 0; j < k; j++)
            if (cfg->backend_opt_owner[j] == owner &&
                strcmp(cfg->opt_buf[j][0], key) == 0)
                return kvj_fail_at(c, "%s", "key given twice");
        memcpy(cfg->opt_buf[k][0], key, kl + 1);
        char *val = cfg->opt_buf[k][1];
        size_t vsize = sizeof(cfg->opt_buf[k][1]);
        if (cJSON_IsString(o)) {
            pdx_status_t st = kvj_read_str(c, o, val, vsize, 0, KVJ_STR_ANY);
            if (st != PDX_OK)
                return st;
        } else if (cJSON_IsBool(o)) {
            snprintf(val, vsize, "%s", cJSON_IsTrue(o) ? "true" : "false");
        } else if (cJSON_IsNumber(o)) {
            uint64_t u;
            if (kvj_read_uint(c, o, 0, KVJ_INT_MAX, &u) != PDX_OK)
                return kvj_fail_type(c, o,
                                     "a string, a non-negative integer or a "
                                     "boolean");
            snprintf(val, vsize, "%" PRIu64, u);
        } else {
            return kvj_fail_type(
                c, o, "a string, a non-negative integer or a boolean");
        }
        cfg->backend_opt_owner[k] = owner;
        cfg->nbackend_opts = k + 1;
        kvj_pop(c, old);
    }
    return PDX_OK;
}

static pdx_status_t parse_backends(kvj_ctx_t *c, const cJSON *root,
                                   pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"name", "options", "required"};
    const cJSON *b = kvj_member(root, "backends");
    size_t old = kvj_push_key(c, "backends");
    char exp[64];
    snprintf(exp, sizeof(exp), "an array of 1 to %d backend objects",
             PDX_KV_MAX_BACKENDS);
    cfg->nbackends = 0;
    cfg->nbackend_opts = 0;
    if (b == NULL) {
        snprintf(cfg->backends[0], sizeof(cfg->backends[0]), "ucx");
        cfg->nbackends = 1;
        kvj_pop(c, old);
        return PDX_OK;
    }
    if (!cJSON_IsArray(b))
        return kvj_fail_type(c, b, exp);
    int n = cJSON_GetArraySize(b);
    if (n < 1 || n > PDX_KV_MAX_BACKENDS)
        return kvj_fail_at(c, "expected %s, got %d", exp, n);
    size_t i = 0;
    for (const cJSON *e = b->child; e != NULL; e = e->next, i++) {
        size_t o2 = kvj_push_index(c, i);
        if (!cJSON_IsObject(e))
            return kvj_fail_type(c, e, "a backend object");
        pdx_status_t st = kvj_check_keys(c, e, keys, 3, "a backend");
        if (st == PDX_OK)
            st = kvj_get_str(c, e, "name", cfg->backends[i],
                             sizeof(cfg->backends[i]), 1, KVJ_STR_LOWER, 1, "");
        if (st == PDX_OK)
            st = kvj_get_bool(c, e, "required", false,
                              &cfg->backend_required[i]);
        if (st != PDX_OK)
            return st;
        for (size_t j = 0; j < i; j++)
            if (strcmp(cfg->backends[j], cfg->backends[i]) == 0) {
                kvj_push_key(c, "name");
                return kvj_fail_at(c, "backend \"%s\" listed twice",
                                   cfg->backends[i]);
            }
        const cJSON *opts;
        size_t o3;
        st = kvj_get_object(c, e, "options", 0, &opts, &o3);
        if (st == PDX_OK && opts != NULL)
            st = parse_backend_opts(c, opts, cfg, (uint32_t)i);
        if (st != PDX_OK)
            return st;
        kvj_pop(c, o3);
        cfg->nbackends = (uint32_t)i + 1;
        kvj_pop(c, o2);
    }
    kvj_pop(c, old);
    return PDX_OK;
}

/* The `store` section: a store module (etcd) for discovery by name,
 * liveness through leases and the block-owner registry. */
static pdx_status_t parse_store(kvj_ctx_t *c, const cJSON *root,
                                pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {
        "type",          "endpoints",      "namespace",
        "lease_ttl_ms",  "timeout_ms",     "fetch_timeout_ms",
        "max_txn_ops",   "registry",       "demote_owners",
        "remote_offload", "remote_offload_timeout_ms",
        "ca_file",       "cert_file",      "key_file",
        "user",          "password_file"};
    const cJSON *s;
    size_t old;
    cfg->has_store = false;
    pdx_status_t st = kvj_get_object(c, root, "store", 0, &s, &old);
    if (st != PDX_OK)
        return st;
    if (s == NULL) {
        kvj_pop(c, old);
        return PDX_OK;
    }
    st = kvj_check_keys(c, s, keys, sizeof(keys) / sizeof(keys[0]), "store");
    if (st == PDX_OK)
        st = kvj_get_str(c, s, "type", cfg->store_type, sizeof(cfg->store_type),
                         1, KVJ_STR_LOWER, 0, "etcd");
    if (st != PDX_OK)
        return st;
    /* endpoints: one URL string (commas allowed) or an array of them. */
    const cJSON *e = kvj_member(s, "endpoints");
    size_t o1 = kvj_push_key(c, "endpoints");
    const char *exp = "an array of 1 to 8 \"http://host:port\" strings";
    if (e == NULL)
        return kvj_fail_at(c, "missing (required: %s)", exp);
    size_t n = 0, used = 0, i = 0;
    cfg->store_endpoints[0] = '\0';
    const cJSON *first = cJSON_IsArray(e) ? e->child : e;
    if (!cJSON_IsArray(e) && !cJSON_IsString(e))
        return kvj_fail_type(c, e, exp);
    if (cJSON_IsArray(e) &&
        (cJSON_GetArraySize(e) < 1 || cJSON_GetArraySize(e) > 8))
        return kvj_fail_at(c, "expected %s, got %d", exp,
                           cJSON_GetArraySize(e));
    for (const cJSON *u = first; u != NULL;
         u = cJSON_IsArray(e) ? u->next : NULL, i++) {
        size_t o2 = cJSON_IsArray(e) ? kvj_push_index(c, i) : c->path_len;
        if (!cJSON_IsString(u) || u->valuestring == NULL)
            return kvj_fail_type(c, u, "a \"http://host:port\" string");
        const char *v = u->valuestring;
        size_t len = strlen(v);
        bool ok =
            len > 7 && len < 256 && kvj_str_ok(v, KVJ_STR_ANY) &&
            (strncmp(v, "http://", 7) == 0 || strncmp(v, "https://", 8) == 0) &&
            strchr(v, ' ') == NULL;
        if (ok && cJSON_IsArray(e))
            ok = strchr(v, ',') == NULL;
        if (!ok)
            return kvj_fail_type(c, u,
                                 "a \"http://host:port\" URL (http or "
                                 "https, no spaces)");
        if (used + len + 2 > sizeof(cfg->store_endpoints))
            return kvj_fail_at(c, "%s",
                               "endpoints longer than 511 bytes in all");
        used += (size_t)snprintf(cfg->store_endpoints + used,
                                 sizeof(cfg->store_endpoints) - used, "%s%s",
                                 n ? "," : "", v);
        n++;
        kvj_pop(c, o2);
    }
    kvj_pop(c, o1);
    st = kvj_get_str(c, s, "namespace", cfg->store_namespace,
                     sizeof(cfg->store_namespace), 1, KVJ_STR_ANY, 0, "pdx");
    if (st != PDX_OK)
        return st;
    {
        const char *v = cfg->store_namespace;
        size_t len = strlen(v);
        bool ok = v[len - 1] != '/';
        for (size_t k = 0; k < len && ok; k++)
            ok = (v[k] >= 'a' && v[k] <= 'z') || (v[k] >= 'A' && v[k] <= 'Z') ||
                 (v[k] >= '0' && v[k] <= '9') || v[k] == '.' || v[k] == '_' ||
                 v[k] == '-' || v[k] == '/';
        if (!ok) {
            kvj_push_key(c, "namespace");
            return kvj_fail_type(
                c, kvj_member(s, "namespace"),
                "a string of 1 to 127 bytes of [A-Za-z0-9._/-] "
                "not ending in '/'");
        }
    }
    st = kvj_get_u32(c, s, "lease_ttl_ms", 1000, 3600000, 0, 10000,
                     &cfg->store_lease_ttl_ms);
    if (st == PDX_OK)
        st = kvj_get_u32(c, s, "timeout_ms", 1, 600000, 0, 2000,
                         &cfg->store_timeout_ms);
    if (st == PDX_OK)
        st = kvj_get_u32(c, s, "fetch_timeout_ms", 0, MS_MAX, 0, 5000,
                         &cfg->store_fetch_timeout_ms);
    if (st == PDX_OK)
        st = kvj_get_u32(c, s, "max_txn_ops", 2, 1000000, 0, 128,
                         &cfg->store_max_txn_ops);
    if (st == PDX_OK)
        st = kvj_get_bool(c, s, "registry", true, &cfg->store_registry);
    if (st == PDX_OK)
        st = kvj_get_u32(c, s, "demote_owners", 1, 65535, 0, 3,
                         &cfg->store_demote_owners);
    if (st == PDX_OK)
        st = kvj_get_bool(c, s, "remote_offload", true,
                          &cfg->store_remote_offload);
    if (st == PDX_OK)
        st = kvj_get_u32(c, s, "remote_offload_timeout_ms", 0, MS_MAX, 0, 1000,
                         &cfg->store_remote_offload_timeout_ms);
    /* TLS and auth (docs/SECURITY.md); the module checks the pairs. */
    if (st == PDX_OK)
        st = kvj_get_str(c, s, "ca_file", cfg->store_ca_file,
                         sizeof(cfg->store_ca_file), 1, KVJ_STR_ANY, 0, "");
    if (st == PDX_OK)
        st = kvj_get_str(c, s, "cert_file", cfg->store_cert_file,
                         sizeof(cfg->store_cert_file), 1, KVJ_STR_ANY, 0, "");
    if (st == PDX_OK)
        st = kvj_get_str(c, s, "key_file", cfg->store_key_file,
                         sizeof(cfg->store_key_file), 1, KVJ_STR_ANY, 0, "");
    if (st == PDX_OK)
        st = kvj_get_str(c, s, "user", cfg->store_user, sizeof(cfg->store_user),
                         1, KVJ_STR_ANY, 0, "");
    if (st == PDX_OK)
        st = kvj_get_str(c, s, "password_file", cfg->store_password_file,
                         sizeof(cfg->store_password_file), 1, KVJ_STR_ANY, 0,
                         "");
    if (st != PDX_OK)
        return st;
    cfg->has_store = true;
    kvj_pop(c, old);
    return PDX_OK;
}

static pdx_status_t parse_root(kvj_ctx_t *c, const cJSON *root,
                               pdx_kv_config_t *cfg)
{
    static const char *const keys[] = {"version",   "description", "model",
                                       "parallel",  "kv",          "hashing",
                                       "connector", "agent",       "backends",
                                       "store"};
    uint32_t version;
    if (!cJSON_IsObject(root))
        return kvj_fail_type(c, root, "an object at the top level");
    pdx_status_t st = kvj_check_keys(
        c, root, keys, sizeof(keys) / sizeof(keys[0]), "the file");
    if (st == PDX_OK)
        st = kvj_get_u32(c, root, "version", 1, 1, 0, 1, &version);
    if (st == PDX_OK) {
        /* Free text for people; checked for type only. */
        const cJSON *d = kvj_member(root, "description");
        size_t old = kvj_push_key(c, "description");
        if (d != NULL && !cJSON_IsString(d))
            return kvj_fail_type(c, d, "a string");
        kvj_pop(c, old);
    }
    /* Order matters: each section may check against the ones before. */
    if (st == PDX_OK)
        st = parse_model(c, root, cfg);
    if (st == PDX_OK)
        st = parse_parallel(c, root, cfg);
    if (st == PDX_OK)
        st = parse_kv(c, root, cfg);
    if (st == PDX_OK)
        st = parse_hashing(c, root, cfg);
    if (st == PDX_OK)
        st = parse_agent(c, root, cfg);
    if (st == PDX_OK)
        st = parse_connector(c, root, cfg);
    if (st == PDX_OK)
        st = parse_backends(c, root, cfg);
    if (st == PDX_OK)
        st = parse_store(c, root, cfg);
    return st;
}

/* ---- public ------------------------------------------------------- */

static pdx_status_t config_parse(const char *json, size_t len,
                                 const char *name, pdx_kv_config_t *cfg,
                                 char *err, size_t err_len)
{
    kvj_ctx_t c = {.name = name != NULL ? name : "<memory>",
                   .err = err,
                   .err_len = err_len,
                   .path = "$",
                   .path_len = 1};
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    if (len > PDX_KV_CONFIG_MAX_BYTES)
        return kvj_fail(&c, "%zu bytes, more than the %u a config may have",
                        len, PDX_KV_CONFIG_MAX_BYTES);
    if (len == 0)
        return kvj_fail(&c, "empty file (expected a JSON object)");
    cJSON *root = NULL;
    pdx_status_t st = kvj_parse(&c, json, len, &root);
    if (st != PDX_OK)
        return st;

    pdx_kv_config_t *tmp = calloc(1, sizeof(*tmp));
    if (tmp == NULL) {
        cJSON_Delete(root);
        return kvj_fail_st(&c, PDX_ERR_NOMEM, "out of memory");
    }
    snprintf(tmp->source, sizeof(tmp->source), "%s", c.name);
    st = parse_root(&c, root, tmp);
    cJSON_Delete(root);
    if (st == PDX_OK) {
        *cfg = *tmp;
        for (uint32_t i = 0; i < cfg->nbackend_opts; i++) {
            cfg->backend_opts[i].key = cfg->opt_buf[i][0];
            cfg->backend_opts[i].value = cfg->opt_buf[i][1];
        }
        if (err != NULL && err_len > 0)
            err[0] = '\0';
    }
    free(tmp);
    return st;
}

pdx_status_t pdx_kv_config_parse(const char *json, size_t len, const char *name,
                                 pdx_kv_config_t *cfg, char *err,
                                 size_t err_len)
{
    PDX_ENTER();
    if ((len > 0 && !cfg_arg_ok(json, __func__, "json", err, err_len)) ||
        !cfg_arg_ok(cfg, __func__, "cfg", err, err_len))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(config_parse(json, len, name, cfg, err, err_len));
}

static pdx_status_t config_load(const char *path, pdx_kv_config_t *cfg,
                                char *err, size_t err_len)
{
    kvj_ctx_t c = {.name = path, .err = err, .err_len = err_len};
    if (err != NULL && err_len > 0)
        err[0] = '\0';

    char ebuf[128];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return kvj_fail_st(&c, e == ENOENT ? PDX_ERR_NOT_FOUND : PDX_ERR_IO,
                           "cannot open: %s",
                           strerror_r(e, ebuf, sizeof(ebuf)));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kvj_fail_st(&c, PDX_ERR_IO, "not a regular file");
    }
    if (sb.st_size > (off_t)PDX_KV_CONFIG_MAX_BYTES) {
        close(fd);
        return kvj_fail(&c, "%lld bytes, more than the %u a config may have",
                        (long long)sb.st_size, PDX_KV_CONFIG_MAX_BYTES);
    }
    /* Read to EOF, not to st_size: the file may change under us. */
    size_t cap = (size_t)sb.st_size + 1, len = 0;
    char *buf = malloc(cap);
    pdx_status_t st = PDX_OK;
    if (buf == NULL) {
        close(fd);
        return kvj_fail_st(&c, PDX_ERR_NOMEM, "out of memory");
    }
    for (;;) {
        if (len == cap) {
            if (cap > PDX_KV_CONFIG_MAX_BYTES) {
                st = kvj_fail(&c, "more than the %u bytes a config may have",
                              PDX_KV_CONFIG_MAX_BYTES);
                break;
            }
            char *nb = realloc(buf, cap * 2);
            if (nb == NULL) {
                st = kvj_fail_st(&c, PDX_ERR_NOMEM, "out of memory");
                break;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            st = kvj_fail_st(&c, PDX_ERR_IO, "read failed: %s",
                             strerror_r(e, ebuf, sizeof(ebuf)));
            break;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (st == PDX_OK)
        st = config_parse(buf, len, path, cfg, err, err_len);
    free(buf);
    return st;
}

pdx_status_t pdx_kv_config_load(const char *path, pdx_kv_config_t *cfg,
                                char *err, size_t err_len)
{
    PDX_ENTER();
    if (!cfg_arg_ok(path, __func__, "path", err, err_len) ||
        !cfg_arg_ok(cfg, __func__, "cfg", err, err_len))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(config_load(path, cfg, err, err_len));
}

uint64_t pdx_kv_config_bytes_per_block(const pdx_kv_config_t *cfg)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(cfg, "cfg"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    uint64_t per_token =
        (uint64_t)cfg->num_layers * cfg->mla_bytes_per_token +
        (uint64_t)cfg->n_index_k_layers * cfg->index_k_bytes_per_token +
        (uint64_t)cfg->mtp_layers *
            ((uint64_t)cfg->mla_bytes_per_token + cfg->index_k_bytes_per_token);
    PDX_LEAVE_VAL(PDX_OK, per_token * cfg->block_tokens);
}

uint32_t pdx_kv_config_num_arenas(const pdx_kv_config_t *cfg)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(cfg, "cfg"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    PDX_LEAVE_VAL(PDX_OK,
                 cfg->num_layers + cfg->n_index_k_layers +
                     cfg->mtp_layers *
                         (cfg->index_k_bytes_per_token > 0 ? 2u : 1u));
}

static pdx_status_t add_arena(pdx_layout_h l, const pdx_kv_config_t *cfg,
                              const char *prefix, uint32_t layer,
                              pdx_kv_kind_t kind, int is_mtp, uint32_t bpt)
{
    return pdx_layout_add_layer_arena(
        l, prefix, layer, kind, is_mtp, bpt, cfg->num_blocks, cfg->mem_type,
        cfg->mem_type == PDX_MEM_VRAM ? cfg->device : 0);
}

static pdx_status_t config_layout(const pdx_kv_config_t *cfg,
                                 pdx_layout_h *layout_p)
{
    if (cfg->block_tokens == 0 ||
        cfg->n_index_k_layers > PDX_KV_MAX_INDEX_LAYERS) {
        pdx_error("kv config %.256s: layout: block_tokens %u (must be > 0), "
                  "%u index-K layers (at most %d)",
                  cfg->source, cfg->block_tokens, cfg->n_index_k_layers,
                  PDX_KV_MAX_INDEX_LAYERS);
        return PDX_ERR_INVALID;
    }
    pdx_layout_h l;
    pdx_status_t st = pdx_layout_create(cfg->block_tokens, &l);
    if (st != PDX_OK)
        return st;
    uint32_t next_idx = 0;
    for (uint32_t layer = 0; layer < cfg->num_layers && st == PDX_OK; layer++) {
        st = add_arena(l, cfg, "layer", layer, PDX_KV_KIND_MLA, 0,
                       cfg->mla_bytes_per_token);
        if (st == PDX_OK && next_idx < cfg->n_index_k_layers &&
            cfg->index_k_layers[next_idx] == layer) {
            st = add_arena(l, cfg, "layer", layer, PDX_KV_KIND_INDEX_K, 0,
                           cfg->index_k_bytes_per_token);
            next_idx++;
        }
    }
    /* A list that is not increasing or runs past num_layers (a struct not
     * made by the loader) would silently drop arenas. */
    if (st == PDX_OK && next_idx != cfg->n_index_k_layers) {
        pdx_error("kv config %.256s: layout: index_k_layers is not an "
                  "increasing list below num_layers %u (%u of %u used)",
                  cfg->source, cfg->num_layers, next_idx,
                  cfg->n_index_k_layers);
        st = PDX_ERR_INVALID;
    }
    for (uint32_t i = 0; i < cfg->mtp_layers && st == PDX_OK; i++) {
        uint32_t layer = cfg->num_layers + i;
        st = add_arena(l, cfg, "mtp", layer, PDX_KV_KIND_MLA, 1,
                       cfg->mla_bytes_per_token);
        if (st == PDX_OK && cfg->index_k_bytes_per_token > 0)
            st = add_arena(l, cfg, "mtp", layer, PDX_KV_KIND_INDEX_K, 1,
                           cfg->index_k_bytes_per_token);
    }
    if (st != PDX_OK) {
        pdx_layout_destroy(l);
        return st == PDX_ERR_NOMEM ? st : PDX_ERR_INVALID;
    }
    *layout_p = l;
    return PDX_OK;
}

pdx_status_t pdx_kv_config_layout(const pdx_kv_config_t *cfg,
                                  pdx_layout_h *layout_p)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(cfg, "cfg") || !PDX_ARG_OK(layout_p, "layout_p"))
        PDX_LEAVE(PDX_ERR_INVALID);
    PDX_LEAVE(config_layout(cfg, layout_p));
}

size_t pdx_kv_config_backend_opts(const pdx_kv_config_t *cfg, uint32_t backend,
                                  pdx_option_t *out, size_t max)
{
    PDX_ENTER();
    if (!PDX_ARG_OK(cfg, "cfg"))
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    if (backend >= cfg->nbackends) {
        pdx_error("kv config %.256s: backend index %u out of range (%u "
                  "backends)",
                  cfg->source, backend, cfg->nbackends);
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    }
    size_t n = 0;
    for (uint32_t i = 0; i < cfg->nbackend_opts && i < PDX_KV_MAX_BACKEND_OPTS;
         i++) {
        if (cfg->backend_opt_owner[i] != backend)
            continue;
        if (out != NULL && n < max) {
            out[n].key = cfg->opt_buf[i][0];
            out[n].value = cfg->opt_buf[i][1];
        }
        n++;
    }
    PDX_LEAVE_VAL(PDX_OK, n);
}
