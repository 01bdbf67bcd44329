/* The etcd store module (libpdx_store_etcd.so): pdx's discovery, liveness
 * and block-owner registry on etcd v3, through its JSON gateway. This file
 * is the glue: create, destroy, status, and put, get and del of keys.
 *
 * One thread per client keeps the leases alive (keepalive every TTL/3),
 * grants a new one when it was lost and puts the leased keys again, and
 * runs the watch streams (curl multi): a stream that breaks is reopened
 * with backoff from the revision after the last event reported, and one
 * whose revision was compacted lists its prefix and reports the difference,
 * so no change is lost or reported twice. Callers' requests run on their
 * own threads with pooled connections. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init = CURLE_OK;

static void curl_init_once(void)
{
    g_curl_init = curl_global_init(CURL_GLOBAL_DEFAULT);
}

pdx_status_t etcd_query(char *why, size_t why_len)
{
    pthread_once(&g_curl_once, curl_init_once);
    if (g_curl_init != CURLE_OK) {
        snprintf(why, why_len, "curl_global_init: %s",
                 curl_easy_strerror(g_curl_init));
        return PDX_ERR_UNAVAILABLE;
    }
    if (why_len > 0) {
        why[0] = '\0';
    }
    return PDX_OK;
}

void etcd_counters(void *st, pdx_store_counters_t *c)
{
    etcd_store_t *s = st;
    if (c == NULL) {
        return;
    }
    pdx_store_counters_t v = {.size = (uint32_t)sizeof(v)};
    pthread_mutex_lock(&s->lock);
    v.events = s->events;
    v.event_bytes = s->event_bytes;
    v.keepalives = s->keepalives;
    v.lease_late_ms = s->lease_late_ms;
    pthread_mutex_unlock(&s->lock);
    pthread_mutex_lock(&s->client->lock);
    v.key_stream_opens = s->client->mopens;
    pthread_mutex_unlock(&s->client->lock);
    size_t n = c->size < sizeof(v) ? c->size : sizeof(v);
    if (n > sizeof(v.size)) {
        memcpy((char *)c + sizeof(v.size), (char *)&v + sizeof(v.size),
               n - sizeof(v.size));
    }
}

void etcd_status(void *st, pdx_store_status_t *o)
{
    etcd_store_t *s = st;
    pthread_mutex_lock(&s->lock);
    etcd_fill_status_locked(s, o);
    pthread_mutex_unlock(&s->lock);
}

static void etcd_free(etcd_store_t *s)
{
    for (uint32_t i = 0; i < s->nendpoints; i++) {
        free(s->endpoints[i]);
    }
    while (s->leased != NULL) {
        etcd_leased_t *k = s->leased;
        s->leased = k->next;
        free(k->key);
        free(k->value);
        free(k);
    }
    while (s->watches != NULL) {
        etcd_watch_t *w = s->watches;
        s->watches = w->next;
        etcd_watch_free(w);
    }
    while (s->evq != NULL) {
        etcd_event_t *e = s->evq;
        s->evq = e->next;
        free(e);
    }
    curl_slist_free_all(s->hdrs);
    for (size_t i = 0; i < ETCD_PARALLEL; i++) {
        if (s->gh[i] != NULL) {
            curl_easy_cleanup(s->gh[i]);
        }
    }
    curl_slist_free_all(s->ghdrs);
    etcd_auth_free(s);
    pthread_mutex_destroy(&s->auth_lock);
    pthread_mutex_destroy(&s->glock);
    pthread_mutex_destroy(&s->deliver);
    pthread_mutex_destroy(&s->pub_lock);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static pdx_status_t parse_endpoints(etcd_store_t *s, const char *list)
{
    const char *p = list;
    for (int guard = 0; guard < 64 && p != NULL && *p; guard++) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        while (n > 0 && p[0] == ' ') {
            p++;
            n--;
        }
        while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '/')) {
            n--;
        }
        if (n > 0) {
            if (s->nendpoints == ETCD_MAX_ENDPOINTS || n >= 256 ||
                (strncmp(p, "http://", 7) != 0 &&
                 strncmp(p, "https://", 8) != 0)) {
                pdx_error("store etcd: endpoint '%.*s': expected up to %d "
                          "http:// or https:// URLs", (int)n, p,
                          ETCD_MAX_ENDPOINTS);
                return PDX_ERR_CONFIG;
            }
            s->endpoints[s->nendpoints++] = strndup(p, n);
        }
        p = end ? end + 1 : NULL;
    }
    if (s->nendpoints == 0) {
        pdx_error("store etcd: no endpoint given");
        return PDX_ERR_CONFIG;
    }
    return PDX_OK;
}

pdx_status_t etcd_create(const pdx_store_host_t *host,
                         const pdx_store_params_t *p, void **st_p)
{
    char why[128];
    if (host == NULL || p == NULL || st_p == NULL) {
        return PDX_ERR_INVALID;
    }
    if (etcd_query(why, sizeof(why)) != PDX_OK) {
        pdx_error("store etcd: %s", why);
        return PDX_ERR_UNAVAILABLE;
    }
    size_t nsl = p->ns ? strlen(p->ns) : 0;
    if (nsl == 0 || nsl >= 128 || p->ns[nsl - 1] == '/') {
        pdx_error("store etcd: namespace '%s': expected 1-127 bytes not "
                  "ending in '/'", p->ns ? p->ns : "(null)");
        return PDX_ERR_CONFIG;
    }
    for (size_t i = 0; i < nsl; i++) {
        char c = p->ns[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-' ||
              c == '/')) {
            pdx_error("store etcd: namespace '%s': character '%c' not in "
                      "[A-Za-z0-9._/-]", p->ns, c);
            return PDX_ERR_CONFIG;
        }
    }
    etcd_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->pub_lock, NULL);
    pthread_mutex_init(&s->deliver, NULL);
    pthread_mutex_init(&s->glock, NULL);
    pthread_mutex_init(&s->auth_lock, NULL);
    s->host = *host;
    if (s->host.agent_name == NULL) {
        s->host.agent_name = "?";
    }
    snprintf(s->ns, sizeof(s->ns), "%s", p->ns);
    pdx_status_t st = parse_endpoints(s, p->endpoints);
    if (st == PDX_OK && s->nendpoints > 1) {
        /* Processes spread over the members; a process's agents share
         * one (and its connections). */
        s->ep = (uint32_t)getpid() % s->nendpoints;
    }
    if (st == PDX_OK) {
        st = etcd_opts_parse(s, p->opts, p->nopts); /* TLS, auth */
    }
    if (st != PDX_OK) {
        etcd_free(s);
        return st;
    }
    uint32_t ttl_ms = p->lease_ttl_ms ? p->lease_ttl_ms : 10000;
    s->ttl_s = (ttl_ms + 999) / 1000;
    s->timeout_ms = p->timeout_ms ? p->timeout_ms : DEFAULT_TIMEOUT_MS;
    s->retry_min_ms = p->retry_min_ms ? p->retry_min_ms : DEFAULT_RETRY_MIN_MS;
    s->retry_max_ms = p->retry_max_ms ? p->retry_max_ms : DEFAULT_RETRY_MAX_MS;
    if (s->retry_max_ms < s->retry_min_ms) {
        s->retry_max_ms = s->retry_min_ms;
    }
    s->max_txn_ops = p->max_txn_ops >= 2 ? p->max_txn_ops : DEFAULT_TXN_OPS;
    s->next_watch_id = 1;
    s->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (s->hdrs != NULL) {
        /* No "Expect: 100-continue" round trip for large blobs. */
        struct curl_slist *h2 = curl_slist_append(s->hdrs, "Expect:");
        s->hdrs = h2 ? h2 : s->hdrs;
    }
    s->ghdrs = curl_slist_append(NULL, "content-type: application/grpc");
    if (s->ghdrs != NULL) {
        struct curl_slist *h2 = curl_slist_append(s->ghdrs, "te: trailers");
        s->ghdrs = h2 ? h2 : s->ghdrs;
    }
    bool handles = true;
    for (size_t i = 0; i < ETCD_PARALLEL; i++) {
        s->gh[i] = curl_easy_init();
        handles = handles && s->gh[i] != NULL;
    }
    if (s->hdrs == NULL || s->ghdrs == NULL || !handles) {
        etcd_free(s);
        return PDX_ERR_NOMEM;
    }
    /* Instances with module options (TLS, auth: their own token) keep a
     * client of their own; the others share the process's. */
    st = etcd_client_attach(s, p->nopts == 0 ? p->endpoints : NULL);
    if (st != PDX_OK) {
        etcd_free(s);
        return st;
    }
    pdx_info("store etcd: agent %s: %s, namespace %s, lease TTL %u s, "
             "timeout %u ms", s->host.agent_name, s->endpoints[0], s->ns,
             s->ttl_s, s->timeout_ms);
    *st_p = s;
    return PDX_OK;
}

