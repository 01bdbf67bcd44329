/* The etcd store module (libpdx_store_etcd.so): pdx's discovery, liveness
 * and block-owner registry on etcd v3, through its JSON gateway.
 *
 * One thread per instance keeps the lease alive (keepalive every TTL/3),
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

#define DEFAULT_TIMEOUT_MS 2000
#define DEFAULT_RETRY_MIN_MS 100
#define DEFAULT_RETRY_MAX_MS 5000
#define DEFAULT_TXN_OPS 128
#define LIST_PAGE 512    /* keys a listing request */
#define MUX_GAP_MS 50    /* key-watch stream reopened at most this often */
#define LEASE_BATCH 64   /* renewals in one keepalive request */
#define MUX_CREATE_WAIT_MS 5000 /* every key acknowledged by then */
#define MUX_MSG_MAX (64u << 20) /* largest WatchResponse taken */
#define IDLE_WAIT_MS 600000 /* an idle client thread sleeps at most this */

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init = CURLE_OK;

static void curl_init_once(void)
{
    g_curl_init = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static bool valid_key(const char *k)
{
    size_t n = k ? strlen(k) : 0;
    if (n == 0 || n >= PDX_STORE_KEY_MAX) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (k[i] <= ' ' || k[i] > '~') {
            return false;
        }
    }
    return true;
}

static bool valid_block(const char *b)
{
    size_t n = b ? strlen(b) : 0;
    if (n == 0 || n > 128) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (!((b[i] >= '0' && b[i] <= '9') || (b[i] >= 'a' && b[i] <= 'f'))) {
            return false;
        }
    }
    return true;
}

static bool valid_owner(const char *o)
{
    size_t n = o ? strlen(o) : 0;
    if (n == 0 || n >= 64) {
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char c = o[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            return false;
        }
    }
    return true;
}

static void wake(etcd_store_t *s)
{
    curl_multi_wakeup(s->client->multi);
}

static uint32_t backoff_next(etcd_store_t *s, uint32_t cur)
{
    uint32_t b = cur ? cur * 2 : s->retry_min_ms;
    return b > s->retry_max_ms ? s->retry_max_ms : b;
}

/* ---- events ---- */

static void queue_event(etcd_store_t *s, uint64_t watch_id,
                        pdx_store_event_type_t type, uint32_t flags,
                        const char *key, const void *value, size_t vlen,
                        int64_t rev, int64_t lease)
{
    size_t klen = strlen(key);
    etcd_event_t *e = malloc(sizeof(*e) + klen + 1 + vlen + 1);
    if (e == NULL) {
        pdx_error("store etcd: out of memory: dropped an event of %s", key);
        return;
    }
    e->next = NULL;
    e->watch_id = watch_id;
    memcpy(e->mem, key, klen + 1);
    if (vlen > 0) {
        memcpy(e->mem + klen + 1, value, vlen);
    }
    e->mem[klen + 1 + vlen] = '\0';
    e->ev = (pdx_store_event_t){
        .type = type, .flags = flags, .key = e->mem,
        .value = type == PDX_STORE_EV_PUT ? e->mem + klen + 1 : NULL,
        .value_len = type == PDX_STORE_EV_PUT ? vlen : 0, .revision = rev,
        .lease = lease};
    pthread_mutex_lock(&s->lock);
    s->events++;
    s->event_bytes += klen + vlen;
    pthread_mutex_unlock(&s->lock);
    if (s->evq_tail != NULL) {
        s->evq_tail->next = e;
    } else {
        s->evq = e;
    }
    s->evq_tail = e;
}

static etcd_watch_t *find_watch_locked(etcd_store_t *s, uint64_t id)
{
    for (etcd_watch_t *w = s->watches; w != NULL; w = w->next) {
        if (w->id == id && !w->removed) {
            return w;
        }
    }
    return NULL;
}

static void fill_status_locked(etcd_store_t *s, pdx_store_status_t *o);

/* Hand queued events and state changes to the host, no lock but
 * `deliver` held (unwatch waits on it). */
static void deliver(etcd_store_t *s)
{
    pthread_mutex_lock(&s->lock);
    etcd_event_t *list = s->evq;
    s->evq = s->evq_tail = NULL;
    bool dirty = s->state_dirty;
    s->state_dirty = false;
    pdx_store_status_t status;
    if (dirty) {
        fill_status_locked(s, &status);
    }
    pthread_mutex_unlock(&s->lock);
    if (list == NULL && !dirty) {
        return;
    }
    pthread_mutex_lock(&s->deliver);
    if (dirty && s->host.state_change != NULL) {
        s->host.state_change(s->host.ctx, &status);
    }
    while (list != NULL) {
        etcd_event_t *e = list;
        list = e->next;
        pthread_mutex_lock(&s->lock);
        bool live = find_watch_locked(s, e->watch_id) != NULL;
        pthread_mutex_unlock(&s->lock);
        if (live && s->host.watch_event != NULL) {
            s->host.watch_event(s->host.ctx, e->watch_id, &e->ev);
        }
        free(e);
    }
    pthread_mutex_unlock(&s->deliver);
}

/* ---- known keys of a prefix watch (for resyncs) ---- */

static ssize_t known_find(const etcd_watch_t *w, const char *key)
{
    for (size_t i = 0; i < w->nknown; i++) {
        if (strcmp(w->known[i].key, key) == 0) {
            return (ssize_t)i;
        }
    }
    return -1;
}

static void known_set(etcd_watch_t *w, const char *key, int64_t rev)
{
    ssize_t i = known_find(w, key);
    if (i >= 0) {
        w->known[i].rev = rev;
        return;
    }
    if (w->nknown == w->known_cap) {
        size_t cap = w->known_cap ? w->known_cap * 2 : 16;
        etcd_known_t *k = realloc(w->known, cap * sizeof(*k));
        if (k == NULL) {
            return;
        }
        w->known = k;
        w->known_cap = cap;
    }
    char *dup = strdup(key);
    if (dup != NULL) {
        w->known[w->nknown++] = (etcd_known_t){dup, rev};
    }
}

static void known_del(etcd_watch_t *w, const char *key)
{
    ssize_t i = known_find(w, key);
    if (i >= 0) {
        free(w->known[i].key);
        w->known[i] = w->known[--w->nknown];
    }
}

static void known_free(etcd_watch_t *w)
{
    for (size_t i = 0; i < w->nknown; i++) {
        free(w->known[i].key);
    }
    free(w->known);
    w->known = NULL;
    w->nknown = w->known_cap = 0;
}

/* Relative key of a full one from etcd, or NULL when outside the
 * namespace. */
static const char *rel_key(etcd_store_t *s, const char *full)
{
    size_t n = strlen(s->ns);
    if (strncmp(full, s->ns, n) != 0 || full[n] != '/') {
        return NULL;
    }
    return full + n + 1;
}

static bool str_in(char *const *v, size_t n, const char *k)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i] != NULL && strcmp(v[i], k) == 0) {
            return true;
        }
    }
    return false;
}

/* List the watch's prefix, LIST_PAGE keys a request, all pages at the
 * revision of the first (one snapshot), and report what changed since
 * what it reported (client thread, blocking: each page within the
 * timeout). */
static pdx_status_t watch_resync(etcd_store_t *s, etcd_watch_t *w)
{
    char *full = etcd_full_key(s, w->prefix);
    char *eb = full ? etcd_prefix_end_b64(full) : NULL;
    size_t from_len = full ? strlen(full) : 0;
    char *from = full ? malloc(from_len + 1) : NULL;
    if (from == NULL || eb == NULL) {
        free(full);
        free(eb);
        free(from);
        return PDX_ERR_NOMEM;
    }
    memcpy(from, full, from_len);
    int64_t rev = 0;
    char **seen = NULL;
    size_t nseen = 0, seen_cap = 0, puts = 0, dels = 0, pages = 0;
    pdx_status_t st = PDX_OK;
    bool complete = false;
    for (int guard = 0; guard < 1000000 && st == PDX_OK && !complete;
         guard++) {
        char *kb = etcd_b64_enc(from, from_len);
        cJSON *req = cJSON_CreateObject(), *resp = NULL;
        st = PDX_ERR_NOMEM;
        if (kb != NULL && req != NULL) {
            cJSON_AddStringToObject(req, "key", kb);
            cJSON_AddStringToObject(req, "range_end", eb);
            etcd_json_add_i64(req, "limit", LIST_PAGE);
            if (rev > 0) {
                etcd_json_add_i64(req, "revision", rev);
            }
            st = etcd_call(s, s->client->th, "/v3/kv/range", req, &resp, true,
                           NULL, 0);
        }
        free(kb);
        cJSON_Delete(req);
        if (st != PDX_OK) {
            break;
        }
        pages++;
        if (rev == 0) {
            rev = etcd_json_i64(
                cJSON_GetObjectItemCaseSensitive(resp, "header"), "revision");
        }
        const cJSON *kvs = cJSON_GetObjectItemCaseSensitive(resp, "kvs");
        const cJSON *kv;
        char *last = NULL;
        size_t last_len = 0;
        cJSON_ArrayForEach(kv, kvs)
        {
            const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
            size_t klen = 0, vlen = 0;
            char *key = cJSON_IsString(k) ? etcd_b64_dec(k->valuestring, &klen)
                                          : NULL;
            void *val = cJSON_IsString(v)
                            ? etcd_b64_dec(v->valuestring, &vlen) : NULL;
            const char *rel = key && strlen(key) == klen ? rel_key(s, key)
                                                         : NULL;
            if (rel != NULL) {
                int64_t mrev = etcd_json_i64(kv, "mod_revision");
                ssize_t i = known_find(w, rel);
                if (i < 0 || w->known[i].rev != mrev) {
                    queue_event(s, w->id, PDX_STORE_EV_PUT,
                                PDX_STORE_EVF_RESYNC, rel, val,
                                val ? vlen : 0, mrev,
                                etcd_json_i64(kv, "lease"));
                    known_set(w, rel, mrev);
                    puts++;
                }
                if (nseen == seen_cap) {
                    size_t cap = seen_cap ? seen_cap * 2 : 64;
                    char **ns = realloc(seen, cap * sizeof(*ns));
                    if (ns != NULL) {
                        seen = ns;
                        seen_cap = cap;
                    }
                }
                if (nseen < seen_cap) {
                    seen[nseen++] = strdup(rel);
                }
            }
            if (key != NULL) {
                free(last);
                last = key;
                last_len = klen;
            }
            free(val);
        }
        bool more = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(resp,
                                                                  "more"));
        cJSON_Delete(resp);
        if (!more || last == NULL) {
            free(last);
            complete = true;
            break;
        }
        /* The next page starts right after the last key (key + NUL). */
        char *nf = realloc(last, last_len + 1);
        if (nf == NULL) {
            free(last);
            st = PDX_ERR_NOMEM;
            break;
        }
        nf[last_len] = '\0';
        free(from);
        from = nf;
        from_len = last_len + 1;
    }
    /* Keys reported before and gone now were deleted meanwhile (only
     * when every page came: else the next resync finds them). */
    for (size_t i = 0; complete && i < w->nknown;) {
        if (str_in(seen, nseen, w->known[i].key)) {
            i++;
            continue;
        }
        queue_event(s, w->id, PDX_STORE_EV_DELETE, PDX_STORE_EVF_RESYNC,
                    w->known[i].key, NULL, 0, rev, 0);
        dels++;
        free(w->known[i].key);
        w->known[i] = w->known[--w->nknown];
    }
    for (size_t j = 0; j < nseen; j++) {
        free(seen[j]);
    }
    free(seen);
    free(from);
    free(full);
    free(eb);
    if (!complete) {
        return st != PDX_OK ? st : PDX_ERR_IO;
    }
    pdx_debug("store etcd: watch %s resynced at revision %lld in %zu "
              "page(s): %zu put, %zu deleted", w->prefix, (long long)rev,
              pages, puts, dels);
    w->next_rev = rev + 1;
    w->need_resync = false;
    return PDX_OK;
}

