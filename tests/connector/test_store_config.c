/* The `store` section of the connector config: defaults, every key, and
 * errors that name the JSON path; and the store API's argument checks. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <pdx/kv_config.h>
#include <pdx/pdx.h>
#include <pdx/store.h>

/* A valid config with `store` (a JSON object text, or NULL for none) and
 * `peer` (NULL: no agent.peer). */
static pdx_status_t parse(const char *store, const char *peer,
                          pdx_kv_config_t *cfg, char *err, size_t len)
{
    char text[4096];
    snprintf(text, sizeof(text),
             "{\"model\": {\"id\": \"m/x\", \"kv_dtype\": \"fp8\", "
             "\"num_layers\": 2, \"mla_bytes_per_token\": 64},"
             " \"kv\": {\"block_tokens\": 16, \"num_blocks\": 8},"
             " \"hashing\": {\"seed\": \"s\"},"
             " \"agent\": {\"role\": \"consumer\"%s%s%s},"
             " \"connector\": {\"children\": [{\"type\": \"remote\"},"
             "   {\"type\": \"offload\", \"budget_bytes\": \"1MiB\"}]}%s%s}",
             peer ? ", \"peer\": \"" : "", peer ? peer : "",
             peer ? "\"" : "", store ? ", \"store\": " : "",
             store ? store : "");
    return pdx_kv_config_parse(text, strlen(text), "t.json", cfg, err, len);
}

static void test_defaults(void **state)
{
    (void)state;
    pdx_kv_config_t cfg;
    char err[512];
    assert_int_equal(parse(NULL, "p", &cfg, err, sizeof(err)), PDX_OK);
    assert_false(cfg.has_store);
    assert_int_equal(parse("{\"endpoints\": [\"http://10.0.0.1:2379\"]}",
                           NULL, &cfg, err, sizeof(err)),
                     PDX_OK);
    assert_true(cfg.has_store);
    assert_string_equal(cfg.store_type, "etcd");
    assert_string_equal(cfg.store_endpoints, "http://10.0.0.1:2379");
    assert_string_equal(cfg.store_namespace, "pdx");
    assert_int_equal(cfg.store_lease_ttl_ms, 10000);
    assert_int_equal(cfg.store_timeout_ms, 2000);
    assert_int_equal(cfg.store_fetch_timeout_ms, 5000);
    assert_int_equal(cfg.store_max_txn_ops, 128);
    assert_true(cfg.store_registry);
    assert_int_equal(cfg.store_demote_owners, 3);
    assert_true(cfg.store_remote_offload);
    assert_int_equal(cfg.store_remote_offload_timeout_ms, 1000);
    assert_string_equal(cfg.peer_name, ""); /* found by name */
}

static void test_every_key(void **state)
{
    (void)state;
    pdx_kv_config_t cfg;
    char err[512];
    assert_int_equal(
        parse("{\"type\": \"etcd\", \"endpoints\": [\"http://a:1\", "
              "\"https://b:2\"], \"namespace\": \"prod/glm52\", "
              "\"lease_ttl_ms\": 5000, \"timeout_ms\": 300, "
              "\"fetch_timeout_ms\": 0, \"max_txn_ops\": 4096, "
              "\"registry\": false, \"demote_owners\": 2, "
              "\"remote_offload\": false, \"remote_offload_timeout_ms\": 50}",
              "p", &cfg, err, sizeof(err)),
        PDX_OK);
    assert_string_equal(cfg.store_endpoints, "http://a:1,https://b:2");
    assert_string_equal(cfg.store_namespace, "prod/glm52");
    assert_int_equal(cfg.store_lease_ttl_ms, 5000);
    assert_int_equal(cfg.store_max_txn_ops, 4096);
    assert_false(cfg.store_registry);
    assert_int_equal(cfg.store_demote_owners, 2);
    assert_false(cfg.store_remote_offload);
    /* One string with commas works too. */
    assert_int_equal(parse("{\"endpoints\": \"http://a:1,http://b:2\"}", "p",
                           &cfg, err, sizeof(err)),
                     PDX_OK);
    assert_string_equal(cfg.store_endpoints, "http://a:1,http://b:2");
}

