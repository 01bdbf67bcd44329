/* The connector's use of the agent's store: publication, discovery of the
 * agents handoff parameters name, the block-owner registry of the offload
 * pool (batched registrations of saves and unregistrations of evictions,
 * demotion of replicas with enough owners, the whole pool registered again
 * when the store grants a new lease), and cross-node offload hits.
 *
 * A cross-node hit, between a reader R whose pool misses and an owner O:
 *   R lookup -> PDX_INPROGRESS; R's registry thread asks the store for the
 *   owners of the request's blocks, picks the agent with the longest prefix
 *   (longer than R's own), loads it by name (invariants checked) and sends
 *   it "fetch <rid> <first> <total> <hash>..." notifications (several when
 *   the hashes do not fit one);
 *   O pins the longest prefix it still has (a pool lease) and answers
 *   "offer <rid> <first> <total> <addr>..." with the slab addresses;
 *   R's next lookup returns a REMOTE match of those blocks, its load READs
 *   them like a handoff from O's pool (done/hb/reject <rid> as for any
 *   handoff), and O releases the lease on done, reject or expiry.
 * Messages are text, at most PDX_NOTIF_MAX bytes each. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <cjson/cJSON.h>

#include <pdx/log.h>
#include <pdx/notif.h>
#include <pdx/peer.h>
#include <pdx/store.h>
#include <pdx/xfer.h>

#include "pdx_clock.h"

#include "kv_handoff_int.h"
#include "kv_store_int.h"

#define MSG_FETCH "pdxkv:fetch "
#define MSG_OFFER "pdxkv:offer "
#define RID_PREFIX "xf-"
#define REG_BATCH 4096      /* blocks in one registration call */
#define REG_QUEUE_MAX 65536 /* registrations waiting; older ones dropped */
#define REG_COALESCE_NS 2000000ull
#define REG_RETRY_NS 1000000000ull  /* after the store was unreachable */
#define LEASE_CHECK_NS 100000000ull /* how often a new lease is looked for */
#define SERVE_LEASE_NS 30000000000ull /* a served prefix without hb/done */
#define FAILED_KEEP_NS 5000000000ull  /* no second query meanwhile */

typedef enum {
    XF_QUERY = 0, /* waiting for the registry thread */
    XF_ASKING,    /* the thread is querying */
    XF_WAIT,      /* fetch sent, waiting for the offer */
    XF_OFFERED,
    XF_MATCHED, /* returned by a lookup, not loaded yet */
    XF_FAILED,
} xf_state_t;

typedef struct xfetch {
    struct xfetch *next;
    char req[PDX_KV_REQ_ID_MAX];
    char rid[PDX_KV_REQ_ID_MAX];
    char owner[PDX_NAME_MAX];
    xf_state_t state;
    size_t n, local;
    pdx_offload_key_t *keys;
    size_t offered, got;
    uint64_t *addrs;
    uint64_t deadline_ns;
} xfetch_t;

typedef struct xserve {
    struct xserve *next;
    char rid[PDX_KV_REQ_ID_MAX];
    char peer[PDX_NAME_MAX];
    size_t total, got;
    pdx_offload_key_t *keys;
    pdx_offload_lease_h lease;
    uint64_t deadline_ns;
    bool to_answer; /* every hash arrived: the thread answers */
} xserve_t;

struct kv_store {
    pdx_agent_h agent;
    pdx_offload_pool_h pool;
    uint32_t block_tokens;
    bool registry, remote_offload;
    uint32_t demote_owners, remote_timeout_ms, fetch_timeout_ms;

    pthread_mutex_t lock;
    pthread_cond_t cv;
    bool stop;
    pthread_t thread;
    bool running;
    pdx_offload_key_t *regq;
    size_t nregq;
    uint64_t last_push_ns, reg_retry_ns;
    bool reg_dropped; /* regq overflowed: some saves never registered */
    /* Evicted blocks to unregister (kv_store_evicted), batched likewise. */
    pdx_offload_key_t *delq;
    size_t ndelq;
    uint64_t last_del_ns, del_retry_ns;
    /* A new lease (the old one expired, and its entries with it): the
     * whole pool is registered again, REG_BATCH blocks at a time. */
    uint64_t leases_seen, lease_check_ns;
    bool resync;
    uint64_t resync_cursor, resync_retry_ns, resync_blocks;
    uint32_t resync_gen; /* bumped at each start */
    xfetch_t *fetches;
    xserve_t *serves;
    uint32_t rid_base;
    uint64_t rid_seq;
    uint64_t last_dead_check_ns;
    pdx_offload_key_t *batch; /* REG_BATCH keys: the registry thread's */
    pdx_kv_store_stats_t stats;
};

static xserve_t **find_serve(kv_store_t *s, const char *peer,
                             const char *rid);
static void serve_free(kv_store_t *s, xserve_t *v);
static void serve_answer(kv_store_t *s, xserve_t *v);

static void key_hex(const pdx_offload_key_t *k, char *buf, size_t len)
{
    static const char digits[] = "0123456789abcdef";
    size_t n = 0;
    for (uint8_t i = 0; i < k->len && n + 2 < len; i++) {
        buf[n++] = digits[k->bytes[i] >> 4];
        buf[n++] = digits[k->bytes[i] & 15];
    }
    buf[n] = '\0';
}

