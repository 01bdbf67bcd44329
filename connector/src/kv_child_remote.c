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
} held_handoff_t;

typedef struct remote_child {
    kv_child_t base; /* first */
    held_handoff_t *held;
} remote_child_t;

static remote_child_t *remote_of(kv_child_t *ch)
{
    return (remote_child_t *)ch;
}

/* Releases the blocks of h and reports the request freed. */
static void free_held(pdx_kv_connector_h c, held_handoff_t *h,
                      pdx_kv_free_reason_t why)
{
    if (h->lease != NULL) {
        pdx_offload_release(c->pool, h->lease);
    }
    kv_freed_t *f = calloc(1, sizeof(*f));
    if (f != NULL) {
        snprintf(f->req, sizeof(f->req), "%s", h->req);
        f->why = why;
        if (c->freed_tail) {
            c->freed_tail->next = f;
        } else {
            c->freed = f;
        }
        c->freed_tail = f;
    }
    free(h);
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

pdx_status_t kv_remote_read(pdx_kv_connector_h c, const pdx_kv_request_t *r,
                            const pdx_kv_match_t *m, const uint64_t *ids,
                            kv_load_t *rec)
{
    kv_handoff_t h;
    pdx_status_t st = kv_handoff_parse(r->params, c->narenas, &h);
    if (st != PDX_OK) {
        return st;
    }
    size_t nb = m->blocks + (m->tail ? 1 : 0);
    size_t n = nb * c->narenas, j = 0;
    pdx_desc_t *l = NULL, *rm = NULL;
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
    for (size_t a = 0; a < c->narenas; a++) {
        const pdx_arena_t *ar = &c->arenas[a];
        uint64_t bb = kv_arena_block_bytes(ar);
        for (size_t b = 0; b < nb; b++) {
            bool tail = b == m->blocks;
            uint64_t rid = tail ? h.tail_id : h.ids[b];
            if (ids[b] >= ar->num_blocks) {
                pdx_error("kv: load %s: local block id %llu out of range",
                          r->req_id, (unsigned long long)ids[b]);
                st = PDX_ERR_INVALID;
                goto out;
            }
            uint64_t la = ar->base + ids[b] * ar->stride;
            uint64_t ra = h.pool ? rid + c->arena_off[a]
                                 : h.bases[a] + rid * h.strides[a];
            if (j > 0 && b > 0 && l[j - 1].addr + l[j - 1].len == la &&
                rm[j - 1].addr + rm[j - 1].len == ra) {
                /* Runs merged as they are built: a 128K-token request is
                 * 101 pieces, not 200k descriptors to write and merge. */
                l[j - 1].len += bb;
                rm[j - 1].len += bb;
                continue;
            }
            l[j] = (pdx_desc_t){.addr = la, .len = bb, .dev_id = ar->dev_id};
            rm[j] = (pdx_desc_t){
                .addr = ra, .len = bb,
                .dev_id = h.devs != NULL ? (uint32_t)h.devs[a] : 0};
            j++;
        }
    }
    /* The holder's arenas are in its memory type (GPU memory on each
     * arena's device where the handoff says so); its pool is host
     * memory. */
    pdx_desc_list_t ll = {pdx_layout_mem_type(c->layout), l, j};
    pdx_desc_list_t rl = {h.pool ? PDX_MEM_DRAM : h.mem, rm, j};
    char note[128];
    kv_msg_format(note, sizeof(note), "done", h.req);
    st = pdx_xfer_create(c->agent, PDX_XFER_READ, &ll, &rl, h.agent, note,
                         strlen(note), &rec->xfer);
    if (st != PDX_OK) {
        pdx_error("kv connector %s: load %s: cannot prepare the read of %zu "
                  "blocks from %s: %s",
                  c->cfg.agent_name, r->req_id, nb, h.agent,
                  pdx_status_string(st));
        goto out;
    }
    st = pdx_xfer_post(rec->xfer);
    if (st >= 0) {
        snprintf(rec->peer, sizeof(rec->peer), "%s", h.agent);
        snprintf(rec->peer_req, sizeof(rec->peer_req), "%s", h.req);
        rec->status = PDX_INPROGRESS;
        rec->last_hb_ns = pdx_now_ns();
        pdx_debug("kv: load %s: %zu blocks from %s in %zu pieces", r->req_id,
                  nb, h.agent, pdx_xfer_segments(rec->xfer));
        st = PDX_OK;
    } else {
        pdx_error("kv connector %s: load %s: the read from %s did not start: "
                  "%s",
                  c->cfg.agent_name, r->req_id, h.agent,
                  pdx_status_string(st));
        pdx_xfer_release(rec->xfer);
        rec->xfer = NULL;
    }
out:
    free(l);
    free(rm);
    kv_handoff_free(&h);
    return st;
}

pdx_status_t kv_remote_read_check(kv_child_t *ch, kv_load_t *l)
{
    (void)ch;
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
                                const pdx_kv_match_t *m, const uint64_t *ids,
                                pdx_status_t prepared, kv_load_t *l)
{
    (void)prepared;
    return kv_remote_read(ch->conn, r, m, ids, l);
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
    h = NULL;
    f->params = text;
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
                              const char *verb, const char *req)
{
    remote_child_t *rc = remote_of(ch);
    held_handoff_t **pp = &rc->held;
    while (*pp != NULL && strcmp((*pp)->req, req) != 0) {
        pp = &(*pp)->next;
    }
    if (*pp == NULL) {
        return false;
    }
    held_handoff_t *h = *pp;
    snprintf(h->peer, sizeof(h->peer), "%s", peer); /* its reader */
    if (strcmp(verb, "hb") == 0) {
        h->deadline_ns =
            pdx_now_ns() + (uint64_t)ch->cfg->lease_ms * 1000000ull;
    } else if (strcmp(verb, "done") == 0 || strcmp(verb, "reject") == 0) {
        *pp = h->next;
        pdx_debug("kv: %s freed by %s (%s)", req, peer, verb);
        free_held(ch->conn, h,
                  verb[0] == 'd' ? PDX_KV_FREED_DONE : PDX_KV_FREED_REJECT);
    }
    return true;
}

static int remote_progress(kv_child_t *ch, uint64_t now, bool check_dead)
{
    remote_child_t *rc = remote_of(ch);
    pdx_kv_connector_h c = ch->conn;
    int events = 0;
    for (held_handoff_t **pp = &rc->held; *pp != NULL;) {
        held_handoff_t *h = *pp;
        if (now > h->deadline_ns) {
            *pp = h->next;
            pdx_warn("kv: lease of %s expired (peer %s never read it or "
                     "died): freeing its blocks", h->req, h->peer);
            free_held(c, h, PDX_KV_FREED_EXPIRED);
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
            free_held(c, h, PDX_KV_FREED_PEER_GONE);
            events++;
        } else {
            pp = &h->next;
        }
    }
    /* Heartbeats of this node's reads, so their holders keep the lease. */
    uint64_t period = (uint64_t)ch->cfg->heartbeat_ms * 1000000ull;
    for (kv_load_t *l = c->loads; l != NULL; l = l->next) {
        if (l->xfer != NULL && now - l->last_hb_ns >= period) {
            kv_msg_send(c->agent, l->peer, "hb", l->peer_req);
            l->last_hb_ns = now;
        }
    }
    return events;
}

static void remote_destroy(kv_child_t *ch)
{
    remote_child_t *rc = remote_of(ch);
    while (rc->held) {
        held_handoff_t *h = rc->held;
        rc->held = h->next;
        if (h->lease) {
            pdx_offload_release(ch->conn->pool, h->lease);
        }
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
