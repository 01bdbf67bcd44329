/* The MultiConnector: the connector's entry points per request, routed to
 * its children (kv_connector_int.h) in config order for a lookup and by
 * the match's source for a load; the records every child shares (loads,
 * freed requests, pending lookups) are kept here. */
#include <stdio.h>
#include <stdlib.h>

#include <pdx/log.h>
#include <pdx/notif.h>
#include <pdx/xfer.h>

#include "kv_call_int.h"
#include "kv_connector_int.h"
#include "kv_handoff_int.h"

/* `req` of an entry point, whose id must be valid (logged otherwise). */
static bool req_arg_ok(pdx_kv_connector_h c, const char *fn,
                       const pdx_kv_request_t *r)
{
    if (!pdx_arg_ok(r, fn, "req") ||
        !pdx_arg_ok(r->req_id, fn, "req->req_id")) {
        return false;
    }
    if (!kv_valid_req(r->req_id)) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: kv connector %s: req->req_id of %zu bytes is not "
                      "1..%d printable ASCII characters",
                      fn, c->cfg.agent_name, strnlen(r->req_id, 4096),
                      PDX_KV_REQ_ID_MAX - 1);
        return false;
    }
    if (r->nfull > 0 && r->hashes == NULL) {
        pdx_call_fail(PDX_ERR_INVALID, "%s: req->hashes is NULL (nfull %zu)",
                      fn, r->nfull);
        return false;
    }
    return true;
}

static size_t cap_tokens(const pdx_kv_request_t *r, size_t tokens)
{
    /* The last prompt token is always recomputed: its logits are needed. */
    size_t limit = r->prompt_tokens > 0 ? r->prompt_tokens - 1 : 0;
    return tokens < limit ? tokens : limit;
}

