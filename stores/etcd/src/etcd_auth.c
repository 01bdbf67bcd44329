/* TLS and user/password authentication for the etcd store: module options,
 * libcurl's TLS settings on every handle, and etcd v3 auth
 * (/v3/auth/authenticate gives a token, sent as the Authorization header
 * on the JSON gateway and as the "token" metadata on gRPC). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "etcd_int.h"

#define PASSWORD_MAX 1024

static pdx_status_t read_secret(const char *path, char **out_p)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        pdx_error("store etcd: option password_file: cannot open %s: %s",
                  path, strerror(errno));
        return PDX_ERR_CONFIG;
    }
    char buf[PASSWORD_MAX + 2];
    size_t n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    if (n > PASSWORD_MAX) {
        OPENSSL_cleanse(buf, sizeof(buf));
        pdx_error("store etcd: option password_file: %s is over %d bytes",
                  path, PASSWORD_MAX);
        return PDX_ERR_CONFIG;
    }
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r')) {
        n--;
    }
    buf[n] = '\0';
    *out_p = strdup(buf);
    OPENSSL_cleanse(buf, sizeof(buf));
    return *out_p != NULL ? PDX_OK : PDX_ERR_NOMEM;
}

pdx_status_t etcd_opts_parse(etcd_store_t *s, const pdx_option_t *opts,
                             size_t nopts)
{
    static const char accepted[] =
        "ca_file, cert_file, key_file, user, password, password_file";
    for (size_t i = 0; i < nopts; i++) {
        const char *k = opts[i].key, *v = opts[i].value;
        if (k == NULL || v == NULL || v[0] == '\0') {
            pdx_error("store etcd: option '%s' has no value",
                      k != NULL ? k : "(null)");
            return PDX_ERR_CONFIG;
        }
        char **dst = strcmp(k, "ca_file") == 0     ? &s->ca_file
                     : strcmp(k, "cert_file") == 0 ? &s->cert_file
                     : strcmp(k, "key_file") == 0  ? &s->key_file
                     : strcmp(k, "user") == 0      ? &s->user
                     : strcmp(k, "password") == 0 ||
                             strcmp(k, "password_file") == 0
                         ? &s->password
                         : NULL;
        if (dst == NULL) {
            pdx_error("store etcd: unknown option '%s' (accepted: %s)", k,
                      accepted);
            return PDX_ERR_CONFIG;
        }
        if (*dst != NULL) {
            pdx_error("store etcd: option '%s' given twice (or both password "
                      "and password_file)", k);
            return PDX_ERR_CONFIG;
        }
        if (strcmp(k, "password_file") == 0) {
            pdx_status_t st = read_secret(v, dst);
            if (st != PDX_OK) {
                return st;
            }
        } else if ((*dst = strdup(v)) == NULL) {
            return PDX_ERR_NOMEM;
        }
    }
    if ((s->user != NULL) != (s->password != NULL)) {
        pdx_error("store etcd: option user needs password or password_file, "
                  "and the other way round");
        return PDX_ERR_CONFIG;
    }
    if ((s->cert_file != NULL) != (s->key_file != NULL)) {
        pdx_error("store etcd: options cert_file and key_file go together "
                  "(a client certificate and its key)");
        return PDX_ERR_CONFIG;
    }
    return PDX_OK;
}

void etcd_tls_setup(const etcd_store_t *s, CURL *h)
{
    if (s->ca_file != NULL) {
        curl_easy_setopt(h, CURLOPT_CAINFO, s->ca_file);
    }
    if (s->cert_file != NULL) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, s->cert_file);
        curl_easy_setopt(h, CURLOPT_SSLKEY, s->key_file);
    }
}

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    etcd_buf_add(arg, p, size * n);
    return size * n;
}

/* New header lists with the token; the old ones retired. */
static pdx_status_t install_token(etcd_store_t *s, const char *token)
{
    size_t tl = strlen(token);
    char *h1 = malloc(tl + 32), *h2 = malloc(tl + 32);
    struct curl_slist *a = NULL, *b = NULL;
    pdx_status_t st = PDX_ERR_NOMEM;
    if (h1 == NULL || h2 == NULL) {
        goto out;
    }
    snprintf(h1, tl + 32, "Authorization: %s", token);
    snprintf(h2, tl + 32, "token: %s", token);
    a = curl_slist_append(NULL, "Content-Type: application/json");
    a = a ? curl_slist_append(a, "Expect:") : NULL;
    a = a ? curl_slist_append(a, h1) : NULL;
    b = curl_slist_append(NULL, "content-type: application/grpc");
    b = b ? curl_slist_append(b, "te: trailers") : NULL;
    b = b ? curl_slist_append(b, h2) : NULL;
    if (a == NULL || b == NULL) {
        goto out;
    }
    pthread_mutex_lock(&s->lock);
    struct curl_slist **r =
        realloc(s->retired, (s->nretired + 2) * sizeof(*r));
    if (r != NULL) {
        s->retired = r;
        r[s->nretired++] = s->hdrs;
        r[s->nretired++] = s->ghdrs;
        s->hdrs = a;
        s->ghdrs = b;
        s->token_ok = true;
        a = b = NULL;
        st = PDX_OK;
    }
    pthread_mutex_unlock(&s->lock);
out:
    curl_slist_free_all(a);
    curl_slist_free_all(b);
    free(h1);
    free(h2);
    return st;
}

