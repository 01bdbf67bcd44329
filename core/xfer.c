/* Transfer requests, the calls above the progress pass: create (from
 * descriptor lists) and make (from prepared lists), with descriptor
 * resolution and merging and the backend choice; post, check, release,
 * abort, the notification and telemetry. How a request in flight is
 * checked and how it ends: xfer_progress.c and xfer_end.c. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "api_int.h"
#include "backend_int.h"
#include "ctl_int.h"
#include "dlist_int.h"
#include "mem_int.h"
#include "path_int.h"
#include "progress_int.h"
#include "xfer_int.h"


/* Hold users on the distinct local regions of a request, so a region in
 * use cannot be deregistered under it. */
static pdx_status_t hold_regs(struct pdx_xfer *x, struct pdx_mem_reg **regs,
                              size_t n)
{
    x->regs = n <= PDX_XFER_INLINE_REGS ? x->regs_inline
                                        : malloc(n * sizeof(*x->regs));
    if (x->regs == NULL) {
        return PDX_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        x->regs[i] = regs[i];
        regs[i]->users++;
    }
    x->nregs = n;
    return PDX_OK;
}

static struct pdx_xfer *xfer_new(pdx_agent_h agent, pdx_xfer_op_t op,
                                 pdx_peer_t *peer, const void *notif,
                                 size_t notif_len, size_t max_iov)
{
    struct pdx_xfer *x = NULL;
    if (agent->nxfer_cache > PDX_XFER_QUARANTINE) {
        /* The oldest released request: at least PDX_XFER_QUARANTINE
         * releases ago, so a stale handle to it was very likely refused
         * already. */
        x = agent->xfer_cache;
        agent->xfer_cache = x->next;
        if (agent->xfer_cache == NULL) {
            agent->xfer_cache_tail = NULL;
        }
        agent->nxfer_cache--;
        memset(x, 0, offsetof(struct pdx_xfer, why) + 1);
    } else if ((x = calloc(1, sizeof(*x))) == NULL) {
        return NULL;
    }
    x->agent = agent;
    x->op = op;
    x->bindex = -1;
    x->alt = -1;
    x->cls = -1;
    x->status = PDX_OK;
    /* Not snprintf: it cost a third of a one-descriptor make. */
    size_t nl = strnlen(peer->name, sizeof(x->peer_name) - 1);
    memcpy(x->peer_name, peer->name, nl);
    x->peer_name[nl] = '\0';
    x->peer_epoch = peer->epoch;
    x->pcache = peer;
    x->pcache_gen = agent->peer_del_gen;
    x->pstats = peer->stats;
    x->iov = max_iov <= PDX_XFER_INLINE_IOV
                 ? x->iov_inline
                 : malloc(max_iov * sizeof(*x->iov));
    if (x->iov == NULL) {
        free(x);
        return NULL;
    }
    if (notif != NULL) {
        x->notif = malloc(notif_len ? notif_len : 1);
        if (x->notif == NULL) {
            if (x->iov != x->iov_inline) {
                free(x->iov);
            }
            free(x);
            return NULL;
        }
        memcpy(x->notif, notif, notif_len);
        x->notif_len = notif_len;
    }
    x->magic = PDX_MAGIC_XFER;
    return x;
}

/* Free an iov array of `x` unless it is one of its inline ones. */
static void iov_free(struct pdx_xfer *x, pdx_backend_iov_t *v)
{
    if (v != x->iov_inline && v != x->iov_alt_inline) {
        free(v);
    }
}

/* The request keeps its backend: no cost class, no second iov. */
static void xfer_drop_alt(struct pdx_xfer *x)
{
    if (x->iov_alt != NULL) {
        iov_free(x, x->iov_alt);
    }
    x->iov_alt = NULL;
    x->alt = -1;
    x->cls = -1;
}

/* Agent's lock held (the request goes to the agent's cache, tagged dead). */
static void xfer_free(struct pdx_xfer *x)
{
    if (x == NULL) {
        return;
    }
    for (size_t i = 0; i < x->nregs; i++) {
        x->regs[i]->users--;
    }
    if (x->regs != x->regs_inline) {
        free(x->regs);
    }
    if (x->iov != NULL) {
        iov_free(x, x->iov);
    }
    xfer_drop_alt(x);
    free(x->notif);
    x->regs = NULL;
    x->iov = NULL;
    x->notif = NULL;
    x->magic = PDX_MAGIC_DEAD;
    pdx_agent_h agent = x->agent;
    x->next = NULL;
    if (agent->xfer_cache_tail != NULL) {
        agent->xfer_cache_tail->next = x;
    } else {
        agent->xfer_cache = x;
    }
    agent->xfer_cache_tail = x;
    if (++agent->nxfer_cache > PDX_XFER_CACHE_MAX) {
        struct pdx_xfer *old = agent->xfer_cache;
        agent->xfer_cache = old->next;
        agent->nxfer_cache--;
        free(old);
    }
}

