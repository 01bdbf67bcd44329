/* ucx: served host memory, the service this instance gives peers'
 * requests (ucx_dram.c is the requester's side). Each request is checked
 * against the DRAM regions registered now (its token names one, the range
 * lies inside it, a WRITE's region is writable) before a byte is touched:
 * a WRITE's bytes are copied in from inside the AM callback, a READ's
 * copied out (checked again) when its answer is sent. Answers go from
 * progress, never from inside a UCX callback, to the requester's worker
 * address (in its request: a peer we never loaded is served too), on an
 * endpoint of ours with an error handler, one per requester
 * (ucx_client.c), closed once failed or exited: what UCX sends on its own
 * endpoints for a requester that died is dropped there, never fatal.
 * Driven by this instance's progress. */
#include "ucx_dram_int.h"

#include <signal.h>
#include <sys/stat.h>

/* The pid namespace of this process (same-host requesters are given up
 * by pid only within it). */
uint64_t ucx_dsvc_pidns(void)
{
    struct stat sb;
    return stat("/proc/self/ns/pid", &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

/* ---- the datatype of served data ------------------------------------------ */

static void *dt_start_pack(void *context, const void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return (void *)buffer; /* the ucx_dsrc_t */
}

static void *dt_start_unpack(void *context, void *buffer, size_t count)
{
    (void)context;
    (void)count;
    return buffer; /* the ucx_dsrc_t: its put places each fragment */
}

static size_t dt_packed_size(void *state)
{
    return ((const ucx_dsrc_t *)state)->len;
}

static size_t dt_pack(void *state, size_t offset, void *dest,
                      size_t max_length)
{
    const ucx_dsrc_t *s = state;
    size_t n = offset < s->len ? s->len - offset : 0;
    if (n > max_length) {
        n = max_length;
    }
    if (s->p == NULL || (s->live != NULL && !s->live(s))) {
        memset(dest, 0, n);
    } else {
        memcpy(dest, s->p + offset, n);
    }
    return n;
}

static ucs_status_t dt_unpack(void *state, size_t offset, const void *src,
                              size_t length)
{
    ucx_dsrc_t *s = state;
    if (s == NULL || s->put == NULL) {
        return UCS_ERR_UNSUPPORTED;
    }
    if (offset > s->len || length > s->len - offset) {
        return UCS_ERR_MESSAGE_TRUNCATED;
    }
    s->put(s, offset, src, length);
    return UCS_OK;
}

static void dt_finish(void *state)
{
    (void)state;
}

pdx_status_t ucx_dsvc_dt(ucx_be_t *be, ucp_datatype_t *dt_p)
{
    struct ucx_dram_state *ds = ucx_dram_state(be);
    if (ds == NULL) {
        return PDX_ERR_NOMEM;
    }
    if (!ds->has_dt) {
        static const ucp_generic_dt_ops_t ops = {
            .start_pack = dt_start_pack,
            .start_unpack = dt_start_unpack,
            .packed_size = dt_packed_size,
            .pack = dt_pack,
            .unpack = dt_unpack,
            .finish = dt_finish,
        };
        ucs_status_t s = ucp_dt_create_generic(&ops, NULL, &ds->dt);
        if (s != UCS_OK) {
            pdx_error("ucx: making the served data's datatype failed: %s",
                      ucs_status_string(s));
            return ucx_status(s);
        }
        ds->has_dt = 1;
    }
    *dt_p = ds->dt;
    return PDX_OK;
}

/* ---- the regions ---------------------------------------------------------- */

/* The DRAM region of token `token` holding [addr, +len): PDX_OK with it,
 * PDX_ERR_STALE when no region of ours has that token (deregistered, or
 * never ours), PDX_ERR_INVALID when the range is not inside it. */
static pdx_status_t dsvc_region(ucx_be_t *be, uint64_t token, uint64_t addr,
                                uint64_t len, ucx_md_t **md_p)
{
    for (ucx_link_t *l = be->dregs.next; l != &be->dregs; l = l->next) {
        ucx_md_t *md = UCX_CONTAINER(l, ucx_md_t, vlink);
        if (md->token != token) {
            continue;
        }
        if (addr < md->addr || len > md->len || addr - md->addr > md->len - len) {
            return PDX_ERR_INVALID;
        }
        *md_p = md;
        return PDX_OK;
    }
    return PDX_ERR_STALE;
}

/* A refusal, logged at most once a second (a peer hammering a region
 * that went must not flood the log). */
static void dsvc_refused(ucx_be_t *be, const dhdr_t *h, pdx_status_t st,
                         const char *why)
{
    struct ucx_dram_state *ds = be->dram;
    ds->refused++;
    uint64_t now = pdx_now_ns();
    if (ds->refused_log_ns != 0 && now - ds->refused_log_ns < 1000000000ull) {
        ds->refused_quiet++;
        return;
    }
    ds->refused_log_ns = now;
    pdx_warn("ucx: refused %s's %s of 0x%" PRIx64 " +%" PRIu64 ": %s (%s)"
             "%s", h->name, h->op == DOP_READ ? "READ" : "WRITE", h->raddr,
             h->len, why, pdx_status_string(st),
             ds->refused_quiet > 0 ? " (and others in the last second)"
                                   : "");
    ds->refused_quiet = 0;
}

/* ---- requests ------------------------------------------------------------- */

/* Bytes of WRITE `a` (a rendezvous fragment, a piece) at `off` of its
 * chunk: into its region, checked again when a DRAM region was
 * deregistered since the last check (a region that went takes no more
 * bytes; the answer says why). */
static void dsvc_write_at(ucx_dans_t *a, size_t off, const void *src,
                          size_t n)
{
    ucx_be_t *be = a->be;
    struct ucx_dram_state *ds = be->dram;
    if (a->h.status != PDX_OK) {
        return;
    }
    if (a->gen != ds->gen) {
        ucx_md_t *md = NULL;
        pdx_status_t st = dsvc_region(be, a->h.token, a->h.raddr, a->h.len,
                                      &md);
        if (st == PDX_OK && md->readonly) {
            st = PDX_ERR_POLICY;
        }
        if (st != PDX_OK) {
            a->h.status = st;
            dsvc_refused(be, &a->h, st, "its region was deregistered while "
                                        "its data arrived");
            return;
        }
        a->gen = ds->gen;
    }
    memcpy((unsigned char *)(uintptr_t)a->h.raddr + off, src, n);
}

/* A rendezvous WRITE's fragment (UCX's unpack of the served datatype). */
static void dsvc_put(ucx_dsrc_t *s, size_t off, const void *src, size_t n)
{
    dsvc_write_at(s->arg, off, src, n);
}

/* A rendezvous WRITE's data is in (or failed): its answer is queued. */
static void dsvc_recv_end(ucx_dans_t *a, ucs_status_t status)
{
    struct ucx_dram_state *ds = a->be->dram;
    ucx_list_del(&a->link);
    ds->nreceiving--;
    if (status != UCS_OK && a->h.status == PDX_OK) {
        a->h.status = ucx_status(status);
    }
    if (a->h.status == PDX_OK) {
        ds->served++;
    }
    ucx_list_push(&ds->answers, &a->link);
    ds->nanswers++;
}

static void dsvc_recv_cb(void *request, ucs_status_t status, size_t length,
                         void *user_data)
{
    ucx_dans_t *a = user_data;
    (void)length;
    ucp_request_free(request);
    a->be->rx_rndv--;
    dsvc_recv_end(a, status);
}

/* Receive a checked rendezvous WRITE's data (UCX unpacks it into its
 * region through dsvc_put); its answer is queued when it is in. What the
 * AM callback returns. */
static ucs_status_t dsvc_receive(ucx_be_t *be, ucp_worker_h w, ucx_dans_t *a,
                                 void *data, ucp_datatype_t dt)
{
    struct ucx_dram_state *ds = be->dram;
    a->gen = ds->gen;
    a->src = (ucx_dsrc_t){.len = a->h.len, .put = dsvc_put, .arg = a};
    ucx_list_push(&ds->receiving, &a->link);
    ds->nreceiving++;
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = dsvc_recv_cb,
        .user_data = a,
        .datatype = dt,
    };
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(w, data, &a->src, a->h.len,
                                               &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        dsvc_recv_end(a, UCS_PTR_STATUS(sp));
    } else if (sp == NULL) {
        dsvc_recv_end(a, UCS_OK);
    } else {
        be->rx_rndv++;
    }
    return UCS_INPROGRESS;
}

ucs_status_t ucx_dsvc_request(ucx_be_t *be, ucp_worker_h w, const dhdr_t *h,
                              void *data, size_t length, int rndv)
{
    struct ucx_dram_state *ds = ucx_dram_state(be);
    if (ds == NULL || ds->nanswers + ds->nreceiving >= DSVC_MAX_ANSWERS) {
        if (ds != NULL && ds->dropped++ % 1024 == 0) {
            pdx_warn("ucx: %u served requests wait for their answers: "
                     "dropping %s's (it times out)", ds->nanswers, h->name);
        }
        return UCS_OK;
    }
    ucx_dans_t *a = malloc(sizeof(*a) + h->addr_len);
    if (a == NULL) {
        return UCS_OK;
    }
    memset(a, 0, sizeof(*a));
    a->be = be;
    a->h = *h;
    memcpy(a->addr, h->addr, h->addr_len);
    a->h.addr = a->addr;
    /* A request's status field carries what its sender takes. */
    a->rndv_ok = h->op == DOP_READ && (h->status & DREQ_RNDV_ANSWERS) != 0;
    a->frag_ok = h->op == DOP_READ && (h->status & DREQ_FRAG_ANSWERS) != 0;
    a->h.status = PDX_OK;
    pdx_status_t st = PDX_OK;
    const char *why = NULL;
    ucx_md_t *md = NULL;
    ucp_datatype_t dt = 0;
    if (rndv && (h->op != DOP_WRITE || ucx_dsvc_dt(be, &dt) != PDX_OK)) {
        st = PDX_ERR_UNSUPPORTED;
        why = "sent by rendezvous";
    } else if (h->len == 0 || h->len > DSVC_MAX_CHUNK) {
        st = PDX_ERR_TOO_LARGE;
        why = "a chunk of 1 B to 16 MiB expected";
    } else if (h->op == DOP_WRITE &&
               length != ((h->status & DREQ_WRITE_PIECES) ? 0 : h->len)) {
        st = PDX_ERR_CORRUPT;
        why = "its data is not the length it names";
    } else if ((st = dsvc_region(be, h->token, h->raddr, h->len, &md)) !=
               PDX_OK) {
        why = st == PDX_ERR_STALE ? "no region of ours has its token "
                                    "(deregistered, or never ours)"
                                  : "the range is not inside the region";
    } else if (h->op == DOP_WRITE && md->readonly) {
        st = PDX_ERR_POLICY;
        why = "the region is registered read-only";
    }
    if (st != PDX_OK) {
        dsvc_refused(be, h, st, why);
    } else if (h->op == DOP_WRITE && rndv) {
        return dsvc_receive(be, w, a, data, dt);
    } else if (h->op == DOP_WRITE && (h->status & DREQ_WRITE_PIECES)) {
        /* Its data comes in pieces (ucx_dsvc_piece). */
        a->wpieces = 1;
        a->gen = ds->gen;
        a->last_ns = pdx_now_ns();
        ucx_list_push(&ds->receiving, &a->link);
        ds->nreceiving++;
        return UCS_OK;
    } else if (h->op == DOP_WRITE) {
        /* Checked just now, and no op (a deregistration) runs while this
         * callback does. */
        memcpy((void *)(uintptr_t)h->raddr, data, h->len);
        ds->served++;
    }
    a->h.status = st;
    ucx_list_push(&ds->answers, &a->link);
    ds->nanswers++;
    return UCS_OK;
}

ucs_status_t ucx_dsvc_piece(ucx_be_t *be, const dhdr_t *h, const void *data,
                            size_t length, int rndv)
{
    struct ucx_dram_state *ds = be->dram;
    ucx_dans_t *a = NULL;
    if (ds != NULL && !rndv) {
        for (ucx_link_t *l = ds->receiving.next; l != &ds->receiving;
             l = l->next) {
            ucx_dans_t *e = UCX_CONTAINER(l, ucx_dans_t, link);
            if (e->wpieces && e->h.id == h->id && e->h.job == h->job &&
                e->h.seq == h->seq && e->h.pid == h->pid &&
                e->h.token == h->token) {
                a = e;
                break;
            }
        }
    }
    if (a == NULL) {
        /* A stranger's, a dropped request's, or sent by rendezvous. */
        pdx_debug("ucx: dropping a served WRITE's piece that no request "
                  "waits for");
        return UCS_OK;
    }
    a->last_ns = pdx_now_ns();
    if (length == 0 || h->len != length || h->raddr > a->h.len ||
        length > a->h.len - h->raddr || length > a->h.len - a->got) {
        if (a->h.status == PDX_OK) {
            a->h.status = PDX_ERR_CORRUPT;
            dsvc_refused(be, &a->h, PDX_ERR_CORRUPT,
                         "a piece of its data does not fit it");
        }
        a->wpieces = 0;
        dsvc_recv_end(a, UCS_OK); /* answered now; later pieces dropped */
        return UCS_OK;
    }
    /* Checked at the request and again since any deregistration; no op
     * (a deregistration) runs while this callback does. */
    dsvc_write_at(a, h->raddr, data, length);
    a->got += length;
    if (a->got == a->h.len) {
        a->wpieces = 0;
        dsvc_recv_end(a, UCS_OK); /* its ACK queued */
    }
    return UCS_OK;
}

/* WRITEs in pieces whose pieces stopped coming (their requester died or
 * was stopped): answered PDX_ERR_TIMEOUT (dropped at the send if the
 * requester is gone); later pieces find no request. */
static int dsvc_drop_idle_pieces(ucx_be_t *be, uint64_t now)
{
    struct ucx_dram_state *ds = be->dram;
    int n = 0;
    ucx_link_t *l = ds->receiving.next;
    while (l != &ds->receiving) {
        ucx_link_t *next = l->next;
        ucx_dans_t *a = UCX_CONTAINER(l, ucx_dans_t, link);
        if (a->wpieces && now - a->last_ns > DSVC_PIECES_IDLE_NS) {
            pdx_info("ucx: %s's served WRITE of %" PRIu64 " bytes got no "
                     "piece of its data for %llu s: answered timeout",
                     a->h.name, a->h.len,
                     DSVC_PIECES_IDLE_NS / 1000000000ull);
            a->wpieces = 0;
            if (a->h.status == PDX_OK) {
                a->h.status = PDX_ERR_TIMEOUT;
            }
            dsvc_recv_end(a, UCS_OK);
            n++;
        }
        l = next;
    }
    return n;
}

/* ---- the requesters' endpoints ------------------------------------------- */

/* The endpoint to the requester of `a` (ucx_client_get; a failed one is
 * returned, its answers dropped), given its pid where it runs in our pid
 * namespace. Never from inside a UCX callback. */
static ucx_client_t *dclient_get(ucx_be_t *be, const ucx_dans_t *a)
{
    struct ucx_dram_state *ds = be->dram;
    pid_t pid = 0;
    if (ds->pidns != 0 && a->h.pidns == ds->pidns && a->h.pid > 1 &&
        a->h.pid < (uint32_t)INT32_MAX) {
        pid = (pid_t)a->h.pid;
    }
    return ucx_client_get(&ds->clients, a->addr, a->h.addr_len, NULL, pid,
                          a->h.name);
}

/* ---- answers -------------------------------------------------------------- */

static void dans_free(ucx_be_t *be, ucx_dans_t *a)
{
    struct ucx_dram_state *ds = be->dram;
    if (a->bounce != NULL) {
        if (a->spare && ds->nspare < DSVC_SPARE_MAX) {
            ds->spare[ds->nspare++] = a->bounce;
        } else {
            free(a->bounce);
        }
    }
    free(a->fsrc);
    free(a->fhdr);
    if (a->bytes > 0) {
        ds->bytes -= a->bytes;
        ds->blocked = 0;
    }
    ucx_client_t *c = a->client;
    uint64_t bytes = a->sent_bytes;
    ucx_list_del(&a->link);
    free(a);
    if (c != NULL) {
        c->bytes -= bytes;
        ucx_client_done(c);
    }
}

static void dans_sent_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_dans_t *a = user_data;
    ucp_request_free(request);
    if (status != UCS_OK) {
        pdx_debug("ucx: an answer to %s's served request was not "
                  "delivered: %s", a->h.name, ucs_status_string(status));
    }
    dans_free(a->be, a);
}

