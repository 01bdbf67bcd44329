/* The remote P/D child: on the prefill side the handoffs it holds for a
 * reader (leases, heartbeats, done/reject), on the decode side the match
 * of handoff parameters and their READ (one request, arena by arena,
 * contiguous runs merged, the done notification riding on it). */
#include <stdio.h>
#include <stdlib.h>

#include <pdx/log.h>
#include <pdx/peer.h>
#include <pdx/xfer.h>

#include "kv_connector_int.h"
#include "kv_handoff_int.h"

/* A finished request whose blocks this node holds for its reader until
 * done, reject, the lease or the reader's death. */
typedef struct held_handoff {
    struct held_handoff *next;
    char req[PDX_KV_REQ_ID_MAX];
    char peer[PDX_NAME_MAX];
    uint64_t deadline_ns;
    pdx_offload_lease_h lease; /* FROM_POOL */
    uint64_t *ids;             /* FROM_ARENA: its blocks, for a late push */
    size_t nids;
} held_handoff_t;

typedef struct remote_child {
    kv_child_t base; /* first */
    held_handoff_t *held;
    kv_push_t *pushes; /* kv_push.c: layer-wise pushes of this node */
} remote_child_t;

static remote_child_t *remote_of(kv_child_t *ch)
{
    return (remote_child_t *)ch;
}

/* Reports request `req` freed (pdx_kv_poll_freed). */
static void report_freed(pdx_kv_connector_h c, const char *req,
                         pdx_kv_free_reason_t why)
{
    kv_freed_t *f = calloc(1, sizeof(*f));
    if (f != NULL) {
        snprintf(f->req, sizeof(f->req), "%s", req);
        f->why = why;
        if (c->freed_tail) {
            c->freed_tail->next = f;
        } else {
            c->freed = f;
        }
        c->freed_tail = f;
    }
}

/* Releases the blocks of h, forgets its push and reports the request
 * freed. */
static void free_held(kv_child_t *ch, held_handoff_t *h,
                      pdx_kv_free_reason_t why)
{
    pdx_kv_connector_h c = ch->conn;
    if (h->lease != NULL) {
        pdx_offload_release(c->pool, h->lease);
    }
    /* A reader that is done or gone wants no push any more. */
    kv_push_forget(c, &remote_of(ch)->pushes, h->req,
                   why != PDX_KV_FREED_DONE);
    report_freed(c, h->req, why);
    free(h->ids);
    free(h);
}

static held_handoff_t *find_held(remote_child_t *rc, const char *req)
{
    held_handoff_t *h = rc->held;
    while (h != NULL && strcmp(h->req, req) != 0) {
        h = h->next;
    }
    return h;
}

static size_t match_remote(kv_child_t *ch, const pdx_kv_request_t *r,
                           const kv_handoff_t *h, bool *tail_p)
{
    size_t k = 0;
    while (k < r->nfull && k < h->n &&
           pdx_block_hash_equal(&r->hashes[k], &h->hashes[k])) {
        k++;
    }
    *tail_p = ch->cfg->load_tail && k == r->nfull && k == h->n &&
              r->has_tail && h->has_tail &&
              r->tail_tokens == h->tail_tokens &&
              pdx_block_hash_equal(&r->tail_hash, &h->tail_hash);
    return k;
}

static pdx_status_t remote_lookup(kv_child_t *ch, const pdx_kv_request_t *r,
                                  pdx_kv_match_t *m)
{
    pdx_kv_connector_h c = ch->conn;
    kv_handoff_t h;
    if (r->params == NULL ||
        kv_handoff_parse(r->params, c->narenas, &h) != PDX_OK) {
        return PDX_OK;
    }
    if (pdx_peer_state(c->agent, h.agent) == PDX_OK) {
        bool tail;
        size_t k = match_remote(ch, r, &h, &tail);
        if (k > 0 || tail) {
            *m = (pdx_kv_match_t){.source = PDX_KV_SOURCE_REMOTE,
                                  .blocks = k, .tail = tail};
        }
    } else {
        pdx_warn("kv: lookup %s: peer %s not connected or dead", r->req_id,
                 h.agent);
    }
    kv_handoff_free(&h);
    return PDX_OK;
}

