/* ucx: transfers that stage GPU memory through pinned host buffers, and
 * the service this instance gives peers' staged requests (the protocol:
 * backends/ucx/README.md, "GPU memory").
 *
 * A request with a staged piece runs as jobs of at most a slot's bytes,
 * up to stage_window of them at once, each a small state machine moved on
 * by UCX's callbacks, the staged AMs and stage progress (device copies
 * polled), never by a wait:
 *   direct   host memory both sides (or native VRAM): puts or gets
 *   local    our VRAM staged, the peer's memory reached by RMA: a device
 *            copy into a slot and puts from it (WRITE), or gets into a
 *            slot and a device copy out of it (READ)
 *   remote   the peer's VRAM, staged by its own progress: the data goes
 *            with an active message (SW) the peer copies to its GPU and
 *            acknowledges (SA), or the peer copies it out and sends it
 *            back (SR, answered by SD); our side from host memory as it
 *            is, or through a slot for our own VRAM.
 * The service (the peer side of SW/SR) checks every byte of a request
 * against its own registrations (token, bounds, device, read-only)
 * before any device copy, and answers on the requester's reply endpoint,
 * so a peer it never loaded is served too. */
#include "ucx_stage_int.h"

/* ---- which pieces stage ---------------------------------------------- */

static int piece_kind(const pdx_backend_iov_t *v, int *lstaged)
{
    const ucx_md_t *md = v->local_md;
    const ucx_rmd_t *rmd = v->remote_md;
    *lstaged = md->type == PDX_MEM_VRAM && md->memh == NULL;
    if (rmd->type == PDX_MEM_VRAM && rmd->staged) {
        return KIND_REMOTE;
    }
    return *lstaged ? KIND_LOCAL : KIND_DIRECT;
}

int ucx_stage_needed(const ucx_be_t *be, const pdx_backend_iov_t *iov,
                     size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int ls;
        if (piece_kind(&iov[i], &ls) != KIND_DIRECT) {
            return 1;
        }
    }
    return 0;
}

int ucx_stage_busy(const ucx_req_t *r)
{
    const ucx_sreq_t *s = r->sreq;
    return s != NULL && (s->active > 0 || s->flushing);
}

int ucx_stage_copying(const ucx_be_t *be)
{
    return be->st != NULL && (be->st->copies > 0 || be->st->kick);
}

/* ---- building a request's jobs --------------------------------------- */

static ucx_job_t *job_new(ucx_sreq_t *s, int kind, int lstaged, int dev)
{
    ucx_job_t *j = calloc(1, sizeof(*j) + STAGE_MAX_SEGS * sizeof(ucx_seg_t));
    if (j == NULL) {
        return NULL;
    }
    j->sreq = s;
    j->kind = (uint8_t)kind;
    j->lstaged = (uint8_t)lstaged;
    j->dev = dev;
    j->slot = UINT32_MAX;
    j->phase = PH_IDLE;
    ucx_list_init(&j->link);
    return j;
}

static pdx_status_t jobs_add(ucx_sreq_t *s, ucx_job_t *j)
{
    if ((s->njobs & (s->njobs - 1)) == 0) {
        uint32_t cap = s->njobs ? s->njobs * 2 : 4;
        ucx_job_t **a = realloc(s->jobs, cap * sizeof(*a));
        if (a == NULL) {
            return PDX_ERR_NOMEM;
        }
        s->jobs = a;
    }
    s->jobs[s->njobs++] = j;
    return PDX_OK;
}

/* The data bytes a job of this kind may carry: a slot of ours for our
 * staged VRAM, a slot of the peer's (its table included) for its. */
static uint64_t job_cap(ucx_be_t *be, int kind, int lstaged,
                        const ucx_rmd_t *rmd)
{
    uint64_t cap = kind == KIND_DIRECT ? UINT64_MAX : be->stage_chunk;
    if (kind == KIND_REMOTE) {
        /* The peer's slot holds the payload: the table and the data. */
        uint64_t peer = rmd->slot - (uint64_t)STAGE_MAX_SEGS * SEG_LEN;
        cap = lstaged && be->stage_chunk < peer ? be->stage_chunk : peer;
    }
    return cap;
}

/* Staged jobs of a small request are cut to a quarter of it (not below
 * STAGE_SUB_MIN): a single 1 MiB piece then runs as four jobs whose device
 * copies overlap the wire, instead of one whose copies and transfer run
 * one after the other. */