/* A READ's data under a check made now: sent by rendezvous straight
 * from its region (to a requester that takes it, above
 * DRAM_EAGER_MAX; ucx_dsvc_region_gone copies it out should the region
 * go first), else copied out into a bounce buffer (a spare when the
 * chunk fits one). */
static pdx_status_t dans_fill(ucx_be_t *be, ucx_dans_t *a)
{
    struct ucx_dram_state *ds = be->dram;
    ucx_md_t *md = NULL;
    pdx_status_t st = dsvc_region(be, a->h.token, a->h.raddr, a->h.len, &md);
    if (st != PDX_OK) {
        dsvc_refused(be, &a->h, st, "its region was deregistered since");
        return st;
    }
    a->rndv = a->rndv_ok && a->h.len > DRAM_EAGER_MAX && !a->client->shm;
    a->frag = a->frag_ok && a->h.len > DRAM_FRAG_DATA && a->client->shm;
    if (a->frag) {
        uint64_t nf = (a->h.len + DRAM_FRAG_DATA - 1) / DRAM_FRAG_DATA;
        a->fsrc = malloc(nf * sizeof(*a->fsrc));
        a->fhdr = malloc(nf * DHDR_LEN);
        if (a->fsrc == NULL || a->fhdr == NULL) {
            return PDX_ERR_NOMEM;
        }
    } else if (!a->rndv) {
        if (a->h.len <= DRAM_CHUNK && ds->nspare > 0) {
            a->bounce = ds->spare[--ds->nspare];
            a->spare = 1;
        } else if (a->h.len <= DRAM_CHUNK) {
            a->bounce = malloc(DRAM_CHUNK);
            a->spare = 1;
        } else {
            a->bounce = malloc(a->h.len);
        }
        if (a->bounce == NULL) {
            return PDX_ERR_NOMEM;
        }
        memcpy(a->bounce, (const void *)(uintptr_t)a->h.raddr, a->h.len);
    }
    a->bytes = a->h.len;
    ds->bytes += a->bytes;
    ds->served++;
    return PDX_OK;
}

