/* Path choice: which backend carries a request (cuda_ipc, cma, UCX): by
 * fixed rules where one path is the floor, by measured cost where two
 * compete (cost classes, calibrated on the requests themselves); and the
 * path report of a peer (each backend's transport, the regions that take
 * a backend's fallback, why a same-host peer misses the fast path). */
#include <stdio.h>
#include <stdlib.h>
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

/* The agent's pinned backend (path_backend), if it carries this pair. */
static int path_pinned(pdx_agent_h agent, const pdx_peer_t *peer,
                       pdx_xfer_op_t op, const struct pdx_mem_reg *lreg,
                       const pdx_peer_region_t *rreg)
{
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        const pdx_backend_ops_t *ops = agent->backends[b]->ops;
        if (strcmp(agent->backends[b]->name, agent->path_backend) == 0) {
            return peer->bpeer[b] != NULL && lreg->md[b] != NULL &&
                           rreg->rmd[b] != NULL && (ops->caps & op_cap(op))
                       ? (int)b
                       : -1;
        }
    }
    return -1;
}

/* Pick the backend for a request: one that reaches the peer, holds both
 * regions and does the op. VRAM on either side: the same-host GPU path
 * (cuda_ipc) first, then one that carries GPU memory natively (UCX built
 * with CUDA), then one that stages it through host memory. Host memory:
 * a same-host host-memory backend (cma) where it maps the peer region
 * (one memcpy by this thread: nothing is cheaper), else message-capable
 * ones (UCX); a same-host peer's region cma cannot map is carried by
 * process_vm_readv/writev or UCX, whichever costs less (pick->alt). */
void pdx_path_choose(pdx_agent_h agent, pdx_peer_t *peer, pdx_xfer_op_t op,
                     struct pdx_mem_reg *lreg, pdx_peer_region_t *rreg,
                     pdx_path_pick_t *pick)
{
    *pick = (pdx_path_pick_t){.b = -1, .alt = -1, .cls = -1};
    if (agent->path_backend[0] != '\0' &&
        (pick->b = path_pinned(agent, peer, op, lreg, rreg)) >= 0) {
        return;
    }
    int vram = lreg->region.mem_type == PDX_MEM_VRAM ||
               rreg->region.mem_type == PDX_MEM_VRAM;
    int best = -1, best_score = -1, pvm = -1, msg = -1;
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
            if (same_host_dram && rreg->slow[b] && pvm < 0) {
                pvm = (int)b;
            } else if (!same_host && score == 1 && msg < 0) {
                msg = (int)b;
            }
        }
        if (score > best_score) {
            best = (int)b;
            best_score = score;
        }
    }
    pick->b = best;
    if (best == pvm && msg >= 0 && peer->same_host) {
        pick->alt = msg;
    }
}

/* ---- cost classes ---- */

static const char *const size_class_name[] = {
    "up to 16 KiB", "16-64 KiB", "64-256 KiB", "256 KiB-1 MiB",
    "1-4 MiB", "4-16 MiB", "16 MiB and more"};

static unsigned size_class(uint64_t bytes)
{
    unsigned c = 0;
    for (uint64_t lim = 16384; c < 6 && bytes >= lim; lim <<= 2) {
        c++;
    }
    return c;
}

void pdx_path_class(pdx_peer_t *peer, pdx_xfer_op_t op, uint64_t bytes,
                    size_t ndescs, pdx_path_pick_t *pick)
{
    /* The class names its two backends in a fixed order (lower index
     * first), whichever the pick had first. */
    int lo = pick->b < pick->alt ? pick->b : pick->alt;
    int hi = pick->b < pick->alt ? pick->alt : pick->b;
    uint32_t key = 1u | (op == PDX_XFER_WRITE ? 2u : 0u) |
                   (size_class(bytes) << 2) | (ndescs > 1 ? 1u << 5 : 0u) |
                   ((uint32_t)lo << 6) | ((uint32_t)hi << 14);
    if (peer->cost == NULL &&
        (peer->cost = calloc(1, sizeof(*peer->cost))) == NULL) {
        pick->alt = -1;
        return;
    }
    uint32_t h = (key * 2654435761u) >> 26; /* 6 bits: PDX_PATH_CLASSES */
    pdx_path_class_t *c = NULL;
    for (uint32_t i = 0; i < PDX_PATH_CLASSES; i++) {
        pdx_path_class_t *t = &peer->cost->c[(h + i) % PDX_PATH_CLASSES];
        if (t->key == key || t->key == 0) {
            c = t;
            break;
        }
    }
    if (c == NULL) {
        pick->alt = -1; /* every slot taken: the fixed choice */
        return;
    }
    if (c->key == 0) {
        *c = (pdx_path_class_t){.key = key, .b = {(int8_t)lo, (int8_t)hi},
                                .chosen = -1, .run_k = -1,
                                .first = pick->b == hi};
    }
    int k = c->chosen >= 0 ? c->chosen : c->first;
    pick->b = c->b[k];
    pick->alt = c->b[1 - k];
    pick->cls = (int)(c - peer->cost->c);
    pick->key = key;
}