/* Note the path of a new (lreg, rreg) pair of request `x`. */
static void xfer_note_path(pdx_agent_h agent, struct pdx_xfer *x,
                           const pdx_peer_t *p,
                           const struct pdx_mem_reg *lreg,
                           const pdx_peer_region_t *rreg)
{
    const char *why = NULL;
    /* With a cost class, the fallback as the same-host backend sees it
     * (both of the class's paths are fallbacks, for the same reason). */
    int b = x->bindex;
    if (x->alt >= 0 && (agent->backends[x->alt]->ops->caps &
                        PDX_BACKEND_CAP_SAME_HOST)) {
        b = x->alt;
    }
    x->paths |= rreg->slow[b] ? 2 : 1;
    int slow = pdx_path_fallback(agent, p, b, lreg, rreg, &why);
    if (slow != PDX_PATH_FAST && !(x->slow & (1u << slow))) {
        if (!x->fallback) {
            snprintf(x->why, sizeof(x->why), "%s%s",
                     slow == PDX_PATH_STAGED ? "staged through host memory: "
                                             : "",
                     why);
        }
        x->fallback = true;
        x->slow |= (uint8_t)(1u << slow);
    }
}

/* The path policy: a request that would fall back is refused. */
static pdx_status_t xfer_policy(pdx_agent_h agent, struct pdx_xfer *x,
                                const char *what)
{
    bool same_host = (x->slow & (1u << PDX_PATH_SAME_HOST_SLOW)) != 0;
    bool staged = (x->slow & (1u << PDX_PATH_STAGED)) != 0;
    uint32_t policy = agent->params.path_policy;
    if (!(same_host && policy >= PDX_PATH_POLICY_SAME_HOST_FAST) &&
        !(staged && policy >= PDX_PATH_POLICY_NATIVE)) {
        return PDX_OK;
    }
    if (x->pstats != NULL) {
        x->pstats->s.refused++;
    }
    agent->backends[x->bindex]->stats.refused++;
    if (same_host) {
        pdx_error("agent %s: %s: path policy %s: peer %s is on this host "
                  "but the fast path is refused (%s); %s would carry it",
                  agent->name, what,
                  policy == PDX_PATH_POLICY_NATIVE ? "native"
                                                   : "same_host_fast",
                  x->peer_name, x->why, agent->backends[x->bindex]->name);
    } else {
        pdx_error("agent %s: %s: path policy native: GPU memory to or from "
                  "peer %s would be %s; %s would carry it", agent->name,
                  what, x->peer_name, x->why,
                  agent->backends[x->bindex]->name);
    }
    return PDX_ERR_POLICY;
}

static void xfer_link(pdx_agent_h agent, struct pdx_xfer *x)
{
    x->prev = NULL;
    x->next = agent->xfers;
    if (agent->xfers != NULL) {
        agent->xfers->prev = x;
    }
    agent->xfers = x;
}

static void xfer_unlink(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->prev != NULL) {
        x->prev->next = x->next;
    } else {
        agent->xfers = x->next;
    }
    if (x->next != NULL) {
        x->next->prev = x->prev;
    }
}

/* Append one pair, merging with the last piece when both sides continue it
 * in the same regions; the same piece with the other backend's keys to
 * iov_alt (merged alike: keys are per region on every backend). */
static inline void iov_append(struct pdx_xfer *x, uint64_t laddr,
                              uint64_t raddr, uint64_t len, void *lmd,
                              void *rmd, void *almd, void *armd)
{
    if (x->niov > 0) {
        pdx_backend_iov_t *last = &x->iov[x->niov - 1];
        if (last->local_md == lmd && last->remote_md == rmd &&
            last->local_addr + last->len == laddr &&
            last->remote_addr + last->len == raddr) {
            last->len += len;
            if (x->iov_alt != NULL) {
                x->iov_alt[x->niov - 1].len += len;
            }
            return;
        }
    }
    if (x->iov_alt != NULL) {
        x->iov_alt[x->niov] = (pdx_backend_iov_t){.local_addr = laddr,
                                                  .remote_addr = raddr,
                                                  .len = len,
                                                  .local_md = almd,
                                                  .remote_md = armd};
    }
    x->iov[x->niov++] = (pdx_backend_iov_t){.local_addr = laddr,
                                            .remote_addr = raddr,
                                            .len = len,
                                            .local_md = lmd,
                                            .remote_md = rmd};
}

/* The backend of a new request, from its first pair: path.c's choice;
 * with a cost class (two backends compete), the request's size (a pass
 * over its `n` lengths, only then) picks the class and a second iov is
 * kept for the other backend. */
