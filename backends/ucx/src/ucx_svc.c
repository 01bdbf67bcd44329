/* ucx: the service this instance gives peers' staged requests: SW (a
 * peer's data for our GPU: received into a slot of the service's half of
 * the pool, its table checked, copied to the device, acknowledged with
 * SA once it is there) and SR (our GPU's data for a peer: its table
 * checked, copied into a slot, sent back with SD). Every byte a peer sent
 * is checked before any device copy. Answers go to the requester's worker
 * address (in its request's header: a peer we never loaded is served
 * too) on an endpoint of ours with an error handler, one per requester;
 * they are sent from progress, never from inside a UCX callback. Driven
 * by this instance's progress, never by a wait. */
#include "ucx_stage_int.h"

/* ---- service requests ---------------------------------------------------- */

static void svc_free(ucx_be_t *be, ucx_svc_t *v)
{
    if (v->desc != NULL) {
        ucp_am_data_release(v->worker, v->desc); /* never received */
        v->desc = NULL;
    }
    if (v->held) {
        for (uint32_t i = 0; i < v->nseg; i++) {
            if (v->seg[i].md != NULL) {
                v->seg[i].md->svc_busy--;
            }
        }
        v->held = 0;
    }
    if (v->slot != UINT32_MAX) {
        ucx_vram_slot_put(be, v->slot);
        be->st->kick = 1;
    }
    if (v->client != NULL) {
        ucx_client_done(v->client);
    }
    ucx_list_del(&v->link);
    be->st->nsvc--;
    free(v->addr);
    free(v);
}

static void svc_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_svc_t *v = user_data;
    ucp_request_free(request);
    v->ucx_pending--;
    if (status != UCS_OK) {
        pdx_debug("ucx: answer to %s's staged request not delivered: %s",
                  v->peer, ucs_status_string(status));
    }
    v->be->st->kick = 1; /* freed (its slot back) by the next progress */
}

/* The answer to be sent from progress: SA (a WRITE's status) or SD (a
 * READ's data from the slot, or its error). */
static void svc_end(ucx_svc_t *v, pdx_status_t st)
{
    if (v->status == PDX_OK) {
        v->status = st;
    }
    v->phase = SVC_ANSWER;
    v->be->st->kick = 1;
}

/* Send the answer (from progress). The request ends with the send. */
static void svc_answer(ucx_be_t *be, ucx_svc_t *v)
{
    int sd = v->op == OP_SR;
    int data = sd && v->status == PDX_OK;
    v->phase = PH_END;
    ucx_client_t *c =
        ucx_client_get(&be->st->clients, v->addr, v->addr_len, v->via, 0,
                       v->peer);
    if (c == NULL || c->failed) {
        return;
    }
    v->client = c;
    c->users++;
    v->hdr_len = ucx_shdr_make(be, v->hdr, sd ? OP_SD : OP_SA, 0, v->status,
                               v->rid, data ? v->bytes : 0, NULL, 0);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = data ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER,
        .cb.send = svc_sent_cb,
        .user_data = v,
    };
    if (data) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = ucx_vram_pool_memh(be);
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(
        c->ep, UCX_AM_ID_STAGE, v->hdr, v->hdr_len,
        data ? ucx_vram_slot_ptr(be, v->slot) : NULL, data ? v->bytes : 0,
        &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        pdx_debug("ucx: answering %s's staged request failed: %s", v->peer,
                  ucs_status_string(UCS_PTR_STATUS(sp)));
    } else if (sp != NULL) {
        v->ucx_pending++;
    }
}

/* Check a table of `nseg` segments against our VRAM regions: every one
 * ours (token), inside its region, on one device, writable for a WRITE;
 * their sum is the data. Holds the regions on success. */