/* One line of a prefix watch's stream: {"result": {...}} or
 * {"error": {...}}. */
static void stream_line(etcd_store_t *s, etcd_watch_t *w, const char *line,
                        size_t n)
{
    cJSON *j = cJSON_ParseWithLength(line, n);
    const cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (!cJSON_IsObject(res)) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        pdx_warn("store etcd: watch %s: stream error: %s", w->prefix,
                 cJSON_IsString(m) ? m->valuestring : "unparsable message");
        w->broken = true;
        cJSON_Delete(j);
        return;
    }
    const cJSON *hdr = cJSON_GetObjectItemCaseSensitive(res, "header");
    int64_t hrev = etcd_json_i64(hdr, "revision");
    if (hrev > 0) {
        etcd_note_ok(s, hrev);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "created"))) {
        w->created = true;
        w->backoff_ms = 0;
        if (w->next_rev == 0) {
            w->next_rev = hrev + 1;
        }
        pthread_mutex_lock(&s->lock);
        w->up = true;
        pthread_mutex_unlock(&s->lock);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "canceled"))) {
        int64_t compact = etcd_json_i64(res, "compact_revision");
        if (compact > 0) {
            pdx_info("store etcd: watch %s: revision %lld was compacted "
                     "(oldest kept %lld): listing the prefix instead",
                     w->prefix, (long long)w->next_rev, (long long)compact);
            w->need_resync = true;
        } else {
            pdx_warn("store etcd: watch %s canceled by the server",
                     w->prefix);
        }
        w->broken = true;
    }
    int64_t last = 0;
    const cJSON *ev;
    cJSON_ArrayForEach(ev, cJSON_GetObjectItemCaseSensitive(res, "events"))
    {
        const cJSON *kv = cJSON_GetObjectItemCaseSensitive(ev, "kv");
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(ev, "type");
        bool del = cJSON_IsString(t) && strcmp(t->valuestring, "DELETE") == 0;
        int64_t mrev = etcd_json_i64(kv, "mod_revision");
        if (mrev < w->next_rev) {
            continue; /* reported before the stream was reopened */
        }
        if (mrev > last) {
            last = mrev;
        }
        const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
        size_t klen = 0, vlen = 0;
        char *key = cJSON_IsString(k) ? etcd_b64_dec(k->valuestring, &klen)
                                      : NULL;
        void *val = !del && cJSON_IsString(v)
                        ? etcd_b64_dec(v->valuestring, &vlen) : NULL;
        const char *rel = key && strlen(key) == klen ? rel_key(s, key) : NULL;
        if (rel != NULL) {
            queue_event(s, w->id, del ? PDX_STORE_EV_DELETE : PDX_STORE_EV_PUT,
                        0, rel, val, val ? vlen : 0, mrev,
                        etcd_json_i64(kv, "lease"));
            if (del) {
                known_del(w, rel);
            } else {
                known_set(w, rel, mrev);
            }
        }
        free(key);
        free(val);
    }
    if (last >= w->next_rev) {
        w->next_rev = last + 1;
    }
    cJSON_Delete(j);
}

static size_t stream_data(char *p, size_t size, size_t nmemb, void *arg)
{
    etcd_watch_t *w = arg;
    size_t n = size * nmemb;
    etcd_buf_add(&w->rx, p, n);
    return n;
}

/* Split received bytes into lines; line(arg, line, len) for each, until
 * stop() says so. Keeps a partial last line. */
static void split_lines(etcd_buf_t *rx, void (*line)(void *, const char *,
                                                     size_t),
                        bool (*stop)(void *), void *arg)
{
    size_t start = 0;
    for (size_t i = 0; i < rx->len && !stop(arg); i++) {
        if (rx->data[i] == '\n') {
            if (i > start) {
                line(arg, rx->data + start, i - start);
            }
            start = i + 1;
        }
    }
    if (start > 0 && start <= rx->len) {
        memmove(rx->data, rx->data + start, rx->len - start);
        rx->len -= start;
    }
}

static void w_line(void *arg, const char *l, size_t n)
{
    etcd_watch_t *w = arg;
    stream_line(w->owner, w, l, n);
}

static bool w_stop(void *arg)
{
    return ((etcd_watch_t *)arg)->broken;
}

static void stream_drain(etcd_watch_t *w)
{
    split_lines(&w->rx, w_line, w_stop, w);
}

static void stream_close(etcd_client_t *c, etcd_watch_t *w)
{
    if (w->h != NULL) {
        curl_multi_remove_handle(c->multi, w->h);
        curl_easy_cleanup(w->h);
        w->h = NULL;
    }
    free(w->body);
    w->body = NULL;
    etcd_buf_free(&w->rx);
    w->created = false;
    w->broken = false;
    pthread_mutex_lock(&w->owner->lock);
    w->up = false;
    pthread_mutex_unlock(&w->owner->lock);
}

/* The wait before a retry after a backoff of `ms`: between half of it and
 * all of it (jitter: clients that failed together retry apart). */
static uint64_t backoff_ns(uint32_t ms)
{
    return etcd_rand_range((uint64_t)ms * 500000ull,
                           (uint64_t)ms * 1000000ull);
}

static void stream_retry_later(etcd_store_t *s, etcd_watch_t *w)
{
    w->backoff_ms = backoff_next(s, w->backoff_ms);
    w->retry_at_ns = etcd_now_ns() + backoff_ns(w->backoff_ms);
}

static void stream_open(etcd_store_t *s, etcd_watch_t *w)
{
    etcd_client_t *c = s->client;
    if (w->need_resync && watch_resync(s, w) != PDX_OK) {
        stream_retry_later(s, w);
        return;
    }
    char *full = etcd_full_key(s, w->prefix);
    char *kb = full ? etcd_b64_enc(full, strlen(full)) : NULL;
    char *eb = full ? etcd_prefix_end_b64(full) : NULL;
    cJSON *req = cJSON_CreateObject();
    cJSON *cr = cJSON_AddObjectToObject(req, "create_request");
    if (kb != NULL && eb != NULL && cr != NULL) {
        cJSON_AddStringToObject(cr, "key", kb);
        cJSON_AddStringToObject(cr, "range_end", eb);
        if (w->next_rev > 0) {
            etcd_json_add_i64(cr, "start_revision", w->next_rev);
        }
        w->body = cJSON_PrintUnformatted(req);
    }
    free(full);
    free(kb);
    free(eb);
    cJSON_Delete(req);
    w->h = w->body ? curl_easy_init() : NULL;
    if (w->h == NULL) {
        stream_close(c, w);
        stream_retry_later(s, w);
        return;
    }
    pthread_mutex_lock(&s->lock);
    const char *endpoint = s->endpoints[s->ep];
    pthread_mutex_unlock(&s->lock);
    etcd_easy_setup(s, w->h, endpoint, "/v3/watch", w->body, NULL, 0);
    curl_easy_setopt(w->h, CURLOPT_WRITEFUNCTION, stream_data);
    curl_easy_setopt(w->h, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(w->h, CURLOPT_PRIVATE, w);
    if (curl_multi_add_handle(c->multi, w->h) != CURLM_OK) {
        stream_close(c, w);
        stream_retry_later(s, w);
    }
}

/* ---- key watches: one multiplexed stream per client ----
 *
 * Every watched key of every member goes in one gRPC Watch call: one
 * WatchRequest frame a key, each with its own watch_id (etcd keeps the
 * watches of a half-closed stream). When the set of keys changes the
 * stream is reopened with the new set (at most every MUX_GAP_MS), each key
 * from the revision after the last one it reported, so nothing is lost;
 * duplicates are dropped per subscriber by revision. */

static void mux_set_up(etcd_client_t *c, etcd_kw_t *kw, bool up)
{
    (void)c;
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        pthread_mutex_lock(&w->owner->lock);
        w->up = up;
        pthread_mutex_unlock(&w->owner->lock);
    }
}

static void mux_close(etcd_client_t *c)
{
    if (c->mh != NULL) {
        curl_multi_remove_handle(c->multi, c->mh);
        curl_easy_cleanup(c->mh);
        c->mh = NULL;
    }
    free(c->mbody);
    c->mbody = NULL;
    etcd_buf_free(&c->mrx);
    c->mrep = NULL;
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        if (kw->created) {
            mux_set_up(c, kw, false);
        }
        kw->created = false;
        kw->wid = 0;
    }
}

static void mux_retry_later(etcd_client_t *c, etcd_store_t *s)
{
    c->mbackoff_ms = s ? backoff_next(s, c->mbackoff_ms)
                       : DEFAULT_RETRY_MIN_MS;
    c->mretry_at_ns = etcd_now_ns() + backoff_ns(c->mbackoff_ms);
    c->mbroken = true;
}

static size_t mux_data(char *p, size_t size, size_t nmemb, void *arg)
{
    etcd_client_t *c = arg;
    size_t n = size * nmemb;
    etcd_buf_add(&c->mrx, p, n);
    c->rx_bytes += n;
    return n;
}

static void kw_free(etcd_kw_t *kw)
{
    free(kw->full);
    free(kw);
}

/* Take watch w off its key; a key nobody wants leaves the stream. */
static void kw_unsub(etcd_client_t *c, etcd_watch_t *w)
{
    etcd_kw_t *kw = w->kw;
    if (kw == NULL) {
        return;
    }
    for (etcd_watch_t **pp = &kw->subs; *pp != NULL; pp = &(*pp)->kw_next) {
        if (*pp == w) {
            *pp = w->kw_next;
            break;
        }
    }
    w->kw = NULL;
    w->kw_next = NULL;
    if (kw->subs != NULL) {
        return;
    }
    for (etcd_kw_t **pp = &c->keys; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == kw) {
            *pp = kw->next;
            c->nkeys--;
            break;
        }
    }
    kw_free(kw);
    c->mdirty = true;
}

