/* JSON config loader: the shipped GLM-5.2 configs load with the right shape,
 * and every kind of bad config is refused with a message naming the file,
 * the JSON path and what was expected. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include <pdx/agent.h> /* pdx_path_policy_t */
#include <pdx/kv_config.h>
#include <pdx/kv_layout.h>

#define CFG_DIR PDX_SOURCE_DIR "/configs/glm52-fp8-mtp/"

static const uint32_t GLM52_INDEX_LAYERS[21] = {0,  1,  2,  6,  10, 14, 18,
                                                22, 26, 30, 34, 38, 42, 46,
                                                50, 54, 58, 62, 66, 70, 74};

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* `text` with the first `from` replaced by `to` (which must be there). */
static char *replace(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    if (at == NULL)
        fail_msg("'%s' not in the base config", from);
    size_t pre = (size_t)(at - text), fl = strlen(from), tl = strlen(to);
    size_t rest = strlen(at + fl);
    char *out = malloc(pre + tl + rest + 1);
    assert_non_null(out);
    memcpy(out, text, pre);
    memcpy(out + pre, to, tl);
    memcpy(out + pre + tl, at + fl, rest + 1);
    return out;
}

static pdx_status_t parse_text(const char *text, pdx_kv_config_t *cfg,
                               char *err, size_t err_len)
{
    return pdx_kv_config_parse(text, strlen(text), "bad.json", cfg, err,
                               err_len);
}

/* Parses `base` with `from` replaced by `to`: it must fail with `want` and
 * a message holding every string of the NULL-terminated list, and leave
 * the output untouched. */
static void expect_bad(const char *base, const char *from, const char *to,
                       pdx_status_t want, ...)
{
    char *text = replace(base, from, to);
    pdx_kv_config_t cfg, before;
    memset(&cfg, 0xA5, sizeof(cfg));
    memcpy(&before, &cfg, sizeof(cfg));
    char err[512];
    pdx_status_t st = parse_text(text, &cfg, err, sizeof(err));
    if (st != want)
        fail_msg("'%s' -> '%s': status %d, want %d; message: %s", from, to, st,
                 want, err);
    assert_memory_equal(&cfg, &before, sizeof(cfg));
    assert_true(strncmp(err, "bad.json: ", 10) == 0);
    va_list ap;
    va_start(ap, want);
    for (const char *s = va_arg(ap, const char *); s != NULL;
         s = va_arg(ap, const char *))
        if (strstr(err, s) == NULL)
            fail_msg("message lacks '%s': %s", s, err);
    va_end(ap);
    free(text);
}

static void check_glm52_shape(const pdx_kv_config_t *cfg)
{
    assert_string_equal(cfg->model_id, "zai-org/GLM-5.2-FP8");
    assert_string_equal(cfg->kv_dtype, "fp8_ds_mla");
    assert_int_equal(cfg->num_layers, 78);
    assert_int_equal(cfg->mla_bytes_per_token, 656);
    assert_int_equal(cfg->index_k_bytes_per_token, 132);
    assert_int_equal(cfg->n_index_k_layers, 21);
    assert_memory_equal(cfg->index_k_layers, GLM52_INDEX_LAYERS,
                        sizeof(GLM52_INDEX_LAYERS));
    assert_int_equal(cfg->mtp_layers, 1);
    assert_int_equal(cfg->block_tokens, 64);
    assert_int_equal(cfg->bytes_per_block, 3502592);
    assert_int_equal(pdx_kv_config_bytes_per_block(cfg), 3502592);
    /* 78 MLA + 21 index-K + MTP (MLA and index-K) */
    assert_int_equal(pdx_kv_config_num_arenas(cfg), 101);
    assert_string_equal(cfg->hash_algo, "xxhash_cbor");
    assert_string_equal(cfg->hash_seed, "glm52-pd");

    /* The generated layout is the reference GLM-5.2 layout. */
    pdx_layout_h l, ref;
    assert_int_equal(pdx_kv_config_layout(cfg, &l), PDX_OK);
    assert_int_equal(
        pdx_layout_glm52(cfg->num_blocks, cfg->mem_type, cfg->device, &ref),
        PDX_OK);
    assert_int_equal(pdx_layout_num_arenas(l), 101);
    assert_int_equal(pdx_layout_bytes_per_block(l), 3502592);
    assert_int_equal(pdx_layout_num_blocks(l), cfg->num_blocks);
    assert_int_equal(pdx_layout_mem_type(l), cfg->mem_type);
    assert_int_equal(pdx_layout_fingerprint(l), pdx_layout_fingerprint(ref));
    for (size_t i = 0; i < 101; i++) {
        pdx_arena_t a, b;
        assert_int_equal(pdx_layout_get_arena(l, i, &a), PDX_OK);
        assert_int_equal(pdx_layout_get_arena(ref, i, &b), PDX_OK);
        assert_string_equal(a.name, b.name);
        assert_int_equal(a.dev_id, b.dev_id);
    }
    pdx_layout_destroy(l);
    pdx_layout_destroy(ref);
}

