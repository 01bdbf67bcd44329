/* etcd store: prefix watches: one JSON stream each (curl multi), reopened
 * with backoff from the revision after the last event; a compacted one
 * lists its prefix and reports the difference (resync). Plus the watch
 * and unwatch ops. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

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
                    etcd_queue_event(s, w->id, PDX_STORE_EV_PUT,
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
        etcd_queue_event(s, w->id, PDX_STORE_EV_DELETE, PDX_STORE_EVF_RESYNC,
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
            etcd_queue_event(s, w->id,
                             del ? PDX_STORE_EV_DELETE : PDX_STORE_EV_PUT, 0,
                             rel, val, val ? vlen : 0, mrev,
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

void etcd_stream_drain(etcd_watch_t *w)
{
    split_lines(&w->rx, w_line, w_stop, w);
}

void etcd_stream_close(etcd_client_t *c, etcd_watch_t *w)
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

void etcd_stream_retry_later(etcd_store_t *s, etcd_watch_t *w)
{
    w->backoff_ms = etcd_backoff_next(s, w->backoff_ms);
    w->retry_at_ns = pdx_now_ns() + etcd_backoff_ns(w->backoff_ms);
}

static void stream_open(etcd_store_t *s, etcd_watch_t *w)
{
    etcd_client_t *c = s->client;
    if (w->need_resync && watch_resync(s, w) != PDX_OK) {
        etcd_stream_retry_later(s, w);
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
        etcd_stream_close(c, w);
        etcd_stream_retry_later(s, w);
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
        etcd_stream_close(c, w);
        etcd_stream_retry_later(s, w);
    }
}

etcd_watch_t *etcd_watch_head(etcd_store_t *s)
{
    pthread_mutex_lock(&s->lock);
    etcd_watch_t *w = s->watches;
    pthread_mutex_unlock(&s->lock);
    return w;
}

void etcd_watch_free(etcd_watch_t *w)
{
    free(w->prefix);
    free(w->body);
    etcd_buf_free(&w->rx);
    known_free(w);
    free(w);
}

void etcd_watches_step(etcd_store_t *s, uint64_t now)
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
    etcd_watch_t *w = etcd_watch_head(s);
    for (; w != NULL;) {
        pthread_mutex_lock(&s->lock);
        bool removed = w->removed;
        etcd_watch_t *next = w->next;
        pthread_mutex_unlock(&s->lock);
        if (w->keyed) {
            if (removed) {
                etcd_kw_unsub(c, w);
            } else if (w->kw == NULL) {
                etcd_kw_sub(c, w);
            }
        } else if (removed) {
            if (w->h != NULL) {
                etcd_stream_close(c, w);
            }
        } else if (w->h != NULL && (restart || w->broken)) {
            bool resync = w->need_resync;
            etcd_stream_close(c, w);
            if (resync) {
                w->retry_at_ns = now; /* compacted: list and reopen now */
            } else {
                etcd_stream_retry_later(s, w);
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
            etcd_watch_free(x);
        } else {
            pp = &x->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
}

pdx_status_t etcd_watch(void *st, const char *prefix,
                        int64_t start_revision, uint32_t flags,
                        uint64_t *id_p)
{
    etcd_store_t *s = st;
    if (!etcd_valid_key(prefix) || start_revision < 0 || id_p == NULL) {
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
    etcd_wake(s);
    return PDX_OK;
}

pdx_status_t etcd_unwatch(void *st, uint64_t id)
{
    etcd_store_t *s = st;
    pthread_mutex_lock(&s->lock);
    etcd_watch_t *w = etcd_find_watch_locked(s, id);
    if (w != NULL) {
        w->removed = true;
    }
    pthread_mutex_unlock(&s->lock);
    if (w == NULL) {
        return PDX_ERR_NOT_FOUND;
    }
    etcd_wake(s);
    /* A delivery in progress finishes; later ones see `removed`. */
    pthread_mutex_lock(&s->deliver);
    pthread_mutex_unlock(&s->deliver);
    return PDX_OK;
}