static void dans_frag_cb(void *request, ucs_status_t status, void *user_data)
{
    ucx_dans_t *a = user_data;
    ucp_request_free(request);
    if (status != UCS_OK) {
        pdx_debug("ucx: a piece of an answer to %s's served READ was not "
                  "delivered: %s", a->h.name, ucs_status_string(status));
    }
    if (--a->frag_pending == 0 && a->frags_posted) {
        dans_free(a->be, a);
    }
}

/* A READ's answer in pieces (DRAM_FRAG_DATA), each packed by UCX straight
 * from the region (ucx_dsvc_region_gone copies what is left out should
 * the region go first). A piece UCX refuses ends the sending: the
 * requester's job then waits for pieces that never come, until its
 * endpoint fails (UCX refuses for a failed one) or its request times out,
 * as for an answer not delivered. Freed by the last piece's callback, or
 * now. */
static void dans_send_frags(ucx_be_t *be, ucx_dans_t *a, ucx_client_t *c,
                            ucp_datatype_t dt)
{
    uint64_t len = a->h.len;
    uint32_t k = 0;
    for (uint64_t off = 0; off < len; off += DRAM_FRAG_DATA, k++) {
        uint64_t n = len - off < DRAM_FRAG_DATA ? len - off : DRAM_FRAG_DATA;
        unsigned char *hdr = a->fhdr + (size_t)k * DHDR_LEN;
        dhdr_t d = {.op = DOP_FRAG, .job = a->h.job, .seq = a->h.seq,
                    .status = PDX_OK, .id = a->h.id,
                    .token = DSVC_FEAT_WRITE_PIECES, .raddr = off,
                    .len = n};
        ucx_dhdr_make(hdr, &d, NULL, 0);
        a->fsrc[k] = (ucx_dsrc_t){
            .p = (const unsigned char *)(uintptr_t)a->h.raddr + off,
            .len = n};
        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                            UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_FLAGS |
                            UCP_OP_ATTR_FIELD_DATATYPE,
            .flags = UCP_AM_SEND_FLAG_EAGER,
            .cb.send = dans_frag_cb,
            .user_data = a,
            .datatype = dt,
        };
        ucs_status_ptr_t sp = ucp_am_send_nbx(c->ep, UCX_AM_ID_DRAM, hdr,
                                              DHDR_LEN, &a->fsrc[k], n, &rp);
        if (UCS_PTR_IS_ERR(sp)) {
            pdx_debug("ucx: answering %s's served READ failed: %s",
                      a->h.name, ucs_status_string(UCS_PTR_STATUS(sp)));
            break;
        }
        if (sp != NULL) {
            a->frag_pending++;
        }
    }
    a->frags_posted = 1;
    if (a->frag_pending == 0) {
        dans_free(be, a);
    } else {
        a->sent_bytes = a->bytes;
        c->bytes += a->bytes;
    }
}