static pdx_status_t lookup(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                           pdx_kv_match_t *match_p)
{
    pdx_kv_match_t m = {0};
    pdx_status_t st = PDX_OK;
    if (c->store != NULL && r->params != NULL) {
        /* The handoff's agent, by name through the store (bounded). */
        kv_store_discover(c->store, r->params);
    }
    pthread_mutex_lock(&c->lock);
    /* The first child in config order that matches anything wins. */
    for (uint32_t i = 0; i < c->cfg.nchildren && m.blocks == 0 && !m.tail;
         i++) {
        kv_child_t *ch = c->order[i];
        if (ch == NULL || ch->ops->lookup == NULL) {
            continue;
        }
        st = ch->ops->lookup(ch, r, &m);
        if (st != PDX_OK) {
            break;
        }
    }
    if (st == PDX_OK) {
        kv_pending_forget(&c->pending, r->req_id);
        m.tokens = cap_tokens(r, m.blocks * c->block_tokens +
                                     (m.tail ? r->tail_tokens : 0));
        *match_p = m;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

pdx_status_t pdx_kv_lookup(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                           pdx_kv_match_t *match_p)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !PDX_ARG_OK(match_p, "match_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(lookup(c, r, match_p));
}

static kv_load_t *find_load(pdx_kv_connector_h c, const char *req)
{
    for (kv_load_t *l = c->loads; l != NULL; l = l->next) {
        if (strcmp(l->req, req) == 0) {
            return l;
        }
    }
    return NULL;
}

static kv_child_t *child_of_source(pdx_kv_connector_h c, pdx_kv_source_t s)
{
    return s == PDX_KV_SOURCE_REMOTE    ? c->remote_child
           : s == PDX_KV_SOURCE_OFFLOAD ? c->offload_child
                                        : NULL;
}

static pdx_status_t load(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const pdx_kv_match_t *m, const kv_load_opts_t *o,
                         const uint64_t *ids)
{
    pdx_status_t st, prepared = PDX_OK;
    kv_child_t *ch = child_of_source(c, m->source);
    if (ch != NULL && ch->ops->load_prepare != NULL &&
        (m->blocks > 0 || m->tail)) {
        prepared = ch->ops->load_prepare(ch, r, m, o, ids); /* no lock */
    }
    pthread_mutex_lock(&c->lock);
    if (find_load(c, r->req_id) != NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv: load %s: already loading", r->req_id);
        return PDX_ERR_EXISTS;
    }
    kv_load_t *rec = calloc(1, sizeof(*rec));
    if (rec == NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: load %s: out of memory",
                  c->cfg.agent_name, r->req_id);
        return PDX_ERR_NOMEM;
    }
    snprintf(rec->req, sizeof(rec->req), "%s", r->req_id);
    rec->tokens = m->tokens;
    pdx_kv_request_t r2 = *r;
    char *xparams = NULL;
    ch = NULL;
    if (m->blocks == 0 && !m->tail) {
        rec->status = PDX_OK;
    } else if (m->source == PDX_KV_SOURCE_REMOTE && c->store != NULL &&
               (xparams = kv_store_take_params(c->store, r->req_id)) !=
                   NULL) {
        /* The offload child's cross-node hit: a handoff from the owner's
         * pool, through the store. */
        r2.params = xparams;
        ch = c->offload_child;
    } else if (m->source == PDX_KV_SOURCE_REMOTE && r->params != NULL) {
        ch = c->remote_child;
    } else if (m->source == PDX_KV_SOURCE_OFFLOAD) {
        ch = c->offload_child;
    }
    if (m->blocks == 0 && !m->tail) {
        st = PDX_OK;
    } else if (ch != NULL && ch->ops->load != NULL) {
        rec->child = ch;
        st = ch->ops->load(ch, &r2, m, o, ids, prepared, rec);
    } else {
        pdx_error("kv connector %s: load %s: match source %d has no child "
                  "here to load from (remote needs req->params and a remote "
                  "child, offload an offload child)",
                  c->cfg.agent_name, r->req_id, (int)m->source);
        st = PDX_ERR_INVALID;
    }
    free(xparams);
    if (st != PDX_OK && st != PDX_ERR_NOT_FOUND) {
        kv_load_free(c, rec);
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    if (st == PDX_ERR_NOT_FOUND) {
        rec->status = st; /* reported by load_check under the policy */
    }
    rec->next = c->loads;
    c->loads = rec;
    pthread_mutex_unlock(&c->lock);
    return PDX_OK;
}

pdx_status_t pdx_kv_load(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const pdx_kv_match_t *m, const uint64_t *ids)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !PDX_ARG_OK(m, "match")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if ((m->blocks > 0 || m->tail) && !PDX_ARG_OK(ids, "block_ids")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (m->blocks > r->nfull || (m->tail && !r->has_tail)) {
        pdx_error("kv connector %s: load %s: match of %zu blocks%s exceeds "
                  "the request's %zu blocks%s",
                  c->cfg.agent_name, r->req_id, m->blocks,
                  m->tail ? " and a tail" : "", r->nfull,
                  r->has_tail ? " and a tail" : "");
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    kv_load_opts_t o = {0};
    PDX_LEAVE(load(c, r, m, &o, ids));
}

pdx_status_t pdx_kv_load_ex(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                            const pdx_kv_match_t *m,
                            const pdx_kv_load_params_t *p,
                            const uint64_t *ids)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !PDX_ARG_OK(m, "match")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    kv_load_opts_t o = {0};
    if (p != NULL && (p->field_mask & PDX_KV_LOAD_PARAM_FIRST_BLOCK)) {
        o.first = p->first_block;
    }
    if (p != NULL && (p->field_mask & PDX_KV_LOAD_PARAM_FLAGS)) {
        if (p->flags & ~PDX_KV_LOAD_F_LAYERED) {
            pdx_call_fail(PDX_ERR_INVALID, "%s: unknown flags 0x%x",
                          __func__, p->flags);
            PDX_LEAVE(PDX_ERR_INVALID);
        }
        o.layered = (p->flags & PDX_KV_LOAD_F_LAYERED) != 0;
    }
    size_t nb = m->blocks + (m->tail ? 1 : 0);
    if (o.first > nb) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: first block %zu is past the match's %zu blocks",
                      __func__, o.first, nb);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (nb > o.first && !PDX_ARG_OK(ids, "block_ids")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (m->blocks > r->nfull || (m->tail && !r->has_tail)) {
        pdx_error("kv connector %s: load %s: match of %zu blocks%s exceeds "
                  "the request's %zu blocks%s",
                  c->cfg.agent_name, r->req_id, m->blocks,
                  m->tail ? " and a tail" : "", r->nfull,
                  r->has_tail ? " and a tail" : "");
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(load(c, r, m, &o, ids));
}

pdx_status_t pdx_kv_load_abort(pdx_kv_connector_h c, const char *req_id)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(req_id, "req_id")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&c->lock);
    kv_load_t *l = find_load(c, req_id);
    if (l == NULL || l->aborted) {
        bool aborting = l != NULL;
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: load abort: %s request %.*s",
                  c->cfg.agent_name,
                  aborting ? "already aborting the load of"
                           : "no load is known of",
                  PDX_KV_REQ_ID_MAX, req_id);
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    l->aborted = true;
    if (kv_load_busy(l, c->nlayers)) {
        /* Asked, not waited for: the peer may still be answering, and
         * waiting here would hold every lock of this node meanwhile. A
         * push ends when its holder says it stopped. */
        if (l->xfer != NULL) {
            pdx_xfer_abort(l->xfer);
        }
        for (uint32_t i = 0; l->lxfer != NULL && i < c->nlayers; i++) {
            if (l->lxfer[i] != NULL) {
                pdx_xfer_abort(l->lxfer[i]);
            }
        }
        if (l->peer[0] != '\0') {
            kv_msg_send(c->agent, l->peer, "reject", l->peer_req);
        }
    }
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE(PDX_OK);
}

static pdx_status_t load_check(pdx_kv_connector_h c, const char *req_id,
                               size_t *tokens_p)
{
    pthread_mutex_lock(&c->lock);
    kv_load_t **pp = &c->loads;
    while (*pp != NULL && strcmp((*pp)->req, req_id) != 0) {
        pp = &(*pp)->next;
    }
    kv_load_t *l = *pp;
    if (l == NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: load check: no load of request %.*s is "
                  "known",
                  c->cfg.agent_name, PDX_KV_REQ_ID_MAX, req_id);
        return PDX_ERR_NOT_FOUND;
    }
    pdx_status_t st = l->child != NULL && l->child->ops->load_check != NULL
                          ? l->child->ops->load_check(l->child, l)
                          : l->status;
    if (st == PDX_INPROGRESS) {
        pthread_mutex_unlock(&c->lock);
        return st;
    }
    *pp = l->next;
    size_t tokens = l->tokens;
    if (l->aborted) {
        /* Final: no byte lands any more; the blocks are the caller's. The
         * load may have completed first (PDX_OK, data valid). */
        kv_load_free(c, l);
        pthread_mutex_unlock(&c->lock);
        if (st == PDX_OK) {
            *tokens_p = tokens;
            return PDX_OK;
        }
        pdx_error("kv connector %s: load %.*s: aborted (%s when it stopped)",
                  c->cfg.agent_name, PDX_KV_REQ_ID_MAX, req_id,
                  pdx_status_string(st));
        return PDX_ERR_CANCELED;
    }
    if (st != PDX_OK) {
        /* The remote child's failure policy is the connector's. */
        pdx_warn("kv: load %s failed: %s (policy %s)", req_id,
                 pdx_status_string(st),
                 c->remote && c->remote->failure_policy == PDX_KV_FAIL_FAIL
                     ? "fail" : "recompute");
        if (l->peer[0] != '\0') {
            kv_msg_send(c->agent, l->peer, "reject", l->peer_req);
        }
        if (c->remote == NULL ||
            c->remote->failure_policy == PDX_KV_FAIL_RECOMPUTE) {
            st = PDX_OK;
            tokens = 0;
        }
    }
    kv_load_free(c, l);
    pthread_mutex_unlock(&c->lock);
    if (st == PDX_OK) {
        *tokens_p = tokens;
    }
    return st;
}

