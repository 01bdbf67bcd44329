/* Layer-wise pushes, the remote child's: on a prefill node, one record per
 * request that it saved layer by layer or that a decode node asked for,
 * and the writes of each layer into the decode node's blocks as soon as
 * both the layer and the ask are there; on a decode node, the ask (its
 * arena table and block ids, as connector messages) and the load record
 * that follows the holder's writes layer by layer.
 *
 * Messages (kv_handoff.h's "pdxkv:<verb> <req> <rest>"):
 *   D -> P  arena <preq> <dreq> <narenas> <off> <memtype> <hex b:s[:d],...>
 *           (d: the arena's device where memtype is GPU memory)
 *           want <preq> <dreq> <first> <n> <off> <id,id,...>
 *           reject <preq>            (an abort: stop, then say nopush)
 *   P -> D  lyr <dreq> <layer> <end> [last]
 *                                    (rides on each write: its bytes are
 *                                     in, blocks below `end` of that
 *                                     layer; "last": no write of that
 *                                     layer follows. Every layer's last
 *                                     one in: the reader has it all)
 *           pushed <dreq>            (every layer of the last step in)
 *           nopush <dreq>            (refused, given up or stopped; no
 *                                     write of it is in flight any more)
 * Writes of one layer go one at a time, in order, so a block written twice
 * (the partial last block of a chunked prefill) lands last with its final
 * content. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <pdx/log.h>
#include <pdx/peer.h>
#include <pdx/xfer.h>

#include "kv_connector_int.h"
#include "kv_handoff_int.h"

/* Ids and arenas per message: well under PDX_NOTIF_MAX. */
#define IDS_PER_MSG 256
#define ARENAS_PER_MSG 80

struct kv_push {
    struct kv_push *next;
    char req[PDX_KV_REQ_ID_MAX]; /* this node's id (the holder's) */
    /* What this node saved: its block ids by block index, and per layer
     * index the range saved but not yet written, [lo, hi). */
    uint64_t *ids;
    uint8_t *id_known;
    size_t ids_cap;
    size_t *lo, *hi;
    uint8_t *last_done; /* per layer: the last step's save of it came */
    bool saved;         /* any save at all */
    /* The ask. */
    char peer[PDX_NAME_MAX];
    char dreq[PDX_KV_REQ_ID_MAX];
    size_t dfirst, dn;
    uint64_t *dids;
    size_t dids_got;
    uint64_t *dbases, *dstrides;
    uint64_t *ddevs; /* each arena's device on D (GPU memory), else 0 */
    size_t darenas_got;
    pdx_mem_type_t dmem;
    bool asked, ready;
    uint64_t deadline_ns; /* an ask with no save yet gives up then */
    /* The write of each layer in flight, and the block end it carries. */
    pdx_xfer_h *x;
    size_t *x_end;
    kv_push_state_t state;
    bool ended_told; /* the end reported (cb) and the peer told */
    bool forgotten, tell;
};

static kv_push_t *find_push(kv_push_t *list, const char *req)
{
    for (kv_push_t *p = list; p != NULL; p = p->next) {
        if (strcmp(p->req, req) == 0 && !p->forgotten) {
            return p;
        }
    }
    return NULL;
}

static void push_free(pdx_kv_connector_h c, kv_push_t *p)
{
    for (uint32_t i = 0; p->x != NULL && i < c->nlayers; i++) {
        if (p->x[i] != NULL) {
            pdx_xfer_release(p->x[i]);
        }
    }
    free(p->ids);
    free(p->id_known);
    free(p->lo);
    free(p->hi);
    free(p->last_done);
    free(p->dids);
    free(p->dbases);
    free(p->dstrides);
    free(p->ddevs);
    free(p->x);
    free(p->x_end);
    free(p);
}

static kv_push_t *push_new(pdx_kv_connector_h c, kv_push_t **list,
                           const char *req)
{
    kv_push_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return NULL;
    }
    uint32_t n = c->nlayers;
    p->lo = malloc(n * sizeof(*p->lo));
    p->hi = calloc(n, sizeof(*p->hi));
    p->last_done = calloc(n, 1);
    p->x = calloc(n, sizeof(*p->x));
    p->x_end = calloc(n, sizeof(*p->x_end));
    if (p->lo == NULL || p->hi == NULL || p->last_done == NULL ||
        p->x == NULL || p->x_end == NULL) {
        push_free(c, p);
        return NULL;
    }
    for (uint32_t i = 0; i < n; i++) {
        p->lo[i] = SIZE_MAX;
    }
    snprintf(p->req, sizeof(p->req), "%s", req);
    p->next = *list;
    *list = p;
    return p;
}

