/* Store glue: an agent's discovery, liveness and block-owner registry
 * through a store module (pdx/store.h).
 *
 * The agent watches only the names it uses: every peer it has loaded (by
 * fetch, by hand or through the connector), every name it was asked to
 * fetch (the most recent WANT_MAX of those not loaded), and its own key,
 * each with a key watch (PDX_STORE_WATCH_KEY). So what it receives grows
 * with the peers it uses, not with the namespace. The module's callback
 * only updates the local cache (newest blob of each watched name) and
 * queues the event. One glue thread per agent does the agent work the
 * events ask for (reload a loaded peer whose instance or generation
 * changed, mark one whose key vanished dead), drops watches of names no
 * longer wanted, and publishes the agent's blob when its generation
 * differs from the one published (woken where the generation changes:
 * idle, it sleeps). Neither thread holds the agent lock while calling the
 * store, and the store's thread never takes the agent lock. */
#include <errno.h>
#include <stddef.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pdx/store.h>

#include "api_int.h"
#include "discovery_int.h"
#include "loader_int.h"
#include "peer_death_int.h"
#include "peer_int.h"
#include "xfer_int.h"

#define WANT_MAX 256 /* names asked for and not loaded, still watched */

/* A watched name: its watch and the newest blob the store gave for it. */
typedef struct cached {
    struct cached *next;
    char name[PDX_NAME_MAX];
    bool loaded;       /* a loaded peer (or this agent itself) */
    bool self;
    uint64_t watch_id; /* 0: not watched (yet) */
    bool subscribing;  /* a thread is opening its watch */
    bool drop;         /* to be unwatched and forgotten (glue thread) */
    uint64_t used_ns;  /* last asked for or unloaded (eviction order) */
    /* Its blob, when the store has one (blob NULL otherwise). */
    uint64_t instance;
    uint32_t generation;
    int64_t revision;
    uint64_t put_ns; /* pdx_now_ns() of the PUT that brought it */
    size_t len;
    unsigned char *blob;
} cached_t;

typedef struct gev {
    struct gev *next;
    pdx_store_event_type_t type;
    char name[PDX_NAME_MAX];
    uint64_t instance; /* PUT: from the blob; DELETE: of the entry removed */
    uint32_t generation;
    uint64_t recv_ns; /* pdx_now_ns() when the watch brought it */
    size_t len;
    unsigned char blob[];
} gev_t;

struct pdx_store_agent {
    pdx_agent_h agent;
    const pdx_store_ops_t *ops;
    void *dl;
    void *st;
    pdx_store_host_t host;
    char module[32];
    char endpoints[512];
    char ns[128];

    pthread_mutex_t lock; /* everything below */
    pthread_cond_t cv;    /* events queued, cache changed, stop */
    bool stop;
    bool publish;
    bool published_any;
    bool gen_changed; /* the agent's generation moved */
    uint32_t published_gen;
    uint64_t publish_retry_ns;
    gev_t *evq, *evq_tail;
    cached_t *cache;
    uint32_t ncache, nblobs, nwant_idle;
    uint64_t reloads, deaths;
    bool warned_name_clash;
    /* Owner registry calls through this agent (pdx_store_owners_*). */
    uint64_t own_add_calls, own_add_blocks, own_add_failures;
    uint64_t own_del_calls, own_del_blocks, own_del_failures;
    uint64_t own_get_calls, own_get_blocks, own_get_failures;

    pthread_t thread;
    bool thread_running;
};

static cached_t *cache_find(struct pdx_store_agent *g, const char *name)
{
    for (cached_t *c = g->cache; c != NULL; c = c->next) {
        if (strcmp(c->name, name) == 0) {
            return c;
        }
    }
    return NULL;
}

static void blob_forget(struct pdx_store_agent *g, cached_t *c)
{
    if (c->blob != NULL) {
        free(c->blob);
        c->blob = NULL;
        c->len = 0;
        g->nblobs--;
    }
}

/* Entries not loaded, watched because they were asked for. */
static void count_idle(struct pdx_store_agent *g)
{
    uint32_t n = 0;
    for (cached_t *c = g->cache; c != NULL; c = c->next) {
        n += !c->loaded && !c->self && !c->drop;
    }
    g->nwant_idle = n;
}

/* The entry of `name`, made if missing (g->lock held); NULL without
 * memory. */
static cached_t *want_locked(struct pdx_store_agent *g, const char *name)
{
    cached_t *c = cache_find(g, name);
    if (c == NULL) {
        c = calloc(1, sizeof(*c));
        if (c == NULL) {
            return NULL;
        }
        snprintf(c->name, sizeof(c->name), "%s", name);
        c->next = g->cache;
        g->cache = c;
        g->ncache++;
    }
    c->drop = false;
    c->used_ns = pdx_now_ns();
    return c;
}

