/* ucx: host memory the peer serves, this instance's side: a request's
 * pieces cut into chunks, a window of them sent to the peer's service
 * (READ: the range; WRITE: the range and its bytes), each ended by its
 * answer (the data, or the service's ACK), the data stage's end told to
 * the request layer above through the pointer it gave. An answer lands
 * only in a chunk still waiting for it: a released request's answers are
 * dropped, so no byte of an aborted READ lands after its end. Also the AM
 * handler every worker gets, which hands requests to the service
 * (ucx_dsvc.c). Below ucx_request.c. */
#include "ucx_dram_int.h"

#include <unistd.h>

/* ---- requests ------------------------------------------------------------ */

int ucx_dram_busy(const ucx_req_t *r)
{
    return r->dreq != NULL && r->dreq->ucx_pending > 0;
}

/* Tell the request layer the data stage ended (once), and take the
 * request out of the table: answers after this are dropped. */
static void dreq_end(ucx_dreq_t *q, pdx_status_t st)
{
    if (q->ended || q->posting) {
        return;
    }
    q->ended = 1;
    ucx_idtab_del(&q->be->dram->ids, q, &q->id);
    if (q->req != NULL) {
        q->done(q->req, st);
    }
}

static void dreq_fail(ucx_dreq_t *q, pdx_status_t st)
{
    if (q->status == PDX_OK) {
        q->status = st;
    }
}

/* UCX's status for one of q's sends or receives, as pdx says it: any
 * failure once its peer's endpoint failed (or the peer is gone) is a
 * disconnect. */
static pdx_status_t dreq_ucx_status(const ucx_dreq_t *q, ucs_status_t s)
{
    const ucx_peer_t *peer = q->req != NULL ? q->req->peer : NULL;
    if (s == UCS_OK) {
        return PDX_OK;
    }
    return peer == NULL || peer->ep_status != UCS_OK
               ? PDX_ERR_REMOTE_DISCONNECT
               : ucx_status(s);
}

/* No chunk of q's window waits for its answer any more: late ones (and a
 * rendezvous answer's fragments) are dropped. */
static void dreq_forget_window(ucx_dreq_t *q)
{
    q->inflight = 0;
    for (uint32_t k = 0; k < DRAM_WINDOW; k++) {
        q->job[k].seq = 0;
    }
}

/* Has every chunk sent been answered (or can no answer come)? Then the
 * data stage ends: with the first failure, CANCELED when aborted. */
static void dreq_maybe_end(ucx_dreq_t *q)
{
    if (q->ended) {
        return;
    }
    int all = q->left == 0 && q->inflight == 0;
    int stopped = (q->status != PDX_OK || q->aborted) && q->inflight == 0;
    if (all || stopped) {
        dreq_end(q, q->status != PDX_OK ? q->status
                    : q->aborted       ? PDX_ERR_CANCELED
                                       : PDX_OK);
    }
}

static void dram_send_cb(void *request, ucs_status_t status,
                         void *user_data);

/* A WRITE's data is read from the application's memory only while its
 * request is live: once aborted or released, what UCX still sends of it
 * is zeros (the target's range is undefined after an aborted WRITE
 * anyway). */
static int job_src_live(const ucx_dsrc_t *s)
{
    const ucx_dreq_t *q = s->arg;
    return q->req != NULL && !q->aborted;
}

static void dram_piece_cb(void *request, ucs_status_t status,
                          void *user_data)
{
    ucx_dsrc_t *s = user_data;
    ucx_dreq_t *q = s->arg;
    q->job[s->k].wpending--;
    dram_send_cb(request, status, q);
}

/* A WRITE's job `k` in pieces (DREQ_WRITE_PIECES): the request without
 * its data, then the data, DRAM_FRAG_DATA bytes a message, each packed
 * from the caller's memory by UCX (zeros once the request is aborted or
 * released). */
