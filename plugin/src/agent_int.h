/* Private structures of the agent: backends, registrations, peers, requests.
 * Everything here is protected by agent->lock unless said otherwise. */
#ifndef PDX_AGENT_INT_H
#define PDX_AGENT_INT_H

#include <pthread.h>
#include <stdbool.h>

#include <pdx/agent.h>
#include <pdx/backend.h>
#include <pdx/notif.h>
#include <pdx/store.h>
#include <pdx/xfer.h>

#include "base.h"
#include "blob.h"
#include "sign.h"
#include "pdx_call.h"

/* The blob's limits are the agent's: what one side writes the other reads. */
#define PDX_MAX_BACKENDS PDX_BLOB_MAX_BACKENDS
#define PDX_INV_KEY_MAX PDX_BLOB_INV_KEY_MAX
#define PDX_INV_VAL_MAX PDX_BLOB_INV_VAL_MAX
#define PDX_MAX_INVARIANTS PDX_BLOB_MAX_INVARIANTS

/* Counters of one backend or one peer (by name, kept for the agent's
 * life: requests hold a pointer to their peer's). */
typedef struct pdx_stats_entry {
    struct pdx_stats_entry *next;
    char name[PDX_NAME_MAX];
    pdx_stats_t s;
} pdx_stats_entry_t;

struct pdx_backend {
    uint32_t magic; /* PDX_MAGIC_BACKEND */
    pdx_agent_h agent;
    const pdx_backend_ops_t *ops;
    void *dl; /* dlopen handle, NULL when linked in */
    void *be; /* backend instance */
    uint32_t index;
    char name[PDX_BLOB_BACKEND_NAME_MAX];
    pdx_stats_t stats;
};

/* Optional ops of a backend table (appended after the first release). */
#define PDX_BE_HAS(ops, op)                                                    \
    ((ops)->size > offsetof(pdx_backend_ops_t, op) && (ops)->op != NULL)

struct pdx_mem_reg {
    pdx_region_t region;
    void *md[PDX_MAX_BACKENDS];
    uint32_t users; /* requests and prepared lists using it */
};

typedef struct pdx_peer_region {
    pdx_region_t region;
    void *rmd[PDX_MAX_BACKENDS];
    /* Per backend: the backend's path op said this region takes its
     * fallback (e.g. cma without a mapping: process_vm). */
    bool slow[PDX_MAX_BACKENDS];
    /* What the blob said of it (fields and keys): a reload keeps this
     * object, its keys and what uses it when the new blob says the same. */
    uint64_t key_hash;
    /* Prepared lists holding it. A region removed or changed by a reload
     * (or whose peer went) is `gone`: its keys are unloaded, lists using it
     * are refused (STALE), and the last list to let go frees it. */
    uint32_t users;
    bool gone;
} pdx_peer_region_t;

#define PDX_WHY_MAX 160

typedef struct pdx_peer {
    char name[PDX_NAME_MAX];
    uint64_t instance;   /* the peer's instance id from its blob */
    uint32_t generation; /* the peer's generation from its blob */
    uint64_t epoch;      /* this agent's id for this incarnation */
    char host_id[PDX_BLOB_HOST_MAX];
    int32_t pid;
    int pidfd; /* -1 when the peer is not on this host */
    bool pidfd_watched; /* in the progress thread's epoll set */
    bool same_host; /* same host id: fallbacks are counted for it */
    pdx_status_t dead; /* PDX_OK while alive */
    char dead_how[64]; /* how it was found dead */
    uint64_t dead_ns;  /* pdx_now_ns() when it was found dead */
    bool dead_final;   /* its process exited or its agent was destroyed:
                        * never revived (only a new instance replaces it) */
    pdx_stats_entry_t *stats;
    /* Path report: per backend its transport name for this peer, and why
     * host (dram_why) or GPU (vram_why) memory of this same-host peer does
     * not take the fast path ("" when it does or the peer is remote). */
    char transport[PDX_MAX_BACKENDS][64];
    char slow_why[PDX_MAX_BACKENDS][PDX_WHY_MAX];
    char dram_why[PDX_WHY_MAX];
    char vram_why[PDX_WHY_MAX];
    void *bpeer[PDX_MAX_BACKENDS];
    /* hash of the blob's backend names and connection infos: a reload of
     * the same instance with the same hash keeps the connections */
    uint64_t conn_hash;
    pdx_peer_region_t **regions; /* sorted by (mem_type, addr) */
    size_t nregions;
    struct pdx_peer *next;
} pdx_peer_t;

