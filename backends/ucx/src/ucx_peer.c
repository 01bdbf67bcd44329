/* ucx: peers and their endpoints: connect, error callbacks, closes (with
 * deadlines, forced when the peer failed), giving up on a stalled peer,
 * and the transport report of a path. */
#include "ucx_int.h"

/* Mark `peer` failed; the agent hears of it from the next progress or
 * xfer_check, and its live requests fail now. */
static void ucx_peer_set_failed(ucx_peer_t *peer, ucs_status_t status)
{
    if (peer->ep_status != UCS_OK) {
        return;
    }
    peer->ep_status = status;
    peer->error_pending = 1;
    if (peer->be != NULL) {
        peer->be->lost++;
        peer->be->errors_hint = 1;
    }
    for (ucx_link_t *l = peer->reqs.next; l != &peer->reqs; l = l->next) {
        ucx_req_finish(UCX_CONTAINER(l, ucx_req_t, link),
                       PDX_ERR_REMOTE_DISCONNECT);
    }
    if (peer->be != NULL) {
        /* Staged jobs waiting for its answers end now. */
        ucx_stage_peer_failed(peer->be, peer);
    }
}

static void ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *peer = arg;
    (void)ep;
    if (peer->ep_status == UCS_OK) {
        pdx_error("ucx: peer %s: endpoint failed: %s", peer->name,
                  ucs_status_string(status));
    }
    peer->ucx_failed = 1;
    ucx_peer_set_failed(peer, status);
}

/* Report failed peers to the agent (those marked since the hint was set).
 * The scan restarts after each callback
 * because the agent may disconnect peers from inside it; each pass clears
 * one flag, so it ends. */
int ucx_deliver_errors(ucx_be_t *be)
{
    int n = 0;
    int again = 1;
    /* Every progress call comes here: no walk of the peers without a
     * failure (a callback may set the hint again). */
    if (!be->errors_hint) {
        return 0;
    }
    be->errors_hint = 0;
    while (again) {
        again = 0;
        for (ucx_link_t *l = be->peers.next; l != &be->peers; l = l->next) {
            ucx_peer_t *peer = UCX_CONTAINER(l, ucx_peer_t, link);
            if (peer->error_pending) {
                peer->error_pending = 0;
                if (be->host.peer_error != NULL) {
                    be->host.peer_error(be->host.agent_ctx, peer->name,
                                        PDX_ERR_REMOTE_DISCONNECT);
                }
                n++;
                again = 1;
                break;
            }
        }
    }
    return n;
}

/* Start closing the endpoint of `peer` without waiting: the close request
 * (if UCX needs one) is kept in peer->close_req and reaped by progress. */
static void ucx_ep_close_async(ucx_be_t *be, ucx_peer_t *peer, int force)
{
    if (peer->ep == NULL) {
        return;
    }
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0,
    };
    be->forced += force != 0;
    ucs_status_ptr_t sp = ucp_ep_close_nbx(peer->ep, &p);
    peer->ep = NULL;
    if (sp == NULL) {
        return;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        /* The endpoint is released even when closing reports an error. */
        pdx_debug("ucx: peer %s: close: %s", peer->name,
                  ucs_status_string(UCS_PTR_STATUS(sp)));
        return;
    }
    peer->close_req = sp;
}

/* Has the close of `peer` finished (or was there none)? Frees the close
 * request when it has. */
int ucx_close_done(ucx_peer_t *peer)
{
    if (peer->flush_req != NULL) {
        return 0;
    }
    if (peer->close_req == NULL) {
        return 1;
    }
    if (ucp_request_check_status(peer->close_req) == UCS_INPROGRESS) {
        return 0;
    }
    ucp_request_free(peer->close_req);
    peer->close_req = NULL;
    return 1;
}