static pdx_status_t job_send_pieces(ucx_dreq_t *q, ucx_peer_t *peer,
                                    uint32_t k)
{
    ucx_djob_t *j = &q->job[k];
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = dram_send_cb,
        .user_data = q,
    };
    ucs_status_ptr_t sp = ucp_am_send_nbx(peer->ep, UCX_AM_ID_DRAM, j->hdr,
                                          q->hdr_len, NULL, 0, &rp);
    uint64_t token = ucx_dget(j->hdr + 32, 8);
    uint32_t pid = (uint32_t)ucx_dget(j->hdr + 28, 4);
    uint32_t i = 0;
    for (uint64_t off = 0; !UCS_PTR_IS_ERR(sp) && off < j->len;
         off += DRAM_FRAG_DATA, i++) {
        if (sp != NULL) {
            q->ucx_pending++;
        }
        uint64_t n = j->len - off < DRAM_FRAG_DATA ? j->len - off
                                                    : DRAM_FRAG_DATA;
        unsigned char *h = j->whdr + (size_t)i * DHDR_LEN;
        dhdr_t d = {.op = DOP_WPIECE, .job = k, .seq = j->seq, .id = q->id,
                    .pid = pid, .token = token, .raddr = off, .len = n};
        ucx_dhdr_make(h, &d, NULL, 0);
        j->wsrc[i] = (ucx_dsrc_t){
            .p = (const unsigned char *)(uintptr_t)j->laddr + off,
            .len = n, .live = job_src_live, .arg = q, .k = k,
            .seq = j->seq};
        ucp_request_param_t pp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                            UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_FLAGS |
                            UCP_OP_ATTR_FIELD_DATATYPE,
            .flags = UCP_AM_SEND_FLAG_EAGER,
            .cb.send = dram_piece_cb,
            .user_data = &j->wsrc[i],
            .datatype = q->be->dram->dt,
        };
        sp = ucp_am_send_nbx(peer->ep, UCX_AM_ID_DRAM, h, DHDR_LEN,
                             &j->wsrc[i], n, &pp);
        if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
            j->wpending++;
        }
    }
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t s = UCS_PTR_STATUS(sp);
        pdx_log(ucx_op_log_level(s, peer->ep_status), "ucx: peer %s: "
                "sending a served WRITE of %" PRIu64 " bytes failed: %s",
                peer->name, j->len, ucs_status_string(s));
        return dreq_ucx_status(q, s);
    }
    if (sp != NULL) {
        q->ucx_pending++;
    }
    q->be->dram->wpiece_chunks++;
    return PDX_OK;
}

/* Send job `k` of `q` (its chunk set). PDX_OK (sent or queued by UCX) or
 * the error. */
static pdx_status_t job_send(ucx_dreq_t *q, uint32_t k)
{
    ucx_djob_t *j = &q->job[k];
    ucx_peer_t *peer = q->req != NULL ? q->req->peer : NULL;
    if (peer == NULL || peer->ep == NULL) {
        return PDX_ERR_REMOTE_DISCONNECT;
    }
    int write = q->op == PDX_XFER_WRITE;
    if (write && q->wpieces && j->len >= DRAM_WPIECES_MIN) {
        return job_send_pieces(q, peer, k);
    }
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = write && j->len > DRAM_EAGER_MAX && !q->shm
                     ? UCP_AM_SEND_FLAG_RNDV
                     : UCP_AM_SEND_FLAG_EAGER,
        .cb.send = dram_send_cb,
        .user_data = q,
    };
    if (write) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        rp.datatype = q->be->dram->dt;
        j->src = (ucx_dsrc_t){
            .p = (const unsigned char *)(uintptr_t)j->laddr,
            .len = j->len, .live = job_src_live, .arg = q};
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(
        peer->ep, UCX_AM_ID_DRAM, j->hdr, q->hdr_len,
        write ? (void *)&j->src : NULL, write ? j->len : 0, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t s = UCS_PTR_STATUS(sp);
        pdx_log(ucx_op_log_level(s, peer->ep_status), "ucx: peer %s: "
                "sending a served %s of %" PRIu64 " bytes failed: %s",
                peer->name, write ? "WRITE" : "READ", j->len,
                ucs_status_string(s));
        return dreq_ucx_status(q, s);
    }
    if (sp != NULL) {
        q->ucx_pending++;
    }
    return PDX_OK;
}

