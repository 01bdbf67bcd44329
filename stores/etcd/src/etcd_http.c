/* Requests to etcd's v3 JSON gateway (grpc-gateway): POST of a JSON body
 * with libcurl (handles pooled per client), the gRPC code of a refusal
 * mapped to a status; reachability bookkeeping (unreachable since when,
 * fail-fast window, endpoint rotation). Encodings are in etcd_codec.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

static size_t on_data(char *p, size_t size, size_t n, void *arg)
{
    etcd_buf_add(arg, p, size * n);
    return size * n;
}

/* What every request of s sets: its header list (JSON or gRPC, with the
 * token once known), TLS, where the response goes, no signals, no proxy,
 * no Nagle. */
static void easy_common(etcd_store_t *s, CURL *h, bool grpc,
                        curl_write_callback on, void *arg)
{
    pthread_mutex_lock(&s->lock); /* replaced when a token comes */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, grpc ? s->ghdrs : s->hdrs);
    pthread_mutex_unlock(&s->lock);
    etcd_tls_setup(s, h);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, arg);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
}

void etcd_easy_setup(etcd_store_t *s, CURL *h, const char *endpoint,
                     const char *path, const char *body, etcd_buf_t *out,
                     long timeout_ms)
{
    char url[512];
    snprintf(url, sizeof(url), "%s%s", endpoint, path);
    etcd_auth_ensure(s, endpoint); /* a token first, with a user */
    curl_easy_reset(h); /* keeps the connection cache */
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    easy_common(s, h, false, on_data, out);
    long connect_ms = (long)s->timeout_ms;
    if (timeout_ms > 0 && timeout_ms < connect_ms) {
        connect_ms = timeout_ms;
    }
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
}

void etcd_grpc_easy_setup(etcd_store_t *s, CURL *h, const char *endpoint,
                          const char *path, curl_write_callback on_data,
                          curl_write_callback on_header, void *arg)
{
    char url[512];
    snprintf(url, sizeof(url), "%s%s", endpoint, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     strncmp(endpoint, "https://", 8) == 0
                         ? (long)CURL_HTTP_VERSION_2TLS
                         : (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    etcd_auth_ensure(s, endpoint);
    easy_common(s, h, true, on_data, arg);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, arg);
    /* A connection a call: curl 7.88 fails a second stream on a
     * prior-knowledge h2c connection ("Error in the HTTP2 framing
     * layer"; etcd_h2.c keeps connections for the calls that matter). */
    curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->timeout_ms);
}

void etcd_note_ok(etcd_store_t *s, int64_t revision)
{
    pthread_mutex_lock(&s->lock);
    if (!s->reachable) {
        double down = s->unreach_mono_ns
                          ? (double)(pdx_now_ns() - s->unreach_mono_ns) / 1e9
                          : 0.0;
        if (s->ever_reached || s->unreach_mono_ns) {
            pdx_warn("store etcd (ns %s, agent %s): %s reachable again "
                     "after %.1f s", s->ns, s->host.agent_name,
                     s->endpoints[s->ep], down);
        }
        s->reachable = true;
        s->unreach_rt_ns = s->unreach_mono_ns = 0;
        s->probe_backoff_ms = 0;
        s->state_dirty = true;
    }
    s->ever_reached = true;
    if (revision > s->revision) {
        s->revision = revision;
    }
    pthread_mutex_unlock(&s->lock);
}