#define STAGE_SUB_MIN (128u << 10)

static uint64_t sub_cap(const pdx_backend_iov_t *iov, size_t n)
{
    uint64_t total = 0;
    for (size_t i = 0; i < n && total < UINT64_MAX / 2; i++) {
        total += iov[i].len;
    }
    uint64_t q = (total / 4 + 4095) & ~4095ull;
    return q < STAGE_SUB_MIN ? STAGE_SUB_MIN : q;
}

static pdx_status_t sreq_build(ucx_be_t *be, ucx_sreq_t *s,
                               const pdx_backend_iov_t *iov, size_t n)
{
    ucx_job_t *j = NULL;
    int jrdev = -1;
    uint64_t cap = 0, sub = sub_cap(iov, n);
    for (size_t i = 0; i < n; i++) {
        int ls;
        int kind = piece_kind(&iov[i], &ls);
        ucx_md_t *md = iov[i].local_md;
        ucx_rmd_t *rmd = iov[i].remote_md;
        int dev = ls ? md->dev : -1;
        int rdev = kind == KIND_REMOTE ? (int)rmd->dev : -1;
        uint64_t off = 0;
        while (off < iov[i].len) {
            if (j == NULL || j->kind != kind || j->lstaged != ls ||
                j->dev != dev || jrdev != rdev || j->nseg == STAGE_MAX_SEGS ||
                j->bytes >= cap) {
                if (j != NULL && jobs_add(s, j) != PDX_OK) {
                    free(j);
                    return PDX_ERR_NOMEM;
                }
                j = job_new(s, kind, ls, dev);
                if (j == NULL) {
                    return PDX_ERR_NOMEM;
                }
                jrdev = rdev;
                cap = job_cap(be, kind, ls, rmd);
                if (kind != KIND_DIRECT && sub < cap) {
                    cap = sub;
                }
            }
            uint64_t len = iov[i].len - off;
            if (len > cap - j->bytes) {
                len = cap - j->bytes;
            }
            if (kind == KIND_DIRECT && len > be->max_chunk) {
                len = be->max_chunk;
            }
            j->seg[j->nseg++] = (ucx_seg_t){.laddr = iov[i].local_addr + off,
                                            .raddr = iov[i].remote_addr + off,
                                            .len = len,
                                            .md = md,
                                            .rmd = rmd};
            j->bytes += len;
            off += len;
        }
    }
    if (j != NULL && jobs_add(s, j) != PDX_OK) {
        free(j);
        return PDX_ERR_NOMEM;
    }
    return PDX_OK;
}

/* ---- a job's steps ----------------------------------------------------- */

static void sreq_pump(ucx_be_t *be, ucx_sreq_t *s);
static void sreq_end_data(ucx_be_t *be, ucx_sreq_t *s);
static void job_advance(ucx_be_t *be, ucx_job_t *j);

/* The end of `j` (status `st`) once nothing of it is in flight. */
static void job_fail(ucx_job_t *j, pdx_status_t st)
{
    if (j->status == PDX_OK && st != PDX_OK) {
        j->status = st;
    }
    j->phase = PH_END;
}

static void job_copy(ucx_be_t *be, ucx_job_t *j, int to_host, int phase)
{
    ucx_vseg_t vs[STAGE_MAX_SEGS];
    unsigned char *slot = ucx_vram_slot_ptr(be, j->slot);
    uint64_t off = 0;
    for (uint32_t i = 0; i < j->nseg; i++) {
        vs[i] = (ucx_vseg_t){.dptr = j->seg[i].laddr,
                             .host = slot + off,
                             .len = j->seg[i].len};
        off += j->seg[i].len;
    }
    pdx_status_t st = ucx_vram_copy(be, j->dev, to_host, vs, j->nseg, &j->ev);
    if (st != PDX_OK) {
        job_fail(j, st);
        return;
    }
    be->st->copies++;
    j->phase = (uint8_t)phase;
}

static void job_ucx_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_job_t *j = user_data;
    ucp_request_free(request);
    j->ucx_pending--;
    if (status != UCS_OK) {
        ucx_peer_t *p = j->sreq->peer;
        job_fail(j, p != NULL && p->ep_status != UCS_OK
                        ? PDX_ERR_REMOTE_DISCONNECT
                        : ucx_status(status));
    }
    if (j->kind == KIND_DIRECT || j->kind == KIND_LOCAL) {
        j->sreq->req->be->gets_done++; /* a drain's progress indicator */
    }
    job_advance(j->sreq->req->be, j);
}