static bool push_busy(pdx_kv_connector_h c, const kv_push_t *p)
{
    for (uint32_t i = 0; i < c->nlayers; i++) {
        if (p->x[i] != NULL) {
            return true;
        }
    }
    return false;
}

/* Stop: writes in flight asked to stop; the end is reported by progress
 * once none is in flight. */
static void push_fail(pdx_kv_connector_h c, kv_push_t *p, const char *why)
{
    if (p->state == KV_PUSH_NONE && p->asked) {
        pdx_warn("kv connector %s: push of %s to %s given up: %s",
                 c->cfg.agent_name, p->req, p->peer, why);
    }
    p->state = KV_PUSH_REFUSED;
    for (uint32_t i = 0; i < c->nlayers; i++) {
        if (p->x[i] != NULL) {
            pdx_xfer_abort(p->x[i]);
        }
    }
}

static bool ids_grow(kv_push_t *p, size_t n)
{
    if (n <= p->ids_cap) {
        return true;
    }
    size_t cap = p->ids_cap ? p->ids_cap : 16;
    while (cap < n) {
        cap *= 2;
    }
    uint64_t *ids = realloc(p->ids, cap * sizeof(*ids));
    if (ids == NULL) {
        return false;
    }
    p->ids = ids;
    uint8_t *known = realloc(p->id_known, cap);
    if (known == NULL) {
        return false;
    }
    memset(known + p->ids_cap, 0, cap - p->ids_cap);
    p->id_known = known;
    p->ids_cap = cap;
    return true;
}

/* Post the write of layer li's saved range clipped to what was asked. */
static pdx_status_t post_layer(pdx_kv_connector_h c, kv_push_t *p, uint32_t li)
{
    size_t lo = p->lo[li] > p->dfirst ? p->lo[li] : p->dfirst;
    size_t hi = p->hi[li] < p->dfirst + p->dn ? p->hi[li] : p->dfirst + p->dn;
    p->lo[li] = SIZE_MAX;
    p->hi[li] = 0;
    if (lo >= hi) {
        return PDX_OK;
    }
    size_t cap = (hi - lo) * c->narenas, j = 0;
    pdx_desc_t *l = malloc(cap * sizeof(*l)), *r = malloc(cap * sizeof(*r));
    pdx_status_t st = PDX_OK;
    if (l == NULL || r == NULL) {
        st = PDX_ERR_NOMEM;
        goto out;
    }
    for (size_t a = 0; a < c->narenas; a++) {
        const pdx_arena_t *ar = &c->arenas[a];
        uint64_t bb = kv_arena_block_bytes(ar);
        if (c->arena_li[a] != li) {
            continue;
        }
        for (size_t b = lo; b < hi; b++) {
            if (b >= p->ids_cap || !p->id_known[b]) {
                pdx_error("kv connector %s: push of %s: block %zu of layer "
                          "%u was never saved here",
                          c->cfg.agent_name, p->req, b, c->layers[li]);
                st = PDX_ERR_INVALID;
                goto out;
            }
            uint64_t la = ar->base + p->ids[b] * ar->stride;
            uint64_t ra =
                p->dbases[a] + p->dids[b - p->dfirst] * p->dstrides[a];
            if (j > 0 && b > lo && l[j - 1].addr + l[j - 1].len == la &&
                r[j - 1].addr + r[j - 1].len == ra) {
                l[j - 1].len += bb;
                r[j - 1].len += bb;
                continue;
            }
            l[j] = (pdx_desc_t){.addr = la, .len = bb, .dev_id = ar->dev_id};
            r[j] = (pdx_desc_t){.addr = ra, .len = bb,
                                .dev_id = (uint32_t)p->ddevs[a]};
            j++;
        }
    }
    /* The layer's final write (nothing of it is saved after the last
     * step's) says so: once every layer's final write landed, the reader
     * has it all, without waiting for "pushed". */
    char note[128];
    snprintf(note, sizeof(note), KV_MSG_PREFIX "lyr %s %u %zu%s", p->dreq,
             c->layers[li], hi, p->last_done[li] ? " last" : "");
    pdx_desc_list_t ll = {pdx_layout_mem_type(c->layout), l, j};
    pdx_desc_list_t rl = {p->dmem, r, j};
    st = pdx_xfer_create(c->agent, PDX_XFER_WRITE, &ll, &rl, p->peer, note,
                         strlen(note), &p->x[li]);
    if (st == PDX_OK) {
        st = pdx_xfer_post(p->x[li]);
        if (st < 0) {
            pdx_xfer_release(p->x[li]);
            p->x[li] = NULL;
        } else {
            p->x_end[li] = hi;
            st = PDX_OK;
        }
    }
    if (st != PDX_OK) {
        pdx_error("kv connector %s: push of %s: the write of layer %u to %s "
                  "did not start: %s",
                  c->cfg.agent_name, p->req, c->layers[li], p->peer,
                  pdx_status_string(st));
    }
out:
    free(l);
    free(r);
    return st;
}