static pdx_status_t xfer_bind(pdx_agent_h agent, struct pdx_xfer *x,
                              pdx_peer_t *p, struct pdx_mem_reg *lreg,
                              pdx_peer_region_t *rreg, size_t n,
                              uint64_t (*len_of)(const void *, size_t),
                              const void *arg, const char *what)
{
    pdx_path_pick_t pk;
    pdx_path_choose(agent, p, x->op, lreg, rreg, &pk);
    if (pk.b < 0) {
        pdx_error("agent %s: %s: no backend reaches peer %s for this "
                  "memory", agent->name, what, p->name);
        return PDX_ERR_UNSUPPORTED;
    }
    if (pk.alt >= 0) {
        uint64_t total = 0;
        for (size_t i = 0; i < n; i++) {
            total += len_of(arg, i);
        }
        pdx_path_class(p, x->op, total, n, &pk);
    }
    x->bindex = pk.b;
    if (pk.alt >= 0 && pk.cls >= 0) {
        x->iov_alt = n <= PDX_XFER_INLINE_IOV
                         ? x->iov_alt_inline
                         : malloc(n * sizeof(*x->iov_alt));
        if (x->iov_alt != NULL) {
            x->alt = pk.alt;
            x->cls = pk.cls;
            x->cls_key = pk.key;
        }
    }
    return PDX_OK;
}

static uint64_t desc_len(const void *arg, size_t i)
{
    return ((const pdx_desc_t *)arg)[i].len;
}

typedef struct make_lens {
    const pdx_dlist_entry_t *le;
    const uint32_t *idx;
    size_t count;
} make_lens_t;

static uint64_t make_len(const void *arg, size_t i)
{
    const make_lens_t *m = arg;
    return m->idx[i] < m->count ? m->le[m->idx[i]].len : 0;
}

/* The other backend's keys for a pair; where it lacks one, the request
 * keeps its backend (no cost class). */
static void alt_keys(struct pdx_xfer *x, struct pdx_mem_reg *lreg,
                     pdx_peer_region_t *rreg, void **almd, void **armd)
{
    *almd = *armd = NULL;
    if (x->alt < 0) {
        return;
    }
    *almd = lreg->md[x->alt];
    *armd = rreg->rmd[x->alt];
    if (*almd == NULL || *armd == NULL) {
        xfer_drop_alt(x);
    }
}

static pdx_status_t check_notif(pdx_agent_h agent, const void *notif,
                                size_t len)
{
    if (notif != NULL && len > PDX_NOTIF_MAX) {
        pdx_error("agent %s: notification of %zu bytes over the %d limit",
                  agent->name, len, PDX_NOTIF_MAX);
        return PDX_ERR_TOO_LARGE;
    }
    if (pdx_ctl_reserved(notif, len)) {
        pdx_error("agent %s: notification starts with pdx's reserved "
                  "control prefix (\\0PDXCTL\\1)", agent->name);
        return PDX_ERR_INVALID;
    }
    return PDX_OK;
}

/* A READ lands in local memory, a WRITE in the peer's: neither may land in
 * a region registered PDX_REGION_F_READONLY. Logs and returns true when
 * this one would. */
static bool lands_readonly(pdx_agent_h agent, const char *what,
                           pdx_xfer_op_t op, size_t i,
                           const struct pdx_mem_reg *l,
                           const pdx_peer_region_t *r, const char *peer)
{
    const pdx_region_t *g = op == PDX_XFER_READ ? &l->region : &r->region;
    if (!(g->flags & PDX_REGION_F_READONLY)) {
        return false;
    }
    pdx_error("agent %s: %s: descriptor %zu: a %s would land in %s region "
              "0x%llx+%llu, registered read-only", agent->name, what, i,
              op == PDX_XFER_READ ? "READ" : "WRITE",
              op == PDX_XFER_READ ? "local" : peer,
              (unsigned long long)g->addr, (unsigned long long)g->len);
    return true;
}

