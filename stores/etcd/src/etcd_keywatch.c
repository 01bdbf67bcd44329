/* etcd store: key watches: one multiplexed gRPC stream per client.
 *
 * Every watched key of every member goes in one gRPC Watch call, a
 * bidirectional stream: one WatchRequest frame a key, each with its own
 * watch_id. A key that joins is one more create frame on the open stream
 * (the upload pauses between frames), a key that leaves one cancel frame;
 * a key that wants older history (or comes back after a compaction) is
 * cancelled and created again under a new id. The stream is reopened only
 * when it breaks, with every key from the revision after the last one it
 * reported, so nothing is lost; duplicates are dropped per subscriber by
 * revision. (Reopening the whole stream for each new key made etcd create
 * every key again: at 512 agents that was most of its work in a burst of
 * fetches.) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

static void mux_set_up(etcd_client_t *c, etcd_kw_t *kw, bool up)
{
    (void)c;
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        pthread_mutex_lock(&w->owner->lock);
        w->up = up;
        pthread_mutex_unlock(&w->owner->lock);
    }
}

void etcd_mux_close(etcd_client_t *c)
{
    if (c->mh != NULL) {
        curl_multi_remove_handle(c->multi, c->mh);
        curl_easy_cleanup(c->mh);
        c->mh = NULL;
    }
    etcd_buf_free(&c->mtx);
    c->mtx_off = 0;
    c->mpaused = false;
    etcd_buf_free(&c->mrx);
    c->mrep = NULL;
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        if (kw->created) {
            mux_set_up(c, kw, false);
        }
        kw->created = false;
        kw->wid = 0;
        kw->sent_ns = 0;
    }
}

void etcd_mux_retry_later(etcd_client_t *c, etcd_store_t *s)
{
    c->mbackoff_ms = s ? etcd_backoff_next(s, c->mbackoff_ms)
                       : DEFAULT_RETRY_MIN_MS;
    c->mretry_at_ns = pdx_now_ns() + etcd_backoff_ns(c->mbackoff_ms);
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

void etcd_kw_free(etcd_kw_t *kw)
{
    free(kw->full);
    free(kw);
}

/* Take watch w off its key; a key nobody wants leaves the stream. */
void etcd_kw_unsub(etcd_client_t *c, etcd_watch_t *w)
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
    if (c->mh != NULL && !c->mbroken && kw->wid != 0) {
        etcd_pb_watch_cancel(&c->mtx, (int64_t)kw->wid);
        c->mdirty = true; /* sent by the next step */
    }
    etcd_kw_free(kw);
}

/* The watch of kw on the stream (created, or its create in flight)
 * starts after revision `rev`, which a subscriber still wants. */
static bool kw_behind(const etcd_kw_t *kw, int64_t rev)
{
    return kw->wid != 0 && !kw->recreate && (kw->pos == 0 || kw->pos > rev);
}

/* Put key watch w on its key (a new key joins the stream). */
void etcd_kw_sub(etcd_client_t *c, etcd_watch_t *w)
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
        kw->recreate = true;
        c->mdirty = true;
    }
    free(full);
    w->kw = kw;
    w->kw_next = kw->subs;
    kw->subs = w;
    if (!w->need_resync) {
        if (w->next_rev == 0) {
            w->next_rev = kw->created ? kw->pos : 0;
        } else if (kw_behind(kw, w->next_rev)) {
            kw->recreate = true; /* wants history the stream is past */
            c->mdirty = true;
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
    etcd_kv_read_t o;
    pdx_status_t st = etcd_read_key(w0->owner, c->th, kw->full, true, &o);
    if (st != PDX_OK) {
        return st;
    }
    int64_t rev = o.rev;
    bool present = o.present;
    void *val = o.value;
    size_t vlen = o.len;
    int64_t mrev = o.mod_rev, lease = o.lease;
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        if (!w->need_resync) {
            continue;
        }
        if (present && w->known_rev != mrev) {
            etcd_queue_event(w->owner, w->id, PDX_STORE_EV_PUT,
                             PDX_STORE_EVF_RESYNC, w->prefix, val,
                             val ? vlen : 0, mrev, lease);
            w->known_rev = mrev;
        } else if (!present && w->known_rev != 0) {
            etcd_queue_event(w->owner, w->id, PDX_STORE_EV_DELETE,
                             PDX_STORE_EVF_RESYNC, w->prefix, NULL, 0, rev, 0);
            w->known_rev = 0;
        }
        w->next_rev = rev + 1;
        w->need_resync = false;
        if (kw_behind(kw, w->next_rev)) {
            kw->recreate = true;
            c->mdirty = true;
        } else if (kw->created) {
            pthread_mutex_lock(&w->owner->lock);
            w->up = true;
            pthread_mutex_unlock(&w->owner->lock);
        }
    }
    etcd_kv_read_free(&o);
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

/* Where key kw's watch starts: the oldest revision a subscriber still
 * waits for (0: from now). */
static int64_t kw_start(const etcd_kw_t *kw)
{
    int64_t start = kw->pos;
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        if (!w->need_resync && w->next_rev > 0 &&
            (start == 0 || w->next_rev < start)) {
            start = w->next_rev;
        }
    }
    return start;
}