/* Send answer `a` (off the queue) on the endpoint of client `c`: freed by
 * the send's callback, or now. */
static void dans_send(ucx_be_t *be, ucx_dans_t *a, ucx_client_t *c)
{
    struct ucx_dram_state *ds = be->dram;
    a->client = c;
    c->users++;
    int read = a->h.op == DOP_READ;
    if (read && a->h.status == PDX_OK) {
        a->h.status = dans_fill(be, a);
    }
    int data = read && a->h.status == PDX_OK;
    dhdr_t d = {.op = read ? DOP_DATA : DOP_ACK, .job = a->h.job,
                .seq = a->h.seq, .status = a->h.status, .id = a->h.id,
                .token = DSVC_FEAT_WRITE_PIECES,
                .len = data ? a->h.len : 0};
    ucx_dhdr_make(a->hdr, &d, NULL, 0);
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = data && a->rndv ? UCP_AM_SEND_FLAG_RNDV
                                 : UCP_AM_SEND_FLAG_EAGER,
        .cb.send = dans_sent_cb,
        .user_data = a,
    };
    if (data && ucx_dsvc_dt(be, &rp.datatype) == PDX_OK) {
        rp.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        a->src = (ucx_dsrc_t){
            .p = a->rndv ? (const unsigned char *)(uintptr_t)a->h.raddr
                         : a->bounce,
            .len = a->h.len};
    } else if (data) {
        a->h.status = PDX_ERR_NOMEM;
        data = 0;
        ucx_dhdr_make(a->hdr, &(dhdr_t){.op = DOP_DATA, .job = a->h.job,
                                         .seq = a->h.seq, .id = a->h.id,
                                         .status = PDX_ERR_NOMEM},
                      NULL, 0);
    }
    ucx_list_push(&ds->sending, &a->link);
    if (data && a->frag) {
        dans_send_frags(be, a, c, rp.datatype);
        return;
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(c->ep, UCX_AM_ID_DRAM, a->hdr,
                                          DHDR_LEN, data ? (void *)&a->src
                                                         : NULL,
                                          data ? a->h.len : 0, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        pdx_debug("ucx: answering %s's served request failed: %s",
                  a->h.name, ucs_status_string(UCS_PTR_STATUS(sp)));
        dans_free(be, a);
    } else if (sp == NULL) {
        dans_free(be, a);
    } else {
        a->sent_bytes = a->bytes;
        c->bytes += a->bytes;
    }
}