/* Count a UCX request of `j`, or its immediate end or failure. */
static void job_ucx_track(ucx_job_t *j, ucs_status_ptr_t sp, int free_now)
{
    if (UCS_PTR_IS_ERR(sp)) {
        ucx_peer_t *p = j->sreq->peer;
        ucs_status_t s = UCS_PTR_STATUS(sp);
        pdx_log(ucx_op_log_level(s, p != NULL ? p->ep_status : UCS_OK),
                "ucx: peer %s: a staged transfer's operation failed: %s",
                p != NULL ? p->name : "(gone)", ucs_status_string(s));
        job_fail(j, p != NULL && p->ep_status != UCS_OK
                        ? PDX_ERR_REMOTE_DISCONNECT
                        : ucx_status(s));
    } else if (sp != NULL && free_now) {
        ucp_request_free(sp);
    } else if (sp != NULL) {
        j->ucx_pending++;
    }
}

/* Puts or gets of the job's segments: from and to our memory as it is
 * (direct), or from and to the slot (local). */
static void job_rma(ucx_be_t *be, ucx_job_t *j)
{
    ucx_sreq_t *s = j->sreq;
    ucx_peer_t *p = s->peer;
    int write = s->req->op == PDX_XFER_WRITE;
    unsigned char *slot =
        j->kind == KIND_LOCAL ? ucx_vram_slot_ptr(be, j->slot) : NULL;
    uint64_t off = 0;
    j->phase = PH_UCX;
    for (uint32_t i = 0; i < j->nseg && j->status == PDX_OK; i++) {
        ucx_seg_t *g = &j->seg[i];
        void *laddr = slot != NULL ? (void *)(slot + off)
                                   : (void *)(uintptr_t)g->laddr;
        ucp_request_param_t rp = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = job_ucx_cb,
            .user_data = j,
        };
        if (slot != NULL) {
            rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            rp.memh = ucx_vram_pool_memh(be);
        }
        /* A direct WRITE's puts are ended by the request's flush; a
         * staged one's free their slot on their own completion. */
        int fire_forget = write && slot == NULL;
        if (fire_forget) {
            rp.op_attr_mask = 0;
        }
        ucs_status_ptr_t sp =
            write ? ucp_put_nbx(p->ep, laddr, g->len, g->raddr, g->rmd->rkey,
                                &rp)
                  : ucp_get_nbx(p->ep, laddr, g->len, g->raddr, g->rmd->rkey,
                                &rp);
        job_ucx_track(j, sp, fire_forget);
        off += g->len;
    }
    if (write) {
        s->puts = 1;
    }
}

/* The SW of a remote WRITE: its table and data (the slot, or our host
 * memory as it is), rendezvous (the peer pulls it when it has a slot). */
static void job_send_sw(ucx_be_t *be, ucx_job_t *j)
{
    ucx_sreq_t *s = j->sreq;
    uint32_t niov = j->lstaged ? 2 : 1 + j->nseg;
    j->iov = calloc(niov, sizeof(*j->iov));
    if (j->iov == NULL) {
        job_fail(j, PDX_ERR_NOMEM);
        return;
    }
    j->iov[0] = (ucp_dt_iov_t){j->table, j->table_len};
    if (j->lstaged) {
        j->iov[1] = (ucp_dt_iov_t){ucx_vram_slot_ptr(be, j->slot), j->bytes};
    } else {
        for (uint32_t i = 0; i < j->nseg; i++) {
            j->iov[1 + i] = (ucp_dt_iov_t){
                (void *)(uintptr_t)j->seg[i].laddr, j->seg[i].len};
        }
    }
    j->hdr_len = ucx_shdr_make(be, j->hdr, OP_SW, j->nseg, PDX_OK, j->rid,
                               j->bytes, s->wctx->addr, s->wctx->addr_len);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS |
                        UCP_OP_ATTR_FIELD_DATATYPE,
        /* REPLY: the service tells our connection from an older one. */
        .flags = UCP_AM_SEND_FLAG_RNDV | UCP_AM_SEND_FLAG_REPLY,
        .cb.send = job_ucx_cb,
        .user_data = j,
        .datatype = ucp_dt_make_iov(),
    };
    j->phase = PH_PEER;
    j->peer_ns = pdx_now_ns();
    job_ucx_track(j, ucp_am_send_nbx(s->peer->ep, UCX_AM_ID_STAGE, j->hdr,
                                     j->hdr_len, j->iov, niov, &rp),
                  0);
}

