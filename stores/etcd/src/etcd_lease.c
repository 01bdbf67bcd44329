/* etcd store: the lease: grant, keepalives in batches, and republishing
 * the leased keys under a new lease. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

/* Renewal period: a third of the TTL, +-10 % so that the members of a
 * fleet started together spread out. */
static uint64_t ka_period_ns(etcd_store_t *s)
{
    uint64_t ttl = s->lease_ttl_s ? s->lease_ttl_s : s->ttl_s;
    uint64_t p = ttl * 1000000000ull / 3;
    return etcd_rand_range(p - p / 10, p + p / 10);
}

void etcd_lease_grant(etcd_store_t *s, CURL *h)
{
    cJSON *req = cJSON_CreateObject(), *resp = NULL;
    if (req == NULL) {
        return;
    }
    etcd_json_add_i64(req, "TTL", s->ttl_s);
    uint64_t sent = pdx_now_ns(); /* the TTL runs from about here */
    pdx_status_t st = etcd_call(s, h, "/v3/lease/grant", req, &resp, true,
                                NULL, 0);
    cJSON_Delete(req);
    uint64_t now = pdx_now_ns();
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
        s->keepalive_at_ns = sent + ka_period_ns(s);
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
        s->lease_backoff_ms = etcd_backoff_next(s, s->lease_backoff_ms);
        s->lease_retry_at_ns = now + etcd_backoff_ns(s->lease_backoff_ms);
    }
    pthread_mutex_unlock(&s->lock);
    cJSON_Delete(resp);
}

/* The outcome of renewing `lease` of s with a request sent at sent_ns:
 * st PDX_OK with the TTL left (0: expired), PDX_ERR_NOT_FOUND (expired),
 * else not reached. The next renewal is due a period after the send, not
 * after the answer: a slow etcd (a restart of many agents) then does not
 * push each renewal later by its own response time. */
static void lease_renewed(etcd_store_t *s, int64_t lease, pdx_status_t st,
                          int64_t ttl, uint64_t sent_ns)
{
    uint64_t now = pdx_now_ns();
    pthread_mutex_lock(&s->lock);
    if (s->lease != lease) {
        pthread_mutex_unlock(&s->lock); /* replaced meanwhile */
        return;
    }
    if (st == PDX_OK && ttl > 0) {
        s->keepalive_at_ns = sent_ns + ka_period_ns(s);
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
        s->lease_backoff_ms = etcd_backoff_next(s, s->lease_backoff_ms);
        uint64_t period = (uint64_t)s->lease_ttl_s * 1000000000ull / 3;
        uint64_t wait = etcd_backoff_ns(s->lease_backoff_ms);
        s->keepalive_at_ns = now + (wait < period ? wait : period);
        s->restart_watches = true;
    }
    pthread_mutex_unlock(&s->lock);
}

/* Renew the leases of n members in one request: the gateway's keepalive
 * is a stream, and a body of one request a line gets one result a line.
 * A refusal that is not a result (auth) falls back to one call each. */
/* The renewals as gRPC LeaseKeepAlive on the client's h2c connections:
 * one request message a lease, the stream ended after them; etcd answers
 * each in order. true when the call went through (results in ttl/got). */
static bool keepalive_h2(etcd_client_t *c, etcd_store_t *s0,
                         const char *endpoint, const int64_t *ids, size_t n,
                         int64_t *ttl, bool *got, size_t *ngot, int64_t *rev,
                         char *err, size_t elen)
{
    etcd_buf_t frames = {0}, raw = {0};
    for (size_t i = 0; i < n; i++) {
        etcd_buf_t m = {0};
        etcd_pb_lease_ka_req(&m, ids[i]);
        etcd_grpc_frame(&frames, &m);
        etcd_buf_free(&m);
    }
    int g = -1;
    uint64_t deadline = pdx_now_ns() + (uint64_t)s0->timeout_ms * 1000000ull;
    pdx_status_t st = frames.data == NULL
                          ? PDX_ERR_NOMEM
                          : etcd_h2_stream(c, endpoint,
                                           "/etcdserverpb.Lease/LeaseKeepAlive",
                                           &frames, deadline, &raw, &g, err,
                                           elen);
    bool ok = st == PDX_OK && g == 0;
    const uint8_t *p = (const uint8_t *)raw.data, *msg;
    size_t left = raw.len, len;
    while (ok && etcd_grpc_next_frame(&p, &left, &msg, &len)) {
        int64_t r = 0, id = 0, t = 0;
        if (etcd_pb_lease_ka_resp(msg, len, &r, &id, &t) < 0) {
            break; /* untrusted: the rest is not read */
        }
        *rev = r > *rev ? r : *rev;
        for (size_t i = 0; id != 0 && i < n; i++) {
            if (ids[i] == id && !got[i]) {
                got[i] = true;
                ttl[i] = t;
                (*ngot)++;
                break;
            }
        }
    }
    if (st == PDX_OK && g > 0) {
        ok = true; /* refused (auth, ...): the calls one by one say why */
    }
    etcd_buf_free(&frames);
    etcd_buf_free(&raw);
    return ok;
}