void etcd_note_fail(etcd_store_t *s, const char *what)
{
    pthread_mutex_lock(&s->lock);
    s->failures++;
    snprintf(s->last_error, sizeof(s->last_error), "%s", what);
    uint64_t now = pdx_now_ns();
    if (s->reachable || s->unreach_mono_ns == 0) {
        s->reachable = false;
        s->unreach_rt_ns = pdx_realtime_ns();
        s->unreach_mono_ns = now;
        s->state_dirty = true;
        char when[32];
        etcd_fmt_time(s->unreach_rt_ns, when, sizeof(when));
        pdx_warn("store etcd (ns %s, agent %s): unreachable since %s: %s; "
                 "loaded peers keep working, publication and watches retry "
                 "with backoff", s->ns, s->host.agent_name, when, what);
    }
    /* Callers fail fast for a while; the window grows like the thread's
     * backoff so a partitioned store does not cost every call a timeout. */
    s->probe_backoff_ms = s->probe_backoff_ms
                              ? s->probe_backoff_ms * 2 : s->retry_min_ms;
    if (s->probe_backoff_ms > s->retry_max_ms) {
        s->probe_backoff_ms = s->retry_max_ms;
    }
    s->probe_at_ns = now + (uint64_t)s->probe_backoff_ms * 1000000ull;
    if (s->nendpoints > 1) {
        s->ep = (s->ep + 1) % s->nendpoints;
    }
    pthread_mutex_unlock(&s->lock);
}

pdx_status_t etcd_grpc_status(int code)
{
    switch (code) {
    case 3: /* INVALID_ARGUMENT */
    case 9: /* FAILED_PRECONDITION */
        return PDX_ERR_INVALID;
    case 4: /* DEADLINE_EXCEEDED */
        return PDX_ERR_TIMEOUT;
    case 5: /* NOT_FOUND (a lease) */
        return PDX_ERR_NOT_FOUND;
    case 8: /* RESOURCE_EXHAUSTED (request too large) */
        return PDX_ERR_TOO_LARGE;
    case 11: /* OUT_OF_RANGE (compacted) */
        return PDX_ERR_STALE;
    default:
        return PDX_ERR_IO;
    }
}

/* A request refused by etcd with gRPC code g: the store is reachable,
 * but the reason goes into last_error for pdx_store_status. */
static pdx_status_t refused(etcd_store_t *s, const char *what, int g)
{
    etcd_note_ok(s, 0);
    pthread_mutex_lock(&s->lock);
    snprintf(s->last_error, sizeof(s->last_error), "%s", what);
    pthread_mutex_unlock(&s->lock);
    return etcd_grpc_status(g);
}

/* Whether a caller's request fails at once (the store was unreachable a
 * moment ago: no timeout per call while it is down; force: never); and
 * the endpoint to try first. */
static bool fail_fast(etcd_store_t *s, bool force, uint64_t now,
                      uint32_t *ep_p)
{
    pthread_mutex_lock(&s->lock);
    bool ff = !force && !s->reachable && s->unreach_mono_ns != 0 &&
              now < s->probe_at_ns;
    *ep_p = s->ep;
    pthread_mutex_unlock(&s->lock);
    return ff;
}