static pdx_path_class_t *path_class_get(pdx_peer_t *peer, int cls,
                                        uint32_t key)
{
    if (peer->cost == NULL || cls < 0 || cls >= PDX_PATH_CLASSES ||
        peer->cost->c[cls].key != key) {
        return NULL;
    }
    return &peer->cost->c[cls];
}

/* What b[k] costs: the mean of its samples without the largest (one
 * preemption of this thread is not the path's), from five samples on
 * without the two largest (a path cut short on two outliers, then probed
 * again), so that a path with a low median but a long tail (a peer's
 * progress thread woken late) costs what it costs a stream of requests.
 * UINT32_MAX without samples. */
static uint32_t path_cost(const pdx_path_class_t *c, int k)
{
    unsigned n = c->n[k];
    if (n == 0) {
        return UINT32_MAX;
    }
    uint64_t sum = 0, max = 0, max2 = 0;
    for (unsigned i = 0; i < n; i++) {
        uint64_t v = c->ns[k][i];
        sum += v;
        if (v > max) {
            max2 = max;
            max = v;
        } else if (v > max2) {
            max2 = v;
        }
    }
    return n <= 2   ? (uint32_t)(sum / n)
           : n <= 4 ? (uint32_t)((sum - max) / (n - 1))
                    : (uint32_t)((sum - max - max2) / (n - 2));
}

/* Is a probe of the other backend due? Every PDX_PATH_PROBE_EVERY posts,
 * stretched by how much dearer it measured (at most 1000x), so that its
 * runs cost a fraction of a percent of the class's time; at most
 * PDX_PATH_PROBE_FEW x while it has fewer than PDX_PATH_CAL_MIN samples
 * (a run cut short: a slow spell of its peer must not hide a path for
 * a million posts). */
static bool probe_due(const pdx_path_class_t *c)
{
    int k = c->chosen;
    uint64_t mine = path_cost(c, k), other = path_cost(c, 1 - k);
    uint64_t ratio = mine > 0 && other > mine ? other / mine : 1;
    uint64_t cap = c->n[1 - k] < PDX_PATH_CAL_MIN ? PDX_PATH_PROBE_FEW : 1000;
    ratio = ratio > cap ? cap : ratio;
    return c->posts - c->last_probe >= PDX_PATH_PROBE_EVERY * ratio;
}

int pdx_path_post(pdx_peer_t *peer, int cls, uint32_t key, uint64_t *t0_p,
                  uint32_t *div_p)
{
    pdx_path_class_t *c = path_class_get(peer, cls, key);
    *t0_p = 0;
    if (c == NULL) {
        return -1;
    }
    uint64_t n = ++c->posts;
    if (c->run_left == 0) {
        /* A new run: calibrating, the one with fewer samples (the fixed
         * rules' choice first); decided, a probe of the other now and
         * then. */
        if (c->chosen < 0) {
            c->run_k = c->n[0] == c->n[1] ? c->first : c->n[0] > c->n[1];
        } else if (probe_due(c)) {
            c->run_k = (int8_t)(1 - c->chosen);
            c->last_probe = n;
        } else {
            c->run_k = -1;
        }
        if (c->run_k >= 0) {
            c->run_left = PDX_PATH_RUN;
            c->run_skip = PDX_PATH_RUN_SKIP;
            c->run_n = 0;
        }
    }
    int k;
    bool measure;
    if (c->run_left > 0) {
        k = c->run_k;
        c->run_left--;
        measure = c->run_skip == 0;
        if (c->run_skip > 0) {
            c->run_skip--;
        }
    } else {
        k = c->chosen;
        measure = n % PDX_PATH_SAMPLE_EVERY == 0;
    }
    *div_p = ++c->inflight[k];
    if (measure) {
        *t0_p = pdx_now_ns();
    }
    return c->b[k];
}

/* A new sample `ns` of b[k] (already stored): decide (both measured
 * over a whole run), switch (the other 10% cheaper), or cut a run short
 * that is plainly the dearer path (from its fourth sample, two in a row
 * over four times the other's cost). A run's first samples are often a
 * cold start's, not the path's: a peer's first served requests over UCX
 * make the owner's endpoint to it, and a run starts with the peer's
 * progress thread asleep; two such samples of a 64 KiB READ, 11-15x the
 * steady 5.4 us, cut ucx out of its class, where it was the cheaper by a
 * quarter (BENCH-LOG, session 24). */