/* Put key watch w on its key (a new key joins the stream). */
static void kw_sub(etcd_client_t *c, etcd_watch_t *w)
{
    char *full = etcd_full_key(w->owner, w->prefix);
    if (full == NULL) {
        return; /* retried at the next pass */
    }
    etcd_kw_t *kw = c->keys;
    while (kw != NULL && strcmp(kw->full, full) != 0) {
        kw = kw->next;
    }
    if (kw == NULL) {
        kw = calloc(1, sizeof(*kw));
        if (kw == NULL) {
            free(full);
            return;
        }
        kw->full = full;
        full = NULL;
        kw->next = c->keys;
        c->keys = kw;
        c->nkeys++;
        c->mdirty = true;
    }
    free(full);
    w->kw = kw;
    w->kw_next = kw->subs;
    kw->subs = w;
    if (!w->need_resync) {
        if (w->next_rev == 0) {
            w->next_rev = kw->created ? kw->pos : 0;
        } else if (kw->created && kw->pos > w->next_rev) {
            c->mdirty = true; /* wants history the stream is past */
        }
    }
    if (kw->created && !w->need_resync) {
        pthread_mutex_lock(&w->owner->lock);
        w->up = true;
        pthread_mutex_unlock(&w->owner->lock);
    }
}

/* Read the key of kw once for every subscriber that needs its current
 * value (a new watch with PDX_STORE_WATCH_INITIAL, or after a
 * compaction) and report what differs from what each was told. */
static pdx_status_t kw_read(etcd_client_t *c, etcd_kw_t *kw)
{
    etcd_watch_t *w0 = kw->subs;
    while (w0 != NULL && !w0->need_resync) {
        w0 = w0->kw_next;
    }
    if (w0 == NULL) {
        return PDX_OK;
    }
    etcd_store_t *s0 = w0->owner;
    char *kb = etcd_b64_enc(kw->full, strlen(kw->full));
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    pdx_status_t st = PDX_ERR_NOMEM;
    if (kb != NULL && req != NULL) {
        cJSON_AddStringToObject(req, "key", kb);
        st = etcd_call(s0, c->th, "/v3/kv/range", req, &resp, true, NULL, 0);
    }
    free(kb);
    cJSON_Delete(req);
    if (st != PDX_OK) {
        return st;
    }
    int64_t rev = etcd_json_i64(
        cJSON_GetObjectItemCaseSensitive(resp, "header"), "revision");
    const cJSON *kv = cJSON_GetArrayItem(
        cJSON_GetObjectItemCaseSensitive(resp, "kvs"), 0);
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(kv, "key");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
    size_t klen = 0, vlen = 0;
    char *key = cJSON_IsString(k) ? etcd_b64_dec(k->valuestring, &klen) : NULL;
    bool present = key != NULL && strcmp(key, kw->full) == 0;
    void *val = present && cJSON_IsString(v)
                    ? etcd_b64_dec(v->valuestring, &vlen) : NULL;
    int64_t mrev = present ? etcd_json_i64(kv, "mod_revision") : 0;
    int64_t lease = present ? etcd_json_i64(kv, "lease") : 0;
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        if (!w->need_resync) {
            continue;
        }
        if (present && w->known_rev != mrev) {
            queue_event(w->owner, w->id, PDX_STORE_EV_PUT,
                        PDX_STORE_EVF_RESYNC, w->prefix, val,
                        val ? vlen : 0, mrev, lease);
            w->known_rev = mrev;
        } else if (!present && w->known_rev != 0) {
            queue_event(w->owner, w->id, PDX_STORE_EV_DELETE,
                        PDX_STORE_EVF_RESYNC, w->prefix, NULL, 0, rev, 0);
            w->known_rev = 0;
        }
        w->next_rev = rev + 1;
        w->need_resync = false;
        if (kw->created) {
            if (kw->pos > w->next_rev) {
                c->mdirty = true;
            } else {
                pthread_mutex_lock(&w->owner->lock);
                w->up = true;
                pthread_mutex_unlock(&w->owner->lock);
            }
        }
    }
    free(key);
    free(val);
    cJSON_Delete(resp);
    return PDX_OK;
}

static etcd_store_t *first_member(etcd_client_t *c)
{
    pthread_mutex_lock(&c->lock);
    etcd_store_t *s = c->members;
    while (s != NULL && s->detaching) {
        s = s->cnext;
    }
    pthread_mutex_unlock(&c->lock);
    return s;
}

static size_t mux_header(char *p, size_t size, size_t n, void *arg)
{
    etcd_client_t *c = arg;
    size_t len = size * n;
    static const char gs[] = "grpc-status:";
    if (len > sizeof(gs) - 1 && strncasecmp(p, gs, sizeof(gs) - 1) == 0) {
        int code = atoi(p + sizeof(gs) - 1);
        if (code != 0) {
            pdx_warn("store etcd: key-watch stream ended by etcd: grpc-status "
                     "%d", code);
            if (code == 16 && c->mrep != NULL) {
                etcd_auth_invalidate(c->mrep);
            }
        }
    }
    return len;
}

/* Open the stream: etcd's gRPC Watch over HTTP/2, one WatchRequest frame
 * a key. (The JSON gateway drops the create requests of a body it has
 * not read when it starts answering: one per stream only.) */
static void mux_open(etcd_client_t *c)
{
    etcd_store_t *rep = first_member(c);
    if (rep == NULL || c->keys == NULL) {
        return;
    }
    etcd_buf_t body = {0};
    uint64_t wid = 0;
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        int64_t start = kw->pos;
        for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
            if (!w->need_resync && w->next_rev > 0 &&
                (start == 0 || w->next_rev < start)) {
                start = w->next_rev;
            }
        }
        kw->pos = start;
        kw->created = false;
        kw->wid = ++wid;
        etcd_pb_watch_create(&body, kw->full, start, (int64_t)kw->wid);
    }
    c->mbody = body.data;
    c->mbody_len = body.len;
    c->mh = c->mbody ? curl_easy_init() : NULL;
    if (c->mh == NULL) {
        mux_close(c);
        mux_retry_later(c, rep);
        return;
    }
    pthread_mutex_lock(&rep->lock);
    char url[512];
    snprintf(url, sizeof(url), "%s/etcdserverpb.Watch/Watch",
             rep->endpoints[rep->ep]);
    bool tls = strncmp(rep->endpoints[rep->ep], "https://", 8) == 0;
    char endpoint[256];
    snprintf(endpoint, sizeof(endpoint), "%s", rep->endpoints[rep->ep]);
    pthread_mutex_unlock(&rep->lock);
    CURL *h = c->mh;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     tls ? (long)CURL_HTTP_VERSION_2TLS
                         : (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->mbody);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)c->mbody_len);
    etcd_auth_ensure(rep, endpoint);
    pthread_mutex_lock(&rep->lock);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, rep->ghdrs);
    pthread_mutex_unlock(&rep->lock);
    etcd_tls_setup(rep, h);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, mux_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, mux_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, c);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)rep->timeout_ms);
    /* A connection of its own: curl 7.88 fails streams that share a
     * prior-knowledge h2c connection ("Error in the HTTP2 framing
     * layer"). */
    curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(h, CURLOPT_PRIVATE, NULL);
    if (curl_multi_add_handle(c->multi, c->mh) != CURLM_OK) {
        mux_close(c);
        mux_retry_later(c, rep);
        return;
    }
    c->mrep = rep;
    c->mopened_ns = etcd_now_ns();
    c->mopens++;
    pdx_debug("store etcd: key-watch stream opened with %u key(s) (agent "
              "%s's client)", c->nkeys, rep->host.agent_name);
}

static etcd_kw_t *kw_by_wid(etcd_client_t *c, uint64_t wid)
{
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        if (kw->wid == wid) {
            return kw;
        }
    }
    return NULL;
}

typedef struct mux_ev_ctx {
    etcd_client_t *c;
    etcd_kw_t *kw;
} mux_ev_ctx_t;

static void mux_event(void *arg, const etcd_pb_event_t *ev)
{
    mux_ev_ctx_t *x = arg;
    etcd_kw_t *kw = x->kw;
    int64_t mrev = ev->mod_revision;
    if (mrev <= 0 || (kw->pos > 0 && mrev < kw->pos)) {
        return; /* reported before the stream was reopened */
    }
    if (ev->key_len != strlen(kw->full) ||
        memcmp(ev->key, kw->full, ev->key_len) != 0) {
        return; /* another key than the one asked for: untrusted */
    }
    kw->pos = mrev + 1;
    pdx_debug("store etcd: key watch %s: %s at revision %lld", kw->full,
              ev->is_delete ? "delete" : "put", (long long)mrev);
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        if (w->need_resync || mrev < w->next_rev) {
            continue;
        }
        queue_event(w->owner, w->id,
                    ev->is_delete ? PDX_STORE_EV_DELETE : PDX_STORE_EV_PUT, 0,
                    w->prefix, ev->is_delete ? NULL : ev->value,
                    ev->is_delete ? 0 : ev->value_len, mrev, ev->lease);
        w->next_rev = mrev + 1;
        w->known_rev = ev->is_delete ? 0 : mrev;
    }
}

/* One WatchResponse of the stream (untrusted bytes). */
static void mux_msg(etcd_client_t *c, const uint8_t *p, size_t n)
{
    etcd_pb_watch_t wr;
    if (etcd_pb_watch_resp(p, n, &wr, NULL, NULL) < 0) {
        pdx_warn("store etcd: key-watch stream: malformed message (%zu "
                 "bytes): reopening", n);
        mux_retry_later(c, c->mrep);
        return;
    }
    if (wr.revision > 0 && c->mrep != NULL) {
        etcd_note_ok(c->mrep, wr.revision);
    }
    etcd_kw_t *kw = wr.watch_id > 0 ? kw_by_wid(c, (uint64_t)wr.watch_id)
                                    : NULL;
    if (kw == NULL) {
        return; /* not one of ours, or a key dropped since */
    }
    if (wr.created) {
        kw->created = true;
        c->mbackoff_ms = 0;
        if (kw->pos == 0) {
            kw->pos = wr.revision + 1;
        }
        for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
            if (!w->need_resync && w->next_rev == 0) {
                w->next_rev = kw->pos;
            }
        }
        mux_set_up(c, kw, true);
    }
    if (wr.canceled) {
        if (wr.compact_revision > 0) {
            pdx_info("store etcd: key watch %s: revision %lld was compacted "
                     "(oldest kept %lld): reading the key instead", kw->full,
                     (long long)kw->pos, (long long)wr.compact_revision);
            for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
                w->need_resync = true;
            }
            kw->pos = 0;
            c->mdirty = true;
        } else {
            pdx_warn("store etcd: key watch %s canceled by the server",
                     kw->full);
            mux_retry_later(c, c->mrep);
        }
        mux_set_up(c, kw, false);
        kw->created = false;
        return;
    }
    mux_ev_ctx_t x = {c, kw};
    etcd_pb_watch_resp(p, n, &wr, mux_event, &x);
}

static bool mux_stop(void *arg)
{
    etcd_client_t *c = arg;
    return c->mh == NULL || (c->mbroken && c->mretry_at_ns > etcd_now_ns());
}