/* The descriptors of a READ of handoff h into the local blocks `ids`:
 * blocks [first, nb) of the match, in the arenas of layer index `li` (all
 * arenas when li < 0), contiguous runs merged as they are built: a
 * 128K-token request is 101 pieces, not 200k descriptors to write and
 * merge. Returns the count, or 0 with *st_p set for an id out of range. */
static size_t read_descs(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                         const kv_handoff_t *h, const pdx_kv_match_t *m,
                         size_t first, int li, const uint64_t *ids,
                         pdx_desc_t *l, pdx_desc_t *rm, pdx_status_t *st_p)
{
    size_t nb = m->blocks + (m->tail ? 1 : 0), j = 0;
    for (size_t a = 0; a < c->narenas; a++) {
        const pdx_arena_t *ar = &c->arenas[a];
        uint64_t bb = kv_arena_block_bytes(ar);
        if (li >= 0 && c->arena_li[a] != (uint32_t)li) {
            continue;
        }
        for (size_t b = first; b < nb; b++) {
            bool tail = b == m->blocks;
            uint64_t rid = tail ? h->tail_id : h->ids[b];
            uint64_t id = ids[b - first];
            if (id >= ar->num_blocks) {
                pdx_error("kv: load %s: local block id %llu out of range",
                          r->req_id, (unsigned long long)id);
                *st_p = PDX_ERR_INVALID;
                return 0;
            }
            uint64_t la = ar->base + id * ar->stride;
            uint64_t ra = h->pool ? rid + c->arena_off[a]
                                  : h->bases[a] + rid * h->strides[a];
            if (j > 0 && b > first && l[j - 1].addr + l[j - 1].len == la &&
                rm[j - 1].addr + rm[j - 1].len == ra) {
                l[j - 1].len += bb;
                rm[j - 1].len += bb;
                continue;
            }
            l[j] = (pdx_desc_t){.addr = la, .len = bb, .dev_id = ar->dev_id};
            rm[j] = (pdx_desc_t){
                .addr = ra, .len = bb,
                .dev_id = h->devs != NULL ? (uint32_t)h->devs[a] : 0};
            j++;
        }
    }
    *st_p = PDX_OK;
    return j;
}

/* One READ of `j` descriptors from h->agent, posted; `note` rides on it
 * (NULL: none). */
static pdx_status_t post_read(pdx_kv_connector_h c, const kv_handoff_t *h,
                              const char *req, pdx_desc_t *l, pdx_desc_t *rm,
                              size_t j, const char *note, pdx_xfer_h *x_p)
{
    /* The holder's arenas are in its memory type (GPU memory on each
     * arena's device where the handoff says so); its pool is host
     * memory. */
    pdx_desc_list_t ll = {pdx_layout_mem_type(c->layout), l, j};
    pdx_desc_list_t rl = {h->pool ? PDX_MEM_DRAM : h->mem, rm, j};
    pdx_status_t st =
        pdx_xfer_create(c->agent, PDX_XFER_READ, &ll, &rl, h->agent, note,
                        note ? strlen(note) : 0, x_p);
    if (st != PDX_OK) {
        pdx_error("kv connector %s: load %s: cannot prepare the read from "
                  "%s: %s",
                  c->cfg.agent_name, req, h->agent, pdx_status_string(st));
        return st;
    }
    st = pdx_xfer_post(*x_p);
    if (st < 0) {
        pdx_error("kv connector %s: load %s: the read from %s did not start: "
                  "%s",
                  c->cfg.agent_name, req, h->agent, pdx_status_string(st));
        pdx_xfer_release(*x_p);
        *x_p = NULL;
        return st;
    }
    return PDX_OK;
}

/* A layered READ: one transfer per layer that has descriptors. */
static pdx_status_t read_layered(pdx_kv_connector_h c,
                                 const pdx_kv_request_t *r,
                                 const kv_handoff_t *h,
                                 const pdx_kv_match_t *m, size_t first,
                                 const uint64_t *ids, pdx_desc_t *l,
                                 pdx_desc_t *rm, kv_load_t *rec)
{
    rec->lxfer = calloc(c->nlayers, sizeof(*rec->lxfer));
    rec->layer_ok = calloc(c->nlayers, 1);
    if (rec->lxfer == NULL || rec->layer_ok == NULL) {
        pdx_error("kv connector %s: load %s: out of memory", c->cfg.agent_name,
                  r->req_id);
        return PDX_ERR_NOMEM;
    }
    for (uint32_t li = 0; li < c->nlayers; li++) {
        pdx_status_t st;
        size_t j = read_descs(c, r, h, m, first, (int)li, ids, l, rm, &st);
        if (st != PDX_OK) {
            return st;
        }
        if (j == 0) {
            rec->layer_ok[li] = 1;
            continue;
        }
        st = post_read(c, h, r->req_id, l, rm, j, NULL, &rec->lxfer[li]);
        if (st != PDX_OK) {
            return st; /* the posted ones go with the record */
        }
    }
    return PDX_OK;
}