typedef struct pdx_notif_item {
    struct pdx_notif_item *next;
    size_t len;
    char peer[PDX_NAME_MAX];
    unsigned char msg[];
} pdx_notif_item_t;

#define PDX_XFER_CACHE 32
#define PDX_XFER_INLINE_IOV 2
#define PDX_XFER_INLINE_REGS 2

struct pdx_xfer {
    uint32_t magic; /* PDX_MAGIC_XFER; PDX_MAGIC_DEAD once released */
    pdx_agent_h agent;
    pdx_xfer_op_t op;
    char peer_name[PDX_NAME_MAX];
    uint64_t peer_epoch;
    int bindex; /* chosen backend */
    pdx_backend_iov_t *iov;
    size_t niov;
    struct pdx_mem_reg **regs; /* distinct local regions, users held */
    size_t nregs;
    unsigned char *notif;
    size_t notif_len;
    void *breq;
    pdx_status_t status;
    bool posted;
    bool aborting; /* pdx_xfer_abort asked; no notification */
    bool stale;    /* a peer region it uses went away: never posted again */
    bool counted;  /* this post's end is in the counters */
    bool fallback; /* see pdx_path_policy_t */
    uint8_t paths; /* 1: a fast piece, 2: a backend-fallback piece */
    uint64_t post_ns;
    uint64_t done_ns;      /* when pdx saw the end of the last post */
    uint64_t start_rt_ns;  /* CLOCK_REALTIME at the last post */
    uint64_t post_dur_ns;
    uint64_t bytes, ndescs, nposts;
    pdx_stats_entry_t *pstats;
    char why[PDX_WHY_MAX]; /* fallback reason */
    struct pdx_xfer *prev, *next; /* agent's list of live requests */
    /* Storage for small requests (no malloc per request): `iov` and
     * `regs` point here when they fit. */
    pdx_backend_iov_t iov_inline[PDX_XFER_INLINE_IOV];
    struct pdx_mem_reg *regs_inline[PDX_XFER_INLINE_REGS];
};

/* Released requests wait this many later releases before reuse, so a
 * stale handle reads PDX_MAGIC_DEAD (pdx_xfer_* refuse it); at most
 * PDX_XFER_CACHE_MAX are kept (the oldest beyond are freed). */
#define PDX_XFER_QUARANTINE 64
#define PDX_XFER_CACHE_MAX 1024

typedef struct pdx_dlist_entry {
    uint64_t addr;
    uint64_t len;
    void *region; /* struct pdx_mem_reg * or pdx_peer_region_t * */
} pdx_dlist_entry_t;

struct pdx_dlist {
    uint32_t magic; /* PDX_MAGIC_DLIST */
    pdx_agent_h agent;
    bool remote;
    char peer_name[PDX_NAME_MAX];
    uint64_t peer_epoch;
    pdx_mem_type_t mem_type;
    pdx_dlist_entry_t *entries;
    size_t entries_map_len; /* mmapped (huge pages) when > 0 */
    size_t count;
    struct pdx_mem_reg **regs; /* local: distinct regions, users held */
    size_t nregs;
    pdx_peer_region_t **rregs; /* remote: distinct regions, users held */
    size_t nrregs;
};

typedef struct pdx_invariant {
    char key[PDX_INV_KEY_MAX];
    char value[PDX_INV_VAL_MAX];
} pdx_invariant_t;

