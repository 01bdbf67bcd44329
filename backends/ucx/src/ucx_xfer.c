/* ucx: transfers: post (puts or gets in chunks, then a flush), check,
 * abort, release, the drain of an aborted request that UCX cannot
 * cancel, and standalone notifications. Posting to a peer is where a lazy
 * instance makes its endpoint (ucx_peer_ep). */
#include "ucx_int.h"

static int ucx_range_ok(uint64_t base, uint64_t len, uint64_t addr,
                        uint64_t n)
{
    return addr >= base && n <= len && addr - base <= len - n;
}

/* Check the pieces of a post, and unpack the remote keys not used before
 * (a lazy instance connects here on the first post to a peer). */
static pdx_status_t ucx_check_iov(ucx_be_t *be, const ucx_peer_t *peer,
                                  const pdx_backend_iov_t *iov, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const ucx_md_t *md = iov[i].local_md;
        ucx_rmd_t *rmd = iov[i].remote_md;
        if (md == NULL || rmd == NULL) {
            pdx_error("ucx: peer %s: piece %zu has no local or remote key",
                      peer->name, i);
            return PDX_ERR_INVALID;
        }
        if (rmd->peer != peer) {
            pdx_error("ucx: peer %s: piece %zu uses a key of peer %s",
                      peer->name, i,
                      rmd->peer != NULL ? rmd->peer->name : "(unloaded)");
            return PDX_ERR_INVALID;
        }
        if (!ucx_range_ok(md->addr, md->len, iov[i].local_addr, iov[i].len) ||
            !ucx_range_ok(rmd->addr, rmd->len, iov[i].remote_addr,
                          iov[i].len)) {
            pdx_error("ucx: peer %s: piece %zu (local 0x%" PRIx64
                      ", remote 0x%" PRIx64 ", %" PRIu64
                      " bytes) is outside its registered region",
                      peer->name, i, iov[i].local_addr, iov[i].remote_addr,
                      iov[i].len);
            return PDX_ERR_INVALID;
        }
        if (rmd->rkey == NULL && !rmd->staged) {
            pdx_status_t st = ucx_rmd_rkey(be, rmd);
            if (st != PDX_OK) {
                return st;
            }
        }
    }
    return PDX_OK;
}

/* Does this request go through the peer's service (ucx_dram.c: every
 * piece host memory whose key names a token, and RMA to the peer emulated
 * by UCX or the option says so)? */
static int ucx_dram_wanted(ucx_be_t *be, ucx_peer_t *peer,
                           const pdx_backend_iov_t *iov, size_t n)
{
    if (be->rma_mode == UCX_RMA_NATIVE || n == 0) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        const ucx_md_t *md = iov[i].local_md;
        const ucx_rmd_t *rmd = iov[i].remote_md;
        if (md->type != PDX_MEM_DRAM || rmd->type != PDX_MEM_DRAM ||
            rmd->token == 0) {
            return 0; /* a peer whose keys name no token: RMA */
        }
    }
    if (be->rma_mode == UCX_RMA_SERVED) {
        return 1;
    }
    if (peer->served < 0) {
        /* UCX moves host memory without the target's CPU only over RDMA
         * (and the same-host kernel-assisted transports, which peer
         * error handling rules out): a lane of one of those, RMA; else
         * served. Decided once, from the endpoint's lanes. */
        ucx_peer_transport(peer);
        peer->served = 1;
        for (const char *t = peer->transport; *t != '\0';) {
            if (strncmp(t, "rc", 2) == 0 || strncmp(t, "dc", 2) == 0 ||
                strncmp(t, "xpmem", 5) == 0 || strncmp(t, "knem", 4) == 0) {
                peer->served = 0;
                break;
            }
            const char *c = strchr(t, ',');
            t = c != NULL ? c + 1 : "";
        }
    }
    return peer->served;
}

/* UCX 1.13 cannot cancel RMA: an aborted READ ends when its last get does,
 * so that no byte lands after the agent hears of its end. A peer that lets
 * UCX_DRAIN_IDLE_NS pass without a get chunk completing (or
 * UCX_DRAIN_MAX_NS in all) is given up on. An aborted WRITE (a timed-out
 * one to a hung peer) has no such progress to watch: its peer is given up
 * on after UCX_DRAIN_IDLE_NS, or its request would never end and could
 * never be posted again. Never waits: called from xfer_check. Returns 1
 * when the request ended. */
