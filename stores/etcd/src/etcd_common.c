/* etcd store: what every part of an instance uses: key, block and owner
 * checks, waking the client thread, backoff, the status snapshot. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "etcd_int.h"

bool etcd_valid_key(const char *k)
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

bool etcd_valid_block(const char *b)
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

bool etcd_valid_owner(const char *o)
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

void etcd_wake(etcd_store_t *s)
{
    curl_multi_wakeup(s->client->multi);
}

uint32_t etcd_backoff_next(etcd_store_t *s, uint32_t cur)
{
    uint32_t b = cur ? cur * 2 : s->retry_min_ms;
    return b > s->retry_max_ms ? s->retry_max_ms : b;
}

/* The wait before a retry after a backoff of `ms`: between half of it and
 * all of it (jitter: clients that failed together retry apart). */
uint64_t etcd_backoff_ns(uint32_t ms)
{
    return etcd_rand_range((uint64_t)ms * 500000ull,
                           (uint64_t)ms * 1000000ull);
}

/* Wake the lease thread (a member lost its lease, or joined). No
 * instance lock held. */
void etcd_lease_kick(etcd_client_t *c)
{
    pthread_mutex_lock(&c->lock);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

void etcd_fill_status_locked(etcd_store_t *s, pdx_store_status_t *o)
{
    memset(o, 0, sizeof(*o));
    o->reachable = s->reachable;
    o->unreachable_since_ns = s->reachable ? 0 : s->unreach_rt_ns;
    o->unreachable_ms = !s->reachable && s->unreach_mono_ns
                            ? (pdx_now_ns() - s->unreach_mono_ns) / 1000000
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