/* Post what can go: every idle layer with a saved range, once asked. */
static pdx_status_t push_kick(pdx_kv_connector_h c, kv_push_t *p)
{
    if (!p->ready || p->state != KV_PUSH_NONE) {
        return PDX_OK;
    }
    for (uint32_t li = 0; li < c->nlayers; li++) {
        if (p->x[li] == NULL && p->hi[li] > 0) {
            pdx_status_t st = post_layer(c, p, li);
            if (st != PDX_OK) {
                push_fail(c, p, pdx_status_string(st));
                return st;
            }
        }
    }
    return PDX_OK;
}

pdx_status_t kv_push_save_layer(pdx_kv_connector_h c, kv_push_t **list,
                                const pdx_kv_request_t *r,
                                const pdx_kv_layer_save_t *s,
                                const uint64_t *ids)
{
    int li = kv_layer_index(c, s->layer);
    kv_push_t *p = find_push(*list, r->req_id);
    if (p == NULL && (p = push_new(c, list, r->req_id)) == NULL) {
        return PDX_ERR_NOMEM;
    }
    if (!ids_grow(p, s->first_block + s->nblocks)) {
        return PDX_ERR_NOMEM;
    }
    for (size_t i = 0; i < s->nblocks; i++) {
        p->ids[s->first_block + i] = ids[i];
        p->id_known[s->first_block + i] = 1;
    }
    p->saved = true;
    p->deadline_ns = 0;
    if (s->nblocks > 0) {
        if (s->first_block < p->lo[li]) {
            p->lo[li] = s->first_block;
        }
        if (s->first_block + s->nblocks > p->hi[li]) {
            p->hi[li] = s->first_block + s->nblocks;
        }
    }
    if (s->last) {
        p->last_done[li] = 1;
    }
    return push_kick(c, p);
}

/* The request finished here (its handoff made): whatever was not saved
 * layer by layer is saved now, whole, and it is the last step. */
void kv_push_finished(pdx_kv_connector_h c, kv_push_t *list, const char *req,
                      const uint64_t *ids, size_t n)
{
    kv_push_t *p = find_push(list, req);
    if (p == NULL || !ids_grow(p, n)) {
        return;
    }
    for (uint32_t li = 0; li < c->nlayers; li++) {
        if (p->last_done[li]) {
            continue;
        }
        for (size_t b = 0; b < n; b++) {
            p->ids[b] = ids[b];
            p->id_known[b] = 1;
        }
        p->lo[li] = 0;
        p->hi[li] = n;
        p->last_done[li] = 1;
    }
    p->saved = true;
    p->deadline_ns = 0;
    push_kick(c, p);
}

/* "a:b,c:d,..." of hex pairs, or "1,2,3" of decimals, into out[off...]. */
/* Decimal ids, or hex pairs "base:stride" each with an optional ":device"
 * (into c; 0 where absent; a device past PDX_KV_MAX_DEVICE refused). */