pdx_status_t pdxi_xfer_create(pdx_agent_h agent, pdx_xfer_op_t op,
                             const pdx_desc_list_t *local,
                             const pdx_desc_list_t *remote, const char *peer,
                             const void *notif, size_t notif_len,
                             pdx_xfer_h *xfer_p)
{
    if (local->count != remote->count || local->count == 0 ||
        (op != PDX_XFER_READ && op != PDX_XFER_WRITE)) {
        pdx_error("agent %s: xfer create: invalid arguments (counts %zu/%zu)",
                  agent->name, local ? local->count : 0,
                  remote ? remote->count : 0);
        return PDX_ERR_INVALID;
    }
    pdx_status_t st = check_notif(agent, notif, notif_len);
    if (st != PDX_OK) {
        return st;
    }
    struct pdx_mem_reg **set = NULL;
    size_t nset = 0, capset = 0;
    struct pdx_xfer *x = NULL;
    pdx_agent_lock(agent);
    pdx_peer_t *p = pdx_peer_find(agent, peer);
    if (p == NULL) {
        pdx_error("agent %s: xfer create: unknown peer %s", agent->name, peer);
        st = PDX_ERR_NOT_FOUND;
        goto out;
    }
    x = xfer_new(agent, op, p, notif, notif_len, local->count);
    if (x == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    struct pdx_mem_reg *lreg = NULL, *last_l = NULL;
    pdx_peer_region_t *rreg = NULL, *last_r = NULL;
    for (size_t i = 0; i < local->count; i++) {
        const pdx_desc_t *l = &local->descs[i], *r = &remote->descs[i];
        if (l->len != r->len || l->len == 0) {
            pdx_error("agent %s: xfer create: descriptor %zu lengths %llu "
                      "and %llu", agent->name, i, (unsigned long long)l->len,
                      (unsigned long long)r->len);
            st = PDX_ERR_INVALID;
            goto err;
        }
        /* Reuse the last region when it holds this piece. */
        if (lreg == NULL || !pdx_region_holds(&lreg->region, l->addr, l->len)) {
            lreg = pdx_reg_find(agent, local->mem_type, l->addr, l->len);
            if (lreg == NULL) {
                pdx_error("agent %s: xfer create: local descriptor %zu "
                          "0x%llx+%llu is not in registered memory",
                          agent->name, i, (unsigned long long)l->addr,
                          (unsigned long long)l->len);
                st = PDX_ERR_NOT_FOUND;
                goto err;
            }
            if ((st = pdx_mem_reg_set_add(&set, &nset, &capset, lreg)) !=
                PDX_OK) {
                goto err;
            }
        }
        if (rreg == NULL || !pdx_region_holds(&rreg->region, r->addr, r->len)) {
            rreg = pdx_peer_region_find(p, remote->mem_type, r->addr, r->len);
            if (rreg == NULL) {
                pdx_error("agent %s: xfer create: remote descriptor %zu "
                          "0x%llx+%llu is not in memory peer %s registered",
                          agent->name, i, (unsigned long long)r->addr,
                          (unsigned long long)r->len, peer);
                st = PDX_ERR_NOT_FOUND;
                goto err;
            }
        }
        if ((lreg != last_l || rreg != last_r) &&
            lands_readonly(agent, "xfer create", op, i, lreg, rreg, peer)) {
            st = PDX_ERR_INVALID;
            goto err;
        }
        if (x->bindex < 0 &&
            (st = xfer_bind(agent, x, p, lreg, rreg, local->count, desc_len,
                            local->descs, "xfer create")) != PDX_OK) {
            goto err;
        }
        void *lmd = lreg->md[x->bindex], *rmd = rreg->rmd[x->bindex];
        void *almd, *armd;
        alt_keys(x, lreg, rreg, &almd, &armd);
        if (lmd == NULL || rmd == NULL) {
            pdx_error("agent %s: xfer create: descriptor %zu is not reachable "
                      "by backend %s like the rest", agent->name, i,
                      agent->backends[x->bindex]->name);
            st = PDX_ERR_UNSUPPORTED;
            goto err;
        }
        if (lreg != last_l || rreg != last_r) {
            xfer_note_path(agent, x, p, lreg, rreg);
            last_l = lreg;
            last_r = rreg;
        }
        x->bytes += l->len;
        iov_append(x, l->addr, r->addr, l->len, lmd, rmd, almd, armd);
    }
    x->ndescs = local->count;
    if ((st = xfer_policy(agent, x, "xfer create")) != PDX_OK) {
        goto err;
    }
    if ((st = hold_regs(x, set, nset)) != PDX_OK) {
        goto err;
    }
    xfer_link(agent, x);
    *xfer_p = x;
    st = PDX_OK;
    goto out;
err:
    xfer_free(x);
out:
    pthread_mutex_unlock(&agent->lock);
    free(set);
    return st;
}

pdx_status_t pdxi_xfer_abort(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    pdx_agent_lock(agent);
    if (x->status == PDX_INPROGRESS && x->breq != NULL && !x->aborting) {
        x->aborting = true;
        if (!pdx_xfer_backend_abort_locked(agent, x)) {
            pdx_xfer_end_locked(agent, x, PDX_ERR_CANCELED);
        }
        /* else completes through progress as PDX_ERR_CANCELED */
    }
    pthread_mutex_unlock(&agent->lock);
    return PDX_OK;
}

size_t pdxi_xfer_segments(pdx_xfer_h x) { return x->niov; }

pdx_status_t pdxi_xfer_set_notif(pdx_xfer_h x, const void *msg, size_t len)
{
    pdx_agent_h agent = x->agent;
    pdx_status_t st = check_notif(agent, msg, len);
    if (st != PDX_OK) {
        return st;
    }
    unsigned char *copy = NULL;
    if (msg != NULL) {
        copy = malloc(len ? len : 1);
        if (copy == NULL) {
            pdx_error("agent %s: set notif: out of memory", agent->name);
            return PDX_ERR_NOMEM;
        }
        memcpy(copy, msg, len);
    }
    pdx_agent_lock(agent);
    if (x->status == PDX_INPROGRESS || x->breq != NULL) {
        pthread_mutex_unlock(&agent->lock);
        free(copy);
        pdx_error("agent %s: set notif: the request to %s is in flight",
                  agent->name, x->peer_name);
        return PDX_ERR_BUSY;
    }
    free(x->notif);
    x->notif = copy;
    x->notif_len = copy != NULL ? len : 0;
    pthread_mutex_unlock(&agent->lock);
    return PDX_OK;
}

pdx_status_t pdxi_xfer_telemetry(pdx_xfer_h x, pdx_xfer_telemetry_t *t)
{
    pdx_agent_h agent = x->agent;
    memset(t, 0, sizeof(*t));
    pdx_agent_lock(agent);
    if (x->bindex >= 0) {
        struct pdx_backend *b = agent->backends[x->bindex];
        snprintf(t->backend, sizeof(t->backend), "%s", b->name);
        pdx_peer_t *p = pdx_peer_find(agent, x->peer_name);
        if (p != NULL && p->epoch == x->peer_epoch) {
            pdx_path_transport(agent, p, (uint32_t)x->bindex);
        }
        const char *tr = p != NULL && p->epoch == x->peer_epoch
                             ? p->transport[x->bindex]
                             : "";
        if ((b->ops->caps & PDX_BACKEND_CAP_SAME_HOST) &&
            !(b->ops->caps & PDX_BACKEND_CAP_VRAM)) {
            /* cma: which of its two ways the pieces took */
            tr = x->paths == 3 ? "memcpy+process_vm"
                 : x->paths == 2 ? "process_vm"
                                 : "memcpy";
        }
        snprintf(t->transport, sizeof(t->transport), "%s", tr);
    }
    t->fallback = x->fallback;
    snprintf(t->fallback_why, sizeof(t->fallback_why), "%s", x->why);
    pdx_peer_t *cp = x->cls >= 0 ? pdx_peer_find(agent, x->peer_name) : NULL;
    if (cp != NULL && cp->epoch == x->peer_epoch) {
        /* Which of two paths, and why: the measured costs first. */
        char cost[PDX_WHY_MAX];
        pdx_path_cost_why(agent, cp, x->cls, x->cls_key, cost, sizeof(cost));
        if (cost[0] != '\0') {
            snprintf(t->fallback_why, sizeof(t->fallback_why), "%s; %s",
                     cost, x->why);
        }
    }
    t->status = x->status;
    t->descs = x->ndescs;
    t->segments = x->niov;
    t->bytes = x->bytes;
    t->posts = x->nposts;
    /* Times only with telemetry (the metrics' timing is theirs). */
    if (agent->params.flags & PDX_AGENT_F_TELEMETRY) {
        t->start_time_ns = x->start_rt_ns;
        t->post_duration_ns = x->post_dur_ns;
        if (x->counted && x->done_ns >= x->post_ns && x->post_ns != 0) {
            t->xfer_duration_ns = x->done_ns - x->post_ns;
        }
    }
    pthread_mutex_unlock(&agent->lock);
    return PDX_OK;
}

pdx_status_t pdxi_xfer_make(pdx_agent_h agent, pdx_xfer_op_t op,
                           pdx_dlist_h local, const uint32_t *local_idx,
                           pdx_dlist_h remote, const uint32_t *remote_idx,
                           size_t n, const void *notif, size_t notif_len,
                           pdx_xfer_h *xfer_p)
{
    if (local->remote || !remote->remote || n == 0 ||
        local->agent != agent || remote->agent != agent ||
        (op != PDX_XFER_READ && op != PDX_XFER_WRITE)) {
        pdx_error("agent %s: xfer make: invalid arguments (%s%s%s%s%s)",
                  agent->name, local->remote ? "local list is remote " : "",
                  !remote->remote ? "remote list is local " : "",
                  n == 0 ? "no indices " : "",
                  local->agent != agent || remote->agent != agent
                      ? "list of another agent "
                      : "",
                  op != PDX_XFER_READ && op != PDX_XFER_WRITE ? "bad op" : "");
        return PDX_ERR_INVALID;
    }
    pdx_status_t st = check_notif(agent, notif, notif_len);
    if (st != PDX_OK) {
        return st;
    }
    struct pdx_xfer *x = NULL;
    pdx_agent_lock(agent);
    pdx_peer_t *p = pdx_peer_find(agent, remote->peer_name);
    if (p == NULL || p->epoch != remote->peer_epoch) {
        pdx_error("agent %s: xfer make: prepared list for %s is stale",
                  agent->name, remote->peer_name);
        st = PDX_ERR_STALE;
        goto out;
    }
    x = xfer_new(agent, op, p, notif, notif_len, n);
    if (x == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    const pdx_dlist_entry_t *le = local->entries, *re = remote->entries;
    make_lens_t lens = {le, local_idx, local->count};
    void *lreg_last = NULL, *rreg_last = NULL;
    void *lmd = NULL, *rmd = NULL, *almd = NULL, *armd = NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t li = local_idx[i], ri = remote_idx[i];
        if (li >= local->count || ri >= remote->count ||
            le[li].len != re[ri].len) {
            pdx_error("agent %s: xfer make: pair %zu (%u, %u) out of range "
                      "or of unequal length", agent->name, i, li, ri);
            st = PDX_ERR_INVALID;
            goto err;
        }
        if (le[li].region != lreg_last || re[ri].region != rreg_last) {
            struct pdx_mem_reg *lr = le[li].region;
            pdx_peer_region_t *rr = re[ri].region;
            if (rr->gone) {
                pdx_error("agent %s: xfer make: pair %zu: peer %s removed or "
                          "changed region 0x%llx+%llu since the list was "
                          "prepared", agent->name, i, remote->peer_name,
                          (unsigned long long)rr->region.addr,
                          (unsigned long long)rr->region.len);
                st = PDX_ERR_STALE;
                goto err;
            }
            if (lands_readonly(agent, "xfer make", op, i, lr, rr, p->name)) {
                st = PDX_ERR_INVALID;
                goto err;
            }
            if (x->bindex < 0 &&
                (st = xfer_bind(agent, x, p, lr, rr, n, make_len, &lens,
                                "xfer make")) != PDX_OK) {
                goto err;
            }
            lmd = lr->md[x->bindex];
            rmd = rr->rmd[x->bindex];
            alt_keys(x, lr, rr, &almd, &armd);
            if (lmd == NULL || rmd == NULL) {
                pdx_error("agent %s: xfer make: pair %zu is not reachable by "
                          "backend %s like the rest", agent->name, i,
                          agent->backends[x->bindex]->name);
                st = PDX_ERR_UNSUPPORTED;
                goto err;
            }
            xfer_note_path(agent, x, p, lr, rr);
            lreg_last = lr;
            rreg_last = rr;
        }
        x->bytes += le[li].len;
        iov_append(x, le[li].addr, re[ri].addr, le[li].len, lmd, rmd, almd,
                   armd);
    }
    x->ndescs = n;
    if ((st = xfer_policy(agent, x, "xfer make")) != PDX_OK) {
        goto err;
    }
    if ((st = hold_regs(x, local->regs, local->nregs)) != PDX_OK) {
        goto err;
    }
    if (x->niov < n / 2 && x->iov != x->iov_inline) {
        /* Give back what merging saved. */
        void *shrunk = realloc(x->iov, x->niov * sizeof(*x->iov));
        if (shrunk != NULL) {
            x->iov = shrunk;
        }
        if (x->iov_alt != NULL && x->iov_alt != x->iov_alt_inline &&
            (shrunk = realloc(x->iov_alt, x->niov * sizeof(*x->iov))) !=
                NULL) {
            x->iov_alt = shrunk;
        }
    }
    xfer_link(agent, x);
    *xfer_p = x;
    st = PDX_OK;
    goto out;
err:
    xfer_free(x);
out:
    pthread_mutex_unlock(&agent->lock);
    return st;
}

/* Requests of at most this many bytes are posted under the agent lock. */
#define POST_LOCKED_MAX 65536u

/* Post `x` (not in progress; looked at once): refuses a stale or dead
 * peer, else hands it to its backend, which runs without the lock
 * (callbacks are queued: the caller runs them). */
static pdx_status_t xfer_post_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    pdx_status_t st;
    pdx_peer_t *p = pdx_xfer_peer(agent, x);
    if (p == NULL || p->epoch != x->peer_epoch) {
        pdx_error("agent %s: xfer post: peer %s was %s since this request "
                  "was made", agent->name, x->peer_name,
                  p == NULL ? "unloaded" : "reloaded");
        st = x->status = PDX_ERR_STALE;
        return st;
    }
    if (x->stale) {
        pdx_error("agent %s: xfer post: peer %s removed or changed a region "
                  "this request uses since it was made", agent->name,
                  x->peer_name);
        st = x->status = PDX_ERR_STALE;
        return st;
    }
    if (p->dead != PDX_OK) {
        pdx_error("agent %s: xfer post: peer %s is gone (%s)", agent->name,
                  x->peer_name, p->dead_how);
        st = x->status = p->dead;
        return st;
    }
    if (x->breq != NULL) {
        pdx_error("agent %s: xfer post: the previous post to %s ended "
                  "(%s) but its data may still be moving; post again "
                  "later", agent->name, x->peer_name,
                  pdx_status_string(x->status));
        st = PDX_ERR_BUSY;
        return st;
    }

    if (x->cls >= 0) {
        /* Two backends compete: this post takes the one the cost class
         * says (calibrating: each in turn), measured now and then. */
        int want = pdx_path_post(p, x->cls, x->cls_key, &x->cost_t0,
                                 &x->cost_div);
        if (want < 0) {
            xfer_drop_alt(x);
        } else if (want != x->bindex) {
            pdx_backend_iov_t *v = x->iov;
            x->iov = x->iov_alt;
            x->iov_alt = v;
            x->alt = x->bindex;
            x->bindex = want;
        }
    }
    struct pdx_backend *b = agent->backends[x->bindex];
    int carries = !!(b->ops->caps & PDX_BACKEND_CAP_NOTIF);
    bool tele = (agent->params.flags & PDX_AGENT_F_TELEMETRY) != 0;
    bool timed = tele || agent->metrics_timed;
    uint64_t t0 = 0;
    if (tele) {
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        x->start_rt_ns = (uint64_t)rt.tv_sec * 1000000000ull +
                         (uint64_t)rt.tv_nsec;
    }
    if (timed) {
        t0 = pdx_now_ns();
    }
    x->timed = timed;
    x->posted = true;
    x->counted = false;
    x->aborting = false;
    x->nposts++;
    b->stats.requests++;
    b->stats.fallbacks += x->fallback;
    if (x->pstats != NULL) {
        x->pstats->s.requests++;
        x->pstats->s.fallbacks += x->fallback;
    }
    /* Without the agent lock: over UCX sm or tcp a post copies what fits
     * (megabytes), and other threads' calls must not wait for that. A
     * small one (POST_LOCKED_MAX) keeps the lock: dropping and retaking it
     * cost ~60 ns, a tenth of an 8 KiB request's post. */
    void *bpeer = p->bpeer[x->bindex];
    bool unlocked = x->bytes > POST_LOCKED_MAX;
    if (unlocked) {
        pdx_backend_unlock_begin(agent);
    }
    st = b->ops->xfer_post(b->be, bpeer, x->op, x->iov, x->niov,
                           carries ? x->notif : NULL,
                           carries ? x->notif_len : 0, &x->breq);
    if (unlocked) {
        pdx_backend_unlock_end(agent);
    }
    /* The timeout clock starts when the request is in flight (a request
     * done inside post needs none), on the coarse clock: the timeout may
     * end up to a tick late, never early. */
    x->post_ns = timed                   ? pdx_now_ns()
                 : st == PDX_INPROGRESS ? pdx_now_after_ns()
                                        : 0;
    if (timed) {
        x->post_dur_ns = x->post_ns - t0;
        x->post_ns = t0;
        pdx_hist_add(&b->metrics.post, x->post_dur_ns);
    }
    if (st == PDX_OK) {
        x->breq = NULL;
        st = pdx_xfer_finish_locked(agent, x, p);
    } else if (st != PDX_INPROGRESS) {
        x->breq = NULL;
        pdx_error("agent %s: xfer post to %s over %s: %s", agent->name,
                  x->peer_name, b->name, pdx_status_string(st));
    }
    pdx_xfer_end_locked(agent, x, st);
    return st;
}