/* The SR of a remote READ: its table, eager. */
static void job_send_sr(ucx_be_t *be, ucx_job_t *j)
{
    j->hdr_len = ucx_shdr_make(be, j->hdr, OP_SR, j->nseg, PDX_OK, j->rid,
                               j->bytes, j->sreq->wctx->addr,
                               j->sreq->wctx->addr_len);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
        .cb.send = job_ucx_cb,
        .user_data = j,
    };
    j->phase = PH_PEER;
    j->peer_ns = pdx_now_ns();
    job_ucx_track(j, ucp_am_send_nbx(j->sreq->peer->ep, UCX_AM_ID_STAGE,
                                     j->hdr, j->hdr_len, j->table,
                                     j->table_len, &rp),
                  0);
}

/* Start `j` (its slot, if it needs one, taken). */
static void job_start(ucx_be_t *be, ucx_job_t *j)
{
    ucx_sreq_t *s = j->sreq;
    int write = s->req->op == PDX_XFER_WRITE;
    ucx_list_push(&be->st->jobs, &j->link);
    if (s->peer == NULL || s->peer->ep == NULL) {
        job_fail(j, PDX_ERR_REMOTE_DISCONNECT);
        return;
    }
    if (j->kind == KIND_REMOTE) {
        j->table_len = (size_t)j->nseg * SEG_LEN;
        j->table = malloc(j->table_len);
        j->hdr = malloc(SHDR_LEN + UCX_MAX_NAME + s->wctx->addr_len);
        if (j->table == NULL || j->hdr == NULL ||
            ucx_idtab_add(&be->st->ids, j, &j->rid) != PDX_OK) {
            job_fail(j, PDX_ERR_NOMEM);
            return;
        }
        for (uint32_t i = 0; i < j->nseg; i++) {
            unsigned char *t = j->table + (size_t)i * SEG_LEN;
            ucx_put_le(t, j->seg[i].rmd->token, 8);
            ucx_put_le(t + 8, j->seg[i].raddr, 8);
            ucx_put_le(t + 16, j->seg[i].len, 8);
        }
    }
    if (write && j->lstaged) {
        job_copy(be, j, 1, PH_D2H); /* then SW or puts */
    } else if (j->kind == KIND_REMOTE) {
        if (write) {
            job_send_sw(be, j);
        } else {
            job_send_sr(be, j);
        }
    } else {
        job_rma(be, j);
    }
}

/* Free what `j` holds once nothing of it is in flight. */
static void job_release(ucx_be_t *be, ucx_job_t *j)
{
    ucx_vram_slot_put(be, j->slot);
    j->slot = UINT32_MAX;
    ucx_idtab_del(&be->st->ids, j, &j->rid);
    free(j->table);
    j->table = NULL;
    free(j->hdr);
    j->hdr = NULL;
    free(j->iov);
    j->iov = NULL;
}

/* Move `j` on after an event: its next step, or its end once nothing of
 * it is in flight. An aborted job stops at the next step, but one whose
 * peer acts on it (SW sent, SR asked) waits for the answer first. */
static void job_advance(ucx_be_t *be, ucx_job_t *j)
{
    ucx_sreq_t *s = j->sreq;
    int write = s->req->op == PDX_XFER_WRITE;
    if (j->status != PDX_OK && !write && j->kind == KIND_REMOTE &&
        j->phase == PH_PEER && j->slot != UINT32_MAX) {
        /* A failed READ whose SR UCX still holds (a peer that never
         * wired up): UCX holds only its header and table, not the slot
         * its data was to land in, and no data lands any more (on_sd
         * drops it): the slot goes back now. */
        ucx_vram_slot_put(be, j->slot);
        j->slot = UINT32_MAX;
        be->st->kick = 1;
    }
    for (;;) {
        if (j->ucx_pending > 0 || j->ev != NULL || j->ended) {
            return;
        }
        if (j->status != PDX_OK || j->phase == PH_END) {
            break;
        }
        if (j->phase == PH_PEER) {
            return; /* on_answer moves it on */
        }
        if (s->req->aborted || s->peer == NULL) {
            job_fail(j, s->peer == NULL ? PDX_ERR_REMOTE_DISCONNECT
                                        : PDX_ERR_CANCELED);
            break;
        }
        switch (j->phase) {
        case PH_D2H: /* our VRAM is in the slot */
            if (j->kind == KIND_REMOTE) {
                job_send_sw(be, j);
            } else {
                job_rma(be, j);
            }
            break;
        case PH_UCX: /* the puts or gets ended */
            if (!write && j->kind == KIND_LOCAL) {
                job_copy(be, j, 0, PH_H2D);
            } else {
                j->phase = PH_END;
            }
            break;
        case PH_RECV: /* SD's data arrived */
            if (j->lstaged) {
                job_copy(be, j, 0, PH_H2D);
            } else {
                j->phase = PH_END;
            }
            break;
        default:
            j->phase = PH_END;
            break;
        }
    }
    j->ended = 1;
    j->phase = PH_END;
    job_release(be, j);
    ucx_list_del(&j->link);
    if (j->status != PDX_OK && s->status == PDX_OK) {
        s->status = j->status;
    }
    s->active--;
    s->ended++;
    be->st->kick = 1; /* a slot or a window place back */
    if (!s->pumping) {
        sreq_pump(be, s);
    }
}

