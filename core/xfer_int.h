/* The request object (xfer.c): a transfer between local and peer regions,
 * and the one place a peer's death ends requests. The calls that drive
 * requests (post, check, release) are progress.c's. */
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
    uint8_t paths; /* 1: a fast piece, 2: a backend-fallback piece */
    uint64_t post_ns;
    uint64_t done_ns;      /* when pdx saw the end of the last post */
    uint64_t start_rt_ns;  /* CLOCK_REALTIME at the last post */
    uint64_t post_dur_ns;
    uint64_t bytes, ndescs, nposts;
    struct pdx_stats_entry *pstats;
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
/* The sink of every peer death (a pidfd, an agent destroyed in this
 * process, a backend's peer error, the store's lease, a failed transfer):
 * the peer is gone, its requests fail (released now unless called from
 * inside a backend call, `in_backend`) and new ones are refused until it
 * is loaded again. */
void pdx_xfer_peer_gone_locked(pdx_agent_h agent, pdx_peer_t *peer,
                               pdx_status_t why, const char *how,
                               bool in_backend);
/* `p`'s process exited (its pidfd) or began to (pdx_peer_pid_exited): it
 * is gone for good (remote disconnected, "process exited", dead_final).
 * in_backend: as pdx_xfer_peer_gone_locked's. Lock held. */
void pdx_xfer_peer_exited_locked(pdx_agent_h agent, pdx_peer_t *p,
                                 bool in_backend);
/* Check request `x`'s backend request once and end `x` when it ended. */
void pdx_xfer_progress_locked(pdx_agent_h agent, struct pdx_xfer *x);
/* End requests in flight longer than the agent's xfer timeout. */
void pdx_xfer_timeouts_locked(pdx_agent_h agent, uint64_t now);
/* The end of a post (status `st`), counted once in the backend's and the
 * peer's counters. */
void pdx_xfer_end_locked(pdx_agent_h agent, struct pdx_xfer *x,
                         pdx_status_t st);
/* Ask the backend to stop `x`'s request without waiting. Returns false
 * when it has no abort op (then the request was released, blocking). */
bool pdx_xfer_backend_abort_locked(pdx_agent_h agent, struct pdx_xfer *x);
/* Post `x` (not in progress; progress.c looked at it once): refuses a
 * stale or dead peer, else hands it to its backend, which runs without
 * the lock (callbacks are queued: the caller runs them). */
pdx_status_t pdx_xfer_post_locked(pdx_agent_h agent, struct pdx_xfer *x);
/* Release `x`'s backend request, unlink and free it (to the cache). */
void pdx_xfer_free_locked(pdx_agent_h agent, struct pdx_xfer *x);

#endif