static void expect_error(const char *store, const char *path_and_what)
{
    pdx_kv_config_t cfg;
    char err[512];
    assert_int_equal(parse(store, "p", &cfg, err, sizeof(err)),
                     PDX_ERR_CONFIG);
    if (strstr(err, path_and_what) == NULL) {
        print_message("got: %s\nwant: %s\n", err, path_and_what);
    }
    assert_non_null(strstr(err, path_and_what));
}

static void test_errors_name_the_path(void **state)
{
    (void)state;
    expect_error("{}", "$.store.endpoints: missing");
    expect_error("{\"endpoints\": [\"http://a:1\", \"10.0.0.2:2379\"]}",
                 "$.store.endpoints[1]: expected a \"http://host:port\"");
    expect_error("{\"endpoints\": []}", "$.store.endpoints: expected an "
                                        "array of 1 to 8");
    expect_error("{\"endpoints\": 5}", "$.store.endpoints: expected");
    expect_error("{\"endpoints\": \"http://a:1\", \"namespace\": \"x/\"}",
                 "$.store.namespace: expected a string of 1 to 127 bytes");
    expect_error("{\"endpoints\": \"http://a:1\", \"lease_ttl_ms\": 10}",
                 "$.store.lease_ttl_ms: expected an integer from 1000");
    expect_error("{\"endpoints\": \"http://a:1\", \"demote_owners\": 0}",
                 "$.store.demote_owners");
    expect_error("{\"endpoints\": \"http://a:1\", \"registry\": 1}",
                 "$.store.registry: expected true or false");
    expect_error("{\"endpoints\": \"http://a:1\", \"lease_tll_ms\": 5000}",
                 "$.store.lease_tll_ms: unknown key (did you mean "
                 "lease_ttl_ms?)");
    expect_error("[]", "$.store: expected an object");
}

static void test_api_arguments(void **state)
{
    (void)state;
    char buf[64];
    size_t prefix;
    pdx_store_status_t st;
    const char *blocks[] = {"ab"};
    assert_int_equal(pdx_agent_publish(NULL), PDX_ERR_INVALID);
    assert_int_equal(pdx_peer_fetch(NULL, "x", 0), PDX_ERR_INVALID);
    assert_int_equal(pdx_store_status(NULL, &st), PDX_ERR_INVALID);
    assert_int_equal(pdx_store_describe(NULL, buf, sizeof(buf)),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_store_owners_add(NULL, blocks, 1, NULL),
                     PDX_ERR_INVALID);
    assert_int_equal(pdx_store_owners_del(NULL, blocks, 1), PDX_ERR_INVALID);
    assert_int_equal(pdx_store_owners_longest(NULL, blocks, 1, buf, &prefix),
                     PDX_ERR_INVALID);
    assert_non_null(strstr(pdx_last_error(), "agent is NULL"));
    /* An agent without a store: refused, saying how to get one. */
    pdx_agent_h a;
    assert_int_equal(pdx_agent_create("nostore", NULL, &a), PDX_OK);
    assert_int_equal(pdx_store_status(a, &st), PDX_ERR_UNSUPPORTED);
    assert_non_null(strstr(pdx_last_error(), "PDX_AGENT_PARAM_STORE"));
    assert_int_equal(pdx_store_owners_longest(a, blocks, 1, buf, &prefix),
                     PDX_ERR_UNSUPPORTED);
    assert_int_equal(pdx_store_status(a, NULL), PDX_ERR_INVALID);
    pdx_agent_destroy(a);
    /* A store without endpoints, or a module that does not exist. */
    pdx_agent_params_t ap = {.field_mask = PDX_AGENT_PARAM_STORE};
    assert_int_equal(pdx_agent_create("bad", &ap, &a), PDX_ERR_INVALID);
    assert_non_null(strstr(pdx_last_error(), "store_endpoints"));
    ap.store_endpoints = "http://127.0.0.1:1";
    ap.store = "nosuch";
    assert_int_equal(pdx_agent_create("bad", &ap, &a), PDX_ERR_NOT_FOUND);
    assert_non_null(strstr(pdx_last_error(), "libpdx_store_nosuch.so"));
    ap.store = "etcd";
    ap.store_endpoints = "127.0.0.1:2379"; /* no scheme */
    assert_int_equal(pdx_agent_create("bad", &ap, &a), PDX_ERR_CONFIG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_key),
        cmocka_unit_test(test_errors_name_the_path),
        cmocka_unit_test(test_api_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