/* A backend callback (notif_recv, peer_error) made during a progress call
 * that runs without the agent lock: queued, handled under the lock once
 * that call returns (agent.c). */
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
     * waits for at most one backend progress call. */
    pthread_mutex_t lock;
    pthread_cond_t be_cond;
    bool be_busy;
    uint32_t be_waiters;
    pdx_deferred_t *defer_head, *defer_tail; /* owner of be_busy only */
    pthread_mutex_t delivery; /* serialises notification callbacks */
    pdx_agent_params_t params;
    pdx_ckey_t ckey; /* cluster key (sign.h); immutable after create */
    uint64_t instance;
    uint32_t generation;
    char host_id[PDX_BLOB_HOST_MAX];

    struct pdx_backend *backends[PDX_MAX_BACKENDS];
    uint32_t nbackends;
    pdx_backend_host_t host;

    struct pdx_mem_reg **regs; /* sorted by (mem_type, addr) */
    size_t nregs, regs_cap;

    pdx_peer_t *peers;
    uint64_t next_epoch;

    pdx_invariant_t invariants[PDX_MAX_INVARIANTS];
    uint32_t ninvariants;

    struct pdx_xfer *xfers; /* live requests */
    /* Released requests kept for reuse, oldest first (linked by `next`):
     * malloc/free was a third of a small request's cost, and a request is
     * reused only after PDX_XFER_QUARANTINE later releases. */
    struct pdx_xfer *xfer_cache, *xfer_cache_tail;
    uint32_t nxfer_cache;
    pdx_stats_entry_t *peer_stats;
    pdx_notif_item_t *nq_head, *nq_tail;

    int stats_fd; /* listening socket for pdx-info --stats, or -1 */
    uint64_t stats_served_ns; /* atomic */
    int event_fd; /* eventfd: notifications and completions queued */
    int epoll_fd; /* event_fd + every backend's event fd (what users see) */
    uint64_t last_liveness_ns;
    uint64_t destroyed_seen; /* agent.c's destroy sequence last looked at */
    uint64_t last_full_progress_ns;
    pthread_t progress_thread;
    bool thread_running;
    volatile int stop;
    /* The progress thread's own wait (agent.c): an epoll set of the
     * backends' event fds, peers' pidfds, the stats socket and wake_fd
     * (an eventfd: stop, a post or a load while it sleeps). */
    int prog_epoll_fd;
    int wake_fd;
    int thread_sleeping; /* atomic: in a wait without a short timeout */
    struct pdx_store_agent *store; /* store.c: discovery; NULL if none */
    /* Region-removal notices (notif.c): deregistrations waiting for
     * loaded peers' acknowledgements, and removals told by peers whose
     * acknowledgement waits for our requests on the region to end. */
    struct pdx_ctl_wait *ctl_waits;
    struct pdx_ctl_ack *ctl_acks;
    uint64_t ctl_seq;
};

/* Does `r` hold [addr, addr+len)? The one containment check of the agent:
 * len is compared first so the subtraction cannot wrap. */
static inline bool pdx_region_holds(const pdx_region_t *r, uint64_t addr,
                                    uint64_t len)
{
    return len <= r->len && addr >= r->addr && addr - r->addr <= r->len - len;
}

/* Shared memory registry (shm.c), process-wide, own lock. acquire: if
 * [addr, +len) lies in memory from pdx_mem_alloc/pdx_mem_share, count one
 * more user (pdx_mem_free refuses while any) and give its fd and the file
 * offset of `addr`. release undoes one acquire of the same range. */
bool pdx_shm_acquire(uint64_t addr, uint64_t len, int *fd_p, uint64_t *off_p);
void pdx_shm_release(uint64_t addr, uint64_t len);

/* Helpers shared by the agent's files; all need agent->lock held. */
/* Deregister `r` from every backend that took it, release its shared
 * range, free it. The caller has removed it from agent->regs. */
void pdx_mem_reg_free_locked(pdx_agent_h agent, struct pdx_mem_reg *r);
pdx_peer_t *pdx_peer_find(pdx_agent_h agent, const char *name);
pdx_peer_region_t *pdx_peer_region_find(pdx_peer_t *peer, pdx_mem_type_t t,
                                        uint64_t addr, uint64_t len);