static int ucx_req_drain_check(ucx_be_t *be, ucx_req_t *r)
{
    uint64_t now = pdx_now_ns();
    if (r->drain_start_ns == 0) {
        r->drain_start_ns = r->drain_event_ns = now;
        r->drain_gets = be->gets_done;
        return 0;
    }
    if (r->op == PDX_XFER_READ && be->gets_done != r->drain_gets) {
        r->drain_gets = be->gets_done;
        r->drain_event_ns = now;
    }
    if (now - r->drain_event_ns <= UCX_DRAIN_IDLE_NS &&
        now - r->drain_start_ns <= UCX_DRAIN_MAX_NS) {
        return 0;
    }
    char why[96];
    snprintf(why, sizeof(why), "an aborted %s did not finish within %.0f ms",
             r->op == PDX_XFER_READ ? "read" : "write",
             (double)(now - r->drain_start_ns) / 1e6);
    ucx_peer_give_up(be, r->peer, why);
    ucx_req_finish(r, PDX_ERR_REMOTE_DISCONNECT);
    return 1;
}

/* The puts or gets of `r` (chunks of at most max_chunk), counted in
 * *posted_p. A WRITE's puts are fire-and-forget (their requests freed at
 * once): a put's completion says only that its source may be reused, so
 * the one flush after them reports that every byte landed (or failed). A
 * READ's get completes when its bytes have landed: the READ ends with its
 * last get's callback, without a flush (which cost a small request a
 * second UCX request and callback). PDX_OK, or the first error (what was
 * posted before it is in flight). */
static pdx_status_t ucx_post_rma(ucx_be_t *be, ucx_peer_t *peer, ucx_req_t *r,
                                 pdx_xfer_op_t op,
                                 const pdx_backend_iov_t *iov, size_t n,
                                 size_t *posted_p)
{
    ucp_request_param_t rp = {.op_attr_mask = 0};
    if (op == PDX_XFER_READ) {
        rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                          UCP_OP_ATTR_FIELD_USER_DATA;
        rp.cb.send = ucx_get_cb;
        rp.user_data = r;
    }
    ucs_status_ptr_t sp;
    for (size_t i = 0; i < n; i++) {
        const ucx_rmd_t *rmd = iov[i].remote_md;
        for (uint64_t off = 0; off < iov[i].len; off += be->max_chunk) {
            uint64_t len = iov[i].len - off;
            if (len > be->max_chunk) {
                len = be->max_chunk;
            }
            void *laddr = (void *)(uintptr_t)(iov[i].local_addr + off);
            uint64_t raddr = iov[i].remote_addr + off;
            sp = op == PDX_XFER_WRITE
                    ? ucp_put_nbx(peer->ep, laddr, len, raddr, rmd->rkey, &rp)
                    : ucp_get_nbx(peer->ep, laddr, len, raddr, rmd->rkey, &rp);
            if (UCS_PTR_IS_ERR(sp)) {
                ucs_status_t s = UCS_PTR_STATUS(sp);
                pdx_log(ucx_op_log_level(s, peer->ep_status),
                        "ucx: peer %s: %s of %" PRIu64 " bytes at remote "
                        "0x%" PRIx64 " (piece %zu of %zu) failed: %s",
                        peer->name, op == PDX_XFER_WRITE ? "put" : "get",
                        len, raddr, i, n, ucs_status_string(s));
                return ucx_status(s);
            }
            if (sp != NULL && op == PDX_XFER_WRITE) {
                ucp_request_free(sp);
            } else if (sp != NULL) {
                r->gets_left++; /* its callback comes from progress */
            }
            (*posted_p)++;
        }
    }
    return PDX_OK;
}