/* Queue kw's create frame under a new watch id (cancelling the old one):
 * events of the old id are dropped from then on, the new one starts where
 * the oldest subscriber is. */
static void kw_queue_create(etcd_client_t *c, etcd_kw_t *kw, uint64_t now)
{
    if (kw->wid != 0) {
        etcd_pb_watch_cancel(&c->mtx, (int64_t)kw->wid);
        if (kw->created) {
            mux_set_up(c, kw, false);
        }
    }
    kw->pos = kw_start(kw);
    kw->created = false;
    kw->recreate = false;
    kw->wid = ++c->mnext_wid;
    kw->sent_ns = now;
    etcd_pb_watch_create(&c->mtx, kw->full, kw->pos, (int64_t)kw->wid);
}

/* The upload of the stream: queued frames, then a pause until more come
 * (curl_easy_pause from mux_flush). */
static size_t mux_read(char *buf, size_t size, size_t nitems, void *arg)
{
    etcd_client_t *c = arg;
    size_t room = size * nitems, left = c->mtx.len - c->mtx_off;
    if (left == 0) {
        c->mpaused = true;
        return CURL_READFUNC_PAUSE;
    }
    size_t n = left < room ? left : room;
    memcpy(buf, c->mtx.data + c->mtx_off, n);
    c->mtx_off += n;
    if (c->mtx_off == c->mtx.len) {
        c->mtx.len = c->mtx_off = 0;
    }
    return n;
}

/* Frames queued while the upload pauses: resume it (client thread; the
 * next curl_multi_perform sends them). */
static void mux_flush(etcd_client_t *c)
{
    if (c->mh != NULL && c->mpaused && c->mtx.len > c->mtx_off) {
        c->mpaused = false;
        if (curl_easy_pause(c->mh, CURLPAUSE_CONT) != CURLE_OK) {
            pdx_warn("store etcd: key-watch stream: cannot resume its "
                     "upload: reopening");
            etcd_mux_retry_later(c, c->mrep);
        }
    }
}

/* Open the stream: etcd's gRPC Watch over HTTP/2 (prior knowledge on
 * http), one WatchRequest frame a key, the upload left open for the keys
 * that come later. */