/* Reads, then a (re)open when the key set changed or the stream broke. */
static void mux_step(etcd_client_t *c, uint64_t now)
{
    if (now < c->mretry_at_ns) {
        return;
    }
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        if (kw_read(c, kw) != PDX_OK) {
            mux_retry_later(c, kw->subs ? kw->subs->owner : NULL);
            return;
        }
    }
    /* Every key acknowledged (created) within the wait, else the stream is
     * not to be trusted: reopened. */
    if (c->mh != NULL && !c->mbroken && !c->mdirty &&
        now >= c->mopened_ns + (uint64_t)MUX_CREATE_WAIT_MS * 1000000ull) {
        for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
            if (!kw->created) {
                pdx_warn("store etcd: key watch %s not created by etcd "
                         "within %u ms: reopening the stream", kw->full,
                         MUX_CREATE_WAIT_MS);
                c->mbroken = true;
                break;
            }
        }
    }
    bool gap_ok = c->mh == NULL || c->mbroken ||
                  now >= c->mopened_ns + (uint64_t)MUX_GAP_MS * 1000000ull;
    if ((c->mdirty || c->mbroken) && gap_ok) {
        mux_close(c);
        c->mdirty = c->mbroken = false;
        mux_open(c);
    }
}

/* The gRPC frames received so far (5-byte prefix: flag, length). */
static void mux_drain(etcd_client_t *c)
{
    size_t off = 0;
    for (int guard = 0; guard < 1000000 && c->mh != NULL && !mux_stop(c) &&
                        c->mrx.len - off >= 5;
         guard++) {
        const uint8_t *b = (const uint8_t *)c->mrx.data + off;
        size_t len = (size_t)b[1] << 24 | (size_t)b[2] << 16 |
                     (size_t)b[3] << 8 | (size_t)b[4];
        if (b[0] != 0 || len > MUX_MSG_MAX) {
            pdx_warn("store etcd: key-watch stream: bad frame (flag %u, %zu "
                     "bytes): reopening", b[0], len);
            mux_retry_later(c, c->mrep);
            off = c->mrx.len;
            break;
        }
        if (c->mrx.len - off - 5 < len) {
            break;
        }
        mux_msg(c, b + 5, len);
        off += 5 + len;
    }
    if (off > 0 && c->mrx.data != NULL) {
        memmove(c->mrx.data, c->mrx.data + off, c->mrx.len - off);
        c->mrx.len -= off;
    }
}

static bool mux_pending_reads(etcd_client_t *c)
{
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
            if (w->need_resync) {
                return true;
            }
        }
    }
    return false;
}

/* ---- lease (the client's lease thread) ---- */

/* Renewal period: a third of the TTL, +-10 % so that the members of a
 * fleet started together spread out. */
static uint64_t ka_period_ns(etcd_store_t *s)
{
    uint64_t ttl = s->lease_ttl_s ? s->lease_ttl_s : s->ttl_s;
    uint64_t p = ttl * 1000000000ull / 3;
    return etcd_rand_range(p - p / 10, p + p / 10);
}

static void lease_grant(etcd_store_t *s, CURL *h)
{
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    if (req == NULL) {
        return;
    }
    etcd_json_add_i64(req, "TTL", s->ttl_s);
    pdx_status_t st = etcd_call(s, h, "/v3/lease/grant", req, &resp, true,
                                NULL, 0);
    cJSON_Delete(req);
    uint64_t now = etcd_now_ns();
    pthread_mutex_lock(&s->lock);
    int64_t id = st == PDX_OK ? etcd_json_i64(resp, "ID") : 0;
    if (id != 0) {
        s->lease = id;
        s->lease_ttl_s = (uint32_t)etcd_json_i64(resp, "TTL");
        if (s->lease_ttl_s == 0) {
            s->lease_ttl_s = s->ttl_s;
        }
        s->leases_granted++;
        s->lease_backoff_ms = 0;
        s->keepalive_at_ns = now + ka_period_ns(s);
        s->republish_at_ns = 0;
        s->state_dirty = true;
        uint32_t nkeys = 0;
        for (etcd_leased_t *k = s->leased; k != NULL; k = k->next) {
            nkeys++;
        }
        if (s->leases_granted > 1) {
            pdx_warn("store etcd (ns %s, agent %s): new lease %llx (TTL "
                     "%u s) after the last one expired: publishing %u "
                     "key(s) again", s->ns, s->host.agent_name,
                     (unsigned long long)id, s->lease_ttl_s, nkeys);
        } else {
            pdx_info("store etcd (ns %s, agent %s): lease %llx granted "
                     "(TTL %u s)", s->ns, s->host.agent_name,
                     (unsigned long long)id, s->lease_ttl_s);
        }
    } else {
        s->lease_backoff_ms = backoff_next(s, s->lease_backoff_ms);
        s->lease_retry_at_ns = now + backoff_ns(s->lease_backoff_ms);
    }
    pthread_mutex_unlock(&s->lock);
    cJSON_Delete(resp);
}

/* The outcome of renewing `lease` of s: st PDX_OK with the TTL left (0:
 * expired), PDX_ERR_NOT_FOUND (expired), else not reached. */
static void lease_renewed(etcd_store_t *s, int64_t lease, pdx_status_t st,
                          int64_t ttl)
{
    uint64_t now = etcd_now_ns();
    pthread_mutex_lock(&s->lock);
    if (s->lease != lease) {
        pthread_mutex_unlock(&s->lock); /* replaced meanwhile */
        return;
    }
    if (st == PDX_OK && ttl > 0) {
        s->keepalive_at_ns = now + ka_period_ns(s);
        s->lease_backoff_ms = 0;
    } else if (st == PDX_OK || st == PDX_ERR_NOT_FOUND) {
        pdx_warn("store etcd (ns %s, agent %s): lease %llx expired (the "
                 "store did not hear from this agent for its TTL): "
                 "granting a new one", s->ns, s->host.agent_name,
                 (unsigned long long)lease);
        s->lease = 0;
        s->lease_retry_at_ns = now;
        s->state_dirty = true;
    } else {
        /* Unreachable: retry sooner than the period, and the streams may
         * be dead without knowing it (a partition sends no RST). */
        s->lease_backoff_ms = backoff_next(s, s->lease_backoff_ms);
        uint64_t period = (uint64_t)s->lease_ttl_s * 1000000000ull / 3;
        uint64_t wait = backoff_ns(s->lease_backoff_ms);
        s->keepalive_at_ns = now + (wait < period ? wait : period);
        s->restart_watches = true;
    }
    pthread_mutex_unlock(&s->lock);
}

/* Renew the leases of n members in one request: the gateway's keepalive
 * is a stream, and a body of one request a line gets one result a line.
 * A refusal that is not a result (auth) falls back to one call each. */
static void lease_keepalive_batch(etcd_client_t *c, etcd_store_t **ms,
                                  const int64_t *ids, size_t n)
{
    etcd_buf_t body = {0};
    for (size_t i = 0; i < n; i++) {
        char line[64];
        int l = snprintf(line, sizeof(line), "{\"ID\":\"%lld\"}\n",
                         (long long)ids[i]);
        etcd_buf_add(&body, line, (size_t)l);
    }
    etcd_store_t *s0 = ms[0];
    pthread_mutex_lock(&s0->lock);
    const char *endpoint = s0->endpoints[s0->ep];
    pthread_mutex_unlock(&s0->lock);
    etcd_buf_t out = {0};
    CURLcode cc = CURLE_OUT_OF_MEMORY;
    long code = 0;
    if (body.data != NULL) {
        etcd_easy_setup(s0, c->lh, endpoint, "/v3/lease/keepalive",
                        body.data, &out, (long)s0->timeout_ms);
        cc = curl_easy_perform(c->lh);
        curl_easy_getinfo(c->lh, CURLINFO_RESPONSE_CODE, &code);
    }
    int64_t *ttl = calloc(n, sizeof(*ttl));
    bool *got = calloc(n, sizeof(*got));
    int64_t rev = 0;
    size_t ngot = 0;
    for (size_t p = 0; cc == CURLE_OK && code == 200 && ttl && got &&
                       out.data != NULL && p < out.len;) {
        char *nl = memchr(out.data + p, '\n', out.len - p);
        size_t e = nl ? (size_t)(nl - out.data) : out.len;
        cJSON *j = cJSON_ParseWithLength(out.data + p, e - p);
        const cJSON *res = cJSON_GetObjectItemCaseSensitive(j, "result");
        int64_t id = etcd_json_i64(res, "ID");
        int64_t hr = etcd_json_i64(
            cJSON_GetObjectItemCaseSensitive(res, "header"), "revision");
        rev = hr > rev ? hr : rev;
        for (size_t i = 0; id != 0 && i < n; i++) {
            if (ids[i] == id && !got[i]) {
                got[i] = true;
                ttl[i] = etcd_json_i64(res, "TTL");
                ngot++;
                break;
            }
        }
        cJSON_Delete(j);
        p = e + 1;
    }
    for (size_t i = 0; i < n; i++) {
        etcd_store_t *s = ms[i];
        pthread_mutex_lock(&s->lock);
        s->requests += i == 0;
        s->keepalives++;
        pthread_mutex_unlock(&s->lock);
        if (got != NULL && got[i]) {
            etcd_note_ok(s, rev);
            lease_renewed(s, ids[i], PDX_OK, ttl[i]);
        } else if (cc == CURLE_OK && ngot == 0) {
            /* Not a stream of results: one call, with its auth retry. */
            cJSON *req = cJSON_CreateObject(), *resp = NULL;
            pdx_status_t st = PDX_ERR_NOMEM;
            if (req != NULL) {
                etcd_json_add_i64(req, "ID", ids[i]);
                st = etcd_call(s, c->lh, "/v3/lease/keepalive", req, &resp,
                               true, NULL, 0);
            }
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(resp,
                                                                "result");
            lease_renewed(s, ids[i], st, etcd_json_i64(res, "TTL"));
            cJSON_Delete(req);
            cJSON_Delete(resp);
        } else {
            char what[256];
            snprintf(what, sizeof(what), "%s/v3/lease/keepalive: %s",
                     endpoint, cc != CURLE_OK ? curl_easy_strerror(cc)
                                              : "no result for the lease");
            etcd_note_fail(s, what);
            lease_renewed(s, ids[i], PDX_ERR_UNAVAILABLE, 0);
        }
    }
    free(ttl);
    free(got);
    etcd_buf_free(&out);
    etcd_buf_free(&body);
}

static void cv_wait_until(etcd_client_t *c, uint64_t deadline_ns)
{
    if (deadline_ns == UINT64_MAX) {
        pthread_cond_wait(&c->cv, &c->lock);
        return;
    }
    struct timespec ts = {.tv_sec = (time_t)(deadline_ns / 1000000000ull),
                          .tv_nsec = (long)(deadline_ns % 1000000000ull)};
    pthread_cond_timedwait(&c->cv, &c->lock, &ts); /* CLOCK_MONOTONIC */
}