static void load_ok(const char *file, pdx_kv_config_t *cfg)
{
    char path[512], err[512] = "x";
    snprintf(path, sizeof(path), "%s%s", CFG_DIR, file);
    pdx_status_t st = pdx_kv_config_load(path, cfg, err, sizeof(err));
    if (st != PDX_OK)
        fail_msg("%s: status %d: %s", file, st, err);
    assert_string_equal(err, "");
    assert_string_equal(cfg->source, path);
    check_glm52_shape(cfg);
}

static void test_shipped_production(void **state)
{
    (void)state;
    pdx_kv_config_t p, d;
    load_ok("prefill.json", &p);
    load_ok("decode.json", &d);

    assert_int_equal(p.role, PDX_KV_ROLE_PRODUCER);
    assert_string_equal(p.agent_name, "glm52-p-dp0");
    assert_string_equal(p.peer_name, "glm52-d-dp0");
    assert_int_equal(d.role, PDX_KV_ROLE_CONSUMER);
    assert_string_equal(d.agent_name, "glm52-d-dp0");
    assert_string_equal(d.peer_name, "glm52-p-dp0");
    assert_true(p.peer_address[0] != '\0' && d.peer_address[0] != '\0');

    const pdx_kv_config_t *both[] = {&p, &d};
    for (int i = 0; i < 2; i++) {
        const pdx_kv_config_t *c = both[i];
        assert_int_equal(c->dp_size, 8);
        assert_int_equal(c->dp_rank, 0);
        assert_int_equal(c->tp_size, 1);
        assert_int_equal(c->mem_type, PDX_MEM_VRAM);
        assert_int_equal(c->num_blocks, 8192);
        assert_int_equal(c->nchildren, 2);
        assert_int_equal(c->children[0].type, PDX_KV_CHILD_REMOTE);
        assert_int_equal(c->children[0].lease_ms, 30000);
        assert_int_equal(c->children[0].heartbeat_ms, 2000);
        assert_int_equal(c->children[0].failure_policy, PDX_KV_FAIL_RECOMPUTE);
        assert_true(c->children[0].load_tail);
        assert_int_equal(c->children[1].type, PDX_KV_CHILD_OFFLOAD);
        assert_int_equal(c->children[1].budget_bytes, 256ull << 30);
        assert_int_equal(c->children[1].ranks_per_host, 8);
        assert_true(c->children[1].save_tail);
        assert_int_equal(c->nbackends, 2);
        assert_string_equal(c->backends[0], "ucx");
        assert_string_equal(c->backends[1], "cuda_ipc");
    }
    assert_int_equal(p.children[1].mode, PDX_KV_OFFLOAD_READ_WRITE);
    assert_true(p.children[1].wait_for_full_prefix);
    assert_int_equal(d.children[1].mode, PDX_KV_OFFLOAD_SAVE_ONLY);
    assert_false(d.children[1].wait_for_full_prefix);
}

static void test_shipped_colocated(void **state)
{
    (void)state;
    pdx_kv_config_t p, d;
    load_ok("colocated-prefill.json", &p);
    load_ok("colocated-decode.json", &d);
    assert_int_equal(p.role, PDX_KV_ROLE_PRODUCER);
    assert_int_equal(d.role, PDX_KV_ROLE_CONSUMER);
    assert_string_equal(p.peer_name, d.agent_name);
    assert_string_equal(d.peer_name, p.agent_name);
    const pdx_kv_config_t *both[] = {&p, &d};
    for (int i = 0; i < 2; i++) {
        const pdx_kv_config_t *c = both[i];
        assert_int_equal(c->dp_size, 1);
        assert_int_equal(c->mem_type, PDX_MEM_DRAM);
        assert_int_equal(c->device, 0);
        /* Small enough for a 2-core, 24 GiB CI host running P and D. */
        assert_true((uint64_t)c->num_blocks * c->bytes_per_block <
                    (1ull << 30));
        assert_true(c->children[1].budget_bytes <= (1ull << 30));
        assert_int_equal(c->children[1].ranks_per_host, 1);
        /* UCX for notifications and other hosts, cma for same-host data. */
        assert_int_equal(c->nbackends, 2);
        assert_string_equal(c->backends[0], "ucx");
        assert_string_equal(c->backends[1], "cma");
        assert_int_equal(c->nbackend_opts, 1);
        assert_string_equal(c->backend_opts[0].key, "tls");
        assert_string_equal(c->backend_opts[0].value, "sm");
        assert_ptr_equal(c->backend_opts[0].key, c->opt_buf[0][0]);
    }
    assert_int_equal(p.children[1].mode, PDX_KV_OFFLOAD_READ_WRITE);
    assert_int_equal(d.children[1].mode, PDX_KV_OFFLOAD_SAVE_ONLY);
}