/* Fill the window: the next chunks go out while slots are free. */
static void dreq_pump(ucx_dreq_t *q)
{
    while (!q->aborted && q->status == PDX_OK && q->inflight < DRAM_WINDOW &&
           q->piece < q->npieces) {
        uint32_t k = 0;
        while (k < DRAM_WINDOW &&
               (q->job[k].seq != 0 || q->job[k].wpending != 0)) {
            k++;
        }
        if (k == DRAM_WINDOW) {
            break;
        }
        uint64_t plen = q->pieces[q->piece].len;
        uint64_t len = plen - q->off;
        if (len > q->chunk) {
            len = q->chunk;
        }
        ucx_djob_t *j = &q->job[k];
        j->seq = ++q->seq == 0 ? ++q->seq : q->seq;
        j->laddr = q->pieces[q->piece].laddr + q->off;
        j->len = len;
        j->got = 0;
        /* The header's variable fields: job, what it takes, seq, token,
         * range. */
        ucx_dput(j->hdr + 10, k, 2);
        ucx_dput(j->hdr + 12,
                 DREQ_RNDV_ANSWERS | DREQ_FRAG_ANSWERS |
                     (q->wpieces && len >= DRAM_WPIECES_MIN
                          ? DREQ_WRITE_PIECES
                          : 0),
                 4);
        ucx_dput(j->hdr + 24, j->seq, 4);
        ucx_dput(j->hdr + 32, q->pieces[q->piece].token, 8);
        ucx_dput(j->hdr + 40, q->pieces[q->piece].raddr + q->off, 8);
        ucx_dput(j->hdr + 48, len, 8);
        q->off += len;
        if (q->off == plen) {
            q->piece++;
            q->off = 0;
        }
        q->inflight++;
        pdx_status_t st = job_send(q, k);
        if (st != PDX_OK) {
            j->seq = 0;
            q->inflight--;
            dreq_fail(q, st);
        }
    }
    dreq_maybe_end(q);
}

static void dreq_dealloc(ucx_dreq_t *q)
{
    ucx_list_del(&q->link);
    free(q->wsrcs);
    free(q->whdrs);
    free(q->hdrs);
    free(q->pieces);
    free(q);
}

/* UCX let go of one of q's sends or receives: the last one frees a
 * detached q, or a released request whose end waited for it. */
static void dreq_unpend(ucx_dreq_t *q)
{
    q->ucx_pending--;
    if (q->ucx_pending > 0) {
        return;
    }
    if (q->req == NULL) {
        dreq_dealloc(q); /* detached */
    } else {
        q->unbusy(q->req); /* may free q */
    }
}

static void dram_send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_dreq_t *q = user_data;
    ucp_request_free(request);
    if (status != UCS_OK && status != UCS_ERR_CANCELED) {
        pdx_debug("ucx: a served request's send failed: %s",
                  ucs_status_string(status));
    }
    if (status != UCS_OK && q->req != NULL && !q->ended) {
        /* Not delivered: its answer never comes, nor (the endpoint
         * failed) any other of the window's. A rendezvous send can fail
         * this way after its post returned, and before the request is
         * among its peer's (a failure then finishes nothing). */
        dreq_fail(q, dreq_ucx_status(q, status));
        dreq_forget_window(q);
        dreq_maybe_end(q);
    }
    dreq_unpend(q);
}