/* Make sure `name` is watched: from `from_rev` (a revision after the blob
 * the caller holds), or with its current value first (0). Non-blocking
 * (the module's watch op is); never from a store callback. g->lock not
 * held. */
static void watch_name(struct pdx_store_agent *g, const char *name,
                       int64_t from_rev)
{
    pthread_mutex_lock(&g->lock);
    cached_t *c = want_locked(g, name);
    bool go = c != NULL && c->watch_id == 0 && !c->subscribing;
    if (go) {
        c->subscribing = true;
    }
    pthread_mutex_unlock(&g->lock);
    if (!go) {
        return;
    }
    char key[PDX_NAME_MAX + 16];
    snprintf(key, sizeof(key), "agents/%s", name);
    uint64_t id = 0;
    pdx_status_t st = g->ops->watch(g->st, key, from_rev > 0 ? from_rev : 0,
                                    PDX_STORE_WATCH_KEY |
                                        (from_rev > 0
                                             ? 0 : PDX_STORE_WATCH_INITIAL),
                                    &id);
    pthread_mutex_lock(&g->lock);
    c = cache_find(g, name); /* only the glue thread frees entries */
    if (c != NULL) {
        c->subscribing = false;
        c->watch_id = st == PDX_OK ? id : 0;
    }
    pthread_mutex_unlock(&g->lock);
    if (st != PDX_OK) {
        pdx_warn("agent %s: store: cannot watch %s: %s", g->agent->name,
                 key, pdx_status_string(st));
    }
}

/* The agent name of key `agents/<name>`, or NULL. */
static const char *agent_of_key(const char *key)
{
    static const char pfx[] = "agents/";
    if (strncmp(key, pfx, sizeof(pfx) - 1) != 0) {
        return NULL;
    }
    const char *name = key + sizeof(pfx) - 1;
    size_t n = strlen(name);
    if (n == 0 || n >= PDX_NAME_MAX || strchr(name, '/') != NULL) {
        return NULL;
    }
    return name;
}

static void queue_ev(struct pdx_store_agent *g, pdx_store_event_type_t type,
                     const char *name, uint64_t instance, uint32_t generation,
                     const void *blob, size_t len)
{
    gev_t *e = malloc(sizeof(*e) + len);
    if (e == NULL) {
        pdx_error("agent %s: store event of %s dropped: out of memory",
                  g->agent->name, name);
        return;
    }
    e->next = NULL;
    e->type = type;
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->instance = instance;
    e->generation = generation;
    e->recv_ns = pdx_now_ns();
    e->len = len;
    if (len > 0) {
        memcpy(e->blob, blob, len);
    }
    if (g->evq_tail != NULL) {
        g->evq_tail->next = e;
    } else {
        g->evq = e;
    }
    g->evq_tail = e;
}

/* Put a valid blob of `name` at `revision` into its entry (g->lock held);
 * an older one than the entry's never replaces it. */
static void cache_blob_locked(struct pdx_store_agent *g, cached_t *c,
                              const pdx_blob_t *b, const void *v, size_t len,
                              int64_t revision)
{
    if (c->blob != NULL && revision < c->revision) {
        return;
    }
    unsigned char *copy = malloc(len ? len : 1);
    if (copy == NULL) {
        pdx_warn("agent %s: out of memory: agents/%s not cached",
                 g->agent->name, c->name);
        return;
    }
    memcpy(copy, v, len);
    if (c->blob == NULL) {
        g->nblobs++;
    }
    free(c->blob);
    c->blob = copy;
    c->len = len;
    c->instance = b->instance;
    c->generation = b->generation;
    c->revision = revision;
    c->put_ns = pdx_now_ns();
}

