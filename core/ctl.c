/* Region-removal notices between agents: internal messages on the
 * notification channel that never reach the application's queue. Above
 * xfer (a notice fails requests on the region) and below progress (which
 * delivers them and drives the deregister wait). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_int.h"
#include "ctl_int.h"
#include "mem_int.h"
#include "xfer_int.h"

/* Region-removal notices. pdx_mem_deregister sends GONE (the region) to
 * each live loaded peer that carries notifications and waits for ACK: the
 * peer takes the region out of its table at once (lists and requests on
 * it are refused STALE) and acknowledges once none of its requests on it
 * is in flight, so nothing reads or writes the memory after deregister
 * returns (over UCX shared memory a get is served by the target's own
 * memcpy: a freed region there killed the target). The messages ride the
 * notification channel behind a prefix applications cannot send. Little
 * endian: prefix[8], u8 type, u64 sender instance, u64 seq, and for GONE
 * u8 mem type, u64 addr, u64 len, u32 the sender's generation without the
 * region (a blob of that generation or newer, loaded first, says it all
 * already: the notice is then acknowledged and ignored, so a region
 * registered again at the same place is not taken for the old one).
 * Everything received is checked. */
enum { CTL_GONE = 1, CTL_ACK = 2 };
#define CTL_HDR (8 + 1 + 8 + 8)
#define CTL_GONE_LEN (CTL_HDR + 1 + 8 + 8 + 4)
/* Longest pdx_mem_deregister waits for acknowledgements. */
#define CTL_WAIT_MAX_MS 5000

typedef struct pdx_ctl_ack {
    struct pdx_ctl_ack *next;
    uint64_t epoch; /* the peer incarnation that told us */
    uint64_t seq;
    pdx_peer_region_t *g; /* retired region (a user held), or NULL */
} pdx_ctl_ack_t;

static void put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (uint64_t)p[i] << (8 * i);
    }
    return v;
}

static size_t ctl_hdr(unsigned char *m, int type, uint64_t instance,
                      uint64_t seq)
{
    memcpy(m, pdx_ctl_prefix, sizeof(pdx_ctl_prefix));
    m[8] = (unsigned char)type;
    put_u64(m + 9, instance);
    put_u64(m + 17, seq);
    return CTL_HDR;
}

/* Does a backend carry messages to `p`? (Without one it learns of the
 * removal from the next blob; no error line per deregistration.) */
static bool reaches(pdx_agent_h agent, const pdx_peer_t *p)
{
    for (uint32_t b = 0; b < agent->nbackends; b++) {
        if (p->bpeer[b] != NULL &&
            (agent->backends[b]->ops->caps & PDX_BACKEND_CAP_NOTIF)) {
            return true;
        }
    }
    return false;
}

static pdx_peer_t *peer_by_epoch(pdx_agent_h agent, uint64_t epoch)
{
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        if (p->epoch == epoch) {
            return p;
        }
    }
    return NULL;
}

/* Does a request of ours to incarnation `epoch` with a backend request
 * still out use one of `g`'s keys? */
static bool region_busy(pdx_agent_h agent, uint64_t epoch,
                        const pdx_peer_region_t *g)
{
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->peer_epoch != epoch || x->breq == NULL) {
            continue;
        }
        for (size_t i = 0; i < x->niov; i++) {
            void *md = x->iov[i].remote_md;
            if (md != NULL && x->bindex >= 0 && md == g->rmd[x->bindex]) {
                return true;
            }
        }
    }
    return false;
}

/* Requests of ours that use `g` are never posted again (STALE); one in
 * flight runs to its end, and the acknowledgement waits for it. */
static void mark_stale(pdx_agent_h agent, uint64_t epoch,
                       const pdx_peer_region_t *g)
{
    for (struct pdx_xfer *x = agent->xfers; x != NULL; x = x->next) {
        if (x->peer_epoch != epoch || x->bindex < 0) {
            continue;
        }
        for (size_t i = 0; i < x->niov; i++) {
            void *md = x->iov[i].remote_md;
            if (md != NULL && md == g->rmd[x->bindex]) {
                x->stale = true;
                break;
            }
        }
    }
}