/* Release `x`'s backend request, unlink and free it (to the cache). */
static void xfer_free_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->breq != NULL) {
        agent->backends[x->bindex]->ops->xfer_release(
            agent->backends[x->bindex]->be, x->breq);
        x->breq = NULL;
    }
    xfer_unlink(agent, x);
    xfer_free(x);
}

/* pdx_xfer_check of a request in flight without a progress thread runs a
 * full pass at most this often. */
#define FULL_PROGRESS_PERIOD_NS 100000ull

/* Progress `x`'s backend (without the agent lock: see struct pdx_agent),
 * then check `x`. Lock held, no backend busy; the lock is dropped and
 * retaken, so the caller keeps no pointer but `x`. When another thread
 * is progressing a backend, nothing is done: that thread's pass checks
 * every request. */
static void xfer_progress_own(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->breq == NULL || agent->be_busy) {
        return;
    }
    /* A polling caller progresses its request's backend at once (one
     * bounded call, without the lock), progress thread or not: waiting
     * for the thread to wake cost a request over UCX 60-120 us more than
     * UCX's own loop. The thread keeps out of the backends while callers
     * poll (the backend's caller_polls). */
    if (pdx_progress_backend_unlocked(agent, agent->backends[x->bindex],
                                      NULL)) {
        if (agent->thread_running) {
            /* Any change will do: a plain store, no locked add. */
            struct pdx_backend *b = agent->backends[x->bindex];
            __atomic_store_n(&b->caller_polls,
                             __atomic_load_n(&b->caller_polls,
                                             __ATOMIC_RELAXED) + 1,
                             __ATOMIC_RELEASE);
        }
    }
    pdx_xfer_progress_locked(agent, x);
}