void etcd_destroy(void *st)
{
    etcd_store_t *s = st;
    if (s == NULL) {
        return;
    }
    /* No callback, stream or renewal of s after this. */
    etcd_client_detach(s);
    /* Revoke: our keys vanish now rather than at the TTL, so peers learn
     * at once that this agent is gone. */
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->lease;
    bool reachable = s->reachable;
    pthread_mutex_unlock(&s->lock);
    if (lease != 0 && reachable) {
        cJSON *req = cJSON_CreateObject(), *resp = NULL;
        CURL *h = etcd_handle_get(s);
        if (req != NULL && h != NULL) {
            etcd_json_add_i64(req, "ID", lease);
            if (etcd_call(s, h, "/v3/lease/revoke", req, &resp, true,
                          NULL, 0) == PDX_OK) {
                pdx_debug("store etcd: lease %llx revoked",
                          (unsigned long long)lease);
            }
        }
        etcd_handle_put(s, h);
        cJSON_Delete(req);
        cJSON_Delete(resp);
    }
    etcd_client_release(s->client);
    etcd_free(s);
}

static etcd_leased_t *leased_find_locked(etcd_store_t *s, const char *key)
{
    for (etcd_leased_t *k = s->leased; k != NULL; k = k->next) {
        if (strcmp(k->key, key) == 0) {
            return k;
        }
    }
    return NULL;
}