/* Start closing `peer`'s endpoint without waiting. A failed or given-up
 * peer is forced at once. Any other is flushed first, so queued
 * notifications still reach it; a flush that has not finished by
 * close_deadline (a hung peer) is abandoned and the endpoint forced, which
 * purges what UCX still holds for it. Never closing with a flush that cannot
 * finish matters: UCX 1.13 asserts in ucp_worker_destroy on an endpoint
 * whose requests were never completed or purged. */
static void ucx_ep_close_start(ucx_be_t *be, ucx_peer_t *peer)
{
    if (peer->ep == NULL) {
        return;
    }
    peer->close_deadline = pdx_after_ns(UCX_CLOSE_TIMEOUT_NS);
    if (peer->ucx_failed || peer->ep_status != UCS_OK) {
        ucx_ep_close_async(be, peer, 1);
        return;
    }
    ucp_request_param_t p = {.op_attr_mask = 0};
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(peer->ep, &p);
    if (sp == NULL) {
        ucx_ep_close_async(be, peer, 0);
    } else if (UCS_PTR_IS_ERR(sp)) {
        pdx_debug("ucx: peer %s: flush before close: %s", peer->name,
                  ucs_status_string(UCS_PTR_STATUS(sp)));
        ucx_ep_close_async(be, peer, 1);
    } else {
        peer->flush_req = sp;
    }
}

/* Move a close along: a finished flush becomes a close; a flush past its
 * deadline (or any, when `now_force`) is abandoned and the endpoint forced.
 * Never waits. */
void ucx_ep_close_step(ucx_be_t *be, ucx_peer_t *peer, int now_force)
{
    if (peer->flush_req == NULL) {
        return;
    }
    ucs_status_t fs = ucp_request_check_status(peer->flush_req);
    if (fs == UCS_INPROGRESS) {
        if (!now_force && pdx_before(peer->close_deadline)) {
            return;
        }
        if (!now_force) {
            pdx_warn("ucx: peer %s: endpoint flush did not finish within "
                     "%llu ms; forcing the endpoint closed", peer->name,
                     UCX_CLOSE_TIMEOUT_NS / 1000000ull);
        }
    }
    /* An unfinished request is released by UCX when it completes (the
     * force below completes it). */
    ucp_request_free(peer->flush_req);
    peer->flush_req = NULL;
    ucx_ep_close_async(be, peer, fs != UCS_OK);
}

/* A worker of the instance: SERIALIZED (the agent never calls in from two
 * threads at once), its wake-up fds in the instance's epoll set (so one fd
 * wakes the agent for every worker). Blocking (UCX opens its interfaces). */
pdx_status_t ucx_worker_open(ucx_be_t *be, const char *name,
                             ucx_wctx_t *wc, ucp_worker_h *w_p)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE |
                      UCP_WORKER_PARAM_FIELD_NAME |
                      UCP_WORKER_PARAM_FIELD_EVENT_FD |
                      UCP_WORKER_PARAM_FIELD_USER_DATA,
        .thread_mode = UCS_THREAD_MODE_SERIALIZED,
        .name = name,
        .event_fd = be->efd,
        .user_data = be,
    };
    ucs_status_t s = ucp_worker_create(be->ctx, &wp, w_p);
    if (s != UCS_OK) {
        *w_p = NULL;
        pdx_error("ucx: worker creation with tls=%s failed: %s",
                  be->tls[0] ? be->tls : "(default)", ucs_status_string(s));
        return be->tls[0] ? PDX_ERR_CONFIG : ucx_status(s);
    }
    /* Staged transfers' answers come back to the worker that asked, at
     * the address the request carries. */
    wc->be = be;
    wc->worker = *w_p;
    ucp_address_t *a = NULL;
    size_t alen = 0;
    pdx_status_t st = ucx_stage_set_handler(be, wc);
    if (st == PDX_OK) {
        st = ucx_dram_set_handler(be, wc);
    }
    if (st == PDX_OK) {
        s = ucp_worker_get_address(*w_p, &a, &alen);
        st = s != UCS_OK ? ucx_status(s) : PDX_OK;
    }
    if (st == PDX_OK && (wc->addr = malloc(alen)) == NULL) {
        st = PDX_ERR_NOMEM;
    }
    if (a != NULL) {
        if (st == PDX_OK) {
            memcpy(wc->addr, a, alen);
            wc->addr_len = alen;
        }
        ucp_worker_release_address(*w_p, a);
    }
    if (st != PDX_OK) {
        ucp_worker_destroy(*w_p);
        *w_p = NULL;
        return st;
    }
    return PDX_OK;
}