/* Seeds and layouts differ between P and D by editing one value: loading
 * works, and the difference shows where connect will compare it. */
static void test_changed_seed_and_layout_load(void **state)
{
    (void)state;
    char *base = slurp(CFG_DIR "colocated-decode.json");
    pdx_kv_config_t ref, cfg;
    char err[512];
    assert_int_equal(parse_text(base, &ref, err, sizeof(err)), PDX_OK);

    char *t = replace(base, "\"seed\": \"glm52-pd\"", "\"seed\": \"other\"");
    assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
    assert_string_equal(cfg.hash_seed, "other");
    free(t);

    /* vLLM accepts any PYTHONHASHSEED string, the empty one included. */
    t = replace(base, "\"seed\": \"glm52-pd\"", "\"seed\": \"\"");
    assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
    assert_string_equal(cfg.hash_seed, "");
    free(t);

    /* A different shape: drop the bytes_per_block check along with it. */
    char *t1 = replace(base, "\"mla_bytes_per_token\": 656",
                       "\"mla_bytes_per_token\": 576");
    t = replace(t1, "\"bytes_per_block\": 3502592,", "");
    assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
    assert_int_equal(cfg.bytes_per_block,
                     (78ull * 576 + 21 * 132 + (576 + 132)) * 64);
    pdx_layout_h a, b;
    assert_int_equal(pdx_kv_config_layout(&ref, &a), PDX_OK);
    assert_int_equal(pdx_kv_config_layout(&cfg, &b), PDX_OK);
    assert_true(pdx_layout_fingerprint(a) != pdx_layout_fingerprint(b));
    pdx_layout_destroy(a);
    pdx_layout_destroy(b);
    free(t);
    free(t1);

    t = replace(base, "\"block_tokens\": 64", "\"block_tokens\": 32");
    t1 = replace(t, "\"bytes_per_block\": 3502592,", "");
    assert_int_equal(parse_text(t1, &cfg, err, sizeof(err)), PDX_OK);
    assert_int_equal(cfg.bytes_per_block, 3502592 / 2);
    free(t);
    free(t1);
    free(base);
}