void ucx_dsvc_region_gone(ucx_be_t *be, const ucx_md_t *md)
{
    struct ucx_dram_state *ds = be->dram;
    if (ds == NULL) {
        return;
    }
    /* Rendezvous WRITEs arriving into it look again (dsvc_put). */
    ds->gen++;
    /* READ answers UCX still sends from it: their bytes as they are now,
     * copied out, so UCX never reads the region after this. */
    for (ucx_link_t *l = ds->sending.next; l != &ds->sending; l = l->next) {
        ucx_dans_t *a = UCX_CONTAINER(l, ucx_dans_t, link);
        /* Sent from the region (rendezvous, or in pieces) starting at the
         * chunk's address. */
        uintptr_t p = (uintptr_t)a->h.raddr;
        if (!(a->rndv || a->frag) || a->bounce != NULL ||
            a->h.op != DOP_READ || p < md->addr || p - md->addr >= md->len) {
            continue;
        }
        a->bounce = malloc(a->h.len);
        a->spare = 0;
        if (a->bounce != NULL) {
            memcpy(a->bounce, (const void *)p, a->h.len);
        } else {
            pdx_error("ucx: out of memory copying a served READ's %" PRIu64
                      " bytes out of a region being deregistered: %s gets "
                      "zeros", a->h.len, a->h.name);
        }
        if (a->frag) {
            /* Every piece's bytes from the copy (those UCX packed already
             * are no longer read). */
            for (uint64_t off = 0, k = 0; off < a->h.len;
                 off += DRAM_FRAG_DATA, k++) {
                a->fsrc[k].p = a->bounce != NULL ? a->bounce + off : NULL;
            }
        } else {
            a->src.p = a->bounce;
        }
    }
}