/* Nothing to do: a token, or backing off after a failure. Takes s->lock. */
static bool auth_settled(etcd_store_t *s)
{
    pthread_mutex_lock(&s->lock);
    bool ok = s->token_ok || pdx_now_ns() < s->auth_retry_at_ns;
    pthread_mutex_unlock(&s->lock);
    return ok;
}

void etcd_auth_ensure(etcd_store_t *s, const char *endpoint)
{
    if (s->user == NULL || auth_settled(s)) {
        return;
    }
    pthread_mutex_lock(&s->auth_lock);
    /* Another thread may have done it meanwhile: got a token, or failed
     * and set a backoff (looking at the token alone, two threads that found
     * the backoff over both tried: trust_etcd_tls_auth once counted 4
     * attempts in 3 s against a wrong password, where the backoff allows
     * 3). */
    if (auth_settled(s)) {
        pthread_mutex_unlock(&s->auth_lock);
        return;
    }
    cJSON *req = cJSON_CreateObject();
    char *body = NULL;
    if (req != NULL) {
        cJSON_AddStringToObject(req, "name", s->user);
        cJSON_AddStringToObject(req, "password", s->password);
        body = cJSON_PrintUnformatted(req);
        cJSON_Delete(req);
    }
    CURL *h = curl_easy_init();
    struct curl_slist *hd =
        curl_slist_append(NULL, "Content-Type: application/json");
    etcd_buf_t out = {0};
    char what[256] = "";
    if (body == NULL || h == NULL || hd == NULL) {
        snprintf(what, sizeof(what), "out of memory");
        goto done;
    }
    char url[512];
    snprintf(url, sizeof(url), "%s/v3/auth/authenticate", endpoint);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &out);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    etcd_tls_setup(s, h);
    CURLcode cc = curl_easy_perform(h);
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    cJSON *resp = cc == CURLE_OK ? etcd_parse_body(&out) : NULL;
    const cJSON *tok =
        resp ? cJSON_GetObjectItemCaseSensitive(resp, "token") : NULL;
    if (cc != CURLE_OK) {
        snprintf(what, sizeof(what), "%s", curl_easy_strerror(cc));
    } else if (code != 200 || !cJSON_IsString(tok) ||
               tok->valuestring[0] == '\0') {
        const cJSON *m =
            resp ? cJSON_GetObjectItemCaseSensitive(resp, "message") : NULL;
        snprintf(what, sizeof(what), "HTTP %ld%s%s", code,
                 cJSON_IsString(m) ? ": " : "",
                 cJSON_IsString(m) ? m->valuestring : "");
    } else if (install_token(s, tok->valuestring) != PDX_OK) {
        snprintf(what, sizeof(what), "out of memory");
    } else {
        pdx_debug("store etcd (ns %s, agent %s): authenticated as %s at %s",
                  s->ns, s->host.agent_name, s->user, endpoint);
    }
    cJSON_Delete(resp);
done:
    if (what[0] != '\0') {
        char msg[384];
        snprintf(msg, sizeof(msg), "%s/v3/auth/authenticate as user %s: %s",
                 endpoint, s->user, what);
        pdx_warn("store etcd (ns %s, agent %s): authentication failed: %s",
                 s->ns, s->host.agent_name, msg);
        pthread_mutex_lock(&s->lock);
        snprintf(s->last_error, sizeof(s->last_error), "%s", msg);
        s->auth_backoff_ms = s->auth_backoff_ms == 0 ? 1000
                             : s->auth_backoff_ms >= 15000
                                 ? 30000
                                 : 2 * s->auth_backoff_ms;
        s->auth_retry_at_ns =
            pdx_now_ns() + (uint64_t)s->auth_backoff_ms * 1000000ull;
        pthread_mutex_unlock(&s->lock);
    } else {
        pthread_mutex_lock(&s->lock);
        s->auth_backoff_ms = 0;
        s->auth_retry_at_ns = 0;
        pthread_mutex_unlock(&s->lock);
    }
    etcd_buf_free(&out);
    curl_slist_free_all(hd);
    if (h != NULL) {
        curl_easy_cleanup(h);
    }
    if (body != NULL) {
        OPENSSL_cleanse(body, strlen(body));
        free(body);
    }
    pthread_mutex_unlock(&s->auth_lock);
}

void etcd_auth_invalidate(etcd_store_t *s)
{
    if (s->user == NULL) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->token_ok = false;
    pthread_mutex_unlock(&s->lock);
}

void etcd_auth_free(etcd_store_t *s)
{
    for (size_t i = 0; i < s->nretired; i++) {
        curl_slist_free_all(s->retired[i]);
    }
    free(s->retired);
    free(s->ca_file);
    free(s->cert_file);
    free(s->key_file);
    free(s->user);
    if (s->password != NULL) {
        OPENSSL_cleanse(s->password, strlen(s->password));
        free(s->password);
    }
}