static void test_defaults_and_forms(void **state)
{
    (void)state;
    char *base = slurp(CFG_DIR "colocated-prefill.json");
    pdx_kv_config_t cfg;
    char err[512];

    /* Explicit IndexShare list == "indexshare". */
    char *t = replace(base, "\"indexshare\"",
                      "[0, 1, 2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, "
                      "50, 54, 58, 62, 66, 70, 74]");
    assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
    check_glm52_shape(&cfg);
    free(t);

    /* Default agent name from the model id, role and rank. */
    t = replace(base, "\"name\": \"glm52-p-dp0\",", "");
    assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
    assert_string_equal(cfg.agent_name, "glm52-p-dp0");
    assert_int_equal(cfg.path_policy, PDX_PATH_POLICY_ANY);
    free(t);

    /* The path policies, by name. */
    static const struct {
        const char *name;
        uint32_t policy;
    } pol[] = {{"any", PDX_PATH_POLICY_ANY},
               {"same_host_fast", PDX_PATH_POLICY_SAME_HOST_FAST},
               {"native", PDX_PATH_POLICY_NATIVE}};
    for (size_t i = 0; i < sizeof(pol) / sizeof(pol[0]); i++) {
        char to[96];
        snprintf(to, sizeof(to),
                 "\"name\": \"glm52-p-dp0\", \"path_policy\": \"%s\",",
                 pol[i].name);
        t = replace(base, "\"name\": \"glm52-p-dp0\",", to);
        assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
        assert_int_equal(cfg.path_policy, pol[i].policy);
        free(t);
    }

    /* Minimal file: every optional key takes its default. */
    static const char *minimal =
        "{\"model\": {\"id\": \"m\", \"kv_dtype\": \"bf16\", "
        "\"num_layers\": 2, \"mla_bytes_per_token\": 100},"
        " \"kv\": {\"block_tokens\": 16, \"num_blocks\": 4},"
        " \"hashing\": {\"seed\": \"\"},"
        " \"agent\": {\"role\": \"both\"},"
        " \"connector\": {\"children\": [{\"type\": \"offload\","
        " \"budget_bytes\": 3200}]}}";
    assert_int_equal(parse_text(minimal, &cfg, err, sizeof(err)), PDX_OK);
    assert_int_equal(cfg.role, PDX_KV_ROLE_BOTH);
    assert_string_equal(cfg.agent_name, "m-pd-dp0");
    assert_string_equal(cfg.peer_name, "");
    assert_string_equal(cfg.hash_algo, "sha256_cbor");
    assert_int_equal(cfg.dp_size, 1);
    assert_int_equal(cfg.tp_size, 1);
    assert_int_equal(cfg.mem_type, PDX_MEM_DRAM);
    assert_int_equal(cfg.n_index_k_layers, 0);
    assert_int_equal(cfg.mtp_layers, 0);
    assert_int_equal(cfg.bytes_per_block, 3200);
    assert_int_equal(pdx_kv_config_num_arenas(&cfg), 2);
    assert_int_equal(cfg.nchildren, 1);
    assert_int_equal(cfg.children[0].mode, PDX_KV_OFFLOAD_READ_WRITE);
    assert_int_equal(cfg.children[0].ranks_per_host, 1);
    assert_int_equal(cfg.children[0].wait_timeout_ms, 2000);
    assert_false(cfg.children[0].wait_for_full_prefix);
    assert_true(cfg.children[0].save_tail);
    assert_int_equal(cfg.nbackends, 1);
    assert_string_equal(cfg.backends[0], "ucx");
    assert_int_equal(cfg.nbackend_opts, 0);
    assert_string_equal(cfg.source, "bad.json");

    /* Byte counts: integers and strings with units. */
    static const struct {
        const char *text;
        uint64_t bytes;
    } sizes[] = {
        {"\"1GiB\"", 1ull << 30},       {"\"512 MiB\"", 512ull << 20},
        {"\"100GB\"", 100000000000ull}, {"\"4194304\"", 4194304},
        {"\"1tib\"", 1ull << 40},       {"8388608", 8388608},
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        char to[64];
        snprintf(to, sizeof(to), "\"budget_bytes\": %s", sizes[i].text);
        t = replace(base, "\"budget_bytes\": \"1GiB\"", to);
        pdx_status_t st = parse_text(t, &cfg, err, sizeof(err));
        if (st != PDX_OK)
            fail_msg("%s: %s", sizes[i].text, err);
        assert_int_equal(cfg.children[1].budget_bytes, sizes[i].bytes);
        free(t);
    }
    free(base);
}

static void test_backend_opts(void **state)
{
    (void)state;
    char *base = slurp(CFG_DIR "colocated-prefill.json");
    char *t = replace(
        base, "{ \"name\": \"ucx\", \"options\": { \"tls\": \"sm\" } }",
        "{\"name\": \"ucx\", \"options\": {\"tls\": \"sm\", "
        "\"max_chunk\": \"1m\"}}, {\"name\": \"cuda_ipc\", \"options\": "
        "{\"streams\": 4}}, {\"name\": \"mock\", \"options\": {\"on\": true}}");
    pdx_kv_config_t cfg;
    char err[512];
    assert_int_equal(parse_text(t, &cfg, err, sizeof(err)), PDX_OK);
    assert_int_equal(cfg.nbackends, 4); /* the file's cma comes last */
    assert_string_equal(cfg.backends[3], "cma");
    assert_int_equal(cfg.nbackend_opts, 4);

    /* A copy has stale backend_opts pointers; the accessor does not. */
    pdx_kv_config_t *copy = malloc(sizeof(*copy));
    assert_non_null(copy);
    memcpy(copy, &cfg, sizeof(cfg));
    memset(&cfg, 0, sizeof(cfg));
    pdx_option_t kv[8];
    assert_int_equal(pdx_kv_config_backend_opts(copy, 0, kv, 8), 2);
    assert_string_equal(kv[0].key, "tls");
    assert_string_equal(kv[0].value, "sm");
    assert_string_equal(kv[1].key, "max_chunk");
    assert_string_equal(kv[1].value, "1m");
    assert_ptr_equal(kv[0].key, copy->opt_buf[0][0]);
    assert_int_equal(pdx_kv_config_backend_opts(copy, 1, kv, 8), 1);
    assert_string_equal(kv[0].key, "streams");
    assert_string_equal(kv[0].value, "4");
    assert_int_equal(pdx_kv_config_backend_opts(copy, 2, kv, 8), 1);
    assert_string_equal(kv[0].value, "true");
    assert_int_equal(pdx_kv_config_backend_opts(copy, 3, kv, 8), 0);
    assert_int_equal(pdx_kv_config_backend_opts(copy, 0, NULL, 0), 2);
    free(copy);
    free(t);
    free(base);
}