/* The lease thread: grants and renewals of every member, nothing else,
 * so a slow listing, put or callback never delays a keepalive. Due
 * renewals go together with those due within half a period: members
 * settle on one request per period. */
static void *lease_main(void *arg)
{
    etcd_client_t *c = arg;
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        uint64_t now = etcd_now_ns(), next = UINT64_MAX;
        etcd_store_t *grant[LEASE_BATCH], *keep[LEASE_BATCH];
        int64_t ids[LEASE_BATCH];
        size_t ng = 0, nk = 0;
        bool due = false;
        for (etcd_store_t *s = c->members; s != NULL; s = s->cnext) {
            if (s->detaching || s->lease_busy) {
                continue;
            }
            pthread_mutex_lock(&s->lock);
            if (s->lease == 0) {
                if (now >= s->lease_retry_at_ns && ng < LEASE_BATCH) {
                    grant[ng++] = s;
                    s->lease_busy = true;
                } else if (s->lease_retry_at_ns < next) {
                    next = s->lease_retry_at_ns;
                }
            } else if (now >= s->keepalive_at_ns) {
                due = true;
            } else if (s->keepalive_at_ns < next) {
                next = s->keepalive_at_ns;
            }
            pthread_mutex_unlock(&s->lock);
        }
        for (etcd_store_t *s = c->members; due && s != NULL; s = s->cnext) {
            if (s->detaching || s->lease_busy || nk == LEASE_BATCH) {
                continue;
            }
            pthread_mutex_lock(&s->lock);
            uint64_t half = (uint64_t)s->lease_ttl_s * 1000000000ull / 6;
            if (s->lease != 0 && s->keepalive_at_ns <= now + half) {
                uint64_t late = now > s->keepalive_at_ns
                                    ? (now - s->keepalive_at_ns) / 1000000
                                    : 0;
                if (late > s->lease_late_ms) {
                    s->lease_late_ms = late;
                }
                keep[nk] = s;
                ids[nk++] = s->lease;
                s->lease_busy = true;
            }
            pthread_mutex_unlock(&s->lock);
        }
        if (ng == 0 && nk == 0) {
            cv_wait_until(c, next);
            continue;
        }
        pthread_mutex_unlock(&c->lock);
        for (size_t i = 0; i < ng; i++) {
            lease_grant(grant[i], c->lh);
        }
        if (nk > 0) {
            lease_keepalive_batch(c, keep, ids, nk);
        }
        curl_multi_wakeup(c->multi); /* republish, state, streams */
        pthread_mutex_lock(&c->lock);
        for (size_t i = 0; i < ng; i++) {
            grant[i]->lease_busy = false;
        }
        for (size_t i = 0; i < nk; i++) {
            keep[i]->lease_busy = false;
        }
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* Wake the lease thread (a member lost its lease, or joined). No
 * instance lock held. */
static void lease_kick(etcd_client_t *c)
{
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

/* Put one key under `lease`. */
static pdx_status_t put_raw(etcd_store_t *s, CURL *h, const char *key,
                            const void *value, size_t len, int64_t lease,
                            bool force)
{
    char *kb = etcd_key_b64(s, key);
    char *vb = etcd_b64_enc(value ? value : "", len);
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    pdx_status_t st = PDX_ERR_NOMEM;
    if (kb != NULL && vb != NULL && req != NULL) {
        cJSON_AddStringToObject(req, "key", kb);
        cJSON_AddStringToObject(req, "value", vb);
        if (lease != 0) {
            etcd_json_add_i64(req, "lease", lease);
        }
        char err[256] = "";
        st = etcd_call(s, h, "/v3/kv/put", req, &resp, force, err,
                       sizeof(err));
        if (st != PDX_OK && st != PDX_ERR_UNAVAILABLE &&
            st != PDX_ERR_NOT_FOUND) {
            pdx_warn("store etcd: put %s: %s", key, err);
        }
    }
    free(kb);
    free(vb);
    cJSON_Delete(req);
    cJSON_Delete(resp);
    return st;
}

/* Publish leased keys not yet stored under the current lease (client
 * thread); a failure retries after a jittered backoff. */
static void republish_step(etcd_store_t *s, uint64_t now)
{
    bool lost = false;
    for (int guard = 0; guard < 1024; guard++) {
        pthread_mutex_lock(&s->pub_lock);
        pthread_mutex_lock(&s->lock);
        int64_t lease = s->lease;
        etcd_leased_t *k = s->leased;
        while (k != NULL && k->lease_put == lease) {
            k = k->next;
        }
        bool wait = now < s->republish_at_ns;
        pthread_mutex_unlock(&s->lock);
        if (lease == 0 || k == NULL || wait) {
            pthread_mutex_unlock(&s->pub_lock);
            break;
        }
        /* Entries change only under pub_lock: k stays valid. */
        pdx_status_t st = put_raw(s, s->client->th, k->key, k->value, k->len,
                                  lease, true);
        pthread_mutex_lock(&s->lock);
        if (st == PDX_OK) {
            k->lease_put = lease;
            s->republish_backoff_ms = 0;
            pdx_info("store etcd (ns %s): published %s (%zu bytes) under "
                     "lease %llx", s->ns, k->key, k->len,
                     (unsigned long long)lease);
        } else {
            if (st == PDX_ERR_NOT_FOUND && s->lease == lease) {
                s->lease = 0; /* lease gone: grant another, then retry */
                s->lease_retry_at_ns = etcd_now_ns();
                lost = true;
            }
            s->republish_backoff_ms = backoff_next(s,
                                                   s->republish_backoff_ms);
            s->republish_at_ns = etcd_now_ns() +
                                 backoff_ns(s->republish_backoff_ms);
        }
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_unlock(&s->pub_lock);
        if (st != PDX_OK) {
            break;
        }
    }
    if (lost) {
        lease_kick(s->client);
    }
}

static etcd_watch_t *watch_head(etcd_store_t *s)
{
    pthread_mutex_lock(&s->lock);
    etcd_watch_t *w = s->watches;
    pthread_mutex_unlock(&s->lock);
    return w;
}

static void watch_free(etcd_watch_t *w)
{
    free(w->prefix);
    free(w->body);
    etcd_buf_free(&w->rx);
    known_free(w);
    free(w);
}

static void watches_step(etcd_store_t *s, uint64_t now)
{
    etcd_client_t *c = s->client;
    pthread_mutex_lock(&s->lock);
    bool restart = s->restart_watches;
    s->restart_watches = false;
    pthread_mutex_unlock(&s->lock);
    if (restart && c->mh != NULL) {
        c->mbroken = true; /* reopened at once, from where it was */
    }
    /* The list only grows from other threads (at its head) and is pruned
     * here: after reading the head under the lock this thread may walk it
     * (`removed` is read under the lock). */
    etcd_watch_t *w = watch_head(s);
    for (; w != NULL;) {
        pthread_mutex_lock(&s->lock);
        bool removed = w->removed;
        etcd_watch_t *next = w->next;
        pthread_mutex_unlock(&s->lock);
        if (w->keyed) {
            if (removed) {
                kw_unsub(c, w);
            } else if (w->kw == NULL) {
                kw_sub(c, w);
            }
        } else if (removed) {
            if (w->h != NULL) {
                stream_close(c, w);
            }
        } else if (w->h != NULL && (restart || w->broken)) {
            bool resync = w->need_resync;
            stream_close(c, w);
            if (resync) {
                w->retry_at_ns = now; /* compacted: list and reopen now */
            } else {
                stream_retry_later(s, w);
            }
        } else if (w->h == NULL && now >= w->retry_at_ns) {
            stream_open(s, w);
        }
        w = next;
    }
    /* Free removed watches (their handles are closed). */
    pthread_mutex_lock(&s->lock);
    etcd_watch_t **pp = &s->watches;
    while (*pp != NULL) {
        etcd_watch_t *x = *pp;
        if (x->removed && x->h == NULL && x->kw == NULL) {
            *pp = x->next;
            watch_free(x);
        } else {
            pp = &x->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

static void streams_done(etcd_client_t *c)
{
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(c->multi, &left)) != NULL) {
        if (m->msg != CURLMSG_DONE) {
            continue;
        }
        CURLcode cc = m->data.result;
        if (m->easy_handle == c->mh) {
            mux_drain(c);
            etcd_store_t *rep = c->mrep;
            long code = 0;
            curl_easy_getinfo(c->mh, CURLINFO_RESPONSE_CODE, &code);
            pdx_debug("store etcd: key-watch stream of %s ended: %s, HTTP "
                      "%ld", rep ? rep->host.agent_name : "?",
                      curl_easy_strerror(cc), code);
            if (cc != CURLE_OK && rep != NULL) {
                char what[256];
                snprintf(what, sizeof(what), "key-watch stream: %s",
                         curl_easy_strerror(cc));
                etcd_note_fail(rep, what);
            }
            bool dirty = c->mdirty;
            mux_close(c);
            mux_retry_later(c, rep);
            if (dirty && cc == CURLE_OK) {
                c->mretry_at_ns = etcd_now_ns(); /* compacted: at once */
            }
            continue;
        }
        etcd_watch_t *w = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&w);
        if (w == NULL) {
            continue;
        }
        stream_drain(w);
        bool resync = w->need_resync;
        if (cc != CURLE_OK && !w->broken) {
            char what[256];
            snprintf(what, sizeof(what), "watch %s: %s", w->prefix,
                     curl_easy_strerror(cc));
            etcd_note_fail(w->owner, what);
        }
        stream_close(c, w);
        if (resync) {
            w->retry_at_ns = etcd_now_ns();
        } else {
            stream_retry_later(w->owner, w);
        }
    }
}

/* When the client thread must next act (CLOCK_MONOTONIC ns). */
static uint64_t next_deadline(etcd_client_t *c, etcd_store_t *head,
                              uint64_t now)
{
    uint64_t d = now + (uint64_t)IDLE_WAIT_MS * 1000000ull;
    for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
        pthread_mutex_lock(&s->lock);
        for (etcd_watch_t *w = s->watches; w != NULL; w = w->next) {
            if (!w->keyed && w->h == NULL && !w->removed &&
                w->retry_at_ns < d) {
                d = w->retry_at_ns;
            }
            if (w->keyed && (w->kw == NULL || w->removed)) {
                d = now; /* to attach or detach */
            }
        }
        for (etcd_leased_t *k = s->leased; k != NULL; k = k->next) {
            if (s->lease != 0 && k->lease_put != s->lease &&
                s->republish_at_ns < d) {
                d = s->republish_at_ns; /* something to publish */
            }
        }
        if (s->evq != NULL || s->state_dirty || s->restart_watches) {
            d = now;
        }
        pthread_mutex_unlock(&s->lock);
    }
    if (c->keys != NULL && (c->mdirty || c->mbroken || c->mh == NULL ||
                            mux_pending_reads(c))) {
        uint64_t m = c->mretry_at_ns;
        if (c->mdirty && !c->mbroken && c->mh != NULL &&
            c->mopened_ns + (uint64_t)MUX_GAP_MS * 1000000ull > m) {
            m = c->mopened_ns + (uint64_t)MUX_GAP_MS * 1000000ull;
        }
        if (m < d) {
            d = m;
        }
    }
    bool uncreated = false;
    for (etcd_kw_t *kw = c->keys; kw != NULL && c->mh != NULL; kw = kw->next) {
        uncreated = uncreated || !kw->created;
    }
    uint64_t cw = c->mopened_ns + (uint64_t)MUX_CREATE_WAIT_MS * 1000000ull;
    if (uncreated && cw < d) {
        d = cw > now ? cw : now + 1000000ull;
    }
    long ct = -1;
    curl_multi_timeout(c->multi, &ct);
    if (ct >= 0 && now + (uint64_t)ct * 1000000ull < d) {
        d = now + (uint64_t)ct * 1000000ull;
    }
    return d;
}

/* Members leaving (destroy waits on `detached`): their streams and keys
 * go, and nothing of theirs is touched after. Client thread. */
static void detach_pass(etcd_client_t *c)
{
    pthread_mutex_lock(&c->lock);
    for (etcd_store_t **pp = &c->members; *pp != NULL;) {
        etcd_store_t *s = *pp;
        if (!s->detaching) {
            pp = &s->cnext;
            continue;
        }
        for (etcd_watch_t *w = s->watches; w != NULL; w = w->next) {
            if (w->keyed) {
                kw_unsub(c, w);
            } else if (w->h != NULL) {
                stream_close(c, w);
            }
        }
        if (c->mrep == s) {
            mux_close(c);
            c->mdirty = true;
        }
        while (s->evq != NULL) {
            etcd_event_t *e = s->evq;
            s->evq = e->next;
            free(e);
        }
        s->evq_tail = NULL;
        *pp = s->cnext;
        s->cnext = NULL;
        s->detached = true;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->lock);
}

static etcd_store_t *members_head(etcd_client_t *c, bool *stop_p)
{
    pthread_mutex_lock(&c->lock);
    etcd_store_t *s = c->members;
    *stop_p = c->stop;
    pthread_mutex_unlock(&c->lock);
    return s;
}

/* The client thread: watch streams, republication and event delivery of
 * every member; sleeps until a stream has data, a retry is due or a
 * caller wakes it (no fixed period). Only this thread removes members,
 * so it walks the list (which others only prepend to) without the lock. */
static void *client_main(void *arg)
{
    etcd_client_t *c = arg;
    for (;;) {
        detach_pass(c);
        bool stop;
        etcd_store_t *head = members_head(c, &stop);
        if (stop) {
            break;
        }
        uint64_t now = etcd_now_ns();
        for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
            republish_step(s, now);
            watches_step(s, etcd_now_ns());
        }
        mux_step(c, etcd_now_ns());
        int running = 0;
        curl_multi_perform(c->multi, &running);
        for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
            for (etcd_watch_t *w = watch_head(s); w != NULL; w = w->next) {
                if (!w->keyed && w->h != NULL) {
                    stream_drain(w);
                }
            }
        }
        if (c->mh != NULL) {
            mux_drain(c);
        }
        streams_done(c);
        for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
            deliver(s);
        }
        now = etcd_now_ns();
        uint64_t d = next_deadline(c, head, now);
        uint64_t wait = d > now ? (d - now + 999999) / 1000000 : 0;
        if (wait > IDLE_WAIT_MS) {
            wait = IDLE_WAIT_MS;
        }
        if (wait > 0) {
            curl_multi_poll(c->multi, NULL, 0, (int)wait, NULL);
        }
    }
    mux_close(c);
    return NULL;
}