pdx_status_t ucx_xfer_post(void *bev, void *peerv, pdx_xfer_op_t op,
                           const pdx_backend_iov_t *iov, size_t n,
                           const void *notif, size_t notif_len,
                           void **req_p)
{
    ucx_be_t *be = bev;
    ucx_peer_t *peer = peerv;
    pdx_status_t st;

    if (be == NULL || peer == NULL || req_p == NULL || (n > 0 && iov == NULL) ||
        (op != PDX_XFER_READ && op != PDX_XFER_WRITE)) {
        return PDX_ERR_INVALID;
    }
    if (notif == NULL) {
        notif_len = 0;
    }
    if (notif_len > UCX_MAX_NOTIF) {
        pdx_error("ucx: peer %s: notification of %zu bytes (limit %u)",
                  peer->name, notif_len, UCX_MAX_NOTIF);
        return PDX_ERR_TOO_LARGE;
    }
    st = ucx_peer_ep(be, peer);
    if (st != PDX_OK) {
        return st;
    }
    /* Validate everything before posting anything: an error return must
     * leave nothing in flight. */
    st = ucx_check_iov(be, peer, iov, n);
    if (st != PDX_OK) {
        return st;
    }
    ucx_req_t *r = ucx_req_get(be, notif_len);
    if (r == NULL) {
        return PDX_ERR_NOMEM;
    }
    r->be = be;
    r->peer = peer;
    r->worker = peer->worker;
    r->op = op;
    r->stage = UCX_STAGE_FLUSH;
    r->has_notif = notif != NULL;
    r->notif_len = notif_len;
    if (notif_len > 0) {
        memcpy(r->notif, notif, notif_len);
    }
    ucx_list_init(&r->link);

    if (ucx_stage_needed(be, iov, n)) {
        /* GPU memory staged through host buffers on one side or both:
         * jobs, moved on by callbacks and progress (ucx_stage.c). */
        st = ucx_stage_post(be, r, iov, n, ucx_req_stage_done);
        if (st != PDX_INPROGRESS) {
            ucx_req_put(be, r);
            return st;
        }
        if (r->stage == UCX_STAGE_DONE && !ucx_req_busy(r)) {
            st = r->status;
            ucx_req_put(be, r);
            return st;
        }
        ucx_list_push(&peer->reqs, &r->link);
        *req_p = r;
        return PDX_INPROGRESS;
    }
    if (ucx_dram_wanted(be, peer, iov, n)) {
        /* Host memory the peer serves: requests its service checks
         * (ucx_dram.c), not RMA that UCX would emulate on its CPU. */
        st = ucx_dram_post(be, r, iov, n, ucx_req_stage_done,
                           ucx_req_maybe_free);
        if (st != PDX_INPROGRESS) {
            ucx_req_put(be, r);
            return st;
        }
        if (r->stage == UCX_STAGE_DONE && !ucx_req_busy(r)) {
            st = r->status;
            ucx_req_put(be, r);
            return st;
        }
        ucx_list_push(&peer->reqs, &r->link);
        *req_p = r;
        return PDX_INPROGRESS;
    }

    ucp_request_param_t fp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = ucx_flush_cb,
        .user_data = r,
    };
    ucs_status_ptr_t sp;
    size_t posted = 0;
    st = ucx_post_rma(be, peer, r, op, iov, n, &posted);
    if (st != PDX_OK) {
        goto err_posted;
    }

    if (op == PDX_XFER_WRITE) {
        sp = ucp_ep_flush_nbx(peer->ep, &fp);
        if (UCS_PTR_IS_ERR(sp)) {
            ucs_status_t s = UCS_PTR_STATUS(sp);
            pdx_log(ucx_op_log_level(s, peer->ep_status), "ucx: peer %s: "
                    "flush after %zu operations failed: %s", peer->name,
                    posted, ucs_status_string(s));
            st = ucx_status(s);
            goto err_posted;
        }
        r->ucs_req = sp;
    }
    if (!ucx_req_busy(r)) {
        /* Every byte landed in place: the flush ended at once, or every
         * get did. */
        peer->wired = 1;
        st = ucx_req_send_notif(r);
        if (st != PDX_INPROGRESS) {
            /* Data landed and the notification (if any) went out, or the
             * notification failed with nothing left in flight. */
            ucx_req_put(be, r);
            return st;
        }
    }
    ucx_list_push(&peer->reqs, &r->link);
    *req_p = r;
    return PDX_INPROGRESS;

err_posted:
    if (posted > 0 && op == PDX_XFER_READ) {
        /* Gets already posted may still write local memory and UCX cannot
         * cancel them: the endpoint failed (the usual cause) or is made
         * to, so the agent fails the peer and its buffers are suspect
         * until it is reloaded. Never waits here. */
        ucx_peer_give_up(be, peer, "a read failed half-posted");
    }
    if (r->gets_left > 0) {
        /* Their callbacks still come (the endpoint's failure purges
         * them): the last one frees it. */
        r->aborted = 1;
        r->released = 1;
        r->peer = NULL;
        ucx_list_push(&be->orphan_reqs, &r->link);
        return st;
    }
    ucx_req_put(be, r);
    return st;
}