int ucx_dsvc_quiesce(ucx_be_t *be)
{
    struct ucx_dram_state *ds = be->dram;
    if (ds == NULL) {
        return 0;
    }
    return ucx_clients_shut(&ds->clients) | !ucx_list_empty(&ds->sending);
}

int ucx_dsvc_pending(const ucx_be_t *be)
{
    return be->dram != NULL && !ucx_list_empty(&be->dram->answers) &&
           !be->dram->blocked;
}

/* Send the queued answers that may go now: every answer without data;
 * a READ's while the data in flight, overall and to its requester, is
 * under its cap (the others wait in order). Answers to a requester that
 * failed or cannot be reached are dropped. */
static int dsvc_send_queued(ucx_be_t *be)
{
    struct ucx_dram_state *ds = be->dram;
    int n = 0, waiting = 0;
    ucx_link_t *l = ds->answers.next;
    while (l != &ds->answers) {
        ucx_link_t *next = l->next;
        ucx_dans_t *a = UCX_CONTAINER(l, ucx_dans_t, link);
        ucx_client_t *c = dclient_get(be, a);
        if (c != NULL && !c->failed && !c->closing &&
            a->h.op == DOP_READ && a->h.status == PDX_OK &&
            ((ds->bytes > 0 && ds->bytes + a->h.len > DSVC_MAX_BYTES) ||
             (c->bytes > 0 && c->bytes + a->h.len > DSVC_CLIENT_BYTES))) {
            waiting++;
            l = next;
            continue;
        }
        ucx_list_del(&a->link);
        ds->nanswers--;
        if (c == NULL || c->failed || c->closing) {
            free(a);
        } else {
            dans_send(be, a, c);
        }
        n++;
        l = next;
    }
    ds->blocked = waiting > 0 && (uint32_t)waiting == ds->nanswers;
    return n;
}