/* ---- the process's clients ---- */

static pthread_mutex_t g_clients_lock = PTHREAD_MUTEX_INITIALIZER;
static etcd_client_t *g_clients;

static void client_free(etcd_client_t *c)
{
    mux_close(c);
    while (c->keys != NULL) {
        etcd_kw_t *kw = c->keys;
        c->keys = kw->next;
        kw_free(kw);
    }
    for (uint32_t i = 0; i < c->npool; i++) {
        curl_easy_cleanup(c->pool[i]);
    }
    if (c->th != NULL) {
        curl_easy_cleanup(c->th);
    }
    if (c->lh != NULL) {
        curl_easy_cleanup(c->lh);
    }
    if (c->multi != NULL) {
        curl_multi_cleanup(c->multi);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lock);
    free(c->key);
    free(c);
}

static void client_stop(etcd_client_t *c)
{
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
    if (c->multi != NULL) {
        curl_multi_wakeup(c->multi);
    }
    if (c->thread_running) {
        pthread_join(c->thread, NULL);
    }
    if (c->lthread_running) {
        pthread_join(c->lthread, NULL);
    }
}

static etcd_client_t *client_new(const char *key)
{
    etcd_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    c->pid = (int)getpid();
    c->key = key ? strdup(key) : NULL;
    c->multi = curl_multi_init();
    if (c->multi != NULL) {
        curl_multi_setopt(c->multi, CURLMOPT_PIPELINING,
                          (long)CURLPIPE_NOTHING);
    }
    c->th = curl_easy_init();
    c->lh = curl_easy_init();
    if ((key != NULL && c->key == NULL) || c->multi == NULL ||
        c->th == NULL || c->lh == NULL) {
        client_free(c);
        return NULL;
    }
    int rc = pthread_create(&c->thread, NULL, client_main, c);
    c->thread_running = rc == 0;
    if (rc == 0) {
        rc = pthread_create(&c->lthread, NULL, lease_main, c);
        c->lthread_running = rc == 0;
    }
    if (rc != 0) {
        pdx_error("store etcd: thread: %s", strerror(rc));
        client_stop(c);
        client_free(c);
        return NULL;
    }
    return c;
}

/* Join the process's client for `key` (NULL: a private one), making it
 * if needed, and become one of its members. */
static pdx_status_t client_attach(etcd_store_t *s, const char *key)
{
    pthread_mutex_lock(&g_clients_lock);
    etcd_client_t *c = g_clients;
    while (key != NULL && c != NULL &&
           (c->key == NULL || c->pid != (int)getpid() ||
            strcmp(c->key, key) != 0)) {
        c = c->next;
    }
    if (key == NULL || c == NULL) {
        c = client_new(key);
        if (c == NULL) {
            pthread_mutex_unlock(&g_clients_lock);
            return PDX_ERR_IO;
        }
        c->next = g_clients;
        g_clients = c;
    }
    c->refs++;
    pthread_mutex_unlock(&g_clients_lock);
    s->client = c;
    pthread_mutex_lock(&c->lock);
    s->cnext = c->members;
    c->members = s;
    pthread_cond_broadcast(&c->cv); /* the lease thread grants */
    pthread_mutex_unlock(&c->lock);
    curl_multi_wakeup(c->multi);
    return PDX_OK;
}

/* Leave the client: after this nothing of it touches s. */
static void client_detach(etcd_store_t *s)
{
    etcd_client_t *c = s->client;
    pthread_mutex_lock(&c->lock);
    s->detaching = true;
    pthread_mutex_unlock(&c->lock);
    curl_multi_wakeup(c->multi);
    pthread_mutex_lock(&c->lock);
    for (int guard = 0; guard < 1000000 && (!s->detached || s->lease_busy);
         guard++) {
        pthread_cond_wait(&c->cv, &c->lock);
    }
    pthread_mutex_unlock(&c->lock);
}

