/* ucx: notifications as active messages: the receive callbacks, the inbox
 * that delivers them in arrival order from progress, and the send both a
 * transfer's notification and a standalone one (ucx_xfer.c) go through. */
#include "ucx_int.h"

static void ucx_am_rndv_cb(void *request, ucs_status_t status, size_t length,
                           void *user_data)
{
    ucx_inmsg_t *m = user_data;
    ucp_request_free(request);
    m->be->rx_rndv--;
    if (status != UCS_OK) {
        pdx_error("ucx: notification from %s: rendezvous receive of %zu "
                  "bytes failed: %s", m->peer, m->len,
                  ucs_status_string(status));
        m->failed = 1;
    }
    m->ready = 1;
}

ucs_status_t ucx_am_recv_cb(void *arg, const void *header,
                            size_t header_length, void *data,
                            size_t length,
                            const ucp_am_recv_param_t *param)
{
    ucx_be_t *be = arg;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;

    if (header_length == 0 || header_length > UCX_MAX_NAME) {
        pdx_error("ucx: dropping notification with a sender name of %zu "
                  "bytes (1..%u allowed)", header_length, UCX_MAX_NAME);
        return rndv ? UCS_ERR_INVALID_PARAM : UCS_OK;
    }
    if (length > UCX_MAX_NOTIF) {
        pdx_error("ucx: dropping notification of %zu bytes from %.*s "
                  "(limit %u)", length, (int)header_length,
                  (const char *)header, UCX_MAX_NOTIF);
        return rndv ? UCS_ERR_EXCEEDS_LIMIT : UCS_OK;
    }
    ucx_inmsg_t *m = malloc(sizeof(*m) + length);
    if (m == NULL) {
        pdx_error("ucx: dropping notification of %zu bytes: out of memory",
                  length);
        return rndv ? UCS_ERR_NO_MEMORY : UCS_OK;
    }
    m->be = be;
    m->ready = 0;
    m->failed = 0;
    m->len = length;
    memcpy(m->peer, header, header_length);
    m->peer[header_length] = '\0';

    if (!rndv) {
        if (length > 0) {
            memcpy(m->data, data, length);
        }
        m->ready = 1;
        ucx_list_push(&be->inbox, &m->link);
        return UCS_OK;
    }

    /* Rendezvous: queue the entry now, so order is kept, fill it later. */
    ucp_request_param_t rp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.recv_am = ucx_am_rndv_cb,
        .user_data = m,
    };
    ucx_list_push(&be->inbox, &m->link);
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(be->worker, data, m->data,
                                               length, &rp);
    if (UCS_PTR_IS_ERR(sp)) {
        /* UCX owns the descriptor now even on failure. */
        pdx_error("ucx: notification from %s: rendezvous receive of %zu "
                  "bytes failed to start: %s", m->peer, length,
                  ucs_status_string(UCS_PTR_STATUS(sp)));
        m->failed = 1;
        m->ready = 1;
    } else if (sp == NULL) {
        m->ready = 1;
    } else {
        be->rx_rndv++;
    }
    return UCS_INPROGRESS;
}

/* Hand queued notifications to the agent, oldest first, stopping at one whose
 * data is still arriving. */
int ucx_deliver_inbox(ucx_be_t *be)
{
    int n = 0;
    while (!ucx_list_empty(&be->inbox)) {
        ucx_inmsg_t *m = UCX_CONTAINER(be->inbox.next, ucx_inmsg_t, link);
        if (!m->ready) {
            break;
        }
        ucx_list_del(&m->link);
        if (!m->failed && be->host.notif_recv != NULL) {
            be->host.notif_recv(be->host.agent_ctx, m->peer, m->data, m->len);
            n++;
        }
        free(m);
    }
    return n;
}

ucs_status_ptr_t ucx_am_send(ucx_be_t *be, ucp_ep_h ep,
                             const void *buf, size_t len,
                             ucp_send_nbx_callback_t cb, void *arg)
{
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .flags = len <= UCX_NOTIF_EAGER_MAX ? UCP_AM_SEND_FLAG_EAGER : 0,
        .cb.send = cb,
        .user_data = arg,
    };
    /* The header (our agent name) stays valid until destroy, which comes
     * after every send completed or the worker is gone. */
    return ucp_am_send_nbx(ep, UCX_AM_ID_NOTIF, be->host.agent_name,
                           be->name_len, buf, len, &p);
}