static void mux_open(etcd_client_t *c)
{
    etcd_store_t *rep = first_member(c);
    if (rep == NULL || c->keys == NULL) {
        return;
    }
    uint64_t now = pdx_now_ns();
    etcd_buf_free(&c->mtx);
    c->mtx_off = 0;
    c->mpaused = false;
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        kw->wid = 0; /* nothing to cancel on a new stream */
        kw_queue_create(c, kw, now);
    }
    c->mh = c->mtx.data != NULL ? curl_easy_init() : NULL;
    if (c->mh == NULL) {
        etcd_mux_close(c);
        etcd_mux_retry_later(c, rep);
        return;
    }
    pthread_mutex_lock(&rep->lock);
    char endpoint[256];
    snprintf(endpoint, sizeof(endpoint), "%s", rep->endpoints[rep->ep]);
    pthread_mutex_unlock(&rep->lock);
    CURL *h = c->mh;
    /* A connection of its own (etcd_grpc_easy_setup). */
    etcd_grpc_easy_setup(rep, h, endpoint, "/etcdserverpb.Watch/Watch",
                         mux_data, mux_header, c);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, mux_read);
    curl_easy_setopt(h, CURLOPT_READDATA, c);
    curl_easy_setopt(h, CURLOPT_PRIVATE, NULL);
    if (curl_multi_add_handle(c->multi, c->mh) != CURLM_OK) {
        etcd_mux_close(c);
        etcd_mux_retry_later(c, rep);
        return;
    }
    c->mrep = rep;
    pthread_mutex_lock(&c->lock);
    c->mopens++; /* read by etcd_counters */
    pthread_mutex_unlock(&c->lock);
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
        etcd_queue_event(w->owner, w->id,
                         ev->is_delete ? PDX_STORE_EV_DELETE
                                       : PDX_STORE_EV_PUT,
                         0, w->prefix, ev->is_delete ? NULL : ev->value,
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
        etcd_mux_retry_later(c, c->mrep);
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
            mux_set_up(c, kw, false);
            kw->pos = 0;
            kw->created = false;
            kw->wid = 0; /* gone on etcd's side: nothing to cancel */
            kw->recreate = true; /* after the read */
            c->mdirty = true;
        } else {
            pdx_warn("store etcd: key watch %s canceled by the server",
                     kw->full);
            mux_set_up(c, kw, false);
            kw->created = false;
            etcd_mux_retry_later(c, c->mrep);
        }
        return;
    }
    mux_ev_ctx_t x = {c, kw};
    etcd_pb_watch_resp(p, n, &wr, mux_event, &x);
}

static bool mux_stop(void *arg)
{
    etcd_client_t *c = arg;
    return c->mh == NULL || (c->mbroken && c->mretry_at_ns > pdx_now_ns());
}

/* Reads, then creates and cancels on the open stream, or a (re)open when
 * it broke. */
void etcd_mux_step(etcd_client_t *c, uint64_t now)
{
    if (now < c->mretry_at_ns) {
        return;
    }
    for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
        if (kw_read(c, kw) != PDX_OK) {
            etcd_mux_retry_later(c, kw->subs ? kw->subs->owner : NULL);
            return;
        }
    }
    /* Every create acknowledged within the wait, else the stream is not
     * to be trusted: reopened. */
    for (etcd_kw_t *kw = c->keys; kw != NULL && c->mh != NULL && !c->mbroken;
         kw = kw->next) {
        if (!kw->created && !kw->recreate && kw->sent_ns != 0 &&
            now >= kw->sent_ns + (uint64_t)MUX_CREATE_WAIT_MS * 1000000ull) {
            pdx_warn("store etcd: key watch %s not created by etcd within "
                     "%u ms: reopening the stream", kw->full,
                     MUX_CREATE_WAIT_MS);
            c->mbroken = true;
        }
    }
    if (c->mh != NULL && (c->mbroken || c->keys == NULL)) {
        etcd_mux_close(c); /* broken, or nothing left to watch */
    }
    if (c->mh == NULL) {
        c->mdirty = c->mbroken = false;
        mux_open(c);
        return;
    }
    if (c->mdirty) {
        c->mdirty = false;
        for (etcd_kw_t *kw = c->keys; kw != NULL; kw = kw->next) {
            if (kw->recreate && !etcd_kw_resyncing(kw)) {
                kw_queue_create(c, kw, now);
            } else if (kw->recreate) {
                c->mdirty = true; /* after its read */
            }
        }
        mux_flush(c);
    }
}

/* The gRPC frames received so far (5-byte prefix: flag, length). */
void etcd_mux_drain(etcd_client_t *c)
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
            etcd_mux_retry_later(c, c->mrep);
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

bool etcd_kw_resyncing(const etcd_kw_t *kw)
{
    for (etcd_watch_t *w = kw->subs; w != NULL; w = w->kw_next) {
        if (w->need_resync) {
            return true;
        }
    }
    return false;
}

bool etcd_mux_pending_reads(etcd_client_t *c)
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