#define PDX_KV_MAX_DEVICE 1023
static bool parse_list(const char *s, bool pairs, uint64_t *a, uint64_t *b,
                       uint64_t *c, size_t off, size_t cap, size_t *count_p)
{
    size_t k = 0;
    while (*s != '\0') {
        char *end;
        if (off + k >= cap) {
            return false;
        }
        a[off + k] = strtoull(s, &end, pairs ? 16 : 10);
        if (end == s) {
            return false;
        }
        s = end;
        if (pairs) {
            if (*s != ':') {
                return false;
            }
            b[off + k] = strtoull(s + 1, &end, 16);
            if (end == s + 1) {
                return false;
            }
            s = end;
            c[off + k] = 0;
            if (*s == ':') {
                c[off + k] = strtoull(s + 1, &end, 16);
                if (end == s + 1 || c[off + k] > PDX_KV_MAX_DEVICE) {
                    return false;
                }
                s = end;
            }
        }
        k++;
        if (*s == ',') {
            s++;
        } else if (*s != '\0') {
            return false;
        }
    }
    *count_p = k;
    return true;
}

static kv_push_t *ask_record(pdx_kv_connector_h c, kv_push_t **list,
                             const char *peer, const char *preq,
                             const char *dreq)
{
    kv_push_t *p = find_push(*list, preq);
    if (p == NULL) {
        /* Asked before any save: it may not have started here yet. The
         * ask waits one lease for a save. */
        p = push_new(c, list, preq);
        if (p == NULL) {
            return NULL;
        }
        uint32_t lease = c->remote ? c->remote->lease_ms : 30000;
        p->deadline_ns = pdx_now_ns() + (uint64_t)lease * 1000000ull;
    }
    if (p->peer[0] == '\0') {
        snprintf(p->peer, sizeof(p->peer), "%s", peer);
        snprintf(p->dreq, sizeof(p->dreq), "%s", dreq);
    } else if (strcmp(p->peer, peer) != 0 || strcmp(p->dreq, dreq) != 0) {
        pdx_warn("kv connector %s: push of %s: %s asks for it as %s, but %s "
                 "already did as %s: ignored",
                 c->cfg.agent_name, preq, peer, dreq, p->peer, p->dreq);
        return NULL;
    }
    p->asked = true;
    return p;
}

/* "arena <preq> <dreq> <narenas> <off> <memtype> <pairs>" */
static void on_arena(pdx_kv_connector_h c, kv_push_t **list, const char *peer,
                     const char *preq, const char *rest)
{
    char dreq[PDX_KV_REQ_ID_MAX];
    size_t na, off;
    unsigned mem;
    int used = 0;
    if (sscanf(rest, "%63s %zu %zu %u %n", dreq, &na, &off, &mem, &used) != 4 ||
        na != c->narenas || mem > PDX_MEM_VRAM) {
        pdx_warn("kv connector %s: arena table for %s from %s does not fit "
                 "this layout (%zu arenas): ignored",
                 c->cfg.agent_name, preq, peer, c->narenas);
        return;
    }
    kv_push_t *p = ask_record(c, list, peer, preq, dreq);
    if (p == NULL) {
        return;
    }
    if (p->dbases == NULL) {
        p->dbases = calloc(na, sizeof(*p->dbases));
        p->dstrides = calloc(na, sizeof(*p->dstrides));
        p->ddevs = calloc(na, sizeof(*p->ddevs));
        if (p->dbases == NULL || p->dstrides == NULL || p->ddevs == NULL) {
            push_fail(c, p, "out of memory");
            return;
        }
    }
    size_t k;
    if (!parse_list(rest + used, true, p->dbases, p->dstrides, p->ddevs, off,
                    na, &k)) {
        push_fail(c, p, "a malformed arena table");
        return;
    }
    p->dmem = (pdx_mem_type_t)mem;
    p->darenas_got += k;
}

/* "want <preq> <dreq> <first> <n> <off> <ids>" */
static void on_want(pdx_kv_connector_h c, kv_push_t **list, const char *peer,
                    const char *preq, const char *rest)
{
    char dreq[PDX_KV_REQ_ID_MAX];
    size_t first, n, off;
    int used = 0;
    if (sscanf(rest, "%63s %zu %zu %zu %n", dreq, &first, &n, &off, &used) !=
            4 ||
        n == 0 || n > (1u << 24) || first > (1u << 24)) {
        pdx_warn("kv connector %s: a malformed ask for %s from %s: ignored",
                 c->cfg.agent_name, preq, peer);
        return;
    }
    kv_push_t *p = ask_record(c, list, peer, preq, dreq);
    if (p == NULL) {
        return;
    }
    if (p->dids == NULL) {
        p->dids = calloc(n, sizeof(*p->dids));
        if (p->dids == NULL) {
            push_fail(c, p, "out of memory");
            return;
        }
        p->dfirst = first;
        p->dn = n;
    } else if (p->dfirst != first || p->dn != n) {
        push_fail(c, p, "asks that disagree");
        return;
    }
    size_t k;
    if (!parse_list(rest + used, false, p->dids, NULL, NULL, off, n, &k)) {
        push_fail(c, p, "a malformed ask");
        return;
    }
    p->dids_got += k;
}

