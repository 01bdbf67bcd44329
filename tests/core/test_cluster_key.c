/* Cluster key (issue 21 item 2): with a key, blobs are signed and an agent
 * refuses an unsigned blob, a blob signed with another key and a signed
 * blob with any one byte flipped (every byte of the envelope tried), each
 * with a clear error; a blob signed with its key loads; an agent without a
 * key loads a signed blob; the key comes from the params, a key file or
 * PDX_CLUSTER_KEY_FILE; bad keys fail agent creation. Agents in one
 * process with the cma backend (the metadata path is what is tested). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pdx/kv_config.h>
#include <pdx/pdx.h>

static int failures;

#define EXPECT(cond, ...)                                                      \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fprintf(stderr, "\n");                                             \
            failures++;                                                        \
        }                                                                      \
    } while (0)

static const char K1[] = "k1-0123456789abcdef-cluster-key";
static const char K2[] = "k2-0123456789abcdef-cluster-key";

static pdx_agent_h agent_with(const char *name, const char *key,
                              const char *file)
{
    pdx_agent_params_t p = {0};
    if (key != NULL || file != NULL) {
        p.field_mask = PDX_AGENT_PARAM_CLUSTER_KEY;
        p.cluster_key = key;
        p.cluster_key_len = key ? strlen(key) : 0;
        p.cluster_key_file = file;
    }
    pdx_agent_h a = NULL;
    pdx_status_t st = pdx_agent_create(name, &p, &a);
    if (st != PDX_OK) {
        fprintf(stderr, "FATAL: create %s: %s (%s)\n", name,
                pdx_status_string(st), pdx_last_error());
        exit(1);
    }
    st = pdx_backend_create(a, "cma", NULL, 0, NULL);
    if (st != PDX_OK) {
        fprintf(stderr, "FATAL: cma backend: %s (%s)\n",
                pdx_status_string(st), pdx_last_error());
        exit(1);
    }
    return a;
}

static void describe(pdx_agent_h a, unsigned char **blob, size_t *len)
{
    void *b = NULL;
    pdx_status_t st = pdx_agent_describe(a, &b, len);
    if (st != PDX_OK) {
        fprintf(stderr, "FATAL: describe: %s\n", pdx_status_string(st));
        exit(1);
    }
    *blob = b;
}

static int is_signed(const unsigned char *b, size_t len)
{
    return len > 4 && memcmp(b, "PDXS", 4) == 0;
}

static void write_file(const char *path, const char *data, mode_t mode)
{
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(data, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "FATAL: write %s\n", path);
        exit(1);
    }
    chmod(path, mode);
}

/* agent.cluster_key_file in a connector config: read into the config, and
 * a wrong type is refused naming the JSON path. */
static void config_key(const char *cfg_path, const char *key_file)
{
    FILE *f = fopen(cfg_path, "r");
    static char text[1 << 16];
    size_t n = f ? fread(text, 1, sizeof(text) - 1, f) : 0;
    if (f != NULL) {
        fclose(f);
    }
    text[n] = '\0';
    char *at = strstr(text, "\"agent\": {");
    if (at == NULL) {
        fprintf(stderr, "FATAL: no agent section in %s\n", cfg_path);
        exit(1);
    }
    at += strlen("\"agent\": {");
    static char json[sizeof(text) + 512];
    static pdx_kv_config_t cfg;
    char err[512];
    for (int bad = 0; bad < 2; bad++) {
        char ins[400];
        if (bad) {
            snprintf(ins, sizeof(ins), " \"cluster_key_file\": 5,");
        } else {
            snprintf(ins, sizeof(ins), " \"cluster_key_file\": \"%s\",",
                     key_file);
        }
        /* And a store section with the TLS/auth keys, before "agent". */
        const char *agent_at = at - strlen("\"agent\": {");
        snprintf(json, sizeof(json),
                 "%.*s\"store\": {\"endpoints\": \"https://127.0.0.1:2379\", "
                 "\"ca_file\": \"/etc/pdx/ca.pem\", \"cert_file\": "
                 "\"/etc/pdx/c.pem\", \"key_file\": \"/etc/pdx/c.key\", "
                 "\"user\": \"pdxu\", \"password_file\": \"/etc/pdx/pw\"},\n  "
                 "%.*s%s%s",
                 (int)(agent_at - text), text, (int)(at - agent_at), agent_at,
                 ins, at);
        pdx_status_t st = pdx_kv_config_parse(json, strlen(json), "ck.json",
                                              &cfg, err, sizeof(err));
        if (bad) {
            EXPECT(st == PDX_ERR_CONFIG &&
                       strstr(err, "$.agent.cluster_key_file") != NULL,
                   "bad cluster_key_file: %s (%s)", pdx_status_string(st),
                   err);
        } else {
            EXPECT(st == PDX_OK && strcmp(cfg.cluster_key_file, key_file) == 0,
                   "cluster_key_file: %s (%s) '%s'", pdx_status_string(st),
                   err, cfg.cluster_key_file);
            EXPECT(st == PDX_OK &&
                       strcmp(cfg.store_ca_file, "/etc/pdx/ca.pem") == 0 &&
                       strcmp(cfg.store_cert_file, "/etc/pdx/c.pem") == 0 &&
                       strcmp(cfg.store_key_file, "/etc/pdx/c.key") == 0 &&
                       strcmp(cfg.store_user, "pdxu") == 0 &&
                       strcmp(cfg.store_password_file, "/etc/pdx/pw") == 0,
                   "store TLS/auth keys not read: '%s' '%s'",
                   cfg.store_ca_file, cfg.store_user);
        }
    }
}