static pdx_status_t svc_check(ucx_be_t *be, ucx_svc_t *v,
                              const unsigned char *t, uint64_t *sum_p)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < v->nseg; i++, t += SEG_LEN) {
        uint64_t token = ucx_get_le(t, 8), addr = ucx_get_le(t + 8, 8),
                 len = ucx_get_le(t + 16, 8);
        ucx_md_t *md = ucx_vram_find(be, token, addr, len);
        const char *bad = md == NULL ? "no region of ours with that token "
                                       "holds it (deregistered?)"
                          : i > 0 && md->dev != v->dev
                              ? "segments on two devices"
                          : v->op == OP_SW && md->readonly
                              ? "the region is registered read-only"
                              : NULL;
        if (bad == NULL && sum + len < sum) {
            bad = "lengths overflow";
        }
        if (bad != NULL) {
            pdx_warn("ucx: %s's staged %s: segment %u (0x%" PRIx64
                     " +%" PRIu64 ") refused: %s", v->peer,
                     v->op == OP_SW ? "WRITE" : "READ", i, addr, len, bad);
            return md == NULL ? PDX_ERR_NOT_FOUND : PDX_ERR_INVALID;
        }
        v->dev = md->dev;
        v->seg[i].addr = addr;
        v->seg[i].len = len;
        v->seg[i].md = md;
        sum += len;
    }
    for (uint32_t i = 0; i < v->nseg; i++) {
        v->seg[i].md->svc_busy++;
    }
    v->held = 1;
    *sum_p = sum;
    return PDX_OK;
}

static void svc_copy(ucx_be_t *be, ucx_svc_t *v, int to_host,
                     const unsigned char *host)
{
    ucx_vseg_t vs[STAGE_MAX_SEGS];
    uint64_t off = 0;
    for (uint32_t i = 0; i < v->nseg; i++) {
        vs[i] = (ucx_vseg_t){.dptr = v->seg[i].addr,
                             .host = (void *)(host + off),
                             .len = v->seg[i].len};
        off += v->seg[i].len;
    }
    pdx_status_t st = ucx_vram_copy(be, v->dev, to_host, vs, v->nseg, &v->ev);
    if (st != PDX_OK) {
        svc_end(v, st);
        return;
    }
    be->st->copies++;
    v->phase = to_host ? PH_D2H : PH_H2D;
}

/* SW's payload is in the slot: check its table, copy the data to the
 * GPU. */
static void svc_sw_landed(ucx_be_t *be, ucx_svc_t *v)
{
    const unsigned char *slot = ucx_vram_slot_ptr(be, v->slot);
    uint64_t sum = 0;
    pdx_status_t st = svc_check(be, v, slot, &sum);
    if (st == PDX_OK && sum != v->bytes) {
        pdx_warn("ucx: %s's staged WRITE: table of %" PRIu64 " bytes for "
                 "%" PRIu64 " of data", v->peer, sum, v->bytes);
        st = PDX_ERR_INVALID;
    }
    if (st != PDX_OK) {
        svc_end(v, st);
        return;
    }
    svc_copy(be, v, 0, slot + (size_t)v->nseg * SEG_LEN);
}

static void svc_recv_cb(void *request, ucs_status_t status, size_t length,
                        void *user_data)
{
    ucx_svc_t *v = user_data;
    ucp_request_free(request);
    v->ucx_pending--;
    v->be->rx_rndv--;
    v->desc = NULL;
    if (status != UCS_OK) {
        svc_end(v, ucx_status(status));
    } else if (length != v->payload) {
        svc_end(v, PDX_ERR_INVALID);
    } else {
        v->phase = SVC_LANDED; /* checked and copied by progress */
        v->be->st->kick = 1;
    }
}

/* A queued service request gets its slot. */
static void svc_start(ucx_be_t *be, ucx_svc_t *v)
{
    ucx_list_del(&v->link);
    ucx_list_push(&be->st->svc_active, &v->link);
    if (v->op == OP_SR) {
        svc_copy(be, v, 1, ucx_vram_slot_ptr(be, v->slot));
        return;
    }
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_MEMH,
        .cb.recv_am = svc_recv_cb,
        .user_data = v,
        .memh = ucx_vram_pool_memh(be),
    };
    v->phase = PH_RECV;
    void *desc = v->desc;
    v->desc = NULL; /* UCX's once asked, failed or not */
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(
        v->worker, desc, ucx_vram_slot_ptr(be, v->slot), v->payload, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        svc_end(v, ucx_status(UCS_PTR_STATUS(sp)));
    } else if (sp == NULL) {
        svc_sw_landed(be, v);
    } else {
        v->ucx_pending++;
        be->rx_rndv++;
    }
}