/* D's load of request `dreq` that `peer` pushes, if any. */
static kv_load_t *push_load(pdx_kv_connector_h c, const char *peer,
                            const char *dreq)
{
    for (kv_load_t *l = c->loads; l != NULL; l = l->next) {
        if (l->push && strcmp(l->req, dreq) == 0 &&
            strcmp(l->peer, peer) == 0) {
            return l;
        }
    }
    return NULL;
}

/* D: the holder's news about one of this node's asks. */
static bool on_news(pdx_kv_connector_h c, const char *peer, const char *verb,
                    const char *dreq, const char *rest)
{
    kv_load_t *l = push_load(c, peer, dreq);
    if (l == NULL) {
        pdx_debug("kv: %s about %s from %s: no such push here", verb, dreq,
                  peer);
        return true;
    }
    if (strcmp(verb, "lyr") == 0) {
        unsigned layer;
        size_t end;
        int li, used = 0;
        if (sscanf(rest, "%u %zu%n", &layer, &end, &used) == 2 &&
            (li = kv_layer_index(c, layer)) >= 0 && end >= l->push_end) {
            /* 1: in; 2: in, and the holder's last write of it */
            l->layer_ok[li] = strcmp(rest + used, " last") == 0 ? 2 : 1;
        }
        bool all = l->status == PDX_INPROGRESS;
        for (uint32_t i = 0; all && i < c->nlayers; i++) {
            all = l->layer_ok[i] == 2;
        }
        if (all) {
            l->status = PDX_OK;
        }
    } else if (l->status == PDX_INPROGRESS) {
        bool pushed = strcmp(verb, "pushed") == 0;
        for (uint32_t i = 0; pushed && i < c->nlayers; i++) {
            l->layer_ok[i] = 1;
        }
        l->status = pushed ? PDX_OK : PDX_ERR_NOT_FOUND;
        if (!pushed) {
            pdx_warn("kv connector %s: %s will not push %s (%s)",
                     c->cfg.agent_name, peer, dreq,
                     l->aborted ? "stopped as asked" : "refused or gave up");
        }
    }
    return true;
}

bool kv_push_on_message(pdx_kv_connector_h c, kv_push_t **list,
                        const char *peer, const char *verb, const char *req,
                        const char *rest)
{
    if (strcmp(verb, "arena") == 0) {
        on_arena(c, list, peer, req, rest);
    } else if (strcmp(verb, "want") == 0) {
        on_want(c, list, peer, req, rest);
    } else if (strcmp(verb, "lyr") == 0 || strcmp(verb, "pushed") == 0 ||
               strcmp(verb, "nopush") == 0) {
        return on_news(c, peer, verb, req, rest);
    } else if (strcmp(verb, "reject") == 0) {
        kv_push_t *p = find_push(*list, req);
        if (p == NULL) {
            return false;
        }
        push_fail(c, p, "the decode node stopped it");
        return true;
    } else {
        return false;
    }
    kv_push_t *p = find_push(*list, req);
    if (p != NULL && !p->ready && p->dids != NULL && p->dbases != NULL &&
        p->dids_got == p->dn && p->darenas_got == c->narenas) {
        p->ready = true;
        pdx_debug("kv: push of %s to %s as %s: asked for %zu blocks from %zu",
                  p->req, p->peer, p->dreq, p->dn, p->dfirst);
        push_kick(c, p);
    }
    return true;
}