/* Does `peer` get a worker of its own? Where the instance may use UCX's
 * shared-memory FIFOs (its own address has an mm transport) and the peer's
 * address has one on this host (the same device address: UCX's system
 * id): then UCX reaches it over shared memory. */
static int ucx_peer_wants_worker(const ucx_be_t *be, const ucx_peer_t *peer)
{
    return be->peer_workers && ucx_vaddr_same_host(&peer->vaddr, &be->self);
}

/* Free every notification record on a list: UCX will not call back for
 * them (their worker is gone). */
void ucx_send_list_free(ucx_link_t *head)
{
    while (!ucx_list_empty(head)) {
        ucx_link_t *l = head->next;
        ucx_list_del(l);
        free(UCX_CONTAINER(l, ucx_send_t, link));
    }
}

/* The last of a peer no list holds: keys the agent may still hold no
 * longer point at it, and its memory goes. */
static void ucx_peer_dealloc(ucx_peer_t *peer)
{
    while (!ucx_list_empty(&peer->rmds)) {
        ucx_rmd_t *rmd = UCX_CONTAINER(peer->rmds.next, ucx_rmd_t, plink);
        ucx_list_del(&rmd->plink);
        rmd->peer = NULL;
    }
    free(peer->addr);
    free(peer->name);
    free(peer);
}

/* UCX no longer calls back for requests on `w` (destroyed): end those
 * still counted on it, and free the ones nobody owns. */
static void ucx_reqs_worker_gone(ucx_be_t *be, ucx_link_t *head,
                                 ucp_worker_h w)
{
    ucx_link_t *l = head->next;
    while (l != head) {
        ucx_link_t *next = l->next;
        ucx_req_t *r = UCX_CONTAINER(l, ucx_req_t, link);
        if (r->worker == w && ucx_req_busy(r)) {
            r->ucs_req = NULL;
            r->gets_left = 0;
            ucx_req_finish(r, PDX_ERR_REMOTE_DISCONNECT);
            if (r->released) {
                ucx_list_del(&r->link);
                ucx_req_put(be, r);
            }
        }
        l = next;
    }
}

/* Destroy `peer`'s own worker (if it has one) and what UCX held on it: its
 * keys first (UCX frees them into the worker's pool), then the worker
 * (which completes or drops its requests), then the records of requests
 * and notifications whose callbacks will not come. The endpoint must be
 * closed (or the worker be going with the instance). Blocking (bounded:
 * UCX closes its interfaces). */
void ucx_peer_worker_destroy(ucx_be_t *be, ucx_peer_t *peer)
{
    if (!peer->own_worker || peer->worker == NULL) {
        return;
    }
    for (ucx_link_t *l = peer->rmds.next; l != &peer->rmds; l = l->next) {
        ucx_rmd_t *rmd = UCX_CONTAINER(l, ucx_rmd_t, plink);
        if (rmd->rkey != NULL) {
            ucp_rkey_destroy(rmd->rkey);
            rmd->rkey = NULL;
        }
    }
    ucp_worker_h w = peer->worker;
    ucp_worker_destroy(w);
    peer->worker = NULL;
    free(peer->wctx.addr);
    peer->wctx.addr = NULL;
    ucx_list_del(&peer->wlink);
    ucx_stage_worker_gone(be, w);
    ucx_reqs_worker_gone(be, &peer->reqs, w);
    ucx_reqs_worker_gone(be, &be->orphan_reqs, w);
    ucx_dram_worker_gone(be, w);
    ucx_send_list_free(&peer->sends);
}

