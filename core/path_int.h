/* Path choice (path.c). All with agent->lock held. */
#ifndef PDX_PATH_H
#define PDX_PATH_H

#include <stdbool.h>

#include <pdx/xfer.h>

#include "agent_int.h"
#include "blob_int.h"
#include "peer_int.h"

struct pdx_mem_reg;

/* The backend for a request between `lreg` and peer region `rreg`: one
 * that reaches the peer, holds both regions and does the op; -1 if none. */
int pdx_path_choose(pdx_agent_h agent, pdx_peer_t *peer, pdx_xfer_op_t op,
                    struct pdx_mem_reg *lreg, pdx_peer_region_t *rreg);
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