pdx_status_t ucx_dram_post(ucx_be_t *be, ucx_req_t *r,
                           const pdx_backend_iov_t *iov, size_t n,
                           ucx_stage_done_cb_t done,
                           void (*unbusy)(ucx_req_t *r))
{
    struct ucx_dram_state *ds = ucx_dram_state(be);
    ucx_peer_t *peer = r->peer;
    const ucx_wctx_t *wc = peer->own_worker ? &peer->wctx : &be->main_wctx;
    ucp_datatype_t dt;
    if (ds == NULL) {
        return PDX_ERR_NOMEM;
    }
    pdx_status_t dst = ucx_dsvc_dt(be, &dt);
    if (dst != PDX_OK) {
        return dst;
    }
    size_t hdr_len = DHDR_LEN + be->name_len + wc->addr_len;
    if (wc->addr_len == 0 || wc->addr_len > DRAM_MAX_ADDR ||
        hdr_len > be->max_am_header) {
        pdx_error("ucx: peer %s: a served request's header of %zu bytes "
                  "exceeds UCX's %zu-byte limit", peer->name, hdr_len,
                  be->max_am_header);
        return PDX_ERR_TOO_LARGE;
    }
    ucx_dreq_t *q = calloc(1, sizeof(*q));
    if (q == NULL) {
        return PDX_ERR_NOMEM;
    }
    q->pieces = malloc(n * sizeof(*q->pieces));
    q->hdrs = malloc(DRAM_WINDOW * hdr_len);
    if (q->pieces == NULL || q->hdrs == NULL ||
        ucx_idtab_add(&ds->ids, q, &q->id) != PDX_OK) {
        free(q->pieces);
        free(q->hdrs);
        free(q);
        return PDX_ERR_NOMEM;
    }
    q->be = be;
    q->req = r;
    q->worker = peer->worker;
    q->op = r->op;
    q->done = done;
    q->unbusy = unbusy;
    q->npieces = n;
    q->hdr_len = hdr_len;
    q->chunk = be->max_chunk < DRAM_CHUNK ? be->max_chunk : DRAM_CHUNK;
    q->shm = ucx_vaddr_same_host(&peer->vaddr, &be->self);
    int big = 0; /* a piece whose chunks go in pieces */
    for (size_t i = 0; i < n; i++) {
        const ucx_rmd_t *rmd = iov[i].remote_md;
        q->pieces[i].laddr = iov[i].local_addr;
        q->pieces[i].raddr = iov[i].remote_addr;
        q->pieces[i].len = iov[i].len;
        q->pieces[i].token = rmd->token;
        q->left += iov[i].len;
        big |= iov[i].len >= DRAM_WPIECES_MIN;
    }
    if (r->op == PDX_XFER_WRITE && q->shm && peer->dsvc_wpieces && big &&
        q->chunk >= DRAM_WPIECES_MIN) {
        q->wper = (uint32_t)((q->chunk + DRAM_FRAG_DATA - 1) /
                             DRAM_FRAG_DATA);
        q->wsrcs = malloc((size_t)DRAM_WINDOW * q->wper * sizeof(*q->wsrcs));
        q->whdrs = malloc((size_t)DRAM_WINDOW * q->wper * DHDR_LEN);
        q->wpieces = q->wsrcs != NULL && q->whdrs != NULL;
        for (uint32_t k = 0; q->wpieces && k < DRAM_WINDOW; k++) {
            q->job[k].wsrc = q->wsrcs + (size_t)k * q->wper;
            q->job[k].whdr = q->whdrs + (size_t)k * q->wper * DHDR_LEN;
        }
    }
    /* Every job's header: the fixed fields now, the rest per chunk. */
    dhdr_t d = {.op = r->op == PDX_XFER_WRITE ? DOP_WRITE : DOP_READ,
                .status = DREQ_RNDV_ANSWERS | DREQ_FRAG_ANSWERS,
                .id = q->id, .pid = (uint32_t)getpid(), .pidns = ds->pidns,
                .addr = wc->addr,
                .addr_len = wc->addr_len};
    for (uint32_t k = 0; k < DRAM_WINDOW; k++) {
        q->job[k].hdr = q->hdrs + (size_t)k * hdr_len;
        ucx_dhdr_make(q->job[k].hdr, &d, be->host.agent_name, be->name_len);
    }
    ucx_list_push(&ds->live, &q->link);
    r->dreq = q;
    q->posting = 1;
    dreq_pump(q);
    q->posting = 0;
    if (q->status != PDX_OK && q->inflight == 0 && q->ucx_pending == 0) {
        /* Nothing went out: the post fails with nothing in flight. */
        pdx_status_t st = q->status;
        r->dreq = NULL;
        ucx_idtab_del(&ds->ids, q, &q->id);
        dreq_dealloc(q);
        return st;
    }
    dreq_maybe_end(q);
    return PDX_INPROGRESS;
}

void ucx_dram_abort(ucx_req_t *r)
{
    ucx_dreq_t *q = r->dreq;
    if (q == NULL || q->ended) {
        return;
    }
    q->aborted = 1;
    if (q->op == PDX_XFER_READ) {
        /* Its answers land only while it waits for them: from now on
         * they are dropped. */
        dreq_forget_window(q);
    }
    dreq_maybe_end(q);
}

void ucx_dram_free(ucx_req_t *r)
{
    ucx_dreq_t *q = r->dreq;
    if (q == NULL) {
        return;
    }
    r->dreq = NULL;
    q->req = NULL;
    if (q->be->dram != NULL) {
        ucx_idtab_del(&q->be->dram->ids, q, &q->id);
    }
    if (q->ucx_pending > 0) {
        return; /* its sends' callbacks free it */
    }
    dreq_dealloc(q);
}