/* Free a peer taken off every list whose endpoint is closed: its own
 * worker goes; notifications still in flight on the main worker are
 * handed to the instance (their callbacks free them); its keys, if the
 * agent still holds any, are detached. */
void ucx_peer_release(ucx_be_t *be, ucx_peer_t *peer)
{
    ucx_stage_peer_gone(be, peer);
    ucx_peer_worker_destroy(be, peer);
    while (!ucx_list_empty(&peer->sends)) {
        ucx_link_t *l = peer->sends.next;
        ucx_list_del(l);
        ucx_list_push(&be->orphan_sends, l);
    }
    ucx_peer_dealloc(peer);
}

void ucx_peer_free(ucx_peer_t *peer)
{
    if (peer->close_req != NULL || peer->flush_req != NULL) {
        /* Only after the worker is gone (destroy): UCX releases them. */
        peer->close_req = NULL;
        peer->flush_req = NULL;
    }
    /* Sends still listed here never completed; UCX is gone or will not
     * touch them again (the worker is destroyed before this runs). */
    ucx_send_list_free(&peer->sends);
    ucx_peer_dealloc(peer);
}

pdx_status_t ucx_peer_connect(void *bev, const char *peer_name,
                              const void *conn, size_t conn_len,
                              void **peer_p)
{
    ucx_be_t *be = bev;
    pdx_status_t st;
    if (be == NULL || peer_name == NULL || conn == NULL || conn_len == 0 ||
        peer_p == NULL) {
        return PDX_ERR_INVALID;
    }
    /* Peer bytes: UCX would abort or read out of bounds on a bad one. */
    ucx_vaddr_t vaddr;
    char vwhy[256];
    st = ucx_validate_address(&be->vlocal, conn, conn_len, &vaddr, vwhy,
                              sizeof(vwhy));
    if (st != PDX_OK) {
        pdx_error("ucx: peer %s: malformed connection info (%zu-byte worker "
                  "address): %s", peer_name, conn_len, vwhy);
        return st;
    }
    ucx_peer_t *peer = calloc(1, sizeof(*peer));
    if (peer == NULL) {
        return PDX_ERR_NOMEM;
    }
    peer->name = strdup(peer_name);
    peer->addr = malloc(conn_len);
    if (peer->name == NULL || peer->addr == NULL) {
        st = PDX_ERR_NOMEM;
        goto err_peer;
    }
    memcpy(peer->addr, conn, conn_len);
    peer->addr_len = conn_len;
    peer->be = be;
    peer->worker = be->worker;
    peer->ep_status = UCS_OK;
    peer->served = -1;
    peer->vaddr = vaddr;
    ucx_list_init(&peer->reqs);
    ucx_list_init(&peer->sends);
    ucx_list_init(&peer->rmds);
    ucx_list_init(&peer->wlink);
    /* Eager: the endpoint now, so that a peer UCX cannot reach is
     * declined at load. Not for a same-host peer over shared memory: its
     * address already says UCX reaches it, and its endpoint comes with a
     * worker of its own (1.3 MiB, progressed and armed at every wake-up),
     * wasted where the agent moves its data with another backend (cma). */
    if (!be->lazy && !ucx_peer_wants_worker(be, peer)) {
        st = ucx_peer_ep(be, peer);
        if (st != PDX_OK) {
            goto err_peer;
        }
    }
    ucx_list_push(&be->peers, &peer->link);
    *peer_p = peer;
    return PDX_OK;

err_peer:
    free(peer->addr);
    free(peer->name);
    free(peer);
    return st;
}

/* Can `peer` still be used (its endpoint made, or to be made at first
 * use)? PDX_OK; the lazy connect's error; or PDX_ERR_REMOTE_DISCONNECT
 * for a failed or closed peer. Makes nothing. */