static void test_bad_keys_and_types(void **state)
{
    (void)state;
    char *p = slurp(CFG_DIR "colocated-prefill.json");
    expect_bad(p, "\"budget_bytes\"", "\"budgt\"", PDX_ERR_CONFIG,
               "$.connector.children[1].budgt: unknown key", "budget_bytes",
               NULL);
    expect_bad(p, "\"model\"", "\"modle\"", PDX_ERR_CONFIG,
               "$.modle: unknown key (did you mean model?)", NULL);
    expect_bad(p, "\"tp_rank\": 0", "\"tp_rank\": 0, \"pp_size\": 2",
               PDX_ERR_CONFIG, "$.parallel.pp_size: unknown key", NULL);
    expect_bad(p, "\"lease_ms\"", "\"mode\"", PDX_ERR_CONFIG,
               "$.connector.children[0].mode: unknown key", "\"remote\" child",
               NULL);
    expect_bad(p, "\"tls\": \"sm\"", "\"tls\": \"sm\", \"a b\": \"1\"",
               PDX_ERR_CONFIG, "$.backends[0].options[\"a b\"]", NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": \"256\"",
               PDX_ERR_CONFIG, "$.kv.num_blocks: expected a positive integer",
               "got string \"256\"", NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": 2.5", PDX_ERR_CONFIG,
               "$.kv.num_blocks: expected a positive integer", "got number 2.5",
               NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": -1", PDX_ERR_CONFIG,
               "$.kv.num_blocks", "got number -1", NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": 1e300",
               PDX_ERR_CONFIG, "$.kv.num_blocks", NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": 5000000000",
               PDX_ERR_CONFIG, "$.kv.num_blocks", "up to 4294967295",
               "got number 5000000000", NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": null", PDX_ERR_CONFIG,
               "$.kv.num_blocks", "got null", NULL);
    expect_bad(p, "\"load_tail\": true", "\"load_tail\": 1", PDX_ERR_CONFIG,
               "$.connector.children[0].load_tail: expected true or false, "
               "got number 1",
               NULL);
    expect_bad(p, "\"parallel\": {", "\"parallel\": [], \"x\": {",
               PDX_ERR_CONFIG, "$.x: unknown key", NULL);
    expect_bad(p, "\"dp_size\": 1,", "\"dp_size\": 1, \"dp_size\": 2,",
               PDX_ERR_CONFIG, "$.parallel.dp_size: key given twice", NULL);
    expect_bad(p, "\"version\": 1", "\"version\": 2", PDX_ERR_CONFIG,
               "$.version", NULL);
    expect_bad(p, "\"role\": \"producer\"", "\"role\": \"prefill\"",
               PDX_ERR_CONFIG,
               "$.agent.role: expected one of \"producer\", \"consumer\", "
               "\"both\", got string \"prefill\"",
               NULL);
    expect_bad(p, "\"name\": \"glm52-p-dp0\"", "\"name\": \"glm52 p\"",
               PDX_ERR_CONFIG, "$.agent.name", "[A-Za-z0-9._-]", NULL);
    expect_bad(p, "\"name\": \"glm52-p-dp0\",",
               "\"name\": \"glm52-p-dp0\", \"path_policy\": \"fast\",",
               PDX_ERR_CONFIG,
               "$.agent.path_policy: expected one of \"any\", "
               "\"same_host_fast\", \"native\"",
               NULL);
    expect_bad(p, "\"children\": [", "\"children\": {}, \"c\": [",
               PDX_ERR_CONFIG, "$.connector.c: unknown key", NULL);
    free(p);
}