static bool hex_key(const char *s, size_t n, pdx_offload_key_t *k)
{
    if (n == 0 || n % 2 != 0 || n / 2 > PDX_OFFLOAD_KEY_MAX) {
        return false;
    }
    memset(k, 0, sizeof(*k));
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int v = c >= '0' && c <= '9' ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                       : -1;
        if (v < 0) {
            return false;
        }
        k->bytes[i / 2] = (uint8_t)(k->bytes[i / 2] << 4 | v);
    }
    k->len = (uint8_t)(n / 2);
    return true;
}

void kv_store_agent_params(const pdx_kv_config_t *cfg,
                           pdx_agent_params_t *ap)
{
    if (!cfg->has_store || (ap->field_mask & PDX_AGENT_PARAM_STORE)) {
        return; /* the caller's own store parameters win */
    }
    ap->field_mask |= PDX_AGENT_PARAM_STORE;
    ap->store = cfg->store_type;
    ap->store_endpoints = cfg->store_endpoints;
    ap->store_namespace = cfg->store_namespace;
    ap->store_lease_ttl_ms = cfg->store_lease_ttl_ms;
    ap->store_timeout_ms = cfg->store_timeout_ms;
    ap->store_max_txn_ops = cfg->store_max_txn_ops;
    /* TLS and auth options: read by pdx_agent_create, which the caller
     * makes next on this thread (the strings live in cfg). */
    static _Thread_local pdx_option_t opts[5];
    const char *const names[5] = {"ca_file", "cert_file", "key_file", "user",
                                  "password_file"};
    const char *const vals[5] = {cfg->store_ca_file, cfg->store_cert_file,
                                 cfg->store_key_file, cfg->store_user,
                                 cfg->store_password_file};
    size_t n = 0;
    for (size_t i = 0; i < 5; i++) {
        if (vals[i][0] != '\0') {
            opts[n].key = names[i];
            opts[n].value = vals[i];
            n++;
        }
    }
    if (n > 0 && !(ap->field_mask & PDX_AGENT_PARAM_STORE_OPTS)) {
        ap->field_mask |= PDX_AGENT_PARAM_STORE_OPTS;
        ap->store_opts = opts;
        ap->store_nopts = n;
    }
}

/* ---- registry thread ---- */

static char **hex_list(const pdx_offload_key_t *keys, size_t n)
{
    char **hex = calloc(n ? n : 1, sizeof(*hex));
    for (size_t i = 0; hex != NULL && i < n; i++) {
        hex[i] = malloc(2 * PDX_OFFLOAD_KEY_MAX + 1);
        if (hex[i] == NULL) {
            for (size_t j = 0; j < i; j++) {
                free(hex[j]);
            }
            free(hex);
            return NULL;
        }
        key_hex(&keys[i], hex[i], 2 * PDX_OFFLOAD_KEY_MAX + 1);
    }
    return hex;
}

static void hex_free(char **hex, size_t n)
{
    for (size_t i = 0; hex != NULL && i < n; i++) {
        free(hex[i]);
    }
    free(hex);
}

/* Moves the keys of keys[0..n) that the pool holds (present) or does not
 * hold (!present) to the front; returns their number. Checked when a batch
 * goes out, on the registry thread that sends every batch: whatever order
 * saves and evictions of one block were queued in, the last batch sent for
 * it matches whether the pool has it (an eviction after the check queues
 * an unregistration, a save after it a registration, both sent later). */
static size_t keep_if(kv_store_t *s, pdx_offload_key_t *keys, size_t n,
                      bool present)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        pdx_offload_class_t cls;
        bool in = pdx_offload_class_of(s->pool, &keys[i], &cls) == PDX_OK;
        if (in == present) {
            keys[k++] = keys[i];
        }
    }
    return k;
}

/* Register this agent as an owner of the n blocks (one call, transactions
 * of max_txn_ops), demoting replicas with enough owners. `again`: a walk
 * after a new lease. Registry thread. */
static pdx_status_t do_register(kv_store_t *s, pdx_offload_key_t *keys,
                                size_t n, bool again)
{
    if (n == 0) {
        return PDX_OK;
    }
    char **hex = hex_list(keys, n);
    uint32_t *counts = calloc(n, sizeof(*counts));
    pdx_status_t st = PDX_ERR_NOMEM;
    if (hex != NULL && counts != NULL) {
        st = pdx_store_owners_add(s->agent, (const char *const *)hex, n,
                                  counts);
    }
    size_t demoted = 0;
    for (size_t i = 0; st == PDX_OK && i < n; i++) {
        if (counts[i] < s->demote_owners) {
            continue;
        }
        /* Enough live owners: this replica may go first under pressure. The
         * pool demotes at demote_owners owner hints. */
        pdx_offload_class_t cls;
        for (uint32_t j = 0;
             j < s->demote_owners &&
             pdx_offload_class_of(s->pool, &keys[i], &cls) == PDX_OK &&
             cls == PDX_OFFLOAD_RETAINED;
             j++) {
            pdx_offload_add_owner(s->pool, &keys[i]);
        }
        if (pdx_offload_class_of(s->pool, &keys[i], &cls) == PDX_OK &&
            cls == PDX_OFFLOAD_RECLAIMABLE) {
            demoted++;
        }
    }
    hex_free(hex, n);
    free(counts);
    pthread_mutex_lock(&s->lock);
    if (st == PDX_OK) {
        s->stats.registrations++;
        s->stats.registered_blocks += n;
        s->stats.demoted += demoted;
        if (again) {
            s->stats.reregistered_blocks += n;
            s->resync_blocks += n;
        }
    } else {
        s->stats.registration_failures++;
    }
    pthread_mutex_unlock(&s->lock);
    if (st != PDX_OK && st != PDX_ERR_UNAVAILABLE) {
        pdx_warn("kv: registering %zu block owners failed: %s", n,
                 pdx_status_string(st));
    }
    return st;
}