static void client_release(etcd_client_t *c)
{
    pthread_mutex_lock(&g_clients_lock);
    bool last = --c->refs == 0;
    if (last) {
        for (etcd_client_t **pp = &g_clients; *pp != NULL;
             pp = &(*pp)->next) {
            if (*pp == c) {
                *pp = c->next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&g_clients_lock);
    if (last) {
        client_stop(c);
        client_free(c);
    }
}

/* ---- ops ---- */

static pdx_status_t etcd_query(char *why, size_t why_len)
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

static void fill_status_locked(etcd_store_t *s, pdx_store_status_t *o)
{
    memset(o, 0, sizeof(*o));
    o->reachable = s->reachable;
    o->unreachable_since_ns = s->reachable ? 0 : s->unreach_rt_ns;
    o->unreachable_ms = !s->reachable && s->unreach_mono_ns
                            ? (etcd_now_ns() - s->unreach_mono_ns) / 1000000
                            : 0;
    o->lease = s->lease;
    o->lease_ttl_s = s->lease_ttl_s;
    o->leases_granted = s->leases_granted;
    o->revision = s->revision;
    o->requests = s->requests;
    o->failures = s->failures;
    for (etcd_leased_t *k = s->leased; k != NULL; k = k->next) {
        o->leased_keys++;
        o->unpublished += k->lease_put != s->lease || s->lease == 0;
    }
    for (etcd_watch_t *w = s->watches; w != NULL; w = w->next) {
        if (!w->removed) {
            o->watches++;
            o->watches_down += !w->up;
        }
    }
    snprintf(o->endpoint, sizeof(o->endpoint), "%s", s->endpoints[s->ep]);
    snprintf(o->last_error, sizeof(o->last_error), "%s", s->last_error);
}

static void etcd_counters(void *st, pdx_store_counters_t *c)
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
    size_t n = c->size < sizeof(v) ? c->size : sizeof(v);
    if (n > sizeof(v.size)) {
        memcpy((char *)c + sizeof(v.size), (char *)&v + sizeof(v.size),
               n - sizeof(v.size));
    }
}

static void etcd_status(void *st, pdx_store_status_t *o)
{
    etcd_store_t *s = st;
    pthread_mutex_lock(&s->lock);
    fill_status_locked(s, o);
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
        watch_free(w);
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

static pdx_status_t etcd_create(const pdx_store_host_t *host,
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
    st = client_attach(s, p->nopts == 0 ? p->endpoints : NULL);
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

static void etcd_destroy(void *st)
{
    etcd_store_t *s = st;
    if (s == NULL) {
        return;
    }
    /* No callback, stream or renewal of s after this. */
    client_detach(s);
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
    client_release(s->client);
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

static pdx_status_t etcd_put(void *st, const char *key, const void *value,
                             size_t len, uint32_t flags)
{
    etcd_store_t *s = st;
    if (!valid_key(key) || (value == NULL && len > 0)) {
        pdx_error("store etcd: put: invalid key or value");
        return PDX_ERR_INVALID;
    }
    if (!(flags & PDX_STORE_PUT_LEASED)) {
        CURL *h = etcd_handle_get(s);
        if (h == NULL) {
            return PDX_ERR_NOMEM;
        }
        pdx_status_t r = put_raw(s, h, key, value, len, 0, false);
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
        r = h ? put_raw(s, h, key, value, len, lease, false) : PDX_ERR_NOMEM;
        etcd_handle_put(s, h);
        pthread_mutex_lock(&s->lock);
        bool lost = false;
        if (r == PDX_OK) {
            k->lease_put = lease;
        } else if (r == PDX_ERR_NOT_FOUND && s->lease == lease) {
            s->lease = 0; /* expired: the lease thread grants a new one */
            s->lease_retry_at_ns = etcd_now_ns();
            lost = true;
        }
        pthread_mutex_unlock(&s->lock);
        if (lost) {
            lease_kick(s->client);
        }
        if (r == PDX_ERR_NOT_FOUND || r == PDX_ERR_UNAVAILABLE) {
            r = PDX_INPROGRESS;
        }
    }
    pthread_mutex_unlock(&s->pub_lock);
    if (r == PDX_INPROGRESS) {
        wake(s);
    }
    return r;
}

static pdx_status_t etcd_get(void *st, const char *key, void **value_p,
                             size_t *len_p, int64_t *rev_p)
{
    etcd_store_t *s = st;
    if (!valid_key(key) || value_p == NULL || len_p == NULL) {
        return PDX_ERR_INVALID;
    }
    char *kb = etcd_key_b64(s, key);
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    CURL *h = etcd_handle_get(s);
    pdx_status_t r = PDX_ERR_NOMEM;
    if (kb != NULL && req != NULL && h != NULL) {
        cJSON_AddStringToObject(req, "key", kb);
        r = etcd_call(s, h, "/v3/kv/range", req, &resp, false, NULL, 0);
    }
    etcd_handle_put(s, h);
    free(kb);
    cJSON_Delete(req);
    if (r == PDX_OK) {
        const cJSON *kv = cJSON_GetArrayItem(
            cJSON_GetObjectItemCaseSensitive(resp, "kvs"), 0);
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(kv, "value");
        if (kv == NULL) {
            r = PDX_ERR_NOT_FOUND;
        } else {
            size_t len = 0;
            void *val = cJSON_IsString(v) ? etcd_b64_dec(v->valuestring, &len)
                                          : calloc(1, 1);
            if (val == NULL) {
                r = PDX_ERR_CORRUPT;
            } else {
                *value_p = val;
                *len_p = len;
                if (rev_p != NULL) {
                    *rev_p = etcd_json_i64(kv, "mod_revision");
                }
            }
        }
    }
    cJSON_Delete(resp);
    return r;
}

static pdx_status_t etcd_del(void *st, const char *key)
{
    etcd_store_t *s = st;
    if (!valid_key(key)) {
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

static pdx_status_t etcd_watch(void *st, const char *prefix,
                               int64_t start_revision, uint32_t flags,
                               uint64_t *id_p)
{
    etcd_store_t *s = st;
    if (!valid_key(prefix) || start_revision < 0 || id_p == NULL) {
        return PDX_ERR_INVALID;
    }
    etcd_watch_t *w = calloc(1, sizeof(*w));
    if (w == NULL || (w->prefix = strdup(prefix)) == NULL) {
        free(w);
        return PDX_ERR_NOMEM;
    }
    w->owner = s;
    w->flags = flags;
    w->keyed = (flags & PDX_STORE_WATCH_KEY) != 0;
    w->next_rev = start_revision;
    w->need_resync = (flags & PDX_STORE_WATCH_INITIAL) != 0;
    pthread_mutex_lock(&s->lock);
    w->id = s->next_watch_id++;
    w->next = s->watches;
    s->watches = w;
    *id_p = w->id;
    pthread_mutex_unlock(&s->lock);
    wake(s);
    return PDX_OK;
}

static pdx_status_t etcd_unwatch(void *st, uint64_t id)
{
    etcd_store_t *s = st;
    pthread_mutex_lock(&s->lock);
    etcd_watch_t *w = find_watch_locked(s, id);
    if (w != NULL) {
        w->removed = true;
    }
    pthread_mutex_unlock(&s->lock);
    if (w == NULL) {
        return PDX_ERR_NOT_FOUND;
    }
    wake(s);
    /* A delivery in progress finishes; later ones see `removed`. */
    pthread_mutex_lock(&s->deliver);
    pthread_mutex_unlock(&s->deliver);
    return PDX_OK;
}

/* ---- block-owner registry: gRPC transactions in parallel ---- */

typedef struct txn_job {
    size_t first, count; /* blocks */
    etcd_buf_t body;     /* gRPC frame: flag, length, TxnRequest */
    etcd_buf_t out;
    CURL *h;
    int grpc_status; /* -1 until a grpc-status header or trailer */
    char grpc_msg[160];
    pdx_status_t st;
} txn_job_t;

static size_t on_grpc_header(char *p, size_t size, size_t n, void *arg)
{
    txn_job_t *j = arg;
    size_t len = size * n;
    static const char gs[] = "grpc-status:", gm[] = "grpc-message:";
    if (len > sizeof(gs) - 1 && strncasecmp(p, gs, sizeof(gs) - 1) == 0) {
        j->grpc_status = atoi(p + sizeof(gs) - 1);
    } else if (len > sizeof(gm) - 1 &&
               strncasecmp(p, gm, sizeof(gm) - 1) == 0) {
        size_t m = len - (sizeof(gm) - 1);
        const char *v = p + sizeof(gm) - 1;
        while (m > 0 && (*v == ' ')) {
            v++;
            m--;
        }
        while (m > 0 && (v[m - 1] == '\r' || v[m - 1] == '\n')) {
            m--;
        }
        snprintf(j->grpc_msg, sizeof(j->grpc_msg), "%.*s", (int)m, v);
    }
    return len;
}

static size_t on_grpc_data(char *p, size_t size, size_t n, void *arg)
{
    etcd_buf_add(&((txn_job_t *)arg)->out, p, size * n);
    return size * n;
}

static pdx_status_t grpc_code_status(int code)
{
    switch (code) {
    case 3:
    case 9:
        return PDX_ERR_INVALID;
    case 4:
        return PDX_ERR_TIMEOUT;
    case 5:
        return PDX_ERR_NOT_FOUND; /* lease gone */
    case 8:
        return PDX_ERR_TOO_LARGE;
    case 14:
        return PDX_ERR_UNAVAILABLE;
    default:
        return PDX_ERR_IO;
    }
}

/* The TxnResponse of a finished job (after its 5-byte gRPC prefix). */
static bool job_msg(const txn_job_t *j, const uint8_t **p, size_t *n)
{
    if (j->out.len < 5 || (uint8_t)j->out.data[0] != 0) {
        return false;
    }
    const uint8_t *b = (const uint8_t *)j->out.data;
    size_t len = (size_t)b[1] << 24 | (size_t)b[2] << 16 |
                 (size_t)b[3] << 8 | (size_t)b[4];
    if (len > j->out.len - 5) {
        return false;
    }
    *p = b + 5;
    *n = len;
    return true;
}

static void grpc_setup(etcd_store_t *s, txn_job_t *j, CURL *h,
                       const char *endpoint)
{
    char url[512];
    snprintf(url, sizeof(url), "%s/etcdserverpb.KV/Txn", endpoint);
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     strncmp(endpoint, "https://", 8) == 0
                         ? (long)CURL_HTTP_VERSION_2TLS
                         : (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, j->body.data);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)j->body.len);
    etcd_auth_ensure(s, endpoint);
    pthread_mutex_lock(&s->lock);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, s->ghdrs);
    pthread_mutex_unlock(&s->lock);
    etcd_tls_setup(s, h);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_grpc_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, j);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_grpc_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, j);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)s->timeout_ms);
    curl_easy_setopt(h, CURLOPT_PRIVATE, j);
}

/* Run every job's transaction, up to ETCD_PARALLEL streams at once on one
 * HTTP/2 connection kept between calls. Each job ends PDX_OK with its
 * response in `out`, or an error. */
static pdx_status_t run_txns(etcd_store_t *s, txn_job_t *jobs, size_t njobs)
{
    uint64_t now = etcd_now_ns();
    pthread_mutex_lock(&s->lock);
    bool fast_fail = !s->reachable && s->unreach_mono_ns != 0 &&
                     now < s->probe_at_ns;
    const char *endpoint = s->endpoints[s->ep];
    pthread_mutex_unlock(&s->lock);
    if (fast_fail) {
        return PDX_ERR_UNAVAILABLE;
    }
    /* A multi per call, without CURLOPT_PIPEWAIT: with curl 7.88, streams
     * that waited to share one prior-knowledge h2c connection to etcd
     * failed ("Error in the HTTP2 framing layer"); a connection per
     * stream costs a loopback round trip. */
    CURLM *gm = curl_multi_init();
    if (gm == NULL) {
        return PDX_ERR_NOMEM;
    }
    curl_multi_setopt(gm, CURLMOPT_PIPELINING, (long)CURLPIPE_NOTHING);
    pthread_mutex_lock(&s->glock);
    CURL *free_h[ETCD_PARALLEL];
    size_t nfree = 0;
    for (size_t i = 0; i < ETCD_PARALLEL; i++) {
        if (s->gh[i] != NULL) {
            free_h[nfree++] = s->gh[i];
        }
    }
    size_t next = 0, active = 0, done = 0;
    pdx_status_t st = PDX_OK;
    /* Each transfer has its own timeout: the loop ends within
     * njobs / ETCD_PARALLEL + 1 timeouts. */
    for (uint64_t guard = 0; done < njobs && guard < 10000000; guard++) {
        while (nfree > 0 && next < njobs) {
            txn_job_t *j = &jobs[next++];
            j->h = free_h[--nfree];
            j->grpc_status = -1;
            grpc_setup(s, j, j->h, endpoint);
            curl_multi_add_handle(gm, j->h);
            active++;
        }
        int running = 0;
        curl_multi_perform(gm, &running);
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(gm, &left)) != NULL) {
            if (msg->msg != CURLMSG_DONE) {
                continue;
            }
            txn_job_t *j = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&j);
            CURLcode cc = msg->data.result;
            long code = 0;
            curl_easy_getinfo(j->h, CURLINFO_RESPONSE_CODE, &code);
            curl_multi_remove_handle(gm, j->h);
            free_h[nfree++] = j->h;
            j->h = NULL;
            pthread_mutex_lock(&s->lock);
            s->requests++;
            pthread_mutex_unlock(&s->lock);
            const uint8_t *p;
            size_t n;
            int64_t rev = 0;
            if (cc != CURLE_OK) {
                char what[256];
                snprintf(what, sizeof(what), "%s/etcdserverpb.KV/Txn: %s",
                         endpoint, curl_easy_strerror(cc));
                etcd_note_fail(s, what);
                j->st = PDX_ERR_UNAVAILABLE;
            } else if (j->grpc_status > 0 || code != 200) {
                if (j->grpc_status == 16) {
                    etcd_auth_invalidate(s); /* the next call re-authenticates */
                }
                j->st = code != 200 ? PDX_ERR_IO
                                    : grpc_code_status(j->grpc_status);
                if (j->st == PDX_ERR_UNAVAILABLE) {
                    etcd_note_fail(s, j->grpc_msg);
                } else {
                    etcd_note_ok(s, 0);
                    pdx_warn("store etcd: transaction of %zu blocks: HTTP "
                             "%ld, grpc-status %d: %s", j->count, code,
                             j->grpc_status, j->grpc_msg);
                }
            } else if (!job_msg(j, &p, &n) ||
                       etcd_pb_txn(p, n, &rev, NULL, NULL) < 0) {
                pdx_warn("store etcd: transaction of %zu blocks: malformed "
                         "answer (%zu bytes)", j->count, j->out.len);
                j->st = PDX_ERR_CORRUPT;
            } else {
                etcd_note_ok(s, rev);
                j->st = PDX_OK;
            }
            if (j->st != PDX_OK && st == PDX_OK) {
                st = j->st;
            }
            active--;
            done++;
        }
        if (done < njobs && active > 0) {
            curl_multi_poll(gm, NULL, 0, 100, NULL);
        }
    }
    pthread_mutex_unlock(&s->glock);
    curl_multi_cleanup(gm);
    return st;
}