static void test_bad_values(void **state)
{
    (void)state;
    char *p = slurp(CFG_DIR "colocated-prefill.json");
    char *prod = slurp(CFG_DIR "prefill.json");
    expect_bad(p, "\"budget_bytes\": \"1GiB\"", "\"budget_bytes\": 1024",
               PDX_ERR_CONFIG,
               "$.connector.children[1].budget_bytes: 1024 is smaller than "
               "one block (3502592 bytes)",
               NULL);
    expect_bad(prod, "\"budget_bytes\": \"256GiB\"",
               "\"budget_bytes\": \"16MiB\"", PDX_ERR_CONFIG,
               "$.connector.children[1].budget_bytes: 16777216 over 8 ranks "
               "per host is 2097152 bytes per rank, smaller than one block "
               "(3502592 bytes)",
               NULL);
    expect_bad(p, "\"budget_bytes\": \"1GiB\"", "\"budget_bytes\": \"1.5GiB\"",
               PDX_ERR_CONFIG, "$.connector.children[1].budget_bytes",
               "like \"64GiB\"", NULL);
    expect_bad(p, "\"budget_bytes\": \"1GiB\"",
               "\"budget_bytes\": \"99999999999TiB\"", PDX_ERR_CONFIG,
               "budget_bytes", NULL);
    expect_bad(p, "\"budget_bytes\": \"1GiB\",", "", PDX_ERR_CONFIG,
               "$.connector.children[1].budget_bytes: missing", NULL);
    expect_bad(p, "\"num_blocks\": 256", "\"num_blocks\": 0", PDX_ERR_CONFIG,
               "$.kv.num_blocks: expected a positive integer", "got number 0",
               NULL);
    expect_bad(p, "\"peer\": \"glm52-d-dp0\",", "", PDX_ERR_CONFIG,
               "$.agent.peer: missing (required for role producer", NULL);
    char *d = slurp(CFG_DIR "decode.json");
    expect_bad(d, "\"peer\": \"glm52-p-dp0\",", "", PDX_ERR_CONFIG,
               "$.agent.peer: missing (required for role consumer", NULL);
    free(d);
    /* "both" needs a peer only for a remote child. */
    expect_bad(p, "\"peer\": \"glm52-d-dp0\",", "", PDX_ERR_CONFIG,
               "$.agent.peer", NULL);
    char *t = replace(p, "\"role\": \"producer\"", "\"role\": \"both\"");
    expect_bad(t, "\"peer\": \"glm52-d-dp0\",", "", PDX_ERR_CONFIG,
               "$.agent.peer: missing (required by the \"remote\" child", NULL);
    free(t);
    expect_bad(p, "\"peer\": \"glm52-d-dp0\"", "\"peer\": \"glm52-p-dp0\"",
               PDX_ERR_CONFIG, "$.agent.peer", "own name", NULL);
    expect_bad(p, "\"bytes_per_block\": 3502592",
               "\"bytes_per_block\": 3502000", PDX_ERR_CONFIG,
               "$.kv.bytes_per_block: 3502000 does not match the model's "
               "layout: 3502592 bytes",
               NULL);
    expect_bad(p, "\"xxhash_cbor\"", "\"sha256\"", PDX_ERR_CONFIG,
               "$.hashing.algorithm: expected one of \"xxhash_cbor\", "
               "\"sha256_cbor\", got string \"sha256\"",
               NULL);
    expect_bad(p, "\"seed\": \"glm52-pd\"", "\"seed\": 42", PDX_ERR_CONFIG,
               "$.hashing.seed", "got number 42", NULL);
    expect_bad(p, ", \"seed\": \"glm52-pd\"", "", PDX_ERR_CONFIG,
               "$.hashing.seed: missing", NULL);
    expect_bad(p, "\"dp_rank\": 0", "\"dp_rank\": 1", PDX_ERR_CONFIG,
               "$.parallel.dp_rank: 1 is not below dp_size (1)", NULL);
    expect_bad(p, "\"tp_size\": 1, \"tp_rank\": 0",
               "\"tp_size\": 2, \"tp_rank\": 2", PDX_ERR_CONFIG,
               "$.parallel.tp_rank: 2 is not below tp_size (2)", NULL);
    expect_bad(p, "\"indexshare\"", "[0, 1, 78]", PDX_ERR_CONFIG,
               "$.model.index_k_layers[2]: expected a layer number from 0 "
               "to 77",
               NULL);
    expect_bad(p, "\"indexshare\"", "[0, 2, 1]", PDX_ERR_CONFIG,
               "$.model.index_k_layers[2]: layer 1 after 2", NULL);
    expect_bad(p, "\"indexshare\"", "\"every4\"", PDX_ERR_CONFIG,
               "$.model.index_k_layers", "\"indexshare\"", NULL);
    expect_bad(p, "\"index_k_bytes_per_token\": 132,", "", PDX_ERR_CONFIG,
               "$.model.index_k_layers: 21 index-K layers listed", NULL);
    expect_bad(p, "\"recompute\"", "\"retry\"", PDX_ERR_CONFIG,
               "$.connector.children[0].failure_policy: expected one of "
               "\"recompute\", \"fail\", got string \"retry\"",
               NULL);
    expect_bad(p, "\"mode\": \"read_write\"", "\"mode\": \"rw\"",
               PDX_ERR_CONFIG,
               "$.connector.children[1].mode: expected one of "
               "\"read_write\", \"save_only\", \"load_only\"",
               NULL);
    expect_bad(p, "\"mode\": \"read_write\"", "\"mode\": \"save_only\"",
               PDX_ERR_CONFIG,
               "$.connector.children[1].wait_for_full_prefix: true, but mode "
               "save_only never loads",
               NULL);
    expect_bad(p, "\"type\": \"offload\"", "\"type\": \"remote\"",
               PDX_ERR_CONFIG, "$.connector.children[1].type",
               "a second \"remote\" child", NULL);
    expect_bad(p, "\"type\": \"multi\"", "\"type\": \"single\"", PDX_ERR_CONFIG,
               "$.connector.type", NULL);
    expect_bad(p, "\"heartbeat_ms\": 1000", "\"heartbeat_ms\": 30000",
               PDX_ERR_CONFIG,
               "$.connector.children[0].heartbeat_ms: 30000 is not below "
               "lease_ms (30000)",
               NULL);
    expect_bad(p, "\"ranks_per_host\": 1", "\"ranks_per_host\": 2",
               PDX_ERR_CONFIG, "$.connector.children[1].ranks_per_host",
               "up to 1", NULL);
    expect_bad(p, "\"memory\": \"dram\"", "\"memory\": \"hbm\"", PDX_ERR_CONFIG,
               "$.kv.memory", NULL);
    expect_bad(p, "{ \"name\": \"ucx\"",
               "{ \"name\": \"ucx\" }, { \"name\": \"ucx\"", PDX_ERR_CONFIG,
               "$.backends[1].name", "listed twice", NULL);
    expect_bad(p, "\"backends\": [", "\"backends\": [], \"z\": [",
               PDX_ERR_CONFIG, "$.z: unknown key", NULL);
    char *b1 = replace(p, "\"block_tokens\": 64", "\"block_tokens\": 65536");
    char *big = replace(b1, "\"bytes_per_block\": 3502592,", "");
    free(b1);
    expect_bad(big, "\"num_blocks\": 256", "\"num_blocks\": 4294967295",
               PDX_ERR_CONFIG,
               "$.kv.num_blocks: 4294967295 blocks of 3586654208 bytes "
               "exceed 2^62",
               NULL);
    free(big);
    free(prod);
    free(p);
}