pdx_status_t ucx_xfer_check(void *bev, void *reqv)
{
    ucx_be_t *be = bev;
    ucx_req_t *r = reqv;
    if (be == NULL || r == NULL) {
        return PDX_ERR_INVALID;
    }
    /* No progress here: the agent progresses the worker (without its
     * lock) before it checks, so a check is O(1) under the lock. */
    if (r->stage != UCX_STAGE_DONE && r->aborted &&
        r->stage == UCX_STAGE_FLUSH && ucx_req_busy(r) &&
        r->peer != NULL) {
        ucx_req_drain_check(be, r);
    }
    return r->stage == UCX_STAGE_DONE ? r->status : PDX_INPROGRESS;
}

/* Non-blocking abort: the gets or the flush still complete, and then the
 * request reports PDX_ERR_CANCELED without sending the note. */
pdx_status_t ucx_xfer_abort(void *bev, void *reqv)
{
    ucx_be_t *be = bev;
    ucx_req_t *r = reqv;
    if (be == NULL || r == NULL) {
        return PDX_ERR_INVALID;
    }
    r->aborted = 1;
    if (r->ucs_req != NULL) {
        ucp_request_cancel(r->worker, r->ucs_req);
    }
    ucx_stage_abort(r);
    ucx_dram_abort(r);
    /* A request already done keeps its result: its data has landed. */
    return PDX_OK;
}

void ucx_xfer_release(void *bev, void *reqv)
{
    ucx_be_t *be = bev;
    ucx_req_t *r = reqv;
    if (be == NULL || r == NULL) {
        return;
    }
    r->aborted = 1;
    if (r->ucs_req != NULL) {
        /* A no-op for RMA and AM sends in UCX 1.13, but the documented way
         * to ask. Never waits: the agent released an in-flight READ only
         * after xfer_check said it ended, or because the peer failed. */
        ucp_request_cancel(r->worker, r->ucs_req);
    }
    ucx_stage_abort(r);
    ucx_dram_abort(r);
    ucx_list_del(&r->link);
    if (!ucx_req_busy(r)) {
        ucx_req_put(be, r);
        return;
    }
    /* Detach: the pending callback frees it. Its peer's endpoint still
     * carries what it moved: a close forces it (see disconnect). */
    if (r->peer != NULL) {
        r->peer->abandoned = 1;
    }
    r->released = 1;
    r->peer = NULL;
    ucx_list_push(&be->orphan_reqs, &r->link);
}

/* Standalone notifications (the agent's notif_send). */
static void ucx_send_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_send_t *s = user_data;
    ucp_request_free(request);
    if (status != UCS_OK) {
        pdx_log(ucx_op_log_level(status, UCS_OK) == PDX_LOG_ERROR
                    ? PDX_LOG_WARN : PDX_LOG_DEBUG,
                "ucx: a %zu-byte notification was not delivered: %s", s->len,
                ucs_status_string(status));
    }
    ucx_list_del(&s->link);
    free(s);
}

pdx_status_t ucx_notif_send(void *bev, void *peerv, const void *msg,
                            size_t len)
{
    ucx_be_t *be = bev;
    ucx_peer_t *peer = peerv;
    if (be == NULL || peer == NULL || (msg == NULL && len > 0)) {
        return PDX_ERR_INVALID;
    }
    if (len > UCX_MAX_NOTIF) {
        pdx_error("ucx: peer %s: notification of %zu bytes (limit %u)",
                  peer->name, len, UCX_MAX_NOTIF);
        return PDX_ERR_TOO_LARGE;
    }
    pdx_status_t st = ucx_peer_ep(be, peer);
    if (st != PDX_OK) {
        return st;
    }
    ucx_send_t *s = malloc(sizeof(*s) + len);
    if (s == NULL) {
        return PDX_ERR_NOMEM;
    }
    s->len = len;
    if (len > 0) {
        memcpy(s->data, msg, len);
    }
    ucx_list_init(&s->link);
    ucs_status_ptr_t sp = ucx_am_send(be, peer->ep, s->data, len,
                                      ucx_send_cb, s);
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t us = UCS_PTR_STATUS(sp);
        pdx_log(ucx_op_log_level(us, peer->ep_status), "ucx: peer %s: "
                "sending a %zu-byte notification failed: %s", peer->name, len,
                ucs_status_string(us));
        free(s);
        return ucx_status(us);
    }
    if (sp == NULL) {
        free(s);
        return PDX_OK;
    }
    ucx_list_push(&peer->sends, &s->link);
    return PDX_OK;
}