static void jobs_free(txn_job_t *jobs, size_t njobs)
{
    for (size_t i = 0; i < njobs; i++) {
        etcd_buf_free(&jobs[i].body);
        etcd_buf_free(&jobs[i].out);
    }
    free(jobs);
}

/* `<ns>/blocks/<block>/` (or with the owner appended) as a full key. */
static char *block_key(etcd_store_t *s, const char *block, const char *owner)
{
    size_t n = strlen(s->ns) + strlen(block) + (owner ? strlen(owner) : 0) +
               16;
    char *k = malloc(n);
    if (k != NULL) {
        snprintf(k, n, "%s/blocks/%s/%s", s->ns, block, owner ? owner : "");
    }
    return k;
}

typedef enum { OWN_ADD, OWN_DEL, OWN_GET } own_kind_t;

/* Build the jobs of an owner op: `per` blocks a transaction. */
static pdx_status_t build_jobs(etcd_store_t *s, own_kind_t kind,
                               const char *owner, const char *const *blocks,
                               size_t n, int64_t lease, txn_job_t **jobs_p,
                               size_t *njobs_p)
{
    size_t per = kind == OWN_ADD ? s->max_txn_ops / 2 : s->max_txn_ops;
    if (per == 0) {
        per = 1;
    }
    size_t njobs = (n + per - 1) / per;
    txn_job_t *jobs = calloc(njobs ? njobs : 1, sizeof(*jobs));
    if (jobs == NULL) {
        return PDX_ERR_NOMEM;
    }
    for (size_t j = 0; j < njobs; j++) {
        jobs[j].first = j * per;
        jobs[j].count = n - jobs[j].first < per ? n - jobs[j].first : per;
        etcd_buf_t txn = {0};
        bool ok = true;
        for (size_t i = 0; ok && i < jobs[j].count; i++) {
            const char *b = blocks[jobs[j].first + i];
            char *pfx = block_key(s, b, NULL);
            char *full = kind == OWN_GET ? NULL : block_key(s, b, owner);
            ok = pfx != NULL && (kind == OWN_GET || full != NULL);
            if (ok) {
                /* Keys are text: the prefix's last byte ('/') + 1. */
                char *end = strdup(pfx);
                ok = end != NULL;
                if (ok) {
                    end[strlen(end) - 1]++;
                    if (kind == OWN_ADD) {
                        etcd_pb_put(&txn, full, lease);
                        etcd_pb_range(&txn, pfx, end, true, false);
                    } else if (kind == OWN_DEL) {
                        etcd_pb_delete(&txn, full);
                    } else {
                        etcd_pb_range(&txn, pfx, end, false, true);
                    }
                }
                free(end);
            }
            free(pfx);
            free(full);
        }
        if (ok && txn.len > 0) {
            uint8_t hdr[5] = {0, (uint8_t)(txn.len >> 24),
                              (uint8_t)(txn.len >> 16),
                              (uint8_t)(txn.len >> 8), (uint8_t)txn.len};
            etcd_buf_add(&jobs[j].body, hdr, 5);
            etcd_buf_add(&jobs[j].body, txn.data, txn.len);
            ok = jobs[j].body.len == txn.len + 5;
        }
        etcd_buf_free(&txn);
        if (!ok) {
            jobs_free(jobs, njobs);
            return PDX_ERR_NOMEM;
        }
    }
    *jobs_p = jobs;
    *njobs_p = njobs;
    return PDX_OK;
}

static pdx_status_t check_blocks(const char *owner, const char *const *blocks,
                                 size_t n, bool need_owner)
{
    if ((need_owner && !valid_owner(owner)) || (blocks == NULL && n > 0)) {
        pdx_error("store etcd: owner op: invalid owner or block list");
        return PDX_ERR_INVALID;
    }
    for (size_t i = 0; i < n; i++) {
        if (!valid_block(blocks[i])) {
            pdx_error("store etcd: block %zu '%s' is not 1-128 lowercase hex "
                      "digits", i, blocks[i] ? blocks[i] : "(null)");
            return PDX_ERR_INVALID;
        }
    }
    return PDX_OK;
}

typedef struct add_acc {
    uint32_t *counts; /* of the job's first block */
    size_t nblocks;
    size_t seen;
} add_acc_t;

static void on_add_op(void *arg, size_t index, uint32_t kind,
                      const uint8_t *p, size_t n)
{
    add_acc_t *a = arg;
    if (index % 2 == 1 && kind == 1 && index / 2 < a->nblocks) {
        a->counts[index / 2] = (uint32_t)etcd_pb_range_count(p, n);
        a->seen++;
    }
}

static pdx_status_t etcd_owners_add(void *st, const char *owner,
                                    const char *const *blocks, size_t n,
                                    uint32_t *counts)
{
    etcd_store_t *s = st;
    pdx_status_t r = check_blocks(owner, blocks, n, true);
    if (r != PDX_OK || n == 0) {
        return r;
    }
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->lease;
    pthread_mutex_unlock(&s->lock);
    if (lease == 0) {
        return PDX_ERR_UNAVAILABLE; /* not reached yet, or lease lost */
    }
    txn_job_t *jobs;
    size_t njobs;
    r = build_jobs(s, OWN_ADD, owner, blocks, n, lease, &jobs, &njobs);
    if (r != PDX_OK) {
        return r;
    }
    r = run_txns(s, jobs, njobs);
    if (r == PDX_ERR_NOT_FOUND) {
        /* Our lease is gone: the thread grants a new one. */
        pthread_mutex_lock(&s->lock);
        if (s->lease == lease) {
            s->lease = 0;
            s->lease_retry_at_ns = etcd_now_ns();
        }
        pthread_mutex_unlock(&s->lock);
        lease_kick(s->client);
        r = PDX_ERR_UNAVAILABLE;
    }
    uint32_t *tmp = counts ? NULL : calloc(n, sizeof(*tmp));
    for (size_t j = 0; r == PDX_OK && j < njobs; j++) {
        const uint8_t *p;
        size_t len;
        add_acc_t a = {.counts = (counts ? counts : tmp) + jobs[j].first,
                       .nblocks = jobs[j].count};
        if (a.counts == NULL || !job_msg(&jobs[j], &p, &len) ||
            etcd_pb_txn(p, len, NULL, on_add_op, &a) < 0 ||
            a.seen != jobs[j].count) {
            r = PDX_ERR_CORRUPT;
        }
    }
    free(tmp);
    jobs_free(jobs, njobs);
    return r;
}

static pdx_status_t etcd_owners_del(void *st, const char *owner,
                                    const char *const *blocks, size_t n)
{
    etcd_store_t *s = st;
    pdx_status_t r = check_blocks(owner, blocks, n, true);
    if (r != PDX_OK || n == 0) {
        return r;
    }
    txn_job_t *jobs;
    size_t njobs;
    r = build_jobs(s, OWN_DEL, owner, blocks, n, 0, &jobs, &njobs);
    if (r == PDX_OK) {
        r = run_txns(s, jobs, njobs);
        jobs_free(jobs, njobs);
    }
    return r;
}

typedef struct get_acc {
    etcd_store_t *s;
    const char *const *blocks;
    size_t first, count;
    pdx_store_owner_cb_t cb;
    void *arg;
    size_t bi;
    size_t seen;
} get_acc_t;

static void on_owner_key(void *arg, const char *key, size_t len)
{
    get_acc_t *a = arg;
    char *pfx = block_key(a->s, a->blocks[a->bi], NULL);
    size_t plen = pfx ? strlen(pfx) : 0;
    if (pfx != NULL && len > plen && len - plen < 64 &&
        memcmp(key, pfx, plen) == 0 &&
        memchr(key + plen, '/', len - plen) == NULL) {
        char owner[64];
        memcpy(owner, key + plen, len - plen);
        owner[len - plen] = '\0';
        a->cb(a->arg, a->bi, owner);
    }
    free(pfx);
}

static void on_get_op(void *arg, size_t index, uint32_t kind,
                      const uint8_t *p, size_t n)
{
    get_acc_t *a = arg;
    if (kind != 1 || index >= a->count) {
        return;
    }
    a->bi = a->first + index;
    a->seen++;
    etcd_pb_range_keys(p, n, on_owner_key, a);
}

static pdx_status_t etcd_owners_get(void *st, const char *const *blocks,
                                    size_t n, pdx_store_owner_cb_t cb,
                                    void *arg)
{
    etcd_store_t *s = st;
    pdx_status_t r = check_blocks(NULL, blocks, n, false);
    if (r != PDX_OK || n == 0) {
        return r;
    }
    if (cb == NULL) {
        return PDX_ERR_INVALID;
    }
    txn_job_t *jobs;
    size_t njobs;
    r = build_jobs(s, OWN_GET, NULL, blocks, n, 0, &jobs, &njobs);
    if (r != PDX_OK) {
        return r;
    }
    r = run_txns(s, jobs, njobs);
    /* Blocks in order: jobs are in block order. */
    for (size_t j = 0; r == PDX_OK && j < njobs; j++) {
        const uint8_t *p;
        size_t len;
        get_acc_t a = {.s = s, .blocks = blocks, .first = jobs[j].first,
                       .count = jobs[j].count, .cb = cb, .arg = arg};
        if (!job_msg(&jobs[j], &p, &len) ||
            etcd_pb_txn(p, len, NULL, on_get_op, &a) < 0 ||
            a.seen != jobs[j].count) {
            r = PDX_ERR_CORRUPT;
        }
    }
    jobs_free(jobs, njobs);
    return r;
}

PDX_API const pdx_store_ops_t pdx_store_v1 = {
    .abi_version = PDX_STORE_ABI_VERSION,
    .size = sizeof(pdx_store_ops_t),
    .name = "etcd",
    .query = etcd_query,
    .create = etcd_create,
    .destroy = etcd_destroy,
    .status = etcd_status,
    .put = etcd_put,
    .get = etcd_get,
    .del = etcd_del,
    .watch = etcd_watch,
    .unwatch = etcd_unwatch,
    .owners_add = etcd_owners_add,
    .owners_del = etcd_owners_del,
    .owners_get = etcd_owners_get,
    .counters = etcd_counters,
};