pdx_status_t pdx_kv_load_check(pdx_kv_connector_h c, const char *req_id,
                               size_t *tokens_p)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(req_id, "req_id") ||
        !PDX_ARG_OK(tokens_p, "tokens_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(load_check(c, req_id, tokens_p));
}

pdx_status_t pdx_kv_save(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const uint64_t *ids)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r)) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if ((r->nfull > 0 || r->has_tail) && !PDX_ARG_OK(ids, "block_ids")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    kv_child_t *ch = c->offload_child;
    if (ch == NULL || ch->ops->save == NULL) {
        PDX_LEAVE(PDX_OK); /* no child saves */
    }
    pthread_mutex_lock(&c->lock);
    pdx_status_t st = ch->ops->save(ch, r, ids);
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE(st);
}

pdx_status_t pdx_kv_save_check(pdx_kv_connector_h c, const char *req_id)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(req_id, "req_id")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    kv_child_t *ch = c->offload_child;
    pdx_status_t st = PDX_OK;
    pthread_mutex_lock(&c->lock);
    if (ch != NULL && ch->ops->save_check != NULL) {
        st = ch->ops->save_check(ch, req_id);
    }
    pthread_mutex_unlock(&c->lock);
    if (st < 0) {
        pdx_error("kv connector %s: save %.*s failed: %s", c->cfg.agent_name,
                  PDX_KV_REQ_ID_MAX, req_id, pdx_status_string(st));
    }
    PDX_LEAVE(st);
}