/* Start what the window and the pool allow; end the data stage once
 * every job ended (or no more will start). */
static void sreq_pump(ucx_be_t *be, ucx_sreq_t *s)
{
    if (s->finished) {
        return;
    }
    s->pumping = 1;
    while (s->next < s->njobs && s->active < be->stage_window &&
           s->status == PDX_OK && !s->req->aborted && s->peer != NULL) {
        ucx_job_t *j = s->jobs[s->next];
        if (j->lstaged) {
            j->slot = ucx_vram_slot_get(be, 0);
            if (j->slot == UINT32_MAX) {
                break; /* a slot back in the pool pumps again */
            }
        }
        s->next++;
        s->active++;
        job_start(be, j);
        job_advance(be, j);
    }
    s->pumping = 0;
    if (s->active == 0 &&
        (s->next == s->njobs || s->status != PDX_OK || s->req->aborted ||
         s->peer == NULL)) {
        sreq_end_data(be, s);
    }
}

static void sreq_flush_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_sreq_t *s = user_data;
    ucp_request_free(request);
    s->flushing = 0;
    if (status != UCS_OK && s->status == PDX_OK) {
        s->status = s->peer != NULL && s->peer->ep_status != UCS_OK
                        ? PDX_ERR_REMOTE_DISCONNECT
                        : ucx_status(status);
    }
    s->done(s->req, s->status);
}

/* Every job ended: a flush where puts went out (their bytes landed once
 * it ends), then the request's data stage ends. */
static void sreq_end_data(ucx_be_t *be, ucx_sreq_t *s)
{
    s->finished = 1;
    ucx_list_del(&s->link);
    if (s->status == PDX_OK && s->next < s->njobs) {
        s->status = s->req->aborted ? PDX_ERR_CANCELED
                                    : PDX_ERR_REMOTE_DISCONNECT;
    }
    if (s->status == PDX_OK && s->puts && s->peer != NULL &&
        s->peer->ep != NULL && !s->req->aborted) {
        ucp_request_param_t fp = {
            .op_attr_mask =
                UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = sreq_flush_cb,
            .user_data = s,
        };
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(s->peer->ep, &fp);
        if (UCS_PTR_IS_ERR(sp)) {
            s->status = ucx_status(UCS_PTR_STATUS(sp));
        } else if (sp != NULL) {
            s->flushing = 1;
            return;
        }
    }
    s->done(s->req, s->status);
}

pdx_status_t ucx_stage_post(ucx_be_t *be, ucx_req_t *r,
                            const pdx_backend_iov_t *iov, size_t n,
                            ucx_stage_done_cb_t done)
{
    if (ucx_stage_state(be) == NULL) {
        return PDX_ERR_NOMEM;
    }
    ucx_sreq_t *s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return PDX_ERR_NOMEM;
    }
    s->req = r;
    s->done = done;
    s->peer = r->peer;
    s->worker = r->worker;
    s->wctx = r->peer->own_worker ? &r->peer->wctx : &be->main_wctx;
    if (s->wctx->addr_len > STAGE_MAX_ADDR) {
        pdx_error("ucx: our worker address of %zu bytes is over the staged "
                  "protocol's %u", s->wctx->addr_len, STAGE_MAX_ADDR);
        free(s);
        return PDX_ERR_TOO_LARGE;
    }
    ucx_list_init(&s->link);
    pdx_status_t st = sreq_build(be, s, iov, n);
    if (st != PDX_OK) {
        for (uint32_t i = 0; i < s->njobs; i++) {
            free(s->jobs[i]);
        }
        free(s->jobs);
        free(s);
        return st;
    }
    r->sreq = s;
    ucx_list_push(&be->st->sreqs, &s->link);
    sreq_pump(be, s);
    return PDX_INPROGRESS;
}