/* Writes checked; the next range of a layer posted when its write is in. */
static int push_writes(pdx_kv_connector_h c, kv_push_t *p)
{
    int events = 0;
    for (uint32_t li = 0; li < c->nlayers; li++) {
        if (p->x[li] == NULL) {
            continue;
        }
        pdx_status_t st = pdx_xfer_check(p->x[li]);
        if (st == PDX_INPROGRESS) {
            continue;
        }
        pdx_xfer_release(p->x[li]);
        p->x[li] = NULL;
        events++;
        if (st != PDX_OK && p->state == KV_PUSH_NONE) {
            push_fail(c, p, pdx_status_string(st));
        }
    }
    push_kick(c, p);
    return events;
}

static bool push_complete(pdx_kv_connector_h c, const kv_push_t *p)
{
    for (uint32_t li = 0; li < c->nlayers; li++) {
        if (!p->last_done[li] || p->x[li] != NULL || p->hi[li] > 0) {
            return false;
        }
    }
    return p->ready;
}

int kv_push_progress(pdx_kv_connector_h c, kv_push_t **list, uint64_t now,
                     kv_push_end_cb_t cb, void *arg)
{
    int events = 0;
    for (kv_push_t **pp = list; *pp != NULL;) {
        kv_push_t *p = *pp;
        events += push_writes(c, p);
        if (p->state == KV_PUSH_NONE && p->deadline_ns != 0 &&
            now > p->deadline_ns) {
            push_fail(c, p, "this node never saved the request");
            p->forgotten = p->tell = true;
        }
        if (p->state == KV_PUSH_NONE && push_complete(c, p)) {
            p->state = KV_PUSH_DONE;
            kv_msg_send(c->agent, p->peer, "pushed", p->dreq);
            pdx_debug("kv: pushed %s to %s", p->req, p->peer);
        }
        /* An end is told once no write is in flight; a tombstone (a
         * request dropped before anyone asked) waits for an ask, or its
         * deadline. */
        if (p->state != KV_PUSH_NONE && !p->ended_told && !push_busy(c, p) &&
            (p->asked || p->saved || now > p->deadline_ns)) {
            p->ended_told = true;
            if (p->state == KV_PUSH_REFUSED && p->asked) {
                kv_msg_send(c->agent, p->peer, "nopush", p->dreq);
            }
            if (!p->forgotten && cb != NULL) {
                cb(arg, p->req, p->state);
            }
            events++;
        }
        if (p->state != KV_PUSH_NONE && p->ended_told && !p->saved) {
            p->forgotten = true; /* an ask for a request never seen here */
        }
        if (p->forgotten && !push_busy(c, p)) {
            if (p->tell && p->asked && !p->ended_told) {
                kv_msg_send(c->agent, p->peer, "nopush", p->dreq);
            }
            *pp = p->next;
            push_free(c, p);
            continue;
        }
        pp = &p->next;
    }
    return events;
}

kv_push_state_t kv_push_state(kv_push_t *list, const char *req, bool *exists_p)
{
    kv_push_t *p = find_push(list, req);
    *exists_p = p != NULL;
    return p != NULL && p->ended_told ? p->state : KV_PUSH_NONE;
}

void kv_push_forget(pdx_kv_connector_h c, kv_push_t **list, const char *req,
                    bool tell)
{
    kv_push_t *p = find_push(*list, req);
    if (p == NULL && tell) {
        /* A tombstone: an ask that arrives late is told "nopush" at once
         * rather than waiting a lease for saves that never come. */
        p = push_new(c, list, req);
        if (p != NULL) {
            uint32_t lease = c->remote ? c->remote->lease_ms : 30000;
            p->state = KV_PUSH_REFUSED;
            p->deadline_ns = pdx_now_ns() + (uint64_t)lease * 1000000ull;
        }
        return;
    }
    if (p == NULL) {
        return;
    }
    if (tell && p->state == KV_PUSH_NONE) {
        push_fail(c, p, "the request was dropped or its reader left");
    }
    /* Reaped by the next progress pass, once no write is in flight (a
     * mark only: this may run from inside that pass's callback). */
    p->forgotten = true;
    p->tell = tell;
}

void kv_push_free_all(pdx_kv_connector_h c, kv_push_t **list)
{
    while (*list != NULL) {
        kv_push_t *p = *list;
        *list = p->next;
        push_free(c, p);
    }
}

/* --------------------------------------------------------- the decode side
 */