/* Requesters that failed or exited (same host: their pid, looked at
 * whether or not answers are in flight) are closed at once (what UCX
 * still holds for it ends); live idle ones are kept (see
 * DSVC_MAX_CLIENTS); one on another host that went is found by UCX (its
 * endpoint fails). */
static int dsvc_reap_clients(ucx_be_t *be, uint64_t now)
{
    struct ucx_dram_state *ds = be->dram;
    int n = 0;
    ucx_link_t *l = ds->clients.live.next;
    while (l != &ds->clients.live) {
        ucx_link_t *next = l->next;
        ucx_client_t *c = UCX_CONTAINER(l, ucx_client_t, link);
        if (!c->failed && c->pid > 0 && kill(c->pid, 0) != 0 &&
            errno == ESRCH) {
            pdx_debug("ucx: a served requester (pid %d) exited with %u "
                      "answers in flight to it", (int)c->pid, c->users);
            ucx_client_retire(c, NULL);
        }
        if (c->failed) {
            ucx_client_close(c);
            n++;
        }
        l = next;
    }
    return n;
}

int ucx_dsvc_progress(ucx_be_t *be)
{
    struct ucx_dram_state *ds = be->dram;
    if (ds == NULL) {
        return 0;
    }
    int n = 0;
    if (!ucx_list_empty(&ds->answers) && !ds->blocked) {
        n += dsvc_send_queued(be);
    }
    /* A main worker that cannot sleep may wait on sends to a requester
     * that died (its FIFO full for good): looked at every pass then, so
     * its close frees the worker at once rather than at the next check. */
    uint64_t now = pdx_now_ns();
    uint64_t every = be->main_ws.stuck_since_ns != 0 ? DSVC_PID_CHECK_STUCK_NS
                                                     : DSVC_PID_CHECK_NS;
    if (now - ds->idle_check_ns >= every) {
        ds->idle_check_ns = now;
        n += dsvc_reap_clients(be, now);
        n += dsvc_drop_idle_pieces(be, now);
    }
    return n;
}