pdx_status_t etcd_call(etcd_store_t *s, CURL *h, const char *path,
                       cJSON *req, cJSON **resp_p, bool force, char *err,
                       size_t err_len)
{
    uint64_t now = pdx_now_ns();
    uint32_t ep;
    if (fail_fast(s, force, now, &ep)) {
        if (err != NULL) {
            snprintf(err, err_len, "store unreachable");
        }
        return PDX_ERR_UNAVAILABLE;
    }
    char *body = cJSON_PrintUnformatted(req);
    if (body == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = PDX_ERR_UNAVAILABLE;
    bool auth_retried = false;
    uint64_t deadline = now + (uint64_t)s->timeout_ms * 1000000ull;
    for (uint32_t t = 0; t < s->nendpoints; t++) {
        const char *endpoint = s->endpoints[(ep + t) % s->nendpoints];
        long left = (long)((int64_t)(deadline - now) / 1000000);
        if (now >= deadline || left <= 0) {
            break;
        }
        etcd_buf_t out = {0};
        etcd_easy_setup(s, h, endpoint, path, body, &out, left);
        CURLcode cc = curl_easy_perform(h);
        pthread_mutex_lock(&s->lock);
        s->requests++;
        pthread_mutex_unlock(&s->lock);
        if (cc != CURLE_OK) {
            char what[256];
            snprintf(what, sizeof(what), "%s%s: %s", endpoint, path,
                     curl_easy_strerror(cc));
            etcd_note_fail(s, what);
            if (err != NULL) {
                snprintf(err, err_len, "%s", what);
            }
            etcd_buf_free(&out);
            now = pdx_now_ns();
            continue;
        }
        long code = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
        cJSON *resp = etcd_parse_body(&out);
        etcd_buf_free(&out);
        if (code == 200 && resp != NULL) {
            const cJSON *hdr = cJSON_GetObjectItemCaseSensitive(resp, "header");
            etcd_note_ok(s, hdr ? etcd_json_i64(hdr, "revision") : 0);
            *resp_p = resp;
            st = PDX_OK;
            break;
        }
        int g = resp ? (int)etcd_json_i64(resp, "code") : 0;
        const cJSON *msg = resp ? cJSON_GetObjectItemCaseSensitive(resp,
                                                                   "message")
                                : NULL;
        char what[256];
        snprintf(what, sizeof(what), "%s%s: HTTP %ld%s%s", endpoint, path,
                 code, cJSON_IsString(msg) ? ": " : "",
                 cJSON_IsString(msg) ? msg->valuestring : "");
        cJSON_Delete(resp);
        if (err != NULL) {
            snprintf(err, err_len, "%s", what);
        }
        if (g == 16 && s->user != NULL && !auth_retried) {
            /* Token expired or revoked: authenticate again, once. */
            auth_retried = true;
            etcd_auth_invalidate(s);
            t--;
            now = pdx_now_ns();
            continue;
        }
        if (g == 14 || code >= 500 || g == 0) {
            /* No leader, or not etcd answering: as good as unreachable;
             * another endpoint may do better. */
            etcd_note_fail(s, what);
            now = pdx_now_ns();
            continue;
        }
        /* Refused (permission denied, no user, ...). */
        st = refused(s, what, g);
        break;
    }
    free(body);
    return st;
}

/* The pool is the client's: agents of one process reuse each other's
 * connections. */
CURL *etcd_handle_get(etcd_store_t *s)
{
    etcd_client_t *c = s->client;
    CURL *h = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->npool > 0) {
        h = c->pool[--c->npool];
    }
    pthread_mutex_unlock(&c->lock);
    return h != NULL ? h : curl_easy_init();
}

