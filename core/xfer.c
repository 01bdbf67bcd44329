/* Transfer requests: descriptor resolution and merging, backend choice,
 * post/check/release, prepared lists. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "api_int.h"
#include "backend_int.h"
#include "dlist_int.h"
#include "mem_int.h"
#include "notif_int.h"
#include "path.h"
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
    if (x->iov != x->iov_inline) {
        free(x->iov);
    }
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

/* The end of a post: record it once in the backend's and peer's counters. */
static void xfer_end(pdx_agent_h agent, struct pdx_xfer *x, pdx_status_t st)
{
    x->status = st;
    if (st == PDX_INPROGRESS || x->counted || !x->posted) {
        return;
    }
    x->counted = true;
    if (agent->params.flags & PDX_AGENT_F_TELEMETRY) {
        x->done_ns = pdx_now_ns();
    }
    pdx_stats_t *bs = x->bindex >= 0 ? &agent->backends[x->bindex]->stats
                                     : NULL;
    pdx_stats_t *ps = x->pstats != NULL ? &x->pstats->s : NULL;
    for (int i = 0; i < 2; i++) {
        pdx_stats_t *s = i == 0 ? bs : ps;
        if (s == NULL) {
            continue;
        }
        if (st == PDX_OK) {
            s->completed++;
            s->bytes += x->bytes;
        } else if (st == PDX_ERR_CANCELED) {
            s->canceled++;
        } else {
            s->errors++;
            s->timeouts += st == PDX_ERR_TIMEOUT;
        }
    }
}

/* The loaded peer named by `x` (any epoch), or NULL: the cached one
 * while no peer has left the index since it was found. */
static pdx_peer_t *xfer_peer(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->pcache != NULL && x->pcache_gen == agent->peer_del_gen) {
        return x->pcache;
    }
    x->pcache = pdx_peer_find(agent, x->peer_name);
    x->pcache_gen = agent->peer_del_gen;
    return x->pcache;
}

/* Note the path of a new (lreg, rreg) pair of request `x`. */
static void xfer_note_path(pdx_agent_h agent, struct pdx_xfer *x,
                           const pdx_peer_t *p,
                           const struct pdx_mem_reg *lreg,
                           const pdx_peer_region_t *rreg)
{
    const char *why = NULL;
    x->paths |= rreg->slow[x->bindex] ? 2 : 1;
    if (pdx_path_fallback(agent, p, x->bindex, lreg, rreg, &why) &&
        !x->fallback) {
        x->fallback = true;
        snprintf(x->why, sizeof(x->why), "%s", why);
    }
}