pdx_status_t ucx_peer_usable(const ucx_peer_t *peer)
{
    if (peer->connect_st != PDX_OK) {
        return peer->connect_st;
    }
    if (peer->ep_status != UCS_OK || (peer->ep == NULL && peer->addr == NULL)) {
        return PDX_ERR_REMOTE_DISCONNECT; /* failed, or closed */
    }
    return PDX_OK;
}

/* The endpoint of `peer`, created on first use where the instance
 * connects lazily (UCX's endpoint creation is the costly part of loading
 * a peer: it queries every interface for lane selection and wires up a
 * reply endpoint at the peer, work wasted on peers never transferred
 * with). PDX_OK once the endpoint exists; PDX_ERR_REMOTE_DISCONNECT for a
 * failed or closed peer; PDX_ERR_UNSUPPORTED when UCX has no transport to
 * reach it. Non-blocking. */
pdx_status_t ucx_peer_ep(ucx_be_t *be, ucx_peer_t *peer)
{
    pdx_status_t ust = ucx_peer_usable(peer);
    if (ust != PDX_OK || peer->ep != NULL) {
        return ust;
    }
    /* A local shortage is a local error, for this request only: the peer
     * is neither failed nor given up (a later use tries again). */
    char what[UCX_MAX_NAME + 32];
    snprintf(what, sizeof(what), "connecting to peer %s", peer->name);
    ust = ucx_fd_room(!peer->own_worker && ucx_peer_wants_worker(be, peer)
                          ? UCX_FDS_PEER_WORKER
                          : UCX_FDS_EP,
                      what);
    if (ust != PDX_OK) {
        return ust;
    }
    if (!peer->own_worker && ucx_peer_wants_worker(be, peer)) {
        ucp_worker_h w;
        if (ucx_worker_open(be, peer->name, &peer->wctx, &w) == PDX_OK) {
            peer->worker = w;
            peer->own_worker = 1;
            ucx_list_push(&be->wpeers, &peer->wlink);
        } else {
            pdx_warn("ucx: peer %s: no worker of its own (see above): its "
                     "replies share the main worker's receive queue",
                     peer->name);
        }
    }
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_NAME,
        .address = peer->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ucx_ep_err_cb, .arg = peer},
        .name = peer->name,
    };
    ucs_status_t s = ucp_ep_create(peer->worker, &ep, &peer->ep);
    if (s != UCS_OK) {
        /* At first use (a lazy instance, or a peer that has a worker of
         * its own: see ucx_peer_connect) or at load. */
        int first_use = be->lazy || ucx_peer_wants_worker(be, peer);
        peer->ep = NULL;
        if (peer->own_worker) {
            ucx_peer_worker_destroy(be, peer);
            peer->own_worker = 0;
            peer->worker = be->worker;
        }
        pdx_error("ucx: connecting to peer %s (%zu-byte address)%s failed: "
                  "%s%s%s", peer->name, peer->addr_len,
                  first_use ? " at its first use" : "", ucs_status_string(s),
                  s == UCS_ERR_SHMEM_SEGMENT
                      ? " (UCX's shared memory with a process of another "
                        "user or user namespace, or a non-dumpable one: give "
                        "both agents the ucx option tls=tcp)"
                      : "",
                  first_use ? "; requests to it fail until it is unloaded"
                           : "");
        /* No common transport: decline, so the agent can pick another
         * backend, rather than calling the peer dead. */
        pdx_status_t st = s == UCS_ERR_UNREACHABLE ? PDX_ERR_UNSUPPORTED
                                                   : ucx_status(s);
        if (first_use) {
            /* Loaded already: every request to it ends with this error
             * (retrying each would repeat it), until it is unloaded. */
            peer->connect_st = st;
            free(peer->addr);
            peer->addr = NULL;
        }
        return st;
    }
    free(peer->addr);
    peer->addr = NULL;
    return PDX_OK;
}