pdx_status_t kv_remote_read(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                            const pdx_kv_match_t *m, const kv_load_opts_t *o,
                            const uint64_t *ids, kv_load_t *rec)
{
    kv_handoff_t h;
    pdx_status_t st = kv_handoff_parse(r->params, c->narenas, &h);
    if (st != PDX_OK) {
        return st;
    }
    size_t first = o ? o->first : 0;
    size_t nb = m->blocks + (m->tail ? 1 : 0);
    size_t n = (nb > first ? nb - first : 1) * c->narenas;
    pdx_desc_t *l = NULL, *rm = NULL;
    if (first >= nb) {
        /* This node has all of it already: the holder may free now. */
        rec->status = PDX_OK;
        kv_msg_send(c->agent, h.agent, "done", h.req);
        goto out;
    }
    if (m->blocks > h.n || (m->tail && !h.has_tail)) {
        /* A match that is not this handoff's: never index past it. */
        pdx_error("kv connector %s: load %s: match of %zu blocks%s exceeds "
                  "the handoff's %zu blocks%s",
                  c->cfg.agent_name, r->req_id, m->blocks,
                  m->tail ? " and a tail" : "", h.n,
                  h.has_tail ? " and a tail" : "");
        st = PDX_ERR_INVALID;
        goto out;
    }
    l = malloc(n * sizeof(*l));
    rm = malloc(n * sizeof(*rm));
    if (l == NULL || rm == NULL) {
        pdx_error("kv connector %s: load %s: out of memory for %zu "
                  "descriptors",
                  c->cfg.agent_name, r->req_id, n);
        st = PDX_ERR_NOMEM;
        goto out;
    }
    if (o != NULL && o->layered) {
        st = read_layered(c, r, &h, m, first, ids, l, rm, rec);
    } else {
        size_t j = read_descs(c, r, &h, m, first, -1, ids, l, rm, &st);
        char note[128];
        kv_msg_format(note, sizeof(note), "done", h.req);
        if (st == PDX_OK) {
            st = post_read(c, &h, r->req_id, l, rm, j, note, &rec->xfer);
        }
        if (st == PDX_OK) {
            pdx_debug("kv: load %s: %zu blocks from %s in %zu pieces",
                      r->req_id, nb - first, h.agent,
                      pdx_xfer_segments(rec->xfer));
        }
    }
    if (st == PDX_OK) {
        snprintf(rec->peer, sizeof(rec->peer), "%s", h.agent);
        snprintf(rec->peer_req, sizeof(rec->peer_req), "%s", h.req);
        rec->status = PDX_INPROGRESS;
        rec->last_hb_ns = pdx_now_ns();
    }
out:
    free(l);
    free(rm);
    kv_handoff_free(&h);
    return st;
}

/* A layered READ's check: each layer marked as it lands; the first error
 * stops the others; the holder told "done" once every layer landed. */
static pdx_status_t layered_check(pdx_kv_connector_h c, kv_load_t *l)
{
    bool busy = false;
    for (uint32_t i = 0; i < c->nlayers; i++) {
        if (l->lxfer[i] == NULL) {
            continue;
        }
        pdx_status_t st = pdx_xfer_check(l->lxfer[i]);
        if (st == PDX_INPROGRESS) {
            busy = true;
            continue;
        }
        pdx_xfer_release(l->lxfer[i]);
        l->lxfer[i] = NULL;
        if (st == PDX_OK) {
            l->layer_ok[i] = 1;
        } else if (l->status == PDX_INPROGRESS) {
            l->status = st; /* the rest asked to stop */
            for (uint32_t k = 0; k < c->nlayers; k++) {
                if (l->lxfer[k] != NULL) {
                    pdx_xfer_abort(l->lxfer[k]);
                }
            }
        }
    }
    if (busy) {
        return PDX_INPROGRESS;
    }
    if (l->status == PDX_INPROGRESS) {
        l->status = PDX_OK;
        kv_msg_send(c->agent, l->peer, "done", l->peer_req);
    }
    return l->status;
}

