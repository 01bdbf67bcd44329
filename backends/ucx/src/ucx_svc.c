/* ucx: the service this instance gives peers' staged requests: SW (a
 * peer's data for our GPU: received into a slot of the service's half of
 * the pool, its table checked, copied to the device, acknowledged with
 * SA once it is there) and SR (our GPU's data for a peer: its table
 * checked, copied into a slot, sent back with SD). Every byte a peer sent
 * is checked before any device copy; answers go to the requester's reply
 * endpoint (a peer we never loaded is served too). Driven by this
 * instance's progress, never by a wait. */
#include "ucx_stage_int.h"

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
    ucx_list_del(&v->link);
    be->st->nsvc--;
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

/* Answer a service request: SA (a WRITE's status) or SD (a READ's data
 * from the slot, or its error). The request ends with the send. */
static void svc_answer(ucx_be_t *be, ucx_svc_t *v, pdx_status_t st)
{
    int sd = v->op == OP_SR;
    int data = sd && st == PDX_OK;
    v->hdr_len = ucx_shdr_make(be, v->hdr, sd ? OP_SD : OP_SA, 0, st, v->rid,
                          data ? v->bytes : 0);
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
    v->phase = PH_END;
    if (v->reply_ep == NULL) {
        return;
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(
        v->reply_ep, UCX_AM_ID_STAGE, v->hdr, v->hdr_len,
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
        svc_answer(be, v, st);
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
        svc_answer(be, v, st);
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
    v->desc = NULL;
    v->be->st->kick = 1;
    v->status = status != UCS_OK ? ucx_status(status)
                : length != v->payload ? PDX_ERR_INVALID
                                       : PDX_OK;
    v->phase = PH_UCX; /* the next stage progress moves it on */
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
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(
        v->worker, desc, ucx_vram_slot_ptr(be, v->slot), v->payload, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        v->desc = NULL;
        svc_answer(be, v, ucx_status(UCS_PTR_STATUS(sp)));
    } else if (sp == NULL) {
        v->desc = NULL;
        svc_sw_landed(be, v);
    } else {
        v->ucx_pending++;
    }
}

/* A peer's SW or SR arrived on `w`. */
ucs_status_t ucx_svc_request(ucx_be_t *be, ucp_worker_h w, const shdr_t *h,
                             void *data, size_t length,
                             const ucp_am_recv_param_t *param, int rndv)
{
    struct ucx_stage_state *st = ucx_stage_state(be);
    ucp_ep_h reply = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
                         ? param->reply_ep
                         : NULL;
    uint64_t slot = ucx_vram_slot_size(be);
    uint64_t table = (uint64_t)h->nseg * SEG_LEN;
    const char *bad = NULL;
    pdx_status_t why = PDX_ERR_INVALID;
    if (st == NULL) {
        bad = "out of memory";
        why = PDX_ERR_NOMEM;
    } else if (slot == 0 || be->vram == NULL) {
        bad = "this agent stages no GPU memory";
        why = PDX_ERR_UNSUPPORTED;
    } else if (h->nseg == 0 || h->nseg > STAGE_MAX_SEGS) {
        bad = "segment count out of bounds";
    } else if (h->op == OP_SW &&
               (length != table + h->bytes || length > slot)) {
        bad = "payload does not match its header or exceeds a slot";
    } else if (h->op == OP_SR && (length != table || rndv ||
                                  h->bytes > slot || h->bytes == 0)) {
        bad = "table does not match its header, or asks over a slot";
    } else if (st->nsvc >= SVC_QUEUE_MAX) {
        bad = "too many staged requests queued";
        why = PDX_ERR_BUSY;
    } else if (reply == NULL) {
        bad = "no reply endpoint";
    }
    ucx_svc_t *v = NULL;
    if (bad == NULL) {
        v = calloc(1, sizeof(*v) + h->nseg * sizeof(v->seg[0]));
        if (v != NULL) {
            v->be = be;
        }
        if (v == NULL) {
            bad = "out of memory";
            why = PDX_ERR_NOMEM;
        }
    }
    if (bad != NULL) {
        pdx_warn("ucx: staged %s from %s refused: %s",
                 h->op == OP_SW ? "WRITE" : "READ", h->name, bad);
        if (reply != NULL && st != NULL) {
            ucx_svc_t tmp = {.op = (uint8_t)h->op, .rid = h->rid,
                             .reply_ep = reply};
            unsigned char hb[SHDR_LEN + UCX_MAX_NAME];
            size_t hl = ucx_shdr_make(be, hb, h->op == OP_SR ? OP_SD : OP_SA, 0,
                                 why, tmp.rid, 0);
            ucp_request_param_t rp = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                .flags = UCP_AM_SEND_FLAG_EAGER,
            };
            ucs_status_ptr_t sp = ucp_am_send_nbx(reply, UCX_AM_ID_STAGE, hb,
                                                  hl, NULL, 0, &rp);
            if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
                /* The header was copied for an eager send. */
                ucp_request_free(sp);
            }
        }
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    v->op = (uint8_t)h->op;
    v->rid = h->rid;
    v->reply_ep = reply;
    v->worker = w;
    v->nseg = h->nseg;
    v->bytes = h->bytes;
    v->slot = UINT32_MAX;
    v->dev = -1;
    snprintf(v->peer, sizeof(v->peer), "%s", h->name);
    ucx_list_init(&v->link);
    st->nsvc++;
    if (h->op == OP_SR) {
        uint64_t sum = 0;
        pdx_status_t cst = svc_check(be, v, data, &sum);
        if (cst == PDX_OK && sum != h->bytes) {
            cst = PDX_ERR_INVALID;
        }
        ucx_list_push(&st->svc_active, &v->link);
        if (cst != PDX_OK) {
            svc_answer(be, v, cst);
            return UCS_OK;
        }
        ucx_list_del(&v->link);
        ucx_list_push(&st->svc_wait, &v->link);
        return UCS_OK;
    }
    v->payload = length;
    if (!rndv) {
        /* Small enough to come eager: handled now if a slot is free. */
        v->slot = ucx_vram_slot_get(be, 1);
        ucx_list_push(&st->svc_active, &v->link);
        if (v->slot == UINT32_MAX) {
            svc_answer(be, v, PDX_ERR_BUSY);
            return UCS_OK;
        }
        memcpy(ucx_vram_slot_ptr(be, v->slot), data, length);
        svc_sw_landed(be, v);
        return UCS_OK;
    }
    v->desc = data;
    ucx_list_push(&st->svc_wait, &v->link);
    return UCS_INPROGRESS;
}

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
            if (d < 0) {
                svc_answer(be, v, PDX_ERR_BACKEND);
            } else if (v->phase == PH_H2D) {
                svc_answer(be, v, PDX_OK); /* in the GPU: SA */
            } else {
                svc_answer(be, v, PDX_OK); /* out of the GPU: SD */
            }
        } else if (v->phase == PH_UCX) {
            /* SW's data landed (svc_recv_cb). */
            n++;
            if (v->status != PDX_OK) {
                svc_answer(be, v, v->status);
            } else {
                svc_sw_landed(be, v);
            }
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
            if (v->phase != PH_END) {
                if (k == 1) {
                    ucx_list_del(&v->link);
                    ucx_list_push(&st->svc_active, &v->link);
                }
                svc_answer(be, v, PDX_ERR_STALE);
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
    ucx_link_t *l;
    for (l = st->svc_active.next; l != &st->svc_active;) {
        ucx_svc_t *v = UCX_CONTAINER(l, ucx_svc_t, link);
        l = l->next;
        if (v->worker == w) {
            v->desc = NULL; /* UCX freed it with the worker */
            if (v->ev != NULL) {
                ucx_vram_copy_wait(be, v->dev, v->ev);
                st->copies--;
            }
            svc_free(be, v);
        }
    }
    for (l = st->svc_wait.next; l != &st->svc_wait;) {
        ucx_svc_t *v = UCX_CONTAINER(l, ucx_svc_t, link);
        l = l->next;
        if (v->worker == w) {
            v->desc = NULL;
            svc_free(be, v);
        }
    }
}

void ucx_svc_fini(ucx_be_t *be)
{
    struct ucx_stage_state *st = be->st;
    while (!ucx_list_empty(&st->svc_active)) {
        ucx_svc_t *v = UCX_CONTAINER(st->svc_active.next, ucx_svc_t, link);
        v->desc = NULL;
        if (v->ev != NULL) {
            ucx_vram_copy_wait(be, v->dev, v->ev);
            st->copies--;
        }
        svc_free(be, v);
    }
    while (!ucx_list_empty(&st->svc_wait)) {
        ucx_svc_t *v = UCX_CONTAINER(st->svc_wait.next, ucx_svc_t, link);
        v->desc = NULL;
        svc_free(be, v);
    }
}