/* The remote child writes the handoff; the offload child adds its part
 * first (from the pool: the slots it leases). */
static pdx_status_t request_finished(pdx_kv_connector_h c,
                                     const pdx_kv_request_t *r,
                                     const uint64_t *ids, size_t tokens,
                                     pdx_kv_handoff_from_t from,
                                     char **params_p)
{
    if (c->remote_child == NULL) {
        pdx_error("kv: request_finished %s: no remote child configured",
                  r->req_id);
        return PDX_ERR_UNSUPPORTED;
    }
    if (from == PDX_KV_FROM_POOL && c->pool == NULL) {
        pdx_error("kv connector %s: request_finished %s: a handoff from the "
                  "pool needs an offload child",
                  c->cfg.agent_name, r->req_id);
        return PDX_ERR_UNSUPPORTED;
    }
    kv_finish_t f = {.r = r, .ids = ids, .tokens = tokens, .from = from};
    kv_child_t *parts[] = {c->offload_child, c->remote_child};
    pdx_status_t st = PDX_OK;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]) && st == PDX_OK;
         i++) {
        kv_child_t *ch = parts[i];
        if (ch != NULL && ch->ops->request_finished != NULL) {
            st = ch->ops->request_finished(ch, &f);
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (st == PDX_ERR_NOMEM) {
        pdx_error("kv connector %s: request_finished %s: out of memory",
                  c->cfg.agent_name, r->req_id);
    }
    if (f.lease != NULL) { /* not taken by a held handoff */
        pdx_offload_release(c->pool, f.lease);
    }
    free(f.addrs);
    if (st == PDX_OK) {
        *params_p = f.params;
    }
    return st;
}

pdx_status_t pdx_kv_request_finished(pdx_kv_connector_h c,
                                     const pdx_kv_request_t *r,
                                     const uint64_t *ids, size_t tokens,
                                     pdx_kv_handoff_from_t from,
                                     char **params_p)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !PDX_ARG_OK(params_p, "params_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (from != PDX_KV_FROM_ARENA && from != PDX_KV_FROM_POOL) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: from %d is not a pdx_kv_handoff_from_t", __func__,
                      (int)from);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (from == PDX_KV_FROM_ARENA && (r->nfull > 0 || r->has_tail) &&
        !PDX_ARG_OK(ids, "block_ids")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    PDX_LEAVE(request_finished(c, r, ids, tokens, from, params_p));
}

pdx_status_t pdx_kv_reject(pdx_kv_connector_h c, const char *params)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(params, "params")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    kv_handoff_t h;
    pdx_status_t st = kv_handoff_parse(params, c->narenas, &h);
    if (st != PDX_OK) {
        PDX_LEAVE(st);
    }
    if (c->store != NULL) {
        kv_store_discover(c->store, params); /* the holder, by name */
    }
    st = kv_msg_send(c->agent, h.agent, "reject", h.req);
    if (st != PDX_OK) {
        pdx_error("kv connector %s: reject of %s: cannot notify %s: %s",
                  c->cfg.agent_name, h.req, h.agent, pdx_status_string(st));
    }
    kv_handoff_free(&h);
    PDX_LEAVE(st);
}

