/* Cluster key and sealed blobs (see sign.h). HMAC-SHA-256 comes from
 * libcrypto; only the envelope framing is hand-written. */
#include "sign_int.h"

#include <stdbool.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <pdx/log.h>

/* pdx_agent_params_t is append-only: the key and store option fields
 * came after every older field. */
_Static_assert(offsetof(pdx_agent_params_t, cluster_key) >
                   offsetof(pdx_agent_params_t, store_max_txn_ops),
               "cluster key fields appended");
_Static_assert(offsetof(pdx_agent_params_t, store_opts) >
                   offsetof(pdx_agent_params_t, cluster_key_file),
               "store option fields appended");

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static uint64_t get_le(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static int mac(const pdx_ckey_t *k, const void *data, size_t len,
               uint8_t out[PDX_SIG_MAC_LEN])
{
    unsigned int olen = 0;
    return HMAC(EVP_sha256(), k->bytes, (int)k->len, data, len, out,
                &olen) != NULL && olen == PDX_SIG_MAC_LEN;
}

static pdx_status_t key_set(pdx_ckey_t *k, const char *agent,
                            const void *bytes, size_t len, const char *from)
{
    if (len < PDX_CLUSTER_KEY_MIN || len > PDX_CLUSTER_KEY_MAX) {
        pdx_error("agent %s: cluster key from %s is %zu bytes; it must be "
                  "%u..%u bytes", agent, from, len, PDX_CLUSTER_KEY_MIN,
                  PDX_CLUSTER_KEY_MAX);
        return PDX_ERR_INVALID;
    }
    k->bytes = malloc(len);
    if (k->bytes == NULL) {
        return PDX_ERR_NOMEM;
    }
    memcpy(k->bytes, bytes, len);
    k->len = len;
    static const char label[] = "pdx cluster key id";
    uint8_t m[PDX_SIG_MAC_LEN];
    if (!mac(k, label, sizeof(label) - 1, m)) {
        pdxi_ckey_clear(k);
        pdx_error("agent %s: HMAC-SHA-256 from libcrypto failed", agent);
        return PDX_ERR_BACKEND;
    }
    k->id = get_le(m, 8);
    pdx_info("agent %s: cluster key %016llx (from %s): blobs are signed and "
             "peers' blobs must be", agent, (unsigned long long)k->id, from);
    return PDX_OK;
}

static pdx_status_t key_file(pdx_ckey_t *k, const char *agent,
                             const char *path, const char *from)
{
    char what[512];
    snprintf(what, sizeof(what), "%s %s", from, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        pdx_error("agent %s: cannot open the cluster key file (%s): %s",
                  agent, what, strerror(errno));
        return PDX_ERR_CONFIG;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        sb.st_size > (off_t)PDX_CLUSTER_KEY_MAX + 2) {
        pdx_error("agent %s: cluster key file (%s) is not a regular file of "
                  "at most %u bytes", agent, what, PDX_CLUSTER_KEY_MAX);
        close(fd);
        return PDX_ERR_CONFIG;
    }
    if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
        pdx_warn("agent %s: cluster key file (%s) is accessible to group or "
                 "others (mode %03o): make it 0600", agent, what,
                 (unsigned)(sb.st_mode & 0777));
    }
    uint8_t buf[PDX_CLUSTER_KEY_MAX + 2];
    size_t n = 0;
    while (n < sizeof(buf)) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - n);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            pdx_error("agent %s: reading the cluster key file (%s): %s",
                      agent, what, strerror(errno));
            close(fd);
            OPENSSL_cleanse(buf, sizeof(buf));
            return PDX_ERR_CONFIG;
        }
        if (r == 0) {
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    /* A trailing newline (echo > file) is not part of the key. */
    if (n > 0 && buf[n - 1] == '\n') {
        n--;
        if (n > 0 && buf[n - 1] == '\r') {
            n--;
        }
    }
    pdx_status_t st = key_set(k, agent, buf, n, what);
    OPENSSL_cleanse(buf, sizeof(buf));
    return st == PDX_ERR_INVALID ? PDX_ERR_CONFIG : st;
}

pdx_status_t pdxi_ckey_init(pdx_ckey_t *k, const char *agent,
                            const pdx_agent_params_t *params)
{
    *k = (pdx_ckey_t){0};
    if (params != NULL && (params->field_mask & PDX_AGENT_PARAM_CLUSTER_KEY)) {
        if ((params->cluster_key != NULL) ==
            (params->cluster_key_file != NULL)) {
            pdx_error("agent %s: PDX_AGENT_PARAM_CLUSTER_KEY needs exactly "
                      "one of cluster_key and cluster_key_file", agent);
            return PDX_ERR_INVALID;
        }
        if (params->cluster_key != NULL) {
            return key_set(k, agent, params->cluster_key,
                           params->cluster_key_len, "the agent params");
        }
        return key_file(k, agent, params->cluster_key_file,
                        "cluster_key_file");
    }
    const char *env = getenv("PDX_CLUSTER_KEY_FILE");
    if (env != NULL && env[0] != '\0') {
        return key_file(k, agent, env, "PDX_CLUSTER_KEY_FILE");
    }
    return PDX_OK;
}