/* The path policy: a request that would fall back is refused. */
static pdx_status_t xfer_policy(pdx_agent_h agent, struct pdx_xfer *x,
                                const char *what)
{
    if (!x->fallback ||
        agent->params.path_policy != PDX_PATH_POLICY_SAME_HOST_FAST) {
        return PDX_OK;
    }
    if (x->pstats != NULL) {
        x->pstats->s.refused++;
    }
    agent->backends[x->bindex]->stats.refused++;
    pdx_error("agent %s: %s: path policy same_host_fast: peer %s is on "
              "this host but the fast path is refused (%s); %s would carry "
              "it", agent->name, what, x->peer_name, x->why,
              agent->backends[x->bindex]->name);
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
 * in the same regions. */
static inline void iov_append(struct pdx_xfer *x, uint64_t laddr,
                              uint64_t raddr, uint64_t len, void *lmd,
                              void *rmd)
{
    if (x->niov > 0) {
        pdx_backend_iov_t *last = &x->iov[x->niov - 1];
        if (last->local_md == lmd && last->remote_md == rmd &&
            last->local_addr + last->len == laddr &&
            last->remote_addr + last->len == raddr) {
            last->len += len;
            return;
        }
    }
    x->iov[x->niov++] = (pdx_backend_iov_t){.local_addr = laddr,
                                            .remote_addr = raddr,
                                            .len = len,
                                            .local_md = lmd,
                                            .remote_md = rmd};
}

static pdx_status_t check_notif(pdx_agent_h agent, const void *notif,
                                size_t len)
{
    if (notif != NULL && len > PDX_NOTIF_MAX) {
        pdx_error("agent %s: notification of %zu bytes over the %d limit",
                  agent->name, len, PDX_NOTIF_MAX);
        return PDX_ERR_TOO_LARGE;
    }
    if (pdx_notif_reserved(notif, len)) {
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
        if (x->bindex < 0) {
            x->bindex = pdx_path_choose(agent, p, op, lreg, rreg);
            if (x->bindex < 0) {
                pdx_error("agent %s: xfer create: no backend reaches peer %s "
                          "for this memory", agent->name, peer);
                st = PDX_ERR_UNSUPPORTED;
                goto err;
            }
        }
        void *lmd = lreg->md[x->bindex], *rmd = rreg->rmd[x->bindex];
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
        iov_append(x, l->addr, r->addr, l->len, lmd, rmd);
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

/* Complete a request whose data landed: send the notification through a
 * message backend when the data backend carries none. */
static pdx_status_t xfer_finish(pdx_agent_h agent, struct pdx_xfer *x,
                                pdx_peer_t *peer)
{
    if (x->notif == NULL ||
        (agent->backends[x->bindex]->ops->caps & PDX_BACKEND_CAP_NOTIF)) {
        return PDX_OK;
    }
    return pdx_notif_send_locked(agent, peer, x->notif, x->notif_len);
}

void pdx_xfer_progress_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->breq == NULL) {
        return;
    }
    struct pdx_backend *b = agent->backends[x->bindex];
    pdx_status_t st = b->ops->xfer_check(b->be, x->breq);
    if (x->status != PDX_INPROGRESS) {
        /* Ended already (peer failed, timed out): the backend request
         * was aborted and is released once the backend says it ended. */
        if (st != PDX_INPROGRESS) {
            b->ops->xfer_release(b->be, x->breq);
            x->breq = NULL;
        }
        return;
    }
    if (st == PDX_INPROGRESS) {
        return;
    }
    b->ops->xfer_release(b->be, x->breq);
    x->breq = NULL;
    if (st == PDX_ERR_REMOTE_DISCONNECT) {
        /* A backend saw the peer gone (e.g. cma's ESRCH): every other
         * request to it fails too, and new posts are refused. */
        pdx_peer_t *p = xfer_peer(agent, x);
        if (p != NULL && p->epoch == x->peer_epoch) {
            xfer_end(agent, x, st);
            pdx_xfer_peer_gone_locked(agent, p, st, "transfer failed", false);
            return;
        }
    }
    if (st == PDX_OK && !x->aborting) {
        pdx_peer_t *p = xfer_peer(agent, x);
        if (p == NULL || p->epoch != x->peer_epoch) {
            st = PDX_ERR_STALE;
        } else {
            st = xfer_finish(agent, x, p);
        }
    }
    if (st < 0 && st != PDX_ERR_STALE && st != PDX_ERR_REMOTE_DISCONNECT) {
        /* Another error from a same-host peer whose process exited (e.g.
         * the notification's UCX connect found its shared memory gone):
         * the request ends as its exit's, like the others to it, rather
         * than with whatever the backend saw on the way. */
        pdx_peer_t *p = xfer_peer(agent, x);
        if (p != NULL && p->epoch == x->peer_epoch && p->dead == PDX_OK &&
            pdx_peer_pid_exited(p)) {
            xfer_end(agent, x, PDX_ERR_REMOTE_DISCONNECT);
            pdx_xfer_peer_exited_locked(agent, p, false);
            return;
        }
    }
    xfer_end(agent, x, st);
}

/* Ask the backend to stop `x`'s request without waiting. Returns false
 * when it has no abort op (then the request was released, blocking). */
static bool xfer_backend_abort(pdx_agent_h agent, struct pdx_xfer *x)
{
    struct pdx_backend *b = agent->backends[x->bindex];
    if (PDX_BE_HAS(b->ops, xfer_abort) &&
        b->ops->xfer_abort(b->be, x->breq) == PDX_OK) {
        return true;
    }
    b->ops->xfer_release(b->be, x->breq);
    x->breq = NULL;
    return false;
}

pdx_status_t pdxi_xfer_abort(pdx_xfer_h x)
{
    pdx_agent_h agent = x->agent;
    pdx_agent_lock(agent);
    if (x->status == PDX_INPROGRESS && x->breq != NULL && !x->aborting) {
        x->aborting = true;
        if (!xfer_backend_abort(agent, x)) {
            xfer_end(agent, x, PDX_ERR_CANCELED);
        }
        /* else completes through progress as PDX_ERR_CANCELED */
    }
    pthread_mutex_unlock(&agent->lock);
    return PDX_OK;
}

void pdx_xfer_fail_peer_locked(pdx_agent_h agent, uint64_t epoch,
                               pdx_status_t why, pdx_fail_mode_t mode)
{
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->peer_epoch != epoch) {
            continue;
        }
        bool was_live = x->status == PDX_INPROGRESS;
        if (was_live) {
            xfer_end(agent, x, why);
        }
        if (x->breq == NULL) {
            continue;
        }
        if (mode == PDX_FAIL_RELEASE) {
            /* The peer is being unloaded: backends want every request
             * released before the peer; release never waits for it. */
            agent->backends[x->bindex]->ops->xfer_release(
                agent->backends[x->bindex]->be, x->breq);
            x->breq = NULL;
        } else if (was_live && mode == PDX_FAIL_ABORT) {
            /* Stop it; progress releases it once the backend says it
             * ended (never waiting here, under the lock). From inside a
             * backend call (PDX_FAIL_MARK) the backend already ended it. */
            xfer_backend_abort(agent, x);
        }
    }
}