void ucx_stage_abort(ucx_req_t *r)
{
    ucx_sreq_t *s = r->sreq;
    if (s == NULL || s->finished) {
        return;
    }
    /* No new job starts (sreq_pump looks at r->aborted); those started
     * finish, the peer's part included, and then the request ends. */
    if (s->active == 0) {
        sreq_pump(r->be, s);
    }
}

void ucx_stage_free(ucx_req_t *r)
{
    ucx_sreq_t *s = r->sreq;
    if (s == NULL) {
        return;
    }
    for (uint32_t i = 0; i < s->njobs; i++) {
        ucx_job_t *j = s->jobs[i];
        if (!j->ended) {
            job_release(r->be, j);
            ucx_list_del(&j->link);
        }
        free(j);
    }
    if (!s->finished) {
        ucx_list_del(&s->link);
    }
    free(s->jobs);
    free(s);
    r->sreq = NULL;
}

/* ---- the peer's answers: SA and SD ------------------------------------ */

static void sd_recv_cb(void *request, ucs_status_t status, size_t length,
                       void *user_data)
{
    ucx_job_t *j = user_data;
    ucp_request_free(request);
    j->ucx_pending--;
    j->sreq->req->be->rx_rndv--;
    if (status != UCS_OK) {
        job_fail(j, ucx_status(status));
    } else if (length != j->bytes) {
        job_fail(j, PDX_ERR_BACKEND);
    }
    job_advance(j->sreq->req->be, j);
}

/* SD: the data of our READ, into the slot or our host memory. */
static ucs_status_t on_sd(ucx_be_t *be, ucx_job_t *j, const shdr_t *h,
                          void *data, size_t length, int rndv)
{
    if (j->sreq->req->aborted || j->status != PDX_OK) {
        /* No byte of an aborted or failed READ lands: its data is
         * dropped. */
        job_fail(j, PDX_ERR_CANCELED);
        if (rndv) {
            ucp_am_data_release(j->sreq->worker, data);
        }
        job_advance(be, j);
        return UCS_OK;
    }
    if (h->status != PDX_OK || length != j->bytes || h->bytes != j->bytes) {
        if (h->status == PDX_OK) {
            pdx_error("ucx: peer %s: staged READ answered with %zu bytes, "
                      "%" PRIu64 " asked", h->name, length, j->bytes);
        }
        job_fail(j, h->status != PDX_OK ? ucx_peer_status(h->status)
                                        : PDX_ERR_BACKEND);
        if (rndv) {
            ucp_am_data_release(j->sreq->worker, data);
        }
        job_advance(be, j);
        return UCS_OK;
    }
    j->phase = PH_RECV;
    if (!rndv) {
        const unsigned char *p = data;
        if (j->lstaged) {
            memcpy(ucx_vram_slot_ptr(be, j->slot), p, length);
        } else {
            for (uint32_t i = 0; i < j->nseg; p += j->seg[i].len, i++) {
                memcpy((void *)(uintptr_t)j->seg[i].laddr, p, j->seg[i].len);
            }
        }
        job_advance(be, j);
        return UCS_OK;
    }
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = sd_recv_cb,
        .user_data = j,
    };
    void *buf;
    size_t count;
    if (j->lstaged) {
        buf = ucx_vram_slot_ptr(be, j->slot);
        count = length;
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        rp.memh = ucx_vram_pool_memh(be);
    } else {
        j->iov = calloc(j->nseg, sizeof(*j->iov));
        if (j->iov == NULL) {
            ucp_am_data_release(j->sreq->worker, data);
            job_fail(j, PDX_ERR_NOMEM);
            job_advance(be, j);
            return UCS_OK;
        }
        for (uint32_t i = 0; i < j->nseg; i++) {
            j->iov[i] = (ucp_dt_iov_t){(void *)(uintptr_t)j->seg[i].laddr,
                                       j->seg[i].len};
        }
        buf = j->iov;
        count = j->nseg;
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        rp.datatype = ucp_dt_make_iov();
    }
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(j->sreq->worker, data, buf,
                                               count, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        job_fail(j, ucx_status(UCS_PTR_STATUS(sp)));
    } else if (sp != NULL) {
        j->ucx_pending++;
        be->rx_rndv++;
    }
    job_advance(be, j);
    return UCS_INPROGRESS;
}