void ucx_peer_disconnect(void *bev, void *peerv)
{
    ucx_be_t *be = bev;
    ucx_peer_t *peer = peerv;
    if (be == NULL || peer == NULL) {
        return;
    }
    ucx_list_del(&peer->link);
    /* Requests still in flight: a flush would wait for what they moved
     * (and for a peer that may be going away too); they are aborted, so
     * the endpoint is forced and UCX purges them. */
    int force = !ucx_list_empty(&peer->reqs) || peer->abandoned;
    /* The agent releases requests first; if it did not, fail them and
     * detach them from the peer so nothing points at it afterwards. */
    while (!ucx_list_empty(&peer->reqs)) {
        ucx_req_t *r = UCX_CONTAINER(peer->reqs.next, ucx_req_t, link);
        pdx_debug("ucx: peer %s disconnected with a request in flight",
                  peer->name);
        r->aborted = 1;
        ucx_req_finish(r, PDX_ERR_CANCELED);
        r->peer = NULL;
        ucx_list_del(&r->link);
        ucx_list_push(&be->orphan_reqs, &r->link);
    }
    if (peer->ep != NULL) {
        /* Never waits: a hung peer must not stall the agent. */
        if (force) {
            peer->close_deadline =
                pdx_after_ns(UCX_CLOSE_TIMEOUT_NS);
            ucx_ep_close_async(be, peer, 1);
        } else {
            ucx_ep_close_start(be, peer);
        }
        /* A responsive peer completes the flush and close within a few
         * round trips: give it UCX_CLOSE_SPIN_NS of progress (bounded,
         * like a progress pass) so the common case needs no zombie. */
        uint64_t until = pdx_after_ns(UCX_CLOSE_SPIN_NS);
        while ((peer->flush_req != NULL ||
                (peer->close_req != NULL &&
                 ucp_request_check_status(peer->close_req) ==
                     UCS_INPROGRESS)) &&
               pdx_before(until)) {
            ucp_worker_progress(peer->worker);
            ucx_ep_close_step(be, peer, 0);
        }
    }
    if (!ucx_close_done(peer)) {
        /* UCX may still call back into this peer (error handler, sends):
         * keep it until its close completes (progress reaps it) or the
         * worker is destroyed. */
        ucx_list_push(&be->zombies, &peer->link);
        return;
    }
    ucx_peer_release(be, peer);
}


/* Give up on a peer that stopped answering: fail it (its requests end with
 * PDX_ERR_REMOTE_DISCONNECT, the agent hears of it at the next progress)
 * and force its endpoint closed, without waiting for the close. Even that
 * does not always stop the replies of emulated gets if the peer wakes up
 * later (seen over tcp with a stopped peer). An endpoint still in wireup
 * cannot be forced (UCX asserts); its gets stay queued. */
void ucx_peer_give_up(ucx_be_t *be, ucx_peer_t *peer, const char *why)
{
    ucx_peer_set_failed(peer, UCS_ERR_TIMED_OUT);
    if (peer->ep == NULL) {
        return;
    }
    if (!peer->wired) {
        pdx_error("ucx: peer %s: %s while connecting; the peer is failed, "
                  "but its queued gets may still land if it wakes",
                  peer->name, why);
        return;
    }
    pdx_error("ucx: peer %s: %s; forcing the endpoint closed (late replies "
              "may still land if the peer wakes)", peer->name, why);
    ucx_ep_close_async(be, peer, 1);
}

/* The agent saw the peer's process exit: fail its requests now and force
 * the endpoint closed, so nothing waits for a drain that cannot come. */
void ucx_peer_failed(void *bev, void *peerv)
{
    ucx_be_t *be = bev;
    ucx_peer_t *peer = peerv;
    if (be == NULL || peer == NULL) {
        return;
    }
    ucx_peer_set_failed(peer, UCS_ERR_CONNECTION_RESET);
    peer->error_pending = 0; /* the agent told us */
    if (peer->ep != NULL && peer->wired) {
        ucx_ep_close_async(be, peer, 1);
    }
}

/* Transport names of the lanes of `peer`'s endpoint ("sysv/memory,tcp/lo"),
 * computed once. */