/* This node's arena table and the ids, to the holder. */
static pdx_status_t send_ask(pdx_kv_connector_h c, const char *req_id,
                             const pdx_kv_push_expect_t *e, const uint64_t *ids)
{
    char rest[PDX_NOTIF_MAX - 200];
    pdx_status_t st = PDX_OK;
    unsigned mem = (unsigned)pdx_layout_mem_type(c->layout);
    for (size_t a0 = 0; st == PDX_OK && a0 < c->narenas; a0 += ARENAS_PER_MSG) {
        int n = snprintf(rest, sizeof(rest), "%s %zu %zu %u ", req_id,
                         c->narenas, a0, mem);
        for (size_t a = a0; a < c->narenas && a < a0 + ARENAS_PER_MSG; a++) {
            n += snprintf(rest + n, sizeof(rest) - (size_t)n,
                          "%s%" PRIx64 ":%" PRIx64, a > a0 ? "," : "",
                          c->arenas[a].base, c->arenas[a].stride);
            if (mem == PDX_MEM_VRAM) {
                /* The holder writes into GPU memory on this device. */
                n += snprintf(rest + n, sizeof(rest) - (size_t)n, ":%x",
                              (unsigned)c->arenas[a].dev_id);
            }
        }
        st =
            kv_msg_send_rest(c->agent, e->holder, "arena", e->holder_req, rest);
    }
    for (size_t i0 = 0; st == PDX_OK && i0 < e->nblocks; i0 += IDS_PER_MSG) {
        int n = snprintf(rest, sizeof(rest), "%s %zu %zu %zu ", req_id,
                         e->first_block, e->nblocks, i0);
        for (size_t i = i0; i < e->nblocks && i < i0 + IDS_PER_MSG; i++) {
            n += snprintf(rest + n, sizeof(rest) - (size_t)n, "%s%" PRIu64,
                          i > i0 ? "," : "", ids[i]);
        }
        st = kv_msg_send_rest(c->agent, e->holder, "want", e->holder_req, rest);
    }
    return st;
}

pdx_status_t kv_push_expect(pdx_kv_connector_h c, const char *req_id,
                            const pdx_kv_push_expect_t *e, const uint64_t *ids,
                            kv_load_t *l)
{
    if (pdx_peer_state(c->agent, e->holder) != PDX_OK) {
        pdx_error("kv connector %s: push of %s from %s: not a live peer "
                  "here (connect it first)",
                  c->cfg.agent_name, req_id, e->holder);
        return PDX_ERR_NOT_FOUND;
    }
    l->layer_ok = calloc(c->nlayers, 1);
    if (l->layer_ok == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t st = send_ask(c, req_id, e, ids);
    if (st != PDX_OK) {
        pdx_error("kv connector %s: push of %s: cannot ask %s: %s",
                  c->cfg.agent_name, req_id, e->holder, pdx_status_string(st));
        return st;
    }
    uint32_t timeout = (e->field_mask & PDX_KV_PUSH_TIMEOUT)
                           ? e->timeout_ms
                           : (c->remote ? c->remote->lease_ms : 30000);
    uint64_t now = pdx_now_ns();
    l->push = true;
    l->push_end = e->first_block + e->nblocks;
    l->deadline_ns = now + (uint64_t)timeout * 1000000ull;
    l->last_hb_ns = now;
    l->status = PDX_INPROGRESS;
    snprintf(l->peer, sizeof(l->peer), "%s", e->holder);
    snprintf(l->peer_req, sizeof(l->peer_req), "%s", e->holder_req);
    return PDX_OK;
}

pdx_status_t kv_push_load_check(pdx_kv_connector_h c, kv_load_t *l)
{
    if (l->status != PDX_INPROGRESS) {
        return l->status;
    }
    if (pdx_peer_state(c->agent, l->peer) == PDX_ERR_REMOTE_DISCONNECT) {
        pdx_warn("kv connector %s: push of %s: holder %s is gone",
                 c->cfg.agent_name, l->req, l->peer);
        l->status = PDX_ERR_REMOTE_DISCONNECT;
    } else if (pdx_now_ns() > l->deadline_ns) {
        pdx_warn("kv connector %s: push of %s from %s: not all in by its "
                 "deadline",
                 c->cfg.agent_name, l->req, l->peer);
        l->status = PDX_ERR_TIMEOUT;
    }
    return l->status;
}