/* SA or SD for a job of ours. */
static ucs_status_t on_answer(ucx_be_t *be, const shdr_t *h, void *data,
                              size_t length, int rndv)
{
    ucx_job_t *j =
        be->st != NULL ? ucx_idtab_find(&be->st->ids, h->rid) : NULL;
    int read = h->op == OP_SD;
    if (j == NULL || j->kind != KIND_REMOTE || j->phase != PH_PEER ||
        (j->sreq->req->op == PDX_XFER_READ) != read ||
        j->sreq->peer == NULL || strcmp(j->sreq->peer->name, h->name) != 0) {
        /* Late (the job failed or was released), or not ours: dropped. */
        pdx_debug("ucx: a staged %s from %s for no job waiting on it: "
                  "dropped", read ? "SD" : "SA", h->name);
        if (rndv) {
            return UCS_ERR_INVALID_PARAM; /* UCX releases the data */
        }
        return UCS_OK;
    }
    if (!read) {
        if (h->status != PDX_OK) {
            job_fail(j, ucx_peer_status(h->status));
        } else {
            j->phase = PH_END;
        }
        job_advance(be, j);
        return UCS_OK;
    }
    return on_sd(be, j, h, data, length, rndv);
}

/* ---- the service: peers' SW and SR ------------------------------------ */

/* The AM handler of every worker of the instance: `arg` is the worker's
 * context (the instance and the worker). */
static ucs_status_t stage_am_cb(void *arg, const void *header,
                                size_t header_length, void *data,
                                size_t length,
                                const ucp_am_recv_param_t *param)
{
    ucx_wctx_t *wc = arg;
    ucx_be_t *be = wc->be;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    shdr_t h;
    if (ucx_shdr_parse(header, header_length, &h) != 0) {
        pdx_warn("ucx: a staged message with a malformed header (%zu "
                 "bytes): dropped", header_length);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (h.op == OP_SA || h.op == OP_SD) {
        return on_answer(be, &h, data, length, rndv);
    }
    return ucx_svc_request(be, wc->worker, &h, data, length, param, rndv);
}

pdx_status_t ucx_stage_set_handler(ucx_be_t *be, ucx_wctx_t *wc)
{
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = UCX_AM_ID_STAGE,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = stage_am_cb,
        .arg = wc,
    };
    ucs_status_t s = ucp_worker_set_am_recv_handler(wc->worker, &ap);
    if (s != UCS_OK) {
        pdx_error("ucx: setting the staged transfer handler failed: %s",
                  ucs_status_string(s));
        return ucx_status(s);
    }
    return PDX_OK;
}

/* ---- progress ---------------------------------------------------------- */

int ucx_stage_progress(ucx_be_t *be)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL) {
        return 0;
    }
    st->kick = 0;
    int n = 0;
    /* A job of an aborted or released request whose peer has not
     * answered within UCX_DRAIN_IDLE_NS: the peer is stalled (stopped, or
     * its host gone) and UCX cannot take back what it sends, so the
     * instance gives the peer up (ucx_progress), which ends them. */
    uint64_t now = 0;
    for (ucx_link_t *l = st->jobs.next; l != &st->jobs; l = l->next) {
        ucx_job_t *j = UCX_CONTAINER(l, ucx_job_t, link);
        ucx_req_t *r = j->sreq->req;
        if (j->phase != PH_PEER || !(r->aborted || r->released) ||
            j->sreq->peer == NULL) {
            continue;
        }
        now = now ? now : pdx_now_ns();
        if (now - j->peer_ns > UCX_DRAIN_IDLE_NS) {
            j->sreq->peer->stage_stalled = 1;
            be->stalled_hint = 1;
        }
    }
    if (st->copies > 0) {
        ucx_link_t *l = st->jobs.next;
        while (l != &st->jobs) {
            ucx_job_t *j = UCX_CONTAINER(l, ucx_job_t, link);
            l = l->next;
            if (j->ev == NULL) {
                continue;
            }
            int d = ucx_vram_copy_done(be, j->dev, j->ev);
            if (d == 0) {
                continue;
            }
            j->ev = NULL;
            st->copies--;
            n++;
            if (d < 0) {
                job_fail(j, PDX_ERR_BACKEND);
            }
            l = j->link.next; /* advancing may unlink it */
            job_advance(be, j);
        }
    }
    if (!ucx_list_empty(&st->svc_active) || !ucx_list_empty(&st->svc_wait)) {
        n += ucx_svc_progress(be);
    }
    /* Requests waiting for a slot of ours. */
    ucx_link_t *l = st->sreqs.next;
    while (l != &st->sreqs) {
        ucx_sreq_t *s = UCX_CONTAINER(l, ucx_sreq_t, link);
        l = l->next;
        if (s->next < s->njobs && s->active < be->stage_window) {
            sreq_pump(be, s);
        }
    }
    return n;
}