/* Why a request is refused at once, or NULL (then *why_p is unused). */
static const char *svc_refusal(ucx_be_t *be, const shdr_t *h, size_t length,
                               int rndv, pdx_status_t *why_p)
{
    uint64_t slot = ucx_vram_slot_size(be);
    uint64_t table = (uint64_t)h->nseg * SEG_LEN;
    *why_p = PDX_ERR_INVALID;
    if (slot == 0 || be->vram == NULL || ucx_vram_pool_memh(be) == NULL) {
        *why_p = PDX_ERR_UNSUPPORTED;
        return "this agent stages no GPU memory";
    }
    if (h->nseg == 0 || h->nseg > STAGE_MAX_SEGS) {
        return "segment count out of bounds";
    }
    if (h->op == OP_SW &&
        (length != table + h->bytes || length > slot || h->bytes == 0)) {
        return "payload does not match its header or exceeds a slot";
    }
    if (h->op == OP_SR &&
        (length != table || rndv || h->bytes > slot || h->bytes == 0)) {
        return "table does not match its header, or asks over a slot";
    }
    if (be->st->nsvc >= SVC_QUEUE_MAX) {
        *why_p = PDX_ERR_BUSY;
        return "too many staged requests queued";
    }
    return NULL;
}

/* A peer's SW or SR arrived on `w`: queued (answers are sent from
 * progress). */
ucs_status_t ucx_svc_request(ucx_be_t *be, ucp_worker_h w, const shdr_t *h,
                             void *data, size_t length,
                             const ucp_am_recv_param_t *param, int rndv)
{
    struct ucx_stage_state *st = ucx_stage_state(be);
    if (st == NULL || h->addr_len == 0) {
        pdx_warn("ucx: staged request from %s without %s: dropped", h->name,
                 st == NULL ? "memory" : "an address to answer");
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    ucx_svc_t *v = calloc(1, sizeof(*v) + h->nseg * sizeof(v->seg[0]));
    unsigned char *addr = malloc(h->addr_len);
    if (v == NULL || addr == NULL) {
        free(v);
        free(addr);
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    v->be = be;
    v->op = (uint8_t)h->op;
    v->rid = h->rid;
    v->worker = w;
    /* The connection it came over (requests are sent with a reply
     * endpoint): an identity only, never used (ucx_client_get). */
    v->via = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) &&
                     w == be->worker
                 ? (const void *)param->reply_ep
                 : NULL;
    v->nseg = h->nseg;
    v->bytes = h->bytes;
    v->slot = UINT32_MAX;
    v->dev = -1;
    v->addr = addr;
    v->addr_len = h->addr_len;
    memcpy(addr, h->addr, h->addr_len);
    snprintf(v->peer, sizeof(v->peer), "%s", h->name);
    ucx_list_init(&v->link);
    st->nsvc++;
    pdx_status_t why;
    const char *bad = svc_refusal(be, h, length, rndv, &why);
    ucs_status_t ret = UCS_OK;
    if (bad != NULL) {
        pdx_warn("ucx: staged %s from %s refused: %s",
                 h->op == OP_SW ? "WRITE" : "READ", h->name, bad);
        v->nseg = 0; /* nothing checked, nothing held */
        svc_end(v, why);
        if (rndv) {
            ret = UCS_ERR_INVALID_PARAM; /* UCX releases the data */
        }
    } else if (h->op == OP_SR) {
        uint64_t sum = 0;
        pdx_status_t cst = svc_check(be, v, data, &sum);
        if (cst == PDX_OK && sum != h->bytes) {
            cst = PDX_ERR_INVALID;
        }
        if (cst != PDX_OK) {
            svc_end(v, cst);
        } else {
            ucx_list_push(&st->svc_wait, &v->link);
            st->kick = 1;
            return UCS_OK;
        }
    } else if (!rndv) {
        /* Small enough to come eager: landed now if a slot is free. */
        v->payload = length;
        v->slot = ucx_vram_slot_get(be, 1);
        if (v->slot == UINT32_MAX) {
            svc_end(v, PDX_ERR_BUSY);
        } else {
            memcpy(ucx_vram_slot_ptr(be, v->slot), data, length);
            v->phase = SVC_LANDED;
        }
    } else {
        v->payload = length;
        v->desc = data;
        ucx_list_push(&st->svc_wait, &v->link);
        st->kick = 1;
        return UCS_INPROGRESS;
    }
    ucx_list_push(&st->svc_active, &v->link);
    st->kick = 1;
    return ret;
}

/* ---- progress ------------------------------------------------------------ */

int ucx_svc_progress(ucx_be_t *be)
{
    struct ucx_stage_state *st = be->st;
    int n = 0;
    ucx_link_t *l = st->svc_active.next;
    while (l != &st->svc_active) {
        ucx_svc_t *v = UCX_CONTAINER(l, ucx_svc_t, link);
        l = l->next;
        if (v->ev != NULL) {
            int d = ucx_vram_copy_done(be, v->dev, v->ev);
            if (d == 0) {
                continue;
            }
            v->ev = NULL;
            st->copies--;
            n++;
            /* In the GPU (SA), or out of it into the slot (SD). */
            svc_end(v, d < 0 ? PDX_ERR_BACKEND : PDX_OK);
        }
        if (v->phase == SVC_LANDED) {
            n++;
            svc_sw_landed(be, v);
        }
        if (v->phase == SVC_ANSWER) {
            n++;
            svc_answer(be, v);
        }
        if (v->phase == PH_END && v->ucx_pending == 0 && v->ev == NULL) {
            svc_free(be, v);
        }
    }
    while (!ucx_list_empty(&st->svc_wait)) {
        ucx_svc_t *v = UCX_CONTAINER(st->svc_wait.next, ucx_svc_t, link);
        v->slot = ucx_vram_slot_get(be, 1);
        if (v->slot == UINT32_MAX) {
            break;
        }
        svc_start(be, v);
        n++;
    }
    /* Requesters whose endpoint failed, once nothing goes to them. */
    l = st->clients.live.next;
    while (l != &st->clients.live) {
        ucx_client_t *c = UCX_CONTAINER(l, ucx_client_t, link);
        l = l->next;
        if (c->failed && c->users == 0) {
            ucx_client_close(c);
        }
    }
    return n;
}

void ucx_stage_region_gone(ucx_be_t *be, ucx_md_t *md)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL || md->svc_busy == 0) {
        return;
    }
    ucx_link_t *lists[2] = {&st->svc_active, &st->svc_wait};
    for (int k = 0; k < 2; k++) {
        ucx_link_t *l = lists[k]->next;
        while (l != lists[k]) {
            ucx_svc_t *v = UCX_CONTAINER(l, ucx_svc_t, link);
            l = l->next;
            int uses = 0;
            for (uint32_t i = 0; v->held && i < v->nseg; i++) {
                uses |= v->seg[i].md == md;
            }
            if (!uses) {
                continue;
            }
            if (v->ev != NULL) {
                /* A copy to or from the region in flight: it ends before
                 * the region may go (bounded by the copy itself). */
                ucx_vram_copy_wait(be, v->dev, v->ev);
                v->ev = NULL;
                st->copies--;
            }
            if (k == 1) {
                ucx_list_del(&v->link);
                ucx_list_push(&st->svc_active, &v->link);
            }
            if (v->phase != PH_END) {
                v->status = PDX_OK;
                svc_end(v, PDX_ERR_STALE);
            }
            /* Its segments no longer name the region. */
            for (uint32_t i = 0; i < v->nseg; i++) {
                if (v->seg[i].md != NULL) {
                    v->seg[i].md->svc_busy--;
                    v->seg[i].md = NULL;
                }
            }
            v->held = 0;
        }
    }
}