void pdxi_ckey_clear(pdx_ckey_t *k)
{
    if (k->bytes != NULL) {
        OPENSSL_cleanse(k->bytes, k->len);
        free(k->bytes);
    }
    *k = (pdx_ckey_t){0};
}

pdx_status_t pdxi_blob_seal(const pdx_ckey_t *k, uint8_t **buf_p,
                            size_t *len_p)
{
    size_t in = *len_p;
    if (in > UINT32_MAX) {
        return PDX_ERR_TOO_LARGE;
    }
    size_t total = PDX_SIG_HEADER_LEN + in + PDX_SIG_MAC_LEN;
    uint8_t *e = malloc(total);
    if (e == NULL) {
        return PDX_ERR_NOMEM;
    }
    put_le(e, PDX_SIG_MAGIC, 4);
    put_le(e + 4, PDX_SIG_VERSION, 2);
    put_le(e + 6, PDX_SIG_ALG_HMAC_SHA256, 2);
    put_le(e + 8, in, 4);
    put_le(e + 12, 0, 4);
    put_le(e + 16, k->id, 8);
    memcpy(e + PDX_SIG_HEADER_LEN, *buf_p, in);
    if (!mac(k, e, PDX_SIG_HEADER_LEN + in, e + PDX_SIG_HEADER_LEN + in)) {
        free(e);
        pdx_error("signing a %zu-byte blob: HMAC-SHA-256 from libcrypto "
                  "failed", in);
        return PDX_ERR_BACKEND;
    }
    free(*buf_p);
    *buf_p = e;
    *len_p = total;
    return PDX_OK;
}

pdx_status_t pdxi_blob_open(const pdx_ckey_t *k, const void *buf, size_t len,
                            const void **inner_p, size_t *inner_len_p,
                            char *why, size_t why_len)
{
    const uint8_t *p = buf;
    bool keyed = k != NULL && k->bytes != NULL;
    if (p == NULL || len < 4 || get_le(p, 4) != PDX_SIG_MAGIC) {
        if (keyed) {
            snprintf(why, why_len, "the blob is not signed, and this agent "
                     "accepts only blobs signed with its cluster key "
                     "%016llx", (unsigned long long)k->id);
            return PDX_ERR_MISMATCH;
        }
        *inner_p = buf;
        *inner_len_p = len;
        return PDX_OK;
    }
    if (len < PDX_SIG_HEADER_LEN + PDX_SIG_MAC_LEN) {
        snprintf(why, why_len, "signed blob truncated: %zu bytes, the "
                 "envelope alone needs %u", len,
                 PDX_SIG_HEADER_LEN + PDX_SIG_MAC_LEN);
        return PDX_ERR_CORRUPT;
    }
    unsigned ver = (unsigned)get_le(p + 4, 2), alg = (unsigned)get_le(p + 6, 2);
    uint64_t in = get_le(p + 8, 4), id = get_le(p + 16, 8);
    if (ver != PDX_SIG_VERSION) {
        snprintf(why, why_len, "signed blob envelope version %u, this pdx "
                 "reads version %u", ver, PDX_SIG_VERSION);
        return PDX_ERR_VERSION;
    }
    if (alg != PDX_SIG_ALG_HMAC_SHA256 || get_le(p + 12, 4) != 0) {
        snprintf(why, why_len, "signed blob: unknown algorithm %u or "
                 "reserved field not 0", alg);
        return PDX_ERR_CORRUPT;
    }
    if (in != len - PDX_SIG_HEADER_LEN - PDX_SIG_MAC_LEN) {
        snprintf(why, why_len, "signed blob length mismatch: envelope says "
                 "%llu inner bytes, have %zu", (unsigned long long)in,
                 len - PDX_SIG_HEADER_LEN - PDX_SIG_MAC_LEN);
        return PDX_ERR_CORRUPT;
    }
    if (keyed) {
        if (id != k->id) {
            snprintf(why, why_len, "the blob is signed with cluster key "
                     "%016llx, this agent's key is %016llx",
                     (unsigned long long)id, (unsigned long long)k->id);
            return PDX_ERR_MISMATCH;
        }
        uint8_t m[PDX_SIG_MAC_LEN];
        if (!mac(k, p, PDX_SIG_HEADER_LEN + in, m)) {
            snprintf(why, why_len, "HMAC-SHA-256 from libcrypto failed");
            return PDX_ERR_BACKEND;
        }
        if (CRYPTO_memcmp(m, p + PDX_SIG_HEADER_LEN + in, PDX_SIG_MAC_LEN) !=
            0) {
            snprintf(why, why_len, "bad signature (HMAC-SHA-256 with cluster "
                     "key %016llx does not match): the blob was altered or "
                     "not signed with this key", (unsigned long long)k->id);
            return PDX_ERR_CORRUPT;
        }
    }
    *inner_p = p + PDX_SIG_HEADER_LEN;
    *inner_len_p = (size_t)in;
    return PDX_OK;
}