/* A batch of saves from regq. */
static void register_saved(kv_store_t *s, pdx_offload_key_t *keys, size_t n)
{
    n = keep_if(s, keys, n, true); /* evicted meanwhile: nothing to own */
    pdx_status_t st = do_register(s, keys, n, false);
    if (st != PDX_ERR_UNAVAILABLE) {
        return;
    }
    /* Store down (or no lease yet): keep them for later. */
    pthread_mutex_lock(&s->lock);
    size_t room = REG_QUEUE_MAX - s->nregq;
    size_t keep = n < room ? n : room;
    if (keep < n) {
        s->reg_dropped = true;
    }
    memmove(s->regq + keep, s->regq, s->nregq * sizeof(*s->regq));
    memcpy(s->regq, keys, keep * sizeof(*keys));
    s->nregq += keep;
    s->reg_retry_ns = pdx_now_ns() + REG_RETRY_NS;
    pthread_mutex_unlock(&s->lock);
}

/* Remove this agent as the owner of the evicted blocks of keys[0..n) that
 * the pool does not hold again. Registry thread. */
static void unregister_evicted(kv_store_t *s, pdx_offload_key_t *keys, size_t n)
{
    n = keep_if(s, keys, n, false); /* saved again meanwhile: still owned */
    if (n == 0) {
        return;
    }
    char **hex = hex_list(keys, n);
    pdx_status_t st = PDX_ERR_NOMEM;
    if (hex != NULL) {
        st = pdx_store_owners_del(s->agent, (const char *const *)hex, n);
    }
    hex_free(hex, n);
    pthread_mutex_lock(&s->lock);
    if (st == PDX_OK) {
        s->stats.unregistrations++;
        s->stats.unregistered_blocks += n;
    } else {
        s->stats.registration_failures++;
        if (st == PDX_ERR_UNAVAILABLE) {
            /* Entries of a lease that expires meanwhile go with it; those
             * of a lease that lives on must still go: retry. */
            size_t room = REG_QUEUE_MAX - s->ndelq;
            size_t keep = n < room ? n : room;
            memmove(s->delq + keep, s->delq, s->ndelq * sizeof(*s->delq));
            memcpy(s->delq, keys, keep * sizeof(*keys));
            s->ndelq += keep;
            s->del_retry_ns = pdx_now_ns() + REG_RETRY_NS;
        }
    }
    pthread_mutex_unlock(&s->lock);
    if (st != PDX_OK && st != PDX_ERR_UNAVAILABLE) {
        pdx_warn("kv: unregistering %zu evicted blocks failed: %s", n,
                 pdx_status_string(st));
    }
}

/* Registry thread, without the lock: has the store granted a new lease
 * since the last look? Then the entries of the old one are gone: start
 * walking the pool to register every block again. So does a long outage
 * that overflowed the queue of saves to register, once a lease is held. */
static void check_lease(kv_store_t *s)
{
    pdx_store_status_t st;
    if (pdx_store_status(s->agent, &st) != PDX_OK) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    bool new_lease = st.leases_granted > s->leases_seen && s->leases_seen > 0;
    bool start = new_lease || (s->reg_dropped && st.reachable && st.lease != 0);
    s->leases_seen = st.leases_granted;
    if (start) {
        /* Queued saves the pool still holds are in the walk. */
        s->nregq = 0;
        s->reg_dropped = false;
        s->resync = true;
        s->resync_cursor = 0;
        s->resync_retry_ns = 0;
        s->resync_blocks = 0;
        s->resync_gen++;
        s->stats.lease_resyncs++;
    }
    pthread_mutex_unlock(&s->lock);
    if (start) {
        pdx_offload_stats_t os = {0};
        pdx_offload_stats(s->pool, &os);
        pdx_info("kv: agent %s: registering the %llu blocks of the pool "
                 "again (%s, lease %llx)", pdx_agent_name(s->agent),
                 (unsigned long long)(os.blocks[PDX_OFFLOAD_RETAINED] +
                                      os.blocks[PDX_OFFLOAD_RECLAIMABLE]),
                 new_lease ? "the store granted a new lease"
                           : "saves were dropped while the store was down",
                 (unsigned long long)st.lease);
    }
}

/* Registry thread, without the lock: the next REG_BATCH blocks of the
 * walk. */
static void resync_step(kv_store_t *s, pdx_offload_key_t *keys)
{
    pthread_mutex_lock(&s->lock);
    uint64_t cur = s->resync_cursor;
    uint32_t gen = s->resync_gen;
    pthread_mutex_unlock(&s->lock);
    size_t n = 0;
    /* Each call looks at a bounded number of slots; the pool has at most
     * 2^30 of them. */
    for (int guard = 0; guard < (1 << 17) && n < REG_BATCH; guard++) {
        size_t got = 0;
        if (pdx_offload_keys(s->pool, &cur, keys + n, REG_BATCH - n, &got) !=
            PDX_OK) {
            cur = 0;
            break;
        }
        n += got;
        if (cur == 0) {
            break;
        }
    }
    n = keep_if(s, keys, n, true);
    pdx_status_t st = do_register(s, keys, n, true);
    pthread_mutex_lock(&s->lock);
    if (s->resync_gen != gen) {
        /* Restarted meanwhile (yet another lease): nothing to move. */
    } else if (st == PDX_ERR_UNAVAILABLE) {
        s->resync_retry_ns = pdx_now_ns() + REG_RETRY_NS;
    } else if (cur == 0) {
        s->resync = false;
        pdx_info("kv: agent %s: %llu blocks registered again under the new "
                 "lease", pdx_agent_name(s->agent),
                 (unsigned long long)s->resync_blocks);
    } else {
        s->resync_cursor = cur;
    }
    pthread_mutex_unlock(&s->lock);
}

