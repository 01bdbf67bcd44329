/* ucx: the requesters' endpoints of ucx_client_int.h, from the address
 * check to the close. */
#include "ucx_client_int.h"

void ucx_clients_init(ucx_clients_t *cs, ucx_be_t *be, uint32_t max,
                      const char *what, int keep_failed, int *kick)
{
    *cs = (ucx_clients_t){.be = be, .max = max, .what = what,
                          .keep_failed = keep_failed, .kick = kick};
    ucx_list_init(&cs->live);
    ucx_list_init(&cs->closing);
}

void ucx_client_retire(ucx_client_t *c, const char *why)
{
    if (!c->failed) {
        if (why != NULL) {
            pdx_debug("ucx: a %s requester's endpoint %s", c->set->what,
                      why);
        }
        /* Like a peer's failure: a worker with a failed tcp endpoint is
         * left to the process's exit at destroy (ucx_destroy). */
        c->set->be->lost++;
    }
    c->failed = 1;
    if (c->set->kick != NULL) {
        *c->set->kick = 1;
    }
}

static void client_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_client_t *c = arg;
    (void)ep;
    if (!c->failed) {
        pdx_debug("ucx: a %s requester's endpoint failed: %s", c->set->what,
                  ucs_status_string(status));
    }
    ucx_client_retire(c, NULL);
}

static void client_maybe_free(ucx_client_t *c)
{
    if (c->closed && c->users == 0) {
        ucx_list_del(&c->link);
        free(c);
    }
}

static void client_closed_cb(void *request, ucs_status_t status,
                             void *user_data)
{
    ucx_client_t *c = user_data;
    (void)status;
    ucp_request_free(request);
    c->closed = 1;
    client_maybe_free(c);
}

void ucx_client_close(ucx_client_t *c)
{
    ucx_clients_t *cs = c->set;
    ucx_list_del(&c->link);
    cs->n--;
    c->closing = 1;
    ucx_list_push(&cs->closing, &c->link);
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = client_closed_cb,
        .user_data = c,
    };
    ucs_status_ptr_t sp = ucp_ep_close_nbx(c->ep, &p);
    c->ep = NULL;
    if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
        c->closed = 1;
        client_maybe_free(c);
    }
}

void ucx_client_done(ucx_client_t *c)
{
    c->users--;
    client_maybe_free(c);
}

static void client_front(ucx_clients_t *cs, ucx_client_t *c)
{
    ucx_list_del(&c->link);
    c->link.next = cs->live.next;
    c->link.prev = &cs->live;
    cs->live.next->prev = &c->link;
    cs->live.next = &c->link;
}

/* The requester's endpoint already made, most recently used first. A
 * requester that closed its endpoint to us and made a new one (it
 * unloaded this agent and loaded it again: vLLM's TTL eviction and new
 * handshake) sends over a new connection. Ours to it may be the far end
 * of the old one (UCX pairs two workers' endpoints to each other), which
 * is dead even if no error has come yet: answers there would be lost and
 * the requester would wait for ever. The connection a request came over
 * (`via`) tells: one other than our endpoint's retires it. */
static ucx_client_t *client_find(ucx_clients_t *cs, const void *addr,
                                 size_t addr_len, const void *via)
{
    for (ucx_link_t *l = cs->live.next; l != &cs->live; l = l->next) {
        ucx_client_t *c = UCX_CONTAINER(l, ucx_client_t, link);
        if (c->addr_len != addr_len || memcmp(c->addr, addr, addr_len) != 0) {
            continue;
        }
        if (!c->failed && via != NULL && c->via != NULL && c->via != via) {
            ucx_client_retire(c, "is of a connection the requester "
                                 "replaced");
        }
        if (!c->failed) {
            client_front(cs, c);
            return c;
        }
        if (cs->keep_failed) {
            return c; /* its answers are dropped */
        }
    }
    return NULL;
}

/* Room for one more: the least recently used idle one is closed past
 * `max`. 0, or -1 (logged) when every one is busy. */
static int client_room(ucx_clients_t *cs, const char *who)
{
    if (cs->n < cs->max) {
        return 0;
    }
    for (ucx_link_t *l = cs->live.prev; l != &cs->live; l = l->prev) {
        ucx_client_t *c = UCX_CONTAINER(l, ucx_client_t, link);
        if (c->users == 0) {
            ucx_client_close(c);
            break;
        }
    }
    if (cs->n >= cs->max) {
        pdx_warn("ucx: %s request from %s: %u requesters busy: not "
                 "answered", cs->what, who, cs->n);
        return -1;
    }
    return 0;
}

ucx_client_t *ucx_client_get(ucx_clients_t *cs, const void *addr,
                             size_t addr_len, const void *via, pid_t pid,
                             const char *who)
{
    ucx_be_t *be = cs->be;
    if (cs->shut) {
        pdx_debug("ucx: %s request from %s: the instance is going: not "
                  "answered", cs->what, who);
        return NULL;
    }
    ucx_client_t *c = client_find(cs, addr, addr_len, via);
    if (c != NULL) {
        return c;
    }
    ucx_vaddr_t va;
    char why[256];
    if (ucx_validate_address(&be->vlocal, addr, addr_len, &va, why,
                             sizeof(why)) != PDX_OK) {
        pdx_warn("ucx: %s request from %s: its address is not one UCX "
                 "may use (%s): not answered", cs->what, who, why);
        return NULL;
    }
    if (client_room(cs, who) != 0) {
        return NULL;
    }
    char what[64];
    snprintf(what, sizeof(what), "answering a %s request", cs->what);
    if (ucx_fd_room(UCX_FDS_CLIENT, what) != PDX_OK) {
        return NULL; /* logged; the request times out at its sender */
    }
    c = calloc(1, sizeof(*c) + addr_len);
    if (c == NULL) {
        return NULL;
    }
    c->set = cs;
    c->via = via;
    c->addr_len = addr_len;
    memcpy(c->addr, addr, addr_len);
    /* On this host (the same shared-memory device, UCX's system id): its
     * pid says when it exited. */
    c->shm = ucx_vaddr_same_host(&va, &be->self);
    if (pid > 0 && c->shm) {
        c->pid = pid;
    }
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)c->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = client_err_cb, .arg = c},
    };
    ucs_status_t s = ucp_ep_create(be->worker, &ep, &c->ep);
    if (s != UCS_OK) {
        pdx_warn("ucx: %s request from %s: no endpoint to it: %s", cs->what,
                 who, ucs_status_string(s));
        free(c);
        return NULL;
    }
    ucx_list_init(&c->link);
    client_front(cs, c);
    cs->n++;
    return c;
}

void ucx_clients_drop(ucx_clients_t *cs)
{
    ucx_link_t *heads[2] = {&cs->live, &cs->closing};
    for (int i = 0; i < 2; i++) {
        while (!ucx_list_empty(heads[i])) {
            ucx_link_t *l = heads[i]->next;
            ucx_list_del(l);
            free(UCX_CONTAINER(l, ucx_client_t, link));
        }
    }
    cs->n = 0;
}

int ucx_clients_shut(ucx_clients_t *cs)
{
    cs->shut = 1;
    while (!ucx_list_empty(&cs->live)) {
        ucx_client_close(UCX_CONTAINER(cs->live.next, ucx_client_t, link));
    }
    return !ucx_list_empty(&cs->closing);
}
