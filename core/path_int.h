/* Path choice (path.c): the backend of a request, by fixed rules where
 * one path is the floor (cuda_ipc for GPU memory on this host, cma's
 * memcpy into a mapped peer region) and by measured cost where two paths
 * compete (a same-host peer's host memory that cannot be mapped: cma's
 * process_vm_readv/writev or UCX); the path report. All with agent->lock
 * held. */
#ifndef PDX_PATH_H
#define PDX_PATH_H

#include <stdbool.h>

#include <pdx/xfer.h>

#include "agent_int.h"
#include "blob_int.h"
#include "peer_int.h"

struct pdx_mem_reg;

/* Cost classes: per peer, for each (op, size class, one or many
 * descriptors, the two competing backends) the last PDX_PATH_SAMPLES
 * measured costs of each backend (post to the end pdx saw, divided by the
 * requests of the class in flight on it then); a backend's cost is their
 * mean without the largest (the two largest from five samples on). A
 * backend is measured in runs of consecutive posts, the first
 * PDX_PATH_RUN_SKIP of a run not counted: what a path
 * costs depends on its state (a peer's progress thread polling through a
 * stream, or asleep), and a run measures it as a stream of the class
 * would use it. Calibration: a run on the fixed rules' choice, then one
 * on the other, cut short once, from its fourth sample, two in a row are
 * over four times the first's cost; the cheaper then carries the class
 * (a run cut short is dearer), sampled every
 * PDX_PATH_SAMPLE_EVERY posts, the other probed by a run every
 * PDX_PATH_PROBE_EVERY posts times how much dearer it was (at most
 * 1000x; at most PDX_PATH_PROBE_FEW x while it has fewer than
 * PDX_PATH_CAL_MIN samples); a switch needs the other 10% cheaper. */
#define PDX_PATH_SAMPLES 8
#define PDX_PATH_CAL_MIN 8 /* a whole run's samples */
#define PDX_PATH_RUN 16
#define PDX_PATH_RUN_SKIP 8
#define PDX_PATH_SAMPLE_EVERY 16
#define PDX_PATH_PROBE_EVERY 1024
#define PDX_PATH_PROBE_FEW 16
#define PDX_PATH_CLASSES 64

typedef struct pdx_path_class {
    uint32_t key;      /* 0: a free slot */
    int8_t b[2];       /* the two backends */
    int8_t chosen;     /* 0 or 1 (index into b), -1 while calibrating */
    int8_t first;      /* the fixed rules' choice: calibrated first */
    int8_t run_k;      /* the run in progress: on b[run_k] */
    uint8_t run_left;  /* posts left in it (0: none) */
    uint8_t run_skip;  /* its first posts, not measured */
    uint8_t run_n;     /* its samples so far */
    uint8_t n[2];      /* samples so far (at most PDX_PATH_SAMPLES) */
    uint8_t next[2];   /* ring positions */
    uint32_t inflight[2];
    uint32_t ns[2][PDX_PATH_SAMPLES];
    uint64_t posts;
    uint64_t last_probe; /* posts when the last probe began */
    uint32_t switches;
} pdx_path_class_t;

typedef struct pdx_path_cost {
    pdx_path_class_t c[PDX_PATH_CLASSES];
} pdx_path_cost_t;

/* What the choice of a request's backend found. */
typedef struct pdx_path_pick {
    int b;        /* the backend; -1: none reaches */
    int alt;      /* the competing backend of a cost class, or -1 */
    int cls;      /* the cost class (index in peer->cost), or -1 */
    uint32_t key; /* its key (a slot reused by another class differs) */
} pdx_path_pick_t;

/* The backend for a request between `lreg` and peer region `rreg`: one
 * that reaches the peer, holds both regions and does the op (pick->b, -1
 * if none). The agent's pinned backend (path_backend) where it reaches;
 * GPU memory: cuda_ipc on this host, then a backend carrying it natively,
 * then one staging it; host memory: cma where the peer region is mapped,
 * else, for a same-host peer, whichever of cma's process_vm and a message
 * backend (UCX) is cheaper: pick->alt is then the other and the caller
 * passes the request's size to pdx_path_class. */
void pdx_path_choose(pdx_agent_h agent, pdx_peer_t *peer, pdx_xfer_op_t op,
                     struct pdx_mem_reg *lreg, pdx_peer_region_t *rreg,
                     pdx_path_pick_t *pick);
/* The cost class of a request of `bytes` in `ndescs` descriptors whose
 * pick has an alternative: sets pick->cls and pick->key, and orders b and
 * alt as the class decided (or, calibrating, as it alternates). On no
 * memory, pick->alt = -1 (fixed choice). */
void pdx_path_class(pdx_peer_t *peer, pdx_xfer_op_t op, uint64_t bytes,
                    size_t ndescs, pdx_path_pick_t *pick);
/* A post of a request of class `cls` (key `key`): the backend it takes
 * (one of the class's two), *t0_p the time to measure from (0: not
 * measured) and *div_p the requests of the class in flight on that
 * backend, this one included. -1 when the class is gone (keep the
 * request's backend, unmeasured). */
int pdx_path_post(pdx_peer_t *peer, int cls, uint32_t key, uint64_t *t0_p,
                  uint32_t *div_p);
/* The end of such a post on backend `b`: measured from t0 (when not 0)
 * if it succeeded. */
void pdx_path_end(pdx_peer_t *peer, int cls, uint32_t key, int b,
                  uint64_t t0, uint32_t div, bool ok);
/* The cost choice of class `cls` in words, for the path report ("cost:
 * cma (process_vm) 1.2 us < ucx 2.5 us per up to 16 KiB read (8, 6
 * samples)"); "" when the class is gone. */
void pdx_path_cost_why(pdx_agent_h agent, const pdx_peer_t *peer, int cls,
                       uint32_t key, char *buf, size_t len);
/* Free a peer's cost classes (its destruction, a reconnection). */
void pdx_path_cost_free(pdx_peer_t *p);
/* Is a piece between `lreg` and `rreg` over backend `b` a slower path
 * than the agent could have (pdx_path_policy_t)? PDX_PATH_FAST, or, with
 * *why set: a same-host peer's fallback (cma or cuda_ipc missing or not
 * reaching the region), or GPU memory staged through host memory (any
 * host). */
enum {
    PDX_PATH_FAST = 0,
    PDX_PATH_SAME_HOST_SLOW = 1,
    PDX_PATH_STAGED = 2,
};
int pdx_path_fallback(pdx_agent_h agent, const pdx_peer_t *p, int b,
                      const struct pdx_mem_reg *lreg,
                      const pdx_peer_region_t *rreg, const char **why);
/* Does backend k take its fallback for region g of peer p? (g->slow[k],
 * and p->slow_why[k] for the first such region.) */
void pdx_path_region(pdx_agent_h agent, pdx_peer_t *p, pdx_peer_region_t *g,
                     uint32_t k);
/* The path report of a new peer (warned once for a same-host peer whose
 * memory would not take the fast path). */
/* Ask backend k again for its transport to peer p (into p->transport[k]):
 * a backend that connects at first use (ucx) names its transport only
 * then. Backends for same-host memory keep what the load found. Lock held
 * with pdx_agent_lock (backend calls). */
void pdx_path_transport(pdx_agent_h agent, pdx_peer_t *p, uint32_t k);
void pdx_path_peer(pdx_agent_h agent, pdx_peer_t *p, const pdx_blob_t *b);

#endif
