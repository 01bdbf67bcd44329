/* The agent object: struct pdx_agent, its lock and its event fds. Other
 * objects' structs live in their own private headers; this one only names
 * them. Everything here is protected by agent->lock unless said otherwise.
 * The life cycle (create, destroy) is agent.c, the top room of the core. */
#ifndef PDX_AGENT_INT_H
#define PDX_AGENT_INT_H

#include <pthread.h>
#include <stdbool.h>

#include <pdx/agent.h>
#include <pdx/backend.h>

#include "base_int.h"
#include "blob_int.h"
#include "call_int.h"
#include "sign_int.h"

/* The blob's limits are the agent's: what one side writes the other reads. */
#define PDX_MAX_BACKENDS PDX_BLOB_MAX_BACKENDS
/* A reason kept for a report (a path's fallback, a peer's). */
#define PDX_WHY_MAX 160
/* A peer's pidfd in nap_epoll_fd: epoll data PDX_PIDFD_TAG | fd. */
#define PDX_PIDFD_TAG (1ull << 32)
#define PDX_INV_KEY_MAX PDX_BLOB_INV_KEY_MAX
#define PDX_INV_VAL_MAX PDX_BLOB_INV_VAL_MAX
#define PDX_MAX_INVARIANTS PDX_BLOB_MAX_INVARIANTS

struct pdx_peer;          /* peer_int.h */
struct pdx_stats_entry;   /* stats_int.h */
struct pdx_xfer;          /* xfer_int.h */
struct pdx_mem_reg;       /* mem_int.h */
struct pdx_backend;       /* backend_int.h */
struct pdx_store_agent;   /* discovery.c */
struct pdx_ctl_wait;      /* ctl_int.h */
struct pdx_ctl_ack;       /* ctl.c */

/* discovery.c's hooks (see struct pdx_agent's `disc`); agent lock held. */
typedef struct pdx_disc_hooks {
    void (*peer_loaded)(pdx_agent_h agent, const char *name);
    void (*peer_unloaded)(pdx_agent_h agent, const char *name);
    void (*changed)(pdx_agent_h agent);
} pdx_disc_hooks_t;

typedef struct pdx_invariant {
    char key[PDX_INV_KEY_MAX];
    char value[PDX_INV_VAL_MAX];
} pdx_invariant_t;

/* A backend callback (notif_recv, peer_error) made during a progress call
 * that runs without the agent lock: queued, handled under the lock once
 * that call returns (progress.c). */
/* A received application notification, queued for pdx_notif_poll. */
typedef struct pdx_notif_item {
    struct pdx_notif_item *next;
    size_t len;
    char peer[PDX_NAME_MAX];
    unsigned char msg[];
} pdx_notif_item_t;

typedef struct pdx_deferred {
    struct pdx_deferred *next;
    int kind; /* 0 notification, 1 peer error */
    pdx_status_t why;
    char peer[PDX_NAME_MAX];
    size_t len;
    unsigned char msg[];
} pdx_deferred_t;

struct pdx_agent {
    uint32_t magic; /* PDX_MAGIC_AGENT */
    char name[PDX_NAME_MAX];
    /* The agent lock guards everything below. A backend's progress op
     * (UCX's ucp_worker_progress can copy megabytes in one call: 10-40 ms
     * measured under load) runs WITHOUT it: the thread sets be_busy under
     * the lock, drops the lock, progresses, retakes it and clears be_busy.
     * Rules: a call into any backend op needs the lock held and be_busy
     * clear (pdx_agent_lock waits for that, on be_cond); code that only
     * reads agent state takes the plain lock and never touches a backend
     * while be_busy is set. One backend is progressed unlocked at a time.
     * be_waiters counts threads waiting in pdx_agent_lock: the progressing
     * thread lets them in before its next unlocked call, so a caller
     * waits for at most one backend progress call (be_waiters is written
     * atomically, under the lock; the progress thread's spin reads it
     * without). */
    pthread_mutex_t lock;
    pthread_cond_t be_cond;
    bool be_busy;
    uint32_t be_waiters;
    pdx_deferred_t *defer_head, *defer_tail; /* owner of be_busy only */
    pthread_mutex_t delivery; /* serialises notification callbacks */
    pdx_agent_params_t params;
    /* The backend every request takes where it reaches (path.c): the
     * path_backend param, else $PDX_PATH_BACKEND; "" for the choice. */
    char path_backend[16];
    pdx_ckey_t ckey; /* cluster key (sign.h); immutable after create */
    uint64_t instance;
    uint32_t generation;
    char host_id[PDX_BLOB_HOST_MAX];

    struct pdx_backend *backends[PDX_MAX_BACKENDS];
    uint32_t nbackends; /* written under the lock with a release store */
    pdx_backend_host_t host;

    struct pdx_mem_reg **regs; /* sorted by (mem_type, addr) */
    size_t nregs, regs_cap;

    struct pdx_peer *peers;
    /* peers by name (peer.c): chained buckets, a power of two of them,
     * NULL while none could be allocated (then pdx_peer_find walks) */
    struct pdx_peer **peer_buckets;
    uint32_t peer_nbuckets, npeers;
    uint64_t peer_del_gen; /* moves when a peer leaves the index */
    uint64_t next_epoch;

