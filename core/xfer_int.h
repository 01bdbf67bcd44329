/* The request object: a transfer between local and peer regions. Its life
 * is in three files, bottom up: xfer_end.c (how requests end: counted
 * once, stopped, failed by peer or region, timed out), xfer_progress.c (a
 * request in flight checked once, the progress pass's step) and xfer.c
 * (create, make, post, check, release, abort: the calls above the
 * progress pass). */
#ifndef PDX_XFER_INT_H
#define PDX_XFER_INT_H

#include <stdbool.h>

#include <pdx/xfer.h>

#include "agent_int.h"
#include "peer_int.h"
#include "stats_int.h"

struct pdx_mem_reg;

#define PDX_XFER_CACHE 32
#define PDX_XFER_INLINE_IOV 2
#define PDX_XFER_INLINE_REGS 2

struct pdx_xfer {
    uint32_t magic; /* PDX_MAGIC_XFER; PDX_MAGIC_DEAD once released */
    pdx_agent_h agent;
    pdx_xfer_op_t op;
    char peer_name[PDX_NAME_MAX];
    uint64_t peer_epoch;
    /* The peer as last found, while agent->peer_del_gen is pcache_gen (no
     * peer left the index since): post and end skip the lookup. Check
     * its epoch against peer_epoch as that of a lookup's result. */
    struct pdx_peer *pcache;
    uint64_t pcache_gen;
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
    bool timed;    /* post_ns is this post's start, for the histograms */
    uint8_t slow;  /* bits 1 << PDX_PATH_*: the slower paths it takes */
    uint8_t paths; /* 1: a fast piece, 2: a backend-fallback piece */
    /* 1 while the last post ended PDX_OK and no backend request is held:
     * pdx_xfer_check answers PDX_OK without the agent lock. Set under the
     * lock (pdx_xfer_settle_locked), cleared by every change of status
     * (pdx_xfer_end_locked) and by a post; read and written with
     * __atomic only. */
    uint8_t settled;
    uint64_t post_ns;
    uint64_t done_ns;      /* when pdx saw the end of the last post */
    uint64_t start_rt_ns;  /* CLOCK_REALTIME at the last post */
    uint64_t post_dur_ns;
    uint64_t bytes, ndescs, nposts;
    struct pdx_stats_entry *pstats;
    /* A cost class (path.c): two backends compete for this request; each
     * post takes the one the class says, swapping `iov` with `iov_alt`
     * (the same pieces with the other backend's keys). */
    int alt;            /* the other backend, or -1 */
    int cls;            /* the class, or -1 */
    uint32_t cls_key;
    uint32_t cost_div;  /* requests of the class in flight at this post */
    uint64_t cost_t0;   /* this post is measured from here (0: not) */
    pdx_backend_iov_t *iov_alt;
    char why[PDX_WHY_MAX]; /* fallback reason */
    struct pdx_xfer *prev, *next; /* agent's list of live requests */
    /* Storage for small requests (no malloc per request): `iov` and
     * `regs` point here when they fit. */
    pdx_backend_iov_t iov_inline[PDX_XFER_INLINE_IOV];
    pdx_backend_iov_t iov_alt_inline[PDX_XFER_INLINE_IOV];
    struct pdx_mem_reg *regs_inline[PDX_XFER_INLINE_REGS];
};

/* Released requests wait this many later releases before reuse, so a
 * stale handle reads PDX_MAGIC_DEAD (pdx_xfer_* refuse it); at most
 * PDX_XFER_CACHE_MAX are kept (the oldest beyond are freed). */
#define PDX_XFER_QUARANTINE 64
#define PDX_XFER_CACHE_MAX 1024

/* All with agent->lock held. */
typedef enum pdx_fail_mode {
    PDX_FAIL_RELEASE, /* the peer is being unloaded: release now */
    PDX_FAIL_ABORT,   /* the peer died: abort, progress releases */
    PDX_FAIL_MARK,    /* from inside a backend call: status only */
} pdx_fail_mode_t;
/* End every live request of peer incarnation `epoch` with `why`. Never
 * waits for the peer. */
void pdx_xfer_fail_peer_locked(pdx_agent_h agent, uint64_t epoch,
                               pdx_status_t why, pdx_fail_mode_t mode);
/* End (STALE) and never post again the requests of peer incarnation
 * `epoch` that use one of the remote keys `rmds` (n of them), releasing
 * their backend requests now (the keys are unloaded next). All of the
 * incarnation's requests when rmds is NULL. */
void pdx_xfer_fail_rmds_locked(pdx_agent_h agent, uint64_t epoch,
                               void *const *rmds, size_t n);
/* xfer_progress.c: check request `x`'s backend request once and end `x`
 * when it ended; finish: the end of a request whose data landed (the
 * notification sent through a message backend when its data backend
 * carries none). */
void pdx_xfer_progress_locked(pdx_agent_h agent, struct pdx_xfer *x);
pdx_status_t pdx_xfer_finish_locked(pdx_agent_h agent, struct pdx_xfer *x,
                                    pdx_peer_t *peer);

/* The loaded peer named by `x` (any epoch), or NULL: the cached one while
 * no peer has left the index since it was found. */
static inline pdx_peer_t *pdx_xfer_peer(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->pcache != NULL && x->pcache_gen == agent->peer_del_gen) {
        return x->pcache;
    }
    x->pcache = pdx_peer_find(agent, x->peer_name);
    x->pcache_gen = agent->peer_del_gen;
    return x->pcache;
}
/* Lock held: mark `x` settled when its last post ended PDX_OK and it
 * holds no backend request (see pdx_xfer.settled). */
static inline void pdx_xfer_settle_locked(struct pdx_xfer *x)
{
    if (x->status == PDX_OK && x->breq == NULL && x->posted) {
        __atomic_store_n(&x->settled, 1, __ATOMIC_RELEASE);
    }
}
/* pdx_xfer_check's answer without the lock: true when `x` is settled. */
static inline bool pdx_xfer_settled(const struct pdx_xfer *x)
{
    return __atomic_load_n(&x->settled, __ATOMIC_ACQUIRE) != 0;
}
/* End requests in flight longer than the agent's xfer timeout. */
void pdx_xfer_timeouts_locked(pdx_agent_h agent, uint64_t now);
/* The end of a post (status `st`), counted once in the backend's and the
 * peer's counters. */
void pdx_xfer_end_locked(pdx_agent_h agent, struct pdx_xfer *x,
                         pdx_status_t st);
/* Ask the backend to stop `x`'s request without waiting. Returns false
 * when it has no abort op (then the request was released, blocking). */
bool pdx_xfer_backend_abort_locked(pdx_agent_h agent, struct pdx_xfer *x);

#endif