pdx_status_t pdxi_xfer_post(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    pdx_status_t st;
    pdx_agent_lock(agent);
    if (x->status == PDX_INPROGRESS) {
        pdx_error("agent %s: xfer post: request still in progress",
                  agent->name);
        st = PDX_ERR_BUSY;
        goto out;
    }
    __atomic_store_n(&x->settled, 0, __ATOMIC_RELAXED);
    /* Ended (peer failed, timed out) but still being stopped: one more
     * look first (the lock is dropped in it, so before the peer lookup). */
    xfer_progress_own(agent, x);
    uint64_t nposts = x->nposts;
    st = xfer_post_locked(agent, x);
    if (st < 0 && x->nposts == nposts && x->bindex >= 0) {
        /* Refused before its backend saw it (peer gone, stale): an error
         * of its path for the metrics, not a post for the counters. */
        pdx_be_metrics_error(&agent->backends[x->bindex]->metrics, st);
    }
    /* Callbacks the post made (a peer error) now that x is consistent
     * (none are queued when it returned before the backend's post). */
    pdx_progress_run_deferred_locked(agent);
    pdx_xfer_settle_locked(x);
out:
    pthread_mutex_unlock(&agent->lock);
    return st;
}

pdx_status_t pdxi_xfer_check(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    /* The plain lock: while another thread progresses a backend (the
     * progress thread, or a check on another thread) this returns the
     * state as it is, without waiting for that call. */
    pthread_mutex_lock(&agent->lock);
    if (!agent->be_busy && (x->status == PDX_INPROGRESS || x->breq != NULL)) {
        /* Its own backend, progressed without the lock: O(1) per call. */
        xfer_progress_own(agent, x);
        if (x->status == PDX_INPROGRESS && !agent->be_busy &&
            !agent->thread_running &&
            pdx_now_ns() - agent->last_full_progress_ns >=
                FULL_PROGRESS_PERIOD_NS) {
            /* Liveness, timeouts and the other requests: at most every
             * FULL_PROGRESS_PERIOD_NS, so a polling caller stays cheap. */
            pdx_progress_locked(agent);
        }
    }
    pdx_status_t st = x->status;
    pdx_xfer_settle_locked(x);
    if (st < 0) {
        /* Said once in the log when it happened; here for the caller. */
        pdx_peer_t *p = pdx_peer_find(agent, x->peer_name);
        bool same = p != NULL && p->epoch == x->peer_epoch;
        pdx_call_note("agent %s: request to %s (%s over %s): %s%s%s%s",
                      agent->name, x->peer_name,
                      x->op == PDX_XFER_READ ? "read" : "write",
                      agent->backends[x->bindex]->name,
                      pdx_status_string(st),
                      st == PDX_ERR_REMOTE_DISCONNECT && same ? ": peer "
                                                              : "",
                      st == PDX_ERR_REMOTE_DISCONNECT && same ? p->dead_how
                                                              : "",
                      st == PDX_ERR_STALE
                          ? x->stale ? ": the peer removed or changed a "
                                       "region it uses"
                                     : ": the peer was unloaded or reloaded "
                                       "since it was made"
                          : "");
    }
    pthread_mutex_unlock(&agent->lock);
    return st;
}