static void recv_gone(pdx_agent_h agent, pdx_peer_t *p, uint64_t seq,
                      const unsigned char *m)
{
    pdx_mem_type_t t = (pdx_mem_type_t)m[CTL_HDR];
    uint64_t addr = get_u64(m + CTL_HDR + 1);
    uint64_t len = get_u64(m + CTL_HDR + 9);
    const unsigned char *gp = m + CTL_HDR + 17;
    uint32_t gen = (uint32_t)gp[0] | (uint32_t)gp[1] << 8 |
                   (uint32_t)gp[2] << 16 | (uint32_t)gp[3] << 24;
    pdx_ctl_ack_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        pdx_error("agent %s: peer %s removed region 0x%llx+%llu: no memory "
                  "to note it (its requests end when the peer republishes)",
                  agent->name, p->name, (unsigned long long)addr,
                  (unsigned long long)len);
        return;
    }
    a->epoch = p->epoch;
    a->seq = seq;
    /* Generations wrap in 2^32 changes: compare by difference. */
    bool newer_loaded = (int32_t)(p->generation - gen) >= 0;
    pdx_peer_region_t *g =
        newer_loaded ? NULL : pdx_peer_region_find(p, t, addr, len);
    if (g != NULL && g->region.addr == addr && g->region.len == len) {
        pdx_info("agent %s: peer %s removed region 0x%llx+%llu: its lists "
                 "and requests are refused (STALE)", agent->name, p->name,
                 (unsigned long long)addr, (unsigned long long)len);
        g->users++; /* ours until the acknowledgement */
        pdx_peer_region_retire_locked(p, g);
        mark_stale(agent, p->epoch, g);
        a->g = g;
    } else {
        /* Unknown to us (never loaded, or a reload took it already):
         * nothing of ours can use it; acknowledge. */
        pdx_debug("agent %s: peer %s removed region 0x%llx+%llu we do not "
                  "hold", agent->name, p->name, (unsigned long long)addr,
                  (unsigned long long)len);
    }
    a->next = agent->ctl_acks;
    agent->ctl_acks = a;
}

static void recv_ack(pdx_agent_h agent, const char *peer, uint64_t seq)
{
    for (pdx_ctl_wait_t *w = agent->ctl_waits; w != NULL; w = w->next) {
        if (w->seq != seq) {
            continue;
        }
        for (size_t i = 0; i < w->n; i++) {
            if (!w->peers[i].done && strcmp(w->peers[i].name, peer) == 0) {
                w->peers[i].done = true;
                w->left--;
            }
        }
        return;
    }
}

bool pdx_ctl_recv_locked(pdx_agent_h agent, const char *peer,
                         const void *msg, size_t len)
{
    if (!pdx_ctl_reserved(msg, len)) {
        return false;
    }
    const unsigned char *m = msg;
    pdx_peer_t *p = pdx_peer_find(agent, peer);
    int type = len >= CTL_HDR ? m[8] : 0;
    if ((type == CTL_GONE && len != CTL_GONE_LEN) ||
        (type == CTL_ACK && len != CTL_HDR) ||
        (type != CTL_GONE && type != CTL_ACK)) {
        pdx_warn("agent %s: dropping a malformed %zu-byte control message "
                 "(type %d) from %s", agent->name, len, type, peer);
        return true;
    }
    uint64_t instance = get_u64(m + 9), seq = get_u64(m + 17);
    if (type == CTL_ACK) {
        recv_ack(agent, peer, seq);
        return true;
    }
    if (p == NULL || p->dead != PDX_OK || p->instance != instance) {
        /* Not (or no longer) the peer we loaded: nothing of ours uses
         * that incarnation's regions. It waits on us only if it loaded
         * us, and then it reaches us: acknowledge from here. */
        if (p != NULL && p->dead == PDX_OK && reaches(agent, p)) {
            unsigned char ack[CTL_HDR];
            (void)pdx_peer_send_locked(agent, p, ack,
                                        ctl_hdr(ack, CTL_ACK, agent->instance,
                                                seq));
        }
        return true;
    }
    recv_gone(agent, p, seq, m);
    return true;
}

void pdx_ctl_progress_locked(pdx_agent_h agent)
{
    pdx_ctl_ack_t **pa = &agent->ctl_acks;
    while (*pa != NULL) {
        pdx_ctl_ack_t *a = *pa;
        pdx_peer_t *p = peer_by_epoch(agent, a->epoch);
        if (p != NULL && a->g != NULL && p->dead == PDX_OK &&
            region_busy(agent, a->epoch, a->g)) {
            pa = &a->next;
            continue;
        }
        if (a->g != NULL) {
            pdx_peer_region_drop_locked(agent, a->g);
            pdx_peer_region_put_locked(a->g);
        }
        if (p != NULL && p->dead == PDX_OK && reaches(agent, p)) {
            unsigned char ack[CTL_HDR];
            pdx_status_t st = pdx_peer_send_locked(
                agent, p, ack, ctl_hdr(ack, CTL_ACK, agent->instance, a->seq));
            if (st != PDX_OK) {
                pdx_warn("agent %s: could not acknowledge a region removal "
                         "to %s: %s (it waits its bound)", agent->name,
                         p->name, pdx_status_string(st));
            }
        }
        *pa = a->next;
        free(a);
    }
}