struct pdx_mem_reg *pdx_reg_find(pdx_agent_h agent, pdx_mem_type_t t,
                                 uint64_t addr, uint64_t len);
/* Take the agent lock for work that may call into a backend: waits (lock
 * released) while a backend is progressed without the lock. */
void pdx_agent_lock(pdx_agent_h agent);
/* A full pass: every backend progressed (without the lock, see struct
 * pdx_agent), then liveness, requests, timeouts. Called with the lock
 * taken by pdx_agent_lock; the lock is dropped and retaken inside, so the
 * caller must not keep pointers another thread may free (its own handle
 * is fine). Returns at once (0) when another thread is mid-pass. */
int pdx_agent_progress_locked(pdx_agent_h agent);
/* Progress backend `b` alone, without the lock (same contract as above);
 * false when another thread is progressing a backend (nothing done). */
bool pdx_backend_progress_unlocked(pdx_agent_h agent, struct pdx_backend *b,
                                   int *events_p);
/* Around one backend op that may take long (a post that copies data):
 * begin (lock held, be_busy clear) marks the backends busy and drops the
 * lock; end retakes it and clears be_busy. Callbacks in between are
 * queued: run them with pdx_agent_run_deferred_locked once the caller's
 * state is consistent again. While busy no other thread calls a backend
 * op or frees agent state (both need pdx_agent_lock). */
void pdx_backend_unlock_begin(pdx_agent_h agent);
void pdx_backend_unlock_end(pdx_agent_h agent);
void pdx_agent_run_deferred_locked(pdx_agent_h agent);
/* End requests in flight longer than the agent's xfer timeout. */
void pdx_xfer_timeouts_locked(pdx_agent_h agent, uint64_t now);
void pdx_agent_signal(pdx_agent_h agent);
/* Wake the progress thread if it sleeps without a short timeout (a request
 * was posted, a peer loaded): one atomic load when it does not. Any
 * thread, lock held or not. */
void pdx_agent_wake(pdx_agent_h agent);
typedef enum pdx_fail_mode {
    PDX_FAIL_RELEASE, /* the peer is being unloaded: release now */
    PDX_FAIL_ABORT,   /* the peer died: abort, progress releases */
    PDX_FAIL_MARK,    /* from inside a backend call: status only */
} pdx_fail_mode_t;
/* End every live request of peer incarnation `epoch` with `why`. Never
 * waits for the peer. */
void pdx_xfer_fail_peer_locked(pdx_agent_h agent, uint64_t epoch,
                               pdx_status_t why, pdx_fail_mode_t mode);
void pdx_peer_destroy_locked(pdx_agent_h agent, pdx_peer_t *peer);
/* A prepared list lets go of peer region `g`: frees it when gone and
 * unused. */
void pdx_peer_region_put_locked(pdx_peer_region_t *g);
/* End (STALE) and never post again the requests of peer incarnation
 * `epoch` that use one of the remote keys `rmds` (n of them), releasing
 * their backend requests now (the keys are unloaded next). All of the
 * incarnation's requests when rmds is NULL. */
void pdx_xfer_fail_rmds_locked(pdx_agent_h agent, uint64_t epoch,
                               void *const *rmds, size_t n);
/* The peer is gone: fail its requests (released now unless called from
 * inside a backend call) and refuse new ones until it is loaded again. */
void pdx_peer_mark_dead_locked(pdx_agent_h agent, pdx_peer_t *peer,
                               pdx_status_t why, const char *how,
                               bool in_backend);
pdx_status_t pdx_notif_send_locked(pdx_agent_h agent, pdx_peer_t *peer,
                                   const void *msg, size_t len);
void pdx_xfer_progress_locked(pdx_agent_h agent, struct pdx_xfer *x);
/* The counters of peer `name`, made on first use (NULL only without
 * memory). */
pdx_stats_entry_t *pdx_peer_stats_get(pdx_agent_h agent, const char *name);

