/* ucx: transfer requests: their end, and the UCX callbacks of their
 * stages (a READ's gets or a WRITE's flush, which confirm every byte
 * landed, then the notification). */
#include "ucx_int.h"

ucx_req_t *ucx_req_get(ucx_be_t *be, size_t notif_len)
{
    size_t cap = notif_len <= UCX_REQ_CACHE_NOTIF ? UCX_REQ_CACHE_NOTIF
                                                  : notif_len;
    ucx_req_t *r;
    if (cap == UCX_REQ_CACHE_NOTIF && !ucx_list_empty(&be->req_cache)) {
        ucx_link_t *l = be->req_cache.next;
        ucx_list_del(l);
        be->nreq_cache--;
        r = UCX_CONTAINER(l, ucx_req_t, link);
        memset(r, 0, sizeof(*r));
    } else if ((r = calloc(1, sizeof(*r) + cap)) == NULL) {
        return NULL;
    }
    r->notif_cap = cap;
    return r;
}

void ucx_req_put(ucx_be_t *be, ucx_req_t *r)
{
    ucx_stage_free(r);
    ucx_dram_free(r);
    if (r->notif_cap == UCX_REQ_CACHE_NOTIF &&
        be->nreq_cache < UCX_REQ_CACHE_MAX) {
        ucx_list_push(&be->req_cache, &r->link);
        be->nreq_cache++;
        return;
    }
    free(r);
}

void ucx_req_finish(ucx_req_t *r, pdx_status_t st)
{
    if (r->stage != UCX_STAGE_DONE) {
        r->stage = UCX_STAGE_DONE;
        r->status = st;
        r->be->reqs_done++;
    }
}

/* A UCX request of `r` failed: log it unless the endpoint failure that
 * caused it was already logged, or it was a cancel we asked for. */
static void ucx_req_fail(ucx_req_t *r, ucs_status_t status, const char *what)
{
    ucx_peer_t *peer = r->peer;
    if (peer != NULL && peer->ep_status != UCS_OK) {
        ucx_req_finish(r, PDX_ERR_REMOTE_DISCONNECT);
        return;
    }
    if (!r->aborted) {
        pdx_log(ucx_op_log_level(status, UCS_OK), "ucx: peer %s: %s %s "
                "failed: %s", peer != NULL ? peer->name : "(gone)",
                r->op == PDX_XFER_READ ? "read" : "write", what,
                ucs_status_string(status));
    }
    ucx_req_finish(r, r->aborted ? PDX_ERR_CANCELED : ucx_status(status));
}

void ucx_req_maybe_free(ucx_req_t *r)
{
    if (r->released && !ucx_req_busy(r)) {
        ucx_list_del(&r->link);
        ucx_req_put(r->be, r);
    }
}

static void ucx_notif_req_cb(void *request, ucs_status_t status,
                             void *user_data)
{
    ucx_req_t *r = user_data;
    ucp_request_free(request);
    r->ucs_req = NULL;
    if (status != UCS_OK) {
        ucx_req_fail(r, status, "notification");
    } else {
        ucx_req_finish(r, PDX_OK);
    }
    ucx_req_maybe_free(r);
}

/* The data of `r` has landed; send its notification if it has one.
 * PDX_INPROGRESS while the AM is in flight, else the final status. */
pdx_status_t ucx_req_send_notif(ucx_req_t *r)
{
    if (!r->has_notif) {
        return PDX_OK;
    }
    ucs_status_ptr_t sp = ucx_am_send(r->be, r->peer->ep, r->notif,
                                      r->notif_len, ucx_notif_req_cb, r);
    if (UCS_PTR_IS_ERR(sp)) {
        ucs_status_t s = UCS_PTR_STATUS(sp);
        pdx_log(ucx_op_log_level(s, r->peer->ep_status), "ucx: peer %s: "
                "sending a %zu-byte notification failed: %s", r->peer->name,
                r->notif_len, ucs_status_string(s));
        return ucx_status(s);
    }
    if (sp == NULL) {
        return PDX_OK;
    }
    r->stage = UCX_STAGE_NOTIF;
    r->ucs_req = sp;
    return PDX_INPROGRESS;
}

/* Every byte of `r` has landed (status UCS_OK) or its move failed. */
static void ucx_req_data_done(ucx_req_t *r, ucs_status_t status,
                              const char *what)
{
    if (r->stage != UCX_STAGE_FLUSH) {
        return;
    }
    if (status != UCS_OK) {
        ucx_req_fail(r, status, what);
    } else if (r->aborted) {
        ucx_req_finish(r, PDX_ERR_CANCELED);
    } else {
        r->peer->wired = 1;
        /* Sending from a callback is allowed; only progress is not. */
        pdx_status_t st = ucx_req_send_notif(r);
        if (st != PDX_INPROGRESS) {
            ucx_req_finish(r, st);
        }
    }
}

void ucx_req_stage_done(ucx_req_t *r, pdx_status_t st)
{
    if (r->stage == UCX_STAGE_FLUSH) {
        if (st != PDX_OK && r->peer != NULL && r->peer->ep_status != UCS_OK) {
            st = PDX_ERR_REMOTE_DISCONNECT;
        }
        if (st != PDX_OK || r->aborted) {
            ucx_req_finish(r, r->aborted && (st == PDX_OK ||
                                             st == PDX_ERR_CANCELED)
                                  ? PDX_ERR_CANCELED
                                  : st);
        } else if (r->peer != NULL) {
            r->peer->wired = 1;
            st = ucx_req_send_notif(r);
            if (st != PDX_INPROGRESS) {
                ucx_req_finish(r, st);
            }
        } else {
            ucx_req_finish(r, PDX_ERR_REMOTE_DISCONNECT);
        }
    }
    ucx_req_maybe_free(r);
}

void ucx_flush_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_req_t *r = user_data;
    ucp_request_free(request);
    r->ucs_req = NULL;
    ucx_req_data_done(r, status, "flush");
    ucx_req_maybe_free(r);
}

/* A READ's get: the last one to complete ends the data stage (a get's
 * completion means its bytes landed; no flush is needed). Each also
 * counts for a drain, which tells a slow peer (chunks still completing)
 * from a stalled one. */
void ucx_get_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_req_t *r = user_data;
    ucp_request_free(request);
    r->be->gets_done++;
    if (status != UCS_OK && r->get_status == UCS_OK) {
        r->get_status = status;
    }
    if (--r->gets_left > 0) {
        return;
    }
    ucx_req_data_done(r, r->get_status, "get");
    ucx_req_maybe_free(r);
}