static void test_bad_text(void **state)
{
    (void)state;
    char *p = slurp(CFG_DIR "colocated-prefill.json");
    /* Line 4 of the file: a missing comma after "id". */
    expect_bad(p, "\"zai-org/GLM-5.2-FP8\",", "\"zai-org/GLM-5.2-FP8\"",
               PDX_ERR_CONFIG,
               "line 6, column 5: JSON syntax error near '\"kv_dtype\": "
               "\"fp8'",
               NULL);
    expect_bad(p, "\"version\": 1,", "\"version\": 1,,", PDX_ERR_CONFIG,
               "line 2", "JSON syntax error", NULL);
    expect_bad(p, "\"version\": 1,", "\"version\": 1, \"s\": \"\xff\"",
               PDX_ERR_CONFIG, "line 2, column 23: invalid UTF-8", NULL);
    expect_bad(p, "glm52-pd", "glm52\\u0000pd", PDX_ERR_CONFIG, "\\u0000",
               NULL);
    expect_bad(p, "glm52-pd", "glm52\tpd", PDX_ERR_CONFIG,
               "raw control character", NULL);
    free(p);

    pdx_kv_config_t cfg;
    char err[512];
    const char *trunc = "{\"model\": {\"id\": \"x\"";
    assert_int_equal(pdx_kv_config_parse(trunc, strlen(trunc), "t.json", &cfg,
                                         err, sizeof(err)),
                     PDX_ERR_CONFIG);
    assert_non_null(strstr(err, "t.json: line 1"));
    assert_non_null(strstr(err, "ends early"));
    assert_int_equal(
        pdx_kv_config_parse("{} {}", 5, "t.json", &cfg, err, sizeof(err)),
        PDX_ERR_CONFIG);
    assert_non_null(strstr(err, "text after the top-level value"));
    assert_int_equal(
        pdx_kv_config_parse("[1]", 3, "t.json", &cfg, err, sizeof(err)),
        PDX_ERR_CONFIG);
    assert_non_null(
        strstr(err, "t.json: $: expected an object at the top level, got "
                    "array"));
    assert_int_equal(
        pdx_kv_config_parse("", 0, "t.json", &cfg, err, sizeof(err)),
        PDX_ERR_CONFIG);
    assert_non_null(strstr(err, "empty"));
    assert_int_equal(
        pdx_kv_config_parse("{}\0", 3, "t.json", &cfg, err, sizeof(err)),
        PDX_ERR_CONFIG);
    assert_non_null(strstr(err, "NUL byte"));
    assert_int_equal(
        pdx_kv_config_parse("{}", 2, "t.json", &cfg, err, sizeof(err)),
        PDX_ERR_CONFIG);
    assert_non_null(strstr(err, "t.json: $.model: missing"));

    /* Deep nesting stops at cJSON's limit, cleanly. */
    size_t depth = 5000;
    char *deep = malloc(2 * depth + 1);
    assert_non_null(deep);
    memset(deep, '[', depth);
    memset(deep + depth, ']', depth);
    deep[2 * depth] = '\0';
    assert_int_equal(parse_text(deep, &cfg, err, sizeof(err)), PDX_ERR_CONFIG);
    free(deep);

    /* A tiny error buffer is cut, never overrun; NULL err is fine. */
    char small[8];
    memset(small, 'x', sizeof(small));
    assert_int_equal(pdx_kv_config_parse("[", 1, "t.json", &cfg, small, 5),
                     PDX_ERR_CONFIG);
    assert_string_equal(small, "t.js");
    assert_int_equal(small[5], 'x');
    assert_int_equal(pdx_kv_config_parse("[", 1, "t.json", &cfg, NULL, 0),
                     PDX_ERR_CONFIG);
    assert_int_equal(pdx_kv_config_parse("{}", 2, "t", NULL, err, sizeof(err)),
                     PDX_ERR_INVALID);
}