static void on_notif(void *arg, const char *peer, const void *msg, size_t len)
{
    pdx_kv_connector_h c = arg; /* c->lock is held by pdx_kv_progress */
    if (kv_store_on_note(c->store, peer, msg, len)) {
        return; /* cross-node offload messages */
    }
    char verb[16], req[PDX_KV_REQ_ID_MAX], rest[PDX_NOTIF_MAX];
    int k = kv_msg_parse_rest(msg, len, verb, req, rest, sizeof(rest));
    if (k < 0) {
        pdx_debug("kv: ignoring a %zu-byte message from %s", len, peer);
    }
    if (k <= 0) {
        return;
    }
    for (uint32_t i = 0; i < c->cfg.nchildren; i++) {
        kv_child_t *ch = c->order[i];
        if (ch != NULL && ch->ops->on_message != NULL &&
            ch->ops->on_message(ch, peer, verb, req, rest)) {
            return;
        }
    }
    pdx_debug("kv: %s for unknown request %s from %s", verb, req, peer);
}

int pdx_kv_progress(pdx_kv_connector_h c)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c)) {
        PDX_LEAVE_INT(PDX_ERR_INVALID);
    }
    int events = 0;
    pthread_mutex_lock(&c->lock);
    events += pdx_notif_poll(c->agent, on_notif, c);
    bool check_dead = false;
    events += kv_store_progress(c->store, &check_dead);
    uint64_t now = pdx_now_ns();
    kv_child_t *timers[] = {c->remote_child, c->offload_child};
    for (size_t i = 0; i < sizeof(timers) / sizeof(timers[0]); i++) {
        kv_child_t *ch = timers[i];
        if (ch != NULL && ch->ops->progress != NULL) {
            events += ch->ops->progress(ch, now, check_dead);
        }
    }
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE_INT(events);
}

int pdx_kv_poll_freed(pdx_kv_connector_h c, pdx_kv_freed_cb_t cb, void *arg)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c)) {
        PDX_LEAVE_INT(PDX_ERR_INVALID);
    }
    pthread_mutex_lock(&c->lock);
    kv_freed_t *list = c->freed;
    c->freed = c->freed_tail = NULL;
    pthread_mutex_unlock(&c->lock);
    int n = 0;
    while (list != NULL) {
        kv_freed_t *f = list;
        list = f->next;
        if (cb != NULL) {
            /* The caller's code: its own pdx calls record their own
             * errors, not this call's. */
            int d = pdx_call_suspend();
            cb(arg, f->req, f->why);
            pdx_call_resume(d);
        }
        free(f);
        n++;
    }
    PDX_LEAVE_INT(n);
}

size_t pdx_kv_held_requests(pdx_kv_connector_h c)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c)) {
        PDX_LEAVE_VAL(PDX_ERR_INVALID, 0);
    }
    size_t n = 0;
    pthread_mutex_lock(&c->lock);
    if (c->remote_child != NULL) {
        n = kv_remote_held(c->remote_child);
    }
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE_VAL(PDX_OK, n);
}