pdx_status_t etcd_put(void *st, const char *key, const void *value,
                      size_t len, uint32_t flags)
{
    etcd_store_t *s = st;
    if (!etcd_valid_key(key) || (value == NULL && len > 0)) {
        pdx_error("store etcd: put: invalid key or value");
        return PDX_ERR_INVALID;
    }
    if (!(flags & PDX_STORE_PUT_LEASED)) {
        CURL *h = etcd_handle_get(s);
        if (h == NULL) {
            return PDX_ERR_NOMEM;
        }
        pdx_status_t r = etcd_put_raw(s, h, key, value, len, 0, false);
        etcd_handle_put(s, h);
        return r;
    }
    void *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        return PDX_ERR_NOMEM;
    }
    if (len > 0) {
        memcpy(copy, value, len);
    }
    pthread_mutex_lock(&s->pub_lock);
    pthread_mutex_lock(&s->lock);
    etcd_leased_t *k = leased_find_locked(s, key);
    if (k == NULL) {
        k = calloc(1, sizeof(*k));
        char *kd = k ? strdup(key) : NULL;
        if (kd == NULL) {
            free(k);
            free(copy);
            pthread_mutex_unlock(&s->lock);
            pthread_mutex_unlock(&s->pub_lock);
            return PDX_ERR_NOMEM;
        }
        k->key = kd;
        k->next = s->leased;
        s->leased = k;
    }
    free(k->value);
    k->value = copy;
    k->len = len;
    k->lease_put = 0;
    int64_t lease = s->lease;
    pthread_mutex_unlock(&s->lock);
    pdx_status_t r = PDX_INPROGRESS;
    if (lease != 0) {
        CURL *h = etcd_handle_get(s);
        r = h ? etcd_put_raw(s, h, key, value, len, lease, false)
              : PDX_ERR_NOMEM;
        etcd_handle_put(s, h);
        pthread_mutex_lock(&s->lock);
        bool lost = false;
        if (r == PDX_OK) {
            k->lease_put = lease;
        } else if (r == PDX_ERR_NOT_FOUND && s->lease == lease) {
            s->lease = 0; /* expired: the lease thread grants a new one */
            s->lease_retry_at_ns = pdx_now_ns();
            lost = true;
        }
        pthread_mutex_unlock(&s->lock);
        if (lost) {
            etcd_lease_kick(s->client);
        }
        if (r == PDX_ERR_NOT_FOUND || r == PDX_ERR_UNAVAILABLE) {
            r = PDX_INPROGRESS;
        }
    }
    pthread_mutex_unlock(&s->pub_lock);
    if (r == PDX_INPROGRESS) {
        etcd_wake(s);
    }
    return r;
}

pdx_status_t etcd_get(void *st, const char *key, void **value_p,
                      size_t *len_p, int64_t *rev_p)
{
    etcd_store_t *s = st;
    if (!etcd_valid_key(key) || value_p == NULL || len_p == NULL) {
        return PDX_ERR_INVALID;
    }
    char *full = etcd_full_key(s, key);
    if (full == NULL) {
        return PDX_ERR_NOMEM;
    }
    etcd_kv_read_t o;
    pdx_status_t r = etcd_read_key(s, NULL, full, false, &o);
    free(full);
    if (r == PDX_OK && !o.present) {
        r = PDX_ERR_NOT_FOUND;
    } else if (r == PDX_OK) {
        *value_p = o.value;
        *len_p = o.len;
        o.value = NULL;
        if (rev_p != NULL) {
            *rev_p = o.mod_rev;
        }
    }
    etcd_kv_read_free(&o);
    return r;
}

pdx_status_t etcd_del(void *st, const char *key)
{
    etcd_store_t *s = st;
    if (!etcd_valid_key(key)) {
        return PDX_ERR_INVALID;
    }
    pthread_mutex_lock(&s->pub_lock);
    pthread_mutex_lock(&s->lock);
    for (etcd_leased_t **pp = &s->leased; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->key, key) == 0) {
            etcd_leased_t *k = *pp;
            *pp = k->next;
            free(k->key);
            free(k->value);
            free(k);
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    char *kb = etcd_key_b64(s, key);
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    CURL *h = etcd_handle_get(s);
    pdx_status_t r = PDX_ERR_NOMEM;
    if (kb != NULL && req != NULL && h != NULL) {
        cJSON_AddStringToObject(req, "key", kb);
        r = etcd_call(s, h, "/v3/kv/deleterange", req, &resp, false, NULL, 0);
    }
    pthread_mutex_unlock(&s->pub_lock);
    etcd_handle_put(s, h);
    free(kb);
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return r;
}