static void test_files(void **state)
{
    (void)state;
    pdx_kv_config_t cfg;
    char err[512];
    const char *missing = PDX_SOURCE_DIR "/configs/no-such-dir/x.json";
    assert_int_equal(pdx_kv_config_load(missing, &cfg, err, sizeof(err)),
                     PDX_ERR_NOT_FOUND);
    assert_true(strncmp(err, missing, strlen(missing)) == 0);
    assert_non_null(strstr(err, "cannot open: No such file or directory"));
    assert_int_equal(
        pdx_kv_config_load(PDX_SOURCE_DIR "/configs", &cfg, err, sizeof(err)),
        PDX_ERR_IO);
    assert_non_null(strstr(err, "/configs: not a regular file"));
    assert_int_equal(pdx_kv_config_load(NULL, &cfg, err, sizeof(err)),
                     PDX_ERR_INVALID);

    /* An unreadable file (skipped as root, who reads anything). */
    char tmpl[] = "/tmp/pdx-kv-config-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "{}", 2), 2);
    close(fd);
    assert_int_equal(chmod(tmpl, 0), 0);
    if (geteuid() != 0) {
        assert_int_equal(pdx_kv_config_load(tmpl, &cfg, err, sizeof(err)),
                         PDX_ERR_IO);
        assert_non_null(strstr(err, "Permission denied"));
    }
    unlink(tmpl);
}

/* The example in configs/README.md loads, with the defaults it claims. */
static void test_readme_example(void **state)
{
    (void)state;
    char *md = slurp(PDX_SOURCE_DIR "/configs/README.md");
    char *start = strstr(md, "```json\n");
    assert_non_null(start);
    start += 8;
    char *end = strstr(start, "```");
    assert_non_null(end);
    pdx_kv_config_t cfg;
    char err[512];
    pdx_status_t st = pdx_kv_config_parse(start, (size_t)(end - start),
                                          "README.md", &cfg, err, sizeof(err));
    if (st != PDX_OK)
        fail_msg("%s", err);
    check_glm52_shape(&cfg);
    assert_string_equal(cfg.agent_name, "glm52-d-dp0");
    assert_int_equal(cfg.role, PDX_KV_ROLE_CONSUMER);
    assert_int_equal(cfg.children[0].lease_ms, 30000);
    assert_int_equal(cfg.children[1].mode, PDX_KV_OFFLOAD_SAVE_ONLY);
    free(md);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_production),
        cmocka_unit_test(test_shipped_colocated),
        cmocka_unit_test(test_changed_seed_and_layout_load),
        cmocka_unit_test(test_defaults_and_forms),
        cmocka_unit_test(test_backend_opts),
        cmocka_unit_test(test_bad_keys_and_types),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_bad_text),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_readme_example),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