void ucx_dram_worker_gone(ucx_be_t *be, ucp_worker_h w)
{
    struct ucx_dram_state *ds = be->dram;
    if (ds == NULL) {
        return;
    }
    ucx_link_t *l = ds->live.next;
    while (l != &ds->live) {
        ucx_link_t *next = l->next;
        ucx_dreq_t *q = UCX_CONTAINER(l, ucx_dreq_t, link);
        if (q->worker == w) {
            q->ucx_pending = 0; /* no callback comes */
            if (q->req == NULL) {
                dreq_dealloc(q);
            } else {
                q->inflight = 0;
                dreq_fail(q, PDX_ERR_REMOTE_DISCONNECT);
                dreq_maybe_end(q);
            }
        }
        l = next;
    }
}

void ucx_dram_fini(ucx_be_t *be)
{
    struct ucx_dram_state *ds = be->dram;
    if (ds == NULL) {
        return;
    }
    ucx_dsvc_fini(be);
    if (ds->has_dt) {
        ucp_dt_destroy(ds->dt);
    }
    while (!ucx_list_empty(&ds->live)) {
        ucx_dreq_t *q = UCX_CONTAINER(ds->live.next, ucx_dreq_t, link);
        ucx_list_del(&q->link);
        if (q->req != NULL) {
            q->req->dreq = NULL;
        }
        free(q->wsrcs);
        free(q->whdrs);
        free(q->hdrs);
        free(q->pieces);
        free(q);
    }
    ucx_idtab_fini(&ds->ids);
    free(ds);
    be->dram = NULL;
}

/* ---- answers ------------------------------------------------------------- */

/* Job k of q answered (its data in, or not): the window moves on. */
static void job_answered(ucx_dreq_t *q, ucx_djob_t *j, pdx_status_t st)
{
    if (st != PDX_OK) {
        dreq_fail(q, st);
    } else {
        q->left -= j->len;
        q->be->gets_done++; /* progress, for a drain */
    }
    j->seq = 0;
    q->inflight--;
    dreq_pump(q);
}

/* A fragment of a rendezvous answer: into the job's memory while the job
 * still waits for it (an aborted or released READ takes no more). */
static void job_put(ucx_dsrc_t *s, size_t off, const void *src, size_t n)
{
    ucx_dreq_t *q = s->arg;
    ucx_djob_t *j = &q->job[s->k];
    if (q->req == NULL || q->ended || q->aborted || j->seq != s->seq ||
        off > j->len || n > j->len - off) {
        return;
    }
    memcpy((unsigned char *)(uintptr_t)j->laddr + off, src, n);
}

static void job_recv_cb(void *request, ucs_status_t status, size_t length,
                        void *user_data)
{
    ucx_dsrc_t *s = user_data;
    ucx_dreq_t *q = s->arg;
    ucx_djob_t *j = &q->job[s->k];
    (void)length;
    ucp_request_free(request);
    q->be->rx_rndv--;
    if (q->req != NULL && !q->ended && j->seq == s->seq) {
        job_answered(q, j, dreq_ucx_status(q, status));
    }
    dreq_unpend(q);
}

/* Receive a rendezvous answer's data for job k of q (through job_put). */
static ucs_status_t job_receive(ucx_dreq_t *q, ucp_worker_h w, uint32_t k,
                                void *data)
{
    ucx_djob_t *j = &q->job[k];
    j->src = (ucx_dsrc_t){.len = j->len, .put = job_put, .arg = q, .k = k,
                          .seq = j->seq};
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = job_recv_cb,
        .user_data = &j->src,
        .datatype = q->be->dram->dt,
    };
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(w, data, &j->src, j->len, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        job_answered(q, j, ucx_status(UCS_PTR_STATUS(sp)));
    } else if (sp == NULL) {
        job_answered(q, j, PDX_OK);
    } else {
        q->ucx_pending++;
        q->be->rx_rndv++;
    }
    return UCS_INPROGRESS;
}