static bool send_fetch(kv_store_t *s, const char *owner, const char *rid,
                       const pdx_offload_key_t *keys, size_t n)
{
    char msg[PDX_NOTIF_MAX];
    size_t first = 0;
    for (size_t guard = 0; first < n && guard <= n; guard++) {
        int len = snprintf(msg, sizeof(msg), MSG_FETCH "%s %zu %zu", rid,
                           first, n);
        size_t i = first;
        while (i < n && (size_t)len + 2 + 2 * keys[i].len < sizeof(msg)) {
            msg[len++] = ' ';
            key_hex(&keys[i], msg + len, sizeof(msg) - (size_t)len);
            len += 2 * keys[i].len;
            i++;
        }
        if (pdx_notif_send(s->agent, owner, msg, (size_t)len) != PDX_OK) {
            return false;
        }
        first = i;
    }
    return true;
}

/* Registry thread: find the best owner of x's blocks and ask it. */
static void do_query(kv_store_t *s, xfetch_t *x, pdx_offload_key_t *keys,
                     size_t n, size_t local)
{
    char **hex = hex_list(keys, n);
    pdx_status_t st = PDX_ERR_NOMEM;
    char owner[PDX_NAME_MAX] = "";
    size_t best = 0;
    if (hex != NULL) {
        /* Sampled rounds, not every block: see pdx/store.h. */
        st = pdx_store_owners_longest(s->agent, (const char *const *)hex, n,
                                      owner, &best);
    }
    hex_free(hex, n);
    bool ok = st == PDX_OK && best > local;
    if (ok) {
        /* The owner by name, invariants checked like any peer. */
        st = pdx_peer_fetch(s->agent, owner, s->fetch_timeout_ms);
        ok = st == PDX_OK;
        if (!ok) {
            pdx_warn("kv: owner %s of %zu blocks cannot be used: %s", owner,
                     best, pdx_status_string(st));
        }
    }
    char rid[PDX_KV_REQ_ID_MAX];
    pthread_mutex_lock(&s->lock);
    snprintf(rid, sizeof(rid), RID_PREFIX "%08x-%" PRIu64, s->rid_base,
             ++s->rid_seq);
    pthread_mutex_unlock(&s->lock);
    if (ok) {
        ok = send_fetch(s, owner, rid, keys, best);
    }
    pthread_mutex_lock(&s->lock);
    s->stats.remote_queries++;
    if (x->state == XF_ASKING) {
        if (ok) {
            snprintf(x->rid, sizeof(x->rid), "%s", rid);
            snprintf(x->owner, sizeof(x->owner), "%s", owner);
            x->state = XF_WAIT;
        } else {
            x->state = XF_FAILED;
            x->deadline_ns = pdx_now_ns() + FAILED_KEEP_NS;
        }
    }
    pthread_mutex_unlock(&s->lock);
    pdx_debug("kv: registry: %s owns %zu of %zu blocks (local %zu)%s",
              owner[0] ? owner : "nobody", best, n, local,
              ok ? ": asked" : "");
}