void pdx_xfer_peer_gone_locked(pdx_agent_h agent, pdx_peer_t *peer,
                               pdx_status_t why, const char *how,
                               bool in_backend)
{
    if (peer->dead != PDX_OK) {
        return;
    }
    peer->dead = why;
    snprintf(peer->dead_how, sizeof(peer->dead_how), "%s", how);
    peer->dead_ns = pdx_now_ns();
    if (peer->stats != NULL) {
        peer->stats->s.dead_events++;
    }
    pdx_warn("agent %s: peer %s (pid %d) is gone (%s): failing its requests",
             agent->name, peer->name, (int)peer->pid, how);
    pdx_peer_unwatch_pidfd_locked(agent, peer);
    if (!in_backend) {
        /* Backends drop the connection without waiting (UCX force-closes
         * the endpoint), so its requests end now, not after a drain. */
        for (uint32_t b = 0; b < agent->nbackends; b++) {
            const pdx_backend_ops_t *ops = agent->backends[b]->ops;
            if (peer->bpeer[b] != NULL && PDX_BE_HAS(ops, peer_failed)) {
                ops->peer_failed(agent->backends[b]->be, peer->bpeer[b]);
            }
        }
    }
    pdx_xfer_fail_peer_locked(agent, peer->epoch, why,
                              in_backend ? PDX_FAIL_MARK : PDX_FAIL_ABORT);
    pdx_agent_signal(agent);
}

void pdx_xfer_peer_exited_locked(pdx_agent_h agent, pdx_peer_t *p,
                                 bool in_backend)
{
    pdx_xfer_peer_gone_locked(agent, p, PDX_ERR_REMOTE_DISCONNECT,
                              "process exited", in_backend);
    p->dead_final = true;
}

static bool uses_rmd(const struct pdx_xfer *x, void *const *rmds, size_t n)
{
    if (rmds == NULL) {
        return true;
    }
    for (size_t i = 0; i < x->niov; i++) {
        for (size_t j = 0; j < n; j++) {
            if (x->iov[i].remote_md == rmds[j]) {
                return true;
            }
        }
    }
    return false;
}

void pdx_xfer_fail_rmds_locked(pdx_agent_h agent, uint64_t epoch,
                               void *const *rmds, size_t n)
{
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->peer_epoch != epoch || x->stale || !uses_rmd(x, rmds, n)) {
            continue;
        }
        x->stale = true;
        if (x->status == PDX_INPROGRESS) {
            xfer_end(agent, x, PDX_ERR_STALE);
        }
        if (x->breq != NULL) {
            /* The keys it uses are unloaded next: backends want their
             * requests released first; release never waits for the peer. */
            agent->backends[x->bindex]->ops->xfer_release(
                agent->backends[x->bindex]->be, x->breq);
            x->breq = NULL;
        }
    }
}