pdx_status_t pdx_kv_offload_stats(pdx_kv_connector_h c,
                                  pdx_offload_stats_t *stats_p)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(stats_p, "stats_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (c->pool == NULL) {
        pdx_error("kv connector %s: offload stats: no offload child",
                  c->cfg.agent_name);
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    PDX_LEAVE(pdx_offload_stats(c->pool, stats_p));
}

pdx_status_t pdx_kv_store_stats(pdx_kv_connector_h c,
                                pdx_kv_store_stats_t *stats_p)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(stats_p, "stats_p")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (c->store == NULL) {
        pdx_error("kv connector %s: store stats: no store section",
                  c->cfg.agent_name);
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    kv_store_stats(c->store, stats_p);
    PDX_LEAVE(PDX_OK);
}

/* ------------------------------------------------------------ layer-wise */

pdx_status_t pdx_kv_load_layer_check(pdx_kv_connector_h c, const char *req_id,
                                     uint32_t layer)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(req_id, "req_id")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    int li = kv_layer_index(c, layer);
    pthread_mutex_lock(&c->lock);
    kv_load_t *l = find_load(c, req_id);
    if (l == NULL || li < 0) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv connector %s: layer check: %s %.*s",
                  c->cfg.agent_name,
                  l == NULL ? "no load is known of request"
                            : "the layout has no such layer, in request",
                  PDX_KV_REQ_ID_MAX, req_id);
        PDX_LEAVE(PDX_ERR_NOT_FOUND);
    }
    /* The child's check moves the load on (and never drops the record). */
    pdx_status_t st = l->child != NULL && l->child->ops->load_check != NULL
                          ? l->child->ops->load_check(l->child, l)
                          : l->status;
    if (l->layer_ok != NULL && l->layer_ok[li] && st != PDX_OK &&
        st != PDX_INPROGRESS && !l->aborted) {
        st = PDX_OK; /* that layer landed before the failure */
    } else if (st == PDX_INPROGRESS && l->layer_ok != NULL &&
               l->layer_ok[li]) {
        st = PDX_OK;
    } else if (st != PDX_OK && st != PDX_INPROGRESS) {
        st = l->aborted ? PDX_ERR_CANCELED : st;
    }
    pthread_mutex_unlock(&c->lock);
    if (st != PDX_OK && st != PDX_INPROGRESS) {
        pdx_error("kv connector %s: layer %u of %.*s will not land: %s",
                  c->cfg.agent_name, layer, PDX_KV_REQ_ID_MAX, req_id,
                  pdx_status_string(st));
    }
    PDX_LEAVE(st);
}

pdx_status_t pdx_kv_push_expect(pdx_kv_connector_h c, const char *req_id,
                                const pdx_kv_push_expect_t *e,
                                const uint64_t *ids)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(req_id, "req_id") ||
        !PDX_ARG_OK(e, "e") || !PDX_ARG_OK(ids, "block_ids")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    uint64_t need = PDX_KV_PUSH_HOLDER | PDX_KV_PUSH_HOLDER_REQ |
                    PDX_KV_PUSH_NBLOCKS;
    if ((e->field_mask & need) != need || e->holder == NULL ||
        e->holder_req == NULL || !kv_valid_req(req_id) ||
        !kv_valid_req(e->holder_req) || e->nblocks == 0 ||
        strnlen(e->holder, PDX_NAME_MAX) >= PDX_NAME_MAX) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: kv connector %s: needs req_id, e->holder, "
                      "e->holder_req (1..%d printable characters) and "
                      "e->nblocks > 0",
                      __func__, c->cfg.agent_name, PDX_KV_REQ_ID_MAX - 1);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    for (size_t i = 0; i < e->nblocks; i++) {
        if (ids[i] >= pdx_layout_num_blocks(c->layout)) {
            pdx_call_fail(PDX_ERR_INVALID,
                          "%s: kv connector %s: block id %llu out of range",
                          __func__, c->cfg.agent_name,
                          (unsigned long long)ids[i]);
            PDX_LEAVE(PDX_ERR_INVALID);
        }
    }
    if (c->remote_child == NULL) {
        pdx_error("kv connector %s: push of %s: no remote child",
                  c->cfg.agent_name, req_id);
        PDX_LEAVE(PDX_ERR_UNSUPPORTED);
    }
    pthread_mutex_lock(&c->lock);
    if (find_load(c, req_id) != NULL) {
        pthread_mutex_unlock(&c->lock);
        pdx_error("kv: push of %s: already loading", req_id);
        PDX_LEAVE(PDX_ERR_EXISTS);
    }
    kv_load_t *rec = calloc(1, sizeof(*rec));
    pdx_status_t st = rec == NULL ? PDX_ERR_NOMEM : PDX_OK;
    if (rec != NULL) {
        snprintf(rec->req, sizeof(rec->req), "%s", req_id);
        rec->child = c->remote_child;
        rec->tokens = (e->field_mask & PDX_KV_PUSH_TOKENS) ? e->tokens : 0;
        st = kv_push_expect(c, req_id, e, ids, rec);
    }
    if (st == PDX_OK) {
        rec->next = c->loads;
        c->loads = rec;
    } else if (rec != NULL) {
        kv_load_free(c, rec);
    }
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE(st);
}

