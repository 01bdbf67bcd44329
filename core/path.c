/* Path choice: which backend carries a request (cuda_ipc, cma, UCX), and
 * the path report of a peer (each backend's transport, the regions that
 * take a backend's fallback, why a same-host peer misses the fast path). */
#include <stdio.h>
#include <string.h>

#include "backend_int.h"
#include "mem_int.h"
#include "path_int.h"

static uint64_t op_cap(pdx_xfer_op_t op)
{
    return op == PDX_XFER_READ ? PDX_BACKEND_CAP_READ : PDX_BACKEND_CAP_WRITE;
}

/* Does a piece between `lreg` and `rreg` over backend `b` (one across
 * hosts) stage GPU memory through host memory? Sets *why when it does. */
static bool path_staged(pdx_agent_h agent, const pdx_peer_t *p, int b,
                        const struct pdx_mem_reg *lreg,
                        const pdx_peer_region_t *rreg, const char **why)
{
    const struct pdx_backend *be = agent->backends[b];
    if (be->ops->caps & PDX_BACKEND_CAP_SAME_HOST) {
        return false;
    }
    if (lreg->region.mem_type == PDX_MEM_VRAM && be->vram_staged) {
        *why = be->vram_why;
        return true;
    }
    if (rreg->region.mem_type == PDX_MEM_VRAM && rreg->slow[b]) {
        *why = p->slow_why[b][0] ? p->slow_why[b] : be->vram_why;
        return true;
    }
    return false;
}

/* Pick the backend for a request: one that reaches the peer, holds both
 * regions and does the op. VRAM on either side: the same-host GPU path
 * (cuda_ipc) first, then one that carries GPU memory natively (UCX built
 * with CUDA), then one that stages it through host memory; host-only
 * transfers prefer a same-host host-memory backend (cma: one kernel copy),
 * then message-capable ones (UCX). */
int pdx_path_choose(pdx_agent_h agent, pdx_peer_t *peer, pdx_xfer_op_t op,
                    struct pdx_mem_reg *lreg, pdx_peer_region_t *rreg)
{
    int vram = lreg->region.mem_type == PDX_MEM_VRAM ||
               rreg->region.mem_type == PDX_MEM_VRAM;
    int best = -1, best_score = -1;
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        const pdx_backend_ops_t *ops = agent->backends[b]->ops;
        if (peer->bpeer[b] == NULL || lreg->md[b] == NULL ||
            rreg->rmd[b] == NULL || !(ops->caps & op_cap(op))) {
            continue;
        }
        int same_host = (ops->caps & PDX_BACKEND_CAP_SAME_HOST) != 0;
        int same_host_dram = same_host && !(ops->caps & PDX_BACKEND_CAP_VRAM);
        const char *why;
        int score;
        if (vram) {
            score = !(ops->caps & PDX_BACKEND_CAP_VRAM) ? 0
                    : same_host && !rreg->slow[b]       ? 3
                    : !path_staged(agent, peer, (int)b, lreg, rreg, &why) ? 2
                                                                    : 1;
        } else {
            score = same_host_dram ? 2 : !!(ops->caps & PDX_BACKEND_CAP_NOTIF);
        }
        if (score > best_score) {
            best = (int)b;
            best_score = score;
        }
    }
    return best;
}

int pdx_path_fallback(pdx_agent_h agent, const pdx_peer_t *p, int b,
                      const struct pdx_mem_reg *lreg,
                      const pdx_peer_region_t *rreg, const char **why)
{
    if (!p->same_host) {
        return path_staged(agent, p, b, lreg, rreg, why) ? PDX_PATH_STAGED
                                                      : PDX_PATH_FAST;
    }
    uint64_t caps = agent->backends[b]->ops->caps;
    bool same_host_be = (caps & PDX_BACKEND_CAP_SAME_HOST) != 0;
    if (lreg->region.mem_type == PDX_MEM_VRAM ||
        rreg->region.mem_type == PDX_MEM_VRAM) {
        if (same_host_be && (caps & PDX_BACKEND_CAP_VRAM) && !rreg->slow[b]) {
            return PDX_PATH_FAST;
        }
        *why = same_host_be && rreg->slow[b] ? p->slow_why[b]
               : p->vram_why[0] ? p->vram_why
                                : "cuda_ipc does not reach this region";
        return PDX_PATH_SAME_HOST_SLOW;
    }
    if (same_host_be && !rreg->slow[b]) {
        return PDX_PATH_FAST;
    }
    *why = same_host_be ? p->slow_why[b]
           : p->dram_why[0] ? p->dram_why
                            : "the cma backend does not reach this region";
    return PDX_PATH_SAME_HOST_SLOW;
}

static bool blob_has_backend(const pdx_blob_t *b, const char *name)
{
    for (uint16_t i = 0; i < b->nbackends; i++) {
        if (strcmp(b->backends[i].name, name) == 0) {
            return true;
        }
    }
    return false;
}