/* Store thread: never takes the agent lock. */
static void on_store_event(void *ctx, uint64_t watch_id,
                           const pdx_store_event_t *ev)
{
    struct pdx_store_agent *g = ctx;
    const char *name = agent_of_key(ev->key);
    if (name == NULL) {
        return;
    }
    pthread_mutex_lock(&g->lock);
    cached_t *c = cache_find(g, name);
    if (c == NULL || c->drop || (c->watch_id != 0 && c->watch_id != watch_id)) {
        pthread_mutex_unlock(&g->lock); /* not (or no longer) wanted */
        return;
    }
    if (ev->type == PDX_STORE_EV_PUT) {
        pdx_blob_t *b = NULL;
        char why[192];
        const void *in = NULL;
        size_t in_len = 0;
        /* Signed with the agent's cluster key (sign.h), else ignored: a
         * forged put never replaces the cached blob of a peer. */
        if (ev->value == NULL ||
            pdxi_blob_open(&g->agent->ckey, ev->value, ev->value_len, &in,
                           &in_len, why, sizeof(why)) != PDX_OK ||
            pdx_blob_parse(in, in_len, &b, why, sizeof(why)) != PDX_OK ||
            strcmp(b->name, name) != 0) {
            pdx_warn("agent %s: store key agents/%s holds no valid blob of "
                     "that agent (%s): ignored", g->agent->name, name,
                     b ? "name differs" : ev->value ? why : "no value");
            pdx_blob_free_parsed(b);
            pthread_mutex_unlock(&g->lock);
            return;
        }
        cache_blob_locked(g, c, b, ev->value, ev->value_len, ev->revision);
        queue_ev(g, ev->type, name, b->instance, b->generation, ev->value,
                 ev->value_len);
        pdx_blob_free_parsed(b);
    } else {
        uint64_t inst = c->instance;
        if (c->blob == NULL || ev->revision >= c->revision) {
            blob_forget(g, c);
            c->revision = ev->revision;
        }
        queue_ev(g, ev->type, name, inst, 0, NULL, 0);
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
}

static void on_store_state(void *ctx, const pdx_store_status_t *s)
{
    struct pdx_store_agent *g = ctx;
    pthread_mutex_lock(&g->lock);
    pthread_cond_broadcast(&g->cv); /* fetch waiters re-evaluate */
    pthread_mutex_unlock(&g->lock);
    pdx_debug("agent %s: store %s (lease %llx)", g->agent->name,
              s->reachable ? "reachable" : "unreachable",
              (unsigned long long)s->lease);
}

/* ---- hooks of the core (agent lock held: agent -> glue order), called
 * through agent->disc (pdx_disc_*_locked) ---- */

static void disc_peer_loaded_locked(pdx_agent_h a, const char *name)
{
    struct pdx_store_agent *g = a->store;
    if (g == NULL) {
        return;
    }
    pthread_mutex_lock(&g->lock);
    cached_t *c = want_locked(g, name);
    if (c != NULL) {
        c->loaded = true;
    }
    bool need = c != NULL && c->watch_id == 0 && !c->subscribing;
    pthread_mutex_unlock(&g->lock);
    if (need) {
        /* Loaded by hand or from a cached blob: its current value first
         * (the same description again changes nothing). */
        watch_name(g, name, 0);
    }
}

static void disc_peer_unloaded_locked(pdx_agent_h a, const char *name)
{
    struct pdx_store_agent *g = a->store;
    if (g == NULL) {
        return;
    }
    pthread_mutex_lock(&g->lock);
    cached_t *c = cache_find(g, name);
    if (c != NULL && !c->self) {
        c->loaded = false;
        c->used_ns = pdx_now_ns();
        count_idle(g);
        if (g->nwant_idle > WANT_MAX) {
            pthread_cond_broadcast(&g->cv); /* the glue thread evicts */
        }
    }
    pthread_mutex_unlock(&g->lock);
}

static void disc_changed_locked(pdx_agent_h a)
{
    struct pdx_store_agent *g = a->store;
    if (g == NULL) {
        return;
    }
    pthread_mutex_lock(&g->lock);
    g->gen_changed = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
}

static const pdx_disc_hooks_t disc_hooks = {
    .peer_loaded = disc_peer_loaded_locked,
    .peer_unloaded = disc_peer_unloaded_locked,
    .changed = disc_changed_locked,
};

/* Glue thread: one event's agent work. */
static void handle_event(struct pdx_store_agent *g, gev_t *e)
{
    pdx_agent_h a = g->agent;
    if (strcmp(e->name, a->name) == 0) {
        if (e->type == PDX_STORE_EV_PUT && e->instance != a->instance) {
            pthread_mutex_lock(&g->lock);
            bool warned = g->warned_name_clash;
            g->warned_name_clash = true;
            pthread_mutex_unlock(&g->lock);
            if (!warned) {
                pdx_warn("agent %s: the store's agents/%s is instance %016llx, "
                         "not this agent (%016llx): an earlier run, or two "
                         "agents with one name in namespace %s", a->name,
                         a->name, (unsigned long long)e->instance,
                         (unsigned long long)a->instance, g->ns);
            }
        } else if (e->type == PDX_STORE_EV_DELETE) {
            /* Our key went (deleted by hand, or our lease expired while
             * the module could not renew it): publish it again. */
            pthread_mutex_lock(&g->lock);
            g->published_any = false;
            pthread_mutex_unlock(&g->lock);
        }
        return;
    }
    pdx_agent_lock(a);
    pdx_peer_t *p = pdx_peer_find(a, e->name);
    bool loaded = p != NULL;
    /* A dead peer whose key comes back with its instance and the same or
     * a newer generation is revived (its lease expired while it or the
     * store was paused): dead is a state a peer leaves again. Only a put
     * the watch brought after the death counts (one from before, late in
     * the queue, says nothing of the peer now). */
    bool changed = p != NULL && (p->instance != e->instance ||
                                 p->generation != e->generation ||
                                 (p->dead != PDX_OK &&
                                  e->type == PDX_STORE_EV_PUT &&
                                  e->recv_ns > p->dead_ns));
    uint32_t old_gen = p ? p->generation : 0;
    uint64_t old_inst = p ? p->instance : 0;
    struct pollfd pfd = {.fd = p != NULL ? p->pidfd : -1, .events = POLLIN};
    if (e->type == PDX_STORE_EV_DELETE && p != NULL && p->dead == PDX_OK &&
        p->pidfd >= 0 && p->pid != (int32_t)getpid() &&
        poll(&pfd, 1, 0) == 0) {
        /* The store alone does not fail a same-host peer whose process
         * lives (a frozen store, a paused peer): its transfers go on, and
         * its pidfd or its backends say when it really goes. (Our own
         * pid's pidfd says nothing of an agent of this process.) */
        pdx_info("agent %s: store: peer %s's key went (lease expired or "
                 "deleted) but its process %d lives: keeping it", a->name,
                 e->name, (int)p->pid);
    } else if (e->type == PDX_STORE_EV_DELETE && p != NULL &&
               p->dead == PDX_OK) {
        pdx_peer_gone_locked(a, p, PDX_ERR_REMOTE_DISCONNECT,
                                  "store: lease expired or key deleted",
                                  false);
        pthread_mutex_lock(&g->lock);
        g->deaths++;
        pthread_mutex_unlock(&g->lock);
    }
    pthread_mutex_unlock(&a->lock);
    if (e->type != PDX_STORE_EV_PUT || !loaded || !changed) {
        return;
    }
    pdx_info("agent %s: store: peer %s has a new description (generation %u "
             "-> %u%s): reloading", a->name, e->name, old_gen, e->generation,
             old_inst != e->instance  ? ", new instance"
             : old_gen == e->generation ? ", back after it was failed"
                                        : "");
    pdx_status_t st = pdxi_peer_load(a, e->blob, e->len, NULL);
    if (st == PDX_OK) {
        pthread_mutex_lock(&g->lock);
        g->reloads++;
        pthread_mutex_unlock(&g->lock);
    } else if (old_inst != e->instance) {
        /* Refused (another layout or seed...): the old incarnation is gone
         * anyway, since another one publishes under its name. */
        pdx_agent_lock(a);
        p = pdx_peer_find(a, e->name);
        if (p != NULL && p->instance == old_inst) {
            pdx_peer_gone_locked(a, p, PDX_ERR_REMOTE_DISCONNECT,
                                      "store: replaced by an instance this "
                                      "agent refuses", false);
        }
        pthread_mutex_unlock(&a->lock);
    }
}

static void publish_step(struct pdx_store_agent *g, uint64_t now)
{
    pdx_agent_h a = g->agent;
    pthread_mutex_lock(&g->lock);
    bool on = g->publish && now >= g->publish_retry_ns;
    bool any = g->published_any;
    uint32_t done = g->published_gen;
    g->gen_changed = false;
    pthread_mutex_unlock(&g->lock);
    if (!on) {
        return;
    }
    pdx_agent_lock(a);
    uint32_t gen = a->generation;
    pthread_mutex_unlock(&a->lock);
    if (any && gen == done) {
        return;
    }
    void *blob = NULL;
    size_t len = 0;
    pdx_status_t st = pdxi_agent_describe(a, &blob, &len);
    char key[PDX_NAME_MAX + 16];
    snprintf(key, sizeof(key), "agents/%s", a->name);
    if (st == PDX_OK) {
        st = g->ops->put(g->st, key, blob, len, PDX_STORE_PUT_LEASED);
    }
    pthread_mutex_lock(&g->lock);
    cached_t *self = st == PDX_OK ? cache_find(g, a->name) : NULL;
    if (self != NULL && self->self) {
        /* What it published, as the store holds it (the watch of its
         * own key replaces it with the store's revision). */
        pdx_blob_t b = {.instance = a->instance, .generation = gen};
        cache_blob_locked(g, self, &b, blob, len,
                          self->blob ? self->revision : 0);
    }
    free(blob);
    if (st == PDX_OK || st == PDX_INPROGRESS) {
        /* INPROGRESS: the module holds it and publishes when it can. */
        g->published_any = true;
        g->published_gen = gen;
        g->publish_retry_ns = 0;
        pdx_debug("agent %s: generation %u %s as %s", a->name, gen,
                  st == PDX_OK ? "published" : "handed to the store", key);
    } else {
        /* 0.5-1.5 s: agents that failed together retry apart. */
        uint64_t wait = 500000000ull + (now ^ a->instance) % 1000000000ull;
        pdx_warn("agent %s: publishing %s failed: %s; retrying in %.1f s",
                 a->name, key, pdx_status_string(st), (double)wait / 1e9);
        g->publish_retry_ns = now + wait;
    }
    pthread_mutex_unlock(&g->lock);
}

/* Unwatch and forget names asked for long ago and never loaded, beyond
 * WANT_MAX (glue thread: unwatch waits for a delivery in progress). */
static void evict_step(struct pdx_store_agent *g)
{
    for (int guard = 0; guard < 4 * WANT_MAX; guard++) {
        pthread_mutex_lock(&g->lock);
        count_idle(g);
        cached_t *old = NULL;
        if (g->nwant_idle > WANT_MAX) {
            for (cached_t *c = g->cache; c != NULL; c = c->next) {
                if (!c->loaded && !c->self && !c->drop && !c->subscribing &&
                    (old == NULL || c->used_ns < old->used_ns)) {
                    old = c;
                }
            }
        }
        if (old == NULL) {
            pthread_mutex_unlock(&g->lock);
            return;
        }
        old->drop = true;
        uint64_t id = old->watch_id;
        old->watch_id = 0;
        pthread_mutex_unlock(&g->lock);
        if (id != 0) {
            g->ops->unwatch(g->st, id);
        }
        pthread_mutex_lock(&g->lock);
        for (cached_t **pp = &g->cache; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == old) {
                if (!old->drop || old->subscribing) {
                    break; /* wanted again meanwhile */
                }
                *pp = old->next;
                blob_forget(g, old);
                free(old);
                g->ncache--;
                break;
            }
        }
        pthread_mutex_unlock(&g->lock);
    }
}