pdx_status_t pdx_kv_save_layer(pdx_kv_connector_h c,
                               const pdx_kv_request_t *r,
                               const pdx_kv_layer_save_t *s,
                               const uint64_t *ids)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !req_arg_ok(c, __func__, r) ||
        !PDX_ARG_OK(s, "s")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    uint64_t need = PDX_KV_LAYER_SAVE_LAYER | PDX_KV_LAYER_SAVE_NBLOCKS |
                    PDX_KV_LAYER_SAVE_TOKENS;
    if ((s->field_mask & need) != need) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: s->field_mask lacks layer, nblocks or tokens",
                      __func__);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    if (s->nblocks > 0 && !PDX_ARG_OK(ids, "block_ids")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    pdx_kv_layer_save_t ls = *s;
    if (!(s->field_mask & PDX_KV_LAYER_SAVE_FIRST_BLOCK)) {
        ls.first_block = 0;
    }
    if (!(s->field_mask & PDX_KV_LAYER_SAVE_LAST)) {
        ls.last = false;
    }
    if (kv_layer_index(c, ls.layer) < 0) {
        pdx_call_fail(PDX_ERR_INVALID,
                      "%s: kv connector %s: the layout has no layer %u",
                      __func__, c->cfg.agent_name, ls.layer);
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    for (size_t i = 0; i < ls.nblocks; i++) {
        if (ids[i] >= pdx_layout_num_blocks(c->layout)) {
            pdx_call_fail(PDX_ERR_INVALID,
                          "%s: kv connector %s: block id %llu out of range",
                          __func__, c->cfg.agent_name,
                          (unsigned long long)ids[i]);
            PDX_LEAVE(PDX_ERR_INVALID);
        }
    }
    pdx_status_t st = PDX_OK;
    kv_child_t *kids[] = {c->offload_child, c->remote_child};
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++) {
        if (kids[i] != NULL && kids[i]->ops->save_layer != NULL) {
            pdx_status_t s2 = kids[i]->ops->save_layer(kids[i], r, &ls, ids);
            st = st == PDX_OK ? s2 : st;
        }
    }
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE(st);
}

pdx_status_t pdx_kv_request_dropped(pdx_kv_connector_h c, const char *req_id)
{
    PDX_ENTER();
    if (!KV_CONN_OK(c) || !PDX_ARG_OK(req_id, "req_id")) {
        PDX_LEAVE(PDX_ERR_INVALID);
    }
    kv_child_t *kids[] = {c->offload_child, c->remote_child};
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < sizeof(kids) / sizeof(kids[0]); i++) {
        if (kids[i] != NULL && kids[i]->ops->request_dropped != NULL) {
            kids[i]->ops->request_dropped(kids[i], req_id);
        }
    }
    pthread_mutex_unlock(&c->lock);
    PDX_LEAVE(PDX_OK);
}