void ucx_dsvc_describe(const ucx_be_t *be, char *buf, size_t len)
{
    const struct ucx_dram_state *ds = be->dram;
    unsigned closing = 0;
    for (const ucx_link_t *l = ds->clients.closing.next;
         l != &ds->clients.closing && closing < 1000000; l = l->next) {
        closing++;
    }
    snprintf(buf, len, "served host memory: %" PRIu64 " chunks served, %"
             PRIu64 " refused, %" PRIu64 " dropped; %u requesters (%u "
             "closing), %u answers queued, %" PRIu64 " bytes in flight; "
             "chunks moved here in pieces: %" PRIu64 " READ, %" PRIu64
             " WRITE",
             ds->served, ds->refused, ds->dropped, ds->clients.n, closing,
             ds->nanswers, ds->bytes, ds->frag_chunks, ds->wpiece_chunks);
}

void ucx_dsvc_fini(ucx_be_t *be)
{
    struct ucx_dram_state *ds = be->dram;
    if (ds == NULL) {
        return;
    }
    /* The workers are gone: no callback comes for what UCX held. */
    while (!ucx_list_empty(&ds->sending)) {
        ucx_dans_t *a = UCX_CONTAINER(ds->sending.next, ucx_dans_t, link);
        a->client = NULL;
        dans_free(be, a);
    }
    while (!ucx_list_empty(&ds->answers)) {
        ucx_dans_t *a = UCX_CONTAINER(ds->answers.next, ucx_dans_t, link);
        dans_free(be, a);
    }
    while (!ucx_list_empty(&ds->receiving)) {
        ucx_dans_t *a = UCX_CONTAINER(ds->receiving.next, ucx_dans_t, link);
        ds->nreceiving--;
        dans_free(be, a);
    }
    ucx_clients_drop(&ds->clients);
    while (ds->nspare > 0) {
        free(ds->spare[--ds->nspare]);
    }
}