void etcd_lease_keepalive_batch(etcd_client_t *c, etcd_store_t **ms,
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
    uint64_t sent = pdx_now_ns();
    int64_t *ttl = calloc(n, sizeof(*ttl));
    bool *got = calloc(n, sizeof(*got));
    int64_t rev = 0;
    size_t ngot = 0;
    char h2err[192] = "";
    bool h2 = s0->user == NULL && etcd_h2_usable(endpoint);
    if (h2 && ttl != NULL && got != NULL) {
        cc = keepalive_h2(c, s0, endpoint, ids, n, ttl, got, &ngot, &rev,
                          h2err, sizeof(h2err))
                 ? CURLE_OK : CURLE_RECV_ERROR;
        code = 200;
    } else if (body.data != NULL) {
        etcd_easy_setup(s0, c->lh, endpoint, "/v3/lease/keepalive",
                        body.data, &out, (long)s0->timeout_ms);
        cc = curl_easy_perform(c->lh);
        curl_easy_getinfo(c->lh, CURLINFO_RESPONSE_CODE, &code);
    }
    for (size_t p = 0; !h2 && cc == CURLE_OK && code == 200 && ttl && got &&
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
            lease_renewed(s, ids[i], PDX_OK, ttl[i], sent);
        } else if (cc == CURLE_OK && ngot == 0) {
            /* Not a stream of results: one call, with its auth retry. */
            cJSON *req = cJSON_CreateObject(), *resp = NULL;
            pdx_status_t st = PDX_ERR_NOMEM;
            uint64_t sent1 = pdx_now_ns();
            if (req != NULL) {
                etcd_json_add_i64(req, "ID", ids[i]);
                st = etcd_call(s, c->lh, "/v3/lease/keepalive", req, &resp,
                               true, NULL, 0);
            }
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(resp,
                                                                "result");
            lease_renewed(s, ids[i], st, etcd_json_i64(res, "TTL"), sent1);
            cJSON_Delete(req);
            cJSON_Delete(resp);
        } else {
            char what[256];
            snprintf(what, sizeof(what), "%s%s: %s", endpoint,
                     h2 ? "/etcdserverpb.Lease/LeaseKeepAlive"
                        : "/v3/lease/keepalive",
                     h2 && h2err[0] ? h2err
                     : cc != CURLE_OK ? curl_easy_strerror(cc)
                                      : "no result for the lease");
            etcd_note_fail(s, what);
            lease_renewed(s, ids[i], PDX_ERR_UNAVAILABLE, 0, sent);
        }
    }
    free(ttl);
    free(got);
    etcd_buf_free(&out);
    etcd_buf_free(&body);
}

/* Put one key under `lease`. */
pdx_status_t etcd_put_raw(etcd_store_t *s, CURL *h, const char *key,
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
void etcd_republish_step(etcd_store_t *s, uint64_t now)
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
        pdx_status_t st = etcd_put_raw(s, s->client->th, k->key, k->value,
                                       k->len, lease, true);
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
                s->lease_retry_at_ns = pdx_now_ns();
                lost = true;
            }
            s->republish_backoff_ms =
                etcd_backoff_next(s, s->republish_backoff_ms);
            s->republish_at_ns = pdx_now_ns() +
                                 etcd_backoff_ns(s->republish_backoff_ms);
        }
        pthread_mutex_unlock(&s->lock);
        pthread_mutex_unlock(&s->pub_lock);
        if (st != PDX_OK) {
            break;
        }
    }
    if (lost) {
        etcd_lease_kick(s->client);
    }
}