static void path_decide(pdx_path_class_t *c, int k, uint32_t ns)
{
    uint64_t other = path_cost(c, 1 - k);
    bool in_run = c->run_k == k;
    if (in_run && c->run_n < UINT8_MAX) {
        c->run_n++;
    }
    /* the run's sample before this one (run_n >= 2) */
    uint32_t prev =
        c->ns[k][(c->next[k] + PDX_PATH_SAMPLES - 2) % PDX_PATH_SAMPLES];
    bool loser = in_run && c->run_n >= 4 &&
                 c->n[1 - k] >= PDX_PATH_CAL_MIN && ns / 4 > other &&
                 prev / 4 > other;
    if (loser) {
        c->run_left = 0;
    }
    if (c->chosen < 0) {
        if (loser) {
            c->chosen = (int8_t)(1 - k);
        } else if (c->n[0] >= PDX_PATH_CAL_MIN &&
                   c->n[1] >= PDX_PATH_CAL_MIN) {
            c->chosen = path_cost(c, 1) < path_cost(c, 0);
        }
        return;
    }
    if (c->n[0] == 0 || c->n[1] == 0) {
        return;
    }
    uint64_t m0 = path_cost(c, 0), m1 = path_cost(c, 1);
    if (c->chosen == 0 ? m1 * 10 < m0 * 9 : m0 * 10 < m1 * 9) {
        c->chosen = (int8_t)(1 - c->chosen); /* the other 10% cheaper */
        c->switches++;
    }
}

void pdx_path_end(pdx_peer_t *peer, int cls, uint32_t key, int b,
                  uint64_t t0, uint32_t div, bool ok)
{
    pdx_path_class_t *c = path_class_get(peer, cls, key);
    if (c == NULL || (b != c->b[0] && b != c->b[1])) {
        return;
    }
    int k = b == c->b[1];
    if (c->inflight[k] > 0) {
        c->inflight[k]--;
    }
    if (t0 == 0 || !ok) {
        return;
    }
    uint64_t ns = (pdx_now_ns() - t0) / (div ? div : 1);
    uint32_t v = ns > UINT32_MAX ? UINT32_MAX : (uint32_t)ns;
    c->ns[k][c->next[k]] = v;
    c->next[k] = (uint8_t)((c->next[k] + 1) % PDX_PATH_SAMPLES);
    if (c->n[k] < PDX_PATH_SAMPLES) {
        c->n[k]++;
    }
    path_decide(c, k, v);
}

/* A backend's name in the cost report: cma's fallback says so. */
static const char *cost_name(pdx_agent_h agent, int b)
{
    uint64_t caps = agent->backends[b]->ops->caps;
    return (caps & PDX_BACKEND_CAP_SAME_HOST) && !(caps & PDX_BACKEND_CAP_VRAM)
               ? "cma (process_vm)"
               : agent->backends[b]->name;
}

void pdx_path_cost_why(pdx_agent_h agent, const pdx_peer_t *peer, int cls,
                       uint32_t key, char *buf, size_t len)
{
    pdx_path_class_t *c = path_class_get((pdx_peer_t *)peer, cls, key);
    if (c == NULL) {
        buf[0] = '\0';
        return;
    }
    const char *what = (key & 2u) ? "write" : "read";
    const char *sz = size_class_name[(key >> 2) & 7u];
    const char *many = (key & (1u << 5)) ? ", many descriptors" : "";
    if (c->chosen < 0) {
        snprintf(buf, len, "calibrating: %s and %s take turns for %s %ss%s",
                 cost_name(agent, c->b[0]), cost_name(agent, c->b[1]), sz,
                 what, many);
        return;
    }
    int k = c->chosen;
    snprintf(buf, len, "cost: %s %.1f us < %s %.1f us per %s %s%s "
             "(%u, %u samples)", cost_name(agent, c->b[k]),
             path_cost(c, k) / 1e3, cost_name(agent, c->b[1 - k]),
             path_cost(c, 1 - k) / 1e3, sz, what, many, c->n[k],
             c->n[1 - k]);
}

void pdx_path_cost_free(pdx_peer_t *p)
{
    free(p->cost);
    p->cost = NULL;
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
    pdx_path_cost_free(p); /* new connections: measured afresh */
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
            /* A same-host host-memory backend may say why it cannot reach
             * some of the peer's host memory (cma without the right to
             * read the peer's memory): the report's reason, in its name. */
            if (be->ops->path(be->be, p->bpeer[k], NULL, p->transport[k],
                              sizeof(p->transport[k]), why,
                              sizeof(why)) != PDX_OK &&
                why[0] != '\0' && p->same_host &&
                (caps & PDX_BACKEND_CAP_SAME_HOST) &&
                !(caps & PDX_BACKEND_CAP_VRAM)) {
                snprintf(p->dram_why, sizeof(p->dram_why), "%s: %s",
                         be->name, why);
            }
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