pdx_status_t kv_remote_read_check(kv_child_t *ch, kv_load_t *l)
{
    if (l->push) {
        return kv_push_load_check(ch->conn, l);
    }
    if (l->lxfer != NULL) {
        return layered_check(ch->conn, l);
    }
    if (l->xfer != NULL) {
        l->status = pdx_xfer_check(l->xfer);
        if (l->status != PDX_INPROGRESS) {
            pdx_xfer_release(l->xfer);
            l->xfer = NULL;
        }
    }
    return l->status;
}

static pdx_status_t remote_load(kv_child_t *ch, const pdx_kv_request_t *r,
                                const pdx_kv_match_t *m,
                                const kv_load_opts_t *o, const uint64_t *ids,
                                pdx_status_t prepared, kv_load_t *l)
{
    (void)prepared;
    return kv_remote_read(ch->conn, r, m, o, ids, l);
}

/* The handoff parameters of a finished request: where its blocks are (the
 * arenas, or the pool slots the offload child leased), and a held entry
 * that keeps them until the reader is done. */
static pdx_status_t remote_request_finished(kv_child_t *ch, kv_finish_t *f)
{
    remote_child_t *rc = remote_of(ch);
    pdx_kv_connector_h c = ch->conn;
    const pdx_kv_request_t *r = f->r;
    pdx_status_t st = PDX_OK;
    cJSON *root = cJSON_CreateObject();
    held_handoff_t *h = calloc(1, sizeof(*h));
    if (root == NULL || h == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    cJSON_AddStringToObject(root, "agent", c->cfg.agent_name);
    cJSON_AddStringToObject(root, "req", r->req_id);
    cJSON_AddStringToObject(root, "source",
                            f->from == PDX_KV_FROM_POOL ? "pool" : "arena");
    size_t n = r->nfull;
    if (f->from == PDX_KV_FROM_POOL) {
        h->lease = f->lease; /* ours now */
        f->lease = NULL;
        n = f->n_addrs;
        kv_json_add_u64s(root, "addrs", f->addrs, n);
    } else {
        kv_json_add_u64s(root, "ids", f->ids, n);
        uint64_t *v = malloc(c->narenas * 2 * sizeof(*v));
        if (v == NULL) {
            st = PDX_ERR_NOMEM;
            goto out;
        }
        for (size_t a = 0; a < c->narenas; a++) {
            v[a] = c->arenas[a].base;
            v[c->narenas + a] = c->arenas[a].stride;
        }
        kv_json_add_u64s(root, "bases", v, c->narenas);
        kv_json_add_u64s(root, "strides", v + c->narenas, c->narenas);
        if (pdx_layout_mem_type(c->layout) == PDX_MEM_VRAM) {
            /* The reader names our GPU memory, on each arena's device. */
            cJSON_AddStringToObject(root, "memory", "vram");
            for (size_t a = 0; a < c->narenas; a++) {
                v[a] = c->arenas[a].dev_id;
            }
            kv_json_add_u64s(root, "devices", v, c->narenas);
        }
        free(v);
        if (r->has_tail) {
            char hex[2 * PDX_OFFLOAD_KEY_MAX + 1], id[24];
            pdx_block_hash_to_hex(&r->tail_hash, hex, sizeof(hex));
            snprintf(id, sizeof(id), "%llu", (unsigned long long)f->ids[n]);
            cJSON *t = cJSON_AddObjectToObject(root, "tail");
            cJSON_AddStringToObject(t, "hash", hex);
            cJSON_AddStringToObject(t, "id", id);
            cJSON_AddNumberToObject(t, "tokens", r->tail_tokens);
        }
    }
    size_t covered = n * c->block_tokens +
                     (f->from == PDX_KV_FROM_ARENA && r->has_tail
                          ? r->tail_tokens : 0);
    cJSON_AddNumberToObject(
        root, "tokens", (double)(f->tokens < covered ? f->tokens : covered));
    cJSON *hs = cJSON_AddArrayToObject(root, "hashes");
    for (size_t i = 0; i < n; i++) {
        char hex[2 * PDX_OFFLOAD_KEY_MAX + 1];
        pdx_block_hash_to_hex(&r->hashes[i], hex, sizeof(hex));
        cJSON_AddItemToArray(hs, cJSON_CreateString(hex));
    }
    if (f->has_offload_blocks) {
        /* The offload child's part: how much of this request the local
         * pool holds, so a router can prefer this node next turn. */
        cJSON *off = cJSON_CreateObject();
        if (off == NULL) {
            st = PDX_ERR_NOMEM;
            goto out;
        }
        cJSON_AddNumberToObject(off, "offload_blocks",
                                (double)f->offload_blocks);
        st = kv_params_merge(root, off, "remote", "offload");
        cJSON_Delete(off);
        if (st != PDX_OK) {
            goto out;
        }
    }
    char *text = cJSON_PrintUnformatted(root);
    if (text == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    snprintf(h->req, sizeof(h->req), "%s", r->req_id);
    snprintf(h->peer, sizeof(h->peer), "%s", c->cfg.peer_name);
    h->deadline_ns = pdx_now_ns() + (uint64_t)ch->cfg->lease_ms * 1000000ull;
    h->next = rc->held;
    rc->held = h;
    f->params = text;
    if (f->from == PDX_KV_FROM_ARENA) {
        /* A decode node that asked for a push gets the rest now, whole
         * (or when its ask arrives: the ids are kept for it). */
        h->nids = n + (r->has_tail ? 1 : 0);
        h->ids = malloc(h->nids * sizeof(*h->ids));
        if (h->ids != NULL) {
            memcpy(h->ids, f->ids, h->nids * sizeof(*h->ids));
        }
        kv_push_finished(c, rc->pushes, r->req_id, f->ids, h->nids);
    }
    bool pushing;
    kv_push_state_t ps = kv_push_state(rc->pushes, r->req_id, &pushing);
    if (ps != KV_PUSH_NONE) {
        /* Its push ended before: nobody reads these blocks any more. */
        rc->held = h->next;
        free_held(ch, h,
                  ps == KV_PUSH_DONE ? PDX_KV_FREED_DONE
                                     : PDX_KV_FREED_REJECT);
    }
    h = NULL;
out:
    if (h != NULL) {
        if (h->lease) {
            pdx_offload_release(c->pool, h->lease);
        }
        free(h);
    }
    cJSON_Delete(root);
    return st;
}

static bool remote_on_message(kv_child_t *ch, const char *peer,
                              const char *verb, const char *req,
                              const char *rest)
{
    remote_child_t *rc = remote_of(ch);
    bool reject = strcmp(verb, "reject") == 0;
    if (!reject &&
        kv_push_on_message(ch->conn, &rc->pushes, peer, verb, req, rest)) {
        held_handoff_t *h = find_held(rc, req);
        if (h != NULL && h->ids != NULL) {
            /* Asked after the request finished here: pushed whole. */
            kv_push_finished(ch->conn, rc->pushes, req, h->ids, h->nids);
        }
        return true;
    }
    held_handoff_t **pp = &rc->held;
    while (*pp != NULL && strcmp((*pp)->req, req) != 0) {
        pp = &(*pp)->next;
    }
    if (*pp == NULL) {
        /* A reject before the request finished here stops its push. */
        return reject && kv_push_on_message(ch->conn, &rc->pushes, peer,
                                            verb, req, rest);
    }
    held_handoff_t *h = *pp;
    snprintf(h->peer, sizeof(h->peer), "%s", peer); /* its reader */
    if (strcmp(verb, "hb") == 0) {
        h->deadline_ns =
            pdx_now_ns() + (uint64_t)ch->cfg->lease_ms * 1000000ull;
    } else if (strcmp(verb, "done") == 0 || strcmp(verb, "reject") == 0) {
        *pp = h->next;
        pdx_debug("kv: %s freed by %s (%s)", req, peer, verb);
        free_held(ch, h,
                  verb[0] == 'd' ? PDX_KV_FREED_DONE : PDX_KV_FREED_REJECT);
    }
    return true;
}

/* A push ended: the blocks it held for its reader are free. */
static void on_push_end(void *arg, const char *req, kv_push_state_t how)
{
    kv_child_t *ch = arg;
    remote_child_t *rc = remote_of(ch);
    for (held_handoff_t **pp = &rc->held; *pp != NULL; pp = &(*pp)->next) {
        if (strcmp((*pp)->req, req) == 0) {
            held_handoff_t *h = *pp;
            *pp = h->next;
            free_held(ch, h,
                      how == KV_PUSH_DONE ? PDX_KV_FREED_DONE
                                          : PDX_KV_FREED_REJECT);
            return;
        }
    }
}

static int remote_progress(kv_child_t *ch, uint64_t now, bool check_dead)
{
    remote_child_t *rc = remote_of(ch);
    pdx_kv_connector_h c = ch->conn;
    int events = kv_push_progress(c, &rc->pushes, now, on_push_end, ch);
    for (held_handoff_t **pp = &rc->held; *pp != NULL;) {
        held_handoff_t *h = *pp;
        if (now > h->deadline_ns) {
            *pp = h->next;
            pdx_warn("kv: lease of %s expired (peer %s never read it or "
                     "died): freeing its blocks", h->req, h->peer);
            free_held(ch, h, PDX_KV_FREED_EXPIRED);
            events++;
        } else if (check_dead && h->peer[0] != '\0' &&
                   pdx_peer_state(c->agent, h->peer) ==
                       PDX_ERR_REMOTE_DISCONNECT) {
            /* Its reader is gone (store lease or connection): free now
             * rather than at the handoff lease. */
            *pp = h->next;
            pdx_warn("kv: reader %s of %s is gone: freeing its blocks",
                     h->peer, h->req);
            kv_store_note_peer_gone(c->store);
            free_held(ch, h, PDX_KV_FREED_PEER_GONE);
            events++;
        } else {
            pp = &h->next;
        }
    }
    /* Heartbeats of this node's reads, so their holders keep the lease. */
    uint64_t period = (uint64_t)ch->cfg->heartbeat_ms * 1000000ull;
    for (kv_load_t *l = c->loads; l != NULL; l = l->next) {
        if (kv_load_busy(l, c->nlayers) && l->peer[0] != '\0' &&
            now - l->last_hb_ns >= period) {
            kv_msg_send(c->agent, l->peer, "hb", l->peer_req);
            l->last_hb_ns = now;
        }
    }
    return events;
}

static pdx_status_t remote_save_layer(kv_child_t *ch,
                                      const pdx_kv_request_t *r,
                                      const pdx_kv_layer_save_t *s,
                                      const uint64_t *ids)
{
    return kv_push_save_layer(ch->conn, &remote_of(ch)->pushes, r, s, ids);
}

static void remote_request_dropped(kv_child_t *ch, const char *req_id)
{
    kv_push_forget(ch->conn, &remote_of(ch)->pushes, req_id, true);
}

static void remote_destroy(kv_child_t *ch)
{
    remote_child_t *rc = remote_of(ch);
    kv_push_free_all(ch->conn, &rc->pushes);
    while (rc->held) {
        held_handoff_t *h = rc->held;
        rc->held = h->next;
        if (h->lease) {
            pdx_offload_release(ch->conn->pool, h->lease);
        }
        free(h->ids);
        free(h);
    }
    free(rc);
}

static const kv_child_ops_t remote_ops = {
    .name = "remote",
    .lookup = remote_lookup,
    .load = remote_load,
    .load_check = kv_remote_read_check,
    .request_finished = remote_request_finished,
    .on_message = remote_on_message,
    .save_layer = remote_save_layer,
    .request_dropped = remote_request_dropped,
    .progress = remote_progress,
    .destroy = remote_destroy,
};

pdx_status_t kv_remote_create(pdx_kv_connector_h c,
                              const pdx_kv_child_config_t *cfg,
                              kv_child_t **ch_p)
{
    remote_child_t *rc = calloc(1, sizeof(*rc));
    if (rc == NULL) {
        pdx_error("kv connector %s: out of memory for the remote child",
                  c->cfg.agent_name);
        return PDX_ERR_NOMEM;
    }
    rc->base = (kv_child_t){.ops = &remote_ops, .conn = c, .cfg = cfg};
    *ch_p = &rc->base;
    return PDX_OK;
}

size_t kv_remote_held(kv_child_t *ch)
{
    size_t n = 0;
    for (held_handoff_t *h = remote_of(ch)->held; h != NULL; h = h->next) {
        n++;
    }
    return n;
}