static void *reg_main(void *arg)
{
    kv_store_t *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        uint64_t now = pdx_now_ns();
        xserve_t *v = s->serves;
        while (v != NULL && !v->to_answer) {
            v = v->next;
        }
        if (v != NULL) {
            v->to_answer = false;
            char peer[PDX_NAME_MAX], rid[PDX_KV_REQ_ID_MAX];
            snprintf(peer, sizeof(peer), "%s", v->peer);
            snprintf(rid, sizeof(rid), "%s", v->rid);
            pthread_mutex_unlock(&s->lock);
            /* The reader, by name (it published before asking). */
            pdx_status_t st = pdx_peer_fetch(s->agent, peer,
                                             s->fetch_timeout_ms);
            pthread_mutex_lock(&s->lock);
            xserve_t **pp = find_serve(s, peer, rid);
            if (*pp != NULL && st == PDX_OK) {
                serve_answer(s, *pp);
            } else if (*pp != NULL) {
                pdx_warn("kv: cannot answer %s's fetch %s: %s", peer, rid,
                         pdx_status_string(st));
                xserve_t *dead = *pp;
                *pp = dead->next;
                serve_free(s, dead);
            }
            continue;
        }
        xfetch_t *q = s->fetches;
        while (q != NULL && q->state != XF_QUERY) {
            q = q->next;
        }
        if (q != NULL) {
            q->state = XF_ASKING;
            size_t n = q->n, local = q->local;
            pdx_offload_key_t *keys = malloc(n * sizeof(*keys));
            if (keys != NULL) {
                memcpy(keys, q->keys, n * sizeof(*keys));
            }
            pthread_mutex_unlock(&s->lock);
            if (keys != NULL) {
                do_query(s, q, keys, n, local);
            }
            free(keys);
            pthread_mutex_lock(&s->lock);
            if (keys == NULL && q->state == XF_ASKING) {
                q->state = XF_FAILED;
            }
            continue;
        }
        if (s->registry && now >= s->lease_check_ns) {
            s->lease_check_ns = now + LEASE_CHECK_NS;
            pthread_mutex_unlock(&s->lock);
            check_lease(s);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        if (s->nregq > 0 && now >= s->reg_retry_ns &&
            (now - s->last_push_ns >= REG_COALESCE_NS ||
             s->nregq >= REG_BATCH)) {
            size_t n = s->nregq < REG_BATCH ? s->nregq : REG_BATCH;
            memcpy(s->batch, s->regq, n * sizeof(*s->batch));
            memmove(s->regq, s->regq + n, (s->nregq - n) * sizeof(*s->regq));
            s->nregq -= n;
            pthread_mutex_unlock(&s->lock);
            register_saved(s, s->batch, n);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        if (s->ndelq > 0 && now >= s->del_retry_ns &&
            (now - s->last_del_ns >= REG_COALESCE_NS ||
             s->ndelq >= REG_BATCH)) {
            size_t n = s->ndelq < REG_BATCH ? s->ndelq : REG_BATCH;
            memcpy(s->batch, s->delq, n * sizeof(*s->batch));
            memmove(s->delq, s->delq + n, (s->ndelq - n) * sizeof(*s->delq));
            s->ndelq -= n;
            pthread_mutex_unlock(&s->lock);
            unregister_evicted(s, s->batch, n);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        if (s->resync && now >= s->resync_retry_ns) {
            pthread_mutex_unlock(&s->lock);
            resync_step(s, s->batch);
            pthread_mutex_lock(&s->lock);
            continue;
        }
        bool pending = s->nregq > 0 || s->ndelq > 0 || s->resync;
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += pending ? 2000000L : 100000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&s->cv, &s->lock, &dl);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

pdx_status_t kv_store_start(const pdx_kv_config_t *cfg, pdx_agent_h agent,
                            pdx_offload_pool_h pool, uint32_t block_tokens,
                            kv_store_t **s_p)
{
    *s_p = NULL;
    if (!cfg->has_store) {
        return PDX_OK;
    }
    kv_store_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return PDX_ERR_NOMEM;
    }
    s->agent = agent;
    s->pool = pool;
    s->block_tokens = block_tokens;
    s->registry = cfg->store_registry && pool != NULL;
    s->remote_offload = cfg->store_remote_offload && pool != NULL;
    s->demote_owners = cfg->store_demote_owners;
    s->remote_timeout_ms = cfg->store_remote_offload_timeout_ms;
    s->fetch_timeout_ms = cfg->store_fetch_timeout_ms;
    if (getrandom(&s->rid_base, sizeof(s->rid_base), 0) !=
        sizeof(s->rid_base)) {
        s->rid_base = (uint32_t)pdx_now_ns();
    }
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (s->registry) {
        s->regq = malloc(REG_QUEUE_MAX * sizeof(*s->regq));
        s->delq = malloc(REG_QUEUE_MAX * sizeof(*s->delq));
        s->batch = malloc(REG_BATCH * sizeof(*s->batch));
        if (s->regq == NULL || s->delq == NULL || s->batch == NULL) {
            kv_store_stop(s);
            return PDX_ERR_NOMEM;
        }
    }
    int rc = pthread_create(&s->thread, NULL, reg_main, s);
    if (rc != 0) {
        pdx_error("kv: store registry thread: %s", strerror(rc));
        kv_store_stop(s);
        return PDX_ERR_IO;
    }
    s->running = true;
    pdx_status_t st = pdx_agent_publish(agent);
    if (st != PDX_OK) {
        kv_store_stop(s);
        return st;
    }
    *s_p = s;
    return PDX_OK;
}

void kv_store_stop(kv_store_t *s)
{
    if (s == NULL) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->lock);
    if (s->running) {
        pthread_join(s->thread, NULL);
    }
    while (s->fetches != NULL) {
        xfetch_t *x = s->fetches;
        s->fetches = x->next;
        free(x->keys);
        free(x->addrs);
        free(x);
    }
    while (s->serves != NULL) {
        xserve_t *v = s->serves;
        s->serves = v->next;
        if (v->lease != NULL) {
            pdx_offload_release(s->pool, v->lease);
        }
        free(v->keys);
        free(v);
    }
    free(s->regq);
    free(s->delq);
    free(s->batch);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

void kv_store_saved(kv_store_t *s, const pdx_offload_key_t *key)
{
    if (s == NULL || !s->registry) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    if (s->nregq == REG_QUEUE_MAX) {
        /* The store has been down long: the oldest registrations go (the
         * next lease's walk registers what the pool still holds). */
        memmove(s->regq, s->regq + 1, (s->nregq - 1) * sizeof(*s->regq));
        s->nregq--;
        s->stats.registration_failures++;
        s->reg_dropped = true;
    }
    s->regq[s->nregq++] = *key;
    s->last_push_ns = pdx_now_ns();
    if (s->nregq == 1 || s->nregq >= REG_BATCH) {
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->lock);
}

void kv_store_evicted(kv_store_t *s, const pdx_offload_key_t *key)
{
    if (s == NULL || !s->registry) {
        return;
    }
    pthread_mutex_lock(&s->lock);
    if (s->ndelq == REG_QUEUE_MAX) {
        /* The store has been down long: this entry stays until the lease
         * ends (the newest is dropped: O(1) on the save path). */
        s->stats.registration_failures++;
    } else {
        s->delq[s->ndelq++] = *key;
        s->last_del_ns = pdx_now_ns();
        if (s->ndelq == 1 || s->ndelq >= REG_BATCH) {
            pthread_cond_broadcast(&s->cv);
        }
    }
    pthread_mutex_unlock(&s->lock);
}

void kv_store_discover(kv_store_t *s, const char *params)
{
    if (s == NULL || params == NULL) {
        return;
    }
    cJSON *root = cJSON_Parse(params);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "agent");
    char name[PDX_NAME_MAX] = "";
    if (cJSON_IsString(a) && strlen(a->valuestring) < sizeof(name)) {
        snprintf(name, sizeof(name), "%s", a->valuestring);
    }
    cJSON_Delete(root);
    if (name[0] == '\0' || strcmp(name, pdx_agent_name(s->agent)) == 0) {
        return;
    }
    pdx_status_t state = pdx_peer_state(s->agent, name);
    if (state == PDX_OK) {
        return;
    }
    /* Unknown: wait for it to be published. Dead: only a newer blob
     * already known helps, so do not wait. */
    uint32_t wait = state == PDX_ERR_NOT_FOUND ? s->fetch_timeout_ms : 0;
    pdx_status_t st = pdx_peer_fetch(s->agent, name, wait);
    if (st == PDX_OK) {
        pthread_mutex_lock(&s->lock);
        s->stats.discovered++;
        pthread_mutex_unlock(&s->lock);
        pdx_info("kv: agent %s: peer %s found through the store",
                 pdx_agent_name(s->agent), name);
    }
}

static xfetch_t **find_fetch(kv_store_t *s, const char *req, const char *rid)
{
    xfetch_t **pp = &s->fetches;
    while (*pp != NULL && !(req && strcmp((*pp)->req, req) == 0) &&
           !(rid && strcmp((*pp)->rid, rid) == 0)) {
        pp = &(*pp)->next;
    }
    return pp;
}

static void fetch_reject(kv_store_t *s, xfetch_t *x)
{
    if (x->rid[0] != '\0' && x->owner[0] != '\0' &&
        (x->state == XF_WAIT || x->state == XF_OFFERED ||
         x->state == XF_MATCHED)) {
        kv_msg_send(s->agent, x->owner, "reject", x->rid);
    }
}

pdx_status_t kv_store_match(kv_store_t *s, const pdx_kv_request_t *r,
                            size_t local, pdx_kv_match_t *m)
{
    if (s == NULL || !s->remote_offload || r->nfull == 0 ||
        local >= r->nfull) {
        return PDX_OK;
    }
    uint64_t now = pdx_now_ns();
    pthread_mutex_lock(&s->lock);
    xfetch_t **pp = find_fetch(s, r->req_id, NULL);
    xfetch_t *x = *pp;
    pdx_status_t st = PDX_OK;
    if (x == NULL) {
        x = calloc(1, sizeof(*x));
        pdx_offload_key_t *keys = x ? malloc(r->nfull * sizeof(*keys)) : NULL;
        if (keys == NULL) {
            free(x);
            pthread_mutex_unlock(&s->lock);
            return PDX_OK; /* no memory: the local result */
        }
        for (size_t i = 0; i < r->nfull; i++) {
            memcpy(&keys[i], &r->hashes[i], sizeof(keys[i]));
        }
        snprintf(x->req, sizeof(x->req), "%s", r->req_id);
        x->keys = keys;
        x->n = r->nfull;
        x->local = local;
        x->state = XF_QUERY;
        x->deadline_ns = now + (uint64_t)s->remote_timeout_ms * 1000000ull;
        x->next = s->fetches;
        s->fetches = x;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->lock);
        return PDX_INPROGRESS;
    }
    switch (x->state) {
    case XF_QUERY:
    case XF_ASKING:
    case XF_WAIT:
        if (now < x->deadline_ns) {
            st = PDX_INPROGRESS;
        } else {
            pdx_debug("kv: lookup %s: no owner answered within %u ms; the "
                      "local pool's %zu blocks", r->req_id,
                      s->remote_timeout_ms, local);
            fetch_reject(s, x);
            x->state = XF_FAILED;
            x->deadline_ns = now + FAILED_KEEP_NS;
        }
        break;
    case XF_OFFERED:
    case XF_MATCHED:
        if (x->offered > local && x->offered <= r->nfull) {
            if (x->state == XF_OFFERED) {
                s->stats.remote_hits++;
                s->stats.remote_hit_blocks += x->offered;
            }
            x->state = XF_MATCHED;
            x->deadline_ns = now + SERVE_LEASE_NS;
            *m = (pdx_kv_match_t){.source = PDX_KV_SOURCE_REMOTE,
                                  .blocks = x->offered};
        } else {
            fetch_reject(s, x);
            x->state = XF_FAILED;
            x->deadline_ns = now + FAILED_KEEP_NS;
        }
        break;
    case XF_FAILED:
        break;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

char *kv_store_take_params(kv_store_t *s, const char *req_id)
{
    if (s == NULL) {
        return NULL;
    }
    pthread_mutex_lock(&s->lock);
    xfetch_t **pp = find_fetch(s, req_id, NULL);
    xfetch_t *x = *pp;
    char *text = NULL;
    if (x != NULL && x->state == XF_MATCHED) {
        /* A handoff from the owner's pool, as request_finished writes it. */
        cJSON *root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "agent", x->owner);
        cJSON_AddStringToObject(root, "req", x->rid);
        cJSON_AddStringToObject(root, "source", "pool");
        cJSON_AddNumberToObject(root, "tokens",
                                (double)(x->offered * s->block_tokens));
        cJSON *hs = cJSON_AddArrayToObject(root, "hashes");
        for (size_t i = 0; hs != NULL && i < x->offered; i++) {
            char hex[2 * PDX_OFFLOAD_KEY_MAX + 1];
            key_hex(&x->keys[i], hex, sizeof(hex));
            cJSON_AddItemToArray(hs, cJSON_CreateString(hex));
        }
        kv_json_add_u64s(root, "addrs", x->addrs, x->offered);
        text = cJSON_PrintUnformatted(root);
        cJSON_Delete(root);
        *pp = x->next;
        free(x->keys);
        free(x->addrs);
        free(x);
    }
    pthread_mutex_unlock(&s->lock);
    return text;
}

/* ---- notifications (under the connector lock) ---- */

static xserve_t **find_serve(kv_store_t *s, const char *peer, const char *rid)
{
    xserve_t **pp = &s->serves;
    while (*pp != NULL && (strcmp((*pp)->rid, rid) != 0 ||
                           strcmp((*pp)->peer, peer) != 0)) {
        pp = &(*pp)->next;
    }
    return pp;
}

static void serve_free(kv_store_t *s, xserve_t *v)
{
    if (v->lease != NULL) {
        pdx_offload_release(s->pool, v->lease);
    }
    free(v->keys);
    free(v);
}

/* Owner: every hash of a fetch arrived; pin and answer. */
static void serve_answer(kv_store_t *s, xserve_t *v)
{
    size_t got = 0;
    if (pdx_offload_lease(s->pool, v->keys, v->total, &v->lease, &got) !=
        PDX_OK) {
        v->lease = NULL;
        got = 0;
    }
    char msg[PDX_NOTIF_MAX];
    size_t first = 0;
    do {
        int len = snprintf(msg, sizeof(msg), MSG_OFFER "%s %zu %zu", v->rid,
                           first, got);
        size_t i = first;
        while (i < got && (size_t)len + 24 < sizeof(msg)) {
            const void *p = NULL;
            pdx_offload_lease_block(s->pool, v->lease, i, &p);
            len += snprintf(msg + len, sizeof(msg) - (size_t)len, " %" PRIu64,
                            (uint64_t)(uintptr_t)p);
            i++;
        }
        pdx_notif_send(s->agent, v->peer, msg, (size_t)len);
        first = i;
    } while (first < got);
    s->stats.remote_served++;
    v->deadline_ns = pdx_now_ns() + SERVE_LEASE_NS;
    free(v->keys);
    v->keys = NULL;
    pdx_debug("kv: serving %zu of %zu blocks to %s (%s)", got, v->total,
              v->peer, v->rid);
}

static void on_fetch(kv_store_t *s, const char *peer, char *text)
{
    char *save = NULL;
    char *rid = strtok_r(text, " ", &save);
    char *first_s = strtok_r(NULL, " ", &save);
    char *total_s = strtok_r(NULL, " ", &save);
    if (rid == NULL || first_s == NULL || total_s == NULL ||
        strlen(rid) >= PDX_KV_REQ_ID_MAX || s->pool == NULL) {
        return;
    }
    size_t first = strtoull(first_s, NULL, 10);
    size_t total = strtoull(total_s, NULL, 10);
    if (total == 0 || total > (1u << 24)) {
        return;
    }
    xserve_t **pp = find_serve(s, peer, rid);
    xserve_t *v = *pp;
    if (v == NULL) {
        if (first != 0) {
            return;
        }
        v = calloc(1, sizeof(*v));
        pdx_offload_key_t *keys = v ? malloc(total * sizeof(*keys)) : NULL;
        if (keys == NULL) {
            free(v);
            return;
        }
        snprintf(v->rid, sizeof(v->rid), "%s", rid);
        snprintf(v->peer, sizeof(v->peer), "%s", peer);
        v->keys = keys;
        v->total = total;
        v->deadline_ns = pdx_now_ns() + SERVE_LEASE_NS;
        v->next = s->serves;
        s->serves = v;
    }
    if (v->keys == NULL || v->total != total || first != v->got) {
        return; /* answered already, or out of order: ignored */
    }
    for (char *h = strtok_r(NULL, " ", &save); h != NULL && v->got < total;
         h = strtok_r(NULL, " ", &save)) {
        if (!hex_key(h, strlen(h), &v->keys[v->got])) {
            pdx_warn("kv: fetch %s from %s: bad hash", rid, peer);
            *find_serve(s, peer, rid) = v->next;
            serve_free(s, v);
            return;
        }
        v->got++;
    }
    if (v->got == v->total) {
        /* Answered by the registry thread: the reader may not be loaded
         * here yet (found by name, which may wait). */
        v->to_answer = true;
        pthread_cond_broadcast(&s->cv);
    }
}

static void on_offer(kv_store_t *s, const char *peer, char *text)
{
    char *save = NULL;
    char *rid = strtok_r(text, " ", &save);
    char *first_s = strtok_r(NULL, " ", &save);
    char *total_s = strtok_r(NULL, " ", &save);
    if (rid == NULL || first_s == NULL || total_s == NULL) {
        return;
    }
    size_t first = strtoull(first_s, NULL, 10);
    size_t total = strtoull(total_s, NULL, 10);
    xfetch_t *x = *find_fetch(s, NULL, rid);
    if (x == NULL || x->state != XF_WAIT || strcmp(x->owner, peer) != 0) {
        /* Too late (the lookup gave up): free the owner's lease now. */
        if (total > 0 && first == 0) {
            kv_msg_send(s->agent, peer, "reject", rid);
        }
        return;
    }
    if (total == 0 || total > x->n) {
        x->state = XF_FAILED;
        x->deadline_ns = pdx_now_ns() + FAILED_KEEP_NS;
        if (total > 0) {
            fetch_reject(s, x);
        }
        return;
    }
    if (x->addrs == NULL) {
        if (first != 0) {
            return;
        }
        x->addrs = calloc(total, sizeof(*x->addrs));
        if (x->addrs == NULL) {
            return;
        }
        x->offered = total;
    }
    if (first != x->got || total != x->offered) {
        return;
    }
    for (char *a = strtok_r(NULL, " ", &save); a != NULL && x->got < total;
         a = strtok_r(NULL, " ", &save)) {
        x->addrs[x->got++] = strtoull(a, NULL, 10);
    }
    if (x->got == x->offered) {
        x->state = XF_OFFERED;
        x->deadline_ns = pdx_now_ns() + SERVE_LEASE_NS;
    }
}

bool kv_store_on_note(kv_store_t *s, const char *peer, const void *msg,
                      size_t len)
{
    if (s == NULL || len < 6 || len >= PDX_NOTIF_MAX + 1) {
        return false;
    }
    const char *m = msg;
    bool fetch = len > sizeof(MSG_FETCH) - 1 &&
                 memcmp(m, MSG_FETCH, sizeof(MSG_FETCH) - 1) == 0;
    bool offer = len > sizeof(MSG_OFFER) - 1 &&
                 memcmp(m, MSG_OFFER, sizeof(MSG_OFFER) - 1) == 0;
    char verb[16], rid[PDX_KV_REQ_ID_MAX];
    if (!fetch && !offer) {
        /* hb/done/reject of a served prefix? */
        char text[160];
        if (len >= sizeof(text)) {
            return false;
        }
        memcpy(text, m, len);
        text[len] = '\0';
        if (sscanf(text, "pdxkv:%15s %63s", verb, rid) != 2 ||
            strncmp(rid, RID_PREFIX, sizeof(RID_PREFIX) - 1) != 0) {
            return false;
        }
        pthread_mutex_lock(&s->lock);
        xserve_t **pp = find_serve(s, peer, rid);
        if (*pp != NULL) {
            if (strcmp(verb, "hb") == 0) {
                (*pp)->deadline_ns = pdx_now_ns() + SERVE_LEASE_NS;
            } else if (strcmp(verb, "done") == 0 ||
                       strcmp(verb, "reject") == 0) {
                xserve_t *v = *pp;
                *pp = v->next;
                serve_free(s, v);
            }
        }
        pthread_mutex_unlock(&s->lock);
        return true;
    }
    char *text = malloc(len + 1);
    if (text == NULL) {
        return true;
    }
    memcpy(text, m, len);
    text[len] = '\0';
    pthread_mutex_lock(&s->lock);
    if (fetch) {
        on_fetch(s, peer, text + sizeof(MSG_FETCH) - 1);
    } else {
        on_offer(s, peer, text + sizeof(MSG_OFFER) - 1);
    }
    pthread_mutex_unlock(&s->lock);
    free(text);
    return true;
}

int kv_store_progress(kv_store_t *s, bool *check_dead_p)
{
    *check_dead_p = false;
    if (s == NULL) {
        return 0;
    }
    int events = 0;
    uint64_t now = pdx_now_ns();
    pthread_mutex_lock(&s->lock);
    if (now - s->last_dead_check_ns >= 50000000ull) {
        s->last_dead_check_ns = now;
        *check_dead_p = true;
    }
    for (xserve_t **pp = &s->serves; *pp != NULL;) {
        xserve_t *v = *pp;
        if (now > v->deadline_ns ||
            pdx_peer_state(s->agent, v->peer) == PDX_ERR_REMOTE_DISCONNECT) {
            *pp = v->next;
            pdx_debug("kv: served prefix %s of %s freed (expired or peer "
                      "gone)", v->rid, v->peer);
            serve_free(s, v);
            events++;
        } else {
            pp = &v->next;
        }
    }
    for (xfetch_t **pp = &s->fetches; *pp != NULL;) {
        xfetch_t *x = *pp;
        bool done = (x->state == XF_FAILED || x->state == XF_MATCHED ||
                     x->state == XF_OFFERED) &&
                    now > x->deadline_ns;
        if (done) {
            fetch_reject(s, x);
            *pp = x->next;
            free(x->keys);
            free(x->addrs);
            free(x);
        } else {
            pp = &x->next;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return events;
}

void kv_store_note_peer_gone(kv_store_t *s)
{
    if (s != NULL) {
        pthread_mutex_lock(&s->lock);
        s->stats.peers_gone++;
        pthread_mutex_unlock(&s->lock);
    }
}

void kv_store_stats(kv_store_t *s, pdx_kv_store_stats_t *out)
{
    pthread_mutex_lock(&s->lock);
    *out = s->stats;
    out->pending_registrations = s->nregq;
    out->pending_unregistrations = s->ndelq;
    pthread_mutex_unlock(&s->lock);
}