/* ---- peers, regions and the instance going away ----------------------- */

void ucx_stage_peer_failed(ucx_be_t *be, ucx_peer_t *peer)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL) {
        return;
    }
    ucx_link_t *l = st->jobs.next;
    while (l != &st->jobs) {
        ucx_job_t *j = UCX_CONTAINER(l, ucx_job_t, link);
        l = l->next;
        if (j->sreq->peer != peer) {
            continue;
        }
        /* The answer will not come; UCX ends its own requests. */
        if (j->phase == PH_PEER || j->phase == PH_IDLE) {
            job_fail(j, PDX_ERR_REMOTE_DISCONNECT);
            l = j->link.next;
            job_advance(be, j);
        } else {
            job_fail(j, PDX_ERR_REMOTE_DISCONNECT);
        }
    }
    for (l = st->sreqs.next; l != &st->sreqs;) {
        ucx_sreq_t *s = UCX_CONTAINER(l, ucx_sreq_t, link);
        l = l->next;
        if (s->peer == peer) {
            if (s->status == PDX_OK) {
                s->status = PDX_ERR_REMOTE_DISCONNECT;
            }
            sreq_pump(be, s);
        }
    }
}

/* `peer` is freed: nothing may point at it any more. */
void ucx_stage_peer_gone(ucx_be_t *be, ucx_peer_t *peer)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL) {
        return;
    }
    ucx_stage_peer_failed(be, peer);
    for (ucx_link_t *l = st->sreqs.next; l != &st->sreqs; l = l->next) {
        ucx_sreq_t *s = UCX_CONTAINER(l, ucx_sreq_t, link);
        if (s->peer == peer) {
            s->peer = NULL;
        }
    }
    for (ucx_link_t *l = st->jobs.next; l != &st->jobs; l = l->next) {
        ucx_job_t *j = UCX_CONTAINER(l, ucx_job_t, link);
        if (j->sreq->peer == peer) {
            j->sreq->peer = NULL;
        }
    }
}

/* Nothing UCX held on worker `w` calls back any more (destroyed). */
void ucx_stage_worker_gone(ucx_be_t *be, ucp_worker_h w)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL) {
        return;
    }
    ucx_link_t *l = st->jobs.next;
    while (l != &st->jobs) {
        ucx_job_t *j = UCX_CONTAINER(l, ucx_job_t, link);
        l = l->next;
        if (j->sreq->worker != w) {
            continue;
        }
        if (j->ev != NULL) {
            ucx_vram_copy_wait(be, j->dev, j->ev);
            j->ev = NULL;
            st->copies--;
        }
        j->ucx_pending = 0;
        job_fail(j, PDX_ERR_REMOTE_DISCONNECT);
        l = j->link.next;
        job_advance(be, j);
    }
    ucx_svc_worker_gone(be, w);
}

void ucx_stage_fini(ucx_be_t *be)
{
    struct ucx_stage_state *st = be->st;
    if (st == NULL) {
        return;
    }
    /* The workers are gone: no callback comes any more. */
    ucx_svc_fini(be);
    while (!ucx_list_empty(&st->jobs)) {
        ucx_job_t *j = UCX_CONTAINER(st->jobs.next, ucx_job_t, link);
        if (j->ev != NULL) {
            ucx_vram_copy_wait(be, j->dev, j->ev);
            st->copies--;
        }
        job_release(be, j);
        ucx_list_del(&j->link);
        j->ended = 1;
    }
    ucx_idtab_fini(&st->ids);
    free(st);
    be->st = NULL;
}