static void *glue_main(void *arg)
{
    struct pdx_store_agent *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        gev_t *list = g->evq;
        g->evq = g->evq_tail = NULL;
        pthread_mutex_unlock(&g->lock);
        while (list != NULL) {
            gev_t *e = list;
            list = e->next;
            handle_event(g, e);
            free(e);
        }
        publish_step(g, pdx_now_ns());
        evict_step(g);
        pthread_mutex_lock(&g->lock);
        if (g->evq != NULL || g->stop || g->gen_changed) {
            continue;
        }
        /* Sleeps until an event, a generation change or stop; a timer
         * only while a failed publication waits for its retry. */
        if (g->publish && g->publish_retry_ns != 0) {
            uint64_t now = pdx_now_ns();
            uint64_t wait = g->publish_retry_ns > now
                                ? g->publish_retry_ns - now : 0;
            struct timespec dl;
            clock_gettime(CLOCK_REALTIME, &dl);
            dl.tv_sec += (time_t)(wait / 1000000000ull);
            dl.tv_nsec += (long)(wait % 1000000000ull);
            if (dl.tv_nsec >= 1000000000L) {
                dl.tv_sec++;
                dl.tv_nsec -= 1000000000L;
            }
            if (wait > 0) {
                pthread_cond_timedwait(&g->cv, &g->lock, &dl);
            }
        } else {
            pthread_cond_wait(&g->cv, &g->lock);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

static void glue_free(struct pdx_store_agent *g)
{
    while (g->evq != NULL) {
        gev_t *e = g->evq;
        g->evq = e->next;
        free(e);
    }
    while (g->cache != NULL) {
        cached_t *c = g->cache;
        g->cache = c->next;
        free(c->blob);
        free(c);
    }
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

pdx_status_t pdx_store_agent_init(pdx_agent_h a,
                                  const pdx_agent_params_t *params)
{
    const char *module = params->store ? params->store : "etcd";
    const char *ns = params->store_namespace ? params->store_namespace
                                             : "pdx";
    if (params->store_endpoints == NULL || params->store_endpoints[0] == 0 ||
        strlen(params->store_endpoints) >= 512) {
        pdx_error("agent %s: PDX_AGENT_PARAM_STORE needs store_endpoints "
                  "(e.g. \"http://127.0.0.1:2379\")", a->name);
        return PDX_ERR_INVALID;
    }
    const pdx_store_ops_t *ops;
    void *dl;
    char why[512];
    pdx_status_t st = pdx_loader_open_store(module, &ops, &dl, why,
                                            sizeof(why));
    if (st != PDX_OK) {
        pdx_error("agent %s: store %s: %s", a->name, module, why);
        return st;
    }
    if (ops->query(why, sizeof(why)) != PDX_OK) {
        pdx_error("agent %s: store %s unavailable: %s", a->name, module, why);
        pdx_loader_close(dl);
        return PDX_ERR_UNAVAILABLE;
    }
    struct pdx_store_agent *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        pdx_loader_close(dl);
        return PDX_ERR_NOMEM;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->agent = a;
    g->ops = ops;
    g->dl = dl;
    snprintf(g->module, sizeof(g->module), "%s", module);
    snprintf(g->endpoints, sizeof(g->endpoints), "%s",
             params->store_endpoints);
    snprintf(g->ns, sizeof(g->ns), "%s", ns);
    g->host = (pdx_store_host_t){.ctx = g, .agent_name = a->name,
                                 .watch_event = on_store_event,
                                 .state_change = on_store_state};
    pdx_store_params_t sp = {
        .endpoints = g->endpoints, .ns = g->ns,
        .lease_ttl_ms = params->store_lease_ttl_ms
                            ? params->store_lease_ttl_ms : 10000,
        .timeout_ms = params->store_timeout_ms ? params->store_timeout_ms
                                               : 2000,
        .retry_min_ms = 100, .retry_max_ms = 5000,
        .max_txn_ops = params->store_max_txn_ops};
    if (params->field_mask & PDX_AGENT_PARAM_STORE_OPTS) {
        sp.opts = params->store_opts; /* TLS, auth (etcd) */
        sp.nopts = params->store_nopts;
    }
    st = ops->create(&g->host, &sp, &g->st);
    if (st != PDX_OK) {
        pdx_error("agent %s: store %s: create failed: %s", a->name, module,
                  pdx_status_string(st));
        goto err;
    }
    int rc = pthread_create(&g->thread, NULL, glue_main, g);
    if (rc != 0) {
        pdx_error("agent %s: store thread: %s", a->name, strerror(rc));
        st = PDX_ERR_IO;
        goto err_store;
    }
    g->thread_running = true;
    pdx_agent_lock(a); /* pdx_stats_json reads it under it */
    a->store = g;
    a->disc = &disc_hooks;
    pthread_mutex_unlock(&a->lock);
    pdx_info("agent %s: store %s at %s, namespace %s (lease TTL %u ms)",
             a->name, module, g->endpoints, g->ns, sp.lease_ttl_ms);
    return PDX_OK;
err_store:
    ops->destroy(g->st);
err:
    pdx_loader_close(g->dl);
    glue_free(g);
    return st;
}

void pdx_store_agent_fini(pdx_agent_h a)
{
    pdx_agent_lock(a);
    struct pdx_store_agent *g = a->store;
    a->store = NULL; /* pdx_stats_json no longer looks at it */
    a->disc = NULL;
    pthread_mutex_unlock(&a->lock);
    if (g == NULL) {
        return;
    }
    pthread_mutex_lock(&g->lock);
    g->stop = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
    if (g->thread_running) {
        pthread_join(g->thread, NULL);
    }
    /* Stops the module's thread (no callback after this) and revokes the
     * lease: peers see this agent gone at once. */
    g->ops->destroy(g->st);
    pdx_loader_close(g->dl);
    glue_free(g);
}

bool pdx_store_agent_snapshot(pdx_agent_h a, pdx_store_snapshot_t *out)
{
    struct pdx_store_agent *g = a->store;
    if (g == NULL) {
        return false;
    }
    memset(out, 0, sizeof(*out));
    /* Lock order agent -> glue -> module, as the glue thread takes them. */
    g->ops->status(g->st, &out->status);
    snprintf(out->module, sizeof(out->module), "%s", g->module);
    snprintf(out->endpoints, sizeof(out->endpoints), "%s", g->endpoints);
    snprintf(out->ns, sizeof(out->ns), "%s", g->ns);
    pthread_mutex_lock(&g->lock);
    out->publishing = g->publish;
    out->published = g->publish && g->published_any;
    out->published_generation = g->published_gen;
    out->agents_known = g->nblobs;
    out->reloads = g->reloads;
    out->deaths = g->deaths;
    out->owners_add_calls = g->own_add_calls;
    out->owners_add_blocks = g->own_add_blocks;
    out->owners_add_failures = g->own_add_failures;
    out->owners_del_calls = g->own_del_calls;
    out->owners_del_blocks = g->own_del_blocks;
    out->owners_del_failures = g->own_del_failures;
    out->owners_get_calls = g->own_get_calls;
    out->owners_get_blocks = g->own_get_blocks;
    out->owners_get_failures = g->own_get_failures;
    pthread_mutex_unlock(&g->lock);
    return true;
}

/* Count one owner call of n blocks. */
static void count_owner_call(struct pdx_store_agent *g, uint64_t *calls,
                             uint64_t *blocks, uint64_t *failures, size_t n,
                             pdx_status_t st)
{
    pthread_mutex_lock(&g->lock);
    (*calls)++;
    if (st == PDX_OK) {
        *blocks += n;
    } else {
        (*failures)++;
    }
    pthread_mutex_unlock(&g->lock);
}

/* The module and its instance for the block-owner registry (owners.c). */
bool pdx_store_agent_module(pdx_agent_h agent, const char *fn,
                            const pdx_store_ops_t **ops_p, void **st_p)
{
    if (!pdx_store_agent_need(agent, fn)) {
        return false;
    }
    *ops_p = agent->store->ops;
    *st_p = agent->store->st;
    return true;
}

void pdx_store_agent_count(pdx_agent_h agent, pdx_owners_call_t which,
                           size_t n, pdx_status_t st)
{
    struct pdx_store_agent *g = agent->store;
    switch (which) {
    case PDX_OWNERS_ADD:
        count_owner_call(g, &g->own_add_calls, &g->own_add_blocks,
                         &g->own_add_failures, n, st);
        break;
    case PDX_OWNERS_DEL:
        count_owner_call(g, &g->own_del_calls, &g->own_del_blocks,
                         &g->own_del_failures, n, st);
        break;
    case PDX_OWNERS_GET:
        count_owner_call(g, &g->own_get_calls, &g->own_get_blocks,
                         &g->own_get_failures, n, st);
        break;
    }
}

/* ---- what the exported functions of pdx/store.h run (api.c gates them) ----
 */

bool pdx_store_agent_need(pdx_agent_h agent, const char *fn)
{
    if (agent->store == NULL) {
        pdx_log(PDX_LOG_ERROR, "%s: agent %s has no store (create it with "
                "PDX_AGENT_PARAM_STORE)", fn, agent->name);
        return false;
    }
    return true;
}

pdx_status_t pdxi_agent_publish(pdx_agent_h agent)
{
    if (!pdx_store_agent_need(agent, "pdx_agent_publish")) {
        return PDX_ERR_UNSUPPORTED;
    }
    struct pdx_store_agent *g = agent->store;
    pthread_mutex_lock(&g->lock);
    g->publish = true;
    cached_t *c = want_locked(g, agent->name);
    if (c != NULL) {
        c->self = true;
    }
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->lock);
    /* Its own key: a deletion (lease lost) publishes it again, another
     * instance under its name is reported. */
    watch_name(g, agent->name, 0);
    return PDX_OK;
}

static bool valid_peer_name(const char *n)
{
    size_t len = n ? strlen(n) : 0;
    if (len == 0 || len >= PDX_NAME_MAX) {
        return false;
    }
    for (size_t i = 0; i < len; i++) {
        char c = n[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            return false;
        }
    }
    return true;
}

static pdx_status_t fetch(pdx_agent_h a, const char *name,
                          uint32_t timeout_ms)
{
    struct pdx_store_agent *g = a->store;
    pdx_agent_lock(a);
    pdx_peer_t *p = pdx_peer_find(a, name);
    pdx_status_t state = p ? p->dead : PDX_ERR_NOT_FOUND;
    uint64_t inst = p ? p->instance : 0;
    uint32_t gen = p ? p->generation : 0;
    uint64_t dead_ns = p ? p->dead_ns : 0;
    pthread_mutex_unlock(&a->lock);
    if (state == PDX_OK) {
        return PDX_OK;
    }
    uint64_t deadline = pdx_deadline_ns(timeout_ms);
    bool asked = false;
    pdx_status_t store_st = PDX_OK;
    pthread_mutex_lock(&g->lock);
    cached_t *c = want_locked(g, name);
    pthread_mutex_unlock(&g->lock);
    if (c == NULL) {
        return PDX_ERR_NOMEM;
    }
    for (uint64_t guard = 0; guard < 1000000; guard++) {
        pthread_mutex_lock(&g->lock);
        c = cache_find(g, name);
        if (c != NULL) {
            c->used_ns = pdx_now_ns();
            c->drop = false;
        }
        bool watched = c != NULL && (c->watch_id != 0 || c->subscribing);
        unsigned char *blob = NULL;
        size_t len = 0;
        /* A dead peer's own description again counts when it was put
         * after the death (the peer re-published: it lives). */
        if (c != NULL && c->blob != NULL &&
            (p == NULL || c->instance != inst || c->generation != gen ||
             c->put_ns > dead_ns)) {
            blob = malloc(c->len);
            if (blob != NULL) {
                memcpy(blob, c->blob, c->len);
                len = c->len;
            }
        }
        pthread_mutex_unlock(&g->lock);
        if (blob == NULL && !asked) {
            /* Not cached: one point read, then a watch from the revision
             * after it (nothing missed between the two). */
            asked = true;
            char key[PDX_NAME_MAX + 16];
            snprintf(key, sizeof(key), "agents/%s", name);
            void *v = NULL;
            size_t vlen = 0;
            int64_t rev = 0;
            store_st = g->ops->get(g->st, key, &v, &vlen, &rev);
            if (store_st == PDX_OK) {
                pdx_blob_t *b = NULL;
                char why[192];
                const void *in = NULL;
                size_t in_len = 0;
                if (pdxi_blob_open(&a->ckey, v, vlen, &in, &in_len, why,
                                   sizeof(why)) == PDX_OK &&
                    pdx_blob_parse(in, in_len, &b, why, sizeof(why)) ==
                        PDX_OK &&
                    strcmp(b->name, name) == 0) {
                    pthread_mutex_lock(&g->lock);
                    c = cache_find(g, name);
                    if (c != NULL && !c->drop) {
                        cache_blob_locked(g, c, b, v, vlen, rev);
                    }
                    pthread_mutex_unlock(&g->lock);
                    if (p == NULL || b->instance != inst ||
                        b->generation != gen) {
                        blob = v;
                        len = vlen;
                        v = NULL;
                    }
                } else {
                    pdx_warn("agent %s: store key agents/%s holds no valid "
                             "blob of that agent (%s): ignored", a->name,
                             name, b ? "name differs" : why);
                }
                pdx_blob_free_parsed(b);
                free(v);
            }
            if (!watched) {
                watch_name(g, name, store_st == PDX_OK ? rev + 1 : 0);
            }
        } else if (!watched) {
            watch_name(g, name, 0);
        }
        if (blob != NULL) {
            pdx_status_t st = pdxi_peer_load(a, blob, len, NULL);
            free(blob);
            return st;
        }
        uint64_t now = pdx_now_ns();
        if (now >= deadline) {
            break;
        }
        /* Wait for the watch to bring it (or a newer one). */
        pthread_mutex_lock(&g->lock);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        uint64_t left = deadline - now;
        uint64_t step = left < 50000000ull ? left : 50000000ull;
        dl.tv_nsec += (long)step;
        while (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->cv, &g->lock, &dl);
        pthread_mutex_unlock(&g->lock);
    }
    if (p != NULL) {
        pdx_error("agent %s: peer %s is dead and the store has no newer "
                  "description of it after %u ms", a->name, name, timeout_ms);
        return PDX_ERR_REMOTE_DISCONNECT;
    }
    if (store_st == PDX_ERR_UNAVAILABLE) {
        char line[512];
        pdxi_store_describe(a, line, sizeof(line));
        pdx_error("agent %s: peer %s: not cached and the store cannot be "
                  "reached (%s)", a->name, name, line);
        return PDX_ERR_UNAVAILABLE;
    }
    pdx_error("agent %s: peer %s not published in %s/agents/ within %u ms",
              a->name, name, g->ns, timeout_ms);
    return PDX_ERR_NOT_FOUND;
}

pdx_status_t pdxi_peer_fetch(pdx_agent_h agent, const char *name,
                             uint32_t timeout_ms)
{
    if (!valid_peer_name(name)) {
        pdx_log(PDX_LOG_ERROR, "pdx_peer_fetch: invalid peer name '%s'",
                name ? name : "(null)");
        return PDX_ERR_INVALID;
    }
    if (!pdx_store_agent_need(agent, "pdx_peer_fetch")) {
        return PDX_ERR_UNSUPPORTED;
    }
    return fetch(agent, name, timeout_ms);
}

pdx_status_t pdxi_store_status(pdx_agent_h agent, pdx_store_status_t *status_p)
{
    if (!pdx_store_agent_need(agent, "pdx_store_status")) {
        return PDX_ERR_UNSUPPORTED;
    }
    agent->store->ops->status(agent->store->st, status_p);
    return PDX_OK;
}

pdx_status_t pdxi_store_counters(pdx_agent_h agent, pdx_store_counters_t *c_p)
{
    if (!pdx_store_agent_need(agent, "pdx_store_counters")) {
        return PDX_ERR_UNSUPPORTED;
    }
    const pdx_store_ops_t *ops = agent->store->ops;
    if (ops->size <= offsetof(pdx_store_ops_t, counters) ||
        ops->counters == NULL) {
        return PDX_ERR_UNSUPPORTED;
    }
    ops->counters(agent->store->st, c_p);
    return PDX_OK;
}

pdx_status_t pdxi_store_describe(pdx_agent_h agent, char *buf, size_t len)
{
    if (!pdx_store_agent_need(agent, "pdx_store_describe")) {
        snprintf(buf, len, "no store");
        return PDX_ERR_UNSUPPORTED;
    }
    struct pdx_store_agent *g = agent->store;
    pdx_store_status_t s;
    g->ops->status(g->st, &s);
    pthread_mutex_lock(&g->lock);
    uint32_t known = g->nblobs;
    uint32_t gen = g->published_gen;
    bool pub = g->publish && g->published_any;
    pthread_mutex_unlock(&g->lock);
    char pubs[64] = "not published";
    if (pub) {
        snprintf(pubs, sizeof(pubs), "%s generation %u",
                 s.unpublished ? "publishing" : "published", gen);
    }
    if (s.reachable) {
        snprintf(buf, len, "%s %s ns %s: reachable, lease %llx (TTL %u s), "
                 "%s, %u agents known, revision %lld", g->module, s.endpoint,
                 g->ns, (unsigned long long)s.lease, s.lease_ttl_s, pubs,
                 known, (long long)s.revision);
    } else {
        char when[32] = "start";
        if (s.unreachable_since_ns != 0) {
            time_t t = (time_t)(s.unreachable_since_ns / 1000000000ull);
            struct tm tm;
            gmtime_r(&t, &tm);
            strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        }
        snprintf(buf, len, "%s %s ns %s: unreachable since %s (%.1f s): %s; "
                 "%s, %u agents cached", g->module, s.endpoint, g->ns, when,
                 (double)s.unreachable_ms / 1000.0,
                 s.last_error[0] ? s.last_error : "no answer yet", pubs,
                 known);
    }
    return PDX_OK;
}