ucs_status_t ucx_dram_answer(ucx_be_t *be, ucp_worker_h w, const dhdr_t *h,
                             void *data, size_t length, int rndv)
{
    ucx_dreq_t *q =
        be->dram != NULL ? ucx_idtab_find(&be->dram->ids, h->id) : NULL;
    ucx_djob_t *j = q != NULL && h->job < DRAM_WINDOW ? &q->job[h->job] : NULL;
    ucx_peer_t *peer = q != NULL && q->req != NULL ? q->req->peer : NULL;
    if (peer != NULL && (h->token & DSVC_FEAT_WRITE_PIECES)) {
        peer->dsvc_wpieces = 1; /* its WRITEs go in pieces from now on */
    }
    int want = peer != NULL && !q->ended &&
               (q->op == PDX_XFER_READ
                    ? h->op == DOP_DATA || h->op == DOP_FRAG
                    : h->op == DOP_ACK);
    if (j == NULL || !want || j->seq == 0 || j->seq != h->seq ||
        (h->op == DOP_FRAG && rndv)) {
        /* A released or ended request's (or a stranger's, or a piece sent
         * by rendezvous, which we never ask for): dropped. */
        pdx_debug("ucx: dropping a served answer for a request that waits "
                  "for none");
        return UCS_OK;
    }
    pdx_status_t st = ucx_dram_peer_status(h->status);
    if (h->op == DOP_FRAG) {
        /* A piece of the chunk: at its offset, inside the chunk. */
        if (st == PDX_OK && (length == 0 || h->len != length ||
                             h->raddr > j->len ||
                             length > j->len - h->raddr ||
                             length > j->len - j->got)) {
            pdx_warn("ucx: peer %s: a served READ's piece of %zu bytes at "
                     "%" PRIu64 " does not fit its chunk of %" PRIu64
                     " (%" PRIu64 " in)", peer->name, length, h->raddr,
                     j->len, j->got);
            st = PDX_ERR_CORRUPT;
        }
        if (st != PDX_OK) {
            job_answered(q, j, st);
            return UCS_OK;
        }
        memcpy((unsigned char *)(uintptr_t)j->laddr + h->raddr, data,
               length);
        j->got += length;
        if (j->got == j->len) {
            q->be->dram->frag_chunks++;
            job_answered(q, j, PDX_OK);
        }
        return UCS_OK;
    }
    if (st == PDX_OK && h->op == DOP_DATA &&
        (length != j->len || h->len != j->len)) {
        pdx_warn("ucx: peer %s: a served READ answered %zu bytes for a "
                 "chunk of %" PRIu64, peer->name, length, j->len);
        st = PDX_ERR_CORRUPT;
    }
    if (st == PDX_OK && h->op == DOP_DATA && rndv) {
        return job_receive(q, w, h->job, data);
    }
    if (st == PDX_OK && h->op == DOP_DATA && length > 0) {
        memcpy((void *)(uintptr_t)j->laddr, data, length);
    }
    if (st != PDX_OK) {
        pdx_log(st == PDX_ERR_STALE ? PDX_LOG_WARN : PDX_LOG_ERROR,
                "ucx: peer %s refused a served %s of %" PRIu64 " bytes: %s%s",
                peer->name, q->op == PDX_XFER_READ ? "READ" : "WRITE",
                j->len, pdx_status_string(st),
                st == PDX_ERR_STALE ? " (the region is no longer registered "
                                      "there)" : "");
    }
    job_answered(q, j, st);
    return UCS_OK;
}

static ucs_status_t dram_am_cb(void *arg, const void *header,
                               size_t header_length, void *data,
                               size_t length,
                               const ucp_am_recv_param_t *param)
{
    ucx_wctx_t *wc = arg;
    ucx_be_t *be = wc->be;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    dhdr_t h;
    if (ucx_dhdr_parse(header, header_length, &h) != 0) {
        pdx_warn("ucx: dropping a malformed %zu-byte served-memory message",
                 header_length);
        return UCS_OK;
    }
    /* Data above DRAM_EAGER_MAX comes by rendezvous (a WRITE's, a READ's
     * answer): received through the served datatype's unpack, never into
     * memory directly; anything else sent so is refused (returning
     * UCS_OK without receiving it: UCX drops it and tells its sender). */
    if (h.op == DOP_READ || h.op == DOP_WRITE) {
        return ucx_dsvc_request(be, wc->worker, &h, data, length, rndv);
    }
    if (h.op == DOP_WPIECE) {
        return ucx_dsvc_piece(be, &h, data, length, rndv);
    }
    return ucx_dram_answer(be, wc->worker, &h, data, length, rndv);
}

pdx_status_t ucx_dram_set_handler(ucx_be_t *be, ucx_wctx_t *wc)
{
    (void)be;
    ucp_am_handler_param_t ap = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                      UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = UCX_AM_ID_DRAM,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = dram_am_cb,
        .arg = wc,
    };
    ucs_status_t s = ucp_worker_set_am_recv_handler(wc->worker, &ap);
    if (s != UCS_OK) {
        pdx_error("ucx: setting the served-memory handler failed: %s",
                  ucs_status_string(s));
        return ucx_status(s);
    }
    return PDX_OK;
}