void ucx_peer_transport(ucx_peer_t *peer)
{
    if (peer->transport[0] != '\0' || peer->ep == NULL) {
        return;
    }
    char *dump = NULL;
    size_t dump_len = 0;
    FILE *f = open_memstream(&dump, &dump_len);
    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(peer->ep, f);
    fclose(f);
    FILE *in = dump_len > 0 ? fmemopen(dump, dump_len, "r") : NULL;
    if (in != NULL) {
        ucx_describe_tls(in, 1, peer->transport, sizeof(peer->transport));
        fclose(in);
    }
    free(dump);
}

pdx_status_t ucx_path(void *bev, void *peerv, void *rmdv,
                      char *transport, size_t tlen, char *why,
                      size_t wlen)
{
    ucx_be_t *be = bev;
    ucx_peer_t *peer = peerv;
    ucx_rmd_t *rmd = rmdv;
    if (why != NULL && wlen > 0) {
        why[0] = '\0';
    }
    if (peer == NULL) {
        /* No peer: how this instance moves its own GPU memory (natively,
         * or staged through its pinned pool, a slower path). */
        if (be == NULL || rmd != NULL) {
            return PDX_ERR_INVALID;
        }
        snprintf(transport, tlen, "vram %s",
                 ucx_vram_mode_name(be->vram_mode));
        if (be->vram_mode == UCX_VRAM_NATIVE) {
            return PDX_OK;
        }
        if (why != NULL) {
            snprintf(why, wlen, "%s", be->vram_why);
        }
        return PDX_ERR_UNAVAILABLE;
    }
    ucx_peer_transport(peer);
    const char *tl = peer->transport[0] ? peer->transport : "ucx";
    if (rmd != NULL && rmd->type == PDX_MEM_VRAM && rmd->staged) {
        /* The peer's GPU memory through its staging service. */
        snprintf(transport, tlen, "staged over %s", tl);
        if (why != NULL) {
            snprintf(why, wlen, "%s", be->vram_mode == UCX_VRAM_NATIVE
                                          ? "the peer's UCX does not carry "
                                            "CUDA memory: its staging serves "
                                            "it"
                                          : be->vram_why);
        }
        return PDX_ERR_UNAVAILABLE;
    }
    snprintf(transport, tlen, "%s", tl);
    /* UCX's own choice among its transports is its fast path; whether a
     * same-host peer should have used cma or cuda_ipc is the agent's call. */
    return PDX_OK;
}

/* Collect transport names from UCX's multi-line dumps: "lane[i]: N:tl/dev.0"
 * lines for an endpoint, "resource N : ... flags -- tl/dev" for a context. */
void ucx_describe_tls(FILE *in, int lanes, char *out, size_t outlen)
{
    char line[512];
    size_t used = strlen(out);
    int count = 0;
    while (count < 32 && fgets(line, sizeof(line), in) != NULL) {
        char *p;
        char name[96];
        if (lanes) {
            p = strstr(line, "lane[");
            if (p == NULL || (p = strchr(p, ':')) == NULL) {
                continue;
            }
            p = strchr(p + 1, ':');
            if (p == NULL) {
                continue;
            }
            p++;
        } else {
            p = strstr(line, "-- ");
            if (strstr(line, "resource") == NULL || p == NULL) {
                continue;
            }
            p += 3;
        }
        size_t k = 0;
        while (p[k] != '\0' && p[k] != ' ' && p[k] != '\n' &&
               (p[k] != '.' || !lanes) && k + 1 < sizeof(name)) {
            name[k] = p[k];
            k++;
        }
        name[k] = '\0';
        if (k == 0 || strstr(out, name) != NULL) {
            continue;
        }
        int w = snprintf(out + used, outlen - used, "%s%s",
                         count > 0 ? "," : "", name);
        if (w < 0 || (size_t)w >= outlen - used) {
            out[used] = '\0';
            break;
        }
        used += (size_t)w;
        count++;
    }
}