void etcd_handle_put(etcd_store_t *s, CURL *h)
{
    if (h == NULL) {
        return;
    }
    etcd_client_t *c = s->client;
    pthread_mutex_lock(&c->lock);
    if (c->npool < ETCD_HANDLE_POOL) {
        c->pool[c->npool++] = h;
        h = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    if (h != NULL) {
        curl_easy_cleanup(h);
    }
}

void etcd_kv_read_free(etcd_kv_read_t *o)
{
    free(o->value);
    memset(o, 0, sizeof(*o));
}

/* Fill o from a decoded KeyValue of `full` (untrusted: another key than
 * the one asked for counts as absent). */
static pdx_status_t kv_take(etcd_kv_read_t *o, const char *full,
                            const void *key, size_t klen, const void *val,
                            size_t vlen, int64_t mod_rev, int64_t lease)
{
    if (key == NULL || klen != strlen(full) || memcmp(key, full, klen) != 0) {
        return PDX_OK;
    }
    o->value = malloc(vlen + 1);
    if (o->value == NULL) {
        return PDX_ERR_NOMEM;
    }
    if (vlen > 0) {
        memcpy(o->value, val, vlen);
    }
    ((char *)o->value)[vlen] = '\0';
    o->len = vlen;
    o->present = true;
    o->mod_rev = mod_rev;
    o->lease = lease;
    return PDX_OK;
}

/* The point read over gRPC on the client's h2c connections. */
static pdx_status_t read_h2(etcd_store_t *s, const char *full, bool force,
                            etcd_kv_read_t *o)
{
    uint64_t now = pdx_now_ns();
    uint32_t ep;
    if (fail_fast(s, force, now, &ep)) {
        return PDX_ERR_UNAVAILABLE;
    }
    etcd_buf_t req = {0};
    etcd_pb_range_req(&req, full);
    if (req.data == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = PDX_ERR_UNAVAILABLE;
    uint64_t deadline = now + (uint64_t)s->timeout_ms * 1000000ull;
    for (uint32_t t = 0; t < s->nendpoints && pdx_now_ns() < deadline;
         t++) {
        const char *endpoint = s->endpoints[(ep + t) % s->nendpoints];
        etcd_buf_t out = {0};
        int g = -1;
        char err[192] = "";
        pdx_status_t r = etcd_h2_unary(s->client, endpoint,
                                       "/etcdserverpb.KV/Range", &req,
                                       deadline, &out, &g, err, sizeof(err));
        pthread_mutex_lock(&s->lock);
        s->requests++;
        pthread_mutex_unlock(&s->lock);
        char what[320];
        snprintf(what, sizeof(what), "%s/etcdserverpb.KV/Range: %s",
                 endpoint, err);
        if (r == PDX_OK && g == 0) {
            int64_t rev = 0;
            etcd_pb_event_t kv;
            int f = etcd_pb_range_resp((const uint8_t *)out.data, out.len,
                                       &rev, &kv);
            if (f < 0) {
                snprintf(what, sizeof(what), "%s/etcdserverpb.KV/Range: "
                         "malformed RangeResponse (%zu bytes)", endpoint,
                         out.len);
                etcd_note_fail(s, what);
                etcd_buf_free(&out);
                st = PDX_ERR_CORRUPT;
                continue;
            }
            etcd_note_ok(s, rev);
            o->rev = rev;
            st = f == 1 ? kv_take(o, full, kv.key, kv.key_len, kv.value,
                                  kv.value_len, kv.mod_revision, kv.lease)
                        : PDX_OK;
            etcd_buf_free(&out);
            break;
        }
        etcd_buf_free(&out);
        if (r == PDX_OK && g != 14) {
            st = refused(s, what, g); /* not "unavailable" */
            break;
        }
        etcd_note_fail(s, what);
        st = r == PDX_OK ? PDX_ERR_UNAVAILABLE : r;
    }
    etcd_buf_free(&req);
    return st == PDX_ERR_IO || st == PDX_ERR_TIMEOUT || st == PDX_ERR_CORRUPT
               ? PDX_ERR_UNAVAILABLE : st;
}

pdx_status_t etcd_read_key(etcd_store_t *s, CURL *h, const char *full,
                           bool force, etcd_kv_read_t *o)
{
    memset(o, 0, sizeof(*o));
    pthread_mutex_lock(&s->lock);
    bool h2 = s->user == NULL && etcd_h2_usable(s->endpoints[s->ep]);
    pthread_mutex_unlock(&s->lock);
    if (h2) {
        return read_h2(s, full, force, o);
    }
    char *kb = etcd_b64_enc(full, strlen(full));
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    CURL *own = h == NULL ? etcd_handle_get(s) : NULL;
    pdx_status_t st = PDX_ERR_NOMEM;
    if (kb != NULL && req != NULL && (h != NULL || own != NULL)) {
        cJSON_AddStringToObject(req, "key", kb);
        st = etcd_call(s, h != NULL ? h : own, "/v3/kv/range", req, &resp,
                       force, NULL, 0);
    }
    etcd_handle_put(s, own);
    free(kb);
    cJSON_Delete(req);
    if (st == PDX_OK) {
        o->rev = etcd_json_i64(cJSON_GetObjectItemCaseSensitive(resp, "header"),
                               "revision");
        const cJSON *kv = cJSON_GetArrayItem(
            cJSON_GetObjectItemCaseSensitive(resp, "kvs"), 0);
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
        size_t klen = 0, vlen = 0;
        char *key = cJSON_IsString(k) ? etcd_b64_dec(k->valuestring, &klen)
                                      : NULL;
        void *val = cJSON_IsString(v) ? etcd_b64_dec(v->valuestring, &vlen)
                                      : NULL;
        if (kv != NULL && (key == NULL || (cJSON_IsString(v) && val == NULL))) {
            st = PDX_ERR_CORRUPT;
        } else if (kv != NULL) {
            st = kv_take(o, full, key, klen, val, val ? vlen : 0,
                         etcd_json_i64(kv, "mod_revision"),
                         etcd_json_i64(kv, "lease"));
        }
        free(key);
        free(val);
    }
    cJSON_Delete(resp);
    return st;
}