void pdx_xfer_timeouts_locked(pdx_agent_h agent, uint64_t now)
{
    uint64_t limit = (uint64_t)agent->params.xfer_timeout_ms * 1000000ull;
    if (limit == 0) {
        return;
    }
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->status == PDX_INPROGRESS && x->post_ns != 0 &&
            now > x->post_ns && now - x->post_ns > limit) {
            pdx_warn("agent %s: request to %s timed out after %u ms "
                     "(peer hung?)", agent->name, x->peer_name,
                     agent->params.xfer_timeout_ms);
            xfer_end(agent, x, PDX_ERR_TIMEOUT);
            if (x->breq != NULL) {
                /* Stopped in the background: progress releases it once
                 * the backend gives up on the peer. */
                xfer_backend_abort(agent, x);
            }
        }
    }
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
    t->status = x->status;
    t->descs = x->ndescs;
    t->segments = x->niov;
    t->bytes = x->bytes;
    t->posts = x->nposts;
    t->start_time_ns = x->start_rt_ns;
    t->post_duration_ns = x->post_dur_ns;
    if (x->counted && x->done_ns >= x->post_ns && x->post_ns != 0) {
        t->xfer_duration_ns = x->done_ns - x->post_ns;
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
    void *lreg_last = NULL, *rreg_last = NULL;
    void *lmd = NULL, *rmd = NULL;
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
            if (x->bindex < 0) {
                x->bindex = pdx_path_choose(agent, p, op, lr, rr);
                if (x->bindex < 0) {
                    pdx_error("agent %s: xfer make: no backend reaches peer "
                              "%s for this memory", agent->name, p->name);
                    st = PDX_ERR_UNSUPPORTED;
                    goto err;
                }
            }
            lmd = lr->md[x->bindex];
            rmd = rr->rmd[x->bindex];
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
        iov_append(x, le[li].addr, re[ri].addr, le[li].len, lmd, rmd);
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

pdx_status_t pdx_xfer_post_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    pdx_status_t st;
    pdx_peer_t *p = xfer_peer(agent, x);
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

    struct pdx_backend *b = agent->backends[x->bindex];
    int carries = !!(b->ops->caps & PDX_BACKEND_CAP_NOTIF);
    bool tele = (agent->params.flags & PDX_AGENT_F_TELEMETRY) != 0;
    uint64_t t0 = 0;
    if (tele) {
        struct timespec rt;
        clock_gettime(CLOCK_REALTIME, &rt);
        x->start_rt_ns = (uint64_t)rt.tv_sec * 1000000000ull +
                         (uint64_t)rt.tv_nsec;
        t0 = pdx_now_ns();
    }
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
    x->post_ns = tele                    ? pdx_now_ns()
                 : st == PDX_INPROGRESS ? pdx_now_after_ns()
                                        : 0;
    if (tele) {
        x->post_dur_ns = x->post_ns - t0;
        x->post_ns = t0;
    }
    if (st == PDX_OK) {
        x->breq = NULL;
        st = xfer_finish(agent, x, p);
    } else if (st != PDX_INPROGRESS) {
        x->breq = NULL;
        pdx_error("agent %s: xfer post to %s over %s: %s", agent->name,
                  x->peer_name, b->name, pdx_status_string(st));
    }
    xfer_end(agent, x, st);
    return st;
}

void pdx_xfer_free_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    if (x->breq != NULL) {
        agent->backends[x->bindex]->ops->xfer_release(
            agent->backends[x->bindex]->be, x->breq);
        x->breq = NULL;
    }
    xfer_unlink(agent, x);
    xfer_free(x);
}

void pdx_xfer_end_locked(pdx_agent_h agent, struct pdx_xfer *x,
                         pdx_status_t st)
{
    xfer_end(agent, x, st);
}

bool pdx_xfer_backend_abort_locked(pdx_agent_h agent, struct pdx_xfer *x)
{
    return xfer_backend_abort(agent, x);
}