    pdx_invariant_t invariants[PDX_MAX_INVARIANTS];
    uint32_t ninvariants;

    struct pdx_xfer *xfers; /* live requests */
    /* Released requests kept for reuse, oldest first (linked by `next`):
     * malloc/free was a third of a small request's cost, and a request is
     * reused only after PDX_XFER_QUARANTINE later releases. */
    struct pdx_xfer *xfer_cache, *xfer_cache_tail;
    uint32_t nxfer_cache;
    struct pdx_stats_entry *peer_stats;
    struct pdx_notif_item *nq_head, *nq_tail;

    int stats_fd; /* listening socket for pdx-info --stats, or -1 */
    uint64_t stats_served_ns; /* atomic */
    int event_fd; /* eventfd: notifications and completions queued */
    int epoll_fd; /* event_fd + every backend's event fd (what users see) */
    uint64_t last_liveness_ns;
    uint64_t destroyed_seen; /* progress.c's destroy sequence last looked at */
    uint64_t last_full_progress_ns;
    pthread_t progress_thread;
    bool thread_running;
    volatile int stop;
    /* The progress thread's own wait (progress.c): an epoll set of the
     * backends' event fds and nap_epoll_fd, itself a set of the peers'
     * pidfds (data: PDX_PIDFD_TAG | fd), the stats socket and wake_fd (an
     * eventfd: stop, a post or a load while it sleeps). The thread naps on
     * nap_epoll_fd alone while callers progress the backends. */
    int prog_epoll_fd;
    int nap_epoll_fd;
    int wake_fd;
    int thread_sleeping; /* atomic: in a wait without a short timeout */
    /* The backends' event fds are out of prog_epoll_fd (progress thread
     * only; progress.c, backends_watch): while the thread polls or naps
     * it waits on no backend, and a watched fd costs every message a
     * wake-up callback per epoll level above the transport's own. */
    bool be_unwatched;
    struct pdx_store_agent *store; /* discovery.c; NULL if none */
    /* discovery.c's hooks, set and cleared with `store`: the rooms below
     * discovery tell it of loads, unloads and generation changes through
     * them (pdx_disc_*_locked) without calling up into it. */
    const struct pdx_disc_hooks *disc;
    /* stats_json.c's pdxi_stats_json, set by agent create: the stats
     * socket (below the progress thread that serves it) answers with it. */
    pdx_status_t (*stats_json)(pdx_agent_h agent, char **json_p);
    /* Metrics (metrics.c, metrics_http.c): requests timed for the latency
     * histograms (on from the first scrape or endpoint), and the HTTP
     * endpoint, NULL while none. */
    bool metrics_timed;
    struct pdx_metrics_http *metrics_http;
    /* Region-removal notices (ctl.c): deregistrations waiting for
     * loaded peers' acknowledgements, and removals told by peers whose
     * acknowledgement waits for our requests on the region to end. */
    struct pdx_ctl_wait *ctl_waits;
    struct pdx_ctl_ack *ctl_acks;
    uint64_t ctl_seq;
};

/* Take the agent lock for work that may call into a backend: waits (lock
 * released) while a backend is progressed without the lock. */
static inline void pdx_agent_lock(pdx_agent_h agent)
{
    pthread_mutex_lock(&agent->lock);
    if (!agent->be_busy) {
        return;
    }
    /* Atomic: the progress thread's spin (progress.c) reads it without
     * the lock to let a waiter in at once. */
    __atomic_fetch_add(&agent->be_waiters, 1, __ATOMIC_RELAXED);
    while (agent->be_busy) {
        pthread_cond_wait(&agent->be_cond, &agent->lock);
    }
    if (__atomic_sub_fetch(&agent->be_waiters, 1, __ATOMIC_RELAXED) == 0) {
        pthread_cond_broadcast(&agent->be_cond); /* the progressing thread */
    }
}

/* Make the agent's event fd readable: notifications or completions wait
 * for the caller. Any thread. */
static inline void pdx_agent_signal(pdx_agent_h agent)
{
    pdx_efd_signal(agent->event_fd);
}

/* Wake the progress thread if it sleeps without a short timeout (a request
 * was posted, a peer loaded): one atomic load when it does not. Any
 * thread, lock held or not. */
static inline void pdx_agent_wake(pdx_agent_h agent)
{
    if (__atomic_load_n(&agent->thread_sleeping, __ATOMIC_ACQUIRE)) {
        pdx_efd_signal(agent->wake_fd);
    }
}

/* Tell discovery (when the agent has a store): a peer was loaded (watch
 * its key) or unloaded (its watch may go), the agent's generation changed
 * (publish it). Agent lock held. */
static inline void pdx_disc_peer_loaded_locked(pdx_agent_h agent,
                                               const char *name)
{
    if (agent->disc != NULL) {
        agent->disc->peer_loaded(agent, name);
    }
}

static inline void pdx_disc_peer_unloaded_locked(pdx_agent_h agent,
                                                 const char *name)
{
    if (agent->disc != NULL) {
        agent->disc->peer_unloaded(agent, name);
    }
}

static inline void pdx_disc_changed_locked(pdx_agent_h agent)
{
    if (agent->disc != NULL) {
        agent->disc->changed(agent);
    }
}

#endif