/* Does backend k take its fallback for region g of peer p? */
void pdx_path_region(pdx_agent_h agent, pdx_peer_t *p, pdx_peer_region_t *g,
                     uint32_t k)
{
    struct pdx_backend *be = agent->backends[k];
    g->slow[k] = false;
    if (g->rmd[k] == NULL || p->bpeer[k] == NULL ||
        !PDX_BE_HAS(be->ops, path)) {
        return;
    }
    char t[64], w[PDX_WHY_MAX] = "";
    if (be->ops->path(be->be, p->bpeer[k], g->rmd[k], t, sizeof(t), w,
                      sizeof(w)) != PDX_OK) {
        g->slow[k] = true;
        if (p->slow_why[k][0] == '\0') {
            snprintf(p->slow_why[k], sizeof(p->slow_why[k]),
                     "region 0x%llx+%llu: %s",
                     (unsigned long long)g->region.addr,
                     (unsigned long long)g->region.len, w);
        }
    }
}

void pdx_path_transport(pdx_agent_h agent, pdx_peer_t *p, uint32_t k)
{
    struct pdx_backend *be = agent->backends[k];
    if (p->bpeer[k] == NULL || !PDX_BE_HAS(be->ops, path) ||
        (be->ops->caps & PDX_BACKEND_CAP_SAME_HOST)) {
        return;
    }
    char why[PDX_WHY_MAX] = "";
    be->ops->path(be->be, p->bpeer[k], NULL, p->transport[k],
                  sizeof(p->transport[k]), why, sizeof(why));
}

/* The path report of a new peer: each backend's transport for it, which
 * regions take a backend's fallback, and for a same-host peer why host or
 * GPU memory would not take the fast path (warned once here). */
void pdx_path_peer(pdx_agent_h agent, pdx_peer_t *p, const pdx_blob_t *b)
{
    int cma = -1, cipc = -1;
    for (uint32_t k = 0; k < agent->nbackends; k++) {
        struct pdx_backend *be = agent->backends[k];
        uint64_t caps = be->ops->caps;
        if (caps & PDX_BACKEND_CAP_SAME_HOST) {
            if (caps & PDX_BACKEND_CAP_VRAM) {
                cipc = (int)k;
            } else {
                cma = (int)k;
            }
        }
        if (p->bpeer[k] == NULL) {
            continue;
        }
        char why[PDX_WHY_MAX] = "";
        if (PDX_BE_HAS(be->ops, path)) {
            be->ops->path(be->be, p->bpeer[k], NULL, p->transport[k],
                          sizeof(p->transport[k]), why, sizeof(why));
            for (size_t i = 0; i < p->nregions; i++) {
                pdx_path_region(agent, p, p->regions[i], k);
            }
        } else {
            snprintf(p->transport[k], sizeof(p->transport[k]), "%s",
                     be->name);
        }
    }
    if (!p->same_host) {
        return;
    }
    if (cma < 0) {
        snprintf(p->dram_why, sizeof(p->dram_why),
                 "the cma backend is not created on agent %s", agent->name);
    } else if (!blob_has_backend(b, "cma")) {
        snprintf(p->dram_why, sizeof(p->dram_why),
                 "peer %s has no cma backend", p->name);
    } else if (p->bpeer[cma] == NULL) {
        snprintf(p->dram_why, sizeof(p->dram_why),
                 "cma declined peer %s (another host to it)", p->name);
    }
    if (cipc < 0) {
        snprintf(p->vram_why, sizeof(p->vram_why),
                 "the cuda_ipc backend is not created on agent %s",
                 agent->name);
    } else if (!blob_has_backend(b, "cuda_ipc")) {
        snprintf(p->vram_why, sizeof(p->vram_why),
                 "peer %s has no cuda_ipc backend", p->name);
    } else if (p->bpeer[cipc] == NULL) {
        snprintf(p->vram_why, sizeof(p->vram_why),
                 "cuda_ipc declined peer %s", p->name);
    }
    bool has_dram = false, has_vram = false;
    for (size_t i = 0; i < p->nregions; i++) {
        has_dram |= p->regions[i]->region.mem_type == PDX_MEM_DRAM;
        has_vram |= p->regions[i]->region.mem_type == PDX_MEM_VRAM;
    }
    const char *why = has_dram && p->dram_why[0]   ? p->dram_why
                      : has_vram && p->vram_why[0] ? p->vram_why
                      : cma >= 0 && p->slow_why[cma][0] ? p->slow_why[cma]
                                                        : NULL;
    if (why != NULL) {
        pdx_warn("agent %s: peer %s is on this host but transfers with it "
                 "will take a slower path (%s)%s", agent->name, p->name, why,
                 agent->params.path_policy == PDX_PATH_POLICY_SAME_HOST_FAST
                     ? ": the path policy will refuse them"
                     : "");
    }
}