void ucx_svc_worker_gone(ucx_be_t *be, ucp_worker_h w)
{
    struct ucx_stage_state *st = be->st;
    ucx_link_t *lists[2] = {&st->svc_active, &st->svc_wait};
    for (int k = 0; k < 2; k++) {
        ucx_link_t *l = lists[k]->next;
        while (l != lists[k]) {
            ucx_svc_t *v = UCX_CONTAINER(l, ucx_svc_t, link);
            l = l->next;
            if (v->worker != w) {
                continue;
            }
            v->desc = NULL; /* UCX freed it with the worker */
            if (v->ev != NULL) {
                ucx_vram_copy_wait(be, v->dev, v->ev);
                v->ev = NULL;
                st->copies--;
            }
            if (v->client == NULL || w == be->worker) {
                svc_free(be, v);
            }
        }
    }
    if (w == be->worker) {
        /* The clients' endpoints went with the main worker. */
        ucx_clients_drop(&st->clients);
    }
}

int ucx_svc_quiesce(ucx_be_t *be)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL) {
        return 0;
    }
    int busy = ucx_clients_shut(&st->clients);
    for (ucx_link_t *l = st->svc_active.next; !busy && l != &st->svc_active;
         l = l->next) {
        busy = UCX_CONTAINER(l, ucx_svc_t, link)->ucx_pending > 0;
    }
    return busy;
}

void ucx_svc_fini(ucx_be_t *be)
{
    ucx_svc_worker_gone(be, be->worker);
}