void pdx_ctl_peer_destroyed_locked(pdx_agent_h agent, pdx_peer_t *peer)
{
    pdx_ctl_ack_t **pa = &agent->ctl_acks;
    while (*pa != NULL) {
        pdx_ctl_ack_t *a = *pa;
        if (a->epoch != peer->epoch) {
            pa = &a->next;
            continue;
        }
        if (a->g != NULL) {
            pdx_peer_region_drop_locked(agent, a->g);
            pdx_peer_region_put_locked(a->g);
        }
        *pa = a->next;
        free(a);
    }
}

/* Wait bound: the agent's request timeout (a request of a peer on the
 * region ends by then), at most CTL_WAIT_MAX_MS. */
uint64_t pdx_ctl_wait_bound_ms(pdx_agent_h agent)
{
    uint64_t ms = agent->params.xfer_timeout_ms;
    return ms == 0 || ms > CTL_WAIT_MAX_MS ? CTL_WAIT_MAX_MS : ms;
}

bool pdx_ctl_gone_begin_locked(pdx_agent_h agent,
                               const struct pdx_mem_reg *r, pdx_ctl_wait_t *w)
{
    size_t n = 0;
    for (pdx_peer_t *p = agent->peers; p != NULL; p = p->next) {
        n += p->dead == PDX_OK;
    }
    if (n == 0) {
        return false;
    }
    *w = (pdx_ctl_wait_t){.seq = ++agent->ctl_seq};
    w->peers = calloc(n, sizeof(*w->peers));
    if (w->peers == NULL) {
        pdx_warn("agent %s: deregister 0x%llx: no memory to tell peers; "
                 "they learn it from the next description",
                 agent->name, (unsigned long long)r->region.addr);
        return false;
    }
    unsigned char m[CTL_GONE_LEN];
    ctl_hdr(m, CTL_GONE, agent->instance, w->seq);
    m[CTL_HDR] = (unsigned char)r->region.mem_type;
    put_u64(m + CTL_HDR + 1, r->region.addr);
    put_u64(m + CTL_HDR + 9, r->region.len);
    for (int i = 0; i < 4; i++) {
        m[CTL_HDR + 17 + i] = (unsigned char)(agent->generation >> (8 * i));
    }
    for (pdx_peer_t *p = agent->peers; p != NULL && w->n < n; p = p->next) {
        if (p->dead != PDX_OK || !reaches(agent, p)) {
            continue;
        }
        if (pdx_peer_send_locked(agent, p, m, sizeof(m)) != PDX_OK) {
            continue; /* no channel: it learns from the next blob */
        }
        if (p->same_host && p->pid == (int32_t)getpid()) {
            /* An agent of this process: told, not waited for (it may
             * progress only on this very thread). */
            continue;
        }
        w->peers[w->n].epoch = p->epoch;
        snprintf(w->peers[w->n].name, sizeof(w->peers[w->n].name), "%s",
                 p->name);
        w->n++;
    }
    w->left = w->n;
    w->next = agent->ctl_waits;
    agent->ctl_waits = w;
    return true;
}

size_t pdx_ctl_gone_check_locked(pdx_agent_h agent, pdx_ctl_wait_t *w)
{
    for (size_t i = 0; i < w->n; i++) {
        pdx_peer_t *p = peer_by_epoch(agent, w->peers[i].epoch);
        if (!w->peers[i].done && (p == NULL || p->dead != PDX_OK)) {
            w->peers[i].done = true; /* gone: it reads nothing more */
            w->left--;
        }
    }
    return w->left;
}

void pdx_ctl_gone_end_locked(pdx_agent_h agent, const struct pdx_mem_reg *r,
                             pdx_ctl_wait_t *w, uint64_t start)
{
    for (size_t i = 0; i < w->n; i++) {
        if (!w->peers[i].done) {
            pdx_warn("agent %s: deregister 0x%llx+%llu: peer %s did not "
                     "acknowledge within %llu ms (it may still read the "
                     "memory until it loads our next description)",
                     agent->name, (unsigned long long)r->region.addr,
                     (unsigned long long)r->region.len, w->peers[i].name,
                     (unsigned long long)pdx_ctl_wait_bound_ms(agent));
        }
    }
    pdx_debug("agent %s: deregister 0x%llx: %zu peers told, waited %llu us",
              agent->name, (unsigned long long)r->region.addr, w->n,
              (unsigned long long)((pdx_now_ns() - start) / 1000));
    pdx_ctl_wait_t **pw = &agent->ctl_waits;
    while (*pw != w) {
        pw = &(*pw)->next;
    }
    *pw = w->next;
    free(w->peers);
}

/* pdx's control messages start with these bytes, which applications may
 * not send. */
const unsigned char pdx_ctl_prefix[8] = {0, 'P', 'D', 'X', 'C', 'T', 'L', 1};

bool pdx_ctl_reserved(const void *msg, size_t len)
{
    return msg != NULL && len >= sizeof(pdx_ctl_prefix) &&
           memcmp(msg, pdx_ctl_prefix, sizeof(pdx_ctl_prefix)) == 0;
}