/* pdx_xfer_release of a request still in flight waits (without the agent
 * lock) for the backend to say nothing more lands, at most this long. */
#define RELEASE_WAIT_MAX_NS 10000000000ull

void pdxi_xfer_release(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    pdx_agent_lock(agent);
    if (x->breq != NULL && x->status == PDX_INPROGRESS) {
        /* Still in flight: stop it and wait until the backend says no byte
         * of it can land, without the agent lock (other threads and peers
         * carry on). Bounded: backends give up on a silent peer (UCX fails
         * it after 1 s without progress). */
        if (!x->aborting) {
            x->aborting = true;
            if (!pdx_xfer_backend_abort_locked(agent, x)) {
                pdx_xfer_end_locked(agent, x, PDX_ERR_CANCELED);
            }
        }
        uint64_t start = pdx_now_ns();
        long sleep_ns = 2000;
        while (x->breq != NULL && x->status == PDX_INPROGRESS) {
            xfer_progress_own(agent, x);
            if (x->breq == NULL || x->status != PDX_INPROGRESS ||
                pdx_now_ns() - start > RELEASE_WAIT_MAX_NS) {
                break;
            }
            pthread_mutex_unlock(&agent->lock);
            struct timespec ts = {0, sleep_ns};
            nanosleep(&ts, NULL);
            sleep_ns = sleep_ns < 1000000 ? sleep_ns * 2 : 1000000;
            pdx_agent_lock(agent);
        }
        if (x->status == PDX_INPROGRESS) {
            pdx_xfer_end_locked(agent, x, PDX_ERR_CANCELED);
        }
    }
    xfer_free_locked(agent, x);
    pthread_mutex_unlock(&agent->lock);
}