/* The stats socket (stats_sock.c). */
void pdx_stats_sock_open(pdx_agent_h agent);
void pdx_stats_sock_serve(pdx_agent_h agent); /* without the lock */
void pdx_stats_sock_close(pdx_agent_h agent);

/* Loader (loader.c). */
pdx_status_t pdx_loader_open(const char *name, const pdx_backend_ops_t **ops_p,
                             void **dl_p, char *why, size_t why_len);
void dlclose_backend(void *dl);
struct pdx_store_ops;
pdx_status_t pdx_loader_open_store(const char *name,
                                   const struct pdx_store_ops **ops_p,
                                   void **dl_p, char *why, size_t why_len);

/* Store glue (store.c). init: load the agent's store module and start
 * watching (PDX_AGENT_PARAM_STORE); called last in agent create, which
 * destroys the agent if it fails. fini: stop publishing and watching,
 * revoke the lease; called first in agent destroy, without the lock. */
pdx_status_t pdx_store_agent_init(pdx_agent_h agent,
                                  const pdx_agent_params_t *params);
void pdx_store_agent_fini(pdx_agent_h agent);
/* Hooks, agent lock held: a peer was loaded (watch its key) or unloaded
 * (its watch may go), the agent's generation changed (publish it). */
void pdx_store_agent_peer_loaded_locked(pdx_agent_h agent, const char *name);
void pdx_store_agent_peer_unloaded_locked(pdx_agent_h agent,
                                          const char *name);
void pdx_store_agent_changed_locked(pdx_agent_h agent);

/* What pdx_stats_json shows of the agent's store. */
typedef struct pdx_store_snapshot {
    char module[32];
    char endpoints[512];
    char ns[128];
    pdx_store_status_t status;
    bool publishing;               /* pdx_agent_publish was called */
    bool published;                /* a generation was handed to the store */
    uint32_t published_generation;
    uint32_t agents_known;         /* blobs cached of the names watched */
    uint64_t reloads, deaths;      /* peers reloaded / failed by the watch */
    /* pdx_store_owners_* calls, the blocks of those that succeeded, and
     * the failed calls. */
    uint64_t owners_add_calls, owners_add_blocks, owners_add_failures;
    uint64_t owners_del_calls, owners_del_blocks, owners_del_failures;
    uint64_t owners_get_calls, owners_get_blocks, owners_get_failures;
} pdx_store_snapshot_t;
/* false without a store. With the agent lock held (the store is attached
 * and detached under it). Non-blocking. */
bool pdx_store_agent_snapshot(pdx_agent_h agent, pdx_store_snapshot_t *out);

/* Region-removal notices between agents (notif.c), internal messages on
 * the notification channel that never reach the application's queue.
 * recv: true when `msg` was such a message (consumed). progress: send the
 * acknowledgements whose regions have no request of ours in flight left.
 * peer_destroyed: forget (and unload) what waits on `peer`. All with the
 * agent lock held. */
bool pdx_ctl_recv_locked(pdx_agent_h agent, const char *peer,
                         const void *msg, size_t len);
void pdx_ctl_progress_locked(pdx_agent_h agent);
void pdx_ctl_peer_destroyed_locked(pdx_agent_h agent, pdx_peer_t *peer);
/* Does an application notification start with pdx's control prefix? */
bool pdx_ctl_reserved(const void *msg, size_t len);
/* pdx_mem_deregister's notice: tell every live loaded peer that carries
 * notifications that `r` goes away and wait, dropping and retaking the
 * lock, until each acknowledged, died, or the bound passed. `r` is out of
 * agent->regs already and not freed. */
void pdx_ctl_region_gone_wait_locked(pdx_agent_h agent,
                                     const struct pdx_mem_reg *r);
/* peer.c: take `g` out of its peer's region table (lists holding it are
 * refused STALE; its keys stay loaded), and later unload and free it. */
void pdx_peer_region_retire_locked(pdx_peer_t *peer, pdx_peer_region_t *g);
void pdx_peer_region_drop_locked(pdx_agent_h agent, pdx_peer_region_t *g);

#endif
