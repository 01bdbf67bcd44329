/* etcd store: the process's clients (one per endpoint list and options,
 * shared by the instances that name them) and the client thread that
 * keeps leases alive and runs the watch streams. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

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
 * settle on one request per period. One grant a pass, after the pass's
 * renewals: a process starting 8 agents on a busy etcd granted all 8 in
 * a row, and its first agent's lease ran out behind the other 7 grants
 * (seen at 1,024 agents on 2 cores). */
static void *lease_main(void *arg)
{
    etcd_client_t *c = arg;
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        uint64_t now = pdx_now_ns(), next = UINT64_MAX;
        etcd_store_t *grant[1] = {NULL}, *keep[LEASE_BATCH];
        int64_t ids[LEASE_BATCH];
        size_t ng = 0, nk = 0;
        bool due = false;
        for (etcd_store_t *s = c->members; s != NULL; s = s->cnext) {
            if (s->detaching || s->lease_busy) {
                continue;
            }
            pthread_mutex_lock(&s->lock);
            if (s->lease == 0) {
                if (now >= s->lease_retry_at_ns && ng < 1) {
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
        if (nk > 0) {
            etcd_lease_keepalive_batch(c, keep, ids, nk);
        }
        for (size_t i = 0; i < ng; i++) {
            etcd_lease_grant(grant[i], c->lh);
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
            etcd_mux_drain(c);
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
            etcd_mux_close(c);
            etcd_mux_retry_later(c, rep);
            if (dirty && cc == CURLE_OK) {
                c->mretry_at_ns = pdx_now_ns(); /* compacted: at once */
            }
            continue;
        }
        etcd_watch_t *w = NULL;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&w);
        if (w == NULL) {
            continue;
        }
        etcd_stream_drain(w);
        bool resync = w->need_resync;
        if (cc != CURLE_OK && !w->broken) {
            char what[256];
            snprintf(what, sizeof(what), "watch %s: %s", w->prefix,
                     curl_easy_strerror(cc));
            etcd_note_fail(w->owner, what);
        }
        etcd_stream_close(c, w);
        if (resync) {
            w->retry_at_ns = pdx_now_ns();
        } else {
            etcd_stream_retry_later(w->owner, w);
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
    if ((c->keys != NULL && (c->mdirty || c->mbroken || c->mh == NULL ||
                             etcd_mux_pending_reads(c))) ||
        (c->keys == NULL && c->mh != NULL)) {
        if (c->mretry_at_ns < d) {
            d = c->mretry_at_ns;
        }
    }
    for (etcd_kw_t *kw = c->keys; kw != NULL && c->mh != NULL; kw = kw->next) {
        uint64_t cw = kw->sent_ns + (uint64_t)MUX_CREATE_WAIT_MS * 1000000ull;
        if (!kw->created && kw->sent_ns != 0 && cw < d) {
            d = cw > now ? cw : now + 1000000ull;
        }
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
                etcd_kw_unsub(c, w);
            } else if (w->h != NULL) {
                etcd_stream_close(c, w);
            }
        }
        if (c->mrep == s) {
            etcd_mux_close(c); /* reopened by another member's settings */
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
        uint64_t now = pdx_now_ns();
        for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
            etcd_republish_step(s, now);
            etcd_watches_step(s, pdx_now_ns());
        }
        etcd_mux_step(c, pdx_now_ns());
        int running = 0;
        curl_multi_perform(c->multi, &running);
        for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
            for (etcd_watch_t *w = etcd_watch_head(s); w != NULL; w = w->next) {
                if (!w->keyed && w->h != NULL) {
                    etcd_stream_drain(w);
                }
            }
        }
        if (c->mh != NULL) {
            etcd_mux_drain(c);
        }
        streams_done(c);
        for (etcd_store_t *s = head; s != NULL; s = s->cnext) {
            etcd_deliver(s);
        }
        now = pdx_now_ns();
        uint64_t d = next_deadline(c, head, now);
        uint64_t wait = d > now ? (d - now + 999999) / 1000000 : 0;
        if (wait > IDLE_WAIT_MS) {
            wait = IDLE_WAIT_MS;
        }
        if (wait > 0) {
            curl_multi_poll(c->multi, NULL, 0, (int)wait, NULL);
        }
    }
    etcd_mux_close(c);
    return NULL;
}

static pthread_mutex_t g_clients_lock = PTHREAD_MUTEX_INITIALIZER;
static etcd_client_t *g_clients;

static void client_free(etcd_client_t *c)
{
    etcd_mux_close(c);
    while (c->keys != NULL) {
        etcd_kw_t *kw = c->keys;
        c->keys = kw->next;
        etcd_kw_free(kw);
    }
    for (uint32_t i = 0; i < c->npool; i++) {
        curl_easy_cleanup(c->pool[i]);
    }
    etcd_h2_pool_free(c);
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
pdx_status_t etcd_client_attach(etcd_store_t *s, const char *key)
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
void etcd_client_detach(etcd_store_t *s)
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

void etcd_client_release(etcd_client_t *c)
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