int main(int argc, char **argv)
{
    unsetenv("PDX_CLUSTER_KEY_FILE");
    pdx_agent_h a = agent_with("ck-a", K1, NULL);
    pdx_agent_h b = agent_with("ck-b", K1, NULL);
    pdx_agent_h c = agent_with("ck-c", NULL, NULL);
    pdx_agent_h e = agent_with("ck-e", K2, NULL);
    unsigned char *ba, *bc, *be;
    size_t la, lc, le;
    describe(a, &ba, &la);
    describe(c, &bc, &lc);
    describe(e, &be, &le);
    EXPECT(is_signed(ba, la), "a keyed agent's blob is not signed");
    EXPECT(!is_signed(bc, lc), "a keyless agent's blob is signed");

    /* Signed with the same key: accepted. */
    char name[PDX_NAME_MAX];
    pdx_status_t st = pdx_peer_load(b, ba, la, name);
    EXPECT(st == PDX_OK, "signed blob refused: %s (%s)",
           pdx_status_string(st), pdx_last_error());
    EXPECT(strcmp(name, "ck-a") == 0, "loaded name %s", name);
    EXPECT(pdx_peer_unload(b, "ck-a") == PDX_OK, "unload");

    /* Unsigned: refused, saying so. */
    st = pdx_peer_load(b, bc, lc, NULL);
    EXPECT(st == PDX_ERR_MISMATCH, "unsigned blob: %s",
           pdx_status_string(st));
    EXPECT(strstr(pdx_last_error(), "not signed") != NULL, "error: %s",
           pdx_last_error());
    EXPECT(pdx_peer_state(b, "ck-c") == PDX_ERR_NOT_FOUND,
           "refused peer is known");

    /* Another key: refused, naming both key ids. */
    st = pdx_peer_load(b, be, le, NULL);
    EXPECT(st == PDX_ERR_MISMATCH, "other key: %s", pdx_status_string(st));
    EXPECT(strstr(pdx_last_error(), "signed with cluster key") != NULL,
           "error: %s", pdx_last_error());

    /* An unsigned blob wrapped in an envelope with the right key id but a
     * MAC made without the key (forged): the last 32 bytes zeroed. */
    unsigned char *m = malloc(la);
    memcpy(m, ba, la);
    memset(m + la - 32, 0, 32);
    st = pdx_peer_load(b, m, la, NULL);
    EXPECT(st == PDX_ERR_CORRUPT, "forged MAC: %s", pdx_status_string(st));
    EXPECT(strstr(pdx_last_error(), "bad signature") != NULL, "error: %s",
           pdx_last_error());

    /* Every single flipped byte of the signed blob is refused. */
    size_t refused = 0;
    for (size_t i = 0; i < la; i++) {
        memcpy(m, ba, la);
        m[i] ^= (unsigned char)(1u << (i % 8));
        st = pdx_peer_load(b, m, la, NULL);
        EXPECT(st < 0, "flip of byte %zu/%zu accepted", i, la);
        refused += st < 0;
        if (st == PDX_OK) {
            pdx_peer_unload(b, "ck-a");
        }
    }
    printf("one-byte flips of a %zu-byte signed blob: %zu refused\n", la,
           refused);
    /* Truncated by one byte and extended by one byte: refused. */
    EXPECT(pdx_peer_load(b, ba, la - 1, NULL) < 0, "truncated accepted");
    unsigned char *x = malloc(la + 1);
    memcpy(x, ba, la);
    x[la] = 0;
    EXPECT(pdx_peer_load(b, x, la + 1, NULL) < 0, "extended accepted");
    free(x);
    free(m);

    /* No key: a signed blob loads (unverified), an unsigned one too. */
    st = pdx_peer_load(c, ba, la, NULL);
    EXPECT(st == PDX_OK, "keyless agent refused a signed blob: %s",
           pdx_status_string(st));
    st = pdx_peer_load(c, be, le, NULL);
    EXPECT(st == PDX_OK, "keyless agent refused: %s", pdx_status_string(st));

    /* The key from a file (trailing newline dropped) and from
     * PDX_CLUSTER_KEY_FILE: the same key, so they interoperate with a. */
    char dir[] = "/tmp/pdx-ck-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        fprintf(stderr, "FATAL: mkdtemp\n");
        return 1;
    }
    char f1[128], f2[128], f3[128];
    snprintf(f1, sizeof(f1), "%s/k1", dir);
    snprintf(f2, sizeof(f2), "%s/short", dir);
    snprintf(f3, sizeof(f3), "%s/missing", dir);
    char k1nl[sizeof(K1) + 1];
    snprintf(k1nl, sizeof(k1nl), "%s\n", K1);
    write_file(f1, k1nl, 0600);
    write_file(f2, "tooshort", 0600);
    if (argc > 1) {
        config_key(argv[1], f1);
    }
    pdx_agent_h fa = agent_with("ck-file", NULL, f1);
    st = pdx_peer_load(fa, ba, la, NULL);
    EXPECT(st == PDX_OK, "key file agent refused a's blob: %s (%s)",
           pdx_status_string(st), pdx_last_error());
    setenv("PDX_CLUSTER_KEY_FILE", f1, 1);
    pdx_agent_h ea = agent_with("ck-env", NULL, NULL);
    unsetenv("PDX_CLUSTER_KEY_FILE");
    unsigned char *bea;
    size_t lea;
    describe(ea, &bea, &lea);
    EXPECT(is_signed(bea, lea), "env key agent's blob not signed");
    st = pdx_peer_load(b, bea, lea, NULL);
    EXPECT(st == PDX_OK, "env key blob refused: %s (%s)",
           pdx_status_string(st), pdx_last_error());
    st = pdx_peer_load(ea, bc, lc, NULL);
    EXPECT(st == PDX_ERR_MISMATCH, "env key agent took an unsigned blob");

    /* Bad keys fail creation with a clear error. */
    pdx_agent_params_t p = {.field_mask = PDX_AGENT_PARAM_CLUSTER_KEY,
                            .cluster_key = "short", .cluster_key_len = 5};
    pdx_agent_h bad = NULL;
    st = pdx_agent_create("ck-bad", &p, &bad);
    EXPECT(st == PDX_ERR_INVALID && bad == NULL, "short key: %s",
           pdx_status_string(st));
    EXPECT(strstr(pdx_last_error(), "16..4096") != NULL, "error: %s",
           pdx_last_error());
    p.cluster_key = NULL;
    p.cluster_key_file = f2;
    st = pdx_agent_create("ck-bad", &p, &bad);
    EXPECT(st == PDX_ERR_CONFIG, "short key file: %s", pdx_status_string(st));
    p.cluster_key_file = f3;
    st = pdx_agent_create("ck-bad", &p, &bad);
    EXPECT(st == PDX_ERR_CONFIG, "missing key file: %s",
           pdx_status_string(st));
    EXPECT(strstr(pdx_last_error(), f3) != NULL, "error names no file: %s",
           pdx_last_error());
    p.cluster_key = K1;
    p.cluster_key_len = strlen(K1);
    st = pdx_agent_create("ck-bad", &p, &bad);
    EXPECT(st == PDX_ERR_INVALID, "both key and file: %s",
           pdx_status_string(st));
    setenv("PDX_CLUSTER_KEY_FILE", f3, 1);
    st = pdx_agent_create("ck-bad", NULL, &bad);
    EXPECT(st == PDX_ERR_CONFIG, "missing PDX_CLUSTER_KEY_FILE: %s",
           pdx_status_string(st));
    unsetenv("PDX_CLUSTER_KEY_FILE");

    pdx_blob_free(ba);
    pdx_blob_free(bc);
    pdx_blob_free(be);
    pdx_blob_free(bea);
    pdx_agent_destroy(a);
    pdx_agent_destroy(b);
    pdx_agent_destroy(c);
    pdx_agent_destroy(e);
    pdx_agent_destroy(fa);
    pdx_agent_destroy(ea);
    unlink(f1);
    unlink(f2);
    rmdir(dir);
    if (failures != 0) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("cluster key: all cases as expected\n");
    return 0;
}
